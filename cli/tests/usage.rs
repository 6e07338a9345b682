//! The client commands run as the real binary without a cluster: usage errors exit 2 before
//! anything is sent, and a missing client config exits 1 with a message saying how to make one.

use std::path::Path;
use std::process::{Command, Output};

fn quotient(arguments: &[&str], config_env: Option<&Path>, home: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quotient"));
    command.args(arguments).env("HOME", home);
    match config_env {
        Some(path) => command.env("QUOTIENT_CONFIG", path),
        None => command.env_remove("QUOTIENT_CONFIG"),
    };
    command.output().expect("the quotient binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_arguments_are_usage_errors() {
    // Proves each cheap local check exits 2, prints nothing on stdout and needs no config.
    let home = tempfile::tempdir().unwrap();
    let cases: &[&[&str]] = &[
        &["share", "create", "qs1", "--strategy", "lend"],
        &[
            "share",
            "create",
            "qs1",
            "--limit",
            "a10g",
            "--strategy",
            "lend",
        ],
        &[
            "share",
            "create",
            "qs1",
            "--limit",
            "a10g=x",
            "--strategy",
            "lend",
        ],
        &[
            "share",
            "create",
            "qs1",
            "--limit",
            "a10g=1",
            "--strategy",
            "share-all",
        ],
        &[
            "share",
            "create",
            "qs1",
            "--limit",
            "a10g=1",
            "--limit",
            "a10g=2",
            "--strategy",
            "lend",
        ],
        &[
            "share",
            "create",
            "bad name",
            "--limit",
            "a10g=1",
            "--strategy",
            "lend",
        ],
        &["share", "update", "qs1"],
        &["share", "update", "qs1", "--state", "paused"],
        &[
            "job",
            "submit",
            "--share",
            "qs1",
            "--priority",
            "10000",
            "--gpus",
            "1",
            "--",
            "true",
        ],
        &[
            "job",
            "submit",
            "--share",
            "qs1",
            "--priority",
            "1",
            "--gpus",
            "1",
            "--grace-period",
            "30",
            "--",
            "true",
        ],
        &[
            "job",
            "submit",
            "--share",
            "qs1",
            "--priority",
            "1",
            "--gpus",
            "1",
        ],
        &[
            "job",
            "submit",
            "--share",
            "qs1",
            "--priority",
            "1",
            "--gpus",
            "1",
            "--env",
            "NOEQUALS",
            "--",
            "true",
        ],
        &["job", "get", "x-1"],
        &["job", "update", "j-1", "--priority", "-1"],
        &["job", "list", "--state", "SLEEPING"],
        &["cluster", "add-member", "--id", "4", "--address", "nohost"],
        &["share", "list", "-o", "yaml"],
        &[
            "job",
            "submit",
            "--share",
            "qs1",
            "--gpus",
            "1",
            "--idempotency-key",
            "",
            "--",
            "true",
        ],
        &["cluster", "backup", "--out", "/dev/null"],
        &["job", "history", "--since", "1h", "--until", "2h"],
        &[
            "share",
            "create",
            "qs1",
            "--limit",
            "a10g=1000001",
            "--strategy",
            "lend",
        ],
        &[
            "share",
            "create",
            "qs1",
            "--limit",
            "a10g=1",
            "--strategy",
            "lend-and-borrow",
            "--borrow-limit",
            "10001",
        ],
        &["share", "update", "qs1", "--limit", "a10g=2000000"],
        &["group", "create", "g 1"],
        &["group", "update", "g1", "--add-user", "a b"],
        &["access-key", "create", "--user", "a b"],
        &["audit", "--user", "a/b"],
        &["certs", "revoke", "--name", "a b"],
        &["certs", "unrevoke", "--name", "a b"],
        &[
            "certs",
            "issue",
            "--dir",
            "/nonexistent",
            "--role",
            "user",
            "--name",
            "ok",
            "--san",
            "bad host!",
        ],
        &[
            "share",
            "usage",
            "--since",
            "2026-12-02T00:00:00Z",
            "--until",
            "2026-12-01T00:00:00Z",
        ],
        &["share", "usage", "--since", "2999-01-01T00:00:00Z"],
        &["share", "usage", "--until", "2d"],
        &["cluster", "backup", "--out", "/"],
        &["frobnicate"],
    ];
    for arguments in cases {
        let output = quotient(arguments, None, home.path());
        assert_eq!(
            output.status.code(),
            Some(2),
            "{arguments:?}: {}",
            stderr(&output)
        );
        assert!(output.stdout.is_empty(), "{arguments:?}");
        assert!(
            stderr(&output).starts_with("error[InvalidArgument]: "),
            "{arguments:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn dev_up_refuses_a_retention_its_coordinators_would_refuse_before_writing_anything() {
    // Proves `dev up --retain-finished` out of the coordinators' range is a usage error that
    // leaves no cluster.json behind (one would make every later `dev up --dir` fail).
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("cluster");
    let dir_text = dir.display().to_string();
    for retain in ["0s", "999ms", "401d"] {
        let output = quotient(
            &["dev", "up", "--dir", &dir_text, "--retain-finished", retain],
            None,
            home.path(),
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{retain}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("finished jobs"),
            "{}",
            stderr(&output)
        );
        assert!(!dir.exists(), "{retain}: nothing written");
    }
}

/// The `{"error": {...}}` document a failed `-o json` command printed on stderr.
fn json_error(output: &Output) -> serde_json::Value {
    let text = stderr(output);
    let document: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|error| panic!("stderr is not one JSON document ({error}): {text}"));
    document["error"].clone()
}

#[test]
fn with_json_output_an_error_is_one_json_document_on_stderr_with_its_code() {
    // Proves `-o json` errors are for machines too: a usage error found by clap or after it,
    // and a local failure, each as {"error": {"code", "message"}} on stderr, nothing on
    // stdout, with the exit status of the contract.
    let home = tempfile::tempdir().unwrap();
    for arguments in [
        &["job", "list", "--state", "SLEEPING", "-o", "json"][..],
        &["share", "update", "qs1", "-o", "json"],
        &["job", "list", "--bogus", "--output=json"],
    ] {
        let output = quotient(arguments, None, home.path());
        assert_eq!(output.status.code(), Some(2), "{arguments:?}");
        assert!(output.stdout.is_empty(), "{arguments:?}");
        let error = json_error(&output);
        assert_eq!(error["code"], "InvalidArgument", "{arguments:?}: {error}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|text| !text.is_empty()),
            "{error}"
        );
    }
    let missing = home.path().join("nowhere.toml");
    let output = quotient(
        &["share", "list", "-o", "json"],
        Some(&missing),
        home.path(),
    );
    assert_eq!(output.status.code(), Some(1));
    let error = json_error(&output);
    assert_eq!(error["code"], "Local", "{error}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|text| text.contains("nowhere.toml")),
        "{error}"
    );
}

#[test]
fn a_job_too_large_to_launch_is_refused_before_anything_is_sent() {
    // Proves `job submit` refuses arguments and environment that are each under the launch
    // limit but over it together, naming the total and the limit, as a usage error.
    let home = tempfile::tempdir().unwrap();
    let value = "x".repeat(16_000);
    let env: Vec<String> = (0..40)
        .map(|index| format!("VALUE_{index}={value}"))
        .collect();
    let mut arguments = vec![
        "job",
        "submit",
        "--share",
        "team",
        "--priority",
        "1",
        "--gpus",
        "1",
    ];
    for variable in &env {
        arguments.extend(["--env", variable.as_str()]);
    }
    arguments.extend(["--", "train.sh"]);
    arguments.extend(std::iter::repeat_n(value.as_str(), 30));
    let output = quotient(&arguments, None, home.path());
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(output.stdout.is_empty());
    assert!(
        text.contains("over the limit of 131072 bytes") && text.contains("through a file"),
        "{text}"
    );
}

#[test]
fn a_missing_config_names_where_it_looked_and_how_to_make_one() {
    // Proves the lookup order reaches the user: $QUOTIENT_CONFIG, then ~/.config/quotient.
    let home = tempfile::tempdir().unwrap();
    let missing = home.path().join("nowhere.toml");
    let output = quotient(&["share", "list"], Some(&missing), home.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(text.starts_with("error[Local]: "), "{text}");
    assert!(text.contains("nowhere.toml"), "{text}");
    assert!(text.contains("QUOTIENT_CONFIG"), "{text}");
    assert!(text.contains("quotient dev up"), "{text}");

    let output = quotient(&["job", "list", "-o", "json"], None, home.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(output.stdout.is_empty());
    let text = stderr(&output);
    assert!(text.contains(".config/quotient/config.toml"), "{text}");

    let flag = home.path().join("flag.toml");
    let output = quotient(
        &["cluster", "status", "--config", flag.to_str().unwrap()],
        Some(&missing),
        home.path(),
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("flag.toml"), "{}", stderr(&output));
}

#[test]
fn an_unreachable_cluster_fails_with_exit_1_and_a_hint() {
    // Proves a config pointing at nothing fails within the deadline, saying what to check.
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let status = Command::new(env!("CARGO_BIN_EXE_quotient"))
        .args(["certs", "init", "--dir", certs.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(status.status.success());
    let status = Command::new(env!("CARGO_BIN_EXE_quotient"))
        .args([
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--role",
            "admin",
            "--name",
            "admin",
        ])
        .output()
        .unwrap();
    assert!(status.status.success());
    // A bound but silent UDP socket: nothing will ever answer the handshake there.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    let config = dir.path().join("client.toml");
    std::fs::write(
        &config,
        format!(
            "coordinators = [\"{address}\"]\nca = \"certs/ca.pem\"\ncert = \"certs/admin.pem\"\nkey = \"certs/admin-key.pem\"\n"
        ),
    )
    .unwrap();
    let output = quotient(&["share", "list"], Some(&config), dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(text.starts_with("error[Unavailable]: "), "{text}");
    assert!(text.contains(&address.to_string()), "{text}");
    assert!(text.contains("is the cluster running"), "{text}");
    assert!(text.contains("quotient dev up"), "{text}");
}

#[test]
fn job_submit_needs_no_priority_or_name() {
    // Proves `--priority` and `--name` are optional: a submit with neither is no usage
    // error (exit 2) but goes on to look for a cluster (here: no config, exit 1).
    let home = tempfile::tempdir().unwrap();
    let missing = home.path().join("nowhere.toml");
    let arguments = [
        "job", "submit", "--share", "qs1", "--gpus", "1", "--", "true",
    ];
    let output = quotient(&arguments, Some(&missing), home.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("nowhere.toml"),
        "{}",
        stderr(&output)
    );
    let help = quotient(&["job", "submit", "--help"], None, home.path());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("[default: 0]"), "{text}");
}

#[test]
fn out_of_range_priorities_and_gpu_counts_are_said_plainly() {
    // Proves `--priority -1` is read as a priority (not as an unknown flag) and says the
    // range, and `--gpus 0` says how many GPUs a job may ask for; both exit 2 before anything
    // is sent.
    let home = tempfile::tempdir().unwrap();
    let submit = |extra: &[&str]| {
        let mut arguments = vec!["job", "submit", "--share", "qs1"];
        arguments.extend_from_slice(extra);
        arguments.extend_from_slice(&["--", "true"]);
        quotient(&arguments, None, home.path())
    };
    for (arguments, expected) in [
        (
            submit(&["--priority", "-1", "--gpus", "1"]),
            "priorities are 0 to 9999, and higher runs first",
        ),
        (
            submit(&["--priority", "10000", "--gpus", "1"]),
            "priorities are 0 to 9999",
        ),
        (submit(&["--gpus", "0"]), "a job needs 1 to 64 GPUs"),
        (submit(&["--gpus", "-1"]), "a job needs 1 to 64 GPUs"),
        (
            quotient(
                &["job", "update", "j-1", "--priority", "-1"],
                None,
                home.path(),
            ),
            "priorities are 0 to 9999",
        ),
    ] {
        let text = stderr(&arguments);
        assert_eq!(arguments.status.code(), Some(2), "{text}");
        assert!(text.contains(expected), "{expected:?} in {text}");
        assert!(!text.contains("unexpected argument"), "{text}");
    }
}

#[test]
fn help_shows_the_defaults() {
    // Proves `job submit --help` shows the grace period's default, and `dev up --help` says
    // that a folder's own settings are read back.
    let home = tempfile::tempdir().unwrap();
    let help = quotient(&["job", "submit", "--help"], None, home.path());
    let text = String::from_utf8_lossy(&help.stdout);
    let grace = text
        .split("--grace-period")
        .nth(1)
        .and_then(|rest| rest.split("--max-preemptions").next())
        .unwrap_or_default();
    assert!(grace.contains("[default: 30s]"), "{text}");
    let help = quotient(&["dev", "up", "--help"], None, home.path());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("settings DIR recorded"), "{text}");
    assert!(text.contains("as DIR's nodes have them"), "{text}");
}
