//! A plan: what one scheduling round decided, proposed to Raft as one command.
//!
//! The leader computes a plan from its state with `scheduler::plan`, commits it, and every
//! replica applies it with `apply`, which re-checks each action against the state at that
//! point and rejects stale ones deterministically (Nomad's plan/apply split).

use serde::{Deserialize, Serialize};

use quotient_common::JobId;

use crate::reason::WaitReason;
use crate::state::{NodeId, PreemptionKind};

/// One decision of a round. Actions apply in order; a later action may rely on an earlier one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanAction {
    /// Bind GPUs (a mask of indices on one node) to a RUNNABLE job.
    Place {
        job: JobId,
        node: NodeId,
        gpu_mask: u64,
    },
    /// Send a job holding GPUs its checkpoint signal; it goes to PREEMPTING.
    Preempt {
        job: JobId,
        kind: PreemptionKind,
        for_job: Option<JobId>,
    },
    /// Keep GPUs on a node for a RUNNABLE job while its victims exit.
    Nominate { job: JobId, node: NodeId },
    /// Drop a nomination that can no longer help: its victims are gone and it does not fit.
    ClearNomination { job: JobId },
    /// Bind GPUs on several nodes to a RUNNABLE job of several nodes, one member per node in
    /// rank order: all of them, or none.
    PlaceMembers {
        job: JobId,
        members: Vec<(NodeId, u64)>,
    },
    /// Keep GPUs on several nodes (one per member) for a RUNNABLE job of several nodes,
    /// while its victims exit or the jobs there end.
    NominateNodes { job: JobId, nodes: Vec<NodeId> },
}

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub actions: Vec<PlanAction>,
    /// Why each queue head that could not start waits.
    pub waiting: Vec<(JobId, WaitReason)>,
}

impl Plan {
    /// True when the plan changes nothing, so the leader need not commit it.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty() && self.waiting.is_empty()
    }

    /// Every member placement of the plan: (job, node, GPU mask), a job of several nodes once
    /// per member.
    pub fn placements(&self) -> impl Iterator<Item = (JobId, NodeId, u64)> + '_ {
        self.actions.iter().flat_map(|a| {
            let members: Vec<(JobId, NodeId, u64)> = match a {
                PlanAction::Place {
                    job,
                    node,
                    gpu_mask,
                } => vec![(*job, *node, *gpu_mask)],
                PlanAction::PlaceMembers { job, members } => {
                    members.iter().map(|(n, m)| (*job, *n, *m)).collect()
                }
                _ => Vec::new(),
            };
            members
        })
    }

    pub fn preemptions(&self) -> impl Iterator<Item = (JobId, PreemptionKind, Option<JobId>)> + '_ {
        self.actions.iter().filter_map(|a| match a {
            PlanAction::Preempt { job, kind, for_job } => Some((*job, *kind, *for_job)),
            _ => None,
        })
    }
}
