//! The quota rules of spec/quota-shares.md as small pure functions, shared by the scheduler
//! (which decides) and `apply` (which re-checks), so that the two can never disagree.

use quotient_common::{GpuClass, ShareSpec, Strategy};

use crate::reason::WaitReason;

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

/// May a share holding `usage` GPUs of `class`, with `kept` more kept free for its nominated
/// jobs, take `gpus` more, when `available` GPUs of the class are free (not held, not kept)
/// and `reserved_idle_total` of them are the idle quota of reserve shares (this share's own
/// included, if it is one)?
pub fn admit(
    share: &ShareSpec,
    class: &GpuClass,
    usage: u64,
    kept: u64,
    gpus: u32,
    available: u64,
    reserved_idle_total: u64,
) -> Result<Admission, WaitReason> {
    let gpus = u64::from(gpus);
    let limit = limit_of(share, class);
    let own_reserved = reserved_idle_of(share, class, usage + kept);
    let others_reserved = reserved_idle_total.saturating_sub(own_reserved);
    let usable = available.saturating_sub(others_reserved);
    if usage + gpus <= limit {
        return if usable >= gpus {
            Ok(Admission::WithinLimit)
        } else {
            Err(WaitReason::NoFreeCapacity {
                class: class.clone(),
                free: usable,
            })
        };
    }
    if !share.strategy.borrows() {
        return Err(WaitReason::ShareLimit {
            share: share.name.clone(),
            class: class.clone(),
            limit,
            usage,
        });
    }
    if let Some(cap) = share.usage_cap(class) {
        if usage + gpus > cap {
            return Err(WaitReason::BorrowLimit {
                share: share.name.clone(),
                class: class.clone(),
                cap,
                usage,
            });
        }
    }
    if usable >= gpus {
        Ok(Admission::Borrowing)
    } else {
        Err(WaitReason::NoBorrowableCapacity {
            share: share.name.clone(),
            class: class.clone(),
            reserved_idle: others_reserved,
        })
    }
}

/// A job that can never start as things stand, whatever else ends: the reason, or `None`.
pub fn never_fits(
    share: &ShareSpec,
    class: &GpuClass,
    gpus: u32,
    largest_node: u32,
) -> Option<WaitReason> {
    if gpus > largest_node {
        return Some(WaitReason::LargestNode {
            class: class.clone(),
            gpus,
            largest: largest_node,
        });
    }
    let cap = share.usage_cap(class);
    if let Some(cap) = cap {
        if u64::from(gpus) > cap {
            return Some(WaitReason::ExceedsShareCap {
                share: share.name.clone(),
                class: class.clone(),
                gpus,
                cap,
            });
        }
    }
    None
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
        }
    }

    fn a10g() -> GpuClass {
        GpuClass::parse("a10g").unwrap()
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
            Err(WaitReason::NoFreeCapacity { free: 1, .. })
        ));
    }

    #[test]
    fn only_lend_and_borrow_borrows_within_its_cap() {
        let lend = share(Strategy::Lend, 1, None);
        assert!(matches!(
            admit(&lend, &a10g(), 1, 0, 1, 5, 0),
            Err(WaitReason::ShareLimit { .. })
        ));
        let lab = share(Strategy::LendAndBorrow, 1, Some(100));
        assert_eq!(
            admit(&lab, &a10g(), 1, 0, 1, 5, 0),
            Ok(Admission::Borrowing)
        );
        assert!(matches!(
            admit(&lab, &a10g(), 2, 0, 1, 5, 0),
            Err(WaitReason::BorrowLimit { .. })
        ));
        assert!(matches!(
            admit(&lab, &a10g(), 1, 0, 1, 1, 1),
            Err(WaitReason::NoBorrowableCapacity { .. })
        ));
    }
}
