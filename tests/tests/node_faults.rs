//! What happens to jobs when nodes go away, through real processes (one coordinator, two
//! agents with one simulated GPU each, the CLI): a drain moves a job without counting toward
//! its `max_preemptions`, and a node whose agent stops answering is shown `unreachable` and
//! gets no new job until it answers again.

use std::time::{Duration, Instant};

use quotient_tests::{poll_until, DevCluster};
use serde_json::Value;

/// How long a change may take to settle (placement, signal, exit, report, placement).
const SETTLE: Duration = Duration::from_secs(60);

/// One coordinator, two one-GPU agents (node-1, node-2), and a share that may use `gpus`.
fn cluster(gpus: u32) -> DevCluster {
    let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "2"]);
    cluster.create_share("team", gpus, "lend", &[]);
    cluster
}

fn job(cluster: &DevCluster, id: &str) -> Value {
    cluster.json(&["job", "get", id, "-o", "json"])
}

/// `job get -o json` once the job runs on a node that `node_ok` accepts.
fn wait_running(
    cluster: &DevCluster,
    id: &str,
    what: &str,
    node_ok: impl Fn(&str) -> bool,
) -> Value {
    poll_until(&format!("{id} RUNNING {what}"), SETTLE, || {
        let view = job(cluster, id);
        let node = view["node"].as_str().unwrap_or_default();
        if view["state"] == "RUNNING" && node_ok(node) {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
}

/// `node list -o json`, the node named `name`.
fn node(cluster: &DevCluster, name: &str) -> Value {
    cluster
        .node(name)
        .unwrap_or_else(|| panic!("no node {name} in the node list"))
}

/// Waits until node `name` is `state` and reachable.
fn wait_node(cluster: &DevCluster, name: &str, state: &str) -> Value {
    poll_until(&format!("{name} {state} and reachable"), SETTLE, || {
        let view = node(cluster, name);
        if view["state"] == state && view["unreachable"] == false {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
}

#[test]
fn drains_do_not_count_toward_max_preemptions() {
    // Proves that a job allowed one preemption by the scheduling rules survives being drained
    // off its node twice: each drain moves it to the other node as a new attempt, counted
    // among its preemptions but not toward max_preemptions.
    let cluster = cluster(1);
    let id = cluster.submit(
        "team",
        &["--max-preemptions", "1", "--grace-period", "2s"],
        &["sleep", "600"],
    );
    let mut view = wait_running(&cluster, &id, "on a node", |node| !node.is_empty());
    for drain in 1..=2 {
        let from = view["node"].as_str().unwrap_or_default().to_string();
        eprintln!("--- drain {drain}: {id} is drained off {from}");
        cluster.ok(&["node", "drain", &from]);
        view = wait_running(&cluster, &id, &format!("off {from}"), |node| {
            !node.is_empty() && node != from
        });
        cluster.ok(&["node", "uncordon", &from]);
        wait_node(&cluster, &from, "ready");
    }
    assert_eq!(view["state"], "RUNNING", "{view}");
    assert_eq!(view["preemptions"], 2, "{view}");
    assert_eq!(view["counted_preemptions"], 0, "{view}");
    assert_eq!(view["max_preemptions"], 1, "{view}");
    assert_eq!(view["attempts"], 3, "{view}");
    let outcomes: Vec<Value> = view["attempt_history"]
        .as_array()
        .expect("attempt_history")
        .iter()
        .map(|attempt| attempt["outcome"].clone())
        .collect();
    assert_eq!(
        outcomes,
        serde_json::json!(["preempted (node-drain)", "preempted (node-drain)", null])
            .as_array()
            .cloned()
            .unwrap_or_default(),
        "{view}"
    );
    assert_eq!(job(&cluster, &id)["state"], "RUNNING");
}

/// A process stopped with SIGSTOP, continued with SIGCONT when this is dropped (however the
/// test ends) unless [`Stopped::resume`] did it first.
struct Stopped(Option<libc::pid_t>);

impl Stopped {
    fn stop(pid: libc::pid_t) -> Stopped {
        // SAFETY: kill(2) on the pid of an agent this test's cluster started.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Stopped(Some(pid))
    }

    fn resume(&mut self) {
        if let Some(pid) = self.0.take() {
            // SAFETY: as above.
            unsafe {
                libc::kill(pid, libc::SIGCONT);
            }
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.resume();
    }
}

/// Waits until the leader has heard a heartbeat from node `name` (a leader that has just
/// taken over knows of none until the node's next one).
fn heard_from(cluster: &DevCluster, name: &str) -> Value {
    poll_until(&format!("a heartbeat from {name}"), SETTLE, || {
        let view = node(cluster, name);
        if view["state"] == "ready" && view["last_heartbeat_ms"].is_u64() {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
}

/// Waits until node `name` is shown unreachable, and still ready (not lost); its view.
fn wait_unreachable(cluster: &DevCluster, name: &str) -> Value {
    poll_until(&format!("{name} unreachable"), SETTLE, || {
        let view = node(cluster, name);
        assert_ne!(
            view["state"], "lost",
            "lost before it was shown unreachable: {view}"
        );
        if view["unreachable"] == true {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

#[test]
fn a_silent_node_is_unreachable_gets_no_new_job_and_comes_back() {
    // Proves that a node whose agent stops answering (SIGSTOP) is shown unreachable, with
    // when it was last heard from, before its lease runs out; that of two jobs submitted
    // then, one runs on the other node and the other waits saying why instead of going to
    // the silent node; and that once the agent answers again (SIGCONT) the node is reachable
    // and the waiting job runs there.
    let cluster = cluster(2);
    heard_from(&cluster, "node-1");

    eprintln!("--- node-1's agent stopped (SIGSTOP)");
    let mut stopped = Stopped::stop(cluster.agent_pid("node-1"));
    let since = Instant::now();
    let silent = wait_unreachable(&cluster, "node-1");
    eprintln!("node-1 unreachable after {:?}", since.elapsed());
    assert_eq!(silent["state"], "ready", "not lost yet: {silent}");
    let last = silent["last_heartbeat_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("a last heartbeat: {silent}"));
    assert!(last <= now_ms(), "{silent}");
    assert_eq!(node(&cluster, "node-2")["unreachable"], false);
    let table = cluster.ok(&["node", "list"]);
    let row = table
        .lines()
        .find(|line| line.starts_with("node-1 "))
        .unwrap_or_else(|| panic!("no node-1 row in:\n{table}"));
    assert_eq!(
        row.split_whitespace().nth(1),
        Some("unreachable"),
        "{table}"
    );
    assert!(table
        .lines()
        .next()
        .unwrap_or_default()
        .contains("LAST-HEARTBEAT"));

    eprintln!("--- two jobs submitted while node-1 is silent");
    let first = cluster.submit("team", &["--grace-period", "1s"], &["sleep", "600"]);
    let second = cluster.submit("team", &["--grace-period", "1s"], &["sleep", "600"]);
    let (running, waiting) = poll_until(
        "one job on node-2, the other waiting for node-1",
        SETTLE,
        || {
            let views = [job(&cluster, &first), job(&cluster, &second)];
            let on_node_2 = views
                .iter()
                .position(|v| v["state"] == "RUNNING" && v["node"] == "node-2");
            let waits = |v: &Value| {
                v["state"] == "RUNNABLE"
                    && v["reason"]
                        .as_str()
                        .is_some_and(|reason| reason.contains("the node is unreachable"))
            };
            match on_node_2 {
                Some(index) if waits(&views[1 - index]) => {
                    let ids = [&first, &second];
                    Ok((ids[index].clone(), ids[1 - index].clone()))
                }
                _ => Err(format!("{} {}", views[0], views[1])),
            }
        },
    );
    let view = job(&cluster, &waiting);
    assert_eq!(view["node"], Value::Null, "{view}");
    assert_eq!(
        view["attempts"], 0,
        "never placed on the silent node: {view}"
    );
    let explained = cluster.ok(&["job", "explain", &waiting]);
    assert!(explained.contains("unreachable"), "{explained}");
    let silent_for = since.elapsed();

    eprintln!("--- node-1's agent continued (SIGCONT) after {silent_for:?}");
    stopped.resume();
    let back = wait_node(&cluster, "node-1", "ready");
    assert!(
        back["last_heartbeat_ms"].as_u64() > Some(last),
        "heard from again: {back}"
    );
    wait_running(&cluster, &waiting, "on node-1", |node| node == "node-1");
    let view = wait_running(&cluster, &running, "on node-2", |node| node == "node-2");
    assert_eq!(view["attempts"], 1, "{view}");
    if silent_for < Duration::from_secs(10) {
        // Within the agent's lease (10 s in a dev cluster): the node was never lost, and the
        // job waiting for it is its first attempt.
        assert_eq!(job(&cluster, &waiting)["attempts"], 1);
    }
}

#[test]
fn a_silent_node_is_unreachable_to_a_new_leader_too() {
    // Proves that a leader that takes over while a node's agent is silent shows that node
    // unreachable once a heartbeat is overdue, as the old leader did, before its lease runs
    // out: the new leader has heard nothing from it since it was elected.
    let cluster = DevCluster::up(&["--coordinators", "3", "--nodes", "2"]);
    heard_from(&cluster, "node-1");
    let _stopped = Stopped::stop(cluster.agent_pid("node-1"));
    wait_unreachable(&cluster, "node-1");

    let (_, output) = cluster.kill_leader_then(&["cluster", "status", "-o", "json"]);
    assert!(output.status.success(), "{output:?}");
    let since = Instant::now();
    poll_until("a new leader", SETTLE, || {
        let status = cluster.run(&["cluster", "status", "-o", "json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
        status["leader"].as_u64().ok_or_else(|| status.to_string())
    });
    eprintln!("a new leader after {:?}", since.elapsed());
    let view = wait_unreachable(&cluster, "node-1");
    eprintln!("node-1 unreachable to it after {:?}", since.elapsed());
    assert_eq!(node(&cluster, "node-2")["unreachable"], false);
    assert_eq!(view["state"], "ready", "{view}");
}
