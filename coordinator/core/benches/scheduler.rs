//! Scheduler benchmark: `cargo bench -p quotient-core --bench scheduler`.
//!
//! Builds 10,000 nodes x 8 GPUs in 2 classes, 100 shares of mixed strategies and 200,000
//! RUNNABLE jobs, then measures (a) one full round from that state and (b) the steady state:
//! one job finishes, one is submitted, one round runs (plan + apply), 10,000 times. Commands
//! are applied noting what they changed, as the coordinator applies them.
//! It runs twice: with jobs of one node only (`"bench":"scheduler"`), then with 10% of the
//! jobs of 2-64 nodes (`"bench":"scheduler-gangs"`); each prints one JSON line, the mix last.
//! `BENCH_QUICK=1` shrinks it for a smoke run; `BENCH_ONLY=scheduler` or
//! `BENCH_ONLY=scheduler-gangs` runs one of the two.

use std::time::Instant;

use quotient_common::{
    GpuClass, GpuDevice, JobId, JobSpec, JobState, NodeInventory, ShareSpec, ShareState, Strategy,
};
use quotient_core::{
    apply_noting, plan, ApplyCtx, Changes, Command, JobEvent, JobReport, Outcome, State,
};

struct Bench {
    state: State,
    index: u64,
    rng: u64,
    /// What each command changed, as the coordinator's state machine notes it.
    changes: Changes,
    /// Out of 100 jobs, how many run on several nodes.
    gang_percent: u64,
}

impl Bench {
    fn apply(&mut self, command: Command) -> Outcome {
        self.index += 1;
        self.changes.clear();
        apply_noting(
            &mut self.state,
            command,
            ApplyCtx {
                log_index: self.index,
                time_ms: self.index,
            },
            &mut self.changes,
        )
    }

    /// xorshift64: deterministic job shapes without a dependency.
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn job(&mut self, shares: usize) -> JobSpec {
        let share = (self.next() % shares as u64) as usize;
        let class = if self.next().is_multiple_of(2) {
            "a10g"
        } else {
            "h100-80gb"
        };
        let gpus = [1, 1, 1, 1, 2, 2, 4, 8][(self.next() % 8) as usize];
        let priority = (self.next() % 100) as u32;
        let mut spec = JobSpec::new(
            &format!("share-{share}"),
            priority,
            gpus,
            vec!["train".into()],
        );
        spec.gpu_class = Some(GpuClass::parse(class).unwrap());
        if self.next() % 100 < self.gang_percent {
            // A job of 2-64 nodes with 1, 2, 4 or 8 GPUs on each.
            spec.nodes = 2 + (self.next() % 63) as u32;
            spec.gpus = [1, 2, 4, 8][(self.next() % 4) as usize];
        }
        spec
    }

    /// Every member of the job that has not exited reports `event`, as its agent would.
    fn report(&mut self, id: JobId, event: JobEvent) {
        let job = self.state.job(id).unwrap();
        let attempt = job.attempts;
        let nodes: Vec<String> = job
            .placement
            .iter()
            .filter(|m| !m.stage.exited())
            .map(|m| self.state.node(m.node).unwrap().name.clone())
            .collect();
        for node in nodes {
            if self.state.job(id).unwrap().placement.is_empty() {
                break;
            }
            self.apply(Command::ReportJob(JobReport {
                job: id,
                attempt,
                node,
                event: event.clone(),
            }));
        }
    }

    /// Plays the agents: start what was scheduled, stop what is preempting.
    fn agents(&mut self, ids: &[JobId]) {
        for id in ids {
            match self.state.job(*id).map(|j| j.state) {
                Some(JobState::Scheduled) => self.report(*id, JobEvent::Running),
                Some(JobState::Preempting) => {
                    self.report(*id, JobEvent::ExitedAfterSignal { code: Some(0) })
                }
                _ => {}
            }
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank]
}

fn main() {
    let only = std::env::var("BENCH_ONLY").ok();
    for (name, gang_percent) in [("scheduler", 0), ("scheduler-gangs", 10)] {
        if only.as_deref().is_none_or(|only| only == name) {
            run(name, gang_percent);
        }
    }
}

/// One run of the benchmark with `gang_percent` of the jobs on several nodes.
fn run(name: &str, gang_percent: u64) {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let (nodes, shares, jobs, steady_rounds) = if quick {
        (1_000, 100, 20_000, 1_000)
    } else {
        (10_000, 100, 200_000, 10_000)
    };
    let classes = [
        GpuClass::parse("a10g").unwrap(),
        GpuClass::parse("h100-80gb").unwrap(),
    ];
    let mut b = Bench {
        state: State::new(),
        index: 0,
        rng: 0x9E37_79B9_7F4A_7C15,
        changes: Changes::new(),
        gang_percent,
    };

    let build = Instant::now();
    for n in 0..nodes {
        let class = classes[n % 2].clone();
        b.apply(Command::RegisterNode(NodeInventory {
            name: format!("node-{n}"),
            host: quotient_common::HostInfo::process_only(),
            gpus: (0..8)
                .map(|i| GpuDevice {
                    index: i,
                    uuid: format!("GPU-{n}-{i}"),
                    class: class.clone(),
                    healthy: true,
                    nvlink_peers: 0,
                })
                .collect(),
        }));
    }
    // Limits add up to 75% of each class; the rest is the free pool.
    let per_share = (nodes as u32 / 2 * 8) * 3 / 4 / shares as u32;
    for s in 0..shares {
        let strategy = [Strategy::Reserve, Strategy::Lend, Strategy::LendAndBorrow][s % 3];
        b.apply(Command::CreateShare(ShareSpec {
            name: format!("share-{s}"),
            limits: classes.iter().map(|c| (c.clone(), per_share)).collect(),
            strategy,
            borrow_limit_percent: (strategy == Strategy::LendAndBorrow).then_some(100),
            in_share_preemption: s % 2 == 0,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        }));
    }
    for _ in 0..jobs {
        let spec = b.job(shares);
        b.apply(Command::SubmitJob(spec));
    }
    let build_ms = build.elapsed().as_secs_f64() * 1e3;

    // (a) one full round from 200,000 queued jobs.
    let t = Instant::now();
    let full = plan(&b.state);
    let full_round_ms = t.elapsed().as_secs_f64() * 1e3;
    let placed_jobs: Vec<JobId> = {
        let mut ids: Vec<JobId> = full.placements().map(|p| p.0).collect();
        ids.dedup();
        ids
    };
    let placements = placed_jobs.len();
    let gangs_placed = placed_jobs
        .iter()
        .filter(|id| b.state.job(**id).is_some_and(|j| j.node_count() > 1))
        .count();
    let t = Instant::now();
    b.apply(Command::ApplyPlan(full.clone()));
    let full_apply_ms = t.elapsed().as_secs_f64() * 1e3;
    let placed = placed_jobs;
    b.agents(&placed);

    // (b) steady state: one finishes, one is submitted, one round (plan + apply).
    let mut samples = Vec::with_capacity(steady_rounds);
    let mut plan_samples = Vec::with_capacity(steady_rounds);
    let mut running: Vec<JobId> = placed;
    let mut steady_placements = 0usize;
    let mut steady_preemptions = 0usize;
    let (mut steady_holds, mut steady_clears, mut steady_waiting) = (0usize, 0usize, 0usize);
    for _ in 0..steady_rounds {
        // Finish a running job (skipping ones that are no longer running).
        while let Some(pos) =
            (!running.is_empty()).then(|| (b.next() % running.len() as u64) as usize)
        {
            let id = running.swap_remove(pos);
            if b.state.job(id).map(|j| j.state) == Some(JobState::Running) {
                b.report(id, JobEvent::Exited { code: 0 });
                break;
            }
        }
        let spec = b.job(shares);
        b.apply(Command::SubmitJob(spec));
        let t = Instant::now();
        let round = plan(&b.state);
        let planned = t.elapsed();
        b.apply(Command::ApplyPlan(round.clone()));
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        plan_samples.push(planned.as_secs_f64() * 1e6);
        let mut placed: Vec<JobId> = round.placements().map(|p| p.0).collect();
        placed.dedup();
        let preempted: Vec<JobId> = round.preemptions().map(|p| p.0).collect();
        steady_placements += placed.len();
        for action in &round.actions {
            match action {
                quotient_core::PlanAction::NominateNodes { .. } => steady_holds += 1,
                quotient_core::PlanAction::ClearNomination { .. } => steady_clears += 1,
                _ => {}
            }
        }
        steady_waiting += round.waiting.len();
        steady_preemptions += preempted.len();
        b.agents(&placed);
        b.agents(&preempted);
        running.extend(placed);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    plan_samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    b.state
        .validate()
        .expect("invariants hold after the benchmark");

    println!("{name}: build: {build_ms:.0} ms; full round: {placements} placements ({gangs_placed} of several nodes) in {full_round_ms:.1} ms (+{full_apply_ms:.1} ms apply)");
    println!(
        "steady: {steady_rounds} rounds, {steady_placements} placements, {steady_preemptions} preemptions, {steady_holds} nodes held, {steady_clears} holds dropped, {steady_waiting} reasons written"
    );
    println!(
        "{{\"bench\":\"{name}\",\"gang_percent\":{gang_percent},\"nodes\":{nodes},\"gpus\":{},\"shares\":{shares},\"jobs\":{jobs},\"full_round_ms\":{full_round_ms:.2},\"full_round_apply_ms\":{full_apply_ms:.2},\"full_round_placements\":{placements},\"full_round_gangs_placed\":{gangs_placed},\"placements_per_sec\":{:.0},\"incremental_rounds\":{steady_rounds},\"incremental_round_us_p50\":{:.1},\"incremental_round_us_p99\":{:.1},\"incremental_plan_us_p50\":{:.1},\"incremental_plan_us_p99\":{:.1}}}",
        nodes * 8,
        placements as f64 / (full_round_ms / 1e3),
        percentile(&samples, 0.50),
        percentile(&samples, 0.99),
        percentile(&plan_samples, 0.50),
        percentile(&plan_samples, 0.99),
    );
}
