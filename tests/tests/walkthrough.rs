//! The walkthrough of docs/quota-shares.md through real processes: three coordinators
//! and three agents with one simulated GPU each (`quotient dev up`), real job scripts that
//! trap the checkpoint signal and write a checkpoint, and the exact states after each step.

use std::collections::BTreeMap;
use std::time::Duration;

use quotient_tests::prometheus::{http_get, Prometheus};
use quotient_tests::{poll_until, write_job_script as write_script, DevCluster};
use serde_json::Value;

/// How long a step may take to settle (placement, signal, exit, report, placement).
const STEP: Duration = Duration::from_secs(60);

struct Walkthrough {
    cluster: DevCluster,
    script: String,
    checkpoints: std::path::PathBuf,
    ids: BTreeMap<&'static str, String>,
}

impl Walkthrough {
    fn submit(&mut self, name: &'static str, share: &str, priority: u32) {
        let priority = priority.to_string();
        let name_env = format!("NAME={name}");
        let checkpoints_env = format!("CHECKPOINTS={}", self.checkpoints.display());
        let id = self
            .cluster
            .ok(&[
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
                "--",
                &self.script,
            ])
            .trim()
            .to_string();
        self.ids.insert(name, id);
    }

    fn jobs(&self) -> BTreeMap<String, Value> {
        self.cluster
            .jobs(&[])
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
    fn expect_states(&self, step: &str, expected: &[(&str, &str)]) -> BTreeMap<String, Value> {
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

    fn share(&self, name: &str) -> Value {
        self.cluster.json(&["share", "get", name, "-o", "json"])
    }

    /// The nodes running no job.
    fn idle_nodes(&self) -> usize {
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

    fn read(&self, name: &str, file: &str) -> String {
        std::fs::read_to_string(self.checkpoints.join(name).join(file)).unwrap_or_default()
    }
}

/// A fresh cluster of 3 coordinators and 3 one-GPU agents, with the walkthrough's shares.
fn set_up() -> Walkthrough {
    let cluster = DevCluster::up(&[
        "--nodes",
        "3",
        "--gpus-per-node",
        "1",
        "--gpu-class",
        "a10g",
    ]);
    let script = write_script(cluster.root.path());
    let checkpoints = cluster.root.path().join("checkpoints");
    let walk = Walkthrough {
        cluster,
        script,
        checkpoints,
        ids: BTreeMap::new(),
    };
    let cluster = &walk.cluster;
    cluster.ok(&[
        "share",
        "create",
        "qs1",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend-and-borrow",
        "--borrow-limit",
        "200",
        "--in-share-preemption",
    ]);
    cluster.ok(&[
        "share",
        "create",
        "qs2",
        "--limit",
        "a10g=1",
        "--strategy",
        "lend",
    ]);
    cluster.ok(&[
        "share",
        "create",
        "qs3",
        "--limit",
        "a10g=1",
        "--strategy",
        "reserve",
    ]);
    walk
}

fn step_1(walk: &mut Walkthrough) {
    eprintln!("--- step 1: high, med, low to QS1");
    walk.submit("high", "qs1", 3);
    walk.submit("med", "qs1", 2);
    walk.submit("low", "qs1", 1);
    let jobs = walk.expect_states(
        "step 1: high and med RUNNING, low RUNNABLE",
        &[("high", "RUNNING"), ("med", "RUNNING"), ("low", "RUNNABLE")],
    );
    assert_ne!(jobs["high"]["node"], jobs["med"]["node"]);
    assert_eq!(walk.idle_nodes(), 1, "QS3's GPU stays idle");
    let qs1 = walk.share("qs1");
    assert_eq!(qs1["usage"]["a10g"], 2, "{qs1}");
    assert_eq!(qs1["borrowed"]["a10g"], 1, "{qs1}");
    let qs2 = walk.share("qs2");
    assert_eq!(qs2["lent"]["a10g"], 1, "{qs2}");
    assert!(walk.read("low", "starts").is_empty(), "low never started");
}

fn step_2(walk: &mut Walkthrough) {
    eprintln!("--- step 2: a job to QS2 reclaims the GPU lent to med");
    walk.submit("q2", "qs2", 1);
    let jobs = walk.expect_states(
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
    let q2_id = walk.ids["q2"].clone();
    assert!(
        med["preempted_for"]
            .as_str()
            .is_some_and(|text| text.starts_with(&q2_id)),
        "{med}"
    );
    assert_eq!(jobs["high"]["preemptions"], 0, "{}", jobs["high"]);
    assert_eq!(walk.read("med", "checkpoint").trim(), "attempt 1");
    assert_eq!(walk.idle_nodes(), 1, "QS3 untouched");
    let qs1 = walk.share("qs1");
    assert_eq!(qs1["usage"]["a10g"], 1, "{qs1}");
}

fn step_3(walk: &mut Walkthrough) {
    eprintln!("--- step 3: low's priority 1 -> 4 preempts high inside QS1");
    walk.cluster
        .ok(&["job", "update", &walk.ids["low"], "--priority", "4"]);
    let jobs = walk.expect_states(
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
    assert_eq!(walk.read("high", "checkpoint").trim(), "attempt 1");
    assert_eq!(jobs["q2"]["preemptions"], 0);
    assert_eq!(walk.idle_nodes(), 1, "QS3's GPU is still idle");
}

/// Every named job's process started exactly once so far.
fn assert_started_once(walk: &Walkthrough, names: &[&str]) {
    for name in names {
        let starts = walk.read(name, "starts");
        assert_eq!(starts.lines().count(), 1, "{name} started once: {starts}");
    }
}

#[test]
fn the_seeds_walkthrough_through_real_agents_and_jobs() {
    // Proves the three steps of docs/quota-shares.md's walkthrough, state by state, with real
    // coordinators, agents and job processes, and that a preempted job's checkpoint is written
    // and resumed from by its next attempt.
    let mut walk = set_up();
    step_1(&mut walk);
    step_2(&mut walk);
    step_3(&mut walk);
    assert_started_once(&walk, &["high", "med", "low", "q2"]);

    eprintln!(
        "--- after the walkthrough: cancelling low gives its GPU back to high, which resumes"
    );
    walk.cluster.ok(&["job", "cancel", &walk.ids["low"]]);
    let jobs = walk.expect_states(
        "low CANCELLED, high RUNNING again",
        &[
            ("high", "RUNNING"),
            ("med", "RUNNABLE"),
            ("low", "CANCELLED"),
            ("q2", "RUNNING"),
        ],
    );
    assert_eq!(jobs["high"]["attempts"], 2, "{}", jobs["high"]);
    let starts = poll_until("high's second start recorded", STEP, || {
        let starts = walk.read("high", "starts");
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
    for name in ["med", "low", "q2"] {
        assert_eq!(
            walk.read(name, "starts").lines().count(),
            1,
            "{name} started once"
        );
    }
}

#[test]
fn the_walkthrough_reaches_its_end_state_when_the_leader_is_killed() {
    // Proves that killing the leading coordinator after step 1 loses nothing: the new leader
    // resumes from the replicated state, the agents follow it, the walkthrough's end state is
    // reached, and the failover starts no job a second time.
    let mut walk = set_up();
    step_1(&mut walk);

    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    eprintln!(
        "--- the leader is killed (unix time {}.{:03} s)",
        killed_at.as_secs(),
        killed_at.subsec_millis()
    );
    let (leader, pid) = walk.cluster.leader();
    // SAFETY: kill(2) on a coordinator this test's cluster started; plain integers.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    poll_until("a new leader", STEP, || {
        let output = walk.cluster.run(&["cluster", "status", "-o", "json"]);
        let status: Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
        match status["leader"].as_u64() {
            Some(new) if new != leader => Ok(new),
            other => Err(format!("leader {other:?}")),
        }
    });
    let jobs = walk.expect_states(
        "step 1's state after the failover",
        &[("high", "RUNNING"), ("med", "RUNNING"), ("low", "RUNNABLE")],
    );
    assert_eq!(jobs["high"]["attempts"], 1);
    assert_eq!(jobs["med"]["attempts"], 1);
    assert_started_once(&walk, &["high", "med"]);

    step_2(&mut walk);
    step_3(&mut walk);
    assert_started_once(&walk, &["high", "med", "low", "q2"]);
    for (agent, log) in agent_logs(&walk) {
        for line in log.lines().filter(|line| {
            line.contains("lost the leader") || line.contains("registered with the leader")
        }) {
            eprintln!("{agent}: {line}");
        }
        assert!(
            !log.contains("self-fencing"),
            "{agent} fenced itself during the failover:\n{log}"
        );
    }
}

/// Every agent's log, by its folder's name.
fn agent_logs(walk: &Walkthrough) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(&walk.cluster.dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let log = std::fs::read_to_string(entry.path().join("agent.log")).ok()?;
            Some((entry.file_name().to_string_lossy().into_owned(), log))
        })
        .collect()
}

#[test]
fn prometheus_sees_the_walkthroughs_first_two_steps() {
    // Proves the metrics an operator scrapes: a real Prometheus server scraping every
    // coordinator and agent of the walkthrough's cluster (addresses from cluster.json) reads,
    // after step 1, QS1 borrowing 1 GPU and QS2 lending 1, once (only the leader reports the
    // shares), one leader, the agents' running attempts and GPUs, and after step 2 the reclaim
    // of med counted once; and every process answers /readyz.
    if !Prometheus::available() {
        return;
    }
    let mut walk = set_up();
    step_1(&mut walk);
    let coordinators = walk.cluster.metrics_addresses("coordinators");
    let agents = walk.cluster.metrics_addresses("agents");
    assert_eq!((coordinators.len(), agents.len()), (3, 3));
    for address in coordinators.iter().chain(&agents) {
        http_get(address, "/readyz").unwrap_or_else(|why| panic!("{address} not ready: {why}"));
    }
    let folder = walk.cluster.root.path().join("prometheus");
    std::fs::create_dir_all(&folder).expect("a folder for prometheus");
    let prometheus = Prometheus::start(
        &folder,
        &[
            ("quotient-coordinator", coordinators),
            ("quotient-agent", agents),
        ],
    );
    let expected = [
        ("sum(up)", 6.0),
        ("sum(quotient_raft_is_leader)", 1.0),
        (
            r#"sum(quotient_share_gpus{share="qs1",kind="borrowed"})"#,
            1.0,
        ),
        (r#"sum(quotient_share_gpus{share="qs2",kind="lent"})"#, 1.0),
        (r#"sum(quotient_share_gpus{share="qs1",kind="used"})"#, 2.0),
        (r#"sum(quotient_share_gpus{share="qs3",kind="used"})"#, 0.0),
        (r#"sum(quotient_jobs{share="qs1",state="runnable"})"#, 1.0),
        (r#"sum(quotient_nodes{state="ready"})"#, 3.0),
        (r#"sum(quotient_agent_jobs{state="running"})"#, 2.0),
        ("count(quotient_gpu_temperature_celsius)", 3.0),
        ("sum(quotient_job_wait_seconds_count)", 2.0),
    ];
    poll_until("prometheus reads step 1's figures", STEP, || {
        let read: Vec<(&str, Result<f64, String>)> = expected
            .iter()
            .map(|(query, _)| (*query, prometheus.scalar(query)))
            .collect();
        let wrong: Vec<String> = read
            .iter()
            .zip(&expected)
            .filter(|((_, got), (_, want))| got.as_ref().ok() != Some(want))
            .map(|((query, got), (_, want))| format!("{query}: {got:?}, want {want}"))
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    });
    step_2(&mut walk);
    let reclaim = r#"sum(quotient_preemptions_total{share="qs1",cause="reclaim"})"#;
    poll_until("prometheus counts step 2's reclaim", STEP, || {
        let count = prometheus.scalar(reclaim);
        if count == Ok(1.0) {
            Ok(())
        } else {
            Err(format!("{reclaim}: {count:?}, want 1"))
        }
    });
    // Every metric docs/metrics.md lists is exported by some process by now.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let docs = std::fs::read_to_string(root.join("docs/metrics.md")).expect("docs/metrics.md");
    let listed: Vec<(String, String)> = docs
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells
                .get(1)?
                .strip_prefix("`quotient_")?
                .strip_suffix('`')?;
            Some((format!("quotient_{name}"), cells.get(2)?.to_string()))
        })
        .collect();
    assert!(listed.len() >= 20, "{listed:?}");
    let missing: Vec<&str> = listed
        .iter()
        .filter(|(name, kind)| {
            let series = if kind == "histogram" {
                format!("{name}_count")
            } else {
                name.clone()
            };
            prometheus
                .scalar(&format!("count({series})"))
                .map_or(true, |count| count < 1.0)
        })
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "documented but not exported: {missing:?}"
    );
}
