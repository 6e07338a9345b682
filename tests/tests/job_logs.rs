//! `quotient job logs ID [--follow]` through real processes: a coordinator and one agent with
//! the process runtime; the leader reads the attempt's log from the agent over the agent's own
//! connection.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use quotient_tests::{binaries, DevCluster};

/// How long a job may take to be placed, run and reported.
const SETTLE: Duration = Duration::from_secs(60);
/// How long `--follow` may take to show a line or to end after the job does.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(30);
/// How long reading from a node whose agent is gone may take to fail (the leader waits
/// `LEADER_REQUEST_TIMEOUT_MS` for an agent that has not yet been noticed gone).
const AGENT_GONE_DEADLINE: Duration = Duration::from_secs(15);

fn submit(cluster: &DevCluster, script: &str) -> String {
    cluster.submit("team", &[], &["sh", "-c", script])
}

/// The lines a finished job printed, stdout and stderr, come back in order.
#[test]
fn logs_show_what_a_finished_job_printed() {
    let cluster = DevCluster::one_gpu();
    let job = submit(
        &cluster,
        "echo first line; echo attempt=$QUOTIENT_ATTEMPT; echo to stderr >&2; echo last line",
    );
    cluster.wait_for_state(&job, "SUCCEEDED", SETTLE);
    let logs = cluster.ok(&["job", "logs", &job]);
    assert_eq!(
        logs, "first line\nattempt=1\nto stderr\nlast line\n",
        "the logs of {job}"
    );
    let first = cluster.ok(&["job", "logs", &job, "--attempt", "1"]);
    assert_eq!(first, logs, "--attempt 1 is the only attempt");
    let missing = cluster.run(&["job", "logs", &job, "--attempt", "2"]);
    assert_eq!(missing.status.code(), Some(1), "no attempt 2");
}

/// `--follow` on a running job shows lines printed later and ends when the job ends.
#[test]
fn follow_shows_later_lines_and_ends_with_the_job() {
    let cluster = DevCluster::one_gpu();
    let flag = cluster.root.path().join("go-on");
    let script = format!(
        "echo before; while [ ! -e '{}' ]; do sleep 0.1; done; echo after; sleep 0.5; echo done",
        flag.display()
    );
    let job = submit(&cluster, &script);
    cluster.wait_for_state(&job, "RUNNING", SETTLE);

    let mut follow = Command::new(binaries().join("quotient"))
        .args(["job", "logs", &job, "--follow"])
        .env("QUOTIENT_CONFIG", &cluster.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("quotient job logs --follow starts");
    let stdout = follow.stdout.take().expect("its stdout");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = |what: &str| {
        lines
            .recv_timeout(FOLLOW_DEADLINE)
            .unwrap_or_else(|error| panic!("no line {what:?} from --follow: {error}"))
    };
    assert_eq!(next_line("before"), "before");
    std::fs::write(&flag, b"").expect("the flag file is written");
    assert_eq!(next_line("after"), "after");
    assert_eq!(next_line("done"), "done");

    let started = Instant::now();
    let status = loop {
        if let Some(status) = follow.try_wait().expect("waiting for --follow") {
            break status;
        }
        if started.elapsed() > FOLLOW_DEADLINE {
            let _ = follow.kill();
            panic!("--follow did not end within {FOLLOW_DEADLINE:?} of the job's end");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "--follow ended with {status}");
    cluster.wait_for_state(&job, "SUCCEEDED", SETTLE);
}

/// `--follow` on a job still queued says on stderr that it waits for the job to start, then
/// prints the job's lines once it runs, and ends with it.
#[test]
fn follow_on_a_queued_job_waits_for_it_then_follows() {
    let cluster = DevCluster::one_gpu();
    let flag = cluster.root.path().join("release");
    let blocker = submit(
        &cluster,
        &format!("while [ ! -e '{}' ]; do sleep 0.1; done", flag.display()),
    );
    cluster.wait_for_state(&blocker, "RUNNING", SETTLE);
    let queued = submit(&cluster, "echo queued one; echo its end");
    let follow = Command::new(binaries().join("quotient"))
        .args(["job", "logs", &queued, "-f"])
        .env("QUOTIENT_CONFIG", &cluster.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("quotient job logs -f starts");
    // Long enough for a first poll to see the job queued.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&flag, b"").expect("the flag file is written");
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(follow.wait_with_output());
    });
    let output = done
        .recv_timeout(SETTLE)
        .expect("-f ends once the queued job has run")
        .expect("-f's output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "-f ended with {}: {stderr}",
        output.status
    );
    assert!(
        stderr.contains("waiting for it to start"),
        "-f says it waits: {stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "queued one\nits end\n"
    );
}

/// Logs from a node whose agent is gone: exit 1 and an error that names the node, well
/// before the CLI's own deadline.
#[test]
fn logs_from_a_node_whose_agent_is_gone_fail_clearly() {
    let cluster = DevCluster::one_gpu();
    let job = submit(&cluster, "echo hello");
    cluster.wait_for_state(&job, "SUCCEEDED", SETTLE);
    assert_eq!(cluster.ok(&["job", "logs", &job]), "hello\n");

    let described: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cluster.dir.join("cluster.json")).expect("cluster.json"),
    )
    .expect("cluster.json is JSON");
    let pid = described["agents"][0]["pid"]
        .as_i64()
        .and_then(|pid| libc::pid_t::try_from(pid).ok())
        .expect("the agent's pid");
    // SAFETY: kill(2) on the agent process this test's cluster started.
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGKILL) },
        0,
        "the agent is killed"
    );

    let started = Instant::now();
    let output = cluster.run(&["job", "logs", &job]);
    assert_eq!(output.status.code(), Some(1), "exit status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("node-1") && stderr.contains("agent"),
        "the error names the node and its agent: {stderr}"
    );
    assert!(
        started.elapsed() < AGENT_GONE_DEADLINE,
        "answered after {:?}",
        started.elapsed()
    );
}

/// Logs of a job that does not exist: exit 1 and an error that names it.
#[test]
fn logs_of_an_unknown_job_fail_clearly() {
    let cluster = DevCluster::one_gpu();
    let output = cluster.run(&["job", "logs", "j-999"]);
    assert_eq!(output.status.code(), Some(1), "exit status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no job j-999"),
        "the error names the job: {stderr}"
    );
    assert!(output.stdout.is_empty(), "nothing on stdout");
}
