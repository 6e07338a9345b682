//! Job history and GPU accounting through real processes (docs/accounting.md): finished jobs
//! keep their record after retention removed them from the live state; `share usage` splits
//! each share's GPU time into own, borrowed and lent; both survive a restart of every
//! coordinator; table, JSON and CSV.

use std::time::Duration;

use quotient_tests::{poll_until, DevCluster};
use serde_json::Value;

const SETTLE: Duration = Duration::from_secs(60);

/// The usage row of `share` in `rows`.
fn row<'a>(rows: &'a Value, share: &str) -> &'a Value {
    rows.as_array()
        .expect("usage rows")
        .iter()
        .find(|row| row["share"] == share)
        .unwrap_or_else(|| panic!("no row of {share}: {rows}"))
}

fn seconds(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("a number: {value}"))
}

#[test]
fn history_and_usage_outlive_retention_and_a_restart_of_every_coordinator() {
    let cluster = DevCluster::up(&[
        "--coordinators",
        "3",
        "--nodes",
        "2",
        "--retain-finished",
        "2s",
    ]);
    cluster.create_share("lender", 1, "lend", &[]);
    cluster.create_share("borrower", 1, "lend-and-borrow", &[]);

    eprintln!("--- the borrower runs two 4 s jobs: one on its own GPU, one on the lender's");
    let first = cluster.submit("borrower", &["--name", "own"], &["sleep", "4"]);
    let second = cluster.submit("borrower", &["--name", "borrowed"], &["sleep", "4"]);
    for job in [&first, &second] {
        cluster.wait_for_state(job, "SUCCEEDED", SETTLE);
    }
    // After them (while they ran, a job of the lender would have taken its GPU back).
    let failed = cluster.submit("lender", &["--name", "fails"], &["sh", "-c", "exit 3"]);
    cluster.wait_for_state(&failed, "FAILED", SETTLE);

    eprintln!("--- retention removes them; the history keeps them");
    poll_until("the jobs removed from the live state", SETTLE, || {
        let left = cluster.jobs(&[]);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.len()))
        }
    });
    let history = cluster.json(&["job", "history", "-o", "json"]);
    let records = history["records"].as_array().expect("records");
    assert_eq!(records.len(), 3, "{history}");
    let by_id = |id: &str| {
        records
            .iter()
            .find(|record| record["id"] == id)
            .unwrap_or_else(|| panic!("no record of {id}: {history}"))
            .clone()
    };
    let own = by_id(&first);
    assert_eq!(own["state"], "SUCCEEDED");
    assert_eq!(own["share"], "borrower");
    assert_eq!(own["owner"], "admin");
    assert_eq!(own["attempts"], 1);
    let gpu_seconds = seconds(&own["gpu_seconds"]);
    assert!((4..=8).contains(&gpu_seconds), "{own}");
    let fails = by_id(&failed);
    assert_eq!(fails["state"], "FAILED");
    assert_eq!(fails["exit_code"], 3);
    // Newest end first.
    let ends: Vec<u64> = records.iter().map(|r| seconds(&r["ended_ms"])).collect();
    let mut sorted = ends.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(ends, sorted);
    // Filters, one record, a page of one with a token.
    let failed_only = cluster.json(&["job", "history", "--state", "FAILED", "-o", "json"]);
    assert_eq!(failed_only["records"].as_array().map(Vec::len), Some(1));
    let one = cluster.json(&["job", "history", "--job", &first, "-o", "json"]);
    assert_eq!(one["records"][0]["id"], first.as_str());
    let page = cluster.json(&["job", "history", "--limit", "1", "-o", "json"]);
    assert!(page["next_page_token"].is_string(), "{page}");
    let table = cluster.ok(&["job", "history"]);
    assert!(table.starts_with("ID"), "{table}");
    let csv = cluster.ok(&["job", "history", "-o", "csv"]);
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .is_some_and(|header| header.starts_with("id,name,share,owner")),
        "{csv}"
    );
    assert_eq!(lines.count(), 3, "{csv}");
    // `job get` of a removed job points to the history.
    let output = cluster.run(&["job", "get", &first]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("job history"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    eprintln!("--- usage: the borrower used its own GPU and borrowed the lender's");
    let usage = cluster.json(&["share", "usage", "--since", "1h", "-o", "json"]);
    let borrower = row(&usage, "borrower");
    let lender = row(&usage, "lender");
    let (own, borrowed) = (
        seconds(&borrower["own_gpu_seconds"]),
        seconds(&borrower["borrowed_gpu_seconds"]),
    );
    assert!((4..=8).contains(&own), "{usage}");
    assert!((4..=8).contains(&borrowed), "{usage}");
    assert_eq!(seconds(&borrower["lent_gpu_seconds"]), 0, "{usage}");
    // The lender lent what the borrower borrowed (the fleet has no GPU beyond the limits).
    assert_eq!(seconds(&lender["lent_gpu_seconds"]), borrowed, "{usage}");
    let by_day = cluster.json(&["share", "usage", "--by", "day", "-o", "json"]);
    assert!(
        by_day
            .as_array()
            .expect("rows")
            .iter()
            .all(|row| row["day_ms"].is_u64()),
        "{by_day}"
    );
    let csv = cluster.ok(&["share", "usage", "-o", "csv"]);
    assert!(
        csv.starts_with("day,share,gpu_class,own_gpu_seconds"),
        "{csv}"
    );

    eprintln!("--- every coordinator is killed and started again");
    for (_, pid) in cluster.coordinator_pids() {
        // SAFETY: kill(2) on a coordinator this cluster started.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    cluster.ok(&["dev", "up", "--dir", &cluster.dir.display().to_string()]);
    cluster.wait_healthy(SETTLE);
    let again = cluster.json(&["job", "history", "-o", "json"]);
    assert_eq!(again, history, "the history after the restart");
    let usage_again = cluster.json(&["share", "usage", "--since", "1h", "-o", "json"]);
    assert_eq!(usage_again, usage, "the usage after the restart");
}
