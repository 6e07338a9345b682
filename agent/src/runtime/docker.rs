//! The Docker runtime: a job's image as a container, through the Docker Engine API (bollard).
//!
//! Each attempt is one container named `quotient-<node>-<job>-<attempt>`, labelled
//! `quotient.job`, `quotient.attempt` and `quotient.node` (plus the checkpoint signal and grace
//! period, so that a restarted agent can still stop it gracefully). [`DockerRuntime::list_own`]
//! finds containers by those labels only, so containers that are not the agent's are never
//! touched. The checkpoint dir is bind-mounted at the same path inside, so
//! `QUOTIENT_CHECKPOINT_DIR` means the same in and out of the container.
//!
//! GPUs are passed as a device request by UUID with the `nvidia` driver, but only when the
//! host's GPUs are real: simulated GPUs do not exist for the driver. Images are never pulled:
//! an image that is not on the host is an error that says so ([`RuntimeError::ImageMissing`],
//! the node's fault: another host may have it). A container the daemon refuses as a bad
//! parameter (HTTP 400: a command not found in the image, a malformed variable) is
//! [`RuntimeError::InvalidLaunch`], the job's fault.
//!
//! The signal goes to the container's main process (PID 1 in its namespace). Like any PID 1, it
//! ignores signals it has no handler for, so a job that does not trap its checkpoint signal is
//! killed when the grace period ends, exactly as a process job that ignores it.
//!
//! # Logs
//! A container's output is kept in the same per-attempt file as a process job's
//! ([`super::log_path`], `<state_dir>/logs/<job>-<attempt>.log`), so that it is served, capped
//! and kept exactly the same way, live and after the exit, after the container is removed and
//! after an agent restart. From the container's start a follower task streams its stdout and
//! stderr from the daemon (`logs` with `follow` and `timestamps`) and appends each message to
//! the file, without its timestamp. The timestamp of the last message written is kept in
//! `<state_dir>/containers/<job>-<attempt>.since` (under an exclusive `flock`, so that only
//! one follower writes a file), so that a follower started again (by a restarted agent, or
//! after the daemon's stream broke) asks only for what came later and writes no line twice.
//! [`DockerRuntime::status`] reports a container as exited only once its follower has written
//! everything (at most [`LOG_DRAIN_MAX_MS`] after the exit; it says so past that), so that the
//! log is whole when the exit is reported; a container that exited while the agent was down
//! is drained by [`DockerRuntime::list_own`] before it is returned.
//!
//! Docker keeps its own copy of the log as well, in its own dir. With
//! [`DockerRuntime::with_log_cap`] (the agent sets it from `--log-max-bytes`) that copy is
//! bounded by Docker's own rotation: when the daemon's logging driver is `json-file` or
//! `local`, each container gets that driver with `max-size` half the cap and `max-file` 2.
//! With any other driver the agent leaves the daemon's copy to it and says so at start; a
//! driver that cannot be read back (`none`, `syslog`...) leaves the agent's file empty.
//!
//! # Calls that get no answer
//! Every call has a deadline ([`DOCKER_CALL_TIMEOUT_S`]), and a daemon may carry out a call
//! whose caller gave up on it. A create or start that got no answer (or found the name taken)
//! is settled by looking the container up by its name, which only this attempt has: one
//! created but never started is started, and one started is taken as the attempt. An attempt
//! that is not tried again after such a failure is [`Runtime::abandon`]ed: its container is
//! removed by name, killed if it runs, once the daemon answers.
//!
//! # The orphan watchdog
//! A container outlives its agent on purpose (a restarted agent re-adopts it by label), but
//! not its agent's lease, for the reason the process runtime gives (`super::process`). With
//! [`DockerRuntime::with_orphan_watchdog`] (the agent always sets it) every container gets a
//! watchdog process on the host, `quotient-agent container-watchdog`, started in its own
//! process group so that it outlives a killed agent. It holds an exclusive `flock` on
//! `<state_dir>/watchdogs/<container id>.lock` (a second one for the same container exits at
//! once, so a restarted agent simply starts one for every running container it finds; and
//! the agent looks every [`WATCHDOG_LOOK_S`] seconds, as it asks about a running container,
//! that a process holds that lock, and starts a watchdog again when none does) and,
//! every [`WATCHDOG_POLL_S`] second, reads the agent's lease file ([`crate::lease`]) and asks
//! the daemon whether the container still runs. It ends when the container does. Once the
//! lease's expiry is [`WATCHDOG_SLACK_MS`] behind it sends the checkpoint signal (not when the
//! file says `fencing`: the agent sent it already), waits the grace period and kills the
//! container, exactly as the process runtime's watchdog does, and leaves what it did in
//! `<state_dir>/watchdogs/<container id>.log` (removed when it had nothing to do). A missing or
//! unreadable lease file keeps the last expiry read (none yet: expired, fail closed), and a
//! daemon that does not answer within [`WATCHDOG_CALL_MS`] is asked again at the next poll.
//! While the daemon answers, the watchdog notes the container's init process (its pid, when
//! this host sees that pid in the container's cgroup, and its start time). Once the lease has
//! run out, a signal or kill the daemon does not take goes to that process directly, and
//! whether the container still runs is read from it: a daemon that hangs does not keep a
//! container running past its agent's lease. A watchdog that could not reach the daemon
//! from its start, or that runs where the container's pids are not its own (an agent in a
//! container), knows no such process, and waits for the daemon.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bollard::container::{
    Config, CreateContainerOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StartContainerOptions,
};
use bollard::errors::Error as DockerError;
use bollard::image::ListImagesOptions;
use bollard::models::{ContainerStateStatusEnum, DeviceRequest, HostConfig, HostConfigLogConfig};
use bollard::Docker;
use futures_util::StreamExt;
use quotient_common::{JobId, Signal};

use super::process::{process_state, WATCHDOG_POLL_S, WATCHDOG_SLACK_MS};
use super::{
    create_checkpoint_dir, job_environment, log_path, read_log_tail, FoundJob, GpuNumbering,
    JobHandle, JobStatus, JobUser, LaunchSpec, Runtime, RuntimeError,
};
use crate::lease::{boot_time_ms, read_lease_file};

/// The deadline of every call to the Docker daemon.
pub const DOCKER_CALL_TIMEOUT_S: u64 = 30;
/// Containers read by one `list_own`.
pub const CONTAINERS_LISTED_MAX: usize = 4_096;
/// How long after a container's exit [`DockerRuntime::status`] waits for its follower to
/// write the last of its output before it reports the exit anyway (milliseconds).
pub const LOG_DRAIN_MAX_MS: u64 = 10_000;
/// How long a follower waits before it asks the daemon again after the log stream of a
/// running container broke (milliseconds).
pub const LOG_FOLLOW_RETRY_MS: u64 = 200;
/// The folder under the state dir with each attempt's `.since` file (see the module docs).
pub const CONTAINERS_DIR: &str = "containers";
/// The most image tags [`local_images`] returns.
pub const IMAGES_LISTED_MAX: usize = 512;
/// The longest image tag [`local_images`] returns; longer ones are left out.
pub const IMAGE_TAG_BYTES_MAX: usize = 512;

pub const LABEL_JOB: &str = "quotient.job";
pub const LABEL_ATTEMPT: &str = "quotient.attempt";
pub const LABEL_NODE: &str = "quotient.node";
pub const LABEL_CHECKPOINT_SIGNAL: &str = "quotient.checkpoint-signal";
pub const LABEL_GRACE_PERIOD_MS: &str = "quotient.grace-period-ms";
/// Which agent installation started the container ([`instance_id`]): an agent adopts only
/// its own, so that containers another cluster's agent of the same node name left on the host
/// (a dev cluster torn down and made again, tests side by side) are never taken for its own.
pub const LABEL_INSTANCE: &str = "quotient.agent-instance";
/// The file in the state dir that holds the agent's instance id.
pub const INSTANCE_FILE: &str = "agent-instance";
/// The instance id's length in hexadecimal digits.
const INSTANCE_ID_CHARS: usize = 12;

/// This state dir's agent instance id, made at its first use: a new state dir is a new agent.
pub fn instance_id(state_dir: &Path) -> Result<String, RuntimeError> {
    let path = state_dir.join(INSTANCE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            if id.len() == INSTANCE_ID_CHARS && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(id.to_string());
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(RuntimeError::io("read", &path, error)),
    }
    let mut bytes = [0u8; INSTANCE_ID_CHARS / 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .map_err(|error| RuntimeError::io("read", Path::new("/dev/urandom"), error))?;
    let id: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    std::fs::create_dir_all(state_dir)
        .map_err(|error| RuntimeError::io("create", state_dir, error))?;
    std::fs::write(&path, format!("{id}\n"))
        .map_err(|error| RuntimeError::io("write", &path, error))?;
    Ok(id)
}

/// Logging drivers whose rotation options (`max-size`, `max-file`) the log cap sets.
pub const ROTATING_LOG_DRIVERS: [&str; 2] = ["json-file", "local"];
/// The log files a capped container's driver keeps: the one written and the one before.
pub const LOG_FILES_KEPT: u64 = 2;

/// How often, at most, the agent looks whether a running container's watchdog still runs
/// (seconds).
pub const WATCHDOG_LOOK_S: u64 = 5;
/// The subcommand of `quotient-agent` that watches one container.
pub const WATCHDOG_SUBCOMMAND: &str = "container-watchdog";
/// The folder under the state dir with the watchdogs' lock and log files.
pub const WATCHDOGS_DIR: &str = "watchdogs";

/// Runs jobs as Docker containers.
pub struct DockerRuntime {
    docker: Docker,
    node: String,
    /// Ask the nvidia driver for the job's GPUs (real GPUs only).
    gpu_device_requests: bool,
    watchdog: Option<WatchdogSetup>,
    /// Containers this agent started a watchdog for.
    watched: Mutex<HashMap<String, Watched>>,
    /// The logging setup of every container, when the log is capped.
    log_config: Option<HostConfigLogConfig>,
    /// The agent's state dir: the attempts' log files and `.since` files.
    state_dir: PathBuf,
    /// Who containers run as.
    user: JobUser,
    /// The most processes and threads a container may have (Docker's `PidsLimit`).
    pids_max: Option<u64>,
    /// This agent's [`instance_id`], on every container it starts.
    instance: String,
    /// The log follower of each container this runtime follows, by container id.
    followers: Mutex<HashMap<String, Follower>>,
    /// When each container asked about was first seen running (Docker's `StartedAt`), to
    /// tell a restart from outside ([`Runs::Restarted`]).
    runs: Mutex<HashMap<String, Runs>>,
}

/// What [`DockerRuntime::status`] saw of a container's runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Runs {
    /// Running since this `StartedAt`.
    Started(String),
    /// Started again from outside (`docker restart`): the attempt is over, as a stop.
    Restarted,
}

/// A container's log follower.
struct Follower {
    task: tokio::task::JoinHandle<()>,
    /// When [`DockerRuntime::status`] first saw the container exited with the follower busy.
    exit_seen: Option<Instant>,
}

/// A container whose watchdog this agent started.
#[derive(Debug, Clone, Copy)]
struct Watched {
    signal: Signal,
    grace_period_ms: u64,
    /// When its watchdog was last started, or last found alive.
    looked: Instant,
}

/// How the agent starts a container's watchdog.
#[derive(Debug, Clone)]
struct WatchdogSetup {
    /// The `quotient-agent` binary.
    program: PathBuf,
    lease_file: PathBuf,
    /// `<state_dir>/watchdogs`.
    dir: PathBuf,
}

/// Connects to the local daemon (`DOCKER_HOST` or the default socket), agrees on an API
/// version (daemons older than bollard's default refuse it otherwise) and checks that the
/// daemon answers.
pub async fn connect_docker() -> Result<Docker, RuntimeError> {
    let docker = Docker::connect_with_local_defaults()
        .map_err(|error| docker_error("connect", error))?
        .with_timeout(Duration::from_secs(DOCKER_CALL_TIMEOUT_S));
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|error| docker_error("negotiate the API version", error))?;
    docker
        .ping()
        .await
        .map_err(|error| docker_error("ping", error))?;
    Ok(docker)
}

impl DockerRuntime {
    /// A runtime for node `node` on the local daemon ([`connect_docker`]), keeping the
    /// containers' logs under `state_dir` and running them as the agent's own user.
    pub async fn connect(
        node: &str,
        state_dir: &Path,
        gpu_device_requests: bool,
    ) -> Result<DockerRuntime, RuntimeError> {
        DockerRuntime::on(
            connect_docker().await?,
            node,
            state_dir,
            gpu_device_requests,
        )
    }

    /// The same on a client of the caller's: tests reach the daemon through a proxy of their
    /// own with it.
    pub fn on(
        docker: Docker,
        node: &str,
        state_dir: &Path,
        gpu_device_requests: bool,
    ) -> Result<DockerRuntime, RuntimeError> {
        Ok(DockerRuntime {
            docker,
            node: node.to_string(),
            gpu_device_requests,
            watchdog: None,
            watched: Mutex::new(HashMap::new()),
            log_config: None,
            state_dir: state_dir.to_path_buf(),
            user: JobUser::current(),
            pids_max: None,
            followers: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
            instance: instance_id(state_dir)?,
        })
    }

    /// Containers run as `user` (`--user uid:gid`), or as their image's own user when that is
    /// root (the agent allows root jobs).
    pub fn with_job_user(mut self, user: JobUser) -> DockerRuntime {
        self.user = user;
        self
    }

    /// The daemon this runtime talks to.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    fn since_file(&self, job: JobId, attempt: u32) -> PathBuf {
        self.state_dir
            .join(CONTAINERS_DIR)
            .join(format!("{job}-{attempt}.since"))
    }

    /// Starts following container `id`'s log into the attempt's file, unless it is followed.
    fn follow(&self, id: &str, job: JobId, attempt: u32) {
        let mut followers = self
            .followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if followers
            .get(id)
            .is_some_and(|follower| !follower.task.is_finished())
        {
            return;
        }
        let task = tokio::spawn(follow_logs(
            self.docker.clone(),
            id.to_string(),
            log_path(&self.state_dir, job, attempt),
            self.since_file(job, attempt),
        ));
        followers.insert(
            id.to_string(),
            Follower {
                task,
                exit_seen: None,
            },
        );
    }

    /// Whether the exit of container `id` may be reported: its follower (if any) has written
    /// all of its output, or has had [`LOG_DRAIN_MAX_MS`] to.
    fn drained(&self, id: &str) -> bool {
        let mut followers = self
            .followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(follower) = followers.get_mut(id) else {
            return true;
        };
        if follower.task.is_finished() {
            return true;
        }
        let seen = *follower.exit_seen.get_or_insert_with(Instant::now);
        if seen.elapsed() < Duration::from_millis(LOG_DRAIN_MAX_MS) {
            return false;
        }
        tracing::warn!(container = %id, "the container's log was not all written within {LOG_DRAIN_MAX_MS} ms of its exit; reporting the exit anyway (the follower goes on)");
        true
    }

    /// Holds every container to `max` processes and threads (`None`: no limit).
    pub fn with_pids_max(mut self, max: Option<u64>) -> DockerRuntime {
        self.pids_max = max.filter(|max| *max > 0);
        self
    }

    /// Bounds each container's log to about `max_bytes` through the daemon's own rotation,
    /// if its logging driver rotates (see the module docs); otherwise says why not.
    pub async fn with_log_cap(mut self, max_bytes: u64) -> DockerRuntime {
        let driver = match self.docker.info().await {
            Ok(info) => info.logging_driver.unwrap_or_default(),
            Err(error) => {
                tracing::warn!("cannot ask the Docker daemon for its logging driver, so containers' logs are not capped: {error}");
                return self;
            }
        };
        if !ROTATING_LOG_DRIVERS.contains(&driver.as_str()) {
            tracing::warn!(%driver, "the Docker daemon's logging driver does not rotate, so containers' logs are not capped at --log-max-bytes: that is up to the driver");
            return self;
        }
        self.log_config = Some(HostConfigLogConfig {
            typ: Some(driver),
            config: Some(HashMap::from([
                (
                    "max-size".to_string(),
                    (max_bytes / LOG_FILES_KEPT).to_string(),
                ),
                ("max-file".to_string(), LOG_FILES_KEPT.to_string()),
            ])),
        });
        self
    }

    /// Gives every container an orphan watchdog (see the module docs): `program` is the
    /// `quotient-agent` binary, `lease_file` the agent's lease file, `state_dir` its state dir.
    pub fn with_orphan_watchdog(
        mut self,
        program: &Path,
        lease_file: &Path,
        state_dir: &Path,
    ) -> DockerRuntime {
        self.watchdog = Some(WatchdogSetup {
            program: program.to_path_buf(),
            lease_file: lease_file.to_path_buf(),
            dir: state_dir.join(WATCHDOGS_DIR),
        });
        self
    }

    /// Starts the watchdog of container `id` unless this agent started one already; one that
    /// an earlier agent started keeps the lock, and the new one exits.
    fn watch(&self, id: &str, signal: Signal, grace_period_ms: u64) {
        if self.watchdog.is_none() {
            return;
        }
        let first = self
            .watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id.to_string(),
                Watched {
                    signal,
                    grace_period_ms,
                    looked: Instant::now(),
                },
            )
            .is_none();
        if first {
            self.start_watchdog(id, signal, grace_period_ms);
        }
    }

    /// Starts the watchdog of a running container `id` again when it is gone (killed by hand,
    /// by the OOM killer): no process holds its lock. Looked at most every
    /// [`WATCHDOG_LOOK_S`] seconds per container.
    fn keep_watched(&self, id: &str) {
        let Some(setup) = &self.watchdog else {
            return;
        };
        let watched = {
            let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(entry) = watched.get_mut(id) else {
                return;
            };
            if entry.looked.elapsed() < Duration::from_secs(WATCHDOG_LOOK_S) {
                return;
            }
            entry.looked = Instant::now();
            *entry
        };
        if watchdog_alive(&setup.dir, id) {
            return;
        }
        tracing::warn!(container = %id, "the container's orphan watchdog is gone; starting it again");
        self.start_watchdog(id, watched.signal, watched.grace_period_ms);
    }

    fn start_watchdog(&self, id: &str, signal: Signal, grace_period_ms: u64) {
        let Some(setup) = &self.watchdog else {
            return;
        };
        let started = std::fs::create_dir_all(&setup.dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(watchdog_log(&setup.dir, id))
            })
            .and_then(|log| {
                tokio::process::Command::new(&setup.program)
                    .arg(WATCHDOG_SUBCOMMAND)
                    .arg("--container")
                    .arg(id)
                    .arg("--lease-file")
                    .arg(&setup.lease_file)
                    .arg("--dir")
                    .arg(&setup.dir)
                    .arg("--signal")
                    .arg(signal.name())
                    .arg("--grace-period-ms")
                    .arg(grace_period_ms.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    // Its own group: a signal to the agent's group does not reach it.
                    .process_group(0)
                    .spawn()
            });
        // A dropped child is reaped by tokio once it exits.
        if let Err(error) = started {
            tracing::error!(container = %id, error = %error, program = %setup.program.display(), "could not start the container's orphan watchdog; it runs without one");
        }
    }

    /// The container name of one attempt on this node.
    pub fn container_name(&self, job: JobId, attempt: u32) -> String {
        format!("quotient-{}-{}-{job}-{attempt}", self.node, self.instance)
    }

    fn labels(&self, spec: &LaunchSpec) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_JOB.to_string(), spec.job.to_string()),
            (LABEL_ATTEMPT.to_string(), spec.attempt.to_string()),
            (LABEL_NODE.to_string(), self.node.clone()),
            (LABEL_INSTANCE.to_string(), self.instance.clone()),
            (
                LABEL_CHECKPOINT_SIGNAL.to_string(),
                spec.checkpoint_signal.name().to_string(),
            ),
            (
                LABEL_GRACE_PERIOD_MS.to_string(),
                spec.grace_period_ms.to_string(),
            ),
        ])
    }

    /// What the container named `name` is: `spec`'s attempt on this node (with whether it
    /// was ever started), another's, or not known (none by that name, or the daemon does not
    /// say).
    async fn by_name(&self, spec: &LaunchSpec, name: &str) -> Named {
        let inspected = match self.docker.inspect_container(name, None).await {
            Ok(inspected) => inspected,
            Err(error) => {
                tracing::warn!(container = %name, error = %error, "could not look the attempt's container up by its name");
                return Named::Unknown;
            }
        };
        let labels = inspected
            .config
            .and_then(|config| config.labels)
            .unwrap_or_default();
        let ours = labels.get(LABEL_JOB) == Some(&spec.job.to_string())
            && labels.get(LABEL_ATTEMPT) == Some(&spec.attempt.to_string())
            && labels.get(LABEL_NODE) == Some(&self.node)
            && labels.get(LABEL_INSTANCE) == Some(&self.instance);
        if !ours {
            return Named::Another;
        }
        let state = inspected.state.unwrap_or_default();
        let started = state.running == Some(true)
            || !matches!(state.status, Some(ContainerStateStatusEnum::CREATED) | None);
        match inspected.id {
            Some(id) => Named::Ours { id, started },
            None => Named::Unknown,
        }
    }

    /// Whether the attempt's container was started again from outside (`docker restart`)
    /// since [`DockerRuntime::status`] first saw it running: its `StartedAt` moved.
    fn restarted_outside(
        &self,
        handle: &JobHandle,
        running: bool,
        started_at: Option<&str>,
    ) -> bool {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let started_at = started_at.unwrap_or_default();
        match runs.get(&handle.id) {
            Some(Runs::Restarted) => true,
            Some(Runs::Started(first)) if !started_at.is_empty() && first != started_at => {
                tracing::warn!(job = %handle.job, attempt = handle.attempt, container = %handle.id, "the attempt's container was started again from outside Quotient (docker restart): it is stopped, and the attempt reported as stopped");
                runs.insert(handle.id.clone(), Runs::Restarted);
                true
            }
            Some(Runs::Started(_)) => false,
            None => {
                if running && !started_at.is_empty() {
                    runs.insert(handle.id.clone(), Runs::Started(started_at.to_string()));
                }
                false
            }
        }
    }

    /// Takes container `id`, started already for `spec` (by an earlier try whose call seemed
    /// to fail, or by this agent's earlier life while Docker did not answer its restart), for
    /// the attempt: followed and watched as if this try had started it.
    fn take_started(&self, spec: &LaunchSpec, id: String, name: &str) -> JobHandle {
        tracing::warn!(job = %spec.job, attempt = spec.attempt, container = %name, "the attempt's container was started already (a start that got no answer, or an earlier life of this agent); it is taken as the attempt");
        self.follow(&id, spec.job, spec.attempt);
        self.watch(&id, spec.checkpoint_signal, spec.grace_period_ms);
        JobHandle {
            job: spec.job,
            attempt: spec.attempt,
            id,
        }
    }

    async fn send_signal(&self, handle: &JobHandle, signal: &str) -> Result<(), RuntimeError> {
        let options = KillContainerOptions { signal };
        match self.docker.kill_container(&handle.id, Some(options)).await {
            Ok(()) => Ok(()),
            // Not running (409) or already gone (404): there is nothing left to signal.
            Err(DockerError::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => Ok(()),
            Err(error) => Err(docker_error("kill", error)),
        }
    }
}

impl Drop for DockerRuntime {
    /// The followers end with their runtime, as they would with the agent's process; a runtime
    /// made again ([`DockerRuntime::list_own`]) follows on from where they stopped.
    fn drop(&mut self) {
        for follower in self
            .followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            follower.task.abort();
        }
    }
}

impl Runtime for DockerRuntime {
    async fn start(&self, spec: &LaunchSpec) -> Result<JobHandle, RuntimeError> {
        let invalid = |problem: String| RuntimeError::InvalidLaunch {
            job: spec.job,
            attempt: spec.attempt,
            problem,
        };
        let Some(image) = spec.payload.image.clone() else {
            return Err(invalid(
                "the Docker runtime needs an image (submit with --image)".to_string(),
            ));
        };
        let user = self.user.for_job(spec.job);
        create_checkpoint_dir(&spec.checkpoint_dir, &user)?;
        let checkpoint_dir = spec.checkpoint_dir.display().to_string();
        // A SageMaker training job also gets SageMaker's files, dirs and variables.
        let sagemaker = match super::sagemaker::contract(spec).map_err(invalid)? {
            Some(contract) => {
                super::create_work_dir(&spec.work_dir, &user)?;
                Some(super::sagemaker::prepare(spec, &contract, &user)?)
            }
            None => None,
        };
        let mut env = job_environment(spec, GpuNumbering::ContainerLocal);
        let mut binds = vec![format!("{checkpoint_dir}:{checkpoint_dir}")];
        if let Some(prepared) = &sagemaker {
            env.extend(prepared.env.clone());
            binds.extend(prepared.binds.iter().cloned());
        }
        let env: Vec<String> = env
            .into_iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let device_requests = (self.gpu_device_requests && !spec.gpu_uuids.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".to_string()),
                device_ids: Some(spec.gpu_uuids.clone()),
                capabilities: Some(vec![vec!["gpu".to_string()]]),
                ..DeviceRequest::default()
            }]
        });
        let config = Config {
            image: Some(image.clone()),
            cmd: (!spec.payload.command.is_empty()).then(|| spec.payload.command.to_vec()),
            entrypoint: sagemaker
                .as_ref()
                .and_then(|prepared| prepared.entrypoint.clone()),
            hostname: sagemaker
                .as_ref()
                .and_then(|prepared| prepared.hostname.clone()),
            env: Some(env),
            user: (!user.is_root()).then(|| format!("{}:{}", user.uid, user.gid)),
            labels: Some(self.labels(spec)),
            host_config: Some(HostConfig {
                binds: Some(binds),
                extra_hosts: sagemaker
                    .as_ref()
                    .map(|prepared| prepared.extra_hosts.clone())
                    .filter(|hosts| !hosts.is_empty()),
                device_requests,
                log_config: self.log_config.clone(),
                nano_cpus: spec.limits.nano_cpus(),
                memory: spec.limits.docker_memory(),
                // As for a process job: the memory limit holds swap included.
                memory_swap: spec.limits.docker_memory(),
                pids_limit: self.pids_max.and_then(|max| i64::try_from(max).ok()),
                // The members of a job of several nodes reach each other at their hosts'
                // addresses: they share the host's network.
                network_mode: spec.rendezvous.is_gang().then(|| "host".to_string()),
                ..HostConfig::default()
            }),
            ..Config::default()
        };
        let name = self.container_name(spec.job, spec.attempt);
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: name.clone(),
                    platform: None,
                }),
                config,
            )
            .await;
        let id = match created {
            Ok(created) => created.id,
            // A create that timed out may still be carried out by the daemon, and the retry
            // then finds the name taken (found by probing, with the daemon frozen): the
            // container of that name is this attempt's, from an earlier try. One never
            // started is started now; one started already is this attempt running.
            Err(error) if settled_by_name(&error) => match self.by_name(spec, &name).await {
                Named::Ours { id, started: false } => {
                    tracing::info!(job = %spec.job, attempt = spec.attempt, container = %name, "an earlier try created the container; starting it");
                    id
                }
                Named::Ours { id, started: true } => return Ok(self.take_started(spec, id, &name)),
                Named::Another if is_conflict(&error) => {
                    return Err(RuntimeError::AlreadyRunning {
                        job: spec.job,
                        attempt: spec.attempt,
                    })
                }
                // The name was taken, and then no container had it: an earlier try's
                // create or clean-up, held up in a daemon that hung, is being carried out
                // now (found by probing, with the daemon frozen: reported as "already
                // running", and the container made later was left behind). Unsettled: the
                // next try, or the abandon once none follows, looks again.
                Named::Unknown if is_conflict(&error) => {
                    return Err(RuntimeError::Unsettled {
                        operation: "docker create container".to_string(),
                        detail: format!("the name {name} was taken, and then no container had it"),
                    })
                }
                Named::Another | Named::Unknown => {
                    return Err(docker_error("create container", error))
                }
            },
            Err(error) => {
                return Err(match error {
                    DockerError::DockerResponseServerError {
                        status_code: 404,
                        message,
                    } => RuntimeError::ImageMissing {
                        image: image.clone(),
                        node: self.node.clone(),
                        detail: message,
                    },
                    // A bad parameter: the container spec itself is refused, on any host.
                    DockerError::DockerResponseServerError {
                        status_code: 400,
                        message,
                    } => invalid(format!(
                        "the Docker daemon refuses the container: {message}"
                    )),
                    other => docker_error("create container", other),
                });
            }
        };
        // The attempt's log starts empty, whatever an earlier try left.
        for dir in [
            spec.log_path.parent().map(Path::to_path_buf),
            self.since_file(spec.job, spec.attempt)
                .parent()
                .map(Path::to_path_buf),
        ]
        .into_iter()
        .flatten()
        {
            super::create_private_dir(&dir)?;
        }
        let since_file = self.since_file(spec.job, spec.attempt);
        match std::fs::remove_file(&since_file) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(RuntimeError::io("remove", &since_file, error)),
        }
        std::fs::File::create(&spec.log_path)
            .map_err(|error| RuntimeError::io("create log", &spec.log_path, error))?;
        if let Err(error) = self
            .docker
            .start_container(&id, None::<StartContainerOptions<String>>)
            .await
        {
            // A start that timed out may have been carried out all the same: the container
            // then runs as this attempt, and is kept rather than killed.
            if settled_by_name(&error) {
                if let Named::Ours {
                    id: found,
                    started: true,
                } = self.by_name(spec, &name).await
                {
                    return Ok(self.take_started(spec, found, &name));
                }
            }
            let removed = self
                .docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptions {
                        force: true,
                        ..RemoveContainerOptions::default()
                    }),
                )
                .await;
            if let Err(remove_error) = removed {
                tracing::warn!(container = %name, "could not remove a container that failed to start: {remove_error}");
            }
            return Err(match error {
                // The job's command cannot be executed in its image (not found, not
                // executable, too large), which the daemon reports as a bad parameter.
                DockerError::DockerResponseServerError {
                    status_code: 400,
                    message,
                } => invalid(format!("the container cannot start: {message}")),
                other => docker_error("start container", other),
            });
        }
        tracing::info!(job = %spec.job, attempt = spec.attempt, container = %name, "started container job");
        self.follow(&id, spec.job, spec.attempt);
        self.watch(&id, spec.checkpoint_signal, spec.grace_period_ms);
        Ok(JobHandle {
            job: spec.job,
            attempt: spec.attempt,
            id,
        })
    }

    async fn signal(&self, handle: &JobHandle, signal: Signal) -> Result<(), RuntimeError> {
        self.send_signal(handle, signal.name()).await
    }

    async fn kill(&self, handle: &JobHandle) -> Result<(), RuntimeError> {
        self.send_signal(handle, "SIGKILL").await
    }

    fn stopped_by_watchdog(&self, handle: &JobHandle) -> bool {
        self.watchdog
            .as_ref()
            .is_some_and(|setup| stop_recorded(&setup.dir, &handle.id))
    }

    async fn exit_reason(&self, handle: &JobHandle, code: i32) -> Option<String> {
        let inspected = self.docker.inspect_container(&handle.id, None).await.ok()?;
        if inspected.state.and_then(|state| state.oom_killed) == Some(true) {
            return Some(super::OUT_OF_MEMORY_REASON.to_string());
        }
        super::shell_exit_reason(code)
    }

    async fn status(&self, handle: &JobHandle) -> Result<JobStatus, RuntimeError> {
        let inspected = match self.docker.inspect_container(&handle.id, None).await {
            Ok(inspected) => inspected,
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                // The agent removes a container only after it saw it exit: this one was
                // removed by someone else (`docker rm -f`). It ran nothing more: a stop.
                tracing::warn!(job = %handle.job, attempt = handle.attempt, container = %handle.id, "the attempt's container is gone, removed outside Quotient: reported as stopped");
                return Ok(JobStatus::Exited { code: None });
            }
            Err(error) => return Err(docker_error("inspect container", error)),
        };
        let state = inspected.state.unwrap_or_default();
        let running = state.running == Some(true);
        if self.restarted_outside(handle, running, state.started_at.as_deref()) {
            // The job ran again from its start inside the same attempt, unknown to the
            // coordinators: it is stopped, and reported as stopped (the job goes back to
            // the queue and resumes from its checkpoint), not by its exit code.
            if running {
                self.send_signal(handle, "SIGKILL").await?;
                return Ok(JobStatus::Running);
            }
            if !self.drained(&handle.id) {
                return Ok(JobStatus::Running);
            }
            return Ok(JobStatus::Exited { code: None });
        }
        if running {
            self.keep_watched(&handle.id);
            return Ok(JobStatus::Running);
        }
        if !self.drained(&handle.id) {
            return Ok(JobStatus::Running);
        }
        let code = match state.status {
            // Created but never started: it ran nothing.
            Some(ContainerStateStatusEnum::CREATED) | None => None,
            _ => state.exit_code.and_then(|code| i32::try_from(code).ok()),
        };
        Ok(JobStatus::Exited { code })
    }

    async fn list_own(&self) -> Result<Vec<FoundJob>, RuntimeError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_NODE}={}", self.node), LABEL_JOB.to_string()],
        )]);
        let containers = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters,
                ..ListContainersOptions::default()
            }))
            .await
            .map_err(|error| docker_error("list containers", error))?;
        let mut found = Vec::new();
        for container in containers.into_iter().take(CONTAINERS_LISTED_MAX) {
            let labels = container.labels.unwrap_or_default();
            let (Some(id), Some(job), Some(attempt)) = (
                container.id,
                labels
                    .get(LABEL_JOB)
                    .and_then(|job| job.parse::<JobId>().ok()),
                labels
                    .get(LABEL_ATTEMPT)
                    .and_then(|attempt| attempt.parse::<u32>().ok()),
            ) else {
                continue;
            };
            if labels.get(LABEL_NODE) != Some(&self.node) {
                continue;
            }
            // Another agent's of the same node name; one without the label predates it.
            if labels
                .get(LABEL_INSTANCE)
                .is_some_and(|instance| *instance != self.instance)
            {
                continue;
            }
            let handle = JobHandle { job, attempt, id };
            let running = container_running(&self.docker, &handle.id).await == Some(true);
            if running {
                self.follow(&handle.id, job, attempt);
            } else if !self
                .followers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&handle.id)
            {
                // Exited while no agent followed it: write the rest of its output now, so that
                // the log is whole when the exit is reported.
                let drain = follow_logs(
                    self.docker.clone(),
                    handle.id.clone(),
                    log_path(&self.state_dir, job, attempt),
                    self.since_file(job, attempt),
                );
                if tokio::time::timeout(Duration::from_millis(LOG_DRAIN_MAX_MS), drain)
                    .await
                    .is_err()
                {
                    tracing::warn!(container = %handle.id, "could not write the exited container's log within {LOG_DRAIN_MAX_MS} ms");
                }
            }
            let status = self.status(&handle).await?;
            let checkpoint_signal = labels
                .get(LABEL_CHECKPOINT_SIGNAL)
                .and_then(|name| Signal::parse(name).ok())
                .unwrap_or(Signal::Sigterm);
            let grace_period_ms = labels
                .get(LABEL_GRACE_PERIOD_MS)
                .and_then(|ms| ms.parse().ok())
                .unwrap_or(quotient_common::job::GRACE_PERIOD_DEFAULT_MS);
            if status == JobStatus::Running {
                self.watch(&handle.id, checkpoint_signal, grace_period_ms);
            }
            found.push(FoundJob {
                handle,
                status,
                checkpoint_signal,
                grace_period_ms,
            });
        }
        found.sort_by(|a, b| a.handle.cmp(&b.handle));
        Ok(found)
    }

    async fn remove(&self, handle: &JobHandle) -> Result<(), RuntimeError> {
        if self.status(handle).await? == JobStatus::Running {
            return Err(RuntimeError::StillRunning {
                job: handle.job,
                attempt: handle.attempt,
            });
        }
        match self
            .docker
            .remove_container(&handle.id, Some(RemoveContainerOptions::default()))
            .await
        {
            Ok(())
            | Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                self.watched
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&handle.id);
                self.runs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&handle.id);
                if let Some(follower) = self
                    .followers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&handle.id)
                {
                    follower.task.abort();
                }
                if let Some(setup) = &self.watchdog {
                    let _ = std::fs::remove_file(watchdog_stop_record(&setup.dir, &handle.id));
                }
                // The log stays; only the follower's bookmark goes.
                let since_file = self.since_file(handle.job, handle.attempt);
                match std::fs::remove_file(&since_file) {
                    Ok(()) => Ok(()),
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(error) => Err(RuntimeError::io("remove", &since_file, error)),
                }
            }
            Err(error) => Err(docker_error("remove container", error)),
        }
    }

    async fn logs(&self, handle: &JobHandle) -> Result<String, RuntimeError> {
        read_log_tail(&log_path(&self.state_dir, handle.job, handle.attempt))
    }

    async fn abandon(
        &self,
        job: JobId,
        attempt: u32,
        _container: bool,
    ) -> Result<(), RuntimeError> {
        let name = self.container_name(job, attempt);
        let options = RemoveContainerOptions {
            force: true,
            ..RemoveContainerOptions::default()
        };
        match self.docker.remove_container(&name, Some(options)).await {
            Ok(()) => {
                tracing::warn!(%job, attempt, container = %name, "removed the container of an attempt whose launch had failed: the daemon had made it after all");
                Ok(())
            }
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(error) => Err(docker_error("remove container", error)),
        }
    }
}

/// Where a container's log follower is: the latest stamp it wrote, and how many messages with
/// that stamp it wrote (the daemon may give several messages one stamp). Within one stream
/// every message is written: stamps are not in order there (stdout and stderr are stamped by
/// two copiers, so a last line on stderr may carry an earlier stamp than the stdout line
/// before it). A stream read again (the follower restarted, or the daemon ended the stream)
/// starts at the latest stamp's second: until it passes that stamp, what was written already
/// is passed over, messages with the stamp itself as many times as they were written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bookmark {
    last: Option<LogStamp>,
    written_at_last: u32,
    /// Messages with the last stamp still to pass over in this stream.
    to_pass: u32,
    /// This stream has passed where the last one ended: write everything.
    past_seam: bool,
}

impl Bookmark {
    fn read(text: &str) -> Bookmark {
        match LogStamp::decode(text) {
            Some((stamp, written)) => Bookmark {
                last: Some(stamp),
                written_at_last: written,
                to_pass: written,
                past_seam: false,
            },
            None => Bookmark::default(),
        }
    }

    /// A new stream begins.
    fn restart(&mut self) {
        self.to_pass = self.written_at_last;
        self.past_seam = self.last.is_none();
    }

    /// Whether the message stamped `stamp` is to be written (and is then counted).
    fn admit(&mut self, stamp: LogStamp) -> bool {
        if !self.past_seam {
            match self.last.map(|last| stamp.cmp(&last)) {
                Some(std::cmp::Ordering::Less) => return false,
                Some(std::cmp::Ordering::Equal) if self.to_pass > 0 => {
                    self.to_pass -= 1;
                    return false;
                }
                _ => self.past_seam = true,
            }
        }
        match self.last.map(|last| stamp.cmp(&last)) {
            Some(std::cmp::Ordering::Equal) => self.written_at_last += 1,
            Some(std::cmp::Ordering::Less) => {}
            _ => {
                self.last = Some(stamp);
                self.written_at_last = 1;
            }
        }
        true
    }

    fn encode(&self) -> String {
        self.last
            .map_or_else(String::new, |stamp| stamp.encode(self.written_at_last))
    }
}

/// When the daemon stamped one log message: whole seconds since the epoch and nanoseconds.
/// Ordered, so that a follower skips what it wrote already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogStamp {
    pub seconds: i64,
    pub nanos: u32,
}

impl LogStamp {
    /// Parses the daemon's stamp, RFC 3339 in UTC with up to nine fraction digits
    /// (`2024-05-01T12:00:00.123456789Z`).
    pub fn parse(text: &str) -> Option<LogStamp> {
        let text = text.strip_suffix('Z')?;
        let (date, time) = text.split_once('T')?;
        let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
        let (year, month, day) = (date.next()??, date.next()??, date.next()??);
        let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
        let mut clock = clock.splitn(3, ':').map(|part| part.parse::<i64>().ok());
        let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
        if fraction.len() > 9 || !fraction.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        let nanos = if fraction.is_empty() {
            0
        } else {
            fraction.parse::<u32>().ok()? * 10u32.pow(9 - fraction.len() as u32)
        };
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
            return None;
        }
        let seconds = quotient_common::duration::days_from_civil(year, month, day) * 86_400
            + hour * 3_600
            + minute * 60
            + second;
        Some(LogStamp { seconds, nanos })
    }

    /// The bookmark: this stamp and how many messages with it were written (several
    /// messages may carry the same stamp). Fixed width, so that it overwrites the last one.
    fn encode(&self, written: u32) -> String {
        format!("{:020} {:09} {written:010}\n", self.seconds, self.nanos)
    }

    /// A bookmark read back; one written before it held a count counts one message.
    fn decode(text: &str) -> Option<(LogStamp, u32)> {
        let mut words = text.split_whitespace();
        let stamp = LogStamp {
            seconds: words.next()?.parse().ok()?,
            nanos: words.next()?.parse().ok()?,
        };
        let written = words.next().and_then(|word| word.parse().ok()).unwrap_or(1);
        Some((stamp, written))
    }
}

/// Splits one message of a log read with timestamps into its stamp and its bytes.
fn split_stamp(bytes: &[u8]) -> Option<(LogStamp, &[u8])> {
    let space = bytes.iter().take(40).position(|byte| *byte == b' ')?;
    let stamp = LogStamp::parse(std::str::from_utf8(&bytes[..space]).ok()?)?;
    Some((stamp, &bytes[space + 1..]))
}

/// Appends container `id`'s output to `log` until the container has ended and all of its
/// output is written (see the module docs); `since_file` keeps the last stamp written. Ends at
/// once when another follower holds `since_file`'s lock and the container is not running.
pub async fn follow_logs(docker: Docker, id: String, log: PathBuf, since_file: PathBuf) {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&since_file);
    let since = match opened {
        Ok(file) => file,
        Err(error) => {
            tracing::error!(container = %id, path = %since_file.display(), "cannot open the log bookmark, so the container's log is not kept: {error}");
            return;
        }
    };
    // One follower per attempt: a second one waits for the first to end.
    loop {
        // SAFETY: flock on a descriptor this task owns; released when it is closed.
        if unsafe { libc::flock(since.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        if container_running(&docker, &id).await == Some(false) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(LOG_FOLLOW_RETRY_MS)).await;
    }
    let mut bookmark = {
        let mut text = String::new();
        use std::io::Read;
        let _ = (&since).take(64).read_to_string(&mut text);
        Bookmark::read(&text)
    };
    let mut out = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
    {
        Ok(file) => file,
        Err(error) => {
            tracing::error!(container = %id, path = %log.display(), "cannot open the container's log file, so its log is not kept: {error}");
            return;
        }
    };
    let mut follow = true;
    let mut quiet_reads = 0;
    loop {
        let options = LogsOptions::<String> {
            follow,
            stdout: true,
            stderr: true,
            timestamps: true,
            since: bookmark.last.map_or(0, |stamp| stamp.seconds),
            tail: "all".to_string(),
            ..LogsOptions::default()
        };
        let mut stream = docker.logs(&id, Some(options));
        bookmark.restart();
        let mut wrote = false;
        while let Some(item) = stream.next().await {
            let bytes = match item {
                Ok(output) => output.into_bytes(),
                Err(error) => {
                    tracing::debug!(container = %id, "the log stream ended: {error}");
                    break;
                }
            };
            let Some((stamp, message)) = split_stamp(&bytes) else {
                tracing::warn!(container = %id, "a log message without a stamp; writing it as it is");
                if let Err(error) = out.write_all(&bytes) {
                    tracing::warn!(container = %id, "cannot write the container's log: {error}");
                }
                continue;
            };
            if !bookmark.admit(stamp) {
                continue;
            }
            wrote = true;
            if let Err(error) = out.write_all(message) {
                tracing::warn!(container = %id, path = %log.display(), "cannot write the container's log: {error}");
            }
            if let Err(error) = since.write_all_at(bookmark.encode().as_bytes(), 0) {
                tracing::warn!(container = %id, "cannot write the log bookmark: {error}");
            }
        }
        if !follow {
            // The daemon may mark a container exited before its log driver has stored the
            // last messages (seen: the final line on stderr missing from the read right after
            // the exit). Read again until reads come back with nothing new.
            if wrote {
                quiet_reads = 0;
            } else {
                quiet_reads += 1;
            }
            if quiet_reads >= LOG_QUIET_READS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(LOG_QUIET_READ_PAUSE_MS)).await;
            continue;
        }
        match container_running(&docker, &id).await {
            // Ended: reads without follow pick up anything the stream left.
            Some(false) => follow = false,
            _ => tokio::time::sleep(Duration::from_millis(LOG_FOLLOW_RETRY_MS)).await,
        }
    }
}

/// After its container exited, a follower reads its log until this many reads in a row bring
/// nothing new, [`LOG_QUIET_READ_PAUSE_MS`] apart.
const LOG_QUIET_READS: u32 = 2;
const LOG_QUIET_READ_PAUSE_MS: u64 = 50;

/// The tags of the images on the daemon's host, sorted: at most [`IMAGES_LISTED_MAX`], each
/// at most [`IMAGE_TAG_BYTES_MAX`] bytes (longer ones are left out), no `<none>`.
pub async fn local_images(docker: &Docker) -> Result<Vec<String>, RuntimeError> {
    let images = docker
        .list_images(Some(ListImagesOptions::<String> {
            all: false,
            ..ListImagesOptions::default()
        }))
        .await
        .map_err(|error| docker_error("list images", error))?;
    let tags: BTreeSet<String> = images
        .into_iter()
        .flat_map(|image| image.repo_tags)
        .filter(|tag| tag.len() <= IMAGE_TAG_BYTES_MAX && !tag.contains("<none>"))
        .collect();
    Ok(tags.into_iter().take(IMAGES_LISTED_MAX).collect())
}

/// The log file of container `id`'s watchdog in `dir`.
pub fn watchdog_log(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.log"))
}

/// The lock file of container `id`'s watchdog in `dir`.
pub fn watchdog_lock(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.lock"))
}

/// The file container `id`'s watchdog in `dir` writes before it stops the container: an
/// exit found later is then the agent's own stop, not the job's (`stopped_by_watchdog`).
pub fn watchdog_stop_record(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.stopped"))
}

/// Whether a watchdog of container `id`, whose files are in `dir`, runs: one holds its lock.
/// The look takes the lock for a moment when it is free: a watchdog starting just then finds
/// it taken and exits, and the next look starts one.
fn watchdog_alive(dir: &Path, id: &str) -> bool {
    use std::os::fd::AsRawFd;
    let path = watchdog_lock(dir, id);
    let lock = match std::fs::OpenOptions::new().write(true).open(&path) {
        Ok(lock) => lock,
        // A watchdog holds its lock file from its start to its end.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return false,
        Err(error) => {
            tracing::warn!(path = %path.display(), "cannot look at the container watchdog's lock: {error}");
            return true;
        }
    };
    // SAFETY: flock on a descriptor this function owns; released when it is closed below.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// Whether the watchdog of container `id`, whose files are in `dir`, stopped it.
pub fn stop_recorded(dir: &Path, id: &str) -> bool {
    watchdog_stop_record(dir, id).exists()
}

/// How a container's watchdog ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The container stopped (or was removed) under a live lease.
    Gone,
    /// The lease ran out: the watchdog stopped the container (its log says whether the
    /// container exited within its grace period or was killed).
    Stopped,
}

/// Whether container `id` runs, with its init process's pid while it does (a container gone
/// does not run); the daemon's error when it does not say.
async fn container_state(docker: &Docker, id: &str) -> Result<(bool, Option<i64>), DockerError> {
    match docker.inspect_container(id, None).await {
        Ok(inspected) => {
            let state = inspected.state.unwrap_or_default();
            let running = state.running == Some(true);
            Ok((running, state.pid.filter(|_| running)))
        }
        Err(DockerError::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok((false, None)),
        Err(error) => Err(error),
    }
}

/// Whether container `id` runs: `None` when the daemon does not say.
async fn container_running(docker: &Docker, id: &str) -> Option<bool> {
    match container_state(docker, id).await {
        Ok((running, _)) => Some(running),
        Err(error) => {
            tracing::warn!(container = %id, error = %error, "the Docker daemon did not say whether the container runs; asking again");
            None
        }
    }
}

/// How long a container's watchdog waits for one answer of the daemon: a daemon that hangs
/// must not hold the lease check up for the client's own timeout of 30 s a call.
pub const WATCHDOG_CALL_MS: u64 = 2_000;

/// A container's init process as this host sees it: its pid and its start time (field 22
/// of `/proc/PID/stat`), which no later process of the same pid has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InitProcess {
    pid: i32,
    started: u64,
}

impl InitProcess {
    /// Process `pid` (the daemon's word for container `id`'s init process) when this host
    /// sees it in that container's cgroup. An agent in a container of its own sees other
    /// pids, and finds none.
    fn of(pid: i64, id: &str) -> Option<InitProcess> {
        let pid = i32::try_from(pid).ok().filter(|pid| *pid > 1)?;
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        if !cgroup.contains(id) {
            return None;
        }
        let (_, started) = process_state(pid)?;
        Some(InitProcess { pid, started })
    }

    /// Whether the process still runs: the same start time, and not a zombie.
    fn alive(&self) -> bool {
        process_state(self.pid)
            .is_some_and(|(state, started)| started == self.started && !matches!(state, 'Z' | 'X'))
    }

    /// Sends `signal` to the process while it runs; whether it was sent.
    fn signal(&self, signal: i32) -> bool {
        // SAFETY: kill(2) with a pid checked just before to be the same process.
        self.alive() && unsafe { libc::kill(self.pid, signal) } == 0
    }
}

/// What a container's watchdog knows of its container.
struct Guarded<'a> {
    docker: &'a Docker,
    id: &'a str,
    /// Its init process, learnt while the daemon answered: signalled directly, and looked at
    /// for whether the container runs, when the daemon does not answer.
    init: Option<InitProcess>,
}

impl Guarded<'_> {
    /// Whether the container runs, by the daemon's word within [`WATCHDOG_CALL_MS`], else by
    /// its init process when known; `None` when neither says.
    async fn running(&mut self) -> Option<bool> {
        let limit = Duration::from_millis(WATCHDOG_CALL_MS);
        let asked = tokio::time::timeout(limit, container_state(self.docker, self.id)).await;
        let why = match asked {
            Ok(Ok((running, pid))) => {
                if let Some(pid) = pid {
                    if self.init.map(|init| i64::from(init.pid)) != Some(pid) {
                        self.init = InitProcess::of(pid, self.id);
                    }
                }
                return Some(running);
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {WATCHDOG_CALL_MS} ms"),
        };
        match self.init {
            Some(init) => {
                let alive = init.alive();
                tracing::warn!(container = %self.id, pid = init.pid, alive, "the Docker daemon did not say whether the container runs ({why}); its init process says");
                Some(alive)
            }
            None => {
                tracing::warn!(container = %self.id, "the Docker daemon did not say whether the container runs ({why}); asking again");
                None
            }
        }
    }

    /// Sends `signal` (name and number) to the container: through the daemon, else, when it
    /// does not take it within [`WATCHDOG_CALL_MS`], straight to the container's init process
    /// (found by probing: with the daemon frozen, a container outlived its agent's lease
    /// while its job ran again elsewhere). Whether it was sent.
    async fn send(&self, name: &'static str, number: i32) -> bool {
        let limit = Duration::from_millis(WATCHDOG_CALL_MS);
        let options = KillContainerOptions { signal: name };
        let sent = tokio::time::timeout(limit, self.docker.kill_container(self.id, Some(options)));
        let why = match sent.await {
            Ok(Ok(())) => return true,
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {WATCHDOG_CALL_MS} ms"),
        };
        if let Some(init) = self.init {
            if init.signal(number) {
                tracing::warn!(container = %self.id, signal = name, pid = init.pid, "the Docker daemon did not take the signal ({why}); sent it to the container's init process directly");
                return true;
            }
        }
        tracing::warn!(container = %self.id, signal = name, "could not signal the container: {why}");
        false
    }
}

/// Watches container `id` against the agent's lease file until the container ends, or stops
/// it once the lease has run out (see the module docs).
pub async fn watch_container(
    docker: &Docker,
    id: &str,
    lease_file: &Path,
    stop_record: &Path,
    signal: Signal,
    grace_period_ms: u64,
) -> WatchEnd {
    let poll = Duration::from_secs(WATCHDOG_POLL_S);
    let mut watched = Guarded {
        docker,
        id,
        init: None,
    };
    let (mut expiry, mut fencing) = (0, false);
    let now = loop {
        if watched.running().await == Some(false) {
            return WatchEnd::Gone;
        }
        if let Some(read) = read_lease_file(lease_file) {
            (expiry, fencing) = read;
        }
        match boot_time_ms() {
            Some(now) if now > expiry.saturating_add(WATCHDOG_SLACK_MS) => break now,
            Some(_) => {}
            None => tracing::error!("the boot clock is unreadable; the lease cannot be checked"),
        }
        tokio::time::sleep(poll).await;
    };
    tracing::warn!(container = %id, expiry_ms = expiry, now_ms = now, "the agent's lease ran out; stopping the container");
    // On record before the signal: whatever the container's exit code, the agent reports
    // this exit as its own stop (the job goes back to the queue), as the process watchdog's.
    if let Err(error) = std::fs::write(stop_record, b"stopped by the orphan watchdog\n") {
        tracing::error!(container = %id, path = %stop_record.display(), error = %error, "could not record the stop; the agent may report it as the job's own exit");
    }
    if !fencing {
        // The grace period counts from a signal that got through (found by probing: one
        // sent into a hung daemon took half the grace with it).
        while !watched.send(signal.name(), signal.number()).await {
            if watched.running().await == Some(false) {
                return WatchEnd::Stopped;
            }
            tokio::time::sleep(poll).await;
        }
    }
    let end = Instant::now() + Duration::from_millis(grace_period_ms);
    while Instant::now() < end {
        if watched.running().await == Some(false) {
            tracing::warn!(container = %id, "the container stopped within its grace period");
            return WatchEnd::Stopped;
        }
        tokio::time::sleep(poll.min(end.saturating_duration_since(Instant::now()))).await;
    }
    tracing::warn!(container = %id, "grace period over; killing the container");
    loop {
        watched.send("SIGKILL", libc::SIGKILL).await;
        if watched.running().await == Some(false) {
            return WatchEnd::Stopped;
        }
        tokio::time::sleep(poll).await;
    }
}

/// What the container of an attempt's name is ([`DockerRuntime::by_name`]).
enum Named {
    /// The attempt's own, and whether it was ever started.
    Ours { id: String, started: bool },
    /// Another's: other labels.
    Another,
    /// None has the name, or the daemon did not say.
    Unknown,
}

/// Whether the daemon refused a create because the container's name is taken.
fn is_conflict(error: &DockerError) -> bool {
    matches!(
        error,
        DockerError::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}

/// Whether a failed create or start is settled by looking the container up by its name: the
/// name was taken (409), or no answer came (a timeout, a broken connection), so the daemon may
/// have carried the call out.
fn settled_by_name(error: &DockerError) -> bool {
    match error {
        DockerError::DockerResponseServerError { .. } => is_conflict(error),
        _ => true,
    }
}

fn docker_error(operation: &str, error: DockerError) -> RuntimeError {
    if matches!(error, DockerError::RequestTimeoutError) {
        return RuntimeError::NoAnswer {
            operation: format!("docker {operation}"),
            limit_ms: DOCKER_CALL_TIMEOUT_S * 1_000,
        };
    }
    let hint = match &error {
        DockerError::SocketNotFoundError(_) | DockerError::HyperResponseError { .. } => {
            ": is the Docker daemon running, and may this user use its socket?"
        }
        _ => "",
    };
    RuntimeError::Docker {
        operation: operation.to_string(),
        detail: format!("{error}{hint}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64, nanos: u32) -> LogStamp {
        LogStamp { seconds, nanos }
    }

    #[test]
    fn messages_sharing_a_stamp_are_all_written_once() {
        // Proves the lost-line bug is gone: two messages with one stamp are both written in
        // one stream, and a stream read again passes over exactly what was written.
        let mut bookmark = Bookmark::default();
        bookmark.restart();
        // Within a stream everything is written, an earlier stamp after a later one too.
        let stream = [at(1, 5), at(1, 7), at(1, 7), at(2, 0), at(1, 9)];
        let written: Vec<bool> = stream.iter().map(|s| bookmark.admit(*s)).collect();
        assert_eq!(written, [true, true, true, true, true]);
        assert_eq!(bookmark.last, Some(at(2, 0)));
        // Ended after the second message stamped 1.7: read again from second 1.
        let mut bookmark = Bookmark::default();
        bookmark.restart();
        assert!(bookmark.admit(at(1, 5)) && bookmark.admit(at(1, 7)) && bookmark.admit(at(1, 7)));
        let mut again = Bookmark::read(&bookmark.encode());
        again.restart();
        let resumed: Vec<bool> = [at(1, 5), at(1, 7), at(1, 7), at(1, 7), at(2, 0)]
            .iter()
            .map(|s| again.admit(*s))
            .collect();
        assert_eq!(resumed, [false, false, false, true, true]);
        // A bookmark of the build before counts carried one message.
        let old = format!("{:020} {:09}\n", 1, 7);
        let mut from_old = Bookmark::read(&old);
        from_old.restart();
        assert_eq!(from_old.written_at_last, 1);
        assert!(!from_old.admit(at(1, 7)));
        assert!(from_old.admit(at(1, 7)));
    }
}
