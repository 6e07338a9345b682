//! The commands the state machine applies, the context each is applied in, and outcomes.
//!
//! A rejection is data, not an `Err` (TigerBeetle's result codes): it is replicated like any
//! other outcome, so every replica agrees on what was refused and why.

use serde::{Deserialize, Serialize};

// An agent's report is replicated as it was sent; its home is the protocol crate.
pub use quotient_common::job_report::{JobEvent, JobReport};
use quotient_common::{JobId, JobSpec, NodeInventory, NodeState, ShareSpec, ShareUpdate};

/// Why a command was refused: defined beside the API's errors, which carry it whole to
/// clients ([`quotient_common::api::ApiError::Rejected`]).
pub use quotient_common::Rejection;

use crate::plan::Plan;
use crate::state::NodeId;

/// Where and when a command is applied: the leader stamps the time; `apply` never reads a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyCtx {
    pub log_index: u64,
    pub time_ms: u64,
}

/// Everything that changes the replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    CreateShare(ShareSpec),
    UpdateShare {
        name: String,
        update: ShareUpdate,
    },
    DisableShare {
        name: String,
    },
    /// Needs the share disabled; its remaining jobs are cancelled.
    DeleteShare {
        name: String,
    },
    SubmitJob(JobSpec),
    UpdateJobPriority {
        job: JobId,
        priority: u32,
    },
    CancelJob {
        job: JobId,
    },
    /// Adds a node or updates its inventory; a lost node comes back ready.
    RegisterNode(NodeInventory),
    SetNodeState {
        node: String,
        state: NodeState,
    },
    CordonNode {
        node: String,
    },
    DrainNode {
        node: String,
    },
    SetGpuHealth {
        node: String,
        index: u32,
        healthy: bool,
    },
    /// The node missed its lease: its jobs are requeued (preemption reason node-lost).
    MarkNodeLost {
        node: String,
    },
    ApplyPlan(Plan),
    ReportJob(JobReport),
    /// Forgets a node that is out of service (cordoned, draining or lost) and holds no job:
    /// its name is gone from the state and its slot is taken by the next new node. An agent
    /// that registers under its name later is a new node.
    RemoveNode {
        node: String,
    },
    /// Has every replica check that its state is the leader's: `leader` is the digest the
    /// leader's state had after the entry of the previous such command, which each replica
    /// compares with its own digest there, and each records its digest after this entry for the
    /// next one (the coordinator's `digest_check`). Changes nothing in the state.
    CheckDigest {
        leader: Option<DigestAt>,
    },
    /// The leader saw attempt `attempt` of `job` run past the job's time limit: the job is
    /// stopped with its checkpoint signal and grace period, and the attempt ends as a failure
    /// with the reason `time limit`.
    StopAtTimeLimit {
        job: JobId,
        attempt: u32,
    },
    /// The leader saw attempt `attempt` of `job`, a job of several nodes, not running on every
    /// member within the start timeout: the attempt is stopped (its members get the checkpoint
    /// signal and grace period) and the job goes back to the queue, so that no gang is left
    /// half-running.
    StopUnstarted {
        job: JobId,
        attempt: u32,
    },
    /// `command`, asked for by `caller` through the API: `apply` checks the caller's rights
    /// on it (a share's members, a job's owner, the per-user cap) and records it in the audit
    /// log when the caller is an admin or is refused for lack of rights.
    As {
        caller: Caller,
        #[serde(deserialize_with = "quotient_common::nesting::shallow_box")]
        command: Box<Command>,
    },
    /// A refusal for lack of rights decided outside `apply` (a role without the right, logs of
    /// another's job): only recorded in the audit log.
    RecordRefusal {
        caller: Caller,
        action: String,
        reason: String,
    },
    /// Declares a group of users, for shares' `group:NAME` members.
    CreateGroup {
        name: String,
        users: Vec<String>,
    },
    UpdateGroup {
        name: String,
        add: Vec<String>,
        remove: Vec<String>,
    },
    DeleteGroup {
        name: String,
    },
    /// Revokes the certificates of `name` (of every role; of one serial when given): every
    /// coordinator refuses them from this entry on. An agent's node is lost with it.
    Revoke {
        name: String,
        serial: Option<String>,
    },
    Unrevoke {
        name: String,
    },
    /// Removes the finished jobs whose retention is over, and the idempotency keys whose
    /// window is over, as of the entry's time (`crate::retention`). Proposed by the leader.
    ExpireFinished(crate::retention::RetentionRule),
    /// Issues an access key for the AWS endpoint (`crate::aws`); the coordinator that took
    /// the request made its id and secret.
    CreateAccessKey {
        id: String,
        user: String,
        admin: bool,
        secret: String,
    },
    DeleteAccessKey {
        id: String,
    },
    /// Sets (`Some`) or deletes (`None`) an object of the AWS endpoint (`KIND/NAME`).
    PutAwsObject {
        key: String,
        value: Option<String>,
    },
    /// Submits a job through the AWS endpoint, keeping the request it came in (JSON).
    SubmitServiceJob {
        spec: JobSpec,
        request: String,
    },
    /// `command`, a client's write tagged with its session (`crate::sessions`): applied at
    /// most once, however many copies of it are logged.
    InSession {
        tag: quotient_common::api::WriteTag,
        #[serde(deserialize_with = "quotient_common::nesting::shallow_box")]
        command: Box<Command>,
    },
}

/// Who asked for a command through the API: the identity of their certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// The name in the certificate.
    pub name: String,
    /// Whether the certificate's role is admin (else user).
    pub admin: bool,
}

impl Caller {
    /// How the audit log names the caller: `quotient://admin/alice`.
    pub fn identity(&self) -> String {
        let role = if self.admin { "admin" } else { "user" };
        format!("quotient://{role}/{}", self.name)
    }
}

/// A state's digest after the log entry at `index` (see [`Command::CheckDigest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestAt {
    pub index: u64,
    pub digest: u64,
}

/// The result of applying one action of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanReport {
    pub placed: u32,
    pub preempted: u32,
    pub nominated: u32,
    /// Stale actions, by position in the plan, with why they were refused.
    pub rejected: Vec<(u32, Rejection)>,
}

/// What applying a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Done,
    JobSubmitted { job: JobId, duplicate: bool },
    NodeRegistered { node: NodeId, incarnation: u64 },
    PlanApplied(PlanReport),
    Rejected(Rejection),
}

impl Outcome {
    pub fn is_rejected(&self) -> bool {
        matches!(self, Outcome::Rejected(_))
    }
}
