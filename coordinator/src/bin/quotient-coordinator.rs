//! `quotient-coordinator`: parses flags (or a TOML config), sets up structured logging and
//! runs one coordinator until SIGINT or SIGTERM. Everything else lives in the library.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use quotient_common::log_format::LogFormat;
use quotient_coordinator::config::{
    parse_peers, AgentTuning, CoordinatorConfig, RaftTuning, RetentionTuning, SchedulingTuning,
};
use quotient_coordinator::CoordinatorError;
use tracing_subscriber::EnvFilter;

/// mimalloc: less CPU per submit than glibc's malloc under load (docs/architecture.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit status of a bad flag or config file.
const USAGE_EXIT_CODE: i32 = 2;
/// Exit status of a coordinator that failed while starting or running.
const FAILURE_EXIT_CODE: i32 = 1;

/// Runs one Quotient coordinator.
#[derive(Debug, Parser)]
#[command(
    name = "quotient-coordinator",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Flags {
    #[command(subcommand)]
    command: Option<Subcommand>,
    /// A TOML config file with the same fields as the flags; the flags are then not allowed.
    #[arg(long, conflicts_with_all = ["id", "listen", "data_dir", "peers", "ca", "cert", "key"])]
    config: Option<PathBuf>,
    /// This coordinator's Raft id (one of --peers).
    #[arg(long)]
    id: Option<u64>,
    /// The UDP address to serve QUIC on, e.g. 127.0.0.1:7401.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Where the Raft log and snapshots live.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The initial coordinators: ID=HOST:PORT,... (this one included).
    #[arg(long)]
    peers: Option<String>,
    /// The cluster CA certificate (PEM).
    #[arg(long)]
    ca: Option<PathBuf>,
    /// This coordinator's certificate (PEM, role coordinator).
    #[arg(long)]
    cert: Option<PathBuf>,
    /// This coordinator's private key (PEM).
    #[arg(long)]
    key: Option<PathBuf>,
    /// The only cluster this coordinator may belong to (32 hexadecimal digits, as
    /// `quotient cluster init` printed it). Optional; needed once to start on a data
    /// directory written before clusters had ids.
    #[arg(long)]
    cluster_id: Option<quotient_common::ClusterId>,
    /// How often the leader has every replica compare its state with the leader's, in
    /// milliseconds (0: never).
    #[arg(long)]
    digest_check_interval_ms: Option<u64>,
    /// Log entries since the last snapshot that trigger a new snapshot and log compaction.
    #[arg(long)]
    snapshot_logs: Option<u64>,
    /// Log entries kept behind a snapshot.
    #[arg(long)]
    logs_kept_after_snapshot: Option<u64>,
    /// Raft heartbeat interval in milliseconds.
    #[arg(long)]
    heartbeat_ms: Option<u64>,
    /// Raft election timeout lower bound in milliseconds.
    #[arg(long)]
    election_timeout_min_ms: Option<u64>,
    /// Raft election timeout upper bound in milliseconds.
    #[arg(long)]
    election_timeout_max_ms: Option<u64>,
    /// How long an agent runs its jobs without a heartbeat answer from a leader before it
    /// stops them, in milliseconds (told to each agent when it registers).
    #[arg(long)]
    agent_lease_ms: Option<u64>,
    /// How often agents send heartbeats, in milliseconds (told to each agent).
    #[arg(long)]
    agent_heartbeat_ms: Option<u64>,
    /// What the leader adds to the agent lease and the largest grace period of a node's jobs
    /// before it marks a silent node lost, in milliseconds (default 5000, at least 3000: a
    /// dead agent's jobs are stopped by their watchdogs up to 2.5 s after its lease ran out).
    #[arg(long)]
    node_lease_margin_ms: Option<u64>,
    /// The node label a job of several nodes is placed in as few values of as fit it
    /// (default: rack).
    #[arg(long)]
    topology_key: Option<String>,
    /// How long all members of a job of several nodes may take to run before its attempt is
    /// stopped and it goes back to the queue, in milliseconds (default: 300000).
    #[arg(long)]
    gang_start_timeout_ms: Option<u64>,
    /// Who borrows idle GPUs first when they are too few for every share that wants them:
    /// fifo (priority, then submit order) or fair (the share holding the least of its limit
    /// first) (default: fifo).
    #[arg(long, value_parser = parse_borrow_order)]
    borrow_order: Option<quotient_core::BorrowOrder>,
    /// How long a finished job stays in the live state after its end, e.g. 7d or 12h
    /// (default 7d); the job history keeps it longer.
    #[arg(long, value_parser = quotient_common::duration::parse_duration_ms)]
    retain_finished: Option<u64>,
    /// The most finished jobs kept in the live state; the ones that ended first go first
    /// (default 100000).
    #[arg(long)]
    retain_finished_max: Option<u64>,
    /// How long a submit's idempotency key outlives its removed job, e.g. 24h (default 24h).
    #[arg(long, value_parser = quotient_common::duration::parse_duration_ms)]
    idempotency_window: Option<u64>,
    /// How long the job history keeps a finished job's record, e.g. 400d (default 400d).
    #[arg(long, value_parser = quotient_common::duration::parse_duration_ms)]
    retain_history: Option<u64>,
    /// How long the shares' hourly usage is kept, e.g. 35d (default 35d).
    #[arg(long, value_parser = quotient_common::duration::parse_duration_ms)]
    retain_usage: Option<u64>,
    /// Serve Prometheus metrics (`/metrics`) and health (`/healthz`, `/readyz`) over plain
    /// HTTP on this address, e.g. 0.0.0.0:9400.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Serve the AWS Batch–compatible API over HTTPS (the coordinator's certificate) on
    /// this address, e.g. 0.0.0.0:9443.
    #[arg(long, value_name = "ADDR")]
    aws_listen: Option<SocketAddr>,
    /// The region AWS clients' signatures must be scoped to (default us-east-1).
    #[arg(long, value_name = "REGION")]
    aws_region: Option<String>,
    /// An instance type for quota shares and training jobs, NAME=CLASS:GPUS (e.g.
    /// ml.g5.xlarge=a10g:1); adds to or replaces the defaults. Repeatable.
    #[arg(long, value_name = "NAME=CLASS:GPUS")]
    aws_instance_type: Vec<String>,
    /// How to write logs: text, or json (one JSON object per line).
    #[arg(long, value_name = "FORMAT", env = "QUOTIENT_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    /// Log as JSON lines instead of text (the same as --log-format json).
    #[arg(long, env = "QUOTIENT_LOG_JSON")]
    log_json: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Subcommand {
    /// Make an empty data directory hold the state of a backup (`quotient cluster backup`)
    /// as member ID of a new cluster of --peers: run it for every member with the same
    /// backup and --peers, then start them; they elect a leader without `cluster init`.
    Restore(RestoreFlags),
    /// Print what a data directory's Raft log holds: the vote, the committed id, and one
    /// line per entry with its commands; with --digests, the state's digest after every
    /// digest check, replayed from the first entry. Run it on a stopped member's data
    /// directory or a copy (opening the log cuts off a write torn by a crash, as a start does).
    Log(LogFlags),
}

#[derive(Debug, clap::Args)]
struct LogFlags {
    /// The data directory whose log to print.
    #[arg(long)]
    data_dir: PathBuf,
    /// Print the entries from this index on.
    #[arg(long, default_value = "0")]
    from: u64,
    /// Print the entries up to this index.
    #[arg(long)]
    to: Option<u64>,
    /// Replay the entries from the first and print the state's digest after every digest
    /// check, to compare members.
    #[arg(long)]
    digests: bool,
}

/// `quotient-coordinator log`.
fn print_log(flags: LogFlags) -> ! {
    let mut out = std::io::stdout().lock();
    let printed = runtime().block_on(quotient_coordinator::inspect::print_log(
        &flags.data_dir,
        flags.from,
        flags.to,
        flags.digests,
        &mut out,
    ));
    match printed {
        Ok(()) => std::process::exit(0),
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::exit(FAILURE_EXIT_CODE);
        }
    }
}

#[derive(Debug, clap::Args)]
struct RestoreFlags {
    /// The backup file `quotient cluster backup --out` wrote.
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// The data directory to fill; it must hold no coordinator's data.
    #[arg(long)]
    data_dir: PathBuf,
    /// This member's Raft id (one of --peers).
    #[arg(long)]
    id: u64,
    /// Every member of the restored cluster: ID=HOST:PORT,... (this one included).
    #[arg(long)]
    peers: String,
}

/// The async runtime, or exit saying why there is none.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap_or_else(|error| {
        eprintln!("error: cannot start the async runtime: {error}");
        std::process::exit(FAILURE_EXIT_CODE);
    })
}

/// `quotient-coordinator restore`.
fn restore(flags: RestoreFlags) -> ! {
    let peers = match parse_peers(&flags.peers) {
        Ok(peers) => peers,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(USAGE_EXIT_CODE);
        }
    };
    let restored = runtime().block_on(quotient_coordinator::backup::restore(
        &flags.from,
        &flags.data_dir,
        flags.id,
        &peers,
    ));
    match restored {
        Ok(restored) => {
            println!(
                "restored the state of cluster {} up to log index {} into {} as member {} of {:?}; start the members now",
                restored.cluster,
                restored.last_log_index,
                flags.data_dir.display(),
                flags.id,
                restored.members
            );
            std::process::exit(0);
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(FAILURE_EXIT_CODE);
        }
    }
}

impl Flags {
    fn into_config(self) -> Result<CoordinatorConfig> {
        let mut config = match &self.config {
            Some(path) => CoordinatorConfig::from_file(path)?,
            None => {
                let missing = |flag: &str| {
                    anyhow::anyhow!("--{flag} is required (or pass --config FILE); see --help")
                };
                CoordinatorConfig {
                    id: self.id.ok_or_else(|| missing("id"))?,
                    listen: self.listen.ok_or_else(|| missing("listen"))?,
                    data_dir: self.data_dir.clone().ok_or_else(|| missing("data-dir"))?,
                    peers: parse_peers(self.peers.as_deref().ok_or_else(|| missing("peers"))?)?,
                    ca: self.ca.clone().ok_or_else(|| missing("ca"))?,
                    cert: self.cert.clone().ok_or_else(|| missing("cert"))?,
                    key: self.key.clone().ok_or_else(|| missing("key"))?,
                    cluster_id: None,
                    raft: RaftTuning::default(),
                    agents: AgentTuning::default(),
                    scheduling: SchedulingTuning::default(),
                    retention: RetentionTuning::default(),
                    metrics_listen: None,
                    aws: Default::default(),
                }
            }
        };
        if self.cluster_id.is_some() {
            config.cluster_id = self.cluster_id;
        }
        if self.metrics_listen.is_some() {
            config.metrics_listen = self.metrics_listen;
        }
        if self.aws_listen.is_some() {
            config.aws.listen = self.aws_listen;
        }
        if let Some(region) = &self.aws_region {
            config.aws.region = region.clone();
        }
        config
            .aws
            .instance_types
            .extend(self.aws_instance_type.iter().cloned());
        let tuning = &mut config.raft;
        if let Some(value) = self.digest_check_interval_ms {
            tuning.digest_check_interval_ms = value;
        }
        if let Some(value) = self.snapshot_logs {
            tuning.snapshot_logs = value;
        }
        if let Some(value) = self.logs_kept_after_snapshot {
            tuning.logs_kept_after_snapshot = value;
        }
        if let Some(value) = self.heartbeat_ms {
            tuning.heartbeat_interval_ms = value;
        }
        if let Some(value) = self.election_timeout_min_ms {
            tuning.election_timeout_min_ms = value;
        }
        if let Some(value) = self.election_timeout_max_ms {
            tuning.election_timeout_max_ms = value;
        }
        let agents = &mut config.agents;
        if let Some(value) = self.agent_lease_ms {
            agents.agent_lease_ms = value;
        }
        if let Some(value) = self.agent_heartbeat_ms {
            agents.agent_heartbeat_ms = value;
        }
        if let Some(value) = self.node_lease_margin_ms {
            agents.node_lease_margin_ms = value;
        }
        if let Some(key) = self.topology_key {
            quotient_common::node::check_label_key(&key)
                .map_err(|e| anyhow::anyhow!("--topology-key: {e}"))?;
            config.scheduling.topology_key = key;
        }
        if let Some(value) = self.gang_start_timeout_ms {
            config.scheduling.gang_start_timeout_ms = value;
        }
        if let Some(order) = self.borrow_order {
            config.scheduling.borrow_order = order;
        }
        if let Some(value) = self.retain_finished {
            config.retention.finished_ms = value;
        }
        if let Some(value) = self.retain_finished_max {
            config.retention.finished_max = value;
        }
        if let Some(value) = self.idempotency_window {
            config.retention.idempotency_window_ms = value;
        }
        if let Some(value) = self.retain_usage {
            config.retention.usage_ms = value;
        }
        if let Some(value) = self.retain_history {
            config.retention.history_ms = value;
        }
        config.validate()?;
        Ok(config)
    }
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn,quinn=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log file or a pipe gets plain text.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        );
    if format == LogFormat::Json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// What to do about an error that stopped the coordinator.
fn hint(error: &CoordinatorError) -> &'static str {
    match error {
        CoordinatorError::RaftStopped(_) => {
            "the coordinator stopped serving because its Raft node did; fix what the error \
             names (a full or failing disk, say) and start it again: it recovers from its data \
             directory and catches up from the others"
        }
        CoordinatorError::Identity(_) => {
            "the data directory does not belong to this coordinator of this cluster; the error \
             says what to do (docs/operations.md: data directories)"
        }
        _ => "check the certificate files, the listen address and the data directory",
    }
}

fn main() {
    let mut flags = Flags::parse();
    init_tracing(LogFormat::chosen(flags.log_format, flags.log_json));
    match flags.command.take() {
        Some(Subcommand::Restore(restore_flags)) => restore(restore_flags),
        Some(Subcommand::Log(log_flags)) => print_log(log_flags),
        None => {}
    }
    let config = match flags.into_config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error:#}");
            eprintln!("hint: see `quotient-coordinator --help` for the flags and the config file");
            std::process::exit(USAGE_EXIT_CODE);
        }
    };
    let id = config.id;
    if let Err(error) = runtime().block_on(quotient_coordinator::run(config, shutdown_signal())) {
        eprintln!("error: coordinator {id} failed: {error}");
        eprintln!("hint: {}", hint(&error));
        std::process::exit(FAILURE_EXIT_CODE);
    }
}

fn parse_borrow_order(text: &str) -> Result<quotient_core::BorrowOrder, String> {
    quotient_core::BorrowOrder::parse(text)
        .ok_or_else(|| format!("unknown borrow order {text:?}; give fifo or fair"))
}
