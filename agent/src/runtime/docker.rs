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
//! an image that is not on the host is an error that says so.
//!
//! The signal goes to the container's main process (PID 1 in its namespace). Like any PID 1, it
//! ignores signals it has no handler for, so a job that does not trap its checkpoint signal is
//! killed when the grace period ends, exactly as a process job that ignores it.

use std::collections::HashMap;
use std::time::Duration;

use bollard::container::{
    Config, CreateContainerOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StartContainerOptions,
};
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerStateStatusEnum, DeviceRequest, HostConfig};
use bollard::Docker;
use futures_util::StreamExt;
use quotient_common::{JobId, Signal};

use super::{
    job_environment, FoundJob, GpuNumbering, JobHandle, JobStatus, LaunchSpec, Runtime,
    RuntimeError, LOG_READ_BYTES_MAX,
};

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

/// Runs jobs as Docker containers.
pub struct DockerRuntime {
    docker: Docker,
    node: String,
    /// Ask the nvidia driver for the job's GPUs (real GPUs only).
    gpu_device_requests: bool,
}

impl DockerRuntime {
    /// Connects to the local daemon (`DOCKER_HOST` or the default socket), agrees on an API
    /// version (daemons older than bollard's default refuse it otherwise) and checks that the
    /// daemon answers.
    pub async fn connect(
        node: &str,
        gpu_device_requests: bool,
    ) -> Result<DockerRuntime, RuntimeError> {
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
        Ok(DockerRuntime {
            docker,
            node: node.to_string(),
            gpu_device_requests,
        })
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
                } => invalid(format!(
                    "image {image} is not on this host ({message}); Quotient never pulls \
                     images: docker pull, load or build it on the host first"
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
            return Err(docker_error("start container", error));
        }
        tracing::info!(job = %spec.job, attempt = spec.attempt, container = %name, "started container job");
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
            found.push(FoundJob {
                handle,
                status,
                checkpoint_signal: labels
                    .get(LABEL_CHECKPOINT_SIGNAL)
                    .and_then(|name| Signal::parse(name).ok())
                    .unwrap_or(Signal::Sigterm),
                grace_period_ms: labels
                    .get(LABEL_GRACE_PERIOD_MS)
                    .and_then(|ms| ms.parse().ok())
                    .unwrap_or(quotient_common::job::GRACE_PERIOD_DEFAULT_MS),
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
            }) => Ok(()),
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
