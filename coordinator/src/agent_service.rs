//! The server side of the agent protocol (ALPN `quotient-agent/1`, see
//! `quotient_common::agent_api`): node registration, heartbeats, desired state as a long
//! poll, and job reports.
//!
//! - **Who may speak it**: only certificates of role `agent`, and only about the node their
//!   certificate names. Any other connection is closed; a request naming another node gets
//!   [`AgentError::Unauthorized`] and is logged, and nothing is written.
//! - **Followers** answer every request with [`AgentError::NotLeader`], naming the leader, so
//!   an agent finds the leader from any coordinator address.
//! - **Register** commits `Command::RegisterNode` and answers the node's incarnation and the agent
//!   timing ([`crate::config::AgentTuning`]).
//! - **Heartbeat** records the node's last-seen time in memory ([`NodeLeases`]; not
//!   replicated) and commits `Command::SetGpuHealth` only for GPUs whose health changed.
//!   It answers at once; the health change commits in the background. Only a leader that a
//!   quorum acknowledged within [`LEADER_QUORUM_ACK_MAX_MS`] answers, so a deposed leader
//!   cut off from the others cannot keep an agent's lease alive.
//! - **WatchDesired** answers at once when the node's desired state is newer than the
//!   agent's fence, else when it changes, else after [`WATCH_TIMEOUT_MS`] with the current one.
//! - **Report** commits one `Command::ReportJob` per event through the proposer (so they
//!   share log entries) and answers, once committed, which were rejected and why.
//! - **DiskUsage** records what a registered node's agent files take, in memory
//!   ([`NodeDisks`]; not replicated), for `quotient node list`.
//!
//! Every request is read within [`AGENT_REQUEST_READ_TIMEOUT_MS`] and answered within
//! [`AGENT_REQUEST_TIMEOUT_MS`] (a watch within its own timeout plus that).

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;
use quotient_common::agent_api::{
    AgentError, AgentRequest, AgentResponse, DesiredState, Fence, ACTUAL_ATTEMPTS_MAX,
    REPORTS_PER_REQUEST_MAX, WATCH_TIMEOUT_MS,
};
use quotient_common::certs::{PeerIdentity, Role};
use quotient_common::job::bounded_launch_message;
use quotient_common::transport::{PeerConnection, RequestStream, RESPONSE_WRITE_TIMEOUT_MS};
use quotient_common::{GpuDevice, NodeState};
use quotient_common::{JobEvent, JobReport};
use quotient_core::{Command, Outcome};

use crate::applied;
use crate::context::Context;
use crate::proposer::{NotProposed, ProposalError};

/// Deadline for an agent to deliver its request once it opened the stream (milliseconds).
pub const AGENT_REQUEST_READ_TIMEOUT_MS: u64 = 10_000;
/// Deadline for answering one request, Raft commit included (milliseconds).
pub const AGENT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// A leader answers heartbeats only while a quorum acknowledged it this recently
/// (milliseconds). A leader cut off from the others keeps believing it leads until it hears
/// of a newer term; without this check it would keep an agent's lease alive while the new
/// leader's node lease runs out and requeues that agent's jobs: a job could run twice.
pub const LEADER_QUORUM_ACK_MAX_MS: u64 = 1_000;

/// What the agent handlers share. Cheap to clone.
#[derive(Clone)]
pub struct AgentService {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Context,
    /// Paces each node's writes to the Raft log (registrations, reports).
    pacer: WritePacer,
}

/// Registrations of one node written per second, once its burst is spent.
pub const REGISTERS_PER_SECOND: f64 = 1.0;
/// Registrations of one node written at once, before [`REGISTERS_PER_SECOND`] holds.
pub const REGISTERS_BURST: f64 = 5.0;
/// Job reports of one node written per second, once its burst is spent.
pub const REPORTS_PER_SECOND: f64 = 1_000.0;
/// Job reports of one node written at once (a journal sent again after a failover).
pub const REPORTS_BURST: f64 = 4_096.0;

/// Each node's writes to the Raft log, paced: every write of a node costs the log, the disks
/// and the replication of every coordinator, so an agent (a compromised host, or one in a
/// loop) that registers or reports without end waits instead of filling the log (found by
/// probing the wire, RELIABILITY.md). A request over its node's pace is delayed, never
/// refused: a real agent's bursts (a registration after each failover, its journal sent
/// again) fit in the burst and are not slowed. The pace is this coordinator's, in memory.
#[derive(Default)]
struct WritePacer {
    /// By (node, what): when the node's next write of that kind is due (a GCRA's theoretical
    /// arrival time).
    due: std::sync::Mutex<std::collections::HashMap<(String, &'static str), tokio::time::Instant>>,
}

impl WritePacer {
    /// How long `node` waits, from `now`, before it writes `count` more of `what`, at
    /// `per_second` with `burst`.
    fn delay(
        &self,
        now: tokio::time::Instant,
        node: &str,
        what: &'static str,
        count: usize,
        per_second: f64,
        burst: f64,
    ) -> Duration {
        let mut due = self
            .due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if due.len() > 100_000 {
            due.retain(|_, at| *at > now);
        }
        let at = due.entry((node.to_string(), what)).or_insert(now);
        let start = (*at).max(now);
        *at = start + Duration::from_secs_f64(count as f64 / per_second);
        let allowed = now + Duration::from_secs_f64(burst / per_second);
        at.saturating_duration_since(allowed)
    }
}

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService").finish_non_exhaustive()
    }
}

/// The node a request is about.
fn node_of(request: &AgentRequest) -> &str {
    match request {
        AgentRequest::Register { inventory, .. } => &inventory.name,
        AgentRequest::Heartbeat { node, .. }
        | AgentRequest::WatchDesired { node, .. }
        | AgentRequest::Report { node, .. }
        | AgentRequest::DiskUsage { node, .. } => node,
    }
}

fn request_kind(request: &AgentRequest) -> &'static str {
    match request {
        AgentRequest::Register { .. } => "Register",
        AgentRequest::Heartbeat { .. } => "Heartbeat",
        AgentRequest::WatchDesired { .. } => "WatchDesired",
        AgentRequest::Report { .. } => "Report",
        AgentRequest::DiskUsage { .. } => "DiskUsage",
    }
}

fn bad_request(why: impl Into<String>) -> AgentError {
    AgentError::BadRequest(why.into())
}

fn write_error(error: ProposalError) -> AgentError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => AgentError::NotLeader {
            leader_id: forward.leader_id,
            leader_address: forward.leader_node.map(|node| node.addr),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(change)) => {
            AgentError::Unavailable(change.to_string())
        }
        RaftError::Fatal(fatal) => AgentError::Unavailable(format!("raft stopped: {fatal}")),
    }
}

fn not_proposed_error(error: NotProposed) -> AgentError {
    match error {
        NotProposed::Stopped => AgentError::Unavailable(error.to_string()),
        NotProposed::TooLarge { .. } | NotProposed::Unencodable(_) => {
            bad_request(error.to_string())
        }
    }
}

/// The report as it is replicated: the launch message cut again, as the agent should have,
/// since it is kept with the job.
fn bounded(mut report: JobReport) -> JobReport {
    match &mut report.event {
        JobEvent::LaunchFailed { message, .. } => *message = bounded_launch_message(message),
        // As many bytes as a launch message (`EXIT_REASON_BYTES_MAX`), cut the same way.
        JobEvent::ExitedWithReason { reason, .. } => *reason = bounded_launch_message(reason),
        _ => {}
    }
    report
}

impl AgentService {
    pub fn new(ctx: &Context) -> AgentService {
        AgentService {
            inner: Arc::new(Inner {
                ctx: ctx.clone(),
                pacer: WritePacer::default(),
            }),
        }
    }

    /// Serves one connection on the agent ALPN until it closes; each request on its own task.
    pub async fn serve_connection(self, connection: PeerConnection) {
        let peer = connection.peer().clone();
        let serial: Option<Arc<str>> = connection.serial().map(Arc::from);
        let address = connection.remote_address();
        if let Err(error) = connection.require_role(&[Role::Agent]) {
            tracing::warn!(%peer, %address, error = %error, "refused an agent connection: not an agent certificate");
            return;
        }
        tracing::debug!(%peer, %address, "agent connected");
        self.inner
            .ctx
            .agent_links
            .connected(&peer.name, &connection);
        loop {
            let stream = match connection.accept_request().await {
                Ok(Some(stream)) => stream,
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%peer, %address, error = %error, "agent connection ended");
                    break;
                }
            };
            let service = self.clone();
            let peer = peer.clone();
            let serial = serial.clone();
            tokio::spawn(
                async move { service.serve_request(peer, serial.as_deref(), stream).await },
            );
        }
        self.inner
            .ctx
            .agent_links
            .disconnected(&peer.name, &connection);
    }

    async fn serve_request(
        &self,
        peer: PeerIdentity,
        serial: Option<&str>,
        mut stream: RequestStream,
    ) {
        let request: AgentRequest = match stream
            .read_request(Duration::from_millis(AGENT_REQUEST_READ_TIMEOUT_MS))
            .await
        {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%peer, error = %error, "refused a bad agent request");
                return;
            }
        };
        let response = self.handle(&peer, serial, request).await;
        if let Err(error) = stream
            .respond(&response, Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS))
            .await
        {
            // An answer over the frame cannot reach the agent however often it asks: an error
            // (found by probing, when a desired state could grow past it; it no longer can).
            match error {
                quotient_common::transport::RequestError::Frame(
                    quotient_common::frame::FrameError::TooLarge { .. },
                ) => {
                    tracing::error!(%peer, error = %error, "an answer to an agent is over the frame limit and was not sent")
                }
                _ => tracing::debug!(%peer, error = %error, "could not answer an agent request"),
            }
        }
    }

    /// Authorises and answers one request, within its deadline. `serial` is the serial number
    /// of the peer's certificate.
    pub async fn handle(
        &self,
        peer: &PeerIdentity,
        serial: Option<&str>,
        request: AgentRequest,
    ) -> AgentResponse {
        let kind = request_kind(&request);
        if peer.role != Role::Agent || node_of(&request) != peer.name {
            tracing::warn!(
                %peer,
                request = kind,
                node = node_of(&request),
                "refused an agent request about another node"
            );
            return AgentResponse::Error(AgentError::Unauthorized(format!(
                "{peer} may speak only for node {:?}, not {:?}",
                peer.name,
                node_of(&request)
            )));
        }
        if self.inner.ctx.state_machine.is_revoked(peer, serial) {
            tracing::warn!(%peer, request = kind, "refused a revoked agent certificate");
            return AgentResponse::Error(AgentError::Unauthorized(format!(
                "the certificate of {} is revoked: its node is lost; issue the agent a new \
                 certificate under another name, or unrevoke it",
                peer.name
            )));
        }
        if let Err(error) = self.leader() {
            return AgentResponse::Error(error);
        }
        let deadline_ms = match request {
            AgentRequest::WatchDesired { .. } => WATCH_TIMEOUT_MS + AGENT_REQUEST_TIMEOUT_MS,
            _ => AGENT_REQUEST_TIMEOUT_MS,
        };
        let answer =
            tokio::time::timeout(Duration::from_millis(deadline_ms), self.answer(request)).await;
        match answer {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                if !matches!(error, AgentError::NotLeader { .. }) {
                    tracing::info!(%peer, request = kind, error = %error, "agent request refused");
                }
                AgentResponse::Error(error)
            }
            Err(_) => AgentResponse::Error(AgentError::Unavailable(format!(
                "no answer within {deadline_ms} ms (is a quorum of coordinators up?)"
            ))),
        }
    }

    /// `Ok` on the leader; else where the leader is.
    fn leader(&self) -> Result<(), AgentError> {
        let metrics = self.inner.ctx.raft.metrics().borrow().clone();
        if metrics.state == ServerState::Leader {
            return Ok(());
        }
        let leader_address = metrics.current_leader.and_then(|leader| {
            metrics
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|node| node.addr.clone())
        });
        Err(AgentError::NotLeader {
            leader_id: metrics.current_leader,
            leader_address,
        })
    }

    /// `Ok` while a quorum acknowledged this leader within [`LEADER_QUORUM_ACK_MAX_MS`].
    fn confirmed_leader(&self) -> Result<(), AgentError> {
        let since_ack_ms = self
            .inner
            .ctx
            .raft
            .metrics()
            .borrow()
            .millis_since_quorum_ack;
        match since_ack_ms {
            Some(ms) if ms <= LEADER_QUORUM_ACK_MAX_MS => Ok(()),
            _ => Err(AgentError::Unavailable(format!(
                "this leader has not heard from a quorum for {since_ack_ms:?} ms; it may be \
                 deposed"
            ))),
        }
    }

    /// Waits until `node` may write `count` more of `what` ([`WritePacer`]).
    async fn pace(
        &self,
        node: &str,
        what: &'static str,
        count: usize,
        per_second: f64,
        burst: f64,
    ) {
        let delay = self.inner.pacer.delay(
            tokio::time::Instant::now(),
            node,
            what,
            count,
            per_second,
            burst,
        );
        if !delay.is_zero() {
            tracing::debug!(%node, what, delay_ms = delay.as_millis() as u64, "pacing a node's writes");
            tokio::time::sleep(delay).await;
        }
    }

    fn term(&self) -> u64 {
        self.inner.ctx.raft.metrics().borrow().current_term
    }

    async fn answer(&self, request: AgentRequest) -> Result<AgentResponse, AgentError> {
        match request {
            AgentRequest::Register {
                inventory,
                actual,
                cluster: agent_cluster,
            } => {
                let Some(cluster) = self.inner.ctx.identity.cluster() else {
                    return Err(AgentError::Unavailable(
                        "this coordinator has joined no cluster yet".to_string(),
                    ));
                };
                if let Some(agent_cluster) = agent_cluster.filter(|agent| *agent != cluster) {
                    return Err(AgentError::OtherCluster {
                        coordinator_cluster: cluster.to_string(),
                        agent_cluster: agent_cluster.to_string(),
                    });
                }
                if actual.len() > ACTUAL_ATTEMPTS_MAX {
                    return Err(bad_request(format!(
                        "{} actual attempts; at most {ACTUAL_ATTEMPTS_MAX}",
                        actual.len()
                    )));
                }
                inventory
                    .validate()
                    .map_err(|error| bad_request(error.to_string()))?;
                let node = inventory.name.clone();
                let gpus = inventory.gpus.len();
                self.pace(&node, "register", 1, REGISTERS_PER_SECOND, REGISTERS_BURST)
                    .await;
                // A registration is news from the node: its lease clock is fresh before the
                // state shows it registered, so the lease check never sees it registered and
                // silent and marks it lost just after (the race docs/simulation.md tells).
                self.inner.ctx.leases.heard_from(&node);
                match self.write(Command::RegisterNode(inventory)).await? {
                    Outcome::NodeRegistered { incarnation, .. } => {
                        self.inner.ctx.leases.heard_from(&node);
                        self.after_write();
                        tracing::info!(%node, gpus, incarnation, "node registered");
                        Ok(AgentResponse::Registered {
                            node_incarnation: incarnation,
                            agent_lease_ms: self.inner.ctx.config.agents.agent_lease_ms,
                            heartbeat_ms: self.inner.ctx.config.agents.agent_heartbeat_ms,
                            cluster,
                        })
                    }
                    other => Err(AgentError::Unavailable(format!(
                        "unexpected outcome of a registration: {other:?}"
                    ))),
                }
            }
            AgentRequest::Heartbeat { node, gpus, actual } => {
                if actual.len() > ACTUAL_ATTEMPTS_MAX
                    || gpus.len() > quotient_common::GPUS_PER_NODE_MAX
                {
                    return Err(bad_request("a heartbeat lists too many GPUs or attempts"));
                }
                self.confirmed_leader()?;
                self.heartbeat(&node, &gpus)
            }
            AgentRequest::WatchDesired { node, after_fence } => self
                .watch(&node, after_fence)
                .await
                .map(AgentResponse::Desired),
            AgentRequest::Report { node, reports } => self.report(&node, reports).await,
            AgentRequest::DiskUsage { node, usage } => {
                self.registered(&node)?;
                self.inner.ctx.node_disks.record(&node, usage);
                Ok(AgentResponse::DiskUsageRecorded)
            }
        }
    }

    /// Proposes `command`; its outcome once committed and applied.
    async fn write(&self, command: Command) -> Result<Outcome, AgentError> {
        match self.inner.ctx.proposer.propose(command).await {
            Ok(Ok(Outcome::Rejected(rejection))) => Err(bad_request(rejection.to_string())),
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(error)) => Err(write_error(error)),
            Err(not_proposed) => Err(not_proposed_error(not_proposed)),
        }
    }

    /// Refreshes the desired state of what a write of ours changed and wakes the scheduler
    /// if it changed anything (the apply watcher does it too; this saves its latency).
    fn after_write(&self) {
        let ctx = &self.inner.ctx;
        applied::follow(
            &ctx.state_machine,
            &ctx.desired,
            &ctx.scheduler,
            &ctx.metrics,
            self.term(),
        );
    }

    /// `Ok` when `node` is registered and not lost.
    fn registered(&self, node: &str) -> Result<(), AgentError> {
        self.inner.ctx.state_machine.read(|state| {
            state
                .node_by_name(node)
                .filter(|record| record.state != NodeState::Lost)
                .map(|_| ())
                .ok_or(AgentError::NotRegistered)
        })
    }

    fn heartbeat(&self, node: &str, gpus: &[GpuDevice]) -> Result<AgentResponse, AgentError> {
        let changes: Vec<(u32, bool)> = self.inner.ctx.state_machine.read(|state| {
            let record = state
                .node_by_name(node)
                .filter(|record| record.state != NodeState::Lost)
                .ok_or(AgentError::NotRegistered)?;
            Ok::<_, AgentError>(
                gpus.iter()
                    .filter_map(|reported| {
                        let known = record.gpus.iter().find(|g| g.index == reported.index)?;
                        (known.healthy != reported.healthy)
                            .then_some((reported.index, reported.healthy))
                    })
                    .collect(),
            )
        })?;
        self.inner.ctx.leases.heard_from(node);
        if !changes.is_empty() {
            let service = self.clone();
            let node = node.to_string();
            tokio::spawn(async move {
                for (index, healthy) in changes {
                    tracing::info!(%node, index, healthy, "GPU health changed");
                    let command = Command::SetGpuHealth {
                        node: node.clone(),
                        index,
                        healthy,
                    };
                    if let Err(error) = service.write(command).await {
                        tracing::warn!(%node, index, error = %error, "could not record GPU health");
                    }
                }
                service.after_write();
            });
        }
        Ok(AgentResponse::HeartbeatAck)
    }

    async fn watch(&self, node: &str, after_fence: Fence) -> Result<DesiredState, AgentError> {
        let desired = &self.inner.ctx.desired;
        let known = self
            .inner
            .ctx
            .state_machine
            .read(|state| state.node_by_name(node).is_some());
        if !known {
            return Err(AgentError::NotRegistered);
        }
        // Before the first look at the desired state, so no change in between is missed.
        let mut changes = desired.subscribe(node);
        if desired.get(node).is_none() {
            self.after_write();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(WATCH_TIMEOUT_MS);
        loop {
            changes.borrow_and_update();
            let current = desired.get(node).ok_or(AgentError::NotRegistered)?;
            if current.fence > after_fence {
                return Ok(current);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Ok(current),
            }
            self.leader()?;
        }
    }

    async fn report(
        &self,
        node: &str,
        reports: Vec<JobReport>,
    ) -> Result<AgentResponse, AgentError> {
        if reports.len() > REPORTS_PER_REQUEST_MAX {
            return Err(bad_request(format!(
                "{} reports; at most {REPORTS_PER_REQUEST_MAX} per request",
                reports.len()
            )));
        }
        // `node` is the certificate's (checked in `handle`); a report may speak for no other.
        if let Some(other) = reports.iter().find(|report| report.node != node) {
            return Err(bad_request(format!(
                "a report of node {node} names node {} (job {} attempt {}): an agent reports only its own node's attempts",
                other.node, other.job, other.attempt
            )));
        }
        self.pace(
            node,
            "report",
            reports.len(),
            REPORTS_PER_SECOND,
            REPORTS_BURST,
        )
        .await;
        let proposals = reports.iter().map(|report| {
            let command = Command::ReportJob(bounded(report.clone()));
            self.inner.ctx.proposer.propose(command)
        });
        // Proposed together, they share log entries.
        let outcomes = futures_util::future::join_all(proposals).await;
        let mut rejected = Vec::new();
        for (report, outcome) in reports.iter().zip(outcomes) {
            match outcome {
                Ok(Ok(Outcome::Rejected(rejection))) => {
                    tracing::warn!(
                        %node,
                        job = %report.job,
                        attempt = report.attempt,
                        %rejection,
                        "rejected a job report"
                    );
                    rejected.push((report.job, report.attempt, rejection.to_string()));
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => return Err(write_error(error)),
                Err(not_proposed) => return Err(not_proposed_error(not_proposed)),
            }
        }
        self.after_write();
        Ok(AgentResponse::Reported { rejected })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's burst is written at once; past it, its writes wait their turn at the pace,
    /// and another node's are not slowed by it.
    #[test]
    fn a_nodes_writes_past_its_burst_wait_their_turn() {
        let pacer = WritePacer::default();
        let mut now = tokio::time::Instant::now();
        let delay = |node: &str, what: &'static str, count: usize, rate: f64, burst: f64| {
            pacer.delay(now, node, what, count, rate, burst)
        };
        for _ in 0..5 {
            assert_eq!(delay("a", "register", 1, 1.0, 5.0), Duration::ZERO);
        }
        assert_eq!(delay("a", "register", 1, 1.0, 5.0), Duration::from_secs(1));
        assert_eq!(delay("a", "register", 1, 1.0, 5.0), Duration::from_secs(2));
        assert_eq!(delay("b", "register", 1, 1.0, 5.0), Duration::ZERO);
        assert_eq!(delay("a", "report", 256, 1_000.0, 4_096.0), Duration::ZERO);
        // Time spent restores the burst.
        now += Duration::from_secs(60);
        let delay = |node: &str, what: &'static str, count: usize, rate: f64, burst: f64| {
            pacer.delay(now, node, what, count, rate, burst)
        };
        assert_eq!(delay("a", "register", 1, 1.0, 5.0), Duration::ZERO);
        // 20 requests of 256 reports: the first 16 fit the burst, the rest wait.
        let delays: Vec<Duration> = (0..20)
            .map(|_| delay("c", "report", 256, 1_000.0, 4_096.0))
            .collect();
        assert!(
            delays[..16].iter().all(|delay| delay.is_zero()),
            "{delays:?}"
        );
        assert_eq!(delays[19], Duration::from_millis(4 * 256));
    }

    /// A job's own failure reason is cut to `EXIT_REASON_BYTES_MAX` before it is replicated,
    /// as a launch failure's message is.
    #[test]
    fn a_reason_is_cut_before_it_is_replicated() {
        let report = JobReport {
            node: "gpu-1".into(),
            job: quotient_common::JobId(1),
            attempt: 1,
            event: JobEvent::ExitedWithReason {
                code: 1,
                reason: "x".repeat(2_000_000),
            },
        };
        let JobEvent::ExitedWithReason { reason, .. } = bounded(report).event else {
            panic!("the event is kept");
        };
        assert!(
            reason.len() <= quotient_common::job_report::EXIT_REASON_BYTES_MAX
                && reason.ends_with("..."),
            "{} bytes",
            reason.len()
        );
    }
}
