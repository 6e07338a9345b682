//! [`Changes`]: what applying commands changed, named once by `apply` so that what follows
//! from an apply (the leader's desired state per node, scheduling rounds, later metrics) costs
//! in proportion to what changed, not to the fleet.
//!
//! Each set names the records a view of that kind must look at again:
//! - `jobs`: job records added, changed or removed (by retention: `State::job` has none);
//! - `nodes`: node records added, changed or removed, and the nodes where a changed job held
//!   or now holds GPUs (what that node's agent is told to run follows its jobs);
//! - `shares`: share records added, changed or removed, and the shares of changed jobs (a
//!   share's usage and queue follow its jobs).
//!
//! A rejected command changes nothing and adds nothing. `apply_noting` records only while the
//! caller asks for it, so `apply` alone pays nothing for it.

use std::collections::BTreeSet;

use quotient_common::JobId;

use crate::state::{JobRecord, NodeId, State};

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub jobs: BTreeSet<JobId>,
    pub nodes: BTreeSet<NodeId>,
    pub shares: BTreeSet<String>,
}

impl Changes {
    pub fn new() -> Changes {
        Changes::default()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.nodes.is_empty() && self.shares.is_empty()
    }

    /// How many records are named, of all kinds together.
    pub fn len(&self) -> usize {
        self.jobs.len() + self.nodes.len() + self.shares.len()
    }

    pub fn clear(&mut self) {
        self.jobs.clear();
        self.nodes.clear();
        self.shares.clear();
    }

    /// Adds everything `other` names.
    pub fn extend(&mut self, other: Changes) {
        self.jobs.extend(other.jobs);
        self.nodes.extend(other.nodes);
        self.shares.extend(other.shares);
    }

    /// Notes a job that changed from `old` to `new` (the same job): the job, its share, and
    /// the nodes where it held or holds GPUs.
    pub(crate) fn job_changed(&mut self, old: &JobRecord, new: &JobRecord) {
        self.jobs.insert(new.id);
        if !self.shares.contains(&new.spec.share) {
            self.shares.insert(new.spec.share.clone());
        }
        for allocation in old.placement.iter().chain(&new.placement) {
            self.nodes.insert(allocation.node);
        }
    }

    /// Notes a job that was just added.
    pub(crate) fn job_added(&mut self, job: &JobRecord) {
        self.job_changed(job, job);
    }
}

impl State {
    /// Notes a changed node record, while a caller of `apply_noting` records changes.
    pub(crate) fn note_node(&mut self, node: NodeId) {
        if let Some(changes) = self.changes.as_mut() {
            changes.nodes.insert(node);
        }
    }

    /// Notes a change of a job that holds no GPUs, of `share`, made in place.
    pub(crate) fn note_queued_job(&mut self, job: JobId, share: String) {
        if let Some(changes) = self.changes.as_mut() {
            changes.jobs.insert(job);
            changes.shares.insert(share);
        }
    }

    /// Notes a changed share record, while a caller of `apply_noting` records changes.
    pub(crate) fn note_share(&mut self, share: &str) {
        if let Some(changes) = self.changes.as_mut() {
            if !changes.shares.contains(share) {
                changes.shares.insert(share.to_string());
            }
        }
    }
}
