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
    // Its closing line is true: the folder given with --dir stays.
    let closing = format!(
        "Their data stays in {}",
        dir.canonicalize().unwrap().display()
    );
    assert!(stdout.contains(&closing), "{closing:?} in:\n{stdout}");
    assert!(!stdout.contains("removed"), "{stdout}");
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

/// Without --dir the demo's folder is its own temporary one: it is removed at the end, and
/// the closing line says so (it once said the data stayed, then removed it).
#[test]
fn the_demo_without_a_folder_removes_its_own_and_says_so() {
    let temp = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(binaries().join("quotient"))
        .arg("demo")
        .env("TMPDIR", temp.path())
        .output()
        .expect("quotient demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("and removed the demo's folder"),
        "the closing line in:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("stays") && !stderr.contains("stays"),
        "{stdout}\n{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(temp.path())
        .expect("the temporary directory")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name())
        .filter(|name| name.to_string_lossy().starts_with("quotient-demo-"))
        .collect();
    assert!(left.is_empty(), "the demo's folder is left: {left:?}");
}
