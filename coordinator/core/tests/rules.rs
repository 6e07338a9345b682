//! One test per rule of docs/quota-shares.md, named after the rule.

mod support;

use quotient_common::{JobEvent, JobState, NodeState, ShareState, ShareUpdate, Strategy};
use quotient_core::limits::QUEUE_HEAD_SCAN_MAX;
use quotient_core::{
    explain, plan, Command, Outcome, Plan, PlanAction, PreemptionKind, Rejection, WaitReason,
    WaitReasons,
};
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

fn share_with_in_share(name: &str, limit: u32) -> quotient_common::ShareSpec {
    let mut s = share(name, Strategy::Lend, limit);
    s.in_share_preemption = true;
    s
}

fn lab(name: &str, limit: u32, borrow: Option<u32>, in_share: bool) -> quotient_common::ShareSpec {
    let mut s = share(name, Strategy::LendAndBorrow, limit);
    s.borrow_limit_percent = borrow;
    s.in_share_preemption = in_share;
    s
}

/// Shares below their limit are served before shares that would borrow, whatever the priority.
#[test]
fn shares_below_their_limit_go_first() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 2);
    sim.ok(Command::CreateShare(lab("a", 1, None, false)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 1)));
    let a1 = sim.submit(job("a", "a1", 1, 1));
    let a2 = sim.submit(job("a", "a2", 9000, 1));
    let b1 = sim.submit(job("b", "b1", 1, 1));
    sim.settle();
    // a2 (highest priority) runs within a's limit, b1 within b's; a1 would borrow but nothing is idle.
    assert_eq!(sim.state_of(a2), JobState::Running);
    assert_eq!(sim.state_of(b1), JobState::Running);
    assert_eq!(sim.state_of(a1), JobState::Runnable);
}

/// Ties break by priority descending, then submit order ascending.
#[test]
fn ties_break_by_priority_then_submit_order() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 2);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let first = sim.submit(job("a", "first", 5, 1));
    let low = sim.submit(job("a", "low", 1, 1));
    let second = sim.submit(job("a", "second", 5, 1));
    sim.settle();
    assert_eq!(sim.state_of(first), JobState::Running);
    assert_eq!(sim.state_of(second), JobState::Running);
    assert_eq!(sim.state_of(low), JobState::Runnable);
}

/// A reserve share never lends its idle quota.
#[test]
fn a_reserve_share_never_lends() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 1);
    sim.ok(Command::CreateShare(lab("borrower", 1, None, false)));
    sim.ok(Command::CreateShare(share(
        "reserved",
        Strategy::Reserve,
        1,
    )));
    let a = sim.submit(job("borrower", "a", 1, 1));
    let b = sim.submit(job("borrower", "b", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(a), JobState::Running);
    assert_eq!(sim.state_of(b), JobState::Runnable);
    assert!(matches!(
        sim.state.job(b).unwrap().reason.as_deref(),
        Some(WaitReason::NoBorrowableCapacity { .. })
    ));
    // The reserve share's own job starts at once on its idle quota.
    let r = sim.submit(job("reserved", "r", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(r), JobState::Running);
}

/// A lend share never borrows, even when GPUs are idle.
#[test]
fn a_lend_share_never_borrows() {
    let mut sim = Sim::new();
    fleet(&mut sim, 3, 1);
    sim.ok(Command::CreateShare(share("lender", Strategy::Lend, 1)));
    let a = sim.submit(job("lender", "a", 1, 1));
    let b = sim.submit(job("lender", "b", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(a), JobState::Running);
    assert_eq!(sim.state_of(b), JobState::Runnable);
    assert!(matches!(
        sim.state.job(b).unwrap().reason.as_deref(),
        Some(WaitReason::ShareLimit { .. })
    ));
}

/// Borrowing stays within borrow_limit_percent of the share's own limit.
#[test]
fn borrowing_stays_within_the_borrow_limit() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 8);
    sim.ok(Command::CreateShare(lab("a", 2, Some(50), false)));
    let jobs: Vec<_> = (0..5)
        .map(|i| sim.submit(job("a", &format!("j{i}"), 1, 1)))
        .collect();
    sim.settle();
    let running = jobs
        .iter()
        .filter(|j| sim.state_of(**j) == JobState::Running)
        .count();
    assert_eq!(running, 3, "limit 2 plus 50% = 3");
    let waiting = jobs
        .iter()
        .find(|j| sim.state_of(**j) == JobState::Runnable)
        .unwrap();
    assert!(matches!(
        sim.state.job(*waiting).unwrap().reason.as_deref(),
        Some(WaitReason::BorrowLimit { cap: 3, .. })
    ));
}

/// Borrowing uses the free pool (GPUs beyond all limits) and lent idle quota.
#[test]
fn borrowing_uses_the_free_pool_and_lent_quota() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 4);
    sim.ok(Command::CreateShare(lab("a", 1, None, false)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 1)));
    let jobs: Vec<_> = (0..4)
        .map(|i| sim.submit(job("a", &format!("j{i}"), 1, 1)))
        .collect();
    sim.settle();
    assert!(jobs.iter().all(|j| sim.state_of(*j) == JobState::Running));
    assert_eq!(sim.account("a"), (4, 3, 0));
    assert_eq!(
        sim.account("b"),
        (0, 0, 1),
        "one from b, two from the free pool"
    );
}

/// Cross-share reclaim takes only borrowed jobs, never a job within its share's quota.
#[test]
fn reclaim_takes_only_borrowed_jobs() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 1);
    sim.ok(Command::CreateShare(lab("a", 1, None, false)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 1)));
    let within = sim.submit(job("a", "within", 1, 1));
    let borrowed = sim.submit(job("a", "borrowed", 9000, 1));
    sim.settle();
    // Ranked by priority, "borrowed" (9000) is within the limit and "within" (1) is borrowed.
    assert!(sim.state.is_borrowed(sim.state.job(within).unwrap()));
    assert!(!sim.state.is_borrowed(sim.state.job(borrowed).unwrap()));
    let b = sim.submit(job("b", "b", 1, 1));
    let plan = sim.round();
    let victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    assert_eq!(victims, vec![within]);
    sim.settle();
    assert_eq!(sim.state_of(b), JobState::Running);
    assert_eq!(sim.state_of(borrowed), JobState::Running);
}

/// Reclaim victims: lowest priority first, then least work lost, no more than needed.
#[test]
fn reclaim_takes_the_lowest_priority_borrowed_job_and_no_more_than_needed() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 4);
    sim.ok(Command::CreateShare(lab("a", 1, None, false)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 3)));
    let keep = sim.submit(job("a", "keep", 50, 1));
    let p3_old = sim.submit(job("a", "p3-old", 3, 1));
    sim.settle();
    let p3_new = sim.submit(job("a", "p3-new", 3, 1));
    let p5 = sim.submit(job("a", "p5", 5, 1));
    sim.settle();
    assert_eq!(sim.account("a"), (4, 3, 0));
    let b = sim.submit(job("b", "b", 1, 1));
    let plan = sim.round();
    let victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    assert_eq!(
        victims,
        vec![p3_new],
        "lowest priority, most recently started, one job only"
    );
    sim.settle();
    assert_eq!(sim.state_of(b), JobState::Running);
    for j in [keep, p3_old, p5] {
        assert_eq!(sim.state_of(j), JobState::Running);
    }
}

/// The victim set frees enough GPUs on one node, and is minimal there.
#[test]
fn reclaim_victims_sit_on_one_node() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 2);
    sim.ok(Command::CreateShare(lab("a", 1, None, false)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 2)));
    let a: Vec<_> = (0..4)
        .map(|i| sim.submit(job("a", &format!("a{i}"), 1 + i, 1)))
        .collect();
    sim.settle();
    assert!(a.iter().all(|j| sim.state_of(*j) == JobState::Running));
    let b = sim.submit(job("b", "b", 1, 2));
    let plan = sim.round();
    let victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    assert_eq!(victims.len(), 2);
    let nodes: std::collections::BTreeSet<_> = victims
        .iter()
        .map(|v| {
            sim.state
                .job(*v)
                .unwrap()
                .allocation()
                .copied()
                .unwrap()
                .node
        })
        .collect();
    assert_eq!(nodes.len(), 1, "both victims on one node");
    assert!(
        !victims.contains(&a[3]),
        "the highest-priority job is within the limit"
    );
    sim.settle();
    assert_eq!(sim.state_of(b), JobState::Running);
}

/// Among borrowed jobs of the lowest priority, the victim is the one that loses the least
/// work: time since its last checkpoint (or its start) times its GPUs, not merely the most
/// recently started. The same order holds for in-share victims.
#[test]
fn victims_of_equal_priority_are_those_that_lose_the_least_work() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 3);
    sim.ok(Command::CreateShare(lab("a", 1, None, true)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 2)));
    let a: Vec<_> = (0..3)
        .map(|i| sim.submit(job("a", &format!("a{i}"), 1, 1)))
        .collect();
    sim.settle();
    assert!(a.iter().all(|j| sim.state_of(*j) == JobState::Running));
    // a0 is within the limit; a1 and a2 borrow. a1 checkpoints after a2 started, so a2
    // would lose more: 10 ms of work against a1's few.
    sim.report(a[1], JobEvent::Checkpointed);
    let b = sim.submit(job("b", "b", 1, 1));
    let plan = sim.round();
    let victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    assert_eq!(
        victims,
        vec![a[1]],
        "the borrowed job that checkpointed last"
    );
    let why = explain(&sim.state, a[1]).unwrap().details.join("\n");
    assert!(
        why.contains("losing the least work") && why.contains("since its last checkpoint"),
        "{why}"
    );
    let running = explain(&sim.state, a[2]).unwrap().details.join("\n");
    assert!(
        running.contains("a preemption now would lose") && running.contains("no checkpoint"),
        "{running}"
    );
    sim.settle();
    assert_eq!(sim.state_of(b), JobState::Running);
    assert_eq!(sim.state_of(a[1]), JobState::Runnable);

    // In-share: a high-priority job of a preempts, of a0 and a2 (priority 1), the one that
    // checkpointed last, though a2 started later.
    sim.report(a[0], JobEvent::Checkpointed);
    let urgent = sim.submit(job("a", "urgent", 9, 1));
    let plan = sim.round();
    let victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    assert_eq!(victims, vec![a[0]], "the job that checkpointed last");
    sim.settle();
    assert_eq!(sim.state_of(urgent), JobState::Running);
}

/// Among nodes that victims of the lowest priority could clear, the one whose victims lose the
/// least work in all (work at risk x their GPUs) is taken, not merely the node reached first
/// in victim order: a 4-GPU job a little younger than a 1-GPU one would lose four times as
/// much for a preemptor that needs one GPU.
#[test]
fn the_node_whose_victims_lose_least_in_all_is_taken() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 4);
    sim.ok(Command::CreateShare(share_with_in_share("a", 8)));
    let old = sim.submit(job("a", "old-1-gpu", 1, 1));
    let busy = sim.submit(job("a", "busy-3-gpus", 5, 3));
    sim.settle();
    let young = sim.submit(job("a", "young-4-gpus", 1, 4));
    sim.settle();
    for id in [old, busy, young] {
        assert_eq!(sim.state_of(id), JobState::Running);
    }
    assert_eq!(sim.nodes_of(old), sim.nodes_of(busy), "packed on one node");
    assert_ne!(sim.nodes_of(old), sim.nodes_of(young));
    // Both priority-1 jobs have run about a second: per GPU the young one risks less, but
    // stopping it loses 4 GPU-seconds against the old one's 1.
    sim.time_ms += 1_000;
    let urgent = sim.submit(job("a", "urgent", 9, 1));
    let plan = sim.round();
    let victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    assert_eq!(victims, vec![old], "the victim that loses least in all");
    sim.settle();
    assert_eq!(sim.state_of(urgent), JobState::Running);
    assert_eq!(sim.state_of(young), JobState::Running);
    assert_eq!(sim.state_of(busy), JobState::Running);
}

/// A reclaim that needs several borrowed jobs of one share applies whole, whatever order of
/// work at risk found them in. Here b2 checkpointed last, so it is taken first, but it ranks
/// above b3: applied first, it would leave b3 no longer borrowed (the share at its limit)
/// when b3's turn came, and the plan would be refused in part. The plan lists them lowest
/// rank first.
#[test]
fn a_reclaim_of_several_borrowed_jobs_of_one_share_applies_whole() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 8);
    sim.ok(Command::CreateShare(lab("b", 3, None, false)));
    let b: Vec<_> = [("b1", 2), ("b2", 2), ("b3", 1)]
        .into_iter()
        .map(|(name, gpus)| {
            let id = sim.submit(job("b", name, 1, gpus));
            sim.settle();
            assert_eq!(sim.state_of(id), JobState::Running);
            id
        })
        .collect();
    // b holds 5 of its limit 3: b3 and b2 are borrowed (lowest rank first, while what is
    // left is above the limit).
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 6)));
    sim.report(b[1], JobEvent::Checkpointed);
    let a = sim.submit(job("a", "a", 1, 6));
    // `round` checks that the plan applies whole.
    let plan = sim.round();
    let victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    assert_eq!(victims, vec![b[2], b[1]], "lowest rank first");
    sim.settle();
    assert_eq!(sim.state_of(a), JobState::Running);
    assert_eq!(sim.state_of(b[0]), JobState::Running);
}

/// Freed GPUs are nominated: they go to the job they were freed for, not to another.
#[test]
fn nominations_keep_freed_gpus_for_their_job() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 2);
    sim.ok(Command::CreateShare(lab("a", 1, None, false)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 1)));
    sim.ok(Command::CreateShare(lab("c", 1, None, false)));
    let a1 = sim.submit(job("a", "a1", 5, 1));
    let a2 = sim.submit(job("a", "a2", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(a2), JobState::Running, "a2 borrows");
    let b1 = sim.submit(job("b", "b1", 1, 1));
    let plan = sim.round();
    assert!(plan
        .actions
        .iter()
        .any(|a| matches!(a, PlanAction::Nominate { job, .. } if *job == b1)));
    // A higher-priority job of another share arrives while a2 is being stopped.
    let c1 = sim.submit(job("c", "c1", 9999, 1));
    sim.agents_stop();
    sim.settle();
    assert_eq!(sim.state_of(b1), JobState::Running);
    assert_eq!(sim.state_of(a1), JobState::Running);
    assert_eq!(sim.state_of(a2), JobState::Runnable);
    assert_eq!(sim.state_of(c1), JobState::Runnable);
}

/// In-share preemption happens only where the share enables it.
#[test]
fn in_share_preemption_happens_only_when_enabled() {
    for enabled in [false, true] {
        let mut sim = Sim::new();
        fleet(&mut sim, 1, 1);
        sim.ok(Command::CreateShare(lab("a", 1, Some(0), enabled)));
        let low = sim.submit(job("a", "low", 1, 1));
        sim.settle();
        let high = sim.submit(job("a", "high", 5, 1));
        sim.settle();
        if enabled {
            assert_eq!(sim.state_of(high), JobState::Running);
            assert_eq!(sim.state_of(low), JobState::Runnable);
        } else {
            assert_eq!(sim.state_of(high), JobState::Runnable);
            assert_eq!(sim.state_of(low), JobState::Running);
        }
    }
}

/// In-share, no job is preempted for a job of equal or lower priority.
#[test]
fn in_share_preemption_only_for_a_higher_priority_job() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(lab("a", 1, Some(0), true)));
    let first = sim.submit(job("a", "first", 5, 1));
    sim.settle();
    let equal = sim.submit(job("a", "equal", 5, 1));
    sim.settle();
    assert_eq!(sim.state_of(first), JobState::Running);
    assert_eq!(sim.state_of(equal), JobState::Runnable);
}

/// A priority change takes effect in the next round and can trigger in-share preemption.
#[test]
fn a_priority_update_triggers_in_share_preemption() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(lab("a", 1, Some(0), true)));
    let running = sim.submit(job("a", "running", 5, 1));
    sim.settle();
    let queued = sim.submit(job("a", "queued", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(queued), JobState::Runnable);
    sim.ok(Command::UpdateJobPriority {
        job: queued,
        priority: 6,
    });
    sim.settle();
    assert_eq!(sim.state_of(queued), JobState::Running);
    assert_eq!(sim.state_of(running), JobState::Runnable);
}

/// A job whose priority is lowered below its in-share victim's while the victim stops gives
/// up the GPUs being freed for it: the victim runs again once stopped, and the job is not
/// placed ahead of it only to be preempted at once (which, with max_preemptions 0, failed
/// it; found by probing the scheduling contract end to end).
#[test]
fn a_job_lowered_below_its_in_share_victim_gives_up_the_gpus_freed_for_it() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(lab("a", 1, Some(0), true)));
    let low = sim.submit(job("a", "low", 1, 1));
    sim.settle();
    let mut spec = job("a", "high", 5, 1);
    spec.max_preemptions = Some(0);
    let high = sim.submit(spec);
    sim.round();
    assert_eq!(sim.state_of(low), JobState::Preempting, "stopped for high");
    sim.ok(Command::UpdateJobPriority {
        job: high,
        priority: 0,
    });
    sim.settle();
    assert_eq!(sim.state_of(low), JobState::Running, "it runs again");
    assert_eq!(
        sim.state_of(high),
        JobState::Runnable,
        "it waits, not failed"
    );
    let record = sim.state.job(high).expect("high");
    assert_eq!(record.preemptions, 0, "never placed, so never preempted");
}

/// A job cancelled while it is being preempted for another stays that job's victim: its GPUs
/// are still freed for it, no second job is stopped for the same need, and it ends CANCELLED
/// without its preemption counted (found by probing: the cancel made the scheduler stop a
/// second borrowed job for a lender's job of one GPU).
#[test]
fn a_victim_cancelled_in_its_grace_period_is_not_replaced_by_another() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 3);
    sim.ok(Command::CreateShare(lab("g", 1, None, false)));
    sim.ok(Command::CreateShare(share("r", Strategy::Lend, 2)));
    let g: Vec<_> = (0..3)
        .map(|n| sim.submit(job("g", &format!("g{n}"), 1, 1)))
        .collect();
    sim.settle();
    assert!(g.iter().all(|id| sim.state_of(*id) == JobState::Running));
    let r = sim.submit(job("r", "r", 1, 1));
    sim.round();
    let stopping: Vec<_> = g
        .iter()
        .filter(|id| sim.state_of(**id) == JobState::Preempting)
        .copied()
        .collect();
    assert_eq!(stopping.len(), 1, "one borrowed job stops for r's one GPU");
    sim.ok(Command::CancelJob { job: stopping[0] });
    for _ in 0..3 {
        let plan = sim.round();
        assert!(
            !plan
                .actions
                .iter()
                .any(|action| matches!(action, PlanAction::Preempt { .. })),
            "no second job is stopped: {plan:?}"
        );
    }
    sim.settle();
    assert_eq!(sim.state_of(stopping[0]), JobState::Cancelled);
    assert_eq!(sim.state.job(stopping[0]).unwrap().counted_preemptions, 0);
    assert_eq!(sim.state_of(r), JobState::Running);
    let running = g
        .iter()
        .filter(|id| sim.state_of(**id) == JobState::Running)
        .count();
    assert_eq!(running, 2, "the other borrowed jobs run on");
}

/// max_preemptions 0 fails a job on its first preemption.
#[test]
fn max_preemptions_zero_fails_the_job_on_first_preemption() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(lab("a", 1, Some(0), true)));
    let mut spec = job("a", "fragile", 1, 1);
    spec.max_preemptions = Some(0);
    let fragile = sim.submit(spec);
    sim.settle();
    let high = sim.submit(job("a", "high", 5, 1));
    sim.settle();
    assert_eq!(sim.state_of(fragile), JobState::Failed);
    assert_eq!(sim.state_of(high), JobState::Running);
    let why = explain(&sim.state, fragile).unwrap().summary;
    assert!(why.contains("max_preemptions is 0"), "{why}");
}

/// Lowering a share's limit makes its jobs above the new limit preemptible, whatever its strategy.
#[test]
fn lowering_a_limit_makes_jobs_above_it_preemptible() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 2);
    sim.ok(Command::CreateShare(share("a", Strategy::Reserve, 2)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 1)));
    let a1 = sim.submit(job("a", "a1", 5, 1));
    let a2 = sim.submit(job("a", "a2", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(a2), JobState::Running);
    sim.ok(Command::UpdateShare {
        name: "a".into(),
        update: ShareUpdate {
            limits: Some([(class("a10g"), 1)].into()),
            ..ShareUpdate::default()
        },
    });
    let b1 = sim.submit(job("b", "b1", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(b1), JobState::Running);
    assert_eq!(sim.state_of(a2), JobState::Runnable);
    assert_eq!(sim.state_of(a1), JobState::Running);
}

/// Placement packs jobs onto partly used nodes to keep whole nodes free.
#[test]
fn placement_packs_to_keep_whole_nodes_free() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 4);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 8)));
    let small: Vec<_> = (0..3)
        .map(|i| sim.submit(job("a", &format!("s{i}"), 1, 1)))
        .collect();
    sim.settle();
    let nodes: std::collections::BTreeSet<_> = small
        .iter()
        .map(|j| {
            sim.state
                .job(*j)
                .unwrap()
                .allocation()
                .copied()
                .unwrap()
                .node
        })
        .collect();
    assert_eq!(nodes.len(), 1, "small jobs share one node");
    let big = sim.submit(job("a", "big", 1, 4));
    sim.settle();
    assert_eq!(sim.state_of(big), JobState::Running);
}

/// Only healthy GPUs of the class on schedulable nodes are used.
#[test]
fn placement_uses_only_healthy_gpus_on_schedulable_nodes() {
    let mut sim = Sim::new();
    fleet(&mut sim, 3, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 3)));
    sim.ok(Command::CordonNode {
        node: "node-1".into(),
    });
    sim.ok(Command::SetGpuHealth {
        node: "node-2".into(),
        index: 0,
        healthy: false,
    });
    let jobs: Vec<_> = (0..3)
        .map(|i| sim.submit(job("a", &format!("j{i}"), 1, 1)))
        .collect();
    sim.settle();
    let running: Vec<_> = jobs
        .iter()
        .filter(|j| sim.state_of(**j) == JobState::Running)
        .collect();
    assert_eq!(running.len(), 1);
    let node = sim
        .state
        .job(*running[0])
        .unwrap()
        .allocation()
        .copied()
        .unwrap()
        .node;
    assert_eq!(sim.state.node(node).unwrap().name, "node-3");
}

/// A job that can never fit stays RUNNABLE with a reason naming the limit, and does not block
/// the jobs behind it.
#[test]
fn a_job_that_can_never_fit_names_the_limit_it_exceeds() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 2);
    sim.ok(Command::CreateShare(lab("a", 2, Some(100), false)));
    let too_big_node = sim.submit(job("a", "big", 9, 3));
    let too_big_share = {
        let mut s = share("b", Strategy::Lend, 1);
        s.name = "b".into();
        sim.ok(Command::CreateShare(s));
        sim.submit(job("b", "b", 9, 2))
    };
    let small = sim.submit(job("a", "small", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(small), JobState::Running);
    let reason = |id| sim.state.reason(sim.state.job(id).unwrap());
    assert!(matches!(
        reason(too_big_node),
        Some(WaitReason::LargestNode { largest: 2, .. })
    ));
    assert!(matches!(
        reason(too_big_share),
        Some(WaitReason::ExceedsShareCap { cap: 1, .. })
    ));
    assert!(
        explain(&sim.state, too_big_node)
            .unwrap()
            .summary
            .contains("largest"),
        "explain names the limit"
    );
    // Such jobs cost a round nothing: with hundreds more queued, the settled state plans
    // nothing at all (no reasons to record, no entries to commit).
    for i in 0..300 {
        sim.submit(job("a", &format!("big-{i}"), 9, 3));
    }
    assert!(quotient_core::plan(&sim.state).is_empty());
    assert_eq!(sim.state_of(small), JobState::Running);
    // Jobs that fit, queued behind ones that never will, wait behind the first that fits.
    let fillers: Vec<_> = (0..5)
        .map(|i| sim.submit(job("a", &format!("fill-{i}"), 1, 1)))
        .collect();
    sim.settle();
    let waiting: Vec<_> = fillers
        .iter()
        .copied()
        .filter(|id| sim.state_of(*id) == JobState::Runnable)
        .collect();
    assert!(waiting.len() >= 2, "two fillers wait: {waiting:?}");
    let summary = explain(&sim.state, waiting[1]).unwrap().summary;
    assert!(
        summary.contains(&format!("behind {}", waiting[0])),
        "{summary}"
    );
}

/// Every job left RUNNABLE has a reason that explain can show.
#[test]
fn every_job_left_runnable_has_a_reason() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
    let jobs: Vec<_> = (0..4)
        .map(|i| sim.submit(job("a", &format!("j{i}"), 1, 1)))
        .collect();
    sim.settle();
    for j in jobs.iter().skip(1) {
        let e = explain(&sim.state, *j).unwrap();
        assert!(e.summary.contains("waits"), "{}", e.summary);
    }
    assert!(explain(&sim.state, jobs[2])
        .unwrap()
        .summary
        .contains("queued behind"));
}

/// The reason `job list` and `job get` show for a RUNNABLE job the scheduler recorded none
/// for: the job of its queue that it waits behind, the first one that can fit.
#[test]
fn a_job_behind_its_queues_head_shows_the_head_as_its_reason() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
    let never = sim.submit(job("a", "never", 9, 2));
    let jobs: Vec<_> = (0..4)
        .map(|i| sim.submit(job("a", &format!("j{i}"), 1, 1)))
        .collect();
    sim.settle();
    // One lookup of the queue's head serves a page of jobs.
    let mut reasons = WaitReasons::default();
    let state = &sim.state;
    let mut reason_of = |id| {
        reasons
            .of(state, state.job(id).unwrap())
            .map(|r| r.to_string())
    };
    let never_reason = reason_of(never).unwrap();
    assert!(
        never_reason.contains("largest schedulable node"),
        "it can never fit: {never_reason}"
    );
    assert_eq!(reason_of(jobs[0]), None, "it runs");
    // The head has the scheduler's reason; those behind it wait behind it, not behind the
    // job that can never fit.
    let head = reason_of(jobs[1]).unwrap();
    assert!(!head.contains("queued behind"), "{head}");
    for j in &jobs[2..] {
        assert_eq!(
            reason_of(*j).unwrap(),
            format!(
                "queued behind {}, which is ahead of it in its share's queue",
                jobs[1]
            )
        );
    }
}

/// A queue's head is looked for among its first `QUEUE_HEAD_SCAN_MAX` jobs only: behind more
/// jobs that can never fit, a waiting job gets no reason rather than a long search.
/// A job that was its queue's head and is no longer (a higher-priority job came, or another
/// was raised above it) says which job it waits behind, not the reason it was given as the
/// head (found by probing: the old reason stayed in `job list`, `job get` and `explain`).
#[test]
fn a_former_head_says_which_job_it_waits_behind() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 2);
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 2)));
    sim.submit(job("b", "x", 5, 2));
    sim.settle();
    let y = sim.submit(job("b", "y", 1, 1));
    sim.settle();
    let reason_of =
        |sim: &Sim, id| WaitReasons::default().of(&sim.state, sim.state.job(id).unwrap());
    assert!(
        matches!(reason_of(&sim, y), Some(WaitReason::ShareLimit { .. })),
        "{:?}",
        reason_of(&sim, y)
    );
    let z = sim.submit(job("b", "z", 3, 1));
    sim.settle();
    assert_eq!(
        reason_of(&sim, y),
        Some(WaitReason::QueuedBehind { job: z })
    );
    sim.ok(Command::UpdateJobPriority {
        job: y,
        priority: 4,
    });
    sim.settle();
    assert_eq!(
        reason_of(&sim, z),
        Some(WaitReason::QueuedBehind { job: y })
    );
    assert!(matches!(
        reason_of(&sim, y),
        Some(WaitReason::ShareLimit { .. })
    ));
}

#[test]
fn the_search_for_a_queues_head_is_bounded() {
    // A share whose one GPU is taken, `never` jobs that can never fit ahead in its queue, and
    // two that could fit behind them.
    let queue_behind = |never: usize| {
        let mut sim = Sim::new();
        fleet(&mut sim, 1, 1);
        sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
        sim.submit(job("a", "first", 1, 1));
        sim.settle();
        for i in 0..never {
            sim.submit(job("a", &format!("never-{i}"), 9, 2));
        }
        let fits = [
            sim.submit(job("a", "second", 1, 1)),
            sim.submit(job("a", "third", 1, 1)),
        ];
        (sim, fits)
    };
    let (sim, [second, third]) = queue_behind(QUEUE_HEAD_SCAN_MAX - 1);
    assert_eq!(
        sim.state.queue_head_that_fits("a", &class("a10g")),
        Some(second)
    );
    let reason = WaitReasons::default().of(&sim.state, sim.state.job(third).unwrap());
    assert_eq!(reason, Some(WaitReason::QueuedBehind { job: second }));

    let (sim, [_, third]) = queue_behind(QUEUE_HEAD_SCAN_MAX);
    assert_eq!(sim.state.queue_head_that_fits("a", &class("a10g")), None);
    let reason = WaitReasons::default().of(&sim.state, sim.state.job(third).unwrap());
    assert_eq!(reason, None, "past the bound");
    // explain says what it is behind, all the same.
    let summary = explain(&sim.state, third).unwrap().summary;
    assert!(
        summary.contains(&format!(
            "queued behind more than {QUEUE_HEAD_SCAN_MAX} jobs of its share's queue, none of which can ever fit"
        )),
        "{summary}"
    );
}

/// A preempted job that exits after its signal is requeued, not failed.
#[test]
fn exit_after_the_checkpoint_signal_is_a_preemption_not_a_failure() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(lab("a", 1, Some(0), true)));
    let low = sim.submit(job("a", "low", 1, 1));
    sim.settle();
    sim.submit(job("a", "high", 2, 1));
    sim.round();
    let attempt = sim.state.job(low).unwrap().attempts;
    sim.ok(Command::ReportJob(quotient_core::JobReport {
        job: low,
        attempt,
        node: "node-1".into(),
        event: quotient_core::JobEvent::Exited { code: 143 },
    }));
    assert_eq!(sim.state_of(low), JobState::Runnable);
    assert_eq!(sim.state.job(low).unwrap().preemptions, 1);
}

/// A node that is lost requeues its jobs with a node-lost preemption.
#[test]
fn a_lost_node_requeues_its_jobs() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let j = sim.submit(job("a", "j", 1, 1));
    sim.settle();
    let node = sim
        .state
        .job(j)
        .unwrap()
        .allocation()
        .copied()
        .unwrap()
        .node;
    let name = sim.state.node(node).unwrap().name.clone();
    sim.ok(Command::MarkNodeLost { node: name.clone() });
    assert_eq!(sim.state_of(j), JobState::Runnable);
    assert_eq!(
        sim.state
            .job(j)
            .unwrap()
            .last_preemption
            .as_ref()
            .unwrap()
            .kind,
        PreemptionKind::NodeLost
    );
    sim.settle();
    assert_eq!(sim.state_of(j), JobState::Running);
    assert_ne!(
        sim.state
            .job(j)
            .unwrap()
            .allocation()
            .copied()
            .unwrap()
            .node,
        node
    );
    assert!(matches!(
        sim.apply(Command::CordonNode { node: name }),
        Outcome::Rejected(Rejection::NodeLost(_))
    ));
}

/// Draining a node preempts its jobs and places nothing new there.
#[test]
fn draining_a_node_moves_its_jobs_off() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let j = sim.submit(job("a", "j", 1, 1));
    sim.settle();
    let node = sim
        .state
        .job(j)
        .unwrap()
        .allocation()
        .copied()
        .unwrap()
        .node;
    let name = sim.state.node(node).unwrap().name.clone();
    sim.ok(Command::DrainNode { node: name.clone() });
    sim.settle();
    assert_eq!(sim.state_of(j), JobState::Running);
    assert_ne!(
        sim.state
            .job(j)
            .unwrap()
            .allocation()
            .copied()
            .unwrap()
            .node,
        node
    );
    assert_eq!(
        sim.state.node_by_name(&name).unwrap().state,
        NodeState::Draining
    );
}

/// Cancelling a running job stops it through its agent; its GPUs stay held until it exits.
#[test]
fn cancelling_a_running_job_holds_its_gpus_until_it_exits() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
    let j = sim.submit(job("a", "j", 1, 1));
    let next = sim.submit(job("a", "next", 1, 1));
    sim.settle();
    sim.ok(Command::CancelJob { job: j });
    assert_eq!(sim.state_of(j), JobState::Preempting);
    sim.round();
    assert_eq!(
        sim.state_of(next),
        JobState::Runnable,
        "the GPU is still held"
    );
    sim.settle();
    assert_eq!(sim.state_of(j), JobState::Cancelled);
    assert_eq!(sim.state_of(next), JobState::Running);
    assert_eq!(sim.state.job(j).unwrap().preemptions, 0);
}

/// A disabled share refuses submissions; its jobs run on. Deleting needs it disabled and
/// cancels what is left.
#[test]
fn a_share_is_disabled_before_it_is_deleted() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 1);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
    let running = sim.submit(job("a", "running", 1, 1));
    let queued = sim.submit(job("a", "queued", 1, 1));
    sim.settle();
    assert_eq!(
        sim.apply(Command::DeleteShare { name: "a".into() }),
        Outcome::Rejected(Rejection::ShareEnabled("a".into()))
    );
    sim.ok(Command::DisableShare { name: "a".into() });
    assert_eq!(
        sim.state.share("a").unwrap().spec.state,
        ShareState::Disabled
    );
    assert!(matches!(
        sim.apply(Command::SubmitJob(job("a", "late", 1, 1))),
        Outcome::Rejected(Rejection::ShareDisabled(_))
    ));
    sim.settle();
    assert_eq!(sim.state_of(running), JobState::Running);
    sim.ok(Command::DeleteShare { name: "a".into() });
    assert_eq!(sim.state_of(queued), JobState::Cancelled);
    assert_eq!(sim.state_of(running), JobState::Preempting);
    // A share of the same name cannot be made while the deleted one's jobs still hold GPUs:
    // they would count against it (found by probing: a new `reserve` share shown borrowing).
    assert_eq!(
        sim.apply(Command::CreateShare(share("a", Strategy::Reserve, 1))),
        Outcome::Rejected(Rejection::ShareStillStopping {
            share: "a".into(),
            jobs: 1,
            first: running,
        })
    );
    sim.settle();
    assert_eq!(sim.state_of(running), JobState::Cancelled);
    assert!(sim.state.share("a").is_none());
    sim.ok(Command::CreateShare(share("a", Strategy::Reserve, 1)));
    assert_eq!(sim.account("a").0, 0, "the new share holds nothing");
}

/// A share's `running` count is of its jobs holding GPUs: placed, starting and being stopped
/// count as well as running (found by probing: a starting gang counted as none).
#[test]
fn a_shares_running_count_is_of_its_jobs_holding_gpus() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 2);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let id = sim.submit(job("a", "j", 1, 1));
    let queued = sim.submit(job("a", "k", 1, 1));
    let running = |sim: &Sim| quotient_core::share_accounts(&sim.state)["a"].running;
    sim.round();
    assert_eq!(sim.state_of(id), JobState::Scheduled);
    assert_eq!(running(&sim), 2, "placed");
    sim.ok(Command::CancelJob { job: queued });
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    assert_eq!(running(&sim), 1);
}

/// Submitting twice with one idempotency key gives one job.
#[test]
fn submit_is_idempotent_by_key() {
    let mut sim = Sim::new();
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
    let mut spec = job("a", "j", 1, 1);
    spec.idempotency_key = Some("k-1".into());
    let first = sim.apply(Command::SubmitJob(spec.clone()));
    let second = sim.apply(Command::SubmitJob(spec));
    let (
        Outcome::JobSubmitted {
            job: a,
            duplicate: false,
        },
        Outcome::JobSubmitted {
            job: b,
            duplicate: true,
        },
    ) = (first, second)
    else {
        panic!("unexpected outcomes");
    };
    assert_eq!(a, b);
    assert_eq!(sim.state.jobs().count(), 1);
}

/// Invalid commands are rejected with a reason and change nothing.
#[test]
fn invalid_commands_are_rejected_and_change_nothing() {
    let mut sim = Sim::new();
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
    let before = sim.state.to_snapshot_bytes();
    let cases = vec![
        Command::SubmitJob(job("nope", "j", 1, 1)),
        Command::SubmitJob(job("a", "j", 10_000, 1)),
        Command::CreateShare(share("a", Strategy::Lend, 1)),
        Command::CreateShare({
            let mut s = share("b", Strategy::Lend, 1);
            s.borrow_limit_percent = Some(10);
            s
        }),
        Command::DeleteShare { name: "a".into() },
        Command::UpdateJobPriority {
            job: quotient_common::JobId(99),
            priority: 1,
        },
        Command::CordonNode {
            node: "ghost".into(),
        },
    ];
    for command in cases {
        let outcome = sim.apply(command.clone());
        assert!(outcome.is_rejected(), "{command:?} gave {outcome:?}");
        // Only the applied index and the entries' clock move.
        let mut data = sim.state.data().clone();
        data.last_applied_index = 1;
        data.clock_ms = 1;
        let mut expected = quotient_core::State::from_snapshot_bytes(&before)
            .unwrap()
            .data()
            .clone();
        expected.last_applied_index = 1;
        expected.clock_ms = 1;
        assert_eq!(data, expected, "{command:?} changed the state");
    }
    assert_eq!(
        sim.apply(Command::SubmitJob(job("a", "j", 10_000, 1))),
        Outcome::Rejected(Rejection::Invalid(quotient_common::SpecError::Priority(
            10_000
        )))
    );
}

/// A stale plan is rejected part by part, deterministically, leaving the rest applied.
#[test]
fn applying_a_stale_plan_rejects_its_stale_parts() {
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 2);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 2)));
    let j1 = sim.submit(job("a", "j1", 1, 1));
    let j2 = sim.submit(job("a", "j2", 1, 1));
    let stale: Plan = plan(&sim.state);
    assert_eq!(stale.placements().count(), 2);
    sim.ok(Command::CancelJob { job: j1 });
    let Outcome::PlanApplied(report) = sim.apply(Command::ApplyPlan(stale)) else {
        panic!("plan not applied");
    };
    assert_eq!(report.placed, 1);
    assert_eq!(report.rejected.len(), 1);
    assert_eq!(sim.state_of(j2), JobState::Scheduled);
    // Applying it a second time rejects everything: nothing is placed twice.
    let again = plan(&sim.state);
    assert!(again.placements().next().is_none());
}

/// A job names its class, or takes the share's only one.
#[test]
fn a_job_class_is_needed_only_when_the_share_has_several() {
    let mut sim = Sim::new();
    let mut two = share("two", Strategy::Lend, 1);
    two.limits.insert(class("h100-80gb"), 1);
    sim.ok(Command::CreateShare(two));
    sim.ok(Command::CreateShare(share("one", Strategy::Lend, 1)));
    assert!(matches!(
        sim.apply(Command::SubmitJob(job("two", "j", 1, 1))),
        Outcome::Rejected(Rejection::ClassRequired { .. })
    ));
    let mut spec = job("two", "j", 1, 1);
    spec.gpu_class = Some(class("h100-80gb"));
    sim.submit(spec);
    let id = sim.submit(job("one", "k", 1, 1));
    assert_eq!(sim.state.job(id).unwrap().class(), &class("a10g"));
}

/// A snapshot captured under the lock and encoded later is the state as it was at capture,
/// byte for byte, whatever is applied in between (jobs changed and added, idempotency keys
/// added); and it is the same bytes as one encoding of
/// the whole `StateData`.
#[test]
fn a_captured_snapshot_is_the_state_at_capture_however_it_changes_after() {
    let mut sim = Sim::new();
    fleet(&mut sim, 2, 4);
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 4)));
    let mut first = None;
    for n in 0..20 {
        let mut spec = job("a", &format!("j{n}"), 1, 1);
        spec.idempotency_key = Some(format!("key-{n}"));
        let id = sim.submit(spec);
        first.get_or_insert(id);
    }
    sim.round();
    let whole = bincode::serde::encode_to_vec(sim.state.data(), bincode::config::standard())
        .expect("encodes");
    let at_capture = sim.state.to_snapshot_bytes();
    // After the header (magic and version), the fields as one encoding of the whole data.
    let header = quotient_core::snapshot::SNAPSHOT_STATE_HEADER_BYTES;
    assert_eq!(at_capture[header..], whole);

    let capture = sim.state.capture_snapshot();
    // Change records the capture shares (JobTable's own tests cover chunks of every kind),
    // and add one.
    sim.ok(Command::CancelJob {
        job: first.expect("submitted"),
    });
    sim.ok(Command::CancelJob {
        job: quotient_common::JobId(15),
    });
    let mut later = job("a", "later", 1, 1);
    later.idempotency_key = Some("key-later".into());
    sim.submit(later);
    sim.round();
    assert_ne!(
        sim.state.to_snapshot_bytes(),
        at_capture,
        "the state did change"
    );
    assert_eq!(capture.into_bytes(), at_capture);
}

/// Borrowing, when idle GPUs are too few for every share that wants them: first come, first
/// served by default; with the fair order, the share holding the least of its limit first.
#[test]
fn borrowers_take_idle_gpus_first_come_or_least_served_first() {
    use quotient_core::{plan_ordered, BorrowOrder, DEFAULT_TOPOLOGY_KEY};
    let mut sim = Sim::new();
    fleet(&mut sim, 1, 8);
    sim.ok(Command::CreateShare(lab("a", 2, None, false)));
    sim.ok(Command::CreateShare(lab("b", 2, None, false)));
    sim.ok(Command::CreateShare(share("c", Strategy::Lend, 4)));
    // `a` holds 4 GPUs (2 borrowed), `b` its 2, `c` 1 of its 4: one GPU is left idle.
    for n in 0..4 {
        sim.submit(job("a", &format!("a{n}"), 5, 1));
    }
    for n in 0..2 {
        sim.submit(job("b", &format!("b{n}"), 5, 1));
    }
    sim.submit(job("c", "c0", 5, 1));
    sim.settle();
    assert_eq!(sim.account("a"), (4, 2, 0));
    assert_eq!(sim.account("b"), (2, 0, 0));
    // Both want the last idle GPU; `a`'s job came first.
    let a_next = sim.submit(job("a", "a-next", 5, 1));
    let b_next = sim.submit(job("b", "b-next", 5, 1));
    let placed = |plan: &Plan| -> Vec<_> {
        plan.actions
            .iter()
            .filter_map(|action| match action {
                PlanAction::Place { job, .. } => Some(*job),
                _ => None,
            })
            .collect()
    };
    let none = std::collections::BTreeSet::new();
    let fifo = plan_ordered(&sim.state, &none, DEFAULT_TOPOLOGY_KEY, BorrowOrder::Fifo);
    assert_eq!(placed(&fifo), vec![a_next]);
    assert_eq!(
        fifo,
        plan(&sim.state),
        "first come, first served is the default"
    );
    // `b` holds 2 of its 2 (100%), `a` 4 of its 2 (200%): `b` is further below its share.
    let fair = plan_ordered(&sim.state, &none, DEFAULT_TOPOLOGY_KEY, BorrowOrder::Fair);
    assert_eq!(placed(&fair), vec![b_next]);
    // A higher priority does not jump the fair order across shares.
    sim.ok(Command::UpdateJobPriority {
        job: a_next,
        priority: 9_000,
    });
    let fair = plan_ordered(&sim.state, &none, DEFAULT_TOPOLOGY_KEY, BorrowOrder::Fair);
    assert_eq!(placed(&fair), vec![b_next]);
    assert_eq!(BorrowOrder::parse("fair"), Some(BorrowOrder::Fair));
    assert_eq!(BorrowOrder::parse("lifo"), None);
}

/// In-share preemption when no node's victims would free room for the job, but another node
/// has room and only the share's limit holds the job back: victims wherever they run, enough
/// for the limit, and the job is nominated to the room it has.
#[test]
fn in_share_preemption_frees_the_limit_when_room_is_elsewhere() {
    let mut sim = Sim::new();
    fleet(&mut sim, 3, 4);
    sim.ok(Command::CreateShare(share_with_in_share("a", 4)));
    sim.ok(Command::CreateShare(share("b", Strategy::Lend, 8)));
    // a's two low jobs of 2 GPUs on two nodes, each beside a 2-GPU job of b; node 3 is free.
    let l1 = sim.submit(job("a", "l1", 1, 2));
    let b1 = sim.submit(job("b", "b1", 1, 2));
    sim.settle();
    let l2 = sim.submit(job("a", "l2", 1, 2));
    let b2 = sim.submit(job("b", "b2", 1, 2));
    sim.settle();
    assert_eq!(sim.nodes_of(l1), sim.nodes_of(b1));
    assert_eq!(sim.nodes_of(l2), sim.nodes_of(b2));
    assert_ne!(sim.nodes_of(l1), sim.nodes_of(l2));
    let high = sim.submit(job("a", "high", 9, 4));
    let plan = sim.round();
    let mut victims: Vec<_> = plan.preemptions().map(|p| p.0).collect();
    victims.sort();
    assert_eq!(victims, vec![l1, l2], "both, for the limit");
    sim.settle();
    assert_eq!(sim.state_of(high), JobState::Running);
    let free_node = sim.nodes_of(high);
    assert!(![sim.nodes_of(b1), sim.nodes_of(b2)].contains(&free_node));
    assert_eq!(sim.state_of(b1), JobState::Running);
    assert_eq!(sim.state_of(b2), JobState::Running);
}
