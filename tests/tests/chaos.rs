//! `quotient-chaos` end to end: two short episodes of a fixed seed against clusters of Docker
//! containers (coordinators and agents each in a container of its own), with faults injected
//! while clients run; the checker must find no violation, and faults must have been injected.
//! The seed's two episodes include a full disk and a one-way loss (carried out where the host
//! allows: root, loop devices, nsenter and iptables).
//! Also: bad flags are refused with a clear message.
//!
//! Needs Docker: without it the episodes' test fails when `CI=true` and is skipped, with the
//! reason, otherwise.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test, built by cargo for this package's integration tests.
const CHAOS: &str = env!("CARGO_BIN_EXE_quotient-chaos");
/// The fixed seed of the episodes.
const SEED: &str = "20240613";
/// The longest the two episodes may take, image build included.
const DEADLINE: Duration = Duration::from_secs(240);

fn docker_reachable() -> Result<(), String> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Err(error) => Err(format!("the docker CLI cannot run: {error}")),
        Ok(output) if !output.status.success() => Err(format!(
            "the Docker daemon is not reachable: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

#[test]
fn two_episodes_with_faults_find_no_violation() {
    // Proves that under kills, pauses, stops, disconnects, partitions and one-way losses of
    // coordinators and agents, and a coordinator's full disk, no acknowledged write is lost,
    // no job is duplicated or runs twice at once, no GPU is given twice, the replicas agree,
    // the state passes the core's checks and nothing is stuck once healed; and that faults
    // were really injected.
    if let Err(reason) = docker_reachable() {
        if std::env::var("CI").is_ok_and(|value| value == "true") {
            panic!("CI=true, and this test needs Docker: {reason}");
        }
        eprintln!("skipped: {reason} (set CI=true to make this a failure)");
        return;
    }
    // The agents' and coordinators' binaries go into the image: they must be built.
    let bin_dir = quotient_tests::binaries();
    let out = tempfile::tempdir().expect("a temporary directory");
    let started = Instant::now();
    let mut child = Command::new(CHAOS)
        .args(["--episodes", "2", "--seed", SEED, "--length-s", "20"])
        .args(["--coordinators", "3", "--agents", "3"])
        .arg("--bin-dir")
        .arg(&bin_dir)
        .arg("--out")
        .arg(out.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("quotient-chaos runs");
    let pid = child.id();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            // A kill skips the teardown: say how to remove what is left.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "quotient-chaos ran past {DEADLINE:?}; remove its containers with \
                 `docker ps -aq --filter label=quotient-chaos=quotient-chaos-{pid}-1 | xargs docker rm -f`"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("stdout is text");
    eprintln!("quotient-chaos took {:.1?}", started.elapsed());
    let last = stdout.lines().last().unwrap_or_default();
    let summary: Value = serde_json::from_str(last)
        .unwrap_or_else(|error| panic!("the last line is no JSON ({error}): {stdout}"));
    eprintln!("{summary}");
    for key in [
        "lost_acks",
        "duplicate_jobs",
        "double_runs",
        "gpu_overcommits",
        "divergent_replicas",
        "stuck_jobs",
        "phantom_writes",
        "invariant_violations",
    ] {
        assert_eq!(
            summary[key], 0,
            "{key}: {summary} (stderr above says which)"
        );
    }
    assert!(status.success(), "exit status {status}: {summary}");
    assert_eq!(summary["episodes"], 2, "{summary}");
    assert_eq!(summary["seed"].to_string(), SEED, "{summary}");
    assert!(summary["operations"].as_u64() > Some(20), "{summary}");
    assert!(summary["acknowledged"].as_u64() > Some(10), "{summary}");
    let faults = summary["faults"].as_object().expect("faults by kind");
    let injected: u64 = faults
        .iter()
        .filter(|(kind, _)| kind.as_str() != "concurrent")
        .filter_map(|(_, count)| count.as_u64())
        .sum();
    assert!(injected >= 2, "faults were injected: {summary}");
    // Nothing left behind: no container and no network of its episodes.
    for episode in [1, 2] {
        let network = format!("quotient-chaos-{pid}-{episode}");
        let filter = format!("label=quotient-chaos={network}");
        let left = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
            .expect("docker runs");
        assert!(
            String::from_utf8_lossy(&left.stdout).trim().is_empty(),
            "containers of {network} left"
        );
        let network_left = Command::new("docker")
            .args(["network", "inspect", &network])
            .output()
            .expect("docker runs");
        assert!(
            !network_left.status.success(),
            "the network {network} is left"
        );
    }
}

#[test]
fn bad_flags_are_refused_with_a_clear_message() {
    // Proves that no episode starts from a bad command line, and the message says what is
    // wrong (exit status 2, as clap's usage errors).
    for (arguments, expected) in [
        (&["--episodes", "0"][..], "run at least 1 episode"),
        (&["--frobnicate"][..], "unexpected argument '--frobnicate'"),
        (&["--coordinators", "4"][..], "3 or 5 coordinators"),
        (&["--agents", "2"][..], "3 to 16 agents"),
        (&["--episode", "0"][..], "numbered from 1"),
        (&["--length-s", "x"][..], "5 to 3600 seconds"),
        (&["--parallel", "17"][..], "1 to 16 episodes at once"),
        (
            &["--episodes", "3", "--from-episode", "4"][..],
            "nothing to run",
        ),
    ] {
        let output = Command::new(CHAOS)
            .args(arguments)
            .output()
            .expect("quotient-chaos runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{arguments:?}: {stderr}");
        assert!(stderr.contains(expected), "{arguments:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{arguments:?}");
    }
}
