//! Per-share accounting as users see it: usage, borrowed, lent, queued and running counts.
//!
//! Borrowed GPUs are attributed first to the free pool (the healthy GPUs of the schedulable
//! nodes beyond the sum of all limits), then to lending shares' idle quota, taking from shares
//! in name order, then to the idle quota of shares that no longer lend (switched to `reserve`
//! while borrowed from) (`crate::usage::usage_rates`). The spec leaves the attribution open; name
//! order is deterministic and easy to read in a table.

use std::collections::BTreeMap;

use quotient_common::{GpuClass, JobState};

use crate::state::State;
use crate::usage::usage_rates;

/// One share's numbers; the maps hold every class of the share's limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareAccount {
    pub usage: BTreeMap<GpuClass, u64>,
    pub borrowed: BTreeMap<GpuClass, u64>,
    pub lent: BTreeMap<GpuClass, u64>,
    pub runnable: u64,
    pub running: u64,
}

/// The accounts of every share, by name: what each holds now (`crate::usage::usage_rates`,
/// the split GPU time is counted with) and its queued and running jobs.
pub fn share_accounts(state: &State) -> BTreeMap<String, ShareAccount> {
    let mut accounts: BTreeMap<String, ShareAccount> = BTreeMap::new();
    for share in state.shares() {
        let mut account = ShareAccount::default();
        for class in share.spec.limits.keys() {
            account.usage.insert(class.clone(), 0);
            account.borrowed.insert(class.clone(), 0);
            account.lent.insert(class.clone(), 0);
        }
        accounts.insert(share.spec.name.clone(), account);
    }
    for ((share, class), rates) in usage_rates(state) {
        if let Some(account) = accounts.get_mut(&share) {
            account
                .usage
                .insert(class.clone(), rates.own + rates.borrowed);
            account.borrowed.insert(class.clone(), rates.borrowed);
            account.lent.insert(class, rates.lent);
        }
    }
    for job in state.jobs() {
        if let Some(account) = accounts.get_mut(&job.spec.share) {
            // `running` counts every job holding GPUs: scheduled, starting and being stopped
            // too (docs/cli.md; found by probing: a starting gang counted as none).
            match job.state {
                JobState::Runnable => account.runnable += 1,
                state if state.holds_gpus() => account.running += 1,
                _ => {}
            }
        }
    }
    accounts
}
