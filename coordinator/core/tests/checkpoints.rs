//! A job's checkpoints as its agent reports them: the time the coordinators learnt of the
//! last one, kept while the job holds GPUs.

mod support;

use quotient_common::{JobEvent, JobState, Strategy};
use quotient_core::{Command, JobReport, Outcome, Rejection, State};
use support::*;

#[test]
fn a_checkpoint_is_kept_at_the_leaders_time_until_the_job_lets_its_gpus_go() {
    // Proves the record: set at the entry's time by a report of the current attempt, moved on
    // by the next one, refused for an old attempt, kept across a snapshot, and dropped when
    // the job is requeued (its next attempt resumes from the checkpoint and has lost nothing).
    let mut sim = Sim::new();
    sim.ok(Command::RegisterNode(node("n1", 2, "a10g")));
    sim.ok(Command::CreateShare(share(
        "lab",
        Strategy::LendAndBorrow,
        2,
    )));
    let id = sim.submit(job("lab", "train", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    assert_eq!(sim.state.data().checkpoints.get(&id), None);
    sim.report(id, JobEvent::Checkpointed);
    assert_eq!(sim.state.data().checkpoints.get(&id), Some(&sim.time_ms));
    let first = sim.time_ms;
    sim.report(id, JobEvent::Checkpointed);
    assert!(sim.state.data().checkpoints[&id] > first);
    let restored = State::from_snapshot_bytes(&sim.state.to_snapshot_bytes()).expect("loads");
    assert_eq!(restored.data().checkpoints, sim.state.data().checkpoints);
    // The node is lost: the job goes back to the queue, and its checkpoint time with it.
    sim.ok(Command::MarkNodeLost { node: "n1".into() });
    assert_eq!(sim.state_of(id), JobState::Runnable);
    assert_eq!(sim.state.data().checkpoints.get(&id), None);
    // A late report of the attempt that was lost changes nothing.
    let late = sim.apply(Command::ReportJob(JobReport {
        job: id,
        attempt: 1,
        node: "n1".into(),
        event: JobEvent::Checkpointed,
    }));
    assert!(
        matches!(late, Outcome::Rejected(Rejection::StaleReport { .. })),
        "{late:?}"
    );
    assert!(sim.state.data().checkpoints.is_empty());
}
