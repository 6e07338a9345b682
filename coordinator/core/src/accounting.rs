//! Per-share accounting as users see it: usage, borrowed, lent, queued and running counts.
//!
//! Borrowed GPUs are attributed first to the free pool (fleet GPUs beyond the sum of all
//! limits), then to lending shares' idle quota, taking from shares in name order. The spec
//! leaves the attribution open; name order is deterministic and easy to read in a table.

use std::collections::BTreeMap;

use quotient_common::{GpuClass, JobState};

use crate::rules::limit_of;
use crate::state::State;

/// One share's numbers; the maps hold every class of the share's limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareAccount {
    pub usage: BTreeMap<GpuClass, u64>,
    pub borrowed: BTreeMap<GpuClass, u64>,
    pub lent: BTreeMap<GpuClass, u64>,
    pub runnable: u64,
    pub running: u64,
}

/// Healthy GPUs per class on nodes that are not lost (the fleet).
pub fn fleet_gpus(state: &State) -> BTreeMap<GpuClass, u64> {
    let mut fleet = BTreeMap::new();
    for node in state.nodes() {
        if node.state == quotient_common::NodeState::Lost {
            continue;
        }
        for gpu in node.gpus.iter().filter(|g| g.healthy) {
            *fleet.entry(gpu.class.clone()).or_insert(0) += 1;
        }
    }
    fleet
}

/// The accounts of every share, by name.
pub fn share_accounts(state: &State) -> BTreeMap<String, ShareAccount> {
    let mut accounts: BTreeMap<String, ShareAccount> = BTreeMap::new();
    let mut borrowed_total: BTreeMap<GpuClass, u64> = BTreeMap::new();
    let mut limits_total: BTreeMap<GpuClass, u64> = BTreeMap::new();
    for share in state.shares() {
        let name = &share.spec.name;
        let mut account = ShareAccount::default();
        for class in share.spec.limits.keys() {
            let usage = state.usage(name, class);
            let limit = limit_of(&share.spec, class);
            let borrowed = usage.saturating_sub(limit);
            account.usage.insert(class.clone(), usage);
            account.borrowed.insert(class.clone(), borrowed);
            account.lent.insert(class.clone(), 0);
            *borrowed_total.entry(class.clone()).or_insert(0) += borrowed;
            *limits_total.entry(class.clone()).or_insert(0) += limit;
        }
        accounts.insert(name.clone(), account);
    }
    for job in state.jobs() {
        if let Some(account) = accounts.get_mut(&job.spec.share) {
            match job.state {
                JobState::Runnable => account.runnable += 1,
                JobState::Running => account.running += 1,
                _ => {}
            }
        }
    }
    let fleet = fleet_gpus(state);
    for (class, borrowed) in borrowed_total {
        let free_pool = fleet
            .get(&class)
            .copied()
            .unwrap_or(0)
            .saturating_sub(limits_total.get(&class).copied().unwrap_or(0));
        let mut from_lenders = borrowed.saturating_sub(free_pool);
        for share in state.shares() {
            if from_lenders == 0 {
                break;
            }
            if !share.spec.strategy.lends() || !share.spec.limits.contains_key(&class) {
                continue;
            }
            let usage = state.usage(&share.spec.name, &class);
            let idle = limit_of(&share.spec, &class).saturating_sub(usage);
            let lent = idle.min(from_lenders);
            from_lenders -= lent;
            if let Some(account) = accounts.get_mut(&share.spec.name) {
                account.lent.insert(class.clone(), lent);
            }
        }
    }
    accounts
}
