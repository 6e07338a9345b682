//! The command line of `quotient-agent`, parsed with clap and checked into plain config.
//!
//! `quotient-agent inventory` prints the host's GPUs (NVML, or `--simulated-gpus`). Without a
//! subcommand, or with `run`, the flags describe the long-running agent: its node name, the
//! coordinators and its certificate, its state dir, its runtime and its self-fencing lease
//! (before the first registration; then the leader's `agent_lease_ms` applies).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use quotient_common::name::validate_name;

/// Where the agent keeps pid files, checkpoints and logs unless told otherwise.
pub const STATE_DIR_DEFAULT: &str = "/var/lib/quotient-agent";
/// The agent's self-fencing lease: cut off from a leader this long, it stops its jobs. It must
/// stay below the coordinators' node lease, with a margin.
pub const LEASE_DEFAULT_MS: u64 = 10_000;
/// The shortest lease accepted: below it a brief network hiccup would stop every job.
pub const LEASE_MIN_MS: u64 = 500;
/// The most coordinator addresses one agent is given.
pub const COORDINATORS_MAX: usize = 16;

/// Runs the Quotient agent on a GPU host, or prints the host's GPU inventory.
#[derive(Debug, Parser)]
#[command(
    name = "quotient-agent",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct AgentFlags {
    #[command(subcommand)]
    pub command: Option<AgentCommand>,
    #[command(flatten)]
    pub run: RunFlags,
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Print this host's GPUs as the agent would report them.
    Inventory(InventoryFlags),
    /// Run the agent (the same as giving no subcommand).
    Run(Box<RunFlags>),
    /// Watch one container against the agent's lease (the agent starts this itself; see
    /// `runtime::docker`).
    #[command(name = crate::runtime::docker::WATCHDOG_SUBCOMMAND, hide = true)]
    ContainerWatchdog(ContainerWatchdogFlags),
}

/// The flags the agent gives a container's orphan watchdog.
#[derive(Debug, Args)]
pub struct ContainerWatchdogFlags {
    /// The container's id.
    #[arg(long)]
    pub container: String,
    /// The agent's lease file.
    #[arg(long)]
    pub lease_file: PathBuf,
    /// The folder of the watchdogs' lock and log files.
    #[arg(long)]
    pub dir: PathBuf,
    /// The job's checkpoint signal, e.g. SIGUSR1.
    #[arg(long)]
    pub signal: String,
    /// The job's grace period.
    #[arg(long)]
    pub grace_period_ms: u64,
}

/// Output formats: `table` for people, `json` for machines (one document on stdout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

/// Which runtime runs jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// Commands as process groups on the host.
    Process,
    /// Images as Docker containers.
    Docker,
}

#[derive(Debug, Args)]
pub struct InventoryFlags {
    /// Use simulated GPUs instead of NVML, e.g. 8xa10g or 2xa10g,1xh100-80gb.
    #[arg(long, env = "QUOTIENT_SIMULATED_GPUS")]
    pub simulated_gpus: Option<String>,
    /// The node name (simulated GPU UUIDs derive from it); defaults to the host name.
    #[arg(long)]
    pub name: Option<String>,
    /// The state dir whose `unhealthy-gpus` file marks simulated GPUs unhealthy.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct RunFlags {
    /// This node's name (its certificate must name it too); defaults to the host name.
    #[arg(long)]
    pub name: Option<String>,
    /// Coordinator addresses, HOST:PORT, comma-separated or repeated; any subset will do.
    #[arg(long, value_delimiter = ',', env = "QUOTIENT_COORDINATORS")]
    pub coordinators: Vec<String>,
    /// The cluster CA certificate (PEM).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// This agent's certificate (PEM, role agent).
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// This agent's private key (PEM).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Where pid files, checkpoints and logs live.
    #[arg(long, default_value = STATE_DIR_DEFAULT)]
    pub state_dir: PathBuf,
    /// Where jobs' checkpoint dirs live [default: STATE_DIR/checkpoints]. Point every agent at
    /// the same shared storage so that a job preempted on one host resumes on another.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_root: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "process")]
    pub runtime: RuntimeKind,
    /// Self-fencing lease in milliseconds; keep it below the coordinators' node lease.
    #[arg(long, default_value_t = LEASE_DEFAULT_MS)]
    pub lease_ms: u64,
    /// Use simulated GPUs instead of NVML, e.g. 8xa10g.
    #[arg(long, env = "QUOTIENT_SIMULATED_GPUS")]
    pub simulated_gpus: Option<String>,
    /// The only cluster this agent may join (32 hexadecimal digits, from `quotient cluster
    /// status`) [default: the cluster of its first registration, kept in STATE_DIR/cluster-id].
    #[arg(long, env = "QUOTIENT_CLUSTER_ID")]
    pub cluster_id: Option<quotient_common::ClusterId>,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "QUOTIENT_LOG_JSON")]
    pub log_json: bool,
}

/// A checked configuration of the long-running agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    pub name: String,
    pub coordinators: Vec<String>,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub state_dir: PathBuf,
    /// Where jobs' checkpoint dirs live (one per job, kept across attempts).
    pub checkpoint_root: PathBuf,
    pub runtime: RuntimeKind,
    pub lease_ms: u64,
    pub simulated_gpus: Option<String>,
    /// `--cluster-id`: the only cluster this agent may join.
    pub cluster_id: Option<quotient_common::ClusterId>,
}

/// A flag that is missing or wrong, worded to say what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--{0} is required; see --help")]
    Missing(&'static str),
    #[error("--name {name:?}: {problem}")]
    Name { name: String, problem: String },
    #[error("--coordinators: at most {COORDINATORS_MAX} addresses")]
    TooManyCoordinators,
    #[error("--lease-ms {0} is below the minimum of {LEASE_MIN_MS} ms")]
    LeaseTooShort(u64),
    #[error("cannot tell this host's name ({0}); pass --name")]
    HostName(String),
}

impl RunFlags {
    /// Checks the flags into a config.
    pub fn into_config(self) -> Result<AgentConfig, ConfigError> {
        let name = node_name(self.name)?;
        if self.coordinators.is_empty() {
            return Err(ConfigError::Missing("coordinators"));
        }
        if self.coordinators.len() > COORDINATORS_MAX {
            return Err(ConfigError::TooManyCoordinators);
        }
        if self.lease_ms < LEASE_MIN_MS {
            return Err(ConfigError::LeaseTooShort(self.lease_ms));
        }
        Ok(AgentConfig {
            name,
            coordinators: self.coordinators,
            ca: self.ca.ok_or(ConfigError::Missing("ca"))?,
            cert: self.cert.ok_or(ConfigError::Missing("cert"))?,
            key: self.key.ok_or(ConfigError::Missing("key"))?,
            checkpoint_root: self
                .checkpoint_root
                .unwrap_or_else(|| self.state_dir.join("checkpoints")),
            state_dir: self.state_dir,
            runtime: self.runtime,
            lease_ms: self.lease_ms,
            simulated_gpus: self.simulated_gpus,
            cluster_id: self.cluster_id,
        })
    }
}

/// The node name given, or the host name; either must be a valid node name.
pub fn node_name(given: Option<String>) -> Result<String, ConfigError> {
    let name = match given {
        Some(name) => name,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|text| text.trim().to_string())
            .map_err(|error| ConfigError::HostName(error.to_string()))?,
    };
    validate_name("node", &name).map_err(|error| ConfigError::Name {
        name: name.clone(),
        problem: error.to_string(),
    })?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> AgentFlags {
        AgentFlags::try_parse_from(args).unwrap()
    }

    /// The inventory subcommand takes its own flags.
    #[test]
    fn inventory_flags_parse() {
        let flags = parse(&[
            "quotient-agent",
            "inventory",
            "--simulated-gpus",
            "8xa10g",
            "-o",
            "json",
        ]);
        match flags.command {
            Some(AgentCommand::Inventory(inventory)) => {
                assert_eq!(inventory.simulated_gpus.as_deref(), Some("8xa10g"));
                assert_eq!(inventory.output, OutputFormat::Json);
            }
            _ => panic!("inventory expected"),
        }
    }

    /// The run flags are checked, with messages that name the flag.
    #[test]
    fn run_flags_are_checked() {
        let flags = parse(&[
            "quotient-agent",
            "--name",
            "node-1",
            "--coordinators",
            "127.0.0.1:7401,127.0.0.1:7402",
            "--ca",
            "ca.pem",
            "--cert",
            "node-1.pem",
            "--key",
            "node-1-key.pem",
            "--runtime",
            "docker",
            "--lease-ms",
            "3000",
        ]);
        let config = flags.run.into_config().unwrap();
        assert_eq!(config.coordinators.len(), 2);
        assert_eq!(config.runtime, RuntimeKind::Docker);
        assert_eq!(config.lease_ms, 3_000);
        assert_eq!(config.state_dir, PathBuf::from(STATE_DIR_DEFAULT));

        let flags = parse(&["quotient-agent", "--name", "node-1"]);
        assert_eq!(
            flags.run.into_config(),
            Err(ConfigError::Missing("coordinators"))
        );
        let flags = parse(&[
            "quotient-agent",
            "--name",
            "bad name",
            "--coordinators",
            "x:1",
        ]);
        assert!(matches!(
            flags.run.into_config(),
            Err(ConfigError::Name { .. })
        ));
    }
}
