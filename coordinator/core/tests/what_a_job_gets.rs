//! What a job gets around its GPUs: retries by its retry strategy, a time limit, only the
//! scheduling rules' preemptions counted toward max_preemptions, nodes that can run it
//! (runtime, image, CPUs, memory, reachable), and a record of every attempt.

mod support;

use std::collections::BTreeSet;

use quotient_common::{HostInfo, JobState, RetryPolicy, RetryRule, Runtime, Strategy};
use quotient_core::{explain, plan_avoiding, Command, JobEvent, NodeId, Outcome, WaitReason};
use support::*;

fn one_node(gpus: u32) -> Sim {
    let mut sim = Sim::new();
    sim.ok(Command::RegisterNode(node("gpu-1", gpus, "a10g")));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 8)));
    sim
}

fn reason_of(sim: &Sim, id: quotient_common::JobId) -> String {
    sim.state
        .job(id)
        .unwrap()
        .reason
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// A drain and a lost node requeue a job without counting toward its max_preemptions;
/// the scheduling rules' own preemptions (in-share here) count.
#[test]
fn only_the_rules_preemptions_count_toward_max_preemptions() {
    let mut sim = one_node(1);
    let mut spec = job("team", "careful", 1, 1);
    spec.max_preemptions = Some(1);
    let id = sim.submit(spec);
    for _ in 0..2 {
        sim.settle();
        assert_eq!(sim.state_of(id), JobState::Running);
        sim.ok(Command::DrainNode {
            node: "gpu-1".into(),
        });
        sim.settle();
        assert_eq!(sim.state_of(id), JobState::Runnable, "a drain requeues it");
        sim.ok(Command::SetNodeState {
            node: "gpu-1".into(),
            state: quotient_common::NodeState::Ready,
        });
    }
    sim.settle();
    sim.ok(Command::MarkNodeLost {
        node: "gpu-1".into(),
    });
    sim.ok(Command::RegisterNode(node("gpu-1", 1, "a10g")));
    sim.settle();
    let record = sim.state.job(id).unwrap();
    assert_eq!(record.state, JobState::Running, "{record:?}");
    assert_eq!((record.preemptions, record.counted_preemptions), (3, 0));

    // Two in-share preemptions pass max_preemptions 1.
    sim.ok(Command::UpdateShare {
        name: "team".into(),
        update: quotient_common::ShareUpdate {
            in_share_preemption: Some(true),
            ..Default::default()
        },
    });
    for round in 0..2 {
        let urgent = sim.submit(job("team", "urgent", 9, 1));
        sim.settle();
        if round == 0 {
            assert_eq!(sim.state_of(id), JobState::Runnable);
            sim.finish(urgent, 0);
            sim.settle();
            assert_eq!(sim.state_of(id), JobState::Running);
        }
    }
    let record = sim.state.job(id).unwrap();
    assert_eq!(record.state, JobState::Failed, "{record:?}");
    assert_eq!(record.counted_preemptions, 2);
    assert!(reason_of(&sim, id).contains("max_preemptions is 1"));
}

/// A failed attempt is retried while retries are left, each retry a new attempt in the
/// job's history; the last failure ends it FAILED saying how many retries it used.
#[test]
fn failures_are_retried_while_retries_are_left() {
    let mut sim = one_node(1);
    let mut spec = job("team", "flaky", 1, 1);
    spec.retry = RetryPolicy {
        retries: 2,
        rules: Vec::new(),
    };
    let id = sim.submit(spec);
    for attempt in 1..=3 {
        sim.settle();
        assert_eq!(sim.state.job(id).unwrap().attempts, attempt);
        sim.finish(id, 1);
    }
    let record = sim.state.job(id).unwrap();
    assert_eq!(record.state, JobState::Failed);
    assert_eq!(record.retries_used, 2);
    assert_eq!(record.history.len(), 3);
    for (i, attempt) in record.history.iter().enumerate() {
        assert_eq!(attempt.attempt, i as u32 + 1);
        assert_eq!(attempt.node(), "gpu-1");
        assert_eq!(attempt.exit_code, Some(1));
        assert_eq!(attempt.outcome.as_deref(), Some("exited with code 1"));
        assert!(attempt.started_ms.is_some() && attempt.ended_ms >= attempt.started_ms);
    }
    assert!(
        reason_of(&sim, id).contains("after 2 of 2 retries"),
        "{}",
        reason_of(&sim, id)
    );
    assert!(record.first_started_ms.is_some());
    assert!(record.waited_ms(u64::MAX) < 1_000);
}

/// A rule that says exit ends the job at the first failure it matches; one that matches
/// nothing leaves the retries to the count.
#[test]
fn an_exit_rule_ends_the_job_at_once() {
    let mut sim = one_node(1);
    let mut spec = job("team", "picky", 1, 1);
    spec.retry = RetryPolicy {
        retries: 5,
        rules: vec![
            RetryRule::parse("exit:exit-code=3").unwrap(),
            RetryRule::parse("retry:exit-code=1*").unwrap(),
        ],
    };
    let id = sim.submit(spec);
    sim.settle();
    sim.finish(id, 137);
    assert_eq!(sim.state_of(id), JobState::Runnable, "137 matches 1*");
    sim.settle();
    sim.finish(id, 3);
    assert_eq!(sim.state_of(id), JobState::Failed);
    assert!(reason_of(&sim, id).contains("a retry rule said exit"));
}

/// At its time limit a job is stopped with its checkpoint signal; its attempt ends as a
/// failure with the reason "time limit", which its retry strategy may retry.
#[test]
fn a_job_at_its_time_limit_is_stopped_and_fails() {
    let mut sim = one_node(1);
    let mut spec = job("team", "slow", 1, 1);
    spec.time_limit_ms = Some(12 * 3_600_000);
    spec.retry.retries = 1;
    spec.retry.rules = vec![RetryRule::parse("retry:reason=time*").unwrap()];
    let id = sim.submit(spec);
    sim.settle();
    let stale = sim.apply(Command::StopAtTimeLimit {
        job: id,
        attempt: 2,
    });
    assert!(stale.is_rejected(), "another attempt's limit is stale");
    sim.ok(Command::StopAtTimeLimit {
        job: id,
        attempt: 1,
    });
    assert_eq!(sim.state_of(id), JobState::Preempting);
    assert!(explain(&sim.state, id)
        .unwrap()
        .summary
        .contains("time limit (12h)"));
    sim.report(id, JobEvent::ExitedAfterSignal { code: Some(0) });
    assert_eq!(sim.state_of(id), JobState::Runnable, "retried once");
    sim.settle();
    sim.ok(Command::StopAtTimeLimit {
        job: id,
        attempt: 2,
    });
    sim.report(id, JobEvent::ExitedAfterSignal { code: None });
    let record = sim.state.job(id).unwrap();
    assert_eq!(record.state, JobState::Failed);
    assert_eq!(record.preemptions, 0, "a time limit is no preemption");
    assert!(reason_of(&sim, id).starts_with("time limit (12h) reached"));
    assert_eq!(
        record.history[1].outcome.as_deref(),
        Some("time limit (12h) reached")
    );
}

fn docker_host(images: &[&str]) -> HostInfo {
    HostInfo {
        runtimes: vec![Runtime::Process, Runtime::Docker],
        images: images.iter().map(|i| i.to_string()).collect(),
        ..HostInfo::default()
    }
}

/// A container job goes only to a node with Docker that holds its image; while there is
/// none it waits saying so, and it starts once such a node registers.
#[test]
fn a_container_job_goes_only_where_docker_and_its_image_are() {
    let mut sim = one_node(4);
    let mut spec = job("team", "boxed", 1, 1);
    spec.payload.image = Some("trainer:1".into());
    let id = sim.submit(spec);
    sim.round();
    assert_eq!(sim.state_of(id), JobState::Runnable);
    let reason = reason_of(&sim, id);
    assert!(reason.contains("no Docker runtime"), "{reason}");

    let mut other = node("gpu-2", 4, "a10g");
    other.host = docker_host(&["trainer:2"]);
    sim.ok(Command::RegisterNode(other.clone()));
    sim.round();
    // gpu-1 (lowest id, same free GPUs) is refused first: it has no Docker.
    assert_eq!(sim.state_of(id), JobState::Runnable);
    assert!(matches!(
        sim.state.job(id).unwrap().reason.as_deref(),
        Some(WaitReason::NodeUnfit { .. })
    ));

    other.host = docker_host(&["trainer:1", "trainer:2"]);
    sim.ok(Command::RegisterNode(other));
    sim.round();
    let record = sim.state.job(id).unwrap();
    assert_eq!(record.state, JobState::Scheduled);
    assert_eq!(record.last_node.as_deref(), Some("gpu-2"));
    // A process job runs on the process-only node too (only it has 4 free GPUs).
    let plain = sim.submit(job("team", "plain", 1, 4));
    sim.round();
    assert_eq!(
        sim.state.job(plain).unwrap().last_node.as_deref(),
        Some("gpu-1")
    );
}

/// A job takes the CPUs and memory it asks for, or its share of the node's by GPUs; a node
/// without enough left free takes no more.
#[test]
fn cpus_and_memory_are_set_aside_and_respected() {
    let mut sim = Sim::new();
    let mut inventory = node("gpu-1", 4, "a10g");
    inventory.host.cpu_millis = 16_000;
    inventory.host.memory_bytes = 64 << 30;
    sim.ok(Command::RegisterNode(inventory));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 8)));
    let default = sim.submit(job("team", "default", 5, 1));
    let mut big = job("team", "big", 4, 1);
    big.cpu_millis = Some(10_000);
    let big = sim.submit(big);
    let mut more = job("team", "more", 3, 1);
    more.cpu_millis = Some(4_000);
    let more = sim.submit(more);
    sim.round();
    let alloc = sim
        .state
        .job(default)
        .unwrap()
        .allocation()
        .copied()
        .unwrap();
    assert_eq!((alloc.cpu_millis, alloc.memory_bytes), (4_000, 16 << 30));
    assert_eq!(
        sim.state
            .job(big)
            .unwrap()
            .allocation()
            .copied()
            .unwrap()
            .cpu_millis,
        10_000
    );
    assert_eq!(sim.state_of(more), JobState::Runnable, "2 CPUs are left");
    let reason = reason_of(&sim, more);
    assert!(
        reason.contains("needs 4 CPUs, the node has 2 free"),
        "{reason}"
    );
    sim.agents_start();
    sim.finish(big, 0);
    sim.round();
    assert_eq!(sim.state_of(more), JobState::Scheduled);
}

/// Nothing new is placed on a node the leader cannot reach, though its lease still holds.
#[test]
fn nothing_new_goes_to_an_unreachable_node() {
    let mut sim = one_node(1);
    sim.ok(Command::RegisterNode(node("gpu-2", 1, "a10g")));
    let id = sim.submit(job("team", "j", 1, 1));
    let unreachable: BTreeSet<NodeId> = [NodeId(0)].into();
    let plan = plan_avoiding(&sim.state, &unreachable);
    let placed: Vec<_> = plan.placements().collect();
    assert_eq!(placed, vec![(id, NodeId(1), 1)]);
    let both: BTreeSet<NodeId> = [NodeId(0), NodeId(1)].into();
    let plan = plan_avoiding(&sim.state, &both);
    assert_eq!(plan.placements().count(), 0);
    assert!(matches!(
        sim.apply(Command::ApplyPlan(plan)),
        Outcome::PlanApplied(_)
    ));
    assert!(
        reason_of(&sim, id).contains("unreachable"),
        "{}",
        reason_of(&sim, id)
    );
}

/// A job no node can run does not hold up the jobs behind it in its queue: they take the
/// GPUs it could not use. (A job that waits for CPUs or memory does hold them up, as one
/// that waits for GPUs does, so that it is not starved.)
#[test]
fn a_job_no_node_can_run_does_not_hold_up_its_queue() {
    let mut sim = one_node(1);
    let mut boxed = job("team", "boxed", 9, 1);
    boxed.payload.image = Some("trainer:1".into());
    let boxed = sim.submit(boxed);
    let plain = sim.submit(job("team", "plain", 1, 1));
    sim.round();
    assert_eq!(sim.state_of(boxed), JobState::Runnable);
    assert!(reason_of(&sim, boxed).contains("no Docker runtime"));
    assert_eq!(sim.state_of(plain), JobState::Scheduled);
}
