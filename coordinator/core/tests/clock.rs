//! Times recorded on a job come from whichever leader applied the event; after a failover the
//! new leader's clock may be behind. A job's times never run backwards all the same.

mod support;

use quotient_common::{JobState, Strategy};
use quotient_core::Command;
use support::*;

fn one_gpu_fleet(sim: &mut Sim) {
    sim.ok(Command::RegisterNode(node("node-1", 1, "a10g")));
    sim.ok(Command::CreateShare(share("a", Strategy::Lend, 1)));
}

#[test]
fn a_leader_clock_behind_never_makes_a_job_start_before_its_submit_or_end_before_its_start() {
    let mut sim = Sim::new();
    one_gpu_fleet(&mut sim);
    sim.time_ms = 50_000;
    let id = sim.submit(job("a", "train", 1, 1));
    // A new leader whose clock is 40 s behind places and starts it.
    sim.time_ms = 10_000;
    sim.settle();
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Running);
    let submitted = job.submitted_ms;
    let started = job.started_ms.expect("a running job has started");
    assert!(
        started >= submitted,
        "started {started} before submitted {submitted}"
    );
    // Another one, further behind still, sees it exit.
    sim.time_ms = 1_000;
    sim.finish(id, 0);
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    let ended = job.ended_ms.expect("a finished job has ended");
    assert!(ended >= started, "ended {ended} before started {started}");
}

#[test]
fn a_job_cancelled_while_queued_by_a_leader_behind_ends_no_earlier_than_its_submit() {
    let mut sim = Sim::new();
    one_gpu_fleet(&mut sim);
    sim.time_ms = 50_000;
    let id = sim.submit(job("a", "queued", 1, 2));
    sim.time_ms = 1_000;
    sim.ok(Command::CancelJob { job: id });
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    assert!(job.ended_ms.unwrap() >= job.submitted_ms);
}

#[test]
fn a_clock_that_runs_forward_is_recorded_as_it_is() {
    let mut sim = Sim::new();
    one_gpu_fleet(&mut sim);
    let id = sim.submit(job("a", "train", 1, 1));
    let submitted = sim.state.job(id).unwrap().submitted_ms;
    sim.settle();
    let started = sim.state.job(id).unwrap().started_ms.unwrap();
    assert!(started > submitted);
    sim.finish(id, 0);
    let job = sim.state.job(id).unwrap();
    assert_eq!(job.ended_ms, Some(sim.time_ms));
}
