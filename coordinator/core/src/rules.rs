//! The quota rules of docs/quota-shares.md as small pure functions, shared by the scheduler
//! (which decides) and `apply` (which re-checks), so that the two can never disagree.

use std::collections::BTreeMap;

use quotient_common::{GpuClass, Runtime, ShareSpec, Strategy};

use crate::index::{JobSize, NodeSlot};
use crate::reason::WaitReason;
use crate::state::{JobRecord, NodeRecord};

/// How a placement would count against its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Usage stays within the share's limit (rule 1).
    WithinLimit,
    /// Usage goes above the limit: the share borrows (rule 3).
    Borrowing,
}

/// The share's limit for a class (0 when it has none).
pub fn limit_of(spec: &ShareSpec, class: &GpuClass) -> u64 {
    u64::from(spec.limits.get(class).copied().unwrap_or(0))
}

/// The idle quota of a `reserve` share: GPUs nobody else may take.
pub fn reserved_idle_of(spec: &ShareSpec, class: &GpuClass, usage: u64) -> u64 {
    if spec.strategy == Strategy::Reserve {
        limit_of(spec, class).saturating_sub(usage)
    } else {
        0
    }
}

/// Why the quota rules refuse a placement, without the names a [`WaitReason`] carries: the
/// scheduler checks queue heads in every round and names only the reasons it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NoFreeCapacity { free: u64 },
    ShareLimit { limit: u64, usage: u64 },
    BorrowLimit { cap: u64, usage: u64 },
    NoBorrowableCapacity { reserved_idle: u64 },
}

impl Refusal {
    /// The reason a job of `share` waiting for `class` is given.
    pub fn reason(self, share: &ShareSpec, class: &GpuClass) -> WaitReason {
        match self {
            Refusal::NoFreeCapacity { free } => WaitReason::NoFreeCapacity {
                class: class.clone(),
                free,
            },
            Refusal::ShareLimit { limit, usage } => WaitReason::ShareLimit {
                share: share.name.clone(),
                class: class.clone(),
                limit,
                usage,
            },
            Refusal::BorrowLimit { cap, usage } => WaitReason::BorrowLimit {
                share: share.name.clone(),
                class: class.clone(),
                cap,
                usage,
            },
            Refusal::NoBorrowableCapacity { reserved_idle } => WaitReason::NoBorrowableCapacity {
                share: share.name.clone(),
                class: class.clone(),
                reserved_idle,
            },
        }
    }

    /// Whether `reason` equals `self.reason(share, class)`, without building that.
    pub fn is_reason(self, reason: &WaitReason, share: &ShareSpec, class: &GpuClass) -> bool {
        match (self, reason) {
            (
                Refusal::NoFreeCapacity { free },
                WaitReason::NoFreeCapacity { class: c, free: f },
            ) => c == class && *f == free,
            (
                Refusal::ShareLimit { limit, usage },
                WaitReason::ShareLimit {
                    share: s,
                    class: c,
                    limit: l,
                    usage: u,
                },
            ) => *s == share.name && c == class && *l == limit && *u == usage,
            (
                Refusal::BorrowLimit { cap, usage },
                WaitReason::BorrowLimit {
                    share: s,
                    class: c,
                    cap: k,
                    usage: u,
                },
            ) => *s == share.name && c == class && *k == cap && *u == usage,
            (
                Refusal::NoBorrowableCapacity { reserved_idle },
                WaitReason::NoBorrowableCapacity {
                    share: s,
                    class: c,
                    reserved_idle: r,
                },
            ) => *s == share.name && c == class && *r == reserved_idle,
            _ => false,
        }
    }
}

/// May a share holding `usage` GPUs of `class`, with `kept` more kept free for its nominated
/// jobs, take `gpus` more, when `available` GPUs of the class are free (not held, not kept)
/// and `reserved_idle_total` of them are the idle quota of reserve shares (this share's own
/// included, if it is one)? A refusal names no share or class until asked
/// ([`Refusal::reason`]).
pub fn admit(
    share: &ShareSpec,
    class: &GpuClass,
    usage: u64,
    kept: u64,
    gpus: u32,
    available: u64,
    reserved_idle_total: u64,
) -> Result<Admission, Refusal> {
    let gpus = u64::from(gpus);
    let limit = limit_of(share, class);
    let own_reserved = reserved_idle_of(share, class, usage + kept);
    let others_reserved = reserved_idle_total.saturating_sub(own_reserved);
    let usable = available.saturating_sub(others_reserved);
    if usage + gpus <= limit {
        return if usable >= gpus {
            Ok(Admission::WithinLimit)
        } else {
            Err(Refusal::NoFreeCapacity { free: usable })
        };
    }
    if !share.strategy.borrows() {
        return Err(Refusal::ShareLimit { limit, usage });
    }
    if let Some(cap) = share.usage_cap(class) {
        if usage + gpus > cap {
            return Err(Refusal::BorrowLimit { cap, usage });
        }
    }
    if usable >= gpus {
        Ok(Admission::Borrowing)
    } else {
        Err(Refusal::NoBorrowableCapacity {
            reserved_idle: others_reserved,
        })
    }
}

/// What a job may take if it is placed on one node: see [`available_for_job`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Available {
    /// The node's free GPUs of the class that the job may take.
    pub on_node: u32,
    /// The class's available GPUs (what [`admit`] is given), that node's counted as
    /// `on_node`.
    pub in_class: u64,
}

/// The GPUs available for a job on one node: the node's free GPUs (`slot`) less those kept
/// for other nominated jobs; the ones kept for this job (`kept_for_job`, its own nomination
/// on this node, else 0) are its to take. `available_total` is the class's available GPUs,
/// every node's counted without the GPUs kept on it.
pub fn available_for_job(slot: NodeSlot, available_total: u64, kept_for_job: u32) -> Available {
    let kept_for_others = slot.nominated.saturating_sub(kept_for_job);
    let on_node = slot.free_mask.count_ones().saturating_sub(kept_for_others);
    Available {
        on_node,
        in_class: available_total - u64::from(slot.available()) + u64::from(on_node),
    }
}

/// Which of a share's jobs of one class are borrowed (spec rule 3), walked from the lowest
/// rank up. Rank the share's jobs that hold GPUs of the class and are not stopping by
/// (priority desc, start asc); those whose GPUs, added up in rank order, go beyond the share's
/// limit are borrowed. Walking from the lowest rank, with what is left starting at all their
/// GPUs, a job is borrowed while what is left, itself included, is above the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BorrowedFromLowest {
    left: u64,
    limit: u64,
}

impl BorrowedFromLowest {
    /// `held` is the GPUs the share's jobs of the class hold, stopping ones not counted.
    pub fn new(held: u64, limit: u64) -> BorrowedFromLowest {
        BorrowedFromLowest { left: held, limit }
    }

    /// Whether any job not passed yet is borrowed.
    pub fn any_left(&self) -> bool {
        self.left > self.limit
    }

    /// Passes the next job of `gpus` GPUs, the lowest ranked not passed yet (stopping jobs
    /// are not passed): whether it is borrowed.
    pub fn pass(&mut self, gpus: u32) -> bool {
        let borrowed = self.any_left();
        self.left = self.left.saturating_sub(u64::from(gpus));
        borrowed
    }
}

/// A job that can never start as things stand, whatever else ends: the reason, or `None`.
/// Why a node cannot run a job, its GPUs aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// A container job, on a node without Docker.
    NoDocker,
    /// A container job, on a node that does not hold its image (images are never pulled).
    NoImage(String),
    /// Not enough CPUs (thousandths) left on the node.
    Cpus { need: u64, free: u64 },
    /// Not enough memory (bytes) left on the node.
    Memory { need: u64, free: u64 },
    /// The leader has not heard from the node since its last heartbeat was due.
    Unreachable,
    /// A job submitted with `--same KEY`, on a node without label KEY.
    NoLabel(String),
}

impl Unfit {
    /// Whether the node stays unable to run the job until its host changes (no Docker, the
    /// image missing, unreachable), rather than until jobs there end (CPUs, memory).
    pub fn is_lasting(&self) -> bool {
        matches!(
            self,
            Unfit::NoDocker | Unfit::NoImage(_) | Unfit::Unreachable | Unfit::NoLabel(_)
        )
    }
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::NoDocker => f.write_str(
                "the node has no Docker runtime: container jobs go only to nodes whose agent reaches Docker",
            ),
            Unfit::Unreachable => f.write_str(
                "the node is unreachable: its agent missed its heartbeats, and nothing new goes there until it is heard from",
            ),
            Unfit::NoImage(image) => write!(
                f,
                "the node does not hold image {image}: images are never pulled, load it on the nodes"
            ),
            Unfit::NoLabel(key) => write!(
                f,
                "the node has no label {key}, and a job submitted with --same {key} runs only on nodes that have it: label nodes (the agent's --label {key}=VALUE) or submit without --same"
            ),
            Unfit::Cpus { need, free } => write!(
                f,
                "the job needs {} CPUs, the node has {} free",
                millis_words(*need),
                millis_words(*free)
            ),
            Unfit::Memory { need, free } => write!(
                f,
                "the job needs {} MiB of memory, the node has {} MiB free",
                need >> 20,
                free >> 20
            ),
        }
    }
}

fn millis_words(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        format!("{}", millis / 1000)
    } else {
        format!("{:.2}", millis as f64 / 1000.0)
    }
}

/// The CPUs (thousandths) and memory (bytes) a job takes on `node`: what it asked for, or
/// its share of the node's by GPUs (`gpus` of the node's GPUs; 0 where the node reports
/// none).
pub fn resources_for(job: &JobRecord, node: &NodeRecord) -> (u32, u64) {
    let node_gpus = node.gpus.len().max(1) as u128;
    let share = |total: u64| (u128::from(total) * u128::from(job.gpus()) / node_gpus) as u64;
    let cpus = job
        .spec
        .cpu_millis
        .unwrap_or_else(|| share(u64::from(node.host.cpu_millis)) as u32);
    let memory = job
        .spec
        .memory_bytes
        .unwrap_or_else(|| share(node.host.memory_bytes));
    (cpus, memory)
}

/// Whether `node` can run `job`, its GPUs aside: its runtime and image, and the CPUs and
/// memory it takes beside `used` (what the node has set aside already). A node that reports
/// no CPUs or memory does not account them.
pub fn runs_on(job: &JobRecord, node: &NodeRecord, used: (u64, u64)) -> Result<(), Unfit> {
    if let Some(key) = &job.spec.same {
        if !node.host.labels.contains_key(key) {
            return Err(Unfit::NoLabel(key.clone()));
        }
    }
    if let Some(image) = &job.spec.payload.image {
        if !node.host.has_runtime(Runtime::Docker) {
            return Err(Unfit::NoDocker);
        }
        if !node.host.has_image(image) {
            return Err(Unfit::NoImage(image.clone()));
        }
    }
    let (cpus, memory) = resources_for(job, node);
    let total_cpus = u64::from(node.host.cpu_millis);
    if total_cpus > 0 && used.0 + u64::from(cpus) > total_cpus {
        return Err(Unfit::Cpus {
            need: u64::from(cpus),
            free: total_cpus.saturating_sub(used.0),
        });
    }
    let total_memory = node.host.memory_bytes;
    if total_memory > 0 && used.1 + memory > total_memory {
        return Err(Unfit::Memory {
            need: memory,
            free: total_memory.saturating_sub(used.1),
        });
    }
    Ok(())
}

pub fn never_fits(
    share: &ShareSpec,
    class: &GpuClass,
    size: JobSize,
    node_sizes: &BTreeMap<u32, u32>,
) -> Option<WaitReason> {
    if can_ever_fit(share, class, node_sizes)(size) {
        return None;
    }
    let largest = node_sizes.keys().next_back().copied().unwrap_or(0);
    if size.gpus > largest {
        return Some(WaitReason::LargestNode {
            class: class.clone(),
            gpus: size.gpus,
            largest,
        });
    }
    let cap = share.usage_cap(class);
    if let Some(cap) = cap {
        if size.total() > cap {
            return Some(WaitReason::ExceedsShareCap {
                share: share.name.clone(),
                class: class.clone(),
                gpus: size.total() as u32,
                cap,
            });
        }
    }
    let have = nodes_with_at_least(node_sizes, size.gpus);
    if have < size.nodes {
        return Some(WaitReason::TooFewNodes {
            class: class.clone(),
            gpus: size.gpus,
            nodes: size.nodes,
            have,
        });
    }
    None
}

/// How many nodes of a class's `node_sizes` (healthy GPUs -> nodes) have at least `gpus`.
pub fn nodes_with_at_least(node_sizes: &BTreeMap<u32, u32>, gpus: u32) -> u32 {
    node_sizes.range(gpus..).map(|(_, count)| *count).sum()
}

/// The test [`never_fits`] makes, for one share and class, with the share's cap looked up
/// once: whether a job of some size could ever fit. The scheduler asks it for every job size
/// of every queue in every round, where building the reason would cost more.
pub fn can_ever_fit<'a>(
    share: &ShareSpec,
    class: &GpuClass,
    node_sizes: &'a BTreeMap<u32, u32>,
) -> impl Fn(JobSize) -> bool + 'a {
    let cap = share.usage_cap(class);
    let largest = node_sizes.keys().next_back().copied().unwrap_or(0);
    move |size| {
        size.gpus <= largest
            && cap.is_none_or(|cap| size.total() <= cap)
            && (size.nodes <= 1 || nodes_with_at_least(node_sizes, size.gpus) >= size.nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::ShareState;

    fn share(strategy: Strategy, limit: u32, borrow: Option<u32>) -> ShareSpec {
        ShareSpec {
            name: "s".into(),
            limits: [(GpuClass::parse("a10g").unwrap(), limit)].into(),
            strategy,
            borrow_limit_percent: borrow,
            in_share_preemption: false,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        }
    }

    fn a10g() -> GpuClass {
        GpuClass::parse("a10g").unwrap()
    }

    #[test]
    fn a_refusal_is_the_reason_it_names_and_no_other() {
        let class = a10g();
        let spec = share(Strategy::LendAndBorrow, 4, Some(50));
        let other = share(Strategy::Lend, 4, None);
        let h100 = GpuClass::parse("h100-80gb").unwrap();
        let refusals = [
            Refusal::NoFreeCapacity { free: 1 },
            Refusal::NoFreeCapacity { free: 2 },
            Refusal::ShareLimit { limit: 4, usage: 4 },
            Refusal::ShareLimit { limit: 4, usage: 3 },
            Refusal::BorrowLimit { cap: 6, usage: 6 },
            Refusal::BorrowLimit { cap: 6, usage: 5 },
            Refusal::NoBorrowableCapacity { reserved_idle: 2 },
            Refusal::NoBorrowableCapacity { reserved_idle: 3 },
        ];
        for a in refusals {
            for b in refusals {
                for (s, c) in [(&spec, &class), (&other, &class), (&spec, &h100)] {
                    let reason = b.reason(s, c);
                    assert_eq!(
                        a.is_reason(&reason, &spec, &class),
                        a.reason(&spec, &class) == reason,
                        "{a:?} against {reason:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn can_ever_fit_agrees_with_never_fits() {
        let class = a10g();
        for strategy in [Strategy::Reserve, Strategy::Lend, Strategy::LendAndBorrow] {
            for borrow in [None, Some(0), Some(50)] {
                let spec = share(strategy, 4, borrow);
                for sizes in [vec![], vec![(2, 1)], vec![(2, 3), (8, 1)]] {
                    let sizes: BTreeMap<u32, u32> = sizes.into_iter().collect();
                    let fits = can_ever_fit(&spec, &class, &sizes);
                    for gpus in 0..12 {
                        for nodes in 1..5 {
                            let size = JobSize { gpus, nodes };
                            assert_eq!(
                                fits(size),
                                never_fits(&spec, &class, size, &sizes).is_none(),
                                "{strategy:?} borrow {borrow:?} nodes {sizes:?} size {size:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_job_may_take_the_gpus_kept_for_it_but_not_those_kept_for_others() {
        // Four free GPUs, three kept for nominated jobs: a job without a nomination here may
        // take one; a nominee with two of the three kept for it may take three.
        let slot = NodeSlot {
            free_mask: 0b1111,
            nominated: 3,
            healthy: 4,
        };
        let others = available_for_job(slot, 10, 0);
        assert_eq!((others.on_node, others.in_class), (1, 10));
        let nominee = available_for_job(slot, 10, 2);
        assert_eq!((nominee.on_node, nominee.in_class), (3, 12));
    }

    #[test]
    fn borrowed_jobs_are_those_ranked_beyond_the_limit() {
        // Jobs ranked first to last with 2, 1, 3, 2 GPUs against a limit of 3: the prefixes
        // are 2, 3, 6, 8, so the last two are borrowed. Walked from the lowest rank, the
        // same two come first and then nothing more is borrowed.
        let ranked = [2u32, 1, 3, 2];
        let held: u64 = ranked.iter().map(|g| u64::from(*g)).sum();
        let mut walk = BorrowedFromLowest::new(held, 3);
        let borrowed: Vec<bool> = ranked.iter().rev().map(|g| walk.pass(*g)).collect();
        assert_eq!(borrowed, vec![true, true, false, false]);
        assert!(!walk.any_left());
        assert!(!BorrowedFromLowest::new(3, 3).any_left(), "at its limit");
    }

    #[test]
    fn within_limit_may_not_take_reserved_idle_quota() {
        let s = share(Strategy::Lend, 1, None);
        assert_eq!(
            admit(&s, &a10g(), 0, 0, 1, 1, 0),
            Ok(Admission::WithinLimit)
        );
        assert!(admit(&s, &a10g(), 0, 0, 1, 1, 1).is_err());
    }

    #[test]
    fn a_reserve_share_may_use_its_own_idle_quota() {
        let s = share(Strategy::Reserve, 1, None);
        assert_eq!(
            admit(&s, &a10g(), 0, 0, 1, 1, 1),
            Ok(Admission::WithinLimit)
        );
    }

    #[test]
    fn gpus_kept_for_a_reserve_shares_nominee_are_not_its_idle_quota() {
        // Limit 2, one GPU kept for its nominated job: one idle; another reserve share's idle
        // GPU makes two in all, and of two free GPUs only one is the share's to take.
        let s = share(Strategy::Reserve, 2, None);
        assert_eq!(
            admit(&s, &a10g(), 0, 1, 1, 2, 2),
            Ok(Admission::WithinLimit)
        );
        assert!(matches!(
            admit(&s, &a10g(), 0, 1, 2, 2, 2),
            Err(Refusal::NoFreeCapacity { free: 1 })
        ));
    }

    #[test]
    fn only_lend_and_borrow_borrows_within_its_cap() {
        let lend = share(Strategy::Lend, 1, None);
        assert!(matches!(
            admit(&lend, &a10g(), 1, 0, 1, 5, 0),
            Err(Refusal::ShareLimit { .. })
        ));
        let lab = share(Strategy::LendAndBorrow, 1, Some(100));
        assert_eq!(
            admit(&lab, &a10g(), 1, 0, 1, 5, 0),
            Ok(Admission::Borrowing)
        );
        assert!(matches!(
            admit(&lab, &a10g(), 2, 0, 1, 5, 0),
            Err(Refusal::BorrowLimit { .. })
        ));
        assert!(matches!(
            admit(&lab, &a10g(), 1, 0, 1, 1, 1),
            Err(Refusal::NoBorrowableCapacity { .. })
        ));
    }
}
