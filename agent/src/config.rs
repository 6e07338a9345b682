//! The command line of `quotient-agent`, parsed with clap and checked into plain config.
//!
//! `quotient-agent inventory` prints the host's GPUs (NVML, or `--simulated-gpus`). Without a
//! subcommand, or with `run`, the flags describe the long-running agent: its node name, the
//! coordinators and its certificate, its state dir, its runtime and its self-fencing lease
//! (before the first registration; then the leader's `agent_lease_ms` applies).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use quotient_common::duration::parse_duration_ms;
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
/// Each attempt's log keeps at most this much on disk unless told otherwise (16 MiB): far
/// more than anyone reads through `quotient job logs`, small enough that a week of attempts
/// on a busy host fits its disk. See [`crate::disk`].
pub const LOG_MAX_BYTES_DEFAULT: &str = "16MiB";
/// The smallest log cap accepted: the kept start and end are whole filesystem blocks
/// (4 KiB), and each should hold more than a few lines.
pub const LOG_MAX_BYTES_MIN: u64 = 64 * 1024;
/// How long the logs and checkpoint dirs of a job are kept after this node last ran it,
/// unless told otherwise: a week, so that a failure is still readable after a long weekend
/// and a job preempted here and placed here again within the week resumes from its
/// checkpoint.
pub const RETENTION_DEFAULT: &str = "7d";
/// The longest retention accepted, in days (ten years: "never" is `off`).
pub const RETENTION_MAX_DAYS: u64 = 3_650;

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

/// Which runtimes run jobs. Each job picks its own: one with an image runs as a Docker
/// container, one without as a process group on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// Process jobs always, container jobs when Docker is reachable (the default).
    Auto,
    /// Process jobs only: a job with an image fails to launch here (the node's fault, so it is
    /// placed on another node).
    Process,
    /// Like auto, but the agent refuses to start when Docker is not reachable.
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
    /// Which jobs this node runs: auto runs process jobs, and container jobs (those with an
    /// image) when Docker is reachable; process refuses container jobs; docker is auto that
    /// refuses to start without Docker.
    #[arg(long, value_enum, default_value = "auto")]
    pub runtime: RuntimeKind,
    /// The user jobs run as (processes and containers). Required when the agent runs as root,
    /// unless --allow-root-jobs; otherwise jobs run as the agent's own user.
    #[arg(long, value_name = "USER", env = "QUOTIENT_AGENT_JOB_USER")]
    pub job_user: Option<String>,
    /// Let jobs run as root when the agent runs as root and no --job-user is given (containers
    /// then run as their image's user).
    #[arg(long, env = "QUOTIENT_AGENT_ALLOW_ROOT_JOBS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_root_jobs: bool,
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
    /// Log as JSON lines instead of text (the same as --log-format json).
    #[arg(long, env = "QUOTIENT_LOG_JSON")]
    pub log_json: bool,
    /// How to write logs: text, or json (one JSON object per line).
    #[arg(long, value_name = "FORMAT", env = "QUOTIENT_LOG_FORMAT")]
    pub log_format: Option<quotient_common::log_format::LogFormat>,
    /// Serve Prometheus metrics (`/metrics`) and health (`/healthz`, `/readyz`) over plain
    /// HTTP on this address, e.g. 0.0.0.0:9401.
    #[arg(long, value_name = "ADDR", env = "QUOTIENT_AGENT_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The most one attempt's log keeps on disk, e.g. 16MiB, 512KiB or 1048576: past it the
    /// first quarter and the newest three quarters stay and the middle is dropped.
    #[arg(long, value_name = "SIZE", default_value = LOG_MAX_BYTES_DEFAULT, value_parser = parse_log_max_bytes, env = "QUOTIENT_AGENT_LOG_MAX_BYTES")]
    pub log_max_bytes: u64,
    /// How long a job's logs are kept after this node last ran it, e.g. 7d, 12h or 30m; `off`
    /// keeps them forever.
    #[arg(long, value_name = "DURATION", default_value = RETENTION_DEFAULT, value_parser = parse_retention, env = "QUOTIENT_AGENT_LOG_RETENTION")]
    pub log_retention: Retention,
    /// How long a job's checkpoint dir is kept after this node last ran it, e.g. 7d, or `off`
    /// [default: 7d; off with --checkpoint-root, which may be shared: another node may still
    /// run the job].
    #[arg(long, value_name = "DURATION", value_parser = parse_retention, env = "QUOTIENT_AGENT_CHECKPOINT_RETENTION")]
    pub checkpoint_retention: Option<Retention>,
    /// The CPUs this node offers jobs, e.g. 60 or 7.5 [default: the CPUs the agent may use:
    /// online CPUs, or its cgroup's CPU quota if lower]. Set it lower to keep some for the
    /// host.
    #[arg(long, value_name = "N", value_parser = parse_cpus, env = "QUOTIENT_AGENT_CPUS")]
    pub cpus: Option<u32>,
    /// The memory this node offers jobs, e.g. 480GiB [default: MemTotal, or the agent's
    /// cgroup's memory limit if lower]. Set it lower to keep some for the host.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory, env = "QUOTIENT_AGENT_MEMORY")]
    pub memory: Option<u64>,
    /// The most processes and threads one job may have (a cgroup's `pids.max`, Docker's
    /// `--pids-limit`), so that a fork bomb cannot take every process id of the host; 0: no
    /// limit [default: a quarter of the kernel's pid_max, at least 1024].
    #[arg(long, value_name = "N", env = "QUOTIENT_AGENT_JOB_PIDS_MAX")]
    pub job_pids_max: Option<u64>,
    /// Keep an idle connection open to every coordinator, opening the missing ones at a
    /// random moment within this long after registering, e.g. 60s or 2m; `off` keeps only the
    /// leader's. A failover then needs no new TLS handshake: the agent registers with the new
    /// leader over the connection it has.
    #[arg(long, value_name = "DURATION", default_value = STANDING_WITHIN_DEFAULT, value_parser = parse_standing_within, env = "QUOTIENT_AGENT_STANDING_CONNECTIONS_WITHIN")]
    pub standing_connections_within: StandingWithin,
    /// How often the agent looks again at its images and Docker, in ms (tests shorten it).
    #[arg(long, default_value_t = crate::host_info::HOST_RECHECK_MS, hide = true)]
    pub host_recheck_ms: u64,
    /// A label of this node, KEY=VALUE (e.g. rack=r3 or block=b1): its place in the topology,
    /// shown in `node list`. Repeat for several (at most 16).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = quotient_common::node::parse_label)]
    pub labels: Vec<(String, String)>,
    /// The address other nodes' jobs reach this node's jobs at (an IP or a DNS name)
    /// [default: this host's address on the route to the first coordinator].
    #[arg(long, value_name = "ADDRESS", env = "QUOTIENT_AGENT_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
}

/// How long files are kept: a number of milliseconds, or forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// `None`: kept forever (`off`).
    pub after_ms: Option<u64>,
}

impl Retention {
    /// Kept forever.
    pub const OFF: Retention = Retention { after_ms: None };

    /// Kept for `ms` milliseconds.
    pub fn after_ms(ms: u64) -> Retention {
        Retention { after_ms: Some(ms) }
    }
}

/// Parses a retention: `off`, or a whole number with s, m, h or d, e.g. `7d`.
pub fn parse_retention(text: &str) -> Result<Retention, String> {
    if text == "off" {
        return Ok(Retention::OFF);
    }
    let hint = || {
        format!(
            "invalid retention {text:?}: write a whole number with s, m, h or d (e.g. 7d), or off"
        )
    };
    let unit_ms = match text.chars().last() {
        Some('s') => 1_000,
        Some('m') => 60_000,
        Some('h') => 3_600_000,
        Some('d') => 86_400_000,
        _ => return Err(hint()),
    };
    let number = &text[..text.len() - 1];
    if number.is_empty() || !number.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(hint());
    }
    let ms = number
        .parse::<u64>()
        .ok()
        .and_then(|number| number.checked_mul(unit_ms))
        .filter(|ms| *ms <= RETENTION_MAX_DAYS * 86_400_000)
        .ok_or_else(|| {
            format!("retention {text:?} is over {RETENTION_MAX_DAYS} days; write off to keep files forever")
        })?;
    if ms == 0 {
        return Err(format!(
            "retention {text:?} would remove a job's files as soon as it ends; write at least 1s, or off"
        ));
    }
    Ok(Retention::after_ms(ms))
}

/// The default of `--standing-connections-within`
/// ([`crate::session::STANDING_WITHIN_DEFAULT_MS`]).
pub const STANDING_WITHIN_DEFAULT: &str = "60s";
/// The longest `--standing-connections-within`.
pub const STANDING_WITHIN_MAX_S: u64 = 3_600;

/// `--standing-connections-within`: `None` keeps no standing connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandingWithin(pub Option<Duration>);

/// Parses `off`, or a duration (`90s`, `2m`; [`parse_duration_ms`]) of 1 s to 1 h.
pub fn parse_standing_within(text: &str) -> Result<StandingWithin, String> {
    if text == "off" {
        return Ok(StandingWithin(None));
    }
    let hint = || {
        format!("invalid duration {text:?}: write a duration from 1s to {STANDING_WITHIN_MAX_S}s (e.g. 60s, 2m), or off")
    };
    let ms = parse_duration_ms(text).map_err(|_| hint())?;
    if !(1_000..=STANDING_WITHIN_MAX_S * 1_000).contains(&ms) {
        return Err(hint());
    }
    Ok(StandingWithin(Some(Duration::from_millis(ms))))
}

/// Parses a log cap: bytes, or a whole number with KiB, MiB or GiB; at least
/// [`LOG_MAX_BYTES_MIN`].
pub fn parse_log_max_bytes(text: &str) -> Result<u64, String> {
    let hint = || {
        format!("invalid size {text:?}: write bytes, or a whole number with KiB, MiB or GiB (e.g. 16MiB)")
    };
    let (number, unit) = [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)]
        .into_iter()
        .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|number| (number, unit)))
        .unwrap_or((text, 1));
    if number.is_empty() || !number.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(hint());
    }
    let bytes = number
        .parse::<u64>()
        .ok()
        .and_then(|number| number.checked_mul(unit))
        .ok_or_else(hint)?;
    if bytes < LOG_MAX_BYTES_MIN {
        return Err(format!(
            "log cap {text:?} is below the minimum of {} KiB",
            LOG_MAX_BYTES_MIN >> 10
        ));
    }
    Ok(bytes)
}

/// The most CPUs `--cpus` takes (CPUs are reported in thousandths in a `u32`).
pub const CPUS_MAX: u32 = 1_000_000;

/// Parses `--cpus`: a positive number of CPUs with at most three decimals, into thousandths.
pub fn parse_cpus(text: &str) -> Result<u32, String> {
    let hint = || format!("invalid CPU count {text:?}: write a positive number, e.g. 60 or 7.5");
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || fraction.len() > 3
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(hint());
    }
    let whole: u64 = whole.parse().map_err(|_| hint())?;
    let fraction: u64 = format!("{fraction:0<3}").parse().map_err(|_| hint())?;
    let millis = whole
        .checked_mul(1_000)
        .and_then(|millis| millis.checked_add(fraction))
        .filter(|millis| *millis <= u64::from(CPUS_MAX) * 1_000)
        .ok_or_else(|| format!("CPU count {text:?} is over {CPUS_MAX}"))?;
    if millis == 0 {
        return Err(format!(
            "CPU count {text:?}: a node offers at least 0.001 CPUs"
        ));
    }
    Ok(millis as u32)
}

/// Parses `--memory`: bytes, or a whole number with KiB, MiB, GiB or TiB; more than 0.
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let hint = || {
        format!("invalid size {text:?}: write bytes, or a whole number with KiB, MiB, GiB or TiB (e.g. 480GiB)")
    };
    let (number, unit) = [
        ("KiB", 1u64 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
    ]
    .into_iter()
    .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|number| (number, unit)))
    .unwrap_or((text, 1));
    if number.is_empty() || !number.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(hint());
    }
    let bytes = number
        .parse::<u64>()
        .ok()
        .and_then(|number| number.checked_mul(unit))
        .ok_or_else(hint)?;
    if bytes == 0 {
        return Err(format!("memory {text:?}: a node offers more than 0 bytes"));
    }
    Ok(bytes)
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
    /// What the agent keeps of its jobs' files, and for how long ([`crate::disk`]).
    pub disk: DiskSettings,
    /// `--job-user`, resolved at start by [`resolve_job_user`].
    pub job_user: Option<String>,
    /// `--allow-root-jobs`.
    pub allow_root_jobs: bool,
    /// `--cpus`, in thousandths: what the node reports instead of what it detects.
    pub cpu_millis: Option<u32>,
    /// `--memory`, in bytes: what the node reports instead of what it detects.
    pub memory_bytes: Option<u64>,
    /// `--job-pids-max` as given (0: no limit; `None`: the default, see
    /// [`crate::runtime::cgroup::default_pids_max`]).
    pub job_pids_max: Option<u64>,
    /// How often the agent looks again at its images and Docker.
    pub host_recheck_ms: u64,
    /// `--label`s, by key.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `--advertise-address`, if given.
    pub advertise_address: Option<String>,
    /// `--metrics-listen`, if given ([`crate::metrics`]).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `--standing-connections-within` ([`crate::session`], "Standing connections").
    pub standing_within: Option<Duration>,
}

/// Why the agent will not run jobs as the user it was told (or not told).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JobUserError {
    #[error("the agent runs as root and would run every job as root: pass --job-user USER (an unprivileged user jobs run as, e.g. one made with `useradd --system quotient-job`), or --allow-root-jobs to run them as root")]
    RootWithoutChoice,
    #[error("--job-user {0:?}: no such user on this host (getent passwd {0})")]
    Unknown(String),
    #[error("--job-user {0:?}: the agent runs as uid {1}, which cannot run jobs as another user; run it as root, or drop --job-user to run jobs as the agent's own user")]
    NotPermitted(String, u32),
}

/// Who jobs run as: `--job-user` (looked up with `lookup`); without it the agent's own user,
/// but root only with `--allow-root-jobs`. `agent_uid` is the agent's effective uid.
pub fn resolve_job_user(
    job_user: Option<&str>,
    allow_root_jobs: bool,
    agent_uid: u32,
    lookup: impl Fn(&str) -> Option<crate::runtime::JobUser>,
    current: impl Fn() -> crate::runtime::JobUser,
) -> Result<crate::runtime::JobUser, JobUserError> {
    match job_user {
        Some(crate::runtime::PER_JOB) if agent_uid != 0 => Err(JobUserError::NotPermitted(
            crate::runtime::PER_JOB.to_string(),
            agent_uid,
        )),
        Some(crate::runtime::PER_JOB) => Ok(crate::runtime::JobUser::per_job()),
        Some(name) => {
            let user = lookup(name).ok_or_else(|| JobUserError::Unknown(name.to_string()))?;
            if agent_uid != 0 && user.uid != agent_uid {
                return Err(JobUserError::NotPermitted(name.to_string(), agent_uid));
            }
            Ok(user)
        }
        None if agent_uid == 0 && !allow_root_jobs => Err(JobUserError::RootWithoutChoice),
        None => Ok(current()),
    }
}

/// What the agent keeps of its jobs' logs and checkpoint dirs ([`crate::disk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSettings {
    /// The most one attempt's log keeps on disk.
    pub log_max_bytes: u64,
    pub log_retention: Retention,
    pub checkpoint_retention: Retention,
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
    #[error("--label: {0}")]
    Labels(String),
    #[error(
        "--advertise-address {0:?}: give an IP address or a DNS name (1-253 bytes, no spaces)"
    )]
    AdvertiseAddress(String),
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
        let mut labels = std::collections::BTreeMap::new();
        for (key, value) in &self.labels {
            if labels.insert(key.clone(), value.clone()).is_some() {
                return Err(ConfigError::Labels(format!("{key} is given twice")));
            }
        }
        if labels.len() > quotient_common::node::NODE_LABELS_MAX {
            return Err(ConfigError::Labels(format!(
                "{} labels, at most {}",
                labels.len(),
                quotient_common::node::NODE_LABELS_MAX
            )));
        }
        if let Some(address) = &self.advertise_address {
            let valid = !address.is_empty()
                && address.len() <= quotient_common::node::ADDRESS_BYTES_MAX
                && !address
                    .bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control());
            if !valid {
                return Err(ConfigError::AdvertiseAddress(address.clone()));
            }
        }
        // A checkpoint root of its own choosing may be shared storage, where another node may
        // run the job now: this agent cannot tell, so it keeps the dirs unless told.
        let checkpoint_retention = self.checkpoint_retention.unwrap_or_else(|| {
            if self.checkpoint_root.is_some() {
                Retention::OFF
            } else {
                parse_retention(RETENTION_DEFAULT).expect("the default retention parses")
            }
        });
        let disk = DiskSettings {
            log_max_bytes: self.log_max_bytes,
            log_retention: self.log_retention,
            checkpoint_retention,
        };
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
            disk,
            job_user: self.job_user,
            allow_root_jobs: self.allow_root_jobs,
            cpu_millis: self.cpus,
            memory_bytes: self.memory,
            job_pids_max: self.job_pids_max,
            host_recheck_ms: self.host_recheck_ms.max(100),
            labels,
            advertise_address: self.advertise_address.clone(),
            metrics_listen: self.metrics_listen,
            standing_within: self.standing_connections_within.0,
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

    /// The least a `run` needs, then `extra`.
    fn run_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "quotient-agent",
            "--name",
            "node-1",
            "--coordinators",
            "x:1",
            "--ca",
            "ca.pem",
            "--cert",
            "c.pem",
            "--key",
            "k.pem",
        ];
        args.extend_from_slice(extra);
        args
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

        assert_eq!(
            config.disk,
            DiskSettings {
                log_max_bytes: 16 << 20,
                log_retention: Retention::after_ms(7 * 86_400_000),
                checkpoint_retention: Retention::after_ms(7 * 86_400_000),
            }
        );

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

    /// Labels are kept by key, a key given twice and a bad address are refused.
    #[test]
    fn labels_and_the_advertised_address_are_checked() {
        let with = |extra: &[&str]| parse(&run_args(extra)).run.into_config();
        let config = with(&["--label", "rack=r3", "--advertise-address", "10.0.0.7"]).unwrap();
        assert_eq!(config.labels["rack"], "r3");
        assert_eq!(config.advertise_address.as_deref(), Some("10.0.0.7"));
        assert!(matches!(
            with(&["--label", "rack=r3", "--label", "rack=r4"]),
            Err(ConfigError::Labels(_))
        ));
        assert!(matches!(
            with(&["--advertise-address", "two words"]),
            Err(ConfigError::AdvertiseAddress(_))
        ));
        assert!(
            AgentFlags::try_parse_from(run_args(&["--label", "rack"])).is_err(),
            "KEY=VALUE is needed"
        );
    }

    /// Without a flag the runtime is auto; --job-user and --allow-root-jobs are kept.
    #[test]
    fn runtime_defaults_to_auto_and_job_user_flags_parse() {
        let config = parse(&run_args(&[])).run.into_config().unwrap();
        assert_eq!(config.runtime, RuntimeKind::Auto);
        assert_eq!(config.job_user, None);
        assert!(!config.allow_root_jobs);
        let args = run_args(&[
            "--job-user",
            "nobody",
            "--allow-root-jobs",
            "--runtime",
            "process",
        ]);
        let config = parse(&args).run.into_config().unwrap();
        assert_eq!(config.runtime, RuntimeKind::Process);
        assert_eq!(config.job_user.as_deref(), Some("nobody"));
        assert!(config.allow_root_jobs);
    }

    /// Root runs jobs as root only when told; a named user must exist, and only root may
    /// switch to another user.
    #[test]
    fn the_job_user_is_never_root_by_accident() {
        use crate::runtime::JobUser;
        let user = |name: &str, uid: u32| JobUser {
            name: name.to_string(),
            uid,
            gid: uid,
            per_job: false,
        };
        let lookup = |name: &str| (name == "trainer").then(|| user("trainer", 1500));
        // A uid per job, for a root agent only; each job's own, the same on every call.
        let per_job = resolve_job_user(Some("per-job"), false, 0, lookup, || user("root", 0));
        let per_job = per_job.unwrap();
        let first = per_job.for_job(quotient_common::JobId(7));
        assert_eq!(
            (first.uid, first.gid),
            (crate::runtime::PER_JOB_UID_FIRST + 7, first.uid)
        );
        assert_eq!(per_job.for_job(quotient_common::JobId(7)), first);
        assert_ne!(per_job.for_job(quotient_common::JobId(8)).uid, first.uid);
        assert!(first.differs_from_agent() || unsafe { libc::geteuid() } == first.uid);
        assert!(matches!(
            resolve_job_user(Some("per-job"), false, 1000, lookup, || user("alice", 1000)),
            Err(JobUserError::NotPermitted(_, 1000))
        ));
        let as_root = || user("root", 0);
        let as_alice = || user("alice", 1000);
        assert_eq!(
            resolve_job_user(None, false, 0, lookup, as_root),
            Err(JobUserError::RootWithoutChoice)
        );
        assert!(JobUserError::RootWithoutChoice
            .to_string()
            .contains("--job-user USER"));
        assert_eq!(
            resolve_job_user(None, true, 0, lookup, as_root),
            Ok(user("root", 0))
        );
        assert_eq!(
            resolve_job_user(Some("trainer"), false, 0, lookup, as_root),
            Ok(user("trainer", 1500))
        );
        assert_eq!(
            resolve_job_user(Some("ghost"), false, 0, lookup, as_root),
            Err(JobUserError::Unknown("ghost".into()))
        );
        assert_eq!(
            resolve_job_user(None, false, 1000, lookup, as_alice),
            Ok(user("alice", 1000))
        );
        assert_eq!(
            resolve_job_user(Some("trainer"), false, 1000, lookup, as_alice),
            Err(JobUserError::NotPermitted("trainer".into(), 1000))
        );
    }

    /// Log caps and retentions parse with their units, and bad ones say what to write.
    #[test]
    fn disk_flags_parse_with_units() {
        assert_eq!(parse_log_max_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_log_max_bytes("512KiB"), Ok(512 << 10));
        assert_eq!(parse_log_max_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_log_max_bytes("1048576"), Ok(1 << 20));
        assert!(parse_log_max_bytes("16MB").unwrap_err().contains("16MiB"));
        assert!(parse_log_max_bytes("1KiB").unwrap_err().contains("minimum"));
        assert_eq!(parse_retention("7d"), Ok(Retention::after_ms(604_800_000)));
        assert_eq!(parse_retention("90s"), Ok(Retention::after_ms(90_000)));
        assert_eq!(parse_retention("off"), Ok(Retention::OFF));
        assert!(parse_retention("7").unwrap_err().contains("7d"));
        assert!(parse_retention("0d").is_err());
        assert!(parse_retention("99999999999d").is_err());

        // A checkpoint root of the operator's own is kept unless a retention is given.
        let with = |extra: &[&str]| parse(&run_args(extra)).run.into_config().unwrap().disk;
        assert_eq!(
            with(&["--checkpoint-root", "/shared"]).checkpoint_retention,
            Retention::OFF
        );
        assert_eq!(
            with(&[
                "--checkpoint-root",
                "/shared",
                "--checkpoint-retention",
                "2d",
                "--log-max-bytes",
                "1MiB",
                "--log-retention",
                "off"
            ]),
            DiskSettings {
                log_max_bytes: 1 << 20,
                log_retention: Retention::OFF,
                checkpoint_retention: Retention::after_ms(2 * 86_400_000),
            }
        );
    }

    /// `--cpus` takes whole and decimal CPU counts into thousandths, `--memory` sizes with
    /// units; zero and nonsense are refused; both reach the config.
    #[test]
    fn cpus_and_memory_parse() {
        assert_eq!(parse_cpus("60"), Ok(60_000));
        assert_eq!(parse_cpus("7.5"), Ok(7_500));
        assert_eq!(parse_cpus("0.25"), Ok(250));
        for bad in [
            "0", "0.0", "", ".5", "1.2345", "-1", "two", "1e3", "1000001",
        ] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_memory("480GiB"), Ok(480 << 30));
        assert_eq!(parse_memory("1TiB"), Ok(1 << 40));
        assert_eq!(parse_memory("1048576"), Ok(1 << 20));
        for bad in ["0", "0GiB", "", "12GB", "-1", "GiB"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
        let args = [
            "quotient-agent",
            "--name",
            "gpu-1",
            "--coordinators",
            "c:1",
            "--ca",
            "ca",
            "--cert",
            "c",
            "--key",
            "k",
            "--cpus",
            "12.5",
            "--memory",
            "64GiB",
        ];
        let config = parse(&args).run.into_config().unwrap();
        assert_eq!(config.cpu_millis, Some(12_500));
        assert_eq!(config.memory_bytes, Some(64 << 30));
        let config = parse(&args[..11]).run.into_config().unwrap();
        assert_eq!((config.cpu_millis, config.memory_bytes), (None, None));
    }

    #[test]
    fn standing_connections_are_opened_within_a_minute_unless_told_otherwise() {
        let within = |text| parse_standing_within(text).map(|within| within.0);
        assert_eq!(within("90s"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(within("2m"), Ok(Some(Duration::from_secs(120))));
        assert_eq!(within("off"), Ok(None));
        assert_eq!(within("1h"), Ok(Some(Duration::from_secs(3_600))));
        for bad in ["0s", "61m", "", "s", "10", "2h", "-5s", "1.5s", "999ms"] {
            let error = within(bad).unwrap_err();
            assert!(error.contains("or off"), "{bad}: {error}");
        }
        let off = run_args(&["--standing-connections-within", "off"]);
        let config = parse(&off).run.into_config().unwrap();
        assert_eq!(config.standing_within, None);
        let config = parse(&run_args(&[])).run.into_config().unwrap();
        assert_eq!(
            config.standing_within,
            Some(Duration::from_millis(
                crate::session::STANDING_WITHIN_DEFAULT_MS
            ))
        );
    }
}
