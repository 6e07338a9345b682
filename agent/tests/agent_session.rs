//! The real `quotient-agent` binary against a fake leader (support/fake_leader.rs), on the
//! process runtime with simulated GPUs: registration and heartbeats, starting and stopping a
//! job, a restart mid-job, self-fencing when cut off, the orphan watchdog (on the Docker
//! runtime too), failover, and bad input.

mod support;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quotient_agent::gpu::simulated::simulated_uuid;
use quotient_agent::lease::{LEASE_FENCING_MARK, LEASE_FILE};
use quotient_agent::log_server::read_file_chunk;
use quotient_agent::runtime::log_path;
use quotient_agent::runtime::process::{
    process_state, PidRecord, JOBS_DIR, WATCHDOG_KILLED_EXIT_CODE, WATCHDOG_POLL_S,
    WATCHDOG_SLACK_MS,
};
use quotient_common::agent_api::{
    leader_patience_ms, ActualPhase, DesiredState, Fence, WireAllocation, WireIntent,
    LOG_CHUNK_BYTES_MAX,
};
use quotient_common::{JobEvent, JobId, Runtime};
use support::docker;
use support::fake_leader::{make_certs, FakeLeader, LeaderState, Mode};
use support::*;

const NODE: &str = "node-1";
/// A job that counts its starts, records its environment, and checkpoints on SIGUSR1.
const COUNTING_JOB: &str = r#"trap 'echo checkpointed > "$QUOTIENT_CHECKPOINT_DIR/checkpoint"; exit 0' USR1
echo start >> "$QUOTIENT_CHECKPOINT_DIR/starts"
env > "$QUOTIENT_CHECKPOINT_DIR/env.txt"
while :; do sleep 0.05; done"#;
/// A job that records each checkpoint signal (SIGUSR1) and runs on regardless.
const STUBBORN_JOB: &str = r#"trap 'echo signalled >> "$QUOTIENT_CHECKPOINT_DIR/signals"' USR1
echo start >> "$QUOTIENT_CHECKPOINT_DIR/starts"
while :; do sleep 0.05; done"#;
/// A lease long enough that no test trips it by accident.
const LONG_LEASE_MS: u64 = 10_000;
const HEARTBEAT_MS: u64 = 100;

/// One agent's files: certificates, state dir, log; and flags its agents get besides the
/// usual ones.
struct Node {
    _dir: tempfile::TempDir,
    certs: PathBuf,
    state: PathBuf,
    log: PathBuf,
    agent_args: Vec<String>,
    /// Environment variables its agents get besides the usual ones.
    agent_env: Vec<(String, String)>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        make_certs(&certs, &[NODE, "node-2"]);
        let state = dir.path().join("state");
        let log = dir.path().join("agent.log");
        Node {
            certs,
            state,
            log,
            agent_args: Vec::new(),
            agent_env: Vec::new(),
            _dir: dir,
        }
    }

    fn checkpoint_dir(&self, job: u64) -> PathBuf {
        self.state.join("checkpoints").join(format!("j-{job}"))
    }

    fn starts(&self, job: u64) -> usize {
        std::fs::read_to_string(self.checkpoint_dir(job).join("starts"))
            .map(|text| text.lines().count())
            .unwrap_or(0)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    /// A failing test shows the agent's log.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- agent log\n{}", self.log_text());
        }
    }
}

/// The agent process, killed when dropped; its jobs too (see [`JobsGuard`]).
struct Agent {
    child: Child,
}

impl Agent {
    fn start(node: &Node, cert_name: &str, coordinators: &[String], lease_ms: u64) -> Agent {
        Agent::start_on(node, cert_name, coordinators, lease_ms, "process")
    }

    /// An agent with the runtime `runtime` (`process` or `docker`).
    fn start_on(
        node: &Node,
        cert_name: &str,
        coordinators: &[String],
        lease_ms: u64,
        runtime: &str,
    ) -> Agent {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_quotient-agent"))
            .args([
                "--name",
                NODE,
                "--coordinators",
                &coordinators.join(","),
                "--ca",
                node.certs.join("ca.pem").to_str().unwrap(),
                "--cert",
                node.certs
                    .join(format!("{cert_name}.pem"))
                    .to_str()
                    .unwrap(),
                "--key",
                node.certs
                    .join(format!("{cert_name}-key.pem"))
                    .to_str()
                    .unwrap(),
                "--state-dir",
                node.state.to_str().unwrap(),
                "--runtime",
                runtime,
                "--lease-ms",
                &lease_ms.to_string(),
            ])
            // Two GPUs unless the test gives its own.
            .args(
                (!node.agent_args.iter().any(|a| a == "--simulated-gpus"))
                    .then_some(["--simulated-gpus", "2xa10g"])
                    .into_iter()
                    .flatten(),
            )
            .args(&node.agent_args)
            // The tests run as root in CI: jobs may run as root there (see --job-user).
            .args(running_as_root().then_some("--allow-root-jobs"))
            .env_remove("QUOTIENT_SIMULATED_GPUS")
            .env_remove("QUOTIENT_COORDINATORS")
            .env("RUST_LOG", "info,quotient_agent=debug")
            .env("NO_COLOR", "1")
            .envs(node.agent_env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start quotient-agent");
        Agent { child }
    }

    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills, when dropped, every job process group the agent's pid files name (checked against
/// the recorded start time, so nothing else is touched).
struct JobsGuard(PathBuf);

impl Drop for JobsGuard {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.0.join(JOBS_DIR)) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let Ok(record) = serde_json::from_str::<PidRecord>(&text) else {
                continue;
            };
            if process_state(record.pid).map(|(_, start)| start) == Some(record.start_time_ticks) {
                // SAFETY: kill(2) on a process group this test's agent started.
                unsafe {
                    libc::kill(-record.pgid, libc::SIGKILL);
                }
            }
        }
    }
}

fn allocation(node: &str, job: u64, gpu_indices: Vec<u32>, intent: WireIntent) -> WireAllocation {
    WireAllocation {
        job: JobId(job),
        attempt: 1,
        gpu_uuids: gpu_indices
            .iter()
            .map(|index| simulated_uuid(node, *index))
            .collect(),
        gpu_indices,
        spec: job_spec(None, shell(COUNTING_JOB)),
        intent,
        cpu_millis: 0,
        memory_bytes: 0,
        gang: None,
    }
}

fn desired(term: u64, index: u64, allocations: Vec<WireAllocation>) -> DesiredState {
    DesiredState {
        node: NODE.to_string(),
        fence: Fence { term, index },
        allocations,
    }
}

/// Polls a plain condition until it holds, or panics at the deadline.
async fn wait_until(what: &str, check: impl Fn() -> bool) {
    wait_for(what, || {
        let done = check();
        async move { done.then_some(()) }
    })
    .await;
}

fn reported(leader: &FakeLeader, job: u64, event: JobEvent) -> bool {
    leader
        .state()
        .reports
        .iter()
        .any(|report| report.job == JobId(job) && report.event == event)
}

fn report_count(leader: &FakeLeader, job: u64, event: JobEvent) -> usize {
    leader
        .state()
        .reports
        .iter()
        .filter(|report| report.job == JobId(job) && report.event == event)
        .count()
}

fn exit_reported(leader: &FakeLeader, job: u64) -> bool {
    leader.state().reports.iter().any(|report| {
        report.job == JobId(job)
            && matches!(
                report.event,
                JobEvent::Exited { .. } | JobEvent::ExitedAfterSignal { .. }
            )
    })
}

fn job_pid_alive(state: &Path, job: u64) -> bool {
    let path = state.join(JOBS_DIR).join(format!("j-{job}-1.json"));
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(record) = serde_json::from_str::<PidRecord>(&text) else {
        return false;
    };
    matches!(process_state(record.pid), Some((state, start)) if start == record.start_time_ticks && state != 'Z')
}

/// Registration carries the inventory, heartbeats carry GPU health, a desired allocation
/// starts a real process with the right environment, and a Stop intent leads to the
/// checkpoint signal and an ExitedAfterSignal report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_registers_runs_a_job_and_stops_it_with_its_checkpoint_signal() {
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);

    wait_until("the agent registers", || {
        !leader.state().registrations.is_empty()
    })
    .await;
    {
        let state = leader.state();
        let (inventory, actual) = &state.registrations[0];
        assert_eq!(inventory.name, NODE);
        assert_eq!(inventory.gpus.len(), 2);
        for (index, gpu) in inventory.gpus.iter().enumerate() {
            assert_eq!(gpu.index, index as u32);
            assert_eq!(gpu.uuid, simulated_uuid(NODE, index as u32));
            assert_eq!(gpu.class.as_str(), "a10g");
            assert!(gpu.healthy);
        }
        assert!(actual.is_empty());
        // `--runtime process`: processes only, no images; the host's own CPUs and memory.
        assert_eq!(inventory.host.runtimes, vec![Runtime::Process]);
        assert!(inventory.host.images.is_empty());
        assert!(inventory.host.cpu_millis >= 1_000, "{:?}", inventory.host);
        assert!(inventory.host.memory_bytes > 0, "{:?}", inventory.host);
    }

    // An unhealthy GPU is reported so in heartbeats.
    std::fs::write(node.state.join("unhealthy-gpus"), "1\n").unwrap();
    wait_until("a heartbeat reports GPU 1 unhealthy", || {
        leader
            .state()
            .last_heartbeat
            .as_ref()
            .is_some_and(|(gpus, _)| gpus.len() == 2 && gpus[0].healthy && !gpus[1].healthy)
    })
    .await;

    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 1, vec![1], WireIntent::Run)],
    ));
    let env_file = node.checkpoint_dir(1).join("env.txt");
    wait_until("the job starts", || env_file.exists()).await;
    wait_until("the job's environment is written", || {
        std::fs::read_to_string(&env_file).is_ok_and(|env| env.contains("QUOTIENT_JOB_ID"))
    })
    .await;
    let env = std::fs::read_to_string(&env_file).unwrap();
    for line in [
        "QUOTIENT_JOB_ID=j-1".to_string(),
        "QUOTIENT_ATTEMPT=1".to_string(),
        "CUDA_VISIBLE_DEVICES=1".to_string(),
        format!("NVIDIA_VISIBLE_DEVICES={}", simulated_uuid(NODE, 1)),
        format!(
            "QUOTIENT_CHECKPOINT_DIR={}",
            node.checkpoint_dir(1).display()
        ),
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from:\n{env}"
        );
    }
    wait_until("the job is reported running", || {
        reported(&leader, 1, JobEvent::Running)
    })
    .await;
    wait_until("a heartbeat lists the job running", || {
        leader
            .state()
            .last_heartbeat
            .as_ref()
            .is_some_and(|(_, actual)| {
                actual
                    .iter()
                    .any(|a| a.job == JobId(1) && a.phase == ActualPhase::Running)
            })
    })
    .await;

    leader.set_desired(desired(
        1,
        2,
        vec![allocation(NODE, 1, vec![1], WireIntent::Stop)],
    ));
    let checkpoint = node.checkpoint_dir(1).join("checkpoint");
    wait_until("the job gets its checkpoint signal", || checkpoint.exists()).await;
    wait_until("the stop is reported as ExitedAfterSignal", || {
        reported(&leader, 1, JobEvent::ExitedAfterSignal { code: Some(0) })
    })
    .await;
    assert_eq!(node.starts(1), 1);
    assert!(agent.is_running());
}

/// An agent stopped mid-job (SIGTERM leaves jobs running) and started again re-adopts the
/// running job and reports it running, and never starts it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_mid_job_readopts_it_without_starting_it_again() {
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 3, vec![0], WireIntent::Run)],
    ));
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the job starts", || node.starts(3) == 1).await;
    wait_until("the job is reported running", || {
        reported(&leader, 3, JobEvent::Running)
    })
    .await;

    // --- the agent is stopped with SIGTERM (jobs keep running) and comes back
    let status = stop_agent(&mut agent).await;
    assert!(status.success(), "SIGTERM is an orderly stop: {status:?}");
    assert!(job_pid_alive(&node.state, 3), "the job outlives its agent");
    let registrations_before = leader.state().registrations.len();
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the restarted agent registers", || {
        leader.state().registrations.len() > registrations_before
    })
    .await;
    {
        let state = leader.state();
        let (_, actual) = state.registrations.last().unwrap();
        assert!(
            actual
                .iter()
                .any(|a| a.job == JobId(3) && a.attempt == 1 && a.phase == ActualPhase::Running),
            "registration after the restart lists the running job: {actual:?}"
        );
    }
    wait_until("the job is re-adopted and reported running again", || {
        report_count(&leader, 3, JobEvent::Running) >= 2
    })
    .await;
    let heartbeats = leader.state().heartbeat_count;
    wait_until("a few more heartbeats", || {
        leader.state().heartbeat_count >= heartbeats + 3
    })
    .await;
    assert_eq!(node.starts(3), 1, "the job was started a second time");
    assert!(job_pid_alive(&node.state, 3));
    assert!(!exit_reported(&leader, 3));
}

/// Cut off from the leader (it stops answering), the agent stops its jobs within its lease
/// plus the grace period, reports them once the leader answers again, and never restarts
/// the finished attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_cut_off_from_the_leader_stops_its_jobs_within_its_lease() {
    const LEASE_MS: u64 = 1_500;
    /// Slack for the executor tick, process start-up and a loaded test machine.
    const SLACK_MS: u64 = 1_500;
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 5, vec![0], WireIntent::Run)],
    ));
    let _agent = Agent::start(&node, NODE, &[leader.address()], LEASE_MS);
    wait_until("the job is reported running", || {
        reported(&leader, 5, JobEvent::Running)
    })
    .await;

    // --- the leader goes silent
    leader.set_mode(Mode::Silent);
    let cut_at = Instant::now();
    let checkpoint = node.checkpoint_dir(5).join("checkpoint");
    wait_until("the agent fences itself and signals the job", || {
        checkpoint.exists()
    })
    .await;
    let took = cut_at.elapsed();
    assert!(
        took <= Duration::from_millis(LEASE_MS + SHORT_GRACE_MS + SLACK_MS),
        "the job was stopped only after {took:?}"
    );
    wait_until("the job has exited", || !job_pid_alive(&node.state, 5)).await;
    // The agent marks the lease file once its checkpoint signals are out, and a job can exit
    // before the mark lands on a loaded machine: wait for it rather than race it.
    let lease_file = node.state.join(LEASE_FILE);
    wait_until(
        "the lease file tells the wrappers that the agent fenced itself",
        || {
            std::fs::read_to_string(&lease_file)
                .unwrap_or_default()
                .trim_end()
                .ends_with(LEASE_FENCING_MARK)
        },
    )
    .await;
    assert!(
        !exit_reported(&leader, 5),
        "nothing reaches a silent leader"
    );

    // --- the leader answers again
    leader.set_mode(Mode::Serve);
    wait_until("the stop is reported once the leader answers", || {
        reported(&leader, 5, JobEvent::ExitedAfterSignal { code: Some(0) })
    })
    .await;
    wait_until("the agent takes the leader's desired state again", || {
        node.log_text().matches("new desired state").count() >= 2
    })
    .await;
    let heartbeats = leader.state().heartbeat_count;
    wait_until("a few more heartbeats", || {
        leader.state().heartbeat_count >= heartbeats + 3
    })
    .await;
    assert_eq!(
        node.starts(5),
        1,
        "a finished attempt was started again from a stale desired state"
    );
}

/// Kills `agent` outright and waits for job `job`'s watchdog to send its checkpoint signal
/// (the job records it in `signals`), which must come once the lease has run out and within
/// the watchdog's slack and poll (plus `slack_ms`). When it was killed, how long the signal
/// took, and the `signals` file.
async fn kill_and_await_the_watchdogs_signal(
    agent: &mut Agent,
    node: &Node,
    job: u64,
    lease_ms: u64,
    slack_ms: u64,
) -> (Instant, Duration, PathBuf) {
    agent.kill();
    let killed_at = Instant::now();
    let watchdog_ms = WATCHDOG_SLACK_MS + WATCHDOG_POLL_S * 1_000;
    let signals = node.checkpoint_dir(job).join("signals");
    wait_until("the watchdog sends the checkpoint signal", || {
        signals.exists()
    })
    .await;
    let signalled = killed_at.elapsed();
    assert!(
        signalled >= Duration::from_millis(lease_ms - 2 * HEARTBEAT_MS),
        "the job was signalled before the lease ran out: {signalled:?}"
    );
    assert!(
        signalled <= Duration::from_millis(lease_ms + watchdog_ms + slack_ms),
        "the job was signalled only after {signalled:?}"
    );
    (killed_at, signalled, signals)
}

/// An agent killed outright (SIGKILL, no restart) cannot fence itself: its job's wrapper gets
/// the job its checkpoint signal once the agent's lease file has not been renewed for the
/// lease, and kills it after the grace period, recording exit code 137.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_outright_leaves_no_job_running_past_its_lease() {
    const LEASE_MS: u64 = 1_500;
    /// Slack for process start-up, `sleep` and a loaded test machine.
    const SLACK_MS: u64 = 1_500;
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LEASE_MS, HEARTBEAT_MS);
    let mut stubborn = allocation(NODE, 13, vec![0], WireIntent::Run);
    stubborn.spec = job_spec(None, shell(STUBBORN_JOB));
    leader.set_desired(desired(1, 1, vec![stubborn]));
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LEASE_MS);
    wait_until("the job is reported running", || {
        reported(&leader, 13, JobEvent::Running)
    })
    .await;

    // --- the agent dies without a word; nothing restarts it
    let (killed_at, signalled, signals) =
        kill_and_await_the_watchdogs_signal(&mut agent, &node, 13, LEASE_MS, SLACK_MS).await;
    let watchdog_ms = WATCHDOG_SLACK_MS + WATCHDOG_POLL_S * 1_000;
    wait_until("the job is gone", || !job_pid_alive(&node.state, 13)).await;
    let gone = killed_at.elapsed();
    assert!(
        gone <= Duration::from_millis(
            LEASE_MS + watchdog_ms + SHORT_GRACE_MS + WATCHDOG_POLL_S * 1_000 + SLACK_MS
        ),
        "the job was killed only after {gone:?}"
    );
    assert!(
        gone >= signalled + Duration::from_millis(SHORT_GRACE_MS),
        "the job was killed before its grace period ran out: {gone:?} after {signalled:?}"
    );
    let exit_file = node.state.join(JOBS_DIR).join("j-13-1.exit");
    assert_eq!(
        std::fs::read_to_string(&exit_file)
            .unwrap_or_default()
            .trim(),
        format!("stopped {WATCHDOG_KILLED_EXIT_CODE}"),
        "the watchdog says it stopped the job"
    );
    assert_eq!(
        std::fs::read_to_string(&signals).unwrap().lines().count(),
        1,
        "one checkpoint signal"
    );

    // --- started again, the agent reports the watchdog's stop as a stop by the agent (the
    // job goes back to the queue), never as the job's own exit (found by probing: a job that
    // exited 0 on its checkpoint signal was reported SUCCEEDED)
    let _agent = Agent::start(&node, NODE, &[leader.address()], LEASE_MS);
    let stopped = JobEvent::ExitedAfterSignal {
        code: Some(WATCHDOG_KILLED_EXIT_CODE),
    };
    wait_until("the stop is reported as the agent's", || {
        reported(&leader, 13, stopped.clone())
    })
    .await;
    assert!(!reported(
        &leader,
        13,
        JobEvent::Exited {
            code: WATCHDOG_KILLED_EXIT_CODE
        }
    ));
    assert_eq!(node.starts(13), 1);
}

/// The name of the container of attempt 1 of `job` on `node`'s agent (named with its instance
/// id, made here in its state dir first), removed when the guard drops.
fn container_of(node: &Node, job: u64) -> (String, docker::RemoveContainers) {
    let instance = quotient_agent::runtime::docker::instance_id(&node.state).unwrap();
    let container = format!("quotient-{NODE}-{instance}-j-{job}-1");
    let guard = docker::RemoveContainers(vec![format!("name={container}")]);
    (container, guard)
}

/// On the Docker runtime too: an agent killed outright leaves its container to the container's
/// watchdog process, which gets the job its checkpoint signal once the lease file has not been
/// renewed for the lease and kills it after the grace period (Docker reports 137).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_outright_leaves_no_container_running_past_its_lease() {
    const LEASE_MS: u64 = 1_500;
    /// Slack for process start-up, Docker API calls and a loaded test machine.
    const SLACK_MS: u64 = 2_500;
    const JOB: u64 = 16;
    if let Err(why) = docker::ensure_image() {
        docker::unavailable(why);
        return;
    }
    let node = Node::new();
    // The agent names its containers with its instance id, made here in its state dir first.
    let (container, _containers) = container_of(&node, JOB);
    let leader = FakeLeader::start(&node.certs, LEASE_MS, HEARTBEAT_MS);
    let mut stubborn = allocation(NODE, JOB, vec![0], WireIntent::Run);
    stubborn.spec = job_spec(Some(docker::IMAGE), shell(STUBBORN_JOB));
    leader.set_desired(desired(1, 1, vec![stubborn]));
    let mut agent = Agent::start_on(&node, NODE, &[leader.address()], LEASE_MS, "docker");
    wait_until("the job is reported running", || {
        reported(&leader, JOB, JobEvent::Running)
    })
    .await;
    let running = || {
        Command::new("docker")
            .args(["inspect", "--format", "{{.State.Running}}", &container])
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "true")
    };
    assert!(running(), "the container runs");

    let (killed_at, signalled, signals) =
        kill_and_await_the_watchdogs_signal(&mut agent, &node, JOB, LEASE_MS, SLACK_MS).await;
    wait_until("the container is gone", || !running()).await;
    let gone = killed_at.elapsed();
    assert!(
        gone >= signalled + Duration::from_millis(SHORT_GRACE_MS),
        "the container was killed before its grace period ran out: {gone:?} after {signalled:?}"
    );
    let exit = Command::new("docker")
        .args(["inspect", "--format", "{{.State.ExitCode}}", &container])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&exit.stdout).trim(), "137");
    assert_eq!(
        std::fs::read_to_string(&signals).unwrap().lines().count(),
        1,
        "one checkpoint signal"
    );
    assert_eq!(node.starts(JOB), 1);
}

/// An agent killed outright and restarted within its lease renews the lease file on
/// registration: the job's wrapper leaves the re-adopted job alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_and_restarted_within_its_lease_keeps_its_job() {
    const LEASE_MS: u64 = 3_000;
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 14, vec![0], WireIntent::Run)],
    ));
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LEASE_MS);
    wait_until("the job is reported running", || {
        reported(&leader, 14, JobEvent::Running)
    })
    .await;

    agent.kill();
    let killed_at = Instant::now();
    let registrations_before = leader.state().registrations.len();
    let _agent = Agent::start(&node, NODE, &[leader.address()], LEASE_MS);
    wait_until("the restarted agent registers", || {
        leader.state().registrations.len() > registrations_before
    })
    .await;
    let past_watchdog =
        Duration::from_millis(LEASE_MS + WATCHDOG_SLACK_MS + 2 * WATCHDOG_POLL_S * 1_000);
    tokio::time::sleep(past_watchdog.saturating_sub(killed_at.elapsed())).await;
    assert!(job_pid_alive(&node.state, 14), "the job was stopped");
    assert!(!node.checkpoint_dir(14).join("checkpoint").exists());
    assert_eq!(node.starts(14), 1);
    assert!(!exit_reported(&leader, 14));
}

/// An agent started again while the Docker daemon hangs (here: a socket that takes
/// connections and never answers) registers within its lease, and its process job runs on.
/// Before, the agent's Docker calls at start (connect, list containers, list images) waited
/// 30 s each, its lease ran out meanwhile, and the watchdogs stopped every job
/// of the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restarted_while_docker_hangs_registers_within_its_lease_and_keeps_its_job() {
    const LEASE_MS: u64 = 8_000;
    let mut node = Node::new();
    let socket = node.state.with_file_name("hung-docker.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let hung = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    node.agent_env = vec![(
        "DOCKER_HOST".to_string(),
        format!("unix://{}", socket.display()),
    )];
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 16, vec![0], WireIntent::Run)],
    ));
    let mut agent = Agent::start_on(&node, NODE, &[leader.address()], LEASE_MS, "auto");
    wait_until("the job is reported running", || {
        reported(&leader, 16, JobEvent::Running)
    })
    .await;

    agent.kill();
    let killed_at = Instant::now();
    let registrations_before = leader.state().registrations.len();
    let _agent = Agent::start_on(&node, NODE, &[leader.address()], LEASE_MS, "auto");
    wait_until("the restarted agent registers", || {
        leader.state().registrations.len() > registrations_before
    })
    .await;
    let registered_after = killed_at.elapsed();
    assert!(
        registered_after < Duration::from_millis(LEASE_MS),
        "registered {registered_after:?} after the kill, past its lease"
    );
    let past_watchdog =
        Duration::from_millis(LEASE_MS + WATCHDOG_SLACK_MS + 2 * WATCHDOG_POLL_S * 1_000);
    tokio::time::sleep(past_watchdog.saturating_sub(killed_at.elapsed())).await;
    assert!(job_pid_alive(&node.state, 16), "the job was stopped");
    assert_eq!(node.starts(16), 1);
    assert!(!exit_reported(&leader, 16));
    hung.abort();
}

/// A container job's agent started again while the Docker daemon hangs cannot look for the
/// job's container: it neither starts the attempt again nor reports its launch failed (the
/// job would be placed elsewhere while its container runs on here), and adopts the container
/// once the daemon answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_jobs_agent_restarted_while_docker_hangs_adopts_it_once_docker_answers() {
    const JOB: u64 = 18;
    if let Err(why) = docker::ensure_image() {
        docker::unavailable(why);
        return;
    }
    let mut node = Node::new();
    let proxy = docker::DaemonProxy::start(node.state.parent().unwrap());
    node.agent_env = vec![(
        "DOCKER_HOST".to_string(),
        format!("unix://{}", proxy.socket.display()),
    )];
    let (container, containers) = container_of(&node, JOB);
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let mut job = allocation(NODE, JOB, vec![0], WireIntent::Run);
    job.spec = job_spec(Some(docker::IMAGE), shell(COUNTING_JOB));
    leader.set_desired(desired(1, 1, vec![job]));
    let mut agent = Agent::start_on(&node, NODE, &[leader.address()], LONG_LEASE_MS, "auto");
    wait_until("the job is reported running", || {
        reported(&leader, JOB, JobEvent::Running)
    })
    .await;

    // Every call to the daemon goes unanswered from now on.
    proxy.hold(&["HTTP/1.1"]);
    agent.kill();
    let registrations_before = leader.state().registrations.len();
    let _agent = Agent::start_on(&node, NODE, &[leader.address()], LONG_LEASE_MS, "auto");
    wait_until("the restarted agent registers", || {
        leader.state().registrations.len() > registrations_before
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let launch_failed = |state: &LeaderState| {
        state
            .reports
            .iter()
            .any(|report| matches!(report.event, JobEvent::LaunchFailed { .. }))
    };
    assert!(
        !launch_failed(&leader.state()),
        "its launch was reported failed while its container ran: {:?}",
        leader.state().reports
    );

    let offers_docker = |state: &LeaderState| {
        state.registrations.last().is_some_and(|(inventory, _)| {
            inventory
                .host
                .runtimes
                .contains(&quotient_common::Runtime::Docker)
        })
    };
    assert!(
        !offers_docker(&leader.state()),
        "registered offering container jobs while Docker hangs"
    );
    proxy.release();
    let released = Instant::now();
    wait_until(
        "the container is adopted and reported running again",
        || report_count(&leader, JOB, JobEvent::Running) >= 2,
    )
    .await;
    // Once the daemon answers, the node offers container jobs again within a few seconds
    // (a look for its containers, every 5 s, reaches Docker), not at the host info's next
    // look 30 s on.
    wait_until("the node offers container jobs again", || {
        offers_docker(&leader.state())
    })
    .await;
    assert!(
        released.elapsed() < Duration::from_secs(15),
        "offered container jobs {:?} after Docker answered again",
        released.elapsed()
    );
    assert!(
        !launch_failed(&leader.state()),
        "{:?}",
        leader.state().reports
    );
    assert_eq!(node.starts(JOB), 1, "started once");

    // The container goes while the proxy still passes calls on: its watchdog, which reaches
    // the daemon through the proxy, sees it gone and ends, rather than trying for ever.
    let inspected = Command::new("docker")
        .args(["inspect", "--format", "{{.Id}}", &container])
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&inspected.stdout)
        .trim()
        .to_string();
    drop(containers);
    wait_until("the container's watchdog ends", || {
        docker::watchdog_pids(&id).is_empty()
    })
    .await;
}

/// The first coordinator answers NotLeader naming the second; the agent follows and its
/// running job is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_follows_not_leader_to_the_new_leader_without_touching_jobs() {
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let first = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let second = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let running = vec![allocation(NODE, 7, vec![0], WireIntent::Run)];
    first.set_desired(desired(1, 1, running.clone()));
    let mut agent = Agent::start(&node, NODE, &[first.address()], LONG_LEASE_MS);
    wait_until("the job is reported running", || {
        reported(&first, 7, JobEvent::Running)
    })
    .await;

    // --- leadership moves to the second coordinator
    second.set_desired(desired(2, 1, running));
    first.set_mode(Mode::NotLeader(second.address()));
    wait_until("the agent registers with the new leader", || {
        !second.state().registrations.is_empty()
    })
    .await;
    {
        let state = second.state();
        let (_, actual) = &state.registrations[0];
        assert!(
            actual.iter().any(|a| a.job == JobId(7)),
            "the new leader learns of the running job: {actual:?}"
        );
    }
    wait_until("heartbeats reach the new leader", || {
        second.state().heartbeat_count >= 3
    })
    .await;
    assert_eq!(node.starts(7), 1);
    assert!(job_pid_alive(&node.state, 7));
    assert!(!node.checkpoint_dir(7).join("checkpoint").exists());
    assert!(!exit_reported(&first, 7) && !exit_reported(&second, 7));
    assert!(agent.is_running());
}

/// A fake leader and an agent running job 7 on GPU 0, reported running. Fields drop in
/// order: the agent first, the job files last.
struct RunningJob {
    agent: Agent,
    leader: FakeLeader,
    node: Node,
    _jobs: JobsGuard,
}

impl RunningJob {
    async fn start() -> RunningJob {
        let node = Node::new();
        let _jobs = JobsGuard(node.state.clone());
        let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
        let running = vec![allocation(NODE, 7, vec![0], WireIntent::Run)];
        leader.set_desired(desired(1, 1, running));
        let agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
        wait_until("the job is reported running", || {
            reported(&leader, 7, JobEvent::Running)
        })
        .await;
        RunningJob {
            agent,
            leader,
            node,
            _jobs,
        }
    }
}

/// A leader that keeps refusing heartbeats (it cannot show a quorum's recent
/// acknowledgement) makes the agent look for the leader again, once the refusals have lasted
/// `leader_patience_ms` of the lease; but the agent keeps the connection and registers over
/// it: no new handshake per refusal. The job is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_keeps_its_connection_to_a_leader_that_refuses_heartbeats() {
    let mut job = RunningJob::start().await;
    assert_eq!(job.leader.state().connections, 1);

    job.leader.set_mode(Mode::RefuseHeartbeats);
    let refusing = Instant::now();
    wait_until("the agent registers again", || {
        job.leader.state().registrations.len() >= 2
    })
    .await;
    let patience = Duration::from_millis(leader_patience_ms(LONG_LEASE_MS));
    assert!(
        refusing.elapsed() >= patience,
        "registered again {:?} after the refusals began, before the patience of {patience:?}",
        refusing.elapsed()
    );
    wait_until("the agent registers again twice", || {
        job.leader.state().registrations.len() >= 3
    })
    .await;
    job.leader.set_mode(Mode::Serve);
    let heartbeats = job.leader.state().heartbeat_count;
    wait_until("heartbeats answered again", || {
        job.leader.state().heartbeat_count >= heartbeats + 2
    })
    .await;
    assert_eq!(
        job.leader.state().connections,
        1,
        "every registration went over the first connection"
    );
    assert_eq!(job.node.starts(7), 1);
    assert!(job_pid_alive(&job.node.state, 7));
    assert!(!exit_reported(&job.leader, 7));
    assert!(job.agent.is_running());
}

/// Puts a fake leader whose agent runs a job into `mode` until `held` says enough heartbeats
/// went unacknowledged (less than `leader_patience_ms` in all), then serves again, and checks
/// that the agent kept it: no registration again, so no Raft write per agent, the same
/// connection, the job untouched.
async fn agent_rides_out(mode: Mode, held: fn(&LeaderState) -> bool) {
    let mut job = RunningJob::start().await;
    job.leader.set_mode(mode);
    wait_until("heartbeats unacknowledged", || held(&job.leader.state())).await;
    job.leader.set_mode(Mode::Serve);
    // Beyond the (at most two) late answers to heartbeats held before.
    let heartbeats = job.leader.state().heartbeat_count;
    wait_until("heartbeats answered in time again", || {
        job.leader.state().heartbeat_count >= heartbeats + 5
    })
    .await;
    let state = job.leader.state();
    assert_eq!(state.registrations.len(), 1, "no registration again");
    assert_eq!(state.connections, 1);
    drop(state);
    assert_eq!(job.node.starts(7), 1);
    assert!(job_pid_alive(&job.node.state, 7));
    assert!(job.agent.is_running());
}

/// A leader that refuses heartbeats for less than `leader_patience_ms` (busy for a moment)
/// keeps its agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_rides_out_a_leader_that_refuses_heartbeats_for_a_moment() {
    agent_rides_out(Mode::RefuseHeartbeats, |state| {
        state.refused_heartbeats >= 5
    })
    .await;
}

/// A leader that answers heartbeats after their deadline, for less than `leader_patience_ms`
/// (busy, but its QUIC side acknowledges the packets), keeps its agent as well. Two
/// heartbeats held past the agent's 1 s deadline make about 2 s of no acknowledgement, under
/// the patience of 2.5 s. (A leader that sends nothing at all, killed or frozen, is left at
/// once: `tests/tests/failover.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_rides_out_a_leader_that_answers_heartbeats_late_for_a_moment() {
    agent_rides_out(Mode::SlowHeartbeats, |state| state.slow_heartbeats >= 2).await;
}

/// An agent whose certificate names another node, or is not an agent's, refuses to start
/// and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_refuses_a_certificate_naming_another_node() {
    let node = Node::new();
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    for (cert, expected) in [
        ("node-2", "names node \"node-2\""),
        ("coord-1", "role agent"),
    ] {
        let mut agent = Agent::start(&node, cert, &[leader.address()], LONG_LEASE_MS);
        let status = wait_for("the agent to exit", || {
            let status = agent.child.try_wait().ok().flatten();
            async move { status }
        })
        .await;
        assert!(!status.success());
        let log = node.log_text();
        assert!(log.contains(expected), "{expected:?} missing from:\n{log}");
    }
    assert!(leader.state().registrations.is_empty());
}

/// An allocation naming GPU indices the node lacks is refused and logged, and nothing of it
/// starts; a stop of a job not here is logged and starts nothing; a good allocation in a
/// later state still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_refuses_an_allocation_for_gpus_it_lacks() {
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let mut bad = allocation(NODE, 9, vec![5], WireIntent::Run);
    bad.gpu_uuids.clear();
    leader.set_desired(desired(1, 1, vec![bad.clone()]));
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the refusal is logged", || {
        node.log_text().contains("refused an allocation")
    })
    .await;
    assert!(node.log_text().contains("GPU index 5 does not exist"));

    leader.set_desired(desired(
        1,
        2,
        vec![
            bad,
            allocation(NODE, 10, vec![0], WireIntent::Run),
            allocation(NODE, 12, vec![1], WireIntent::Stop),
        ],
    ));
    wait_until("the good job starts", || node.starts(10) == 1).await;
    wait_until("the good job is reported running", || {
        reported(&leader, 10, JobEvent::Running)
    })
    .await;
    assert_eq!(node.starts(9), 0, "the refused job started");
    assert_eq!(node.starts(12), 0, "a stop of an unknown job started it");
    assert!(node.log_text().contains("not running here"));
    assert!(!node.checkpoint_dir(9).exists());
    assert!(!leader.state().reports.iter().any(|r| r.job == JobId(9)));
    assert!(agent.is_running());
}

/// An agent restarted with fewer GPUs (the job's GPU gone from its inventory) still stops the
/// job it adopted when the leader says so: the stop names a GPU the node no longer has, and
/// the job gets its checkpoint signal and is reported stopped. The coordinators keep such a
/// job's GPUs until that report comes (`quotient-core`, `node_removal.rs`), so it never runs
/// elsewhere while this attempt may still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restarted_without_a_jobs_gpu_stops_it_with_its_signal_when_told() {
    restarted_without_a_jobs_gpu(WireIntent::Stop).await;
}

/// The same, while the leader still asks the attempt to run on the GPU that is gone (it has
/// not seen the node's new inventory yet): the agent stops it as it would a stop, with its
/// checkpoint signal, instead of killing it for want of an allocation it can accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restarted_without_a_jobs_gpu_stops_it_with_its_signal_while_told_to_run() {
    restarted_without_a_jobs_gpu(WireIntent::Run).await;
}

async fn restarted_without_a_jobs_gpu(intent: WireIntent) {
    let mut node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 4, vec![1], WireIntent::Run)],
    ));
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the job starts", || node.starts(4) == 1).await;
    wait_until("the job is reported running", || {
        reported(&leader, 4, JobEvent::Running)
    })
    .await;

    stop_agent(&mut agent).await;
    assert!(job_pid_alive(&node.state, 4), "the job outlives its agent");
    // What the leader asks of the attempt once the agent is back.
    leader.set_desired(desired(1, 2, vec![allocation(NODE, 4, vec![1], intent)]));
    let registrations_before = leader.state().registrations.len();
    node.agent_args = vec!["--simulated-gpus".into(), "1xa10g".into()];
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the restarted agent registers", || {
        leader.state().registrations.len() > registrations_before
    })
    .await;
    assert_eq!(
        leader.state().registrations.last().unwrap().0.gpus.len(),
        1,
        "it registers with one GPU"
    );
    let checkpoint = node.checkpoint_dir(4).join("checkpoint");
    wait_until("the job gets its checkpoint signal", || checkpoint.exists()).await;
    wait_until("the stop is reported as ExitedAfterSignal", || {
        reported(&leader, 4, JobEvent::ExitedAfterSignal { code: Some(0) })
    })
    .await;
    assert!(
        !node.log_text().contains("killed job=j-4"),
        "killed, not signalled"
    );
    assert_eq!(node.starts(4), 1);
}

/// Stops the agent with SIGTERM (its jobs keep running) and waits for it to exit.
async fn stop_agent(agent: &mut Agent) -> std::process::ExitStatus {
    // SAFETY: kill(2) on the agent process this test started and still owns.
    unsafe {
        libc::kill(agent.child.id() as i32, libc::SIGTERM);
    }
    wait_for("the agent to exit on SIGTERM", || {
        let status = agent.child.try_wait().ok().flatten();
        async move { status }
    })
    .await
}

/// An allocation of `command` with a grace period of `grace_ms`.
fn allocation_of(job: u64, command: &str, grace_ms: u64, intent: WireIntent) -> WireAllocation {
    let mut allocation = allocation(NODE, job, vec![0], intent);
    allocation.spec = job_spec(None, shell(command));
    allocation.spec.grace_period_ms = grace_ms;
    allocation
}

/// An agent restarted in a job's grace period goes on with that grace period: the job is
/// killed when the grace that began with its checkpoint signal runs out, not a whole grace
/// period after the restart, and it is not signalled a second time (found by probing: 29 s
/// for a grace of 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restarted_in_a_grace_period_goes_on_with_it() {
    const GRACE_MS: u64 = 6_000;
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation_of(5, STUBBORN_JOB, GRACE_MS, WireIntent::Run)],
    ));
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the job is reported running", || {
        reported(&leader, 5, JobEvent::Running)
    })
    .await;
    leader.set_desired(desired(
        1,
        2,
        vec![allocation_of(5, STUBBORN_JOB, GRACE_MS, WireIntent::Stop)],
    ));
    let signals = node.checkpoint_dir(5).join("signals");
    wait_until("the job gets its checkpoint signal", || signals.exists()).await;
    let signalled = Instant::now();

    tokio::time::sleep(Duration::from_millis(GRACE_MS / 2)).await;
    stop_agent(&mut agent).await;
    assert!(job_pid_alive(&node.state, 5), "the job outlives its agent");
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    let restarted = Instant::now();
    wait_until("the job's exit is reported", || exit_reported(&leader, 5)).await;
    let (since_signal, since_restart) = (signalled.elapsed(), restarted.elapsed());
    assert!(
        since_restart < Duration::from_millis(GRACE_MS - 1_000),
        "killed {since_restart:?} after the restart: the grace period began again"
    );
    assert!(
        since_signal >= Duration::from_millis(GRACE_MS - 500),
        "killed {since_signal:?} after its signal, before its grace period of {GRACE_MS} ms"
    );
    let text = std::fs::read_to_string(&signals).unwrap();
    assert_eq!(text.lines().count(), 1, "signalled again: {text}");
    assert!(node.log_text().contains("its grace period goes on"));
}

/// A job that exits on its checkpoint signal while its agent is down is reported, once the
/// agent is back, as stopped by the agent (`ExitedAfterSignal`: back to the queue), not as
/// its own exit (which would end it SUCCEEDED with its work lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_exits_on_its_signal_while_its_agent_is_down_is_reported_stopped() {
    const SLOW_TO_CHECKPOINT: &str = r#"trap 'sleep 1; exit 0' USR1
echo start >> "$QUOTIENT_CHECKPOINT_DIR/starts"
while :; do sleep 0.05; done"#;
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation_of(
            6,
            SLOW_TO_CHECKPOINT,
            20_000,
            WireIntent::Run,
        )],
    ));
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the job is reported running", || {
        reported(&leader, 6, JobEvent::Running)
    })
    .await;
    leader.set_desired(desired(
        1,
        2,
        vec![allocation_of(
            6,
            SLOW_TO_CHECKPOINT,
            20_000,
            WireIntent::Stop,
        )],
    ));
    wait_until("the checkpoint signal is sent", || {
        node.log_text().contains("sent the checkpoint signal")
    })
    .await;
    stop_agent(&mut agent).await;
    wait_until("the job exits while its agent is down", || {
        !job_pid_alive(&node.state, 6)
    })
    .await;
    assert!(!exit_reported(&leader, 6), "reported before the agent went");
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the job's exit is reported", || exit_reported(&leader, 6)).await;
    assert!(
        reported(&leader, 6, JobEvent::ExitedAfterSignal { code: Some(0) }),
        "{:?}",
        leader.state().reports
    );
    assert!(!reported(&leader, 6, JobEvent::Exited { code: 0 }));
}

/// A frame over the size limit from the leader is refused and logged; the agent keeps
/// running and works once the leader behaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_survives_an_oversized_frame_from_the_leader() {
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    leader.set_mode(Mode::OversizedDesired);
    let mut agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the oversized frame is refused and logged", || {
        node.log_text().contains("over the limit")
    })
    .await;
    assert!(agent.is_running());

    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 11, vec![0], WireIntent::Run)],
    ));
    leader.set_mode(Mode::Serve);
    wait_until("a job starts once the leader behaves", || {
        reported(&leader, 11, JobEvent::Running)
    })
    .await;
    assert!(agent.is_running());
}

/// The log file of `job` attempt 1 in `state`, and what it takes on disk.
fn log_on_disk(state: &Path, job: u64) -> (PathBuf, u64) {
    use std::os::unix::fs::MetadataExt;
    let path = log_path(state, JobId(job), 1);
    let allocated = std::fs::metadata(&path).map_or(0, |metadata| metadata.blocks() * 512);
    (path, allocated)
}

/// A job that writes far more than a small log cap keeps about the cap on disk (allocated
/// blocks, not length), and its log reads back with its first line, one line saying what was
/// dropped, and its last line; the agent reports its disk use to the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_caps_a_log_far_over_the_cap_and_reports_its_disk_use() {
    const CAP: u64 = 256 * 1024;
    let mut node = Node::new();
    node.agent_args = vec!["--log-max-bytes".into(), "256KiB".into()];
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the agent reports its disk use", || {
        leader
            .state()
            .disk_usage
            .is_some_and(|usage| usage.free_bytes > 0 && usage.total_bytes >= usage.free_bytes)
    })
    .await;

    // About 21 MB of output, 80 times the cap.
    let script = "echo first line; yes 'a line in the middle of the output' | head -n 600000; echo last line";
    let mut writer = allocation(NODE, 5, vec![0], WireIntent::Run);
    writer.spec = job_spec(None, shell(script));
    leader.set_desired(desired(1, 1, vec![writer]));
    wait_until("the job's exit is reported", || {
        reported(&leader, 5, JobEvent::Exited { code: 0 })
    })
    .await;
    let (path, _) = log_on_disk(&node.state, 5);
    let length = std::fs::metadata(&path).unwrap().len();
    assert!(length > 20_000_000, "the job wrote {length} bytes");
    let slack = 2 * 4096;
    wait_until("the log is cut back to the cap", || {
        log_on_disk(&node.state, 5).1 <= CAP + slack
    })
    .await;

    let mut text = Vec::new();
    let mut offset = 0;
    loop {
        let chunk = read_file_chunk(&path, offset, LOG_CHUNK_BYTES_MAX).unwrap();
        text.extend_from_slice(&chunk.data);
        offset = chunk.next_offset;
        if chunk.end {
            break;
        }
    }
    assert_eq!(offset, length);
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with("first line\na line in the middle"),
        "{}",
        &text[..100]
    );
    assert!(text.ends_with("a line in the middle of the output\nlast line\n"));
    let dropped: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("[... ") && line.ends_with(" bytes dropped ...]"))
        .collect();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert!(
        text.len() as u64 <= CAP + slack,
        "{} bytes read",
        text.len()
    );
}

/// Logs and checkpoint dirs of a job this node last ran longer ago than the retention are
/// removed (and the agent says so), while those of a job still placed here, however old, and
/// of a job that ran recently stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_removes_old_jobs_files_but_keeps_placed_and_recent_ones() {
    let mut node = Node::new();
    node.agent_args = ["--log-retention", "1d", "--checkpoint-retention", "1d"]
        .map(String::from)
        .to_vec();
    let _jobs = JobsGuard(node.state.clone());
    // j-7 ran here two days ago, j-8 too but is placed here again, j-9 ran a minute ago.
    let two_days_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 86_400);
    for job in [7, 8, 9] {
        let log = log_path(&node.state, JobId(job), 0);
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(&log, "an old attempt\n").unwrap();
        let checkpoint = node.checkpoint_dir(job);
        std::fs::create_dir_all(&checkpoint).unwrap();
        std::fs::write(checkpoint.join("model.ckpt"), "weights").unwrap();
        if job != 9 {
            for path in [&log, &checkpoint] {
                std::fs::File::open(path)
                    .unwrap()
                    .set_modified(two_days_ago)
                    .unwrap();
            }
        }
    }
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, 8, vec![0], WireIntent::Run)],
    ));
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    let gone = |job: u64| {
        !log_path(&node.state, JobId(job), 0).exists() && !node.checkpoint_dir(job).exists()
    };
    wait_until("j-7's log and checkpoint dir are removed", || gone(7)).await;
    for job in [8, 9] {
        assert!(
            log_path(&node.state, JobId(job), 0).exists(),
            "j-{job}'s log"
        );
        assert!(
            node.checkpoint_dir(job).join("model.ckpt").exists(),
            "j-{job}'s checkpoint"
        );
    }
    assert_eq!(node.starts(8), 1, "j-8 runs");
    // The sweep logs once it has removed everything, a moment after the files are gone.
    wait_until("the agent to say what it removed", || {
        node.log_text()
            .contains("removed the logs and checkpoint dirs")
    })
    .await;
}

/// `--cpus` and `--memory` replace what the agent detects in its registration; its
/// `--label`s and `--advertise-address` are in it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_reports_the_cpus_and_memory_it_is_told() {
    let mut node = Node::new();
    node.agent_args = [
        "--cpus",
        "3.5",
        "--memory",
        "12GiB",
        "--label",
        "rack=r3",
        "--label",
        "block=b1",
        "--advertise-address",
        "gpu-7.example.internal",
    ]
    .map(str::to_string)
    .to_vec();
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    wait_until("the agent registers", || {
        !leader.state().registrations.is_empty()
    })
    .await;
    let host = leader.state().registrations[0].0.host.clone();
    assert_eq!(host.cpu_millis, 3_500);
    assert_eq!(host.memory_bytes, 12 << 30);
    assert_eq!(
        host.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["block=b1", "rack=r3"]
    );
    assert_eq!(host.address.as_deref(), Some("gpu-7.example.internal"));
}

/// With Docker the registration names the docker runtime and the images the engine holds;
/// an image tagged after registration reaches the leader by a new registration on the same
/// connection (the agent looks again every `--host-recheck-ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_reports_docker_and_its_images_and_registers_again_when_they_change() {
    if let Err(why) = docker::ensure_image() {
        docker::unavailable(why);
        return;
    }
    let tag = format!("quotient-test-busybox:session-{}", std::process::id());
    struct Untag(String);
    impl Drop for Untag {
        fn drop(&mut self) {
            let _ = Command::new("docker")
                .args(["rmi", &self.0])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
    let untag = Untag(tag.clone());
    drop(Untag(tag.clone()));
    let mut node = Node::new();
    node.agent_args = ["--host-recheck-ms", "200"].map(str::to_string).to_vec();
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let _agent = Agent::start_on(&node, NODE, &[leader.address()], LONG_LEASE_MS, "docker");
    wait_until("the agent registers", || {
        !leader.state().registrations.is_empty()
    })
    .await;
    let host = leader.state().registrations[0].0.host.clone();
    assert_eq!(host.runtimes, vec![Runtime::Process, Runtime::Docker]);
    assert!(host.has_image(docker::IMAGE), "{:?}", host.images);
    assert!(!host.has_image(&tag));
    assert!(host.cpu_millis > 0 && host.memory_bytes > 0);
    let heartbeats_before = leader.state().heartbeat_count;

    let tagged = Command::new("docker")
        .args(["tag", docker::IMAGE, &tag])
        .status()
        .unwrap();
    assert!(tagged.success());
    wait_until("the agent registers the new image", || {
        leader
            .state()
            .registrations
            .last()
            .is_some_and(|(inventory, _)| inventory.host.has_image(&tag))
    })
    .await;
    // Registered again on the same connection: heartbeats went on, and the leader was
    // never lost.
    assert!(leader.state().heartbeat_count > heartbeats_before);
    let log = node.log_text();
    assert!(log.contains("the host changed; registering again"), "{log}");
    assert!(!log.contains("lost the leader"), "{log}");
    drop(untag);
}

/// An agent 1.2 s of round trip away from its leader (a path across continents, or a
/// satellite link) registers, though its handshake takes longer than a first connect's
/// deadline of 1 s (each next try waits longer), and keeps its lease and its job: a heartbeat
/// waits three round trips as QUIC measures them, within a quarter of the lease (found by
/// probing: every handshake and heartbeat missed its 1 s, and the agent stopped its jobs with
/// its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_a_second_away_from_its_leader_registers_and_keeps_its_job() {
    const JOB: u64 = 21;
    let node = Node::new();
    let _jobs = JobsGuard(node.state.clone());
    let leader = FakeLeader::start(&node.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    leader.set_desired(desired(
        1,
        1,
        vec![allocation(NODE, JOB, vec![0], WireIntent::Run)],
    ));
    let proxy = quotient_tests::fault_proxy::FaultProxy::start(
        leader.address().parse().expect("the leader's address"),
    )
    .await;
    // Each way: 1.2 s a round trip.
    proxy.delay(Duration::from_millis(600));
    let _agent = Agent::start(&node, NODE, &[proxy.address().to_string()], LONG_LEASE_MS);
    wait_until("the job is reported running", || {
        reported(&leader, JOB, JobEvent::Running)
    })
    .await;
    let heartbeats = leader.state().heartbeat_count;
    // Longer than the lease.
    tokio::time::sleep(Duration::from_millis(LONG_LEASE_MS + 5_000)).await;
    assert!(job_pid_alive(&node.state, JOB), "the job was stopped");
    assert!(
        !std::fs::read_to_string(node.state.join(LEASE_FILE))
            .unwrap_or_default()
            .trim_end()
            .ends_with(LEASE_FENCING_MARK),
        "the agent fenced itself"
    );
    let state = leader.state();
    assert!(
        state.heartbeat_count >= heartbeats + 5,
        "{} heartbeats in {} s",
        state.heartbeat_count - heartbeats,
        (LONG_LEASE_MS + 5_000) / 1_000
    );
}

/// An agent that no coordinator accepts (here its certificate is of another CA, as one that
/// expired would be refused) says why in its search's warning, each address with what it
/// last answered, not only that it finds no leader (found by probing: an agent whose
/// certificate had expired logged nothing but "no leader found yet").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refused_at_the_handshake_says_why_while_it_searches() {
    let node = Node::new();
    let elsewhere = Node::new();
    let leader = FakeLeader::start(&elsewhere.certs, LONG_LEASE_MS, HEARTBEAT_MS);
    let _agent = Agent::start(&node, NODE, &[leader.address()], LONG_LEASE_MS);
    let address = leader.address();
    wait_until("the agent's search says why each address fails", || {
        std::fs::read_to_string(&node.log)
            .unwrap_or_default()
            .lines()
            .any(|line| {
                line.contains("no leader found yet")
                    && line.contains(&address)
                    && line.contains("same cluster CA")
            })
    })
    .await;
}
