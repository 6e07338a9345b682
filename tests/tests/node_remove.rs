//! `quotient node remove` on a local cluster of real processes (one coordinator, two agents
//! with one simulated GPU each): what it refuses and why, what it does once the node is
//! drained and its agent stopped, and what happens when that agent starts again.

use std::time::Duration;

use quotient_tests::{poll_until, write_job_script, DevCluster};
use serde_json::Value;

/// How long a change may take to settle (placement, signal, exit, report, registration).
const SETTLE: Duration = Duration::from_secs(60);

/// `quotient node list -o json`, by name: (state, the jobs on its GPUs).
fn nodes(cluster: &DevCluster) -> Vec<(String, String, Vec<String>)> {
    let list = cluster.json(&["node", "list", "-o", "json"]);
    list.as_array()
        .into_iter()
        .flatten()
        .map(|node| {
            let jobs = node["gpus"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|gpu| gpu["job"].as_str().map(str::to_string))
                .collect();
            (
                node["name"].as_str().unwrap_or_default().to_string(),
                node["state"].as_str().unwrap_or_default().to_string(),
                jobs,
            )
        })
        .collect()
}

/// Runs `quotient node remove NAME`, which must fail as something to change first; its stderr.
fn refused(cluster: &DevCluster, name: &str) -> String {
    let output = cluster.run(&["node", "remove", name]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "removing {name} was accepted: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(
        stderr.starts_with("error[FailedPrecondition]: "),
        "{stderr}"
    );
    stderr
}

#[test]
fn a_node_is_removed_once_drained_and_its_agent_stopped_and_comes_back_as_a_new_node() {
    // Proves that `node remove` refuses a ready node, a node holding a job and a node whose
    // agent runs, each saying what to do; that a drained node with its agent stopped is
    // removed and gone from `node list`; and that its agent, started again, registers the
    // host as a new, ready node that takes work.
    let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "2"]);
    let script = write_job_script(cluster.root.path());
    let checkpoints = cluster.root.path().join("checkpoints");
    let checkpoints_env = format!("CHECKPOINTS={}", checkpoints.display());
    cluster.create_share("team", 2, "lend", &[]);

    eprintln!("--- a ready node is refused");
    let text = refused(&cluster, "node-2");
    assert!(
        text.contains("is ready") && text.contains("quotient node cordon node-2"),
        "{text}"
    );

    eprintln!("--- a node with a job on it is refused, cordoned or not");
    for name in ["first", "second"] {
        let name_env = format!("NAME={name}");
        cluster.submit(
            "team",
            &[
                "--name",
                name,
                "--env",
                &name_env,
                "--env",
                &checkpoints_env,
            ],
            &[&script],
        );
    }
    let on_node_2 = poll_until("a job on each node", SETTLE, || {
        let nodes = nodes(&cluster);
        match nodes.iter().find(|(name, _, _)| name == "node-2") {
            Some((_, _, jobs)) if jobs.len() == 1 && nodes.iter().all(|n| n.2.len() == 1) => {
                Ok(jobs[0].clone())
            }
            _ => Err(format!("{nodes:?}")),
        }
    });
    cluster.ok(&["node", "cordon", "node-2"]);
    let text = refused(&cluster, "node-2");
    assert!(
        text.contains("still holds 1 job")
            && text.contains(&on_node_2)
            && text.contains("quotient node drain node-2"),
        "{text}"
    );

    eprintln!("--- drained, but its agent still runs: refused");
    cluster.ok(&["node", "drain", "node-2"]);
    poll_until("node-2 holds no job", SETTLE, || {
        let nodes = nodes(&cluster);
        let empty = nodes
            .iter()
            .any(|(name, _, jobs)| name == "node-2" && jobs.is_empty());
        if empty {
            Ok(())
        } else {
            Err(format!("{nodes:?}"))
        }
    });
    let text = refused(&cluster, "node-2");
    assert!(
        text.contains("agent of node node-2 is still connected") && text.contains("stop it"),
        "{text}"
    );

    eprintln!("--- its agent stopped: removed, and gone from the node list");
    // SAFETY: kill(2) on the pid of an agent this test's cluster started.
    unsafe {
        libc::kill(cluster.agent_pid("node-2"), libc::SIGTERM);
    }
    let said = poll_until("node-2 removed", SETTLE, || {
        let output = cluster.run(&["node", "remove", "node-2"]);
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    });
    assert!(
        said.contains("removed node node-2") && said.contains("new, ready node"),
        "{said}"
    );
    let names: Vec<String> = nodes(&cluster).into_iter().map(|n| n.0).collect();
    assert_eq!(names, ["node-1"]);
    let output = cluster.run(&["node", "remove", "node-2", "-o", "json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let refusal: Value = serde_json::from_str(stderr.trim()).expect("one JSON document");
    assert!(
        !output.status.success()
            && refusal["error"]["code"] == "NotFound"
            && stderr.contains("no node named node-2"),
        "removed twice: {stderr}"
    );

    eprintln!("--- its agent started again: a new, ready node that takes the waiting job");
    cluster.ok(&["dev", "up", "--dir", &cluster.dir.display().to_string()]);
    poll_until(
        "node-2 back, ready, running the job it left",
        SETTLE,
        || {
            let nodes = nodes(&cluster);
            let back = nodes
                .iter()
                .any(|(name, state, jobs)| name == "node-2" && state == "ready" && jobs.len() == 1);
            if back {
                Ok(())
            } else {
                Err(format!("{nodes:?}"))
            }
        },
    );
}
