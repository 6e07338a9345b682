//! The process runtime against real processes: environment and GPUs, the checkpoint signal,
//! preemption (trapped and ignored signals), exit codes, re-finding jobs after a restart
//! without touching anyone else's process, and the orphan watchdog.

mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Instant;

use quotient_agent::executor::{Executor, LAUNCH_TRIES_MAX};
use quotient_agent::lease::{boot_time_ms, LEASE_FILE};
use quotient_agent::reconcile::Intent;
use quotient_agent::runtime::process::{
    process_state, ProcessRuntime, JOBS_DIR, WATCHDOG_POLL_S, WATCHDOG_SLACK_MS,
};
use quotient_agent::runtime::{JobHandle, JobStatus, Runtime, RuntimeError};
use quotient_common::job::LaunchFault;
use quotient_common::{JobEvent, JobId};
use support::*;

/// A script that checkpoints on SIGUSR1: writes a file, then exits 0.
const TRAPPING_JOB: &str = r#"trap 'echo checkpointed > "$QUOTIENT_CHECKPOINT_DIR/checkpoint"; exit 0' USR1
echo ready > "$QUOTIENT_CHECKPOINT_DIR/ready"
while :; do sleep 0.05; done"#;
/// A script that ignores its checkpoint signal.
const IGNORING_JOB: &str = r#"trap '' USR1
echo ready > "$QUOTIENT_CHECKPOINT_DIR/ready"
while :; do sleep 0.05; done"#;

fn gpu_uuids() -> BTreeMap<u32, String> {
    BTreeMap::from([(0, "GPU-zero".to_string()), (1, "GPU-one".to_string())])
}

/// An executor of node `node-1` over a process runtime, keeping its files in `state`.
fn process_executor(state: &std::path::Path) -> Executor<ProcessRuntime> {
    Executor::new(ProcessRuntime::new(state), "node-1", state, gpu_uuids())
}

async fn wait_ready(dir: &std::path::Path) {
    let ready = dir.join("ready");
    wait_for("the job to start", || {
        let exists = ready.exists();
        async move { exists.then_some(()) }
    })
    .await;
}

/// A job gets Quotient's environment, its GPUs and its own variables, and its output lands in
/// its log file.
#[tokio::test]
async fn process_job_gets_its_environment_and_gpus() {
    let state = tempfile::tempdir().unwrap();
    let runtime = ProcessRuntime::new(state.path());
    let spec = launch(
        state.path(),
        11,
        2,
        None,
        shell(r#"env > "$QUOTIENT_CHECKPOINT_DIR/env.txt"; echo hello-from-the-job"#),
    );
    let handle = runtime.start(&spec).await.unwrap();
    let code = runtime
        .wait(&handle, WAIT_DEADLINE)
        .await
        .unwrap()
        .expect("the job exits");
    assert_eq!(code, Some(0));
    let env = std::fs::read_to_string(spec.checkpoint_dir.join("env.txt")).unwrap();
    for line in [
        "QUOTIENT_JOB_ID=j-11",
        "QUOTIENT_ATTEMPT=2",
        &format!("QUOTIENT_CHECKPOINT_DIR={}", spec.checkpoint_dir.display()),
        "CUDA_VISIBLE_DEVICES=1,3",
        "NVIDIA_VISIBLE_DEVICES=GPU-one,GPU-three",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "TRAIN_EPOCHS=3",
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from:\n{env}"
        );
    }
    assert!(spec.checkpoint_dir.ends_with("checkpoints/j-11"));
    let logs = runtime.logs(&handle).await.unwrap();
    assert!(logs.contains("hello-from-the-job"), "{logs}");
    assert!(spec.log_path.exists());
    runtime.remove(&handle).await.unwrap();
    assert!(runtime.list_own().await.unwrap().is_empty());
}

/// The checkpoint signal reaches the job, which checkpoints and exits with its own code.
#[tokio::test]
async fn process_checkpoint_signal_reaches_the_job() {
    let state = tempfile::tempdir().unwrap();
    let runtime = ProcessRuntime::new(state.path());
    let spec = launch(state.path(), 12, 1, None, shell(TRAPPING_JOB));
    let handle = runtime.start(&spec).await.unwrap();
    wait_ready(&spec.checkpoint_dir).await;
    assert_eq!(runtime.status(&handle).await.unwrap(), JobStatus::Running);
    runtime
        .signal(&handle, quotient_common::Signal::Sigusr1)
        .await
        .unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(0)));
    let checkpoint = std::fs::read_to_string(spec.checkpoint_dir.join("checkpoint")).unwrap();
    assert_eq!(checkpoint.trim(), "checkpointed");
}

/// Preemption of a job that traps its signal: signal, it exits, reported as after-signal.
#[tokio::test]
async fn process_preempted_job_that_traps_the_signal_is_reported_after_signal() {
    let state = tempfile::tempdir().unwrap();
    let mut executor = process_executor(state.path());
    let spec = job_spec(None, shell(TRAPPING_JOB));
    let run = desired_one(1, 21, 1, &spec, Intent::Run);
    let reports = executor.step(&run).await;
    assert_eq!(
        events_of(&reports, 21, 1),
        vec![JobEvent::Started, JobEvent::Running]
    );
    wait_ready(&state.path().join("checkpoints/j-21")).await;

    let stop = desired_one(2, 21, 1, &spec, Intent::Stop);
    let reports = step_until(&mut executor, &stop, "the preempted exit", is_exit).await;
    assert_eq!(
        events_of(&reports, 21, 1),
        vec![JobEvent::ExitedAfterSignal { code: Some(0) }]
    );
    assert!(state.path().join("checkpoints/j-21/checkpoint").exists());
    assert_eq!(
        executor.jobs().count(),
        0,
        "the exited attempt is forgotten"
    );
    let again = executor.step(&stop).await;
    assert!(again.is_empty(), "reported once: {again:?}");
}

/// A job that touches the checkpoint marker is reported to have checkpointed, once per
/// checkpoint, within about a second; one file written alone counts too.
#[tokio::test]
async fn process_job_checkpoints_are_reported_once_each() {
    let state = tempfile::tempdir().unwrap();
    let mut executor = process_executor(state.path());
    // Two checkpoints a second and a half apart, by the marker, then it runs on.
    let script = r#"sleep 0.3
touch "$QUOTIENT_CHECKPOINT_DIR/.quotient-checkpointed"
sleep 1.5
touch "$QUOTIENT_CHECKPOINT_DIR/.quotient-checkpointed"
echo ready > "$QUOTIENT_CHECKPOINT_DIR/ready"
while :; do sleep 0.05; done"#;
    let spec = job_spec(None, shell(script));
    let run = desired_one(1, 25, 1, &spec, Intent::Run);
    let mut reports = executor.step(&run).await;
    let started = Instant::now();
    while checkpoints_of(&reports, 25, 1) < 2 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "two checkpoints reported: {reports:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        reports.extend(executor.step(&run).await);
    }
    wait_ready(&state.path().join("checkpoints/j-25")).await;
    // No third: the marker did not change again, and with a marker only it counts ("ready").
    for _ in 0..60 {
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        reports.extend(executor.step(&run).await);
    }
    assert_eq!(checkpoints_of(&reports, 25, 1), 2, "{reports:?}");
    let stop = desired_one(2, 25, 1, &spec, Intent::Stop);
    step_until(&mut executor, &stop, "the stop", is_exit).await;
}

/// A job that ignores its checkpoint signal is killed when its grace period ends.
#[tokio::test]
async fn process_job_that_ignores_the_signal_is_killed_after_the_grace_period() {
    let state = tempfile::tempdir().unwrap();
    let mut executor = process_executor(state.path());
    let spec = job_spec(None, shell(IGNORING_JOB));
    executor
        .step(&desired_one(1, 22, 1, &spec, Intent::Run))
        .await;
    wait_ready(&state.path().join("checkpoints/j-22")).await;

    let stop = desired_one(2, 22, 1, &spec, Intent::Stop);
    let signalled = Instant::now();
    assert!(
        executor.step(&stop).await.is_empty(),
        "signalled, not yet killed"
    );
    let deadline = executor.next_deadline().expect("a grace period runs");
    assert!(
        deadline.as_millis() <= u128::from(SHORT_GRACE_MS),
        "{deadline:?}"
    );
    let reports = step_until(
        &mut executor,
        &stop,
        "the kill after the grace period",
        is_exit,
    )
    .await;
    let elapsed = signalled.elapsed();
    assert_eq!(
        events_of(&reports, 22, 1),
        vec![JobEvent::ExitedAfterSignal { code: Some(137) }],
        "killed by SIGKILL: 128 + 9"
    );
    assert!(
        elapsed.as_millis() >= u128::from(SHORT_GRACE_MS),
        "killed after {elapsed:?}, before the {SHORT_GRACE_MS} ms grace period"
    );
}

/// A command that is not there exits 127, as a shell says it, and the report says what that
/// code usually means (the job's own code otherwise says nothing of why; found by probing).
#[tokio::test]
async fn a_command_not_found_is_reported_with_what_its_code_means() {
    let state = tempfile::tempdir().unwrap();
    let mut executor = process_executor(state.path());
    let missing = job_spec(None, vec!["/nonexistent/quotient-no-such-command".into()]);
    let desired = desired_one(1, 33, 1, &missing, Intent::Run);
    let reports = step_until(&mut executor, &desired, "its exit", is_exit).await;
    let events = events_of(&reports, 33, 1);
    assert!(
        events.iter().any(|event| matches!(
            event,
            JobEvent::ExitedWithReason { code: 127, reason } if reason.contains("no such command")
        )),
        "{events:?}"
    );
}

/// Exit codes are reported as they are: 0 and non-zero.
#[tokio::test]
async fn process_exit_codes_are_reported() {
    let state = tempfile::tempdir().unwrap();
    let mut executor = process_executor(state.path());
    let ok = job_spec(None, shell("exit 0"));
    let failing = job_spec(None, shell("echo failing >&2; exit 3"));
    let mut desired = desired_one(1, 31, 1, &ok, Intent::Run);
    desired
        .allocations
        .extend(desired_one(1, 32, 1, &failing, Intent::Run).allocations);
    let mut reports = Vec::new();
    while !(events_of(&reports, 31, 1)
        .iter()
        .any(|e| matches!(e, JobEvent::Exited { .. }))
        && events_of(&reports, 32, 1)
            .iter()
            .any(|e| matches!(e, JobEvent::Exited { .. })))
    {
        reports.extend(step_until(&mut executor, &desired, "both exits", is_exit).await);
    }
    assert!(events_of(&reports, 31, 1).contains(&JobEvent::Exited { code: 0 }));
    assert!(events_of(&reports, 32, 1).contains(&JobEvent::Exited { code: 3 }));
    let log = std::fs::read_to_string(state.path().join("logs/j-32-1.log")).unwrap();
    assert!(log.contains("failing"), "{log}");
    let again = executor.step(&desired).await;
    assert!(
        again.is_empty(),
        "finished attempts are not started again: {again:?}"
    );
    // Found by probing a long churn: an empty work dir per attempt and an empty checkpoint
    // dir per job were kept for ever. Reported, both jobs left theirs empty: they are gone.
    for job in [31, 32] {
        assert!(!state.path().join(format!("work/j-{job}-1")).exists());
        assert!(!state.path().join(format!("checkpoints/j-{job}")).exists());
    }
}

/// A job that writes into its checkpoint dir keeps it after it ends: only empty ones go.
#[tokio::test]
async fn process_checkpoint_dir_a_job_wrote_to_stays() {
    let state = tempfile::tempdir().unwrap();
    let mut executor = process_executor(state.path());
    let writing = job_spec(
        None,
        shell(r#"echo step-7 > "$QUOTIENT_CHECKPOINT_DIR/model.ckpt"; exit 0"#),
    );
    let desired = desired_one(1, 33, 1, &writing, Intent::Run);
    step_until(&mut executor, &desired, "its exit", is_exit).await;
    let kept = state.path().join("checkpoints/j-33/model.ckpt");
    assert_eq!(std::fs::read_to_string(&kept).unwrap().trim(), "step-7");
}

/// A restarted runtime re-finds its running job by pid file and the executor adopts it rather
/// than starting it twice; an unrelated process, even one whose pid a forged pid file names,
/// is never touched.
#[tokio::test]
async fn process_restarted_runtime_refinds_its_job_and_leaves_others_alone() {
    let state = tempfile::tempdir().unwrap();
    let spec = job_spec(None, shell(TRAPPING_JOB));
    let run = desired_one(1, 41, 1, &spec, Intent::Run);
    let first_pid = {
        let mut executor = process_executor(state.path());
        executor.step(&run).await;
        wait_ready(&state.path().join("checkpoints/j-41")).await;
        executor.handle(JobId(41), 1).unwrap().id.clone()
        // The executor and its runtime are dropped here: the agent "restarts".
    };

    // An unrelated process, and a forged pid file naming it with another start time.
    let mut unrelated = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let unrelated_pid = unrelated.id() as i32;
    let (_, real_start) = process_state(unrelated_pid).unwrap();
    let forged = serde_json::json!({
        "job": 99, "attempt": 1, "pid": unrelated_pid, "pgid": unrelated_pid,
        "start_time_ticks": real_start + 12345, "checkpoint_signal": "Sigterm",
        "grace_period_ms": 0, "log_path": "/dev/null"
    });
    std::fs::write(
        state.path().join(JOBS_DIR).join("j-99-1.json"),
        forged.to_string(),
    )
    .unwrap();

    let runtime = ProcessRuntime::new(state.path());
    let found = runtime.list_own().await.unwrap();
    let statuses: Vec<(JobId, JobStatus)> =
        found.iter().map(|f| (f.handle.job, f.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (JobId(41), JobStatus::Running),
            (JobId(99), JobStatus::Exited { code: None })
        ],
        "the job is found running; the forged record is not a live job of ours"
    );
    let forged_handle = JobHandle {
        job: JobId(99),
        attempt: 1,
        id: unrelated_pid.to_string(),
    };
    runtime.kill(&forged_handle).await.unwrap();
    runtime
        .signal(&forged_handle, quotient_common::Signal::Sigterm)
        .await
        .unwrap();
    assert_eq!(
        unrelated.try_wait().unwrap(),
        None,
        "an unrelated process must survive"
    );

    let mut executor = Executor::new(runtime, "node-1", state.path(), gpu_uuids());
    assert_eq!(executor.recover().await.unwrap(), 2);
    let reports = executor.step(&run).await;
    assert_eq!(
        events_of(&reports, 41, 1),
        vec![JobEvent::Running],
        "adopted, not started again"
    );
    assert_eq!(executor.handle(JobId(41), 1).unwrap().id, first_pid);
    assert_eq!(
        events_of(&reports, 99, 1),
        vec![JobEvent::ExitedAfterSignal { code: None }],
        "the stale record is reported gone and forgotten"
    );
    assert_eq!(unrelated.try_wait().unwrap(), None);

    // The adopted job still stops the normal way.
    let stop = desired_one(2, 41, 1, &spec, Intent::Stop);
    let reports = step_until(&mut executor, &stop, "the adopted job's exit", is_exit).await;
    assert_eq!(
        events_of(&reports, 41, 1),
        vec![JobEvent::ExitedAfterSignal { code: Some(0) }],
        "the exit code comes from the shim's exit file, though the agent is not its parent"
    );
    assert_eq!(unrelated.try_wait().unwrap(), None);
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
}

/// After a restart, a job of this agent's that the coordinators no longer want is killed at
/// once and reported as stopped.
#[tokio::test]
async fn process_found_job_that_is_not_desired_is_killed() {
    let state = tempfile::tempdir().unwrap();
    let spec = job_spec(None, shell(IGNORING_JOB));
    {
        let mut executor = process_executor(state.path());
        executor
            .step(&desired_one(1, 51, 1, &spec, Intent::Run))
            .await;
        wait_ready(&state.path().join("checkpoints/j-51")).await;
    }
    let mut executor = process_executor(state.path());
    assert_eq!(executor.recover().await.unwrap(), 1);
    let nothing = quotient_agent::reconcile::Desired {
        fence: 2,
        allocations: vec![],
    };
    let reports = step_until(&mut executor, &nothing, "the unknown job's exit", is_exit).await;
    assert_eq!(
        events_of(&reports, 51, 1),
        vec![JobEvent::ExitedAfterSignal { code: None }],
        "killed by SIGKILL with its shim, so no exit file: the code is unknown"
    );
    assert!(executor.runtime().list_own().await.unwrap().is_empty());
}

/// A job the runtime can never launch (an image on the process runtime) is tried a bounded
/// number of times, then reported once as a launch failure of the job with the runtime's
/// reason, and never tried again.
#[tokio::test]
async fn process_job_that_cannot_launch_is_reported_failed() {
    let state = tempfile::tempdir().unwrap();
    let mut executor = process_executor(state.path());
    let spec = job_spec(Some("trainer:1"), vec![]);
    let desired = desired_one(1, 61, 1, &spec, Intent::Run);
    let reports = step_until(&mut executor, &desired, "the launch failure", |report| {
        matches!(report.event, JobEvent::LaunchFailed { .. })
    })
    .await;
    assert_eq!(
        events_of(&reports, 61, 1),
        vec![JobEvent::LaunchFailed {
            fault: LaunchFault::Job,
            tries: LAUNCH_TRIES_MAX,
            message: "cannot launch j-61 attempt 1: the job names an image: run the agent with \
                      --runtime docker"
                .into()
        }]
    );
    assert!(executor.step(&desired).await.is_empty(), "not retried");
}

/// The issue's job: an environment execve refuses (E2BIG, "Argument list too long") is the
/// job's fault, said in words, not an I/O error of the node to retry forever.
#[tokio::test]
async fn process_launch_too_large_for_execve_is_the_jobs_fault() {
    let state = tempfile::tempdir().unwrap();
    let runtime = ProcessRuntime::new(state.path());
    let mut spec = launch(state.path(), 62, 1, None, shell("true"));
    // 8 MB: over execve's limit whatever the stack limit (at most 6 MiB when unlimited).
    for index in 0..80 {
        spec.env
            .insert(format!("LARGE_{index}"), "x".repeat(100_000));
    }
    let error = runtime.start(&spec).await.unwrap_err();
    assert!(
        matches!(error, RuntimeError::InvalidLaunch { .. }),
        "{error:?}"
    );
    assert_eq!(error.launch_fault(), LaunchFault::Job);
    let text = error.to_string();
    assert!(text.contains("too large to execute"), "{text}");
    assert!(text.contains("through a file"), "{text}");
}

/// With the orphan watchdog, a job under a live lease runs and exits as before (its exit code
/// recorded), and a job whose agent's lease file runs out gets its checkpoint signal from its
/// wrapper, without any agent, within the watchdog's slack and poll.
#[tokio::test]
async fn process_watchdog_stops_a_job_once_the_agents_lease_file_runs_out() {
    let state = tempfile::tempdir().unwrap();
    let lease_file = state.path().join(LEASE_FILE);
    let now_ms = boot_time_ms().expect("the boot clock");
    std::fs::write(&lease_file, format!("{}\n", now_ms + 60_000)).unwrap();
    let runtime = ProcessRuntime::new(state.path()).with_orphan_watchdog(&lease_file);

    let quick = launch(state.path(), 41, 1, None, shell("sleep 0.2; exit 3"));
    let handle = runtime.start(&quick).await.unwrap();
    let code = runtime
        .wait(&handle, WAIT_DEADLINE)
        .await
        .unwrap()
        .expect("the job exits");
    assert_eq!(
        code,
        Some(3),
        "the exit code is recorded as without a watchdog"
    );
    assert!(!runtime.stopped_by_watchdog(&handle), "it ended on its own");

    let trapping = launch(state.path(), 42, 1, None, shell(TRAPPING_JOB));
    let handle = runtime.start(&trapping).await.unwrap();
    wait_ready(&trapping.checkpoint_dir).await;
    give_the_watchdogs_time().await;
    assert_eq!(
        runtime.status(&handle).await.unwrap(),
        JobStatus::Running,
        "a live lease leaves the job alone"
    );

    let took = expire_the_lease_and_await_the_checkpoint(
        &lease_file,
        &trapping.checkpoint_dir.join("checkpoint"),
    )
    .await;
    assert!(
        took.as_millis() as u64 <= WATCHDOG_SLACK_MS + WATCHDOG_POLL_S * 1_000 + 1_500,
        "signalled only after {took:?}"
    );
    let code = runtime
        .wait(&handle, WAIT_DEADLINE)
        .await
        .unwrap()
        .expect("the job exits");
    assert_eq!(
        code,
        Some(0),
        "the job's own exit code after its checkpoint"
    );
    assert!(
        runtime.stopped_by_watchdog(&handle),
        "the watchdog stopped it: a stop by the agent, not the job's own exit"
    );
    let log = std::fs::read_to_string(&trapping.log_path).unwrap();
    assert!(log.contains("the agent's lease ran out"), "{log}");
}
