//! `quotient demo`, the README's first command, runs the walkthrough to its end and stops
//! its cluster.

use std::process::Command;

use quotient_tests::binaries;

/// The demo reaches the spec's end state, prints the tables, and leaves no process behind.
#[test]
fn the_demo_runs_the_walkthrough_and_stops_its_cluster() {
    let root = tempfile::tempdir().expect("a temporary directory");
    let dir = root.path().join("demo");
    let output = Command::new(binaries().join("quotient"))
        .args(["demo", "--dir"])
        .arg(&dir)
        .output()
        .expect("quotient demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed:\n{stdout}\n{stderr}");
    for expected in [
        "step 1",
        "step 2",
        "step 3",
        "NAME  STRATEGY",
        "The walkthrough reached exactly the states of docs/quota-shares.md.",
        "--- stopping the cluster",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    let cluster: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cluster.json")).expect("cluster.json"),
    )
    .expect("cluster.json is JSON");
    let pids = cluster["coordinators"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(cluster["agents"].as_array().into_iter().flatten())
        .filter(|entry| !entry["pid"].is_null())
        .count();
    assert_eq!(pids, 0, "every process is recorded as stopped: {cluster}");
}
