//! `quotient certs` run as the real binary: the files it writes and its exit statuses.

use std::path::Path;
use std::process::{Command, Output};

fn quotient(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quotient"))
        .args(arguments)
        .output()
        .expect("the quotient binary runs")
}

fn path(dir: &Path) -> &str {
    dir.to_str().expect("a UTF-8 temporary path")
}

#[test]
fn certs_init_and_issue_write_the_files() {
    // Proves the spec's two commands write the spec's file names and exit 0.
    let dir = tempfile::tempdir().unwrap();
    let output = quotient(&["certs", "init", "--dir", path(dir.path())]);
    assert!(output.status.success(), "{output:?}");
    assert!(dir.path().join("ca.pem").is_file());
    assert!(dir.path().join("ca-key.pem").is_file());

    let output = quotient(&[
        "certs",
        "issue",
        "--dir",
        path(dir.path()),
        "--role",
        "coordinator",
        "--name",
        "coord-1",
        "--san",
        "10.0.0.5",
        "--san",
        "coord-1.example.org",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert!(dir.path().join("coord-1.pem").is_file());
    assert!(dir.path().join("coord-1-key.pem").is_file());

    let output = quotient(&[
        "certs",
        "issue",
        "--dir",
        path(dir.path()),
        "--role",
        "user",
        "--name",
        "alice",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert!(dir.path().join("alice.pem").is_file());
    assert!(dir.path().join("alice-key.pem").is_file());
}

#[test]
fn a_bad_role_is_a_usage_error() {
    // Proves an unknown role exits 2 and names the valid ones.
    let dir = tempfile::tempdir().unwrap();
    let output = quotient(&[
        "certs",
        "issue",
        "--dir",
        path(dir.path()),
        "--role",
        "root",
        "--name",
        "alice",
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("coordinator"), "{stderr}");
    assert!(!dir.path().join("alice.pem").exists());
}

#[test]
fn a_bad_name_is_a_usage_error() {
    // Proves a name outside the name rule exits 2 before anything is written.
    let dir = tempfile::tempdir().unwrap();
    let output = quotient(&[
        "certs",
        "issue",
        "--dir",
        path(dir.path()),
        "--role",
        "user",
        "--name",
        "../alice",
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[test]
fn a_failed_command_exits_1_and_says_what_to_do() {
    // Proves a command that parses but fails exits 1 with a hint on stderr.
    let dir = tempfile::tempdir().unwrap();
    let output = quotient(&[
        "certs",
        "issue",
        "--dir",
        path(dir.path()),
        "--role",
        "user",
        "--name",
        "alice",
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("quotient certs init"), "{stderr}");

    assert!(quotient(&["certs", "init", "--dir", path(dir.path())])
        .status
        .success());
    let again = quotient(&["certs", "init", "--dir", path(dir.path())]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("refusing to overwrite"), "{stderr}");
}
