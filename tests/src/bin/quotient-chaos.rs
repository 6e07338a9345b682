//! `quotient-chaos --episodes N --seed S [--episode E] [--length-s SECS] [--coordinators 3|5]
//! [--agents N]`: randomized fault injection against a Quotient cluster of Docker containers,
//! with a checker of the history and the final state. See docs/chaos.md and
//! `quotient_tests::chaos`.
//!
//! The last line on stdout is one JSON object with the counts; every violation is printed to
//! stderr before it, with the seed and episode that replay it. Exit status: 0 when no check
//! found a violation, 1 when one did, 2 for bad flags, 3 when an episode could not be run
//! (the others still run; `episodes_not_run` lists it).

use clap::Parser;
use quotient_tests::chaos::{self, Options};

fn main() {
    let options = Options::parse();
    if let Err(message) = options.check() {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
    let seed = options.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(1)
    });
    match chaos::run(&options, seed) {
        Ok(outcome) => {
            let summary = chaos::summary(seed, &outcome);
            let violations: usize = outcome.reports.iter().map(|r| r.violations.total()).sum();
            println!("{summary}");
            std::process::exit(if violations > 0 {
                1
            } else if !outcome.not_run.is_empty() {
                3
            } else {
                0
            });
        }
        Err(error) => {
            eprintln!("quotient-chaos: error: {error:#}");
            eprintln!("quotient-chaos: replay with --seed {seed}");
            std::process::exit(3);
        }
    }
}
