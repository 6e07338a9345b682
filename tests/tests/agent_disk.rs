//! An agent's disk through real processes (`quotient dev up`: a coordinator and one agent
//! with the process runtime and a 256 KiB log cap): `quotient node list` shows the disk use
//! the agent reports, and `quotient job logs` of a job that wrote far more than the cap shows
//! its first and last lines with one line for what was dropped between them.

use std::time::Duration;

use quotient_tests::{poll_until, DevCluster};

/// How long a job may take to be placed, run and reported, and an agent to report its disk.
const SETTLE: Duration = Duration::from_secs(60);
/// The agents' log cap in these tests.
const LOG_MAX_BYTES: u64 = 256 * 1024;

fn cluster() -> DevCluster {
    let cluster = DevCluster::up_with_env(
        &["--coordinators", "1", "--nodes", "1"],
        &[("QUOTIENT_AGENT_LOG_MAX_BYTES", "256KiB")],
    );
    cluster.create_share("team", 1, "lend", &[]);
    cluster
}

/// `node list -o json` carries the disk use the node's agent reported, and the table shows it.
#[test]
fn node_list_shows_the_disk_use_an_agent_reports() {
    let cluster = cluster();
    let node = poll_until("node-1's disk use in node list", SETTLE, || {
        let nodes = cluster.json(&["node", "list", "-o", "json"]);
        let node = nodes[0].clone();
        if node["disk_free_bytes"]
            .as_u64()
            .is_some_and(|free| free > 0)
        {
            Ok(node)
        } else {
            Err(node.to_string())
        }
    });
    assert_eq!(node["name"], "node-1");
    let used = node["disk_used_bytes"].as_u64().expect("disk_used_bytes");
    let logs = node["disk_logs_bytes"].as_u64().expect("disk_logs_bytes");
    let checkpoints = node["disk_checkpoints_bytes"]
        .as_u64()
        .expect("disk_checkpoints_bytes");
    assert_eq!(used, logs + checkpoints, "{node}");
    let table = cluster.ok(&["node", "list"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(header.contains("DISK-USED/FREE"), "{table}");
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(row.contains("B/"), "used/free in its column: {table}");
}

/// A job that writes about 80 times the cap: `job logs` shows its first line, one line for
/// the dropped middle, and its last line, and no more than about the cap.
#[test]
fn job_logs_of_a_log_over_the_cap_show_its_ends_and_what_was_dropped() {
    let cluster = cluster();
    let job = cluster.submit(
        "team",
        &[],
        &[
            "sh",
            "-c",
            "echo first line; yes 'a line in the middle of the output' | head -n 600000; echo last line",
        ],
    );
    poll_until(&format!("{job} to succeed"), SETTLE, || {
        let view = cluster.json(&["job", "get", &job, "-o", "json"]);
        if view["state"] == "SUCCEEDED" {
            Ok(())
        } else {
            Err(view.to_string())
        }
    });
    // The agent cuts a log back within a second of the attempt's end.
    let logs = poll_until("the log to be cut back to the cap", SETTLE, || {
        let logs = cluster.ok(&["job", "logs", &job]);
        if (logs.len() as u64) < 2 * LOG_MAX_BYTES {
            Ok(logs)
        } else {
            Err(format!("{} bytes", logs.len()))
        }
    });
    assert!(
        logs.starts_with("first line\na line in the middle"),
        "{}",
        &logs[..80]
    );
    assert!(logs.ends_with("of the output\nlast line\n"));
    let dropped: Vec<&str> = logs
        .lines()
        .filter(|line| line.starts_with("[... ") && line.ends_with(" bytes dropped ...]"))
        .collect();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
}
