//! The scheduler: `plan(&State) -> Plan`, one pure, deterministic round of
//! docs/quota-shares.md ("What the scheduler does").
//!
//! A round never mutates the state. It works on a [`Scratch`]: usage counters for the queues it
//! touches and an overlay of the nodes whose free GPUs it has spent, on top of the state's
//! indexes. The round reads queue heads, not whole queues, so its cost is the number of
//! placements plus the number of queues, not the number of queued jobs. Jobs that can never
//! fit (more GPUs than the largest node of their class, or than their share could ever hold)
//! are not visited at all: each queue is kept split by job size and a round merges only the
//! sizes that can fit; such a job's reason is derived when read ([`State::reason`]).
//!
//! Order of a round:
//! 0. jobs on draining nodes are preempted; nominated jobs whose GPUs are free take them;
//! 1. queues whose head fits within its share's limit place it (priority desc, submit asc);
//! 2. a head within its limit that found no room reclaims borrowed GPUs (cross-share);
//! 3. `lend-and-borrow` queues at their limit borrow idle capacity;
//! 4. a head still blocked preempts lower-priority jobs of its own share, where enabled;
//! 5. every head left waiting gets a reason.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};
use std::iter::Peekable;

use quotient_common::{GpuClass, JobId, JobState, ShareSpec};

use crate::index::{ClassCapacity, NodeSlot, QueueKey, ShareClassIndex};
use crate::limits::{IN_SHARE_CANDIDATES_SCAN_MAX, RECLAIM_CANDIDATES_SCAN_MAX};
use crate::plan::{Plan, PlanAction};
use crate::reason::WaitReason;
use crate::rules::{
    admit, available_for_job, can_ever_fit, limit_of, reserved_idle_of, resources_for, runs_on,
    Admission, BorrowedFromLowest, Refusal, Unfit,
};
use crate::state::{JobRecord, NodeId, PreemptionKind, State};

/// Computes one scheduling round. See the module docs.
pub fn plan(state: &State) -> Plan {
    plan_avoiding(state, &BTreeSet::new())
}

/// [`plan`], placing nothing new on the nodes of `unreachable`: nodes the leader has not
/// heard from since their last heartbeat was due, whose lease has not yet run out. Which
/// nodes those are is the leader's own knowledge, not replicated state; `apply` does not
/// re-check it (a placement there is no safety problem, only a likely launch delay).
pub fn plan_avoiding(state: &State, unreachable: &BTreeSet<NodeId>) -> Plan {
    Round::new(state, unreachable).run()
}

/// Whether `node` can run `job` this round, its GPUs aside: reachable, and
/// [`runs_on`] with the CPUs and memory the state and this round have set aside there.
fn node_runs(
    state: &State,
    unreachable: &BTreeSet<NodeId>,
    used_this_round: &HashMap<NodeId, (u64, u64)>,
    job: &JobRecord,
    node: NodeId,
) -> Result<(), Unfit> {
    if !unreachable.is_empty() && unreachable.contains(&node) {
        return Err(Unfit::Unreachable);
    }
    let Some(record) = state.node(node) else {
        return Err(Unfit::Unreachable);
    };
    // The common case, and a round's hot path: a process job on a node that accounts no CPUs
    // or memory fits wherever its GPUs do.
    let accounts = record.host.cpu_millis > 0 || record.host.memory_bytes > 0;
    if job.spec.payload.image.is_none() && !accounts {
        return Ok(());
    }
    let (cpus, memory) = state.index.node_resources_used(node);
    let (more_cpus, more_memory) = used_this_round.get(&node).copied().unwrap_or((0, 0));
    runs_on(job, record, (cpus + more_cpus, memory + more_memory))
}

/// The free capacity of one class as the round has spent it so far.
struct ClassScratch<'a> {
    real: &'a ClassCapacity,
    /// Slots of the nodes this round has changed.
    touched: HashMap<NodeId, NodeSlot>,
    /// Touched nodes by available count.
    overlay: Vec<BTreeSet<NodeId>>,
    /// Per real bucket, the last node known to be touched (scan from after it).
    cursors: Vec<Option<NodeId>>,
    /// Real buckets that may still hold an untouched node.
    real_live: u128,
    available_total: u64,
}

impl<'a> ClassScratch<'a> {
    fn new(real: &'a ClassCapacity) -> Self {
        let buckets = real.buckets.len();
        let mut real_live = 0u128;
        for (k, bucket) in real.buckets.iter().enumerate() {
            if !bucket.is_empty() {
                real_live |= 1u128 << k;
            }
        }
        ClassScratch {
            real,
            touched: HashMap::new(),
            overlay: vec![BTreeSet::new(); buckets],
            cursors: vec![None; buckets],
            real_live,
            available_total: real.available_total,
        }
    }

    fn slot(&self, node: NodeId) -> Option<NodeSlot> {
        self.touched
            .get(&node)
            .copied()
            .or_else(|| self.real.slots.get(&node).copied())
    }

    fn set_slot(&mut self, node: NodeId, slot: NodeSlot) {
        let old = self.slot(node).unwrap_or_default();
        if self.touched.contains_key(&node) && old.available() > 0 {
            self.overlay[old.available() as usize].remove(&node);
        }
        self.available_total =
            self.available_total - u64::from(old.available()) + u64::from(slot.available());
        if slot.available() > 0 {
            self.overlay[slot.available() as usize].insert(node);
        }
        self.touched.insert(node, slot);
    }

    /// The first untouched node of real bucket `k`, advancing its cursor past touched ones.
    fn real_candidate(&mut self, k: usize) -> Option<NodeId> {
        if self.real_live & (1u128 << k) == 0 {
            return None;
        }
        let bucket = &self.real.buckets[k];
        let range = match self.cursors[k] {
            Some(after) => {
                bucket.range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            }
            None => bucket.range(..),
        };
        for node in range {
            if self.touched.contains_key(node) {
                self.cursors[k] = Some(*node);
            } else {
                return Some(*node);
            }
        }
        self.real_live &= !(1u128 << k);
        None
    }

    /// Best fit: the node with the fewest available GPUs that still has `gpus`, lowest id
    /// first, among the nodes `accept` takes. Packing jobs onto busy nodes keeps whole nodes
    /// free for large jobs. When no node fits, why the first node with the GPUs was refused
    /// (`None`: no node has the GPUs).
    fn best_fit(
        &mut self,
        gpus: u32,
        mut accept: impl FnMut(NodeId) -> Result<(), Unfit>,
    ) -> Result<NodeId, Option<Unfit>> {
        let mut refused = None;
        for k in (gpus as usize)..self.overlay.len() {
            let real = self.real_candidate(k);
            let overlay = self.overlay[k].first().copied();
            let best = match (real, overlay) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let Some(best) = best else { continue };
            match accept(best) {
                Ok(()) => return Ok(best),
                Err(unfit) => {
                    refused.get_or_insert(unfit);
                }
            }
            // The slow way, only when the first candidate was refused: every node of the
            // bucket, in id order.
            let untouched = self.real.buckets[k]
                .iter()
                .filter(|node| !self.touched.contains_key(node));
            let mut candidates: Vec<NodeId> =
                untouched.chain(self.overlay[k].iter()).copied().collect();
            candidates.sort_unstable();
            if let Some(node) = candidates
                .into_iter()
                .filter(|node| *node != best)
                .find(|node| accept(*node).is_ok())
            {
                return Ok(node);
            }
        }
        Err(refused)
    }
}

/// One share's queue of one class, as the round walks it.
struct Queue<'a> {
    share: &'a ShareSpec,
    class: &'a GpuClass,
    /// The queue's entry in the state's index (its holding jobs, for in-share victims).
    index: &'a ShareClassIndex,
    heads: Heads<'a>,
    usage: u64,
    /// GPUs kept free for the queue's nominated jobs (see `index::Nominee::kept`).
    kept: u64,
    /// The head that waits, and why; the queue takes no further part in phases 1-3.
    blocked: Option<(JobId, Blocked)>,
    /// Set when GPUs are being freed for the head: nothing more to do this round.
    nominated: bool,
}

/// Why a queue's head waits. Most often the quota rules refused it, in every round alike:
/// such a refusal is named (share and class copied into a [`WaitReason`]) only at the round's
/// end, and only if it is not the reason the job already has.
enum Blocked {
    Refused(Refusal),
    Reason(WaitReason),
    /// No node with the GPUs can run the job (no Docker, its image nowhere, unreachable):
    /// it waits, but the jobs behind it in its queue are not held up by it, since the GPUs
    /// they would take are no use to it.
    Unrunnable(WaitReason),
}

/// A queue's jobs that can fit at all, in queue order: its per-size sets up to the largest
/// node of its class and its share's cap, merged. Jobs of larger sizes are never visited:
/// their reason (`rules::never_fits`) is derived from the state when read, so a queue of jobs
/// that can never fit costs a round nothing.
struct Heads<'a> {
    sizes: Vec<Peekable<std::collections::btree_set::Iter<'a, QueueKey>>>,
    /// [`Heads::first`] once found, until [`Heads::next`] moves on: a round asks for a
    /// queue's head several times (to rank it, to take it, to skip it) between moves.
    first: Option<Option<(usize, &'a QueueKey)>>,
}

impl<'a> Heads<'a> {
    fn new(index: &'a ShareClassIndex, fits: impl Fn(u32) -> bool) -> Self {
        let sizes = index
            .runnable_by_gpus
            .iter()
            .filter(|(gpus, _)| fits(**gpus))
            .map(|(_, jobs)| jobs.iter().peekable())
            .collect();
        Heads { sizes, first: None }
    }

    /// The first job in queue order across the sizes, and which size holds it.
    fn first(&mut self) -> Option<(usize, &'a QueueKey)> {
        if let Some(first) = self.first {
            return first;
        }
        let first = self
            .sizes
            .iter_mut()
            .enumerate()
            .filter_map(|(size, jobs)| jobs.peek().map(|key| (size, *key)))
            .min_by_key(|(_, key)| *key);
        self.first = Some(first);
        first
    }

    fn peek(&mut self) -> Option<&'a QueueKey> {
        self.first().map(|(_, key)| key)
    }

    fn next(&mut self) {
        if let Some((size, _)) = self.first() {
            self.sizes[size].next();
        }
        self.first = None;
    }
}

struct Round<'a> {
    state: &'a State,
    plan: Plan,
    queues: Vec<Queue<'a>>,
    classes: BTreeMap<&'a GpuClass, ClassScratch<'a>>,
    reserved_idle: BTreeMap<&'a GpuClass, u64>,
    /// Jobs placed this round (for skipping them in their queue).
    placed: HashSet<JobId>,
    /// Jobs this round asked to preempt.
    victims: HashSet<JobId>,
    /// GPUs of this round's victims per (share, class).
    victim_gpus: BTreeMap<(&'a str, &'a GpuClass), u64>,
    /// Usage of (share, class) pairs without a queue never changes in a round.
    queue_of: BTreeMap<(&'a str, &'a GpuClass), usize>,
    /// Nodes to place nothing new on ([`plan_avoiding`]).
    unreachable: &'a BTreeSet<NodeId>,
    /// CPUs and memory this round's placements set aside, per node.
    resources_used: HashMap<NodeId, (u64, u64)>,
}

impl<'a> Round<'a> {
    fn new(state: &'a State, unreachable: &'a BTreeSet<NodeId>) -> Self {
        let mut queues = Vec::new();
        let mut queue_of = BTreeMap::new();
        for (share_name, classes) in &state.index.shares {
            let Some(share) = state.data.shares.get(share_name) else {
                continue;
            };
            for (class, index) in classes {
                if index.runnable.is_empty() {
                    continue;
                }
                queue_of.insert((share_name.as_str(), class), queues.len());
                let largest = state.index.largest_node(class);
                let spec = &share.spec;
                queues.push(Queue {
                    share: spec,
                    class,
                    index,
                    heads: Heads::new(index, can_ever_fit(spec, class, largest)),
                    usage: index.usage,
                    kept: index.kept,
                    blocked: None,
                    nominated: false,
                });
            }
        }
        let classes = state
            .index
            .capacity
            .iter()
            .map(|(class, capacity)| (class, ClassScratch::new(capacity)))
            .collect();
        let reserved_idle = state
            .index
            .reserved_idle
            .iter()
            .map(|(class, idle)| (class, *idle))
            .collect();
        Round {
            state,
            plan: Plan::default(),
            queues,
            classes,
            reserved_idle,
            placed: HashSet::new(),
            victims: HashSet::new(),
            victim_gpus: BTreeMap::new(),
            queue_of,
            unreachable,
            resources_used: HashMap::new(),
        }
    }

    fn job(&self, id: JobId) -> &'a JobRecord {
        self.state.job(id).expect("indexed jobs exist")
    }

    fn run(mut self) -> Plan {
        self.drain();
        self.nominated();
        self.within_limits();
        self.reclaim();
        self.borrow();
        self.in_share();
        self.reasons();
        self.plan
    }

    // --- phase 0 -------------------------------------------------------------------------

    /// Preempts every job on a draining node that is not already stopping.
    fn drain(&mut self) {
        for node in &self.state.index.draining {
            for job in self.state.index.jobs_on_node(*node) {
                if self.job(job).state != JobState::Preempting {
                    self.preempt(job, PreemptionKind::Drain, None);
                }
            }
        }
    }

    /// Places nominated jobs whose GPUs are free; drops nominations that can no longer help.
    fn nominated(&mut self) {
        let state = self.state;
        for &id in state.index.nominated.keys() {
            let job = self.job(id);
            let node = job.nomination.expect("indexed as nominated");
            let Some(&q) = self.queue_of.get(&(job.spec.share.as_str(), job.class())) else {
                continue;
            };
            let waiting_on = self.state.index.preempting_for.get(&id);
            if self.try_place_nominated(q, job, node) {
                continue;
            }
            match waiting_on {
                Some(victims) if !victims.is_empty() => {
                    let node_name = self.node_name(node);
                    self.queues[q].nominated = true;
                    self.queues[q].blocked = Some((
                        id,
                        Blocked::Reason(WaitReason::WaitingForPreemption {
                            node: node_name,
                            victims: victims.iter().copied().collect(),
                        }),
                    ));
                }
                _ => {
                    // Its victims are gone and it still does not fit: release the GPUs kept
                    // for it, and let it queue like any other job.
                    self.plan
                        .actions
                        .push(PlanAction::ClearNomination { job: id });
                    let kept = self.state.index.kept_for(id);
                    if let Some(scratch) = self.classes.get_mut(job.class()) {
                        if let Some(mut slot) = scratch.slot(node) {
                            slot.nominated -= kept.min(slot.nominated);
                            scratch.set_slot(node, slot);
                        }
                    }
                    self.change_kept(q, |kept_now| kept_now - u64::from(kept));
                }
            }
        }
    }

    fn try_place_nominated(&mut self, q: usize, job: &'a JobRecord, node: NodeId) -> bool {
        let class = job.class();
        let Some(scratch) = self.classes.get(class) else {
            return false;
        };
        let Some(slot) = scratch.slot(node) else {
            return false;
        };
        if node_runs(
            self.state,
            self.unreachable,
            &self.resources_used,
            job,
            node,
        )
        .is_err()
        {
            return false;
        }
        // This job may use the GPUs kept for it, but not those kept for others.
        let kept = self.state.index.kept_for(job.id);
        let available = available_for_job(slot, scratch.available_total, kept);
        if available.on_node < job.gpus() {
            return false;
        }
        let queue = &self.queues[q];
        if admit(
            queue.share,
            class,
            queue.usage,
            queue.kept,
            job.gpus(),
            available.in_class,
            self.reserved(class),
        )
        .is_err()
        {
            return false;
        }
        let mut slot = slot;
        slot.nominated -= kept.min(slot.nominated);
        self.bind(q, job, node, slot, u64::from(kept));
        true
    }

    // --- phases 1 and 3 ----------------------------------------------------------------

    /// The next job of a queue to consider, skipping jobs placed this round (jobs that can
    /// never fit are not in [`Heads`] at all).
    fn head(&mut self, q: usize) -> Option<&'a JobRecord> {
        loop {
            let &(_, id) = self.queues[q].heads.peek()?;
            if self.placed.contains(&id) {
                self.queues[q].heads.next();
                continue;
            }
            return Some(self.job(id));
        }
    }

    fn head_key(&mut self, q: usize) -> Option<(u32, Reverse<JobId>)> {
        self.head(q).map(|job| (job.priority(), Reverse(job.id)))
    }

    /// Phase 1: heads within their share's limit, highest priority first, across shares.
    fn within_limits(&mut self) {
        self.place_heads(true);
    }

    /// Phase 3: `lend-and-borrow` heads above their limit borrow idle capacity.
    fn borrow(&mut self) {
        self.place_heads(false);
    }

    /// Places queue heads in global order (priority desc, submit asc) until each queue is
    /// empty or blocked. With `within_limit_only`, a head that would take its share over its
    /// limit is left for phase 3 without blocking its queue.
    fn place_heads(&mut self, within_limit_only: bool) {
        let mut heap = BinaryHeap::new();
        for q in 0..self.queues.len() {
            if self.queues[q].blocked.is_none() {
                if let Some(key) = self.head_key(q) {
                    heap.push((key, q));
                }
            }
        }
        while let Some((_, q)) = heap.pop() {
            let Some(job) = self.head(q) else { continue };
            let queue = &self.queues[q];
            if within_limit_only
                && queue.usage + u64::from(job.gpus()) > limit_of(queue.share, queue.class)
            {
                continue;
            }
            match self.try_place(q, job) {
                Ok(()) => {
                    if let Some(key) = self.head_key(q) {
                        heap.push((key, q));
                    }
                }
                Err(Blocked::Unrunnable(reason)) => {
                    self.wait(job.id, reason);
                    self.queues[q].heads.next();
                    if let Some(key) = self.head_key(q) {
                        heap.push((key, q));
                    }
                }
                Err(reason) => self.queues[q].blocked = Some((job.id, reason)),
            }
        }
    }

    /// Places a job on the best-fitting node if its share's rules allow it.
    fn try_place(&mut self, q: usize, job: &'a JobRecord) -> Result<(), Blocked> {
        let class = job.class();
        let reserved = self.reserved(class);
        let queue = &self.queues[q];
        let Some(scratch) = self.classes.get_mut(class) else {
            return Err(Blocked::Refused(Refusal::NoFreeCapacity { free: 0 }));
        };
        admit(
            queue.share,
            class,
            queue.usage,
            queue.kept,
            job.gpus(),
            scratch.available_total,
            reserved,
        )
        .map_err(Blocked::Refused)?;
        let (state, unreachable, used) = (self.state, self.unreachable, &self.resources_used);
        let node = match scratch.best_fit(job.gpus(), |node| {
            node_runs(state, unreachable, used, job, node)
        }) {
            Ok(node) => node,
            Err(None) => {
                return Err(Blocked::Reason(WaitReason::Fragmented {
                    class: class.clone(),
                    gpus: job.gpus(),
                }))
            }
            Err(Some(unfit)) => {
                let reason = WaitReason::NodeUnfit {
                    class: class.clone(),
                    gpus: job.gpus(),
                    unfit: unfit.to_string(),
                };
                return Err(match unfit {
                    Unfit::Cpus { .. } | Unfit::Memory { .. } => Blocked::Reason(reason),
                    Unfit::NoDocker | Unfit::NoImage(_) | Unfit::Unreachable => {
                        Blocked::Unrunnable(reason)
                    }
                });
            }
        };
        let slot = scratch.slot(node).expect("best_fit returns a known node");
        self.bind(q, job, node, slot, 0);
        Ok(())
    }

    /// Records a placement on `node`, whose slot (before the placement) is `slot`; the queue
    /// stops keeping `kept` GPUs for the job.
    fn bind(&mut self, q: usize, job: &'a JobRecord, node: NodeId, mut slot: NodeSlot, kept: u64) {
        let mut gpu_mask = 0u64;
        let mut free = slot.free_mask;
        for _ in 0..job.gpus() {
            let lowest = free & free.wrapping_neg();
            gpu_mask |= lowest;
            free &= !lowest;
        }
        slot.free_mask = free;
        if let Some(record) = self.state.node(node) {
            let (cpus, memory) = resources_for(job, record);
            if cpus > 0 || memory > 0 {
                let used = self.resources_used.entry(node).or_insert((0, 0));
                used.0 += u64::from(cpus);
                used.1 += memory;
            }
        }
        let class = job.class();
        self.classes
            .get_mut(class)
            .expect("placed on a known class")
            .set_slot(node, slot);
        let queue = &mut self.queues[q];
        let before = queue.usage + queue.kept;
        queue.usage += u64::from(job.gpus());
        queue.kept -= kept;
        let (share, after) = (queue.share, queue.usage + queue.kept);
        self.move_reserved(share, class, before, after);
        self.placed.insert(job.id);
        self.queues[q].heads.next();
        self.plan.actions.push(PlanAction::Place {
            job: job.id,
            node,
            gpu_mask,
        });
    }

    fn reserved(&self, class: &GpuClass) -> u64 {
        self.reserved_idle.get(class).copied().unwrap_or(0)
    }

    /// Changes the GPUs kept for a queue's nominated jobs, and its share's idle quota with it.
    fn change_kept(&mut self, q: usize, change: impl FnOnce(u64) -> u64) {
        let queue = &mut self.queues[q];
        let before = queue.usage + queue.kept;
        queue.kept = change(queue.kept);
        let (share, class, after) = (queue.share, queue.class, queue.usage + queue.kept);
        self.move_reserved(share, class, before, after);
    }

    /// Moves a share's idle quota from what it claimed `before` (held plus kept) to `after`.
    fn move_reserved(&mut self, share: &ShareSpec, class: &'a GpuClass, before: u64, after: u64) {
        let idle_before = reserved_idle_of(share, class, before);
        let idle_after = reserved_idle_of(share, class, after);
        if idle_before != idle_after {
            let entry = self.reserved_idle.entry(class).or_insert(0);
            *entry = (*entry + idle_after).saturating_sub(idle_before);
        }
    }

    // --- phases 2 and 4 ----------------------------------------------------------------

    /// The blocked queues in head order, for the preemption phases.
    fn blocked_in_order(&self) -> Vec<usize> {
        let mut blocked: Vec<(Reverse<u32>, JobId, usize)> = self
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.nominated)
            .filter_map(|(i, q)| {
                let (id, _) = q.blocked.as_ref()?;
                Some((Reverse(self.job(*id).priority()), *id, i))
            })
            .collect();
        blocked.sort();
        blocked.into_iter().map(|(_, _, q)| q).collect()
    }

    /// Phase 2: a head within its limit that found no room takes borrowed GPUs back.
    fn reclaim(&mut self) {
        let mut failed_gpus: BTreeMap<&'a GpuClass, u32> = BTreeMap::new();
        for q in self.blocked_in_order() {
            let id = self.queues[q].blocked.as_ref().expect("blocked").0;
            let job = self.job(id);
            let queue = &self.queues[q];
            if queue.usage + u64::from(job.gpus()) > limit_of(queue.share, queue.class) {
                continue;
            }
            // A search that found no room for `g` GPUs finds none for more in this round:
            // candidates and free GPUs only shrink, and every non-reserve share sees the same
            // reserved idle quota. Reserve shares see less of it, so they always search.
            let class = job.class();
            let memo = self.queues[q].share.strategy != quotient_common::Strategy::Reserve;
            if memo && failed_gpus.get(class).is_some_and(|g| job.gpus() >= *g) {
                continue;
            }
            let mut merge = self.borrowed_merge(class);
            let found = self.choose_victims(q, job, || merge.next(self));
            match found {
                Some((node, victims)) => {
                    self.nominate(q, job, node, victims, PreemptionKind::Reclaim)
                }
                None if memo => {
                    let entry = failed_gpus.entry(class).or_insert(job.gpus());
                    *entry = (*entry).min(job.gpus());
                }
                None => {}
            }
        }
    }

    /// Borrowed jobs of a class across shares, in victim order: lowest priority first, then
    /// most recently started (least work lost). A share's jobs ranked by (priority desc, start
    /// asc) beyond its limit are its borrowed ones; jobs already stopping do not count.
    /// A lazy merge of one stream per borrowing share, so a search that succeeds early costs
    /// little.
    fn borrowed_merge(&self, class: &GpuClass) -> BorrowedMerge<'a> {
        let state: &'a State = self.state;
        let mut merge = BorrowedMerge {
            streams: Vec::new(),
            heap: BinaryHeap::new(),
            yielded: 0,
        };
        for (share_name, classes) in &state.index.shares {
            let Some(index) = classes.get(class) else {
                continue;
            };
            let limit = state
                .data
                .shares
                .get(share_name)
                .map_or(0, |s| limit_of(&s.spec, class));
            let victims_this_round = self
                .victim_gpus
                .get(&(share_name.as_str(), class))
                .copied()
                .unwrap_or(0);
            let held = index.usage - index.preempting - victims_this_round;
            let borrowed = BorrowedFromLowest::new(held, limit);
            if !borrowed.any_left() {
                continue;
            }
            merge.streams.push(BorrowedStream {
                jobs: index.holding.iter().rev(),
                borrowed,
            });
        }
        for i in 0..merge.streams.len() {
            merge.refill(self, i);
        }
        merge
    }

    fn stopping(&self, id: JobId) -> bool {
        self.victims.contains(&id) || self.job(id).state == JobState::Preempting
    }

    /// Phase 4: a head still blocked preempts lower-priority jobs of its own share.
    fn in_share(&mut self) {
        for q in self.blocked_in_order() {
            if !self.queues[q].share.in_share_preemption || self.queues[q].nominated {
                continue;
            }
            let id = self.queues[q].blocked.as_ref().expect("blocked").0;
            let job = self.job(id);
            let queue = &self.queues[q];
            // Reverse rank order is victim order: lowest priority, most recently started.
            let candidates: Vec<JobId> = queue
                .index
                .holding
                .iter()
                .rev()
                .map(|(_, _, id)| *id)
                .filter(|id| !self.stopping(*id))
                .take_while(|id| self.job(*id).priority() < job.priority())
                .take(IN_SHARE_CANDIDATES_SCAN_MAX)
                .collect();
            let mut candidates = candidates.into_iter();
            if let Some((node, victims)) = self.choose_victims(q, job, || candidates.next()) {
                self.nominate(q, job, node, victims, PreemptionKind::InShare);
            }
        }
    }

    /// The smallest set of victims, taken in candidate order, that frees room for `job` on
    /// one node; the node reached first in candidate order wins.
    fn choose_victims(
        &self,
        q: usize,
        job: &'a JobRecord,
        mut next_candidate: impl FnMut() -> Option<JobId>,
    ) -> Option<(NodeId, Vec<JobId>)> {
        let class = job.class();
        let share_name = self.queues[q].share.name.as_str();
        let scratch = self.classes.get(class)?;
        let mut per_node: BTreeMap<NodeId, Vec<JobId>> = BTreeMap::new();
        while let Some(id) = next_candidate() {
            let victim = self.job(id);
            let Some(alloc) = victim.allocation else {
                continue;
            };
            let Some(slot) = scratch.slot(alloc.node) else {
                continue;
            };
            if !self.may_host(job, alloc.node) {
                continue;
            }
            let on_node = per_node.entry(alloc.node).or_default();
            on_node.push(id);
            if self.frees_enough(q, job, slot, scratch.available_total, on_node, share_name) {
                let mut set = on_node.clone();
                // No more than needed: drop any earlier victim the set can do without.
                let mut i = 0;
                while i + 1 < set.len() {
                    let mut without = set.clone();
                    without.remove(i);
                    if self.frees_enough(
                        q,
                        job,
                        slot,
                        scratch.available_total,
                        &without,
                        share_name,
                    ) {
                        set = without;
                    } else {
                        i += 1;
                    }
                }
                return Some((alloc.node, set));
            }
        }
        None
    }

    fn frees_enough(
        &self,
        q: usize,
        job: &JobRecord,
        slot: NodeSlot,
        available_total: u64,
        victims: &[JobId],
        share_name: &str,
    ) -> bool {
        let freed: u64 = victims.iter().map(|v| u64::from(self.job(*v).gpus())).sum();
        let own_freed: u64 = victims
            .iter()
            .map(|v| self.job(*v))
            .filter(|v| v.spec.share == share_name)
            .map(|v| u64::from(v.gpus()))
            .sum();
        if u64::from(slot.available()) + freed < u64::from(job.gpus()) {
            return false;
        }
        let queue = &self.queues[q];
        let usage = queue.usage - own_freed;
        // Usage drops by the share's own victims; its reserved idle grows if it is a reserve
        // share, which `admit` subtracts again as its own.
        let reserved = self.reserved(queue.class).saturating_sub(reserved_idle_of(
            queue.share,
            queue.class,
            queue.usage + queue.kept,
        )) + reserved_idle_of(queue.share, queue.class, usage + queue.kept);
        matches!(
            admit(
                queue.share,
                queue.class,
                usage,
                queue.kept,
                job.gpus(),
                available_total + freed,
                reserved
            ),
            Ok(Admission::WithinLimit | Admission::Borrowing)
        )
    }

    fn nominate(
        &mut self,
        q: usize,
        job: &'a JobRecord,
        node: NodeId,
        victims: Vec<JobId>,
        kind: PreemptionKind,
    ) {
        for v in &victims {
            self.preempt(*v, kind, Some(job.id));
        }
        // The node keeps free what the victims' GPUs will not cover (`index::Nominee`).
        let freed: u32 = victims.iter().map(|v| self.job(*v).gpus()).sum();
        let kept = job.gpus().saturating_sub(freed);
        let class = job.class();
        let scratch = self
            .classes
            .get_mut(class)
            .expect("victims on a known class");
        let mut slot = scratch.slot(node).expect("victims on a known node");
        slot.nominated += kept;
        scratch.set_slot(node, slot);
        self.change_kept(q, |kept_now| kept_now + u64::from(kept));
        self.plan
            .actions
            .push(PlanAction::Nominate { job: job.id, node });
        let node_name = self.node_name(node);
        let queue = &mut self.queues[q];
        queue.nominated = true;
        queue.blocked = Some((
            job.id,
            Blocked::Reason(WaitReason::WaitingForPreemption {
                node: node_name,
                victims,
            }),
        ));
    }

    fn preempt(&mut self, job: JobId, kind: PreemptionKind, for_job: Option<JobId>) {
        if self.victims.insert(job) {
            let record = self.job(job);
            *self
                .victim_gpus
                .entry((record.spec.share.as_str(), record.class()))
                .or_insert(0) += u64::from(record.gpus());
            self.plan
                .actions
                .push(PlanAction::Preempt { job, kind, for_job });
        }
    }

    /// Whether preempting jobs on `node` could make room for `job` there: the node is
    /// reachable and has its runtime and image (its CPUs and memory are checked when the job
    /// is placed, after the victims have freed theirs).
    fn may_host(&self, job: &JobRecord, node: NodeId) -> bool {
        match node_runs(self.state, self.unreachable, &HashMap::new(), job, node) {
            Ok(()) | Err(Unfit::Cpus { .. } | Unfit::Memory { .. }) => true,
            Err(Unfit::NoDocker | Unfit::NoImage(_) | Unfit::Unreachable) => false,
        }
    }

    fn node_name(&self, node: NodeId) -> String {
        self.state
            .node(node)
            .map_or_else(|| format!("node #{}", node.0), |n| n.name.clone())
    }

    // --- phase 5 -------------------------------------------------------------------------

    /// Records why each blocked head waits, where that changed.
    /// The last phase: it takes the queues' reasons, which no phase reads after it.
    fn reasons(&mut self) {
        for q in 0..self.queues.len() {
            let Some((id, blocked)) = self.queues[q].blocked.take() else {
                continue;
            };
            let reason = match blocked {
                Blocked::Refused(refusal) => {
                    let queue = &self.queues[q];
                    let known = self.job(id).reason.as_ref();
                    if known.is_some_and(|r| refusal.is_reason(r, queue.share, queue.class)) {
                        continue;
                    }
                    refusal.reason(queue.share, queue.class)
                }
                Blocked::Reason(reason) | Blocked::Unrunnable(reason) => reason,
            };
            self.wait(id, reason);
        }
    }

    fn wait(&mut self, id: JobId, reason: WaitReason) {
        if self.job(id).reason.as_ref() != Some(&reason) {
            self.plan.waiting.push((id, reason));
        }
    }
}

/// One borrowing share's borrowed jobs, lowest rank first.
struct BorrowedStream<'a> {
    jobs: std::iter::Rev<std::collections::btree_set::Iter<'a, crate::index::HoldingKey>>,
    /// Which of them are borrowed, over the share's jobs not stopping and not yet yielded.
    borrowed: BorrowedFromLowest,
}

/// Victim order across streams: priority asc, then start desc, then id desc.
type VictimKey = Reverse<(u32, Reverse<u64>, Reverse<JobId>)>;

/// The k-way merge of [`BorrowedStream`]s in victim order, bounded by
/// `RECLAIM_CANDIDATES_SCAN_MAX`.
struct BorrowedMerge<'a> {
    streams: Vec<BorrowedStream<'a>>,
    heap: BinaryHeap<(VictimKey, usize, JobId)>,
    yielded: usize,
}

impl<'a> BorrowedMerge<'a> {
    /// Pushes stream `i`'s next borrowed job, if it has one.
    fn refill(&mut self, round: &Round<'a>, i: usize) {
        let stream = &mut self.streams[i];
        if !stream.borrowed.any_left() {
            return;
        }
        for &(_, _, id) in stream.jobs.by_ref() {
            if round.stopping(id) {
                continue;
            }
            let job = round.job(id);
            stream.borrowed.pass(job.gpus());
            let key = Reverse((job.priority(), Reverse(job.placed_index), Reverse(id)));
            self.heap.push((key, i, id));
            return;
        }
    }

    fn next(&mut self, round: &Round<'a>) -> Option<JobId> {
        if self.yielded >= RECLAIM_CANDIDATES_SCAN_MAX {
            return None;
        }
        let (_, i, id) = self.heap.pop()?;
        self.yielded += 1;
        self.refill(round, i);
        Some(id)
    }
}
