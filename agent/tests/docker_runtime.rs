//! The Docker runtime against the real daemon, with an image built offline by
//! `tests/docker/build-test-image.sh` (busybox-static, `docker import`): environment and GPUs,
//! the checkpoint signal, preemption (trapped and ignored signals), exit codes,
//! re-adoption by label after a restart without touching other containers, and the orphan
//! watchdog.
//!
//! Without a reachable daemon these tests fail when `CI=true` (they must never be skipped
//! there) and otherwise skip with a loud message.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

use quotient_agent::executor::{Executor, ACT_CALL_MS, START_CALL_MS};
use quotient_agent::lease::{boot_time_ms, LEASE_FILE};
use quotient_agent::reconcile::{Desired, Intent};
use quotient_agent::runtime::docker::{
    watchdog_lock, watchdog_log, DockerRuntime, LABEL_ATTEMPT, LABEL_JOB, LABEL_NODE, WATCHDOGS_DIR,
};
use quotient_agent::runtime::process::{WATCHDOG_POLL_S, WATCHDOG_SLACK_MS};
use quotient_agent::runtime::{JobStatus, Runtime, RuntimeError};
use quotient_common::job::LaunchFault;
use quotient_common::{JobEvent, JobId, Signal};
use support::docker::{
    ensure_image, unavailable, watchdog_pids, DaemonProxy, RemoveContainers, IMAGE,
};
use support::*;

/// A script that checkpoints on SIGUSR1: writes a file, then exits 0.
const TRAPPING_JOB: &str = r#"trap 'echo checkpointed > "$QUOTIENT_CHECKPOINT_DIR/checkpoint"; exit 0' USR1
echo ready > "$QUOTIENT_CHECKPOINT_DIR/ready"
while :; do sleep 0.05; done"#;
/// A script with no handler for its checkpoint signal: as PID 1 of the container it ignores it.
const IGNORING_JOB: &str = r#"echo ready > "$QUOTIENT_CHECKPOINT_DIR/ready"
while :; do sleep 0.05; done"#;

/// A runtime for a node name unique to this test, with its state dir, or `None` (skip)
/// outside CI.
async fn runtime_for(
    test: &str,
) -> Option<(DockerRuntime, String, RemoveContainers, tempfile::TempDir)> {
    let node = format!("dt-{}-{test}", std::process::id());
    let state = tempfile::tempdir().unwrap();
    let runtime = match DockerRuntime::connect(&node, state.path(), false).await {
        Ok(runtime) => runtime,
        Err(error) => {
            unavailable(format!("the Docker daemon is not reachable: {error}"));
            return None;
        }
    };
    if let Err(why) = ensure_image() {
        unavailable(why);
        return None;
    }
    let cleanup = RemoveContainers(vec![format!("label={LABEL_NODE}={node}")]);
    Some((runtime, node, cleanup, state))
}

/// The agent's lease file in `state`, written to run for another minute.
fn live_lease(state: &std::path::Path) -> std::path::PathBuf {
    let lease_file = state.join(LEASE_FILE);
    let now_ms = boot_time_ms().expect("the boot clock");
    std::fs::write(&lease_file, format!("{}\n", now_ms + 60_000)).unwrap();
    lease_file
}

/// `runtime` giving its containers watchdogs (this test build's agent binary) that read a
/// live lease file in `state`; with that file.
fn with_watchdogs(
    runtime: DockerRuntime,
    state: &std::path::Path,
) -> (DockerRuntime, std::path::PathBuf) {
    let lease_file = live_lease(state);
    let agent = std::path::Path::new(env!("CARGO_BIN_EXE_quotient-agent"));
    (
        runtime.with_orphan_watchdog(agent, &lease_file, state),
        lease_file,
    )
}

async fn wait_ready(dir: &std::path::Path) {
    let ready = dir.join("ready");
    wait_for("the container job to start", || {
        let exists = ready.exists();
        async move { exists.then_some(()) }
    })
    .await;
}

fn gpu_uuids() -> BTreeMap<u32, String> {
    BTreeMap::from([(0, "GPU-zero".to_string())])
}

/// A container job gets Quotient's environment (GPUs renumbered from 0, UUIDs as they are),
/// the checkpoint dir at the same path, its labels, and its logs can be read.
#[tokio::test]
async fn docker_job_gets_its_environment_and_gpus() {
    let Some((runtime, node, _cleanup, state)) = runtime_for("env").await else {
        return;
    };
    let spec = launch(
        state.path(),
        11,
        2,
        Some(IMAGE),
        shell(r#"env > "$QUOTIENT_CHECKPOINT_DIR/env.txt"; echo hello-from-the-container"#),
    );
    let handle = runtime.start(&spec).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(0)));
    let env = std::fs::read_to_string(spec.checkpoint_dir.join("env.txt")).unwrap();
    for line in [
        "QUOTIENT_JOB_ID=j-11",
        "QUOTIENT_ATTEMPT=2",
        &format!("QUOTIENT_CHECKPOINT_DIR={}", spec.checkpoint_dir.display()),
        "CUDA_VISIBLE_DEVICES=0,1",
        "NVIDIA_VISIBLE_DEVICES=GPU-one,GPU-three",
        "TRAIN_EPOCHS=3",
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from:\n{env}"
        );
    }
    let logs = runtime.logs(&handle).await.unwrap();
    assert!(logs.contains("hello-from-the-container"), "{logs}");

    let labels = Command::new("docker")
        .args(["inspect", "--format", "{{json .Config.Labels}}", &handle.id])
        .output()
        .unwrap();
    let labels: BTreeMap<String, String> = serde_json::from_slice(&labels.stdout).unwrap();
    assert_eq!(labels[LABEL_JOB], "j-11");
    assert_eq!(labels[LABEL_ATTEMPT], "2");
    assert_eq!(labels[LABEL_NODE], node);

    runtime.remove(&handle).await.unwrap();
    assert!(runtime.list_own().await.unwrap().is_empty());
}

/// A container that writes far more than the log cap keeps only about the cap of its newest
/// output, through the daemon's rotation (without the cap Docker keeps all of it).
#[tokio::test]
async fn docker_log_is_capped_by_the_daemons_rotation() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("logcap").await else {
        return;
    };
    let cap: u64 = 256 * 1024;
    let runtime = runtime.with_log_cap(cap).await;
    let spec = launch(
        state.path(),
        31,
        1,
        Some(IMAGE),
        shell(
            r#"echo first line; i=0; while [ $i -lt 40000 ]; do echo "line $i of the container output"; i=$((i+1)); done; echo last line"#,
        ),
    );
    let handle = runtime.start(&spec).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(0)));
    let output = Command::new("docker")
        .args(["logs", &handle.id])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.ends_with("last line\n"), "the newest output stays");
    assert!(
        text.len() as u64 <= cap,
        "{} bytes of log kept for a cap of {cap}",
        text.len()
    );
    assert!(
        !text.contains("first line"),
        "the oldest output is rotated away"
    );
    runtime.remove(&handle).await.unwrap();
}

/// The checkpoint signal reaches the container's job, which checkpoints and exits.
#[tokio::test]
async fn docker_checkpoint_signal_reaches_the_job() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("signal").await else {
        return;
    };
    let spec = launch(state.path(), 12, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let handle = runtime.start(&spec).await.unwrap();
    wait_ready(&spec.checkpoint_dir).await;
    assert_eq!(runtime.status(&handle).await.unwrap(), JobStatus::Running);
    runtime.signal(&handle, Signal::Sigusr1).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(0)));
    let checkpoint = std::fs::read_to_string(spec.checkpoint_dir.join("checkpoint")).unwrap();
    assert_eq!(checkpoint.trim(), "checkpointed");
}

/// Preemption of a container job that traps its signal: reported as after-signal.
#[tokio::test]
async fn docker_preempted_job_that_traps_the_signal_is_reported_after_signal() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("trap").await else {
        return;
    };
    let mut executor = Executor::new(runtime, "node-1", state.path(), gpu_uuids());
    let spec = job_spec(Some(IMAGE), shell(TRAPPING_JOB));
    let reports = executor
        .step(&desired_one(1, 21, 1, &spec, Intent::Run))
        .await;
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
    assert!(
        executor.runtime().list_own().await.unwrap().is_empty(),
        "the exited container is removed"
    );
}

/// A container job that ignores its checkpoint signal is killed when its grace period ends.
#[tokio::test]
async fn docker_job_that_ignores_the_signal_is_killed_after_the_grace_period() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("ignore").await else {
        return;
    };
    let mut executor = Executor::new(runtime, "node-1", state.path(), gpu_uuids());
    let spec = job_spec(Some(IMAGE), shell(IGNORING_JOB));
    executor
        .step(&desired_one(1, 22, 1, &spec, Intent::Run))
        .await;
    wait_ready(&state.path().join("checkpoints/j-22")).await;
    let stop = desired_one(2, 22, 1, &spec, Intent::Stop);
    let signalled = Instant::now();
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
        vec![JobEvent::ExitedAfterSignal { code: Some(137) }]
    );
    assert!(
        elapsed.as_millis() >= u128::from(SHORT_GRACE_MS),
        "killed after {elapsed:?}, before the {SHORT_GRACE_MS} ms grace period"
    );
}

/// Container exit codes are reported as they are: 0 and non-zero.
#[tokio::test]
async fn docker_exit_codes_are_reported() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("codes").await else {
        return;
    };
    let mut executor = Executor::new(runtime, "node-1", state.path(), gpu_uuids());
    let ok = job_spec(Some(IMAGE), shell("exit 0"));
    let failing = job_spec(Some(IMAGE), shell("echo failing >&2; exit 3"));
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
}

/// A job whose image is not on the host fails to launch with a reason, as the node's fault
/// (another host may have the image), and nothing is pulled.
#[tokio::test]
async fn docker_missing_image_fails_the_launch_without_pulling() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("noimage").await else {
        return;
    };
    let spec = launch(
        state.path(),
        13,
        1,
        Some("quotient-test-absent:never"),
        shell("true"),
    );
    let error = runtime.start(&spec).await.unwrap_err();
    assert!(
        matches!(error, RuntimeError::ImageMissing { .. }),
        "{error:?}"
    );
    assert_eq!(error.launch_fault(), LaunchFault::Node);
    let text = error.to_string();
    assert!(
        text.contains("image quotient-test-absent:never is not present on node dt-")
            && text.contains("images are never pulled"),
        "{text}"
    );
}

/// Through the host runtime, a launch that finds its image gone asks for the host info to be
/// looked at again at once (found by probing: a node went on offering a removed image until
/// its next look, 30 s later, and the job was placed there again and again until it failed).
#[tokio::test]
async fn host_runtime_rechecks_the_host_when_an_image_is_missing() {
    let Some((_runtime, node, _cleanup, state)) = runtime_for("recheck").await else {
        return;
    };
    let host = quotient_agent::runtime::host::HostRuntime::new(
        &node,
        quotient_agent::runtime::process::ProcessRuntime::new(state.path()),
        Some(quotient_agent::runtime::host::DockerSetup {
            node: node.clone(),
            state_dir: state.path().to_path_buf(),
            gpu_device_requests: false,
            log_max_bytes: None,
            watchdog: None,
            user: quotient_agent::runtime::JobUser::current(),
            pids_max: None,
        }),
    );
    let recheck = host.recheck_wanted();
    tokio::pin!(recheck);
    let spec = launch(
        state.path(),
        15,
        1,
        Some("quotient-test-absent:never"),
        shell("true"),
    );
    let error = host.start(&spec).await.unwrap_err();
    assert!(
        matches!(error, RuntimeError::ImageMissing { .. }),
        "{error:?}"
    );
    tokio::time::timeout(std::time::Duration::from_secs(1), recheck)
        .await
        .expect("the host info is asked to look again");
}

/// A command the image cannot execute is refused by the daemon when the container starts:
/// the job's fault, with the daemon's words, and no container is left behind.
#[tokio::test]
async fn docker_command_the_image_cannot_execute_is_the_jobs_fault() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("nocommand").await else {
        return;
    };
    let spec = launch(
        state.path(),
        14,
        1,
        Some(IMAGE),
        vec!["/no/such/command".into()],
    );
    let error = runtime.start(&spec).await.unwrap_err();
    assert!(
        matches!(error, RuntimeError::InvalidLaunch { .. }),
        "{error:?}"
    );
    assert_eq!(error.launch_fault(), LaunchFault::Job);
    let text = error.to_string();
    assert!(text.contains("/no/such/command"), "{text}");
    assert!(
        runtime.list_own().await.unwrap().is_empty(),
        "the container that could not start is removed"
    );
}

/// After a restart the runtime re-finds its container by label and the executor adopts it
/// instead of starting it again; containers of another node or with no labels are untouched.
#[tokio::test]
async fn docker_restarted_runtime_readopts_by_label_and_leaves_others_alone() {
    let Some((first, node, mut cleanup, state)) = runtime_for("adopt").await else {
        return;
    };
    let spec = job_spec(Some(IMAGE), shell(TRAPPING_JOB));
    let run = desired_one(1, 41, 1, &spec, Intent::Run);
    let container = {
        let mut executor = Executor::new(first, &node, state.path(), gpu_uuids());
        executor.step(&run).await;
        wait_ready(&state.path().join("checkpoints/j-41")).await;
        executor.handle(JobId(41), 1).unwrap().id.clone()
        // The executor and its runtime are dropped here: the agent "restarts".
    };

    // Another node's container (same labels, other node) and an unlabelled one.
    let other_node = format!("{node}-other");
    cleanup.0.push(format!("label={LABEL_NODE}={other_node}"));
    let other_state = tempfile::tempdir().unwrap();
    let other = DockerRuntime::connect(&other_node, other_state.path(), false)
        .await
        .unwrap();
    let other_handle = other
        .start(&launch(
            other_state.path(),
            41,
            1,
            Some(IMAGE),
            shell("sleep 60"),
        ))
        .await
        .unwrap();
    let unlabelled_name = format!("{node}-unlabelled");
    let unlabelled = Command::new("docker")
        .args([
            "run",
            "-d",
            "--name",
            &unlabelled_name,
            IMAGE,
            "sleep",
            "60",
        ])
        .output()
        .unwrap();
    assert!(unlabelled.status.success(), "{unlabelled:?}");
    cleanup.0.push(format!("name={unlabelled_name}"));

    let runtime = DockerRuntime::connect(&node, state.path(), false)
        .await
        .unwrap();
    let found = runtime.list_own().await.unwrap();
    assert_eq!(found.len(), 1, "only this node's container: {found:?}");
    assert_eq!(found[0].handle.id, container);
    assert_eq!(found[0].status, JobStatus::Running);
    assert_eq!(found[0].checkpoint_signal, Signal::Sigusr1);
    assert_eq!(found[0].grace_period_ms, SHORT_GRACE_MS);

    let mut executor = Executor::new(runtime, &node, state.path(), gpu_uuids());
    assert_eq!(executor.recover().await.unwrap(), 1);
    let reports = executor.step(&run).await;
    assert_eq!(
        events_of(&reports, 41, 1),
        vec![JobEvent::Running],
        "adopted, not started again"
    );
    let stop = desired_one(2, 41, 1, &spec, Intent::Stop);
    let reports = step_until(&mut executor, &stop, "the adopted job's exit", is_exit).await;
    assert_eq!(
        events_of(&reports, 41, 1),
        vec![JobEvent::ExitedAfterSignal { code: Some(0) }]
    );

    assert_eq!(
        other.status(&other_handle).await.unwrap(),
        JobStatus::Running,
        "another node's container is untouched"
    );
    let running = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{.State.Running}}",
            &unlabelled_name,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&running.stdout).trim(), "true");
}

/// With the orphan watchdog (the `quotient-agent` binary, as the agent starts it), a container
/// under a live lease runs on untouched; once the agent's lease file runs out, with no agent
/// around, the watchdog sends a trapping job its checkpoint signal (it checkpoints and exits
/// 0) and kills a job that ignores it after its grace period. A second watchdog for the same
/// container (a restarted agent adopting it) exits at once, and a watchdog that had nothing to
/// do leaves no files behind.
#[tokio::test]
async fn docker_watchdog_stops_containers_once_the_agents_lease_file_runs_out() {
    let Some((runtime, node, _cleanup, state)) = runtime_for("watchdog").await else {
        return;
    };
    let (runtime, lease_file) = with_watchdogs(runtime, state.path());
    let watchdogs = state.path().join(WATCHDOGS_DIR);

    let quick = launch(state.path(), 51, 1, Some(IMAGE), shell("sleep 0.2; exit 3"));
    let handle = runtime.start(&quick).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(
        code,
        Some(Some(3)),
        "a live lease leaves the exit code alone"
    );
    assert!(
        !runtime.stopped_by_watchdog(&handle),
        "its own exit under a live lease"
    );
    let quick_log = watchdog_log(&watchdogs, &handle.id);
    wait_for("the quick job's watchdog to clean up after itself", || {
        let gone = !quick_log.exists() && !watchdog_lock(&watchdogs, &handle.id).exists();
        async move { gone.then_some(()) }
    })
    .await;

    let trapping = launch(state.path(), 52, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let trapping_handle = runtime.start(&trapping).await.unwrap();
    let ignoring = launch(state.path(), 53, 1, Some(IMAGE), shell(IGNORING_JOB));
    let ignoring_handle = runtime.start(&ignoring).await.unwrap();
    wait_ready(&trapping.checkpoint_dir).await;
    wait_ready(&ignoring.checkpoint_dir).await;
    // Adopting both again starts no second watchdog that acts: it finds the lock taken.
    let agent = std::path::Path::new(env!("CARGO_BIN_EXE_quotient-agent"));
    let adopting = DockerRuntime::connect(&node, state.path(), false)
        .await
        .unwrap()
        .with_orphan_watchdog(agent, &lease_file, state.path());
    assert_eq!(adopting.list_own().await.unwrap().len(), 3);
    give_the_watchdogs_time().await;
    for handle in [&trapping_handle, &ignoring_handle] {
        assert_eq!(
            runtime.status(handle).await.unwrap(),
            JobStatus::Running,
            "a live lease leaves the container alone"
        );
    }

    let took = expire_the_lease_and_await_the_checkpoint(
        &lease_file,
        &trapping.checkpoint_dir.join("checkpoint"),
    )
    .await;
    assert!(
        took.as_millis() as u64 <= WATCHDOG_SLACK_MS + WATCHDOG_POLL_S * 1_000 + 2_500,
        "signalled only after {took:?}"
    );
    let code = runtime.wait(&trapping_handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(
        code,
        Some(Some(0)),
        "the job's own exit after its checkpoint"
    );
    let code = runtime.wait(&ignoring_handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(137)), "killed after its grace period");
    let log = std::fs::read_to_string(watchdog_log(&watchdogs, &ignoring_handle.id)).unwrap();
    assert!(log.contains("the agent's lease ran out"), "{log}");
    assert!(log.contains("grace period over"), "{log}");
    let signals = log.matches("stopping the container").count();
    assert_eq!(signals, 1, "one watchdog acted, not two:\n{log}");
    // Found by probing: a container its watchdog stopped was reported, after the agent came
    // back, as the job's own exit (SUCCEEDED for this one's exit 0), not as the agent's stop.
    for handle in [&trapping_handle, &ignoring_handle] {
        assert!(
            runtime.stopped_by_watchdog(handle),
            "the stop is on record for {handle:?}"
        );
        runtime.remove(handle).await.unwrap();
        assert!(
            !watchdogs.join(format!("{}.stopped", handle.id)).exists(),
            "the record goes with the container"
        );
    }
}

/// The Docker daemon hangs as the agent's lease runs out: each container's watchdog, which
/// learnt the container's init process while the daemon answered, signals that process
/// directly, and kills it after its grace period, rather than waiting for the daemon while
/// the job runs again elsewhere (found by probing, with the daemon frozen and the agent
/// down: its containers ran on past the lease).
#[tokio::test]
async fn docker_watchdog_stops_its_container_while_the_daemon_hangs() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("frozenwatch").await else {
        return;
    };
    let trapping = launch(state.path(), 66, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let trapping_handle = runtime.start(&trapping).await.unwrap();
    let ignoring = launch(state.path(), 67, 1, Some(IMAGE), shell(IGNORING_JOB));
    let ignoring_handle = runtime.start(&ignoring).await.unwrap();
    wait_ready(&trapping.checkpoint_dir).await;
    wait_ready(&ignoring.checkpoint_dir).await;
    // Each watchdog reaches the daemon through a proxy, as the agent's would through a
    // daemon that is about to hang.
    let lease_file = live_lease(state.path());
    let proxy = DaemonProxy::start(state.path());
    let dir = state.path().join(WATCHDOGS_DIR);
    /// Kills the watchdogs however the test ends.
    struct Watchdogs(Vec<std::process::Child>);
    impl Drop for Watchdogs {
        fn drop(&mut self) {
            for watchdog in &mut self.0 {
                let _ = watchdog.kill();
                let _ = watchdog.wait();
            }
        }
    }
    let mut watchdogs = Watchdogs(Vec::new());
    watchdogs.0 = [&trapping_handle, &ignoring_handle]
        .into_iter()
        .map(|handle| {
            std::fs::create_dir_all(&dir).unwrap();
            let log = std::fs::File::create(dir.join(format!("{}.test.log", handle.id))).unwrap();
            Command::new(env!("CARGO_BIN_EXE_quotient-agent"))
                .args([
                    "container-watchdog",
                    "--container",
                    &handle.id,
                    "--lease-file",
                ])
                .arg(&lease_file)
                .arg("--dir")
                .arg(&dir)
                .args(["--signal", "SIGUSR1", "--grace-period-ms", "1000"])
                .env("DOCKER_HOST", format!("unix://{}", proxy.socket.display()))
                .stderr(log)
                .spawn()
                .unwrap()
        })
        .collect();
    // They look at their containers while the daemon answers (every second).
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    proxy.swallow(&["HTTP/1.1"]);
    let now_ms = boot_time_ms().expect("the boot clock");
    std::fs::write(&lease_file, format!("{}\n", now_ms - 60_000)).unwrap();
    for (watchdog, handle) in watchdogs
        .0
        .iter_mut()
        .zip([&trapping_handle, &ignoring_handle])
    {
        wait_for("the watchdog to stop its container and end", || {
            let ended = watchdog.try_wait().unwrap().is_some();
            async move { ended.then_some(()) }
        })
        .await;
        let log = std::fs::read_to_string(dir.join(format!("{}.test.log", handle.id))).unwrap();
        assert!(
            log.contains("sent it to the container's init process directly"),
            "{log}"
        );
        // The daemon, asked directly, knows the container has exited.
        assert_eq!(
            container_status(&handle.id).as_deref(),
            Some("exited"),
            "{log}"
        );
    }
    assert!(
        trapping.checkpoint_dir.join("checkpoint").exists(),
        "the trapping job got its checkpoint signal"
    );
    drop(proxy);
}

/// A container's watchdog that dies (killed by hand, by the OOM killer) is started again by
/// the agent as it asks about the container, and the new one stops the container once the
/// lease runs out. Before, the container ran on without one.
#[tokio::test]
async fn docker_watchdog_that_dies_is_started_again() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("wdagain").await else {
        return;
    };
    let (runtime, lease_file) = with_watchdogs(runtime, state.path());
    let trapping = launch(state.path(), 55, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let handle = runtime.start(&trapping).await.unwrap();
    wait_ready(&trapping.checkpoint_dir).await;
    let first = wait_for("the watchdog to run", || {
        let pids = watchdog_pids(&handle.id);
        async move { (pids.len() == 1).then(|| pids[0]) }
    })
    .await;
    // SAFETY: kill(2) of a process this test's runtime started.
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
    let again = wait_for("a watchdog started again", || {
        let runtime = &runtime;
        let handle = &handle;
        async move {
            assert_eq!(runtime.status(handle).await.unwrap(), JobStatus::Running);
            let pids = watchdog_pids(&handle.id);
            (pids.len() == 1 && pids[0] != first).then(|| pids[0])
        }
    })
    .await;
    assert_ne!(again, first);
    expire_the_lease_and_await_the_checkpoint(
        &lease_file,
        &trapping.checkpoint_dir.join("checkpoint"),
    )
    .await;
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(0)));
    assert!(
        runtime.stopped_by_watchdog(&handle),
        "the new watchdog's stop"
    );
}

/// A watchdog that cannot reach the Docker daemon when it starts keeps trying, and stops the
/// container once the lease runs out (found by probing: a daemon hung as the watchdog
/// started, the watchdog gave up, the agent was killed, and the job ran on beside its next
/// attempt). The daemon is reached through a socket that only starts forwarding later.
#[tokio::test]
async fn docker_watchdog_that_cannot_reach_the_daemon_at_first_keeps_trying() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("wdconnect").await else {
        return;
    };
    let lease_file = live_lease(state.path());
    let trapping = launch(state.path(), 54, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let handle = runtime.start(&trapping).await.unwrap();
    wait_ready(&trapping.checkpoint_dir).await;

    let socket = state.path().join("late-docker.sock");
    let watchdogs = state.path().join(WATCHDOGS_DIR);
    std::fs::create_dir_all(&watchdogs).unwrap();
    let log = std::fs::File::create(watchdog_log(&watchdogs, &handle.id)).unwrap();
    let agent = env!("CARGO_BIN_EXE_quotient-agent");
    let mut watchdog = tokio::process::Command::new(agent)
        .args([
            "container-watchdog",
            "--container",
            &handle.id,
            "--lease-file",
        ])
        .arg(&lease_file)
        .arg("--dir")
        .arg(&watchdogs)
        .args(["--signal", "SIGUSR1", "--grace-period-ms", "20000"])
        .env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    give_the_watchdogs_time().await;
    assert!(
        watchdog.try_wait().unwrap().is_none(),
        "the watchdog waits for the daemon rather than exiting"
    );

    // The daemon answers on that socket from now on.
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let daemon = support::docker::daemon_socket();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let daemon = daemon.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::UnixStream::connect(&daemon).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    expire_the_lease_and_await_the_checkpoint(
        &lease_file,
        &trapping.checkpoint_dir.join("checkpoint"),
    )
    .await;
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(0)));
    assert!(
        watchdogs.join(format!("{}.stopped", handle.id)).exists(),
        "the watchdog recorded its stop"
    );
    let _ = watchdog.kill().await;
}

/// What the daemon says of container `name`: its status (`created`, `running`, `exited`...),
/// or `None` when there is none.
fn container_status(name: &str) -> Option<String> {
    let output = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Status}}", name])
        .output()
        .unwrap();
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// A runtime whose calls go through a [`DaemonProxy`] and time out after a second.
async fn proxied_runtime(node: &str, state: &std::path::Path) -> (DockerRuntime, DaemonProxy) {
    let proxy = DaemonProxy::start(state);
    let docker = proxy.client(1).await;
    (
        DockerRuntime::on(docker, node, state, false).unwrap(),
        proxy,
    )
}

/// A `docker create` whose answer never came (the call timed out) but which the daemon carried
/// out is settled by looking the attempt's container up by its name: that container is
/// started, within the same try or, when the daemon did not say then, at the next, rather
/// than the attempt refused as already running (found by probing, with the daemon frozen).
#[tokio::test]
async fn docker_create_that_timed_out_but_was_carried_out_is_settled_by_name() {
    let Some((_, node, _cleanup, state)) = runtime_for("createlate").await else {
        return;
    };
    let (runtime, proxy) = proxied_runtime(&node, state.path()).await;
    let spec = launch(state.path(), 60, 1, Some(IMAGE), shell(TRAPPING_JOB));
    proxy.hold(&["/containers/create"]);
    let handle = runtime.start(&spec).await.expect("settled within the try");
    proxy.release();
    wait_ready(&spec.checkpoint_dir).await;
    assert_eq!(container_status(&handle.id).as_deref(), Some("running"));
    runtime.kill(&handle).await.unwrap();

    // The daemon answers neither the create nor the look-up by name: the try fails.
    let spec = launch(state.path(), 61, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let name = runtime.container_name(spec.job, spec.attempt);
    proxy.hold(&["/containers/create", "/json "]);
    let error = runtime.start(&spec).await.unwrap_err();
    assert!(
        matches!(error, RuntimeError::NoAnswer { .. }),
        "the call timed out: {error}"
    );
    proxy.release();
    assert_eq!(
        container_status(&name).as_deref(),
        Some("created"),
        "the daemon carried the create out"
    );
    let handle = runtime.start(&spec).await.expect("the next try starts it");
    wait_ready(&spec.checkpoint_dir).await;
    assert_eq!(runtime.status(&handle).await.unwrap(), JobStatus::Running);
    assert_eq!(container_status(&handle.id).as_deref(), Some("running"));
    runtime.kill(&handle).await.unwrap();
}

/// A `docker create` refused because the attempt's name was taken, after which no container
/// has that name: an earlier try's create or clean-up, held up in a daemon that hung, is
/// being carried out. That is unsettled, to be looked at again, not "already running" (found
/// by probing, with the daemon frozen: the attempt was refused as already running, and a
/// container made late was left behind until the agent restarted).
#[tokio::test]
async fn docker_create_refused_for_a_name_no_container_then_has_is_unsettled() {
    let Some((_, node, _cleanup, state)) = runtime_for("namefreed").await else {
        return;
    };
    let (runtime, proxy) = proxied_runtime(&node, state.path()).await;
    let spec = launch(state.path(), 64, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let name = runtime.container_name(spec.job, spec.attempt);
    let made = Command::new("docker")
        .args(["create", "--name", &name, IMAGE, "true"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    // The create is refused (the name is taken) while its answer is held; the container is
    // gone by the time the answer comes and the attempt's container is looked up.
    proxy.hold(&["/containers/create"]);
    let freed = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let removed = tokio::process::Command::new("docker")
            .args(["rm", "-f", &name])
            .output()
            .await
            .unwrap();
        assert!(removed.status.success(), "{removed:?}");
        proxy.release();
    };
    let (started, ()) = tokio::join!(runtime.start(&spec), freed);
    let error = started.expect_err("the name was taken when the daemon looked");
    assert!(
        matches!(error, RuntimeError::Unsettled { .. }) && error.unsettled(),
        "not settled either way: {error}"
    );
    let handle = runtime.start(&spec).await.expect("the next try starts it");
    wait_ready(&spec.checkpoint_dir).await;
    assert_eq!(container_status(&handle.id).as_deref(), Some("running"));
    runtime.kill(&handle).await.unwrap();
}

/// A `docker start` whose answer never came but which the daemon carried out: the container
/// runs as the attempt, and is neither killed nor started a second time.
#[tokio::test]
async fn docker_start_that_timed_out_but_was_carried_out_keeps_the_container() {
    let Some((_, node, _cleanup, state)) = runtime_for("startlate").await else {
        return;
    };
    let (runtime, proxy) = proxied_runtime(&node, state.path()).await;
    let spec = launch(state.path(), 62, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let name = runtime.container_name(spec.job, spec.attempt);
    proxy.hold(&["/start "]);
    let handle = runtime
        .start(&spec)
        .await
        .expect("the container found running is the attempt");
    proxy.release();
    wait_ready(&spec.checkpoint_dir).await;
    assert_eq!(runtime.status(&handle).await.unwrap(), JobStatus::Running);
    assert_eq!(container_status(&name).as_deref(), Some("running"));
    // Its checkpoint signal still reaches it: the attempt is the runtime's as any other.
    runtime.signal(&handle, Signal::Sigusr1).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(0)));
    assert!(spec.checkpoint_dir.join("checkpoint").exists());
}

/// A launch whose start, look-up by name and clean-up all got no answer, while the daemon
/// started the container: once the attempt is no longer tried (here: cancelled), the executor
/// removes that container as soon as the daemon answers, rather than leaving it running
/// beside the job's next placement (found by probing, with the daemon frozen).
#[tokio::test]
async fn docker_container_of_a_launch_given_up_unsettled_is_removed() {
    let Some((_, node, _cleanup, state)) = runtime_for("abandon").await else {
        return;
    };
    let (runtime, proxy) = proxied_runtime(&node, state.path()).await;
    let name = runtime.container_name(JobId(63), 1);
    let mut executor = Executor::new(runtime, "node-1", state.path(), gpu_uuids());
    let spec = job_spec(Some(IMAGE), shell(TRAPPING_JOB));
    proxy.hold(&["/start ", "/json "]);
    proxy.swallow(&["DELETE "]);
    let reports = executor
        .step(&desired_one(1, 63, 1, &spec, Intent::Run))
        .await;
    assert!(
        events_of(&reports, 63, 1).is_empty(),
        "the launch failed and is to be tried again: {reports:?}"
    );
    wait_ready(&state.path().join("checkpoints/j-63")).await;
    assert_eq!(container_status(&name).as_deref(), Some("running"));
    // Cancelled: no longer desired, so not tried again.
    let cancelled = Desired {
        fence: 2,
        allocations: Vec::new(),
    };
    executor.step(&cancelled).await;
    proxy.release();
    let gone = async {
        let deadline = Instant::now() + WAIT_DEADLINE;
        while container_status(&name).is_some() && Instant::now() < deadline {
            executor.step(&cancelled).await;
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        container_status(&name).is_none()
    };
    assert!(gone.await, "the container was removed");
}

/// A daemon that does not answer holds a round up for [`START_CALL_MS`] at most for a start,
/// and [`ACT_CALL_MS`] for a signal, not for its client's whole deadline (30 s in the agent,
/// a minute here); what it did meanwhile is settled once it answers.
#[tokio::test]
async fn a_daemon_that_does_not_answer_holds_a_round_up_for_a_bounded_time() {
    let Some((_, node, _cleanup, state)) = runtime_for("bounded").await else {
        return;
    };
    let proxy = DaemonProxy::start(state.path());
    let runtime = DockerRuntime::on(proxy.client(60).await, &node, state.path(), false).unwrap();
    let mut executor = Executor::new(runtime, "node-1", state.path(), gpu_uuids());
    let spec = job_spec(Some(IMAGE), shell(TRAPPING_JOB));
    let run = desired_one(1, 64, 1, &spec, Intent::Run);
    proxy.hold(&["/containers/create"]);
    let round = Instant::now();
    let reports = executor.step(&run).await;
    let took = round.elapsed();
    assert!(events_of(&reports, 64, 1).is_empty(), "{reports:?}");
    assert!(
        took.as_millis() as u64 <= START_CALL_MS + 5_000,
        "a hung create held the round {took:?}"
    );
    proxy.release();
    let reports = step_until(&mut executor, &run, "the retried launch", |report| {
        report.event == JobEvent::Running
    })
    .await;
    assert_eq!(
        events_of(&reports, 64, 1),
        vec![JobEvent::Started, JobEvent::Running],
        "settled by name: started once"
    );
    wait_ready(&state.path().join("checkpoints/j-64")).await;

    proxy.hold(&["/kill"]);
    let stop = desired_one(2, 64, 1, &spec, Intent::Stop);
    let round = Instant::now();
    executor.step(&stop).await;
    let took = round.elapsed();
    assert!(
        took.as_millis() as u64 <= ACT_CALL_MS + 5_000,
        "a hung signal held the round {took:?}"
    );
    proxy.release();
    let reports = step_until(&mut executor, &stop, "the preempted exit", is_exit).await;
    assert!(
        reports
            .iter()
            .any(|report| report.event == JobEvent::ExitedAfterSignal { code: Some(0) }),
        "{reports:?}"
    );
}

/// A job's container started again from outside (`docker restart`) ran the job again from
/// its start inside the same attempt, unknown to the coordinators (found by probing). It is
/// now stopped, and the attempt reported as stopped (no exit code: the job goes back to the
/// queue), not left running.
#[tokio::test]
async fn docker_container_restarted_outside_is_stopped_and_reported_stopped() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("restarted").await else {
        return;
    };
    let spec = launch(state.path(), 65, 1, Some(IMAGE), shell(TRAPPING_JOB));
    let handle = runtime.start(&spec).await.unwrap();
    wait_ready(&spec.checkpoint_dir).await;
    assert_eq!(runtime.status(&handle).await.unwrap(), JobStatus::Running);
    let restarted = Command::new("docker")
        .args(["restart", "-t", "0", &handle.id])
        .output()
        .unwrap();
    assert!(restarted.status.success(), "{restarted:?}");
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(None), "reported as stopped, not by an exit code");
    assert_eq!(
        container_status(&handle.id).as_deref(),
        Some("exited"),
        "not left running"
    );
}

/// The lines a container job prints (`line 0` to `line N-1` on stdout, then a traceback on
/// stderr) before it exits 3.
fn printing_job(lines: u32, pause_every: u32) -> Vec<String> {
    shell(&format!(
        r#"i=0; while [ $i -lt {lines} ]; do echo "line $i"; i=$((i+1)); if [ $((i % {pause_every})) = 0 ]; then sleep 0.05; fi; done; echo "Traceback: boom" >&2; exit 3"#
    ))
}

/// The lines `printing_job` prints, sorted (stdout and stderr may interleave either way).
fn printed_lines(lines: u32) -> Vec<String> {
    let mut expected: Vec<String> = (0..lines).map(|i| format!("line {i}")).collect();
    expected.push("Traceback: boom".into());
    expected.sort();
    expected
}

fn sorted_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

/// Reads the attempt's log whole through the log server, chunk by chunk, as the leader does.
async fn read_through_the_log_server(state: &std::path::Path, node: &str, job: u64) -> String {
    use quotient_agent::log_server::{answer, LogSource};
    use quotient_common::agent_api::{LeaderRequest, LeaderResponse};
    let source = LogSource::Files {
        state_dir: state.to_path_buf(),
    };
    let (mut text, mut offset) = (Vec::new(), 0);
    loop {
        let request = LeaderRequest::ReadLogs {
            node: node.to_string(),
            job: JobId(job),
            attempt: 1,
            offset,
            max_bytes: 1_000,
        };
        match answer(node, &source, request).await {
            LeaderResponse::Logs {
                data,
                next_offset,
                end,
            } => {
                text.extend_from_slice(&data);
                offset = next_offset;
                if end {
                    return String::from_utf8(text).unwrap();
                }
            }
            other => panic!("the log read failed: {other:?}"),
        }
    }
}

/// A container that prints lines and fails keeps its whole output on the agent: in the
/// attempt's log file by the time its exit is reported, after its container is removed, and
/// for a runtime made again (an agent restart).
#[tokio::test]
async fn docker_log_is_kept_whole_after_the_container_is_removed() {
    let Some((runtime, node, _cleanup, state)) = runtime_for("keeplog").await else {
        return;
    };
    let mut executor = Executor::new(runtime, &node, state.path(), gpu_uuids());
    let spec = job_spec(Some(IMAGE), printing_job(20_000, 100_000));
    let run = desired_one(1, 71, 1, &spec, Intent::Run);
    let reports = step_until(&mut executor, &run, "the failed exit", is_exit).await;
    assert!(events_of(&reports, 71, 1).contains(&JobEvent::Exited { code: 3 }));
    // Read at once: the last lines are there before the exit is reported.
    let log = std::fs::read_to_string(state.path().join("logs/j-71-1.log")).unwrap();
    assert_eq!(sorted_lines(&log), printed_lines(20_000), "{log}");

    // The exit is reported, so the container is removed; the log stays.
    executor.step(&run).await;
    assert!(executor.runtime().list_own().await.unwrap().is_empty());
    let inspect = Command::new("docker")
        .args([
            "inspect",
            &format!(
                "quotient-{node}-{}-j-71-1",
                quotient_agent::runtime::docker::instance_id(state.path()).unwrap()
            ),
        ])
        .output()
        .unwrap();
    assert!(!inspect.status.success(), "the container is gone");
    let served = read_through_the_log_server(state.path(), &node, 71).await;
    assert_eq!(served, log);

    drop(executor);
    let restarted = DockerRuntime::connect(&node, state.path(), false)
        .await
        .unwrap();
    let handle = quotient_agent::runtime::JobHandle {
        job: JobId(71),
        attempt: 1,
        id: "0".repeat(64),
    };
    assert_eq!(restarted.logs(&handle).await.unwrap(), log);
}

/// `--follow` as the leader serves it (chunks from the last offset until the attempt has
/// ended and the chunk reaches the end of the log) gets every line of a container job that
/// prints while it runs, then ends cleanly.
#[tokio::test]
async fn docker_log_follow_ends_cleanly_with_every_line() {
    use quotient_agent::log_server::{answer, LogSource};
    use quotient_common::agent_api::{LeaderRequest, LeaderResponse};
    let Some((runtime, node, _cleanup, state)) = runtime_for("follow").await else {
        return;
    };
    let mut executor = Executor::new(runtime, &node, state.path(), gpu_uuids());
    let spec = job_spec(Some(IMAGE), printing_job(200, 10));
    let run = desired_one(1, 72, 1, &spec, Intent::Run);
    let source = LogSource::Files {
        state_dir: state.path().to_path_buf(),
    };
    let deadline = Instant::now() + WAIT_DEADLINE;
    let (mut followed, mut offset, mut ended, mut reads_while_running) = (Vec::new(), 0, false, 0);
    loop {
        let reports = executor.step(&run).await;
        ended |= reports.iter().any(is_exit);
        let request = LeaderRequest::ReadLogs {
            node: node.clone(),
            job: JobId(72),
            attempt: 1,
            offset,
            max_bytes: 4_096,
        };
        let end = match answer(&node, &source, request).await {
            LeaderResponse::Logs {
                data,
                next_offset,
                end,
            } => {
                if !ended && !data.is_empty() {
                    reads_while_running += 1;
                }
                followed.extend_from_slice(&data);
                offset = next_offset;
                end
            }
            other => panic!("follow failed: {other:?}"),
        };
        if ended && end {
            break;
        }
        assert!(Instant::now() < deadline, "follow did not end");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let followed = String::from_utf8(followed).unwrap();
    assert_eq!(sorted_lines(&followed), printed_lines(200), "{followed}");
    assert!(
        reads_while_running > 1,
        "the log is served live, not only once the container has exited"
    );
}

/// A runtime made again while a container prints (an agent restart) follows on from where
/// the last one stopped: every line is in the log once.
#[tokio::test]
async fn docker_log_follows_on_after_a_restart_without_repeating_lines() {
    let Some((runtime, node, _cleanup, state)) = runtime_for("relog").await else {
        return;
    };
    let spec = launch(state.path(), 73, 1, Some(IMAGE), printing_job(150, 5));
    let handle = runtime.start(&spec).await.unwrap();
    wait_for("the first lines in the log", || {
        let text = std::fs::read_to_string(&spec.log_path).unwrap_or_default();
        async move { text.contains("line 10\n").then_some(()) }
    })
    .await;
    drop(runtime);
    let restarted = DockerRuntime::connect(&node, state.path(), false)
        .await
        .unwrap();
    assert_eq!(restarted.list_own().await.unwrap().len(), 1);
    assert_eq!(
        restarted.wait(&handle, WAIT_DEADLINE).await.unwrap(),
        Some(Some(3))
    );
    let log = std::fs::read_to_string(&spec.log_path).unwrap();
    assert_eq!(sorted_lines(&log), printed_lines(150), "{log}");
}

/// A container runs as the job user (`--user uid:gid`), never root, and can write its
/// checkpoint dir; its environment is the job's and Quotient's, not the agent's.
#[tokio::test]
async fn docker_job_runs_as_the_job_user() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("user").await else {
        return;
    };
    let nobody = quotient_agent::runtime::lookup_user("nobody").expect("nobody exists");
    let runtime = runtime.with_job_user(nobody.clone());
    std::env::set_var("QUOTIENT_TEST_AGENT_ONLY_DOCKER", "the agent's own");
    let spec = launch(
        state.path(),
        74,
        1,
        Some(IMAGE),
        shell(r#"id -u > "$QUOTIENT_CHECKPOINT_DIR/uid"; env > "$QUOTIENT_CHECKPOINT_DIR/env""#),
    );
    let handle = runtime.start(&spec).await.unwrap();
    assert_eq!(
        runtime.wait(&handle, WAIT_DEADLINE).await.unwrap(),
        Some(Some(0))
    );
    let uid = std::fs::read_to_string(spec.checkpoint_dir.join("uid")).unwrap();
    assert_eq!(uid.trim(), nobody.uid.to_string());
    let env = std::fs::read_to_string(spec.checkpoint_dir.join("env")).unwrap();
    assert!(!env.contains("QUOTIENT_TEST_AGENT_ONLY_DOCKER"), "{env}");
    assert!(env.lines().any(|line| line == "TRAIN_EPOCHS=3"), "{env}");
}

/// With `--job-user per-job` a container runs as its job's own uid and group, and can write
/// its checkpoint dir, which is that uid's alone.
#[tokio::test]
async fn docker_job_runs_as_its_own_uid_with_a_uid_per_job() {
    use quotient_agent::runtime::{JobUser, PER_JOB_UID_FIRST};
    use std::os::unix::fs::MetadataExt;
    let Some((runtime, _node, _cleanup, state)) = runtime_for("per-job").await else {
        return;
    };
    let runtime = runtime.with_job_user(JobUser::per_job());
    let spec = launch(
        state.path(),
        75,
        1,
        Some(IMAGE),
        shell(r#"id -u > "$QUOTIENT_CHECKPOINT_DIR/uid"; id -g >> "$QUOTIENT_CHECKPOINT_DIR/uid""#),
    );
    let handle = runtime.start(&spec).await.unwrap();
    assert_eq!(
        runtime.wait(&handle, WAIT_DEADLINE).await.unwrap(),
        Some(Some(0))
    );
    let own = (PER_JOB_UID_FIRST + 75).to_string();
    let ids = std::fs::read_to_string(spec.checkpoint_dir.join("uid")).unwrap();
    assert_eq!(
        ids.split_whitespace().collect::<Vec<_>>(),
        [own.as_str(), own.as_str()]
    );
    let dir = std::fs::metadata(&spec.checkpoint_dir).unwrap();
    assert_eq!(
        (dir.uid(), dir.mode() & 0o777),
        (PER_JOB_UID_FIRST + 75, 0o700)
    );
}

/// The HostConfig of a container, as `docker inspect` shows it: (NanoCpus, Memory, MemorySwap,
/// PidsLimit), the last 0 when there is none.
fn container_limits(id: &str) -> (i64, i64, i64, i64) {
    let output = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{with .HostConfig.PidsLimit}}{{.}}{{else}}0{{end}}",
            id,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let numbers: Vec<i64> = text
        .split_whitespace()
        .map(|number| number.parse().unwrap())
        .collect();
    assert_eq!(numbers.len(), 4, "docker inspect said {text:?}");
    (numbers[0], numbers[1], numbers[2], numbers[3])
}

/// A container gets the CPUs and memory the coordinators set aside for it as Docker's own
/// limits (NanoCpus, Memory, and no swap beyond it), and the agent's `--job-pids-max` as its
/// PidsLimit; one without limits gets none.
#[tokio::test]
async fn docker_job_gets_its_cpu_and_memory_limits() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("limits").await else {
        return;
    };
    let runtime = runtime.with_pids_max(Some(64));
    let mut spec = launch(state.path(), 81, 1, Some(IMAGE), shell("sleep 30"));
    spec.limits = quotient_agent::runtime::JobLimits {
        cpu_millis: 1_500,
        memory_bytes: 64 << 20,
    };
    let handle = runtime.start(&spec).await.unwrap();
    assert_eq!(
        container_limits(&handle.id),
        (1_500_000_000, 64 << 20, 64 << 20, 64)
    );
    runtime.kill(&handle).await.unwrap();
    runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    let runtime = runtime.with_pids_max(None);

    let unlimited = launch(state.path(), 82, 1, Some(IMAGE), shell("true"));
    let handle = runtime.start(&unlimited).await.unwrap();
    assert_eq!(container_limits(&handle.id), (0, 0, 0, 0));
    runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
}

/// A container the out-of-memory killer ends at its memory limit says so in its exit's
/// reason (Docker's `OOMKilled`), not only with code 137.
#[tokio::test]
async fn a_container_over_its_memory_limit_says_why_it_ended() {
    let Some((runtime, _node, _cleanup, state)) = runtime_for("oom").await else {
        return;
    };
    let mut spec = launch(
        state.path(),
        83,
        1,
        Some(IMAGE),
        shell("x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}"),
    );
    spec.limits = quotient_agent::runtime::JobLimits {
        cpu_millis: 0,
        memory_bytes: 32 << 20,
    };
    let handle = runtime.start(&spec).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(code, Some(Some(137)), "killed at its limit");
    let reason = runtime.exit_reason(&handle, 137).await;
    assert!(
        reason
            .as_deref()
            .is_some_and(|reason| reason.contains("out-of-memory killer")),
        "the exit says why: {reason:?}"
    );
}
