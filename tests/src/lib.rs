//! Integration tests that start the real Quotient binaries (coordinators, agents, CLI) as
//! processes on loopback and drive them end to end.
//!
//! The cluster tests of one binary live beside it (`coordinator/tests/`, `cli/tests/`),
//! where cargo hands them its path. This crate holds the tests that need all three at once
//! (`tests/walkthrough.rs`: the seed's walkthrough through real jobs). Cargo builds no
//! other package's binaries for them, so [`binaries`] finds them next to each other in the
//! target folder and fails with a message to build the workspace when one is missing.
//!
//! [`DevCluster`] is a `quotient dev up` cluster that is stopped however the test ends
//! (`dev down`, then SIGKILL of whatever is left), whose leader a test can kill
//! ([`DevCluster::kill_leader_then`]); [`poll_until`] waits with a deadline.

pub mod chaos;
pub mod fault_proxy;
pub mod fleet;
pub mod prometheus;
pub mod walkthrough;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The three binaries the tests start.
pub const BINARY_NAMES: [&str; 3] = ["quotient", "quotient-coordinator", "quotient-agent"];
/// Pause between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The folder holding the workspace's binaries: the profile folder above this test
/// executable (`target/debug/deps/TEST` -> `target/debug`). Panics with what to do when a
/// binary is missing.
pub fn binaries() -> PathBuf {
    let executable = std::env::current_exe().expect("the test executable's path");
    let folder = executable
        .parent()
        .and_then(Path::parent)
        .expect("the test executable sits in target/PROFILE/deps")
        .to_path_buf();
    for name in BINARY_NAMES {
        let binary = folder.join(name);
        assert!(
            binary.is_file(),
            "{} is missing: build the workspace first (`cargo build` at the workspace root, \
             with the same profile as the tests), so that {} sit next to each other",
            binary.display(),
            BINARY_NAMES.join(", ")
        );
    }
    folder
}

/// Where [`free_ports`] picks from: at least this port, and below the kernel's ephemeral range.
const TEST_PORTS_FLOOR: u16 = 10_000;

/// `count` distinct ports on 127.0.0.1, each free for both UDP and TCP when picked, for
/// processes a test starts and tells where to listen.
///
/// They come from below the kernel's ephemeral range (`ip_local_port_range`). A port the
/// kernel hands out for port 0 is one it can hand out again at once, to any test's client
/// socket, before the process meant for it binds it (a coordinator that then exits with
/// "Address already in use"). A port below that range is only taken by a bind that names
/// it. The start is random, so that tests picking at the same time pick apart.
pub fn free_ports(count: usize) -> Vec<u16> {
    let ceiling = ephemeral_low().max(TEST_PORTS_FLOOR + 1_000);
    let span = u64::from(ceiling - TEST_PORTS_FLOOR);
    let random = {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.finish()
    };
    let mut ports = Vec::with_capacity(count);
    for step in 0..span {
        let port = TEST_PORTS_FLOOR + ((random.wrapping_add(step)) % span) as u16;
        let free = std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free {
            ports.push(port);
            if ports.len() == count {
                return ports;
            }
        }
    }
    panic!("fewer than {count} free ports between {TEST_PORTS_FLOOR} and {ceiling} on 127.0.0.1");
}

/// The first port of the kernel's ephemeral range (32768, Linux's default, where it cannot
/// be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// `docker ARGS`, its output; panics when the docker CLI cannot run.
pub fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("docker {args:?} could not run: {error}"))
}

/// Whether this host's Docker engine answers, with `image` in it. Under `CI=true` a test
/// that needs Docker must not skip: this panics there when the engine does not answer, and
/// anywhere when the image is missing (it says how to build it).
pub fn docker_ready(image: &str) -> bool {
    let reachable = Command::new("docker")
        .arg("info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !reachable {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "Docker is not reachable, and CI must run the container tests: start the Docker engine"
        );
        eprintln!("SKIPPED: Docker is not reachable; this test needs it (CI runs it)");
        return false;
    }
    assert!(
        docker(&["image", "inspect", image]).status.success(),
        "the image {image} is missing: build it with `bash agent/tests/docker/build-test-image.sh`"
    );
    true
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A local cluster started with `quotient dev up`; stopped when dropped.
pub struct DevCluster {
    pub root: tempfile::TempDir,
    pub dir: PathBuf,
    pub config: PathBuf,
    quotient: PathBuf,
}

impl DevCluster {
    /// `quotient dev up --dir ROOT/cluster` with `arguments` (e.g. `--nodes 3`).
    pub fn up(arguments: &[&str]) -> DevCluster {
        DevCluster::up_with_env(arguments, &[])
    }

    /// [`DevCluster::up`] with environment variables for `dev up`, which its coordinators and
    /// agents inherit (e.g. `QUOTIENT_AGENT_LOG_MAX_BYTES`).
    pub fn up_with_env(arguments: &[&str], env: &[(&str, &str)]) -> DevCluster {
        let quotient = binaries().join("quotient");
        let root = tempfile::tempdir().expect("a temporary directory");
        let dir = root.path().join("cluster");
        let config = dir.join("client.toml");
        let cluster = DevCluster {
            root,
            dir,
            config,
            quotient,
        };
        let dir_text = cluster.dir.display().to_string();
        let mut all = vec!["dev", "up", "--dir", &dir_text];
        all.extend_from_slice(arguments);
        let output = Command::new(&cluster.quotient)
            .args(&all)
            .env("QUOTIENT_CONFIG", &cluster.config)
            .envs(env.iter().copied())
            .output()
            .expect("the quotient binary runs");
        assert!(
            output.status.success(),
            "dev up failed: {}{}",
            text(&output.stderr),
            cluster.logs()
        );
        eprintln!("local cluster in {}", cluster.dir.display());
        cluster
    }

    /// Runs `quotient` with this cluster's client config.
    pub fn run(&self, arguments: &[&str]) -> Output {
        Command::new(&self.quotient)
            .args(arguments)
            .env("QUOTIENT_CONFIG", &self.config)
            .output()
            .expect("the quotient binary runs")
    }

    /// Runs a command that must succeed; its stdout.
    pub fn ok(&self, arguments: &[&str]) -> String {
        let output = self.run(arguments);
        assert!(
            output.status.success(),
            "{arguments:?} failed: {}{}",
            text(&output.stderr),
            text(&output.stdout)
        );
        text(&output.stdout)
    }

    /// `quotient job submit --share SHARE --priority 1 --gpus 1 EXTRA... -- COMMAND...`, which
    /// must succeed; the job's id.
    pub fn submit(&self, share: &str, extra: &[&str], command: &[&str]) -> String {
        let mut arguments = vec![
            "job",
            "submit",
            "--share",
            share,
            "--priority",
            "1",
            "--gpus",
            "1",
        ];
        arguments.extend_from_slice(extra);
        arguments.push("--");
        arguments.extend_from_slice(command);
        self.ok(&arguments).trim().to_string()
    }

    /// `quotient share create NAME --limit a10g=GPUS --strategy STRATEGY EXTRA...`, which must
    /// succeed.
    pub fn create_share(&self, name: &str, gpus: u32, strategy: &str, extra: &[&str]) {
        let limit = format!("a10g={gpus}");
        let mut arguments = vec![
            "share",
            "create",
            name,
            "--limit",
            &limit,
            "--strategy",
            strategy,
        ];
        arguments.extend_from_slice(extra);
        self.ok(&arguments);
    }

    /// One coordinator, one agent with one GPU, and a share `team` that may use it: the
    /// cluster of most end-to-end tests of jobs.
    pub fn one_gpu() -> DevCluster {
        let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "1"]);
        cluster.create_share("team", 1, "lend", &[]);
        cluster
    }

    /// `job get -o json` of `job` once it is in `state`; panics after `timeout`.
    pub fn wait_for_state(&self, job: &str, state: &str, timeout: Duration) -> Value {
        poll_until(&format!("{job} to be {state}"), timeout, || {
            let view = self.json(&["job", "get", job, "-o", "json"]);
            if view["state"] == state {
                Ok(view)
            } else {
                Err(view.to_string())
            }
        })
    }

    /// Issues a certificate of `role` named `name` in the cluster's CA folder and writes a client
    /// config using it, talking to `coordinators` (all of the cluster's when empty); its path.
    pub fn identity(&self, role: &str, name: &str, coordinators: &[String]) -> PathBuf {
        let certs = self.dir.join("certs");
        if !certs.join(format!("{name}.pem")).exists() {
            self.ok(&[
                "certs",
                "issue",
                "--dir",
                &certs.display().to_string(),
                "--role",
                role,
                "--name",
                name,
            ]);
        }
        let admin = std::fs::read_to_string(&self.config).expect("the admin's client config");
        let mut config = String::new();
        for line in admin.lines() {
            if line.starts_with("cert ") || line.starts_with("cert=") {
                config.push_str(&format!(
                    "cert = \"{}\"\n",
                    certs.join(format!("{name}.pem")).display()
                ));
            } else if line.starts_with("key ") || line.starts_with("key=") {
                config.push_str(&format!(
                    "key = \"{}\"\n",
                    certs.join(format!("{name}-key.pem")).display()
                ));
            } else if line.starts_with("coordinators") && !coordinators.is_empty() {
                let list: Vec<String> = coordinators.iter().map(|c| format!("\"{c}\"")).collect();
                config.push_str(&format!("coordinators = [{}]\n", list.join(", ")));
            } else {
                config.push_str(line);
                config.push('\n');
            }
        }
        let suffix = if coordinators.is_empty() {
            String::new()
        } else {
            format!("-{}", coordinators.join("_").replace([':', '.'], "-"))
        };
        let path = self.dir.join(format!("client-{name}{suffix}.toml"));
        std::fs::write(&path, config).expect("the client config is written");
        path
    }

    /// The dev cluster's `cluster.json`.
    pub fn cluster_file(&self) -> Value {
        let file = std::fs::read_to_string(self.dir.join("cluster.json")).expect("cluster.json");
        serde_json::from_str(&file).expect("cluster.json is JSON")
    }

    /// The metrics addresses `cluster.json` records under `kind` (`coordinators`, `agents`).
    pub fn metrics_addresses(&self, kind: &str) -> Vec<String> {
        let file = self.cluster_file();
        file[kind]
            .as_array()
            .into_iter()
            .flatten()
            .map(|entry| {
                entry["metrics"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no metrics address in {entry}"))
                    .to_string()
            })
            .collect()
    }

    /// The pid of the dev cluster's agent `name`, from its `cluster.json`.
    pub fn agent_pid(&self, name: &str) -> libc::pid_t {
        let file = self.cluster_file();
        file["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|agent| agent["name"] == name)
            .and_then(|agent| agent["pid"].as_i64())
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .unwrap_or_else(|| panic!("no running agent {name} in {file}"))
    }

    /// `node list -o json`'s entry of the node named `name`, if there is one.
    pub fn node(&self, name: &str) -> Option<Value> {
        let list = self.json(&["node", "list", "-o", "json"]);
        list.as_array()
            .into_iter()
            .flatten()
            .find(|node| node["name"] == name)
            .cloned()
    }

    /// Runs a `-o json` command that must succeed; its JSON document.
    pub fn json(&self, arguments: &[&str]) -> Value {
        let stdout = self.ok(arguments);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|error| panic!("{arguments:?}: {error}: {stdout}"))
    }

    /// The coordinators' addresses and the admin's certificate files, from the client config:
    /// what an in-process API client of this cluster connects with.
    pub fn admin_tls(&self) -> (Vec<String>, quotient_common::tls::TlsFiles) {
        let config: toml::Value =
            toml::from_str(&std::fs::read_to_string(&self.config).expect("the client config"))
                .expect("the client config is TOML");
        let file = |key: &str| self.dir.join(config[key].as_str().expect("a path"));
        let addresses = config["coordinators"]
            .as_array()
            .expect("coordinators")
            .iter()
            .map(|address| address.as_str().expect("an address").to_string())
            .collect();
        let tls = quotient_common::tls::TlsFiles {
            ca: file("ca"),
            cert: file("cert"),
            key: file("key"),
        };
        (addresses, tls)
    }

    /// A fleet of `nodes` simulated nodes of `gpus_per_node` GPUs for this cluster
    /// ([`fleet::Fleet`]): its coordinators, and its CA to issue the nodes' certificates.
    pub fn fleet_config(&self, nodes: u32, gpus_per_node: u32) -> fleet::FleetConfig {
        let (addresses, tls) = self.admin_tls();
        let ca_dir = tls
            .ca
            .parent()
            .expect("the CA file is in a folder")
            .to_path_buf();
        fleet::FleetConfig::new(addresses, ca_dir, nodes, gpus_per_node)
    }

    /// Every job `quotient job list --all ARGUMENTS -o json` lists, in submit order (the list
    /// is newest first).
    pub fn jobs(&self, arguments: &[&str]) -> Vec<Value> {
        let mut command = vec!["job", "list", "--all"];
        command.extend_from_slice(arguments);
        command.extend_from_slice(&["-o", "json"]);
        let page = self.json(&command);
        assert_eq!(
            page["next_page_token"],
            Value::Null,
            "--all walks every page"
        );
        let mut jobs = page["jobs"]
            .as_array()
            .unwrap_or_else(|| panic!("a page of jobs: {page}"))
            .clone();
        jobs.reverse();
        jobs
    }

    /// Waits until `cluster health` shows all `count` coordinators at one applied index with
    /// one state digest: every replica applied the same entries to the same state (the
    /// scheduler's rounds may move the index, so it polls).
    pub fn wait_replicas_agree(&self, count: usize, timeout: Duration) {
        poll_until(
            &format!("the {count} coordinators at one index and digest"),
            timeout,
            || {
                let output = self.run(&["cluster", "health", "-o", "json"]);
                let entries: Value = serde_json::from_slice(&output.stdout).map_err(|error| {
                    format!("{error}: {}", String::from_utf8_lossy(&output.stdout))
                })?;
                let seen: Vec<(Value, Value)> = entries
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|entry| {
                        let health = &entry["health"];
                        (
                            health["last_applied"].clone(),
                            health["state_digest"].clone(),
                        )
                    })
                    .collect();
                let agree = seen.len() == count && seen.iter().all(|pair| pair == &seen[0]);
                if agree && output.status.success() {
                    Ok(())
                } else {
                    Err(entries.to_string())
                }
            },
        );
    }

    /// Each coordinator's id and process id, from `cluster.json`.
    pub fn coordinator_pids(&self) -> Vec<(u64, libc::pid_t)> {
        let file = self.cluster_file();
        file["coordinators"]
            .as_array()
            .expect("coordinators")
            .iter()
            .filter_map(|entry| {
                let pid = libc::pid_t::try_from(entry["pid"].as_i64()?).ok()?;
                Some((entry["id"].as_u64()?, pid))
            })
            .collect()
    }

    /// The leading coordinator's id and process id, from `cluster status` and `cluster.json`.
    pub fn leader(&self) -> (u64, libc::pid_t) {
        let status = self.json(&["cluster", "status", "-o", "json"]);
        let leader = status["leader"].as_u64().expect("a leader");
        let pid = self
            .coordinator_pids()
            .into_iter()
            .find(|(id, _)| *id == leader)
            .map(|(_, pid)| pid)
            .expect("the leader's pid");
        (leader, pid)
    }

    /// The process ids of the coordinators other than `leader`.
    pub fn follower_pids(&self, leader: u64) -> Vec<libc::pid_t> {
        self.coordinator_pids()
            .into_iter()
            .filter(|(id, _)| *id != leader)
            .map(|(_, pid)| pid)
            .collect()
    }

    /// Waits until `cluster health` reports every coordinator healthy.
    pub fn wait_healthy(&self, timeout: Duration) {
        poll_until("every coordinator healthy", timeout, || {
            let output = self.run(&["cluster", "health"]);
            if output.status.success() {
                Ok(())
            } else {
                Err(text(&output.stderr))
            }
        });
    }

    /// SIGKILLs the leading coordinator and at once runs `quotient ARGUMENTS`; the time from
    /// the kill to the command's exit, and its output.
    pub fn kill_leader_then(&self, arguments: &[&str]) -> (Duration, Output) {
        let killed = self.kill_leader();
        let output = self.run(arguments);
        (killed.elapsed(), output)
    }

    /// SIGKILLs the leading coordinator; when.
    pub fn kill_leader(&self) -> Instant {
        let (leader, pid) = self.leader();
        eprintln!("--- coordinator {leader}, the leader, is killed");
        let killed = Instant::now();
        // SAFETY: kill(2) on a coordinator this cluster started; plain integers.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        killed
    }

    /// The end of every coordinator and agent log, for a failure message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return all;
        };
        for entry in entries.flatten() {
            for name in ["coordinator.log", "agent.log"] {
                let path = entry.path().join(name);
                let Ok(log) = std::fs::read_to_string(&path) else {
                    continue;
                };
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                all.push_str(&format!("\n==== {} (last lines)\n", path.display()));
                for line in tail.into_iter().rev() {
                    all.push_str(line);
                    all.push('\n');
                }
            }
        }
        all
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let _ = Command::new(&self.quotient)
            .args(["dev", "down", "--dir"])
            .arg(&self.dir)
            .output();
        let Ok(cluster) = std::fs::read_to_string(self.dir.join("cluster.json")) else {
            return;
        };
        let Ok(cluster) = serde_json::from_str::<Value>(&cluster) else {
            return;
        };
        let agents = cluster["agents"].as_array().into_iter().flatten();
        for entry in cluster["coordinators"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(agents)
        {
            if let Some(pid) = entry["pid"]
                .as_i64()
                .and_then(|p| libc::pid_t::try_from(p).ok())
            {
                // SAFETY: kill(2) on a pid this test's cluster started; plain integers.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// The write a failover test or benchmark times: a one-GPU job of share `team` running
/// `true`, submitted through the CLI ([`failover_cluster`] makes the share).
pub const FAILOVER_SUBMIT: [&str; 10] = [
    "job",
    "submit",
    "--share",
    "team",
    "--priority",
    "1",
    "--gpus",
    "1",
    "--",
    "true",
];

/// Three coordinators and no agent (`dev up --nodes 0`), with the share `team` that
/// [`FAILOVER_SUBMIT`] submits to.
pub fn failover_cluster() -> DevCluster {
    let cluster = DevCluster::up(&["--nodes", "0"]);
    cluster.create_share("team", 1, "lend", &[]);
    cluster
}

/// A training job: records each start (and the checkpoint it resumes from) in its
/// checkpoint folder, and on SIGTERM writes a checkpoint naming its attempt and exits 0.
/// The folder is `$CHECKPOINTS/$NAME`, shared by every node of this one-host cluster (as
/// shared storage would be), so an attempt on another node still finds its checkpoint.
pub const JOB_SCRIPT: &str = r#"#!/bin/sh
dir="$CHECKPOINTS/$NAME"
mkdir -p "$dir"
echo "start attempt=$QUOTIENT_ATTEMPT job=$QUOTIENT_JOB_ID resume=$(cat "$dir/checkpoint" 2>/dev/null)" >> "$dir/starts"
trap 'echo "attempt $QUOTIENT_ATTEMPT" > "$dir/checkpoint"; exit 0' TERM
while true; do sleep 0.1; done
"#;

/// Writes [`JOB_SCRIPT`] as `FOLDER/train.sh`, executable; its path.
pub fn write_job_script(folder: &Path) -> String {
    let path = folder.join("train.sh");
    std::fs::write(&path, JOB_SCRIPT).expect("the job script is written");
    let mut permissions = std::fs::metadata(&path).expect("the script").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).expect("the script is executable");
    path.display().to_string()
}

/// libfaketime's library, where Debian's `faketime` puts it; `None` if it is not installed
/// (which fails the test under `CI=true`: `.ci/run` installs it).
pub fn libfaketime() -> Option<PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"))
        .find(|path| path.exists());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "libfaketime is not installed (apt-get install faketime): the clock test needs it"
        );
        eprintln!("SKIPPED: libfaketime is not installed (apt-get install faketime)");
    }
    found
}

/// Calls `check` every [`POLL_INTERVAL`] until it gives `Some`, or panics after `timeout`
/// with what it waited for and the last thing `check` saw (`Err`).
pub fn poll_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let started = Instant::now();
    loop {
        let last = match check() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if started.elapsed() > timeout {
            panic!("gave up after {timeout:?} waiting for {what}; last seen: {last}");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}
