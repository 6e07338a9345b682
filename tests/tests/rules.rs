//! Rules of spec/quota-shares.md through real processes (a coordinator, agents with one
//! simulated GPU each, job scripts that trap the checkpoint signal): strategies, the borrow
//! limit, lowering a limit, and what a cancel and a preemption do to a running job.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use quotient_tests::{poll_until, write_job_script, DevCluster};
use serde_json::Value;

/// How long a change may take to settle (placement, signal, exit, report).
const SETTLE: Duration = Duration::from_secs(60);

struct Bench {
    cluster: DevCluster,
    script: String,
    checkpoints: PathBuf,
}

impl Bench {
    /// One coordinator and `nodes` agents with one GPU each.
    fn up(nodes: u32) -> Bench {
        let nodes = nodes.to_string();
        let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", &nodes]);
        let script = write_job_script(cluster.root.path());
        let checkpoints = cluster.root.path().join("checkpoints");
        Bench {
            cluster,
            script,
            checkpoints,
        }
    }

    fn submit(&self, name: &str, share: &str, priority: u32, extra: &[&str]) -> String {
        let priority = priority.to_string();
        let name_env = format!("NAME={name}");
        let checkpoints_env = format!("CHECKPOINTS={}", self.checkpoints.display());
        let mut arguments = vec![
            "job",
            "submit",
            "--share",
            share,
            "--priority",
            &priority,
            "--gpus",
            "1",
            "--name",
            name,
            "--grace-period",
            "10s",
            "--env",
            &name_env,
            "--env",
            &checkpoints_env,
        ];
        arguments.extend_from_slice(extra);
        arguments.extend_from_slice(&["--", &self.script]);
        self.cluster.ok(&arguments).trim().to_string()
    }

    /// Waits until every named job is in its state; the jobs by name.
    fn expect(&self, what: &str, expected: &[(&str, &str)]) -> BTreeMap<String, Value> {
        poll_until(what, SETTLE, || {
            let list = self.cluster.json(&["job", "list", "-o", "json"]);
            let jobs: BTreeMap<String, Value> = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|job| {
                    (
                        job["name"].as_str().unwrap_or_default().to_string(),
                        job.clone(),
                    )
                })
                .collect();
            let matches = expected
                .iter()
                .all(|(name, state)| jobs.get(*name).is_some_and(|job| job["state"] == *state));
            if matches {
                Ok(jobs)
            } else {
                Err(format!("{jobs:?}"))
            }
        })
    }

    fn checkpoint(&self, name: &str) -> String {
        std::fs::read_to_string(self.checkpoints.join(name).join("checkpoint"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }
}

#[test]
fn cancelling_a_running_job_stops_it_with_its_checkpoint_signal() {
    // Proves a cancel reaches the running process as its checkpoint signal, the job ends
    // CANCELLED, and its GPU is free again.
    let bench = Bench::up(1);
    bench.cluster.ok(&[
        "share",
        "create",
        "team",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend",
    ]);
    let id = bench.submit("solo", "team", 1, &[]);
    bench.expect("solo RUNNING", &[("solo", "RUNNING")]);
    bench.cluster.ok(&["job", "cancel", &id]);
    bench.expect("solo CANCELLED", &[("solo", "CANCELLED")]);
    assert_eq!(bench.checkpoint("solo"), "attempt 1");
    let nodes = bench.cluster.json(&["node", "list", "-o", "json"]);
    assert!(nodes[0]["gpus"][0]["job"].is_null(), "{nodes}");
}

#[test]
fn max_preemptions_zero_fails_the_job_on_its_first_preemption() {
    // Proves a job with max_preemptions 0 ends FAILED when an in-share preemption stops it,
    // after it got its checkpoint signal, and that the GPU goes to the job it was freed for.
    let bench = Bench::up(1);
    bench.cluster.ok(&[
        "share",
        "create",
        "team",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend-and-borrow",
        "--in-share-preemption",
    ]);
    bench.submit("fragile", "team", 1, &["--max-preemptions", "0"]);
    bench.expect("fragile RUNNING", &[("fragile", "RUNNING")]);
    bench.submit("urgent", "team", 5, &[]);
    let jobs = bench.expect(
        "fragile FAILED, urgent RUNNING",
        &[("fragile", "FAILED"), ("urgent", "RUNNING")],
    );
    let fragile = &jobs["fragile"];
    assert_eq!(fragile["preemptions"], 1, "{fragile}");
    assert_eq!(fragile["last_preemption"], "in-share", "{fragile}");
    assert_eq!(bench.checkpoint("fragile"), "attempt 1");
}

#[test]
fn a_reserve_share_never_lends() {
    // Proves a reserve share's idle quota is never used by another share's jobs.
    let bench = Bench::up(2);
    bench.cluster.ok(&[
        "share",
        "create",
        "vault",
        "--limit",
        "a10g=1",
        "--strategy",
        "reserve",
    ]);
    bench.cluster.ok(&[
        "share",
        "create",
        "eager",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend-and-borrow",
    ]);
    bench.submit("first", "eager", 2, &[]);
    bench.submit("second", "eager", 1, &[]);
    let jobs = bench.expect(
        "first RUNNING, second RUNNABLE",
        &[("first", "RUNNING"), ("second", "RUNNABLE")],
    );
    let reason = jobs["second"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("reserve"), "{reason}");
}

#[test]
fn a_lend_share_never_borrows() {
    // Proves a lend share stays within its limit even when the free pool has GPUs.
    let bench = Bench::up(2);
    bench.cluster.ok(&[
        "share",
        "create",
        "giver",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend",
    ]);
    bench.submit("first", "giver", 2, &[]);
    bench.submit("second", "giver", 1, &[]);
    bench.expect(
        "first RUNNING, second RUNNABLE",
        &[("first", "RUNNING"), ("second", "RUNNABLE")],
    );
    let nodes = bench.cluster.json(&["node", "list", "-o", "json"]);
    let idle = nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter(|node| node["gpus"][0]["job"].is_null())
        .count();
    assert_eq!(idle, 1, "the free pool's GPU stays idle: {nodes}");
}

#[test]
fn the_borrow_limit_caps_borrowing() {
    // Proves a lend-and-borrow share borrows at most borrow_limit_percent of its limit.
    let bench = Bench::up(3);
    bench.cluster.ok(&[
        "share",
        "create",
        "eager",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend-and-borrow",
        "--borrow-limit",
        "100",
    ]);
    bench.submit("one", "eager", 3, &[]);
    bench.submit("two", "eager", 2, &[]);
    bench.submit("three", "eager", 1, &[]);
    let jobs = bench.expect(
        "one and two RUNNING, three RUNNABLE",
        &[
            ("one", "RUNNING"),
            ("two", "RUNNING"),
            ("three", "RUNNABLE"),
        ],
    );
    let reason = jobs["three"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("borrow"), "{reason}");
}

#[test]
fn lowering_a_limit_makes_the_jobs_above_it_preemptible() {
    // Proves that once a share's limit is lowered, whatever its strategy, its lowest-ranked
    // job above the new limit is reclaimed (with its checkpoint signal) when another share
    // needs the GPU, and its higher-ranked job keeps running.
    let bench = Bench::up(2);
    bench.cluster.ok(&[
        "share",
        "create",
        "team",
        "--limit",
        "a10g=2",
        "--strategy",
        "reserve",
    ]);
    bench.cluster.ok(&[
        "share",
        "create",
        "late",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend",
    ]);
    bench.submit("keeper", "team", 5, &[]);
    bench.submit("extra", "team", 1, &[]);
    bench.expect(
        "both RUNNING",
        &[("keeper", "RUNNING"), ("extra", "RUNNING")],
    );
    bench
        .cluster
        .ok(&["share", "update", "team", "--limit", "a10g=1"]);
    bench.submit("claimant", "late", 1, &[]);
    let jobs = bench.expect(
        "extra RUNNABLE, keeper and claimant RUNNING",
        &[
            ("keeper", "RUNNING"),
            ("extra", "RUNNABLE"),
            ("claimant", "RUNNING"),
        ],
    );
    assert_eq!(jobs["extra"]["preemptions"], 1, "{}", jobs["extra"]);
    assert_eq!(
        jobs["extra"]["last_preemption"], "reclaim",
        "{}",
        jobs["extra"]
    );
    assert_eq!(jobs["keeper"]["preemptions"], 0, "{}", jobs["keeper"]);
    assert_eq!(bench.checkpoint("extra"), "attempt 1");
}
