//! The walkthrough of docs/quota-shares.md, step by step, at the level of the pure core.

mod support;

use quotient_common::{JobState, Strategy};
use quotient_core::{explain, Command, PreemptionKind};
use support::*;

/// Proves the walkthrough: lend-and-borrow borrows from lend, never from reserve; reclaim takes
/// the borrowed job back; a priority raise triggers in-share preemption.
#[test]
fn the_seeds_walkthrough_reproduces_exactly() {
    let mut sim = Sim::new();
    // --- setup: three one-GPU nodes, three shares of limit 1
    for n in 1..=3 {
        sim.ok(Command::RegisterNode(node(&format!("node-{n}"), 1, "a10g")));
    }
    let mut qs1 = share("QS1", Strategy::LendAndBorrow, 1);
    qs1.borrow_limit_percent = Some(200);
    qs1.in_share_preemption = true;
    sim.ok(Command::CreateShare(qs1));
    sim.ok(Command::CreateShare(share("QS2", Strategy::Lend, 1)));
    sim.ok(Command::CreateShare(share("QS3", Strategy::Reserve, 1)));

    // --- step 1: high, med, low to QS1
    let high = sim.submit(job("QS1", "high", 3, 1));
    let med = sim.submit(job("QS1", "med", 2, 1));
    let low = sim.submit(job("QS1", "low", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(high), JobState::Running);
    assert_eq!(sim.state_of(med), JobState::Running);
    assert_eq!(sim.state_of(low), JobState::Runnable);
    assert_eq!(sim.account("QS1"), (2, 1, 0), "QS1 uses 2, borrows 1");
    assert_eq!(sim.account("QS2"), (0, 0, 1), "QS2 lends its idle GPU");
    assert_eq!(sim.account("QS3"), (0, 0, 0), "QS3 never lends");
    assert!(!sim.state.is_borrowed(sim.state.job(high).unwrap()));
    assert!(sim.state.is_borrowed(sim.state.job(med).unwrap()));
    let why = explain(&sim.state, low).unwrap().summary;
    assert!(
        why.contains("reserved"),
        "low waits on reserved capacity: {why}"
    );

    // --- step 2: a job to QS2 reclaims the lent GPU from med
    let qs2_job = sim.submit(job("QS2", "qs2-job", 1, 1));
    let plan = sim.round();
    let preempted: Vec<_> = plan.preemptions().collect();
    assert_eq!(
        preempted,
        vec![(med, PreemptionKind::Reclaim, Some(qs2_job))]
    );
    assert_eq!(sim.state_of(med), JobState::Preempting);
    assert_eq!(sim.state_of(qs2_job), JobState::Runnable);
    sim.settle();
    assert_eq!(sim.state_of(high), JobState::Running);
    assert_eq!(sim.state_of(med), JobState::Runnable);
    assert_eq!(sim.state_of(low), JobState::Runnable);
    assert_eq!(sim.state_of(qs2_job), JobState::Running);
    let med_record = sim.state.job(med).unwrap();
    assert_eq!(med_record.preemptions, 1);
    let last = med_record.last_preemption.as_ref().unwrap();
    assert_eq!(last.kind, PreemptionKind::Reclaim);
    assert_eq!(last.for_job, Some(qs2_job));
    assert_eq!(sim.account("QS1"), (1, 0, 0));
    assert_eq!(sim.account("QS2"), (1, 0, 0));
    assert_eq!(sim.account("QS3"), (0, 0, 0), "QS3 untouched");

    // --- step 3: raise low from 1 to 4: in-share preemption of high
    sim.ok(Command::UpdateJobPriority {
        job: low,
        priority: 4,
    });
    let plan = sim.round();
    let preempted: Vec<_> = plan.preemptions().collect();
    assert_eq!(preempted, vec![(high, PreemptionKind::InShare, Some(low))]);
    sim.settle();
    assert_eq!(sim.state_of(low), JobState::Running);
    assert_eq!(sim.state_of(high), JobState::Runnable);
    assert_eq!(sim.state_of(med), JobState::Runnable);
    assert_eq!(sim.state_of(qs2_job), JobState::Running);
    assert_eq!(sim.account("QS1"), (1, 0, 0));
    assert_eq!(sim.account("QS2"), (1, 0, 0));
    assert_eq!(sim.account("QS3"), (0, 0, 0));
    let high_record = sim.state.job(high).unwrap();
    assert_eq!(high_record.preemptions, 1);
    assert_eq!(
        high_record.last_preemption.as_ref().unwrap().kind,
        PreemptionKind::InShare
    );
    // The low job freed by high's preemption took the GPU high had.
    let explanation = explain(&sim.state, high).unwrap();
    assert!(explanation.details.iter().any(|d| d.contains("in-share")));
}
