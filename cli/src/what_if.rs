//! `quotient what-if --shares S --fleet F --trace T [--compare S2]`: replays a workload on a
//! quota design in virtual time, with the real scheduler, and prints how it would fare
//! against static partitioning and the naive victim choice (docs/what-if.md). With
//! `--generate --seed N --out DIR`, writes a synthetic starting point there instead. Needs no
//! cluster: it runs on the admin's machine.

use std::path::{Path, PathBuf};

use anyhow::Context;
use quotient_eval::generate::{generate, GenerateOptions};
use quotient_eval::{
    evaluate, read_design, read_trace, BorrowOrder, Comparison, Options, Policy, RunReport,
};

use crate::output::{OutputFormat, Table};
use crate::GlobalArgs;

/// Arguments of `quotient what-if`.
#[derive(Debug, clap::Args)]
pub struct WhatIfArgs {
    /// The share design to try (TOML; docs/what-if.md).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["generate", "from_history"])]
    pub shares: Option<PathBuf>,
    /// The fleet: pools of alike nodes (TOML).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["generate", "from_history"])]
    pub fleet: Option<PathBuf>,
    /// The workload: one job per line of JSON.
    #[arg(long, value_name = "FILE", required_unless_present_any = ["generate", "from_history"])]
    pub trace: Option<PathBuf>,
    /// A second share design, run on the same fleet and trace, side by side.
    #[arg(long, value_name = "FILE", conflicts_with = "generate")]
    pub compare: Option<PathBuf>,
    /// The policies to run, comma-separated [default: quotient,naive-victims,static].
    #[arg(long, value_delimiter = ',', value_parser = parse_policy, conflicts_with = "generate")]
    pub policy: Vec<Policy>,
    /// Seconds a job takes to exit after its checkpoint signal (at most its grace period).
    #[arg(long, value_name = "SECONDS", default_value_t = 20)]
    pub stop_s: u64,
    /// Who borrows first when idle GPUs are too few: fifo (priority, then submit order: the
    /// coordinators' order), fair (the share holding the least of its limit first), or both
    /// (each policy runs with each).
    #[arg(long, value_name = "ORDER", default_value = "fifo", value_parser = ["fifo", "fair", "both"], conflicts_with = "generate")]
    pub borrow_order: String,
    /// Write a synthetic design and trace into --out instead: shares.toml, fleet.toml and
    /// jobs.jsonl.
    #[arg(long, requires = "out")]
    pub generate: bool,
    /// Turn a file `quotient job history --all -o json` wrote into a trace: --out DIR gets
    /// jobs.jsonl.
    #[arg(
        long,
        value_name = "FILE",
        requires = "out",
        conflicts_with = "generate"
    )]
    pub from_history: Option<PathBuf>,
    /// The folder --generate or --from-history writes into (made if missing; its three files are replaced).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The seed of --generate: the same seed writes the same files.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// --generate: GPUs in the fleet, in nodes of 8.
    #[arg(long, default_value_t = 1_024)]
    pub gpus: u32,
    /// --generate: days of arrivals.
    #[arg(long, default_value_t = 30.0)]
    pub days: f64,
    /// --generate: how many shares.
    #[arg(long, default_value_t = 8)]
    pub share_count: usize,
    /// --generate: GPU time offered, as a fraction of the fleet's.
    #[arg(long, default_value_t = 0.85)]
    pub load: f64,
}

fn parse_policy(text: &str) -> Result<Policy, String> {
    Policy::parse(text)
        .ok_or_else(|| format!("unknown policy {text:?}; give quotient, naive-victims or static"))
}

pub fn run(global: &GlobalArgs, args: &WhatIfArgs) -> anyhow::Result<()> {
    if args.generate {
        return write_generated(global, args);
    }
    if let Some(history) = &args.from_history {
        return write_from_history(global, history, args);
    }
    let (Some(shares), Some(fleet), Some(trace)) = (&args.shares, &args.fleet, &args.trace) else {
        anyhow::bail!("give --shares, --fleet and --trace, or --generate --out DIR");
    };
    let jobs = read_trace(trace)?;
    let mut policies: Vec<Policy> = Vec::new();
    for policy in if args.policy.is_empty() {
        Policy::ALL.as_slice()
    } else {
        args.policy.as_slice()
    } {
        // A policy named twice runs once: its rows would be the same.
        if !policies.contains(policy) {
            policies.push(*policy);
        }
    }
    let orders = match args.borrow_order.as_str() {
        "both" => vec![BorrowOrder::Fifo, BorrowOrder::Fair],
        order => vec![BorrowOrder::parse(order).context("a borrow order clap checked")?],
    };
    let mut runs = Vec::new();
    for design_path in std::iter::once(shares).chain(&args.compare) {
        let design = read_design(design_path, fleet)?;
        if let (count @ 1.., Some(first)) = design.never_fit(&jobs) {
            eprintln!(
                "note: {count} jobs of the trace can never start on this fleet and will count as never started ({first})"
            );
        }
        for policy in &policies {
            for order in &orders {
                // Static partitions borrow nothing: one run is enough.
                if *policy == Policy::Static && *order != orders[0] {
                    continue;
                }
                let options = Options {
                    stop_ms: args.stop_s.saturating_mul(1_000),
                    check: false,
                    borrow_order: *order,
                };
                let mut run = evaluate(&design, &jobs, *policy, options)
                    .with_context(|| format!("replaying on {}", design_path.display()))?;
                run.design = design_path.display().to_string();
                runs.push(run);
            }
        }
    }
    let comparison = Comparison { runs };
    match global.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&comparison)?),
        _ => print!("{}", comparison_table(&comparison)),
    }
    Ok(())
}

fn write_from_history(
    global: &GlobalArgs,
    history: &Path,
    args: &WhatIfArgs,
) -> anyhow::Result<()> {
    let out = args
        .out
        .as_deref()
        .context("--from-history needs --out DIR")?;
    let page = quotient_eval::trace::read_history(history)?;
    let made = quotient_eval::trace::trace_from_history(&page);
    let (jobs, skipped) = (made.jobs, made.never_ran);
    if let Some(first) = &made.first_unusable {
        eprintln!(
            "note: {} records could not be trace lines and were left out; the first, {first}",
            made.unusable
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot make {}", out.display()))?;
    let path = out.join("jobs.jsonl");
    std::fs::write(&path, quotient_eval::trace::write_trace(&jobs))
        .with_context(|| format!("cannot write {}", path.display()))?;
    match global.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::json!({"trace": path.display().to_string(), "jobs": jobs.len(), "skipped": skipped, "unusable": made.unusable})
        ),
        _ => println!(
            "wrote {} jobs to {} ({skipped} records of jobs that never ran left out)",
            jobs.len(),
            path.display()
        ),
    }
    Ok(())
}

fn write_generated(global: &GlobalArgs, args: &WhatIfArgs) -> anyhow::Result<()> {
    let out = args.out.as_deref().context("--generate needs --out DIR")?;
    let generated = generate(GenerateOptions {
        seed: args.seed,
        gpus: args.gpus,
        days: args.days,
        shares: args.share_count,
        load: args.load,
    })
    // Every refusal of the generator is about its options: a usage error (exit 2), as the
    // docs say of a bad flag (found by probing: it was exit 1).
    .map_err(|e| crate::parse::UsageError(format!("cannot generate: {e}")))?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot make {}", out.display()))?;
    // All three are written beside their places first and then renamed, so that a failed
    // write leaves the folder's earlier set whole rather than mixed with the new one.
    let files = [
        ("shares.toml", generated.shares.to_toml()),
        ("fleet.toml", generated.fleet.to_toml()),
        (
            "jobs.jsonl",
            quotient_eval::trace::write_trace(&generated.jobs),
        ),
    ];
    let mut written = Vec::new();
    for (name, text) in files {
        let path = out.join(name);
        let partial = out.join(format!("{name}.partial"));
        if let Err(error) = std::fs::write(&partial, text) {
            for (_, partial) in &written {
                let _ = std::fs::remove_file(partial);
            }
            let _ = std::fs::remove_file(&partial);
            return Err(error).with_context(|| format!("cannot write {}", partial.display()));
        }
        written.push((path, partial));
    }
    for (path, partial) in &written {
        std::fs::rename(partial, path).with_context(|| {
            format!("cannot rename {} to {}", partial.display(), path.display())
        })?;
    }
    let [shares, fleet, trace] = [0, 1, 2].map(|i| written[i].0.clone());
    let gpus: u32 = generated
        .fleet
        .pool
        .iter()
        .map(|p| p.nodes * p.gpus_per_node)
        .sum();
    let shown = |path: &Path| path.display().to_string();
    match global.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::json!({
                "shares": shown(&shares),
                "fleet": shown(&fleet),
                "trace": shown(&trace),
                "jobs": generated.jobs.len(),
                "gpus": gpus,
            })
        ),
        _ => {
            println!(
                "wrote {} jobs over {} days for {} shares on {gpus} GPUs:",
                generated.jobs.len(),
                args.days,
                generated.shares.share.len()
            );
            println!(
                "  {}\n  {}\n  {}",
                shown(&shares),
                shown(&fleet),
                shown(&trace)
            );
            println!(
                "next: quotient what-if --shares {} --fleet {} --trace {}",
                shown(&shares),
                shown(&fleet),
                shown(&trace)
            );
        }
    }
    Ok(())
}

/// The runs side by side, then each run's shares.
fn comparison_table(comparison: &Comparison) -> String {
    let label = |run: &RunReport| {
        let mut label = run.policy.clone();
        if run.borrow_order != "fifo" && !run.borrow_order.is_empty() {
            label.push_str(&format!(", {} borrowing", run.borrow_order));
        }
        if !run.design.is_empty() {
            label.push_str(&format!(" ({})", run.design));
        }
        label
    };
    let hours = |value: f64| format!("{value:.1}");
    let mut runs = Table::new(&[
        "POLICY",
        "UTILISATION",
        "UNDER BACKLOG",
        "USEFUL",
        "LOST GPU-H",
        "OF IT UNCHECKPOINTED",
        "PREEMPTIONS",
        "LOOPS (>3)",
        "RECLAIM P50/P95 S",
        "NEVER STARTED",
    ]);
    for run in &comparison.runs {
        runs.row(vec![
            label(run),
            format!("{:.1}%", run.utilisation * 100.0),
            format!("{:.1}%", run.utilisation_under_backlog * 100.0),
            format!("{:.1}%", run.useful_utilisation * 100.0),
            hours(run.lost_gpu_hours),
            hours(run.lost_gpu_hours_uncheckpointed),
            run.preemptions.to_string(),
            run.jobs_preempted_over_3.to_string(),
            format!(
                "{:.0}/{:.0}",
                run.reclaims.latency_s_p50, run.reclaims.latency_s_p95
            ),
            run.never_started.to_string(),
        ]);
    }
    let mut out = runs.render();
    for run in &comparison.runs {
        out.push_str(&format!(
            "\n{}: {} jobs on {} GPUs, {:.1} h window\n",
            label(run),
            run.jobs,
            run.gpus,
            run.window_hours
        ));
        let mut shares = Table::new(&[
            "SHARE",
            "JOBS",
            "WAIT P50 S",
            "WAIT P95 S",
            "WAIT MAX S",
            "OWN GPU-H",
            "BORROWED GPU-H",
            "LENT GPU-H",
            "PREEMPTIONS",
            "LOST GPU-H",
        ]);
        for (name, share) in &run.shares {
            shares.row(vec![
                name.clone(),
                share.jobs.to_string(),
                format!("{:.0}", share.queue_delay_s_p50),
                format!("{:.0}", share.queue_delay_s_p95),
                format!("{:.0}", share.queue_delay_s_max),
                hours(share.own_gpu_hours),
                hours(share.borrowed_gpu_hours),
                hours(share.lent_gpu_hours),
                share.preemptions.to_string(),
                hours(share.lost_gpu_hours),
            ]);
        }
        out.push_str(&shares.render());
    }
    out
}
