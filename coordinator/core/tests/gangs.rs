//! Jobs of several nodes (docs/quota-shares.md, "Jobs of several nodes"): one test per rule.

mod support;

use quotient_common::{JobEvent, JobId, JobState, Strategy};
use quotient_core::{
    Command, JobReport, MemberStage, Outcome, PlanAction, PreemptionKind, StopCause,
};
use support::*;

/// `n` ready nodes of `gpus` a10g GPUs each, `node-0` to `node-{n-1}`.
fn fleet(sim: &mut Sim, n: usize, gpus: u32) {
    for i in 0..n {
        sim.ok(Command::RegisterNode(node(
            &format!("node-{i}"),
            gpus,
            "a10g",
        )));
    }
}

/// `nodes` nodes of `gpus` GPUs and a `lend` share `team` of `limit` GPUs.
fn team_on(nodes: usize, gpus: u32, limit: u32) -> Sim {
    let mut sim = Sim::new();
    fleet(&mut sim, nodes, gpus);
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, limit)));
    sim
}

/// Applies a plan of `actions` that must be refused whole; its report.
fn refused(sim: &mut Sim, actions: Vec<PlanAction>) -> quotient_core::PlanReport {
    let plan = quotient_core::Plan {
        actions,
        waiting: Vec::new(),
    };
    let Outcome::PlanApplied(report) = sim.apply(Command::ApplyPlan(plan)) else {
        panic!("a plan applies");
    };
    assert_eq!(report.placed, 0, "{report:?}");
    assert_eq!(report.rejected.len(), 1, "{report:?}");
    report
}

fn reason(sim: &Sim, id: JobId) -> String {
    sim.state
        .reason(sim.state.job(id).unwrap())
        .map(|r| r.to_string())
        .unwrap_or_default()
}

#[test]
fn a_gang_is_placed_whole_in_one_action_on_distinct_nodes_and_counts_every_gpu() {
    let mut sim = team_on(3, 2, 6);
    let id = sim.submit(gang("team", "ddp", 1, 3, 2));
    let plan = sim.round();
    let places: Vec<&PlanAction> = plan
        .actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                PlanAction::Place { .. } | PlanAction::PlaceMembers { .. }
            )
        })
        .collect();
    assert_eq!(places.len(), 1, "one action places every member: {plan:?}");
    let PlanAction::PlaceMembers { members, .. } = places[0] else {
        panic!("a gang is placed with PlaceMembers: {places:?}");
    };
    assert_eq!(members.len(), 3);
    let mut nodes = sim.nodes_of(id);
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "three distinct nodes");
    assert_eq!(
        sim.account("team").0,
        6,
        "3 nodes x 2 GPUs count against the share"
    );
    assert_eq!(sim.state.job(id).unwrap().history[0].nodes.len(), 3);
}

#[test]
fn a_gang_waits_whole_while_capacity_is_short_and_nothing_of_it_starts() {
    let mut sim = team_on(3, 1, 3);
    sim.ok(Command::CreateShare(share("other", Strategy::Lend, 2)));
    let small = sim.submit(job("other", "small", 5, 1));
    let small2 = sim.submit(job("other", "small2", 5, 1));
    sim.settle();
    let big = sim.submit(gang("team", "ddp", 1, 2, 1));
    sim.settle();
    assert_eq!(sim.state_of(big), JobState::Runnable);
    assert!(sim.state.job(big).unwrap().placement.is_empty());
    assert_eq!(sim.account("team").0, 0);
    let why = reason(&sim, big);
    assert!(
        why.starts_with("needs 2 nodes with 1 free a10g each; 1 qualify"),
        "{why}"
    );
    // One of the small jobs ends: now two nodes are free and the gang starts whole.
    sim.finish(small, 0);
    sim.settle();
    assert_eq!(sim.state_of(big), JobState::Running);
    assert_eq!(sim.state_of(small2), JobState::Running);
}

#[test]
fn a_gang_larger_than_the_fleet_says_so() {
    let mut sim = team_on(2, 4, 64);
    let id = sim.submit(gang("team", "huge", 1, 3, 4));
    sim.settle();
    let why = reason(&sim, id);
    assert!(
        why.contains("asks for 3 nodes with 4 a10g GPUs each, but only 2"),
        "{why}"
    );
}

#[test]
fn apply_takes_all_members_or_none() {
    let mut sim = team_on(2, 1, 4);
    let id = sim.submit(gang("team", "ddp", 1, 2, 1));
    let plan = quotient_core::plan(&sim.state);
    // Before the plan commits, another job takes node-1's GPU.
    let other = sim.submit(job("team", "other", 9, 1));
    let node1 = sim.state.node_by_name("node-1").unwrap().id;
    let take = quotient_core::Plan {
        actions: vec![PlanAction::Place {
            job: other,
            node: node1,
            gpu_mask: 1,
        }],
        waiting: Vec::new(),
    };
    sim.ok(Command::ApplyPlan(take));
    refused(&mut sim, plan.actions);
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Runnable);
    assert!(job.placement.is_empty(), "no member was placed");
    // A plan naming fewer members than the job's nodes, or one node twice, is refused too.
    let node0 = sim.state.node_by_name("node-0").unwrap().id;
    for members in [vec![(node0, 1)], vec![(node0, 1), (node0, 1)]] {
        refused(
            &mut sim,
            vec![PlanAction::PlaceMembers { job: id, members }],
        );
        assert!(sim.state.job(id).unwrap().placement.is_empty());
    }
}

#[test]
fn a_gang_runs_once_every_member_runs_and_succeeds_once_every_member_exits_zero() {
    let mut sim = team_on(2, 1, 2);
    let id = sim.submit(gang("team", "ddp", 1, 2, 1));
    sim.round();
    sim.report_member(id, 0, JobEvent::Started);
    assert_eq!(sim.state_of(id), JobState::Starting);
    sim.report_member(id, 0, JobEvent::Running);
    assert_eq!(
        sim.state_of(id),
        JobState::Starting,
        "rank 1 does not run yet"
    );
    sim.report_member(id, 1, JobEvent::Started);
    sim.report_member(id, 1, JobEvent::Running);
    assert_eq!(sim.state_of(id), JobState::Running);
    sim.report_member(id, 1, JobEvent::Exited { code: 0 });
    assert_eq!(sim.state_of(id), JobState::Running, "rank 0 still runs");
    assert_eq!(
        sim.account("team").0,
        2,
        "its GPUs stay held until all exit"
    );
    sim.report_member(id, 0, JobEvent::Exited { code: 0 });
    assert_eq!(sim.state_of(id), JobState::Succeeded);
    assert_eq!(sim.account("team").0, 0);
}

#[test]
fn a_member_that_fails_stops_the_whole_attempt_and_the_job_fails_when_all_have_exited() {
    let mut sim = team_on(3, 1, 3);
    let id = sim.submit(gang("team", "ddp", 1, 3, 1));
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    sim.report_member(id, 1, JobEvent::Exited { code: 3 });
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Preempting, "the others are stopped");
    assert!(matches!(
        job.stop.as_deref(),
        Some(StopCause::MemberEnded { rank: 1, .. })
    ));
    assert_eq!(sim.account("team").0, 3, "held until every member exited");
    sim.report_member(id, 0, JobEvent::ExitedAfterSignal { code: Some(143) });
    assert_eq!(sim.state_of(id), JobState::Preempting);
    let failed_node = sim.nodes_of(id)[1].clone();
    sim.report_member(id, 2, JobEvent::ExitedAfterSignal { code: Some(143) });
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.exit_code, Some(3));
    assert!(job.placement.is_empty());
    assert_eq!(sim.account("team").0, 0);
    // The events of the member's end (the job told to stop, then failed once all have
    // exited) name its node, not the first member's.
    let nodes: Vec<Option<String>> = sim
        .state
        .events(&quotient_core::events::EventFilter::default(), usize::MAX)
        .0
        .iter()
        .filter_map(|event| match &event.what {
            quotient_common::event::EventKind::JobState { job, to, node, .. }
                if *job == id && matches!(to, JobState::Preempting | JobState::Failed) =>
            {
                Some(node.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(nodes, vec![Some(failed_node.clone()), Some(failed_node)]);
}

#[test]
fn a_failed_member_uses_the_jobs_retry_strategy() {
    let mut sim = team_on(2, 1, 2);
    let mut spec = gang("team", "ddp", 1, 2, 1);
    spec.retry.retries = 1;
    let id = sim.submit(spec);
    sim.settle();
    sim.report_member(id, 0, JobEvent::Exited { code: 1 });
    sim.agents_stop();
    assert_eq!(sim.state_of(id), JobState::Runnable, "retried");
    assert_eq!(sim.state.job(id).unwrap().retries_used, 1);
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    assert_eq!(sim.state.job(id).unwrap().attempts, 2);
}

#[test]
fn a_lost_node_stops_the_gang_and_requeues_it_and_no_two_attempts_overlap() {
    let mut sim = team_on(3, 1, 2);
    let id = sim.submit(gang("team", "ddp", 1, 2, 1));
    sim.settle();
    let nodes = sim.nodes_of(id);
    sim.ok(Command::MarkNodeLost {
        node: nodes[1].clone(),
    });
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Preempting);
    assert_eq!(job.placement[1].stage, MemberStage::Exited { code: None });
    // While rank 0 still runs, no new attempt is placed anywhere.
    let plan = sim.round();
    assert!(plan.placements().all(|(job, _, _)| job != id), "{plan:?}");
    sim.report_member(id, 0, JobEvent::ExitedAfterSignal { code: Some(0) });
    let job = sim.state.job(id).unwrap();
    assert_eq!(
        job.state,
        JobState::Runnable,
        "not the job's fault: requeued"
    );
    assert_eq!(job.counted_preemptions, 0);
    assert_eq!(
        job.last_preemption.as_ref().map(|p| p.kind),
        Some(PreemptionKind::NodeLost)
    );
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    assert!(
        !sim.nodes_of(id).contains(&nodes[1]),
        "not on the lost node"
    );
}

/// A member that exited 0 waits for the others; losing its node afterwards, or its node
/// registering again without its GPU, changes nothing: the member still running is not
/// stopped and the job is not run again (found by probing: the healthy member was killed and
/// the whole job rerun).
#[test]
fn a_member_that_succeeded_loses_nothing_with_its_node() {
    for lost in [true, false] {
        let mut sim = team_on(3, 1, 2);
        let id = sim.submit(gang("team", "ddp", 1, 2, 1));
        sim.settle();
        assert_eq!(sim.state_of(id), JobState::Running);
        sim.report_member(id, 1, JobEvent::Exited { code: 0 });
        let name = sim.nodes_of(id)[1].clone();
        if lost {
            sim.ok(Command::MarkNodeLost { node: name });
        } else {
            let mut without = node(&name, 1, "a10g");
            without.gpus.clear();
            sim.ok(Command::RegisterNode(without));
        }
        let job = sim.state.job(id).unwrap();
        assert_eq!(job.state, JobState::Running, "lost {lost}: {job:?}");
        assert!(job.stop.is_none(), "lost {lost}");
        sim.report_member(id, 0, JobEvent::Exited { code: 0 });
        assert_eq!(sim.state_of(id), JobState::Succeeded, "lost {lost}");
        assert_eq!(sim.state.job(id).unwrap().attempts, 1);
    }
}

#[test]
fn a_gang_that_never_starts_on_every_member_is_stopped_and_requeued() {
    let mut sim = team_on(2, 1, 2);
    let id = sim.submit(gang("team", "ddp", 1, 2, 1));
    sim.round();
    sim.report_member(id, 0, JobEvent::Started);
    sim.report_member(id, 0, JobEvent::Running);
    sim.ok(Command::StopUnstarted {
        job: id,
        attempt: 1,
    });
    assert_eq!(sim.state_of(id), JobState::Preempting);
    sim.agents_stop();
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Runnable);
    assert_eq!(
        job.last_preemption.as_ref().map(|p| p.kind),
        Some(PreemptionKind::StartTimeout)
    );
    // A running gang is not stopped so.
    sim.settle();
    assert!(sim
        .apply(Command::StopUnstarted {
            job: id,
            attempt: 2
        })
        .is_rejected());
}

#[test]
fn reclaim_preempts_a_borrowing_gang_as_one_victim_and_frees_its_gpus_when_all_stopped() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 2);
    let mut borrower = share("borrower", Strategy::LendAndBorrow, 1);
    borrower.borrow_limit_percent = Some(400);
    sim.ok(Command::CreateShare(borrower));
    sim.ok(Command::CreateShare(share("lender", Strategy::Lend, 3)));
    let ddp = sim.submit(gang("borrower", "ddp", 1, 2, 2));
    sim.settle();
    assert_eq!(sim.state_of(ddp), JobState::Running);
    assert_eq!(sim.account("borrower"), (4, 3, 0));
    let own = sim.submit(job("lender", "own", 1, 1));
    let plan = sim.round();
    let preempted: Vec<_> = plan.preemptions().collect();
    assert_eq!(
        preempted,
        vec![(ddp, PreemptionKind::Reclaim, Some(own))],
        "the gang is one victim"
    );
    // Every member gets the stop; the GPUs are freed only when both exited.
    sim.report_member(ddp, 0, JobEvent::ExitedAfterSignal { code: Some(0) });
    sim.round();
    assert_eq!(sim.state_of(own), JobState::Runnable);
    sim.report_member(ddp, 1, JobEvent::ExitedAfterSignal { code: Some(0) });
    sim.round();
    assert_eq!(sim.state_of(own), JobState::Scheduled);
    assert_eq!(sim.state_of(ddp), JobState::Runnable);
}

#[test]
fn victims_for_a_gang_free_whole_nodes_not_scattered_gpus() {
    // Four nodes of 2 GPUs, each holding two borrowed 1-GPU jobs; the oldest are on nodes 0
    // and 1 ... but taking one job from each node frees 4 GPUs uselessly for a gang of 2
    // nodes x 2. The victims must be both jobs of two nodes.
    let mut sim = Sim::new();
    fleet(&mut sim, 4, 2);
    let mut borrower = share("borrower", Strategy::LendAndBorrow, 1);
    borrower.borrow_limit_percent = Some(1000);
    sim.ok(Command::CreateShare(borrower));
    sim.ok(Command::CreateShare(share("lender", Strategy::Lend, 7)));
    let mut small = Vec::new();
    for i in 0..8 {
        small.push(sim.submit(job("borrower", &format!("s{i}"), 1, 1)));
    }
    sim.settle();
    assert!(small.iter().all(|j| sim.state_of(*j) == JobState::Running));
    let ddp = sim.submit(gang("lender", "ddp", 5, 2, 2));
    let plan = sim.round();
    let victims: Vec<JobId> = plan.preemptions().map(|(job, _, _)| job).collect();
    assert_eq!(victims.len(), 4, "{plan:?}");
    let mut victim_nodes: Vec<String> = victims.iter().flat_map(|v| sim.nodes_of(*v)).collect();
    victim_nodes.sort();
    victim_nodes.dedup();
    assert_eq!(victim_nodes.len(), 2, "two whole nodes: {victim_nodes:?}");
    sim.agents_stop();
    sim.round();
    assert_eq!(sim.state_of(ddp), JobState::Scheduled);
    let mut nodes = sim.nodes_of(ddp);
    nodes.sort();
    assert_eq!(nodes, victim_nodes);
}

#[test]
fn in_share_preemption_stops_a_lower_priority_gang_whole() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 1);
    let mut team = share("team", Strategy::Lend, 2);
    team.in_share_preemption = true;
    sim.ok(Command::CreateShare(team));
    let low = sim.submit(gang("team", "low", 1, 2, 1));
    sim.settle();
    let high = sim.submit(job("team", "high", 9, 1));
    let plan = sim.round();
    assert_eq!(
        plan.preemptions().collect::<Vec<_>>(),
        vec![(low, PreemptionKind::InShare, Some(high))]
    );
    sim.agents_stop();
    sim.settle();
    assert_eq!(sim.state_of(high), JobState::Running);
    assert_eq!(
        sim.state_of(low),
        JobState::Runnable,
        "it waits for two nodes"
    );
}

#[test]
fn a_head_gang_holds_nodes_so_a_stream_of_small_jobs_cannot_starve_it() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 2);
    sim.ok(Command::CreateShare(share("big", Strategy::Lend, 4)));
    let mut small_share = share("small", Strategy::Lend, 4);
    small_share.borrow_limit_percent = None;
    sim.ok(Command::CreateShare(small_share));
    // The small share fills the fleet within its own limit: nothing to reclaim.
    let mut running = Vec::new();
    for i in 0..4 {
        running.push(sim.submit(job("small", &format!("s{i}"), 1, 1)));
    }
    sim.settle();
    let ddp = sim.submit(gang("big", "ddp", 1, 2, 2));
    sim.settle();
    let why = reason(&sim, ddp);
    assert!(why.contains("held for it"), "{why}");
    // Jobs end one by one, and a new small job is submitted each time: it never takes a GPU
    // the gang's nodes keep for it.
    for (next, id) in running.into_iter().enumerate() {
        sim.finish(id, 0);
        sim.submit(job("small", &format!("n{next}"), 9, 1));
        sim.settle();
    }
    assert_eq!(
        sim.state_of(ddp),
        JobState::Running,
        "{}",
        reason(&sim, ddp)
    );
}

/// A gang holds nodes only while it heads its queue: a job of its share of higher priority
/// that arrives meanwhile takes its place, and runs on the GPUs the gang was keeping (found by
/// probing: it waited, with no reason, for as long as the gang did).
#[test]
fn a_gang_gives_up_its_nodes_to_a_job_of_its_share_of_higher_priority() {
    let mut sim = Sim::new();
    fleet(&mut sim, 4, 2);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 6)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 3)));
    let b2 = sim.submit(job("b", "b2", 1, 2));
    let b1 = sim.submit(job("b", "b1", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(b2), JobState::Running);
    assert_eq!(sim.state_of(b1), JobState::Running);
    let big = sim.submit(gang("a", "big", 1, 3, 2));
    sim.settle();
    assert_eq!(sim.state_of(big), JobState::Runnable);
    assert!(
        !sim.state.job(big).unwrap().nominations.is_empty(),
        "it holds nodes as they drain"
    );
    let urgent = sim.submit(job("a", "urgent", 5, 1));
    sim.settle();
    assert_eq!(
        sim.state_of(urgent),
        JobState::Running,
        "{:?}",
        reason(&sim, urgent)
    );
    assert_eq!(sim.state_of(big), JobState::Runnable);
}

#[test]
fn a_gang_goes_to_the_fewest_racks_that_fit_it() {
    let mut sim = Sim::new();
    for (name, rack) in [
        ("a-1", "r1"),
        ("a-2", "r1"),
        ("b-1", "r2"),
        ("b-2", "r2"),
        ("b-3", "r2"),
    ] {
        sim.ok(Command::RegisterNode(racked(name, 1, rack)));
    }
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 5)));
    let three = sim.submit(gang("team", "three", 1, 3, 1));
    sim.round();
    let mut nodes = sim.nodes_of(three);
    nodes.sort();
    assert_eq!(nodes, vec!["b-1", "b-2", "b-3"], "rack r2 alone fits it");
    let two = sim.submit(gang("team", "two", 1, 2, 1));
    sim.round();
    let mut nodes = sim.nodes_of(two);
    nodes.sort();
    assert_eq!(nodes, vec!["a-1", "a-2"]);
}

#[test]
fn same_rack_is_a_hard_constraint() {
    let mut sim = Sim::new();
    for (name, rack) in [("a-1", "r1"), ("a-2", "r1"), ("b-1", "r2")] {
        sim.ok(Command::RegisterNode(racked(name, 1, rack)));
    }
    sim.ok(Command::RegisterNode(node("loose", 1, "a10g")));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 4)));
    let mut spec = gang("team", "three", 1, 3, 1);
    spec.same = Some("rack".into());
    let three = sim.submit(spec);
    sim.settle();
    assert_eq!(
        sim.state_of(three),
        JobState::Runnable,
        "no rack has 3 nodes"
    );
    // It says that it can never fit, not that it waits for capacity (found by probing).
    let why = reason(&sim, three);
    assert!(
        why.contains("sharing one rack, but no value of rack has more than 2"),
        "{why}"
    );
    let mut spec = gang("team", "zoned", 1, 2, 1);
    spec.same = Some("zone".into());
    let zoned = sim.submit(spec);
    sim.settle();
    let why = reason(&sim, zoned);
    assert!(why.contains("has the label zone"), "{why}");
    sim.apply(Command::CancelJob { job: zoned });
    // It can never start as the fleet stands, so it does not hold up the jobs behind it
    // (found by probing: the queue stood still behind it with every GPU free).
    let mut spec = gang("team", "two", 1, 2, 1);
    spec.same = Some("rack".into());
    let two = sim.submit(spec);
    sim.settle();
    let mut nodes = sim.nodes_of(two);
    nodes.sort();
    assert_eq!(nodes, vec!["a-1", "a-2"]);
    assert_eq!(sim.state_of(three), JobState::Runnable);
    sim.apply(Command::CancelJob { job: three });
    // Apply refuses members that do not share the label.
    let loose = sim.state.node_by_name("loose").unwrap().id;
    let b1 = sim.state.node_by_name("b-1").unwrap().id;
    let mut spec = gang("team", "mixed", 1, 2, 1);
    spec.same = Some("rack".into());
    let mixed = sim.submit(spec);
    refused(
        &mut sim,
        vec![PlanAction::PlaceMembers {
            job: mixed,
            members: vec![(b1, 1), (loose, 1)],
        }],
    );
}

#[test]
fn a_member_of_several_gpus_gets_nvlink_peers() {
    let mut sim = Sim::new();
    let mut inventory = node("nv", 4, "a10g");
    // GPUs 0-2 and 1-3 are NVLink pairs.
    for gpu in &mut inventory.gpus {
        gpu.nvlink_peers = match gpu.index {
            0 => 0b0100,
            2 => 0b0001,
            1 => 0b1000,
            _ => 0b0010,
        };
    }
    sim.ok(Command::RegisterNode(inventory));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 4)));
    let id = sim.submit(job("team", "pair", 1, 2));
    sim.round();
    let alloc = *sim.state.job(id).unwrap().allocation().unwrap();
    assert_eq!(alloc.gpu_indices(), vec![0, 2]);
}

#[test]
fn a_report_from_a_node_of_no_member_is_stale() {
    let mut sim = team_on(3, 1, 2);
    let id = sim.submit(gang("team", "ddp", 1, 2, 1));
    sim.round();
    let nodes = sim.nodes_of(id);
    let stranger = (0..3)
        .map(|i| format!("node-{i}"))
        .find(|n| !nodes.contains(n))
        .unwrap();
    let outcome = sim.apply(Command::ReportJob(JobReport {
        job: id,
        attempt: 1,
        node: stranger,
        event: JobEvent::Running,
    }));
    assert!(outcome.is_rejected());
    // A member that exited reports again: stale, nothing changes.
    sim.report_member(id, 0, JobEvent::Exited { code: 0 });
    let again = sim.apply(Command::ReportJob(JobReport {
        job: id,
        attempt: 1,
        node: nodes[0].clone(),
        event: JobEvent::Exited { code: 1 },
    }));
    assert!(again.is_rejected());
    assert_ne!(sim.state_of(id), JobState::Preempting);
}

/// A gang held back only by its share's limit, with whole nodes free for it elsewhere, still
/// preempts its share's lower-priority jobs: enough of them to bring it within the limit,
/// wherever they run, and it is nominated to the free nodes.
#[test]
fn in_share_preemption_frees_quota_for_a_gang_that_has_room_elsewhere() {
    let mut sim = Sim::new();
    fleet(&mut sim, 4, 2);
    let mut team = share("team", Strategy::Lend, 4);
    team.in_share_preemption = true;
    sim.ok(Command::CreateShare(team));
    let low = sim.submit(gang("team", "low", 1, 2, 2));
    sim.settle();
    assert_eq!(sim.state_of(low), JobState::Running);
    // Two nodes are free, but the share is at its limit of 4.
    let high = sim.submit(gang("team", "high", 9, 2, 2));
    let plan = sim.round();
    assert_eq!(
        plan.preemptions().collect::<Vec<_>>(),
        vec![(low, PreemptionKind::InShare, Some(high))],
        "{}",
        reason(&sim, high)
    );
    sim.agents_stop();
    sim.settle();
    assert_eq!(sim.state_of(high), JobState::Running);
}

#[test]
fn in_share_preemption_frees_quota_for_a_gang_from_jobs_on_nodes_it_cannot_use() {
    // Two nodes of 4 GPUs are free, but the share's lower-priority jobs run on nodes of one
    // GPU, which a gang of 4 GPUs a node cannot use. Their GPUs still count against the
    // share's limit, so stopping them is what lets the gang start.
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 4);
    for i in 0..2 {
        sim.ok(Command::RegisterNode(node(
            &format!("small-{i}"),
            1,
            "a10g",
        )));
    }
    let mut team = share("team", Strategy::Lend, 8);
    team.in_share_preemption = true;
    sim.ok(Command::CreateShare(team));
    let lows: Vec<JobId> = (0..2)
        .map(|i| sim.submit(job("team", &format!("low-{i}"), 1, 1)))
        .collect();
    sim.settle();
    for low in &lows {
        assert_eq!(sim.state_of(*low), JobState::Running);
        assert!(sim.nodes_of(*low)[0].starts_with("small-"), "best fit");
    }
    // 2 of the limit's 8 GPUs are held: the gang of 8 is 2 over it.
    let high = sim.submit(gang("team", "high", 9, 2, 4));
    let plan = sim.round();
    let mut preempted: Vec<_> = plan.preemptions().collect();
    preempted.sort();
    assert_eq!(
        preempted,
        lows.iter()
            .map(|low| (*low, PreemptionKind::InShare, Some(high)))
            .collect::<Vec<_>>(),
        "{}",
        reason(&sim, high)
    );
    sim.agents_stop();
    sim.settle();
    assert_eq!(sim.state_of(high), JobState::Running);
    let mut nodes = sim.nodes_of(high);
    nodes.sort();
    assert_eq!(nodes, vec!["node-0", "node-1"]);
}

#[test]
fn a_job_of_one_node_bound_to_a_label_runs_only_where_it_is_and_says_so_when_none_has_it() {
    let mut sim = Sim::new();
    sim.ok(Command::RegisterNode(node("loose", 2, "a10g")));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 4)));
    let mut spec = job("team", "ranked", 0, 1);
    spec.same = Some("rack".into());
    let ranked = sim.submit(spec);
    let behind = sim.submit(job("team", "behind", 0, 1));
    sim.settle();
    // No node has the label: it waits saying so, and the job behind it runs (found by
    // probing: the plan put it on the unlabelled node, `apply` refused that every round, and
    // it waited with no reason, the queue behind it held up).
    assert_eq!(sim.state_of(ranked), JobState::Runnable);
    let why = reason(&sim, ranked);
    assert!(why.contains("has no label rack"), "{why}");
    assert_eq!(sim.state_of(behind), JobState::Running);
    // A node with the label comes: it runs there.
    sim.ok(Command::RegisterNode(racked("in-rack", 1, "r1")));
    sim.settle();
    assert_eq!(sim.state_of(ranked), JobState::Running);
    assert_eq!(sim.nodes_of(ranked), vec!["in-rack"]);
}
