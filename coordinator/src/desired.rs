//! Desired state per node: what the leader wants each agent to run, computed from the
//! replicated state, with the fencing epoch that orders it across leaders.
//!
//! [`desired_allocations`] is the pure part: every job holding GPUs on a node becomes a
//! [`WireAllocation`] with intent `Run`, or `Stop` once the job is PREEMPTING (a preemption or
//! a cancel). [`DesiredTracker`] keeps, per node, the allocations last computed and the fence
//! at which they last changed (`Fence { term: leader's term, index: last applied index }`);
//! a cheap signature per node (jobs, attempts, intents, GPUs) decides what changed.
//! The coordinator refreshes it after every apply batch; a node's fence moves only when its
//! allocations change (or when the term does), so a long poll (`WatchDesired`) is answered
//! when something that node cares about changed, not on every write to the cluster.
//!
//! A new term clears the tracker, so the first desired state a new leader sends carries its
//! own term and is newer than anything the deposed leader sent. Running jobs keep their
//! attempt and intent `Run`, so a failover restarts nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use quotient_common::agent_api::{DesiredState, Fence, WireAllocation, WireIntent};
use quotient_common::JobState;
use quotient_core::{NodeRecord, State};
use tokio::sync::watch;

/// The allocations `node` should run, in job order.
pub fn desired_allocations(state: &State, node: &NodeRecord) -> Vec<WireAllocation> {
    let mut jobs = state.jobs_on_node(node.id);
    jobs.sort();
    jobs.into_iter()
        .filter_map(|id| state.job(id))
        .filter_map(|job| {
            let allocation = job.allocation?;
            let gpu_indices = allocation.gpu_indices();
            let gpu_uuids = gpu_indices
                .iter()
                .map(|index| {
                    node.gpus
                        .iter()
                        .find(|gpu| gpu.index == *index)
                        .map(|gpu| gpu.uuid.clone())
                        .unwrap_or_default()
                })
                .collect();
            let intent = if job.state == JobState::Preempting {
                WireIntent::Stop
            } else {
                WireIntent::Run
            };
            Some(WireAllocation {
                job: job.id,
                attempt: job.attempts,
                gpu_indices,
                gpu_uuids,
                spec: job.spec.clone(),
                intent,
            })
        })
        .collect()
}

/// What identifies a node's allocations for the agent: per job, its attempt, whether it
/// should stop, and its GPUs. Cheap to compute, so a refresh builds whole allocations (with
/// their specs) only for the nodes whose signature changed; a change of priority alone does
/// not wake the agent.
type Signature = Vec<(quotient_common::JobId, u32, bool, u64)>;

fn signature(state: &State, node: &NodeRecord) -> Signature {
    let mut signature: Signature = state
        .jobs_on_node(node.id)
        .into_iter()
        .filter_map(|id| state.job(id))
        .filter_map(|job| {
            let allocation = job.allocation?;
            Some((
                job.id,
                job.attempts,
                job.state == JobState::Preempting,
                allocation.gpu_mask,
            ))
        })
        .collect();
    signature.sort_unstable();
    signature
}

#[derive(Default)]
struct Tracked {
    term: u64,
    nodes: BTreeMap<String, (Signature, DesiredState)>,
}

/// Every node's current desired state, and a signal when any of them changes. Cheap to clone.
#[derive(Clone)]
pub struct DesiredTracker {
    tracked: Arc<Mutex<Tracked>>,
    changed: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for DesiredTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesiredTracker").finish_non_exhaustive()
    }
}

impl Default for DesiredTracker {
    fn default() -> Self {
        DesiredTracker::new()
    }
}

impl DesiredTracker {
    pub fn new() -> DesiredTracker {
        let (changed, _) = watch::channel(0);
        DesiredTracker {
            tracked: Arc::new(Mutex::new(Tracked::default())),
            changed: Arc::new(changed),
        }
    }

    /// Recomputes every node's allocations from `state` under `term`; returns the names of
    /// the nodes whose desired state changed, and wakes the watchers if any did.
    pub fn refresh(&self, state: &State, term: u64) -> Vec<String> {
        let index = state.data().last_applied_index;
        let mut tracked = self.tracked.lock().unwrap_or_else(PoisonError::into_inner);
        if tracked.term != term {
            tracked.term = term;
            tracked.nodes.clear();
        }
        if tracked.nodes.len() > state.node_count() {
            // A node was removed: forget it, so a removed node's desired state is not kept.
            tracked
                .nodes
                .retain(|name, _| state.node_by_name(name).is_some());
        }
        let mut changed = Vec::new();
        for node in state.nodes() {
            let signature = signature(state, node);
            let same = tracked
                .nodes
                .get(&node.name)
                .is_some_and(|(known, _)| *known == signature);
            if !same {
                let desired = DesiredState {
                    node: node.name.clone(),
                    fence: Fence { term, index },
                    allocations: desired_allocations(state, node),
                };
                tracked
                    .nodes
                    .insert(node.name.clone(), (signature, desired));
                changed.push(node.name.clone());
            }
        }
        drop(tracked);
        if !changed.is_empty() {
            self.changed.send_modify(|generation| *generation += 1);
        }
        changed
    }

    /// The node's desired state as last computed, if the node is known.
    pub fn get(&self, node: &str) -> Option<DesiredState> {
        self.tracked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .nodes
            .get(node)
            .map(|(_, desired)| desired.clone())
    }

    /// A receiver that sees a new value whenever some node's desired state changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use quotient_common::JobSpec;
    use quotient_core::Command;

    use super::*;
    use crate::test_log::Log;

    #[test]
    fn a_placed_job_runs_a_cancelled_one_stops_and_fences_move_only_on_change() {
        // Proves the desired state of a node follows its allocations, intent Stop once a job
        // is PREEMPTING, and that the fence moves only when the node's allocations change
        // or the term does.
        let mut log = Log::new();
        log.register_node("node-1", 2);
        log.create_share("team", 2);
        let tracker = DesiredTracker::new();
        assert_eq!(tracker.refresh(&log.state, 1), vec!["node-1".to_string()]);
        let empty = tracker.get("node-1").expect("a known node");
        assert!(empty.allocations.is_empty());

        log.apply(Command::SubmitJob(JobSpec::new(
            "team",
            1,
            1,
            vec!["x".into()],
        )));
        assert!(
            tracker.refresh(&log.state, 1).is_empty(),
            "nothing placed yet"
        );
        log.schedule();
        assert_eq!(tracker.refresh(&log.state, 1).len(), 1);
        let placed = tracker.get("node-1").expect("a known node");
        assert!(placed.fence > empty.fence);
        assert_eq!(placed.allocations.len(), 1);
        let allocation = &placed.allocations[0];
        assert_eq!(allocation.intent, WireIntent::Run);
        assert_eq!(allocation.attempt, 1);
        assert_eq!(
            allocation.gpu_uuids,
            vec![format!("GPU-{}", allocation.gpu_indices[0])]
        );

        let job = allocation.job;
        log.apply(Command::CancelJob { job });
        assert_eq!(tracker.refresh(&log.state, 1).len(), 1);
        let stopping = tracker.get("node-1").expect("a known node");
        assert_eq!(stopping.allocations[0].intent, WireIntent::Stop);

        // A new leader: the same allocations under a newer fence, attempt unchanged.
        assert_eq!(tracker.refresh(&log.state, 2).len(), 1);
        let new_term = tracker.get("node-1").expect("a known node");
        assert!(new_term.fence > stopping.fence);
        assert_eq!(new_term.allocations, stopping.allocations);
    }

    #[test]
    fn a_removed_nodes_desired_state_is_forgotten() {
        // Proves the tracker drops a node once it is removed from the state, so it holds no
        // desired state for a node that is gone.
        let mut log = Log::new();
        log.register_node("node-1", 1);
        log.register_node("node-2", 1);
        let tracker = DesiredTracker::new();
        tracker.refresh(&log.state, 1);
        assert!(tracker.get("node-2").is_some());
        log.apply(Command::CordonNode {
            node: "node-2".into(),
        });
        log.apply(Command::RemoveNode {
            node: "node-2".into(),
        });
        tracker.refresh(&log.state, 1);
        assert!(tracker.get("node-2").is_none());
        assert!(tracker.get("node-1").is_some());
    }
}
