//! A step of the hosts' wall clock, through real processes: every coordinator and agent of a
//! `dev up` cluster runs under libfaketime (Debian's `faketime`), whose offset the test moves
//! while they run, their monotonic clocks left real, as on a host whose clock is stepped
//! (docs/operations.md, "Clocks"). Found by probing: a leader's clock stepped 3 h forward
//! killed a job for its 2 h time limit after 13 s, and removed every finished job from the
//! replicated state at once.

use std::time::Duration;

use quotient_tests::{libfaketime, poll_until, DevCluster};

const SETTLE: Duration = Duration::from_secs(60);

#[test]
fn a_step_of_the_clock_kills_no_job_by_its_time_limit_and_removes_nothing() {
    let Some(library) = libfaketime() else {
        return;
    };
    let clock_dir = tempfile::tempdir().expect("a temporary directory");
    let offset = clock_dir.path().join("offset");
    std::fs::write(&offset, "+0\n").expect("the offset file");
    let library = library.display().to_string();
    let offset_text = offset.display().to_string();
    let cluster = DevCluster::up_with_env(
        &[
            "--coordinators",
            "3",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--retain-finished",
            "1h",
        ],
        &[
            ("LD_PRELOAD", &library),
            ("FAKETIME_TIMESTAMP_FILE", &offset_text),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    cluster.create_share("team", 1, "lend", &[]);
    let limited = cluster.submit(
        "team",
        &["--time-limit", "1h", "--grace-period", "2s"],
        &["sleep", "600"],
    );
    cluster.wait_for_state(&limited, "RUNNING", SETTLE);
    let cancelled = cluster.submit("team", &[], &["true"]);
    cluster.ok(&["job", "cancel", &cancelled]);
    cluster.wait_for_state(&cancelled, "CANCELLED", SETTLE);

    eprintln!("--- every host's clock steps 2 h forward");
    std::fs::write(&offset, "+2h\n").expect("the offset file");
    // Every coordinator says so in its health: the leader against the time it keeps, the
    // followers against the cluster's time, which they keep from the leader's stamps.
    poll_until("the step in every coordinator's health", SETTLE, || {
        let output = cluster.run(&["cluster", "health", "-o", "json"]);
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let leader = text.matches("ahead of the time this process keeps").count();
        let followers = text.matches("ahead of the cluster's time").count();
        if leader >= 1 && followers >= 2 {
            Ok(())
        } else {
            Err(text)
        }
    });
    // Time limits and retention are checked every second or two: give them several turns.
    std::thread::sleep(Duration::from_secs(8));
    let job = cluster.json(&["job", "get", &limited, "-o", "json"]);
    assert_eq!(job["state"], "RUNNING", "{job}");
    let job = cluster.json(&["job", "get", &cancelled, "-o", "json"]);
    assert_eq!(job["state"], "CANCELLED", "still in the live state: {job}");

    eprintln!("--- the clocks are set right again: the problem goes");
    std::fs::write(&offset, "+0\n").expect("the offset file");
    poll_until("every coordinator healthy again", SETTLE, || {
        let output = cluster.run(&["cluster", "health"]);
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stdout).to_string())
        }
    });
    let job = cluster.json(&["job", "get", &limited, "-o", "json"]);
    assert_eq!(job["state"], "RUNNING", "{job}");

    eprintln!("--- a CLI on a host 2 h behind is told to look at its clock");
    let output = std::process::Command::new(quotient_tests::binaries().join("quotient"))
        .args(["job", "list"])
        .env("QUOTIENT_CONFIG", &cluster.config)
        .env("LD_PRELOAD", &library)
        .env("FAKETIME", "-2h")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output()
        .expect("the quotient binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("is not valid at this host's time") && stderr.contains("clock"),
        "{stderr}"
    );
}
