//! A coordinator's Prometheus metrics (`--metrics-listen ADDR`, `GET /metrics`).
//!
//! Three kinds, by where they come from:
//!
//! - **Read off the replicated state at each scrape, on the leader only**: the shares' GPUs
//!   (`quotient_share_gpus{share,class,kind}`, kind = limit, used, borrowed, lent), jobs by
//!   share and state (`quotient_jobs`), nodes by state (`quotient_nodes`, with `unreachable`
//!   from the leader's heartbeat clocks). Every replica holds the same state, but only the
//!   leader reports it, so that a sum over the coordinators counts each thing once; after a
//!   failover the new leader reports it. A follower's families are empty.
//! - **Counted as the leader sees them happen** (`crate::applied::follow`): preemptions by
//!   share and cause, and each job's wait from submit to its first start. A new leader starts
//!   counting from what it sees after its election (a counter of a process, as Prometheus
//!   expects: `rate()` and `increase()` handle its resets).
//! - **This process's own**: Raft (`is_leader`, term, commit and applied index, and on the
//!   leader each follower's replication lag), the scheduler's rounds and placements, and the
//!   API's request latency by request kind.
//!
//! Reading the state at a scrape holds the state's read lock for one pass over the jobs
//! (about 10 ms per million jobs): a scrape every 15 s costs the leader well under 0.1%.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::ServerState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use quotient_common::metrics_http::MetricsSource;
use quotient_common::{JobId, JobState, NodeState};
use quotient_core::{share_accounts, JobRecord, State};

use crate::applied::AppliedChanges;
use crate::context::Context;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareGpuLabels {
    share: String,
    class: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareStateLabels {
    share: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareCauseLabels {
    share: String,
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareLabels {
    share: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Histogram buckets, as a constructor a [`Family`] can hold.
#[derive(Clone, Copy)]
struct Buckets {
    start: f64,
    factor: f64,
    count: u16,
}

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(self.start, self.factor, self.count))
    }
}

/// A job's wait: 1 s to about 9 h.
const WAIT_BUCKETS: Buckets = Buckets {
    start: 1.0,
    factor: 2.0,
    count: 16,
};
/// An API request or a scheduling round: 100 µs to about 6.5 s.
const LATENCY_BUCKETS: Buckets = Buckets {
    start: 0.000_1,
    factor: 2.0,
    count: 17,
};

/// What the leader saw of a job so far (see [`CoordinatorMetrics::follow`]).
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    preemptions: u32,
    started: bool,
}

/// The jobs seen since this coordinator's current term began.
#[derive(Debug, Default)]
struct SeenJobs {
    term: Option<u64>,
    jobs: HashMap<JobId, Seen>,
}

struct Inner {
    registry: Registry,
    share_gpus: Family<ShareGpuLabels, Gauge>,
    jobs: Family<ShareStateLabels, Gauge>,
    nodes: Family<StateLabels, Gauge>,
    preemptions: Family<ShareCauseLabels, Counter>,
    job_wait: Family<ShareLabels, Histogram, Buckets>,
    round_seconds: Histogram,
    placements: Counter,
    is_leader: Gauge,
    term: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    replication_lag: Family<MemberLabels, Gauge>,
    api_seconds: Family<KindLabels, Histogram, Buckets>,
    handshakes_refused: Counter,
    /// What the QUIC server counts its refusals in; read into `handshakes_refused` at each
    /// scrape.
    handshakes_refused_source: Arc<AtomicU64>,
    seen: Mutex<SeenJobs>,
    /// One scrape at a time refills the state families.
    render: Mutex<()>,
}

/// A coordinator's metrics; cheap to clone, every clone the same.
#[derive(Clone)]
pub struct CoordinatorMetrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CoordinatorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorMetrics").finish_non_exhaustive()
    }
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CoordinatorMetrics {
    pub fn new() -> CoordinatorMetrics {
        CoordinatorMetrics::with_registry(Registry::default())
    }

    /// Its metrics, and the expiry of its certificate and CA (`tls`).
    pub fn for_identity(tls: &quotient_common::tls::TlsIdentity) -> CoordinatorMetrics {
        let mut registry = Registry::default();
        quotient_common::metrics_http::register_certificate_expiry(&mut registry, tls);
        CoordinatorMetrics::with_registry(registry)
    }

    fn with_registry(mut registry: Registry) -> CoordinatorMetrics {
        let share_gpus = Family::<ShareGpuLabels, Gauge>::default();
        registry.register(
            "quotient_share_gpus",
            "GPUs of a share by class: its limit, what it uses, what it borrows from others and what others borrow from it (leader only)",
            share_gpus.clone(),
        );
        let jobs = Family::<ShareStateLabels, Gauge>::default();
        registry.register(
            "quotient_jobs",
            "Jobs in the live state by share and state (leader only)",
            jobs.clone(),
        );
        let nodes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "quotient_nodes",
            "Nodes by state: ready, cordoned, draining, lost, and unreachable (silent past twice the heartbeat interval, not yet lost) (leader only)",
            nodes.clone(),
        );
        let preemptions = Family::<ShareCauseLabels, Counter>::default();
        registry.register(
            "quotient_preemptions",
            "Attempts ended by a preemption, by the victim's share and the cause, as this coordinator saw them while it led",
            preemptions.clone(),
        );
        let job_wait = Family::new_with_constructor(WAIT_BUCKETS);
        registry.register(
            "quotient_job_wait_seconds",
            "From a job's submit to its first start, by share, as this coordinator saw it while it led",
            job_wait.clone(),
        );
        let round_seconds = LATENCY_BUCKETS.new_metric();
        registry.register(
            "quotient_scheduler_round_seconds",
            "How long the leader took to plan one scheduling round",
            round_seconds.clone(),
        );
        let placements = Counter::default();
        registry.register(
            "quotient_scheduler_placements",
            "Jobs placed by committed plans of this coordinator",
            placements.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let is_leader = gauge(
            &mut registry,
            "quotient_raft_is_leader",
            "1 on the Raft leader, 0 elsewhere",
        );
        let term = gauge(&mut registry, "quotient_raft_term", "The current Raft term");
        let commit_index = gauge(
            &mut registry,
            "quotient_raft_commit_index",
            "The newest log index known committed whose entry is on this coordinator's disk",
        );
        let applied_index = gauge(
            &mut registry,
            "quotient_raft_applied_index",
            "The newest log index applied to this coordinator's state",
        );
        let replication_lag = Family::<MemberLabels, Gauge>::default();
        registry.register(
            "quotient_raft_replication_lag_entries",
            "How many log entries each follower's matched index is behind the leader's last (leader only)",
            replication_lag.clone(),
        );
        let api_seconds = Family::new_with_constructor(LATENCY_BUCKETS);
        registry.register(
            "quotient_api_request_seconds",
            "How long this coordinator took to answer an API request, by kind (forwarding included)",
            api_seconds.clone(),
        );
        let handshakes_refused = Counter::default();
        registry.register(
            "quotient_handshakes_refused",
            "Connection attempts refused before their handshake because this coordinator already had its most handshakes under way; the clients try again after their backoff",
            handshakes_refused.clone(),
        );
        CoordinatorMetrics {
            inner: Arc::new(Inner {
                registry,
                share_gpus,
                jobs,
                nodes,
                preemptions,
                job_wait,
                round_seconds,
                placements,
                is_leader,
                term,
                commit_index,
                applied_index,
                replication_lag,
                api_seconds,
                handshakes_refused,
                handshakes_refused_source: Arc::default(),
                seen: Mutex::new(SeenJobs::default()),
                render: Mutex::new(()),
            }),
        }
    }

    /// One API request of `kind` answered in `took`.
    pub fn api_request(&self, kind: &'static str, took: Duration) {
        self.inner
            .api_seconds
            .get_or_create(&KindLabels { kind })
            .observe(took.as_secs_f64());
    }

    /// One scheduling round planned in `took`.
    pub fn scheduler_round(&self, took: Duration) {
        self.inner.round_seconds.observe(took.as_secs_f64());
    }

    /// A committed plan placed `count` jobs.
    pub fn placed(&self, count: u64) {
        self.inner.placements.inc_by(count);
    }

    /// On the leader, with what the applied entries changed: counts the preemptions and first
    /// starts of the changed jobs. The first call of a term (and everything-changed) only
    /// records what each job is at, so that nothing that happened before is counted now.
    pub fn follow(&self, state: &State, changes: &AppliedChanges, term: u64) {
        let mut seen = self
            .inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let named = match changes {
            AppliedChanges::Named(named) if seen.term == Some(term) => named,
            _ => {
                seen.term = Some(term);
                seen.jobs = state
                    .jobs()
                    .filter(|job| !job.state.is_terminal())
                    .map(|job| (job.id, seen_now(job)))
                    .collect();
                return;
            }
        };
        for id in &named.jobs {
            let Some(job) = state.job(*id) else {
                seen.jobs.remove(id);
                continue;
            };
            let before = seen.jobs.get(id).copied().unwrap_or_default();
            if job.preemptions > before.preemptions {
                let cause = job
                    .last_preemption
                    .as_ref()
                    .map_or("other", |p| cause_label(p.kind));
                self.inner
                    .preemptions
                    .get_or_create(&ShareCauseLabels {
                        share: job.spec.share.clone(),
                        cause,
                    })
                    .inc_by(u64::from(job.preemptions - before.preemptions));
            }
            if let (false, Some(started)) = (before.started, job.first_started_ms) {
                let waited = started.saturating_sub(job.submitted_ms) as f64 / 1_000.0;
                self.inner
                    .job_wait
                    .get_or_create(&ShareLabels {
                        share: job.spec.share.clone(),
                    })
                    .observe(waited);
            }
            if job.state.is_terminal() {
                seen.jobs.remove(id);
            } else {
                seen.jobs.insert(*id, seen_now(job));
            }
        }
    }

    /// Where the QUIC server counts the connection attempts it refuses for load
    /// (`Server::counting_refusals_in`).
    pub fn handshakes_refused_source(&self) -> Arc<AtomicU64> {
        self.inner.handshakes_refused_source.clone()
    }

    /// Refreshes what is read at a scrape and encodes everything.
    pub fn render(&self, ctx: &Context) -> String {
        let _one = self
            .inner
            .render
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let inner = &self.inner;
        let refused = inner.handshakes_refused_source.load(Ordering::Relaxed);
        inner
            .handshakes_refused
            .inc_by(refused.saturating_sub(inner.handshakes_refused.get()));
        let raft = ctx.raft.metrics().borrow().clone();
        let leader = raft.state == ServerState::Leader;
        inner.is_leader.set(i64::from(leader));
        inner.term.set(clamp(raft.current_term));
        inner
            .applied_index
            .set(raft.last_applied.map_or(0, |id| clamp(id.index)));
        let committed = ctx.durability.durable().committed;
        inner
            .commit_index
            .set(committed.map_or(0, |id| clamp(id.index)));
        inner.replication_lag.clear();
        inner.share_gpus.clear();
        inner.jobs.clear();
        inner.nodes.clear();
        if leader {
            let last = raft.last_log_index.unwrap_or(0);
            for (member, matched) in raft.replication.iter().flatten() {
                if *member == ctx.id() {
                    continue;
                }
                let matched = matched.map_or(0, |id| id.index);
                inner
                    .replication_lag
                    .get_or_create(&MemberLabels {
                        member: member.to_string(),
                    })
                    .set(clamp(last.saturating_sub(matched)));
            }
            ctx.state_machine.read(|state| {
                let unreachable = ctx.leases.unreachable(state, std::time::Instant::now());
                self.fill_state(state, unreachable.len());
            });
        }
        quotient_common::metrics_http::encode(&inner.registry)
    }

    /// The leader's state families from `state`, with `unreachable` nodes.
    fn fill_state(&self, state: &State, unreachable: usize) {
        let inner = &self.inner;
        let accounts = share_accounts(state);
        for share in state.shares() {
            let name = &share.spec.name;
            let account = accounts.get(name);
            for (class, limit) in &share.spec.limits {
                let class_name = class.to_string();
                let set = |kind: &'static str, value: u64| {
                    inner
                        .share_gpus
                        .get_or_create(&ShareGpuLabels {
                            share: name.clone(),
                            class: class_name.clone(),
                            kind,
                        })
                        .set(clamp(value));
                };
                let of = |map: Option<&BTreeMap<quotient_common::GpuClass, u64>>| {
                    map.and_then(|m| m.get(class)).copied().unwrap_or(0)
                };
                set("limit", u64::from(*limit));
                set("used", of(account.map(|a| &a.usage)));
                set("borrowed", of(account.map(|a| &a.borrowed)));
                set("lent", of(account.map(|a| &a.lent)));
            }
        }
        let mut counts: HashMap<(&str, JobState), i64> = HashMap::new();
        for job in state.jobs() {
            *counts.entry((&job.spec.share, job.state)).or_default() += 1;
        }
        for ((share, job_state), count) in counts {
            inner
                .jobs
                .get_or_create(&ShareStateLabels {
                    share: share.to_string(),
                    state: state_label(job_state),
                })
                .set(count);
        }
        let mut nodes: BTreeMap<&'static str, i64> = [
            NodeState::Ready,
            NodeState::Cordoned,
            NodeState::Draining,
            NodeState::Lost,
        ]
        .into_iter()
        .map(|state| (state.as_str(), 0))
        .collect();
        for node in state.nodes() {
            *nodes.entry(node.state.as_str()).or_default() += 1;
        }
        nodes.insert("unreachable", clamp(unreachable as u64));
        for (label, count) in nodes {
            inner
                .nodes
                .get_or_create(&StateLabels { state: label })
                .set(count);
        }
    }
}

fn seen_now(job: &JobRecord) -> Seen {
    Seen {
        preemptions: job.preemptions,
        started: job.first_started_ms.is_some(),
    }
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A job state as a label value: lower case.
fn state_label(state: JobState) -> &'static str {
    match state {
        JobState::Runnable => "runnable",
        JobState::Scheduled => "scheduled",
        JobState::Starting => "starting",
        JobState::Running => "running",
        JobState::Preempting => "preempting",
        JobState::Succeeded => "succeeded",
        JobState::Failed => "failed",
        JobState::Cancelled => "cancelled",
    }
}

/// A preemption's cause as a label value.
fn cause_label(kind: quotient_core::PreemptionKind) -> &'static str {
    use quotient_core::PreemptionKind::*;
    match kind {
        Reclaim => "reclaim",
        InShare => "in_share",
        Drain => "drain",
        NodeLost => "node_lost",
        AgentStopped => "agent_stopped",
        StartTimeout => "start_timeout",
    }
}

/// The coordinator's door: its metrics, and ready once it is a member of a cluster with a
/// leader it knows.
pub struct CoordinatorDoor {
    pub ctx: Context,
}

impl MetricsSource for CoordinatorDoor {
    fn render(&self) -> String {
        self.ctx.metrics.render(&self.ctx)
    }

    fn ready(&self) -> Result<(), String> {
        if self.ctx.identity.cluster().is_none() {
            return Err("not a member of a cluster yet (`quotient cluster init` or `quotient cluster add-member`)".into());
        }
        let raft = self.ctx.raft.metrics().borrow().clone();
        readiness(&raft)
    }
}

/// Says so when this coordinator is no longer in its cluster's membership: the last
/// membership it has leaves it out, as `cluster remove-member` does (`/readyz` and `cluster
/// health` both report it).
pub fn removed(raft: &openraft::RaftMetrics<u64, openraft::BasicNode>) -> Option<String> {
    let membership = raft.membership_config.membership();
    (membership.nodes().next().is_some() && membership.get_node(&raft.id).is_none()).then(|| {
        format!(
            "coordinator {} is no longer a member of its cluster (removed with `quotient cluster \
             remove-member`): stop it, and wipe its data dir before adding it again",
            raft.id
        )
    })
}

/// Whether a coordinator that has joined a cluster is ready, from its Raft's metrics: Raft
/// runs, this coordinator is still a member ([`removed`]), and it knows a leader.
pub fn readiness(raft: &openraft::RaftMetrics<u64, openraft::BasicNode>) -> Result<(), String> {
    if let Err(fatal) = &raft.running_state {
        return Err(format!("raft stopped: {fatal}"));
    }
    if let Some(problem) = removed(raft) {
        return Err(problem);
    }
    match raft.current_leader {
        Some(_) => Ok(()),
        None => Err(format!("no leader known in term {}", raft.current_term)),
    }
}

#[cfg(test)]
mod readiness_tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use openraft::{BasicNode, Membership, RaftMetrics, StoredMembership};

    use super::readiness;

    fn metrics(id: u64, members: &[u64], leader: Option<u64>) -> RaftMetrics<u64, BasicNode> {
        let nodes: BTreeMap<u64, BasicNode> = members
            .iter()
            .map(|member| {
                (
                    *member,
                    BasicNode::new(format!("127.0.0.1:{}", 7400 + member)),
                )
            })
            .collect();
        let voters: BTreeSet<u64> = nodes.keys().copied().collect();
        let mut metrics = RaftMetrics::new_initial(id);
        metrics.membership_config = Arc::new(StoredMembership::new(
            None,
            Membership::new(vec![voters], nodes),
        ));
        metrics.current_leader = leader;
        metrics
    }

    /// A member that knows a leader is ready; one that the last membership leaves out (removed)
    /// is not, and says what to do, even though it still remembers a leader.
    #[test]
    fn a_removed_coordinator_is_not_ready() {
        assert_eq!(readiness(&metrics(2, &[1, 2, 3], Some(1))), Ok(()));
        let removed = readiness(&metrics(4, &[1, 2, 3], Some(1))).unwrap_err();
        assert!(
            removed.contains("no longer a member") && removed.contains("remove-member"),
            "{removed}"
        );
        let leaderless = readiness(&metrics(2, &[1, 2, 3], None)).unwrap_err();
        assert!(leaderless.contains("no leader"), "{leaderless}");
    }
}
