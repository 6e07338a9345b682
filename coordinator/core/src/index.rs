//! Indexes derived from the canonical state, kept in step by `apply`.
//!
//! A scheduling round over 200,000 queued jobs on 10,000 nodes cannot afford to scan them:
//! it reads the head of each share's queue, the usage counters, and buckets of nodes by free
//! GPU count. All of that lives here. Everything is a `BTreeMap`/`BTreeSet` keyed by canonical
//! values, so an index rebuilt from a snapshot is equal to one maintained by `apply`, and
//! `State::validate` checks exactly that.
//!
//! The only way to change a job is to `remove_job` its old record and `add_job` the new one;
//! the only way to change a node is `refresh_node` after the change.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use quotient_common::{GpuClass, JobId, JobState};

use crate::rules::reserved_idle_of;
use crate::state::{JobRecord, NodeId, NodeRecord, StateData, StopCause};

/// A queued job's key: priority descending, then submit order (the id) ascending.
pub type QueueKey = (Reverse<u32>, JobId);
/// A holding job's key: priority descending, then start order ascending.
pub type HoldingKey = (Reverse<u32>, u64, JobId);

/// One share's jobs of one GPU class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareClassIndex {
    pub runnable: BTreeSet<QueueKey>,
    /// `runnable` split by the GPUs each job asks for, so that a round can pass over the
    /// sizes that can never fit without visiting their jobs.
    pub runnable_by_gpus: BTreeMap<u32, BTreeSet<QueueKey>>,
    pub holding: BTreeSet<HoldingKey>,
    /// GPUs held by the jobs in `holding`.
    pub usage: u64,
    /// GPUs held by the jobs in `holding` that are PREEMPTING.
    pub preempting: u64,
}

/// One node's GPUs of one class, as the placement search sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeSlot {
    /// Healthy, unallocated GPUs of this class (zero when the node is not schedulable).
    pub free_mask: u64,
    /// GPUs kept free for nominated jobs.
    pub nominated: u32,
    /// Healthy GPUs of this class on the node, allocated or not.
    pub healthy: u32,
}

impl NodeSlot {
    /// Free GPUs that a job without a nomination here may take.
    pub fn available(&self) -> u32 {
        self.free_mask.count_ones().saturating_sub(self.nominated)
    }
}

/// The free capacity of one GPU class across schedulable nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassCapacity {
    pub slots: BTreeMap<NodeId, NodeSlot>,
    /// `buckets[k]` holds the nodes with exactly `k` available GPUs (k >= 1).
    pub buckets: Vec<BTreeSet<NodeId>>,
    /// The sum of `available()` over all slots.
    pub available_total: u64,
    /// The sum of healthy GPUs over all slots (schedulable nodes only).
    pub healthy_total: u64,
    /// How many schedulable nodes have each healthy-GPU count, to find the largest node.
    pub node_sizes: BTreeMap<u32, u32>,
}

impl Default for ClassCapacity {
    fn default() -> Self {
        ClassCapacity {
            slots: BTreeMap::new(),
            buckets: vec![BTreeSet::new(); quotient_common::GPUS_PER_NODE_MAX + 1],
            available_total: 0,
            healthy_total: 0,
            node_sizes: BTreeMap::new(),
        }
    }
}

impl ClassCapacity {
    fn remove_slot(&mut self, node: NodeId) -> Option<NodeSlot> {
        let slot = self.slots.remove(&node)?;
        let available = slot.available();
        if available > 0 {
            self.buckets[available as usize].remove(&node);
        }
        self.available_total -= u64::from(available);
        self.healthy_total -= u64::from(slot.healthy);
        if let Some(count) = self.node_sizes.get_mut(&slot.healthy) {
            *count -= 1;
            if *count == 0 {
                self.node_sizes.remove(&slot.healthy);
            }
        }
        Some(slot)
    }

    fn insert_slot(&mut self, node: NodeId, slot: NodeSlot) {
        let available = slot.available();
        if available > 0 {
            self.buckets[available as usize].insert(node);
        }
        self.available_total += u64::from(available);
        self.healthy_total += u64::from(slot.healthy);
        *self.node_sizes.entry(slot.healthy).or_insert(0) += 1;
        self.slots.insert(node, slot);
    }

    /// The most healthy GPUs of this class on one schedulable node.
    pub fn largest_node(&self) -> u32 {
        self.node_sizes.keys().next_back().copied().unwrap_or(0)
    }
}

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    pub shares: BTreeMap<String, BTreeMap<GpuClass, ShareClassIndex>>,
    pub capacity: BTreeMap<GpuClass, ClassCapacity>,
    /// Allocated GPUs per node, all classes.
    pub node_alloc: BTreeMap<NodeId, u64>,
    pub node_jobs: BTreeMap<NodeId, BTreeSet<JobId>>,
    /// RUNNABLE jobs that a node keeps GPUs for.
    pub nominated: BTreeSet<JobId>,
    /// For each job, the PREEMPTING jobs whose GPUs are being freed for it.
    pub preempting_for: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Nominated GPUs per (node, class), so a node refresh can rebuild its slot.
    pub node_nominated: BTreeMap<(NodeId, GpuClass), u32>,
    /// Idle quota of `reserve` shares per class (zero entries left out).
    pub reserved_idle: BTreeMap<GpuClass, u64>,
    /// Nodes in the draining state, whose jobs the scheduler preempts.
    pub draining: BTreeSet<NodeId>,
}

impl Index {
    /// Builds the index from canonical data.
    pub fn rebuild(data: &StateData) -> Index {
        let mut index = Index::default();
        for job in data.jobs.iter() {
            index.add_job(job, data);
        }
        for node in &data.nodes {
            index.refresh_node(node);
        }
        index.recompute_reserved(data);
        index
    }

    /// Recomputes the reserved idle quota of every class; after any share change.
    pub fn recompute_reserved(&mut self, data: &StateData) {
        self.reserved_idle.clear();
        for share in data.shares.values() {
            for class in share.spec.limits.keys() {
                let idle =
                    reserved_idle_of(&share.spec, class, self.usage(&share.spec.name, class));
                if idle > 0 {
                    *self.reserved_idle.entry(class.clone()).or_insert(0) += idle;
                }
            }
        }
    }

    /// The idle quota of reserve shares for a class.
    pub fn reserved_idle(&self, class: &GpuClass) -> u64 {
        self.reserved_idle.get(class).copied().unwrap_or(0)
    }

    /// Moves a reserve share's idle quota from `before` to `after` usage.
    fn adjust_reserved(
        &mut self,
        data: &StateData,
        share: &str,
        class: &GpuClass,
        before: u64,
        after: u64,
    ) {
        let Some(record) = data.shares.get(share) else {
            return;
        };
        let idle_before = reserved_idle_of(&record.spec, class, before);
        let idle_after = reserved_idle_of(&record.spec, class, after);
        if idle_before == idle_after {
            return;
        }
        let entry = self.reserved_idle.entry(class.clone()).or_insert(0);
        *entry = (*entry + idle_after).saturating_sub(idle_before);
        if *entry == 0 {
            self.reserved_idle.remove(class);
        }
    }

    pub fn usage(&self, share: &str, class: &GpuClass) -> u64 {
        self.shares
            .get(share)
            .and_then(|classes| classes.get(class))
            .map_or(0, |i| i.usage)
    }

    /// The most healthy GPUs of `class` on one schedulable node (0 without such a node).
    pub fn largest_node(&self, class: &GpuClass) -> u32 {
        self.capacity
            .get(class)
            .map_or(0, ClassCapacity::largest_node)
    }

    pub fn share_class(&self, share: &str, class: &GpuClass) -> Option<&ShareClassIndex> {
        self.shares.get(share).and_then(|c| c.get(class))
    }

    pub fn queue<'a>(&'a self, share: &str, class: &GpuClass) -> impl Iterator<Item = JobId> + 'a {
        self.share_class(share, class)
            .into_iter()
            .flat_map(|i| i.runnable.iter().map(|(_, id)| *id))
    }

    pub fn holding<'a>(
        &'a self,
        share: &str,
        class: &GpuClass,
    ) -> impl Iterator<Item = JobId> + 'a {
        self.share_class(share, class)
            .into_iter()
            .flat_map(|i| i.holding.iter().map(|(_, _, id)| *id))
    }

    pub fn jobs_on_node(&self, node: NodeId) -> impl Iterator<Item = JobId> + '_ {
        self.node_jobs.get(&node).into_iter().flatten().copied()
    }

    fn share_class_mut(&mut self, share: &str, class: &GpuClass) -> &mut ShareClassIndex {
        self.shares
            .entry(share.to_string())
            .or_default()
            .entry(class.clone())
            .or_default()
    }

    /// Adds a job's contributions. `data` gives the node records for capacity updates.
    pub fn add_job(&mut self, job: &JobRecord, data: &StateData) {
        let class = job.class().clone();
        let share = job.spec.share.clone();
        if job.state == JobState::Runnable {
            let key = (Reverse(job.priority()), job.id);
            let index = self.share_class_mut(&share, &class);
            index.runnable.insert(key);
            index
                .runnable_by_gpus
                .entry(job.gpus())
                .or_default()
                .insert(key);
            if let Some(node) = job.nomination {
                self.nominated.insert(job.id);
                *self
                    .node_nominated
                    .entry((node, class.clone()))
                    .or_insert(0) += job.gpus();
                self.refresh_node_by_id(node, data);
            }
        }
        if let Some(alloc) = job.allocation {
            let index = self.share_class_mut(&share, &class);
            index
                .holding
                .insert((Reverse(job.priority()), job.placed_index, job.id));
            let before = index.usage;
            index.usage += u64::from(job.gpus());
            let after = index.usage;
            if job.state == JobState::Preempting {
                index.preempting += u64::from(job.gpus());
            }
            self.adjust_reserved(data, &share, &class, before, after);
            *self.node_alloc.entry(alloc.node).or_insert(0) |= alloc.gpu_mask;
            self.node_jobs.entry(alloc.node).or_default().insert(job.id);
            self.refresh_node_by_id(alloc.node, data);
        }
        if job.state == JobState::Preempting {
            if let Some(StopCause::Preempted(p)) = &job.stop {
                if let Some(for_job) = p.for_job {
                    self.preempting_for
                        .entry(for_job)
                        .or_default()
                        .insert(job.id);
                }
            }
        }
    }

    /// Removes a job's contributions; the exact inverse of `add_job` for the same record.
    pub fn remove_job(&mut self, job: &JobRecord, data: &StateData) {
        let class = job.class().clone();
        let share = job.spec.share.as_str();
        if job.state == JobState::Runnable {
            let key = (Reverse(job.priority()), job.id);
            let index = self.share_class_mut(share, &class);
            index.runnable.remove(&key);
            if let Some(size) = index.runnable_by_gpus.get_mut(&job.gpus()) {
                size.remove(&key);
                if size.is_empty() {
                    index.runnable_by_gpus.remove(&job.gpus());
                }
            }
            if let Some(node) = job.nomination {
                self.nominated.remove(&job.id);
                let key = (node, class.clone());
                if let Some(count) = self.node_nominated.get_mut(&key) {
                    *count -= job.gpus();
                    if *count == 0 {
                        self.node_nominated.remove(&key);
                    }
                }
                self.refresh_node_by_id(node, data);
            }
        }
        if let Some(alloc) = job.allocation {
            let index = self.share_class_mut(share, &class);
            index
                .holding
                .remove(&(Reverse(job.priority()), job.placed_index, job.id));
            let before = index.usage;
            index.usage -= u64::from(job.gpus());
            let after = index.usage;
            if job.state == JobState::Preempting {
                index.preempting -= u64::from(job.gpus());
            }
            self.adjust_reserved(data, share, &class, before, after);
            if let Some(mask) = self.node_alloc.get_mut(&alloc.node) {
                *mask &= !alloc.gpu_mask;
                if *mask == 0 {
                    self.node_alloc.remove(&alloc.node);
                }
            }
            if let Some(jobs) = self.node_jobs.get_mut(&alloc.node) {
                jobs.remove(&job.id);
                if jobs.is_empty() {
                    self.node_jobs.remove(&alloc.node);
                }
            }
            self.refresh_node_by_id(alloc.node, data);
        }
        if job.state == JobState::Preempting {
            if let Some(StopCause::Preempted(p)) = &job.stop {
                if let Some(for_job) = p.for_job {
                    if let Some(set) = self.preempting_for.get_mut(&for_job) {
                        set.remove(&job.id);
                        if set.is_empty() {
                            self.preempting_for.remove(&for_job);
                        }
                    }
                }
            }
        }
        self.drop_if_empty(share, &class);
    }

    /// Removes a share-class entry with no jobs left, so a rebuilt index equals this one.
    fn drop_if_empty(&mut self, share: &str, class: &GpuClass) {
        if let Some(classes) = self.shares.get_mut(share) {
            if classes
                .get(class)
                .is_some_and(|i| i.runnable.is_empty() && i.holding.is_empty())
            {
                classes.remove(class);
            }
            if classes.is_empty() {
                self.shares.remove(share);
            }
        }
    }

    fn refresh_node_by_id(&mut self, node: NodeId, data: &StateData) {
        if let Some(record) = data.nodes.get(node.0 as usize) {
            self.refresh_node(record);
        }
    }

    /// Recomputes a node's slots in every class after its state, GPUs or allocations changed.
    pub fn refresh_node(&mut self, node: &NodeRecord) {
        for capacity in self.capacity.values_mut() {
            capacity.remove_slot(node.id);
        }
        if node.state == quotient_common::NodeState::Draining {
            self.draining.insert(node.id);
        } else {
            self.draining.remove(&node.id);
        }
        if !node.state.schedulable() {
            self.capacity.retain(|_, c| !c.slots.is_empty());
            return;
        }
        let allocated = self.node_alloc.get(&node.id).copied().unwrap_or(0);
        let classes: BTreeSet<&GpuClass> = node.gpus.iter().map(|g| &g.class).collect();
        for class in classes {
            let healthy = node.healthy_mask(class);
            let slot = NodeSlot {
                free_mask: healthy & !allocated,
                nominated: self
                    .node_nominated
                    .get(&(node.id, class.clone()))
                    .copied()
                    .unwrap_or(0),
                healthy: healthy.count_ones(),
            };
            self.capacity
                .entry(class.clone())
                .or_default()
                .insert_slot(node.id, slot);
        }
        self.capacity.retain(|_, c| !c.slots.is_empty());
    }
}
