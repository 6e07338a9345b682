//! A job's attempts through real processes (one coordinator, one agent on the process
//! runtime, the CLI): retries of failed attempts and the rules that stop them, the time limit
//! that ends an attempt, the times and attempt history that `job get` shows afterwards, and
//! a job's checkpoints as its agent sees them.

use std::path::Path;
use std::time::Duration;

use quotient_tests::{poll_until, DevCluster};
use serde_json::Value;

/// How long a job may take to be placed, run, fail and be retried, or be stopped at its time
/// limit: many times what it takes on a quiet machine.
const SETTLE: Duration = Duration::from_secs(60);

/// The attempts of a job's JSON view.
fn history(view: &Value) -> &Vec<Value> {
    view["attempt_history"]
        .as_array()
        .unwrap_or_else(|| panic!("no attempt_history: {view}"))
}

/// A time in milliseconds since the Unix epoch as `job get` prints it: RFC 3339 in UTC, to
/// the second (days to a civil date as in Howard Hinnant's `civil_from_days`).
fn rfc3339(ms: u64) -> String {
    let seconds = ms / 1000;
    let (days, rest) = ((seconds / 86_400) as i64, seconds % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[test]
fn the_civil_date_of_known_instants() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400_999), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_796_411_211_000), "2026-12-04T19:06:51Z");
}

/// The value after `field:` on its line of `job get`'s text.
fn field<'a>(text: &'a str, field: &str) -> &'a str {
    let prefix = format!("{field}:");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {field:?} line in:\n{text}"))
}

#[test]
fn a_failing_job_is_retried_until_its_retries_are_used_then_fails() {
    // Proves that each failed attempt (a non-zero exit) is retried as a new attempt while
    // retries are left, that the job then ends FAILED saying how many it used, and that its
    // attempt history keeps every attempt with its exit code and how it ended.
    let cluster = DevCluster::one_gpu();
    let job = cluster.submit("team", &["--retries", "2"], &["sh", "-c", "exit 3"]);
    let view = cluster.wait_for_state(&job, "FAILED", SETTLE);
    assert_eq!(view["attempts"], 3, "one attempt and two retries: {view}");
    assert_eq!(view["retries"], 2, "{view}");
    assert_eq!(view["retries_used"], 2, "{view}");
    assert_eq!(view["exit_code"], 3, "{view}");
    assert_eq!(view["preemptions"], 0, "{view}");
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("exited with code 3"), "{view}");
    assert!(reason.contains("after 2 of 2 retries"), "{view}");
    let attempts = history(&view);
    assert_eq!(attempts.len(), 3, "{view}");
    for (index, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt["attempt"], index + 1, "{view}");
        assert_eq!(attempt["node"], "node-1", "{view}");
        assert_eq!(attempt["exit_code"], 3, "{view}");
        assert_eq!(attempt["outcome"], "exited with code 3", "{view}");
        let placed = attempt["placed_ms"].as_u64().expect("placed_ms");
        let started = attempt["started_ms"].as_u64().expect("started_ms");
        let ended = attempt["ended_ms"].as_u64().expect("ended_ms");
        assert!(placed <= started && started <= ended, "{attempt}");
    }
    let text = cluster.ok(&["job", "get", &job]);
    assert_eq!(field(&text, "retries"), "2 of 2", "{text}");
    for attempt in 1..=3 {
        let line = format!("#{attempt} on node-1: ");
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&line) && l.ends_with("exited with code 3")),
            "attempt {attempt} in:\n{text}"
        );
    }
}

#[test]
fn a_retry_rule_that_says_exit_ends_the_job_at_its_first_failure() {
    // Proves that `--retry-on exit:exit-code=3` fails a job exiting 3 at once, retries left
    // or not, and that one matching `retry:` retries a failure other rules would not.
    let cluster = DevCluster::one_gpu();
    let job = cluster.submit(
        "team",
        &["--retries", "5", "--retry-on", "exit:exit-code=3"],
        &["sh", "-c", "exit 3"],
    );
    let view = cluster.wait_for_state(&job, "FAILED", SETTLE);
    assert_eq!(view["attempts"], 1, "{view}");
    assert_eq!(view["retries"], 5, "{view}");
    assert_eq!(view["retries_used"], 0, "{view}");
    assert_eq!(
        view["retry_rules"],
        serde_json::json!(["exit:exit-code=3"]),
        "{view}"
    );
    assert_eq!(history(&view).len(), 1, "{view}");
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("exited with code 3")
            && reason.contains("after 0 of 5 retries")
            && reason.contains("a retry rule said exit"),
        "{view}"
    );

    // The first matching rule decides: exit codes 1* are retried, 3 ends the job.
    let job = cluster.submit(
        "team",
        &[
            "--retries",
            "5",
            "--retry-on",
            "retry:exit-code=1*",
            "--retry-on",
            "exit:exit-code=3",
        ],
        &[
            "sh",
            "-c",
            "if [ \"$QUOTIENT_ATTEMPT\" -lt 3 ]; then exit 12; else exit 3; fi",
        ],
    );
    let view = cluster.wait_for_state(&job, "FAILED", SETTLE);
    let codes: Vec<&Value> = history(&view).iter().map(|a| &a["exit_code"]).collect();
    assert_eq!(codes, [12, 12, 3], "{view}");
    assert_eq!(view["retries_used"], 2, "{view}");
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("after 2 of 5 retries; a retry rule said exit"),
        "{view}"
    );
}

/// Whether process `pid` is alive (a zombie is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
        })
        .unwrap_or(false)
}

/// The pid a job wrote to `file`, once it has.
fn pid_in(file: &Path) -> i32 {
    poll_until("the job to write its pid", SETTLE, || {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .ok_or_else(|| format!("nothing in {}", file.display()))
    })
}

#[test]
fn a_job_past_its_time_limit_is_stopped_and_fails_with_the_reason() {
    // Proves that the leader stops an attempt past its time limit (checkpoint signal, grace
    // period), that the job ends FAILED saying so, that its process is gone, and that the
    // attempt ran at least its limit.
    let cluster = DevCluster::one_gpu();
    let pid_file = cluster.root.path().join("sleeper.pid");
    let script = format!("echo $$ > {}; exec sleep 600", pid_file.display());
    let job = cluster.submit(
        "team",
        &["--time-limit", "2s", "--grace-period", "1s"],
        &["sh", "-c", &script],
    );
    let pid = pid_in(&pid_file);
    assert!(alive(pid), "the job's process {pid} runs");
    let view = cluster.wait_for_state(&job, "FAILED", SETTLE);
    assert_eq!(view["time_limit_ms"], 2000, "{view}");
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("time limit (2s) reached"), "{view}");
    assert_eq!(view["attempts"], 1, "{view}");
    let attempts = history(&view);
    assert_eq!(attempts.len(), 1, "{view}");
    assert_eq!(attempts[0]["outcome"], "time limit (2s) reached", "{view}");
    let started = attempts[0]["started_ms"].as_u64().expect("started_ms");
    let ended = attempts[0]["ended_ms"].as_u64().expect("ended_ms");
    assert!(ended >= started + 2000, "stopped before its limit: {view}");
    poll_until("the job's process to be gone", SETTLE, || {
        if alive(pid) {
            Err(format!("process {pid} still runs"))
        } else {
            Ok(())
        }
    });
    let text = cluster.ok(&["job", "get", &job]);
    assert_eq!(field(&text, "time limit"), "2s", "{text}");

    // A retry rule on the reason sees the time limit: `exit:reason=time*` ends it at once.
    let job = cluster.submit(
        "team",
        &[
            "--time-limit",
            "2s",
            "--grace-period",
            "1s",
            "--retries",
            "3",
            "--retry-on",
            "exit:reason=time*",
        ],
        &["sleep", "600"],
    );
    let view = cluster.wait_for_state(&job, "FAILED", SETTLE);
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("time limit (2s) reached")
            && reason.contains("after 0 of 3 retries; a retry rule said exit"),
        "{view}"
    );
    assert_eq!(view["attempts"], 1, "{view}");
}

/// The times of a job that ended: submitted ≤ started ≤ ended, waited = started − submitted
/// for a job that ran once, and its last node.
fn check_times(view: &Value) {
    let submitted = view["submitted_ms"].as_u64().expect("submitted_ms");
    let started = view["started_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("an ended job that ran has started_ms: {view}"));
    let ended = view["ended_ms"].as_u64().expect("ended_ms");
    assert!(submitted <= started && started <= ended, "{view}");
    assert_eq!(
        view["waited_ms"].as_u64(),
        Some(started - submitted),
        "{view}"
    );
    assert_eq!(view["last_node"], "node-1", "{view}");
    assert_eq!(view["node"], Value::Null, "{view}");
    let attempts = history(view);
    assert_eq!(attempts.len(), 1, "{view}");
    assert_eq!(attempts[0]["started_ms"].as_u64(), Some(started), "{view}");
    assert_eq!(attempts[0]["ended_ms"].as_u64(), Some(ended), "{view}");
}

#[test]
fn an_ended_job_shows_when_it_was_submitted_started_and_ended() {
    // Proves that a job that ran and ended keeps its times in JSON, in order, with how long
    // it waited and the node it ran on, and that `job get` prints them as RFC 3339 times,
    // its attempt history included. Both for a job that exited and one stopped at its time
    // limit.
    let cluster = DevCluster::one_gpu();
    let job = cluster.submit("team", &[], &["sh", "-c", "sleep 1; exit 0"]);
    let view = cluster.wait_for_state(&job, "SUCCEEDED", SETTLE);
    check_times(&view);
    assert_eq!(view["exit_code"], 0, "{view}");
    let started = view["started_ms"].as_u64().unwrap_or_default();
    let ended = view["ended_ms"].as_u64().unwrap_or_default();
    assert!(ended > started, "it slept a second: {view}");

    let text = cluster.ok(&["job", "get", &job]);
    let submitted = view["submitted_ms"].as_u64().unwrap_or_default();
    assert_eq!(field(&text, "submitted"), rfc3339(submitted), "{text}");
    assert_eq!(field(&text, "started"), rfc3339(started), "{text}");
    assert_eq!(field(&text, "ended"), rfc3339(ended), "{text}");
    assert_eq!(field(&text, "last node"), "node-1", "{text}");
    assert_eq!(field(&text, "exit code"), "0", "{text}");
    let attempt = format!(
        "#1 on node-1: {} to {}: exited with code 0",
        rfc3339(started),
        rfc3339(ended)
    );
    assert!(
        text.lines().any(|line| line.trim() == attempt),
        "{attempt:?} in:\n{text}"
    );

    let job = cluster.submit(
        "team",
        &["--time-limit", "2s", "--grace-period", "1s"],
        &["sleep", "600"],
    );
    let view = cluster.wait_for_state(&job, "FAILED", SETTLE);
    check_times(&view);
    let text = cluster.ok(&["job", "get", &job]);
    assert!(
        field(&text, "started").ends_with('Z') && field(&text, "started").contains('T'),
        "{text}"
    );
}

/// A job that touches its checkpoint marker is seen to checkpoint: `job get` shows when, in
/// JSON and in text, and `job explain` says what a preemption would cost it now; once the job
/// holds no GPUs, the time is gone (its next attempt would resume from that checkpoint).
#[test]
fn a_jobs_checkpoint_marker_reaches_job_get_and_explain() {
    let cluster = DevCluster::one_gpu();
    let id = cluster.submit(
        "team",
        &[],
        &[
            "sh",
            "-c",
            r#"sleep 1; touch "$QUOTIENT_CHECKPOINT_DIR/.quotient-checkpointed"; sleep 60"#,
        ],
    );
    let view = poll_until(&format!("{id}'s checkpoint"), SETTLE, || {
        let view = cluster.json(&["job", "get", &id, "-o", "json"]);
        match view["last_checkpoint_ms"].as_u64() {
            Some(_) => Ok(view),
            None => Err(view.to_string()),
        }
    });
    let at = view["last_checkpoint_ms"].as_u64().unwrap_or_default();
    let started = view["started_ms"].as_u64().expect("it runs");
    assert!(at >= started, "checkpointed after it started: {view}");
    let text = cluster.ok(&["job", "get", &id]);
    assert!(
        text.contains(&format!("last checkpoint:  {}", rfc3339(at))),
        "{text}"
    );
    let explained = cluster.ok(&["job", "explain", &id]);
    assert!(
        explained.contains("a preemption now would lose") && explained.contains("last checkpoint"),
        "{explained}"
    );
    cluster.ok(&["job", "cancel", &id]);
    let ended = cluster.wait_for_state(&id, "CANCELLED", SETTLE);
    assert!(ended["last_checkpoint_ms"].is_null(), "{ended}");
}
