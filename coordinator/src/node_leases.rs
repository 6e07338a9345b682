//! Node leases on the leader: when each agent was last heard from, and marking a node lost
//! once it has been silent too long.
//!
//! Heartbeats are not replicated (docs/architecture.md): the leader keeps the last-seen time
//! of each node in memory, and only the outcome, `Command::MarkNodeLost`, goes through Raft.
//! A node is lost once its last heartbeat is older than the agent lease + the largest grace
//! period of its jobs + a margin ([`crate::config::AgentTuning`]). The agent stops its jobs
//! after the agent lease without a heartbeat answer (checkpoint signal, grace period, kill),
//! so by the time the leader requeues them they have been killed: a job never runs twice at
//! once.
//!
//! A coordinator that becomes leader starts every node's clock at its election: it cannot
//! know when the old leader last heard from them, and starting late only delays a requeue.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use openraft::ServerState;
use quotient_common::{JobId, JobState, NodeState};
use quotient_core::{Command, NodeId, Outcome, State};

use crate::config::AgentTuning;
use crate::context::Context;
use crate::proposer::{NotProposed, Proposer};
use crate::store::type_config::Raft;
use crate::store::QuotientStateMachine;

/// How often the leader checks the leases (milliseconds).
pub const NODE_LEASE_CHECK_MS: u64 = 200;
/// Deadline of committing one `MarkNodeLost` (milliseconds); on expiry the next check
/// tries again.
pub const MARK_LOST_TIMEOUT_MS: u64 = 10_000;

/// How often the leader looks for attempts past their job's time limit (milliseconds).
pub const TIME_LIMIT_CHECK_MS: u64 = 1_000;

/// When a node was last heard from: on the leader's monotonic clock (for leases), and as
/// wall-clock milliseconds (for people).
#[derive(Clone, Copy, Debug)]
struct Seen {
    at: Instant,
    wall_ms: Option<u64>,
}

/// The last-seen time of every node, on the leader. Cheap to clone.
#[derive(Clone, Debug)]
pub struct NodeLeases {
    last_seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    tuning: AgentTuning,
}

/// Milliseconds since the Unix epoch, now, as the process keeps them
/// (`quotient_common::steady_clock`): the time the leader judges leases, time limits and
/// retention by, which a step of the host's clock does not move at once.
pub fn wall_ms() -> u64 {
    quotient_common::steady_clock::now_ms()
}

impl NodeLeases {
    pub fn new(tuning: AgentTuning) -> NodeLeases {
        NodeLeases {
            last_seen: Arc::new(Mutex::new(BTreeMap::new())),
            tuning,
        }
    }

    /// Records that `node` was heard from now.
    pub fn heard_from(&self, node: &str) {
        self.heard_from_at(node, Instant::now(), wall_ms());
    }

    /// Records that `node` was heard from at `at` (`wall_ms` on the wall clock): a
    /// simulation's virtual time (the `quotient-sim` crate).
    pub fn heard_from_at(&self, node: &str, at: Instant, wall_ms: u64) {
        let seen = Seen {
            at,
            wall_ms: Some(wall_ms),
        };
        self.lock().insert(node.to_string(), seen);
    }

    /// How long a node may be silent before it is unreachable: it missed a heartbeat (two
    /// intervals, so that one late heartbeat is not enough).
    pub fn suspect_after(&self) -> Duration {
        Duration::from_millis(self.tuning.agent_heartbeat_ms.saturating_mul(2))
    }

    /// When this leader last heard from `node` (wall-clock ms; `None` when it has not since
    /// it was elected), and whether it has been silent past [`NodeLeases::suspect_after`], as
    /// [`NodeLeases::unreachable`] reckons it: a node this leader has never heard from is
    /// silent since the leader started its clock. `None` when its clock has not started.
    pub fn heard(&self, node: &str, now: Instant) -> Option<(Option<u64>, bool)> {
        let seen = *self.lock().get(node)?;
        let silent = now.saturating_duration_since(seen.at) > self.suspect_after();
        Some((seen.wall_ms, silent))
    }

    /// The nodes, not lost, silent past [`NodeLeases::suspect_after`] as of `now`: the
    /// scheduler places nothing new on them ([`quotient_core::plan_avoiding`]).
    pub fn unreachable(&self, state: &State, now: Instant) -> BTreeSet<NodeId> {
        let last_seen = self.lock();
        last_seen
            .iter()
            .filter(|(_, seen)| now.saturating_duration_since(seen.at) > self.suspect_after())
            .filter_map(|(name, _)| state.node_by_name(name))
            .filter(|node| node.state != NodeState::Lost)
            .map(|node| node.id)
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Seen>> {
        self.last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How long `node` may be silent before it is lost, given its jobs' grace periods.
    pub fn lease_of(&self, state: &State, node: &quotient_core::NodeRecord) -> Duration {
        let grace_ms = state
            .jobs_on_node(node.id)
            .into_iter()
            .filter_map(|id| state.job(id))
            .map(|job| job.spec.grace_period_ms)
            .max()
            .unwrap_or(0);
        Duration::from_millis(
            self.tuning
                .agent_lease_ms
                .saturating_add(grace_ms)
                .saturating_add(self.tuning.node_lease_margin_ms),
        )
    }

    /// The nodes whose lease has run out, as of `now`. Nodes not seen yet start their clock.
    pub fn expired(&self, state: &State, now: Instant) -> Vec<String> {
        let mut last_seen = self.lock();
        if last_seen.len() > state.node_count() {
            // A node was removed: its clock goes with it.
            last_seen.retain(|name, _| state.node_by_name(name).is_some());
        }
        state
            .nodes()
            .filter(|node| self.lease_ran_out(&mut last_seen, state, node, now))
            .map(|node| node.name.clone())
            .collect()
    }

    /// Whether the lease of the node named `name` has run out as of `now`, as
    /// [`NodeLeases::expired`] reckons it for every node: the check made again just before
    /// a node is marked lost, looking at that node alone.
    pub fn still_expired(&self, state: &State, name: &str, now: Instant) -> bool {
        let mut last_seen = self.lock();
        state
            .node_by_name(name)
            .is_some_and(|node| self.lease_ran_out(&mut last_seen, state, node, now))
    }

    /// One node's lease check: a lost node's clock is dropped (it is not checked), a node not
    /// seen yet starts its clock at `now`.
    fn lease_ran_out(
        &self,
        last_seen: &mut BTreeMap<String, Seen>,
        state: &State,
        node: &quotient_core::NodeRecord,
        now: Instant,
    ) -> bool {
        if node.state == NodeState::Lost {
            last_seen.remove(&node.name);
            return false;
        }
        let seen = last_seen.entry(node.name.clone()).or_insert(Seen {
            at: now,
            wall_ms: None,
        });
        now.saturating_duration_since(seen.at) > self.lease_of(state, node)
    }

    /// Checks the leases while this coordinator leads, marking expired nodes lost. Runs until
    /// the Raft node shuts down.
    async fn check_while_leading(
        self,
        raft: Raft,
        state_machine: QuotientStateMachine,
        proposer: Proposer,
        gang_start_timeout_ms: u64,
    ) {
        let mut was_leader = false;
        let mut last_time_limit_check = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(NODE_LEASE_CHECK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let metrics = raft.metrics().borrow().clone();
            if metrics.running_state.is_err() {
                return;
            }
            if metrics.state != ServerState::Leader {
                was_leader = false;
                continue;
            }
            if !was_leader {
                // A new leader: every node's clock starts now.
                self.lock().clear();
                was_leader = true;
            }
            if last_time_limit_check.elapsed() >= Duration::from_millis(TIME_LIMIT_CHECK_MS) {
                last_time_limit_check = Instant::now();
                let (over, unstarted) = state_machine.read(|state| {
                    let now = wall_ms();
                    (
                        past_time_limit(state, now),
                        gangs_not_started(state, now, gang_start_timeout_ms),
                    )
                });
                let over = over
                    .into_iter()
                    .map(|(job, attempt)| (job, Command::StopAtTimeLimit { job, attempt }));
                let unstarted = unstarted
                    .into_iter()
                    .map(|(job, attempt)| (job, Command::StopUnstarted { job, attempt }));
                for (job, command) in over.chain(unstarted) {
                    tracing::info!(%job, ?command, "stopping the job's attempt");
                    let proposal = proposer.propose(command);
                    match tokio::time::timeout(
                        Duration::from_millis(MARK_LOST_TIMEOUT_MS),
                        proposal,
                    )
                    .await
                    {
                        Ok(Err(NotProposed::Stopped)) => return,
                        Ok(Ok(Ok(Outcome::Rejected(rejection)))) => {
                            tracing::debug!(%job, %rejection, "stopping the attempt was refused");
                        }
                        Ok(_) => {}
                        Err(_) => {
                            tracing::warn!(%job, "stopping the attempt was not committed in time")
                        }
                    }
                }
            }
            let expired = state_machine.read(|state| self.expired(state, Instant::now()));
            for node in expired {
                // Committing the one before may have taken a while: the node may have been
                // heard from (or registered) since this check began.
                let still =
                    state_machine.read(|state| self.still_expired(state, &node, Instant::now()));
                if !still {
                    continue;
                }
                tracing::warn!(%node, "node missed its lease; marking it lost and requeueing its jobs");
                let proposal = proposer.propose(Command::MarkNodeLost { node: node.clone() });
                let Ok(committed) =
                    tokio::time::timeout(Duration::from_millis(MARK_LOST_TIMEOUT_MS), proposal)
                        .await
                else {
                    tracing::warn!(%node, "marking the node lost was not committed in time");
                    continue;
                };
                match committed {
                    Ok(Ok(Outcome::Rejected(rejection))) => {
                        tracing::warn!(%node, %rejection, "marking the node lost was refused");
                    }
                    Ok(Ok(_)) => {
                        self.lock().remove(&node);
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%node, error = %error, "could not mark the node lost");
                    }
                    Err(NotProposed::Stopped) => return,
                    Err(error) => {
                        tracing::warn!(%node, error = %error, "marking the node lost was not proposed");
                    }
                }
            }
        }
    }
}

/// The attempts running past their job's time limit as of `now_ms` (wall clock): the jobs
/// holding GPUs (not already stopping) whose attempt started running more than the limit ago
/// (as AWS Batch counts from `startedAt`), or, one that never got to run, was placed that
/// long ago. A leader's clock behind the old one's only makes the stop late.
pub fn past_time_limit(state: &State, now_ms: u64) -> Vec<(JobId, u32)> {
    state
        .jobs_holding_gpus()
        .filter(|job| {
            matches!(
                job.state,
                JobState::Scheduled | JobState::Starting | JobState::Running
            )
        })
        .filter_map(|job| {
            let limit = job.spec.time_limit_ms?;
            let attempt = job.history.last().filter(|a| a.attempt == job.attempts)?;
            let since = attempt.started_ms.unwrap_or(attempt.placed_ms);
            (now_ms.saturating_sub(since) >= limit).then_some((job.id, job.attempts))
        })
        .collect()
}

/// The attempts of jobs of several nodes placed more than `timeout_ms` ago (wall clock) that
/// do not yet run on every member: stopped so that no gang is left half-running.
pub fn gangs_not_started(state: &State, now_ms: u64, timeout_ms: u64) -> Vec<(JobId, u32)> {
    state
        .jobs_holding_gpus()
        .filter(|job| {
            job.is_gang() && matches!(job.state, JobState::Scheduled | JobState::Starting)
        })
        .filter_map(|job| {
            let attempt = job.history.last().filter(|a| a.attempt == job.attempts)?;
            (now_ms.saturating_sub(attempt.placed_ms) >= timeout_ms)
                .then_some((job.id, job.attempts))
        })
        .collect()
}

/// Checks the nodes' leases while this coordinator leads, marking expired nodes lost
/// ([`NodeLeases::expired`]). Runs until the Raft node shuts down.
pub async fn run(ctx: Context) {
    let Context {
        leases,
        raft,
        state_machine,
        proposer,
        config,
        ..
    } = ctx;
    let gang_start_timeout_ms = config.scheduling.gang_start_timeout_ms;
    leases
        .check_while_leading(raft, state_machine, proposer, gang_start_timeout_ms)
        .await
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use quotient_common::Strategy;
    use quotient_common::{GpuClass, GpuDevice, JobSpec, NodeInventory, ShareSpec, ShareState};
    use quotient_core::{apply, ApplyCtx};

    use super::*;

    #[test]
    fn a_node_expires_only_after_lease_plus_its_jobs_grace_plus_margin() {
        // Proves the node lease is agent lease + the largest grace period of the node's jobs
        // + the margin, counted from its last heartbeat.
        let class = GpuClass::parse("a10g").expect("a class");
        let mut state = State::new();
        let commands = vec![
            Command::RegisterNode(NodeInventory {
                name: "node-1".into(),
                host: quotient_common::HostInfo::process_only(),
                gpus: vec![GpuDevice {
                    index: 0,
                    uuid: "GPU-0".into(),
                    class: class.clone(),
                    healthy: true,
                    nvlink_peers: 0,
                }],
            }),
            Command::CreateShare(ShareSpec {
                name: "team".into(),
                limits: BTreeMap::from([(class, 1)]),
                strategy: Strategy::Lend,
                borrow_limit_percent: None,
                in_share_preemption: false,
                state: ShareState::Enabled,
                members: Vec::new(),
                max_jobs_per_user: None,
            }),
            Command::SubmitJob(JobSpec {
                grace_period_ms: 2_000,
                ..JobSpec::new("team", 1, 1, vec!["x".into()])
            }),
        ];
        for (index, command) in commands.into_iter().enumerate() {
            let ctx = ApplyCtx {
                log_index: index as u64 + 1,
                time_ms: 0,
            };
            assert!(!apply(&mut state, command, ctx).is_rejected());
        }
        let plan = quotient_core::plan(&state);
        let ctx = ApplyCtx {
            log_index: 4,
            time_ms: 0,
        };
        apply(&mut state, Command::ApplyPlan(plan), ctx);
        let leases = NodeLeases::new(AgentTuning {
            agent_lease_ms: 1_000,
            agent_heartbeat_ms: 100,
            node_lease_margin_ms: 500,
        });
        let node = state.node_by_name("node-1").expect("registered");
        assert_eq!(leases.lease_of(&state, node), Duration::from_millis(3_500));

        let heard = Instant::now();
        leases.heard_from("node-1");
        let early = heard + Duration::from_millis(3_400);
        assert!(leases.expired(&state, early).is_empty());
        assert!(!leases.still_expired(&state, "node-1", early));
        let late = heard + Duration::from_millis(3_600);
        assert_eq!(leases.expired(&state, late), vec!["node-1".to_string()]);
        assert!(leases.still_expired(&state, "node-1", late));
        assert!(
            !leases.still_expired(&state, "node-9", late),
            "an unknown node"
        );
    }

    #[test]
    fn a_gang_not_running_on_every_member_in_time_is_found_once() {
        // Proves the start timeout: a job of two nodes placed at 1,000 ms with one member
        // running is due at 1,000 + timeout, listed once (not once per member's node); once
        // every member runs it is no longer listed.
        let class = GpuClass::parse("a10g").expect("a class");
        let mut state = State::new();
        let node = |name: &str| {
            Command::RegisterNode(NodeInventory {
                name: name.into(),
                host: quotient_common::HostInfo::process_only(),
                gpus: vec![GpuDevice {
                    index: 0,
                    uuid: format!("GPU-{name}"),
                    class: class.clone(),
                    healthy: true,
                    nvlink_peers: 0,
                }],
            })
        };
        let mut spec = JobSpec::new("team", 1, 1, vec!["x".into()]);
        spec.nodes = 2;
        let commands = vec![
            node("node-1"),
            node("node-2"),
            Command::CreateShare(ShareSpec {
                name: "team".into(),
                limits: BTreeMap::from([(class.clone(), 2)]),
                strategy: Strategy::Lend,
                borrow_limit_percent: None,
                in_share_preemption: false,
                state: ShareState::Enabled,
                members: Vec::new(),
                max_jobs_per_user: None,
            }),
            Command::SubmitJob(spec),
        ];
        let mut index = 0;
        let mut run = |state: &mut State, command: Command| {
            index += 1;
            let ctx = ApplyCtx {
                log_index: index,
                time_ms: 1_000,
            };
            assert!(!apply(state, command, ctx).is_rejected());
        };
        for command in commands {
            run(&mut state, command);
        }
        let plan = quotient_core::plan(&state);
        run(&mut state, Command::ApplyPlan(plan));
        let job = JobId(1);
        let report = |node: &str| {
            Command::ReportJob(quotient_core::JobReport {
                job,
                attempt: 1,
                node: node.into(),
                event: quotient_core::JobEvent::Running,
            })
        };
        run(&mut state, report("node-1"));
        assert_eq!(gangs_not_started(&state, 1_000 + 59_999, 60_000), vec![]);
        assert_eq!(
            gangs_not_started(&state, 1_000 + 60_000, 60_000),
            vec![(job, 1)]
        );
        run(&mut state, report("node-2"));
        assert_eq!(gangs_not_started(&state, 1_000 + 60_000, 60_000), vec![]);
    }
}
