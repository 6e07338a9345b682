//! A client command issued the instant the leader is killed is answered once the others have
//! elected a new leader, without waiting out a connect deadline on the dead one; an agent
//! registers with the new leader over a connection it kept open to it. How fast is
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

#[test]
fn an_agent_registers_with_the_next_leader_over_the_connection_it_kept() {
    // Proves the agent's standing connections (agent/src/session.rs): it keeps one open to
    // each coordinator besides the leader, and after the leader is killed it registers with
    // the new one over it, with no handshake; the new leader reads a running job's log over
    // that connection too, and the job runs on in its first attempt.
    let cluster = DevCluster::up_with_env(
        &["--nodes", "1"],
        &[("QUOTIENT_AGENT_STANDING_CONNECTIONS_WITHIN", "1s")],
    );
    cluster.create_share("team", 1, "lend", &[]);
    let job = cluster.submit(
        "team",
        &[],
        &["sh", "-c", "echo attempt=$QUOTIENT_ATTEMPT; exec sleep 600"],
    );
    cluster.wait_for_state(&job, "RUNNING", SETTLE);
    let agent = cluster.metrics_addresses("agents").remove(0);
    let scrape = || http_get(&agent, "/metrics");
    poll_until("two standing connections", SETTLE, || {
        let text = scrape()?;
        match metric(&text, "quotient_agent_standing_connections") {
            Some(2.0) => Ok(()),
            other => Err(format!("{other:?} open")),
        }
    });
    let standing = r#"quotient_agent_registrations_total{connection="standing"}"#;
    let new = r#"quotient_agent_registrations_total{connection="new"}"#;
    let before = scrape().expect("the agent's metrics");
    assert_eq!(metric(&before, standing), Some(0.0), "{before}");
    let killed = cluster.kill_leader();
    poll_until("a registration over a standing connection", SETTLE, || {
        let text = scrape()?;
        match metric(&text, standing) {
            Some(count) if count >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    eprintln!(
        "kill -> registered with the new leader in {:?}",
        killed.elapsed()
    );
    let after = scrape().expect("the agent's metrics");
    assert_eq!(
        metric(&after, new),
        metric(&before, new),
        "no new connection was needed: {after}"
    );
    let logs = cluster.ok(&["job", "logs", &job]);
    assert_eq!(logs, "attempt=1\n", "the new leader reads the log of {job}");
    let got = cluster.json(&["job", "get", &job, "-o", "json"]);
    assert_eq!(got["state"], "RUNNING", "{got}");
    assert_eq!(got["attempts"], 1, "{got}");
}
