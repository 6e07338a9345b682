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

use crate::index::{holding_key, ClassCapacity, JobSize, NodeSlot, QueueKey, ShareClassIndex};
use crate::limits::{
    IN_SHARE_CANDIDATES_SCAN_MAX, RECLAIM_CANDIDATES_SCAN_MAX, VICTIM_NODES_SCAN_MORE_MAX,
};
use crate::plan::{Plan, PlanAction};
use crate::reason::{GangWait, WaitReason};
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
    plan_with(state, unreachable, DEFAULT_TOPOLOGY_KEY)
}

/// The node label whose values a job of several nodes is placed in as few of as fit it.
pub const DEFAULT_TOPOLOGY_KEY: &str = "rack";

/// [`plan_avoiding`], placing jobs of several nodes in as few values of the node label
/// `topology_key` as fit them. The key is a preference of the leader's, not replicated state:
/// `apply` checks only a job's own `same` constraint.
pub fn plan_with(state: &State, unreachable: &BTreeSet<NodeId>, topology_key: &str) -> Plan {
    plan_ordered(state, unreachable, topology_key, BorrowOrder::Fifo)
}

/// How phase 3 orders the heads of the shares that borrow, when idle GPUs are too few for
/// all of them (docs/quota-shares.md, *Who borrows first*).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum BorrowOrder {
    /// Priority, then submit order, across shares: first come, first served, as AWS Batch
    /// documents its assignment of idle capacity. The default.
    #[default]
    Fifo,
    /// The share holding the least of its limit first (GPUs held over its limit, in that
    /// class), then priority and submit order: idle GPUs go to the share furthest below its
    /// entitlement, weighted by its limit.
    Fair,
}

impl BorrowOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            BorrowOrder::Fifo => "fifo",
            BorrowOrder::Fair => "fair",
        }
    }

    pub fn parse(text: &str) -> Option<BorrowOrder> {
        [BorrowOrder::Fifo, BorrowOrder::Fair]
            .into_iter()
            .find(|order| order.as_str() == text)
    }
}

/// [`plan_with`], with phase 3's borrowing in `order`.
pub fn plan_ordered(
    state: &State,
    unreachable: &BTreeSet<NodeId>,
    topology_key: &str,
    order: BorrowOrder,
) -> Plan {
    plan_choosing(
        state,
        unreachable,
        topology_key,
        order,
        VictimOrder::LeastWorkAtRisk,
    )
}

/// How victims of equal priority are chosen (phases 2 and 4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum VictimOrder {
    /// The least work at risk first: the time since the last checkpoint (or the start), per
    /// GPU freed ([`Round::work_at_risk`]). What Quotient does.
    #[default]
    LeastWorkAtRisk,
    /// The most recently placed first, checkpoints unseen: the naive choice that the
    /// evaluation compares against (`quotient what-if`'s `naive-victims`).
    Newest,
}

/// [`plan_ordered`], with victims of equal priority taken in `victims` order.
pub fn plan_choosing(
    state: &State,
    unreachable: &BTreeSet<NodeId>,
    topology_key: &str,
    order: BorrowOrder,
    victims: VictimOrder,
) -> Plan {
    let mut round = Round::new(state, unreachable, topology_key);
    round.borrow_order = order;
    round.victim_order = victims;
    round.run()
}

/// The GPUs of `free_mask` to give a member of `gpus` GPUs on `node`: a set whose GPUs are
/// all NVLink peers of each other when the node reports one, else the lowest indices.
fn choose_gpus(free_mask: u64, gpus: u32, node: Option<&crate::state::NodeRecord>) -> u64 {
    let lowest = |mut free: u64| {
        let mut mask = 0u64;
        for _ in 0..gpus {
            let bit = free & free.wrapping_neg();
            mask |= bit;
            free &= !bit;
        }
        mask
    };
    let Some(node) = node.filter(|n| gpus >= 2 && n.gpus.iter().any(|g| g.nvlink_peers != 0))
    else {
        return lowest(free_mask);
    };
    let peers = |index: u32| {
        node.gpus
            .iter()
            .find(|g| g.index == index)
            .map_or(0, |g| g.nvlink_peers)
    };
    // Greedy, from each free GPU in turn: add the lowest free GPU that is a peer of every
    // GPU taken so far.
    for first in crate::state::mask_indices(free_mask) {
        let mut mask = 1u64 << first;
        let mut common = peers(first) & free_mask;
        while mask.count_ones() < gpus && common != 0 {
            let next = common.trailing_zeros();
            mask |= 1u64 << next;
            common &= peers(next) & !mask;
        }
        if mask.count_ones() == gpus {
            return mask;
        }
    }
    lowest(free_mask)
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
    // The common case, and a round's hot path: a process job bound to no label, on a node
    // that accounts no CPUs or memory, fits wherever its GPUs do. A job of one node bound to
    // a label goes only to nodes that have it (found by probing: the plan put such a job on
    // any node, `apply` refused the placement every round, and the job waited with no
    // reason while its GPUs sat idle for the round).
    let accounts = record.host.cpu_millis > 0 || record.host.memory_bytes > 0;
    if job.spec.payload.image.is_none() && job.spec.same.is_none() && !accounts {
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

impl ClassScratch<'_> {
    /// The nodes of bucket `k` (exactly `k` available GPUs) as the round sees them, in id
    /// order: the untouched nodes of the real bucket and the touched ones now in it.
    fn bucket(&self, k: usize) -> impl Iterator<Item = NodeId> + '_ {
        let mut real = self.real.buckets[k]
            .iter()
            .copied()
            .filter(|node| !self.touched.contains_key(node))
            .peekable();
        let mut overlay = self.overlay[k].iter().copied().peekable();
        std::iter::from_fn(move || match (real.peek(), overlay.peek()) {
            (Some(a), Some(b)) if a < b => real.next(),
            (Some(_), Some(_)) | (None, Some(_)) => overlay.next(),
            (Some(_), None) => real.next(),
            (None, None) => None,
        })
    }

    /// Nodes for a job of several nodes: `job.node_count()` distinct nodes with `job.gpus()`
    /// available each that `accept` takes, best fit first (fewest available GPUs, lowest id),
    /// within as few topology groups (`group`: `None` for a node the job may not use) as
    /// fit it. The first group to reach the count wins outright; otherwise the largest
    /// groups are taken first. When they do not suffice: how many nodes qualify (in the
    /// largest group when the job must stay within one) and why the first refused node was
    /// refused.
    fn gang_fit<'g>(
        &self,
        job: &JobRecord,
        mut accept: impl FnMut(NodeId) -> Result<(), Unfit>,
        group: impl Fn(NodeId) -> Option<Option<&'g str>>,
    ) -> Result<Vec<NodeId>, (u32, Option<Unfit>)> {
        let need = job.node_count() as usize;
        let hard = job.spec.same.is_some();
        let mut groups: Vec<(Option<&'g str>, Vec<NodeId>)> = Vec::new();
        let mut refused = None;
        for k in (job.gpus() as usize).max(1)..self.overlay.len() {
            for node in self.bucket(k) {
                let Some(value) = group(node) else { continue };
                if let Err(unfit) = accept(node) {
                    refused.get_or_insert(unfit);
                    continue;
                }
                let i = match groups.iter().position(|(v, _)| *v == value) {
                    Some(i) => i,
                    None => {
                        groups.push((value, Vec::new()));
                        groups.len() - 1
                    }
                };
                groups[i].1.push(node);
                if groups[i].1.len() == need {
                    return Ok(groups.swap_remove(i).1);
                }
            }
        }
        let sizes = groups.iter().map(|(_, nodes)| nodes.len());
        let qualify = if hard {
            sizes.max().unwrap_or(0)
        } else {
            sizes.sum()
        };
        if hard || qualify < need {
            return Err((qualify as u32, refused));
        }
        groups.sort_by_key(|(_, nodes)| Reverse(nodes.len()));
        Ok(groups
            .into_iter()
            .flat_map(|(_, nodes)| nodes)
            .take(need)
            .collect())
    }
}

/// The topology group of `node` for `job`: the value of its `same` label (`None`: the node
/// lacks the label and may not run the job), else of the topology key (`Some(None)`: the
/// node lacks it, and all such nodes are one group).
fn group_of<'s>(
    state: &'s State,
    node: NodeId,
    job: &JobRecord,
    topology_key: &str,
) -> Option<Option<&'s str>> {
    let labels = &state.node(node)?.host.labels;
    match &job.spec.same {
        Some(key) => labels.get(key).map(|v| Some(v.as_str())),
        None => Some(labels.get(topology_key).map(String::as_str)),
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
    /// It waits for the reason it already has.
    Known,
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
    fn new(index: &'a ShareClassIndex, fits: impl Fn(JobSize) -> bool) -> Self {
        let sizes = index
            .runnable_by_gpus
            .iter()
            .filter(|(size, _)| fits(**size))
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
    /// The node label a job of several nodes is kept within few values of.
    topology_key: &'a str,
    /// Phase 3's order across shares.
    borrow_order: BorrowOrder,
    victim_order: VictimOrder,
}

impl<'a> Round<'a> {
    fn new(state: &'a State, unreachable: &'a BTreeSet<NodeId>, topology_key: &'a str) -> Self {
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
                static NO_NODES: BTreeMap<u32, u32> = BTreeMap::new();
                let node_sizes = state
                    .index
                    .capacity
                    .get(class)
                    .map_or(&NO_NODES, |c| &c.node_sizes);
                let spec = &share.spec;
                queues.push(Queue {
                    share: spec,
                    class,
                    index,
                    heads: Heads::new(index, can_ever_fit(spec, class, node_sizes)),
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
            topology_key,
            borrow_order: BorrowOrder::Fifo,
            victim_order: VictimOrder::LeastWorkAtRisk,
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
        self.hold_for_gangs();
        self.reasons();
        self.plan
    }

    // --- phase 0 -------------------------------------------------------------------------

    /// Preempts every job on a draining node that is not already stopping.
    fn drain(&mut self) {
        for node in &self.state.index.draining {
            for job in self.state.index.jobs_on_node(*node) {
                // A job of several nodes stops whole, whichever of its nodes drains.
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
            let nodes = &job.nominations;
            let Some(&q) = self.queue_of.get(&(job.spec.share.as_str(), job.class())) else {
                continue;
            };
            let waiting_on = self.state.index.preempting_for.get(&id);
            // In-share preemption is only for a higher-priority job: one whose priority was
            // lowered to its victims' or below since gives up what is being freed for it (its
            // victims stop all the same, and come back to their GPUs as the queue's order says).
            let outranked = waiting_on.into_iter().flatten().any(|victim| {
                let victim = self.job(*victim);
                victim.spec.share == job.spec.share && victim.priority() >= job.priority()
            });
            if !outranked && self.try_place_nominated(q, job, nodes) {
                continue;
            }
            let victims: Vec<JobId> = waiting_on.into_iter().flatten().copied().collect();
            if !outranked && !victims.is_empty() {
                let node_name = self.node_names(nodes);
                self.queues[q].nominated = true;
                self.queues[q].blocked = Some((
                    id,
                    Blocked::Reason(WaitReason::WaitingForPreemption {
                        node: node_name,
                        victims,
                    }),
                ));
            } else if !outranked
                && job.is_gang()
                && self.may_hold(q, job, nodes)
                && self
                    .head(q)
                    .is_none_or(|head| head.priority() <= job.priority())
            {
                // A job of several nodes keeps its nodes while the jobs on them end, so that
                // smaller jobs do not take each GPU as it frees; while it heads its queue
                // (a job of its share of higher priority since takes its place, found by
                // probing: that job waited with no reason for as long as the gang did).
                let qualify = self.gang_qualify(job, nodes);
                let known = matches!(
                    job.reason.as_deref(),
                    Some(WaitReason::GangWaiting(wait))
                        if wait.qualify == qualify && wait.held.len() == nodes.len()
                );
                let blocked = if known {
                    Blocked::Known
                } else {
                    Blocked::Reason(self.gang_waiting(job, nodes))
                };
                self.queues[q].nominated = true;
                self.queues[q].blocked = Some((id, blocked));
            } else {
                // Its victims are gone and it still does not fit: release the GPUs kept
                // for it, and let it queue like any other job.
                self.plan
                    .actions
                    .push(PlanAction::ClearNomination { job: id });
                let mut released = 0u64;
                if let Some(scratch) = self.classes.get_mut(job.class()) {
                    for &node in nodes {
                        let kept = state.index.kept_for(id, node);
                        if let Some(mut slot) = scratch.slot(node) {
                            slot.nominated -= kept.min(slot.nominated);
                            scratch.set_slot(node, slot);
                        }
                        released += u64::from(kept);
                    }
                }
                self.change_kept(q, |kept_now| kept_now - released);
            }
        }
    }

    /// Whether a job of several nodes may go on holding `nodes`: each can still run it, and
    /// its share is still within its limit with it.
    fn may_hold(&self, q: usize, job: &JobRecord, nodes: &[NodeId]) -> bool {
        let queue = &self.queues[q];
        let within =
            queue.usage + u64::from(job.total_gpus()) <= limit_of(queue.share, queue.class);
        let scratch = self.classes.get(job.class());
        within
            && nodes.iter().all(|node| {
                self.may_host(job, *node)
                    && scratch
                        .and_then(|s| s.slot(*node))
                        .is_some_and(|slot| slot.healthy >= job.gpus())
            })
    }

    fn try_place_nominated(&mut self, q: usize, job: &'a JobRecord, nodes: &[NodeId]) -> bool {
        let class = job.class();
        let Some(scratch) = self.classes.get(class) else {
            return false;
        };
        let mut in_class = scratch.available_total;
        let mut kept_total = 0u64;
        for &node in nodes {
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
            let kept = self.state.index.kept_for(job.id, node);
            let available = available_for_job(slot, scratch.available_total, kept);
            if available.on_node < job.gpus() {
                return false;
            }
            in_class = in_class - u64::from(slot.available()) + u64::from(available.on_node);
            kept_total += u64::from(kept);
        }
        let queue = &self.queues[q];
        if admit(
            queue.share,
            class,
            queue.usage,
            queue.kept,
            job.total_gpus(),
            in_class,
            self.reserved(class),
        )
        .is_err()
        {
            return false;
        }
        let members: Vec<(NodeId, u32)> = nodes
            .iter()
            .map(|node| (*node, self.state.index.kept_for(job.id, *node)))
            .collect();
        self.bind(q, job, &members, kept_total);
        true
    }

    // --- phases 1 and 3 ----------------------------------------------------------------

    /// The next job of a queue to consider, skipping jobs placed this round (jobs that can
    /// never fit are not in [`Heads`] at all, but for jobs of several nodes in a set whose
    /// smallest could fit: those are passed over here).
    fn head(&mut self, q: usize) -> Option<&'a JobRecord> {
        loop {
            let &(_, id) = self.queues[q].heads.peek()?;
            if self.placed.contains(&id) {
                self.queues[q].heads.next();
                continue;
            }
            let job = self.job(id);
            if job.is_gang() {
                let queue = &self.queues[q];
                let node_sizes = self
                    .state
                    .index
                    .capacity
                    .get(queue.class)
                    .map(|c| &c.node_sizes);
                let fits = node_sizes.is_some_and(|sizes| {
                    can_ever_fit(queue.share, queue.class, sizes)(JobSize::of(job))
                });
                if !fits {
                    self.queues[q].heads.next();
                    continue;
                }
            }
            return Some(job);
        }
    }

    fn head_key(&mut self, q: usize) -> Option<(u32, Reverse<JobId>)> {
        self.head(q).map(|job| (job.priority(), Reverse(job.id)))
    }

    /// A queue's place in phase 1's or phase 3's order: its head's priority and submit order,
    /// after (phase 3, [`BorrowOrder::Fair`]) how much of its limit its share holds, in
    /// millionths, least first.
    fn order_key(
        &mut self,
        q: usize,
        borrowing: bool,
    ) -> Option<(Reverse<u64>, u32, Reverse<JobId>)> {
        let (priority, id) = self.head_key(q)?;
        let held = if borrowing && self.borrow_order == BorrowOrder::Fair {
            let queue = &self.queues[q];
            let limit = limit_of(queue.share, queue.class).max(1);
            queue.usage.saturating_mul(1_000_000) / limit
        } else {
            0
        };
        Some((Reverse(held), priority, id))
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
        let borrowing = !within_limit_only;
        let mut heap = BinaryHeap::new();
        for q in 0..self.queues.len() {
            if self.queues[q].blocked.is_none() {
                if let Some(key) = self.order_key(q, borrowing) {
                    heap.push((key, q));
                }
            }
        }
        while let Some((_, q)) = heap.pop() {
            let Some(job) = self.head(q) else { continue };
            let queue = &self.queues[q];
            if within_limit_only
                && queue.usage + u64::from(job.total_gpus()) > limit_of(queue.share, queue.class)
            {
                continue;
            }
            match self.try_place(q, job) {
                Ok(()) => {
                    if let Some(key) = self.order_key(q, borrowing) {
                        heap.push((key, q));
                    }
                }
                Err(Blocked::Unrunnable(reason)) => {
                    self.wait(job.id, reason);
                    self.queues[q].heads.next();
                    if let Some(key) = self.order_key(q, borrowing) {
                        heap.push((key, q));
                    }
                }
                Err(reason) => self.queues[q].blocked = Some((job.id, reason)),
            }
        }
    }

    /// Places a job on the best-fitting node (a job of several nodes on the best-fitting
    /// nodes, in as few values of the topology label as fit it) if its share's rules allow
    /// it.
    fn try_place(&mut self, q: usize, job: &'a JobRecord) -> Result<(), Blocked> {
        let class = job.class();
        let reserved = self.reserved(class);
        let queue = &self.queues[q];
        let Some(scratch) = self.classes.get_mut(class) else {
            return Err(Blocked::Refused(Refusal::NoFreeCapacity { free: 0 }));
        };
        let admitted = admit(
            queue.share,
            class,
            queue.usage,
            queue.kept,
            job.total_gpus(),
            scratch.available_total,
            reserved,
        );
        // A job of several nodes short of free GPUs waits for whole nodes: it is told how
        // many qualify, and may have nodes held for it (`hold_for_gangs`).
        let short = match admitted {
            Ok(_) => None,
            Err(refusal @ Refusal::NoFreeCapacity { .. }) if job.is_gang() => Some(refusal),
            Err(refusal) => return Err(Blocked::Refused(refusal)),
        };
        let (state, unreachable, used) = (self.state, self.unreachable, &self.resources_used);
        let accept = |node| node_runs(state, unreachable, used, job, node);
        if job.is_gang() {
            let key = self.topology_key;
            let group = |node: NodeId| group_of(state, node, job, key);
            return match scratch.gang_fit(job, accept, group) {
                // The nodes are there, but the GPUs on them are reserve shares' idle quota.
                Ok(_) if short.is_some() => Err(Blocked::Refused(short.expect("matched"))),
                Ok(nodes) => {
                    let members: Vec<(NodeId, u32)> = nodes.into_iter().map(|n| (n, 0)).collect();
                    self.bind(q, job, &members, 0);
                    Ok(())
                }
                Err((0, Some(unfit))) if unfit.is_lasting() => {
                    Err(Blocked::Unrunnable(WaitReason::NodeUnfit {
                        class: class.clone(),
                        gpus: job.gpus(),
                        unfit: unfit.to_string(),
                    }))
                }
                Err((qualify, _)) => {
                    // Bound to one value of a label that no value has enough nodes of: it can
                    // never start as the fleet stands, and does not hold up its queue.
                    let most = job.spec.same.as_ref().map(|_| {
                        let mut per_value: BTreeMap<&str, u32> = BTreeMap::new();
                        for (node, slot) in &scratch.real.slots {
                            if slot.healthy >= job.gpus() {
                                if let Some(Some(value)) = group(*node) {
                                    *per_value.entry(value).or_default() += 1;
                                }
                            }
                        }
                        per_value.into_values().max().unwrap_or(0)
                    });
                    match (most, &job.spec.same) {
                        (Some(most), Some(same)) if most < job.node_count() => {
                            Err(Blocked::Unrunnable(WaitReason::SameTooFew {
                                class: class.clone(),
                                gpus: job.gpus(),
                                nodes: job.node_count(),
                                same: same.clone(),
                                most,
                            }))
                        }
                        _ => Err(Blocked::Reason(WaitReason::GangWaiting(Box::new(
                            GangWait {
                                class: class.clone(),
                                gpus: job.gpus(),
                                nodes: job.node_count(),
                                same: job.spec.same.clone(),
                                qualify,
                                held: Vec::new(),
                            },
                        )))),
                    }
                }
            };
        }
        let node = match scratch.best_fit(job.gpus(), accept) {
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
                return Err(if unfit.is_lasting() {
                    Blocked::Unrunnable(reason)
                } else {
                    Blocked::Reason(reason)
                });
            }
        };
        self.bind(q, job, &[(node, 0)], 0);
        Ok(())
    }

    /// Records a placement of `job` with one member on each node of `members` (rank order),
    /// each with the GPUs kept for it there; the queue stops keeping `kept` GPUs for it.
    fn bind(&mut self, q: usize, job: &'a JobRecord, members: &[(NodeId, u32)], kept: u64) {
        let class = job.class();
        let mut placed = Vec::with_capacity(members.len());
        for &(node, kept_here) in members {
            let scratch = self
                .classes
                .get_mut(class)
                .expect("placed on a known class");
            let mut slot = scratch.slot(node).expect("placed on a known node");
            let record = self.state.node(node);
            let gpu_mask = choose_gpus(slot.free_mask, job.gpus(), record);
            slot.free_mask &= !gpu_mask;
            slot.nominated -= kept_here.min(slot.nominated);
            scratch.set_slot(node, slot);
            if let Some(record) = record {
                let (cpus, memory) = resources_for(job, record);
                if cpus > 0 || memory > 0 {
                    let used = self.resources_used.entry(node).or_insert((0, 0));
                    used.0 += u64::from(cpus);
                    used.1 += memory;
                }
            }
            placed.push((node, gpu_mask));
        }
        let queue = &mut self.queues[q];
        let before = queue.usage + queue.kept;
        queue.usage += u64::from(job.total_gpus());
        queue.kept -= kept;
        let (share, after) = (queue.share, queue.usage + queue.kept);
        self.move_reserved(share, class, before, after);
        self.placed.insert(job.id);
        self.queues[q].heads.next();
        let action = match placed.as_slice() {
            [(node, gpu_mask)] if !job.is_gang() => PlanAction::Place {
                job: job.id,
                node: *node,
                gpu_mask: *gpu_mask,
            },
            _ => PlanAction::PlaceMembers {
                job: job.id,
                members: placed,
            },
        };
        self.plan.actions.push(action);
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
            if queue.usage + u64::from(job.total_gpus()) > limit_of(queue.share, queue.class) {
                continue;
            }
            // A search that found no room for `g` GPUs finds none for more in this round:
            // candidates and free GPUs only shrink, and every non-reserve share sees the same
            // reserved idle quota. Reserve shares see less of it, so they always search. (Jobs
            // of several nodes always search: their room is whole nodes.)
            let class = job.class();
            let memo = self.queues[q].share.strategy != quotient_common::Strategy::Reserve
                && !job.is_gang();
            if memo && failed_gpus.get(class).is_some_and(|g| job.gpus() >= *g) {
                continue;
            }
            let mut merge = self.borrowed_merge(class);
            let found = self.choose_victims(q, job, || merge.next(self));
            match found {
                Some((nodes, victims)) => {
                    self.nominate(q, job, nodes, victims, PreemptionKind::Reclaim)
                }
                None if memo => {
                    let entry = failed_gpus.entry(class).or_insert(job.gpus());
                    *entry = (*entry).min(job.gpus());
                }
                None => {}
            }
        }
    }

    /// Borrowed jobs of a class across shares, in victim order ([`Round::victim_key`]):
    /// lowest priority first, then least work at risk. A share's jobs ranked by (priority desc,
    /// start asc) beyond its limit are its borrowed ones; jobs already stopping do not count.
    /// A lazy merge of one stream per borrowing share, a priority tier at a time, so a search
    /// that succeeds early costs little.
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
                jobs: index.holding.iter().rev().peekable(),
                borrowed,
                in_heap: 0,
            });
        }
        for i in 0..merge.streams.len() {
            merge.refill(self, i);
        }
        merge
    }

    /// The work `job` would lose if it were stopped now (the state's clock), per GPU it frees:
    /// the milliseconds since it last checkpointed, or since it began running in this attempt
    /// when it has not. A job not running yet loses nothing. Per GPU, because victims are
    /// taken to free GPUs: what a victim frees is its GPUs, what it costs is this times them,
    /// so this is the cost of each GPU freed. Weighting by GPUs instead made the scheduler
    /// prefer small victims, which free less each, and cost more preemptions and more work
    /// lost in all (BENCHMARKS.md, the evaluation's notebook).
    fn work_at_risk(&self, job: &JobRecord) -> u64 {
        if job.state != JobState::Running || self.victim_order == VictimOrder::Newest {
            return 0;
        }
        let Some(started) = job.started_ms else {
            return 0;
        };
        let since = self.state.checkpoint_in_attempt(job).unwrap_or(started);
        self.state.data.clock_ms.saturating_sub(since)
    }

    /// The work `job` would lose in all if it were stopped now: its work at risk
    /// ([`Round::work_at_risk`]) times its GPUs, on every node.
    fn loss_of(&self, job: &JobRecord) -> u128 {
        u128::from(self.work_at_risk(job)) * u128::from(job.total_gpus())
    }

    /// Where `job` stands in victim order (the greatest goes first): lowest priority, then
    /// least work at risk ([`Round::work_at_risk`]; none counted in [`VictimOrder::Newest`]),
    /// then most recently placed, then newest.
    fn victim_key(&self, job: &JobRecord) -> VictimKey {
        Reverse((
            job.priority(),
            self.work_at_risk(job),
            Reverse(job.placed_index),
            Reverse(job.id),
        ))
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
            // Reverse rank order is lowest priority first; within a priority, the victim
            // order is least work at risk first.
            let mut candidates: Vec<JobId> = queue
                .index
                .holding
                .iter()
                .rev()
                .map(|(_, _, id)| *id)
                .filter(|id| !self.stopping(*id))
                .take_while(|id| self.job(*id).priority() < job.priority())
                .take(IN_SHARE_CANDIDATES_SCAN_MAX)
                .collect();
            candidates.sort_by_cached_key(|id| self.victim_key(self.job(*id)).0);
            let mut next = candidates.iter().copied();
            let chosen = self.choose_victims(q, job, || next.next()).or_else(|| {
                // No node's victims free room for it, but a node has room already and
                // only the share's limit holds it back: victims anywhere free that.
                let node = self.room_for(job)?;
                let mut next = candidates.iter().copied();
                self.choose_quota_victims(q, job, node, || next.next())
            });
            if let Some((nodes, victims)) = chosen {
                self.nominate(q, job, nodes, victims, PreemptionKind::InShare);
            }
        }
    }

    /// The smallest set of victims, taken in candidate order, that frees room for `job`: on
    /// one node, or for a job of several nodes on enough whole nodes
    /// ([`Round::choose_gang_victims`]). A victim of several nodes frees its GPUs on each of
    /// them, and all of them count against its share.
    ///
    /// On one node: once a node would do, the search goes on through the candidates of the
    /// same priority as the victim that made it do (at most [`VICTIM_NODES_SCAN_MORE_MAX`]
    /// more), and takes the node whose set loses the least work in all
    /// ([`Round::loss_of`]; the first such node on a tie). Candidates come per GPU freed
    /// ([`Round::work_at_risk`]), so the node reached first can hold a large victim that
    /// risks a little less per GPU and loses far more in all (BENCHMARKS.md, the evaluation's
    /// notebook, "Thirty-two months", measures both).
    fn choose_victims(
        &self,
        q: usize,
        job: &'a JobRecord,
        mut next_candidate: impl FnMut() -> Option<JobId>,
    ) -> Option<(Vec<NodeId>, Vec<JobId>)> {
        if job.is_gang() {
            return self.choose_gang_victims(q, job, next_candidate);
        }
        let class = job.class();
        let scratch = self.classes.get(class)?;
        let mut per_node: BTreeMap<NodeId, Vec<JobId>> = BTreeMap::new();
        // The cheapest node found so far, and once one is found, the priority of the victim
        // that made it do and how many candidates of that priority were looked at since.
        let mut best: Option<(u128, NodeId, Vec<JobId>)> = None;
        let mut tier: Option<(u32, usize)> = None;
        while let Some(id) = next_candidate() {
            let victim = self.job(id);
            if let Some((priority, seen)) = tier.as_mut() {
                if victim.priority() != *priority || *seen >= VICTIM_NODES_SCAN_MORE_MAX {
                    break;
                }
                *seen += 1;
            }
            for alloc in &victim.placement {
                let Some(slot) = scratch.slot(alloc.node) else {
                    continue;
                };
                if !self.may_host(job, alloc.node) {
                    continue;
                }
                let on_node = per_node.entry(alloc.node).or_default();
                on_node.push(id);
                let nodes = [(alloc.node, slot)];
                if self.frees_enough(q, job, &nodes, scratch.available_total, on_node) {
                    let set = self.fewest(q, job, &nodes, scratch.available_total, on_node.clone());
                    if self.victim_order == VictimOrder::Newest {
                        // Checkpoints unseen: every set costs the same, the first node wins.
                        return Some((vec![alloc.node], set));
                    }
                    let loss: u128 = set.iter().map(|v| self.loss_of(self.job(*v))).sum();
                    if best.as_ref().is_none_or(|(least, _, _)| loss < *least) {
                        best = Some((loss, alloc.node, set));
                    }
                    tier.get_or_insert((victim.priority(), 0));
                }
            }
        }
        best.map(|(_, node, set)| (vec![node], set))
    }

    /// For a job of one node: the node it would be placed on now, best fit, were its share's
    /// rules to admit it. `None` for a job of several nodes.
    fn room_for(&self, job: &JobRecord) -> Option<NodeId> {
        if job.is_gang() {
            return None;
        }
        let scratch = self.classes.get(job.class())?;
        ((job.gpus() as usize).max(1)..scratch.overlay.len()).find_map(|k| {
            scratch.bucket(k).find(|node| {
                node_runs(
                    self.state,
                    self.unreachable,
                    &self.resources_used,
                    job,
                    *node,
                )
                .is_ok()
            })
        })
    }

    /// For a job of one node with room on `node` that only its share's rules hold back: the
    /// fewest victims, taken in candidate order wherever they run, whose GPUs let the rules
    /// admit it. It is nominated to `node`, whose free GPUs are kept for it meanwhile.
    fn choose_quota_victims(
        &self,
        q: usize,
        job: &'a JobRecord,
        node: NodeId,
        mut next_candidate: impl FnMut() -> Option<JobId>,
    ) -> Option<(Vec<NodeId>, Vec<JobId>)> {
        let scratch = self.classes.get(job.class())?;
        let nodes = [(node, scratch.slot(node)?)];
        let mut taken = Vec::new();
        while let Some(id) = next_candidate() {
            taken.push(id);
            if self.frees_enough(q, job, &nodes, scratch.available_total, &taken) {
                let set = self.fewest(q, job, &nodes, scratch.available_total, taken);
                return Some((vec![node], set));
            }
        }
        None
    }

    /// Drops from `set` every victim, earliest first, that `job` can do without on `nodes`.
    fn fewest(
        &self,
        q: usize,
        job: &JobRecord,
        nodes: &[(NodeId, NodeSlot)],
        available_total: u64,
        mut set: Vec<JobId>,
    ) -> Vec<JobId> {
        let mut i = 0;
        while i + 1 < set.len() || (nodes.len() > 1 && i < set.len()) {
            let mut without = set.clone();
            without.remove(i);
            if self.frees_enough(q, job, nodes, available_total, &without) {
                set = without;
            } else {
                i += 1;
            }
        }
        set
    }

    /// For a job of several nodes: victims, in candidate order, that free `job.gpus()` GPUs
    /// on enough whole nodes (nodes with room already count without victims), all of one
    /// value of its `same` label if it has one. Victims that free nothing on a node the job
    /// could use are passed over, GPUs scattered where it cannot run being no use for room,
    /// unless they are its own share's: those free part of its limit, and are taken when the
    /// nodes have room and only the limit holds it back.
    fn choose_gang_victims(
        &self,
        q: usize,
        job: &'a JobRecord,
        mut next_candidate: impl FnMut() -> Option<JobId>,
    ) -> Option<(Vec<NodeId>, Vec<JobId>)> {
        let scratch = self.classes.get(job.class())?;
        let need = job.node_count() as usize;
        let gpus = job.gpus();
        let key = self.topology_key;
        let group = |node: NodeId| group_of(self.state, node, job, key);
        let accept = |node| {
            node_runs(
                self.state,
                self.unreachable,
                &self.resources_used,
                job,
                node,
            )
        };
        // Nodes with room now, and per group; the search needs at most `need` of them.
        let mut room: Vec<NodeId> = Vec::new();
        for k in (gpus as usize).max(1)..scratch.overlay.len() {
            for node in scratch.bucket(k) {
                if room.len() >= need {
                    break;
                }
                if group(node).is_some() && accept(node).is_ok() {
                    room.push(node);
                }
            }
        }
        // Per node a victim touches: its slot and the victims there so far.
        let mut touched: BTreeMap<NodeId, (NodeSlot, Vec<JobId>)> = BTreeMap::new();
        let mut qualified: Vec<NodeId> = room.clone();
        // Victims that free GPUs on nodes it could use, and those and its share's own
        // victims elsewhere, which free part of its limit; both in candidate order.
        let mut taken: Vec<JobId> = Vec::new();
        let mut seen: Vec<JobId> = Vec::new();
        let (mut freed, mut own_freed) = (0u64, 0u64);
        let share_name = self.queues[q].share.name.as_str();
        while let Some(id) = next_candidate() {
            let victim = self.job(id);
            let mut useful = false;
            for alloc in &victim.placement {
                if room.contains(&alloc.node) || group(alloc.node).is_none() {
                    continue;
                }
                let Some(slot) = scratch.slot(alloc.node) else {
                    continue;
                };
                if slot.healthy < gpus || !self.may_host(job, alloc.node) {
                    continue;
                }
                useful = true;
                let entry = touched.entry(alloc.node).or_insert((slot, Vec::new()));
                entry.1.push(id);
                let freed: u32 = entry.1.iter().map(|v| self.job(*v).gpus()).sum();
                if slot.available() + freed >= gpus && !qualified.contains(&alloc.node) {
                    qualified.push(alloc.node);
                }
            }
            // A victim of its own share frees part of its limit wherever it runs; one of
            // another share that frees nothing here is no use to it.
            let own = victim.spec.share == share_name;
            if !useful && !own {
                continue;
            }
            if useful {
                taken.push(id);
            }
            seen.push(id);
            freed += u64::from(victim.total_gpus());
            if own {
                own_freed += u64::from(victim.total_gpus());
            }
            // Cheap tests first: enough nodes, and the quota with every victim taken so far.
            if qualified.len() < need
                || !self.admits_after(q, job, scratch.available_total, freed, own_freed)
            {
                continue;
            }
            let Some(chosen) = self.pick_gang_nodes(job, &qualified, need) else {
                continue;
            };
            let nodes: Vec<(NodeId, NodeSlot)> = chosen
                .iter()
                .map(|n| (*n, scratch.slot(*n).expect("a known node")))
                .collect();
            let mut set: Vec<JobId> = taken
                .iter()
                .copied()
                .filter(|v| {
                    chosen
                        .iter()
                        .any(|n| touched.get(n).is_some_and(|(_, vs)| vs.contains(v)))
                })
                .collect();
            // The chosen nodes have room once their victims stop (nodes with room already
            // come first); what may still be missing is the share's rules: the other victims
            // seen, in candidate order, wherever they run, until those admit it.
            for v in &seen {
                if self.frees_enough(q, job, &nodes, scratch.available_total, &set) {
                    break;
                }
                if !set.contains(v) {
                    set.push(*v);
                }
            }
            if self.frees_enough(q, job, &nodes, scratch.available_total, &set) {
                let set = self.fewest(q, job, &nodes, scratch.available_total, set);
                return Some((chosen, set));
            }
        }
        None
    }

    /// `need` of the `qualified` nodes, earliest first, all in one value of the job's `same`
    /// label if it has one, else in as few values of the topology label as fit it.
    fn pick_gang_nodes(
        &self,
        job: &JobRecord,
        qualified: &[NodeId],
        need: usize,
    ) -> Option<Vec<NodeId>> {
        if qualified.len() < need {
            return None;
        }
        let mut groups: Vec<(Option<&str>, Vec<NodeId>)> = Vec::new();
        for node in qualified {
            let value = group_of(self.state, *node, job, self.topology_key)?;
            match groups.iter_mut().find(|(v, _)| *v == value) {
                Some((_, nodes)) => nodes.push(*node),
                None => groups.push((value, vec![*node])),
            }
        }
        if let Some((_, nodes)) = groups.iter().find(|(_, nodes)| nodes.len() >= need) {
            return Some(nodes[..need].to_vec());
        }
        if job.spec.same.is_some() {
            return None;
        }
        groups.sort_by_key(|(_, nodes)| Reverse(nodes.len()));
        Some(groups.into_iter().flat_map(|(_, n)| n).take(need).collect())
    }

    /// Whether preempting `victims` makes room for `job` on every one of `nodes` (each
    /// given with its slot) and lets its share's rules admit it; and whether `nodes` may keep
    /// what the victims do not free there meanwhile without taking reserve shares' idle
    /// quota. (Victims elsewhere, which free part of the share's limit, free nothing on
    /// `nodes`: what is kept for the job there must be free GPUs that no reserve share has.)
    fn frees_enough(
        &self,
        q: usize,
        job: &JobRecord,
        nodes: &[(NodeId, NodeSlot)],
        available_total: u64,
        victims: &[JobId],
    ) -> bool {
        let queue = &self.queues[q];
        let share_name = queue.share.name.as_str();
        let mut kept = 0u64;
        for (node, slot) in nodes {
            let freed_here: u32 = victims
                .iter()
                .map(|v| self.job(*v))
                .filter(|v| v.member_on(*node).is_some())
                .map(|v| v.gpus())
                .sum();
            if slot.available() + freed_here < job.gpus() {
                return false;
            }
            kept += u64::from(job.gpus().saturating_sub(freed_here));
        }
        if available_total < kept + self.others_reserved(q) {
            return false;
        }
        let freed: u64 = victims
            .iter()
            .map(|v| u64::from(self.job(*v).total_gpus()))
            .sum();
        let own_freed: u64 = victims
            .iter()
            .map(|v| self.job(*v))
            .filter(|v| v.spec.share == share_name)
            .map(|v| u64::from(v.total_gpus()))
            .sum();
        self.admits_after(q, job, available_total, freed, own_freed)
    }

    /// The idle quota of the reserve shares of queue `q`'s class other than its own share.
    fn others_reserved(&self, q: usize) -> u64 {
        let queue = &self.queues[q];
        self.reserved(queue.class).saturating_sub(reserved_idle_of(
            queue.share,
            queue.class,
            queue.usage + queue.kept,
        ))
    }

    /// Whether `job`'s share's rules admit it once victims freeing `freed` GPUs of its class
    /// (`own_freed` of them its share's own) have stopped.
    fn admits_after(
        &self,
        q: usize,
        job: &JobRecord,
        available_total: u64,
        freed: u64,
        own_freed: u64,
    ) -> bool {
        let queue = &self.queues[q];
        let usage = queue.usage - own_freed;
        // Usage drops by the share's own victims; its reserved idle grows if it is a reserve
        // share, which `admit` subtracts again as its own.
        let reserved = self.others_reserved(q)
            + reserved_idle_of(queue.share, queue.class, usage + queue.kept);
        matches!(
            admit(
                queue.share,
                queue.class,
                usage,
                queue.kept,
                job.total_gpus(),
                available_total + freed,
                reserved
            ),
            Ok(Admission::WithinLimit | Admission::Borrowing)
        )
    }

    /// Preempts `victims` for `job` and has `nodes` keep free what the victims' GPUs will not
    /// cover there (`index::Nominee`).
    fn nominate(
        &mut self,
        q: usize,
        job: &'a JobRecord,
        nodes: Vec<NodeId>,
        mut victims: Vec<JobId>,
        kind: PreemptionKind,
    ) {
        if kind == PreemptionKind::Reclaim {
            // Lowest rank first, the order in which each was found borrowed: each is then
            // still borrowed when it is applied, after those before it have stopped. In
            // victim order, a job ranked below another could be applied after it, when the
            // share's GPUs left may no longer be above its limit.
            victims.sort_by_key(|v| Reverse(holding_key(self.job(*v))));
        }
        for v in &victims {
            self.preempt(*v, kind, Some(job.id));
        }
        self.keep_for(q, job, &nodes, &victims);
        let node_name = self.node_names(&nodes);
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

    /// Has `nodes` keep GPUs free for `job`: on each, its GPUs less what `victims` hold there.
    fn keep_for(&mut self, q: usize, job: &'a JobRecord, nodes: &[NodeId], victims: &[JobId]) {
        let mut kept_total = 0u64;
        for &node in nodes {
            let freed: u32 = victims
                .iter()
                .map(|v| self.job(*v))
                .filter(|v| v.member_on(node).is_some())
                .map(|v| v.gpus())
                .sum();
            let kept = job.gpus().saturating_sub(freed);
            let scratch = self
                .classes
                .get_mut(job.class())
                .expect("nominated on a known class");
            let mut slot = scratch.slot(node).expect("nominated on a known node");
            slot.nominated += kept;
            scratch.set_slot(node, slot);
            kept_total += u64::from(kept);
        }
        self.change_kept(q, |kept_now| kept_now + kept_total);
        let action = match nodes {
            [node] if !job.is_gang() => PlanAction::Nominate {
                job: job.id,
                node: *node,
            },
            _ => PlanAction::NominateNodes {
                job: job.id,
                nodes: nodes.to_vec(),
            },
        };
        self.plan.actions.push(action);
    }

    /// Phase 4b: a job of several nodes at the head of its queue, within its share's limit,
    /// that found no room and no victims, has nodes kept for it: those closest to having its
    /// GPUs free that no other job holds, within its `same` label. Their GPUs are kept for it
    /// as the jobs there end, so a stream of smaller jobs cannot take each GPU as it frees.
    fn hold_for_gangs(&mut self) {
        // Sizes (class, GPUs, nodes) of process jobs without `same` for which no nodes could
        // be held this round: a job as large finds none either, since holds only grow.
        let mut failed: Vec<(&GpuClass, u32, u32)> = Vec::new();
        // Healthy GPU counts of the nodes held so far this round, per class.
        let mut held_now: Vec<(&GpuClass, u32)> = Vec::new();
        for q in self.blocked_in_order() {
            let Some((id, Blocked::Reason(WaitReason::GangWaiting(_)))) =
                self.queues[q].blocked.as_ref()
            else {
                continue;
            };
            let job = self.job(*id);
            let queue = &self.queues[q];
            if queue.usage + u64::from(job.total_gpus()) > limit_of(queue.share, queue.class) {
                continue;
            }
            let plain = job.spec.same.is_none() && job.spec.payload.image.is_none();
            let (gpus, nodes) = (job.gpus(), job.node_count());
            if plain
                && failed
                    .iter()
                    .any(|(c, g, n)| *c == job.class() && *g <= gpus && *n <= nodes)
            {
                continue;
            }
            let Some(scratch) = self.classes.get(job.class()) else {
                continue;
            };
            // An upper bound first, from the index, so that a job that cannot have nodes
            // held costs no scan of the class's nodes: the nodes that keep nothing for anyone
            // (as the round began) with its GPUs, less those held since. (A hold dropped this
            // round is not counted back: such a job waits a round longer for its nodes.)
            let unheld: u32 = scratch
                .real
                .unheld_sizes
                .range(gpus..)
                .map(|(_, count)| *count)
                .sum();
            let held: u32 = held_now
                .iter()
                .filter(|(c, healthy)| *c == job.class() && *healthy >= gpus)
                .count() as u32;
            if unheld.saturating_sub(held) < nodes {
                continue;
            }
            let mut candidates: Vec<(Reverse<u32>, NodeId)> = scratch
                .real
                .slots
                .keys()
                .filter_map(|node| {
                    let slot = scratch.slot(*node)?;
                    let free = slot.nominated == 0
                        && slot.healthy >= job.gpus()
                        && self.may_host(job, *node);
                    free.then_some((Reverse(slot.available()), *node))
                })
                .collect();
            candidates.sort_unstable();
            let ordered: Vec<NodeId> = candidates.into_iter().map(|(_, n)| n).collect();
            let Some(nodes) = self.pick_gang_nodes_ordered(job, &ordered) else {
                if plain {
                    failed.push((job.class(), gpus, nodes));
                }
                continue;
            };
            // The GPUs free on those nodes now become kept for it: only if its share's rules
            // let it take that many of the class's free GPUs, so that a hold never takes
            // the idle quota of a reserve share.
            let free_now: u32 = nodes
                .iter()
                .filter_map(|node| scratch.slot(*node))
                .map(|slot| slot.available().min(gpus))
                .sum();
            let queue = &self.queues[q];
            let admitted = free_now == 0
                || admit(
                    queue.share,
                    queue.class,
                    queue.usage,
                    queue.kept,
                    free_now,
                    scratch.available_total,
                    self.reserved(queue.class),
                )
                .is_ok();
            if !admitted {
                continue;
            }
            for node in &nodes {
                let healthy = scratch.slot(*node).map_or(0, |slot| slot.healthy);
                held_now.push((job.class(), healthy));
            }
            self.keep_for(q, job, &nodes, &[]);
            let reason = self.gang_waiting(job, &nodes);
            let queue = &mut self.queues[q];
            queue.nominated = true;
            queue.blocked = Some((job.id, Blocked::Reason(reason)));
        }
    }

    /// How many of `held` have the GPUs of `job` free now.
    fn gang_qualify(&self, job: &JobRecord, held: &[NodeId]) -> u32 {
        let scratch = self.classes.get(job.class());
        held.iter()
            .filter(|node| {
                scratch
                    .and_then(|s| s.slot(**node))
                    .is_some_and(|slot| slot.free_mask.count_ones() >= job.gpus())
            })
            .count() as u32
    }

    /// [`Round::pick_gang_nodes`] over nodes in preference order, passing over nodes the job
    /// may not use.
    fn pick_gang_nodes_ordered(&self, job: &JobRecord, ordered: &[NodeId]) -> Option<Vec<NodeId>> {
        let usable: Vec<NodeId> = ordered
            .iter()
            .copied()
            .filter(|n| group_of(self.state, *n, job, self.topology_key).is_some())
            .collect();
        self.pick_gang_nodes(job, &usable, job.node_count() as usize)
    }

    /// Why a job of several nodes that `held` nodes keep GPUs for waits: how many of them
    /// have its GPUs free now.
    fn gang_waiting(&self, job: &JobRecord, held: &[NodeId]) -> WaitReason {
        let qualify = self.gang_qualify(job, held);
        WaitReason::GangWaiting(Box::new(GangWait {
            class: job.class().clone(),
            gpus: job.gpus(),
            nodes: job.node_count(),
            same: job.spec.same.clone(),
            qualify,
            held: held.iter().map(|n| self.node_name(*n)).collect(),
        }))
    }

    fn preempt(&mut self, job: JobId, kind: PreemptionKind, for_job: Option<JobId>) {
        if self.victims.insert(job) {
            let record = self.job(job);
            *self
                .victim_gpus
                .entry((record.spec.share.as_str(), record.class()))
                .or_insert(0) += u64::from(record.total_gpus());
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
            Err(Unfit::NoDocker | Unfit::NoImage(_) | Unfit::Unreachable | Unfit::NoLabel(_)) => {
                false
            }
        }
    }

    fn node_name(&self, node: NodeId) -> String {
        self.state
            .node(node)
            .map_or_else(|| format!("node #{}", node.0), |n| n.name.clone())
    }

    /// The names of `nodes`, comma separated.
    fn node_names(&self, nodes: &[NodeId]) -> String {
        let names: Vec<String> = nodes.iter().map(|n| self.node_name(*n)).collect();
        names.join(", ")
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
                Blocked::Known => continue,
            };
            self.wait(id, reason);
        }
    }

    fn wait(&mut self, id: JobId, reason: WaitReason) {
        if self.job(id).reason.as_deref() != Some(&reason) {
            self.plan.waiting.push((id, reason));
        }
    }
}

/// One borrowing share's borrowed jobs, lowest rank first.
struct BorrowedStream<'a> {
    jobs: std::iter::Peekable<
        std::iter::Rev<std::collections::btree_set::Iter<'a, crate::index::HoldingKey>>,
    >,
    /// Which of them are borrowed, over the share's jobs not stopping and not yet yielded.
    borrowed: BorrowedFromLowest,
    /// How many of its jobs are in the merge's heap: its next tier is pushed when none is.
    in_heap: usize,
}

/// Victim order: priority asc, then work at risk asc, then placement desc, then id desc
/// ([`Round::victim_key`]).
type VictimKey = Reverse<(u32, u64, Reverse<u64>, Reverse<JobId>)>;

/// The k-way merge of [`BorrowedStream`]s in victim order, bounded by
/// `RECLAIM_CANDIDATES_SCAN_MAX`.
struct BorrowedMerge<'a> {
    streams: Vec<BorrowedStream<'a>>,
    heap: BinaryHeap<(VictimKey, usize, JobId)>,
    yielded: usize,
}

impl<'a> BorrowedMerge<'a> {
    /// Pushes stream `i`'s borrowed jobs of its next priority tier (at most
    /// `RECLAIM_CANDIDATES_SCAN_MAX` of them), if it has any: within a tier, victim order
    /// depends on the work at risk, not on the rank the stream walks in, so the whole tier
    /// goes in the heap at once. The set of borrowed jobs is the rank's, as before.
    fn refill(&mut self, round: &Round<'a>, i: usize) {
        let stream = &mut self.streams[i];
        let mut tier = None;
        while stream.borrowed.any_left() && stream.in_heap < RECLAIM_CANDIDATES_SCAN_MAX {
            let Some(&&(_, _, id)) = stream.jobs.peek() else {
                return;
            };
            if round.stopping(id) {
                stream.jobs.next();
                continue;
            }
            let job = round.job(id);
            if tier.is_some_and(|priority| priority != job.priority()) {
                return;
            }
            tier = Some(job.priority());
            stream.jobs.next();
            stream.borrowed.pass(job.total_gpus());
            self.heap.push((round.victim_key(job), i, id));
            stream.in_heap += 1;
        }
    }

    fn next(&mut self, round: &Round<'a>) -> Option<JobId> {
        if self.yielded >= RECLAIM_CANDIDATES_SCAN_MAX {
            return None;
        }
        let (_, i, id) = self.heap.pop()?;
        self.yielded += 1;
        self.streams[i].in_heap -= 1;
        if self.streams[i].in_heap == 0 {
            self.refill(round, i);
        }
        Some(id)
    }
}
