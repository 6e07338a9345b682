//! Named maxima of the replicated state, so that no queue or map grows without a bound
//! that someone chose on purpose.

/// The most shares a cluster holds.
pub const SHARES_MAX: usize = 10_000;
/// The most nodes a cluster holds.
pub const NODES_MAX: usize = 100_000;
/// The most jobs that are not terminal at one time, cluster-wide: a submit beyond it is
/// rejected until some end. Bounds the queues and what a round may have to look at.
pub const ACTIVE_JOBS_MAX: usize = 5_000_000;
/// The most jobs the state holds, terminal ones included (until retention removes them:
/// `crate::retention`).
pub const JOBS_MAX: usize = 50_000_000;
/// How many borrowed jobs one reclaim attempt looks at before it gives up on this round.
/// Bounds the cost of a round when borrowed jobs are scattered too thinly to free a node.
pub const RECLAIM_CANDIDATES_SCAN_MAX: usize = 4_096;
/// How many of its own jobs one in-share preemption attempt looks at.
pub const IN_SHARE_CANDIDATES_SCAN_MAX: usize = 4_096;
/// Once a node would do for a preemptor of one node, how many more victims of the same
/// priority the search looks at for a node whose victims lose less work in all.
pub const VICTIM_NODES_SCAN_MORE_MAX: usize = 256;
/// How many jobs of a queue [`crate::state::State::queue_head_that_fits`] looks at for its
/// head, the first that can fit. Bounds what `job list` spends to say what each waiting job
/// is behind.
pub const QUEUE_HEAD_SCAN_MAX: usize = 1_024;
/// The largest snapshot `State::from_snapshot_bytes` decodes.
pub const SNAPSHOT_BYTES_MAX: usize = 4 << 30;
/// How many times a job goes back to the queue because its attempt could not be launched
/// for a fault of the node; the next such failure fails it. A job that never launches on any
/// node must not cycle through the queue forever.
pub const LAUNCH_REQUEUES_MAX: u32 = 3;
