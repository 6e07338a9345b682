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

/// `job`'s [`HoldingKey`]: where it ranks among its share's jobs that hold GPUs.
pub fn holding_key(job: &JobRecord) -> HoldingKey {
    (Reverse(job.priority()), job.placed_index, job.id)
}

/// A job's size: GPUs per node, then nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobSize {
    pub gpus: u32,
    pub nodes: u32,
}

impl JobSize {
    pub fn of(job: &JobRecord) -> JobSize {
        JobSize {
            gpus: job.gpus(),
            nodes: job.node_count(),
        }
    }

    pub fn total(self) -> u64 {
        u64::from(self.gpus) * u64::from(self.nodes)
    }

    /// The smallest size of the queue set this size is kept in: the GPUs, and the nodes
    /// rounded down to the set's lower bound. The sets of jobs of several nodes are by powers
    /// of two (2, 3-4, 5-8, ... 129-256), so that a queue has a few dozen sets, not one per
    /// count: the scheduler merges the heads of every set in every round.
    pub fn set(self) -> JobSize {
        let nodes = match self.nodes {
            0 | 1 => 1,
            2 => 2,
            n => n.next_power_of_two() / 2 + 1,
        };
        JobSize {
            gpus: self.gpus,
            nodes,
        }
    }
}

fn size_of(job: &JobRecord) -> JobSize {
    JobSize::of(job).set()
}

/// One share's jobs of one GPU class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareClassIndex {
    pub runnable: BTreeSet<QueueKey>,
    /// `runnable` split by the size of each job (GPUs per node, and nodes by powers of two:
    /// [`JobSize::set`], keyed by the set's smallest size), so that a round can pass over the
    /// sizes that can never fit without visiting their jobs.
    pub runnable_by_gpus: BTreeMap<JobSize, BTreeSet<QueueKey>>,
    pub holding: BTreeSet<HoldingKey>,
    /// GPUs held by the jobs in `holding`.
    pub usage: u64,
    /// GPUs held by the jobs in `holding` that are PREEMPTING.
    pub preempting: u64,
    /// GPUs that nodes keep free for this queue's nominated jobs ([`Nominee::kept`]). A
    /// `reserve` share's kept GPUs count against its idle quota: they already serve it.
    pub kept: u64,
}

/// A RUNNABLE job that nodes keep GPUs for while its victims stop (or, for a job of several
/// nodes, while the jobs on those nodes end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nominee {
    /// One node per member, in the order of the job's `nominations`.
    pub nodes: Vec<NodeId>,
    pub class: GpuClass,
    pub share: String,
    /// GPUs per node.
    pub gpus: u32,
    /// The GPUs kept free for it now on each of `nodes`: what it asks for less what its
    /// victims on the node still hold. As a victim stops, its GPUs become free and kept at
    /// once, so nobody else can take them; and free GPUs beyond what it will need are not
    /// withheld from others (a `reserve` share's idle quota among them) while the victims
    /// drain.
    pub kept: Vec<u32>,
}

impl Nominee {
    /// The GPUs kept for it on `node`.
    pub fn kept_on(&self, node: NodeId) -> u32 {
        self.nodes
            .iter()
            .position(|n| *n == node)
            .map_or(0, |i| self.kept[i])
    }

    /// The GPUs kept for it on all its nodes.
    pub fn kept_total(&self) -> u64 {
        self.kept.iter().map(|k| u64::from(*k)).sum()
    }
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
    /// The same, of the nodes that keep no GPUs for a nominated job: an upper bound on the
    /// nodes that may be held for a job of several nodes.
    pub unheld_sizes: BTreeMap<u32, u32>,
}

impl Default for ClassCapacity {
    fn default() -> Self {
        ClassCapacity {
            slots: BTreeMap::new(),
            buckets: vec![BTreeSet::new(); quotient_common::GPUS_PER_NODE_MAX + 1],
            available_total: 0,
            healthy_total: 0,
            node_sizes: BTreeMap::new(),
            unheld_sizes: BTreeMap::new(),
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
        for (sizes, counted) in [
            (&mut self.node_sizes, true),
            (&mut self.unheld_sizes, slot.nominated == 0),
        ] {
            if !counted {
                continue;
            }
            if let Some(count) = sizes.get_mut(&slot.healthy) {
                *count -= 1;
                if *count == 0 {
                    sizes.remove(&slot.healthy);
                }
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
        if slot.nominated == 0 {
            *self.unheld_sizes.entry(slot.healthy).or_insert(0) += 1;
        }
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
    /// CPUs (thousandths) and memory (bytes) set aside per node, for the jobs holding GPUs
    /// there (nodes with none left out).
    pub node_resources: BTreeMap<NodeId, (u64, u64)>,
    pub node_jobs: BTreeMap<NodeId, BTreeSet<JobId>>,
    /// RUNNABLE jobs that a node keeps GPUs for.
    pub nominated: BTreeMap<JobId, Nominee>,
    /// For each job, the PREEMPTING jobs whose GPUs are being freed for it.
    pub preempting_for: BTreeMap<JobId, BTreeSet<JobId>>,
    /// GPUs held by the PREEMPTING jobs stopping for a job, per (that job, node).
    pub victims_hold: BTreeMap<(JobId, NodeId), u32>,
    /// Kept GPUs per (node, class), so a node refresh can rebuild its slot.
    pub node_nominated: BTreeMap<(NodeId, GpuClass), u32>,
    /// Idle quota of `reserve` shares per class (zero entries left out).
    pub reserved_idle: BTreeMap<GpuClass, u64>,
    /// Nodes in the draining state, whose jobs the scheduler preempts.
    pub draining: BTreeSet<NodeId>,
    /// Jobs that are not terminal, for `limits::ACTIVE_JOBS_MAX`.
    pub active_jobs: u64,
    /// Finished jobs by when they ended, for retention (`crate::retention`).
    pub finished: BTreeSet<(u64, JobId)>,
}

/// When a finished job ended, as retention orders it.
fn ended_of(job: &JobRecord) -> u64 {
    job.ended_ms.unwrap_or(job.submitted_ms)
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
                    reserved_idle_of(&share.spec, class, self.claimed(&share.spec.name, class));
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

    /// What a share holds of a class plus what nodes keep free for its nominated jobs: the
    /// part of its quota that is not idle.
    pub fn claimed(&self, share: &str, class: &GpuClass) -> u64 {
        self.share_class(share, class)
            .map_or(0, |i| i.usage + i.kept)
    }

    /// The GPUs kept free for a nominated job on `node` (0 for any other job or node).
    pub fn kept_for(&self, job: JobId, node: NodeId) -> u32 {
        self.nominated.get(&job).map_or(0, |n| n.kept_on(node))
    }

    /// The GPUs kept free for a nominated job on all its nodes.
    pub fn kept_total(&self, job: JobId) -> u64 {
        self.nominated.get(&job).map_or(0, Nominee::kept_total)
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

    /// The CPUs (thousandths) and memory (bytes) set aside on `node`.
    pub fn node_resources_used(&self, node: NodeId) -> (u64, u64) {
        self.node_resources.get(&node).copied().unwrap_or((0, 0))
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
        if !job.state.is_terminal() {
            self.active_jobs += 1;
        } else {
            self.finished.insert((ended_of(job), job.id));
        }
        let class = job.class().clone();
        let share = job.spec.share.clone();
        if job.state == JobState::Runnable {
            let key = (Reverse(job.priority()), job.id);
            let index = self.share_class_mut(&share, &class);
            index.runnable.insert(key);
            index
                .runnable_by_gpus
                .entry(size_of(job))
                .or_default()
                .insert(key);
            if !job.nominations.is_empty() {
                let nominee = Nominee {
                    nodes: job.nominations.to_vec(),
                    class: class.clone(),
                    share: share.clone(),
                    gpus: job.gpus(),
                    kept: vec![0; job.nominations.len()],
                };
                self.nominated.insert(job.id, nominee);
                self.refresh_kept(job.id, data);
            }
        }
        if !job.placement.is_empty() {
            let index = self.share_class_mut(&share, &class);
            index.holding.insert(holding_key(job));
            let before = index.usage + index.kept;
            index.usage += u64::from(job.total_gpus());
            let after = index.usage + index.kept;
            if job.state == JobState::Preempting {
                index.preempting += u64::from(job.total_gpus());
            }
            self.adjust_reserved(data, &share, &class, before, after);
            for alloc in &job.placement {
                *self.node_alloc.entry(alloc.node).or_insert(0) |= alloc.gpu_mask;
                if alloc.cpu_millis > 0 || alloc.memory_bytes > 0 {
                    let used = self.node_resources.entry(alloc.node).or_insert((0, 0));
                    used.0 += u64::from(alloc.cpu_millis);
                    used.1 += alloc.memory_bytes;
                }
                self.node_jobs.entry(alloc.node).or_default().insert(job.id);
                self.refresh_node_by_id(alloc.node, data);
            }
        }
        if job.state == JobState::Preempting {
            if let Some(StopCause::Preempted(p)) = job.stop.as_deref() {
                if let Some(for_job) = p.for_job {
                    self.preempting_for
                        .entry(for_job)
                        .or_default()
                        .insert(job.id);
                    if !job.placement.is_empty() {
                        for alloc in &job.placement {
                            *self.victims_hold.entry((for_job, alloc.node)).or_insert(0) +=
                                job.gpus();
                        }
                        self.refresh_kept(for_job, data);
                    }
                }
            }
        }
    }

    /// Removes a job's contributions; the exact inverse of `add_job` for the same record.
    pub fn remove_job(&mut self, job: &JobRecord, data: &StateData) {
        if !job.state.is_terminal() {
            self.active_jobs -= 1;
        } else {
            self.finished.remove(&(ended_of(job), job.id));
        }
        let class = job.class().clone();
        let share = job.spec.share.as_str();
        if job.state == JobState::Runnable {
            let key = (Reverse(job.priority()), job.id);
            let index = self.share_class_mut(share, &class);
            index.runnable.remove(&key);
            let size = size_of(job);
            if let Some(jobs) = index.runnable_by_gpus.get_mut(&size) {
                jobs.remove(&key);
                if jobs.is_empty() {
                    index.runnable_by_gpus.remove(&size);
                }
            }
            if !job.nominations.is_empty() {
                let zero = vec![0; job.nominations.len()];
                self.set_kept(job.id, &zero, data);
                self.nominated.remove(&job.id);
            }
        }
        if !job.placement.is_empty() {
            let index = self.share_class_mut(share, &class);
            index.holding.remove(&holding_key(job));
            let before = index.usage + index.kept;
            index.usage -= u64::from(job.total_gpus());
            let after = index.usage + index.kept;
            if job.state == JobState::Preempting {
                index.preempting -= u64::from(job.total_gpus());
            }
            self.adjust_reserved(data, share, &class, before, after);
        }
        for alloc in &job.placement {
            if let Some(mask) = self.node_alloc.get_mut(&alloc.node) {
                *mask &= !alloc.gpu_mask;
                if *mask == 0 {
                    self.node_alloc.remove(&alloc.node);
                }
            }
            if let Some(used) = self.node_resources.get_mut(&alloc.node) {
                used.0 -= u64::from(alloc.cpu_millis);
                used.1 -= alloc.memory_bytes;
                if *used == (0, 0) {
                    self.node_resources.remove(&alloc.node);
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
            if let Some(StopCause::Preempted(p)) = job.stop.as_deref() {
                if let Some(for_job) = p.for_job {
                    if let Some(set) = self.preempting_for.get_mut(&for_job) {
                        set.remove(&job.id);
                        if set.is_empty() {
                            self.preempting_for.remove(&for_job);
                        }
                    }
                    if !job.placement.is_empty() {
                        for alloc in &job.placement {
                            let key = (for_job, alloc.node);
                            if let Some(hold) = self.victims_hold.get_mut(&key) {
                                *hold -= job.gpus();
                                if *hold == 0 {
                                    self.victims_hold.remove(&key);
                                }
                            }
                        }
                        self.refresh_kept(for_job, data);
                    }
                }
            }
        }
        self.drop_if_empty(share, &class);
    }

    /// Recomputes the GPUs kept for a nominated job (nothing for any other job) after it or
    /// one of its victims changed.
    fn refresh_kept(&mut self, job: JobId, data: &StateData) {
        let Some(nominee) = self.nominated.get(&job) else {
            return;
        };
        let kept: Vec<u32> = nominee
            .nodes
            .iter()
            .map(|node| {
                let hold = self.victims_hold.get(&(job, *node)).copied().unwrap_or(0);
                nominee.gpus.saturating_sub(hold)
            })
            .collect();
        self.set_kept(job, &kept, data);
    }

    /// Moves a nominated job's kept GPUs to `kept` (per node), in its nodes' slots and its
    /// share's claim.
    fn set_kept(&mut self, job: JobId, kept: &[u32], data: &StateData) {
        let Some(nominee) = self.nominated.get_mut(&job) else {
            return;
        };
        if nominee.kept == kept {
            return;
        }
        let old = std::mem::replace(&mut nominee.kept, kept.to_vec());
        let (nodes, class, share) = (
            nominee.nodes.clone(),
            nominee.class.clone(),
            nominee.share.clone(),
        );
        for ((node, old), new) in nodes.iter().zip(&old).zip(kept) {
            if old == new {
                continue;
            }
            let key = (*node, class.clone());
            let count = self.node_nominated.entry(key.clone()).or_insert(0);
            *count = *count + new - old;
            if *count == 0 {
                self.node_nominated.remove(&key);
            }
            self.refresh_node_by_id(*node, data);
        }
        let old_total: u64 = old.iter().map(|k| u64::from(*k)).sum();
        let new_total: u64 = kept.iter().map(|k| u64::from(*k)).sum();
        let index = self.share_class_mut(&share, &class);
        let before = index.usage + index.kept;
        index.kept = index.kept + new_total - old_total;
        let after = index.usage + index.kept;
        self.adjust_reserved(data, &share, &class, before, after);
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
