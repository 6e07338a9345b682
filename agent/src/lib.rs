//! The Quotient agent: runs on every GPU host, reports its GPUs, and runs, checkpoints and
//! preempts the jobs the coordinators place there.
//!
//! The agent is told desired state, not commands (docs/architecture.md): the coordinators
//! push the node's desired allocations with a fence, [`reconcile`] diffs them against
//! what actually runs here, and [`executor`] carries the resulting actions out against a
//! [`runtime::Runtime`].
//!
//! # Layout
//! - [`gpu`]: the `GpuBackend` trait and `DeviceStatus`; [`gpu::nvml`] (real GPUs) and
//!   [`gpu::simulated`] (`--simulated-gpus 8xa10g`).
//! - [`runtime`]: the `Runtime` trait, `LaunchSpec` and the job environment;
//!   [`runtime::process`] (process groups with pid files) and [`runtime::docker`] (bollard).
//! - [`reconcile`]: the pure diff of desired allocations against local jobs.
//! - [`executor`]: carries reconcile's actions out, tracks grace-period deadlines.
//! - [`config`]: the command line of `quotient-agent`.
//! - [`cluster`]: the cluster this agent belongs to, kept in its state dir.
//! - [`session`]: the session with the coordinators (ALPN `quotient-agent/1`): leader
//!   finding, registration, heartbeats, the desired-state long poll, reports; and the
//!   self-fencing timing contract.
//! - [`lease`]: the self-fencing lease clock.
//! - [`log_server`]: answers the leader's log reads on the agent's own connection.
//! - [`disk`]: the cap on each attempt's log, the retention of old jobs' logs and checkpoint
//!   dirs, and the disk use reported to the leader.
//! - [`journal`]: unacknowledged reports, finished attempts and the last heartbeat answer,
//!   kept across restarts in the state dir.
//! - [`run`]: the long-running agent, `run(config, shutdown)`: the executor loop and the
//!   session.

pub mod checkpoints;
pub mod cluster;
pub mod config;
pub mod disk;
pub mod executor;
pub mod gpu;
pub mod host_info;
pub mod journal;
pub mod lease;
pub mod log_server;
pub mod metrics;
pub mod reconcile;
pub mod run;
pub mod runtime;
pub mod session;
