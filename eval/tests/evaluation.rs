//! The evaluation on traces whose figures can be worked out by hand, and on generated ones.

use quotient_eval::design::{FleetFile, SharesFile};
use quotient_eval::generate::{generate, GenerateOptions};
use quotient_eval::trace::parse_trace;
use quotient_eval::{evaluate, Design, Options, Policy, RunReport};

/// Two shares of 8 GPUs on two nodes of 8: `a` lends and borrows, `b` lends.
fn two_shares() -> Design {
    let shares = SharesFile::parse(
        "[[share]]\nname = \"a\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 8 }\n\
         [[share]]\nname = \"b\"\nstrategy = \"lend\"\nlimits = { h100 = 8 }\n",
    )
    .unwrap();
    let fleet =
        FleetFile::parse("[[pool]]\nclass = \"h100\"\nnodes = 2\ngpus_per_node = 8\n").unwrap();
    Design {
        shares: shares.specs().unwrap(),
        nodes: fleet.nodes().unwrap(),
    }
}

fn run(design: &Design, trace: &str, policy: Policy) -> RunReport {
    let jobs = parse_trace(trace).unwrap();
    evaluate(
        design,
        &jobs,
        policy,
        Options {
            check: true,
            ..Options::default()
        },
    )
    .unwrap()
}

/// `a` runs two jobs of 8 GPUs for an hour, checkpointing every 10 minutes, and so borrows
/// `b`'s idle GPUs for the second; at 1,000 s `b` submits a job of its own and takes them
/// back.
const RECLAIM: &str = r#"
{"submit_s": 0, "share": "a", "gpus": 8, "run_s": 3600, "checkpoint_s": 600}
{"submit_s": 0, "share": "a", "gpus": 8, "run_s": 3600, "checkpoint_s": 600}
{"submit_s": 1000, "share": "b", "gpus": 8, "run_s": 600}
"#;

#[test]
fn a_reclaim_costs_the_work_since_the_last_checkpoint() {
    let design = two_shares();
    let report = run(&design, RECLAIM, Policy::Quotient);
    assert_eq!(report.completed, 3);
    assert_eq!(report.preemptions, 1);
    assert_eq!(report.preemptions_by_kind.get("reclaim"), Some(&1));
    // Signalled at 1,000 s, exited 20 s later: 1,020 s run, 600 s of it saved.
    let lost = 420.0 * 8.0 / 3_600.0;
    assert!((report.lost_gpu_hours - lost).abs() < 1e-9, "{report:?}");
    assert_eq!(report.reclaims.count, 1);
    assert_eq!(report.reclaims.latency_s_p50, 20.0);
    assert!((1..=3).contains(&report.reclaims.rounds_max), "{report:?}");
    assert_eq!(report.jobs_preempted_over_3, 0);
    let (a, b) = (&report.shares["a"], &report.shares["b"]);
    // The split is per share: `a` holds 16 GPUs, 8 beyond its limit, until 1,020 s, and again
    // from 1,620 s (its preempted job resumes after `b`'s) until its first job ends at 3,600 s.
    let borrowed = 8.0 * (1_020.0 + 1_980.0) / 3_600.0;
    assert!((a.borrowed_gpu_hours - borrowed).abs() < 1e-6, "{a:?}");
    assert!((b.lent_gpu_hours - borrowed).abs() < 1e-6, "{b:?}");
    assert!(
        (a.own_gpu_hours - 8.0 * 4_620.0 / 3_600.0).abs() < 1e-6,
        "{a:?}"
    );
    assert_eq!(b.queue_delay_s_p50, 20.0);
    // Everything ran: the two hours of `a`, the lost work, and `b`'s ten minutes.
    let used = 8.0 * (3_600.0 + 3_600.0 + 420.0 + 600.0) / 3_600.0;
    assert!((report.used_gpu_hours - used).abs() < 1e-9, "{report:?}");
}

#[test]
fn jobs_that_checkpoint_every_millisecond_replay_and_keep_all_their_work() {
    // Proves a trace of jobs that checkpoint far more often than an agent reports replays
    // (a report per checkpoint would be 10^8 events here), and that a stop still keeps the
    // work up to the last checkpoint: signalled at 1,000 s, exited at 1,020 s, nothing lost.
    let trace = r#"
{"submit_s": 0, "share": "a", "gpus": 8, "run_s": 100000, "checkpoint_s": 0.001}
{"submit_s": 0, "share": "a", "gpus": 8, "run_s": 100000, "checkpoint_s": 0.001}
{"submit_s": 1000, "share": "b", "gpus": 8, "run_s": 600}
"#;
    let report = run(&two_shares(), trace, Policy::Quotient);
    assert_eq!(report.completed, 3);
    assert_eq!(report.preemptions, 1);
    assert!(report.lost_gpu_hours.abs() < 1e-9, "{report:?}");
}

#[test]
fn jobs_no_node_of_the_fleet_could_hold_are_named_before_the_replay() {
    let design = two_shares();
    let jobs = parse_trace(
        r#"
{"submit_s": 0, "share": "a", "gpus": 8, "run_s": 60}
{"submit_s": 0, "share": "a", "gpus": 9, "run_s": 60}
{"submit_s": 0, "share": "a", "gpus": 8, "nodes": 3, "run_s": 60}
{"submit_s": 0, "share": "b", "gpus": 1, "class": "a10g", "run_s": 60}
"#,
    )
    .unwrap();
    let (count, first) = design.never_fit(&jobs);
    assert_eq!(count, 3);
    let first = first.unwrap();
    assert!(first.contains("largest h100 node has 8 GPUs"), "{first}");
    let report = run(
        &design,
        "{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 8, \"nodes\": 3, \"run_s\": 60}",
        Policy::Quotient,
    );
    assert_eq!(report.never_started, 1);
}

#[test]
fn static_partitioning_neither_lends_nor_preempts() {
    let design = two_shares();
    let report = run(&design, RECLAIM, Policy::Static);
    assert_eq!(report.completed, 3);
    assert_eq!(report.preemptions, 0);
    assert_eq!(report.lost_gpu_hours, 0.0);
    assert!(report
        .shares
        .values()
        .all(|s| s.borrowed_gpu_hours == 0.0 && s.lent_gpu_hours == 0.0));
    // `a`'s second job waits for its first: an hour.
    assert_eq!(report.shares["a"].queue_delay_s_p95, 3_600.0);
    assert_eq!(report.shares["b"].queue_delay_s_p50, 0.0);
    let shared = run(&design, RECLAIM, Policy::Quotient);
    assert!(shared.utilisation > report.utilisation);
}

#[test]
fn a_job_that_never_checkpoints_loses_the_whole_attempt() {
    let design = two_shares();
    let trace = RECLAIM.replace(", \"checkpoint_s\": 600", "");
    let report = run(&design, &trace, Policy::Quotient);
    assert!((report.lost_gpu_hours - 1_020.0 * 8.0 / 3_600.0).abs() < 1e-9);
    assert_eq!(
        report.lost_gpu_hours_uncheckpointed, report.lost_gpu_hours,
        "all of it by a job that never checkpoints"
    );
    // It starts over: a's jobs ran 3,600 s twice, 1,020 s lost, and b's 600 s.
    let used = 8.0 * (3_600.0 * 2.0 + 1_020.0 + 600.0) / 3_600.0;
    assert!((report.used_gpu_hours - used).abs() < 1e-9);
}

#[test]
fn a_job_for_an_unknown_share_is_refused_with_its_line() {
    let design = two_shares();
    let jobs =
        parse_trace("\n{\"submit_s\": 0, \"share\": \"nobody\", \"gpus\": 1, \"run_s\": 5}\n")
            .unwrap();
    let error = evaluate(&design, &jobs, Policy::Quotient, Options::default()).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("line 2") && message.contains("nobody"),
        "{message}"
    );
}

fn generated(seed: u64) -> (Design, Vec<quotient_eval::Job>) {
    let generated = generate(GenerateOptions {
        seed,
        gpus: 64,
        days: 2.0,
        shares: 4,
        load: 1.0,
    })
    .unwrap();
    let design = Design {
        shares: generated.shares.specs().unwrap(),
        nodes: generated.fleet.nodes().unwrap(),
    };
    let trace = quotient_eval::trace::write_trace(&generated.jobs);
    (design, parse_trace(&trace).unwrap())
}

#[test]
fn a_generated_trace_replays_the_same_and_every_invariant_holds() {
    let (design, jobs) = generated(5);
    let checked = Options {
        check: true,
        ..Options::default()
    };
    let first = evaluate(&design, &jobs, Policy::Quotient, checked).unwrap();
    let again = evaluate(&design, &jobs, Policy::Quotient, Options::default()).unwrap();
    assert_eq!(first, again);
    assert_eq!(
        first.completed, first.jobs,
        "every generated job fits the fleet"
    );
    assert!(first.preemptions > 0, "{first:?}");
    assert!(first.reclaims.count > 0, "{first:?}");
    let borrowed: f64 = first.shares.values().map(|s| s.borrowed_gpu_hours).sum();
    assert!(borrowed > 0.0);
    // Every GPU-hour held is some share's own or borrowed.
    let accounted: f64 = first
        .shares
        .values()
        .map(|s| s.own_gpu_hours + s.borrowed_gpu_hours)
        .sum();
    assert!((accounted - first.used_gpu_hours).abs() < 1e-6 * first.used_gpu_hours.max(1.0));
    assert!(first.utilisation > 0.0 && first.utilisation <= 1.0);
}

#[test]
fn lending_uses_the_fleet_better_than_static_partitions() {
    let (design, jobs) = generated(9);
    let shared = evaluate(&design, &jobs, Policy::Quotient, Options::default()).unwrap();
    let partitioned = evaluate(&design, &jobs, Policy::Static, Options::default()).unwrap();
    assert!(
        shared.utilisation > partitioned.utilisation,
        "{} against {}",
        shared.utilisation,
        partitioned.utilisation
    );
    assert_eq!(partitioned.preemptions_by_kind.get("reclaim"), None);
}

#[test]
fn the_fair_order_lends_the_last_idle_gpu_to_the_share_holding_least_of_its_limit() {
    use quotient_eval::BorrowOrder;
    let shares = SharesFile::parse(
        "[[share]]\nname = \"a\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 2 }\n\
         [[share]]\nname = \"b\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 2 }\n\
         [[share]]\nname = \"c\"\nstrategy = \"lend\"\nlimits = { h100 = 4 }\n",
    )
    .unwrap();
    let fleet =
        FleetFile::parse("[[pool]]\nclass = \"h100\"\nnodes = 1\ngpus_per_node = 8\n").unwrap();
    let design = Design {
        shares: shares.specs().unwrap(),
        nodes: fleet.nodes().unwrap(),
    };
    // `a` holds 4 GPUs (200% of its limit), `b` 2 (100%), `c` 1: one GPU idle. At 10 s both
    // borrowers want it, `a` first.
    let mut trace = String::new();
    for (share, count) in [("a", 4), ("b", 2), ("c", 1)] {
        for _ in 0..count {
            trace.push_str(&format!(
                "{{\"submit_s\": 0, \"share\": \"{share}\", \"gpus\": 1, \"run_s\": 3600}}\n"
            ));
        }
    }
    trace.push_str("{\"submit_s\": 10, \"share\": \"a\", \"gpus\": 1, \"run_s\": 600}\n");
    trace.push_str("{\"submit_s\": 10, \"share\": \"b\", \"gpus\": 1, \"run_s\": 600}\n");
    let jobs = parse_trace(&trace).unwrap();
    let with = |borrow_order| {
        let options = Options {
            check: true,
            borrow_order,
            ..Options::default()
        };
        evaluate(&design, &jobs, Policy::Quotient, options).unwrap()
    };
    let fifo = with(BorrowOrder::Fifo);
    let fair = with(BorrowOrder::Fair);
    assert_eq!(
        (fifo.borrow_order.as_str(), fair.borrow_order.as_str()),
        ("fifo", "fair")
    );
    // First come: `a`'s job borrows at once, `b`'s waits for it to end (600 s).
    assert_eq!(fifo.shares["a"].queue_delay_s_max, 0.0);
    assert_eq!(fifo.shares["b"].queue_delay_s_max, 600.0);
    // Fair: `b`, holding the least of its limit, borrows first.
    assert_eq!(fair.shares["b"].queue_delay_s_max, 0.0);
    assert_eq!(fair.shares["a"].queue_delay_s_max, 600.0);
}

/// `a` runs two borrowed jobs of 4 GPUs on the same node: `a3`, which checkpoints every
/// 1,000 s and has just done so when `b` reclaims at 1,100 s, and `a4`, placed later but never
/// checkpointing. The naive order takes the most recently placed (`a4`, 600 s lost); Quotient
/// takes the one with the least work at risk (`a3`, 100 s lost).
const CHECKPOINTED_VICTIM: &str = r#"
{"submit_s": 0, "share": "a", "gpus": 4, "run_s": 3600}
{"submit_s": 0, "share": "a", "gpus": 4, "run_s": 3600}
{"submit_s": 0, "share": "a", "gpus": 4, "run_s": 3600, "checkpoint_s": 1000}
{"submit_s": 500, "share": "a", "gpus": 4, "run_s": 3600}
{"submit_s": 1100, "share": "b", "gpus": 4, "run_s": 600}
"#;

#[test]
fn quotient_takes_the_victim_that_checkpointed_last_and_the_naive_order_the_newest() {
    let design = two_shares();
    let quotient = run(&design, CHECKPOINTED_VICTIM, Policy::Quotient);
    let naive = run(&design, CHECKPOINTED_VICTIM, Policy::NaiveVictims);
    assert_eq!((quotient.preemptions, naive.preemptions), (1, 1));
    // Signalled at 1,100 s, exited 20 s later, 4 GPUs.
    let hours = |seconds: f64| seconds * 4.0 / 3_600.0;
    assert!(
        (quotient.lost_gpu_hours - hours(120.0)).abs() < 1e-9,
        "{quotient:?}"
    );
    assert!(
        (naive.lost_gpu_hours - hours(620.0)).abs() < 1e-9,
        "{naive:?}"
    );
    // a4 never checkpoints; a3 does.
    assert_eq!(quotient.lost_gpu_hours_uncheckpointed, 0.0);
    assert_eq!(naive.lost_gpu_hours_uncheckpointed, naive.lost_gpu_hours);
}

/// Two shares borrow from `b`: `a`'s 8-GPU job borrows a node for 600 s, then `a`'s next
/// one, submitted before `c`'s, takes it again for an hour while `c`'s head waits.
const STARVED: &str = r#"
{"submit_s": 0, "share": "a", "gpus": 4, "run_s": 7200}
{"submit_s": 0, "share": "c", "gpus": 4, "run_s": 7200}
{"submit_s": 1, "share": "a", "gpus": 8, "run_s": 600}
{"submit_s": 1, "share": "a", "gpus": 8, "run_s": 3600}
{"submit_s": 2, "share": "c", "gpus": 4, "run_s": 600}
"#;

#[test]
fn a_share_waiting_to_borrow_while_another_borrows_is_counted_as_starved() {
    let shares = SharesFile::parse(
        "[[share]]\nname = \"a\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 4 }\n\
         [[share]]\nname = \"b\"\nstrategy = \"lend\"\nlimits = { h100 = 8 }\n\
         [[share]]\nname = \"c\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 4 }\n",
    )
    .unwrap();
    let fleet =
        FleetFile::parse("[[pool]]\nclass = \"h100\"\nnodes = 2\ngpus_per_node = 8\n").unwrap();
    let design = Design {
        shares: shares.specs().unwrap(),
        nodes: fleet.nodes().unwrap(),
    };
    let report = run(&design, STARVED, Policy::Quotient);
    let (a, c) = (&report.shares["a"], &report.shares["c"]);
    assert_eq!(a.borrow_starved_s_max, 0.0, "{a:?}");
    // From its submit at 2 s to the end of a's second borrowed job, about 601 + 3,600 s.
    assert!(
        c.borrow_starved_s_max >= 4_000.0 && c.borrow_starved_s_max <= 4_300.0,
        "{c:?}"
    );
    let partitioned = run(&design, STARVED, Policy::Static);
    assert!(partitioned
        .shares
        .values()
        .all(|share| share.borrow_starved_s_max == 0.0));
}
