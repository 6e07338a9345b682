//! The host runtime: both runtimes at once, chosen per job. A job with an image runs as a
//! Docker container ([`DockerRuntime`]), one without as a process group
//! ([`ProcessRuntime`]). Process jobs always run; container jobs run when the node's Docker
//! daemon is reachable, which is asked again at each container launch until it answers (a
//! daemon started after the agent is found then). A container job that cannot run here fails
//! to launch as the node's fault, so the coordinators place it elsewhere:
//! [`RuntimeError::DockerUnreachable`], or [`RuntimeError::ContainersDisabled`] on an agent
//! told `--runtime process`.
//!
//! A handle names its runtime by its id: a container id is 64 hexadecimal digits, a process
//! group id a decimal number of at most 10.
//!
//! [`HostRuntime::capabilities`] says what the node can run: its runtimes and the images it
//! has ([`NodeCapabilities`]), for the agent to report at registration.
//!
//! A daemon that hangs holds none of that up for long: connecting waits at most
//! [`DOCKER_CONNECT_MS`] (and is not tried again for [`DOCKER_RECONNECT_MS`] after a failure),
//! listing the agent's containers [`DOCKER_LIST_MS`] and listing images as long. An agent
//! started again while the daemon hung once took over a minute of such calls before it
//! registered, its lease ran out meanwhile, and the watchdogs stopped every job of the node,
//! process jobs too (found reading the start-up path after the Docker probe).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use super::docker::{local_images, DockerRuntime};
use super::process::ProcessRuntime;
use super::{FoundJob, JobHandle, JobStatus, JobUser, LaunchSpec, Runtime, RuntimeError};
use quotient_common::{JobId, Signal};

/// The name of the process runtime in [`NodeCapabilities::runtimes`].
pub const RUNTIME_PROCESS: &str = "process";
/// The name of the Docker runtime in [`NodeCapabilities::runtimes`].
pub const RUNTIME_DOCKER: &str = "docker";

/// What a node can run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeCapabilities {
    /// [`RUNTIME_PROCESS`], and [`RUNTIME_DOCKER`] when Docker is reachable and allowed.
    pub runtimes: Vec<String>,
    /// The tags of the images present on the node, sorted (empty without Docker): at most
    /// [`super::docker::IMAGES_LISTED_MAX`] of at most [`super::docker::IMAGE_TAG_BYTES_MAX`]
    /// bytes each.
    pub images: Vec<String>,
}

/// How long connecting to the Docker daemon may take (milliseconds).
pub const DOCKER_CONNECT_MS: u64 = 3_000;
/// How long after a failed connection the next is tried (milliseconds); calls meanwhile
/// find Docker unreachable at once.
pub const DOCKER_RECONNECT_MS: u64 = 5_000;
/// How long listing the agent's containers, or the host's images, may take (milliseconds).
pub const DOCKER_LIST_MS: u64 = 5_000;

/// How the host runtime connects to Docker, now or later.
#[derive(Debug, Clone)]
pub struct DockerSetup {
    pub node: String,
    pub state_dir: PathBuf,
    /// Ask the nvidia driver for the job's GPUs (real GPUs only).
    pub gpu_device_requests: bool,
    /// `--log-max-bytes`, for the daemon's own copy of the log.
    pub log_max_bytes: Option<u64>,
    /// The `quotient-agent` binary and the lease file, for the orphan watchdog.
    pub watchdog: Option<(PathBuf, PathBuf)>,
    pub user: JobUser,
    /// `--job-pids-max`, resolved: the most processes and threads a container may have.
    pub pids_max: Option<u64>,
}

impl DockerSetup {
    /// Connects to the daemon and sets the runtime up.
    pub async fn connect(&self) -> Result<DockerRuntime, RuntimeError> {
        let mut runtime =
            DockerRuntime::connect(&self.node, &self.state_dir, self.gpu_device_requests)
                .await?
                .with_job_user(self.user.clone())
                .with_pids_max(self.pids_max);
        if let Some(max_bytes) = self.log_max_bytes {
            runtime = runtime.with_log_cap(max_bytes).await;
        }
        if let Some((program, lease_file)) = &self.watchdog {
            runtime = runtime.with_orphan_watchdog(program, lease_file, &self.state_dir);
        }
        Ok(runtime)
    }
}

/// Runs each job with the runtime its spec asks for.
pub struct HostRuntime {
    node: String,
    process: ProcessRuntime,
    /// `None`: container jobs are not run here (`--runtime process`).
    docker_setup: Option<DockerSetup>,
    docker: Mutex<Option<Arc<DockerRuntime>>>,
    /// When connecting last failed, and why.
    connect_failed: Mutex<Option<(std::time::Instant, String)>>,
    /// The images the last listing found: kept through a listing that fails, so that a
    /// daemon slow for a while does not tell the coordinators the node holds none.
    last_images: Mutex<Vec<String>>,
    /// Wakes the host info's next look at once ([`HostRuntime::recheck_wanted`]).
    recheck: tokio::sync::Notify,
    /// Whether the last `list_own` reached Docker too (or had no need to).
    listed_everywhere: std::sync::atomic::AtomicBool,
}

impl HostRuntime {
    /// Process jobs on `process`; container jobs through `docker` (`None`: refused).
    pub fn new(node: &str, process: ProcessRuntime, docker: Option<DockerSetup>) -> HostRuntime {
        HostRuntime {
            last_images: Mutex::new(Vec::new()),
            recheck: tokio::sync::Notify::new(),
            listed_everywhere: std::sync::atomic::AtomicBool::new(true),
            node: node.to_string(),
            process,
            docker_setup: docker,
            docker: Mutex::new(None),
            connect_failed: Mutex::new(None),
        }
    }

    /// The Docker runtime, connecting now if it is not yet.
    pub async fn docker(&self) -> Result<Arc<DockerRuntime>, RuntimeError> {
        let Some(setup) = &self.docker_setup else {
            return Err(RuntimeError::ContainersDisabled {
                node: self.node.clone(),
            });
        };
        if let Some(docker) = self
            .docker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(docker);
        }
        let unreachable = |detail: String| RuntimeError::DockerUnreachable {
            node: self.node.clone(),
            detail,
        };
        if let Some((at, why)) = &*self
            .connect_failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            if at.elapsed() < std::time::Duration::from_millis(DOCKER_RECONNECT_MS) {
                return Err(unreachable(why.clone()));
            }
        }
        let limit = std::time::Duration::from_millis(DOCKER_CONNECT_MS);
        let connected = match tokio::time::timeout(limit, setup.connect()).await {
            Ok(Ok(connected)) => connected,
            failed => {
                let why = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("the daemon did not answer within {DOCKER_CONNECT_MS} ms"),
                };
                *self
                    .connect_failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) =
                    Some((std::time::Instant::now(), why.clone()));
                return Err(unreachable(why));
            }
        };
        tracing::info!(node = %self.node, "connected to Docker: container jobs run on this node");
        // The host info said no Docker while connecting failed: it looks again now, not at its
        // next turn (found by probing: an agent started while the daemon hung offered
        // container jobs 30 s after the daemon answered again).
        let failed_before = self
            .connect_failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some();
        if failed_before {
            self.recheck.notify_one();
        }
        let mut slot = self.docker.lock().unwrap_or_else(PoisonError::into_inner);
        // Another call may have connected meanwhile: keep the first.
        Ok(slot.get_or_insert_with(|| Arc::new(connected)).clone())
    }

    /// Completes when a launch found the host other than its last host info says (an image
    /// it listed is gone), or Docker was reached after connecting had failed: the host info is
    /// looked at again then, not at its next turn.
    pub async fn recheck_wanted(&self) {
        self.recheck.notified().await;
    }

    /// The process runtime.
    pub fn process(&self) -> &ProcessRuntime {
        &self.process
    }

    /// What this node can run now: the process runtime always, Docker when it is allowed
    /// and reachable, with the images it has.
    pub async fn capabilities(&self) -> NodeCapabilities {
        let mut capabilities = NodeCapabilities {
            runtimes: vec![RUNTIME_PROCESS.to_string()],
            images: Vec::new(),
        };
        if self.docker_setup.is_none() {
            return capabilities;
        }
        match self.docker().await {
            Ok(docker) => {
                capabilities.runtimes.push(RUNTIME_DOCKER.to_string());
                let mut last = self
                    .last_images
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let listed = super::within(
                    "docker list images",
                    DOCKER_LIST_MS,
                    local_images(docker.docker()),
                )
                .await;
                match listed {
                    Ok(images) => last = images,
                    // Found by probing: a daemon that did not answer for 30 s made the node
                    // register again with no images, and queued container jobs were told it
                    // did not hold theirs.
                    Err(error) => tracing::warn!(
                        "cannot list the node's images: {error}; the last listing stands"
                    ),
                }
                *self
                    .last_images
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = last.clone();
                capabilities.images = last;
            }
            Err(error) => tracing::debug!("no container jobs here: {error}"),
        }
        capabilities
    }
}

/// Whether a handle names a container: its id is 64 hexadecimal digits.
pub fn is_container(handle: &JobHandle) -> bool {
    handle.id.len() == 64 && handle.id.bytes().all(|byte| byte.is_ascii_hexdigit())
}

impl Runtime for HostRuntime {
    async fn start(&self, spec: &LaunchSpec) -> Result<JobHandle, RuntimeError> {
        if spec.payload.image.is_some() {
            let started = self.docker().await?.start(spec).await;
            if let Err(RuntimeError::ImageMissing { .. }) = &started {
                // Found by probing: the node went on offering the image until its next look,
                // and the job was placed here again and again until it failed for good.
                self.recheck.notify_one();
            }
            started
        } else {
            self.process.start(spec).await
        }
    }

    async fn signal(&self, handle: &JobHandle, signal: Signal) -> Result<(), RuntimeError> {
        if is_container(handle) {
            self.docker().await?.signal(handle, signal).await
        } else {
            self.process.signal(handle, signal).await
        }
    }

    async fn kill(&self, handle: &JobHandle) -> Result<(), RuntimeError> {
        if is_container(handle) {
            self.docker().await?.kill(handle).await
        } else {
            self.process.kill(handle).await
        }
    }

    async fn status(&self, handle: &JobHandle) -> Result<JobStatus, RuntimeError> {
        if is_container(handle) {
            self.docker().await?.status(handle).await
        } else {
            self.process.status(handle).await
        }
    }

    async fn list_own(&self) -> Result<Vec<FoundJob>, RuntimeError> {
        let mut found = self.process.list_own().await?;
        let mut everywhere = true;
        if self.docker_setup.is_some() {
            // Not listed: not looked for (the executor looks again for the attempts it
            // started before, and starts none of them meanwhile).
            let listed = match self.docker().await {
                Ok(docker) => {
                    super::within("docker list containers", DOCKER_LIST_MS, docker.list_own()).await
                }
                Err(error) => Err(error),
            };
            match listed {
                Ok(containers) => found.extend(containers),
                Err(error) => {
                    everywhere = false;
                    tracing::warn!("cannot look for this agent's containers: {error}")
                }
            }
        }
        self.listed_everywhere
            .store(everywhere, std::sync::atomic::Ordering::SeqCst);
        found.sort_by(|a, b| a.handle.cmp(&b.handle));
        Ok(found)
    }

    fn listed_everywhere(&self) -> bool {
        self.listed_everywhere
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn abandon(&self, job: JobId, attempt: u32, container: bool) -> Result<(), RuntimeError> {
        if !container {
            return self.process.abandon(job, attempt, false).await;
        }
        // Never connected: no call reached a daemon.
        let docker = self
            .docker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match docker {
            Some(docker) => docker.abandon(job, attempt, true).await,
            None => Ok(()),
        }
    }

    fn stopped_by_watchdog(&self, handle: &JobHandle) -> bool {
        if !is_container(handle) {
            return self.process.stopped_by_watchdog(handle);
        }
        // Read from the watchdog's files, so that it holds before Docker is reached.
        self.docker_setup.as_ref().is_some_and(|setup| {
            setup.watchdog.is_some()
                && super::docker::stop_recorded(
                    &setup.state_dir.join(super::docker::WATCHDOGS_DIR),
                    &handle.id,
                )
        })
    }

    async fn exit_reason(&self, handle: &JobHandle, code: i32) -> Option<String> {
        if is_container(handle) {
            self.docker().await.ok()?.exit_reason(handle, code).await
        } else {
            self.process.exit_reason(handle, code).await
        }
    }

    async fn remove(&self, handle: &JobHandle) -> Result<(), RuntimeError> {
        if is_container(handle) {
            self.docker().await?.remove(handle).await
        } else {
            self.process.remove(handle).await
        }
    }

    async fn logs(&self, handle: &JobHandle) -> Result<String, RuntimeError> {
        // Both runtimes keep the log in the same file.
        self.process.logs(handle).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::job::LaunchFault;
    use quotient_common::{JobId, JobPayload};
    use std::collections::BTreeMap;

    fn spec(state: &std::path::Path, image: Option<&str>) -> LaunchSpec {
        LaunchSpec {
            job: JobId(4),
            attempt: 1,
            payload: JobPayload {
                image: image.map(str::to_string),
                command: ["true"].into(),
            },
            env: BTreeMap::new(),
            gpu_indices: Vec::new(),
            gpu_uuids: Vec::new(),
            checkpoint_dir: state.join("checkpoints/j-4"),
            work_dir: super::super::work_dir(state, JobId(4), 1),
            log_path: super::super::log_path(state, JobId(4), 1),
            checkpoint_signal: Signal::Sigterm,
            grace_period_ms: 100,
            limits: super::super::JobLimits::NONE,
            rendezvous: Default::default(),
        }
    }

    /// Handles are routed by their id's shape.
    #[test]
    fn container_ids_and_process_ids_are_told_apart() {
        let handle = |id: &str| JobHandle {
            job: JobId(1),
            attempt: 1,
            id: id.to_string(),
        };
        assert!(is_container(&handle(&"ab12".repeat(16))));
        assert!(!is_container(&handle("12345")));
        assert!(!is_container(&handle(&"1".repeat(10))));
    }

    /// A container job on a node that refuses them, or whose Docker is unreachable, fails to
    /// launch as the node's fault, and says why; a process job runs all the same.
    #[tokio::test]
    async fn container_jobs_without_docker_are_the_nodes_fault() {
        let state = tempfile::tempdir().unwrap();
        let process = || ProcessRuntime::new(state.path());
        let refusing = HostRuntime::new("gpu-1", process(), None);
        let error = refusing
            .start(&spec(state.path(), Some("trainer:1")))
            .await
            .unwrap_err();
        assert!(matches!(error, RuntimeError::ContainersDisabled { .. }));
        assert_eq!(error.launch_fault(), LaunchFault::Node);
        assert!(error.to_string().contains("--runtime process"), "{error}");
        assert_eq!(
            refusing.capabilities().await,
            NodeCapabilities {
                runtimes: vec!["process".into()],
                images: Vec::new()
            }
        );

        // A daemon socket that does not exist.
        let unreachable = HostRuntime::new(
            "gpu-1",
            process(),
            Some(DockerSetup {
                node: "gpu-1".into(),
                state_dir: state.path().to_path_buf(),
                gpu_device_requests: false,
                log_max_bytes: None,
                watchdog: None,
                user: JobUser::current(),
                pids_max: None,
            }),
        );
        let error = with_docker_host("unix:///nonexistent/quotient-test.sock", async {
            unreachable
                .start(&spec(state.path(), Some("trainer:1")))
                .await
                .unwrap_err()
        })
        .await;
        assert!(
            matches!(error, RuntimeError::DockerUnreachable { .. }),
            "{error:?}"
        );
        assert_eq!(error.launch_fault(), LaunchFault::Node);
        assert!(
            error
                .to_string()
                .contains("Docker is not reachable on node gpu-1"),
            "{error}"
        );
        let handle = unreachable.start(&spec(state.path(), None)).await.unwrap();
        assert!(!is_container(&handle));
        let code = unreachable
            .wait(&handle, std::time::Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(code, Some(Some(0)));
    }

    /// Runs `body` with `DOCKER_HOST` set (this is the only test of this binary that reads it).
    async fn with_docker_host<T>(value: &str, body: impl std::future::Future<Output = T>) -> T {
        std::env::set_var("DOCKER_HOST", value);
        let result = body.await;
        std::env::remove_var("DOCKER_HOST");
        result
    }
}
