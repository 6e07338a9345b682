//! A client command issued the instant the leader is killed is answered once the others have
//! elected a new leader, without waiting out a connect deadline on the dead one; an agent
//! registers with the new leader over a connection it kept open to it, and re-registers
//! without a new handshake after the leader lost its quorum for a while. How fast is
//! measured by `benches/failover.rs` (BENCHMARKS.md); this test holds a generous bound, so it
//! fails only if the client waits on the dead leader for good or gives up.

use std::time::Duration;

use quotient_tests::prometheus::http_get;
use quotient_tests::{failover_cluster, poll_until, DevCluster, FAILOVER_SUBMIT};

/// Far above the benchmark's figures (about a second), far below the call's own deadline.
const ANSWERED_WITHIN: Duration = Duration::from_secs(10);
/// How long the fresh cluster may take to report every coordinator healthy.
const SETTLE: Duration = Duration::from_secs(60);

#[test]
fn a_submit_issued_as_the_leader_is_killed_is_acknowledged_by_the_next_leader() {
    // Proves failover as a user sees it: `job submit` run at once after SIGKILL of the
    // leader prints a job id well within the bound, and the new leader holds that job.
    let cluster = failover_cluster();
    cluster.wait_healthy(SETTLE);
    let (took, output) = cluster.kill_leader_then(&FAILOVER_SUBMIT);
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    eprintln!("kill -> acknowledged in {took:?}: {stdout}");
    assert!(
        output.status.success(),
        "the submit failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(took < ANSWERED_WITHIN, "acknowledged only after {took:?}");
    let job = cluster.json(&["job", "get", &stdout, "-o", "json"]);
    assert_eq!(job["share"], "team", "{job}");
}

/// A metric's value from an agent's `/metrics` text: the line that starts with `series `.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

const STANDING: &str = r#"quotient_agent_registrations_total{connection="standing"}"#;
const NEW: &str = r#"quotient_agent_registrations_total{connection="new"}"#;

/// Three coordinators and one agent that opens its standing connections within a second.
fn standing_cluster() -> DevCluster {
    DevCluster::up_with_env(
        &["--nodes", "1"],
        &[("QUOTIENT_AGENT_STANDING_CONNECTIONS_WITHIN", "1s")],
    )
}

/// The agent's `/metrics` once it holds a standing connection to both other coordinators.
fn with_two_standing(agent: &str) -> String {
    poll_until("two standing connections", SETTLE, || {
        let text = http_get(agent, "/metrics")?;
        match metric(&text, "quotient_agent_standing_connections") {
            Some(2.0) => Ok(text),
            other => Err(format!("{other:?} open")),
        }
    })
}

/// Waits until the agent registered over a standing connection more often than `before`
/// says; its `/metrics` then.
fn registered_over_standing(agent: &str, before: &str) -> String {
    let count = metric(before, STANDING).unwrap_or_else(|| panic!("no {STANDING}: {before}"));
    poll_until("a registration over a standing connection", SETTLE, || {
        let text = http_get(agent, "/metrics")?;
        match metric(&text, STANDING) {
            Some(now) if now > count => Ok(text),
            other => Err(format!("{other:?}")),
        }
    })
}

#[test]
fn an_agent_registers_with_the_next_leader_over_the_connection_it_kept() {
    // Proves the agent's standing connections (agent/src/session.rs): it keeps one open to
    // each coordinator besides the leader, and after the leader is killed it registers with
    // the new one over it, with no handshake; the new leader reads a running job's log over
    // that connection too, and the job runs on in its first attempt.
    let cluster = standing_cluster();
    cluster.create_share("team", 1, "lend", &[]);
    let job = cluster.submit(
        "team",
        &[],
        &["sh", "-c", "echo attempt=$QUOTIENT_ATTEMPT; exec sleep 600"],
    );
    cluster.wait_for_state(&job, "RUNNING", SETTLE);
    let agent = cluster.metrics_addresses("agents").remove(0);
    let before = with_two_standing(&agent);
    assert_eq!(metric(&before, STANDING), Some(0.0), "{before}");
    let killed = cluster.kill_leader();
    let after = registered_over_standing(&agent, &before);
    eprintln!(
        "kill -> registered with the new leader in {:?}",
        killed.elapsed()
    );
    assert_eq!(
        metric(&after, NEW),
        metric(&before, NEW),
        "no new connection was needed: {after}"
    );
    let logs = cluster.ok(&["job", "logs", &job]);
    assert_eq!(logs, "attempt=1\n", "the new leader reads the log of {job}");
    let got = cluster.json(&["job", "get", &job, "-o", "json"]);
    assert_eq!(got["state"], "RUNNING", "{got}");
    assert_eq!(got["attempts"], 1, "{got}");
}

/// Sends `signal` to every process of `pids`.
fn signal_all(pids: &[libc::pid_t], signal: libc::c_int) {
    for pid in pids {
        // SAFETY: kill(2) on a coordinator this test's cluster started; plain integers.
        assert_eq!(
            unsafe { libc::kill(*pid, signal) },
            0,
            "signal {signal} to {pid}"
        );
    }
}

#[test]
fn an_agent_reregisters_without_a_handshake_after_the_leader_lost_its_quorum() {
    // While both followers are frozen the leader cannot show a quorum's acknowledgement, so
    // it refuses the agent's heartbeats; past the agent's patience (a quarter of its 10 s
    // lease, `leader_patience_ms`) the agent looks for the leader again. It keeps
    // that connection and those to the followers, so once the followers are back it
    // registers over one of them, with no new handshake: with the same leader, or with a new
    // one if the thawed followers called an election (they often do). The same-leader case
    // alone is `agent/tests/agent_session.rs::agent_keeps_its_connection_to_a_leader_that_refuses_heartbeats`.
    let cluster = standing_cluster();
    let agent = cluster.metrics_addresses("agents").remove(0);
    let before = with_two_standing(&agent);
    let (leader, _) = cluster.leader();
    let followers = cluster.follower_pids(leader);
    assert_eq!(followers.len(), 2, "two followers");
    signal_all(&followers, libc::SIGSTOP);
    // Over the 1 s the leader waits for a quorum, the agent's 2.5 s of patience, and a
    // heartbeat interval after it; well inside the 10 s lease.
    std::thread::sleep(Duration::from_millis(5_000));
    signal_all(&followers, libc::SIGCONT);
    let after = registered_over_standing(&agent, &before);
    assert!(
        metric(&after, "quotient_agent_heartbeats_refused_total").is_some_and(|n| n >= 2.0),
        "the leader refused heartbeats: {after}"
    );
    assert_eq!(
        metric(&after, NEW),
        metric(&before, NEW),
        "no new connection was needed: {after}"
    );
    cluster.wait_healthy(SETTLE);
}
