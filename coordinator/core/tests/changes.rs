//! What `apply_noting` says each kind of command changed (`quotient_core::Changes`): the jobs,
//! nodes and shares, exactly. Every other test's harness also checks each apply's changes
//! against a comparison of the states before and after (`support::changed_between`); these
//! name the expected sets by hand, one command kind at a time.

mod support;

use std::collections::BTreeSet;

use quotient_common::{JobId, NodeState, ShareUpdate, Strategy};
use quotient_core::{Changes, Command, JobEvent, NodeId};
use support::*;

/// The changes naming `jobs`, `nodes` and `shares`.
fn changes(jobs: &[u64], nodes: &[u32], shares: &[&str]) -> Changes {
    Changes {
        jobs: jobs.iter().map(|id| JobId(*id)).collect(),
        nodes: nodes.iter().map(|id| NodeId(*id)).collect(),
        shares: shares.iter().map(|name| name.to_string()).collect(),
    }
}

fn nothing() -> Changes {
    Changes::new()
}

/// Applies `command` (rejected or not) and returns what it changed.
fn changed(sim: &mut Sim, command: Command) -> Changes {
    sim.apply(command);
    sim.last_changes.clone()
}

fn report(sim: &mut Sim, job: JobId, event: JobEvent) -> Changes {
    sim.report(job, event);
    sim.last_changes.clone()
}

fn round(sim: &mut Sim) -> Changes {
    let plan = quotient_core::plan(&sim.state);
    changed(sim, Command::ApplyPlan(plan))
}

#[test]
fn each_kind_of_command_names_exactly_what_it_changed() {
    // Proves the summary of every command kind: the records it changed, and nothing for a
    // command that changed nothing or was rejected.
    let mut sim = Sim::new();
    let a = Command::CreateShare(share("a", Strategy::Lend, 2));
    assert_eq!(changed(&mut sim, a.clone()), changes(&[], &[], &["a"]));
    assert_eq!(changed(&mut sim, a), nothing(), "a rejected duplicate");
    let n0 = Command::RegisterNode(node("n0", 2, "a10g"));
    assert_eq!(changed(&mut sim, n0), changes(&[], &[0], &[]));
    let n1 = Command::RegisterNode(node("n1", 2, "a10g"));
    assert_eq!(changed(&mut sim, n1), changes(&[], &[1], &[]));

    let mut keyed = job("a", "j1", 1, 2);
    keyed.idempotency_key = Some("key-1".into());
    let submit = Command::SubmitJob(keyed);
    assert_eq!(
        changed(&mut sim, submit.clone()),
        changes(&[1], &[], &["a"])
    );
    assert_eq!(
        changed(&mut sim, submit),
        nothing(),
        "a duplicate submit answers the first job"
    );
    let placed = round(&mut sim);
    let node = sim
        .state
        .job(JobId(1))
        .unwrap()
        .allocation()
        .copied()
        .unwrap()
        .node;
    assert_eq!(placed, changes(&[1], &[node.0], &["a"]));
    let other = 1 - node.0;
    assert_eq!(round(&mut sim), nothing(), "a round with nothing to do");

    let ran = report(&mut sim, JobId(1), JobEvent::Running);
    assert_eq!(ran, changes(&[1], &[node.0], &["a"]));
    let priority = Command::UpdateJobPriority {
        job: JobId(1),
        priority: 7,
    };
    assert_eq!(
        changed(&mut sim, priority),
        changes(&[1], &[node.0], &["a"])
    );

    // A job that waits gets its reason from a plan: the job and its share, no node.
    assert_eq!(
        changed(&mut sim, Command::SubmitJob(job("a", "j2", 1, 1))),
        changes(&[2], &[], &["a"])
    );
    assert_eq!(round(&mut sim), changes(&[2], &[], &["a"]));
    assert!(sim.state.job(JobId(2)).unwrap().reason.is_some());

    let other_name = sim.state.node(NodeId(other)).unwrap().name.clone();
    let health = |healthy| Command::SetGpuHealth {
        node: other_name.clone(),
        index: 0,
        healthy,
    };
    assert_eq!(
        changed(&mut sim, health(false)),
        changes(&[], &[other], &[])
    );
    assert_eq!(changed(&mut sim, health(false)), nothing(), "no new health");
    assert_eq!(changed(&mut sim, health(true)), changes(&[], &[other], &[]));
    let cordon = Command::CordonNode {
        node: other_name.clone(),
    };
    assert_eq!(
        changed(&mut sim, cordon.clone()),
        changes(&[], &[other], &[])
    );
    assert_eq!(changed(&mut sim, cordon), nothing(), "already cordoned");
    let ready = Command::SetNodeState {
        node: other_name.clone(),
        state: NodeState::Ready,
    };
    assert_eq!(changed(&mut sim, ready), changes(&[], &[other], &[]));

    let update = |limit| Command::UpdateShare {
        name: "a".into(),
        update: ShareUpdate {
            limits: Some([(class("a10g"), limit)].into()),
            ..ShareUpdate::default()
        },
    };
    assert_eq!(changed(&mut sim, update(3)), changes(&[], &[], &["a"]));
    assert_eq!(changed(&mut sim, update(3)), nothing(), "the same limits");

    // Cancelling a running job asks its agent to stop it: the job, its node, its share.
    let cancel = Command::CancelJob { job: JobId(1) };
    assert_eq!(changed(&mut sim, cancel), changes(&[1], &[node.0], &["a"]));
    let stopped = report(
        &mut sim,
        JobId(1),
        JobEvent::ExitedAfterSignal { code: None },
    );
    assert_eq!(stopped, changes(&[1], &[node.0], &["a"]));
    let unknown = Command::CancelJob { job: JobId(99) };
    assert_eq!(changed(&mut sim, unknown), nothing(), "a rejected cancel");
    assert_eq!(
        changed(&mut sim, Command::CheckDigest { leader: None }),
        nothing()
    );

    // Job 2 now runs on one node; that node is drained (the node), the round preempts it
    // (the job, its node, its share), and losing the node requeues it (all three again).
    round(&mut sim);
    let on = sim
        .state
        .job(JobId(2))
        .unwrap()
        .allocation()
        .copied()
        .unwrap()
        .node;
    let on_name = sim.state.node(on).unwrap().name.clone();
    report(&mut sim, JobId(2), JobEvent::Running);
    let drain = Command::DrainNode {
        node: on_name.clone(),
    };
    assert_eq!(changed(&mut sim, drain), changes(&[], &[on.0], &[]));
    assert_eq!(round(&mut sim), changes(&[2], &[on.0], &["a"]));
    let lost = Command::MarkNodeLost {
        node: on_name.clone(),
    };
    assert_eq!(changed(&mut sim, lost), changes(&[2], &[on.0], &["a"]));
    let remove = Command::RemoveNode { node: on_name };
    assert_eq!(changed(&mut sim, remove), changes(&[], &[on.0], &[]));

    // Deleting a disabled share cancels its queued jobs: the share and those jobs.
    let disable = Command::DisableShare { name: "a".into() };
    assert_eq!(
        changed(&mut sim, disable.clone()),
        changes(&[], &[], &["a"])
    );
    assert_eq!(changed(&mut sim, disable), nothing(), "already disabled");
    let queued: BTreeSet<JobId> = sim
        .state
        .jobs()
        .filter(|j| j.state == quotient_common::JobState::Runnable)
        .map(|j| j.id)
        .collect();
    assert_eq!(queued, BTreeSet::from([JobId(2)]));
    let delete = Command::DeleteShare { name: "a".into() };
    assert_eq!(changed(&mut sim, delete), changes(&[2], &[], &["a"]));
}

#[test]
fn a_batch_names_the_union_of_its_commands_changes() {
    // Proves that changes noted into one set across commands add up, as the state machine
    // notes a whole log entry.
    let mut sim = Sim::new();
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let mut batch = Changes::new();
    for (index, command) in [
        Command::RegisterNode(node("n0", 1, "a10g")),
        Command::SubmitJob(job("a", "j1", 1, 1)),
        Command::CancelJob { job: JobId(5) },
    ]
    .into_iter()
    .enumerate()
    {
        let ctx = quotient_core::ApplyCtx {
            log_index: 100 + index as u64,
            time_ms: 5_000,
        };
        quotient_core::apply_noting(&mut sim.state, command, ctx, &mut batch);
    }
    assert_eq!(batch, changes(&[1], &[0], &["a"]));
}
