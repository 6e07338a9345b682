//! The simulator in CI: thousands of short seeded histories with every fault, none of which
//! may break an invariant; the same seed replays the same history; and a deliberately broken
//! coordinator (one that requeues a silent node's jobs before its agent has stopped them) is
//! caught, so the checks are known to bite.

use std::thread;

use quotient_sim::{run, Config, Report};

/// Seeds per CI run, and the virtual length of each history.
const SEEDS: u64 = 2_000;
const HISTORY_MS: u64 = 3 * 60_000;

fn runs(first: u64, count: u64, config: impl Fn(u64) -> Config + Sync) -> Vec<Report> {
    let threads = thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4) as u64;
    thread::scope(|scope| {
        let config = &config;
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    (first..first + count)
                        .filter(|seed| seed % threads == thread)
                        .map(|seed| run(&config(seed)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("a simulation thread panicked"))
            .collect()
    })
}

#[test]
fn thousands_of_faulty_histories_break_no_invariant() {
    let reports = runs(1, SEEDS, |seed| Config::new(seed, HISTORY_MS));
    let failing: Vec<&Report> = reports
        .iter()
        .filter(|r| !r.violations.is_empty())
        .collect();
    for report in &failing {
        eprintln!(
            "seed {} (replay: quotient-sim --seed {} --seeds 1 --minutes 3): {:#?}",
            report.seed, report.seed, report.violations
        );
    }
    assert!(
        failing.is_empty(),
        "{} of {SEEDS} seeds broke an invariant",
        failing.len()
    );
    // The histories did what they are for: faults, lost nodes, fencing, preemptions.
    let sum = |f: fn(&Report) -> u64| reports.iter().map(f).sum::<u64>();
    let faults = sum(|r| r.stats.faults.values().sum());
    let lost = sum(|r| r.stats.nodes_lost);
    let fences = sum(|r| r.stats.self_fences);
    let leaders = sum(|r| r.stats.leader_changes);
    let preemptions = sum(|r| r.stats.preemptions);
    let jobs = sum(|r| r.stats.jobs);
    let gangs = sum(|r| r.stats.gangs_run);
    eprintln!("{SEEDS} seeds: {faults} faults, {lost} nodes lost, {fences} self-fences, {leaders} leaders, {preemptions} preemptions, {jobs} jobs, {gangs} gangs run");
    assert!(faults > SEEDS && lost > 0 && fences > 0 && leaders > SEEDS && preemptions > 0);
    assert!(jobs > SEEDS * 5, "{jobs} jobs in {SEEDS} histories");
    assert!(
        gangs > SEEDS / 10,
        "{gangs} jobs of several nodes ran in {SEEDS} histories"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let first = run(&Config::new(42, 10 * 60_000));
    let again = run(&Config::new(42, 10 * 60_000));
    assert_eq!(
        serde_json::to_string(&first).unwrap(),
        serde_json::to_string(&again).unwrap()
    );
    let other = run(&Config::new(43, 10 * 60_000));
    assert_ne!(first.stats.events, other.stats.events);
}

/// A leader that declares a node lost 2 s after its last heartbeat requeues jobs that still
/// run there (their agent stops them only after its 10 s lease): the fencing check must say
/// so, on some seed of a few.
#[test]
fn a_coordinator_that_requeues_too_early_is_caught() {
    let reports = runs(1, 40, |seed| Config {
        broken_node_lease_ms: Some(2_000),
        ..Config::new(seed, 5 * 60_000)
    });
    let caught: Vec<&String> = reports
        .iter()
        .flat_map(|r| r.violations.iter())
        .filter(|v| v.contains("no longer places it there") || v.contains("more than once"))
        .collect();
    assert!(
        !caught.is_empty(),
        "no seed of 40 caught a coordinator that requeues before the agent's lease runs out"
    );
}

/// Without faults nothing is lost, fenced or requeued, and the workload gets done.
#[test]
fn a_history_without_faults_is_quiet() {
    let report = run(&Config {
        faults: false,
        ..Config::new(7, 20 * 60_000)
    });
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.stats.nodes_lost, 0);
    assert_eq!(report.stats.self_fences, 0);
    assert_eq!(report.stats.watchdog_stops, 0);
    assert_eq!(report.stats.leader_changes, 1);
    assert!(report.stats.jobs_finished > 10, "{:?}", report.stats);
}

/// Agent timing drawn per seed over everything the coordinators accept (heartbeat 0.2-2 s,
/// lease up to 20 s, margin from the minimum to 6 s): no invariant breaks.
#[test]
fn any_accepted_agent_timing_breaks_no_invariant() {
    let reports = runs(1, 150, |seed| Config {
        random_timing: true,
        ..Config::new(seed, 5 * 60_000)
    });
    let failing: Vec<(u64, &Vec<String>)> = reports
        .iter()
        .filter(|r| !r.violations.is_empty())
        .map(|r| (r.seed, &r.violations))
        .collect();
    assert!(failing.is_empty(), "{failing:#?}");
}

/// Why the coordinators refuse a node-lease margin under 3 s: with margins of 0-2.5 s some
/// seed requeues a job whose dead agent's watchdog has not stopped it yet (found by this
/// simulator, which is how the minimum came to be).
#[test]
fn a_margin_below_the_minimum_lets_a_job_run_twice() {
    let reports = runs(1, 100, |seed| Config {
        random_timing: true,
        margin_min_ms: 0,
        ..Config::new(seed, 5 * 60_000)
    });
    let caught: Vec<(u64, u64)> = reports
        .iter()
        .filter(|r| {
            r.violations
                .iter()
                .any(|v| v.contains("no longer places it there"))
        })
        .map(|r| (r.seed, r.stats.margin_ms))
        .collect();
    assert!(
        !caught.is_empty(),
        "no seed of 100 caught a margin below the minimum"
    );
    assert!(
        caught.iter().all(|(_, margin)| *margin < 3_000),
        "a margin of 3 s or more failed: {caught:?}"
    );
}
