//! The evaluation on a large generated trace: `cargo bench -p quotient-eval --bench evaluation`.
//!
//! Generates a month of arrivals for 8 shares on 1,024 GPUs (128 nodes of 8) at 85% offered
//! load, seed 1, and replays it with each policy (borrowing first come, first served), and
//! Quotient's once more with the fair borrowing order. Prints one JSON line per run (its
//! figures and how long the replay took), then one line of them all. `BENCH_GPUS`, `BENCH_DAYS`,
//! `BENCH_SEED` and `BENCH_LOAD` change the workload; `BENCH_RUNS` (e.g.
//! `quotient-fifo,naive-victims-fifo`) replays only the runs it names, POLICY-ORDER each.

use std::time::Instant;

use quotient_eval::generate::{generate, GenerateOptions};
use quotient_eval::report::ShareReport;
use quotient_eval::trace::{parse_trace, write_trace};
use quotient_eval::{evaluate, BorrowOrder, Design, Options, Policy};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} is not a number: {v}"))
        })
        .unwrap_or(default)
}

fn main() {
    let options = GenerateOptions {
        seed: env("BENCH_SEED", 1),
        gpus: env("BENCH_GPUS", 1_024),
        days: env("BENCH_DAYS", 30.0),
        load: env("BENCH_LOAD", 0.85),
        ..GenerateOptions::default()
    };
    let began = Instant::now();
    let generated = generate(options).expect("the options are valid");
    let jobs = parse_trace(&write_trace(&generated.jobs)).expect("a generated trace reads");
    let design = Design {
        shares: generated
            .shares
            .specs()
            .expect("generated shares are valid"),
        nodes: generated.fleet.nodes().expect("a generated fleet is valid"),
    };
    eprintln!(
        "{} jobs on {} GPUs over {} days, generated in {:.1} s",
        jobs.len(),
        design.gpus(),
        options.days,
        began.elapsed().as_secs_f64()
    );
    let mut lines = Vec::new();
    let runs = Policy::ALL
        .into_iter()
        .map(|policy| (policy, BorrowOrder::Fifo))
        .chain([(Policy::Quotient, BorrowOrder::Fair)])
        .filter(|(policy, order)| {
            let name = format!("{}-{}", policy.as_str(), order.as_str());
            std::env::var("BENCH_RUNS")
                .map_or(true, |runs| runs.split(',').any(|run| run.trim() == name))
        });
    for (policy, borrow_order) in runs {
        let began = Instant::now();
        let replay = Options {
            borrow_order,
            ..Options::default()
        };
        let report = evaluate(&design, &jobs, policy, replay).expect("the replay runs");
        let replay_s = began.elapsed().as_secs_f64();
        let mut line = serde_json::to_value(&report).expect("a report encodes");
        line["bench"] = "evaluation".into();
        line["seed"] = options.seed.into();
        line["days"] = options.days.into();
        line["offered_load"] = options.load.into();
        line["replay_s"] = replay_s.into();
        // The longest of a figure in seconds over the shares, in hours.
        let longest_h = |seconds: fn(&ShareReport) -> f64| {
            report.shares.values().map(seconds).fold(0.0, f64::max) / 3_600.0
        };
        let worst_wait_h = longest_h(|s| s.queue_delay_s_max);
        let starved_h = longest_h(|s| s.borrow_starved_s_max);
        eprintln!(
            "{} ({} borrowing): longest wait {worst_wait_h:.1} h, longest starved of borrowing {starved_h:.1} h, utilisation {:.3} (under backlog {:.3}, useful {:.3}), lost {:.0} GPU-h, {} preemptions, {} loops, reclaim p95 {:.0} s, replayed in {replay_s:.1} s",
            policy.as_str(),
            borrow_order.as_str(),
            report.utilisation,
            report.utilisation_under_backlog,
            report.useful_utilisation,
            report.lost_gpu_hours,
            report.preemptions,
            report.jobs_preempted_over_3,
            report.reclaims.latency_s_p95,
        );
        println!("{line}");
        lines.push(serde_json::json!({
            "policy": policy.as_str(),
            "borrow_order": borrow_order.as_str(),
            "longest_wait_h": worst_wait_h,
            "longest_borrow_starved_h": starved_h,
            "utilisation": report.utilisation,
            "utilisation_under_backlog": report.utilisation_under_backlog,
            "useful_utilisation": report.useful_utilisation,
            "lost_gpu_hours": report.lost_gpu_hours,
            "lost_gpu_hours_uncheckpointed": report.lost_gpu_hours_uncheckpointed,
            "preemptions": report.preemptions,
            "jobs_preempted_over_3": report.jobs_preempted_over_3,
            "reclaim_latency_s_p95": report.reclaims.latency_s_p95,
            "replay_s": replay_s,
        }));
    }
    println!(
        "{}",
        serde_json::json!({
            "bench": "evaluation-summary",
            "jobs": jobs.len(),
            "gpus": design.gpus(),
            "days": options.days,
            "seed": options.seed,
            "runs": lines,
        })
    );
}
