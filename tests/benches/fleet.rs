//! Fleet benchmark: `cargo bench -p quotient-tests --bench fleet` (build the release binaries
//! first: `cargo build --release --workspace --bins`).
//!
//! A local cluster of three coordinators (`quotient dev up --nodes 0`) and a fleet of
//! simulated agents in this process (`quotient_tests::fleet`, on a thread of its own), each a
//! real agent session over QUIC and mutual TLS with a certificate of its own, heartbeating
//! every second (the coordinators' default). Measured, in order:
//! - `registered_s`: from the fleet's start until every node is registered (the nodes' first
//!   connections are spread over `QUOTIENT_BENCH_RAMP_S`);
//! - `standing_open_s`: from the fleet's start until every node holds a standing connection
//!   to each other coordinator (opened over `QUOTIENT_BENCH_STANDING_S` after its
//!   registration, default the larger of 60 s and a second per 50 nodes; 0 keeps none, as
//!   agents did before standing connections), before anything else is measured;
//! - the borrower's jobs fill every node (8 GPUs each, half of them on GPUs the lender
//!   lends), then `QUOTIENT_BENCH_QUEUED` more are queued: `submit_per_s` of those;
//! - `idle_leader_cpu_percent`: the leader's CPU (user + system, from /proc) over
//!   `QUOTIENT_BENCH_IDLE_S` seconds with nothing submitted, in percent of one core;
//! - `reclaim_ms`: per round, from sending a lender's submit until a node sees the stop intent
//!   of the borrowed job it reclaims (the agent's checkpoint signal), over
//!   `QUOTIENT_BENCH_RECLAIMS` rounds;
//! - `failover_s`: the leader is killed; from the kill until every node registered with the
//!   new leader; then `nodes_lost` (nodes not ready), `jobs_restarted` (running jobs whose
//!   attempt changed or that stopped running) and `fenced` (jobs a node stopped for its lease)
//!   must all be 0.
//!
//! `QUOTIENT_BENCH_NODES` (default 10,000) and `QUOTIENT_BENCH_GPUS` (default 8) size the
//! fleet. `QUOTIENT_BENCH_MEMBER_THREADS` sets each coordinator's worker threads
//! (`TOKIO_WORKER_THREADS`; unset, the coordinators' default of one per core), as in the
//! submit bench (BENCHMARKS.md: on a 2-vCPU KVM guest a leader on two worker threads spent
//! about 1.6 times the CPU per heartbeat that it spent on one, in wake-ups between them).
//! The last line printed is one JSON object.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse, JobView};
use quotient_common::{JobId, JobSpec, JobState};
use quotient_tests::fleet::FleetThread;
use quotient_tests::{poll_until, DevCluster};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Seconds of CPU process `pid` has used (user + system), from /proc.
fn cpu_seconds(pid: libc::pid_t) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    // The fields after the command (which may hold spaces) in parentheses.
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

struct Bench {
    runtime: tokio::runtime::Runtime,
    client: ApiClient,
}

impl Bench {
    fn submit_many(&self, specs: Vec<JobSpec>, concurrency: usize) -> Vec<JobId> {
        self.runtime.block_on(async {
            let mut ids = Vec::with_capacity(specs.len());
            for chunk in specs.chunks(concurrency) {
                let calls = chunk
                    .iter()
                    .map(|spec| self.client.call(ApiRequest::SubmitJob(spec.clone())));
                for answer in futures_util::future::join_all(calls).await {
                    match answer {
                        Ok(ApiResponse::JobSubmitted { job, .. }) => ids.push(job),
                        other => panic!("submit: {other:?}"),
                    }
                }
            }
            ids
        })
    }

    fn running(&self) -> BTreeMap<String, u32> {
        let request = ApiRequest::ListJobs {
            share: None,
            state: Some(JobState::Running),
            mine: false,
            name_prefix: None,
            limit: 1_000,
            page_token: None,
        };
        let jobs: Vec<JobView> = self
            .runtime
            .block_on(self.client.every_job(request))
            .expect("the running jobs");
        jobs.into_iter().map(|job| (job.id, job.attempts)).collect()
    }

    /// Every node's state, by name.
    fn node_states(&self) -> BTreeMap<String, String> {
        let mut states = BTreeMap::new();
        let mut request = ApiRequest::list_nodes();
        loop {
            let page = match self.runtime.block_on(self.client.call(request)) {
                Ok(ApiResponse::Nodes(page)) => page,
                other => panic!("node list: {other:?}"),
            };
            states.extend(page.nodes.into_iter().map(|node| (node.name, node.state)));
            match page.next_page_token {
                Some(token) => {
                    request = ApiRequest::ListNodes {
                        limit: 0,
                        page_token: Some(token),
                    }
                }
                None => return states,
            }
        }
    }
}

fn main() {
    let nodes = env_or("QUOTIENT_BENCH_NODES", 10_000) as u32;
    let gpus = env_or("QUOTIENT_BENCH_GPUS", 8) as u32;
    let queued = env_or("QUOTIENT_BENCH_QUEUED", 200_000) as usize;
    let reclaims = env_or("QUOTIENT_BENCH_RECLAIMS", 20) as usize;
    let ramp_s = env_or("QUOTIENT_BENCH_RAMP_S", u64::from(nodes) / 150);
    let idle_s = env_or("QUOTIENT_BENCH_IDLE_S", 20);
    // Standing connections: opened over this long after each registration; 0 keeps none.
    let standing_s = env_or("QUOTIENT_BENCH_STANDING_S", (u64::from(nodes) / 50).max(60));
    let wait = Duration::from_secs(300);

    // Unset: the coordinators' own default, a worker thread per core.
    let member_threads = std::env::var("QUOTIENT_BENCH_MEMBER_THREADS").ok();
    let threads_env: Vec<(&str, &str)> = member_threads
        .iter()
        .map(|threads| ("TOKIO_WORKER_THREADS", threads.as_str()))
        .collect();
    let cluster = DevCluster::up_with_env(&["--nodes", "0"], &threads_env);
    let (addresses, tls) = cluster.admin_tls();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let client = {
        let _entered = runtime.enter();
        ApiClient::connect(addresses, &tls).expect("a client")
    };
    let bench = Bench { runtime, client };

    let mut config = cluster.fleet_config(nodes, gpus);
    config.ramp_ms = ramp_s * 1_000;
    config.standing_within_ms = (standing_s > 0).then_some(standing_s * 1_000);
    let started = Instant::now();
    let fleet = FleetThread::start(config).expect("the fleet starts");
    fleet.wait_registered(nodes as usize, None, wait);
    let registered_s = started.elapsed().as_secs_f64();
    eprintln!(
        "{nodes} nodes registered in {registered_s:.1} s: {}",
        fleet.counters()
    );

    // The standing connections are open before anything else is measured, as a real fleet's
    // are within a minute of registering: their handshakes do not share the 2 vCPUs with the
    // fill and the queue.
    let mut standing_open_s = 0.0;
    if standing_s > 0 {
        let coordinators = cluster.coordinator_pids().len();
        fleet.wait_standing(
            nodes as usize * coordinators.saturating_sub(1),
            Duration::from_secs(standing_s + 300),
        );
        standing_open_s = started.elapsed().as_secs_f64();
        eprintln!(
            "standing connections open {standing_open_s:.1} s after the start: {}",
            fleet.counters()
        );
    }

    let half = nodes * gpus / 2;
    cluster.create_share("lender", half, "lend", &[]);
    cluster.create_share("borrower", half, "lend-and-borrow", &[]);
    let mut spec = JobSpec::new("borrower", 1, gpus, vec!["train".into()]);
    spec.grace_period_ms = 1_000;
    let filling = Instant::now();
    bench.submit_many(vec![spec.clone(); nodes as usize], 64);
    poll_until("the borrower's jobs running on every node", wait, || {
        let running = fleet.running_jobs();
        (running == nodes as usize)
            .then_some(())
            .ok_or_else(|| format!("{running} running: {}", fleet.counters()))
    });
    let fill_s = filling.elapsed().as_secs_f64();
    eprintln!("every node runs a job, {fill_s:.1} s after the first submit");

    let submitting = Instant::now();
    bench.submit_many(vec![spec; queued], 256);
    let submit_per_s = queued as f64 / submitting.elapsed().as_secs_f64();
    eprintln!("{queued} jobs queued, {submit_per_s:.0} a second");

    // Idle: nothing submitted, every node heartbeating.
    std::thread::sleep(Duration::from_secs(5));
    let (leader, leader_pid) = cluster.leader();
    let followers = cluster.follower_pids(leader);
    let own_pid = libc::pid_t::try_from(std::process::id()).expect("a pid");
    let fleet_before = cpu_seconds(own_pid);
    let before = cpu_seconds(leader_pid);
    let followers_before: Vec<f64> = followers.iter().map(|pid| cpu_seconds(*pid)).collect();
    std::thread::sleep(Duration::from_secs(idle_s));
    let percent = |pid, before| (cpu_seconds(pid) - before) * 100.0 / idle_s as f64;
    let idle_leader_cpu_percent = percent(leader_pid, before);
    let idle_fleet_cpu_percent = percent(own_pid, fleet_before);
    let idle_follower_cpu_percent: Vec<f64> = followers
        .iter()
        .zip(followers_before)
        .map(|(pid, before)| percent(*pid, before))
        .collect();
    eprintln!(
        "the idle leader used {idle_leader_cpu_percent:.1}% of a core, the followers {idle_follower_cpu_percent:.1?}, the fleet {idle_fleet_cpu_percent:.1}"
    );

    let mut reclaim_ms = Vec::with_capacity(reclaims);
    for round in 0..reclaims {
        let lender = JobSpec::new("lender", 1, gpus, vec!["train".into()]);
        let sent = tokio::time::Instant::now();
        bench.submit_many(vec![lender], 1);
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            if let Some(seen) = fleet.stops_after(sent).into_iter().map(|(_, at)| at).min() {
                break seen;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no victim stopped within 30 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        reclaim_ms.push(seen.duration_since(sent).as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_millis(300));
    }
    reclaim_ms.sort_by(f64::total_cmp);
    eprintln!("reclaims: {reclaim_ms:?}");

    // Failover.
    std::thread::sleep(Duration::from_secs(2));
    let running_before = bench.running();
    let killed = cluster.kill_leader().into();
    fleet.wait_registered(nodes as usize, Some(killed), wait);
    let failover_s = fleet
        .last_registration()
        .expect("registered")
        .duration_since(killed)
        .as_secs_f64();
    let states = bench.node_states();
    let nodes_lost = states.values().filter(|state| *state != "ready").count();
    let running_after = bench.running();
    let jobs_restarted = running_before
        .iter()
        .filter(|(job, attempts)| running_after.get(*job) != Some(attempts))
        .count();
    let fenced = fleet.stats().fenced.load(Ordering::Relaxed);

    let line = serde_json::json!({
        "bench": "fleet",
        "nodes": nodes,
        "member_threads": member_threads.as_deref().unwrap_or("default"),
        "gpus_per_node": gpus,
        "queued": queued,
        "registered_s": registered_s,
        "fill_s": fill_s,
        "submit_per_s": submit_per_s,
        "idle_leader_cpu_percent": idle_leader_cpu_percent,
        "idle_follower_cpu_percent": idle_follower_cpu_percent,
        "idle_fleet_cpu_percent": idle_fleet_cpu_percent,
        "reclaim_ms": {
            "rounds": reclaim_ms.len(),
            "p50": percentile(&reclaim_ms, 0.5),
            "p99": percentile(&reclaim_ms, 0.99),
            "max": reclaim_ms.last().copied().unwrap_or(f64::NAN),
        },
        "standing_within_s": standing_s,
        "standing_open_s": standing_open_s,
        "failover_s": failover_s,
        "nodes_lost": nodes_lost,
        "jobs_restarted": jobs_restarted,
        "fenced": fenced,
        "fleet": fleet.counters(),
    });
    drop(fleet);
    println!("{line}");
}
