//! The agents' disk use on the leader: what each agent last said its logs and checkpoint
//! dirs take and what its state dir's filesystem has left (`AgentRequest::DiskUsage`), for
//! `quotient node list`.
//!
//! Like heartbeats, these reports are not replicated: the leader keeps the last one per node
//! in memory. A new leader knows none until each agent reports again (it does on every new
//! connection, so within a heartbeat or two of registering), and a report older than
//! [`DISK_USAGE_AGE_MAX_MS`] is not shown: an agent sends one about every minute while it
//! runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use quotient_common::agent_api::DiskUsage;

/// A report older than this is unknown (milliseconds): five of the agent's sweep intervals.
pub const DISK_USAGE_AGE_MAX_MS: u64 = 300_000;

/// The last disk use each node reported, on the leader. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct NodeDisks {
    reports: Arc<Mutex<BTreeMap<String, (DiskUsage, Instant)>>>,
}

impl NodeDisks {
    pub fn new() -> NodeDisks {
        NodeDisks::default()
    }

    fn reports(&self) -> MutexGuard<'_, BTreeMap<String, (DiskUsage, Instant)>> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records what `node` reported now. Only registered nodes report (the agent service
    /// checks), so the map holds at most one entry per node.
    pub fn record(&self, node: &str, usage: DiskUsage) {
        self.reports()
            .insert(node.to_string(), (usage, Instant::now()));
    }

    /// What `node` last reported, unless that is older than [`DISK_USAGE_AGE_MAX_MS`].
    pub fn of(&self, node: &str) -> Option<DiskUsage> {
        let mut reports = self.reports();
        let (usage, at) = reports.get(node)?;
        if at.elapsed() > Duration::from_millis(DISK_USAGE_AGE_MAX_MS) {
            reports.remove(node);
            return None;
        }
        Some(*usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last report of a node is what it gives back; other nodes have none.
    #[test]
    fn the_last_report_wins() {
        let disks = NodeDisks::new();
        assert_eq!(disks.of("node-1"), None);
        let first = DiskUsage {
            logs_bytes: 1,
            ..DiskUsage::default()
        };
        let second = DiskUsage {
            logs_bytes: 2,
            free_bytes: 3,
            ..DiskUsage::default()
        };
        disks.record("node-1", first);
        disks.record("node-1", second);
        assert_eq!(disks.of("node-1"), Some(second));
        assert_eq!(disks.of("node-2"), None);
    }
}
