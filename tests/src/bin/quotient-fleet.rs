//! `quotient-fleet`: simulates a fleet of GPU hosts against running coordinators, each node a
//! session of the real agent protocol with a certificate of its own (see
//! `quotient_tests::fleet`). For measuring the coordinators at fleet size; nothing runs on
//! the nodes.
//!
//! ```text
//! quotient dev up --dir /tmp/q --nodes 0
//! quotient-fleet --dev-dir /tmp/q --nodes 10000 --gpus-per-node 8
//! ```
//!
//! Prints the fleet's counters as a JSON line every `--report-every`, until interrupted.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use quotient_common::GpuClass;
use quotient_tests::fleet::{Fleet, FleetConfig};

/// The most bytes of a client.toml read for `--dev-dir`.
const CLIENT_CONFIG_BYTES_MAX: u64 = 64 * 1024;
/// The most nodes one process simulates.
const NODES_MAX: u32 = 100_000;

#[derive(Debug, Parser)]
#[command(
    name = "quotient-fleet",
    about = "Simulate GPU hosts against running coordinators, over the real agent protocol",
    after_help = "Give --dev-dir (a `quotient dev up` folder) or both --coordinators and \
    --ca-dir. Every node gets an agent certificate issued in memory from the CA, so the CA's \
    key must be readable. A job whose spec sets QUOTIENT_FLEET_RUN_MS exits after that many \
    milliseconds (with QUOTIENT_FLEET_EXIT_CODE, default 0); others run until stopped."
)]
struct Args {
    /// A `quotient dev up` folder: its client.toml names the coordinators, its certs/ the CA.
    #[arg(long, value_name = "DIR")]
    dev_dir: Option<PathBuf>,
    /// The coordinators, HOST:PORT separated by commas.
    #[arg(long, value_delimiter = ',')]
    coordinators: Vec<String>,
    /// The folder holding ca.pem and ca-key.pem.
    #[arg(long, value_name = "DIR")]
    ca_dir: Option<PathBuf>,
    /// Nodes to simulate.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=NODES_MAX as i64))]
    nodes: u32,
    /// Simulated GPUs per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus_per_node: u32,
    /// The GPUs' class.
    #[arg(long, default_value = "a10g", value_parser = GpuClass::parse)]
    gpu_class: GpuClass,
    /// Node names are this prefix and a number.
    #[arg(long, default_value = "sim-")]
    prefix: String,
    /// Spread the nodes over K racks (label rack=rack-1 ... rack-K).
    #[arg(long, value_name = "K")]
    racks: Option<u32>,
    /// How long a stopped job takes to exit, in milliseconds.
    #[arg(long, default_value_t = 0)]
    grace_ms: u64,
    /// Seconds over which the nodes first connect [default: one per 1,000 nodes].
    #[arg(long)]
    ramp_s: Option<u64>,
    /// Keep standing connections to the coordinators besides the leader, as the real agent
    /// does, opened over this many seconds after each registration; 0 keeps none.
    #[arg(long, default_value_t = 60)]
    standing_within_s: u64,
    /// Threads the fleet runs on (1: one thread, leaving the other cores to the coordinators).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seconds between two lines of counters.
    #[arg(long, default_value_t = 10)]
    report_every: u64,
}

/// The coordinators and CA folder of a `quotient dev up` folder.
fn from_dev_dir(dir: &std::path::Path) -> anyhow::Result<(Vec<String>, PathBuf)> {
    #[derive(serde::Deserialize)]
    struct ClientToml {
        coordinators: Vec<String>,
        ca: PathBuf,
    }
    let path = dir.join("client.toml");
    let size = std::fs::metadata(&path)
        .with_context(|| {
            format!(
                "cannot read {}: is it a `quotient dev up` folder?",
                path.display()
            )
        })?
        .len();
    anyhow::ensure!(
        size <= CLIENT_CONFIG_BYTES_MAX,
        "{} is {size} bytes; at most {CLIENT_CONFIG_BYTES_MAX}",
        path.display()
    );
    let text = std::fs::read_to_string(&path)?;
    let config: ClientToml = toml::from_str(&text)
        .with_context(|| format!("{} is not a client config", path.display()))?;
    let ca_dir = config
        .ca
        .parent()
        .map(PathBuf::from)
        .context("the client config's ca has no folder")?;
    Ok((config.coordinators, ca_dir))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (coordinators, ca_dir) = match (&args.dev_dir, args.ca_dir.clone()) {
        (Some(dir), None) if args.coordinators.is_empty() => from_dev_dir(dir)?,
        (None, Some(ca_dir)) if !args.coordinators.is_empty() => {
            (args.coordinators.clone(), ca_dir)
        }
        _ => anyhow::bail!("give --dev-dir DIR, or both --coordinators and --ca-dir"),
    };
    let mut config = FleetConfig::new(coordinators, ca_dir, args.nodes, args.gpus_per_node);
    config.gpu_class = args.gpu_class;
    config.prefix = args.prefix;
    config.grace_ms = args.grace_ms;
    if let Some(ramp_s) = args.ramp_s {
        config.ramp_ms = ramp_s * 1_000;
    }
    config.standing_within_ms =
        (args.standing_within_s > 0).then(|| args.standing_within_s.saturating_mul(1_000));
    config.racks = (1..=args.racks.unwrap_or(0))
        .map(|rack| format!("rack-{rack}"))
        .collect();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async move {
        let fleet = Fleet::start(config).await?;
        let mut every = tokio::time::interval(Duration::from_secs(args.report_every.max(1)));
        loop {
            tokio::select! {
                _ = every.tick() => println!("{}", fleet.counters()),
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        fleet.shutdown().await;
        Ok(())
    })
}
