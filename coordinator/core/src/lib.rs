//! The pure, deterministic core of Quotient: the replicated state machine and the scheduler.
//!
//! No tokio, no clock, no I/O, no hash-map iteration: the same commands give the same bytes on
//! every replica. The coordinator wraps this crate in Raft; everything here is testable alone.
//!
//! # Layout
//! - [`state`]: `State`, the canonical replicated data (`StateData`) and its records.
//! - [`index`]: queues, usage counters and free-capacity buckets derived from the data.
//! - [`job_table`]: `JobTable`, the job records in chunks that never move.
//! - [`command`]: `Command`, `ApplyCtx`, `Outcome` and `Rejection`.
//! - [`apply`](mod@apply): the transition function.
//! - [`changes`]: `Changes`, what applying commands changed.
//! - [`rules`]: the quota rules shared by the scheduler and `apply`.
//! - [`scheduler`]: `plan(&State) -> Plan`, one round of docs/quota-shares.md.
//! - [`plan`]: the plan a round produces and Raft commits.
//! - [`reason`]: why a job waits, as data.
//! - [`explain`](mod@explain): why a job waits or was preempted, in words.
//! - [`accounting`]: usage, borrowed and lent per share.
//! - [`validate`]: `State::validate`, the invariants.
//! - [`snapshot`]: state to bytes and back.
//! - [`limits`]: named maxima.

pub mod accounting;
pub mod apply;
pub mod aws;
pub mod changes;
pub mod command;
pub mod events;
pub mod explain;
pub mod index;
pub mod job_table;
pub mod limits;
pub mod plan;
pub mod reason;
pub mod retention;
pub mod rules;
pub mod scheduler;
pub mod sessions;
pub mod snapshot;
pub mod state;
pub mod tenancy;
pub mod usage;
pub mod v1;
pub mod v2;
pub mod v3;
pub mod v4;
pub mod v5;
pub mod v6;
pub mod validate;

pub use accounting::{share_accounts, ShareAccount};
pub use apply::{apply, apply_noting};
pub use changes::Changes;
pub use command::{
    ApplyCtx, Caller, Command, DigestAt, JobEvent, JobReport, Outcome, PlanReport, Rejection,
};
pub use explain::{explain, Explanation};
pub use plan::{Plan, PlanAction};
pub use reason::{GangWait, LaunchFailure, WaitReason};
pub use scheduler::{
    plan, plan_avoiding, plan_choosing, plan_ordered, plan_with, BorrowOrder, VictimOrder,
    DEFAULT_TOPOLOGY_KEY,
};
pub use snapshot::{SnapshotCapture, SnapshotError, SNAPSHOT_STATE_MAGIC};
pub use state::{
    mask_indices, Allocation, AuditEntry, IdempotencyKeys, JobRecord, MemberStage, NodeId,
    NodeRecord, Preemption, PreemptionKind, Revocation, ShareRecord, State, StateData, StopCause,
    WaitReasons,
};
pub use validate::InvariantError;
