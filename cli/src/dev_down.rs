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

pub fn run(global: &GlobalArgs, args: &DevDownArgs) -> anyhow::Result<()> {
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
    // Agents have no data dir to recognise them by yet; their pids are never set.
    let running: Vec<(u32, PathBuf)> = cluster
        .coordinators
        .iter()
        .filter_map(|entry| entry.pid.map(|pid| (pid, entry.data_dir.clone())))
        .filter(|(pid, marker)| dev_cluster::is_running(*pid, marker))
        .collect();
    for (pid, _) in &running {
        dev_cluster::send_signal(*pid, libc::SIGTERM)?;
    }
    let stubborn =
        dev_cluster::wait_until_stopped(&running, Duration::from_millis(STOP_DEADLINE_MS));
    for pid in &stubborn {
        eprintln!("process {pid} did not stop within {STOP_DEADLINE_MS} ms of SIGTERM; killing it");
        dev_cluster::send_signal(*pid, libc::SIGKILL)?;
    }
    let left: Vec<(u32, PathBuf)> = running
        .iter()
        .filter(|(pid, _)| stubborn.contains(pid))
        .cloned()
        .collect();
    let left = dev_cluster::wait_until_stopped(&left, Duration::from_millis(KILL_DEADLINE_MS));
    for entry in &mut cluster.coordinators {
        if entry.pid.is_some_and(|pid| !left.contains(&pid)) {
            entry.pid = None;
        }
    }
    for agent in &mut cluster.agents {
        agent.pid = None;
    }
    cluster.write(&dir)?;
    if !left.is_empty() {
        bail!("processes {left:?} still run after SIGKILL; check them with `ps`");
    }
    if global.output == OutputFormat::Json {
        output::print_json(&cluster)?;
    }
    eprintln!(
        "stopped {} coordinator(s) in {}; their data stays, so `quotient dev up --dir {}` resumes the cluster",
        running.len(),
        dir.display(),
        args.dir.display()
    );
    Ok(())
}
