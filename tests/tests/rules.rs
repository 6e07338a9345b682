//! Rules of docs/quota-shares.md through real processes (a coordinator, agents with one
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
            let jobs: BTreeMap<String, Value> = self
                .cluster
                .jobs(&[])
                .into_iter()
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

    /// How many times the named job's process started (lines of its `starts` file).
    fn starts(&self, name: &str) -> usize {
        std::fs::read_to_string(self.checkpoints.join(name).join("starts"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// `quotient job get ID -o json`.
    fn get(&self, id: &str) -> Value {
        self.cluster.json(&["job", "get", id, "-o", "json"])
    }

    /// Waits until the named job is RUNNABLE with a reason: the scheduler has looked at it
    /// and decided it waits.
    fn expect_waiting(&self, name: &str) -> Value {
        poll_until(&format!("{name} RUNNABLE with a reason"), SETTLE, || {
            let job = self
                .cluster
                .jobs(&[])
                .into_iter()
                .find(|job| job["name"] == name)
                .unwrap_or(Value::Null);
            if job["state"] == "RUNNABLE" && job["reason"].as_str().is_some_and(|r| !r.is_empty()) {
                Ok(job)
            } else {
                Err(format!("{job}"))
            }
        })
    }

    /// Asserts the job (by id) was preempted exactly once, of `kind`, for job `for_id`, and
    /// that its process got the checkpoint signal in its one attempt.
    fn assert_preempted_once(&self, name: &str, id: &str, kind: &str, for_id: &str) {
        let job = self.get(id);
        assert_eq!(job["preemptions"], 1, "{job}");
        assert_eq!(job["last_preemption"], kind, "{job}");
        let preempted_for = job["preempted_for"].as_str().unwrap_or_default();
        assert!(
            preempted_for == for_id || preempted_for.starts_with(&format!("{for_id} ")),
            "{name} was preempted for {for_id}: {job}"
        );
        assert_eq!(self.checkpoint(name), "attempt 1", "{name} got its signal");
        assert_eq!(self.starts(name), 1, "{name} started once");
    }

    /// Asserts the job (by id) was never preempted and its process never got a signal.
    fn assert_untouched(&self, name: &str, id: &str) {
        let job = self.get(id);
        assert_eq!(job["preemptions"], 0, "{job}");
        assert!(job["last_preemption"].is_null(), "{job}");
        assert_eq!(self.checkpoint(name), "", "{name} got no signal");
    }
}

#[test]
fn cancelling_a_running_job_stops_it_with_its_checkpoint_signal() {
    // Proves a cancel reaches the running process as its checkpoint signal, the job ends
    // CANCELLED, and its GPU is free again.
    let bench = Bench::up(1);
    bench.cluster.create_share("team", 1, "lend", &[]);
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
    bench
        .cluster
        .create_share("team", 1, "lend-and-borrow", &["--in-share-preemption"]);
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
    bench.cluster.create_share("vault", 1, "reserve", &[]);
    bench
        .cluster
        .create_share("eager", 1, "lend-and-borrow", &[]);
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
    bench.cluster.create_share("giver", 1, "lend", &[]);
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
    bench
        .cluster
        .create_share("eager", 1, "lend-and-borrow", &["--borrow-limit", "100"]);
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
    bench.cluster.create_share("team", 2, "reserve", &[]);
    bench.cluster.create_share("late", 1, "lend", &[]);
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

#[test]
fn cross_share_reclaim_takes_only_the_lowest_priority_borrowed_job() {
    // Proves a lender's reclaim preempts exactly one borrowed job, the lowest-priority one
    // (even though it started earlier), that it gets its checkpoint signal, and that the
    // freed GPU goes to the lender's job while the other borrowed job keeps running.
    let bench = Bench::up(3);
    bench.cluster.create_share("lender", 1, "lend", &[]);
    bench
        .cluster
        .create_share("borrower", 1, "lend-and-borrow", &[]);
    let keeper = bench.submit("keeper", "borrower", 9, &[]);
    bench.expect("keeper RUNNING", &[("keeper", "RUNNING")]);
    let low = bench.submit("low", "borrower", 1, &[]);
    bench.expect("low RUNNING", &[("low", "RUNNING")]);
    let mid = bench.submit("mid", "borrower", 5, &[]);
    let before = bench.expect(
        "the borrower holds all three GPUs",
        &[
            ("keeper", "RUNNING"),
            ("low", "RUNNING"),
            ("mid", "RUNNING"),
        ],
    );
    let borrower = bench
        .cluster
        .json(&["share", "get", "borrower", "-o", "json"]);
    assert_eq!(borrower["borrowed"]["a10g"], 2, "{borrower}");

    let claim = bench.submit("claim", "lender", 1, &[]);
    let jobs = bench.expect(
        "low RUNNABLE, claim RUNNING",
        &[
            ("keeper", "RUNNING"),
            ("mid", "RUNNING"),
            ("low", "RUNNABLE"),
            ("claim", "RUNNING"),
        ],
    );
    assert_eq!(jobs["claim"]["node"], before["low"]["node"], "{jobs:?}");
    bench.assert_preempted_once("low", &low, "reclaim", &claim);
    bench.assert_untouched("mid", &mid);
    bench.assert_untouched("keeper", &keeper);
    assert_eq!(bench.starts("mid"), 1);
    assert_eq!(bench.starts("keeper"), 1);
}

#[test]
fn in_share_preemption_needs_the_flag_and_a_higher_priority() {
    // Proves a share without in-share preemption never preempts its own jobs, and one with it
    // preempts only for a strictly higher priority, taking its lowest-priority job only.
    let bench = Bench::up(3);
    bench.cluster.create_share("off", 1, "reserve", &[]);
    bench
        .cluster
        .create_share("on", 2, "reserve", &["--in-share-preemption"]);

    let off_low = bench.submit("off-low", "off", 1, &[]);
    bench.expect("off-low RUNNING", &[("off-low", "RUNNING")]);
    let off_high = bench.submit("off-high", "off", 5, &[]);
    bench.expect_waiting("off-high");

    let on_low = bench.submit("on-low", "on", 1, &[]);
    let on_mid = bench.submit("on-mid", "on", 3, &[]);
    bench.expect(
        "on-low and on-mid RUNNING",
        &[("on-low", "RUNNING"), ("on-mid", "RUNNING")],
    );
    let on_peer = bench.submit("on-peer", "on", 1, &[]);
    bench.expect_waiting("on-peer");
    let on_high = bench.submit("on-high", "on", 5, &[]);
    bench.expect(
        "on-high RUNNING in place of on-low",
        &[
            ("on-high", "RUNNING"),
            ("on-mid", "RUNNING"),
            ("on-low", "RUNNABLE"),
            ("on-peer", "RUNNABLE"),
            ("off-low", "RUNNING"),
            ("off-high", "RUNNABLE"),
        ],
    );
    bench.assert_preempted_once("on-low", &on_low, "in-share", &on_high);
    bench.assert_untouched("on-mid", &on_mid);
    assert_eq!(
        bench.starts("on-peer"),
        0,
        "the equal-priority job never ran"
    );
    assert_eq!(bench.get(&on_peer)["attempts"], 0);
    bench.assert_untouched("off-low", &off_low);
    assert_eq!(
        bench.starts("off-high"),
        0,
        "the flag is off: off-high waits"
    );
    assert_eq!(bench.get(&off_high)["state"], "RUNNABLE");
}

#[test]
fn a_priority_update_triggers_in_share_preemption() {
    // Proves raising a waiting job's priority above a running job's makes the scheduler
    // preempt the share's lowest-priority job for it, with its checkpoint signal.
    let bench = Bench::up(2);
    bench
        .cluster
        .create_share("team", 2, "reserve", &["--in-share-preemption"]);
    let top = bench.submit("top", "team", 5, &[]);
    let bottom = bench.submit("bottom", "team", 3, &[]);
    bench.expect(
        "top and bottom RUNNING",
        &[("top", "RUNNING"), ("bottom", "RUNNING")],
    );
    let riser = bench.submit("riser", "team", 1, &[]);
    bench.expect_waiting("riser");
    bench.assert_untouched("bottom", &bottom);

    bench
        .cluster
        .ok(&["job", "update", &riser, "--priority", "4"]);
    bench.expect(
        "riser RUNNING in place of bottom",
        &[
            ("top", "RUNNING"),
            ("riser", "RUNNING"),
            ("bottom", "RUNNABLE"),
        ],
    );
    assert_eq!(bench.get(&riser)["priority"], 4);
    bench.assert_preempted_once("bottom", &bottom, "in-share", &riser);
    bench.assert_untouched("top", &top);
}
