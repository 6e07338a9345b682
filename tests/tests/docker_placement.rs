//! Container jobs and the nodes that can run them, through real processes: a dev cluster's
//! coordinator (its own node cordoned) and two agents started here, one that runs processes
//! only and one with the Docker
//! runtime on this host's Docker engine, which holds the test image
//! (`agent/tests/docker/build-test-image.sh`; nothing is pulled). A container job runs only on
//! the Docker node; when that node is lost (its agent killed) the job goes back to the queue
//! and waits for a Docker node instead of going to the process-only one, where it could never
//! launch; the Docker agent started again runs it. A container job of two nodes runs one
//! container on each of two Docker agents, on the host's network, and its members meet.
//!
//! Docker must be reachable: under `CI=true` this test fails without it, elsewhere it skips
//! with a message.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quotient_common::tls::TlsFiles;
use quotient_tests::{binaries, poll_until, DevCluster};
use serde_json::Value;

/// How long a change may take to settle: registration, placement, a container's start, a
/// node's lease running out (10 s, plus the job's grace period and the leader's margin).
const SETTLE: Duration = Duration::from_secs(90);
/// The image the Docker agent holds and the job runs.
const IMAGE: &str = "quotient-test-busybox:latest";
/// How long the job is watched waiting, to see that it is not placed on the process node.
const WATCH: Duration = Duration::from_secs(4);

fn docker(args: &[&str]) -> std::process::Output {
    quotient_tests::docker(args)
}

/// Whether this host's Docker engine answers, with the test image (see
/// [`quotient_tests::docker_ready`]).
fn docker_ready() -> bool {
    quotient_tests::docker_ready(IMAGE)
}

/// An agent with the Docker runtime started by this test, on the dev cluster's
/// coordinators; SIGKILLed when dropped, and the containers of its node removed.
struct DockerAgent {
    name: String,
    child: Option<Child>,
}

impl DockerAgent {
    /// Issues the agent certificate `name` (once) and starts `quotient-agent run` with
    /// `--runtime docker` and one simulated a10g GPU, its state and log in `DIR/NAME`.
    fn start(cluster: &DevCluster, name: &str) -> DockerAgent {
        DockerAgent::start_with(cluster, name, "docker")
    }

    /// [`DockerAgent::start`] with `--runtime RUNTIME` (`process`: an agent that runs no
    /// containers, though Docker is reachable).
    fn start_with(cluster: &DevCluster, name: &str, runtime: &str) -> DockerAgent {
        let certs = cluster.dir.join("certs");
        if !certs.join(format!("{name}.pem")).exists() {
            cluster.ok(&[
                "certs",
                "issue",
                "--dir",
                &certs.display().to_string(),
                "--role",
                "agent",
                "--name",
                name,
            ]);
        }
        let file = std::fs::read_to_string(cluster.dir.join("cluster.json")).expect("cluster.json");
        let file: Value = serde_json::from_str(&file).expect("cluster.json is JSON");
        let coordinators: Vec<&str> = file["coordinators"]
            .as_array()
            .expect("coordinators")
            .iter()
            .filter_map(|entry| entry["address"].as_str())
            .collect();
        let state_dir = cluster.dir.join(name);
        std::fs::create_dir_all(&state_dir).expect("the agent's state dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state_dir.join("agent.log"))
            .expect("the agent's log");
        let child = Command::new(binaries().join("quotient-agent"))
            .arg("run")
            .args(["--name", name])
            .arg("--coordinators")
            .arg(coordinators.join(","))
            .args(TlsFiles::in_dir(&certs, name).flags())
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--checkpoint-root")
            .arg(cluster.dir.join("checkpoints"))
            .args(["--runtime", runtime])
            .arg("--allow-root-jobs")
            .args(["--simulated-gpus", "1xa10g"])
            .args(["--lease-ms", "10000"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("quotient-agent runs");
        DockerAgent {
            name: name.to_string(),
            child: Some(child),
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The names of the containers of this agent's node (`quotient-NODE-JOB-ATTEMPT`).
    fn containers(&self, all: bool) -> Vec<String> {
        let filter = format!("name=quotient-{}-", self.name);
        let mut args = vec!["ps", "--filter", &filter, "--format", "{{.Names}}"];
        if all {
            args.push("--all");
        }
        let output = docker(&args);
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for DockerAgent {
    fn drop(&mut self) {
        self.kill();
        for container in self.containers(true) {
            let _ = docker(&["rm", "--force", &container]);
        }
    }
}

fn job(cluster: &DevCluster, id: &str) -> Value {
    cluster.json(&["job", "get", id, "-o", "json"])
}

/// Waits until the job runs on `node`.
fn wait_running_on(cluster: &DevCluster, id: &str, node: &str) -> Value {
    poll_until(&format!("{id} RUNNING on {node}"), SETTLE, || {
        let view = job(cluster, id);
        if view["state"] == "RUNNING" && view["node"] == node {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
}

/// The job waits, never placed beyond its first `attempts` attempts, saying why.
fn waits_for_docker(view: &Value, attempts: u64) -> Result<(), String> {
    let reason = view["reason"].as_str().unwrap_or_default();
    if view["state"] == "RUNNABLE"
        && view["node"].is_null()
        && view["attempts"].as_u64() == Some(attempts)
        && reason.contains("Docker")
    {
        Ok(())
    } else {
        Err(view.to_string())
    }
}

#[test]
fn a_container_job_on_a_lost_docker_node_waits_for_docker_and_never_goes_to_a_process_node() {
    if !docker_ready() {
        return;
    }
    let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "1"]);
    cluster.create_share("team", 2, "lend", &[]);
    // The dev cluster's node-1 runs containers too (its agent reaches Docker): out of the
    // way, and a node that runs processes only in its place.
    cluster.ok(&["node", "cordon", "node-1"]);
    let process_name = format!("proc-{}", std::process::id());
    let _process_agent = DockerAgent::start_with(&cluster, &process_name, "process");
    let name = format!("dock-{}", std::process::id());
    let mut agent = DockerAgent::start(&cluster, &name);

    eprintln!(
        "--- {name} registers the Docker runtime and its images; the other node processes only"
    );
    let docker_node = poll_until(&format!("{name} ready"), SETTLE, || {
        match cluster.node(&name) {
            Some(view) if view["state"] == "ready" => Ok(view),
            other => Err(format!("{other:?}")),
        }
    });
    // An agent sends its runtimes and images when it registers: a ready node has them.
    assert_eq!(
        docker_node["runtimes"],
        serde_json::json!(["process", "docker"]),
        "an agent run with --runtime docker, its Docker engine reachable, registers both \
         runtimes: {docker_node}"
    );
    let images = docker_node["images"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(images.iter().any(|image| image == IMAGE), "{docker_node}");
    let process_node = poll_until(&format!("{process_name} ready"), SETTLE, || {
        match cluster.node(&process_name) {
            Some(view) if view["state"] == "ready" => Ok(view),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(
        process_node["runtimes"],
        serde_json::json!(["process"]),
        "{process_node}"
    );
    let table = cluster.ok(&["node", "list"]);
    let row = table
        .lines()
        .find(|line| line.starts_with(&name))
        .unwrap_or_else(|| panic!("no {name} row in:\n{table}"));
    assert!(row.contains("process,docker"), "{table}");

    eprintln!("--- a container job runs on {name}");
    let id = cluster.submit(
        "team",
        &["--image", IMAGE, "--grace-period", "1s"],
        &["sleep", "600"],
    );
    let view = wait_running_on(&cluster, &id, &name);
    assert_eq!(view["attempts"], 1, "{view}");
    // quotient-NODE-INSTANCE-JOB-ATTEMPT: the instance is the agent's own id.
    let container = format!("-{id}-1");
    assert!(
        agent
            .containers(false)
            .iter()
            .any(|name| name.ends_with(&container)),
        "{container} runs: {:?}",
        agent.containers(true)
    );

    eprintln!("--- {name}'s agent killed (SIGKILL): the node is lost, the job back in the queue");
    agent.kill();
    poll_until(&format!("{name} lost"), SETTLE, || {
        match cluster.node(&name) {
            Some(view) if view["state"] == "lost" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let view = poll_until(&format!("{id} waiting for a Docker node"), SETTLE, || {
        let view = job(&cluster, &id);
        waits_for_docker(&view, 1).map(|()| view)
    });
    assert_eq!(view["preemptions"], 1, "lost with its node: {view}");
    assert_eq!(view["counted_preemptions"], 0, "{view}");
    let explained = cluster.ok(&["job", "explain", &id]);
    assert!(explained.contains("Docker"), "{explained}");
    // The process-only node has a free GPU all along: the job must not be placed there,
    // where it could never launch (and a launch failure of the node's fault would only
    // requeue it).
    let watched = Instant::now();
    while watched.elapsed() < WATCH {
        let view = job(&cluster, &id);
        if let Err(seen) = waits_for_docker(&view, 1) {
            panic!("the container job left the queue for a node without Docker: {seen}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let node_1 = cluster.node(&process_name).expect("the process-only node");
    let node_1_jobs: Vec<&Value> = node_1["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|gpu| !gpu["job"].is_null())
        .collect();
    assert!(node_1_jobs.is_empty(), "{node_1}");

    eprintln!("--- {name}'s agent started again: the job runs there as a new attempt");
    drop(agent);
    let _agent = DockerAgent::start(&cluster, &name);
    let view = poll_until(&format!("{id} RUNNING on {name} again"), SETTLE, || {
        let view = job(&cluster, &id);
        if view["state"] == "RUNNING" && view["node"] == name.as_str() {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    });
    assert_eq!(view["attempts"], 2, "{view}");
    let nodes: Vec<&Value> = view["attempt_history"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|attempt| &attempt["node"])
        .collect();
    assert!(
        nodes
            .iter()
            .all(|node| node.as_str() == Some(name.as_str())),
        "{view}"
    );
}

/// A member of a job of several nodes in busybox: rank 0 listens on MASTER_PORT with `nc`,
/// the others send it a line; each says which host's network it is on.
// Rank 0 listens until it gets rank 1's line: a connection that brings anything else (a
// stray one on the host's network, or one closed before its line arrived) is logged and
// listened past at once. Rank 1 sends its line until rank 0 is gone: it has been heard once a
// send went through and the port then refuses for 2 s, so it never exits while rank 0 waits.
const DOCKER_MEMBER: &str = r#"
echo "rank $QUOTIENT_NODE_RANK of $QUOTIENT_NUM_NODES on host $(hostname), rank 0 at $MASTER_ADDR:$MASTER_PORT"
if [ "$QUOTIENT_NODE_RANK" = 0 ]; then
  for i in $(seq 1 300); do
    msg=$(nc -l -p "$MASTER_PORT")
    if [ "$msg" = "hello from rank 1" ]; then
      echo "rank 0 got: $msg"
      exit 0
    fi
    echo "rank 0 heard '$msg' instead; listening again"
    sleep 0.05
  done
  exit 1
else
  sent=0
  refused=0
  for i in $(seq 1 300); do
    if echo "hello from rank $QUOTIENT_NODE_RANK" | nc "$MASTER_ADDR" "$MASTER_PORT"; then
      sent=1
      refused=0
      echo "rank $QUOTIENT_NODE_RANK reached rank 0"
    elif [ "$sent" = 1 ]; then
      refused=$((refused + 1))
      [ "$refused" -ge 10 ] && exit 0
    fi
    sleep 0.2
  done
  exit 1
fi
"#;

#[test]
fn a_container_job_of_two_nodes_runs_one_member_per_node_on_the_hosts_network() {
    // Proves that the Docker runtime runs a job of several nodes: one container per member,
    // each on its node's Docker agent, on the host's network, so that rank 1 reaches rank 0
    // at MASTER_ADDR:MASTER_PORT; the job SUCCEEDS when both exit 0.
    if !docker_ready() {
        return;
    }
    let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "1"]);
    cluster.create_share("team", 2, "lend", &[]);
    cluster.ok(&["node", "cordon", "node-1"]);
    let names = [
        format!("gang-a-{}", std::process::id()),
        format!("gang-b-{}", std::process::id()),
    ];
    let _agents: Vec<DockerAgent> = names
        .iter()
        .map(|name| DockerAgent::start(&cluster, name))
        .collect();
    for name in &names {
        poll_until(&format!("{name} ready"), SETTLE, || {
            match cluster.node(name) {
                Some(view) if view["state"] == "ready" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
    }
    let id = cluster.submit(
        "team",
        &["--nodes", "2", "--image", IMAGE],
        &["sh", "-c", DOCKER_MEMBER],
    );
    let view = poll_until(&format!("{id} SUCCEEDED"), SETTLE, || {
        let view = job(&cluster, &id);
        match view["state"].as_str() {
            Some("SUCCEEDED") => Ok(view),
            Some("FAILED") => panic!("the job failed: {view}"),
            _ => Err(view.to_string()),
        }
    });
    let mut nodes: Vec<String> = view["attempt_history"][0]["nodes"]
        .as_array()
        .expect("the attempt's nodes")
        .iter()
        .map(|n| n.as_str().unwrap_or_default().to_string())
        .collect();
    nodes.sort();
    let mut expected = names.to_vec();
    expected.sort();
    assert_eq!(nodes, expected, "one member on each Docker node");
    let host =
        String::from_utf8_lossy(&Command::new("hostname").output().expect("hostname").stdout)
            .trim()
            .to_string();
    let rank0 = cluster.ok(&["job", "logs", &id, "--rank", "0"]);
    assert!(rank0.contains("rank 0 got: hello from rank 1"), "{rank0}");
    assert!(
        rank0.contains(&format!("on host {host},")),
        "the member shares the host's network (and so its name): {rank0}"
    );
    let rank1 = cluster.ok(&["job", "logs", &id, "--rank", "1"]);
    assert!(rank1.contains("rank 1 reached rank 0"), "{rank1}");
}
