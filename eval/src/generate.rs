//! Synthetic workloads from a seed, shaped on published studies of GPU clusters (docs/what-if.md
//! cites the figures): most jobs take one GPU while the few large ones take most of the GPU
//! time, run times are heavy-tailed (log-normal), and arrivals follow the day and the week.
//! On top, each share works in campaigns: days of heavy submitting, then quieter days, so
//! that idle quota appears, is borrowed, and is reclaimed when its owner comes back.
//!
//! The same options and seed give the same files, byte for byte.

use std::collections::BTreeMap;

use quotient_common::rng::Rng;
use quotient_common::Strategy;

use crate::design::{FleetFile, PoolEntry, ShareEntry, SharesFile, FLEET_NODES_MAX};
use crate::trace::{TraceJob, TRACE_JOBS_MAX};

/// GPUs per generated node.
pub const NODE_GPUS: u32 = 8;
/// The GPU class of the generated fleet.
pub const CLASS: &str = "h100";
/// The longest generated run: a week.
const RUN_S_MAX: f64 = 7.0 * 86_400.0;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateOptions {
    pub seed: u64,
    /// GPUs in the fleet, rounded up to whole nodes of [`NODE_GPUS`].
    pub gpus: u32,
    /// Days of arrivals.
    pub days: f64,
    /// Shares, `team-a` on (at most 26).
    pub shares: usize,
    /// GPU time offered over the fleet's, on average (0.85: 85% of the fleet's GPU-hours).
    pub load: f64,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions {
            seed: 1,
            gpus: 1_024,
            days: 30.0,
            shares: 8,
            load: 0.85,
        }
    }
}

/// A generated design and trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub shares: SharesFile,
    pub fleet: FleetFile,
    pub jobs: Vec<TraceJob>,
}

/// Job sizes (GPUs in all) and how often each is drawn: most jobs take one GPU, few take
/// several nodes (docs/what-if.md, "The generator").
const SIZES: [(u32, f64); 6] = [
    (1, 0.605),
    (2, 0.15),
    (4, 0.15),
    (8, 0.07),
    (16, 0.02),
    (32, 0.005),
];

/// The median run time of a job of `gpus` GPUs, in seconds: larger jobs run longer.
fn median_run_s(gpus: u32) -> f64 {
    match gpus {
        1 => 600.0,
        2..=4 => 2_000.0,
        8 => 3_600.0,
        _ => 7_200.0,
    }
}

/// The spread of log run times (a log-normal's sigma): one job in ten runs 13 times its median.
const RUN_SIGMA: f64 = 2.0;

/// Peak-to-mean swing of the day's arrivals: the rate at 14:00 is three times that at 02:00.
const DIURNAL_AMPLITUDE: f64 = 0.5;
/// Arrivals on Saturdays and Sundays, against weekdays.
const WEEKEND_FACTOR: f64 = 0.65;
/// Campaigns: a share submits heavily for about 2 days, then at a fifth of that for about 1.
const CAMPAIGN_ON_MEAN_S: f64 = 2.0 * 86_400.0;
const CAMPAIGN_OFF_MEAN_S: f64 = 86_400.0;
const CAMPAIGN_OFF_FACTOR: f64 = 0.2;

/// The arrival rate's factor at `t_s` seconds from a Monday midnight: the day, the week.
fn calendar_factor(t_s: f64) -> f64 {
    let day = (t_s / 86_400.0).floor() as u64 % 7;
    let hour = (t_s % 86_400.0) / 3_600.0;
    let diurnal = 1.0 + DIURNAL_AMPLITUDE * ((hour - 14.0) / 24.0 * std::f64::consts::TAU).cos();
    let weekly = if day >= 5 { WEEKEND_FACTOR } else { 1.0 };
    // Normalised so that a week's mean is 1.
    diurnal * weekly / ((5.0 + 2.0 * WEEKEND_FACTOR) / 7.0)
}

/// One job's size, run time and checkpoint interval.
fn draw_job(rng: &mut Rng) -> (u32, f64, Option<f64>) {
    let mut pick = rng.unit();
    let mut gpus = SIZES[SIZES.len() - 1].0;
    for (size, weight) in SIZES {
        if pick < weight {
            gpus = size;
            break;
        }
        pick -= weight;
    }
    let run_s = (median_run_s(gpus) * (RUN_SIGMA * rng.normal()).exp()).clamp(30.0, RUN_S_MAX);
    // Long jobs mostly checkpoint every 10-60 minutes; short ones mostly never do.
    let checkpoints = if run_s > 1_800.0 {
        rng.chance(3, 4)
    } else {
        rng.chance(1, 4)
    };
    let every = checkpoints.then(|| *rng.pick(&[300.0, 600.0, 900.0, 1_800.0, 3_600.0]));
    (gpus, run_s.round(), every)
}

/// The strategies of shares in turn: mostly lend-and-borrow, some lending only, some
/// keeping their quota.
const STRATEGIES: [Strategy; 8] = [
    Strategy::LendAndBorrow,
    Strategy::LendAndBorrow,
    Strategy::Lend,
    Strategy::LendAndBorrow,
    Strategy::Reserve,
    Strategy::LendAndBorrow,
    Strategy::Lend,
    Strategy::LendAndBorrow,
];

/// Generates a design and a trace.
pub fn generate(options: GenerateOptions) -> Result<Generated, String> {
    generate_at_most(options, TRACE_JOBS_MAX)
}

/// [`generate`], refusing a workload of more than `jobs_max` jobs.
fn generate_at_most(options: GenerateOptions, jobs_max: usize) -> Result<Generated, String> {
    if !(2..=26).contains(&options.shares) {
        return Err(format!("{} shares; give 2 to 26", options.shares));
    }
    if !(options.days > 0.0 && options.days <= 366.0) {
        return Err(format!(
            "{} days; give more than 0, at most 366",
            options.days
        ));
    }
    if !(options.load > 0.0 && options.load <= 4.0) {
        return Err(format!(
            "load {}; give more than 0, at most 4",
            options.load
        ));
    }
    // The evaluation's own limits: a fleet it reads, and a trace it reads.
    let gpus_max = FLEET_NODES_MAX * NODE_GPUS;
    if options.gpus > gpus_max {
        return Err(format!(
            "{} GPUs; give at most {gpus_max} ({FLEET_NODES_MAX} nodes of {NODE_GPUS}), the largest fleet `what-if` replays",
            options.gpus
        ));
    }
    let nodes = options.gpus.div_ceil(NODE_GPUS).max(1);
    let gpus = nodes * NODE_GPUS;
    if options.shares as u32 * NODE_GPUS > gpus {
        return Err(format!(
            "{} GPUs cannot give {} shares a node of {NODE_GPUS} GPUs each; give at least {} GPUs or fewer shares",
            options.gpus,
            options.shares,
            options.shares as u32 * NODE_GPUS
        ));
    }
    let mut rng = Rng::new(options.seed);
    let mut sizes = rng.fork();

    // Limits: decreasing weights (the first team is the largest), whole nodes each, adding up
    // to the fleet.
    let weights: Vec<f64> = (0..options.shares)
        .map(|k| 1.0 / ((k + 1) as f64).powf(0.7))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut limits: Vec<u32> = weights
        .iter()
        .map(|w| ((w / total * nodes as f64).floor() as u32).max(1) * NODE_GPUS)
        .collect();
    let given: u32 = limits.iter().sum();
    limits[0] = (limits[0] + gpus).saturating_sub(given).max(NODE_GPUS);

    // Each share's demand against its limit, spread around the load asked for.
    let spread: Vec<f64> = (0..options.shares)
        .map(|_| 0.4 + 1.2 * rng.unit())
        .collect();
    let offered: f64 = spread
        .iter()
        .zip(&limits)
        .map(|(s, l)| s * f64::from(*l))
        .sum();
    let scale = options.load * f64::from(gpus) / offered;

    // The mean GPU-seconds of one job, from draws of a stream of its own.
    let mut probe = rng.fork();
    let mean_gpu_s = {
        let draws = 20_000;
        (0..draws)
            .map(|_| {
                let (g, run, _) = draw_job(&mut probe);
                f64::from(g) * run
            })
            .sum::<f64>()
            / draws as f64
    };

    let horizon_s = options.days * 86_400.0;
    let duty = CAMPAIGN_ON_MEAN_S / (CAMPAIGN_ON_MEAN_S + CAMPAIGN_OFF_MEAN_S);
    let on_boost = 1.0 / (duty + CAMPAIGN_OFF_FACTOR * (1.0 - duty));
    let peak = (1.0 + DIURNAL_AMPLITUDE) / ((5.0 + 2.0 * WEEKEND_FACTOR) / 7.0);

    let mut shares = Vec::new();
    let mut jobs = Vec::new();
    for k in 0..options.shares {
        let name = format!("team-{}", (b'a' + k as u8) as char);
        let strategy = STRATEGIES[k % STRATEGIES.len()];
        shares.push(ShareEntry {
            name: name.clone(),
            strategy,
            limits: BTreeMap::from([(CLASS.to_string(), limits[k])]),
            borrow_limit_percent: None,
            in_share_preemption: k % 2 == 0,
        });
        // Mean arrivals per second, and the highest rate the calendar and campaigns reach.
        let rate = spread[k] * scale * f64::from(limits[k]) / mean_gpu_s;
        let rate_max = rate * on_boost * peak;
        let mut arrivals = rng.fork();
        let mut campaign_on = arrivals.unit() < duty;
        let mut campaign_ends = exponential_s(
            &mut arrivals,
            if campaign_on {
                CAMPAIGN_ON_MEAN_S
            } else {
                CAMPAIGN_OFF_MEAN_S
            },
        );
        let mut t = 0.0;
        let mut n = 0;
        loop {
            t += exponential_s(&mut arrivals, 1.0 / rate_max);
            if t >= horizon_s {
                break;
            }
            while t >= campaign_ends {
                campaign_on = !campaign_on;
                let mean = if campaign_on {
                    CAMPAIGN_ON_MEAN_S
                } else {
                    CAMPAIGN_OFF_MEAN_S
                };
                campaign_ends += exponential_s(&mut arrivals, mean);
            }
            let campaign = if campaign_on {
                1.0
            } else {
                CAMPAIGN_OFF_FACTOR
            };
            let now = rate * on_boost * campaign * calendar_factor(t);
            if arrivals.unit() * rate_max >= now {
                continue;
            }
            let (mut total_gpus, run_s, checkpoint_s) = draw_job(&mut sizes);
            // No team submits a job larger than it can ever hold: its limit, or the fleet
            // if it borrows.
            let most = if strategy.borrows() { gpus } else { limits[k] };
            while total_gpus > most {
                total_gpus /= 2;
            }
            let (gpus, nodes) = if total_gpus > NODE_GPUS {
                (NODE_GPUS, total_gpus / NODE_GPUS)
            } else {
                (total_gpus, 1)
            };
            // Most jobs are routine; some are urgent.
            let priority = match arrivals.range(0, 9) {
                0 => 90,
                1..=3 => 50,
                _ => 10,
            };
            n += 1;
            if jobs.len() == jobs_max {
                return Err(format!(
                    "the workload would hold more than {jobs_max} jobs, the most a trace may hold; give fewer GPUs, days or a lower load"
                ));
            }
            jobs.push(TraceJob {
                submit_s: t.round(),
                share: name.clone(),
                name: Some(format!("{name}-{n}")),
                priority,
                gpus,
                nodes,
                class: Some(CLASS.to_string()),
                run_s,
                checkpoint_s,
            });
        }
    }
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    Ok(Generated {
        shares: SharesFile { share: shares },
        fleet: FleetFile {
            pool: vec![PoolEntry {
                class: CLASS.to_string(),
                nodes,
                gpus_per_node: NODE_GPUS,
                prefix: None,
            }],
        },
        jobs,
    })
}

/// An exponentially distributed span with mean `mean_s` seconds.
fn exponential_s(rng: &mut Rng, mean_s: f64) -> f64 {
    -(1.0 - rng.unit()).ln() * mean_s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seed: u64) -> Generated {
        generate(GenerateOptions {
            seed,
            gpus: 64,
            days: 3.0,
            shares: 4,
            load: 0.9,
        })
        .unwrap()
    }

    #[test]
    fn a_fleet_or_a_workload_beyond_what_the_evaluation_reads_is_refused_at_once() {
        let options = |gpus| GenerateOptions {
            seed: 1,
            gpus,
            days: 1.0,
            shares: 2,
            load: 0.85,
        };
        for gpus in [FLEET_NODES_MAX * NODE_GPUS + 1, u32::MAX] {
            let said = generate(options(gpus)).expect_err("refused");
            assert!(said.contains("give at most 800000"), "{said}");
        }
        let said = generate(options(0)).expect_err("refused");
        assert!(
            said.starts_with("0 GPUs") && said.contains("at least 16"),
            "{said}"
        );
        let said = generate_at_most(options(64), 10).expect_err("refused");
        assert!(said.contains("more than 10 jobs"), "{said}");
    }

    #[test]
    fn a_seed_gives_the_same_files() {
        assert_eq!(small(7), small(7));
        assert_ne!(small(7).jobs, small(8).jobs);
    }

    #[test]
    fn the_design_fills_the_fleet_and_reads_back() {
        let generated = small(3);
        let specs = SharesFile::parse(&generated.shares.to_toml())
            .unwrap()
            .specs()
            .unwrap();
        let nodes = FleetFile::parse(&generated.fleet.to_toml())
            .unwrap()
            .nodes()
            .unwrap();
        let limits: u32 = specs.iter().flat_map(|s| s.limits.values()).sum();
        assert_eq!(limits as usize, nodes.len() * NODE_GPUS as usize);
        let trace = crate::trace::write_trace(&generated.jobs);
        let jobs = crate::trace::parse_trace(&trace).unwrap();
        assert_eq!(jobs.len(), generated.jobs.len());
    }

    #[test]
    fn the_workload_has_the_shape_asked_for() {
        let generated = generate(GenerateOptions {
            seed: 11,
            gpus: 512,
            days: 14.0,
            shares: 6,
            load: 0.8,
        })
        .unwrap();
        let jobs = &generated.jobs;
        assert!(jobs.len() > 1_000, "{} jobs", jobs.len());
        let single = jobs.iter().filter(|j| j.gpus * j.nodes == 1).count();
        let share = single as f64 / jobs.len() as f64;
        assert!((0.5..0.66).contains(&share), "one-GPU jobs: {share}");
        let offered: f64 = jobs
            .iter()
            .map(|j| j.run_s * f64::from(j.gpus * j.nodes))
            .sum();
        let load = offered / (512.0 * 14.0 * 86_400.0);
        assert!((0.55..1.1).contains(&load), "offered load {load}");
        // Weekdays' afternoons see more arrivals than their nights.
        let in_hours = |from: f64, to: f64| {
            jobs.iter()
                .filter(|j| {
                    let day = (j.submit_s / 86_400.0) as u64 % 7;
                    let hour = (j.submit_s % 86_400.0) / 3_600.0;
                    day < 5 && hour >= from && hour < to
                })
                .count()
        };
        assert!(in_hours(12.0, 16.0) > 2 * in_hours(0.0, 4.0));
    }
}
