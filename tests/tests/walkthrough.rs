//! The walkthrough of docs/quota-shares.md through real processes: three coordinators
//! and three agents with one simulated GPU each (`quotient dev up`), real job scripts that
//! trap the checkpoint signal and write a checkpoint, and the exact states after each step.

use std::path::PathBuf;

use quotient_tests::prometheus::{http_get, Prometheus};
use quotient_tests::walkthrough::{Walkthrough, WalkthroughCluster, STEP};
use quotient_tests::{poll_until, write_job_script as write_script, DevCluster};
use serde_json::Value;

/// A local cluster of 3 coordinators and 3 one-GPU agents, with the job script written in its
/// folder and the checkpoints it writes there.
struct Local {
    cluster: DevCluster,
    script: String,
    checkpoints: PathBuf,
}

impl std::ops::Deref for Local {
    type Target = DevCluster;

    fn deref(&self) -> &DevCluster {
        &self.cluster
    }
}

impl WalkthroughCluster for Local {
    fn ok(&self, arguments: &[&str]) -> String {
        self.cluster.ok(arguments)
    }

    fn job_arguments(&self, name: &str) -> Vec<String> {
        vec![
            "--env".into(),
            format!("NAME={name}"),
            "--env".into(),
            format!("CHECKPOINTS={}", self.checkpoints.display()),
            "--".into(),
            self.script.clone(),
        ]
    }

    fn checkpoint_file(&self, name: &str, _id: &str, file: &str) -> String {
        std::fs::read_to_string(self.checkpoints.join(name).join(file)).unwrap_or_default()
    }
}

fn set_up() -> Local {
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
    Local {
        cluster,
        script,
        checkpoints,
    }
}

#[test]
fn the_seeds_walkthrough_through_real_agents_and_jobs() {
    // Proves the three steps of docs/quota-shares.md's walkthrough, state by state, with real
    // coordinators, agents and job processes, and that a preempted job's checkpoint is written
    // and resumed from by its next attempt.
    let local = set_up();
    let mut walk = Walkthrough::start(&local);
    walk.step_1();
    walk.step_2();
    walk.step_3();
    walk.assert_started_once(&["high", "med", "low", "q2"]);

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
    walk.assert_high_resumed_from_its_checkpoint();
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
    let local = set_up();
    let mut walk = Walkthrough::start(&local);
    walk.step_1();

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
    walk.assert_started_once(&["high", "med"]);

    walk.step_2();
    walk.step_3();
    walk.assert_started_once(&["high", "med", "low", "q2"]);
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
fn agent_logs(walk: &Walkthrough<Local>) -> Vec<(String, String)> {
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
    let local = set_up();
    let mut walk = Walkthrough::start(&local);
    walk.step_1();
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
        // Each process's certificate and CA, with when they end.
        ("count(quotient_certificate_expiry_timestamp_seconds)", 12.0),
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
    walk.step_2();
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
