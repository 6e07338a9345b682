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
//! # The log cap
//! Docker keeps a container's log itself, outside the agent's state dir, and removes it with
//! the container once the exit is reported. With [`DockerRuntime::with_log_cap`] (the agent
//! sets it from `--log-max-bytes`) a running container's log is bounded too, by Docker's own
//! rotation: when the daemon's logging driver is `json-file` or `local`, each container gets
//! that driver with `max-size` half the cap and `max-file` 2, so it keeps the newest half to
//! whole cap of its output (the start of a long log is lost, unlike a process job's; a
//! `--follow` across a rotation skips what was rotated away). With any other driver the
//! agent leaves logging to it and says so at start.
//!
//! # The orphan watchdog
//! A container outlives its agent on purpose (a restarted agent re-adopts it by label), but
//! not its agent's lease, for the reason the process runtime gives (`super::process`). With
//! [`DockerRuntime::with_orphan_watchdog`] (the agent always sets it) every container gets a
//! watchdog process on the host, `quotient-agent container-watchdog`, started in its own
//! process group so that it outlives a killed agent. It holds an exclusive `flock` on
//! `<state_dir>/watchdogs/<container id>.lock` (a second one for the same container exits at
//! once, so a restarted agent simply starts one for every running container it finds) and,
//! every [`WATCHDOG_POLL_S`] second, reads the agent's lease file ([`crate::lease`]) and asks
//! the daemon whether the container still runs. It ends when the container does. Once the
//! lease's expiry is [`WATCHDOG_SLACK_MS`] behind it sends the checkpoint signal (not when the
//! file says `fencing`: the agent sent it already), waits the grace period and kills the
//! container, exactly as the process runtime's watchdog does, and leaves what it did in
//! `<state_dir>/watchdogs/<container id>.log` (removed when it had nothing to do). A missing or
//! unreadable lease file keeps the last expiry read (none yet: expired, fail closed), and a
//! daemon that does not answer is asked again at the next poll.

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
use bollard::models::{ContainerStateStatusEnum, DeviceRequest, HostConfig, HostConfigLogConfig};
use bollard::Docker;
use futures_util::StreamExt;
use quotient_common::{JobId, Signal};

use super::process::{WATCHDOG_POLL_S, WATCHDOG_SLACK_MS};
use super::{
    job_environment, FoundJob, GpuNumbering, JobHandle, JobStatus, LaunchSpec, Runtime,
    RuntimeError, LOG_READ_BYTES_MAX,
};
use crate::lease::{boot_time_ms, read_lease_file};

/// The deadline of every call to the Docker daemon.
pub const DOCKER_CALL_TIMEOUT_S: u64 = 30;
/// Containers read by one `list_own`.
pub const CONTAINERS_LISTED_MAX: usize = 4_096;
/// Log lines read back by `logs`.
pub const LOG_LINES_MAX: usize = 10_000;

pub const LABEL_JOB: &str = "quotient.job";
pub const LABEL_ATTEMPT: &str = "quotient.attempt";
pub const LABEL_NODE: &str = "quotient.node";
pub const LABEL_CHECKPOINT_SIGNAL: &str = "quotient.checkpoint-signal";
pub const LABEL_GRACE_PERIOD_MS: &str = "quotient.grace-period-ms";

/// Logging drivers whose rotation options (`max-size`, `max-file`) the log cap sets.
pub const ROTATING_LOG_DRIVERS: [&str; 2] = ["json-file", "local"];
/// The log files a capped container's driver keeps: the one written and the one before.
pub const LOG_FILES_KEPT: u64 = 2;

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
    watched: Mutex<BTreeSet<String>>,
    /// The logging setup of every container, when the log is capped.
    log_config: Option<HostConfigLogConfig>,
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
    /// A runtime for node `node` on the local daemon ([`connect_docker`]).
    pub async fn connect(
        node: &str,
        gpu_device_requests: bool,
    ) -> Result<DockerRuntime, RuntimeError> {
        Ok(DockerRuntime {
            docker: connect_docker().await?,
            node: node.to_string(),
            gpu_device_requests,
            watchdog: None,
            watched: Mutex::new(BTreeSet::new()),
            log_config: None,
        })
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
        let Some(setup) = &self.watchdog else {
            return;
        };
        if !self
            .watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_string())
        {
            return;
        }
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
        format!("quotient-{}-{job}-{attempt}", self.node)
    }

    fn labels(&self, spec: &LaunchSpec) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_JOB.to_string(), spec.job.to_string()),
            (LABEL_ATTEMPT.to_string(), spec.attempt.to_string()),
            (LABEL_NODE.to_string(), self.node.clone()),
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
        std::fs::create_dir_all(&spec.checkpoint_dir)
            .map_err(|error| RuntimeError::io("create", &spec.checkpoint_dir, error))?;
        let checkpoint_dir = spec.checkpoint_dir.display().to_string();
        let env: Vec<String> = job_environment(spec, GpuNumbering::ContainerLocal)
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
            cmd: (!spec.payload.command.is_empty()).then(|| spec.payload.command.clone()),
            env: Some(env),
            labels: Some(self.labels(spec)),
            host_config: Some(HostConfig {
                binds: Some(vec![format!("{checkpoint_dir}:{checkpoint_dir}")]),
                device_requests,
                log_config: self.log_config.clone(),
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
            .await
            .map_err(|error| match error {
                DockerError::DockerResponseServerError {
                    status_code: 409, ..
                } => RuntimeError::AlreadyRunning {
                    job: spec.job,
                    attempt: spec.attempt,
                },
                DockerError::DockerResponseServerError {
                    status_code: 404,
                    message,
                } => RuntimeError::ImageMissing {
                    image: image.clone(),
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
            })?;
        if let Err(error) = self
            .docker
            .start_container(&created.id, None::<StartContainerOptions<String>>)
            .await
        {
            let removed = self
                .docker
                .remove_container(
                    &created.id,
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
        self.watch(&created.id, spec.checkpoint_signal, spec.grace_period_ms);
        Ok(JobHandle {
            job: spec.job,
            attempt: spec.attempt,
            id: created.id,
        })
    }

    async fn signal(&self, handle: &JobHandle, signal: Signal) -> Result<(), RuntimeError> {
        self.send_signal(handle, signal.name()).await
    }

    async fn kill(&self, handle: &JobHandle) -> Result<(), RuntimeError> {
        self.send_signal(handle, "SIGKILL").await
    }

    async fn status(&self, handle: &JobHandle) -> Result<JobStatus, RuntimeError> {
        let inspected = match self.docker.inspect_container(&handle.id, None).await {
            Ok(inspected) => inspected,
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(JobStatus::Exited { code: None }),
            Err(error) => return Err(docker_error("inspect container", error)),
        };
        let state = inspected.state.unwrap_or_default();
        if state.running == Some(true) {
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
            let handle = JobHandle { job, attempt, id };
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
                Ok(())
            }
            Err(error) => Err(docker_error("remove container", error)),
        }
    }

    async fn logs(&self, handle: &JobHandle) -> Result<String, RuntimeError> {
        let options = LogsOptions {
            stdout: true,
            stderr: true,
            tail: LOG_LINES_MAX.to_string(),
            ..LogsOptions::default()
        };
        let mut stream = self.docker.logs(&handle.id, Some(options));
        let mut text = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| docker_error("read logs", error))?;
            text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
            if text.len() as u64 > LOG_READ_BYTES_MAX {
                let cut = text.len() - LOG_READ_BYTES_MAX as usize;
                let cut = (cut..text.len())
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(text.len());
                text.drain(..cut);
            }
        }
        Ok(text)
    }
}

/// The log file of container `id`'s watchdog in `dir`.
pub fn watchdog_log(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.log"))
}

/// The lock file of container `id`'s watchdog in `dir`.
pub fn watchdog_lock(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.lock"))
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

/// Whether container `id` runs: `None` when the daemon does not say.
async fn container_running(docker: &Docker, id: &str) -> Option<bool> {
    match docker.inspect_container(id, None).await {
        Ok(inspected) => Some(inspected.state.and_then(|s| s.running) == Some(true)),
        Err(DockerError::DockerResponseServerError {
            status_code: 404, ..
        }) => Some(false),
        Err(error) => {
            tracing::warn!(container = %id, error = %error, "the Docker daemon did not say whether the container runs; asking again");
            None
        }
    }
}

/// Watches container `id` against the agent's lease file until the container ends, or stops
/// it once the lease has run out (see the module docs).
pub async fn watch_container(
    docker: &Docker,
    id: &str,
    lease_file: &Path,
    signal: Signal,
    grace_period_ms: u64,
) -> WatchEnd {
    let poll = Duration::from_secs(WATCHDOG_POLL_S);
    let (mut expiry, mut fencing) = (0, false);
    let now = loop {
        if container_running(docker, id).await == Some(false) {
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
    let send = |signal: &'static str| async move {
        let options = KillContainerOptions { signal };
        if let Err(error) = docker.kill_container(id, Some(options)).await {
            tracing::warn!(container = %id, signal, error = %error, "could not signal the container");
        }
    };
    if !fencing {
        send(signal.name()).await;
    }
    let end = Instant::now() + Duration::from_millis(grace_period_ms);
    while Instant::now() < end {
        if container_running(docker, id).await == Some(false) {
            tracing::warn!(container = %id, "the container stopped within its grace period");
            return WatchEnd::Stopped;
        }
        tokio::time::sleep(poll.min(end.saturating_duration_since(Instant::now()))).await;
    }
    tracing::warn!(container = %id, "grace period over; killing the container");
    loop {
        send("SIGKILL").await;
        if container_running(docker, id).await == Some(false) {
            return WatchEnd::Stopped;
        }
        tokio::time::sleep(poll).await;
    }
}

fn docker_error(operation: &str, error: DockerError) -> RuntimeError {
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
