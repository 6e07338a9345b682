//! A small fleet of simulated agents (`quotient_tests::fleet`) against a real local cluster:
//! the load generator of the fleet bench, proven to drive the real agent protocol end to end.
//!
//! 100 nodes of 4 GPUs register over QUIC with certificates of their own; jobs run on them
//! and finish; a lender's jobs reclaim borrowed GPUs (the victims see their stop intent and
//! are requeued); the leader is killed, and every node registers with the new one while no
//! node is lost and no running job is touched.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse, JobView};
use quotient_common::{JobId, JobSpec};
use quotient_tests::fleet::{Fleet, RUN_MS_ENV};
use quotient_tests::{poll_until, DevCluster};

const NODES: u32 = 100;
const GPUS_PER_NODE: u32 = 4;
const DEADLINE: Duration = Duration::from_secs(60);

fn submit(runtime: &tokio::runtime::Runtime, client: &ApiClient, spec: JobSpec) -> JobId {
    match runtime.block_on(client.call(ApiRequest::SubmitJob(spec))) {
        Ok(ApiResponse::JobSubmitted { job, .. }) => job,
        other => panic!("submit: {other:?}"),
    }
}

fn job(runtime: &tokio::runtime::Runtime, client: &ApiClient, job: JobId) -> JobView {
    match runtime.block_on(client.call(ApiRequest::GetJob { job })) {
        Ok(ApiResponse::Job(view)) => *view,
        other => panic!("get {job}: {other:?}"),
    }
}

fn jobs(runtime: &tokio::runtime::Runtime, client: &ApiClient) -> Vec<JobView> {
    runtime
        .block_on(client.every_job(ApiRequest::list_jobs(1_000)))
        .expect("the job list")
}

/// Waits until every job of `ids` is in `state`.
fn wait_all_in(runtime: &tokio::runtime::Runtime, client: &ApiClient, ids: &[JobId], state: &str) {
    poll_until(&format!("the jobs {state}"), DEADLINE, || {
        let states: Vec<String> = ids
            .iter()
            .map(|id| job(runtime, client, *id).state)
            .collect();
        states
            .iter()
            .all(|seen| seen == state)
            .then_some(())
            .ok_or_else(|| format!("{states:?}"))
    });
}

/// Jobs of `share` whose state is `state`.
fn count(all: &[JobView], share: &str, state: &str) -> usize {
    all.iter()
        .filter(|job| job.share == share && job.state == state)
        .count()
}

#[test]
fn a_simulated_fleet_runs_jobs_reclaims_and_survives_a_failover() {
    let cluster = DevCluster::up(&["--nodes", "0"]);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let (addresses, tls) = cluster.admin_tls();
    let client = ApiClient::connect(addresses, &tls).expect("a client");
    let mut config = cluster.fleet_config(NODES, GPUS_PER_NODE);
    config.ramp_ms = 2_000;
    config.standing_within_ms = Some(1_000);
    let fleet = runtime
        .block_on(Fleet::start(config))
        .expect("the fleet starts");

    fleet.wait_registered(NODES as usize, None, DEADLINE);
    let nodes = cluster.json(&["node", "list", "-o", "json"]);
    let nodes = nodes.as_array().expect("a node list");
    assert_eq!(nodes.len(), NODES as usize);
    assert!(
        nodes.iter().all(|node| node["state"] == "ready"),
        "{nodes:?}"
    );

    // Half the GPUs are the lender's, half the borrower's.
    let half = NODES * GPUS_PER_NODE / 2;
    cluster.create_share("lender", half, "lend", &[]);
    cluster.create_share("borrower", half, "lend-and-borrow", &[]);

    // Jobs that end on their own are started, run and succeed.
    let short: Vec<JobId> = (0..20)
        .map(|_| {
            let mut spec = JobSpec::new("borrower", 1, GPUS_PER_NODE, vec!["train".into()]);
            spec.env.insert(RUN_MS_ENV.into(), "300".into());
            submit(&runtime, &client, spec)
        })
        .collect();
    wait_all_in(&runtime, &client, &short, "SUCCEEDED");

    // The borrower fills every node, half of them on GPUs the lender lends.
    let mut spec = JobSpec::new("borrower", 1, GPUS_PER_NODE, vec!["train".into()]);
    spec.grace_period_ms = 1_000;
    for _ in 0..NODES {
        submit(&runtime, &client, spec.clone());
    }
    poll_until("the borrower's jobs running", DEADLINE, || {
        let all = jobs(&runtime, &client);
        let running = count(&all, "borrower", "RUNNING");
        (running == NODES as usize && fleet.running_jobs() == NODES as usize)
            .then_some(())
            .ok_or_else(|| format!("{running} running, {}", fleet.counters()))
    });

    // The lender's jobs take their GPUs back: each stops one borrowed job.
    let reclaim = 5;
    let submitted = Instant::now();
    let lender_jobs: Vec<JobId> = (0..reclaim)
        .map(|_| {
            let spec = JobSpec::new("lender", 1, GPUS_PER_NODE, vec!["train".into()]);
            submit(&runtime, &client, spec)
        })
        .collect();
    wait_all_in(&runtime, &client, &lender_jobs, "RUNNING");
    let all = jobs(&runtime, &client);
    let victims: Vec<&JobView> = all
        .iter()
        .filter(|view| view.share == "borrower" && view.preemptions > 0)
        .collect();
    assert_eq!(victims.len(), reclaim, "one victim per lender job");
    for victim in &victims {
        let id: JobId = victim.id.parse().expect("a job id");
        let seen = fleet
            .stop_seen(id)
            .expect("the victim's node saw it stopped");
        assert!(seen >= submitted.into());
        assert_eq!(
            victim.state, "RUNNABLE",
            "a reclaimed job goes back to the queue"
        );
    }

    // The leader dies: every node finds the new one; no node is lost, no job touched.
    let before: BTreeMap<String, u32> = all
        .iter()
        .filter(|view| view.state == "RUNNING")
        .map(|view| (view.id.clone(), view.attempts))
        .collect();
    assert_eq!(before.len(), NODES as usize);
    // Each node keeps a connection open to both followers, and registers over one of them.
    fleet.wait_standing(2 * NODES as usize, DEADLINE);
    let standing_before = fleet.stats().standing_registrations.load(Ordering::Relaxed);
    let killed = cluster.kill_leader().into();
    fleet.wait_registered(NODES as usize, Some(killed), DEADLINE);
    let reconnected = fleet
        .last_registration()
        .expect("registered")
        .duration_since(killed);
    eprintln!("every node registered with the new leader {reconnected:?} after the kill");
    let standing = fleet.stats().standing_registrations.load(Ordering::Relaxed) - standing_before;
    assert!(
        standing >= u64::from(NODES),
        "every node registered over a standing connection: {}",
        fleet.counters()
    );
    let after = jobs(&runtime, &client);
    let running: BTreeMap<String, u32> = after
        .iter()
        .filter(|view| view.state == "RUNNING")
        .map(|view| (view.id.clone(), view.attempts))
        .collect();
    assert_eq!(running, before, "no job was requeued or restarted");
    let nodes = cluster.json(&["node", "list", "-o", "json"]);
    let nodes = nodes.as_array().expect("a node list");
    assert!(
        nodes.iter().all(|node| node["state"] == "ready"),
        "no node lost: {nodes:?}"
    );
    assert_eq!(
        fleet.stats().fenced.load(Ordering::Relaxed),
        0,
        "no node fenced its jobs"
    );
    runtime.block_on(fleet.shutdown());
}
