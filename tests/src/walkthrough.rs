//! The walkthrough of docs/quota-shares.md, step by step, with the exact states and checks
//! after each, through the `quotient` CLI of any cluster that runs its job script: a local
//! cluster of processes (`tests/tests/walkthrough.rs`) or the compose cluster of containers
//! (`tests/tests/compose.rs`). The job script records each start (and the checkpoint it
//! resumes from) and writes a checkpoint naming its attempt when signalled.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::poll_until;

/// How long a step may take to settle (placement, signal, exit, report, placement).
pub const STEP: Duration = Duration::from_secs(60);

/// A cluster the walkthrough runs on.
pub trait WalkthroughCluster {
    /// `quotient ARGUMENTS` with the cluster's admin client config, which must succeed; its
    /// stdout.
    fn ok(&self, arguments: &[&str]) -> String;

    /// What `job submit` gets after its `--name NAME --grace-period 10s` for the job named
    /// `name`: its environment flags, `--`, and the job script's command line.
    fn job_arguments(&self, name: &str) -> Vec<String>;

    /// The file `file` of the checkpoint dir of job `id`, named `name` (empty if missing).
    fn checkpoint_file(&self, name: &str, id: &str, file: &str) -> String;

    /// `quotient ARGUMENTS` that prints JSON.
    fn json(&self, arguments: &[&str]) -> Value {
        let out = self.ok(arguments);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{arguments:?}: {e}: {out}"))
    }
}

/// The walkthrough's jobs on `cluster`, by name.
pub struct Walkthrough<'a, C: WalkthroughCluster> {
    pub cluster: &'a C,
    pub ids: BTreeMap<&'static str, String>,
}

impl<'a, C: WalkthroughCluster> Walkthrough<'a, C> {
    /// Creates the walkthrough's three shares on `cluster` (of three one-GPU a10g nodes).
    pub fn start(cluster: &'a C) -> Walkthrough<'a, C> {
        let shares: [&[&str]; 3] = [
            &[
                "qs1",
                "--limit",
                "a10g=1",
                "--strategy",
                "lend-and-borrow",
                "--borrow-limit",
                "200",
                "--in-share-preemption",
            ],
            &["qs2", "--limit", "a10g=1", "--strategy", "lend"],
            &["qs3", "--limit", "a10g=1", "--strategy", "reserve"],
        ];
        for share in shares {
            let mut arguments = vec!["share", "create"];
            arguments.extend_from_slice(share);
            cluster.ok(&arguments);
        }
        Walkthrough {
            cluster,
            ids: BTreeMap::new(),
        }
    }

    pub fn submit(&mut self, name: &'static str, share: &str, priority: u32) {
        let priority = priority.to_string();
        let job = self.cluster.job_arguments(name);
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
        ];
        arguments.extend(job.iter().map(String::as_str));
        let id = self.cluster.ok(&arguments).trim().to_string();
        self.ids.insert(name, id);
    }

    /// Every job, by name.
    pub fn jobs(&self) -> BTreeMap<String, Value> {
        let page = self.cluster.json(&["job", "list", "--all", "-o", "json"]);
        page["jobs"]
            .as_array()
            .unwrap_or_else(|| panic!("a page of jobs: {page}"))
            .iter()
            .map(|job| {
                (
                    job["name"].as_str().unwrap_or_default().to_string(),
                    job.clone(),
                )
            })
            .collect()
    }

    /// Waits until every named job is in its expected state; the jobs by name.
    pub fn expect_states(&self, step: &str, expected: &[(&str, &str)]) -> BTreeMap<String, Value> {
        poll_until(step, STEP, || {
            let jobs = self.jobs();
            let states: Vec<(String, String)> = expected
                .iter()
                .map(|(name, _)| {
                    let state = jobs
                        .get(*name)
                        .and_then(|job| job["state"].as_str())
                        .unwrap_or("missing");
                    (name.to_string(), state.to_string())
                })
                .collect();
            let wanted: Vec<(String, String)> = expected
                .iter()
                .map(|(name, state)| (name.to_string(), state.to_string()))
                .collect();
            if states == wanted {
                Ok(jobs)
            } else {
                Err(format!("{states:?}"))
            }
        })
    }

    pub fn share(&self, name: &str) -> Value {
        self.cluster.json(&["share", "get", name, "-o", "json"])
    }

    /// The nodes running no job.
    pub fn idle_nodes(&self) -> usize {
        let nodes = self.cluster.json(&["node", "list", "-o", "json"]);
        nodes
            .as_array()
            .expect("a node array")
            .iter()
            .filter(|node| {
                node["gpus"]
                    .as_array()
                    .is_some_and(|gpus| gpus.iter().all(|gpu| gpu["job"].is_null()))
            })
            .count()
    }

    /// A file of the named job's checkpoint dir.
    pub fn read(&self, name: &str, file: &str) -> String {
        self.cluster.checkpoint_file(name, &self.ids[name], file)
    }

    /// Step 1: `high`, `med`, `low` to QS1: high and med run (med on QS2's lent GPU), low
    /// waits, QS3's GPU stays idle.
    pub fn step_1(&mut self) {
        eprintln!("--- step 1: high, med, low to QS1");
        self.submit("high", "qs1", 3);
        self.submit("med", "qs1", 2);
        self.submit("low", "qs1", 1);
        let jobs = self.expect_states(
            "step 1: high and med RUNNING, low RUNNABLE",
            &[("high", "RUNNING"), ("med", "RUNNING"), ("low", "RUNNABLE")],
        );
        assert_ne!(jobs["high"]["node"], jobs["med"]["node"]);
        assert_eq!(self.idle_nodes(), 1, "QS3's GPU stays idle");
        let qs1 = self.share("qs1");
        assert_eq!(qs1["usage"]["a10g"], 2, "{qs1}");
        assert_eq!(qs1["borrowed"]["a10g"], 1, "{qs1}");
        let qs2 = self.share("qs2");
        assert_eq!(qs2["lent"]["a10g"], 1, "{qs2}");
        assert!(self.read("low", "starts").is_empty(), "low never started");
    }

    /// Step 2: a job to QS2 reclaims the GPU lent to med, which checkpoints and waits.
    pub fn step_2(&mut self) {
        eprintln!("--- step 2: a job to QS2 reclaims the GPU lent to med");
        self.submit("q2", "qs2", 1);
        let jobs = self.expect_states(
            "step 2: med RUNNABLE, q2 RUNNING",
            &[
                ("high", "RUNNING"),
                ("med", "RUNNABLE"),
                ("low", "RUNNABLE"),
                ("q2", "RUNNING"),
            ],
        );
        let med = &jobs["med"];
        assert_eq!(med["preemptions"], 1, "{med}");
        assert_eq!(med["last_preemption"], "reclaim", "{med}");
        assert!(
            med["preempted_for"]
                .as_str()
                .is_some_and(|text| text.starts_with(&self.ids["q2"])),
            "{med}"
        );
        assert_eq!(jobs["high"]["preemptions"], 0, "{}", jobs["high"]);
        assert_eq!(self.read("med", "checkpoint").trim(), "attempt 1");
        assert_eq!(self.idle_nodes(), 1, "QS3 untouched");
        let qs1 = self.share("qs1");
        assert_eq!(qs1["usage"]["a10g"], 1, "{qs1}");
    }

    /// Step 3: low's priority 1 -> 4 preempts high inside QS1; low runs.
    pub fn step_3(&mut self) {
        eprintln!("--- step 3: low's priority 1 -> 4 preempts high inside QS1");
        self.cluster
            .ok(&["job", "update", &self.ids["low"], "--priority", "4"]);
        let jobs = self.expect_states(
            "step 3: high RUNNABLE, low RUNNING",
            &[
                ("high", "RUNNABLE"),
                ("med", "RUNNABLE"),
                ("low", "RUNNING"),
                ("q2", "RUNNING"),
            ],
        );
        let high = &jobs["high"];
        assert_eq!(high["preemptions"], 1, "{high}");
        assert_eq!(high["last_preemption"], "in-share", "{high}");
        assert_eq!(self.read("high", "checkpoint").trim(), "attempt 1");
        assert_eq!(jobs["q2"]["preemptions"], 0);
        assert_eq!(self.idle_nodes(), 1, "QS3's GPU is still idle");
    }

    /// `high`, preempted in step 3, started exactly twice: the second time from the checkpoint
    /// its first attempt wrote.
    pub fn assert_high_resumed_from_its_checkpoint(&self) {
        let starts = poll_until("high's second start recorded", STEP, || {
            let starts = self.read("high", "starts");
            if starts.lines().count() >= 2 {
                Ok(starts)
            } else {
                Err(starts)
            }
        });
        let lines: Vec<&str> = starts.lines().collect();
        assert_eq!(lines.len(), 2, "high started exactly twice: {starts}");
        assert!(
            lines[0].contains("attempt=1") && lines[0].ends_with("resume="),
            "{starts}"
        );
        assert!(
            lines[1].contains("attempt=2") && lines[1].ends_with("resume=attempt 1"),
            "{starts}"
        );
    }

    /// Every named job's process started exactly once so far.
    pub fn assert_started_once(&self, names: &[&str]) {
        for name in names {
            let starts = self.read(name, "starts");
            assert_eq!(starts.lines().count(), 1, "{name} started once: {starts}");
        }
    }
}
