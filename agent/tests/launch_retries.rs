//! The executor against a runtime whose launches fail: a bounded number of tries with a
//! growing wait between them, then one report naming whose fault it was, and no more tries;
//! never a loop without bound (it once retried every 25 ms forever).

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quotient_agent::executor::{
    launch_backoff_ms, Executor, SignalRecords, LAUNCH_TRIES_MAX, RELIST_MS, UNSETTLED_QUIET_MS,
};
use quotient_agent::reconcile::{Intent, ALREADY_RAN};
use quotient_agent::runtime::{FoundJob, JobHandle, JobStatus, LaunchSpec, Runtime, RuntimeError};
use quotient_common::job::{LaunchFault, LAUNCH_MESSAGE_BYTES_MAX};
use quotient_common::{JobEvent, JobReport, Signal};
use support::*;

/// A runtime whose `start` fails the first `failures` times with the error `fail` makes,
/// recording when each try came; later starts succeed.
struct FlakyRuntime {
    failures: usize,
    fail: fn(&LaunchSpec) -> RuntimeError,
    tries: Mutex<Vec<Instant>>,
    /// What `listed_everywhere` says (false: as the host runtime while Docker is down).
    listed_everywhere: AtomicBool,
}

impl FlakyRuntime {
    fn new(failures: usize, fail: fn(&LaunchSpec) -> RuntimeError) -> FlakyRuntime {
        FlakyRuntime {
            failures,
            fail,
            tries: Mutex::new(Vec::new()),
            listed_everywhere: AtomicBool::new(true),
        }
    }

    fn tries(&self) -> Vec<Instant> {
        self.tries.lock().unwrap().clone()
    }
}

impl Runtime for FlakyRuntime {
    async fn start(&self, spec: &LaunchSpec) -> Result<JobHandle, RuntimeError> {
        let mut tries = self.tries.lock().unwrap();
        tries.push(Instant::now());
        if tries.len() <= self.failures {
            return Err((self.fail)(spec));
        }
        Ok(JobHandle {
            job: spec.job,
            attempt: spec.attempt,
            id: "flaky".into(),
        })
    }

    async fn signal(&self, _: &JobHandle, _: Signal) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn kill(&self, _: &JobHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn status(&self, _: &JobHandle) -> Result<JobStatus, RuntimeError> {
        Ok(JobStatus::Running)
    }

    async fn list_own(&self) -> Result<Vec<FoundJob>, RuntimeError> {
        Ok(Vec::new())
    }

    fn listed_everywhere(&self) -> bool {
        self.listed_everywhere.load(Ordering::SeqCst)
    }

    async fn remove(&self, _: &JobHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn logs(&self, _: &JobHandle) -> Result<String, RuntimeError> {
        Ok(String::new())
    }
}

/// What execve says of an environment too large: the job's fault.
fn too_large(spec: &LaunchSpec) -> RuntimeError {
    RuntimeError::InvalidLaunch {
        job: spec.job,
        attempt: spec.attempt,
        problem: "its command and environment are too large to execute (Argument list too long)"
            .into(),
    }
}

/// A daemon that does not answer: the node's fault, with a message far over the limit.
fn daemon_down(_: &LaunchSpec) -> RuntimeError {
    RuntimeError::Docker {
        operation: "create container".into(),
        detail: format!("connection refused{}", " and refused".repeat(1_000)),
    }
}

fn executor(runtime: FlakyRuntime) -> Executor<FlakyRuntime> {
    let state = std::env::temp_dir();
    // Kept in memory: nothing of these tests is written to the shared temporary folder.
    Executor::new(runtime, "gpu-2", &state, BTreeMap::new())
        .with_started_records(SignalRecords::Shared(std::sync::Arc::default()))
}

/// Steps like the agent's loop (every 25 ms) for `how_long`; every report seen.
async fn step_for<R: Runtime>(
    executor: &mut Executor<R>,
    desired: &quotient_agent::reconcile::Desired,
    how_long: Duration,
) -> Vec<JobReport> {
    let until = Instant::now() + how_long;
    let mut reports = Vec::new();
    while Instant::now() < until {
        reports.extend(executor.step(desired).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    reports
}

/// Tries a launch that always fails and checks the tries, their spacing and the one report.
async fn always_failing(fail: fn(&LaunchSpec) -> RuntimeError, fault: LaunchFault) -> String {
    let mut executor = executor(FlakyRuntime::new(usize::MAX, fail));
    let spec = job_spec(None, shell("train"));
    let desired = desired_one(1, 7, 1, &spec, Intent::Run);
    let mut reports = step_until(&mut executor, &desired, "the launch failure report", |r| {
        matches!(r.event, JobEvent::LaunchFailed { .. })
    })
    .await;
    // Longer than the last wait: nothing more is tried or reported.
    let after = Duration::from_millis(launch_backoff_ms(LAUNCH_TRIES_MAX) + 500);
    reports.extend(step_for(&mut executor, &desired, after).await);

    let tries = executor.runtime().tries();
    assert_eq!(tries.len() as u32, LAUNCH_TRIES_MAX, "tries: {tries:?}");
    for (index, pair) in tries.windows(2).enumerate() {
        let waited = pair[1] - pair[0];
        let backoff = Duration::from_millis(launch_backoff_ms(index as u32 + 1));
        // The executor's clock counts whole milliseconds.
        assert!(
            waited + Duration::from_millis(1) >= backoff,
            "try {} came {waited:?} after the one before, not after {backoff:?}",
            index + 2
        );
    }
    assert!(
        launch_backoff_ms(2) > launch_backoff_ms(1),
        "the wait grows"
    );
    assert_eq!(reports.len(), 1, "one report: {reports:?}");
    let JobEvent::LaunchFailed {
        fault: reported,
        tries,
        message,
    } = reports[0].event.clone()
    else {
        panic!("not a launch failure: {reports:?}");
    };
    assert_eq!(reported, fault);
    assert_eq!(tries, LAUNCH_TRIES_MAX);
    assert!(
        message.len() <= LAUNCH_MESSAGE_BYTES_MAX,
        "{}",
        message.len()
    );
    assert_eq!(executor.jobs().count(), 0, "nothing tracked");
    assert_eq!(executor.next_deadline(), None, "no try pending");
    message
}

/// A launch that fails for the job's own reason is tried LAUNCH_TRIES_MAX times, with a
/// growing wait, then reported once as the job's fault with the runtime's message.
#[tokio::test]
async fn a_launch_that_always_fails_for_the_job_is_given_up_and_reported_once() {
    let message = always_failing(too_large, LaunchFault::Job).await;
    assert!(message.contains("Argument list too long"), "{message}");
}

/// A launch that fails for the node's reason (the daemon is down) is tried as often, then
/// reported once as the node's fault, its long message cut to the limit.
#[tokio::test]
async fn a_launch_that_always_fails_for_the_node_is_given_up_and_reported_once() {
    let message = always_failing(daemon_down, LaunchFault::Node).await;
    assert!(message.starts_with("docker create container: connection refused"));
    assert!(message.ends_with("..."), "cut: {message}");
}

/// A launch that fails once and then works is started once and reported running, with no
/// launch failure.
#[tokio::test]
async fn a_launch_that_fails_once_then_works_runs() {
    let mut executor = executor(FlakyRuntime::new(1, daemon_down));
    let spec = job_spec(None, shell("train"));
    let desired = desired_one(1, 8, 1, &spec, Intent::Run);
    let reports = step_until(&mut executor, &desired, "the job running", |r| {
        r.event == JobEvent::Running
    })
    .await;
    assert_eq!(
        events_of(&reports, 8, 1),
        vec![JobEvent::Started, JobEvent::Running]
    );
    assert_eq!(executor.runtime().tries().len(), 2);
    assert_eq!(executor.next_deadline(), None, "no try pending");
}

/// A launch waiting for its next try is not tried again once the attempt is no longer
/// desired to run (cancelled, preempted, placed elsewhere).
#[tokio::test]
async fn a_launch_no_longer_desired_is_not_tried_again() {
    let mut executor = executor(FlakyRuntime::new(usize::MAX, daemon_down));
    let spec = job_spec(None, shell("train"));
    let run = desired_one(1, 9, 1, &spec, Intent::Run);
    assert!(executor.step(&run).await.is_empty());
    assert_eq!(executor.runtime().tries().len(), 1);
    assert!(executor.next_deadline().is_some(), "a try is pending");
    let gone = quotient_agent::reconcile::Desired {
        fence: 2,
        allocations: Vec::new(),
    };
    let reports = step_for(
        &mut executor,
        &gone,
        Duration::from_millis(launch_backoff_ms(LAUNCH_TRIES_MAX) + 500),
    )
    .await;
    assert!(reports.is_empty(), "{reports:?}");
    assert_eq!(executor.runtime().tries().len(), 1, "not tried again");
    assert_eq!(executor.next_deadline(), None);
}

/// An attempt that already ran here and is asked for again (coordinators restored from a
/// backup issue its id again) is never started, and is answered once, as a launch that failed
/// for the node's sake, so that the coordinators place the job as a new attempt (found by
/// probing: such a job stayed SCHEDULED for good, holding its GPU). The answer is given again
/// only once the attempt has left the desired state and comes back.
#[tokio::test]
async fn an_attempt_that_already_ran_is_answered_once_and_never_started() {
    let mut executor = executor(FlakyRuntime::new(0, daemon_down));
    executor.remember_finished(quotient_common::JobId(9), 1);
    let spec = job_spec(None, shell("train"));
    let desired = desired_one(1, 9, 1, &spec, Intent::Run);
    let reports = step_for(&mut executor, &desired, Duration::from_millis(200)).await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(
        matches!(
            &reports[0].event,
            JobEvent::LaunchFailed { fault: LaunchFault::Node, message, .. }
                if message == quotient_agent::reconcile::ALREADY_RAN
        ),
        "{reports:?}"
    );
    assert!(executor.runtime().tries().is_empty(), "it was started");
    let none = quotient_agent::reconcile::Desired {
        fence: 2,
        allocations: Vec::new(),
    };
    executor.step(&none).await;
    let mut again = desired_one(3, 9, 1, &spec, Intent::Run);
    again.fence = 3;
    let reports = step_for(&mut executor, &again, Duration::from_millis(100)).await;
    assert_eq!(
        reports.len(),
        1,
        "answered again once asked again: {reports:?}"
    );
}

/// A runtime whose `status` never answers for job 1 (a hung Docker daemon), and answers at
/// once for the others; it records the signals it is asked to send.
#[derive(Default)]
struct HungForOne {
    signalled: Mutex<Vec<quotient_common::JobId>>,
}

impl Runtime for HungForOne {
    async fn start(&self, spec: &LaunchSpec) -> Result<JobHandle, RuntimeError> {
        Ok(JobHandle {
            job: spec.job,
            attempt: spec.attempt,
            id: format!("handle-{}", spec.job),
        })
    }

    async fn signal(&self, handle: &JobHandle, _: Signal) -> Result<(), RuntimeError> {
        self.signalled.lock().unwrap().push(handle.job);
        Ok(())
    }

    async fn kill(&self, _: &JobHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn status(&self, handle: &JobHandle) -> Result<JobStatus, RuntimeError> {
        if handle.job == quotient_common::JobId(1) {
            std::future::pending::<()>().await;
        }
        Ok(JobStatus::Running)
    }

    async fn list_own(&self) -> Result<Vec<FoundJob>, RuntimeError> {
        Ok(Vec::new())
    }

    async fn remove(&self, _: &JobHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn logs(&self, _: &JobHandle) -> Result<String, RuntimeError> {
        Ok(String::new())
    }
}

#[tokio::test]
async fn a_runtime_that_does_not_answer_for_one_attempt_holds_up_no_other() {
    // Found by probing: with the Docker daemon frozen, each round asked every container's
    // status in turn, 30 s each, and a process job's cancel waited 58 s for its signal.
    let state = std::env::temp_dir();
    let mut executor = Executor::new(HungForOne::default(), "gpu-2", &state, BTreeMap::new())
        .with_started_records(SignalRecords::Shared(std::sync::Arc::default()));
    let spec = job_spec(None, shell("train"));
    let both = |second: Intent| {
        let mut desired = desired_one(1, 1, 1, &spec, Intent::Run);
        let mut other = desired_one(1, 2, 1, &spec, second).allocations.remove(0);
        other.gpu_indices = vec![1];
        desired.allocations.push(other);
        desired
    };
    executor.step(&both(Intent::Run)).await;
    let round = Instant::now();
    tokio::time::timeout(Duration::from_secs(20), executor.step(&both(Intent::Stop)))
        .await
        .expect("a round ends although one attempt's status never comes");
    assert!(
        round.elapsed() < Duration::from_secs(10),
        "the round took {:?}",
        round.elapsed()
    );
    assert_eq!(
        *executor.runtime().signalled.lock().unwrap(),
        vec![quotient_common::JobId(2)],
        "the other job got its checkpoint signal"
    );
}

#[tokio::test]
async fn an_attempt_whose_container_went_while_the_agent_was_down_is_not_started_again() {
    // Found by probing: a container removed while its agent was down was started again as
    // the same attempt after the agent's restart, its first run's work and log lost and the
    // history showing one run. The agent keeps which attempts it started; one it cannot
    // find after a restart is reported, and the job goes back to the queue.
    // The agent starts again; its runtime finds nothing of the attempt.
    let (again, reports) = restarted_after_starting(7, FlakyRuntime::new(0, too_large)).await;
    assert!(again.runtime().tries().is_empty(), "not started again");
    assert!(
        reports.iter().any(reported_already_ran),
        "reported, so that the job goes back to the queue: {reports:?}"
    );
}

#[tokio::test]
async fn a_launch_of_this_life_is_tried_again_while_an_earlier_ones_attempt_is_unlisted() {
    // While Docker does not answer, an attempt of the agent's earlier life waits unlisted;
    // a new attempt's launch that fails meanwhile (it has a started record too) is still
    // tried again as usual, across the later looks, and reported if it keeps failing.
    // Taken for unlisted at a later look, it was never tried again nor reported.
    let blind = FlakyRuntime::new(1, too_large);
    blind.listed_everywhere.store(false, Ordering::SeqCst);
    let (mut again, _) = restarted_after_starting(10, blind).await;
    let spec = job_spec(None, shell("train"));
    let mut desired = desired_one(1, 10, 1, &spec, Intent::Run);
    desired
        .allocations
        .extend(desired_one(1, 11, 1, &spec, Intent::Run).allocations);
    // The new attempt's tries span the next look for the unlisted one.
    tokio::time::sleep(Duration::from_millis(RELIST_MS - 300)).await;
    let reports = step_for(&mut again, &desired, Duration::from_secs(3)).await;
    assert!(
        reports
            .iter()
            .any(|report| report.job == quotient_common::JobId(11)
                && report.event == JobEvent::Running),
        "the new attempt was tried again and ran: {reports:?}"
    );
    assert!(
        !reports
            .iter()
            .any(|report| report.job == quotient_common::JobId(10)),
        "the unlisted one waits: {reports:?}"
    );
}

/// Starts attempt 1 of job `job` with an executor, then makes another over `runtime` with
/// the same started records (an agent started again), recovers and steps it once against
/// the same desired state; that executor and its reports.
async fn restarted_after_starting(
    job: u64,
    runtime: FlakyRuntime,
) -> (Executor<FlakyRuntime>, Vec<JobReport>) {
    let records = SignalRecords::Shared(std::sync::Arc::default());
    let spec = job_spec(None, shell("train"));
    let desired = desired_one(1, job, 1, &spec, Intent::Run);
    let mut first = executor(FlakyRuntime::new(0, too_large)).with_started_records(records.clone());
    first.step(&desired).await;
    assert_eq!(first.runtime().tries().len(), 1, "started once");
    drop(first);
    let mut again = executor(runtime).with_started_records(records);
    again.recover().await.expect("recover");
    let reports = again.step(&desired).await;
    (again, reports)
}

fn reported_already_ran(report: &JobReport) -> bool {
    matches!(&report.event, JobEvent::LaunchFailed { message, .. } if message == ALREADY_RAN)
}

#[tokio::test]
async fn an_attempt_not_looked_for_after_a_restart_is_neither_started_nor_taken_for_gone() {
    // An agent started while Docker does not answer cannot list its containers: an attempt
    // it started before is then not known to be gone, and is not reported as such (its job
    // would be placed again while its container runs on). Nor is it started blind: with
    // Docker still silent the launch would fail as the node's, and the job be placed again
    // beside its running container. It waits until a later look finds it, or finds it gone.
    let blind = FlakyRuntime::new(0, too_large);
    blind.listed_everywhere.store(false, Ordering::SeqCst);
    let (mut again, mut reports) = restarted_after_starting(8, blind).await;
    let desired = desired_one(1, 8, 1, &job_spec(None, shell("train")), Intent::Run);
    reports.extend(step_for(&mut again, &desired, Duration::from_millis(300)).await);
    assert!(reports.is_empty(), "nothing reported: {reports:?}");
    assert!(again.runtime().tries().is_empty(), "not started blind");
    // Nor is a stop answered "not here": it may run on, and its GPUs would be freed.
    let stop = desired_one(2, 8, 1, &job_spec(None, shell("train")), Intent::Stop);
    let reports = step_for(&mut again, &stop, Duration::from_millis(300)).await;
    assert!(reports.is_empty(), "no stop reported: {reports:?}");

    // Docker answers again, and the attempt is not among the containers: gone.
    again
        .runtime()
        .listed_everywhere
        .store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(RELIST_MS)).await;
    let desired = desired_one(3, 8, 1, &job_spec(None, shell("train")), Intent::Run);
    let reports = again.step(&desired).await;
    assert!(
        reports.iter().any(reported_already_ran),
        "found gone at the next look, and reported: {reports:?}"
    );
    assert!(again.runtime().tries().is_empty(), "never started again");
}

/// A runtime whose starts get no answer, as from a Docker daemon that hangs, and whose daemon
/// carries out the held-up create just after it first answers an abandon: the container it
/// makes then is there until the next abandon removes it.
#[derive(Default)]
struct CreatedLate {
    /// Abandons asked for.
    abandons: Mutex<u32>,
    /// The container made late is there.
    made: AtomicBool,
}

impl Runtime for CreatedLate {
    async fn start(&self, _: &LaunchSpec) -> Result<JobHandle, RuntimeError> {
        Err(RuntimeError::NoAnswer {
            operation: "docker create container".into(),
            limit_ms: 10,
        })
    }

    async fn signal(&self, _: &JobHandle, _: Signal) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn kill(&self, _: &JobHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn status(&self, _: &JobHandle) -> Result<JobStatus, RuntimeError> {
        Ok(JobStatus::Running)
    }

    async fn list_own(&self) -> Result<Vec<FoundJob>, RuntimeError> {
        Ok(Vec::new())
    }

    async fn remove(&self, _: &JobHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn logs(&self, _: &JobHandle) -> Result<String, RuntimeError> {
        Ok(String::new())
    }

    async fn abandon(
        &self,
        _: quotient_common::JobId,
        _: u32,
        _: bool,
    ) -> Result<(), RuntimeError> {
        let mut abandons = self.abandons.lock().unwrap();
        *abandons += 1;
        // Nothing there at the first answer; the held-up create is carried out right after.
        // Any later abandon removes it.
        let made = self.made.swap(*abandons == 1, Ordering::SeqCst);
        if made {
            eprintln!("abandon {abandons}: removed the container made late");
        }
        Ok(())
    }
}

/// The first answer that nothing is left of an abandoned launch is not taken as settled: a
/// daemon that hung carries out the calls held up in it in any order once it answers again,
/// so a create held up may be carried out just after (found by probing, with the daemon
/// frozen: a `Created` container was left until the agent restarted). The executor asks
/// again each round until it has been told so for `UNSETTLED_QUIET_MS`, and then no more.
#[tokio::test]
async fn an_abandoned_launch_is_asked_about_until_nothing_of_it_has_been_left_for_a_while() {
    let state = std::env::temp_dir();
    let mut executor = Executor::new(CreatedLate::default(), "gpu-2", &state, BTreeMap::new())
        .with_started_records(SignalRecords::Shared(std::sync::Arc::default()));
    let spec = job_spec(Some("img"), shell("train"));
    executor
        .step(&desired_one(1, 9, 1, &spec, Intent::Run))
        .await;
    let gone = quotient_agent::reconcile::Desired {
        fence: 2,
        allocations: Vec::new(),
    };
    step_for(
        &mut executor,
        &gone,
        Duration::from_millis(UNSETTLED_QUIET_MS + 1_000),
    )
    .await;
    let runtime = executor.runtime();
    assert!(
        !runtime.made.load(Ordering::SeqCst),
        "the container made after the first answer is removed"
    );
    let asked = *runtime.abandons.lock().unwrap();
    assert!(asked >= 3, "asked {asked} times");
    step_for(&mut executor, &gone, Duration::from_millis(500)).await;
    assert_eq!(
        *executor.runtime().abandons.lock().unwrap(),
        asked,
        "settled: no longer asked"
    );
}
