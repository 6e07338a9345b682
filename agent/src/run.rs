//! The long-running agent: [`run`] checks the certificate, builds the GPU backend, the runtime
//! and the executor, re-finds this agent's jobs, and runs its tasks until shutdown.
//!
//! - The **executor loop** owns the [`Executor`]. It steps at once on every new desired state
//!   and every [`CORE_TICK_MS`] otherwise (to see exits and carry out kills whose grace period
//!   ran out); it checks the self-fencing lease before each step and, once the lease has run
//!   out, stops every job (checkpoint signal, grace period, kill) and drops the desired state
//!   until a leader answers again. Its reports go to the [`Journal`] before the runtime forgets
//!   an attempt, so an exit is reported at least once across a crash.
//! - The **session** ([`crate::session`]) talks to the leader and never touches a job. It
//!   publishes the lease in `<state_dir>/agent-lease` ([`crate::lease`]); with the process
//!   runtime each job's wrapper stops the job once that lease runs out, so a job outlives a
//!   killed or frozen agent by no more than the lease ([`crate::runtime::process`]).
//!
//! - The **disk task** ([`crate::disk`]) caps the attempts' logs, removes the files of jobs
//!   last run here longer ago than their retention and measures the disk use, which the
//!   session sends to the leader; the executor loop tells it, before and after each step,
//!   which jobs are in use.
//!
//! Shutdown (SIGTERM, SIGINT) ends them all and leaves every job running: an agent restart must
//! not kill jobs. The restarted agent re-finds them (pid files, Docker labels), reports them in
//! `Register`, and keeps or kills each as the first desired state says.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quotient_common::agent_api::{ActualAttempt, ActualPhase};
use quotient_common::certs::Role;
use quotient_common::metrics_http::MetricsServer;
use quotient_common::tls::{TlsError, TlsFiles, TlsIdentity};
use quotient_common::transport::Client;
use tokio::sync::{watch, Notify};

use crate::config::{resolve_job_user, AgentConfig, JobUserError, RuntimeKind, LEASE_MIN_MS};
use crate::disk::DiskKeeper;
use crate::executor::Executor;
use crate::gpu::nvml::NvmlBackend;
use crate::gpu::simulated::SimulatedBackend;
use crate::gpu::{GpuBackend, GpuError};
use crate::host_info::{self, HostResources};
use crate::journal::{Journal, JournalError};
use crate::lease::{LeaseClock, LEASE_FILE};
use crate::log_server::LogSource;
use crate::reconcile::{Desired, LocalPhase};
use crate::runtime::cgroup::{self, Cgroups};
use crate::runtime::host::{DockerSetup, HostRuntime};
use crate::runtime::process::ProcessRuntime;
use crate::runtime::{lookup_user, JobUser, Runtime, RuntimeError};
use crate::session::{LeaderSession, Shared};

/// How often the executor loop steps without news: the delay in seeing an exit, in killing
/// after a grace period, and in noticing that the lease ran out.
pub const CORE_TICK_MS: u64 = 25;

/// Why the agent could not start. Every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("the certificate {} names {found}, but an agent needs role agent: issue one with `quotient certs issue --role agent --name {name}`", cert.display())]
    NotAnAgent {
        cert: PathBuf,
        found: String,
        name: String,
    },
    #[error("the certificate {} names node {found:?}, but this agent runs as --name {name:?}: use that node's certificate, or issue one with `quotient certs issue --role agent --name {name}`", cert.display())]
    WrongNode {
        cert: PathBuf,
        found: String,
        name: String,
    },
    #[error("cannot create the state dir {}: {source}", path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("cannot find the agent's own binary, which watches each container: {0}")]
    OwnBinary(#[source] std::io::Error),
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterFileError),
    #[error("cannot serve metrics on {addr}: {source}; pick a free address for --metrics-listen")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    JobUser(#[from] JobUserError),
    #[error("jobs run as {user}, who cannot reach {} (mode {mode:o}): it holds their working dirs and checkpoints and the agent's lease file, which their watchdog reads; chmod o+x it (and the dirs above it), or choose another --state-dir", path.display())]
    StateDirClosed {
        path: PathBuf,
        mode: u32,
        user: String,
    },
    #[error("--runtime docker: {0}; start Docker, or run the agent with --runtime auto to run process jobs without it")]
    DockerRequired(RuntimeError),
}

/// The most processes and threads a job may have, from `--job-pids-max` (0: no limit;
/// absent: [`cgroup::default_pids_max`]).
pub fn job_pids_max(given: Option<u64>) -> Option<u64> {
    match given {
        Some(0) => None,
        Some(max) => Some(max),
        None => cgroup::default_pids_max(),
    }
}

/// Who jobs run as, from the agent's flags: see [`resolve_job_user`].
pub fn job_user(config: &AgentConfig) -> Result<JobUser, JobUserError> {
    // SAFETY: geteuid cannot fail.
    let agent_uid = unsafe { libc::geteuid() };
    resolve_job_user(
        config.job_user.as_deref(),
        config.allow_root_jobs,
        agent_uid,
        lookup_user,
        JobUser::current,
    )
}

/// Checks that a job user other than the agent's can pass through the state dir and the
/// dirs above it (they may be created by the agent, with its umask, or by an admin).
fn check_state_dir_reachable(state_dir: &std::path::Path, user: &JobUser) -> Result<(), RunError> {
    use std::os::unix::fs::MetadataExt;
    if !user.differs_from_agent() {
        return Ok(());
    }
    let absolute = std::fs::canonicalize(state_dir).map_err(|source| RunError::StateDir {
        path: state_dir.to_path_buf(),
        source,
    })?;
    for dir in absolute.ancestors() {
        let Ok(metadata) = std::fs::metadata(dir) else {
            continue;
        };
        let mode = metadata.mode();
        let searchable = mode & 0o001 != 0
            || (metadata.uid() == user.uid && mode & 0o100 != 0)
            || (metadata.gid() == user.gid && mode & 0o010 != 0);
        if !searchable {
            return Err(RunError::StateDirClosed {
                path: dir.to_path_buf(),
                mode: mode & 0o7777,
                user: user.name.clone(),
            });
        }
    }
    Ok(())
}

/// Loads the agent's certificate and checks that it names an agent called `name`.
pub fn load_identity(config: &AgentConfig) -> Result<TlsIdentity, RunError> {
    let tls = TlsIdentity::load(&TlsFiles {
        ca: config.ca.clone(),
        cert: config.cert.clone(),
        key: config.key.clone(),
    })?;
    let identity = tls.identity();
    if identity.role != Role::Agent {
        return Err(RunError::NotAnAgent {
            cert: config.cert.clone(),
            found: identity.to_string(),
            name: config.name.clone(),
        });
    }
    if identity.name != config.name {
        return Err(RunError::WrongNode {
            cert: config.cert.clone(),
            found: identity.name.clone(),
            name: config.name.clone(),
        });
    }
    Ok(tls)
}

/// Runs the agent until `shutdown` completes; jobs are left running then.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let user = job_user(&config)?;
    let tls = load_identity(&config)?;
    std::fs::create_dir_all(&config.state_dir).map_err(|source| RunError::StateDir {
        path: config.state_dir.clone(),
        source,
    })?;
    check_state_dir_reachable(&config.state_dir, &user)?;
    let backend: Arc<dyn GpuBackend> = match &config.simulated_gpus {
        Some(spec) => Arc::new(SimulatedBackend::new(
            &config.name,
            spec,
            Some(&config.state_dir),
        )?),
        None => Arc::new(NvmlBackend::new()?),
    };
    let inventory = backend.inventory()?;
    tracing::info!(node = %config.name, gpus = inventory.len(), simulated = backend.is_simulated(), runtime = ?config.runtime, job_user = %user.name, job_uid = user.uid, "agent starting");
    if user.is_root() {
        tracing::warn!("jobs run as root (--allow-root-jobs)");
    }
    let gpu_uuids: BTreeMap<u32, String> = inventory
        .iter()
        .map(|gpu| (gpu.index, gpu.uuid.clone()))
        .collect();
    let lease_file = config.state_dir.join(LEASE_FILE);
    let mut process = ProcessRuntime::new(&config.state_dir)
        .with_orphan_watchdog(&lease_file)
        .with_job_user(user.clone());
    let pids_max = job_pids_max(config.job_pids_max);
    match Cgroups::set_up(&cgroup::owner_name(&config.name, &config.state_dir)) {
        Ok(cgroups) => {
            let cgroups = cgroups.with_pids_max(pids_max);
            tracing::info!(cgroups = %cgroups.describe(), "CPU and memory limits are enforced: process jobs run in cgroups of their own, containers under Docker's limits");
            match pids_max {
                Some(max) if cgroups.limits_pids() => {
                    tracing::info!(pids_max = max, "each job may have at most this many processes and threads (--job-pids-max)")
                }
                Some(_) => tracing::warn!(
                    "the process limit (--job-pids-max) is NOT enforced for process jobs: the pids cgroup controller is not available to the agent (containers still get Docker's)"
                ),
                None => tracing::warn!("jobs may have any number of processes (--job-pids-max 0)"),
            }
            process = process.with_cgroups(Arc::new(cgroups));
        }
        Err(why) => tracing::warn!(
            "CPU and memory limits are NOT enforced for process jobs (containers still get Docker's): {why}"
        ),
    }
    let docker = match config.runtime {
        RuntimeKind::Process => None,
        RuntimeKind::Auto | RuntimeKind::Docker => {
            let program = std::env::current_exe().map_err(RunError::OwnBinary)?;
            Some(DockerSetup {
                node: config.name.clone(),
                state_dir: config.state_dir.clone(),
                gpu_device_requests: !backend.is_simulated(),
                log_max_bytes: Some(config.disk.log_max_bytes),
                watchdog: Some((program, lease_file)),
                user,
                pids_max,
            })
        }
    };
    let runtime = Arc::new(HostRuntime::new(&config.name, process, docker));
    match (config.runtime, runtime.docker().await) {
        (RuntimeKind::Process, _) => {
            tracing::info!("process jobs only (--runtime process): jobs with an image fail to launch here")
        }
        (_, Ok(_)) => tracing::info!("process jobs, and container jobs through Docker"),
        (RuntimeKind::Docker, Err(error)) => return Err(RunError::DockerRequired(error)),
        (_, Err(error)) => tracing::warn!(
            "process jobs only for now: {error}; container jobs fail to launch here until Docker answers"
        ),
    }
    let resources = HostResources {
        labels: config.labels.clone(),
        address: config
            .advertise_address
            .clone()
            .or_else(|| host_info::route_address(&config.coordinators[0])),
        ..HostResources::detect(config.cpu_millis, config.memory_bytes)
    };
    let (host, left_out) = host_info::current(&runtime, &resources).await;
    if left_out > 0 {
        host_info::warn_left_out(left_out);
    }
    tracing::info!(runtimes = ?host.runtimes, images = host.images.len(), cpu_millis = host.cpu_millis,
        memory_bytes = host.memory_bytes, cpus_given = config.cpu_millis.is_some(),
        memory_given = config.memory_bytes.is_some(), labels = ?host.labels,
        address = ?host.address, "this host offers jobs");
    let (host_tx, host_rx) = watch::channel(host);
    tokio::spawn(host_info::keep_current(
        runtime.clone(),
        resources,
        host_tx,
        Duration::from_millis(config.host_recheck_ms),
        left_out,
    ));
    drive(config, tls, backend, gpu_uuids, runtime, host_rx, shutdown).await
}

async fn drive<R: Runtime + 'static>(
    config: AgentConfig,
    tls: TlsIdentity,
    backend: Arc<dyn GpuBackend>,
    gpu_uuids: BTreeMap<u32, String>,
    runtime: R,
    host: watch::Receiver<quotient_common::HostInfo>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let journal = Journal::open(&config.state_dir, &config.name)?;
    let cluster = crate::cluster::AgentCluster::open(&config.state_dir, config.cluster_id)?;
    // The address the node registered, which the host info keeps.
    let advertise_address = host.borrow().address.clone();
    let mut executor = Executor::new(runtime, &config.name, &config.state_dir, gpu_uuids)
        .with_checkpoint_root(&config.checkpoint_root)
        .with_advertise_address(advertise_address)
        .defer_removals();
    for (job, attempt) in journal.finished() {
        executor.remember_finished(job, attempt);
    }
    let found = executor.recover().await?;
    if found > 0 {
        tracing::info!(
            found,
            "re-found attempts of this agent; waiting for the leader"
        );
    }
    let lease = initial_lease(&journal, config.lease_ms);
    let disk = Arc::new(DiskKeeper::new(
        config.disk,
        &config.state_dir,
        &config.checkpoint_root,
    ));
    let (disk_usage_tx, disk_usage_rx) = watch::channel(None);
    let (actual_tx, actual_rx) = watch::channel(actual_of(&executor));
    let (desired_tx, desired_rx) = watch::channel(None);
    let shared = Arc::new(Shared {
        node: config.name.clone(),
        lease: Mutex::new(lease),
        journal: Mutex::new(journal),
        reports_ready: Notify::new(),
        actual: actual_rx,
        desired: desired_tx,
        desired_wanted: AtomicBool::new(false),
        backend,
        lease_file: Some(config.state_dir.join(LEASE_FILE)),
        logs: log_source(&config),
        cluster,
        disk_usage: disk_usage_rx,
        host,
        links: Default::default(),
    });
    let metrics_server = match config.metrics_listen {
        Some(addr) => Some(
            MetricsServer::start(
                addr,
                Arc::new(crate::metrics::AgentDoor {
                    shared: shared.clone(),
                    tls: tls.clone(),
                }),
            )
            .await
            .map_err(|source| RunError::Metrics { addr, source })?,
        ),
        None => None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    // Said in the log ahead of time: an agent whose certificate expires can register with no
    // coordinator, and its jobs stop with its lease.
    let expiry_notices = tokio::spawn(tls.clone().log_expiry_notices());
    let session = LeaderSession::new(
        shared.clone(),
        Client::new(tls),
        config.coordinators.clone(),
        LEASE_MIN_MS,
    )
    .with_standing_connections(config.standing_within);
    let session_task = tokio::spawn(session.run(stop_rx.clone()));
    let disk_task = tokio::spawn(crate::disk::run(
        disk.clone(),
        disk_usage_tx,
        stop_rx.clone(),
    ));
    let core_task = tokio::spawn(executor_loop(
        executor,
        shared.clone(),
        disk,
        desired_rx,
        actual_tx,
        stop_rx,
    ));
    shutdown.await;
    tracing::info!("shutting down; jobs keep running");
    let _ = stop_tx.send(true);
    if let Err(error) = session_task.await {
        tracing::error!("the session task failed: {error}");
    }
    if let Err(error) = core_task.await {
        tracing::error!("the executor task failed: {error}");
    }
    if let Err(error) = disk_task.await {
        tracing::error!("the disk task failed: {error}");
    }
    expiry_notices.abort();
    if let Some(server) = metrics_server {
        server.stop();
    }
    Ok(())
}

/// Where the runtimes leave job logs: the same files for both.
fn log_source(config: &AgentConfig) -> LogSource {
    LogSource::Files {
        state_dir: config.state_dir.clone(),
    }
}

/// The lease clock at start: counted from the last acknowledgement in the journal (so a
/// restart does not extend the lease), or from now on a first start.
///
/// On the boot clock when the journal recorded the acknowledgement on it in this boot: the
/// wall clock may have been stepped since (found by probing: an agent restarted across a step
/// of 1 h forward took its lease for expired and stopped its running jobs). Else, after a
/// reboot or from an older journal, on the wall clock.
fn initial_lease(journal: &Journal, lease_ms: u64) -> LeaseClock {
    let now = Instant::now();
    let this_boot = crate::lease::boot_id();
    if let (Some(stamp), Some(boot_now_ms)) =
        (journal.last_ack_boot(), crate::lease::boot_time_ms())
    {
        if this_boot.as_deref() == Some(stamp.boot_id.as_str()) {
            return LeaseClock::resumed(Some(stamp.boot_ms), lease_ms, now, boot_now_ms);
        }
    }
    let now_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    LeaseClock::resumed(journal.last_ack_unix_ms(), lease_ms, now, now_unix_ms)
}

/// The attempts running here, as the protocol reports them.
pub fn actual_of<R: Runtime>(executor: &Executor<R>) -> Vec<ActualAttempt> {
    executor
        .jobs()
        .filter_map(|tracked| {
            let phase = match tracked.local.phase {
                LocalPhase::Exited { .. } => return None,
                _ if tracked.local.signalled_at_ms.is_some() => ActualPhase::Stopping,
                LocalPhase::Found | LocalPhase::Running => ActualPhase::Running,
            };
            Some(ActualAttempt {
                job: tracked.local.job,
                attempt: tracked.local.attempt,
                phase,
            })
        })
        .collect()
}

/// Every attempt the executor tracks, exited ones included.
fn tracked_attempts<R: Runtime>(
    executor: &Executor<R>,
) -> impl Iterator<Item = (quotient_common::JobId, u32)> + '_ {
    executor
        .jobs()
        .map(|tracked| (tracked.local.job, tracked.local.attempt))
}

async fn executor_loop<R: Runtime>(
    mut executor: Executor<R>,
    shared: Arc<Shared>,
    disk: Arc<DiskKeeper>,
    mut desired_rx: watch::Receiver<Option<Desired>>,
    actual_tx: watch::Sender<Vec<ActualAttempt>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(CORE_TICK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut desired: Option<Desired> = None;
    let mut fenced = false;
    let mut fencing_published = false;
    let mut desired_open = true;
    loop {
        let mut changed = false;
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => break,
            result = desired_rx.changed(), if desired_open => match result {
                Ok(()) => changed = true,
                Err(_) => desired_open = false,
            },
            _ = tick.tick() => {}
        }
        let (expired, since_ack, lease_ms) = {
            let lease = shared.lease();
            let now = Instant::now();
            (lease.expired(now), lease.since_ack(now), lease.lease_ms())
        };
        if expired && !fenced {
            tracing::warn!(
                since_ack_ms = since_ack.as_millis() as u64,
                lease_ms,
                "no leader has answered for the whole lease: self-fencing, stopping every job"
            );
            fenced = true;
            desired = None;
        } else if !expired && fenced {
            tracing::info!("a leader answered again; waiting for its desired state");
            fenced = false;
            fencing_published = false;
            shared
                .desired_wanted
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if changed {
            let latest = desired_rx.borrow_and_update().clone();
            if !fenced {
                desired = latest;
            }
        }
        // Before the step, so that a job about to start here is in use before it starts.
        disk.set_in_use(desired.as_ref(), tracked_attempts(&executor));
        let reports = if fenced {
            let reports = executor.stop_all().await;
            if !fencing_published {
                // The checkpoint signals are sent: the jobs' wrappers need not send theirs.
                shared.publish_fencing();
                fencing_published = true;
            }
            reports
        } else if let Some(desired) = &desired {
            executor.step(desired).await
        } else {
            executor.step_idle().await
        };
        shared.record_reports(reports);
        executor.remove_forgotten().await;
        disk.set_in_use(desired.as_ref(), tracked_attempts(&executor));
        let actual = actual_of(&executor);
        actual_tx.send_if_modified(|current| {
            if *current == actual {
                false
            } else {
                *current = actual;
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restarted agent counts its lease from the last answer in its journal, so a long
    /// downtime leaves it expired at once; a first start counts from now.
    #[test]
    fn the_lease_survives_a_restart_through_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), "gpu-a").unwrap();
        assert!(!initial_lease(&journal, 1_000).expired(Instant::now()));

        let now_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        journal.record_ack(now_unix_ms - 60_000, None).unwrap();
        assert!(initial_lease(&journal, 1_000).expired(Instant::now()));

        journal.record_ack(now_unix_ms, None).unwrap();
        let lease = initial_lease(&journal, 1_000);
        assert!(!lease.expired(Instant::now()));
        assert!(lease.expired(Instant::now() + Duration::from_millis(1_100)));
    }

    /// An acknowledgement recorded on the boot clock of this boot counts on it, whatever the
    /// wall clock says (found by probing: a wall clock stepped an hour forward while the
    /// agent restarted made it take its lease for expired and stop its jobs); one of another
    /// boot does not.
    #[test]
    fn a_lease_recorded_on_the_boot_clock_ignores_the_wall_clock() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), "gpu-a").unwrap();
        let now_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let boot_ms = crate::lease::boot_time_ms().unwrap();
        let this_boot = crate::lease::boot_id().unwrap();
        // On the wall clock it was an hour ago; on the boot clock, just now.
        let stamp = |boot_id: &str| crate::journal::BootStamp {
            boot_id: boot_id.to_string(),
            boot_ms,
        };
        journal
            .record_ack(now_unix_ms - 3_600_000, Some(stamp(&this_boot)))
            .unwrap();
        let journal = Journal::open(dir.path(), "gpu-a").unwrap();
        let lease = initial_lease(&journal, 10_000);
        assert!(!lease.expired(Instant::now()), "{lease:?}");
        assert!(lease.expired(Instant::now() + Duration::from_millis(10_100)));
        // Of another boot: the wall clock is all there is.
        let mut journal = journal;
        journal
            .record_ack(now_unix_ms - 3_600_000, Some(stamp("another-boot")))
            .unwrap();
        assert!(initial_lease(&journal, 10_000).expired(Instant::now()));
    }
}
