//! Helpers shared by the runtime tests: launch specs, desired states, and deadline-bounded
//! waiting (never a bare sleep).

#![allow(dead_code)]

pub mod docker;
pub mod fake_leader;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use quotient_agent::executor::Executor;
use quotient_agent::lease::boot_time_ms;
use quotient_agent::reconcile::{Desired, DesiredAllocation, Intent};
use quotient_agent::runtime::process::{WATCHDOG_POLL_S, WATCHDOG_SLACK_MS};
use quotient_agent::runtime::{checkpoint_dir, log_path, work_dir, JobLimits, LaunchSpec, Runtime};
use quotient_common::{JobEvent, JobId, JobPayload, JobReport, JobSpec, Signal};

/// The longest any test waits for a job to do something.
pub const WAIT_DEADLINE: Duration = Duration::from_secs(20);
/// How often a waiting test looks again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// The short grace period the preemption tests use.
pub const SHORT_GRACE_MS: u64 = 300;

/// Polls `check` until it returns `Some`, or panics with `what` at the deadline.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT_DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT_DEADLINE:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits as long as an orphan watchdog needs to act on an expired lease (its slack and two
/// polls), so that a job still running after it shows a live lease was left alone.
pub async fn give_the_watchdogs_time() {
    tokio::time::sleep(Duration::from_millis(
        WATCHDOG_SLACK_MS + 2 * WATCHDOG_POLL_S * 1_000,
    ))
    .await;
}

/// Writes `lease_file` as a lease that ran out a millisecond ago, waits for the job to write
/// `checkpoint` (it does when its watchdog signals it), and returns how long that took.
pub async fn expire_the_lease_and_await_the_checkpoint(
    lease_file: &Path,
    checkpoint: &Path,
) -> Duration {
    let expired_at = Instant::now();
    let now_ms = boot_time_ms().expect("the boot clock");
    std::fs::write(lease_file, format!("{}\n", now_ms.saturating_sub(1))).unwrap();
    wait_for("the watchdog sends the checkpoint signal", || {
        let exists = checkpoint.exists();
        async move { exists.then_some(()) }
    })
    .await;
    expired_at.elapsed()
}

/// A shell command: `sh -c SCRIPT`.
pub fn shell(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

/// A launch spec for `job` attempt `attempt` under `state_dir`.
pub fn launch(
    state_dir: &Path,
    job: u64,
    attempt: u32,
    image: Option<&str>,
    command: Vec<String>,
) -> LaunchSpec {
    LaunchSpec {
        job: JobId(job),
        attempt,
        payload: JobPayload {
            image: image.map(str::to_string),
            command: command.into(),
        },
        env: BTreeMap::from([("TRAIN_EPOCHS".to_string(), "3".to_string())]),
        gpu_indices: vec![1, 3],
        gpu_uuids: vec!["GPU-one".into(), "GPU-three".into()],
        checkpoint_dir: checkpoint_dir(&state_dir.join("checkpoints"), JobId(job)),
        work_dir: work_dir(state_dir, JobId(job), attempt),
        log_path: log_path(state_dir, JobId(job), attempt),
        checkpoint_signal: Signal::Sigusr1,
        grace_period_ms: SHORT_GRACE_MS,
        limits: JobLimits::NONE,
        rendezvous: Default::default(),
    }
}

/// A job spec with the short grace period and SIGUSR1 as its checkpoint signal.
pub fn job_spec(image: Option<&str>, command: Vec<String>) -> JobSpec {
    let mut spec = JobSpec::new("qs1", 1, 1, command);
    spec.payload.image = image.map(str::to_string);
    spec.checkpoint_signal = Signal::Sigusr1;
    spec.grace_period_ms = SHORT_GRACE_MS;
    spec
}

/// A desired state of one allocation.
pub fn desired_one(fence: u64, job: u64, attempt: u32, spec: &JobSpec, intent: Intent) -> Desired {
    Desired {
        fence,
        allocations: vec![DesiredAllocation {
            job: JobId(job),
            attempt,
            gpu_indices: vec![0],
            spec: spec.clone(),
            intent,
            limits: JobLimits::NONE,
            gang: None,
        }],
    }
}

/// Steps the executor against `desired` until a report about `job` satisfies `done`; returns
/// every report seen on the way.
pub async fn step_until<R: Runtime>(
    executor: &mut Executor<R>,
    desired: &Desired,
    what: &str,
    done: impl Fn(&JobReport) -> bool,
) -> Vec<JobReport> {
    let deadline = Instant::now() + WAIT_DEADLINE;
    let mut seen = Vec::new();
    loop {
        let reports = executor.step(desired).await;
        let finished = reports.iter().any(&done);
        seen.extend(reports);
        if finished {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT_DEADLINE:?} waiting for {what}; reports so far: {seen:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Whether a report is an exit of any kind.
pub fn is_exit(report: &JobReport) -> bool {
    matches!(
        report.event,
        JobEvent::Exited { .. }
            | JobEvent::ExitedWithReason { .. }
            | JobEvent::ExitedAfterSignal { .. }
    )
}

/// The events reported about one attempt, in order.
/// The events reported about attempt `attempt` of `job`, in order, but its checkpoints:
/// a test's job that writes files in its checkpoint directory (its readiness, say) may be
/// seen to checkpoint in any step after its start ([`checkpoints_of`] counts those).
pub fn events_of(reports: &[JobReport], job: u64, attempt: u32) -> Vec<JobEvent> {
    reports
        .iter()
        .filter(|r| r.job == JobId(job) && r.attempt == attempt)
        .filter(|r| r.event != JobEvent::Checkpointed)
        .map(|r| r.event.clone())
        .collect()
}

/// How many checkpoints of attempt `attempt` of `job` were reported.
pub fn checkpoints_of(reports: &[JobReport], job: u64, attempt: u32) -> usize {
    reports
        .iter()
        .filter(|r| r.job == JobId(job) && r.attempt == attempt)
        .filter(|r| r.event == JobEvent::Checkpointed)
        .count()
}

/// An empty "finished" set, for readability.
pub fn nothing_finished() -> BTreeSet<(JobId, u32)> {
    BTreeSet::new()
}

/// Whether the tests run as root (they do in CI): an agent started by a test then needs
/// `--allow-root-jobs` or `--job-user`.
pub fn running_as_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}
