//! Failover latency as a user sees it: `cargo build --release && cargo bench -p
//! quotient-tests --bench failover`.
//!
//! A local cluster (`quotient dev up --nodes 0`: 3 coordinators on loopback, release
//! binaries). Each run SIGKILLs the leading coordinator and at once runs `quotient job submit`
//! (the real CLI, a new process, as a person or a script would), and measures from the kill to
//! the command's exit with the job acknowledged. Then `dev up` starts the killed coordinator
//! again and the next run waits until all three are healthy. `QUOTIENT_BENCH_RUNS` (default 5)
//! sets the runs. The last line printed is one JSON object.

use std::time::Duration;

use quotient_tests::{failover_cluster, FAILOVER_SUBMIT};

const RUNS_DEFAULT: usize = 5;
/// How long the cluster may take to report every coordinator healthy between runs.
const SETTLE: Duration = Duration::from_secs(60);

fn main() {
    let runs: usize = std::env::var("QUOTIENT_BENCH_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(RUNS_DEFAULT);
    let cluster = failover_cluster();
    let dir = cluster.dir.display().to_string();
    let mut figures_ms = Vec::new();
    for run in 1..=runs {
        cluster.wait_healthy(SETTLE);
        let (took, output) = cluster.kill_leader_then(&FAILOVER_SUBMIT);
        assert!(
            output.status.success(),
            "run {run}: the submit failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let ms = took.as_secs_f64() * 1_000.0;
        eprintln!("run {run}: kill -> acknowledged in {ms:.0} ms");
        figures_ms.push(ms);
        cluster.ok(&["dev", "up", "--dir", &dir]);
    }
    let mut sorted = figures_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let rounded: Vec<String> = figures_ms.iter().map(|ms| format!("{ms:.0}")).collect();
    println!(
        "{{\"bench\":\"failover\",\"runs\":{runs},\"kill_to_ack_ms\":[{}],\"p50_ms\":{:.0},\"max_ms\":{:.0}}}",
        rounded.join(","),
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    );
}
