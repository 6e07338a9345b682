//! A client command issued the instant the leader is killed is answered once the others have
//! elected a new leader, without waiting out a connect deadline on the dead one. How fast is
//! measured by `benches/failover.rs` (BENCHMARKS.md); this test holds a generous bound, so it
//! fails only if the client waits on the dead leader for good or gives up.

use std::time::Duration;

use quotient_tests::{failover_cluster, FAILOVER_SUBMIT};

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
