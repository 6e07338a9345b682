//! Types that every Quotient part shares: the domain vocabulary of quota shares, jobs and nodes.
//!
//! # Layout
//! - [`agent_api`]: the agent protocol's messages and the fence.
//! - [`api`]: the client API's requests, responses and views (docs/cli.md's JSON).
//! - [`bounded_read`]: reading a whole text file of bounded size.
//! - [`cluster_id`]: a cluster's identity, carried in every exchange between its parts.
//! - [`error_code`]: the stable code of every error a client can get (docs/errors.md).
//! - [`name`]: validation of share, job and node names.
//! - [`gpu_class`]: normalised GPU class names, mapped from NVML model strings.
//! - [`share`]: the share spec (limits, strategy, borrow limit, in-share preemption, state).
//! - [`job`]: the job spec, job ids and job states.
//! - [`job_name`]: the name a job gets when it is submitted without one.
//! - [`job_report`]: what an agent saw happen to an attempt, from its runtime to the replicated
//!   state.
//! - [`node`]: node inventory (GPUs per host) and node states.
//! - [`spec_error`]: the validation error every spec returns, worded to say what to do.
//! - [`rejection`]: why the state machine refused a command, carried whole to clients.
//! - [`retention`]: the bounds of the retention of finished jobs.
//! - [`rng`]: the seeded random source of the simulators.
//! - [`version`]: the version of every encoding that outlives a process, and the error that
//!   refuses one this build does not read.
//!
//! With the `net` feature (the coordinator, agent and CLI turn it on):
//! - `certs`: the cluster CA and certificates that carry a role and a name (rcgen).
//! - `frame`: bincode frames with a header of their encoding's version, size-checked before
//!   decoding.
//! - `tls`: rustls configs with the ring provider, mutual TLS required.
//! - `transport`: QUIC endpoints (quinn), peer identities, request/response helpers.
//!
//! Without it, everything here is plain data with `serde` derives and no clock or I/O, so the
//! pure state machine in `quotient-core` can replicate it byte for byte and links no tokio.

pub mod agent_api;
pub mod api;
pub mod args;
pub mod backup;
pub mod bounded_read;
#[cfg(feature = "net")]
pub mod certs;
pub mod cluster_id;
pub mod duration;
pub mod env_vars;
pub mod error_code;
pub mod event;
#[cfg(feature = "net")]
pub mod frame;
pub mod gpu_class;
#[cfg(feature = "metrics")]
pub mod http_door;
pub mod job;
pub mod job_name;
pub mod job_report;
pub mod log_format;
#[cfg(feature = "metrics")]
pub mod metrics_http;
pub mod name;
pub mod nesting;
pub mod node;
pub mod packed;
pub mod rejection;
pub mod retention;
pub mod retry;
pub mod rng;
pub mod share;
pub mod spec_error;
pub mod steady_clock;
#[cfg(feature = "net")]
pub mod tls;
#[cfg(feature = "net")]
pub mod transport;
pub mod version;

pub use args::Args;
pub use cluster_id::ClusterId;
pub use env_vars::EnvVars;
pub use error_code::ErrorCode;
pub use gpu_class::GpuClass;
pub use job::{JobId, JobPayload, JobSpec, JobState, Signal};
pub use job_report::{JobEvent, JobReport};
pub use node::{GpuDevice, HostInfo, NodeInventory, NodeState, Runtime, GPUS_PER_NODE_MAX};
pub use rejection::Rejection;
pub use retry::{RetryAction, RetryPolicy, RetryRule};
pub use share::{ShareSpec, ShareState, ShareUpdate, Strategy};
pub use spec_error::SpecError;
