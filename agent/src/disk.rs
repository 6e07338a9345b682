//! The agent's disk: how much of its jobs' logs and checkpoint dirs it keeps, for how long,
//! and how much that is. [`DiskKeeper`] holds the rules; [`run`] applies them off the
//! executor's path, on blocking threads.
//!
//! - **A cap on each attempt's log** (`--log-max-bytes`, [`cap_log`]). A process job writes
//!   its log itself: the file is its stdout and stderr, so it writes on while the agent
//!   restarts (a pipe through the agent would break, and the job with it). Every
//!   [`LOG_CAP_INTERVAL_MS`] the agent looks at the logs of the attempts it tracks, and once
//!   more when one ends; a log holding more than the cap gets a hole punched in its middle
//!   (`fallocate(PUNCH_HOLE | KEEP_SIZE)`): the first [`LOG_HEAD_PARTS`]th of the cap and the
//!   newest rest stay, in whole filesystem blocks, and the middle takes no disk. The file
//!   keeps its length, so an offset names the same byte as before (`quotient job logs
//!   --follow` goes on where it was) and the job goes on writing at its own offset. The log
//!   reader ([`crate::log_server`]) shows the hole as one line, [`dropped_marker`]. A job may
//!   write one interval's output past the cap before it is cut back. Rejected: truncating or
//!   renaming the file (the job's descriptor keeps writing at its offset, so the start would
//!   be lost, or the renamed file would grow on), copying the ends to a new file (the job
//!   writes into the old one). On a filesystem that cannot punch holes (`EOPNOTSUPP`) logs
//!   stay whole and the agent says so once. A container's log is the same kind of file,
//!   written by the agent's follower ([`crate::runtime::docker`]), and capped the same way.
//! - **Retention** ([`DiskKeeper::sweep`], `--log-retention`, `--checkpoint-retention`). A
//!   job's logs (`<state_dir>/logs/<job>-<attempt>.log`) and its attempts' working dirs
//!   (`work/<job>-<attempt>` in the state dir, kept as long as the logs), and its checkpoint dir
//!   (`<checkpoint_root>/<job>`) are removed once this node last ran an attempt of the job
//!   longer ago than the retention. When it last ran is the newest modification time of those
//!   files: the job's writes move it, and the agent sets it to now when an attempt ends here,
//!   so a job that printed nothing for days is not "old" the moment it ends. Nothing is
//!   removed of a job the agent tracks an attempt of, or that the current desired state lists
//!   (it may be placed here again and resume from its checkpoint), and nothing at all while
//!   the agent has no desired state (after a start, or while self-fencing: it cannot tell).
//!   The executor loop marks jobs in use ([`DiskKeeper::set_in_use`]) under the lock the
//!   sweep holds while it unlinks a job's logs and renames its checkpoint dir away (deleted
//!   after the lock is released), so a job placed here during a sweep never loses a file it
//!   is about to use.
//! - **Disk use** ([`DiskUsage`]): measured at every sweep (every [`SWEEP_INTERVAL_MS`], and at
//!   once when a desired state first arrives), logged when the sweep removed something, and
//!   sent to the leader ([`crate::session`]) for `quotient node list`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use quotient_common::agent_api::DiskUsage;
use quotient_common::JobId;
use tokio::sync::watch;

use crate::config::{DiskSettings, Retention};
use crate::reconcile::Desired;
use crate::runtime::{checkpoint_dir, log_path, work_dir, LOGS_DIR, WORK_DIR};

/// How often the logs of running attempts are checked against the cap (milliseconds).
pub const LOG_CAP_INTERVAL_MS: u64 = 1_000;
/// How often old files are removed and the disk use measured (milliseconds).
pub const SWEEP_INTERVAL_MS: u64 = 60_000;
/// A capped log keeps the first 1/`LOG_HEAD_PARTS` of the cap (how the job started: its
/// configuration, its first errors) and the newest rest (where it is now).
pub const LOG_HEAD_PARTS: u64 = 4;
/// The most entries one sweep looks at in the logs dir and in the checkpoint root each; more
/// wait for the next sweep.
pub const SWEEP_ENTRIES_MAX: usize = 100_000;
/// The most removed jobs one log line names (the count is always there).
pub const REMOVED_JOBS_NAMED_MAX: usize = 20;
/// The most files and dirs one measurement of a tree counts; past it the use reported is a
/// lower bound (and the agent says so).
pub const MEASURE_ENTRIES_MAX: u64 = 1_000_000;
/// The name a checkpoint dir is renamed to before it is deleted starts with this (never a job
/// id); a leftover from a crash is deleted by the next sweep.
pub const REMOVING_PREFIX: &str = ".removing-";

/// The line the log reader shows in place of the `bytes` a capped log dropped.
pub fn dropped_marker(bytes: u64) -> String {
    format!("[... {bytes} bytes dropped ...]\n")
}

/// Caps the log at `path` to about `max_bytes` on disk: when it holds more, punches a hole
/// between its first `max_bytes / LOG_HEAD_PARTS` and its newest rest, both rounded to whole
/// filesystem blocks inwards (so it keeps at most `max_bytes` plus two blocks). Returns
/// whether it dropped anything now. A missing file is fine; a filesystem without hole
/// punching gives `EOPNOTSUPP`.
pub fn cap_log(path: &Path, max_bytes: u64) -> io::Result<bool> {
    // Opened here, never shared with the job: its offset is not the job's.
    let file = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    let metadata = file.metadata()?;
    if metadata.len() <= max_bytes || allocated_bytes(&metadata) <= max_bytes {
        return Ok(false);
    }
    let block = metadata.blksize().max(512);
    let head_end = (max_bytes / LOG_HEAD_PARTS).div_ceil(block) * block;
    let tail_bytes = max_bytes - max_bytes / LOG_HEAD_PARTS;
    let tail_start = metadata.len().saturating_sub(tail_bytes) / block * block;
    if tail_start <= head_end {
        return Ok(false);
    }
    match seek(&file, head_end, libc::SEEK_DATA)? {
        Some(data) if data < tail_start => {}
        // Dropped already, up to where the tail starts now.
        _ => return Ok(false),
    }
    let (offset, length) = (as_offset(head_end)?, as_offset(tail_start - head_end)?);
    // SAFETY: fallocate(2) on a descriptor this function owns, with plain integers.
    let result = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            length,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

/// Where a dropped span of a capped log that covers `offset` ends, if `offset` is in one.
/// Needs a descriptor of the reader's own (it moves the offset).
pub fn dropped_until(file: &File, offset: u64, length: u64) -> io::Result<Option<u64>> {
    if offset >= length {
        return Ok(None);
    }
    // No data from `offset` to the end would be a hole reaching the end; a capped log always
    // keeps its newest part, so that is a file that only grew by a seek: not dropped.
    match seek(file, offset, libc::SEEK_DATA)? {
        Some(data) if data > offset && data < length => Ok(Some(data)),
        _ => Ok(None),
    }
}

/// Where the data that holds `offset` ends: the next dropped span, or the end of the file.
pub fn data_until(file: &File, offset: u64, length: u64) -> io::Result<u64> {
    Ok(seek(file, offset, libc::SEEK_HOLE)?
        .unwrap_or(length)
        .min(length))
}

/// lseek(2) with SEEK_DATA or SEEK_HOLE: `None` past the end (ENXIO). A filesystem without
/// them answers as if the file were all data, which is right for a log never capped.
fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek(2) on a descriptor the caller owns, with plain integers.
    let result = unsafe { libc::lseek(file.as_raw_fd(), as_offset(offset)?, whence) };
    if result < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(error),
        };
    }
    Ok(Some(result as u64))
}

fn as_offset(value: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(value)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))
}

/// The bytes a file takes on disk: its allocated blocks, not its length.
fn allocated_bytes(metadata: &std::fs::Metadata) -> u64 {
    metadata.blocks().saturating_mul(512)
}

/// Sets a file's or dir's modification time to now: this node ran the job just now. A
/// missing one is fine.
fn touch(path: &Path) -> io::Result<()> {
    match File::open(path) {
        Ok(file) => file.set_modified(SystemTime::now()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// The job and attempt of a log file's name, `<job>-<attempt>.log`.
fn parse_log_name(name: &str) -> Option<(JobId, u32)> {
    let (job, attempt) = name.strip_suffix(".log")?.rsplit_once('-')?;
    Some((job.parse().ok()?, attempt.parse().ok()?))
}

/// The bytes a tree takes on disk (symbolic links are not followed), counting at most
/// `budget` entries; the second value says whether it counted all of them.
///
/// Files are counted as their folder is read, and only folders wait their turn, so what it
/// holds grows with the folders of the tree, not its files (found by a soak: holding a path
/// per file, each minute's measure of 100,000 logs took megabytes, which the allocator then
/// kept, and the agent's memory grew with its logs for the days of their retention).
fn tree_bytes(root: &Path, budget: &mut u64) -> (u64, bool) {
    let Ok(metadata) = std::fs::symlink_metadata(root) else {
        return (0, true);
    };
    if *budget == 0 {
        return (0, false);
    }
    *budget -= 1;
    let mut total = allocated_bytes(&metadata);
    let mut pending = Vec::new();
    if metadata.is_dir() {
        pending.push(root.to_path_buf());
    }
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if *budget == 0 {
                return (total, false);
            }
            *budget -= 1;
            // An entry's own metadata: a symbolic link is not followed.
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            total = total.saturating_add(allocated_bytes(&metadata));
            if metadata.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    (total, true)
}

/// Free and total bytes of the filesystem holding `path`, for an unprivileged user.
fn filesystem_bytes(path: &Path) -> io::Result<(u64, u64)> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: statvfs(3) fills the zeroed struct it is given; the path is NUL-terminated.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = stats.f_frsize as u64;
    Ok((
        (stats.f_bavail as u64).saturating_mul(unit),
        (stats.f_blocks as u64).saturating_mul(unit),
    ))
}

/// Whether files last used `age` ago are past `retention`.
fn expired(retention: Retention, age: Duration) -> bool {
    retention
        .after_ms
        .is_some_and(|ms| age > Duration::from_millis(ms))
}

/// What the executor loop last said is in use.
#[derive(Debug, Default)]
struct InUse {
    /// The agent has a desired state; without one nothing is removed.
    desired_known: bool,
    /// Jobs with a tracked attempt or in the desired state.
    jobs: BTreeSet<JobId>,
    /// The attempts tracked, whose logs are capped.
    attempts: BTreeSet<(JobId, u32)>,
    /// Attempts no longer tracked whose log has not had its last cap and whose files have not
    /// been marked as run now; their jobs count as in use until then.
    ended: BTreeSet<(JobId, u32)>,
}

impl InUse {
    fn holds(&self, job: JobId) -> bool {
        self.jobs.contains(&job) || self.ended.iter().any(|(ended, _)| *ended == job)
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Jobs whose logs or checkpoint dir were removed.
    pub removed_jobs: Vec<JobId>,
    /// The bytes those took.
    pub freed_bytes: u64,
    pub usage: DiskUsage,
}

/// A job's files found by a sweep.
#[derive(Debug, Default)]
struct JobFiles {
    /// Whether it has logs (its working dirs and checkpoint dir are kept beside).
    has_logs: bool,
    /// The newest modification time among its files.
    last_ran: Option<SystemTime>,
}

impl JobFiles {
    fn saw(&mut self, modified: Option<SystemTime>) {
        if let Some(modified) = modified {
            self.last_ran = Some(self.last_ran.map_or(modified, |last| last.max(modified)));
        }
    }
}

/// The agent's rules for its jobs' files (see the module docs). Shared by the executor loop,
/// which says what is in use, and [`run`], which does the file work.
#[derive(Debug)]
pub struct DiskKeeper {
    settings: DiskSettings,
    state_dir: PathBuf,
    checkpoint_root: PathBuf,
    in_use: Mutex<InUse>,
    /// A desired state arrived after none: sweep at the next tick rather than in a minute.
    sweep_soon: AtomicBool,
    /// The agent said already that this filesystem cannot punch holes.
    said_unsupported: AtomicBool,
}

impl DiskKeeper {
    pub fn new(settings: DiskSettings, state_dir: &Path, checkpoint_root: &Path) -> DiskKeeper {
        DiskKeeper {
            settings,
            state_dir: state_dir.to_path_buf(),
            checkpoint_root: checkpoint_root.to_path_buf(),
            in_use: Mutex::new(InUse::default()),
            sweep_soon: AtomicBool::new(false),
            said_unsupported: AtomicBool::new(false),
        }
    }

    fn in_use(&self) -> MutexGuard<'_, InUse> {
        self.in_use.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The executor loop says what is in use: the desired state (`None`: none yet, or dropped
    /// while self-fencing) and the attempts it tracks. Attempts no longer tracked have ended:
    /// their logs get a last cap and their files are marked as run now, at the next tick.
    pub fn set_in_use(
        &self,
        desired: Option<&Desired>,
        tracked: impl Iterator<Item = (JobId, u32)>,
    ) {
        let attempts: BTreeSet<(JobId, u32)> = tracked.collect();
        let mut jobs: BTreeSet<JobId> = attempts.iter().map(|(job, _)| *job).collect();
        if let Some(desired) = desired {
            jobs.extend(desired.allocations.iter().map(|allocation| allocation.job));
        }
        let mut in_use = self.in_use();
        if desired.is_some() && !in_use.desired_known {
            self.sweep_soon.store(true, Ordering::SeqCst);
        }
        let ended: Vec<(JobId, u32)> = in_use.attempts.difference(&attempts).copied().collect();
        in_use.ended.extend(ended);
        in_use.desired_known = desired.is_some();
        in_use.jobs = jobs;
        in_use.attempts = attempts;
    }

    /// Caps the logs of the attempts tracked, and of those that ended since the last call,
    /// whose files are then marked as run now.
    pub fn cap_logs(&self) {
        let (attempts, ended) = {
            let in_use = self.in_use();
            (in_use.attempts.clone(), in_use.ended.clone())
        };
        for (job, attempt) in attempts.iter().chain(&ended) {
            self.cap(&log_path(&self.state_dir, *job, *attempt), *job, *attempt);
        }
        for (job, attempt) in &ended {
            for path in [
                log_path(&self.state_dir, *job, *attempt),
                work_dir(&self.state_dir, *job, *attempt),
                checkpoint_dir(&self.checkpoint_root, *job),
            ] {
                if let Err(error) = touch(&path) {
                    tracing::warn!(%job, attempt, path = %path.display(), "cannot mark the file as just used, so retention counts from its last write: {error}");
                }
            }
        }
        let mut in_use = self.in_use();
        for ended in &ended {
            in_use.ended.remove(ended);
        }
    }

    fn cap(&self, path: &Path, job: JobId, attempt: u32) {
        match cap_log(path, self.settings.log_max_bytes) {
            Ok(true) => {
                tracing::debug!(%job, attempt, log_max_bytes = self.settings.log_max_bytes, "dropped the middle of a log over the cap")
            }
            Ok(false) => {}
            Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                if !self.said_unsupported.swap(true, Ordering::SeqCst) {
                    tracing::warn!(path = %path.display(), "this filesystem cannot punch holes in files, so logs are not capped at --log-max-bytes: keep the state dir on ext4, XFS, btrfs or tmpfs");
                }
            }
            Err(error) => {
                tracing::warn!(%job, attempt, path = %path.display(), "cannot cap the log: {error}")
            }
        }
    }

    /// Whether a sweep is wanted before its interval is up, and forgets the wish.
    pub fn take_sweep_soon(&self) -> bool {
        self.sweep_soon.swap(false, Ordering::SeqCst)
    }

    /// Removes the files of jobs this node last ran longer ago than their retention (and not
    /// in use), caps every log found over the cap, and measures the disk use.
    ///
    /// Two passes over the logs: the first keeps a few bytes per job (when it last ran, what
    /// its logs take), the second removes the logs of the jobs found expired, each checked
    /// again against what is in use as it goes. Nothing is kept per log (see [`tree_bytes`]).
    pub fn sweep(&self, now: SystemTime) -> Sweep {
        let mut jobs: BTreeMap<JobId, JobFiles> = BTreeMap::new();
        let logs_dir = self.state_dir.join(LOGS_DIR);
        for (job, attempt, path, metadata) in self.own_logs(&logs_dir) {
            self.cap(&path, job, attempt);
            let files = jobs.entry(job).or_default();
            files.saw(metadata.modified().ok());
            files.has_logs = true;
        }
        let work_root = self.state_dir.join(WORK_DIR);
        let mut work_dirs: BTreeMap<JobId, Vec<PathBuf>> = BTreeMap::new();
        let found_work_dirs = job_dirs(&work_root, |name| {
            parse_log_name(&format!("{name}.log")).map(|(job, _)| job)
        });
        for (job, path, modified) in found_work_dirs {
            jobs.entry(job).or_default().saw(modified);
            work_dirs.entry(job).or_default().push(path);
        }
        let mut checkpoint_dirs: BTreeMap<JobId, PathBuf> = BTreeMap::new();
        for (job, path, modified) in
            job_dirs(&self.checkpoint_root, |name| name.parse::<JobId>().ok())
        {
            jobs.entry(job).or_default().saw(modified);
            checkpoint_dirs.insert(job, path);
        }

        let mut sweep = Sweep::default();
        // Jobs whose logs go, in the second pass.
        let mut expired_logs = BTreeSet::new();
        for (job, files) in jobs {
            let age = files
                .last_ran
                .and_then(|last| now.duration_since(last).ok())
                .unwrap_or(Duration::ZERO);
            let logs = expired(self.settings.log_retention, age)
                && (files.has_logs || work_dirs.contains_key(&job));
            let checkpoint = expired(self.settings.checkpoint_retention, age)
                && checkpoint_dirs.contains_key(&job);
            if !logs && !checkpoint {
                continue;
            }
            let mut renamed_work_dirs = Vec::new();
            let renamed = {
                let in_use = self.in_use();
                if !in_use.desired_known || in_use.holds(job) {
                    continue;
                }
                let dirs = work_dirs.get(&job).map(Vec::as_slice).unwrap_or_default();
                for dir in dirs.iter().filter(|_| logs) {
                    let Some(name) = dir.file_name().and_then(|name| name.to_str()) else {
                        continue;
                    };
                    let renamed =
                        work_root.join(format!("{REMOVING_PREFIX}{name}-{}", std::process::id()));
                    match std::fs::rename(dir, &renamed) {
                        Ok(()) => renamed_work_dirs.push(renamed),
                        Err(error) => {
                            tracing::warn!(%job, dir = %dir.display(), "cannot remove an old working dir: {error}")
                        }
                    }
                }
                if logs && files.has_logs {
                    expired_logs.insert(job);
                }
                match checkpoint_dirs.get(&job).filter(|_| checkpoint) {
                    Some(dir) => {
                        let renamed = self
                            .checkpoint_root
                            .join(format!("{REMOVING_PREFIX}{job}-{}", std::process::id()));
                        match std::fs::rename(dir, &renamed) {
                            Ok(()) => Some(renamed),
                            Err(error) => {
                                tracing::warn!(%job, dir = %dir.display(), "cannot remove an old checkpoint dir: {error}");
                                None
                            }
                        }
                    }
                    None => None,
                }
            };
            for renamed in renamed_work_dirs.into_iter().chain(renamed) {
                let mut budget = MEASURE_ENTRIES_MAX;
                sweep.freed_bytes += tree_bytes(&renamed, &mut budget).0;
                remove_tree(&renamed);
            }
            sweep.removed_jobs.push(job);
        }
        if !expired_logs.is_empty() {
            for (job, _, path, metadata) in self.own_logs(&logs_dir) {
                if !expired_logs.contains(&job) {
                    continue;
                }
                // In use again since the first pass (the job placed here anew): kept.
                let in_use = self.in_use();
                if !in_use.desired_known || in_use.holds(job) {
                    continue;
                }
                match std::fs::remove_file(&path) {
                    Ok(()) => sweep.freed_bytes += allocated_bytes(&metadata),
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    Err(error) => {
                        tracing::warn!(%job, path = %path.display(), "cannot remove an old log: {error}")
                    }
                }
            }
        }
        sweep.usage = self.measure();
        sweep
    }

    /// What the logs (with the working dirs) and checkpoint dirs take, and what the state dir's filesystem has left.
    pub fn measure(&self) -> DiskUsage {
        let mut budget = MEASURE_ENTRIES_MAX;
        let (logs_bytes, logs_whole) = tree_bytes(&self.state_dir.join(LOGS_DIR), &mut budget);
        // The attempts' working dirs count with the logs they are kept with.
        let (work_bytes, work_whole) = tree_bytes(&self.state_dir.join(WORK_DIR), &mut budget);
        let (logs_bytes, logs_whole) = (
            logs_bytes.saturating_add(work_bytes),
            logs_whole && work_whole,
        );
        let mut budget = MEASURE_ENTRIES_MAX;
        let (checkpoints_bytes, checkpoints_whole) = tree_bytes(&self.checkpoint_root, &mut budget);
        if !logs_whole || !checkpoints_whole {
            tracing::warn!(
                "over {MEASURE_ENTRIES_MAX} files in the logs or checkpoints: their disk use is reported as what the first ones take"
            );
        }
        let (free_bytes, total_bytes) = filesystem_bytes(&self.state_dir).unwrap_or_else(|error| {
            tracing::warn!(state_dir = %self.state_dir.display(), "cannot read the state dir's filesystem size: {error}");
            (0, 0)
        });
        DiskUsage {
            logs_bytes,
            checkpoints_bytes,
            free_bytes,
            total_bytes,
        }
    }
}

impl DiskKeeper {
    /// The agent's own logs in `logs_dir` (at most [`SWEEP_ENTRIES_MAX`] entries looked at),
    /// one at a time: job, attempt, path and metadata. A file whose name the agent would not
    /// have given (`j-01-1.log`) is not one.
    fn own_logs(
        &self,
        logs_dir: &Path,
    ) -> impl Iterator<Item = (JobId, u32, PathBuf, std::fs::Metadata)> + '_ {
        read_dir_or_empty(logs_dir)
            .take(SWEEP_ENTRIES_MAX)
            .filter_map(|entry| {
                let name = entry.file_name();
                let (job, attempt) = name.to_str().and_then(parse_log_name)?;
                let metadata = entry.metadata().ok().filter(|m| m.is_file())?;
                let path = entry.path();
                (path == log_path(&self.state_dir, job, attempt))
                    .then_some((job, attempt, path, metadata))
            })
    }
}

/// The folders in `root` that `job_of` names a job by (at most [`SWEEP_ENTRIES_MAX`]
/// entries looked at), with their modification times. A folder renamed for removal by a sweep
/// that did not get to delete it is deleted now.
fn job_dirs(
    root: &Path,
    job_of: impl Fn(&str) -> Option<JobId>,
) -> Vec<(JobId, PathBuf, Option<SystemTime>)> {
    let mut dirs = Vec::new();
    for entry in read_dir_or_empty(root).take(SWEEP_ENTRIES_MAX) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if name.starts_with(REMOVING_PREFIX) {
            remove_tree(&entry.path());
            continue;
        }
        let Some(job) = job_of(name) else {
            continue;
        };
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        if metadata.is_dir() {
            dirs.push((job, entry.path(), metadata.modified().ok()));
        }
    }
    dirs
}

/// The entries of `dir`; none when it is missing or unreadable (said, unless missing).
fn read_dir_or_empty(dir: &Path) -> impl Iterator<Item = std::fs::DirEntry> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => Some(entries),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), "cannot list: {error}");
            None
        }
    };
    entries.into_iter().flatten().flatten()
}

fn remove_tree(path: &Path) {
    if let Err(error) = std::fs::remove_dir_all(path) {
        if error.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), "cannot remove: {error}");
        }
    }
}

/// Caps logs every [`LOG_CAP_INTERVAL_MS`] and sweeps every [`SWEEP_INTERVAL_MS`] (at once on
/// start, and when [`DiskKeeper::set_in_use`] first sees a desired state), publishing each
/// measurement on `usage`, until `stop` turns true.
pub async fn run(
    keeper: Arc<DiskKeeper>,
    usage: watch::Sender<Option<DiskUsage>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(LOG_CAP_INTERVAL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_sweep = Instant::now();
    loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => break,
            _ = tick.tick() => {}
        }
        let sweep_due = keeper.take_sweep_soon() || Instant::now() >= next_sweep;
        let worker = keeper.clone();
        let done = tokio::task::spawn_blocking(move || {
            worker.cap_logs();
            sweep_due.then(|| worker.sweep(SystemTime::now()))
        })
        .await;
        match done {
            Ok(Some(sweep)) => {
                next_sweep = Instant::now() + Duration::from_millis(SWEEP_INTERVAL_MS);
                if !sweep.removed_jobs.is_empty() {
                    let named: Vec<String> = sweep
                        .removed_jobs
                        .iter()
                        .take(REMOVED_JOBS_NAMED_MAX)
                        .map(JobId::to_string)
                        .collect();
                    tracing::info!(
                        jobs = sweep.removed_jobs.len(),
                        first = %named.join(","),
                        freed_bytes = sweep.freed_bytes,
                        logs_bytes = sweep.usage.logs_bytes,
                        checkpoints_bytes = sweep.usage.checkpoints_bytes,
                        free_bytes = sweep.usage.free_bytes,
                        "removed the logs and checkpoint dirs of jobs last run here longer ago than their retention"
                    );
                }
                usage.send_replace(Some(sweep.usage));
            }
            Ok(None) => {}
            Err(error) => tracing::error!("the disk task failed: {error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::{DesiredAllocation, Intent};
    use quotient_common::JobSpec;
    use std::io::Write;

    const CAP: u64 = 256 * 1024;

    fn settings(retention: Retention) -> DiskSettings {
        DiskSettings {
            log_max_bytes: CAP,
            log_retention: retention,
            checkpoint_retention: retention,
        }
    }

    /// `count` numbered lines, as a job would print them.
    fn lines(count: u32) -> Vec<u8> {
        (1..=count)
            .map(|n| format!("line {n:07} of the job's output\n"))
            .collect::<String>()
            .into_bytes()
    }

    fn desired(jobs: &[u64]) -> Desired {
        Desired {
            fence: 1,
            allocations: jobs
                .iter()
                .map(|job| DesiredAllocation {
                    job: JobId(*job),
                    attempt: 1,
                    gpu_indices: Vec::new(),
                    spec: JobSpec::new("qs", 1, 1, vec!["true".into()]),
                    intent: Intent::Run,
                    limits: crate::runtime::JobLimits::NONE,
                    gang: None,
                })
                .collect(),
        }
    }

    fn set_age(path: &Path, age: Duration) {
        File::open(path)
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
    }

    /// A log far over the cap keeps its start and its newest part, byte for byte and at their
    /// offsets, and takes no more than the cap and two blocks on disk; the reader's seeks
    /// find the dropped span.
    #[test]
    fn a_log_over_the_cap_keeps_its_start_and_newest_part() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j-1-1.log");
        let written = lines(200_000);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&written)
            .unwrap();
        assert!(cap_log(&path, CAP).unwrap(), "a log over the cap is cut");
        let metadata = std::fs::metadata(&path).unwrap();
        assert_eq!(metadata.len(), written.len() as u64, "the length stays");
        let block = metadata.blksize();
        assert!(
            allocated_bytes(&metadata) <= CAP + 2 * block,
            "{} bytes allocated for a cap of {CAP}",
            allocated_bytes(&metadata)
        );
        let kept = std::fs::read(&path).unwrap();
        let head = (CAP / LOG_HEAD_PARTS) as usize;
        assert_eq!(kept[..head], written[..head], "the start stays");
        let tail = (CAP - CAP / LOG_HEAD_PARTS - block) as usize;
        assert_eq!(
            kept[kept.len() - tail..],
            written[written.len() - tail..],
            "the newest part stays"
        );
        assert!(!cap_log(&path, CAP).unwrap(), "nothing more to drop");

        let file = File::open(&path).unwrap();
        let length = metadata.len();
        let head_end = data_until(&file, 0, length).unwrap();
        assert!(head_end as usize >= head && head_end < CAP, "{head_end}");
        let resumes = dropped_until(&file, head_end, length).unwrap().unwrap();
        assert!(length - resumes <= CAP, "{resumes}");
        assert_eq!(data_until(&file, resumes, length).unwrap(), length);
        assert_eq!(dropped_until(&file, 0, length).unwrap(), None);
    }

    /// A log under the cap is left whole.
    #[test]
    fn a_log_under_the_cap_is_left_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j-1-1.log");
        std::fs::write(&path, lines(1_000)).unwrap();
        assert!(!cap_log(&path, CAP).unwrap());
        assert!(!cap_log(&dir.path().join("missing.log"), CAP).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), lines(1_000));
    }

    /// Old files go only once a desired state is known and only for jobs not in use; recent
    /// ones, those of jobs in the desired state or with a tracked attempt stay, and an attempt
    /// that just ended makes its job's old files recent.
    #[test]
    fn retention_removes_only_old_files_of_jobs_not_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let checkpoints = state.join("checkpoints");
        let keeper = DiskKeeper::new(
            settings(Retention::after_ms(3_600_000)),
            &state,
            &checkpoints,
        );
        let old = Duration::from_secs(2 * 3_600);
        for job in 1..=5u64 {
            let log = log_path(&state, JobId(job), 1);
            std::fs::create_dir_all(log.parent().unwrap()).unwrap();
            std::fs::write(&log, lines(100)).unwrap();
            let checkpoint = checkpoint_dir(&checkpoints, JobId(job));
            std::fs::create_dir_all(&checkpoint).unwrap();
            std::fs::write(checkpoint.join("model.ckpt"), b"weights").unwrap();
            let work = work_dir(&state, JobId(job), 1);
            std::fs::create_dir_all(&work).unwrap();
            std::fs::write(work.join("scratch"), b"scratch").unwrap();
            if job != 3 {
                set_age(&log, old);
                set_age(&checkpoint, old);
                set_age(&work, old);
            }
        }
        let gone = |job: u64| {
            !log_path(&state, JobId(job), 1).exists()
                && !work_dir(&state, JobId(job), 1).exists()
                && !checkpoint_dir(&checkpoints, JobId(job)).exists()
        };
        let kept = |job: u64| {
            log_path(&state, JobId(job), 1).exists()
                && work_dir(&state, JobId(job), 1).join("scratch").exists()
                && checkpoint_dir(&checkpoints, JobId(job))
                    .join("model.ckpt")
                    .exists()
        };

        let sweep = keeper.sweep(SystemTime::now());
        assert!(sweep.removed_jobs.is_empty(), "no desired state yet");
        assert!(sweep.usage.logs_bytes > 0 && sweep.usage.checkpoints_bytes > 0);
        assert!(sweep.usage.free_bytes > 0 && sweep.usage.total_bytes >= sweep.usage.free_bytes);

        // j-2 is placed here, j-4 runs here, j-3 ran recently.
        keeper.set_in_use(Some(&desired(&[2])), [(JobId(4), 1)].into_iter());
        assert!(
            keeper.take_sweep_soon(),
            "the first desired state asks for a sweep"
        );
        let sweep = keeper.sweep(SystemTime::now());
        assert_eq!(sweep.removed_jobs, vec![JobId(1), JobId(5)]);
        assert!(sweep.freed_bytes > 0);
        assert!(gone(1) && gone(5));
        assert!(kept(2) && kept(3) && kept(4));
        let leftovers: Vec<_> = std::fs::read_dir(state.join(WORK_DIR))
            .unwrap()
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(REMOVING_PREFIX)
            })
            .collect();
        assert!(leftovers.is_empty(), "renamed work dirs are deleted");

        // j-4's attempt ends: its files count from now.
        keeper.set_in_use(Some(&desired(&[2])), std::iter::empty());
        let sweep = keeper.sweep(SystemTime::now());
        assert!(
            sweep.removed_jobs.is_empty(),
            "an attempt that just ended is in use until its files are marked"
        );
        keeper.cap_logs();
        let sweep = keeper.sweep(SystemTime::now());
        assert!(sweep.removed_jobs.is_empty(), "{:?}", sweep.removed_jobs);
        assert!(kept(4));

        // Without a desired state (self-fencing) nothing goes, however old.
        keeper.set_in_use(None, std::iter::empty());
        let sweep = keeper.sweep(SystemTime::now() + Duration::from_secs(100 * 3_600));
        assert!(sweep.removed_jobs.is_empty());
        keeper.set_in_use(Some(&desired(&[])), std::iter::empty());
        let sweep = keeper.sweep(SystemTime::now() + Duration::from_secs(100 * 3_600));
        assert_eq!(sweep.removed_jobs, vec![JobId(2), JobId(3), JobId(4)]);
    }

    /// Retention off keeps everything; a leftover of an interrupted removal goes.
    #[test]
    fn retention_off_keeps_files_and_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().to_path_buf();
        let checkpoints = state.join("checkpoints");
        let keeper = DiskKeeper::new(settings(Retention::OFF), &state, &checkpoints);
        let log = log_path(&state, JobId(1), 1);
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(&log, b"hello\n").unwrap();
        set_age(&log, Duration::from_secs(1_000 * 86_400));
        let leftover = checkpoints.join(format!("{REMOVING_PREFIX}j-9-1"));
        std::fs::create_dir_all(leftover.join("deep")).unwrap();
        keeper.set_in_use(Some(&desired(&[])), std::iter::empty());
        let sweep = keeper.sweep(SystemTime::now());
        assert!(sweep.removed_jobs.is_empty());
        assert!(log.exists());
        assert!(!leftover.exists());
    }

    /// Log names give their job and attempt; others are not logs of jobs.
    #[test]
    fn log_names_parse() {
        assert_eq!(parse_log_name("j-12-3.log"), Some((JobId(12), 3)));
        assert_eq!(parse_log_name("j-12.log"), None);
        assert_eq!(parse_log_name("notes.txt"), None);
    }
}
