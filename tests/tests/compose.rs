//! The container image and the docker-compose HA cluster of deploy/: builds the image offline
//! from the workspace's binaries (deploy/image/build-offline.sh), brings
//! deploy/compose/docker-compose.yml up under a project name and host ports of its own, waits
//! for every container's health check, plays docs/quota-shares.md's walkthrough through the
//! host's CLI and the published ports (the states of tests/walkthrough.rs, with job scripts
//! that checkpoint into the agents' shared volume), kills the leader's container, shows that
//! writes go on through the other coordinators and that no job was lost or changed, and takes
//! the project down (`down -v`), leaving no container or volume behind, on failure too.
//!
//! Needs Docker and docker-compose (v1 `docker-compose` or v2 `docker compose`): without them
//! it fails when `CI=true` and is skipped, with the reason, otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use quotient_tests::walkthrough::{Walkthrough, WalkthroughCluster, STEP};
use quotient_tests::{binaries, poll_until};
use serde_json::Value;

/// The image the test builds and the project runs.
const IMAGE: &str = "quotient:compose-test";
/// How long the containers may take to become healthy.
const HEALTHY: Duration = Duration::from_secs(120);
/// The services that keep running, and have health checks.
const LONG_RUNNING: [&str; 6] = [
    "coord-1", "coord-2", "coord-3", "agent-1", "agent-2", "agent-3",
];
/// Where every agent mounts the shared checkpoint volume.
const CHECKPOINT_ROOT: &str = "/var/lib/quotient/checkpoints";

/// A training job for the agents' containers (busybox sh): records each start, and the
/// checkpoint it resumes from, in its checkpoint dir (shared by every agent), and on SIGTERM
/// writes a checkpoint naming its attempt and exits 0. tests/src/lib.rs's JOB_SCRIPT, with
/// the agent's own checkpoint dir.
const JOB_SCRIPT: &str = r#"dir="$QUOTIENT_CHECKPOINT_DIR"
echo "start attempt=$QUOTIENT_ATTEMPT job=$QUOTIENT_JOB_ID resume=$(cat "$dir/checkpoint" 2>/dev/null)" >> "$dir/starts"
echo "attempt $QUOTIENT_ATTEMPT of $QUOTIENT_JOB_ID runs on $(hostname)"
trap 'echo "attempt $QUOTIENT_ATTEMPT" > "$dir/checkpoint"; exit 0' TERM
while true; do sleep 0.1; done"#;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command; its output (a command that cannot start is `None`).
fn run(command: &mut Command) -> Option<Output> {
    command.output().ok()
}

/// The compose command here: `docker-compose` (v1), else `docker compose` (v2); or why
/// neither can run the test.
fn compose_command() -> Result<Vec<String>, String> {
    let docker = run(Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"]));
    match docker {
        None => return Err("the docker CLI is not installed".to_string()),
        Some(output) if !output.status.success() => {
            return Err(format!(
                "the Docker daemon is not reachable: {}",
                text(&output.stderr).trim()
            ))
        }
        Some(_) => {}
    }
    let v1 = run(Command::new("docker-compose").arg("version"));
    if v1.is_some_and(|output| output.status.success()) {
        return Ok(vec!["docker-compose".to_string()]);
    }
    let v2 = run(Command::new("docker").args(["compose", "version"]));
    if v2.is_some_and(|output| output.status.success()) {
        return Ok(vec!["docker".to_string(), "compose".to_string()]);
    }
    Err("neither docker-compose nor `docker compose` is installed".to_string())
}

/// The workspace's root (this crate is `tests/` in it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_path_buf()
}

/// A compose project of deploy/compose/docker-compose.yml; taken down (`down -v`) when
/// dropped, whatever happened.
struct Project {
    compose: Vec<String>,
    file: PathBuf,
    name: String,
    env: Vec<(String, String)>,
    client: tempfile::TempDir,
    ports: Vec<u16>,
    quotient: PathBuf,
    down: bool,
}

impl Project {
    fn new(compose: Vec<String>) -> Project {
        let client = tempfile::tempdir().expect("a temporary directory");
        let ports = quotient_tests::free_ports(3);
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let name = format!(
            "quotient-compose-test-{}-{}",
            std::process::id(),
            started.as_millis() % 1_000_000
        );
        let mut env = vec![
            ("QUOTIENT_IMAGE".to_string(), IMAGE.to_string()),
            (
                "QUOTIENT_CLIENT_DIR".to_string(),
                client.path().display().to_string(),
            ),
            ("QUOTIENT_HEALTH_INTERVAL".to_string(), "1s".to_string()),
        ];
        for (index, port) in ports.iter().enumerate() {
            env.push((format!("QUOTIENT_PORT_{}", index + 1), port.to_string()));
        }
        Project {
            compose,
            file: workspace_root().join("deploy/compose/docker-compose.yml"),
            name,
            env,
            client,
            ports,
            quotient: binaries().join("quotient"),
            down: false,
        }
    }

    /// `docker-compose -f FILE -p NAME ARGUMENTS...` with the project's settings.
    fn compose(&self, arguments: &[&str]) -> Output {
        let mut command = Command::new(&self.compose[0]);
        command
            .args(&self.compose[1..])
            .arg("-f")
            .arg(&self.file)
            .args(["-p", &self.name])
            .args(arguments)
            .envs(self.env.iter().map(|(key, value)| (key, value)));
        command.output().expect("docker-compose runs")
    }

    /// A compose command that must succeed; its stdout.
    fn compose_ok(&self, arguments: &[&str]) -> String {
        let output = self.compose(arguments);
        assert!(
            output.status.success(),
            "docker-compose {arguments:?} failed: {}{}",
            text(&output.stderr),
            text(&output.stdout)
        );
        text(&output.stdout)
    }

    /// The container id of `service`.
    fn container(&self, service: &str) -> String {
        let id = self.compose_ok(&["ps", "-q", service]).trim().to_string();
        assert!(!id.is_empty(), "no container of {service}");
        id
    }

    /// Runs `docker ARGUMENTS`, which must succeed; its stdout.
    fn docker(&self, arguments: &[&str]) -> String {
        let output = Command::new("docker")
            .args(arguments)
            .output()
            .expect("docker runs");
        assert!(
            output.status.success(),
            "docker {arguments:?} failed: {}",
            text(&output.stderr)
        );
        text(&output.stdout)
    }

    /// Ids of the project's containers (`all`: stopped ones too).
    fn containers(&self, all: bool) -> Vec<String> {
        let filter = format!("label=com.docker.compose.project={}", self.name);
        let mut arguments = vec!["ps", "-q", "--filter", &filter];
        if all {
            arguments.push("-a");
        }
        self.docker(&arguments)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Names of the project's volumes.
    fn volumes(&self) -> Vec<String> {
        let filter = format!("label=com.docker.compose.project={}", self.name);
        self.docker(&["volume", "ls", "-q", "--filter", &filter])
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn client_config(&self) -> PathBuf {
        self.client.path().join("client.toml")
    }

    /// Runs the host's `quotient` with the client config `config`.
    fn cli_with(&self, config: &Path, arguments: &[&str]) -> Output {
        Command::new(&self.quotient)
            .args(arguments)
            .env("QUOTIENT_CONFIG", config)
            .output()
            .expect("the quotient binary runs")
    }

    /// A CLI command that must succeed (the project's client config); its stdout.
    fn ok(&self, arguments: &[&str]) -> String {
        self.ok_with(&self.client_config(), arguments)
    }

    fn ok_with(&self, config: &Path, arguments: &[&str]) -> String {
        let output = self.cli_with(config, arguments);
        assert!(
            output.status.success(),
            "quotient {arguments:?} failed: {}{}",
            text(&output.stderr),
            text(&output.stdout)
        );
        text(&output.stdout)
    }

    /// A `-o json` CLI command that must succeed; its document.
    fn json(&self, arguments: &[&str]) -> Value {
        let stdout = self.ok(arguments);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|error| panic!("{arguments:?}: {error}: {stdout}"))
    }

    /// `cat PATH` in the container of `service`; empty when it is missing.
    fn read_in(&self, service: &str, path: &str) -> String {
        let output = Command::new("docker")
            .args(["exec", &self.container(service), "cat", path])
            .output()
            .expect("docker runs");
        text(&output.stdout)
    }

    /// `docker-compose down -v` (once).
    fn down(&mut self) -> Output {
        self.down = true;
        self.compose(&["down", "-v", "--remove-orphans", "-t", "5"])
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = self.compose(&["logs", "--no-color", "--tail", "40"]);
            eprintln!(
                "==== the project's logs (last lines)\n{}",
                text(&logs.stdout)
            );
        }
        if !self.down {
            let output = self.down();
            if !output.status.success() {
                eprintln!("docker-compose down -v failed: {}", text(&output.stderr));
            }
        }
        // Whatever `down` left (it failed, or was never reached).
        let filter = format!("label=com.docker.compose.project={}", self.name);
        if let Ok(output) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        {
            for id in text(&output.stdout).lines() {
                let _ = Command::new("docker").args(["rm", "-f", id]).output();
            }
        }
        if let Ok(output) = Command::new("docker")
            .args(["volume", "ls", "-q", "--filter", &filter])
            .output()
        {
            for volume in text(&output.stdout).lines() {
                let _ = Command::new("docker")
                    .args(["volume", "rm", "-f", volume])
                    .output();
            }
        }
    }
}

impl WalkthroughCluster for Project {
    fn ok(&self, arguments: &[&str]) -> String {
        Project::ok(self, arguments)
    }

    fn job_arguments(&self, _name: &str) -> Vec<String> {
        ["--", "/bin/sh", "-c", JOB_SCRIPT]
            .map(String::from)
            .to_vec()
    }

    /// Read in an agent's container: the dir is on the volume every agent shares.
    fn checkpoint_file(&self, _name: &str, id: &str, file: &str) -> String {
        self.read_in("agent-1", &format!("{CHECKPOINT_ROOT}/{id}/{file}"))
    }
}

/// What must not change about a job across the failover.
fn essentials(job: &Value) -> Value {
    serde_json::json!({
        "id": job["id"],
        "name": job["name"],
        "share": job["share"],
        "priority": job["priority"],
        "state": job["state"],
        "node": job["node"],
        "attempts": job["attempts"],
        "preemptions": job["preemptions"],
    })
}

#[test]
fn the_compose_cluster_runs_the_walkthrough_and_survives_losing_its_leader() {
    // Proves that the image and the compose file make a working HA cluster: healthy
    // containers, the walkthrough's states through the host's CLI, writes that go on and no
    // job lost or changed when the leader's container is killed, and nothing left after
    // `down -v`.
    let started = Instant::now();
    let compose = match compose_command() {
        Ok(compose) => compose,
        Err(reason) if std::env::var("CI").is_ok_and(|value| value == "true") => {
            panic!("CI=true, and this test needs Docker and docker-compose: {reason}")
        }
        Err(reason) => {
            eprintln!("skipped: {reason} (set CI=true to make this a failure)");
            return;
        }
    };

    eprintln!(
        "--- the image {IMAGE}, built offline from {}",
        binaries().display()
    );
    let build = Command::new("bash")
        .arg(workspace_root().join("deploy/image/build-offline.sh"))
        .arg("--bin-dir")
        .arg(binaries())
        .args(["--tag", IMAGE])
        .output()
        .expect("bash runs");
    assert!(
        build.status.success(),
        "build-offline.sh failed: {}{}",
        text(&build.stdout),
        text(&build.stderr)
    );
    eprint!("{}", text(&build.stdout));
    eprintln!("    ({:.1?} so far)", started.elapsed());

    let mut project = Project::new(compose);
    eprintln!(
        "--- docker-compose up -d: project {}, coordinators on 127.0.0.1 UDP ports {:?}",
        project.name, project.ports
    );
    project.compose_ok(&["up", "-d"]);
    let containers: Vec<(&str, String)> = LONG_RUNNING
        .iter()
        .map(|service| (*service, project.container(service)))
        .collect();
    poll_until("every container healthy", HEALTHY, || {
        let statuses: Vec<(&str, String)> = containers
            .iter()
            .map(|(service, id)| {
                let status = project
                    .docker(&["inspect", "--format", "{{.State.Health.Status}}", id])
                    .trim()
                    .to_string();
                (*service, status)
            })
            .collect();
        if statuses.iter().all(|(_, status)| status == "healthy") {
            Ok(())
        } else {
            Err(format!("{statuses:?}"))
        }
    });
    eprintln!(
        "    every container healthy ({:.1?} so far)",
        started.elapsed()
    );

    // The host's client config, as the certs service wrote it: the published ports.
    let config = std::fs::read_to_string(project.client_config()).expect("client.toml");
    for port in &project.ports {
        assert!(
            config.contains(&format!("\"127.0.0.1:{port}\"")),
            "{config}"
        );
    }
    project.ok(&["cluster", "health"]);
    let nodes = project.json(&["node", "list", "-o", "json"]);
    let ready: Vec<&str> = nodes
        .as_array()
        .expect("a node array")
        .iter()
        .filter(|node| node["state"] == "ready")
        .filter_map(|node| node["name"].as_str())
        .collect();
    assert_eq!(ready, ["node-1", "node-2", "node-3"], "{nodes}");

    eprintln!("--- the walkthrough's shares");
    let mut walk = Walkthrough::start(&project);
    walk.step_1();
    walk.step_2();
    walk.step_3();
    walk.assert_started_once(&["high", "med", "low", "q2"]);
    let logs = project.ok(&["job", "logs", &walk.ids["q2"]]);
    assert!(logs.contains("attempt 1 of"), "q2's log: {logs}");
    eprintln!(
        "    the walkthrough's end state ({:.1?} so far)",
        started.elapsed()
    );

    // The leader, as the coordinators report it (asked directly, through the published ports).
    let health = project.json(&["cluster", "health", "-o", "json"]);
    let leader = health
        .as_array()
        .expect("a health array")
        .iter()
        .find_map(|entry| entry["health"]["leader"].as_u64())
        .unwrap_or_else(|| panic!("no leader in {health}"));
    let before: BTreeMap<String, Value> = walk
        .jobs()
        .into_iter()
        .map(|(name, job)| (name, essentials(&job)))
        .collect();
    let leader_service = format!("coord-{leader}");
    eprintln!("--- docker kill {leader_service}, the leader");
    let killed = Instant::now();
    project.docker(&["kill", &project.container(&leader_service)]);

    // A client config of the two other coordinators only: the write goes through them.
    let survivors: Vec<String> = (1..=3u64)
        .filter(|id| *id != leader)
        .map(|id| format!("\"127.0.0.1:{}\"", project.ports[id as usize - 1]))
        .collect();
    let survivors_config = project.client.path().join("survivors.toml");
    std::fs::write(
        &survivors_config,
        format!(
            "coordinators = [{}]\nca = \"ca.pem\"\ncert = \"admin.pem\"\nkey = \"admin-key.pem\"\n",
            survivors.join(", ")
        ),
    )
    .expect("survivors.toml is written");
    let after_id = project
        .ok_with(
            &survivors_config,
            &[
                "job",
                "submit",
                "--share",
                "qs3",
                "--priority",
                "1",
                "--gpus",
                "1",
                "--name",
                "after",
                "--grace-period",
                "10s",
                "--",
                "/bin/sh",
                "-c",
                JOB_SCRIPT,
            ],
        )
        .trim()
        .to_string();
    eprintln!(
        "    {after_id} submitted through the other coordinators {:.1?} after the kill",
        killed.elapsed()
    );
    walk.ids.insert("after", after_id.clone());
    let new_leader = poll_until("a new leader", STEP, || {
        let output = project.cli_with(&survivors_config, &["cluster", "health", "-o", "json"]);
        let entries: Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
        let leaders: Vec<Option<u64>> = entries
            .as_array()
            .into_iter()
            .flatten()
            .map(|entry| entry["health"]["leader"].as_u64())
            .collect();
        match leaders.first() {
            Some(Some(new)) if *new != leader && leaders.iter().all(|l| *l == Some(*new)) => {
                Ok(*new)
            }
            _ => Err(entries.to_string()),
        }
    });
    eprintln!("    coordinator {new_leader} leads");

    // QS3's reserved GPU was idle: the new job runs there, and no other job moved.
    let jobs = walk.expect_states(
        "after the failover: the new job RUNNING, the others as they were",
        &[
            ("high", "RUNNABLE"),
            ("med", "RUNNABLE"),
            ("low", "RUNNING"),
            ("q2", "RUNNING"),
            ("after", "RUNNING"),
        ],
    );
    for (name, job) in &before {
        assert_eq!(
            &essentials(&jobs[name]),
            job,
            "{name} changed across the failover"
        );
    }
    assert_eq!(jobs.len(), before.len() + 1, "{jobs:?}");
    assert_eq!(walk.idle_nodes(), 0, "QS3's job took its GPU");
    for name in ["low", "q2", "after"] {
        let starts = walk.read(name, "starts");
        assert_eq!(starts.lines().count(), 1, "{name} started once: {starts}");
    }

    eprintln!("--- after the failover: cancelling low gives its GPU back to high, which resumes");
    project.ok_with(&survivors_config, &["job", "cancel", &walk.ids["low"]]);
    let jobs = walk.expect_states(
        "low CANCELLED, high RUNNING again",
        &[
            ("high", "RUNNING"),
            ("med", "RUNNABLE"),
            ("low", "CANCELLED"),
            ("q2", "RUNNING"),
            ("after", "RUNNING"),
        ],
    );
    assert_eq!(jobs["high"]["attempts"], 2, "{}", jobs["high"]);
    walk.assert_high_resumed_from_its_checkpoint();
    let agent_logs = project.compose_ok(&["logs", "--no-color", "agent-1", "agent-2", "agent-3"]);
    assert!(
        !agent_logs.contains("self-fencing"),
        "an agent fenced itself during the failover:\n{agent_logs}"
    );

    eprintln!("--- docker-compose down -v");
    let down = project.down();
    assert!(
        down.status.success(),
        "docker-compose down -v failed: {}",
        text(&down.stderr)
    );
    assert_eq!(
        project.containers(true),
        Vec::<String>::new(),
        "containers left"
    );
    assert_eq!(project.volumes(), Vec::<String>::new(), "volumes left");
    eprintln!("    done in {:.1?}", started.elapsed());
}
