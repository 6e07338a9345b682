//! The local cluster of `quotient dev up` / `dev down`: its directory layout, its
//! `cluster.json`, and the processes it runs.
//!
//! Layout of DIR:
//! - `certs/`: the cluster CA, `coord-N.pem` per coordinator and `admin.pem` for the CLI;
//! - `coord-N/data/` (the coordinator's `--data-dir`) and `coord-N/coordinator.log`;
//! - `node-N/state/` (the agent's `--state-dir`: pid files, checkpoints, job logs) and
//!   `node-N/agent.log`, with the agent certificate `certs/node-N.pem`;
//! - `client.toml`: an admin client config (docs/cli.md);
//! - `cluster.json`: each process's id, pid, address and data dir (docs/cli.md's shape; the
//!   pid is `null` while it is stopped, and a `log` path is added), and the nodes' settings
//!   (`gpus_per_node`, `gpu_class`), so that `dev up` on the folder restarts agents as they
//!   were.
//!
//! A pid alone is not trusted: the kernel reuses pids, so a process counts as ours only if
//! `/proc/PID/cmdline` carries our data dir. That also treats a zombie (empty cmdline) as
//! stopped. The processes are started in their own process group, so a Ctrl-C in the shell
//! that ran `dev up` does not reach them.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use quotient_common::bounded_read::read_text_at_most;
use quotient_common::ClusterId;
use serde::{Deserialize, Serialize};

/// `cluster.json` in DIR.
pub const CLUSTER_FILE: &str = "cluster.json";
/// `client.toml` in DIR.
pub const CLIENT_CONFIG_FILE: &str = "client.toml";
/// The certificate folder in DIR.
pub const CERTS_DIR: &str = "certs";
/// The admin certificate's name (DIR/certs/admin.pem).
pub const ADMIN_CERT_NAME: &str = "admin";
/// The largest `cluster.json` read.
pub const CLUSTER_FILE_BYTES_MAX: u64 = 1 << 20;
/// How much of a log's end is shown when a process dies at start.
pub const LOG_TAIL_BYTES: u64 = 2_000;
/// Pause between two checks while waiting for processes (milliseconds).
pub const POLL_INTERVAL_MS: u64 = 100;

/// One coordinator in `cluster.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorEntry {
    pub id: u64,
    /// `null` while stopped.
    pub pid: Option<u32>,
    pub address: String,
    pub data_dir: PathBuf,
    #[serde(default)]
    pub log: PathBuf,
    /// Where it serves `/metrics` and health over HTTP (`--metrics-listen`), e.g.
    /// `127.0.0.1:41234`; picked at its first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// Where it serves the AWS Batch–compatible API (`--aws-listen`), as a URL for AWS
    /// clients' endpoint: `https://127.0.0.1:41235`; picked at its first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_endpoint: Option<String>,
}

/// One agent in `cluster.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentEntry {
    pub name: String,
    /// `null` while stopped.
    pub pid: Option<u32>,
    /// The agent's `--state-dir`; also what recognises its process.
    #[serde(default)]
    pub state_dir: PathBuf,
    #[serde(default)]
    pub log: PathBuf,
    /// Its `--label`s (`dev up --racks` gives each node a `rack`), kept so that a restart
    /// gives them again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Where it serves `/metrics` and health over HTTP, as for a coordinator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

/// `DIR/cluster.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// The cluster's id, once `dev up` has initialised it (`quotient cluster init`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<ClusterId>,
    pub coordinators: Vec<CoordinatorEntry>,
    #[serde(default)]
    pub agents: Vec<AgentEntry>,
    /// Simulated GPUs per node, as `--gpus-per-node` made them (`None` in a folder of an
    /// older `dev up`, or while it has no agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// The simulated GPUs' class, as `--gpu-class` made it (`None` as above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_class: Option<String>,
    /// `--retain-finished` of the coordinators, in milliseconds, as `dev up` was last given it
    /// (`None`: the coordinators' default); every coordinator started later gets it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_finished_ms: Option<u64>,
}

impl ClusterFile {
    /// Reads `DIR/cluster.json`; `None` if there is none.
    pub fn read(dir: &Path) -> anyhow::Result<Option<ClusterFile>> {
        let path = dir.join(CLUSTER_FILE);
        let file = match fs::File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(error).with_context(|| format!("cannot open {}", path.display()))
            }
        };
        let Some(text) = read_text_at_most(file, CLUSTER_FILE_BYTES_MAX)
            .with_context(|| format!("cannot read {}", path.display()))?
        else {
            bail!(
                "{} is larger than {CLUSTER_FILE_BYTES_MAX} bytes",
                path.display()
            );
        };
        let cluster = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a cluster file of `quotient dev up`; use another --dir",
                path.display()
            )
        })?;
        Ok(Some(cluster))
    }

    /// Writes `DIR/cluster.json` through a temporary file, so a reader never sees half of it.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(CLUSTER_FILE);
        let temporary = dir.join(format!("{CLUSTER_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).context("cannot render cluster.json")?;
        fs::write(&temporary, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", temporary.display()))?;
        fs::rename(&temporary, &path).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Whether `pid` is a live process whose command line carries `marker` (our data dir).
pub fn is_running(pid: u32, marker: &Path) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let marker = marker.as_os_str().as_encoded_bytes();
    cmdline
        .split(|byte| *byte == 0)
        .any(|argument| argument == marker)
}

/// Sends `signal` to `pid`. A process already gone is not an error.
pub fn send_signal(pid: u32, signal: libc::c_int) -> anyhow::Result<()> {
    let pid = libc::pid_t::try_from(pid).context("pid out of range")?;
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let result = unsafe { libc::kill(pid, signal) };
    if result == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(error).with_context(|| format!("cannot signal process {pid}"))
}

/// Waits until none of `processes` (pid, marker) runs, or `deadline` passes; returns those
/// still running.
pub fn wait_until_stopped(processes: &[(u32, PathBuf)], deadline: Duration) -> Vec<u32> {
    let until = Instant::now() + deadline;
    loop {
        let running: Vec<u32> = processes
            .iter()
            .filter(|(pid, marker)| is_running(*pid, marker))
            .map(|(pid, _)| *pid)
            .collect();
        if running.is_empty() || Instant::now() >= until {
            return running;
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

/// The last [`LOG_TAIL_BYTES`] of a log file, for an error message.
pub fn log_tail(path: &Path) -> String {
    let Ok(text) = fs::read(path) else {
        return format!("(no log at {})", path.display());
    };
    let start = text.len().saturating_sub(LOG_TAIL_BYTES as usize);
    String::from_utf8_lossy(&text[start..])
        .trim_end()
        .to_string()
}

/// A binary that sits next to the running `quotient` executable, if it is there.
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let current = std::env::current_exe().context("cannot find the quotient executable")?;
    let folder = current
        .parent()
        .context("the quotient executable has no folder")?;
    Ok(folder.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_json_has_the_spec_shape_and_round_trips() {
        // Proves the field names of docs/cli.md and that a stopped process is pid null.
        let cluster = ClusterFile {
            cluster_id: None,
            coordinators: vec![CoordinatorEntry {
                id: 1,
                pid: Some(1234),
                address: "127.0.0.1:7401".into(),
                data_dir: "/d/coord-1/data".into(),
                log: "/d/coord-1/coordinator.log".into(),
                metrics: Some("127.0.0.1:9400".into()),
                aws_endpoint: Some("https://127.0.0.1:9443".into()),
            }],
            agents: vec![AgentEntry {
                name: "node-1".into(),
                pid: None,
                state_dir: "/d/node-1/state".into(),
                log: "/d/node-1/agent.log".into(),
                labels: [("rack".to_string(), "rack-1".to_string())].into(),
                metrics: None,
            }],
            gpus_per_node: Some(4),
            gpu_class: Some("h100".into()),
            retain_finished_ms: Some(3_600_000),
        };
        let json = serde_json::to_value(&cluster).unwrap();
        assert_eq!(json["retain_finished_ms"], 3_600_000);
        assert_eq!(json["coordinators"][0]["metrics"], "127.0.0.1:9400");
        assert!(json["agents"][0].get("metrics").is_none());
        assert_eq!(json["coordinators"][0]["id"], 1);
        assert_eq!(json["coordinators"][0]["pid"], 1234);
        assert_eq!(json["coordinators"][0]["address"], "127.0.0.1:7401");
        assert_eq!(json["coordinators"][0]["data_dir"], "/d/coord-1/data");
        assert_eq!(json["agents"][0]["name"], "node-1");
        assert!(json["agents"][0]["pid"].is_null());
        assert_eq!(json["gpus_per_node"], 4);
        assert_eq!(json["gpu_class"], "h100");

        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ClusterFile::read(dir.path()).unwrap(), None);
        cluster.write(dir.path()).unwrap();
        assert_eq!(ClusterFile::read(dir.path()).unwrap(), Some(cluster));
    }

    #[test]
    fn a_pid_counts_only_with_our_marker() {
        // Proves a reused pid running something else is not taken for a coordinator.
        let me = std::process::id();
        assert!(!is_running(me, Path::new("/no/such/data/dir")));
        assert!(!is_running(u32::MAX - 1, Path::new("/x")));
    }
}
