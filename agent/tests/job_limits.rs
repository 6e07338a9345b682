//! A process job held to its CPUs and memory by a cgroup of its own (runtime/cgroup.rs),
//! against real processes and the host's real cgroups (v2, or v1 on legacy and hybrid hosts).
//!
//! These need root and a writable cgroup hierarchy with the cpu and memory controllers. Where
//! the agent's cgroup setup fails, they skip loudly, except with `CI=true` on a host where
//! the cgroups are there and writable (then limits must be enforced, so they fail).

mod support;

use std::path::Path;
use std::sync::Arc;

use quotient_agent::runtime::cgroup::{CgroupVersion, Cgroups, CGROUP_MOUNT};
use quotient_agent::runtime::process::ProcessRuntime;
use quotient_agent::runtime::{JobLimits, Runtime};
use quotient_common::JobId;
use support::docker::in_ci;
use support::*;

/// Whether this host has the cpu and memory controllers where the agent would use them, and
/// this process can write there: then limits must be enforced.
fn host_could_enforce() -> bool {
    if !running_as_root() {
        return false;
    }
    let writable = |path: &Path| {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: access(2) on a NUL-terminated path.
        unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
    };
    let mount = Path::new(CGROUP_MOUNT);
    if let Ok(controllers) = std::fs::read_to_string(mount.join("cgroup.controllers")) {
        let has = |name: &str| controllers.split_whitespace().any(|c| c == name);
        return has("cpu") && has("memory") && writable(&mount.join("cgroup.subtree_control"));
    }
    ["memory", "cpu"]
        .iter()
        .all(|controller| writable(&mount.join(controller)))
}

/// The agent's cgroups, or `None` (skip) where the host cannot have them.
fn cgroups() -> Option<Arc<Cgroups>> {
    match Cgroups::set_up(&format!("limits-{}", std::process::id())) {
        Ok(cgroups) => Some(Arc::new(cgroups)),
        Err(why) if in_ci() && host_could_enforce() => {
            panic!("cgroups are there and writable, but limits are not enforced: {why}")
        }
        Err(why) => {
            eprintln!(
                "\n!!!!!!!! SKIPPING a job-limits test: limits cannot be enforced here: {why}\n"
            );
            None
        }
    }
}

/// A job with a 32 MiB memory limit that takes memory without end (`tail` of a file without
/// a newline keeps it all) is killed by the OOM killer, and the agent can tell.
#[tokio::test]
async fn a_process_job_over_its_memory_limit_is_killed() {
    let Some(cgroups) = cgroups() else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let runtime = ProcessRuntime::new(state.path()).with_cgroups(cgroups.clone());
    let mut spec = launch(state.path(), 91, 1, None, shell("tail /dev/zero"));
    spec.limits = JobLimits {
        cpu_millis: 0,
        memory_bytes: 32 << 20,
    };
    let handle = runtime.start(&spec).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    // SIGKILL by the OOM killer: 128 + 9, as the shim records it.
    assert_eq!(
        code,
        Some(Some(137)),
        "{}",
        runtime.logs(&handle).await.unwrap()
    );
    let kills = cgroups.oom_kills(JobId(91), 1);
    assert!(kills.is_some_and(|kills| kills > 0), "oom_kill = {kills:?}");
    let reason = runtime.exit_reason(&handle, 137).await;
    assert!(
        reason
            .as_deref()
            .is_some_and(|reason| reason.contains("out-of-memory killer")),
        "the exit says why: {reason:?}"
    );
    let dirs = cgroups.dirs(JobId(91), 1);
    assert!(dirs.iter().all(|dir| dir.is_dir()));
    runtime.remove(&handle).await.unwrap();
    assert!(
        dirs.iter().all(|dir| !dir.exists()),
        "the attempt's cgroup is removed with it"
    );
}

/// The job itself, from /proc/self/cgroup, finds its cgroup's cpu and memory limits set to
/// what its attempt was given, and its process limit to the agent's `--job-pids-max`.
#[tokio::test]
async fn a_process_job_runs_in_its_own_cgroup_with_its_limits() {
    let Some(cgroups) = cgroups() else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let cgroups = Arc::new((*cgroups).clone().with_pids_max(Some(321)));
    let runtime = ProcessRuntime::new(state.path()).with_cgroups(cgroups.clone());
    let script = match cgroups.version() {
        CgroupVersion::V2 => {
            r#"dir=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
echo "$dir" > "$QUOTIENT_CHECKPOINT_DIR/cgroup"
cat "$dir/cpu.max" > "$QUOTIENT_CHECKPOINT_DIR/cpu"
cat "$dir/memory.max" > "$QUOTIENT_CHECKPOINT_DIR/memory"
cat "$dir/pids.max" > "$QUOTIENT_CHECKPOINT_DIR/pids" || echo none > "$QUOTIENT_CHECKPOINT_DIR/pids""#
        }
        CgroupVersion::V1 => {
            r#"memory=$(grep -E '^[0-9]+:([^:]*,)?memory(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3)
cpu=$(grep -E '^[0-9]+:([^:]*,)?cpu(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3)
echo "$memory" > "$QUOTIENT_CHECKPOINT_DIR/cgroup"
for mount in /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
  [ -f "$mount$cpu/cpu.cfs_quota_us" ] && cpudir=$mount$cpu
done
echo "$(cat "$cpudir/cpu.cfs_quota_us") $(cat "$cpudir/cpu.cfs_period_us")" > "$QUOTIENT_CHECKPOINT_DIR/cpu"
cat "/sys/fs/cgroup/memory$memory/memory.limit_in_bytes" > "$QUOTIENT_CHECKPOINT_DIR/memory"
pids=$(grep -E '^[0-9]+:pids:' /proc/self/cgroup | cut -d: -f3)
cat "/sys/fs/cgroup/pids$pids/pids.max" > "$QUOTIENT_CHECKPOINT_DIR/pids" || echo none > "$QUOTIENT_CHECKPOINT_DIR/pids""#
        }
    };
    let mut spec = launch(state.path(), 92, 3, None, shell(script));
    spec.limits = JobLimits {
        cpu_millis: 1_500,
        memory_bytes: 64 << 20,
    };
    let handle = runtime.start(&spec).await.unwrap();
    let code = runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    assert_eq!(
        code,
        Some(Some(0)),
        "{}",
        runtime.logs(&handle).await.unwrap()
    );
    let read = |name: &str| {
        std::fs::read_to_string(spec.checkpoint_dir.join(name))
            .unwrap()
            .trim()
            .to_string()
    };
    assert!(
        read("cgroup").ends_with(&format!(
            "/quotient-jobs/limits-{}.j-92-3",
            std::process::id()
        )),
        "{}",
        read("cgroup")
    );
    assert_eq!(read("cpu"), "150000 100000");
    assert_eq!(read("memory"), (64u64 << 20).to_string());
    if cgroups.limits_pids() {
        assert_eq!(read("pids"), "321");
    } else {
        eprintln!("\n!!!!!!!! the pids controller is not available here: the process limit is not checked\n");
        assert!(!in_ci(), "this CI host has a pids hierarchy");
    }
    runtime.remove(&handle).await.unwrap();
    assert!(cgroups.dirs(JobId(92), 3).iter().all(|dir| !dir.exists()));
}

/// A job held to 16 processes and threads cannot start 40: the forks past its limit fail,
/// and the host's other processes never see it take more.
#[tokio::test]
async fn a_process_job_cannot_fork_past_its_process_limit() {
    let Some(cgroups) = cgroups() else {
        return;
    };
    if !cgroups.limits_pids() {
        eprintln!("\n!!!!!!!! SKIPPING: the pids controller is not available here\n");
        assert!(!in_ci(), "this CI host has a pids hierarchy");
        return;
    }
    let cgroups = Arc::new((*cgroups).clone().with_pids_max(Some(16)));
    let state = tempfile::tempdir().unwrap();
    let runtime = ProcessRuntime::new(state.path()).with_cgroups(cgroups.clone());
    // Each child that starts says so, then becomes a sleep (forking nothing, so none ends
    // early and frees its place); a fork that fails says nothing (and ends the script: dash
    // gives up on a failed fork).
    let script = r#"i=0
while [ $i -lt 40 ]; do
  sh -c 'echo x >> "$QUOTIENT_CHECKPOINT_DIR/started"; exec sleep 5' &
  i=$((i+1))
done
wait"#;
    let spec = launch(state.path(), 93, 1, None, shell(script));
    let handle = runtime.start(&spec).await.unwrap();
    runtime.wait(&handle, WAIT_DEADLINE).await.unwrap();
    // The children outlive the script: count them once their count holds for half a second.
    let count = || {
        std::fs::read_to_string(spec.checkpoint_dir.join("started"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let mut started = count();
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let now = count();
        if now == started && now > 0 {
            break;
        }
        started = now;
    }
    assert!(
        (1..16).contains(&started),
        "{started} of 40 children started under a limit of 16: {}",
        runtime.logs(&handle).await.unwrap()
    );
    runtime.remove(&handle).await.unwrap();
}
