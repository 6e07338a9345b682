//! The executor: carries out what [`reconcile`](mod@crate::reconcile) decides, against a
//! [`Runtime`], and keeps the agent's record of each local attempt.
//!
//! It owns the clock (milliseconds since it was made) and the grace-period deadlines: a
//! checkpoint signal stamps `signalled_at_ms`, and a later [`Executor::step`] kills the attempt
//! once its grace period has passed, so a preemption is signal, wait, kill, and the exit is
//! reported as `ExitedAfterSignal`. [`Executor::next_deadline`] tells a loop when the next kill
//! is due, so it can step then rather than poll.
//!
//! Each step: observe (ask the runtime which attempts exited), reconcile, act. Reports come
//! back to the caller as [`JobReport`]s for the session to send. A failed runtime call is
//! logged and retried at the next step, except a launch.
//!
//! # Launches that fail
//! A launch that fails is tried again after [`LAUNCH_BACKOFF_FIRST_MS`], then after twice
//! that, and so on, [`LAUNCH_TRIES_MAX`] tries in all (about 1.5 s); then the executor gives
//! up on the attempt, never starts it again, and reports `LaunchFailed` with the runtime's
//! last message (at most `LAUNCH_MESSAGE_BYTES_MAX` bytes) and whose fault it was
//! ([`RuntimeError::launch_fault`]): the job's (the coordinators fail the attempt) or the
//! node's (they put the job back in the queue). Retrying without a bound once cost a third of
//! a core and 40 log lines a second, while the job held its GPUs with no reason given.
//! Every try is logged. Retries pending are kept only for attempts still desired to run, so
//! there are at most as many as the desired state has allocations.
//!
//! A launch can fail without saying whether it started anything: a call to the Docker daemon
//! that got no answer may be carried out later ([`RuntimeError::unsettled`]). The Docker
//! runtime settles that at the next try by the container's name; an attempt that will not be
//! tried again (given up, or no longer desired) is [`Runtime::abandon`]ed each round, beside
//! [`Executor::observe`]'s questions, until the runtime has said for [`UNSETTLED_QUIET_MS`]
//! that nothing of it is left (found by probing, with the daemon frozen: a container started
//! late ran untracked while the job was placed elsewhere; and a create held up in the daemon
//! was carried out just after the first answer of "nothing there").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quotient_common::job::bounded_launch_message;
use quotient_common::{JobEvent, JobId, JobReport, JobSpec};

use crate::reconcile::{
    self, Action, Desired, DesiredAllocation, Input, Intent, LocalJob, LocalPhase,
};
use crate::runtime::{
    checkpoint_dir, free_port, log_path, work_dir, JobHandle, JobStatus, LaunchSpec, Rendezvous,
    Runtime, RuntimeError,
};

/// Tries to launch one attempt before the executor gives up on it and reports it.
pub const LAUNCH_TRIES_MAX: u32 = 3;
/// How long one round waits for a runtime to say whether an attempt runs
/// ([`Executor::observe`]); an answer later than this is asked for again next round.
pub const OBSERVE_CALL_MS: u64 = 2_000;
/// How long one round waits for a runtime to signal, kill or remove an attempt, or say why it
/// exited; a call not answered by then is tried again next round (a signal may then come
/// twice).
pub const ACT_CALL_MS: u64 = 2_000;
/// How long one round waits for a runtime to start an attempt: longer than the other calls,
/// for a container's mounts and GPU hooks. A start not answered by then is a failed launch
/// whose outcome is settled later ([`RuntimeError::unsettled`]).
pub const START_CALL_MS: u64 = 10_000;
/// How often the executor looks again for attempts an earlier life of the agent started that
/// its runtimes could not be asked about at [`Executor::recover`] (milliseconds).
pub const RELIST_MS: u64 = 5_000;
/// The wait after a first failed launch; each later wait is twice the one before.
pub const LAUNCH_BACKOFF_FIRST_MS: u64 = 500;
/// Finished attempts remembered so that none is started twice; the oldest are forgotten first
/// (by then the coordinators have long moved on).
pub const FINISHED_ATTEMPTS_MAX: usize = 65_536;
/// Attempts whose failed launches are left to settle ([`Runtime::abandon`]), at most; the
/// oldest are dropped first, with an error in the log.
pub const UNSETTLED_LAUNCHES_MAX: usize = 1_024;
/// How long an abandoned attempt must keep being found with nothing left of it before it is
/// taken as settled: a daemon that hung carries out the calls held up in it in any order once
/// it answers again, so one answer of "nothing there" may come before a held-up create is
/// carried out (found by probing, with the daemon frozen: a `Created` container was left).
pub const UNSETTLED_QUIET_MS: u64 = 5_000;
/// Attempts tracked at once; a node runs at most one job per GPU, plus ones being stopped.
/// No more than a heartbeat may list, so that the leader never refuses this agent's.
pub const LOCAL_ATTEMPTS_MAX: usize = quotient_common::agent_api::ACTUAL_ATTEMPTS_MAX;

/// The folder in the agent's state dir that keeps, per attempt, when its checkpoint signal was
/// first sent (milliseconds of `CLOCK_BOOTTIME`, the lease's clock), so that an agent restarted
/// in a grace period goes on with that grace period rather than starting it again, and reports
/// an attempt that exited meanwhile as stopped, not as its own exit.
pub const SIGNALS_DIR: &str = "signals";
/// The folder in the agent's state dir that keeps, per attempt, that this agent started it
/// (its value: when, on `CLOCK_BOOTTIME`), written before the runtime is asked to start it
/// and removed once its exit is reported. An agent restarted finds every attempt it started;
/// one whose process or container is gone (removed while the agent was down) is never
/// started again under the same attempt, but reported, and the job goes back to the queue
/// (found by probing: a container removed while its agent was down was started again as the
/// same attempt, its first run's work and log lost).
pub const STARTED_DIR: &str = "started";
/// The most bytes read of one signal record (a decimal number).
const SIGNAL_RECORD_BYTES_MAX: u64 = 64;

/// A time per attempt (on the boot clock) kept across the agent's restarts: files in a folder
/// of the state dir, or, for a simulated host, a map that outlives the agent's executor. Kept
/// for when attempts were first signalled ([`SIGNALS_DIR`]) and for which attempts were
/// started ([`STARTED_DIR`]).
#[derive(Debug, Clone)]
pub enum SignalRecords {
    Files(PathBuf),
    Shared(Arc<std::sync::Mutex<BTreeMap<(JobId, u32), u64>>>),
}

impl SignalRecords {
    fn path(dir: &Path, job: JobId, attempt: u32) -> PathBuf {
        dir.join(format!("{job}-{attempt}"))
    }

    /// When the attempt was first signalled, if that was kept.
    fn get(&self, job: JobId, attempt: u32) -> Option<u64> {
        match self {
            SignalRecords::Files(dir) => {
                let text = quotient_common::bounded_read::read_text_file_at_most(
                    &Self::path(dir, job, attempt),
                    SIGNAL_RECORD_BYTES_MAX,
                )
                .ok()?;
                text.trim().parse().ok()
            }
            SignalRecords::Shared(map) => lock(map).get(&(job, attempt)).copied(),
        }
    }

    /// Keeps `at` as the attempt's first signal; a later signal keeps the first time. A
    /// failure to write is logged: the grace period then starts again if the agent restarts
    /// within it, as it did before such records were kept.
    fn keep(&self, job: JobId, attempt: u32, at: u64) {
        match self {
            SignalRecords::Files(dir) => {
                let path = Self::path(dir, job, attempt);
                if path.exists() {
                    return;
                }
                let written = std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&path, at.to_string()));
                if let Err(error) = written {
                    tracing::warn!(%job, attempt, path = %path.display(), "cannot keep when the checkpoint signal was sent: {error}");
                }
            }
            SignalRecords::Shared(map) => {
                lock(map).entry((job, attempt)).or_insert(at);
            }
        }
    }

    /// Every attempt with a record.
    fn keys(&self) -> Vec<(JobId, u32)> {
        match self {
            SignalRecords::Files(dir) => {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    return Vec::new();
                };
                entries
                    .flatten()
                    .filter_map(|entry| {
                        let name = entry.file_name();
                        let (job, attempt) = name.to_str()?.rsplit_once('-')?;
                        Some((job.parse().ok()?, attempt.parse().ok()?))
                    })
                    .collect()
            }
            SignalRecords::Shared(map) => lock(map).keys().copied().collect(),
        }
    }

    fn forget(&self, job: JobId, attempt: u32) {
        match self {
            SignalRecords::Files(dir) => {
                let _ = std::fs::remove_file(Self::path(dir, job, attempt));
            }
            SignalRecords::Shared(map) => {
                lock(map).remove(&(job, attempt));
            }
        }
    }

    /// Forgets every record but those of `kept` attempts.
    fn retain(&self, kept: &BTreeSet<(JobId, u32)>) {
        match self {
            SignalRecords::Files(dir) => {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    return;
                };
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    let wanted = kept.iter().any(|(job, attempt)| {
                        name.to_str() == Some(format!("{job}-{attempt}").as_str())
                    });
                    if !wanted {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
            SignalRecords::Shared(map) => lock(map).retain(|key, _| kept.contains(key)),
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the executor tracks about one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalAttempt {
    pub handle: JobHandle,
    pub local: LocalJob,
}

/// A failed launch of one attempt that will be tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LaunchRetry {
    /// Tries so far, all failed.
    tries: u32,
    /// When the next try is due (the executor's clock, ms).
    next_try_ms: u64,
}

/// The wait after the `tries`-th failed launch: [`LAUNCH_BACKOFF_FIRST_MS`], doubled per try.
pub fn launch_backoff_ms(tries: u32) -> u64 {
    LAUNCH_BACKOFF_FIRST_MS.saturating_mul(1 << tries.saturating_sub(1).min(16))
}

/// A clock in milliseconds that only its owner moves (never backwards): the virtual time of a
/// simulation. Clones share the reading.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(now_ms)))
    }

    pub fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Moves the clock to `now_ms`; an earlier reading is ignored.
    pub fn advance_to(&self, now_ms: u64) {
        self.0.fetch_max(now_ms, Ordering::SeqCst);
    }
}

/// Where the executor's milliseconds come from.
#[derive(Debug, Clone)]
enum ExecutorClock {
    /// The host's monotonic clock, counted from the executor's creation.
    Monotonic(Instant),
    Manual(ManualClock),
}

/// An attempt whose launch failed [unsettled](RuntimeError::unsettled).
#[derive(Debug, Clone, Copy)]
struct Unsettled {
    /// Whether it is a container.
    container: bool,
    /// Since when [`Runtime::abandon`] has answered, each time asked, that nothing is left of
    /// it (executor milliseconds).
    quiet_since_ms: Option<u64>,
}

/// Carries out reconcile's actions on one node.
pub struct Executor<R: Runtime> {
    runtime: R,
    node: String,
    state_dir: PathBuf,
    /// Where jobs' checkpoint dirs live; `state_dir/checkpoints` unless shared storage is set.
    checkpoint_root: PathBuf,
    /// GPU index -> UUID, from the node's inventory.
    gpu_uuids: BTreeMap<u32, String>,
    jobs: BTreeMap<(JobId, u32), LocalAttempt>,
    finished: BTreeSet<(JobId, u32)>,
    /// Finished attempts whose end (or `reconcile::ALREADY_RAN`) was reported while a desired
    /// state still names them; forgotten once none does, so that an attempt asked for again
    /// later (its job's id issued again) is answered again.
    answered: BTreeSet<(JobId, u32)>,
    /// Attempts whose launch failed and will be tried again.
    launch_retries: BTreeMap<(JobId, u32), LaunchRetry>,
    /// Attempts whose last launch failed [unsettled](RuntimeError::unsettled): abandoned once
    /// no longer tried, until the runtime has said for [`UNSETTLED_QUIET_MS`] that nothing is
    /// left of them.
    unsettled: BTreeMap<(JobId, u32), Unsettled>,
    /// Attempts an earlier life of this agent started that the runtimes could not be asked
    /// about when it recovered (Docker did not answer): left out of the desired state until
    /// a later look ([`RELIST_MS`]) finds them, or finds them gone. Started blind, a
    /// container that runs on would be missed, the launch would fail as the node's, and the
    /// job would run twice at once; a stop would be answered "not here" and free its GPUs
    /// while it ran.
    unlisted: BTreeSet<(JobId, u32)>,
    /// When the runtimes were last asked about them (the executor's clock).
    unlisted_looked_ms: u64,
    fence: Option<u64>,
    clock: ExecutorClock,
    /// See [`Executor::defer_removals`]: reported attempts whose runtime record is removed only
    /// when the caller says so.
    deferred_removals: Option<Vec<JobHandle>>,
    /// The node's advertised address, for its jobs' `QUOTIENT_HOSTS`.
    advertise_address: Option<String>,
    /// The running attempts' checkpoint directories, looked at for new checkpoints.
    checkpoint_watches: crate::checkpoints::Watches,
    /// When attempts were first signalled, kept across restarts.
    signal_records: SignalRecords,
    /// The attempts this agent started whose exits are not reported yet ([`STARTED_DIR`]).
    started_records: SignalRecords,
    /// Attempts of jobs of one node that this life of the agent started: once reported, their
    /// checkpoint dir is removed if they left it empty (no other member of the job can be
    /// about to write there, and the next attempt is placed only after the report).
    single_node: BTreeSet<(JobId, u32)>,
}

impl<R: Runtime> Executor<R> {
    /// Keeps jobs' checkpoint dirs under `root` (shared storage, so that a job resumes on
    /// whichever host its next attempt lands on).
    pub fn with_checkpoint_root(mut self, root: &Path) -> Executor<R> {
        self.checkpoint_root = root.to_path_buf();
        self
    }

    /// Names the node by `address` in its jobs' rendezvous (`QUOTIENT_HOSTS`).
    pub fn with_advertise_address(mut self, address: Option<String>) -> Executor<R> {
        self.advertise_address = address;
        self
    }

    /// An executor for `node`, keeping checkpoints and logs under `state_dir`.
    pub fn new(
        runtime: R,
        node: &str,
        state_dir: &Path,
        gpu_uuids: BTreeMap<u32, String>,
    ) -> Executor<R> {
        Executor {
            runtime,
            node: node.to_string(),
            state_dir: state_dir.to_path_buf(),
            checkpoint_root: state_dir.join("checkpoints"),
            gpu_uuids,
            jobs: BTreeMap::new(),
            finished: BTreeSet::new(),
            answered: BTreeSet::new(),
            launch_retries: BTreeMap::new(),
            unsettled: BTreeMap::new(),
            unlisted: BTreeSet::new(),
            unlisted_looked_ms: 0,
            fence: None,
            clock: ExecutorClock::Monotonic(Instant::now()),
            deferred_removals: None,
            advertise_address: None,
            checkpoint_watches: crate::checkpoints::Watches::default(),
            signal_records: SignalRecords::Files(state_dir.join(SIGNALS_DIR)),
            started_records: SignalRecords::Files(state_dir.join(STARTED_DIR)),
            single_node: BTreeSet::new(),
        }
    }

    /// Keeps the runtime record (pid file, container) of a reported attempt until
    /// [`Executor::remove_forgotten`], so that the caller can first make the report durable:
    /// an agent that dies in between finds the attempt again and reports its exit once more,
    /// rather than never.
    pub fn defer_removals(mut self) -> Executor<R> {
        self.deferred_removals = Some(Vec::new());
        self
    }

    /// Removes the runtime records held back by [`Executor::defer_removals`].
    pub async fn remove_forgotten(&mut self) {
        let handles = match self.deferred_removals.as_mut() {
            Some(handles) => std::mem::take(handles),
            None => return,
        };
        for handle in handles {
            let removed = self
                .within("remove", ACT_CALL_MS, self.runtime.remove(&handle))
                .await;
            if let Err(error) = removed {
                tracing::warn!(job = %handle.job, attempt = handle.attempt, "cannot remove the exited attempt's record: {error}");
            }
        }
    }

    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// Waits for one runtime call of a round at most `limit_ms` (found by probing: a hung
    /// Docker daemon held each call for 30 s, and every other attempt's signals, kills and
    /// starts with it). A simulated host (a manual clock) answers at once, and runs without
    /// tokio's timers.
    async fn within<T>(
        &self,
        operation: &'static str,
        limit_ms: u64,
        call: impl std::future::Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        if !matches!(self.clock, ExecutorClock::Monotonic(_)) {
            return call.await;
        }
        crate::runtime::within(operation, limit_ms, call).await
    }

    /// The attempts tracked now.
    pub fn jobs(&self) -> impl Iterator<Item = &LocalAttempt> {
        self.jobs.values()
    }

    /// The handle of a tracked attempt.
    pub fn handle(&self, job: JobId, attempt: u32) -> Option<&JobHandle> {
        self.jobs
            .get(&(job, attempt))
            .map(|tracked| &tracked.handle)
    }

    /// The highest fence acted on.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Updates the GPU index -> UUID map (after a new inventory).
    pub fn set_gpu_uuids(&mut self, gpu_uuids: BTreeMap<u32, String>) {
        self.gpu_uuids = gpu_uuids;
    }

    /// Reads its milliseconds from `clock`, which the caller moves, instead of the host's
    /// monotonic clock: a simulation's virtual time (the `quotient-sim` crate).
    pub fn with_manual_clock(mut self, clock: ManualClock) -> Executor<R> {
        self.clock = ExecutorClock::Manual(clock);
        self
    }

    /// Keeps the times of checkpoint signals in `records` rather than in the state dir.
    pub fn with_signal_records(mut self, records: SignalRecords) -> Executor<R> {
        self.signal_records = records;
        self
    }

    /// Keeps which attempts this agent started in `records` rather than in [`STARTED_DIR`]
    /// (a simulated host's, which outlives the agent's executor).
    pub fn with_started_records(mut self, records: SignalRecords) -> Executor<R> {
        self.started_records = records;
        self
    }

    /// The clock signal times are kept in, which runs on across the agent's restarts: the
    /// host's boot clock (a manual clock's reading, which a simulation keeps per host).
    fn boot_ms(&self) -> Option<u64> {
        match &self.clock {
            ExecutorClock::Monotonic(_) => crate::lease::boot_time_ms(),
            ExecutorClock::Manual(clock) => Some(clock.now_ms()),
        }
    }

    /// Milliseconds since this executor was made (on a manual clock: its reading).
    pub fn now_ms(&self) -> u64 {
        match &self.clock {
            ExecutorClock::Monotonic(origin) => origin.elapsed().as_millis() as u64,
            ExecutorClock::Manual(clock) => clock.now_ms(),
        }
    }

    /// How long until the next grace period runs out or the next launch is tried again, if
    /// either is pending.
    pub fn next_deadline(&self) -> Option<Duration> {
        let now = self.now_ms();
        self.jobs
            .values()
            .filter(|tracked| !tracked.local.killed)
            .filter_map(|tracked| {
                tracked
                    .local
                    .signalled_at_ms
                    .map(|at| at.saturating_add(tracked.local.grace_period_ms))
            })
            .chain(self.launch_retries.values().map(|retry| retry.next_try_ms))
            .min()
            .map(|deadline| Duration::from_millis(deadline.saturating_sub(now)))
    }

    /// Finds the attempts this agent started before a restart (by pid file or label). Running
    /// ones wait, as `Found`, for the first desired state to adopt or kill them; exited ones
    /// are reported at the next step.
    pub async fn recover(&mut self) -> Result<usize, RuntimeError> {
        self.look_for_own(false).await
    }

    /// [`Executor::recover`]'s look; `again`: a later one, while attempts are unlisted, which
    /// leaves out what this life already reported.
    async fn look_for_own(&mut self, again: bool) -> Result<usize, RuntimeError> {
        let found = self.runtime.list_own().await?;
        let count = found.len();
        for found in found {
            let key = (found.handle.job, found.handle.attempt);
            if self.jobs.contains_key(&key) || (again && self.finished.contains(&key)) {
                continue;
            }
            let phase = match found.status {
                JobStatus::Running => LocalPhase::Found,
                JobStatus::Exited { code } => LocalPhase::Exited { code },
            };
            tracing::info!(job = %key.0, attempt = key.1, ?phase, "found an attempt of this agent");
            let stopped_by_watchdog = matches!(phase, LocalPhase::Exited { .. })
                && self.runtime.stopped_by_watchdog(&found.handle);
            // Signalled by an earlier life of this agent: the grace period goes on from then.
            let signalled_ago_ms = self.signalled_ago_ms(key.0, key.1);
            let now = self.now_ms();
            if let Some(ago) = signalled_ago_ms {
                tracing::info!(job = %key.0, attempt = key.1, ago_ms = ago, "its checkpoint signal was sent before this agent started; its grace period goes on");
            }
            self.jobs.insert(
                key,
                LocalAttempt {
                    handle: found.handle,
                    local: LocalJob {
                        job: key.0,
                        attempt: key.1,
                        phase,
                        signalled_at_ms: signalled_ago_ms.map(|_| now),
                        // Exited while the agent was away, stopped by its watchdog: a stop
                        // by the agent, not the job's own exit.
                        killed: stopped_by_watchdog,
                        checkpoint_signal: found.checkpoint_signal,
                        grace_period_ms: found
                            .grace_period_ms
                            .saturating_sub(signalled_ago_ms.unwrap_or(0)),
                    },
                },
            );
        }
        self.signal_records
            .retain(&self.jobs.keys().copied().collect());
        // The attempts of an earlier life to account for: at start, every one on record; at a
        // later look, those still unlisted (attempts this life is starting or retrying have
        // records too, and are neither unlisted nor gone).
        let earlier: Vec<(JobId, u32)> = if again {
            self.unlisted.iter().copied().collect()
        } else {
            self.started_records.keys()
        };
        if !self.runtime.listed_everywhere() {
            // Not found may only mean not looked for (Docker does not answer yet): such an
            // attempt is neither taken for gone nor started, until a later look.
            let unlisted: BTreeSet<_> = earlier
                .into_iter()
                .filter(|key| !self.jobs.contains_key(key) && !self.finished.contains(key))
                .collect();
            if !unlisted.is_empty() && unlisted != self.unlisted {
                tracing::warn!(
                    count = unlisted.len(),
                    "attempts this agent started before it restarted could not be looked for (Docker does not answer?): none is started again until they are found, or found gone; looking again every {RELIST_MS} ms"
                );
            }
            self.unlisted = unlisted;
            self.unlisted_looked_ms = self.now_ms();
            return Ok(count);
        }
        self.unlisted.clear();
        for (job, attempt) in earlier {
            let key = (job, attempt);
            if self.jobs.contains_key(&key) {
                continue;
            }
            if self.finished.contains(&key) {
                // Its end is on record in the journal.
                self.started_records.forget(job, attempt);
                continue;
            }
            tracing::warn!(%job, attempt, "this agent started the attempt, and its process or container is gone (removed while the agent was down?): it is not started again; reported, the job goes back to the queue");
            self.remember_finished(job, attempt);
        }
        Ok(count)
    }

    /// How long ago an earlier life of this agent first signalled the attempt, if it did.
    fn signalled_ago_ms(&self, job: JobId, attempt: u32) -> Option<u64> {
        let at = self.signal_records.get(job, attempt)?;
        Some(self.boot_ms()?.saturating_sub(at))
    }

    /// Looks at every attempt that was running and records which have exited. The runtimes
    /// are asked all at once, each answer within [`OBSERVE_CALL_MS`]: one that does not come
    /// (a hung Docker daemon) leaves its attempt as it was until the next round, and holds up
    /// neither the others nor what the round does next (found by probing: a frozen daemon,
    /// asked one container at a time for 30 s each, held a process job's cancel for 58 s).
    /// Attempts whose launches failed unsettled and are no longer tried are abandoned at the
    /// same time, within the same bound.
    pub async fn observe(&mut self) {
        let runtime = &self.runtime;
        // A simulated host (a manual clock) answers at once, and runs without tokio's timers.
        let bounded = matches!(self.clock, ExecutorClock::Monotonic(_));
        let abandoned: Vec<_> = self
            .unsettled
            .iter()
            .filter(|(key, _)| {
                !self.launch_retries.contains_key(key) && !self.jobs.contains_key(key)
            })
            .map(
                |(&(job, attempt), &Unsettled { container, .. })| async move {
                    let limit = std::time::Duration::from_millis(OBSERVE_CALL_MS);
                    let settled = if bounded {
                        tokio::time::timeout(limit, runtime.abandon(job, attempt, container)).await
                    } else {
                        Ok(runtime.abandon(job, attempt, container).await)
                    };
                    ((job, attempt), settled)
                },
            )
            .collect();
        let asked: Vec<_> = self
            .jobs
            .iter()
            .filter(|(_, tracked)| !matches!(tracked.local.phase, LocalPhase::Exited { .. }))
            .map(|(key, tracked)| {
                let handle = tracked.handle.clone();
                async move {
                    let limit = std::time::Duration::from_millis(OBSERVE_CALL_MS);
                    let status = if bounded {
                        tokio::time::timeout(limit, runtime.status(&handle)).await
                    } else {
                        Ok(runtime.status(&handle).await)
                    };
                    (*key, status)
                }
            })
            .collect();
        let (answers, settled) = futures_util::future::join(
            futures_util::future::join_all(asked),
            futures_util::future::join_all(abandoned),
        )
        .await;
        let now = self.now_ms();
        for ((job, attempt), settled) in settled {
            let Some(entry) = self.unsettled.get_mut(&(job, attempt)) else {
                continue;
            };
            if !matches!(settled, Ok(Ok(()))) {
                entry.quiet_since_ms = None;
            }
            match settled {
                Ok(Ok(())) => {
                    let since = *entry.quiet_since_ms.get_or_insert(now);
                    if now.saturating_sub(since) >= UNSETTLED_QUIET_MS {
                        self.unsettled.remove(&(job, attempt));
                    }
                }
                Ok(Err(error)) => {
                    tracing::warn!(%job, attempt, "cannot yet make sure that nothing runs of an attempt whose launch failed: {error}; trying again next round")
                }
                Err(_) => {
                    tracing::warn!(%job, attempt, "the runtime did not say within {OBSERVE_CALL_MS} ms whether anything runs of an attempt whose launch failed; asking again next round")
                }
            }
        }
        for (key, status) in answers {
            let Some(tracked) = self.jobs.get_mut(&key) else {
                continue;
            };
            let Ok(status) = status else {
                tracing::warn!(job = %tracked.local.job, attempt = tracked.local.attempt, "the runtime did not say within {OBSERVE_CALL_MS} ms whether the attempt runs; asking again next round");
                continue;
            };
            match status {
                Ok(JobStatus::Running) => {}
                Ok(JobStatus::Exited { code }) => {
                    tracing::info!(job = %tracked.local.job, attempt = tracked.local.attempt, ?code, "attempt exited");
                    tracked.local.phase = LocalPhase::Exited { code };
                    if self.runtime.stopped_by_watchdog(&tracked.handle) {
                        tracing::info!(job = %tracked.local.job, attempt = tracked.local.attempt, "its watchdog had stopped it (the agent's lease ran out): reported as stopped by the agent");
                        tracked.local.killed = true;
                    }
                }
                Err(error) => {
                    tracing::warn!(job = %tracked.local.job, "cannot read the attempt's status: {error}")
                }
            }
        }
    }

    /// One round: observe, reconcile against `desired`, act. Returns the reports to send.
    pub async fn step(&mut self, desired: &Desired) -> Vec<JobReport> {
        self.step_with(Some(desired)).await
    }

    /// A round without a desired state (none received yet, or the last one was dropped):
    /// exits are reported and due kills done, but nothing is started, adopted or stopped.
    pub async fn step_idle(&mut self) -> Vec<JobReport> {
        self.step_with(None).await
    }

    /// A round that stops every attempt here, as the self-fencing lease demands: the
    /// checkpoint signal, then a kill once the grace period has passed (found attempts are
    /// adopted first so that they get their signal too). Starts nothing.
    pub async fn stop_all(&mut self) -> Vec<JobReport> {
        let allocations = self
            .jobs
            .values()
            .filter(|tracked| !matches!(tracked.local.phase, LocalPhase::Exited { .. }))
            .map(|tracked| DesiredAllocation {
                job: tracked.local.job,
                attempt: tracked.local.attempt,
                gpu_indices: Vec::new(),
                // Never read for a stop: reconcile only starts `Run` allocations.
                spec: JobSpec::new("self-fencing", 0, 0, Vec::new()),
                intent: Intent::Stop,
                limits: crate::runtime::JobLimits::NONE,
                gang: None,
            })
            .collect();
        let desired = Desired {
            fence: self.fence.unwrap_or(0),
            allocations,
        };
        self.step_with(Some(&desired)).await
    }

    async fn step_with(&mut self, desired: Option<&Desired>) -> Vec<JobReport> {
        if !self.unlisted.is_empty()
            && self.now_ms().saturating_sub(self.unlisted_looked_ms) >= RELIST_MS
        {
            self.unlisted_looked_ms = self.now_ms();
            if let Err(error) = self.look_for_own(true).await {
                tracing::warn!(
                    "cannot look for the attempts of this agent's earlier life: {error}"
                );
            }
        }
        self.observe().await;
        let mut reports = Vec::new();
        self.watch_checkpoints(&mut reports);
        let local: Vec<LocalJob> = self.jobs.values().map(|t| t.local.clone()).collect();
        // Without a desired state, reconcile sees one older than any it acted on, which it
        // ignores: only exits and due kills are handled.
        let stale = Desired {
            fence: 0,
            allocations: Vec::new(),
        };
        // Attempts of an earlier life not yet looked for are left out: neither started, nor
        // reported stopped when asked to stop (they may run on, in a container not listed).
        let known;
        let desired = match desired {
            Some(desired) if !self.unlisted.is_empty() => {
                known = Desired {
                    fence: desired.fence,
                    allocations: desired
                        .allocations
                        .iter()
                        .filter(|a| !self.unlisted.contains(&(a.job, a.attempt)))
                        .cloned()
                        .collect(),
                };
                Some(&known)
            }
            desired => desired,
        };
        let (desired_now, fence) = match desired {
            Some(desired) => (desired, self.fence),
            None => (&stale, Some(1)),
        };
        let decision = reconcile::reconcile(Input {
            desired: desired_now,
            fence,
            local: &local,
            finished: &self.finished,
            answered: &self.answered,
            now_ms: self.now_ms(),
        });
        if let Some(desired) = desired {
            if !decision.accepted {
                tracing::warn!(
                    fence = desired.fence,
                    fence = ?self.fence,
                    "ignoring a desired state from an older fence"
                );
            }
            self.fence = decision.fence;
            if decision.accepted {
                // Answers are kept while the attempts are still asked for.
                self.answered.retain(|key| {
                    desired
                        .allocations
                        .iter()
                        .any(|allocation| (allocation.job, allocation.attempt) == *key)
                });
                // A launch no longer desired is not tried again.
                self.launch_retries.retain(|key, _| {
                    desired.allocations.iter().any(|allocation| {
                        (allocation.job, allocation.attempt) == *key
                            && allocation.intent == Intent::Run
                    })
                });
            }
        }
        for action in decision.actions {
            self.act(action, &mut reports).await;
        }
        reports
    }

    /// Reports `Checkpointed` for each running attempt whose checkpoint directory holds a
    /// checkpoint newer than the last one seen (`crate::checkpoints`), and forgets the
    /// attempts no longer running.
    fn watch_checkpoints(&mut self, reports: &mut Vec<JobReport>) {
        let now = self.now_ms();
        let running: Vec<(JobId, u32)> = self
            .jobs
            .values()
            .filter(|tracked| tracked.local.phase == LocalPhase::Running)
            .map(|tracked| (tracked.local.job, tracked.local.attempt))
            .collect();
        self.checkpoint_watches
            .retain(|job, attempt| running.contains(&(job, attempt)));
        for (job, attempt) in running {
            let dir = checkpoint_dir(&self.checkpoint_root, job);
            if self.checkpoint_watches.due(job, attempt, &dir, now) {
                tracing::debug!(%job, attempt, "the job checkpointed");
                self.report(reports, job, attempt, JobEvent::Checkpointed);
            }
        }
    }

    fn report(&self, reports: &mut Vec<JobReport>, job: JobId, attempt: u32, event: JobEvent) {
        reports.push(JobReport {
            job,
            attempt,
            node: self.node.clone(),
            event,
        });
    }

    /// Records that an attempt ran here and exited: it is never started again. The session
    /// seeds this from its journal after a restart.
    pub fn remember_finished(&mut self, job: JobId, attempt: u32) {
        self.finished.insert((job, attempt));
        while self.finished.len() > FINISHED_ATTEMPTS_MAX {
            self.finished.pop_first();
        }
    }

    /// The `tries`-th launch of an attempt failed: try again after a backoff, or give up,
    /// never start it again, and report it.
    fn launch_failed(
        &mut self,
        reports: &mut Vec<JobReport>,
        job: JobId,
        attempt: u32,
        tries: u32,
        error: RuntimeError,
    ) {
        let fault = error.launch_fault();
        if tries < LAUNCH_TRIES_MAX {
            let wait_ms = launch_backoff_ms(tries);
            tracing::warn!(%job, attempt, tries, %fault, "launch failed; trying again in {wait_ms} ms: {error}");
            let next_try_ms = self.now_ms().saturating_add(wait_ms);
            self.launch_retries
                .insert((job, attempt), LaunchRetry { tries, next_try_ms });
            return;
        }
        tracing::error!(%job, attempt, tries, %fault, "launch failed; giving up on this attempt and reporting it: {error}");
        self.launch_retries.remove(&(job, attempt));
        self.remember_finished(job, attempt);
        // Its failure is the answer to the desired state that still asks for it.
        self.answered.insert((job, attempt));
        self.report(
            reports,
            job,
            attempt,
            JobEvent::LaunchFailed {
                fault,
                tries,
                message: bounded_launch_message(&error.to_string()),
            },
        );
    }

    async fn act(&mut self, action: Action, reports: &mut Vec<JobReport>) {
        match action {
            Action::Start {
                job,
                attempt,
                gpu_indices,
                spec,
                limits,
                gang,
            } => {
                if self.jobs.len() >= LOCAL_ATTEMPTS_MAX {
                    tracing::error!(%job, "too many attempts on this node; not starting");
                    return;
                }
                let retry = self.launch_retries.get(&(job, attempt)).copied();
                if retry.is_some_and(|retry| self.now_ms() < retry.next_try_ms) {
                    return;
                }
                let gpu_uuids = gpu_indices
                    .iter()
                    .map(|index| {
                        self.gpu_uuids
                            .get(index)
                            .cloned()
                            .unwrap_or_else(|| format!("GPU-index-{index}"))
                    })
                    .collect();
                let one_node = gang.is_none();
                let launch = LaunchSpec {
                    job,
                    attempt,
                    payload: spec.payload.clone(),
                    env: spec.env.to_map(),
                    gpu_indices,
                    gpu_uuids,
                    checkpoint_dir: checkpoint_dir(&self.checkpoint_root, job),
                    work_dir: work_dir(&self.state_dir, job, attempt),
                    log_path: log_path(&self.state_dir, job, attempt),
                    checkpoint_signal: spec.checkpoint_signal,
                    grace_period_ms: spec.grace_period_ms,
                    limits,
                    rendezvous: match gang {
                        Some(gang) => Rendezvous::member(*gang),
                        None => Rendezvous::single(self.advertise_address.as_deref(), free_port()),
                    },
                };
                // On record before it can run: an agent restarted never starts it again.
                if let Some(at) = self.boot_ms() {
                    self.started_records.keep(job, attempt, at);
                }
                match self
                    .within("start", START_CALL_MS, self.runtime.start(&launch))
                    .await
                {
                    Ok(handle) => {
                        self.launch_retries.remove(&(job, attempt));
                        self.unsettled.remove(&(job, attempt));
                        if one_node {
                            self.single_node.insert((job, attempt));
                        }
                        self.jobs.insert(
                            (job, attempt),
                            LocalAttempt {
                                handle,
                                local: LocalJob {
                                    job,
                                    attempt,
                                    phase: LocalPhase::Running,
                                    signalled_at_ms: None,
                                    killed: false,
                                    checkpoint_signal: spec.checkpoint_signal,
                                    grace_period_ms: spec.grace_period_ms,
                                },
                            },
                        );
                        self.report(reports, job, attempt, JobEvent::Started);
                        self.report(reports, job, attempt, JobEvent::Running);
                    }
                    Err(error) => {
                        if error.unsettled() {
                            self.unsettled.insert(
                                (job, attempt),
                                Unsettled {
                                    container: launch.payload.image.is_some(),
                                    quiet_since_ms: None,
                                },
                            );
                            while self.unsettled.len() > UNSETTLED_LAUNCHES_MAX {
                                if let Some(((job, attempt), _)) = self.unsettled.pop_first() {
                                    tracing::error!(%job, attempt, "too many failed launches left to settle; no longer making sure that nothing of this one runs");
                                }
                            }
                        }
                        let tries = retry.map_or(0, |retry| retry.tries) + 1;
                        self.launch_failed(reports, job, attempt, tries, error);
                    }
                }
            }
            Action::Adopt { job, attempt } => {
                if let Some(tracked) = self.jobs.get_mut(&(job, attempt)) {
                    tracked.local.phase = LocalPhase::Running;
                    tracing::info!(%job, attempt, "adopted a running attempt");
                    self.report(reports, job, attempt, JobEvent::Running);
                }
            }
            Action::SignalCheckpoint {
                job,
                attempt,
                signal,
            } => {
                let now = self.now_ms();
                let boot_ms = self.boot_ms();
                let signalled = match self.jobs.get(&(job, attempt)) {
                    Some(tracked) => Some(
                        self.within(
                            "signal",
                            ACT_CALL_MS,
                            self.runtime.signal(&tracked.handle, signal),
                        )
                        .await,
                    ),
                    None => None,
                };
                if let (Some(tracked), Some(signalled)) =
                    (self.jobs.get_mut(&(job, attempt)), signalled)
                {
                    match signalled {
                        Ok(()) => {
                            tracing::info!(%job, attempt, %signal, "sent the checkpoint signal")
                        }
                        // It may have reached the job all the same, which may exit on it:
                        // that exit is the agent's stop, not the job's own end (found by a
                        // test: a job that exits 0 on its signal was reported succeeded).
                        // The grace period counts from now, and a kill follows it.
                        Err(error) if error.unsettled() => {
                            tracing::warn!(%job, attempt, %signal, "the checkpoint signal may not have reached the job ({error}); it is killed at the end of its grace period if it has not exited")
                        }
                        Err(error) => {
                            tracing::warn!(%job, "cannot signal: {error}");
                            return;
                        }
                    }
                    tracked.local.signalled_at_ms = Some(now);
                    if let Some(at) = boot_ms {
                        self.signal_records.keep(job, attempt, at);
                    }
                    if tracked.local.phase == LocalPhase::Found {
                        tracked.local.phase = LocalPhase::Running;
                    }
                }
            }
            Action::Kill { job, attempt } | Action::KillUnknown { job, attempt } => {
                let now = self.now_ms();
                let killed = match self.jobs.get(&(job, attempt)) {
                    Some(tracked) => Some(
                        self.within("kill", ACT_CALL_MS, self.runtime.kill(&tracked.handle))
                            .await,
                    ),
                    None => None,
                };
                if let (Some(tracked), Some(killed)) = (self.jobs.get_mut(&(job, attempt)), killed)
                {
                    match killed {
                        Ok(()) => {
                            tracing::info!(%job, attempt, "killed");
                            tracked.local.killed = true;
                            tracked.local.signalled_at_ms.get_or_insert(now);
                            if tracked.local.phase == LocalPhase::Found {
                                tracked.local.phase = LocalPhase::Running;
                            }
                        }
                        Err(error) => tracing::warn!(%job, "cannot kill: {error}"),
                    }
                }
            }
            Action::Report {
                job,
                attempt,
                event,
            } => {
                if matches!(
                    event,
                    JobEvent::Exited { .. } | JobEvent::ExitedAfterSignal { .. }
                ) {
                    self.remember_finished(job, attempt);
                }
                // Its end, or the answer to a desired state asking for it again, is told:
                // desired states made before the coordinators applied it get no other answer.
                if self.finished.contains(&(job, attempt)) {
                    self.answered.insert((job, attempt));
                }
                // A failed SageMaker job may have said why (`/opt/ml/output/failure`); else
                // the runtime may tell (the out-of-memory killer, a command not found).
                let event = match event {
                    JobEvent::Exited { code } if code != 0 => {
                        let work = work_dir(&self.state_dir, job, attempt);
                        let reason = match crate::runtime::sagemaker::failure_reason(&work) {
                            Some(reason) => Some(reason),
                            None => match self.jobs.get(&(job, attempt)) {
                                Some(tracked) => self
                                    .within("exit reason", ACT_CALL_MS, async {
                                        Ok(self.runtime.exit_reason(&tracked.handle, code).await)
                                    })
                                    .await
                                    .ok()
                                    .flatten(),
                                None => None,
                            },
                        };
                        match reason {
                            Some(reason) => JobEvent::ExitedWithReason { code, reason },
                            None => JobEvent::Exited { code },
                        }
                    }
                    event => event,
                };
                self.report(reports, job, attempt, event);
            }
            Action::Forget { job, attempt } => {
                // Its exit is reported: stop tracking it even if the runtime cannot remove its
                // record now, so that it is never reported twice in this life.
                self.signal_records.forget(job, attempt);
                self.started_records.forget(job, attempt);
                // Found by probing a long churn: one empty directory per attempt in `work/`,
                // and with a shared checkpoint root (no retention by default) one per job,
                // were kept for ever. Only empty ones go (`remove_dir` leaves any other).
                let _ = std::fs::remove_dir(work_dir(&self.state_dir, job, attempt));
                if self.single_node.remove(&(job, attempt)) {
                    let _ = std::fs::remove_dir(checkpoint_dir(&self.checkpoint_root, job));
                }
                if let Some(tracked) = self.jobs.remove(&(job, attempt)) {
                    if let Some(deferred) = self.deferred_removals.as_mut() {
                        deferred.push(tracked.handle);
                        return;
                    }
                    let removed = self
                        .within("remove", ACT_CALL_MS, self.runtime.remove(&tracked.handle))
                        .await;
                    if let Err(error) = removed {
                        tracing::warn!(%job, attempt, "cannot remove the exited attempt's record: {error}");
                    }
                }
            }
        }
    }
}
