//! Removing a node (`Command::RemoveNode`): refused while the node is ready or holds a job,
//! accepted once it is out of service and empty; its name is gone, its slot is taken by the
//! next new node, and a plan made before the removal places nothing on it.

mod support;

use quotient_common::{JobState, NodeState, Strategy};
use quotient_core::{plan, Command, NodeId, Outcome, PlanAction, Rejection, State};
use support::*;

fn fleet(sim: &mut Sim, nodes: u32, gpus: u32) {
    for n in 1..=nodes {
        sim.ok(Command::RegisterNode(node(
            &format!("node-{n}"),
            gpus,
            "a10g",
        )));
    }
}

fn remove(sim: &mut Sim, name: &str) -> Outcome {
    sim.apply(Command::RemoveNode {
        node: name.to_string(),
    })
}

fn names(state: &State) -> Vec<String> {
    state.nodes().map(|node| node.name.clone()).collect()
}

/// A node holding a job is refused, ready or not; drained and empty, it is removed.
#[test]
fn a_node_is_removed_only_once_no_job_is_on_it() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let j = sim.submit(job("a", "j", 1, 1));
    sim.settle();
    let on = sim
        .state
        .job(j)
        .unwrap()
        .allocation()
        .copied()
        .unwrap()
        .node;
    let name = sim.state.node(on).unwrap().name.clone();

    assert_eq!(
        remove(&mut sim, &name),
        Outcome::Rejected(Rejection::NodeReady(name.clone())),
        "a ready node is refused"
    );
    sim.ok(Command::CordonNode { node: name.clone() });
    assert_eq!(
        remove(&mut sim, &name),
        Outcome::Rejected(Rejection::NodeHasJobs {
            node: name.clone(),
            jobs: 1,
            first: j,
        }),
        "a cordoned node with a running job is refused"
    );

    sim.ok(Command::DrainNode { node: name.clone() });
    sim.round();
    assert_eq!(sim.state_of(j), JobState::Preempting);
    assert!(
        matches!(
            remove(&mut sim, &name),
            Outcome::Rejected(Rejection::NodeHasJobs { .. })
        ),
        "a job being stopped still holds its GPUs there"
    );

    sim.agents_stop();
    assert_eq!(remove(&mut sim, &name), Outcome::Done);
    assert!(sim.state.node_by_name(&name).is_none());
    assert!(sim.state.node(on).is_none());
    assert!(
        !names(&sim.state).contains(&name),
        "gone from the node list"
    );
    assert_eq!(sim.state.node_count(), 1);

    sim.settle();
    assert_eq!(
        sim.state_of(j),
        JobState::Running,
        "it runs on the other node"
    );
    assert_ne!(
        sim.state
            .job(j)
            .unwrap()
            .allocation()
            .copied()
            .unwrap()
            .node,
        on
    );
}

/// An unknown node, or one already removed, is refused by name.
#[test]
fn removing_an_unknown_node_is_refused() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    let refused = Outcome::Rejected(Rejection::UnknownNode("node-9".into()));
    assert_eq!(remove(&mut sim, "node-9"), refused);
    sim.ok(Command::MarkNodeLost {
        node: "node-1".into(),
    });
    assert_eq!(remove(&mut sim, "node-1"), Outcome::Done, "a lost node");
    assert_eq!(
        remove(&mut sim, "node-1"),
        Outcome::Rejected(Rejection::UnknownNode("node-1".into()))
    );
    assert!(
        matches!(
            sim.apply(Command::CordonNode {
                node: "node-1".into()
            }),
            Outcome::Rejected(Rejection::UnknownNode(_))
        ),
        "nothing else knows it either"
    );
}

/// The next new node takes a removed node's slot; the same name registering again is a new,
/// ready node; vacant slots at the end are dropped.
#[test]
fn a_removed_nodes_slot_is_taken_by_the_next_new_node() {
    let mut sim = Sim::new();
    fleet(&mut sim, 3, 1);
    let incarnation_before = sim.state.node_by_name("node-2").unwrap().incarnation;
    sim.ok(Command::CordonNode {
        node: "node-2".into(),
    });
    sim.ok(Command::RemoveNode {
        node: "node-2".into(),
    });
    assert_eq!(names(&sim.state), ["node-1", "node-3"]);
    assert_eq!(
        sim.state.data().nodes.len(),
        3,
        "a vacant slot in the middle"
    );

    sim.ok(Command::RegisterNode(node("node-4", 2, "a10g")));
    let taken = sim.state.node_by_name("node-4").unwrap();
    assert_eq!(taken.id, NodeId(1));
    assert_eq!(taken.state, NodeState::Ready);
    assert!(
        taken.incarnation > incarnation_before,
        "the slot's incarnation goes on rising"
    );
    assert_eq!(sim.state.data().nodes.len(), 3);

    sim.ok(Command::RegisterNode(node("node-2", 1, "a10g")));
    let back = sim.state.node_by_name("node-2").unwrap();
    assert_eq!(back.id, NodeId(3), "a new node, at the end");
    assert_eq!(back.state, NodeState::Ready, "not cordoned: it is new");

    for name in ["node-2", "node-3"] {
        sim.ok(Command::CordonNode { node: name.into() });
        sim.ok(Command::RemoveNode { node: name.into() });
    }
    assert_eq!(
        sim.state.data().nodes.len(),
        2,
        "the vacant slots at the end are dropped"
    );
    assert_eq!(names(&sim.state), ["node-1", "node-4"]);

    // Replicas agree: the state with its vacant slot survives a snapshot round trip.
    let bytes = sim.state.to_snapshot_bytes();
    let restored = State::from_snapshot_bytes(&bytes).expect("a valid snapshot");
    assert_eq!(restored.to_snapshot_bytes(), bytes);
    assert_eq!(names(&restored), ["node-1", "node-4"]);
}

/// A plan made before a node was removed places nothing on it and nominates nothing there.
#[test]
fn a_plan_made_before_a_removal_places_nothing_on_the_removed_node() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
    let j = sim.submit(job("a", "j", 1, 1));
    let stale = plan(&sim.state);
    assert!(stale
        .actions
        .iter()
        .any(|action| matches!(action, PlanAction::Place { job, .. } if *job == j)));

    // Removed in between: the Ready check is met by a cordon, as an operator would.
    sim.ok(Command::CordonNode {
        node: "node-1".into(),
    });
    sim.ok(Command::RemoveNode {
        node: "node-1".into(),
    });
    match sim.apply(Command::ApplyPlan(stale)) {
        Outcome::PlanApplied(report) => {
            assert_eq!(report.placed, 0);
            assert_eq!(report.rejected.len(), 1, "{report:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.state_of(j), JobState::Runnable);
    let nominate = quotient_core::Plan {
        actions: vec![PlanAction::Nominate {
            job: j,
            node: NodeId(0),
        }],
        ..quotient_core::Plan::default()
    };
    match sim.apply(Command::ApplyPlan(nominate)) {
        Outcome::PlanApplied(report) => assert_eq!(report.nominated, 0, "{report:?}"),
        other => panic!("{other:?}"),
    }
}

/// A node that registers again without the GPUs a job runs on (its agent came back with fewer,
/// or of another class) stops that job as its agent's stop, and the job keeps its GPUs until
/// the agent reports the attempt's exit: it is not placed elsewhere while the old attempt may
/// still run (found by probing: the new attempt started 21 ms after the old one's kill, with
/// nothing to order them). Once the exit is reported, it goes back to the queue and runs on.
#[test]
fn a_job_on_gpus_its_node_no_longer_has_waits_for_their_exit_before_it_moves() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let id = sim.submit(job("a", "j", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    let first = sim.nodes_of(id)[0].clone();
    let mut without = node(&first, 1, "a10g");
    without.gpus.clear();
    sim.ok(Command::RegisterNode(without));
    assert_eq!(
        sim.state_of(id),
        JobState::Preempting,
        "stopped, not requeued"
    );
    let plan = sim.round();
    assert!(
        !plan
            .actions
            .iter()
            .any(|action| matches!(action, PlanAction::Place { job, .. } if *job == id)),
        "placed elsewhere before its exit: {plan:?}"
    );
    let record = sim.state.job(id).unwrap();
    assert_eq!(
        record.last_preemption.as_deref().map(|p| p.kind),
        None,
        "counted only once the exit comes"
    );
    sim.report(
        id,
        quotient_common::JobEvent::ExitedAfterSignal { code: Some(0) },
    );
    assert_eq!(sim.state_of(id), JobState::Runnable);
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    assert_ne!(sim.nodes_of(id)[0], first, "it runs on the other node");
}
