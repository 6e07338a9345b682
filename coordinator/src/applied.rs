//! What the applied log entries changed, said once, and what follows from it on the leader.
//!
//! `quotient_core::apply_noting` names the jobs, nodes and shares each command changed
//! ([`Changes`]). The state machine adds every command's changes to one [`AppliedChanges`]
//! as it applies entries; the leader drains it with [`follow`], which refreshes the desired
//! state of the changed nodes only and wakes the scheduler when anything changed. So an apply
//! costs the leader in proportion to what it changed, not to the fleet. Every path that
//! refreshes desired state after a write (the apply watcher, the scheduling loop after a plan,
//! the agent service after a registration or report) goes through [`follow`], so whichever
//! drains first does the work once.
//!
//! What is not known exactly is [`AppliedChanges::Everything`]: the state machine starts that
//! way (a snapshot was loaded, the log is being replayed), a snapshot install sets it, and so
//! does more than [`APPLIED_CHANGES_MAX`] records (a follower, which nobody drains, gets there
//! and then stops noting). A new leader refreshes every node once anyway: the desired-state
//! tracker starts over with each term.

use std::sync::Arc;

use quotient_core::Changes;
use tokio::sync::Notify;

use crate::desired::{DesiredTracker, Refreshed};
use crate::metrics::CoordinatorMetrics;
use crate::store::QuotientStateMachine;

/// The most records (jobs, nodes and shares together) the state machine names between two
/// drains; beyond it, it notes [`AppliedChanges::Everything`] instead. A full refresh costs
/// about as much as a fleet of this many nodes, and a follower's set must not grow with
/// every job it applies.
pub const APPLIED_CHANGES_MAX: usize = 65_536;

/// What the entries applied since the last drain changed. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppliedChanges {
    /// Exactly these records changed.
    Named(Changes),
    /// Anything may have changed: look at everything.
    Everything,
}

impl Default for AppliedChanges {
    fn default() -> Self {
        AppliedChanges::Named(Changes::new())
    }
}

impl AppliedChanges {
    /// Where to note the next command's changes; `None` once everything counts as changed.
    pub fn noting(&mut self) -> Option<&mut Changes> {
        match self {
            AppliedChanges::Named(changes) => Some(changes),
            AppliedChanges::Everything => None,
        }
    }

    /// Gives up naming records once there are more than [`APPLIED_CHANGES_MAX`].
    pub fn bound(&mut self) {
        if let AppliedChanges::Named(changes) = self {
            if changes.len() > APPLIED_CHANGES_MAX {
                *self = AppliedChanges::Everything;
            }
        }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        matches!(self, AppliedChanges::Named(changes) if changes.is_empty())
    }

    /// What changed so far, leaving nothing.
    pub fn take(&mut self) -> AppliedChanges {
        std::mem::take(self)
    }
}

/// On the leader, after entries were applied: refreshes the desired state of the nodes they
/// changed (every node under a new `term`), counts what the metrics count of them, and wakes
/// the scheduler if anything changed.
pub fn follow(
    state_machine: &QuotientStateMachine,
    desired: &DesiredTracker,
    scheduler: &Arc<Notify>,
    metrics: &CoordinatorMetrics,
    term: u64,
) -> Refreshed {
    let (refreshed, changed) = state_machine.read_changes(|state, changes| {
        let changed = !changes.is_empty();
        metrics.follow(state, &changes, term);
        (desired.refresh(state, term, &changes), changed)
    });
    if changed || refreshed.full {
        scheduler.notify_one();
    }
    refreshed
}

#[cfg(test)]
mod tests {
    use quotient_common::JobId;

    use super::*;

    /// Changes naming `count` jobs, bounded as the state machine bounds them.
    fn naming(count: u64) -> AppliedChanges {
        let mut changes = AppliedChanges::default();
        for id in 1..=count {
            let noting = changes.noting().expect("still named");
            noting.jobs.insert(JobId(id));
        }
        changes.bound();
        changes
    }

    #[test]
    fn more_than_the_maximum_counts_as_everything_and_stops_noting() {
        // Proves the bound: past APPLIED_CHANGES_MAX records the changes become Everything,
        // and then nothing more is noted until they are taken.
        assert!(AppliedChanges::default().is_empty());
        let mut changes = naming(APPLIED_CHANGES_MAX as u64 + 1);
        assert_eq!(changes, AppliedChanges::Everything);
        assert!(changes.noting().is_none());
        assert!(!changes.is_empty());
        assert_eq!(changes.take(), AppliedChanges::Everything);
        assert!(changes.is_empty(), "taking leaves nothing");
    }

    #[test]
    fn up_to_the_maximum_the_records_stay_named() {
        // Proves that exactly APPLIED_CHANGES_MAX records are still named one by one.
        let changes = naming(APPLIED_CHANGES_MAX as u64);
        let named = match &changes {
            AppliedChanges::Named(named) => named.len(),
            AppliedChanges::Everything => 0,
        };
        assert_eq!(named, APPLIED_CHANGES_MAX);
    }
}
