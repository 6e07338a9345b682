//! Jobs that can never start, through real processes (a coordinator, an agent on the process
//! runtime, the CLI): the agent gives up after a few tries, `job get` ends with the state and
//! the reason, and the GPU is free for the next job. It once held the GPU forever, SCHEDULED
//! with no reason, while the agent retried every 25 ms.

use std::time::Duration;

use quotient_tests::DevCluster;
use serde_json::Value;

/// How long a job may take to be placed, tried and given up (several times over for a node
/// that cannot launch it), or to run.
const SETTLE: Duration = Duration::from_secs(60);

/// The GPU is free: a job that needs it runs to the end.
fn the_gpu_is_free(cluster: &DevCluster) {
    let next = cluster.submit("team", &[], &["sh", "-c", "exit 0"]);
    cluster.wait_for_state(&next, "SUCCEEDED", SETTLE);
}

/// A container job that no node can run (no node's agent reaches Docker, or none holds its
/// image: images are never pulled) is never placed, so it never fails a launch: it waits, its
/// reason says why, and the GPU stays free for other jobs.
#[test]
fn a_job_no_node_can_run_waits_saying_why_and_leaves_the_gpu_free() {
    let cluster = DevCluster::one_gpu();
    let job = cluster.submit("team", &["--image", "no-such-trainer:1"], &["train"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let view = loop {
        let view: Value =
            serde_json::from_str(&cluster.ok(&["job", "get", &job, "-o", "json"])).unwrap();
        if view["reason"].is_string() || std::time::Instant::now() > deadline {
            break view;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(view["state"], "RUNNABLE", "{view}");
    assert_eq!(view["attempts"], 0, "never placed: {view}");
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("can run it"), "{view}");
    assert!(
        reason.contains("no Docker runtime")
            || reason.contains("does not hold image no-such-trainer:1"),
        "{view}"
    );
    let explained = cluster.ok(&["job", "explain", &job]);
    assert!(
        explained.contains("images are never pulled") || explained.contains("reaches Docker"),
        "{explained}"
    );
    the_gpu_is_free(&cluster);
}

/// A job whose launch fails for the node's reason (the agent cannot create its checkpoint
/// folder) goes back to the queue a bounded number of times, then fails, and `job get` says
/// why; the GPU is free for the next job.
#[test]
fn a_job_a_node_cannot_launch_is_requeued_a_few_times_then_fails() {
    let cluster = DevCluster::one_gpu();
    // The next job is j-1: a file where its checkpoint folder goes makes every launch of it
    // fail with an I/O error in the agent's folders.
    let checkpoints = cluster.dir.join("checkpoints");
    std::fs::create_dir_all(&checkpoints).expect("the checkpoints folder");
    std::fs::write(checkpoints.join("j-1"), b"in the way").expect("the blocking file");
    let job = cluster.submit("team", &[], &["sh", "-c", "exit 0"]);
    assert_eq!(job, "j-1");
    let view = cluster.wait_for_state(&job, "FAILED", SETTLE);
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("launch failed on node node-1 after 3 tries: "),
        "{view}"
    );
    assert!(reason.contains("j-1"), "the runtime's message: {view}");
    assert!(
        reason.contains("failed to launch 4 times, more than the 3 requeues allowed"),
        "{view}"
    );
    assert_eq!(
        view["attempts"], 4,
        "placed once and requeued 3 times: {view}"
    );
    assert_eq!(view["preemptions"], 0, "{view}");
    // Its logs are the launch failure, and a failure: the attempt never ran to write any.
    for arguments in [
        vec!["job", "logs", &job],
        vec!["job", "logs", &job, "--follow"],
    ] {
        let logs = cluster.run(&arguments);
        let stderr = String::from_utf8_lossy(&logs.stderr);
        assert_eq!(logs.status.code(), Some(1), "{arguments:?}: {stderr}");
        assert!(logs.stdout.is_empty(), "{arguments:?}");
        assert!(
            stderr.contains("never started") && stderr.contains("launch failed on node node-1"),
            "{arguments:?}: {stderr}"
        );
    }
    the_gpu_is_free(&cluster);
}
