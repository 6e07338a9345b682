//! End to end on real processes: `quotient dev up --nodes 0` starts three coordinators, the
//! client commands create shares and jobs through them (also through a follower, whose
//! redirect the user never sees), `dev up` with nodes adds three agents, and
//! `quotient dev down` stops them all.
//!
//! The coordinator and agent binaries must sit next to `quotient` (all are in target/debug
//! after `cargo build`); the test does not build them, it fails saying so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn quotient_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quotient"))
}

/// Fails the test with a clear message unless quotient-coordinator and quotient-agent are
/// next to quotient.
fn require_coordinator_binary() {
    for name in ["quotient-coordinator", "quotient-agent"] {
        let binary = quotient_binary().with_file_name(name);
        assert!(
            binary.is_file(),
            "{} is missing: build the workspace first (`cargo build` at the workspace root), \
             so that {name} sits next to quotient",
            binary.display()
        );
    }
}

/// Runs quotient with `config` as $QUOTIENT_CONFIG.
fn quotient(config: &Path, arguments: &[&str]) -> Output {
    Command::new(quotient_binary())
        .args(arguments)
        .env("QUOTIENT_CONFIG", config)
        .output()
        .expect("the quotient binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command that must succeed and returns its stdout.
fn ok(config: &Path, arguments: &[&str]) -> String {
    let output = quotient(config, arguments);
    assert!(
        output.status.success(),
        "{arguments:?} failed: {}{}",
        text(&output.stderr),
        text(&output.stdout)
    );
    text(&output.stdout)
}

/// Runs a `-o json` command that must succeed and parses its one JSON document.
fn json(config: &Path, arguments: &[&str]) -> Value {
    let stdout = ok(config, arguments);
    serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{arguments:?}: {error}: {stdout}"))
}

/// Stops the cluster however the test ends: `dev down`, then SIGKILL for anything left.
struct ClusterGuard {
    dir: PathBuf,
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let _ = Command::new(quotient_binary())
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
            if let Some(pid) = entry["pid"].as_i64() {
                // SAFETY: kill(2) on a pid this test started; no memory is involved.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
    }
}

#[test]
fn a_local_cluster_serves_shares_and_jobs_and_stops() {
    // Proves dev up/down and every client command against three real coordinators.
    require_coordinator_binary();
    let tempdir = tempfile::tempdir().unwrap();
    let dir = tempdir.path().join("cluster");
    let guard = ClusterGuard { dir: dir.clone() };
    let dir_text = dir.to_str().unwrap().to_string();
    let nowhere = tempdir.path().join("unused.toml");

    // --- dev up starts three coordinators and prints the export line
    let output = quotient(&nowhere, &["dev", "up", "--dir", &dir_text, "--nodes", "0"]);
    assert!(
        output.status.success(),
        "dev up failed: {}",
        text(&output.stderr)
    );
    let config = dir.canonicalize().unwrap().join("client.toml");
    assert_eq!(
        text(&output.stdout),
        format!("export QUOTIENT_CONFIG={}\n", config.display())
    );
    let cluster: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let coordinators = cluster["coordinators"].as_array().unwrap();
    assert_eq!(coordinators.len(), 3);
    for (index, entry) in coordinators.iter().enumerate() {
        assert_eq!(entry["id"], index as u64 + 1);
        assert!(entry["pid"].as_u64().is_some(), "{entry}");
        assert!(entry["address"].as_str().unwrap().starts_with("127.0.0.1:"));
        assert!(entry["data_dir"].is_string());
    }
    assert_eq!(cluster["agents"], serde_json::json!([]));

    // --- the cluster has a leader and three members
    let status = json(&config, &["cluster", "status", "-o", "json"]);
    let leader = status["leader"].as_u64().expect("a leader");
    assert!(status["term"].as_u64().unwrap() >= 1);
    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    assert!(members
        .iter()
        .any(|member| member["id"] == leader && member["role"] == "leader"));
    ok(&config, &["cluster", "health"]);

    // --- shares
    ok(
        &config,
        &[
            "share",
            "create",
            "qs1",
            "--limit",
            "a10g=1",
            "--strategy",
            "lend-and-borrow",
            "--borrow-limit",
            "200",
            "--in-share-preemption",
        ],
    );
    let created = json(
        &config,
        &[
            "share",
            "create",
            "qs2",
            "--limit",
            "a10g=2",
            "--strategy",
            "reserve",
            "-o",
            "json",
        ],
    );
    assert_eq!(created["name"], "qs2");
    let duplicate = quotient(
        &config,
        &[
            "share",
            "create",
            "qs2",
            "--limit",
            "a10g=2",
            "--strategy",
            "reserve",
        ],
    );
    assert_eq!(duplicate.status.code(), Some(1));
    assert!(
        text(&duplicate.stderr).starts_with("error[Conflict]: ")
            && text(&duplicate.stderr).contains("qs2"),
        "{}",
        text(&duplicate.stderr)
    );
    // A refusal with -o json is one document on stderr carrying its code.
    let missing = quotient(&config, &["job", "get", "j-999", "-o", "json"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(missing.stdout.is_empty());
    let refusal: serde_json::Value =
        serde_json::from_str(text(&missing.stderr).trim()).expect("one JSON document");
    assert_eq!(refusal["error"]["code"], "NotFound", "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no job j-999") && message.contains("quotient job list"),
        "{refusal}"
    );

    let shares = json(&config, &["share", "list", "-o", "json"]);
    let shares = shares.as_array().unwrap();
    assert_eq!(shares.len(), 2);
    let qs1 = shares.iter().find(|share| share["name"] == "qs1").unwrap();
    assert_eq!(qs1["strategy"], "lend-and-borrow");
    assert_eq!(qs1["limits"], serde_json::json!({"a10g": 1}));
    assert_eq!(qs1["borrow_limit_percent"], 200);
    assert_eq!(qs1["in_share_preemption"], true);
    assert_eq!(qs1["state"], "enabled");
    assert_eq!(qs1["runnable"], 0);
    assert_eq!(qs1["running"], 0);
    let table = ok(&config, &["share", "list"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("lend-and-borrow"), "{table}");

    // --- jobs: submit prints the id alone; -o json prints the job
    let id = ok(
        &config,
        &[
            "job",
            "submit",
            "--share",
            "qs1",
            "--priority",
            "3",
            "--gpus",
            "1",
            "--name",
            "high",
            "--grace-period",
            "30s",
            "--env",
            "A=1",
            "--",
            "sleep",
            "100",
        ],
    );
    let id = id.trim_end().to_string();
    assert!(id.starts_with("j-"), "{id}");
    let second = json(
        &config,
        &[
            "job",
            "submit",
            "--share",
            "qs2",
            "--priority",
            "1",
            "--gpus",
            "2",
            "-o",
            "json",
            "--idempotency-key",
            "once",
            "--",
            "true",
        ],
    );
    assert_eq!(second["share"], "qs2");
    assert_eq!(second["state"], "RUNNABLE");
    let again = ok(
        &config,
        &[
            "job",
            "submit",
            "--share",
            "qs2",
            "--priority",
            "1",
            "--gpus",
            "2",
            "--idempotency-key",
            "once",
            "--",
            "true",
        ],
    );
    assert_eq!(again.trim_end(), second["id"].as_str().unwrap());

    let page = json(&config, &["job", "list", "-o", "json"]);
    assert_eq!(page["next_page_token"], Value::Null, "{page}");
    let jobs = page["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(jobs[0]["id"], second["id"], "newest first: {jobs:?}");
    let high = jobs.iter().find(|job| job["id"] == id.as_str()).unwrap();
    assert_eq!(high["name"], "high");
    assert_eq!(high["share"], "qs1");
    assert_eq!(high["priority"], 3);
    assert_eq!(high["state"], "RUNNABLE");
    assert_eq!(high["gpus"], 1);
    assert_eq!(high["gpu_class"], "a10g");
    assert_eq!(high["node"], Value::Null);
    assert_eq!(high["attempts"], 0);
    assert_eq!(high["preemptions"], 0);
    let of_qs2 = json(&config, &["job", "list", "--share", "qs2", "-o", "json"]);
    assert_eq!(of_qs2["jobs"].as_array().unwrap().len(), 1);

    ok(&config, &["job", "update", &id, "--priority", "7"]);
    assert_eq!(
        json(&config, &["job", "get", &id, "-o", "json"])["priority"],
        7
    );
    let explained = json(&config, &["job", "explain", &id, "-o", "json"]);
    assert!(explained["summary"].is_string(), "{explained}");
    let cancelled = json(&config, &["job", "cancel", &id, "-o", "json"]);
    assert_eq!(cancelled["state"], "CANCELLED");
    let missing = quotient(&config, &["job", "get", "j-999"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(missing.stdout.is_empty());

    // --- a follower's redirect is followed, unseen
    let follower = members
        .iter()
        .find(|member| member["id"] != leader)
        .unwrap();
    let follower_config = tempdir.path().join("follower.toml");
    let original = std::fs::read_to_string(&config).unwrap();
    let only_follower = original
        .lines()
        .map(|line| {
            if line.starts_with("coordinators") {
                format!(
                    "coordinators = [\"{}\"]",
                    follower["address"].as_str().unwrap()
                )
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&follower_config, only_follower).unwrap();
    ok(
        &follower_config,
        &[
            "share",
            "create",
            "via-follower",
            "--limit",
            "a10g=1",
            "--strategy",
            "lend",
        ],
    );
    let got = json(
        &follower_config,
        &["share", "get", "via-follower", "-o", "json"],
    );
    assert_eq!(got["strategy"], "lend");

    // --- a user certificate may submit jobs but not manage shares
    let certs = dir.join("certs");
    let output = quotient(
        &nowhere,
        &[
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--role",
            "user",
            "--name",
            "alice",
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let alice_config = tempdir.path().join("alice.toml");
    std::fs::write(&alice_config, original.replace("admin", "alice")).unwrap();
    let refused = quotient(
        &alice_config,
        &[
            "share",
            "create",
            "mine",
            "--limit",
            "a10g=1",
            "--strategy",
            "lend",
        ],
    );
    assert_eq!(refused.status.code(), Some(1));
    let refusal = text(&refused.stderr);
    assert!(refusal.starts_with("error[Forbidden]: "), "{refusal}");
    assert!(refusal.contains("permission denied"), "{refusal}");
    assert!(refusal.contains("admin"), "{refusal}");
    let submitted = ok(
        &alice_config,
        &[
            "job",
            "submit",
            "--share",
            "qs1",
            "--priority",
            "1",
            "--gpus",
            "1",
            "--",
            "true",
        ],
    );
    assert!(submitted.starts_with("j-"), "{submitted}");

    // --- dev up again starts nothing new; with nodes it starts three agents
    let output = quotient(
        &nowhere,
        &[
            "dev", "up", "--dir", &dir_text, "--nodes", "0", "-o", "json",
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("started 0 of 3"),
        "{}",
        text(&output.stderr)
    );
    let up: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(up["cluster"]["coordinators"].as_array().unwrap().len(), 3);
    assert_eq!(
        up["export"],
        format!("export QUOTIENT_CONFIG={}", config.display())
    );
    let output = quotient(&nowhere, &["dev", "up", "--dir", &dir_text]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("3 nodes are ready"),
        "{}",
        text(&output.stderr)
    );
    let nodes = json(&config, &["node", "list", "-o", "json"]);
    let mut ready: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["state"] == "ready")
        .map(|node| node["name"].as_str().unwrap())
        .collect();
    ready.sort_unstable();
    assert_eq!(ready, ["node-1", "node-2", "node-3"], "{nodes}");
    let cluster: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let agents = cluster["agents"].as_array().unwrap().clone();
    assert_eq!(agents.len(), 3, "{cluster}");
    assert!(
        agents.iter().all(|agent| agent["pid"].is_u64()),
        "{cluster}"
    );
    assert_eq!(
        json(&config, &["share", "list", "-o", "json"])
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // --- the leader is killed: the client finds the new one; dev up restarts the dead one
    let leader_pid = coordinators
        .iter()
        .find(|entry| entry["id"] == leader)
        .and_then(|entry| entry["pid"].as_i64())
        .unwrap();
    // SAFETY: kill(2) on a coordinator this test started; no memory is involved.
    unsafe {
        libc::kill(leader_pid as libc::pid_t, libc::SIGKILL);
    }
    ok(
        &config,
        &[
            "share",
            "create",
            "after-failover",
            "--limit",
            "a10g=1",
            "--strategy",
            "lend",
        ],
    );
    let status = json(&config, &["cluster", "status", "-o", "json"]);
    assert_ne!(status["leader"].as_u64(), Some(leader), "{status}");
    let output = quotient(&nowhere, &["dev", "up", "--dir", &dir_text, "--nodes", "0"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("started 1 of 3"),
        "{}",
        text(&output.stderr)
    );
    ok(&config, &["cluster", "health"]);
    let coordinators: Vec<Value> =
        serde_json::from_str::<Value>(&std::fs::read_to_string(dir.join("cluster.json")).unwrap())
            .unwrap()["coordinators"]
            .as_array()
            .unwrap()
            .clone();

    // --- dev down stops every process and marks it stopped
    let output = quotient(&nowhere, &["dev", "down", "--dir", &dir_text]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let cluster: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    for (entry, before) in cluster["coordinators"]
        .as_array()
        .unwrap()
        .iter()
        .zip(coordinators)
    {
        assert!(entry["pid"].is_null(), "{entry}");
        let pid = before["pid"].as_u64().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(cmdline.is_empty(), "coordinator {pid} still runs");
    }
    for (entry, before) in cluster["agents"].as_array().unwrap().iter().zip(&agents) {
        assert!(entry["pid"].is_null(), "{entry}");
        let pid = before["pid"].as_u64().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(cmdline.is_empty(), "agent {pid} still runs");
    }
    let stopped = quotient(&config, &["share", "list"]);
    assert_eq!(stopped.status.code(), Some(1));
    drop(guard);
}

/// The GPUs of the node named `name` in `node list -o json`, once it is ready.
fn ready_gpus(config: &Path, name: &str) -> Option<usize> {
    let nodes = json(config, &["node", "list", "-o", "json"]);
    nodes
        .as_array()?
        .iter()
        .find(|node| node["name"] == name && node["state"] == "ready")
        .and_then(|node| node["gpus"].as_array())
        .map(Vec::len)
}

#[test]
fn dev_up_on_an_existing_folder_keeps_its_gpus_per_node() {
    // Proves agents restarted by `dev up` on a stopped folder come back with the GPUs they
    // were made with (they came back with 1 each, so a job of 4 GPUs waited forever), and that
    // a --gpus-per-node contradicting the folder is refused.
    require_coordinator_binary();
    let tempdir = tempfile::tempdir().unwrap();
    let dir = tempdir.path().join("cluster");
    let guard = ClusterGuard { dir: dir.clone() };
    let dir_text = dir.to_str().unwrap().to_string();
    let nowhere = tempdir.path().join("unused.toml");
    let up = |extra: &[&str]| {
        let mut arguments = vec!["dev", "up", "--dir", &dir_text];
        arguments.extend_from_slice(extra);
        let output = quotient(&nowhere, &arguments);
        assert!(
            output.status.success(),
            "{arguments:?} failed: {}",
            text(&output.stderr)
        );
    };
    up(&[
        "--coordinators",
        "1",
        "--nodes",
        "3",
        "--gpus-per-node",
        "4",
        "--gpu-class",
        "h100",
        "--racks",
        "2",
    ]);
    let config = dir.canonicalize().unwrap().join("client.toml");
    assert_eq!(ready_gpus(&config, "node-1"), Some(4));
    // --racks spreads the nodes over rack labels round-robin; each node advertises the
    // address it reaches the coordinators from (loopback here).
    let racks = |nodes: &Value| -> Vec<String> {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .map(|node| {
                format!(
                    "{}:{}",
                    node["name"].as_str().unwrap(),
                    node["labels"]["rack"]
                )
            })
            .collect()
    };
    let nodes = json(&config, &["node", "list", "-o", "json"]);
    assert_eq!(
        racks(&nodes),
        [
            "node-1:\"rack-1\"",
            "node-2:\"rack-2\"",
            "node-3:\"rack-1\""
        ],
        "{nodes}"
    );
    assert_eq!(nodes[0]["address"], "127.0.0.1", "{nodes}");
    let table = ok(&config, &["node", "list"]);
    assert!(
        table.lines().next().unwrap().ends_with("LABELS") && table.contains("rack=rack-2"),
        "{table}"
    );
    let down = quotient(&nowhere, &["dev", "down", "--dir", &dir_text]);
    assert!(down.status.success(), "{}", text(&down.stderr));

    up(&[]);
    assert_eq!(ready_gpus(&config, "node-1"), Some(4), "after dev up again");
    let nodes = json(&config, &["node", "list", "-o", "json"]);
    assert_eq!(nodes[0]["gpus"][0]["class"], "h100", "{nodes}");
    assert_eq!(
        racks(&nodes),
        [
            "node-1:\"rack-1\"",
            "node-2:\"rack-2\"",
            "node-3:\"rack-1\""
        ],
        "the labels after dev up again: {nodes}"
    );
    ok(
        &config,
        &[
            "share",
            "create",
            "big",
            "--limit",
            "h100=4",
            "--strategy",
            "reserve",
        ],
    );
    let job = ok(
        &config,
        &[
            "job", "submit", "--share", "big", "--gpus", "4", "--", "sleep", "30",
        ],
    );
    let job = job.trim_end();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let view = json(&config, &["job", "get", job, "-o", "json"]);
        if view["state"] == "RUNNING" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a job of 4 GPUs did not run: {view}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    let refused = quotient(
        &nowhere,
        &["dev", "up", "--dir", &dir_text, "--gpus-per-node", "2"],
    );
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("4 GPUs each"),
        "{}",
        text(&refused.stderr)
    );
    drop(guard);
}

/// Starts one more agent, named `name` with one a10g GPU, in the cluster of `dir` (whose
/// certificates issue its own); its stderr goes to `log`, which is no terminal.
fn start_extra_agent(dir: &Path, config: &Path, name: &str, log: &Path) -> std::process::Child {
    let certs = dir.join("certs");
    let issued = quotient(
        config,
        &[
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--role",
            "agent",
            "--name",
            name,
        ],
    );
    assert!(issued.status.success(), "{}", text(&issued.stderr));
    let cluster: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let coordinators: Vec<&str> = cluster["coordinators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["address"].as_str().unwrap())
        .collect();
    let log = std::fs::File::create(log).unwrap();
    Command::new(quotient_binary().with_file_name("quotient-agent"))
        .args([
            "run",
            "--name",
            name,
            "--coordinators",
            &coordinators.join(","),
        ])
        .arg("--ca")
        .arg(certs.join("ca.pem"))
        .arg("--cert")
        .arg(certs.join(format!("{name}.pem")))
        .arg("--key")
        .arg(certs.join(format!("{name}-key.pem")))
        .arg("--state-dir")
        .arg(dir.join(name).join("state"))
        .args(["--runtime", "process", "--simulated-gpus", "1xa10g"])
        // Tests run as root in CI; a dev cluster's jobs run as whoever runs it.
        .arg("--allow-root-jobs")
        .env_remove("NO_COLOR")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("quotient-agent starts")
}

/// Kills an extra agent however the test ends.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn small_things_read_plainly() {
    // Proves: `node list` in natural name order (node-2 before node-10); an unknown share
    // in `job submit` and `job list --share` is an error offering a near name; a killed
    // member shows `unreachable` in `cluster status`, not `follower`; the coordinators' and
    // agents' logs written to files carry no colour codes.
    require_coordinator_binary();
    let tempdir = tempfile::tempdir().unwrap();
    let dir = tempdir.path().join("cluster");
    let guard = ClusterGuard { dir: dir.clone() };
    let dir_text = dir.to_str().unwrap().to_string();
    let nowhere = tempdir.path().join("unused.toml");
    let output = quotient(&nowhere, &["dev", "up", "--dir", &dir_text, "--nodes", "2"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let dir = dir.canonicalize().unwrap();
    let config = dir.join("client.toml");

    // --- node list: registered node-1, node-2, node-10, then a-node; listed by name
    let mut extras = Vec::new();
    for name in ["node-10", "a-node"] {
        let log = tempdir.path().join(format!("{name}.log"));
        extras.push(ChildGuard(start_extra_agent(&dir, &config, name, &log)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while ready_gpus(&config, name).is_none() {
            assert!(std::time::Instant::now() < deadline, "{name} never ready");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    let nodes = json(&config, &["node", "list", "-o", "json"]);
    let names: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a-node", "node-1", "node-2", "node-10"], "{nodes}");
    let table = ok(&config, &["node", "list"]);
    let rows: Vec<&str> = table
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(rows, names, "{table}");

    // --- an unknown share: an error, with the near name when there is one
    ok(
        &config,
        &[
            "share",
            "create",
            "team-a",
            "--limit",
            "a10g=1",
            "--strategy",
            "lend",
        ],
    );
    let submitted = quotient(
        &config,
        &[
            "job", "submit", "--share", "team", "--gpus", "1", "--", "true",
        ],
    );
    assert_eq!(submitted.status.code(), Some(1));
    assert!(
        text(&submitted.stderr).contains("no share named team: did you mean team-a?"),
        "{}",
        text(&submitted.stderr)
    );
    let listed = quotient(&config, &["job", "list", "--share", "teem-a"]);
    assert_eq!(listed.status.code(), Some(1), "{}", text(&listed.stdout));
    assert!(listed.stdout.is_empty());
    assert!(
        text(&listed.stderr).contains("no share named teem-a: did you mean team-a?"),
        "{}",
        text(&listed.stderr)
    );
    let listed = quotient(&config, &["job", "list", "--share", "nosuch", "-o", "json"]);
    assert_eq!(listed.status.code(), Some(1));
    let refusal: Value = serde_json::from_slice(&listed.stderr).unwrap();
    assert_eq!(refusal["error"]["code"], "NotFound", "{refusal}");
    assert!(
        !refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("did you mean"),
        "{refusal}"
    );
    assert_eq!(
        json(&config, &["job", "list", "--share", "team-a", "-o", "json"]),
        serde_json::json!({"jobs": [], "next_page_token": null})
    );

    // --- a killed follower is unreachable, not a follower
    let status = json(&config, &["cluster", "status", "-o", "json"]);
    let leader = status["leader"].as_u64().unwrap();
    let cluster: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let follower = cluster["coordinators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["id"] != leader)
        .unwrap();
    let follower_id = follower["id"].as_u64().unwrap();
    // SAFETY: kill(2) on a coordinator this test started; no memory is involved.
    unsafe {
        libc::kill(
            follower["pid"].as_i64().unwrap() as libc::pid_t,
            libc::SIGKILL,
        );
    }
    let status = json(&config, &["cluster", "status", "-o", "json"]);
    let member = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|member| member["id"] == follower_id)
        .unwrap()
        .clone();
    assert_eq!(member["status"], "unreachable", "{status}");
    assert_eq!(member["role"], "follower", "the Raft role stays: {status}");
    let table = ok(&config, &["cluster", "status"]);
    let row = table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(&follower_id.to_string()))
        .unwrap();
    assert!(row.contains("unreachable"), "{table}");
    assert!(!row.contains("follower"), "{table}");

    // --- logs written to files have no colour codes
    let mut logs = vec![
        dir.join("coord-1").join("coordinator.log"),
        dir.join("node-1").join("agent.log"),
    ];
    logs.extend(["node-10", "a-node"].map(|name| tempdir.path().join(format!("{name}.log"))));
    for log in logs {
        let content = std::fs::read_to_string(&log).unwrap();
        assert!(content.contains("INFO"), "{}: {content}", log.display());
        assert!(
            !content.contains('\u{1b}'),
            "{} has colour codes: {content}",
            log.display()
        );
    }
    drop(extras);
    drop(guard);
}
