//! The process runtime: a job's command as a process group on the host.
//!
//! Each attempt runs under a tiny `/bin/sh` shim that leads its own process group (so one
//! signal reaches the job and everything it forks), forwards nothing and waits for the job,
//! then writes the job's exit code (the status, or 128 + the signal) to an exit file. The shim
//! catches the checkpoint signals with a no-op trap: caught signals are reset to their
//! defaults in the job it starts, whereas ignored ones would be inherited. So the exit code is
//! known even when the agent was restarted in between and is no longer the job's parent.
//!
//! # The orphan watchdog
//! A job outlives its agent on purpose (a restarted agent re-adopts it), but not its agent's
//! lease: once the coordinators count the node lost they requeue the job elsewhere, so it must
//! be gone by then even if the agent was killed or is frozen and cannot fence itself. With
//! [`ProcessRuntime::with_orphan_watchdog`] (the agent always sets it) the shim starts, before
//! the job, a watchdog subshell in the job's process group that reads the agent's lease file
//! (`<state_dir>/agent-lease`, see [`crate::lease`]: the lease's expiry on the boot clock,
//! rewritten on every acknowledged heartbeat) every [`WATCHDOG_POLL_S`] second and compares
//! it with `/proc/uptime`. Once the expiry is [`WATCHDOG_SLACK_MS`] behind (the slack lets a
//! live agent fence first), it:
//! 1. sends the job's checkpoint signal to the process group (not when the file says
//!    `fencing`: the agent sent it already), and writes a line to the job's log;
//! 2. waits the job's grace period; if the job exits meanwhile, the shim records its exit code
//!    as usual and ends the watchdog;
//! 3. otherwise writes exit code 137 (128 + SIGKILL) to the exit file and sends SIGKILL to the
//!    group, shim and watchdog included.
//!
//! So the job gets its checkpoint signal by `expiry + WATCHDOG_SLACK_MS + WATCHDOG_POLL_S`
//! and is gone one more poll after its grace period, inside the coordinators' margin (see
//! [`crate::session`]). The watchdog only ever reads the file: a restarted agent renews it on
//! registration, and a job whose agent came back within the lease runs on untouched. A missing
//! or unreadable file keeps the last expiry read (none read yet: expired, fail closed; the
//! agent writes the file when it registers, before any job starts). Once the watchdog has
//! started stopping a job it finishes, even if the lease is renewed meanwhile (the
//! coordinators may already have requeued it). The watchdog's subshell catches the checkpoint
//! signals too (so a preemption by the agent does not end it); its `sleep` is cut short by
//! them, which only makes it look sooner. Jobs started by an older shim have no watchdog.
//!
//! Ownership is proven by a pid file, `<state_dir>/jobs/<job>-<attempt>.json`, holding the
//! leader's pid, the group id and the leader's start time from `/proc/<pid>/stat`. A restarted
//! agent signals a group only while a process with that pid *and* that start time exists, so a
//! pid reused by an unrelated process is never touched.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

use quotient_common::{JobId, Signal};
use serde::{Deserialize, Serialize};

use super::cgroup::Cgroups;
use super::{
    create_checkpoint_dir, create_private_dir, create_work_dir, exit_code_of, give_to,
    process_environment, read_log_tail, FoundJob, JobHandle, JobStatus, JobUser, LaunchSpec,
    Runtime, RuntimeError,
};

/// The folder under the state dir that holds pid and exit files.
pub const JOBS_DIR: &str = "jobs";
/// The largest pid file read back; anything bigger is not one of ours.
pub const PID_FILE_BYTES_MAX: u64 = 64 * 1024;
/// Pid files read by one `list_own`.
pub const PID_FILES_MAX: usize = 4_096;
/// The shell that runs the shim.
pub const SHIM_SHELL: &str = "/bin/sh";

/// How often the orphan watchdog reads the lease file, in whole seconds (`sleep` takes no
/// fractions in POSIX).
pub const WATCHDOG_POLL_S: u64 = 1;
/// The most of an exit file read: the shim writes a number and a newline.
const EXIT_FILE_BYTES_MAX: u64 = 64;
/// How long after the lease's expiry the orphan watchdog acts: longer than the agent's own
/// executor tick, so a live agent fences first and marks the lease file.
pub const WATCHDOG_SLACK_MS: u64 = 500;
/// The exit code the orphan watchdog records when it kills the job (128 + SIGKILL).
pub const WATCHDOG_KILLED_EXIT_CODE: i32 = 128 + libc::SIGKILL;

/// The shim runs as the job user, who may not write the jobs dir: the agent creates the exit
/// file empty, owned by that user, and the shim writes its one line into it in place.
///
/// `$1` is the exit file, `$2` the lease file (empty: no watchdog), `$3` the checkpoint signal
/// (a name without `SIG`), `$4` the grace period in ms, `$5` the watchdog's slack in ms, `$6`
/// its poll in seconds, `$7` the exit code it records; the rest is the job's command.
///
/// The shim first reads one line from its stdin, a pipe from the agent: the agent writes `go`
/// once the attempt's pid file is written. An agent killed before that closes the pipe
/// unwritten, and the shim exits without running the job (leaving the exit file empty), so a
/// job never runs without a pid file, where a restarted agent could not find it and would
/// start the attempt again beside it (found by `quotient-chaos`). The job's stdin is
/// `/dev/null`.
const SHIM_SCRIPT: &str = r#"exit_file="$1"; lease_file="$2"; signal="$3"; grace_ms="$4"
slack_ms="$5"; poll_s="$6"; killed_code="$7"; shift 7
IFS= read -r go || go=
[ "$go" = go ] || exit 0
exec </dev/null
trap 'true' HUP INT QUIT TERM USR1 USR2
watchdog=
if [ -n "$lease_file" ]; then
  (
    trap 'true' HUP INT QUIT TERM USR1 USR2
    now() {
      read -r up rest < /proc/uptime || return 1
      cs=${up#*.}; cs=${cs#0}
      now=$(( ${up%.*} * 1000 + cs * 10 ))
    }
    expiry=0; mark=
    while :; do
      if read -r value word < "$lease_file" 2>/dev/null; then
        case "$value" in
          ''|*[!0-9]*) ;;
          *) expiry=$value; mark=$word ;;
        esac
      fi
      now || { echo "quotient: cannot read /proc/uptime: no orphan watchdog" >&2; exit 1; }
      [ "$now" -gt $(( expiry + slack_ms )) ] && break
      sleep "$poll_s"
    done
    echo "quotient: the agent's lease ran out (expiry $expiry ms, now $now ms since boot); stopping the job" >&2
    printf 'stopped\n' > "$exit_file"
    [ "$mark" = fencing ] || kill -s "$signal" 0
    end=$(( now + grace_ms ))
    while now && [ "$now" -lt "$end" ]; do sleep "$poll_s"; done
    echo "quotient: grace period over; killing the job" >&2
    printf 'stopped %s\n' "$killed_code" > "$exit_file"
    kill -s KILL 0
  ) &
  watchdog=$!
fi
"$@"
code=$?
[ -z "$watchdog" ] || kill -s KILL "$watchdog" 2>/dev/null
stopped=
IFS=' ' read -r first rest < "$exit_file" 2>/dev/null && [ "$first" = stopped ] && stopped='stopped '
printf '%s%s\n' "$stopped" "$code" > "$exit_file"
exit "$code""#;

/// An exit file's text: the code, and whether the watchdog stopped the job (`stopped 0`,
/// `stopped 137`, or `stopped` alone while the job has not exited yet).
pub fn parse_exit_record(text: &str) -> (Option<i32>, bool) {
    let text = text.trim();
    match text.strip_prefix("stopped") {
        Some(rest) => (rest.trim().parse().ok(), true),
        None => (text.parse().ok(), false),
    }
}

/// What the pid file records about one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidRecord {
    pub job: JobId,
    pub attempt: u32,
    /// The shim's pid; it leads the group.
    pub pid: i32,
    pub pgid: i32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot. Guards against pid reuse.
    pub start_time_ticks: u64,
    pub checkpoint_signal: Signal,
    pub grace_period_ms: u64,
    pub log_path: PathBuf,
}

/// Runs jobs as process groups on this host.
pub struct ProcessRuntime {
    state_dir: PathBuf,
    /// The agent's lease file, which each job's watchdog reads; `None`: no watchdog.
    lease_file: Option<PathBuf>,
    /// Children this instance started: waited on here so they leave no zombies.
    children: Mutex<BTreeMap<(JobId, u32), Child>>,
    /// Who jobs run as.
    user: JobUser,
    /// Where each job's cgroup goes; `None`: jobs run without CPU and memory limits.
    cgroups: Option<Arc<Cgroups>>,
}

impl ProcessRuntime {
    /// A runtime whose pid files live under `state_dir`, running jobs as the agent's own user.
    pub fn new(state_dir: &Path) -> ProcessRuntime {
        ProcessRuntime {
            state_dir: state_dir.to_path_buf(),
            lease_file: None,
            children: Mutex::new(BTreeMap::new()),
            user: JobUser::current(),
            cgroups: None,
        }
    }

    /// Every job started from now on runs in a cgroup of its own under `cgroups`, held to
    /// the CPUs and memory of its attempt ([`super::cgroup`]).
    pub fn with_cgroups(mut self, cgroups: Arc<Cgroups>) -> ProcessRuntime {
        self.cgroups = Some(cgroups);
        self
    }

    /// Where the jobs' cgroups are, if limits are enforced.
    pub fn cgroups(&self) -> Option<&Cgroups> {
        self.cgroups.as_deref()
    }

    /// Jobs run as `user` (uid, gid, no supplementary groups); the agent must be root unless
    /// it is its own user.
    pub fn with_job_user(mut self, user: JobUser) -> ProcessRuntime {
        self.user = user;
        self
    }

    /// Every job started from now on gets the orphan watchdog, reading the lease file at
    /// `lease_file` (see the module docs).
    pub fn with_orphan_watchdog(mut self, lease_file: &Path) -> ProcessRuntime {
        self.lease_file = Some(lease_file.to_path_buf());
        self
    }

    fn jobs_dir(&self) -> PathBuf {
        self.state_dir.join(JOBS_DIR)
    }

    fn pid_file(&self, job: JobId, attempt: u32) -> PathBuf {
        self.jobs_dir().join(format!("{job}-{attempt}.json"))
    }

    fn exit_file(&self, job: JobId, attempt: u32) -> PathBuf {
        self.jobs_dir().join(format!("{job}-{attempt}.exit"))
    }

    fn children(&self) -> MutexGuard<'_, BTreeMap<(JobId, u32), Child>> {
        self.children
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read_record(&self, job: JobId, attempt: u32) -> Result<Option<PidRecord>, RuntimeError> {
        read_pid_file(&self.pid_file(job, attempt))
    }

    /// The exit code the shim recorded, if any ([`ProcessRuntime::recorded_exit`]).
    fn recorded_exit_code(&self, job: JobId, attempt: u32) -> Option<i32> {
        self.recorded_exit(job, attempt)?.0
    }

    /// What the shim recorded: the exit code, if any, and whether the watchdog stopped the
    /// job (`stopped` before the code: the agent's lease ran out). The file is the job
    /// user's to write, so it is read with a limit: an exit code is a few bytes, and a job
    /// that grew its file to gigabytes would otherwise have the agent read them all, again
    /// and again. (A job can write `stopped` itself: it then only sends itself back to the
    /// queue, as a stop by its agent.)
    fn recorded_exit(&self, job: JobId, attempt: u32) -> Option<(Option<i32>, bool)> {
        let file = std::fs::File::open(self.exit_file(job, attempt)).ok()?;
        let text =
            quotient_common::bounded_read::read_text_at_most(file, EXIT_FILE_BYTES_MAX).ok()??;
        Some(parse_exit_record(&text))
    }

    fn status_of(&self, record: &PidRecord) -> Result<JobStatus, RuntimeError> {
        let key = (record.job, record.attempt);
        // A child of this instance: the OS tells its status.
        let child_status = {
            let mut children = self.children();
            match children.get_mut(&key) {
                Some(child) => Some(
                    child
                        .try_wait()
                        .map_err(|error| RuntimeError::io("wait for", &record.log_path, error))?,
                ),
                None => None,
            }
        };
        match child_status {
            Some(None) => return Ok(JobStatus::Running),
            Some(Some(status)) => {
                let code = self
                    .recorded_exit_code(record.job, record.attempt)
                    .or(exit_code_of(status));
                return Ok(JobStatus::Exited { code });
            }
            None => {}
        }
        // Adopted after a restart: only /proc and the exit file tell.
        match process_state(record.pid) {
            Some((state, start)) if start == record.start_time_ticks && state != 'Z' => {
                Ok(JobStatus::Running)
            }
            Some((_, start)) if start == record.start_time_ticks => {
                // Our zombie: the restarted agent may still be its parent (tests are), reap it.
                reap(record.pid);
                Ok(JobStatus::Exited {
                    code: self.recorded_exit_code(record.job, record.attempt),
                })
            }
            _ => Ok(JobStatus::Exited {
                code: self.recorded_exit_code(record.job, record.attempt),
            }),
        }
    }

    /// Signals the group only if its leader is still the process this agent started.
    fn signal_group(&self, handle: &JobHandle, number: i32) -> Result<(), RuntimeError> {
        let Some(record) = self.read_record(handle.job, handle.attempt)? else {
            tracing::debug!(job = %handle.job, attempt = handle.attempt, "no pid file: nothing to signal");
            return Ok(());
        };
        if self.status_of(&record)? != JobStatus::Running {
            return Ok(());
        }
        // SAFETY: kill(2) takes plain integers; a negative pid names the process group.
        let result = unsafe { libc::kill(-record.pgid, number) };
        if result != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::ESRCH) {
                return Err(RuntimeError::io(
                    "signal the process group of",
                    &self.pid_file(handle.job, handle.attempt),
                    error,
                ));
            }
        }
        Ok(())
    }
}

impl Runtime for ProcessRuntime {
    async fn start(&self, spec: &LaunchSpec) -> Result<JobHandle, RuntimeError> {
        let invalid = |problem: &str| RuntimeError::InvalidLaunch {
            job: spec.job,
            attempt: spec.attempt,
            problem: problem.to_string(),
        };
        // The image first: an image job usually has no command of its own.
        if spec.payload.image.is_some() {
            return Err(invalid(
                "the job names an image: run the agent with --runtime docker",
            ));
        }
        if spec.payload.command.is_empty() {
            return Err(invalid("the process runtime needs a command"));
        }
        if let Some(record) = self.read_record(spec.job, spec.attempt)? {
            if self.status_of(&record)? == JobStatus::Running {
                return Err(RuntimeError::AlreadyRunning {
                    job: spec.job,
                    attempt: spec.attempt,
                });
            }
        }
        let user = self.user.for_job(spec.job);
        create_checkpoint_dir(&spec.checkpoint_dir, &user)?;
        create_work_dir(&spec.work_dir, &user)?;
        let jobs_dir = self.jobs_dir();
        std::fs::create_dir_all(&jobs_dir)
            .map_err(|error| RuntimeError::io("create", &jobs_dir, error))?;
        create_private_dir(
            &spec
                .log_path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| self.state_dir.clone()),
        )?;
        let exit_file = self.exit_file(spec.job, spec.attempt);
        match std::fs::remove_file(&exit_file) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(RuntimeError::io("remove", &exit_file, error)),
        }
        std::fs::File::create(&exit_file)
            .map_err(|error| RuntimeError::io("create", &exit_file, error))?;
        give_to(&exit_file, &user)?;
        let log = std::fs::File::create(&spec.log_path)
            .map_err(|error| RuntimeError::io("create log", &spec.log_path, error))?;
        let log_err = log
            .try_clone()
            .map_err(|error| RuntimeError::io("open log", &spec.log_path, error))?;

        let mut command = Command::new(SHIM_SHELL);
        command
            .arg("-c")
            .arg(SHIM_SCRIPT)
            .arg("quotient-job")
            .arg(&exit_file)
            .arg(self.lease_file.as_deref().unwrap_or(Path::new("")))
            .arg(spec.checkpoint_signal.name().trim_start_matches("SIG"))
            .arg(spec.grace_period_ms.to_string())
            .arg(WATCHDOG_SLACK_MS.to_string())
            .arg(WATCHDOG_POLL_S.to_string())
            .arg(WATCHDOG_KILLED_EXIT_CODE.to_string())
            .args(&spec.payload.command)
            // The start gate (see `SHIM_SCRIPT`); the job itself reads /dev/null.
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(log_err)
            .current_dir(&spec.work_dir)
            .process_group(0)
            // Nothing of the agent's own environment.
            .env_clear()
            .envs(process_environment(spec));
        if user.differs_from_agent() {
            // As root, std also clears the supplementary groups (setgroups(0)) before setuid.
            command.uid(user.uid).gid(user.gid);
        }
        if self.user.per_job {
            // No password entry names the job's own uid: say who it is where tools look.
            for variable in ["USER", "LOGNAME"] {
                if !spec.env.contains_key(variable) {
                    command.env(variable, &user.name);
                }
            }
        }
        if let Some(cgroups) = &self.cgroups {
            let cgroup = cgroups
                .prepare(spec.job, spec.attempt, spec.limits)
                .map_err(|error| {
                    let dir = cgroups.dirs(spec.job, spec.attempt).remove(0);
                    RuntimeError::io("set up the cgroup", &dir, error)
                })?;
            // SAFETY: `enter` only calls write(2), which is async-signal-safe; the files it
            // writes were opened here, before the fork, by the agent.
            unsafe {
                command.pre_exec(move || cgroup.enter());
            }
        } else if !spec.limits.is_none() {
            tracing::debug!(job = %spec.job, attempt = spec.attempt, limits = ?spec.limits,
                "CPU and memory limits are not enforced on this host; the job runs without them");
        }
        let child = command.spawn().map_err(|error| {
            // execve's E2BIG: the job's own arguments and environment are too large (validation
            // keeps them under `LAUNCH_BYTES_MAX`, but the agent adds Quotient's variables).
            if error.raw_os_error() == Some(libc::E2BIG) {
                invalid(&format!(
                    "its command and environment are too large to execute ({error}): pass large \
                     data through a file and its path in a variable"
                ))
            } else {
                RuntimeError::io("start", Path::new(SHIM_SHELL), error)
            }
        })?;
        let pid = child.id() as i32;
        // Not yet waited on, so /proc/<pid> exists even if the job already ended (a zombie).
        let start_time_ticks = process_state(pid).map(|(_, start)| start).unwrap_or(0);
        let record = PidRecord {
            job: spec.job,
            attempt: spec.attempt,
            pid,
            pgid: pid,
            start_time_ticks,
            checkpoint_signal: spec.checkpoint_signal,
            grace_period_ms: spec.grace_period_ms,
            log_path: spec.log_path.clone(),
        };
        let mut child = child;
        let pid_file = self.pid_file(spec.job, spec.attempt);
        let written = write_pid_file(&pid_file, &record).and_then(|()| {
            // The pid file is there: the shim may run the job (see `SHIM_SCRIPT`).
            let mut gate = child.stdin.take().ok_or_else(|| {
                RuntimeError::io(
                    "open the start gate of",
                    Path::new(SHIM_SHELL),
                    std::io::Error::other("no stdin pipe"),
                )
            })?;
            gate.write_all(b"go\n").map_err(|error| {
                RuntimeError::io("open the start gate of", Path::new(SHIM_SHELL), error)
            })
        });
        if let Err(error) = written {
            // Without its pid file the job could be started twice or never found again: undo.
            let _ = std::fs::remove_file(&pid_file);
            // SAFETY: kill(2) on the group this call just created and still owns.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
            if let Err(wait_error) = child.wait() {
                tracing::warn!(pid, "cannot reap a job whose pid file failed: {wait_error}");
            }
            return Err(error);
        }
        self.children().insert((spec.job, spec.attempt), child);
        tracing::info!(job = %spec.job, attempt = spec.attempt, pid, "started process job");
        Ok(JobHandle {
            job: spec.job,
            attempt: spec.attempt,
            id: pid.to_string(),
        })
    }

    async fn signal(&self, handle: &JobHandle, signal: Signal) -> Result<(), RuntimeError> {
        self.signal_group(handle, signal.number())
    }

    async fn kill(&self, handle: &JobHandle) -> Result<(), RuntimeError> {
        self.signal_group(handle, libc::SIGKILL)
    }

    async fn exit_reason(&self, handle: &JobHandle, code: i32) -> Option<String> {
        let oom_killed = self
            .cgroups
            .as_ref()
            .and_then(|cgroups| cgroups.oom_kills(handle.job, handle.attempt))
            .is_some_and(|kills| kills > 0);
        if oom_killed && code == 128 + libc::SIGKILL {
            return Some(super::OUT_OF_MEMORY_REASON.to_string());
        }
        super::shell_exit_reason(code)
    }

    fn stopped_by_watchdog(&self, handle: &JobHandle) -> bool {
        self.recorded_exit(handle.job, handle.attempt)
            .is_some_and(|(_, stopped)| stopped)
    }

    async fn status(&self, handle: &JobHandle) -> Result<JobStatus, RuntimeError> {
        match self.read_record(handle.job, handle.attempt)? {
            Some(record) => self.status_of(&record),
            None => Ok(JobStatus::Exited {
                code: self.recorded_exit_code(handle.job, handle.attempt),
            }),
        }
    }

    async fn list_own(&self) -> Result<Vec<FoundJob>, RuntimeError> {
        let dir = self.jobs_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(RuntimeError::io("list", &dir, error)),
        };
        let mut found = Vec::new();
        for entry in entries.take(PID_FILES_MAX) {
            let path = entry
                .map_err(|error| RuntimeError::io("list", &dir, error))?
                .path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let record = match read_pid_file(&path) {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!("skipping an unreadable pid file: {error}");
                    continue;
                }
            };
            found.push(FoundJob {
                handle: JobHandle {
                    job: record.job,
                    attempt: record.attempt,
                    id: record.pgid.to_string(),
                },
                status: self.status_of(&record)?,
                checkpoint_signal: record.checkpoint_signal,
                grace_period_ms: record.grace_period_ms,
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
        self.children().remove(&(handle.job, handle.attempt));
        if let Some(cgroups) = &self.cgroups {
            cgroups.release(handle.job, handle.attempt);
        }
        for path in [
            self.pid_file(handle.job, handle.attempt),
            self.exit_file(handle.job, handle.attempt),
        ] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(RuntimeError::io("remove", &path, error)),
            }
        }
        Ok(())
    }

    async fn logs(&self, handle: &JobHandle) -> Result<String, RuntimeError> {
        match self.read_record(handle.job, handle.attempt)? {
            Some(record) => read_log_tail(&record.log_path),
            None => Ok(String::new()),
        }
    }
}

fn read_pid_file(path: &Path) -> Result<Option<PidRecord>, RuntimeError> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(RuntimeError::io("open pid file", path, error)),
    };
    let mut text = String::new();
    file.take(PID_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|error| RuntimeError::io("read pid file", path, error))?;
    serde_json::from_str(&text).map(Some).map_err(|error| {
        RuntimeError::io(
            "parse pid file",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, error),
        )
    })
}

/// Writes the pid file whole or not at all (write a temporary file, then rename).
fn write_pid_file(path: &Path, record: &PidRecord) -> Result<(), RuntimeError> {
    let text = serde_json::to_string_pretty(record).map_err(|error| {
        RuntimeError::io(
            "encode pid file",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, error),
        )
    })?;
    let temporary = path.with_extension("json.tmp");
    std::fs::write(&temporary, text)
        .map_err(|error| RuntimeError::io("write pid file", &temporary, error))?;
    std::fs::rename(&temporary, path)
        .map_err(|error| RuntimeError::io("write pid file", path, error))
}

/// A process's state letter and start time (field 22) from `/proc/<pid>/stat`; `None` if gone.
pub fn process_state(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 (state), so field 22 is fields[19].
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// Reaps `pid` if it is a child of this process; harmless otherwise.
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG only reads and reaps; ECHILD for a non-child is ignored.
    unsafe {
        libc::waitpid(pid, &mut status, libc::WNOHANG);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exit file's record: a code, or `stopped` before it when the watchdog stopped the
    /// job (alone while the job has not exited yet); anything else is no code.
    #[test]
    fn exit_records_parse() {
        assert_eq!(parse_exit_record("3\n"), (Some(3), false));
        assert_eq!(parse_exit_record("stopped 0\n"), (Some(0), true));
        assert_eq!(parse_exit_record("stopped 137"), (Some(137), true));
        assert_eq!(parse_exit_record("stopped\n"), (None, true));
        assert_eq!(parse_exit_record(""), (None, false));
        assert_eq!(parse_exit_record("garbage"), (None, false));
    }

    /// Runs the shim with `touch MARKER` as the job; `gate` is what the agent writes on its
    /// stdin before closing it. Whether the job ran, and the exit file's text.
    fn shim_with_gate(gate: &[u8]) -> (bool, String) {
        let dir = tempfile::tempdir().unwrap();
        let exit_file = dir.path().join("exit");
        std::fs::File::create(&exit_file).unwrap();
        let marker = dir.path().join("ran");
        let mut child = Command::new(SHIM_SHELL)
            .arg("-c")
            .arg(SHIM_SCRIPT)
            .arg("quotient-job")
            .arg(&exit_file)
            .args(["", "TERM", "1000", "500", "1", "137", "touch"])
            .arg(&marker)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(gate).unwrap();
        drop(stdin);
        let status = child.wait().unwrap();
        assert!(status.success(), "{status}");
        (
            marker.exists(),
            std::fs::read_to_string(&exit_file).unwrap(),
        )
    }

    #[test]
    fn the_job_runs_only_once_the_agent_opens_the_gate() {
        // Proves the start gate: an agent killed between spawning the shim and writing the pid
        // file closes the pipe unwritten, and the job never runs (an orphan the restarted
        // agent could not find); with `go` it runs and its exit code is recorded.
        assert_eq!(shim_with_gate(b"go\n"), (true, "0\n".to_string()));
        assert_eq!(shim_with_gate(b""), (false, String::new()));
        assert_eq!(shim_with_gate(b"gone\n"), (false, String::new()));
    }
}
