//! `quotient-sim`: runs seeded histories of the simulated control loop and prints, as its
//! last line, one JSON line with what they did and what they found (docs/simulation.md).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use quotient_sim::{run, Config};

/// Seeded histories of Quotient's control loop in virtual time.
#[derive(Parser, Debug)]
#[command(name = "quotient-sim", version)]
struct Args {
    /// The first seed; history `i` uses seed `seed + i`.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many histories (seeds) to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// Virtual minutes of clients and faults per history (then everything heals and the
    /// cluster runs 5 more minutes before the final checks).
    #[arg(long, default_value_t = 120)]
    minutes: u64,
    /// Run without the nemesis (no faults).
    #[arg(long)]
    no_faults: bool,
    /// Draw each history's agent timing (heartbeat, lease, node-lease margin) from its seed,
    /// over what the coordinators' configuration accepts, instead of the defaults.
    #[arg(long)]
    random_timing: bool,
    /// Print each history's report as a JSON line.
    #[arg(long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.seeds == 0 || args.minutes == 0 {
        eprintln!("quotient-sim: --seeds and --minutes must be at least 1");
        return ExitCode::from(2);
    }
    let started = Instant::now();
    let mut failing = Vec::new();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    let mut virtual_ms = 0u64;
    for index in 0..args.seeds {
        let seed = args.seed.wrapping_add(index);
        let mut config = Config::new(seed, args.minutes * 60_000);
        config.faults = !args.no_faults;
        config.random_timing = args.random_timing;
        let report = run(&config);
        virtual_ms += report.virtual_ms;
        for (kind, count) in &report.stats.faults {
            *faults.entry(kind.clone()).or_insert(0) += count;
        }
        let stats = &report.stats;
        for (name, value) in [
            ("events", stats.events),
            ("commits", stats.commits),
            ("operations", stats.operations),
            ("acknowledged", stats.acknowledged),
            ("jobs", stats.jobs),
            ("gangs_run", stats.gangs_run),
            ("preemptions", stats.preemptions),
            ("nodes_lost", stats.nodes_lost),
            ("leader_changes", stats.leader_changes),
            ("self_fences", stats.self_fences),
            ("watchdog_stops", stats.watchdog_stops),
        ] {
            *totals.entry(name).or_insert(0) += value;
        }
        if args.verbose {
            println!(
                "{}",
                serde_json::to_string(&report).expect("a report serializes")
            );
        }
        if !report.violations.is_empty() {
            eprintln!(
                "seed {seed} broke an invariant (replay: quotient-sim --seed {seed} --seeds 1 --minutes {}):",
                args.minutes
            );
            for violation in &report.violations {
                eprintln!("  {violation}");
            }
            failing.push(seed);
        }
    }
    let summary = serde_json::json!({
        "seeds": args.seeds,
        "first_seed": args.seed,
        "virtual_hours": virtual_ms as f64 / 3_600_000.0,
        "wall_s": started.elapsed().as_secs_f64(),
        "violations": failing.len(),
        "failing_seeds": failing,
        "totals": totals,
        "faults": faults,
    });
    println!("{summary}");
    if failing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
