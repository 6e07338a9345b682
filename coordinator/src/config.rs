//! A coordinator's configuration: who it is, where it listens and stores, who its initial
//! peers are, its TLS files, and the Raft tuning knobs. It comes from command-line flags or
//! from a TOML file with the same field names (`quotient-coordinator --config FILE`), and is
//! checked as a whole ([`CoordinatorConfig::validate`]) before anything starts, so a typo
//! fails at start with a message naming the field instead of as a silent split cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::{Config, SnapshotPolicy};
use quotient_common::tls::TlsFiles;
use quotient_common::ClusterId;
use quotient_core::usage::USAGE_BUCKET_MS;
use serde::{Deserialize, Serialize};

/// Default Raft heartbeat interval (milliseconds).
pub const HEARTBEAT_INTERVAL_DEFAULT_MS: u64 = 100;
/// Default lower bound of the election timeout (milliseconds).
///
/// openraft 0.9 has a follower that heard a leader wait out a lease (the upper bound) and then
/// an election timeout (between the bounds) before it stands, so a killed leader is replaced
/// after the upper bound plus a timeout. 300-500 ms puts that at 0.8-1.0 s, so that a command
/// issued as the leader dies is answered within 1.5 s (BENCHMARKS.md). A follower still stands
/// only after 8 heartbeats missed in a row at the least.
pub const ELECTION_TIMEOUT_MIN_DEFAULT_MS: u64 = 300;
/// Default upper bound of the election timeout, and the leader lease a follower waits out
/// first (milliseconds).
pub const ELECTION_TIMEOUT_MAX_DEFAULT_MS: u64 = 500;
/// Default number of log entries since the last snapshot that trigger a new one.
pub const SNAPSHOT_LOGS_DEFAULT: u64 = 10_000;
/// How many log entries before the last snapshot are kept, so that a follower slightly
/// behind catches up from the log instead of a whole snapshot.
pub const LOGS_KEPT_AFTER_SNAPSHOT_DEFAULT: u64 = 1_000;
/// Snapshot chunk size on the wire: well under the frame limit
/// (`quotient_common::frame::MAX_FRAME_BYTES`, 16 MiB) with room for the request around it.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 * 1024 * 1024;
/// Most log entries in one AppendEntries; with small commands this keeps a frame far below
/// the frame limit (a larger batch that does not fit is split, see `network`).
pub const APPEND_ENTRIES_MAX: u64 = 1_000;
/// Most bytes of log entries in one AppendEntries of several entries (2 MiB): the ceiling of
/// the limit that adapts to each follower (`network::BatchBytes`); one entry alone always
/// goes (`proposer::PROPOSAL_BYTES_MAX` keeps it under this). openraft 0.9
/// gives an AppendEntries the heartbeat interval to be answered (100 ms by default), so what
/// it carries must reach a follower and be stored there in that time; 15 MiB of entries for a
/// follower that fell behind missed it on every try, and the follower never caught up.
pub const APPEND_ENTRIES_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Deadline of sending one snapshot chunk and having it stored (milliseconds). openraft's
/// default (200 ms) is too short for a 4 MiB chunk written and fsynced on a busy disk.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 10_000;
/// The most coordinators a cluster may list (Raft beyond this is slow for no gain).
pub const PEERS_MAX: usize = 9;
/// Default agent lease: an agent that hears no heartbeat answer from a leader for this long
/// stops its jobs (milliseconds).
pub const AGENT_LEASE_DEFAULT_MS: u64 = 10_000;
/// Default interval between an agent's heartbeats (milliseconds).
pub const AGENT_HEARTBEAT_DEFAULT_MS: u64 = 1_000;
/// Default margin the leader adds to the agent lease and the jobs' grace periods before it
/// marks a silent node lost (milliseconds).
pub const NODE_LEASE_MARGIN_DEFAULT_MS: u64 = 5_000;
/// The smallest margin a coordinator accepts (milliseconds). A dead or frozen agent cannot
/// stop its jobs; each job's orphan watchdog does, up to 2.5 s after the agent's lease ran
/// out (0.5 s of slack, a 1 s poll before the checkpoint signal and one after the grace
/// period: the agent's `runtime::process`). The other 0.5 s cover the executor's tick and
/// the clocks' rate drift. With less, the seeded simulator (`quotient-sim --random-timing`,
/// docs/simulation.md) finds jobs requeued while they still run.
pub const NODE_LEASE_MARGIN_MIN_MS: u64 = 3_000;
/// Default interval between two checks that every replica holds the leader's state
/// (`digest_check`), in milliseconds. Each costs every replica one encoding of its state, off
/// the apply path; once a minute finds a divergence long before an operator would.
pub const DIGEST_CHECK_INTERVAL_DEFAULT_MS: u64 = 60_000;
/// The shortest interval between digest checks that may be set (milliseconds); 0 turns them off.
pub const DIGEST_CHECK_INTERVAL_MIN_MS: u64 = 100;
/// The Raft cluster name, checked by nothing but shown in openraft's logs.
pub const CLUSTER_NAME: &str = "quotient";

/// Why a configuration is unusable. Each message names the field and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the config file {} is not valid TOML for a coordinator: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("bad peer {entry:?}: {reason}; write peers as ID=HOST:PORT, e.g. 1=127.0.0.1:7401")]
    Peer { entry: String, reason: String },
    #[error("{0}")]
    Invalid(String),
}

/// Raft timing and compaction knobs; the defaults suit a LAN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftTuning {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Entries since the last snapshot that trigger a new one (and log compaction).
    pub snapshot_logs: u64,
    /// Entries kept in the log behind the snapshot.
    pub logs_kept_after_snapshot: u64,
    /// How often the leader has every replica compare its state with the leader's
    /// (milliseconds; 0: never).
    #[serde(default = "digest_check_interval_default_ms")]
    pub digest_check_interval_ms: u64,
}

fn digest_check_interval_default_ms() -> u64 {
    DIGEST_CHECK_INTERVAL_DEFAULT_MS
}

impl Default for RaftTuning {
    fn default() -> Self {
        RaftTuning {
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_DEFAULT_MS,
            election_timeout_min_ms: ELECTION_TIMEOUT_MIN_DEFAULT_MS,
            election_timeout_max_ms: ELECTION_TIMEOUT_MAX_DEFAULT_MS,
            snapshot_logs: SNAPSHOT_LOGS_DEFAULT,
            logs_kept_after_snapshot: LOGS_KEPT_AFTER_SNAPSHOT_DEFAULT,
            digest_check_interval_ms: DIGEST_CHECK_INTERVAL_DEFAULT_MS,
        }
    }
}

/// How agents are timed: what the leader tells each agent at registration, and how long it
/// waits before it marks a silent node lost.
///
/// A node is lost once its last heartbeat is older than `agent_lease_ms` + the largest grace
/// period of its jobs + `node_lease_margin_ms`: by then its agent, which stops its jobs after
/// `agent_lease_ms` without an answer (checkpoint signal, grace period, kill), must have
/// killed them, so a requeued job never runs twice at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentTuning {
    pub agent_lease_ms: u64,
    pub agent_heartbeat_ms: u64,
    pub node_lease_margin_ms: u64,
}

/// Checks the agent timing a coordinator may be given; the error says what to change.
pub fn check_agent_tuning(agents: &AgentTuning) -> Result<(), String> {
    if agents.agent_heartbeat_ms == 0 || agents.agent_lease_ms < 2 * agents.agent_heartbeat_ms {
        return Err(format!(
            "agent timing must satisfy 0 < heartbeat ({}) and lease ({}) >= 2 x heartbeat ms",
            agents.agent_heartbeat_ms, agents.agent_lease_ms
        ));
    }
    if agents.node_lease_margin_ms < NODE_LEASE_MARGIN_MIN_MS {
        return Err(format!(
            "node-lease-margin-ms must be at least {NODE_LEASE_MARGIN_MIN_MS}, not {}: a dead \
             agent's jobs are stopped by their watchdogs up to 2.5 s after its lease ran out, \
             and a node must not be declared lost (its jobs requeued) before that",
            agents.node_lease_margin_ms
        ));
    }
    Ok(())
}

impl Default for AgentTuning {
    fn default() -> Self {
        AgentTuning {
            agent_lease_ms: AGENT_LEASE_DEFAULT_MS,
            agent_heartbeat_ms: AGENT_HEARTBEAT_DEFAULT_MS,
            node_lease_margin_ms: NODE_LEASE_MARGIN_DEFAULT_MS,
        }
    }
}

/// Default start timeout of a job of several nodes: a gang whose members do not all run
/// within it is stopped and requeued (milliseconds).
pub const GANG_START_TIMEOUT_DEFAULT_MS: u64 = 300_000;

/// How the leader schedules: preferences of its own, not replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulingTuning {
    /// The node label a job of several nodes is placed in as few values of as fit it.
    pub topology_key: String,
    /// How long a job of several nodes may take for all its members to run; then its attempt
    /// is stopped and it goes back to the queue.
    pub gang_start_timeout_ms: u64,
    /// Who borrows first when idle GPUs are too few for every share that wants them.
    pub borrow_order: quotient_core::BorrowOrder,
}

impl Default for SchedulingTuning {
    fn default() -> Self {
        SchedulingTuning {
            topology_key: quotient_core::DEFAULT_TOPOLOGY_KEY.to_string(),
            gang_start_timeout_ms: GANG_START_TIMEOUT_DEFAULT_MS,
            borrow_order: quotient_core::BorrowOrder::Fifo,
        }
    }
}

/// Everything a coordinator needs to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// This coordinator's Raft id; must be one of `peers` on first start.
    pub id: u64,
    /// The address the QUIC endpoint binds (API and Raft share it).
    pub listen: SocketAddr,
    /// Where the Raft log (`raft.redb`) and the snapshot (`snapshot.bin`) live.
    pub data_dir: PathBuf,
    /// The initial members: id to `HOST:PORT` (how the others reach each one). Used by
    /// `quotient cluster init`, sent to this coordinator, to bootstrap the cluster once;
    /// afterwards membership lives in the Raft log. In TOML,
    /// either a table (`[peers]` with `1 = "127.0.0.1:7401"`) or the flag's string.
    #[serde(
        deserialize_with = "deserialize_peers",
        serialize_with = "serialize_peers"
    )]
    pub peers: BTreeMap<u64, String>,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The only cluster this coordinator may belong to (32 hexadecimal digits). Optional: a
    /// coordinator learns its cluster at `cluster init` or when it is added. Needed once to
    /// start on a data directory written before clusters had ids.
    #[serde(default)]
    pub cluster_id: Option<ClusterId>,
    #[serde(default)]
    pub raft: RaftTuning,
    #[serde(default)]
    pub agents: AgentTuning,
    #[serde(default)]
    pub scheduling: SchedulingTuning,
    #[serde(default)]
    pub retention: RetentionTuning,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` over plain HTTP
    /// (`crate::metrics`); `None` serves nothing.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// The AWS Batch–compatible endpoint (`crate::aws`).
    #[serde(default)]
    pub aws: AwsTuning,
}

/// The AWS Batch–compatible endpoint's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsTuning {
    /// Where to serve it over HTTPS; `None` serves nothing.
    pub listen: Option<SocketAddr>,
    /// The region signatures must be scoped to.
    pub region: String,
    /// Instance types added to or replacing the defaults: `NAME=CLASS:GPUS`.
    pub instance_types: Vec<String>,
}

/// The region the AWS endpoint answers as when none is configured: the AWS SDKs' usual one.
pub const AWS_REGION_DEFAULT: &str = "us-east-1";

impl Default for AwsTuning {
    fn default() -> Self {
        AwsTuning {
            listen: None,
            region: AWS_REGION_DEFAULT.to_string(),
            instance_types: Vec::new(),
        }
    }
}

/// Default retention of finished jobs in the live state: a week, long enough for `job list`
/// and `job get` to show last week's runs and for retries and investigations, short enough
/// that a busy fleet's state stays in memory; the history keeps them longer.
pub const RETAIN_FINISHED_DEFAULT_MS: u64 = 7 * 86_400_000;
/// Default most finished jobs kept: about 100 MiB of records at the worst.
pub const RETAIN_FINISHED_MAX_DEFAULT: u64 = 100_000;
/// Default time the shares' hourly usage is kept: 35 days, a month of charge-back with a
/// few days to spare (about 840 buckets per share and class).
pub const RETAIN_USAGE_DEFAULT_MS: u64 = 35 * 86_400_000;
pub use quotient_common::retention::{RETAIN_FINISHED_MIN_MS, RETAIN_HISTORY_DEFAULT_MS};
/// Default window an idempotency key outlives its removed job.
pub const IDEMPOTENCY_WINDOW_DEFAULT_MS: u64 = 86_400_000;

/// How long finished jobs stay in the live state (docs/retention.md). The leader's settings:
/// it puts them in each `ExpireFinished` it proposes, so the replicas apply the same ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionTuning {
    /// How long a finished job stays after its end.
    pub finished_ms: u64,
    /// The most finished jobs kept; the ones that ended first go first.
    pub finished_max: u64,
    /// How long an idempotency key outlives its removed job.
    pub idempotency_window_ms: u64,
    /// How long the shares' hourly usage is kept (`quotient share usage`).
    pub usage_ms: u64,
    /// How long the job history keeps a finished job's record after its end (each
    /// coordinator's own file, not the replicated state).
    pub history_ms: u64,
}

impl Default for RetentionTuning {
    fn default() -> Self {
        RetentionTuning {
            finished_ms: RETAIN_FINISHED_DEFAULT_MS,
            finished_max: RETAIN_FINISHED_MAX_DEFAULT,
            idempotency_window_ms: IDEMPOTENCY_WINDOW_DEFAULT_MS,
            usage_ms: RETAIN_USAGE_DEFAULT_MS,
            history_ms: RETAIN_HISTORY_DEFAULT_MS,
        }
    }
}

impl RetentionTuning {
    /// The rule the leader proposes.
    pub fn rule(&self) -> quotient_core::retention::RetentionRule {
        quotient_core::retention::RetentionRule {
            finished_ms: self.finished_ms,
            finished_max: self.finished_max,
            key_window_ms: self.idempotency_window_ms,
            usage_ms: self.usage_ms,
        }
    }
}

/// The largest config file read: a coordinator's settings take a few KiB.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1 << 20;

impl CoordinatorConfig {
    /// Reads a TOML config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            quotient_common::bounded_read::read_text_file_at_most(path, CONFIG_FILE_BYTES_MAX)
                .map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
        let config: CoordinatorConfig =
            toml::from_str(&text).map_err(|source| ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        config.validate()?;
        Ok(config)
    }

    /// The TLS files of this coordinator.
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }

    /// The address other coordinators know this one by (its entry in `peers`).
    pub fn advertised_address(&self) -> String {
        self.peers
            .get(&self.id)
            .cloned()
            .unwrap_or_else(|| self.listen.to_string())
    }

    /// Checks the whole configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |text: String| Err(ConfigError::Invalid(text));
        if self.id == 0 {
            return invalid("id 0 is reserved: give each coordinator an id from 1".into());
        }
        if self.peers.is_empty() {
            return invalid("no peers: list every initial coordinator, this one included, e.g. --peers 1=127.0.0.1:7401,2=127.0.0.1:7402,3=127.0.0.1:7403".into());
        }
        if self.peers.len() > PEERS_MAX {
            return invalid(format!(
                "{} peers is more than the {PEERS_MAX} a cluster may start with",
                self.peers.len()
            ));
        }
        if !self.peers.contains_key(&self.id) {
            return invalid(format!(
                "this coordinator's id {} is not among the peers {:?}: add {}=HOST:PORT to --peers",
                self.id,
                self.peers.keys().collect::<Vec<_>>(),
                self.id
            ));
        }
        let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
        for (id, address) in &self.peers {
            if *id == 0 {
                return invalid("peer id 0 is reserved: number coordinators from 1".into());
            }
            if address.rsplit_once(':').is_none() {
                return invalid(format!(
                    "peer {id} address {address:?} has no port: write HOST:PORT"
                ));
            }
            if let Some(other) = seen.insert(address.as_str(), *id) {
                return invalid(format!(
                    "peers {other} and {id} have the same address {address}: each coordinator \
                     needs an address of its own"
                ));
            }
        }
        let tuning = &self.raft;
        if tuning.heartbeat_interval_ms == 0
            || tuning.election_timeout_min_ms <= tuning.heartbeat_interval_ms
            || tuning.election_timeout_max_ms <= tuning.election_timeout_min_ms
        {
            return invalid(format!(
                "raft timing must satisfy 0 < heartbeat ({}) < election min ({}) < election max ({}) ms",
                tuning.heartbeat_interval_ms,
                tuning.election_timeout_min_ms,
                tuning.election_timeout_max_ms
            ));
        }
        if tuning.digest_check_interval_ms != 0
            && tuning.digest_check_interval_ms < DIGEST_CHECK_INTERVAL_MIN_MS
        {
            return invalid(format!(
                "digest_check_interval_ms must be 0 (off) or at least {DIGEST_CHECK_INTERVAL_MIN_MS}, not {}",
                tuning.digest_check_interval_ms
            ));
        }
        if tuning.snapshot_logs == 0 {
            return invalid("snapshot_logs must be at least 1".into());
        }
        check_agent_tuning(&self.agents).map_err(ConfigError::Invalid)?;
        let retention = &self.retention;
        if retention.finished_ms < RETAIN_FINISHED_MIN_MS {
            return invalid(format!(
                "retain-finished must be at least {} s, not {} ms: a finished job must stay \
                 long enough to be seen",
                RETAIN_FINISHED_MIN_MS / 1_000,
                retention.finished_ms
            ));
        }
        if retention.finished_max == 0 {
            return invalid("retain-finished-max must be at least 1".into());
        }
        if retention.history_ms < retention.finished_ms {
            return invalid(format!(
                "retain-history ({} ms) must be at least retain-finished ({} ms): the history \
                 keeps what the live state lets go",
                retention.history_ms, retention.finished_ms
            ));
        }
        if retention.usage_ms < USAGE_BUCKET_MS {
            return invalid(format!(
                "retain-usage must be at least an hour (one bucket), not {} ms",
                retention.usage_ms
            ));
        }
        Ok(())
    }

    /// The openraft config these settings give.
    pub fn raft_config(&self) -> Result<Arc<Config>, ConfigError> {
        let tuning = &self.raft;
        let config = Config {
            cluster_name: CLUSTER_NAME.to_string(),
            heartbeat_interval: tuning.heartbeat_interval_ms,
            election_timeout_min: tuning.election_timeout_min_ms,
            election_timeout_max: tuning.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(tuning.snapshot_logs),
            max_in_snapshot_log_to_keep: tuning.logs_kept_after_snapshot,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
            max_payload_entries: APPEND_ENTRIES_MAX,
            ..Config::default()
        };
        let config = config
            .validate()
            .map_err(|error| ConfigError::Invalid(format!("raft config: {error}")))?;
        Ok(Arc::new(config))
    }
}

/// TOML keys are strings, so the peer table is read with string keys and parsed here.
fn deserialize_peers<'de, D>(deserializer: D) -> Result<BTreeMap<u64, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Peers {
        Text(String),
        Table(BTreeMap<String, String>),
    }
    match Peers::deserialize(deserializer)? {
        Peers::Text(text) => parse_peers(&text).map_err(serde::de::Error::custom),
        Peers::Table(table) => {
            let text = table
                .iter()
                .map(|(id, address)| format!("{id}={address}"))
                .collect::<Vec<_>>()
                .join(",");
            parse_peers(&text).map_err(serde::de::Error::custom)
        }
    }
}

fn serialize_peers<S>(peers: &BTreeMap<u64, String>, serializer: S) -> Result<S::Ok, S::Error>
where
    S: serde::Serializer,
{
    let table: BTreeMap<String, &String> =
        peers.iter().map(|(id, a)| (id.to_string(), a)).collect();
    table.serialize(serializer)
}

/// Parses `1=127.0.0.1:7401,2=127.0.0.1:7402` into a map.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut peers = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let peer_error = |reason: &str| ConfigError::Peer {
            entry: entry.to_string(),
            reason: reason.to_string(),
        };
        let (id, address) = entry.split_once('=').ok_or_else(|| peer_error("no '='"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| peer_error("the id is not a number"))?;
        let address = address.trim();
        if address.rsplit_once(':').is_none() {
            return Err(peer_error("the address has no port"));
        }
        if peers.insert(id, address.to_string()).is_some() {
            return Err(peer_error("the id appears twice"));
        }
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_that_never_ends_is_refused_not_read_into_memory() {
        let error = CoordinatorConfig::from_file(Path::new("/dev/zero")).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("coordinator.toml");
        std::fs::write(&big, vec![b'#'; 1_048_577]).unwrap();
        let error = CoordinatorConfig::from_file(&big).unwrap_err();
        assert!(
            error.to_string().contains("more than 1048576 bytes"),
            "{error}"
        );
    }

    #[test]
    fn peers_parse_and_bad_ones_say_why() {
        // Proves the --peers syntax and that mistakes name the entry.
        let peers = parse_peers("1=127.0.0.1:7401, 2=localhost:7402").expect("valid peers");
        assert_eq!(peers.get(&2).map(String::as_str), Some("localhost:7402"));
        let error = parse_peers("1=127.0.0.1").expect_err("no port");
        assert!(error.to_string().contains("no port"), "{error}");
        let error = parse_peers("x=127.0.0.1:1").expect_err("bad id");
        assert!(error.to_string().contains("not a number"), "{error}");
    }

    #[test]
    fn agent_timing_that_could_run_a_job_twice_is_refused() {
        // Proves the margin's floor: below it a dead agent's jobs may still run when their node
        // is declared lost (the simulator's finding, docs/simulation.md); the refusal says why.
        let mut tuning = AgentTuning::default();
        check_agent_tuning(&tuning).expect("the defaults are safe");
        tuning.node_lease_margin_ms = NODE_LEASE_MARGIN_MIN_MS;
        check_agent_tuning(&tuning).expect("the minimum is accepted");
        tuning.node_lease_margin_ms = NODE_LEASE_MARGIN_MIN_MS - 1;
        let error = check_agent_tuning(&tuning).expect_err("below the minimum");
        assert!(
            error.contains("node-lease-margin-ms must be at least 3000"),
            "{error}"
        );
        assert!(error.contains("watchdogs"), "{error}");
        tuning.node_lease_margin_ms = NODE_LEASE_MARGIN_DEFAULT_MS;
        tuning.agent_lease_ms = tuning.agent_heartbeat_ms;
        let error = check_agent_tuning(&tuning).expect_err("one heartbeat per lease");
        assert!(error.contains("2 x heartbeat"), "{error}");
    }

    #[test]
    fn a_toml_config_round_trips_and_validates() {
        // Proves the TOML file has the same fields as the flags and that defaults apply.
        let text = r#"
            id = 2
            listen = "127.0.0.1:7402"
            data_dir = "/tmp/q2"
            ca = "ca.pem"
            cert = "coord-2.pem"
            key = "coord-2-key.pem"
            [peers]
            1 = "127.0.0.1:7401"
            2 = "127.0.0.1:7402"
            3 = "127.0.0.1:7403"
        "#;
        let config: CoordinatorConfig = toml::from_str(text).expect("parses");
        config.validate().expect("valid");
        assert_eq!(config.raft, RaftTuning::default());
        assert_eq!(config.agents, AgentTuning::default());
        assert_eq!(config.advertised_address(), "127.0.0.1:7402");
        config.raft_config().expect("a valid raft config");
        let text = toml::to_string(&config).expect("serialises");
        let back: CoordinatorConfig = toml::from_str(&text).expect("parses back");
        assert_eq!(back, config);
    }

    #[test]
    fn the_borrowing_order_is_a_scheduling_setting() {
        let base = "id = 1\nlisten = \"127.0.0.1:7401\"\ndata_dir = \"/tmp/q1\"\nca = \"ca.pem\"\ncert = \"c.pem\"\nkey = \"k.pem\"\n[peers]\n1 = \"127.0.0.1:7401\"\n";
        let config: CoordinatorConfig = toml::from_str(base).expect("parses");
        assert_eq!(
            config.scheduling.borrow_order,
            quotient_core::BorrowOrder::Fifo
        );
        let fair = format!("{base}[scheduling]\nborrow_order = \"fair\"\n");
        let config: CoordinatorConfig = toml::from_str(&fair).expect("parses");
        assert_eq!(
            config.scheduling.borrow_order,
            quotient_core::BorrowOrder::Fair
        );
        let bad = format!("{base}[scheduling]\nborrow_order = \"lifo\"\n");
        assert!(toml::from_str::<CoordinatorConfig>(&bad).is_err());
    }

    #[test]
    fn the_example_config_in_deploy_reads_and_validates() {
        let text = include_str!("../../deploy/examples/coordinator-1.toml");
        let config: CoordinatorConfig = toml::from_str(text).expect("the example parses");
        config.validate().expect("the example is valid");
    }

    #[test]
    fn unknown_keys_are_refused_and_partial_tables_take_defaults() {
        // Found by probing: a misplaced `retain_finished = "1h"` was ignored, and the
        // coordinator ran with the default a week long.
        let base = "id = 1\nlisten = \"127.0.0.1:7401\"\ndata_dir = \"/tmp/q1\"\nca = \"ca.pem\"\ncert = \"c.pem\"\nkey = \"k.pem\"\n[peers]\n1 = \"127.0.0.1:7401\"\n";
        for (extra, key) in [
            ("retain_finished = \"1h\"\n", "retain_finished"),
            ("[retention]\nfinished = 60000\n", "finished"),
            ("[raft]\nheartbeat_ms = 100\n", "heartbeat_ms"),
        ] {
            let text = if extra.starts_with('[') {
                format!("{base}{extra}")
            } else {
                format!("{extra}{base}")
            };
            let error = toml::from_str::<CoordinatorConfig>(&text)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("unknown field") && error.contains(key),
                "{error}"
            );
        }
        let partial = format!(
            "{base}[raft]\nheartbeat_interval_ms = 100\n[agents]\nagent_lease_ms = 20000\n"
        );
        let config: CoordinatorConfig = toml::from_str(&partial).expect("parses");
        assert_eq!(config.raft.heartbeat_interval_ms, 100);
        assert_eq!(
            config.raft.election_timeout_min_ms,
            RaftTuning::default().election_timeout_min_ms
        );
        assert_eq!(config.agents.agent_lease_ms, 20_000);
        let twice = base.replace(
            "[peers]\n1 = \"127.0.0.1:7401\"\n",
            "[peers]\n1 = \"127.0.0.1:7401\"\n2 = \"127.0.0.1:7401\"\n",
        );
        let config: CoordinatorConfig = toml::from_str(&twice).expect("parses");
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("the same address"), "{error}");
    }
}
