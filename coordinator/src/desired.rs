//! Desired state per node: what the leader wants each agent to run, computed from the
//! replicated state, with the fence that orders it across leaders.
//!
//! [`desired_allocations`] is the pure part: every job holding GPUs on a node becomes a
//! [`WireAllocation`] with intent `Run`, or `Stop` once the job is PREEMPTING (a preemption or
//! a cancel). [`DesiredTracker`] keeps, per node, the allocations last computed and the fence
//! at which they last changed (`Fence { term: leader's term, index: last applied index }`);
//! a cheap signature per node (jobs, attempts, intents, GPUs) decides what changed.
//! The coordinator refreshes it after every apply batch, for the nodes the batch changed
//! ([`crate::applied`]); a node's fence moves only when its allocations change (or when the
//! term does), so a long poll (`WatchDesired`) is answered when something that node cares
//! about changed, not on every write to the cluster.
//!
//! A new term clears the tracker, so the first desired state a new leader sends carries its
//! own term and is newer than anything the deposed leader sent. Running jobs keep their
//! attempt and intent `Run`, so a failover restarts nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use quotient_common::agent_api::{DesiredState, Fence, WireAllocation, WireGang, WireIntent};
use quotient_common::JobState;
use quotient_core::{NodeId, NodeRecord, State};
use tokio::sync::watch;

use crate::applied::AppliedChanges;

/// The allocations `node` should run, in job order. A member of a job of several nodes that
/// has exited is no longer wanted there (its GPUs stay held until every member has exited).
pub fn desired_allocations(state: &State, node: &NodeRecord) -> Vec<WireAllocation> {
    let mut jobs = state.jobs_on_node(node.id);
    jobs.sort();
    jobs.into_iter()
        .filter_map(|id| state.job(id))
        .filter_map(|job| {
            let (rank, allocation) = job.member_on(node.id)?;
            if allocation.stage.exited() {
                return None;
            }
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
                cpu_millis: allocation.cpu_millis,
                memory_bytes: allocation.memory_bytes,
                gang: job.is_gang().then(|| gang(state, job, rank)),
            })
        })
        .collect()
}

/// The rendezvous of member `rank` of `job`, a job of several nodes: its peers' addresses
/// (a node that advertises none is reached by its name) and the port rank 0 listens on.
fn gang(state: &State, job: &quotient_core::JobRecord, rank: u32) -> WireGang {
    let hosts = job
        .placement
        .iter()
        .map(|member| {
            state.node(member.node).map_or_else(String::new, |node| {
                node.host
                    .address
                    .clone()
                    .unwrap_or_else(|| node.name.clone())
            })
        })
        .collect();
    WireGang {
        rank,
        hosts,
        master_port: rendezvous_port(job.id, job.attempts),
    }
}

/// The port rank 0 of attempt `attempt` of `job` listens on: the same for every member,
/// derived from the job and attempt (so every leader picks the same), spread over 20000 to
/// 29999 so that two jobs on one node seldom meet. A job that sets `MASTER_PORT` itself
/// keeps its own.
pub fn rendezvous_port(job: quotient_common::JobId, attempt: u32) -> u16 {
    let mixed = job
        .0
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(attempt).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    20_000 + ((mixed >> 32) % 10_000) as u16
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
            let (_, allocation) = job.member_on(node.id)?;
            Some((
                job.id,
                job.attempts,
                job.state == JobState::Preempting || allocation.stage.exited(),
                allocation.gpu_mask,
            ))
        })
        .collect();
    signature.sort_unstable();
    signature
}

#[derive(Default)]
struct DesiredByNode {
    term: u64,
    nodes: BTreeMap<String, (Signature, DesiredState)>,
    /// The name of each tracked node's id, to find what a changed id was called.
    names: BTreeMap<NodeId, String>,
}

impl DesiredByNode {
    /// Brings node `id` up to date with `state`; whether its desired state changed.
    fn refresh_node(&mut self, state: &State, id: NodeId, fence: Fence) -> bool {
        let Some(node) = state.node(id) else {
            // Removed: forget it, so a removed node's desired state is not kept.
            self.forget(state, id);
            return false;
        };
        if self.names.get(&id) != Some(&node.name) {
            // The slot is another node's now.
            self.forget(state, id);
            self.names.insert(id, node.name.clone());
        }
        let signature = signature(state, node);
        let same = self
            .nodes
            .get(&node.name)
            .is_some_and(|(known, _)| *known == signature);
        if same {
            return false;
        }
        let desired = DesiredState {
            node: node.name.clone(),
            fence,
            allocations: desired_allocations(state, node),
        };
        self.nodes.insert(node.name.clone(), (signature, desired));
        true
    }

    /// Forgets what id `id` was called, and that name's desired state unless a node of that
    /// name is in `state` (under another id, refreshed on its own).
    fn forget(&mut self, state: &State, id: NodeId) {
        if let Some(name) = self.names.remove(&id) {
            if state.node_by_name(&name).is_none() {
                self.nodes.remove(&name);
            }
        }
    }
}

/// What one refresh did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Whether every node was looked at (a new term, or changes not known exactly).
    pub full: bool,
    /// How many nodes' allocations were looked at.
    pub examined: usize,
    /// The nodes whose desired state changed.
    pub changed: Vec<String>,
}

/// Every node's current desired state, and a signal per node when it changes. Cheap to clone.
///
/// Each node's long poll waits on a signal of its own ([`DesiredTracker::subscribe`]), so a
/// change wakes only the agents it is about: with 10,000 agents polling, one registration
/// or one placement wakes one poll, not 10,000.
#[derive(Clone)]
pub struct DesiredTracker {
    tracked: Arc<Mutex<DesiredByNode>>,
    /// One signal per node being watched, made by the first watcher; entries no receiver
    /// holds are dropped at the next full refresh.
    watchers: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
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
        DesiredTracker {
            tracked: Arc::new(Mutex::new(DesiredByNode::default())),
            watchers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Recomputes, from `state` under `term`, the allocations of the nodes `changes` names
    /// (of every node under a new term, or when changes are not known exactly); wakes the
    /// watchers if any node's desired state changed.
    pub fn refresh(&self, state: &State, term: u64, changes: &AppliedChanges) -> Refreshed {
        let fence = Fence {
            term,
            index: state.data().last_applied_index,
        };
        let mut tracked = self.tracked.lock().unwrap_or_else(PoisonError::into_inner);
        let mut refreshed = Refreshed::default();
        if tracked.term != term {
            tracked.term = term;
            tracked.nodes.clear();
            tracked.names.clear();
            refreshed.full = true;
        }
        let ids: Vec<NodeId> = match changes {
            AppliedChanges::Named(changes) if !refreshed.full => {
                changes.nodes.iter().copied().collect()
            }
            _ => {
                refreshed.full = true;
                // The nodes there are, and those tracked that may be gone.
                let mut ids: Vec<NodeId> = state.nodes().map(|node| node.id).collect();
                ids.extend(tracked.names.keys().copied());
                ids.sort_unstable();
                ids.dedup();
                ids
            }
        };
        for id in ids {
            if state.node(id).is_some() {
                refreshed.examined += 1;
            }
            if tracked.refresh_node(state, id, fence) {
                let name = state.node(id).expect("changed, so present").name.clone();
                refreshed.changed.push(name);
            }
        }
        drop(tracked);
        if !refreshed.changed.is_empty() || refreshed.full {
            let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
            if refreshed.full {
                // A new term or a full look: every watcher looks again (its node may be gone).
                watchers.retain(|_, signal| signal.receiver_count() > 0);
                for signal in watchers.values() {
                    signal.send_modify(|generation| *generation += 1);
                }
            } else {
                for name in &refreshed.changed {
                    if let Some(signal) = watchers.get(name) {
                        signal.send_modify(|generation| *generation += 1);
                    }
                }
            }
        }
        refreshed
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

    /// A receiver that sees a new value whenever `node`'s desired state changed (or every
    /// node was looked at again).
    pub fn subscribe(&self, node: &str) -> watch::Receiver<u64> {
        let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        match watchers.get(node) {
            Some(signal) => signal.subscribe(),
            None => {
                let (signal, receiver) = watch::channel(0);
                watchers.insert(node.to_string(), signal);
                receiver
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use quotient_common::JobSpec;
    use quotient_core::Command;

    use super::*;
    use crate::test_log::Log;

    /// Refreshes `tracker` with what `log` changed since the last refresh, under `term`.
    fn refresh(tracker: &DesiredTracker, log: &mut Log, term: u64) -> Refreshed {
        let changes = log.take_changes();
        tracker.refresh(&log.state, term, &changes)
    }

    #[test]
    fn a_placed_job_runs_a_cancelled_one_stops_and_fences_move_only_on_change() {
        // Proves the desired state of a node follows its allocations, intent Stop once a job
        // is PREEMPTING, and that the fence moves only when the node's allocations change
        // or the term does.
        let mut log = Log::new();
        log.register_node("node-1", 2);
        log.create_share("team", 2);
        let tracker = DesiredTracker::new();
        assert_eq!(
            refresh(&tracker, &mut log, 1).changed,
            vec!["node-1".to_string()]
        );
        let empty = tracker.get("node-1").expect("a known node");
        assert!(empty.allocations.is_empty());

        log.apply(Command::SubmitJob(JobSpec::new(
            "team",
            1,
            1,
            vec!["x".into()],
        )));
        assert!(
            refresh(&tracker, &mut log, 1).changed.is_empty(),
            "nothing placed yet"
        );
        log.schedule();
        assert_eq!(refresh(&tracker, &mut log, 1).changed.len(), 1);
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
        assert_eq!(refresh(&tracker, &mut log, 1).changed.len(), 1);
        let stopping = tracker.get("node-1").expect("a known node");
        assert_eq!(stopping.allocations[0].intent, WireIntent::Stop);

        // A new leader: the same allocations under a newer fence, attempt unchanged.
        let new_term = refresh(&tracker, &mut log, 2);
        assert!(new_term.full, "a new term looks at every node");
        assert_eq!(new_term.changed.len(), 1);
        let new_term = tracker.get("node-1").expect("a known node");
        assert!(new_term.fence > stopping.fence);
        assert_eq!(new_term.allocations, stopping.allocations);
    }

    #[test]
    fn a_change_wakes_only_the_watchers_of_its_node() {
        // Proves each node's long poll is woken by its own node's changes only (10,000
        // polling agents must not all wake for one placement), and every watcher by a new
        // term.
        let mut log = Log::new();
        log.register_node("node-1", 1);
        log.register_node("node-2", 1);
        log.create_share("team", 2);
        let tracker = DesiredTracker::new();
        refresh(&tracker, &mut log, 1);
        let mut one = tracker.subscribe("node-1");
        let mut two = tracker.subscribe("node-2");
        log.apply(Command::SubmitJob(JobSpec::new(
            "team",
            1,
            1,
            vec!["x".into()],
        )));
        log.schedule();
        let placed = refresh(&tracker, &mut log, 1);
        assert_eq!(placed.changed.len(), 1);
        let (placed_on, other) = if placed.changed[0] == "node-1" {
            (&mut one, &mut two)
        } else {
            (&mut two, &mut one)
        };
        assert!(placed_on.has_changed().expect("the signal is kept"));
        assert!(!other.has_changed().expect("the signal is kept"));
        placed_on.borrow_and_update();

        refresh(&tracker, &mut log, 2);
        assert!(one.has_changed().expect("the signal is kept"));
        assert!(two.has_changed().expect("the signal is kept"));
    }

    #[test]
    fn a_removed_nodes_desired_state_is_forgotten() {
        // Proves the tracker drops a node once it is removed from the state, so it holds no
        // desired state for a node that is gone.
        let mut log = Log::new();
        log.register_node("node-1", 1);
        log.register_node("node-2", 1);
        let tracker = DesiredTracker::new();
        refresh(&tracker, &mut log, 1);
        assert!(tracker.get("node-2").is_some());
        log.apply(Command::CordonNode {
            node: "node-2".into(),
        });
        log.apply(Command::RemoveNode {
            node: "node-2".into(),
        });
        let refreshed = refresh(&tracker, &mut log, 1);
        assert!(!refreshed.full);
        assert!(tracker.get("node-2").is_none());
        assert!(tracker.get("node-1").is_some());
    }

    #[test]
    fn a_refresh_after_an_apply_looks_only_at_the_nodes_it_changed() {
        // Proves the cost of a refresh follows what the applies changed: placing one job on
        // a fleet of 50 nodes looks at that one node, a write that touches no node at none,
        // and only a new term (or changes not known exactly) looks at all 50.
        let mut log = Log::new();
        for n in 0..50 {
            log.register_node(&format!("node-{n}"), 1);
        }
        log.create_share("team", 1);
        let tracker = DesiredTracker::new();
        let first = refresh(&tracker, &mut log, 1);
        assert!(first.full);
        assert_eq!((first.examined, first.changed.len()), (50, 50));

        log.apply(Command::SubmitJob(JobSpec::new(
            "team",
            1,
            1,
            vec!["x".into()],
        )));
        let submitted = refresh(&tracker, &mut log, 1);
        assert_eq!((submitted.full, submitted.examined), (false, 0));
        log.schedule();
        let placed = refresh(&tracker, &mut log, 1);
        assert_eq!((placed.full, placed.examined), (false, 1));
        assert_eq!(placed.changed.len(), 1);
        let node = &placed.changed[0];
        assert_eq!(tracker.get(node).expect("tracked").allocations.len(), 1);

        let everything = tracker.refresh(&log.state, 1, &AppliedChanges::Everything);
        assert_eq!((everything.full, everything.examined), (true, 50));
        assert!(everything.changed.is_empty(), "nothing new to tell");
        let next_term = refresh(&tracker, &mut log, 2);
        assert_eq!((next_term.full, next_term.examined), (true, 50));
    }

    #[test]
    fn a_name_that_moves_to_another_slot_keeps_its_desired_state() {
        // Proves that when a node is removed and a node of the same name registers in
        // another slot before the next refresh, the tracker keeps the new node's desired
        // state rather than forgetting the name with the old slot.
        let mut log = Log::new();
        log.register_node("node-a", 1);
        log.register_node("node-b", 1);
        let tracker = DesiredTracker::new();
        refresh(&tracker, &mut log, 1);
        // node-a leaves slot 0; node-b leaves slot 1 and comes back in slot 0.
        for node in ["node-a", "node-b"] {
            log.apply(Command::CordonNode { node: node.into() });
            log.apply(Command::RemoveNode { node: node.into() });
        }
        log.register_node("node-b", 1);
        assert_eq!(
            log.state.node_by_name("node-b").expect("back").id,
            NodeId(0)
        );
        refresh(&tracker, &mut log, 1);
        assert!(tracker.get("node-a").is_none());
        let back = tracker
            .get("node-b")
            .expect("node-b is tracked in its new slot");
        assert_eq!(back.node, "node-b");
    }
}
