//! The commands the state machine applies, the context each is applied in, and outcomes.
//!
//! A rejection is data, not an `Err` (TigerBeetle's result codes): it is replicated like any
//! other outcome, so every replica agrees on what was refused and why.

use serde::{Deserialize, Serialize};

// An agent's report is replicated as it was sent; its home is the protocol crate.
pub use quotient_common::job_report::{JobEvent, JobReport};
use quotient_common::{
    JobId, JobSpec, JobState, NodeInventory, NodeState, ShareSpec, ShareUpdate, SpecError,
};

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
    NodeRegistered { node: NodeId, epoch: u64 },
    PlanApplied(PlanReport),
    Rejected(Rejection),
}

impl Outcome {
    pub fn is_rejected(&self) -> bool {
        matches!(self, Outcome::Rejected(_))
    }
}

/// Why a command was refused. Nothing in the state changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("{0}")]
    Invalid(SpecError),
    #[error("no share named {0}: list shares with `quotient share list`")]
    UnknownShare(String),
    #[error("a share named {0} already exists: pick another name or use `quotient share update`")]
    DuplicateShare(String),
    #[error(
        "share {0} is enabled: disable it first with `quotient share update {0} --state disabled`"
    )]
    ShareEnabled(String),
    #[error("share {0} is disabled and refuses new jobs: enable it with `quotient share update {0} --state enabled`")]
    ShareDisabled(String),
    #[error("share {share} has no limit for GPU class {class}: use one of {classes}")]
    UnknownClass {
        share: String,
        class: String,
        classes: String,
    },
    #[error("share {share} has limits for several GPU classes ({classes}): pass --gpu-class")]
    ClassRequired { share: String, classes: String },
    #[error("no job {0}: list jobs with `quotient job list`")]
    UnknownJob(JobId),
    #[error("job {job} is {state} and can no longer change")]
    JobTerminal { job: JobId, state: JobState },
    #[error("no node named {0}: list nodes with `quotient node list`")]
    UnknownNode(String),
    #[error("node {0} is lost: it must register again before its state can change")]
    NodeLost(String),
    #[error("node {node} has no GPU with index {index}")]
    UnknownGpu { node: String, index: u32 },
    #[error("the cluster holds its maximum of {max} {what}")]
    TooMany { what: String, max: u64 },
    #[error("stale report for {job} attempt {attempt} from {node}: {why}")]
    StaleReport {
        job: JobId,
        attempt: u32,
        node: String,
        why: String,
    },
    #[error("stale plan action: {0}")]
    StalePlan(String),
    #[error(
        "node {0} is ready and may be given jobs at any moment: cordon it first \
         (`quotient node cordon {0}`, or `quotient node drain {0}` to move its jobs off), stop its \
         agent, then remove it"
    )]
    NodeReady(String),
    #[error(
        "node {node} still holds {jobs} job(s), {first} first: drain it (`quotient node drain \
         {node}`) and remove it once `quotient node list` shows none of its GPUs held"
    )]
    NodeHasJobs {
        node: String,
        jobs: u64,
        first: JobId,
    },
}
