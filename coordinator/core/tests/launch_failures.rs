//! Attempts an agent could not launch: whose fault it was decides whether the job fails or
//! goes back to the queue, the GPUs are freed either way, the job's reason says why, and a
//! job that no node can launch does not cycle through the queue forever.

mod support;

use quotient_common::job::{LaunchFault, LAUNCH_MESSAGE_BYTES_MAX};
use quotient_common::{JobState, Strategy};
use quotient_core::limits::LAUNCH_REQUEUES_MAX;
use quotient_core::{explain, Command, JobEvent, JobReport, Outcome, Rejection, WaitReason};
use support::*;

/// One node of one GPU and a share that may use it.
fn one_gpu() -> Sim {
    let mut sim = Sim::new();
    sim.ok(Command::RegisterNode(node("gpu-2", 1, "a10g")));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 1)));
    sim
}

/// A launch the job is to blame for fails the job at once, with the node, the tries and the
/// runtime's message in its reason, and its GPU goes to the next job.
#[test]
fn a_launch_failure_of_the_job_fails_it_and_frees_its_gpu() {
    let mut sim = one_gpu();
    let broken = sim.submit(job("team", "broken", 5, 1));
    let next = sim.submit(job("team", "next", 1, 1));
    sim.round();
    assert_eq!(sim.state_of(broken), JobState::Scheduled);
    assert_eq!(sim.state_of(next), JobState::Runnable);

    sim.launch_fails(broken, LaunchFault::Job);
    let record = sim.state.job(broken).unwrap();
    assert_eq!(record.state, JobState::Failed);
    assert_eq!(record.allocation(), None);
    assert!(record.ended_ms.is_some());
    let reason = sim.state.reason(record).unwrap().to_string();
    assert!(
        reason.starts_with("launch failed on node gpu-2 after 3 tries: the job's fault;"),
        "{reason}"
    );
    assert!(reason.contains("submit it again"), "{reason}");
    let summary = explain(&sim.state, broken).unwrap().summary;
    assert!(
        summary.contains("FAILED: launch failed on node gpu-2"),
        "{summary}"
    );

    sim.settle();
    assert_eq!(
        sim.state_of(next),
        JobState::Running,
        "the GPU is free again"
    );
}

/// A launch the node is to blame for sends the job back to the queue, without counting as a
/// preemption, up to LAUNCH_REQUEUES_MAX times; the next one fails it.
#[test]
fn a_launch_failure_of_the_node_requeues_the_job_a_bounded_number_of_times() {
    let mut sim = one_gpu();
    let mut spec = job("team", "unlucky", 5, 1);
    // A requeue after a failed launch is not a preemption: the job never ran.
    spec.max_preemptions = Some(0);
    let id = sim.submit(spec);
    for requeue in 1..=LAUNCH_REQUEUES_MAX {
        sim.round();
        assert_eq!(sim.state_of(id), JobState::Scheduled, "placed again");
        sim.launch_fails(id, LaunchFault::Node);
        let record = sim.state.job(id).unwrap();
        assert_eq!(record.state, JobState::Runnable, "requeue {requeue}");
        assert_eq!(record.allocation(), None);
        assert_eq!(record.preemptions, 0);
        assert_eq!(record.launch_requeues, requeue);
        let reason = sim.state.reason(record).unwrap().to_string();
        assert!(
            reason.contains(&format!(
                "the job went back to the queue ({requeue} of at most {LAUNCH_REQUEUES_MAX} times)"
            )),
            "{reason}"
        );
        let details = explain(&sim.state, id).unwrap().details.join("\n");
        assert!(
            details.contains(&format!("went back to the queue {requeue} time(s)")),
            "{details}"
        );
    }
    sim.round();
    sim.launch_fails(id, LaunchFault::Node);
    let record = sim.state.job(id).unwrap();
    assert_eq!(record.state, JobState::Failed);
    assert_eq!(record.attempts, LAUNCH_REQUEUES_MAX + 1);
    let reason = sim.state.reason(record).unwrap().to_string();
    assert!(
        reason.contains(&format!(
            "failed to launch {} times, more than the {LAUNCH_REQUEUES_MAX} requeues allowed",
            LAUNCH_REQUEUES_MAX + 1
        )),
        "{reason}"
    );
    assert_eq!(sim.state.jobs_on_node(quotient_core::NodeId(0)), vec![]);
}

/// Preemptions and launch requeues are counted apart: a job preempted before its launch
/// failures still gets every launch requeue.
#[test]
fn preemptions_do_not_use_up_launch_requeues() {
    let mut sim = one_gpu();
    let id = sim.submit(job("team", "j", 5, 1));
    sim.settle();
    sim.ok(Command::MarkNodeLost {
        node: "gpu-2".into(),
    });
    sim.ok(Command::RegisterNode(node("gpu-2", 1, "a10g")));
    assert_eq!(sim.state.job(id).unwrap().preemptions, 1);
    for _ in 0..LAUNCH_REQUEUES_MAX {
        sim.round();
        sim.launch_fails(id, LaunchFault::Node);
        assert_eq!(sim.state_of(id), JobState::Runnable);
    }
    assert_eq!(
        sim.state.job(id).unwrap().launch_requeues,
        LAUNCH_REQUEUES_MAX
    );
}

/// A launch failure of an attempt that is not the job's current one, or from another node,
/// is refused as stale and changes nothing.
#[test]
fn a_stale_launch_failure_is_refused() {
    let mut sim = one_gpu();
    let id = sim.submit(job("team", "j", 5, 1));
    sim.round();
    let before = sim.state.data().clone();
    let failure = |attempt: u32, node: &str| {
        Command::ReportJob(JobReport {
            job: id,
            attempt,
            node: node.into(),
            event: JobEvent::LaunchFailed {
                fault: LaunchFault::Job,
                tries: 3,
                message: "stale".into(),
            },
        })
    };
    for (command, why) in [
        (failure(7, "gpu-2"), "another attempt"),
        (failure(1, "gpu-9"), "another node"),
    ] {
        match sim.apply(command) {
            Outcome::Rejected(Rejection::StaleReport { why: said, .. }) => {
                assert!(said.contains(why), "{said}")
            }
            other => panic!("not refused as stale: {other:?}"),
        }
    }
    let mut after = sim.state.data().clone();
    after.last_applied_index = before.last_applied_index;
    after.clock_ms = before.clock_ms;
    assert_eq!(after, before, "nothing changed");
    assert_eq!(sim.state_of(id), JobState::Scheduled);
}

/// A job cancelled while the agent still tried to launch it ends CANCELLED when the agent
/// gives up, whoever was to blame.
#[test]
fn a_job_cancelled_while_its_launch_was_tried_ends_cancelled() {
    let mut sim = one_gpu();
    let id = sim.submit(job("team", "j", 5, 1));
    sim.round();
    sim.ok(Command::CancelJob { job: id });
    assert_eq!(sim.state_of(id), JobState::Preempting);
    sim.launch_fails(id, LaunchFault::Node);
    assert_eq!(sim.state_of(id), JobState::Cancelled);
    assert_eq!(
        sim.state.job(id).unwrap().reason.as_deref(),
        Some(&WaitReason::Ended("cancelled".into()))
    );
}

/// The reason survives a snapshot: the new variant encodes and decodes like the others.
#[test]
fn a_launch_failure_reason_survives_a_snapshot() {
    let mut sim = one_gpu();
    let id = sim.submit(job("team", "j", 5, 1));
    sim.round();
    sim.launch_fails(id, LaunchFault::Node);
    let restored = quotient_core::State::from_snapshot_bytes(&sim.state.to_snapshot_bytes())
        .expect("the snapshot decodes");
    assert_eq!(restored.job(id), sim.state.job(id));
    assert!(matches!(
        restored.job(id).unwrap().reason.as_deref(),
        Some(WaitReason::LaunchFailed(failure))
            if failure.fault == LaunchFault::Node && failure.requeues == 1
    ));
}

/// The runtime's message is the one text from outside that a reason keeps: however long the
/// report's, the reason keeps at most LAUNCH_MESSAGE_BYTES_MAX bytes of it.
#[test]
fn a_launch_message_longer_than_its_limit_is_cut_in_the_reason() {
    let mut sim = one_gpu();
    let broken = sim.submit(job("team", "broken", 5, 1));
    sim.round();
    let record = sim.state.job(broken).unwrap();
    let node = sim
        .state
        .node(record.allocation().copied().unwrap().node)
        .unwrap();
    let report = JobReport {
        job: broken,
        attempt: record.attempts,
        node: node.name.clone(),
        event: JobEvent::LaunchFailed {
            fault: LaunchFault::Job,
            tries: 3,
            message: "é".repeat(10_000),
        },
    };
    sim.ok(Command::ReportJob(report));
    match sim.state.job(broken).unwrap().reason.as_deref() {
        Some(WaitReason::LaunchFailed(failure)) => {
            let message = &failure.message;
            assert!(
                message.len() <= LAUNCH_MESSAGE_BYTES_MAX,
                "{}",
                message.len()
            );
            assert!(message.starts_with('é') && message.ends_with("..."));
        }
        other => panic!("expected a launch failure, got {other:?}"),
    }
}
