//! Why a RUNNABLE job waits, or why a job ended: data the scheduler writes and `explain` reads.
//!
//! Every variant names the limit it hits, as spec rule 6 asks, and its `Display` says it in
//! words a user can act on.

use serde::{Deserialize, Serialize};
use std::fmt;

use quotient_common::job::LaunchFault;
use quotient_common::{GpuClass, JobId};

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitReason {
    /// The share is at its limit and its strategy does not borrow.
    ShareLimit {
        share: String,
        class: GpuClass,
        limit: u64,
        usage: u64,
    },
    /// The share borrows, but this job would take it past its borrow limit.
    BorrowLimit {
        share: String,
        class: GpuClass,
        cap: u64,
        usage: u64,
    },
    /// The share is at its limit and no capacity is free to borrow (idle quota of `reserve`
    /// shares is never lent).
    NoBorrowableCapacity {
        share: String,
        class: GpuClass,
        reserved_idle: u64,
    },
    /// The job is within its share's limit, but the class has no free GPUs and no share is
    /// borrowing any that could be reclaimed.
    NoFreeCapacity { class: GpuClass, free: u64 },
    /// Enough GPUs are free in total, but not on one node.
    Fragmented { class: GpuClass, gpus: u32 },
    /// The job asks for more GPUs than the largest schedulable node of its class has.
    LargestNode {
        class: GpuClass,
        gpus: u32,
        largest: u32,
    },
    /// The job asks for more GPUs than its share could ever hold.
    ExceedsShareCap {
        share: String,
        class: GpuClass,
        gpus: u32,
        cap: u64,
    },
    /// GPUs are being freed for this job on a node; it starts when they are.
    WaitingForPreemption { node: String, victims: Vec<JobId> },
    /// A job earlier in the same queue is waiting; this one is behind it.
    QueuedBehind { job: JobId },
    /// A terminal reason: how the job ended.
    Ended(String),
    /// Its last attempt could not be launched on `node` after `tries` tries. A fault of the
    /// job ends it FAILED; a fault of the node sends it back to the queue, and fails it once
    /// that has happened more than `requeues_max` times.
    ///
    /// This variant and [`WaitReason::GangWaiting`] are the largest; boxed, they keep every
    /// job's reason small (a finished job keeps one for as long as retention says). A box
    /// encodes as what it holds, so the encoding is that of the fields inline.
    LaunchFailed(Box<LaunchFailure>),
    /// Nodes have the GPUs, but none of them can run the job otherwise: `unfit` says why
    /// not on the first such node (no Docker, the image missing, too few CPUs or memory).
    NodeUnfit {
        class: GpuClass,
        gpus: u32,
        unfit: String,
    },
    /// A job of several nodes, within its share's quota, waits for enough whole nodes:
    /// `nodes` nodes with `gpus` free GPUs each (all with one value of label `same`, if
    /// set); `qualify` have them now; `held` are the nodes kept free for it as they drain.
    GangWaiting(Box<GangWait>),
    /// A job of several nodes asks for more nodes than the class has (schedulable, with its
    /// GPUs per node).
    TooFewNodes {
        class: GpuClass,
        gpus: u32,
        nodes: u32,
        have: u32,
    },
    /// A job of several nodes bound to one value of label `same` (`--same`) asks for more
    /// nodes than any value has (schedulable, with its GPUs per node): `most` is the most
    /// any value has. Appended last, so that every earlier variant keeps its encoding.
    SameTooFew {
        class: GpuClass,
        gpus: u32,
        nodes: u32,
        same: String,
        most: u32,
    },
}

/// What [`WaitReason::LaunchFailed`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchFailure {
    pub node: String,
    pub tries: u32,
    pub fault: LaunchFault,
    /// The runtime's last error, as the agent reported it.
    pub message: String,
    /// Times the job went back to the queue after a node's launch failure, this one
    /// included when the fault was the node's.
    pub requeues: u32,
    pub requeues_max: u32,
}

/// What [`WaitReason::GangWaiting`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangWait {
    pub class: GpuClass,
    pub gpus: u32,
    pub nodes: u32,
    pub same: Option<String>,
    pub qualify: u32,
    pub held: Vec<String>,
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitReason::ShareLimit { share, class, limit, usage } => write!(
                f,
                "share {share} is at its limit of {limit} {class} GPUs (using {usage}) and its strategy does not borrow; it runs when one of its own jobs ends"
            ),
            WaitReason::BorrowLimit { share, class, cap, usage } => write!(
                f,
                "share {share} would pass its borrow limit: at most {cap} {class} GPUs in all (using {usage}); it runs when one of its own jobs ends"
            ),
            WaitReason::NoBorrowableCapacity { share, class, reserved_idle } => write!(
                f,
                "share {share} is at its limit and no {class} capacity is free to borrow ({reserved_idle} idle GPUs are reserved by reserve shares and never lent); it runs when a GPU is freed"
            ),
            WaitReason::NoFreeCapacity { class, free } => write!(
                f,
                "within its share's limit, but only {free} {class} GPUs are free and no share is borrowing any to reclaim; it runs when a job of its class ends or a node joins"
            ),
            WaitReason::Fragmented { class, gpus } => write!(
                f,
                "no single node has {gpus} free {class} GPUs; it runs when jobs on one node end"
            ),
            WaitReason::LargestNode { class, largest: 0, .. } => write!(
                f,
                "no schedulable node has {class} GPUs; add nodes of class {class}, or submit it again with a --gpu-class that `quotient node list` shows"
            ),
            WaitReason::LargestNode { class, gpus, largest } => write!(
                f,
                "asks for {gpus} {class} GPUs on one node, but the largest schedulable node has {largest}; resubmit with fewer GPUs or add a larger node"
            ),
            WaitReason::ExceedsShareCap { share, class, gpus, cap } => write!(
                f,
                "asks for {gpus} {class} GPUs, more than share {share} may ever hold ({cap}); raise the share's limit or resubmit with fewer GPUs"
            ),
            WaitReason::WaitingForPreemption { node, victims } => {
                write!(f, "GPUs are being freed for it on {node} by preempting")?;
                for (i, v) in victims.iter().enumerate() {
                    write!(f, "{}{v}", if i == 0 { " " } else { ", " })?;
                }
                Ok(())
            }
            WaitReason::QueuedBehind { job } => {
                write!(f, "queued behind {job}, which is ahead of it in its share's queue")
            }
            WaitReason::Ended(text) => f.write_str(text),
            WaitReason::NodeUnfit { class, gpus, unfit } => write!(
                f,
                "no ready node with {gpus} free {class} GPUs can run it; on the first: {unfit}"
            ),
            WaitReason::GangWaiting(wait) => {
                let GangWait { class, gpus, nodes, same, qualify, held } = &**wait;
                write!(f, "needs {nodes} nodes with {gpus} free {class} each")?;
                if let Some(key) = same {
                    write!(f, " sharing one {key}")?;
                }
                write!(f, "; {qualify} qualify")?;
                if !held.is_empty() {
                    let word = if held.len() == 1 { "node" } else { "nodes" };
                    let verb = if held.len() == 1 { "is" } else { "are" };
                    write!(f, "; {word} {} {verb} held for it", held.join(", "))?;
                }
                Ok(())
            }
            WaitReason::TooFewNodes { class, gpus, nodes, have } => write!(
                f,
                "asks for {nodes} nodes with {gpus} {class} GPUs each, but only {have} schedulable nodes have that many; resubmit with fewer nodes or add nodes"
            ),
            WaitReason::SameTooFew { class, gpus, nodes, same, most: 0 } => write!(
                f,
                "asks for {nodes} nodes with {gpus} {class} GPUs each sharing one {same}, but no schedulable node with that many has the label {same}; label nodes (the agent's --label {same}=VALUE) or resubmit without --same"
            ),
            WaitReason::SameTooFew { class, gpus, nodes, same, most } => write!(
                f,
                "asks for {nodes} nodes with {gpus} {class} GPUs each sharing one {same}, but no value of {same} has more than {most} schedulable nodes with that many; resubmit with fewer nodes or without --same, or add nodes"
            ),
            WaitReason::LaunchFailed(failure) => {
                let LaunchFailure { node, tries, fault, message, requeues, requeues_max } =
                    &**failure;
                let tries_word = if *tries == 1 { "try" } else { "tries" };
                write!(f, "launch failed on node {node} after {tries} {tries_word}: {message}; ")?;
                match fault {
                    LaunchFault::Job => f.write_str(
                        "the job cannot start as submitted: fix its command, image or environment and submit it again",
                    ),
                    LaunchFault::Node if requeues <= requeues_max => write!(
                        f,
                        "a fault of the node, so the job went back to the queue ({requeues} of at most {requeues_max} times)"
                    ),
                    LaunchFault::Node => write!(
                        f,
                        "a fault of the node, and the job failed to launch {requeues} times, more than the {requeues_max} requeues allowed: fix the nodes (see their agents' logs) and submit it again"
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boxed variants encode as the struct variants they were: the variant's number,
    /// then the fields in order (snapshots and log entries written before still read).
    #[test]
    fn boxed_variants_encode_as_their_fields_inline() {
        fn encode<T: Serialize>(value: &T) -> Vec<u8> {
            bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap()
        }
        let failure = LaunchFailure {
            node: "gpu-1".into(),
            tries: 3,
            fault: LaunchFault::Node,
            message: "no such image".into(),
            requeues: 1,
            requeues_max: 5,
        };
        let inline = (
            10u32,
            (
                "gpu-1",
                3u32,
                LaunchFault::Node,
                "no such image",
                1u32,
                5u32,
            ),
        );
        assert_eq!(
            encode(&WaitReason::LaunchFailed(Box::new(failure))),
            encode(&inline)
        );
        let wait = GangWait {
            class: GpuClass::parse("a10g").unwrap(),
            gpus: 8,
            nodes: 4,
            same: Some("rack".into()),
            qualify: 2,
            held: vec!["n1".into()],
        };
        let inline = (12u32, ("a10g", 8u32, 4u32, Some("rack"), 2u32, vec!["n1"]));
        assert_eq!(
            encode(&WaitReason::GangWaiting(Box::new(wait))),
            encode(&inline)
        );
    }
}
