//! Holding a process job to its CPUs and memory with a cgroup of its own.
//!
//! At start the agent sets up ([`Cgroups::set_up`]) a parent cgroup for its jobs,
//! `quotient-jobs`, and each attempt gets a child of it,
//! `quotient-jobs/<node>-<state>.<job>-<attempt>` (`<state>`: 8 hexadecimal digits hashed from
//! the agent's state dir, so that agents sharing a cgroup never touch each other's jobs;
//! see [`owner_name`]),
//! with the attempt's limits ([`JobLimits`]): CPU time (`cpu.max`, `<millis × 100> 100000`:
//! per 100 ms period) and memory (`memory.max`, with `memory.swap.max` 0 so the limit holds
//! swap included), and the number of its processes and threads (`pids.max`, the agent's
//! `--job-pids-max`, so that a fork bomb in one job cannot take every process id of the host
//! from the others and the agent; see [`default_pids_max`]). The job's first process enters it in the forked child before it execs
//! ([`JobCgroup::enter`]: one `write(2)` of `0` to `cgroup.procs`, async-signal-safe), so the
//! job and everything it forks is in it from its first instruction. Once the attempt has
//! exited and been reported, [`Cgroups::release`] logs whether the OOM killer killed in it,
//! kills whatever it left behind and removes it.
//!
//! # cgroups v2 (the unified hierarchy at `/sys/fs/cgroup`)
//! v2 forbids processes in a cgroup whose controllers are handed to its children ("no
//! internal processes"), so the agent cannot stay in the cgroup above its jobs:
//! - under systemd with `Delegate=yes` and `DelegateSubgroup=agent` the agent already runs in
//!   `<service cgroup>/agent`: the service cgroup is the base, `quotient-jobs` its other child;
//! - otherwise, when the agent is alone in its cgroup (`Delegate=yes` without
//!   `DelegateSubgroup`, or a plain process started in a cgroup of its own), it moves itself
//!   into a child `agent` first and uses its old cgroup as the base;
//! - in the root cgroup (a plain root process on a host without systemd, or in a container
//!   with its own cgroup namespace) `quotient-jobs` is made right there.
//!
//! The base must offer the `cpu` and `memory` controllers (`cgroup.controllers`), and the
//! agent enables them in the base's and `quotient-jobs`' `cgroup.subtree_control`, with
//! `pids` where the base offers it too.
//!
//! # cgroups v1 (legacy and hybrid hosts)
//! When `/sys/fs/cgroup` is not v2, the `cpu` and `memory` v1 hierarchies are used instead:
//! `quotient-jobs/<node>-<state>.<job>-<attempt>` under the agent's own cgroup in each, with
//! `cpu.cfs_quota_us`/`cpu.cfs_period_us` and `memory.limit_in_bytes` (and
//! `memory.memsw.limit_in_bytes` where swap is accounted), and in the `pids` hierarchy where
//! one is mounted (`pids.max`). v1 has no rule against internal
//! processes, so the agent stays where it is.
//!
//! Where the `pids` controller is missing, the agent says at start that the process limit is
//! not enforced ([`Cgroups::limits_pids`]).
//!
//! When neither works (not root, no delegation, another process sharing the agent's v2
//! cgroup) [`Cgroups::set_up`] says why, and the agent runs process jobs without limits and
//! says so once at start.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use quotient_common::JobId;

use super::JobLimits;

/// Where cgroups v2 is mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// The parent cgroup of the attempts' cgroups.
pub const JOBS_CGROUP: &str = "quotient-jobs";
/// The child the agent moves itself into under cgroups v2 (and `DelegateSubgroup=`).
pub const AGENT_CGROUP: &str = "agent";
/// The period of `cpu.max` and `cpu.cfs_period_us`, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel takes, in microseconds.
pub const CPU_QUOTA_MIN_US: u64 = 1_000;
/// How long [`Cgroups::release`] waits for the processes it killed to leave the cgroup.
pub const RELEASE_WAIT_MS: u64 = 2_000;

/// Which cgroup version holds the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// `quotient-jobs` in the unified hierarchy; `pids`: whether its `pids` controller is on.
    V2 { jobs: PathBuf, pids: bool },
    /// `quotient-jobs` in the memory and in the cpu hierarchy, and in the pids hierarchy
    /// where one is mounted.
    V1 {
        memory: PathBuf,
        cpu: PathBuf,
        pids: Option<PathBuf>,
    },
}

/// Where this agent puts its process jobs' cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    layout: Layout,
    /// What prefixes each attempt's cgroup: [`owner_name`].
    owner: String,
    /// The most processes and threads an attempt may have (`pids.max`), when limited.
    pids_max: Option<u64>,
}

/// An attempt's cgroup, ready for its first process to enter.
#[derive(Debug)]
pub struct JobCgroup {
    /// `cgroup.procs` of each hierarchy, opened by the agent (so the write is checked against
    /// the agent's credentials, not the job user's).
    procs: Vec<std::fs::File>,
}

impl JobCgroup {
    /// Moves the calling process into the cgroup. Meant for the forked child before it execs
    /// (`pre_exec`): it only calls `write(2)`, which is async-signal-safe.
    pub fn enter(&self) -> std::io::Result<()> {
        for file in &self.procs {
            // SAFETY: a write of one byte from a static buffer to a descriptor we own.
            let written = unsafe { libc::write(file.as_raw_fd(), b"0".as_ptr().cast(), 1) };
            if written != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

impl Cgroups {
    /// Sets the jobs' parent cgroup up (see the module docs), or says why limits cannot be
    /// enforced on this host.
    /// `owner` names this agent's attempts' cgroups ([`owner_name`]).
    pub fn set_up(owner: &str) -> Result<Cgroups, String> {
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|error| format!("cannot read /proc/self/cgroup: {error}"))?;
        let layout = if is_v2_mount(Path::new(CGROUP_MOUNT)) {
            set_up_v2(Path::new(CGROUP_MOUNT), &proc_cgroup)?
        } else {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
                .map_err(|error| format!("cannot read /proc/self/mountinfo: {error}"))?;
            set_up_v1(&mountinfo, &proc_cgroup)?
        };
        // A jobs' cgroup that another user made (a root agent before this one, say) may be
        // there and not ours to write: find out now, so that limits are said to be off at
        // start rather than every launch failing.
        let jobs_dirs = match &layout {
            Layout::V2 { jobs, .. } => vec![jobs.clone()],
            Layout::V1 { memory, cpu, pids } => {
                let mut dirs = vec![memory.clone(), cpu.clone()];
                dirs.extend(pids.clone());
                dirs
            }
        };
        for dir in jobs_dirs {
            check_can_make_cgroups(&dir, owner)?;
        }
        Ok(Cgroups {
            layout,
            owner: owner.to_string(),
            pids_max: None,
        })
    }

    /// Holds every attempt from now on to `max` processes and threads (`pids.max`); `None` or
    /// 0: no limit. Without the `pids` controller ([`Cgroups::limits_pids`]) it does nothing.
    pub fn with_pids_max(mut self, max: Option<u64>) -> Cgroups {
        self.pids_max = max.filter(|max| *max > 0);
        self
    }

    /// Whether the `pids` controller is there to hold attempts to [`Cgroups::with_pids_max`].
    pub fn limits_pids(&self) -> bool {
        match &self.layout {
            Layout::V2 { pids, .. } => *pids,
            Layout::V1 { pids, .. } => pids.is_some(),
        }
    }

    pub fn version(&self) -> CgroupVersion {
        match self.layout {
            Layout::V1 { .. } => CgroupVersion::V1,
            Layout::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// Where the jobs' cgroups are, for the agent's log.
    pub fn describe(&self) -> String {
        match &self.layout {
            Layout::V2 { jobs, .. } => format!("cgroups v2 under {}", jobs.display()),
            Layout::V1 { memory, cpu, pids } => {
                let pids = pids
                    .as_ref()
                    .map(|pids| format!(", {}", pids.display()))
                    .unwrap_or_default();
                format!(
                    "cgroups v1 under {}, {}{pids}",
                    memory.display(),
                    cpu.display()
                )
            }
        }
    }

    /// The attempt's cgroup dirs (one per hierarchy: v2's, or v1's memory, cpu and pids
    /// where there is one, in that order).
    pub fn dirs(&self, job: JobId, attempt: u32) -> Vec<PathBuf> {
        let name = format!("{}.{job}-{attempt}", self.owner);
        match &self.layout {
            Layout::V2 { jobs, .. } => vec![jobs.join(name)],
            Layout::V1 { memory, cpu, pids } => {
                let mut dirs = vec![memory.join(&name), cpu.join(&name)];
                dirs.extend(pids.as_ref().map(|pids| pids.join(&name)));
                dirs
            }
        }
    }

    /// Makes the attempt's cgroup afresh with `limits` (0: none), and opens it for the job's
    /// first process to enter.
    pub fn prepare(
        &self,
        job: JobId,
        attempt: u32,
        limits: JobLimits,
    ) -> std::io::Result<JobCgroup> {
        let dirs = self.dirs(job, attempt);
        for dir in &dirs {
            // Left by an earlier try of this attempt (an agent killed mid-launch).
            if dir.exists() {
                kill_and_remove(dir, self.version());
            }
            std::fs::create_dir(dir)?;
        }
        let cpu_quota_us = (limits.cpu_millis > 0)
            .then(|| (u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1_000).max(CPU_QUOTA_MIN_US));
        let memory = (limits.memory_bytes > 0).then_some(limits.memory_bytes);
        let pids_max = self.pids_max.filter(|_| self.limits_pids());
        match &self.layout {
            Layout::V2 { .. } => {
                let dir = &dirs[0];
                let quota = cpu_quota_us.map_or("max".to_string(), |us| us.to_string());
                write_file(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                let max = memory.map_or("max".to_string(), |bytes| bytes.to_string());
                write_file(&dir.join("memory.max"), &max)?;
                if memory.is_some() {
                    write_optional(&dir.join("memory.swap.max"), "0")?;
                }
                if let Some(max) = pids_max {
                    write_file(&dir.join("pids.max"), &max.to_string())?;
                }
            }
            Layout::V1 { .. } => {
                let (memory_dir, cpu_dir) = (&dirs[0], &dirs[1]);
                if let Some(bytes) = memory {
                    write_file(
                        &memory_dir.join("memory.limit_in_bytes"),
                        &bytes.to_string(),
                    )?;
                    write_optional(
                        &memory_dir.join("memory.memsw.limit_in_bytes"),
                        &bytes.to_string(),
                    )?;
                }
                if let Some(us) = cpu_quota_us {
                    write_file(
                        &cpu_dir.join("cpu.cfs_period_us"),
                        &CPU_PERIOD_US.to_string(),
                    )?;
                    write_file(&cpu_dir.join("cpu.cfs_quota_us"), &us.to_string())?;
                }
                if let (Some(max), Some(pids_dir)) = (pids_max, dirs.get(2)) {
                    write_file(&pids_dir.join("pids.max"), &max.to_string())?;
                }
            }
        }
        let procs = dirs
            .iter()
            .map(|dir| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(JobCgroup { procs })
    }

    /// How many processes the OOM killer killed in the attempt's cgroup; `None` when it
    /// cannot tell.
    pub fn oom_kills(&self, job: JobId, attempt: u32) -> Option<u64> {
        let dir = self.dirs(job, attempt).into_iter().next()?;
        let file = match self.version() {
            CgroupVersion::V2 => "memory.events",
            CgroupVersion::V1 => "memory.oom_control",
        };
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|count| count.trim().parse().ok())
    }

    /// After the attempt ended: logs kills by the OOM killer, kills what the attempt left
    /// behind in its cgroup and removes it. Never fails: a cgroup that cannot be removed is
    /// logged and tried again when the attempt is next released or prepared.
    pub fn release(&self, job: JobId, attempt: u32) {
        if let Some(kills) = self.oom_kills(job, attempt).filter(|kills| *kills > 0) {
            tracing::warn!(%job, attempt, oom_kills = kills,
                "the out-of-memory killer killed processes of this attempt: it reached its memory limit");
        }
        for dir in self.dirs(job, attempt) {
            if dir.exists() {
                kill_and_remove(&dir, self.version());
            }
        }
    }
}

/// What names an agent's attempts' cgroups: its node name and a hash (FNV-1a) of its state
/// dir, the same across restarts, different for two agents on one host.
pub fn owner_name(node: &str, state_dir: &Path) -> String {
    let absolute = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let hash = absolute
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0x811c_9dc5u32, |hash, byte| {
            (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
        });
    format!("{node}-{hash:08x}")
}

/// Whether `mount` is a cgroup v2 mount (it has `cgroup.controllers`).
fn is_v2_mount(mount: &Path) -> bool {
    mount.join("cgroup.controllers").is_file()
}

/// The agent's cgroup v2 path (`0::/path` in `/proc/self/cgroup`).
pub fn v2_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim)
}

/// The agent's path in the v1 hierarchy that carries `controller` (`4:memory:/path`,
/// `2:cpu,cpuacct:/path`).
pub fn v1_path<'a>(proc_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    proc_cgroup.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let _id = fields.next()?;
        let controllers = fields.next()?;
        let path = fields.next()?;
        controllers
            .split(',')
            .any(|name| name == controller)
            .then_some(path.trim())
    })
}

/// The mount point and mount root of the v1 hierarchy that carries `controller`, from
/// `/proc/self/mountinfo`.
pub fn v1_mount(mountinfo: &str, controller: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let fields: Vec<&str> = before.split_whitespace().collect();
        let after: Vec<&str> = after.split_whitespace().collect();
        if after.first() != Some(&"cgroup") {
            return None;
        }
        let options = after.get(2)?;
        if !options.split(',').any(|option| option == controller) {
            return None;
        }
        Some((PathBuf::from(fields.get(4)?), fields.get(3)?.to_string()))
    })
}

/// `mount` joined with a cgroup path (relative to the mount's root).
fn under(mount: &Path, root: &str, path: &str) -> PathBuf {
    let relative = path
        .strip_prefix(root)
        .unwrap_or(path)
        .trim_start_matches('/');
    if relative.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(relative)
    }
}

fn set_up_v2(mount: &Path, proc_cgroup: &str) -> Result<Layout, String> {
    let path = v2_path(proc_cgroup)
        .ok_or("cgroups v2 is mounted, but /proc/self/cgroup names no v2 cgroup of the agent")?;
    let own = under(mount, "/", path);
    let at_root = own == mount;
    let (base, move_self) = if at_root {
        (own.clone(), false)
    } else if own.file_name().is_some_and(|name| name == AGENT_CGROUP) {
        (own.parent().unwrap_or(mount).to_path_buf(), false)
    } else {
        (own.clone(), true)
    };
    let controllers = std::fs::read_to_string(base.join("cgroup.controllers"))
        .map_err(|error| format!("cannot read {}/cgroup.controllers: {error}", base.display()))?;
    let missing: Vec<&str> = ["cpu", "memory"]
        .into_iter()
        .filter(|wanted| !controllers.split_whitespace().any(|have| have == *wanted))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the agent's cgroup {} lacks the {} controller(s): delegate them to it (under systemd: Delegate=yes in its unit)",
            base.display(),
            missing.join(" and ")
        ));
    }
    if move_self {
        let procs = std::fs::read_to_string(base.join("cgroup.procs"))
            .map_err(|error| format!("cannot read {}/cgroup.procs: {error}", base.display()))?;
        let me = std::process::id().to_string();
        if procs.lines().any(|pid| pid.trim() != me) {
            return Err(format!(
                "the agent's cgroup {} holds other processes too, so it cannot hold the jobs' cgroups (cgroups v2 allows no processes beside child cgroups): run the agent in a cgroup of its own (under systemd: Delegate=yes and DelegateSubgroup={AGENT_CGROUP} in its unit)",
                base.display()
            ));
        }
        let leaf = base.join(AGENT_CGROUP);
        create_dir_if_missing(&leaf)
            .map_err(|error| format!("cannot create {}: {error}", leaf.display()))?;
        write_file(&leaf.join("cgroup.procs"), &me)
            .map_err(|error| format!("cannot move the agent into {}: {error}", leaf.display()))?;
        tracing::info!(cgroup = %leaf.display(), "moved the agent into a cgroup of its own, beside its jobs'");
    }
    let pids = controllers.split_whitespace().any(|have| have == "pids");
    let wanted: &[&str] = if pids {
        &["cpu", "memory", "pids"]
    } else {
        &["cpu", "memory"]
    };
    enable_controllers(&base, wanted)?;
    let jobs = base.join(JOBS_CGROUP);
    create_dir_if_missing(&jobs)
        .map_err(|error| format!("cannot create {}: {error}", jobs.display()))?;
    enable_controllers(&jobs, wanted)?;
    Ok(Layout::V2 { jobs, pids })
}

/// Enables the `wanted` controllers for the children of `dir`.
fn enable_controllers(dir: &Path, wanted: &[&str]) -> Result<(), String> {
    let file = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&file).unwrap_or_default();
    if wanted
        .iter()
        .all(|wanted| enabled.split_whitespace().any(|have| have == *wanted))
    {
        return Ok(());
    }
    let line = wanted
        .iter()
        .map(|controller| format!("+{controller}"))
        .collect::<Vec<_>>()
        .join(" ");
    write_file(&file, &line).map_err(|error| {
        format!(
            "cannot enable the {} controllers in {}: {error}",
            wanted.join(", "),
            file.display()
        )
    })
}

fn set_up_v1(mountinfo: &str, proc_cgroup: &str) -> Result<Layout, String> {
    let mut jobs = Vec::new();
    for controller in ["memory", "cpu"] {
        let (mount, root) = v1_mount(mountinfo, controller).ok_or_else(|| {
            format!(
                "neither cgroups v2 at {CGROUP_MOUNT} nor a v1 {controller} hierarchy is mounted"
            )
        })?;
        let path = v1_path(proc_cgroup, controller).ok_or_else(|| {
            format!("/proc/self/cgroup names no v1 {controller} cgroup of the agent")
        })?;
        let dir = under(&mount, &root, path).join(JOBS_CGROUP);
        create_dir_if_missing(&dir)
            .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
        jobs.push(dir);
    }
    let cpu = jobs.pop().expect("two hierarchies");
    let memory = jobs.pop().expect("two hierarchies");
    // The pids hierarchy is optional: without it, attempts are not held to a process count.
    let pids = match (v1_mount(mountinfo, "pids"), v1_path(proc_cgroup, "pids")) {
        (Some((mount, root)), Some(path)) => {
            let dir = under(&mount, &root, path).join(JOBS_CGROUP);
            create_dir_if_missing(&dir)
                .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
            Some(dir)
        }
        _ => None,
    };
    Ok(Layout::V1 { memory, cpu, pids })
}

/// The default of `--job-pids-max`: a quarter of the host's process ids (`kernel.pid_max`),
/// so that no single job can take them all from the other jobs and the agent; at least 1,024.
/// `None` when `pid_max` cannot be read.
pub fn default_pids_max() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok()?;
    let pid_max: u64 = text.trim().parse().ok()?;
    Some((pid_max / 4).max(1_024))
}

/// Makes and removes a cgroup under `dir`, or says why it cannot.
fn check_can_make_cgroups(dir: &Path, owner: &str) -> Result<(), String> {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let probe = dir.join(format!(
        "{owner}.probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir(&probe)
        .and_then(|()| std::fs::remove_dir(&probe))
        .map_err(|error| {
            format!(
                "cannot make a job's cgroup under {}: {error} (made by another user, such as \
                 a root agent before this one? remove it, or run this agent as its owner)",
                dir.display()
            )
        })
}

fn create_dir_if_missing(dir: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => Err(error),
        _ => Ok(()),
    }
}

/// Writes `value` to a cgroup file in one `write(2)`, as the kernel wants.
fn write_file(path: &Path, value: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.write_all(value.as_bytes())
        .map_err(|error| std::io::Error::new(error.kind(), format!("{}: {error}", path.display())))
}

/// Like [`write_file`], but a file the kernel does not offer (no swap accounting) is fine.
fn write_optional(path: &Path, value: &str) -> std::io::Result<()> {
    match write_file(path, value) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        result => result,
    }
}

/// Kills every process left in the cgroup `dir` and removes it, waiting up to
/// [`RELEASE_WAIT_MS`] for them to go.
fn kill_and_remove(dir: &Path, version: CgroupVersion) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(RELEASE_WAIT_MS);
    let mut killed = false;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return,
            Err(error) if std::time::Instant::now() >= deadline => {
                tracing::warn!(cgroup = %dir.display(), "cannot remove a job's cgroup: {error}");
                return;
            }
            Err(_) => {}
        }
        if !killed {
            killed = true;
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            if !procs.trim().is_empty() {
                tracing::info!(cgroup = %dir.display(), "killing what an ended attempt left in its cgroup");
            }
            if version == CgroupVersion::V2 && write_file(&dir.join("cgroup.kill"), "1").is_ok() {
                // Kills the whole cgroup at once (Linux 5.14 and later).
            } else {
                for pid in procs
                    .lines()
                    .filter_map(|pid| pid.trim().parse::<i32>().ok())
                {
                    // SAFETY: kill(2) with plain integers, on processes in the attempt's cgroup.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The CPUs (thousandths) and memory (bytes) the agent's own cgroup holds it to, when
/// lower limits are set: the smallest along its cgroup and those above it (v2), or in its
/// own cpu and memory cgroups (v1). `None` for what no cgroup limits.
pub fn own_limits() -> (Option<u32>, Option<u64>) {
    let Ok(proc_cgroup) = std::fs::read_to_string("/proc/self/cgroup") else {
        return (None, None);
    };
    let mount = Path::new(CGROUP_MOUNT);
    if is_v2_mount(mount) {
        let Some(path) = v2_path(&proc_cgroup) else {
            return (None, None);
        };
        let mut cpu: Option<u32> = None;
        let mut memory: Option<u64> = None;
        let mut dir = under(mount, "/", path);
        loop {
            if let Some(millis) = std::fs::read_to_string(dir.join("cpu.max"))
                .ok()
                .and_then(|text| parse_cpu_max(&text))
            {
                cpu = Some(cpu.map_or(millis, |cpu| cpu.min(millis)));
            }
            if let Some(bytes) = std::fs::read_to_string(dir.join("memory.max"))
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
            {
                memory = Some(memory.map_or(bytes, |memory| memory.min(bytes)));
            }
            if dir == mount {
                break;
            }
            match dir.parent() {
                Some(parent) if parent.starts_with(mount) => dir = parent.to_path_buf(),
                _ => break,
            }
        }
        return (cpu, memory);
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return (None, None);
    };
    let dir = |controller: &str| {
        let (mount, root) = v1_mount(&mountinfo, controller)?;
        Some(under(&mount, &root, v1_path(&proc_cgroup, controller)?))
    };
    let read = |dir: &Path, file: &str| -> Option<i64> {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let cpu = dir("cpu").and_then(|dir| {
        let quota = read(&dir, "cpu.cfs_quota_us").filter(|quota| *quota > 0)?;
        let period = read(&dir, "cpu.cfs_period_us").filter(|period| *period > 0)?;
        u32::try_from(quota * 1_000 / period).ok()
    });
    // "Unlimited" in v1 is a huge number, not a word: anything past 2^62 is none.
    let memory = dir("memory").and_then(|dir| {
        read(&dir, "memory.limit_in_bytes")
            .filter(|bytes| *bytes > 0 && *bytes < 1 << 62)
            .map(|bytes| bytes as u64)
    });
    (cpu, memory)
}

/// CPUs in thousandths from a v2 `cpu.max` (`<quota> <period>`); `None` for `max`.
pub fn parse_cpu_max(text: &str) -> Option<u32> {
    let mut fields = text.split_whitespace();
    let quota: u64 = fields.next()?.parse().ok()?;
    let period: u64 = fields.next()?.parse().ok().filter(|period| *period > 0)?;
    u32::try_from(quota * 1_000 / period).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's cgroups are read from /proc/self/cgroup and the v1 mounts from
    /// /proc/self/mountinfo.
    #[test]
    fn cgroup_paths_and_mounts_parse() {
        let proc_cgroup =
            "12:cpu,cpuacct:/a/b\n4:memory:/process_api/x\n0::/system.slice/q.service/agent\n";
        assert_eq!(v2_path(proc_cgroup), Some("/system.slice/q.service/agent"));
        assert_eq!(v1_path(proc_cgroup, "cpu"), Some("/a/b"));
        assert_eq!(v1_path(proc_cgroup, "cpuacct"), Some("/a/b"));
        assert_eq!(v1_path(proc_cgroup, "memory"), Some("/process_api/x"));
        assert_eq!(v1_path(proc_cgroup, "pids"), None);
        assert_eq!(v2_path("4:memory:/x\n"), None);

        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n\
            35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
            41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            v1_mount(mountinfo, "cpu"),
            Some((PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"), "/".to_string()))
        );
        let (mount, root) = v1_mount(mountinfo, "memory").unwrap();
        assert_eq!(
            under(&mount, &root, "/docker/abc/job"),
            PathBuf::from("/sys/fs/cgroup/memory/job")
        );
        assert_eq!(under(&mount, &root, "/docker/abc"), mount);
        assert_eq!(v1_mount(mountinfo, "pids"), None);
    }

    /// An agent's cgroups are named by its node and state dir: the same across restarts,
    /// different for another state dir.
    #[test]
    fn owner_names_differ_by_state_dir() {
        let a = owner_name("gpu-1", Path::new("/nonexistent/a"));
        assert_eq!(a, owner_name("gpu-1", Path::new("/nonexistent/a")));
        assert_ne!(a, owner_name("gpu-1", Path::new("/nonexistent/b")));
        assert!(
            a.starts_with("gpu-1-") && a.len() == "gpu-1-".len() + 8,
            "{a}"
        );
    }

    /// A cgroup v2 directory as the kernel shows it, on a plain filesystem: the files
    /// `set_up_v2` reads and writes (the kernel makes them itself in a real cgroup).
    fn fake_v2_cgroup(dir: &Path, controllers: &str, procs: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
        std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
    }

    /// The layout decisions of cgroups v2, on a fake hierarchy (this CI host has cgroups v1
    /// for cpu and memory, so the kernel's own v2 is not exercised here): an agent alone in
    /// its service's cgroup moves into an `agent` leaf and puts the jobs beside it; one
    /// already in such a leaf (systemd's DelegateSubgroup) uses its parent; a cgroup without
    /// the controllers, or shared with other processes, is refused saying what to set.
    #[test]
    fn cgroups_v2_layout_on_a_fake_hierarchy() {
        let me = std::process::id().to_string();
        let root = tempfile::tempdir().unwrap();
        let service = root.path().join("system.slice/quotient-agent.service");
        fake_v2_cgroup(&service, "cpuset cpu io memory pids\n", &format!("{me}\n"));
        fake_v2_cgroup(&service.join(AGENT_CGROUP), "", "");
        fake_v2_cgroup(&service.join(JOBS_CGROUP), "cpu memory\n", "");
        let proc_cgroup = "0::/system.slice/quotient-agent.service\n";
        let layout = set_up_v2(root.path(), proc_cgroup).expect("set up");
        assert_eq!(
            layout,
            Layout::V2 {
                jobs: service.join(JOBS_CGROUP),
                pids: true,
            }
        );
        let read = |path: PathBuf| std::fs::read_to_string(path).unwrap();
        assert_eq!(read(service.join(AGENT_CGROUP).join("cgroup.procs")), me);
        assert_eq!(
            read(service.join("cgroup.subtree_control")),
            "+cpu +memory +pids"
        );
        assert_eq!(
            read(service.join(JOBS_CGROUP).join("cgroup.subtree_control")),
            "+cpu +memory +pids"
        );

        // Already in the leaf: nothing moves, the parent holds the jobs.
        let in_leaf = "0::/system.slice/quotient-agent.service/agent\n";
        std::fs::write(service.join(AGENT_CGROUP).join("cgroup.procs"), "").unwrap();
        assert!(set_up_v2(root.path(), in_leaf).is_ok());
        assert_eq!(read(service.join(AGENT_CGROUP).join("cgroup.procs")), "");

        // Without the pids controller: set up all the same, without a process limit.
        std::fs::write(service.join("cgroup.controllers"), "cpu memory\n").unwrap();
        std::fs::write(service.join("cgroup.subtree_control"), "").unwrap();
        let layout = set_up_v2(root.path(), in_leaf).expect("set up without pids");
        assert_eq!(
            layout,
            Layout::V2 {
                jobs: service.join(JOBS_CGROUP),
                pids: false,
            }
        );
        assert_eq!(read(service.join("cgroup.subtree_control")), "+cpu +memory");

        // Shared with another process: refused.
        std::fs::write(service.join("cgroup.procs"), format!("{me}\n1\n")).unwrap();
        let shared = set_up_v2(root.path(), proc_cgroup).unwrap_err();
        assert!(shared.contains("DelegateSubgroup=agent"), "{shared}");

        // Without the memory controller delegated: refused.
        std::fs::write(service.join("cgroup.controllers"), "cpu pids\n").unwrap();
        let undelegated = set_up_v2(root.path(), proc_cgroup).unwrap_err();
        assert!(
            undelegated.contains("memory") && undelegated.contains("Delegate=yes"),
            "{undelegated}"
        );
    }

    /// `cpu.max` reads as thousandths of a CPU; `max` is no limit.
    #[test]
    fn cpu_max_parses() {
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1_500));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("50000 100000"), Some(500));
        assert_eq!(parse_cpu_max(""), None);
    }

    #[test]
    fn a_jobs_cgroup_the_agent_cannot_make_cgroups_under_is_said_at_start() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check_can_make_cgroups(dir.path(), "node-1"), Ok(()));
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the probe is gone"
        );
        let missing = dir.path().join("quotient-jobs");
        let why = check_can_make_cgroups(&missing, "node-1").unwrap_err();
        assert!(why.contains("cannot make a job's cgroup under"), "{why}");
    }
}
