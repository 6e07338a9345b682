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
    let dirs = cgroups.dirs(JobId(91), 1);
    assert!(dirs.iter().all(|dir| dir.is_dir()));
    runtime.remove(&handle).await.unwrap();
    assert!(
        dirs.iter().all(|dir| !dir.exists()),
        "the attempt's cgroup is removed with it"
    );
}

/// The job itself, from /proc/self/cgroup, finds its cgroup's cpu and memory limits set to
/// what its attempt was given.
#[tokio::test]
async fn a_process_job_runs_in_its_own_cgroup_with_its_limits() {
    let Some(cgroups) = cgroups() else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let runtime = ProcessRuntime::new(state.path()).with_cgroups(cgroups.clone());
    let script = match cgroups.version() {
        CgroupVersion::V2 => {
            r#"dir=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
echo "$dir" > "$QUOTIENT_CHECKPOINT_DIR/cgroup"
cat "$dir/cpu.max" > "$QUOTIENT_CHECKPOINT_DIR/cpu"
cat "$dir/memory.max" > "$QUOTIENT_CHECKPOINT_DIR/memory""#
        }
        CgroupVersion::V1 => {
            r#"memory=$(grep -E '^[0-9]+:([^:]*,)?memory(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3)
cpu=$(grep -E '^[0-9]+:([^:]*,)?cpu(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3)
echo "$memory" > "$QUOTIENT_CHECKPOINT_DIR/cgroup"
for mount in /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
  [ -f "$mount$cpu/cpu.cfs_quota_us" ] && cpudir=$mount$cpu
done
echo "$(cat "$cpudir/cpu.cfs_quota_us") $(cat "$cpudir/cpu.cfs_period_us")" > "$QUOTIENT_CHECKPOINT_DIR/cpu"
cat "/sys/fs/cgroup/memory$memory/memory.limit_in_bytes" > "$QUOTIENT_CHECKPOINT_DIR/memory""#
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
    runtime.remove(&handle).await.unwrap();
    assert!(cgroups.dirs(JobId(92), 3).iter().all(|dir| !dir.exists()));
}
