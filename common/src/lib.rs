//! Types that every Quotient part shares: the domain vocabulary of quota shares, jobs and nodes.
//!
//! # Layout
//! - [`name`]: validation of share, job and node names.
//! - [`gpu_class`]: normalised GPU class names, mapped from NVML model strings.
//! - [`share`]: the share spec (limits, strategy, borrow limit, in-share preemption, state).
//! - [`job`]: the job spec, job ids and job states.
//! - [`node`]: node inventory (GPUs per host) and node states.
//! - [`spec_error`]: the validation error every spec returns, worded to say what to do.
//!
//! Everything here is plain data with `serde` derives and no clock or I/O, so the pure
//! state machine in `quotient-core` can replicate it byte for byte.

pub mod gpu_class;
pub mod job;
pub mod name;
pub mod node;
pub mod share;
pub mod spec_error;

pub use gpu_class::GpuClass;
pub use job::{JobId, JobPayload, JobSpec, JobState, Signal};
pub use node::{GpuDevice, NodeInventory, NodeState, GPUS_PER_NODE_MAX};
pub use share::{ShareSpec, ShareState, ShareUpdate, Strategy};
pub use spec_error::SpecError;
