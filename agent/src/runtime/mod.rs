//! Runtimes: how the agent starts, signals, kills and re-finds a job's attempt on its host.
//!
//! A [`Runtime`] runs one [`LaunchSpec`] at a time per (job, attempt) and hands back a
//! [`JobHandle`]. [`process::ProcessRuntime`] runs the command as a process group on the host
//! (bare metal, `quotient dev up`, the tests); [`docker::DockerRuntime`] runs the image as a
//! container through the Docker Engine API. Both mark what they start (a pid file, container
//! labels) so that a restarted agent re-finds its own jobs with [`Runtime::list_own`] and leaves
//! everything else on the host alone.
//!
//! The environment every job gets is built here, once, by [`job_environment`]
//! (docs/cli.md: `QUOTIENT_JOB_ID`, `QUOTIENT_ATTEMPT`, `QUOTIENT_CHECKPOINT_DIR`,
//! `CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`), and for a process job by
//! [`process_environment`]: a clean one, nothing of the agent's own (see
//! docs/operations.md, "What a job gets").
//!
//! # Who a job runs as
//! A job never runs as the agent's user by accident: [`JobUser`] is resolved once at start
//! (`--job-user`, or the agent's own user when it is not root, or root only with
//! `--allow-root-jobs`, see [`crate::config::resolve_job_user`]) and every runtime runs its
//! jobs as that user: a process with its uid and gid (supplementary groups cleared), a
//! container with `--user uid:gid` (or the image's own user when jobs may run as root).

pub mod cgroup;
pub mod docker;
pub mod host;
pub mod process;
pub mod sagemaker;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use quotient_common::job::LaunchFault;
use quotient_common::{JobId, JobPayload, Signal};
use serde::{Deserialize, Serialize};

/// How often [`Runtime::wait`] looks at a job.
pub const WAIT_POLL_INTERVAL_MS: u64 = 20;
/// The most log bytes [`Runtime::logs`] returns: the tail of the log.
pub const LOG_READ_BYTES_MAX: u64 = 1024 * 1024;

/// Why a runtime could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The launch spec cannot be run by this runtime, whatever the host: no command, no image,
    /// a command and environment too large to execute, a container spec the daemon refuses.
    #[error("cannot launch {job} attempt {attempt}: {problem}")]
    InvalidLaunch {
        job: JobId,
        attempt: u32,
        problem: String,
    },
    /// This attempt is already running here; it is never started twice.
    #[error("{job} attempt {attempt} is already running on this node")]
    AlreadyRunning { job: JobId, attempt: u32 },
    /// `remove` of an attempt that still runs: stop it first.
    #[error("{job} attempt {attempt} still runs: kill it before removing it")]
    StillRunning { job: JobId, attempt: u32 },
    /// A file under the state dir could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The Docker daemon is not reachable or refused a call.
    #[error("docker {operation}: {detail}")]
    Docker { operation: String, detail: String },
    /// A call whose answer did not come in time (a Docker daemon that hangs): it may still
    /// be carried out.
    #[error("no answer to {operation} within {limit_ms} ms (is the Docker daemon hung?)")]
    NoAnswer { operation: String, limit_ms: u64 },
    /// A call whose outcome the daemon's answers leave open: an earlier call that got no
    /// answer may still be carried out. Like [`RuntimeError::NoAnswer`], tried again or
    /// abandoned ([`Runtime::abandon`]).
    #[error("{operation}: {detail}; an earlier call that got no answer may still be carried out (is the Docker daemon hung?)")]
    Unsettled { operation: String, detail: String },
    /// The job's image is not on this host, and Quotient never pulls one. Another host may
    /// have it, so this is the node's fault, not the job's.
    #[error("image {image} is not present on node {node}; images are never pulled: docker pull, load or build it on the node first ({detail})")]
    ImageMissing {
        image: String,
        node: String,
        detail: String,
    },
    /// A container job on a node whose Docker daemon does not answer. Another node may run
    /// it, so this is the node's fault.
    #[error("Docker is not reachable on node {node}, so it cannot run container jobs ({detail}); start Docker there, or let the job run on another node")]
    DockerUnreachable { node: String, detail: String },
    /// A container job on an agent told to run process jobs only (`--runtime process`).
    #[error("node {node} runs process jobs only (its agent runs with --runtime process), so it cannot run a job with an image")]
    ContainersDisabled { node: String },
}

impl RuntimeError {
    /// Whose fault it is when [`Runtime::start`] fails with this error. Only a launch that
    /// this runtime can never do with the job's spec ([`RuntimeError::InvalidLaunch`]) is the
    /// job's; anything else (the daemon, the host's files, an image not on this host) is the
    /// node's, and the job may launch on another.
    pub fn launch_fault(&self) -> LaunchFault {
        match self {
            RuntimeError::InvalidLaunch { .. } => LaunchFault::Job,
            _ => LaunchFault::Node,
        }
    }

    /// Whether a failed call leaves open whether it was carried out: one that got no answer
    /// in time may still be. A launch failed so is [`Runtime::abandon`]ed once it will not be
    /// tried again; a signal failed so may have reached the job.
    pub fn unsettled(&self) -> bool {
        matches!(
            self,
            RuntimeError::NoAnswer { .. } | RuntimeError::Unsettled { .. }
        )
    }

    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> RuntimeError {
        RuntimeError::Io {
            action,
            path: path.display().to_string(),
            source,
        }
    }
}

/// Waits for a runtime call at most `limit_ms`; one not answered by then is
/// [`RuntimeError::NoAnswer`] (and may still be carried out).
pub async fn within<T>(
    operation: &str,
    limit_ms: u64,
    call: impl Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    tokio::time::timeout(Duration::from_millis(limit_ms), call)
        .await
        .unwrap_or_else(|_| {
            Err(RuntimeError::NoAnswer {
                operation: operation.to_string(),
                limit_ms,
            })
        })
}

/// Everything a runtime needs to start one attempt of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    pub job: JobId,
    /// 1 for the first run, one more after each preemption.
    pub attempt: u32,
    pub payload: JobPayload,
    /// The job's own environment (never one of `RESERVED_ENV`).
    pub env: BTreeMap<String, String>,
    /// Host GPU indices, as NVML numbers them.
    pub gpu_indices: Vec<u32>,
    /// The same GPUs' UUIDs, in the same order.
    pub gpu_uuids: Vec<String>,
    /// Kept across attempts: see [`checkpoint_dir`].
    pub checkpoint_dir: PathBuf,
    /// The attempt's own working dir, created fresh at launch: see [`work_dir`]. A process
    /// job runs in it (and it is its `HOME`); a container keeps its image's working dir.
    pub work_dir: PathBuf,
    /// Where stdout and stderr go, for both runtimes: see [`log_path`].
    pub log_path: PathBuf,
    /// Recorded with the job so that a restarted agent can stop it gracefully.
    pub checkpoint_signal: Signal,
    pub grace_period_ms: u64,
    /// The CPUs and memory the attempt may use here.
    pub limits: JobLimits,
    /// Where the attempt's members meet (one member while jobs run on one node).
    pub rendezvous: Rendezvous,
}

/// What the members of an attempt need to find each other, as torchrun and
/// `torch.distributed` read it: this member's rank, the members' addresses in rank order, and
/// where rank 0 listens. A job on one node is rank 0 of one, meeting itself on loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub rank: u32,
    /// The members' nodes' advertised addresses, in rank order.
    pub hosts: Vec<String>,
    /// Rank 0's address, as the members reach it.
    pub master_addr: String,
    /// The port rank 0 listens on, chosen for the attempt.
    pub master_port: u16,
}

/// torch.distributed's own default port, where no other was chosen.
pub const MASTER_PORT_DEFAULT: u16 = 29_500;

impl Default for Rendezvous {
    fn default() -> Rendezvous {
        Rendezvous::single(None, MASTER_PORT_DEFAULT)
    }
}

impl Rendezvous {
    /// The rendezvous of a job on one node: rank 0 of one, listening on loopback at `port`;
    /// `QUOTIENT_HOSTS` names the node by its advertised `address` (loopback if unknown).
    pub fn single(address: Option<&str>, port: u16) -> Rendezvous {
        Rendezvous {
            rank: 0,
            hosts: vec![address.unwrap_or("127.0.0.1").to_string()],
            master_addr: "127.0.0.1".to_string(),
            master_port: port,
        }
    }
}

impl Rendezvous {
    /// The rendezvous of one member of a job of several nodes, as the coordinators placed it:
    /// rank 0's address is the first of the hosts.
    pub fn member(gang: quotient_common::agent_api::WireGang) -> Rendezvous {
        Rendezvous {
            rank: gang.rank,
            master_addr: gang
                .hosts
                .first()
                .cloned()
                .unwrap_or_else(|| "127.0.0.1".into()),
            hosts: gang.hosts,
            master_port: gang.master_port,
        }
    }

    /// Whether the job runs on several nodes (its members must reach each other).
    pub fn is_gang(&self) -> bool {
        self.hosts.len() > 1
    }
}

/// A TCP port free on this host now, for an attempt's rank 0 to listen on; the default port if
/// none can be had.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|listener| listener.local_addr())
        .map_or(MASTER_PORT_DEFAULT, |address| address.port())
}

/// The CPUs and memory the coordinators set aside for an attempt on this node, which the
/// runtime holds it to: a process job through its own cgroup ([`cgroup`]), a container
/// through Docker. 0 is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct JobLimits {
    /// CPUs in thousandths (1500: one and a half CPUs of time per wall-clock second).
    pub cpu_millis: u32,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

impl JobLimits {
    /// No limit at all.
    pub const NONE: JobLimits = JobLimits {
        cpu_millis: 0,
        memory_bytes: 0,
    };

    pub fn is_none(&self) -> bool {
        *self == JobLimits::NONE
    }

    /// Docker's `NanoCpus` (billionths of a CPU); `None` without a CPU limit.
    pub fn nano_cpus(&self) -> Option<i64> {
        (self.cpu_millis > 0).then(|| i64::from(self.cpu_millis) * 1_000_000)
    }

    /// Docker's `Memory` in bytes; `None` without a memory limit.
    pub fn docker_memory(&self) -> Option<i64> {
        (self.memory_bytes > 0).then(|| i64::try_from(self.memory_bytes).unwrap_or(i64::MAX))
    }
}

/// A started attempt, as the runtime knows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobHandle {
    pub job: JobId,
    pub attempt: u32,
    /// The process group id, or the container id.
    pub id: String,
}

/// Whether an attempt still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Running,
    /// `code` is the exit status, or 128 + the signal that ended it; `None` when the runtime
    /// could not learn it (a process that ended while the agent was down and left no record).
    Exited {
        code: Option<i32>,
    },
}

/// An attempt found on the host by [`Runtime::list_own`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundJob {
    pub handle: JobHandle,
    pub status: JobStatus,
    pub checkpoint_signal: Signal,
    pub grace_period_ms: u64,
}

/// A way to run jobs. Every method is safe to call again after a failure or a restart.
pub trait Runtime: Send + Sync {
    /// Starts the attempt; refuses one that already runs here.
    fn start(
        &self,
        spec: &LaunchSpec,
    ) -> impl Future<Output = Result<JobHandle, RuntimeError>> + Send;

    /// Sends `signal` to the whole job (its process group, or the container's main process).
    /// A job that has already exited is left alone.
    fn signal(
        &self,
        handle: &JobHandle,
        signal: Signal,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Kills the whole job at once (SIGKILL).
    fn kill(&self, handle: &JobHandle) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Running, or exited with which code.
    fn status(
        &self,
        handle: &JobHandle,
    ) -> impl Future<Output = Result<JobStatus, RuntimeError>> + Send;

    /// Every attempt this agent started on this host (by pid file or label), running or not.
    fn list_own(&self) -> impl Future<Output = Result<Vec<FoundJob>, RuntimeError>> + Send;

    /// Whether the last [`Runtime::list_own`] looked everywhere this runtime starts attempts
    /// (the host runtime's skips containers while Docker does not answer): only then is an
    /// attempt it did not find gone.
    fn listed_everywhere(&self) -> bool {
        true
    }

    /// Whether an exited attempt was stopped by the host's own watchdog (the agent's lease ran
    /// out while the agent could not act): reported as a stop by the agent, not as the job's
    /// own exit. The process and the container watchdogs leave that on record.
    fn stopped_by_watchdog(&self, _handle: &JobHandle) -> bool {
        false
    }

    /// Why an exited attempt's `code` is what it is, when the runtime can tell more than the
    /// code: the out-of-memory killer ended it at its memory limit, or its command was not
    /// found. Asked before the attempt is removed; reported with the exit.
    fn exit_reason(
        &self,
        _handle: &JobHandle,
        _code: i32,
    ) -> impl Future<Output = Option<String>> + Send {
        async { None }
    }

    /// Forgets an exited attempt: its pid file or its container. Logs stay.
    fn remove(&self, handle: &JobHandle) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Makes sure that nothing runs, now or later, of an attempt whose launch failed
    /// [unsettled](RuntimeError::unsettled) and that will not be tried again (`container`: it
    /// has an image): a container the daemon made of it after all is removed, killed if it
    /// runs. `Ok` when nothing of it is left now; an error is tried again later. The executor
    /// asks again each round until it has been told so for
    /// [`UNSETTLED_QUIET_MS`](crate::executor::UNSETTLED_QUIET_MS): a call held up in a hung
    /// daemon may still be carried out just after.
    fn abandon(
        &self,
        _job: JobId,
        _attempt: u32,
        _container: bool,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        async { Ok(()) }
    }

    /// The tail of the attempt's stdout and stderr, at most [`LOG_READ_BYTES_MAX`] bytes.
    fn logs(&self, handle: &JobHandle)
        -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// Waits up to `timeout` for the attempt to exit: its code, or `None` if it still runs.
    fn wait(
        &self,
        handle: &JobHandle,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Option<i32>>, RuntimeError>> + Send {
        async move {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                if let JobStatus::Exited { code } = self.status(handle).await? {
                    return Ok(Some(code));
                }
                if tokio::time::Instant::now() >= deadline {
                    return Ok(None);
                }
                tokio::time::sleep(Duration::from_millis(WAIT_POLL_INTERVAL_MS)).await;
            }
        }
    }
}

/// A shared runtime is a runtime: the executor may own one while the agent asks it what the
/// host can run.
impl<R: Runtime> Runtime for std::sync::Arc<R> {
    fn start(
        &self,
        spec: &LaunchSpec,
    ) -> impl Future<Output = Result<JobHandle, RuntimeError>> + Send {
        (**self).start(spec)
    }

    fn signal(
        &self,
        handle: &JobHandle,
        signal: Signal,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        (**self).signal(handle, signal)
    }

    fn kill(&self, handle: &JobHandle) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        (**self).kill(handle)
    }

    fn status(
        &self,
        handle: &JobHandle,
    ) -> impl Future<Output = Result<JobStatus, RuntimeError>> + Send {
        (**self).status(handle)
    }

    fn list_own(&self) -> impl Future<Output = Result<Vec<FoundJob>, RuntimeError>> + Send {
        (**self).list_own()
    }

    fn listed_everywhere(&self) -> bool {
        (**self).listed_everywhere()
    }

    fn stopped_by_watchdog(&self, handle: &JobHandle) -> bool {
        (**self).stopped_by_watchdog(handle)
    }

    fn exit_reason(
        &self,
        handle: &JobHandle,
        code: i32,
    ) -> impl Future<Output = Option<String>> + Send {
        (**self).exit_reason(handle, code)
    }

    fn remove(&self, handle: &JobHandle) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        (**self).remove(handle)
    }

    fn abandon(
        &self,
        job: JobId,
        attempt: u32,
        container: bool,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        (**self).abandon(job, attempt, container)
    }

    fn logs(
        &self,
        handle: &JobHandle,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send {
        (**self).logs(handle)
    }

    fn wait(
        &self,
        handle: &JobHandle,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Option<i32>>, RuntimeError>> + Send {
        (**self).wait(handle, timeout)
    }
}

/// The reason a shell's own exit codes stand for: 127, a command not found; 126, one found but
/// not executable. A job may exit with these codes itself, so the words say what they usually
/// mean and where to look.
pub fn shell_exit_reason(code: i32) -> Option<String> {
    match code {
        127 => Some(
            "the code a shell gives when it finds no such command: check the job's command and its log (`quotient job logs`)".to_string(),
        ),
        126 => Some(
            "the code a shell gives when a command is not executable: check the job's command and its permissions".to_string(),
        ),
        _ => None,
    }
}

/// The reason of an attempt the out-of-memory killer ended.
pub const OUT_OF_MEMORY_REASON: &str =
    "killed by the out-of-memory killer: the job reached its memory limit (--memory)";

/// How a runtime numbers the GPUs it exposes in `CUDA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuNumbering {
    /// A process sees every GPU of the host: name the host indices, and set
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that CUDA numbers GPUs as NVML does.
    HostIndices,
    /// A container sees only its own GPUs, renumbered from 0.
    ContainerLocal,
}

/// The job's checkpoint dir: one per job under the checkpoint root, kept across attempts.
pub fn checkpoint_dir(checkpoint_root: &Path, job: JobId) -> PathBuf {
    checkpoint_root.join(job.to_string())
}

/// The folder of the attempts' log files in the agent's state dir.
pub const LOGS_DIR: &str = "logs";

/// The attempt's log file under the agent's state dir.
pub fn log_path(state_dir: &Path, job: JobId, attempt: u32) -> PathBuf {
    state_dir
        .join(LOGS_DIR)
        .join(format!("{job}-{attempt}.log"))
}

/// The folder of the attempts' working dirs in the agent's state dir.
pub const WORK_DIR: &str = "work";

/// The attempt's working dir under the agent's state dir, `work/<job>-<attempt>`.
pub fn work_dir(state_dir: &Path, job: JobId, attempt: u32) -> PathBuf {
    state_dir.join(WORK_DIR).join(format!("{job}-{attempt}"))
}

/// The `PATH` of a process job that sets none.
pub const JOB_PATH_DEFAULT: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The `LANG` of a process job that sets none.
pub const JOB_LANG_DEFAULT: &str = "C.UTF-8";

/// Who the agent's jobs run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// `--job-user per-job`: each job runs as a uid (and group) of its own,
    /// [`JobUser::for_job`]; `name`, `uid` and `gid` are then only placeholders.
    pub per_job: bool,
}

/// What `--job-user` takes for a uid per job.
pub const PER_JOB: &str = "per-job";
/// The first uid (and gid) of the jobs' own, with `--job-user per-job`: job `j-N` runs as
/// `PER_JOB_UID_FIRST + N mod PER_JOB_UID_COUNT`, the same on every node and every attempt,
/// so that its checkpoint dir stays its own. Far above the ids that distributions and
/// directories hand out, and below 2^31 (tools that read ids as signed).
pub const PER_JOB_UID_FIRST: u32 = 1 << 30;
/// How many uids jobs take: two jobs share one only if their ids are 2^30 apart.
pub const PER_JOB_UID_COUNT: u32 = 1 << 30;

impl JobUser {
    /// A uid of its own for every job ([`PER_JOB`]).
    pub fn per_job() -> JobUser {
        JobUser {
            name: PER_JOB.to_string(),
            uid: PER_JOB_UID_FIRST,
            gid: PER_JOB_UID_FIRST,
            per_job: true,
        }
    }

    /// The user `job` runs as: this one, or with [`PER_JOB`] the job's own uid and group
    /// (with no entry in the password database: the job gets `HOME`, and `USER` and
    /// `LOGNAME` set to this user's name).
    pub fn for_job(&self, job: quotient_common::JobId) -> JobUser {
        if !self.per_job {
            return self.clone();
        }
        let id = PER_JOB_UID_FIRST + (job.0 % u64::from(PER_JOB_UID_COUNT)) as u32;
        JobUser {
            name: format!("quotient-{job}"),
            uid: id,
            gid: id,
            per_job: false,
        }
    }

    /// The user the agent itself runs as.
    pub fn current() -> JobUser {
        // SAFETY: geteuid and getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let name = lookup_user_by_uid(uid)
            .map(|user| user.name)
            .unwrap_or_else(|| uid.to_string());
        JobUser {
            name,
            uid,
            gid,
            per_job: false,
        }
    }

    /// Whether this is root.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the agent must switch to this user to run a job (it runs as someone else).
    pub fn differs_from_agent(&self) -> bool {
        // SAFETY: geteuid cannot fail.
        self.uid != unsafe { libc::geteuid() }
    }
}

/// Looks a user up in the password database (`getpwnam_r`: /etc/passwd, LDAP, whatever NSS
/// says); `None` when there is no such user.
pub fn lookup_user(name: &str) -> Option<JobUser> {
    let c_name = std::ffi::CString::new(name).ok()?;
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getpwnam_r fills `entry` with pointers into `buffer`, which outlives their use.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let result = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if result != 0 || found.is_null() {
        return None;
    }
    Some(JobUser {
        name: name.to_string(),
        uid: entry.pw_uid,
        gid: entry.pw_gid,
        per_job: false,
    })
}

/// The user with id `uid`, if the password database knows one.
fn lookup_user_by_uid(uid: u32) -> Option<JobUser> {
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: as in `lookup_user`.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let result = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if result != 0 || found.is_null() || entry.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name is a NUL-terminated string in `buffer`.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) }
        .to_string_lossy()
        .into_owned();
    Some(JobUser {
        name,
        uid: entry.pw_uid,
        gid: entry.pw_gid,
        per_job: false,
    })
}

/// Hands `path` to the job user, when the agent runs as someone else (root): the job must be
/// able to write its working dir and checkpoint dir. Never through a link: a link a job left
/// where the agent expects its own file would otherwise hand the link's target (any file of
/// the host) to the job.
pub(crate) fn give_to(path: &Path, user: &JobUser) -> Result<(), RuntimeError> {
    if !user.differs_from_agent() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))
        .map_err(|error| RuntimeError::io("hand to the job user", path, error))
}

/// Makes `path` a directory of the job user's, whose parent exists, never following a link
/// at `path`: whatever a job left there that is not a directory (a link to a host directory,
/// a file) is removed first. Directories under a job's checkpoint dir, which the job writes
/// and which outlives its attempts, are made this way.
pub(crate) fn real_dir_for(path: &Path, user: &JobUser) -> Result<(), RuntimeError> {
    ensure_dir(path, InPlace::Remove)?;
    give_to(path, user)
}

/// What [`ensure_dir`] does with something at its path that is not a directory.
#[derive(Clone, Copy)]
enum InPlace {
    /// Removes it (a link or file a job left where the agent makes a directory).
    Remove,
    /// Leaves it and fails, naming it (it is in a place only the agent writes).
    Refuse,
}

/// Makes `path` a directory, whose parent exists, never following a link at `path`.
fn ensure_dir(path: &Path, in_place: InPlace) -> Result<(), RuntimeError> {
    let create =
        || std::fs::create_dir(path).map_err(|error| RuntimeError::io("create", path, error));
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_dir() => Ok(()),
        Ok(_) => match in_place {
            InPlace::Remove => {
                std::fs::remove_file(path).map_err(|error| {
                    RuntimeError::io("remove what is not a directory at", path, error)
                })?;
                create()
            }
            InPlace::Refuse => Err(RuntimeError::io(
                "use as a directory",
                path,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "something that is not a directory is in its place",
                ),
            )),
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => create(),
        Err(error) => Err(RuntimeError::io("look at", path, error)),
    }
}

/// Creates the attempt's working dir fresh (whatever an earlier try left there is removed)
/// and hands it to the job user, readable by it alone.
pub(crate) fn create_work_dir(path: &Path, user: &JobUser) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(RuntimeError::io("remove the old", path, error)),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| RuntimeError::io("create", parent, error))?;
    }
    std::fs::create_dir(path).map_err(|error| RuntimeError::io("create", path, error))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|error| RuntimeError::io("set the mode of", path, error))?;
    give_to(path, user)
}

/// Creates the job's checkpoint dir if missing (its parents the agent's own) and hands it to
/// the job user, readable by that user alone.
pub(crate) fn create_checkpoint_dir(path: &Path, user: &JobUser) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| RuntimeError::io("create", parent, error))?;
    }
    // Its parent is the agent's, so no job put what may be in its place: that is left alone
    // and the launch fails, saying so.
    ensure_dir(path, InPlace::Refuse)?;
    give_to(path, user)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|error| RuntimeError::io("set the mode of", path, error))
}

/// Creates `dir`, the agent's own, readable by the agent alone: the jobs' logs are written
/// through the descriptors the agent opens for them, and read back by the agent.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|error| RuntimeError::io("create", dir, error))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|error| RuntimeError::io("set the mode of", dir, error))
}

/// The whole environment of a process job, and nothing of the agent's: a minimal `PATH`,
/// `HOME` (its working dir) and `LANG` unless the job sets them, the job's own variables,
/// then Quotient's ([`job_environment`], and `QUOTIENT_WORK_DIR`), which win.
pub fn process_environment(spec: &LaunchSpec) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PATH".to_string(), JOB_PATH_DEFAULT.to_string()),
        ("HOME".to_string(), spec.work_dir.display().to_string()),
        ("LANG".to_string(), JOB_LANG_DEFAULT.to_string()),
    ]);
    env.extend(job_environment(spec, GpuNumbering::HostIndices));
    env.insert(
        "QUOTIENT_WORK_DIR".into(),
        spec.work_dir.display().to_string(),
    );
    env
}

/// The environment of an attempt: the job's own variables, then Quotient's, which win.
///
/// `CUDA_VISIBLE_DEVICES` names GPU indices (host indices for processes, 0.. for containers);
/// `NVIDIA_VISIBLE_DEVICES` names the GPU UUIDs, which is what the NVIDIA container toolkit
/// reads and what stays true whatever the numbering. With no GPUs both are empty.
pub fn job_environment(spec: &LaunchSpec, numbering: GpuNumbering) -> BTreeMap<String, String> {
    let mut env = spec.env.clone();
    let indices: Vec<String> = match numbering {
        GpuNumbering::HostIndices => spec.gpu_indices.iter().map(u32::to_string).collect(),
        GpuNumbering::ContainerLocal => {
            (0..spec.gpu_indices.len()).map(|i| i.to_string()).collect()
        }
    };
    env.insert("QUOTIENT_JOB_ID".into(), spec.job.to_string());
    env.insert("QUOTIENT_ATTEMPT".into(), spec.attempt.to_string());
    env.insert(
        "QUOTIENT_CHECKPOINT_DIR".into(),
        spec.checkpoint_dir.display().to_string(),
    );
    env.insert("CUDA_VISIBLE_DEVICES".into(), indices.join(","));
    env.insert("NVIDIA_VISIBLE_DEVICES".into(), spec.gpu_uuids.join(","));
    let meet = &spec.rendezvous;
    let nodes = meet.hosts.len().max(1);
    env.insert("QUOTIENT_NODE_RANK".into(), meet.rank.to_string());
    env.insert("QUOTIENT_NUM_NODES".into(), nodes.to_string());
    env.insert("QUOTIENT_HOSTS".into(), meet.hosts.join(","));
    // torchrun's and torch.distributed's names: set unless the job set them itself.
    let world_size = nodes * spec.gpu_indices.len().max(1);
    for (key, value) in [
        ("MASTER_ADDR", meet.master_addr.clone()),
        ("MASTER_PORT", meet.master_port.to_string()),
        ("NNODES", nodes.to_string()),
        ("NODE_RANK", meet.rank.to_string()),
        ("WORLD_SIZE", world_size.to_string()),
    ] {
        env.entry(key.to_string()).or_insert(value);
    }
    if numbering == GpuNumbering::HostIndices {
        env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
    }
    env
}

/// The exit code a shell reports: the status, or 128 + the signal that ended the process.
pub fn exit_code_of(status: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
}

/// Reads at most [`LOG_READ_BYTES_MAX`] bytes from the end of a file; a missing file is empty.
pub(crate) fn read_log_tail(path: &Path) -> Result<String, RuntimeError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(error) => return Err(RuntimeError::io("open log", path, error)),
    };
    let length = file
        .metadata()
        .map_err(|error| RuntimeError::io("read log", path, error))?
        .len();
    if length > LOG_READ_BYTES_MAX {
        file.seek(SeekFrom::Start(length - LOG_READ_BYTES_MAX))
            .map_err(|error| RuntimeError::io("read log", path, error))?;
    }
    let mut bytes = Vec::new();
    file.take(LOG_READ_BYTES_MAX)
        .read_to_end(&mut bytes)
        .map_err(|error| RuntimeError::io("read log", path, error))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> LaunchSpec {
        LaunchSpec {
            job: JobId(7),
            attempt: 2,
            payload: JobPayload {
                image: None,
                command: ["true"].into(),
            },
            env: BTreeMap::from([("EPOCHS".to_string(), "3".to_string())]),
            gpu_indices: vec![2, 5],
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            checkpoint_dir: PathBuf::from("/state/checkpoints/j-7"),
            work_dir: PathBuf::from("/state/work/j-7-2"),
            log_path: PathBuf::from("/state/logs/j-7-2.log"),
            checkpoint_signal: Signal::Sigterm,
            grace_period_ms: 1_000,
            limits: JobLimits::NONE,
            rendezvous: Rendezvous::single(Some("10.0.0.7"), 29_600),
        }
    }

    /// A job on one node is rank 0 of one: it meets itself on loopback at the attempt's port,
    /// and its world is its GPUs; variables the job set itself for torch stay its own.
    #[test]
    fn the_environment_gives_the_rendezvous() {
        let env = job_environment(&spec(), GpuNumbering::HostIndices);
        assert_eq!(env["QUOTIENT_NODE_RANK"], "0");
        assert_eq!(env["QUOTIENT_NUM_NODES"], "1");
        assert_eq!(env["QUOTIENT_HOSTS"], "10.0.0.7");
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(env["MASTER_PORT"], "29600");
        assert_eq!(
            (env["NNODES"].as_str(), env["NODE_RANK"].as_str()),
            ("1", "0")
        );
        assert_eq!(env["WORLD_SIZE"], "2");
        let mut own = spec();
        own.env.insert("MASTER_PORT".into(), "40000".into());
        let env = job_environment(&own, GpuNumbering::HostIndices);
        assert_eq!(env["MASTER_PORT"], "40000");
        assert_ne!(free_port(), 0);
    }

    /// Processes see host indices, containers see 0.., and both see UUIDs and Quotient's variables.
    #[test]
    fn the_environment_names_the_job_and_its_gpus() {
        let env = job_environment(&spec(), GpuNumbering::HostIndices);
        assert_eq!(env["QUOTIENT_JOB_ID"], "j-7");
        assert_eq!(env["QUOTIENT_ATTEMPT"], "2");
        assert_eq!(env["QUOTIENT_CHECKPOINT_DIR"], "/state/checkpoints/j-7");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2,5");
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert_eq!(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
        assert_eq!(env["EPOCHS"], "3");
        let env = job_environment(&spec(), GpuNumbering::ContainerLocal);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0,1");
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert!(!env.contains_key("CUDA_DEVICE_ORDER"));
        assert!(!env.contains_key("PATH") && !env.contains_key("QUOTIENT_WORK_DIR"));
    }

    /// A process job gets a minimal PATH, HOME and LANG unless it sets its own, its work dir,
    /// and nothing else that the test process (the agent) has.
    #[test]
    fn a_process_environment_is_clean_with_defaults_the_job_may_override() {
        let env = process_environment(&spec());
        assert_eq!(env["PATH"], JOB_PATH_DEFAULT);
        assert_eq!(env["HOME"], "/state/work/j-7-2");
        assert_eq!(env["LANG"], "C.UTF-8");
        assert_eq!(env["QUOTIENT_WORK_DIR"], "/state/work/j-7-2");
        assert_eq!(env["EPOCHS"], "3");
        let expected: std::collections::BTreeSet<&str> = [
            "PATH",
            "HOME",
            "LANG",
            "EPOCHS",
            "QUOTIENT_JOB_ID",
            "QUOTIENT_ATTEMPT",
            "QUOTIENT_CHECKPOINT_DIR",
            "QUOTIENT_WORK_DIR",
            "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES",
            "CUDA_DEVICE_ORDER",
            "QUOTIENT_NODE_RANK",
            "QUOTIENT_NUM_NODES",
            "QUOTIENT_HOSTS",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NNODES",
            "NODE_RANK",
            "WORLD_SIZE",
        ]
        .into();
        assert_eq!(
            env.keys()
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>(),
            expected
        );
        let mut own = spec();
        own.env.insert("PATH".into(), "/opt/job/bin".into());
        own.env.insert("LANG".into(), "de_DE.UTF-8".into());
        let env = process_environment(&own);
        assert_eq!(env["PATH"], "/opt/job/bin");
        assert_eq!(env["LANG"], "de_DE.UTF-8");
    }

    /// Users resolve through the password database; unknown ones do not.
    #[test]
    fn users_resolve_by_name() {
        let root = lookup_user("root").expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.is_root());
        assert!(lookup_user("no-such-user-quotient").is_none());
        let me = JobUser::current();
        assert!(!me.differs_from_agent());
    }
}
