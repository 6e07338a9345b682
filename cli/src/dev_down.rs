//! `quotient dev down --dir DIR`: stops the processes of a local cluster started by
//! `quotient dev up`, and marks them stopped (`"pid": null`) in DIR/cluster.json.
//!
//! Each gets SIGTERM, so it shuts down cleanly; whatever still runs after
//! [`STOP_DEADLINE_MS`] gets SIGKILL. The data stays, so `dev up` on the same DIR resumes the
//! cluster; delete DIR to start afresh. With `-o json` it prints the updated cluster.json.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::dev_cluster::{self, ClusterFile};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// How long the processes get to stop after SIGTERM (milliseconds).
pub const STOP_DEADLINE_MS: u64 = 10_000;
/// How long to wait for the kernel after SIGKILL (milliseconds).
pub const KILL_DEADLINE_MS: u64 = 5_000;

/// Arguments of `quotient dev down`.
#[derive(Debug, clap::Args)]
pub struct DevDownArgs {
    /// The cluster's folder, as given to `quotient dev up`.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// What [`stop_cluster`] stopped.
#[derive(Debug)]
pub struct Stopped {
    /// The updated cluster.json.
    pub cluster: ClusterFile,
    pub coordinators: usize,
    pub agents: usize,
    /// DIR, resolved.
    pub dir: PathBuf,
}

/// Stops the processes of DIR and marks them stopped in its cluster.json, saying nothing on
/// stdout (the demo says what happens to DIR itself).
pub fn stop_cluster(args: &DevDownArgs) -> anyhow::Result<Stopped> {
    let Some(mut cluster) = ClusterFile::read(&args.dir)? else {
        bail!(
            "no local cluster in {}: it has no cluster.json; was it started with `quotient dev \
             up --dir {}`?",
            args.dir.display(),
            args.dir.display()
        );
    };
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", args.dir.display()))?;
    // Agents first, so that they do not spend their stop looking for a leader; each is
    // recognised by its state dir, a coordinator by its data dir.
    let agents: Vec<(u32, PathBuf)> = cluster
        .agents
        .iter()
        .filter(|entry| !entry.state_dir.as_os_str().is_empty())
        .filter_map(|entry| entry.pid.map(|pid| (pid, entry.state_dir.clone())))
        .filter(|(pid, marker)| dev_cluster::is_running(*pid, marker))
        .collect();
    let agents_left = stop(&agents)?;
    // An agent leaves its jobs running when it stops (a restarted agent adopts them); a
    // local cluster going down takes its jobs with it.
    let jobs_killed: usize = cluster
        .agents
        .iter()
        .filter(|entry| !entry.state_dir.as_os_str().is_empty())
        .map(|entry| kill_jobs(&entry.state_dir))
        .sum();
    if jobs_killed > 0 {
        eprintln!("killed {jobs_killed} job(s) the agents left running");
    }
    let coordinators: Vec<(u32, PathBuf)> = cluster
        .coordinators
        .iter()
        .filter_map(|entry| entry.pid.map(|pid| (pid, entry.data_dir.clone())))
        .filter(|(pid, marker)| dev_cluster::is_running(*pid, marker))
        .collect();
    let mut left = stop(&coordinators)?;
    for entry in &mut cluster.coordinators {
        if entry.pid.is_some_and(|pid| !left.contains(&pid)) {
            entry.pid = None;
        }
    }
    for agent in &mut cluster.agents {
        if agent.pid.is_some_and(|pid| !agents_left.contains(&pid)) {
            agent.pid = None;
        }
    }
    left.extend(agents_left);
    cluster.write(&dir)?;
    if !left.is_empty() {
        bail!("processes {left:?} still run after SIGKILL; check them with `ps`");
    }
    Ok(Stopped {
        cluster,
        coordinators: coordinators.len(),
        agents: agents.len(),
        dir,
    })
}

pub fn run(global: &GlobalArgs, args: &DevDownArgs) -> anyhow::Result<()> {
    let stopped = stop_cluster(args)?;
    if global.output == OutputFormat::Json {
        output::print_json(&stopped.cluster)?;
    }
    eprintln!(
        "stopped {} coordinator(s) and {} agent(s) in {}; their data stays, so `quotient dev up --dir {}` resumes the cluster",
        stopped.coordinators,
        stopped.agents,
        stopped.dir.display(),
        args.dir.display()
    );
    Ok(())
}

/// The most job pid files looked at per agent.
pub const JOB_FILES_MAX: usize = 4_096;

/// Kills the process group of every job the agent with `state_dir` started and that still
/// runs, recognised by its pid file in `STATE_DIR/jobs/` and a command line that names a file
/// there. Returns how many it killed.
fn kill_jobs(state_dir: &std::path::Path) -> usize {
    #[derive(serde::Deserialize)]
    struct JobFile {
        pid: u32,
        pgid: u32,
    }
    let jobs_dir = state_dir.join("jobs");
    let Ok(entries) = std::fs::read_dir(&jobs_dir) else {
        return 0;
    };
    let marker = jobs_dir.as_os_str().as_encoded_bytes().to_vec();
    let mut killed = 0;
    for entry in entries.flatten().take(JOB_FILES_MAX) {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(job) = serde_json::from_str::<JobFile>(&text) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", job.pid)) else {
            continue;
        };
        let ours = cmdline
            .split(|byte| *byte == 0)
            .any(|argument| argument.starts_with(&marker));
        if !ours || job.pgid == 0 {
            continue;
        }
        let Ok(pgid) = libc::pid_t::try_from(job.pgid) else {
            continue;
        };
        // SAFETY: kill(2) on a process group this cluster's agent started; plain integers.
        if unsafe { libc::kill(-pgid, libc::SIGKILL) } == 0 {
            killed += 1;
        }
    }
    killed
}

/// SIGTERM to each of `running`, SIGKILL to what still runs after [`STOP_DEADLINE_MS`];
/// returns the pids still running after that.
fn stop(running: &[(u32, PathBuf)]) -> anyhow::Result<Vec<u32>> {
    for (pid, _) in running {
        dev_cluster::send_signal(*pid, libc::SIGTERM)?;
    }
    let stubborn =
        dev_cluster::wait_until_stopped(running, Duration::from_millis(STOP_DEADLINE_MS));
    for pid in &stubborn {
        eprintln!("process {pid} did not stop within {STOP_DEADLINE_MS} ms of SIGTERM; killing it");
        dev_cluster::send_signal(*pid, libc::SIGKILL)?;
    }
    let left: Vec<(u32, PathBuf)> = running
        .iter()
        .filter(|(pid, _)| stubborn.contains(pid))
        .cloned()
        .collect();
    Ok(dev_cluster::wait_until_stopped(
        &left,
        Duration::from_millis(KILL_DEADLINE_MS),
    ))
}
