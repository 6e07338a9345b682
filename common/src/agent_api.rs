//! The agent protocol's messages (ALPN `quotient-agent/1`): what an agent on a GPU host and
//! the leading coordinator say to each other.
//!
//! Agents are told desired state, not commands (docs/architecture.md). The agent opens the
//! connection and sends requests, one per QUIC stream:
//! - `Register` once per connection, with its inventory and what it runs;
//! - `Heartbeat` every `heartbeat_ms`, carrying device health and actual jobs (heartbeats are
//!   not replicated; only a node's state changes are);
//! - `WatchDesired`, a long poll: the leader answers at once when the node's desired state is
//!   newer than `after_fence`, else when it changes, else after `WATCH_TIMEOUT_MS`;
//! - `Report` with job events, answered once they are committed.
//!
//! Followers answer every request with `AgentError::NotLeader`, so the agent finds the leader
//! from any coordinator address.
//!
//! The leader also opens streams the other way, on the same connection, to ask the agent
//! something only the host knows ([`LeaderRequest`]): so far the log of an attempt
//! (`quotient job logs`). Each such request is one stream with a deadline, answered by one
//! [`LeaderResponse`] frame.
//!
//! The fence ([`Fence`]) orders desired states across leaders: a deposed leader's
//! desired state is older than any the new leader sends, and the agent ignores it.

use serde::{Deserialize, Serialize};

use crate::{ClusterId, GpuDevice, JobId, JobReport, JobSpec, NodeInventory};

/// How long the leader holds a `WatchDesired` that has nothing new.
pub const WATCH_TIMEOUT_MS: u64 = 5_000;
/// The most allocations one node's desired state holds (a node has at most 64 GPUs; jobs
/// being stopped can add a few more).
pub const DESIRED_ALLOCATIONS_MAX: usize = 256;
/// The most job events in one `Report`.
pub const REPORTS_PER_REQUEST_MAX: usize = 256;
/// The most log bytes one `ReadLogs` answer carries; larger `max_bytes` are capped to it.
pub const LOG_CHUNK_BYTES_MAX: u32 = 1 << 20;
/// The leader's deadline for an agent's answer to a [`LeaderRequest`] (milliseconds).
pub const LEADER_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// The most actual attempts a `Register` or `Heartbeat` may list; the leader refuses more.
pub const ACTUAL_ATTEMPTS_MAX: usize = 1_024;
/// An agent keeps heartbeating a leader that is there but does not acknowledge its
/// heartbeats for 1/this of its lease before it looks for the leader again (see
/// [`leader_patience_ms`]).
pub const LEADER_PATIENCE_PER_LEASE: u64 = 4;

/// How long an agent with a lease of `lease_ms` keeps heartbeating a leader that is there but
/// acknowledges none of its heartbeats, counted from the first such heartbeat, before it
/// looks for the leader again. "There" means either of:
/// - it refuses the heartbeats with [`AgentError::Unavailable`]: it cannot show a quorum's
///   acknowledgement within the last second, being overloaded or briefly cut off from the
///   other coordinators;
/// - it lets a heartbeat's deadline pass, but its side of the QUIC connection sent datagrams
///   meanwhile (at least the acknowledgement of the heartbeat's own packets): its host is
///   busy, not gone. A killed leader, or one behind a partition, sends nothing, and the
///   agent looks elsewhere at once.
///
/// Looking again means registering again, a Raft write per agent. When a whole fleet does
/// that because its leader was slow for a moment, the writes pile onto the leader that was
/// already slow, and the slowness feeds itself (BENCHMARKS.md, "A fleet of simulated
/// agents"). A leader that is really deposed, or hung, costs its agents this much more time
/// before they find the new one; the lease, which only an acknowledged heartbeat renews,
/// still has three quarters left for that search.
pub fn leader_patience_ms(lease_ms: u64) -> u64 {
    lease_ms / LEADER_PATIENCE_PER_LEASE
}

/// How long a leader has gone without acknowledging a heartbeat while still there: the
/// agent's (and the fleet simulator's) count against [`leader_patience_ms`].
#[derive(Debug, Clone)]
pub struct LeaderPatience {
    patience: std::time::Duration,
    since: Option<std::time::Instant>,
}

impl LeaderPatience {
    pub fn new(lease_ms: u64) -> LeaderPatience {
        LeaderPatience {
            patience: std::time::Duration::from_millis(leader_patience_ms(lease_ms)),
            since: None,
        }
    }

    /// A heartbeat sent at `sent_at` was not acknowledged, though the leader is there. `Err`
    /// with how long none has been, once that is the patience or more: look elsewhere.
    pub fn unacknowledged(
        &mut self,
        sent_at: std::time::Instant,
    ) -> Result<(), std::time::Duration> {
        let failing = self.since.get_or_insert(sent_at).elapsed();
        if failing >= self.patience {
            Err(failing)
        } else {
            Ok(())
        }
    }

    /// A heartbeat was acknowledged: how long none had been before it, if any.
    pub fn acknowledged(&mut self) -> Option<std::time::Duration> {
        self.since.take().map(|since| since.elapsed())
    }
}

/// A fence: the leader's Raft term, then the log index of the state the desired state
/// was computed from. Compared as a pair, so any state sent by a newer leader is newer.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Fence {
    pub term: u64,
    pub index: u64,
}

impl Fence {
    /// The fence as one number for logs and the reconcile diff: term in the high 24 bits.
    pub fn as_u64(self) -> u64 {
        (self.term.min((1 << 24) - 1) << 40) | self.index.min((1 << 40) - 1)
    }
}

/// What the coordinators want of one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireIntent {
    /// Run it: start it, or keep it running.
    Run,
    /// Stop it: checkpoint signal, grace period, kill (a preemption or a cancel).
    Stop,
}

/// One allocation placed on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireAllocation {
    pub job: JobId,
    /// QUOTIENT_ATTEMPT of this placement.
    pub attempt: u32,
    pub gpu_indices: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    pub spec: JobSpec,
    pub intent: WireIntent,
    /// The CPUs (thousandths) and memory (bytes) set aside for it on the node: the limits
    /// the agent enforces (cgroups v2 for a process, Docker's limits for a container); 0 is
    /// no limit (the node reports no CPUs or memory).
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    /// For one member of a job of several nodes: its rank and its peers. `None` for a job of
    /// one node (the agent makes it rank 0 of one, on a port free on the node).
    pub gang: Option<WireGang>,
}

/// One member of a job of several nodes: what its rendezvous needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGang {
    /// This member's rank, 0 to `hosts.len() - 1`.
    pub rank: u32,
    /// The members' advertised addresses, in rank order.
    pub hosts: Vec<String>,
    /// The port rank 0 listens on for the rendezvous, the same for every member.
    pub master_port: u16,
}

/// The node's whole desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    pub node: String,
    pub fence: Fence,
    pub allocations: Vec<WireAllocation>,
}

/// Where an attempt is on the host, as the agent sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActualPhase {
    Starting,
    Running,
    /// The checkpoint signal was sent; waiting for it to exit.
    Stopping,
}

/// One attempt running on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActualAttempt {
    pub job: JobId,
    pub attempt: u32,
    pub phase: ActualPhase,
}

/// A request from an agent. The node name in each must be the name in the agent's
/// certificate; the coordinators refuse any other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentRequest {
    Register {
        inventory: NodeInventory,
        actual: Vec<ActualAttempt>,
        /// The cluster this agent belongs to, once it has registered with one (kept in its
        /// state directory) or was configured with one; a coordinator of another cluster
        /// refuses it. `None` on an agent's first registration.
        cluster: Option<ClusterId>,
    },
    Heartbeat {
        node: String,
        gpus: Vec<GpuDevice>,
        actual: Vec<ActualAttempt>,
    },
    WatchDesired {
        node: String,
        after_fence: Fence,
    },
    /// Each report names `node` too: it is proposed to Raft as it is.
    Report {
        node: String,
        reports: Vec<JobReport>,
    },
    /// What the agent's files take on its host, sent after each measurement (about once a
    /// minute) and on every new connection. Like heartbeats, not replicated: the leader
    /// keeps the last one in memory for `quotient node list`. A coordinator too old to know
    /// this request refuses its frame; the agent then only logs it.
    DiskUsage {
        node: String,
        usage: DiskUsage,
    },
}

/// What an agent's files take on its host ([`AgentRequest::DiskUsage`]). Bytes are allocated
/// blocks, not file lengths: the dropped middle of a capped log takes none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// The attempts' logs in the agent's state dir (the process runtime's; Docker keeps its
    /// own).
    pub logs_bytes: u64,
    /// The jobs' checkpoint dirs under the agent's checkpoint root (all of it: a root shared
    /// by several agents is counted by each).
    pub checkpoints_bytes: u64,
    /// Free bytes, for the agent's user, on the state dir's filesystem.
    pub free_bytes: u64,
    /// The size of the state dir's filesystem.
    pub total_bytes: u64,
}

/// The leader's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentResponse {
    Registered {
        /// The node's incarnation in the replicated state (bumped on every registration).
        node_incarnation: u64,
        /// The agent stops its jobs after this long without a heartbeat answer from a leader.
        agent_lease_ms: u64,
        heartbeat_ms: u64,
        /// The cluster the agent registered with; the agent keeps it and refuses any other.
        cluster: ClusterId,
    },
    HeartbeatAck,
    Desired(DesiredState),
    /// The reports were committed; `rejected` lists the ones refused (stale attempts).
    Reported {
        rejected: Vec<(JobId, u32, String)>,
    },
    Error(AgentError),
    /// The leader recorded an [`AgentRequest::DiskUsage`].
    DiskUsageRecorded,
}

impl AgentResponse {
    /// The variant's name, for a message about an answer that was not the one expected.
    pub fn kind(&self) -> &'static str {
        match self {
            AgentResponse::Registered { .. } => "Registered",
            AgentResponse::HeartbeatAck => "HeartbeatAck",
            AgentResponse::Desired(_) => "Desired",
            AgentResponse::Reported { .. } => "Reported",
            AgentResponse::Error(_) => "Error",
            AgentResponse::DiskUsageRecorded => "DiskUsageRecorded",
        }
    }
}

/// What the answer to one heartbeat means: one reading for the agent's session and for the
/// simulated fleet that stands in for thousands of agents, so that the benchmark's agents
/// leave and keep their leader as the real one does.
#[cfg(feature = "net")]
#[derive(Debug)]
pub enum HeartbeatAnswer {
    /// Acknowledged: the lease runs from the heartbeat's send time.
    Acknowledged,
    /// Refused as unavailable: the leader is there but cannot show a quorum's recent
    /// acknowledgement. Not acknowledged; try it again within [`LeaderPatience`].
    Unavailable(String),
    /// Unanswered by its deadline, but the leader's side of the connection sent datagrams
    /// meanwhile: busy, not gone. Not acknowledged; try it again within [`LeaderPatience`].
    Late,
    /// Another error from the leader (not the leader, this node unknown to it, a refusal):
    /// the session ends, by that error.
    Error(AgentError),
    /// The request failed, or the answer is not one a heartbeat gets: look for the leader.
    Failed(String),
}

#[cfg(feature = "net")]
impl HeartbeatAnswer {
    /// Reads `result`, the heartbeat's answer; `heard_meanwhile` is whether the connection
    /// received datagrams while it was awaited.
    pub fn of(
        result: Result<AgentResponse, crate::transport::RequestError>,
        heard_meanwhile: bool,
    ) -> HeartbeatAnswer {
        match result {
            Ok(AgentResponse::HeartbeatAck) => HeartbeatAnswer::Acknowledged,
            Ok(AgentResponse::Error(AgentError::Unavailable(why))) => {
                HeartbeatAnswer::Unavailable(why)
            }
            Err(crate::transport::RequestError::Timeout { .. }) if heard_meanwhile => {
                HeartbeatAnswer::Late
            }
            Ok(AgentResponse::Error(error)) => HeartbeatAnswer::Error(error),
            Ok(other) => HeartbeatAnswer::Failed(format!(
                "unexpected answer to a heartbeat: {}",
                other.kind()
            )),
            Err(error) => HeartbeatAnswer::Failed(format!("heartbeat failed: {error}")),
        }
    }
}

/// Why an agent request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AgentError {
    #[error("not the leader; try coordinator {leader_id:?} at {leader_address:?}")]
    NotLeader {
        leader_id: Option<u64>,
        leader_address: Option<String>,
    },
    #[error("permission denied: {0}")]
    Unauthorized(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("the node must register first")]
    NotRegistered,
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// The agent belongs to another cluster than the coordinator it reached.
    #[error("the coordinators belong to cluster {coordinator_cluster}, but this agent belongs to cluster {agent_cluster}: check --coordinators, or move the agent's state directory away (or --cluster-id) if the host really moved to this cluster")]
    OtherCluster {
        coordinator_cluster: String,
        agent_cluster: String,
    },
}

/// A request from the leader to an agent, on a stream the leader opens on the connection the
/// agent made. The agent answers only about its own node and its own attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaderRequest {
    /// Up to `max_bytes` (at most [`LOG_CHUNK_BYTES_MAX`]) of the attempt's stdout and stderr,
    /// from byte `offset` on.
    ReadLogs {
        node: String,
        job: JobId,
        attempt: u32,
        offset: u64,
        max_bytes: u32,
    },
}

/// The agent's answer to a [`LeaderRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaderResponse {
    /// `data` starts at the requested offset; `next_offset` is where the next read starts;
    /// `end` when `data` reaches the end of the log as it is now (a running attempt may
    /// still add to it). A log whose middle the agent dropped (its `--log-max-bytes` cap)
    /// reads as its start, one line `[... N bytes dropped ...]` in place of the dropped bytes,
    /// then its newest part: `next_offset` still counts file bytes, and that line may take
    /// `data` past `max_bytes` by its own length.
    Logs {
        data: Vec<u8>,
        next_offset: u64,
        end: bool,
    },
    Error(AgentError),
}

#[cfg(all(test, feature = "net"))]
mod tests {
    use super::*;
    use crate::transport::RequestError;
    use std::time::Duration;

    #[test]
    fn a_heartbeat_answer_reads_the_same_for_the_agent_and_the_simulated_fleet() {
        let late = || {
            Err(RequestError::Timeout {
                after: Duration::from_millis(500),
            })
        };
        assert!(matches!(
            HeartbeatAnswer::of(Ok(AgentResponse::HeartbeatAck), false),
            HeartbeatAnswer::Acknowledged
        ));
        let busy = AgentResponse::Error(AgentError::Unavailable("no quorum".into()));
        assert!(matches!(
            HeartbeatAnswer::of(Ok(busy), false),
            HeartbeatAnswer::Unavailable(why) if why == "no quorum"
        ));
        // Late with datagrams heard: the leader is there. Late in silence: it is gone.
        assert!(matches!(
            HeartbeatAnswer::of(late(), true),
            HeartbeatAnswer::Late
        ));
        assert!(matches!(
            HeartbeatAnswer::of(late(), false),
            HeartbeatAnswer::Failed(why) if why.contains("no answer within 500 ms")
        ));
        assert!(matches!(
            HeartbeatAnswer::of(Ok(AgentResponse::Error(AgentError::NotRegistered)), true),
            HeartbeatAnswer::Error(AgentError::NotRegistered)
        ));
        assert!(matches!(
            HeartbeatAnswer::of(Ok(AgentResponse::DiskUsageRecorded), false),
            HeartbeatAnswer::Failed(why) if why == "unexpected answer to a heartbeat: DiskUsageRecorded"
        ));
    }
}

#[cfg(all(test, feature = "net"))]
mod frame_limit_tests {
    use super::*;
    use crate::job::{FIELD_BYTES_MAX, JOB_NODES_MAX, LAUNCH_BYTES_MAX};
    use crate::name::NAME_BYTES_MAX;
    use crate::node::{ADDRESS_BYTES_MAX, GPUS_PER_NODE_MAX, GPU_UUID_BYTES_MAX};

    /// The largest spec validation lets through: the launch bytes full, every other field
    /// at its limit.
    fn largest_spec() -> JobSpec {
        let name = |c: char| c.to_string().repeat(NAME_BYTES_MAX);
        let mut spec = JobSpec::new(&name('s'), 1, 1, vec!["x".repeat(FIELD_BYTES_MAX)]);
        spec.name = Some(name('n'));
        spec.owner = Some(name('o'));
        spec.idempotency_key = Some("k".repeat(crate::job::IDEMPOTENCY_KEY_BYTES_MAX));
        spec.payload.image = Some("i".repeat(FIELD_BYTES_MAX));
        while spec.launch_bytes() + 1_000 <= LAUNCH_BYTES_MAX {
            let index = spec.env.len();
            if index == crate::job::ENV_ENTRIES_MAX {
                break;
            }
            spec.env.insert(format!("V{index}"), "v".repeat(990));
        }
        spec.validate().expect("the largest valid spec");
        spec
    }

    /// A node's desired state at its largest (a job on each of its 64 GPUs, each with the
    /// largest spec, as a member of a gang of the most nodes with the longest addresses)
    /// fits one frame: the agent always gets its orders (found by probing: 17 jobs with 1 MiB
    /// of environment each made a desired state over the frame, and the node took no order
    /// again).
    #[test]
    fn the_largest_desired_state_fits_one_frame() {
        let spec = largest_spec();
        let allocation = WireAllocation {
            job: crate::JobId(u64::MAX),
            attempt: u32::MAX,
            gpu_indices: vec![u32::MAX],
            gpu_uuids: vec!["u".repeat(GPU_UUID_BYTES_MAX)],
            spec,
            intent: WireIntent::Run,
            cpu_millis: u32::MAX,
            memory_bytes: u64::MAX,
            gang: Some(WireGang {
                rank: u32::MAX,
                hosts: vec![
                    format!("{}:65535", "h".repeat(ADDRESS_BYTES_MAX));
                    JOB_NODES_MAX as usize
                ],
                master_port: u16::MAX,
            }),
        };
        let desired = DesiredState {
            node: "n".repeat(NAME_BYTES_MAX),
            fence: Fence {
                term: u64::MAX,
                index: u64::MAX,
            },
            allocations: vec![allocation; GPUS_PER_NODE_MAX],
        };
        let frame = crate::frame::encode_frame(&AgentResponse::Desired(desired))
            .expect("the largest desired state is one frame");
        assert!(
            frame.len() <= crate::frame::MAX_FRAME_BYTES,
            "{}",
            frame.len()
        );
        eprintln!(
            "the largest desired state: {} bytes of {}",
            frame.len(),
            crate::frame::MAX_FRAME_BYTES
        );
    }
}
