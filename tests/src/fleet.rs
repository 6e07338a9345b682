//! A fleet of simulated agents in one process: the load generator of `quotient-fleet`, the
//! fleet bench (`cargo bench -p quotient-tests --bench fleet`) and the fleet test.
//!
//! A real agent per node does not fit one machine at fleet size, so each simulated node is a
//! pair of tasks speaking the real agent protocol (ALPN `quotient-agent/1`) over real QUIC
//! with mutual TLS, each node presenting a certificate of its own: issued in memory from the
//! cluster CA ([`CaIssuer`]), for the agent identity of its node name, so the coordinators
//! authenticate and authorise every session exactly as they do a real agent's. Connections
//! share a few UDP sockets ([`FleetConfig::sockets`]); the coordinators cannot tell.
//!
//! Each node, like `quotient-agent` (agent/src/session.rs), finds the leader (following
//! `NotLeader` answers; unlike the real agent it tries one coordinator at a time, starting
//! with the leader the fleet last found, so the followers, which share this machine with the
//! leader, are not handed thousands of handshakes that only say "not the leader"), registers with its inventory and the attempts it runs, heartbeats
//! every `heartbeat_ms` the leader gave it, long-polls its desired state, and delivers job
//! reports until a leader acknowledges them. What a node does with a job:
//! - an allocation to run: reports `Started` and `Running` at once; a job whose spec sets
//!   [`RUN_MS_ENV`] exits with [`EXIT_CODE_ENV`] (default 0) that many milliseconds later,
//!   any other runs until stopped;
//! - an allocation to stop (a preemption or a cancel): the "checkpoint signal" is the moment
//!   the node sees the intent ([`Fleet::stop_seen`]); it exits
//!   ([`FleetConfig::grace_ms`] later) with `ExitedAfterSignal`;
//! - a job no longer in its desired state: exits at once, as the real agent kills it.
//!
//! A node that lost its leader waits up to [`RECONNECT_SPREAD_MS`] (spread over the nodes)
//! before it looks for the next, and waits [`CONNECT_DEADLINE_MS`] for a handshake, so that a
//! whole fleet reconnecting after a failover is not one burst that the new leader cannot
//! finish before the nodes give up on it.
//!
//! With [`FleetConfig::standing_within_ms`] a node keeps standing connections to the
//! coordinators besides its leader, as the real agent does, and registers over one after a
//! failover without a handshake.
//!
//! A leader that is there but acknowledges no heartbeat (it refuses them as unavailable, or
//! lets their deadline pass while its side of the connection still sends datagrams) keeps its
//! nodes for `leader_patience_ms` of their lease, as with the real agent, before they look
//! for the leader again.
//!
//! A node that has no heartbeat acknowledged for its lease stops its jobs (self-fencing, as
//! the real agent does) and counts them in [`FleetStats::fenced`]: a bench that expects no
//! job to stop checks that it stays 0. Nothing runs, no process and no file: a node is a few
//! kilobytes of memory, so 10,000 fit one process.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use quotient_common::agent_api::{
    ActualAttempt, ActualPhase, AgentError, AgentRequest, AgentResponse, DesiredState, Fence,
    HeartbeatAnswer, LeaderPatience, LeaderRequest, LeaderResponse, WireIntent,
    REPORTS_PER_REQUEST_MAX, WATCH_TIMEOUT_MS,
};
use quotient_common::certs::{ca_files, CaIssuer, Role};
use quotient_common::tls::{TlsFiles, TlsIdentity};
use quotient_common::transport::{client_endpoint, Client, PeerConnection, ALPN_AGENT};
use quotient_common::{
    ClusterId, GpuClass, GpuDevice, HostInfo, JobEvent, JobId, JobReport, NodeInventory, Runtime,
};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A job whose spec sets this environment variable exits on its own that many milliseconds
/// after it starts.
pub const RUN_MS_ENV: &str = "QUOTIENT_FLEET_RUN_MS";
/// The exit code of such a job (default 0).
pub const EXIT_CODE_ENV: &str = "QUOTIENT_FLEET_EXIT_CODE";
/// Deadline of a connect and `Register`, each. Long enough that a leader working through a
/// queue of handshakes after a failover is not abandoned half way (then the work is lost and
/// the node comes back for more).
pub const CONNECT_DEADLINE_MS: u64 = 5_000;
/// After losing its leader a node waits up to this long (spread by node) before it looks for
/// the next one, so that a fleet does not reach the new leader in one burst.
pub const RECONNECT_SPREAD_MS: u64 = 1_000;
/// Deadline of a heartbeat; one unanswered ends the connection, as for the real agent.
pub const HEARTBEAT_DEADLINE_MS: u64 = 1_000;
/// Deadline of a `Report`.
pub const REPORT_DEADLINE_MS: u64 = 5_000;
/// How much longer than the leader's hold a `WatchDesired` may take.
pub const WATCH_DEADLINE_MARGIN_MS: u64 = 2_000;
/// A watch answered with nothing new sooner than this is asked again only after it.
pub const WATCH_REPOLL_MS: u64 = 200;
/// Backoff between rounds over the coordinators: from this, doubling, with jitter.
pub const BACKOFF_MIN_MS: u64 = 100;
pub const BACKOFF_MAX_MS: u64 = 2_000;
/// The lease a node fences by before its first registration tells it the leader's.
pub const LEASE_DEFAULT_MS: u64 = 10_000;

/// What fleet to simulate, and where its coordinators are.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The coordinators' `HOST:PORT` addresses.
    pub coordinators: Vec<String>,
    /// The folder holding the cluster CA (`ca.pem` and `ca-key.pem`): every node gets an
    /// agent certificate from it, in memory.
    pub ca_dir: PathBuf,
    /// Node names are this prefix and a number: `sim-00001`, ...
    pub prefix: String,
    /// How many nodes.
    pub nodes: u32,
    /// Simulated GPUs per node.
    pub gpus_per_node: u32,
    pub gpu_class: GpuClass,
    /// UDP sockets the nodes' connections are spread over.
    pub sockets: usize,
    /// How long a stopped job takes to exit after its checkpoint signal (milliseconds).
    pub grace_ms: u64,
    /// The first connections are spread over this long (milliseconds), so that starting a
    /// large fleet is not one burst of handshakes.
    pub ramp_ms: u64,
    /// Each node's labels (e.g. `rack`): node `i` (from 0) gets `racks[i % racks.len()]` as
    /// label `rack`, when not empty.
    pub racks: Vec<String>,
    /// Standing connections, as the real agent keeps them (agent/src/session.rs): once
    /// registered, a node opens a connection to every other coordinator at a moment spread
    /// over this long (milliseconds), keeps those that answer `NotLeader`, and registers over
    /// one first when it looks for a new leader. `None`: none kept.
    pub standing_within_ms: Option<u64>,
}

impl FleetConfig {
    /// A fleet of `nodes` nodes of `gpus_per_node` A10G GPUs for the cluster whose CA is in
    /// `ca_dir`; one socket per 500 nodes, no grace, a second of ramp per 1,000 nodes.
    pub fn new(coordinators: Vec<String>, ca_dir: PathBuf, nodes: u32, gpus_per_node: u32) -> Self {
        FleetConfig {
            coordinators,
            ca_dir,
            prefix: "sim-".to_string(),
            nodes,
            gpus_per_node,
            gpu_class: GpuClass::parse("a10g").expect("a10g is a GPU class"),
            sockets: (nodes as usize).div_ceil(500).max(1),
            grace_ms: 0,
            ramp_ms: u64::from(nodes),
            racks: Vec::new(),
            standing_within_ms: None,
        }
    }

    /// The name of node `index` (from 0).
    pub fn node_name(&self, index: u32) -> String {
        format!("{}{:05}", self.prefix, index + 1)
    }
}

/// Counters over the whole fleet.
#[derive(Debug, Default)]
pub struct FleetStats {
    pub registrations: AtomicU64,
    pub heartbeats: AtomicU64,
    /// Heartbeats the leader refused as unavailable, and heartbeats unanswered in time while
    /// the leader's side of the connection still sent datagrams (each node gives such a leader
    /// `leader_patience_ms` before it looks for the leader again, as the real agent does).
    pub heartbeats_refused: AtomicU64,
    pub heartbeats_late: AtomicU64,
    /// Connections ended: by a `NotLeader` answer, a failed request, or a close.
    pub disconnects: AtomicU64,
    /// Connect or register attempts that failed.
    pub connect_failures: AtomicU64,
    pub desired_states: AtomicU64,
    pub reports: AtomicU64,
    /// Jobs stopped by a node's own lease running out (self-fencing).
    pub fenced: AtomicU64,
    /// Standing connections opened (or kept after a `NotLeader`).
    pub standing_opened: AtomicU64,
    /// Registrations over a standing connection (no handshake).
    pub standing_registrations: AtomicU64,
    /// The leader the last registration found: where a node that has no hint of its own looks
    /// first.
    leader_hint: Mutex<Option<String>>,
    /// The last reason a connection or registration failed, for people.
    last_error: Mutex<Option<String>>,
    /// When each job's stop intent was first seen (the checkpoint signal), by job.
    stops: Mutex<HashMap<JobId, Instant>>,
}

fn count(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running fleet; dropped, its tasks are aborted.
pub struct Fleet {
    nodes: Vec<Arc<SimNode>>,
    stats: Arc<FleetStats>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Fleet {
    /// Issues every node's certificate, then starts the nodes (spread over the ramp). Must
    /// run inside a tokio runtime.
    pub async fn start(config: FleetConfig) -> anyhow::Result<Fleet> {
        anyhow::ensure!(
            !config.coordinators.is_empty(),
            "no coordinator address given"
        );
        anyhow::ensure!(config.nodes > 0, "a fleet needs at least one node");
        let config = Arc::new(config);
        let identities = {
            let config = config.clone();
            tokio::task::spawn_blocking(move || issue_identities(&config)).await??
        };
        let sockets = (0..config.sockets.max(1))
            .map(|_| client_endpoint("127.0.0.1:0".parse().expect("an address")))
            .collect::<Result<Vec<_>, _>>()
            .context("cannot bind the fleet's UDP sockets")?;
        let stats = Arc::new(FleetStats::default());
        let (shutdown, _) = watch::channel(false);
        let mut nodes = Vec::with_capacity(identities.len());
        let mut tasks = Vec::with_capacity(identities.len() * 2);
        let total = identities.len() as u64;
        for (index, tls) in identities.into_iter().enumerate() {
            let endpoint = sockets[index % sockets.len()].clone();
            let node = Arc::new(SimNode::new(
                index as u32,
                &config,
                Client::on_endpoint(tls, endpoint),
                stats.clone(),
            ));
            let delay = Duration::from_millis(config.ramp_ms * index as u64 / total);
            let session = node.clone();
            let stop = shutdown.subscribe();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                session.run_session(stop).await;
            }));
            let runner = node.clone();
            let stop = shutdown.subscribe();
            tasks.push(tokio::spawn(async move { runner.run_jobs(stop).await }));
            nodes.push(node);
        }
        Ok(Fleet {
            nodes,
            stats,
            shutdown,
            tasks,
        })
    }

    /// How many nodes are registered with a leader now.
    pub fn registered(&self) -> usize {
        self.registered_after(None)
    }

    /// How many nodes registered (again) after `after` and are still connected.
    pub fn registered_after(&self, after: Option<Instant>) -> usize {
        self.nodes
            .iter()
            .filter(|node| {
                node.sim()
                    .registered_at
                    .is_some_and(|at| after.is_none_or(|after| at > after))
            })
            .count()
    }

    /// Waits until `count` nodes registered after `after` (any registration when `None`) and
    /// are still connected; panics with the fleet's counters after `timeout`.
    pub fn wait_registered(&self, count: usize, after: Option<Instant>, timeout: Duration) {
        crate::poll_until(&format!("{count} nodes registered"), timeout, || {
            let registered = self.registered_after(after);
            (registered == count)
                .then_some(())
                .ok_or_else(|| format!("{registered} registered: {}", self.counters()))
        });
    }

    /// The latest registration of any node (once every node is registered after a failover,
    /// when the last of them did).
    pub fn last_registration(&self) -> Option<Instant> {
        self.nodes
            .iter()
            .filter_map(|node| node.sim().registered_at)
            .max()
    }

    /// Standing connections open now, over the fleet.
    pub fn standing_open(&self) -> usize {
        self.nodes
            .iter()
            .map(|node| {
                locked(&node.standing)
                    .values()
                    .filter(|connection| connection.is_open())
                    .count()
            })
            .sum()
    }

    /// Waits until the fleet holds `count` open standing connections; panics with the
    /// fleet's counters after `timeout`.
    pub fn wait_standing(&self, count: usize, timeout: Duration) {
        crate::poll_until(&format!("{count} standing connections"), timeout, || {
            let open = self.standing_open();
            (open >= count)
                .then_some(())
                .ok_or_else(|| format!("{open} open: {}", self.counters()))
        });
    }

    /// Jobs running on the fleet now.
    pub fn running_jobs(&self) -> usize {
        self.nodes.iter().map(|node| node.sim().jobs.len()).sum()
    }

    /// When a node first saw job `job` wanted stopped.
    pub fn stop_seen(&self, job: JobId) -> Option<Instant> {
        locked(&self.stats.stops).get(&job).copied()
    }

    /// The jobs whose stop intent a node first saw after `after`, and when.
    pub fn stops_after(&self, after: Instant) -> Vec<(JobId, Instant)> {
        locked(&self.stats.stops)
            .iter()
            .filter(|(_, seen)| **seen > after)
            .map(|(job, seen)| (*job, *seen))
            .collect()
    }

    pub fn stats(&self) -> &FleetStats {
        &self.stats
    }

    /// The counters as one JSON object.
    pub fn counters(&self) -> serde_json::Value {
        let stats = &self.stats;
        serde_json::json!({
            "nodes": self.nodes.len(),
            "registered": self.registered(),
            "registrations": count(&stats.registrations),
            "heartbeats": count(&stats.heartbeats),
            "heartbeats_refused": count(&stats.heartbeats_refused),
            "heartbeats_late": count(&stats.heartbeats_late),
            "disconnects": count(&stats.disconnects),
            "connect_failures": count(&stats.connect_failures),
            "desired_states": count(&stats.desired_states),
            "reports": count(&stats.reports),
            "fenced": count(&stats.fenced),
            "standing_open": self.standing_open(),
            "standing_opened": count(&stats.standing_opened),
            "standing_registrations": count(&stats.standing_registrations),
            "running_jobs": self.running_jobs(),
            "last_error": *locked(&stats.last_error),
        })
    }

    /// Closes every session and stops the tasks.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A fleet on a thread of its own, on a one-thread runtime: the rest of the process (a bench
/// timing the cluster) does not share its cores with the fleet's tasks. Stopped when dropped.
pub struct FleetThread {
    fleet: Arc<Fleet>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FleetThread {
    /// Starts the fleet of `config` on a new thread; returns once its nodes are started.
    pub fn start(config: FleetConfig) -> anyhow::Result<FleetThread> {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fleet".to_string())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = started_tx.send(Err(anyhow::Error::from(error)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match Fleet::start(config).await {
                        Ok(fleet) => {
                            let fleet = Arc::new(fleet);
                            let _ = started_tx.send(Ok(fleet.clone()));
                            let _ = stop_rx.await;
                            let _ = fleet.shutdown.send(true);
                        }
                        Err(error) => {
                            let _ = started_tx.send(Err(error));
                        }
                    }
                });
            })?;
        let fleet = started_rx
            .recv()
            .context("the fleet thread ended before it started")??;
        Ok(FleetThread {
            fleet,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl std::ops::Deref for FleetThread {
    type Target = Fleet;

    fn deref(&self) -> &Fleet {
        &self.fleet
    }
}

impl Drop for FleetThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every node's TLS identity, issued in memory from the CA in `config.ca_dir`.
fn issue_identities(config: &FleetConfig) -> anyhow::Result<Vec<TlsIdentity>> {
    let ca = ca_files(&config.ca_dir);
    let issuer = CaIssuer::load(&ca).with_context(|| {
        format!(
            "cannot load the cluster CA from {} (ca.pem and ca-key.pem)",
            config.ca_dir.display()
        )
    })?;
    (0..config.nodes)
        .map(|index| {
            let name = config.node_name(index);
            let issued = issuer.issue(Role::Agent, &name)?;
            // Where the files would be: named in messages only.
            let files = TlsFiles::in_dir(&config.ca_dir, &name);
            let identity = TlsIdentity::from_pem(
                &files,
                issuer.ca_pem().as_bytes(),
                issued.cert_pem.as_bytes(),
                issued.key_pem.as_bytes(),
            )?;
            Ok(identity)
        })
        .collect()
}

/// A job on a simulated node.
#[derive(Debug, Clone)]
struct SimJob {
    attempt: u32,
    phase: ActualPhase,
    /// When it exits, and how.
    exit: Option<(Instant, JobEvent)>,
}

/// What a simulated node knows and runs.
#[derive(Debug, Default)]
struct NodeSim {
    cluster: Option<ClusterId>,
    /// The newest desired state's fence.
    fence: Fence,
    jobs: BTreeMap<JobId, SimJob>,
    /// Reports not yet acknowledged by a leader, oldest first.
    pending: VecDeque<JobReport>,
    /// When the current connection registered; `None` while not connected.
    registered_at: Option<Instant>,
    /// The send time of the last acknowledged heartbeat (or registration).
    last_ack: Option<Instant>,
    lease_ms: u64,
}

/// Why a connection to a leader ended.
#[derive(Debug)]
enum Ended {
    /// Not (or no longer) the leader; maybe with the leader's address.
    NotLeader(Option<String>),
    /// The connection is gone, unanswered, or refused something.
    Lost(String),
    /// The leader refused a heartbeat: handled as `Lost`, but the connection is kept as a
    /// standing one, as the real agent does.
    Refused(String),
}

fn ended_by(error: AgentError) -> Ended {
    match error {
        AgentError::NotLeader { leader_address, .. } => Ended::NotLeader(leader_address),
        other => Ended::Lost(other.to_string()),
    }
}

struct SimNode {
    index: u32,
    name: String,
    client: Client,
    inventory: NodeInventory,
    config: Arc<FleetConfig>,
    stats: Arc<FleetStats>,
    sim: Mutex<NodeSim>,
    /// Reports are waiting.
    reports_ready: Notify,
    /// A job's exit time changed.
    jobs_changed: Notify,
    /// Open connections to coordinators other than the leader, by address.
    standing: Mutex<BTreeMap<String, PeerConnection>>,
}

impl SimNode {
    fn new(index: u32, config: &Arc<FleetConfig>, client: Client, stats: Arc<FleetStats>) -> Self {
        let name = config.node_name(index);
        let gpus = (0..config.gpus_per_node)
            .map(|gpu| GpuDevice {
                index: gpu,
                uuid: format!("GPU-{name}-{gpu}"),
                class: config.gpu_class.clone(),
                healthy: true,
                nvlink_peers: 0,
            })
            .collect();
        let mut labels = BTreeMap::new();
        if !config.racks.is_empty() {
            let rack = &config.racks[index as usize % config.racks.len()];
            labels.insert("rack".to_string(), rack.clone());
        }
        let inventory = NodeInventory {
            name: name.clone(),
            gpus,
            host: HostInfo {
                runtimes: vec![Runtime::Process],
                labels,
                ..HostInfo::default()
            },
        };
        SimNode {
            index,
            name,
            client,
            inventory,
            config: config.clone(),
            stats,
            sim: Mutex::new(NodeSim {
                lease_ms: LEASE_DEFAULT_MS,
                ..NodeSim::default()
            }),
            reports_ready: Notify::new(),
            jobs_changed: Notify::new(),
            standing: Mutex::new(BTreeMap::new()),
        }
    }

    /// Keeps `connection` to `address` as a standing one, or closes it (standing connections
    /// off, or one kept already).
    fn keep_standing(&self, address: &str, connection: PeerConnection) {
        if self.config.standing_within_ms.is_none() || !connection.is_open() {
            connection.close();
            return;
        }
        let mut standing = locked(&self.standing);
        match standing.get(address) {
            Some(kept) if kept.is_open() => {
                if !kept.is_same(&connection) {
                    connection.close();
                }
            }
            _ => {
                standing.insert(address.to_string(), connection);
                self.stats.standing_opened.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Once registered with the leader at `leader`: after a pause spread over
    /// [`FleetConfig::standing_within_ms`], opens a connection to every coordinator that has
    /// no open one, and again after each such pause. Never ends by itself.
    async fn standing_loop(&self, leader: &str, round: u64) -> Ended {
        let Some(within_ms) = self.config.standing_within_ms else {
            return std::future::pending().await;
        };
        let mut pass = 0;
        loop {
            pass += 1;
            tokio::time::sleep(self.spread(within_ms, round * 1_000 + pass)).await;
            for address in &self.config.coordinators {
                let open = locked(&self.standing)
                    .get(address)
                    .is_some_and(PeerConnection::is_open);
                if address == leader || open {
                    continue;
                }
                let deadline = Duration::from_millis(CONNECT_DEADLINE_MS);
                match tokio::time::timeout(deadline, self.client.connect_to(address, ALPN_AGENT))
                    .await
                {
                    Ok(Ok(connection)) => self.keep_standing(address, connection),
                    Ok(Err(error)) => {
                        *locked(&self.stats.last_error) =
                            Some(format!("standing connection to {address}: {error}"));
                    }
                    Err(_) => {
                        *locked(&self.stats.last_error) =
                            Some(format!("standing connection to {address}: timed out"));
                    }
                }
            }
        }
    }

    fn sim(&self) -> MutexGuard<'_, NodeSim> {
        locked(&self.sim)
    }

    fn actual(&self) -> Vec<ActualAttempt> {
        self.sim()
            .jobs
            .iter()
            .map(|(job, sim)| ActualAttempt {
                job: *job,
                attempt: sim.attempt,
                phase: sim.phase,
            })
            .collect()
    }

    /// A pause of `base_ms`, up to half again longer, different per node and round: a fleet
    /// that lost its leader does not come back in one burst.
    fn jittered(&self, base_ms: u64, round: u64) -> Duration {
        Duration::from_millis(base_ms) + self.spread(base_ms / 2, round)
    }

    /// A pause of up to `max_ms`, different per node and round.
    fn spread(&self, max_ms: u64, round: u64) -> Duration {
        let mut x = u64::from(self.index)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(round.wrapping_mul(0xBF58_476D_1CE4_E5B9));
        x ^= x >> 31;
        Duration::from_millis(x % (max_ms + 1))
    }

    /// Finds the leader, serves the connection until it ends, and again, until shutdown.
    async fn run_session(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut hint: Option<String> = None;
        let mut last_lost: Option<String> = None;
        let mut backoff_ms = BACKOFF_MIN_MS;
        let mut round = 0u64;
        while !*shutdown.borrow() {
            round += 1;
            let found = tokio::select! {
                found = self.find_leader(hint.take(), last_lost.take()) => found,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let (connection, address, heartbeat_ms) = match found {
                Ok(found) => found,
                Err(next_hint) => {
                    hint = next_hint;
                    tokio::select! {
                        _ = tokio::time::sleep(self.jittered(backoff_ms, round)) => {}
                        _ = shutdown.wait_for(|stop| *stop) => break,
                    }
                    backoff_ms = (backoff_ms * 2).min(BACKOFF_MAX_MS);
                    continue;
                }
            };
            backoff_ms = BACKOFF_MIN_MS;
            let ended = tokio::select! {
                reason = connection.connection().closed() => {
                    Ended::Lost(format!("the connection closed: {reason}"))
                }
                ended = self.heartbeat_loop(&connection, heartbeat_ms) => ended,
                ended = self.watch_loop(&connection) => ended,
                ended = self.report_loop(&connection) => ended,
                () = refuse_leader_requests(&connection) => Ended::Lost("closed".to_string()),
                ended = self.standing_loop(&address, round) => ended,
                _ = shutdown.wait_for(|stop| *stop) => {
                    connection.close();
                    break;
                }
            };
            match &ended {
                Ended::NotLeader(_) | Ended::Refused(_) => self.keep_standing(&address, connection),
                Ended::Lost(_) => connection.close(),
            }
            self.sim().registered_at = None;
            self.stats.disconnects.fetch_add(1, Ordering::Relaxed);
            match ended {
                Ended::NotLeader(leader) => hint = leader,
                Ended::Lost(why) | Ended::Refused(why) => {
                    *locked(&self.stats.last_error) = Some(why);
                    last_lost = Some(address);
                    tokio::select! {
                        _ = tokio::time::sleep(self.spread(RECONNECT_SPREAD_MS, round)) => {}
                        _ = shutdown.wait_for(|stop| *stop) => break,
                    }
                }
            }
        }
        self.sim().registered_at = None;
        for (_, connection) in std::mem::take(&mut *locked(&self.standing)) {
            connection.close();
        }
    }

    /// Tries `hint`, then every coordinator (the one just lost last), until one registers
    /// this node. `Err` with a leader address to try first next round, if one was named.
    async fn find_leader(
        &self,
        hint: Option<String>,
        last_lost: Option<String>,
    ) -> Result<(PeerConnection, String, u64), Option<String>> {
        let hint = hint
            .or_else(|| locked(&self.stats.leader_hint).clone())
            .filter(|hint| Some(hint) != last_lost.as_ref());
        let mut order: Vec<String> = hint.into_iter().collect();
        let start = self.index as usize % self.config.coordinators.len();
        let rotated = self.config.coordinators[start..]
            .iter()
            .chain(&self.config.coordinators[..start]);
        for address in rotated {
            if !order.contains(address) && Some(address) != last_lost.as_ref() {
                order.push(address.clone());
            }
        }
        order.extend(last_lost);
        let mut named = None;
        let mut tried = 0;
        let mut index = 0;
        while index < order.len() && tried < order.len() + 2 {
            let address = order[index].clone();
            index += 1;
            tried += 1;
            match self.connect_and_register(&address).await {
                Ok((connection, heartbeat_ms)) => {
                    *locked(&self.stats.leader_hint) = Some(address.clone());
                    return Ok((connection, address, heartbeat_ms));
                }
                Err(Ended::NotLeader(Some(leader))) => {
                    // Follow it next, wherever it is in the order.
                    if let Some(position) = order[index..].iter().position(|a| *a == leader) {
                        order.remove(index + position);
                    }
                    if !order[..index].contains(&leader) {
                        order.insert(index, leader.clone());
                    }
                    named = Some(leader);
                }
                Err(Ended::Lost(why) | Ended::Refused(why)) => {
                    self.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                    *locked(&self.stats.last_error) = Some(format!("{address}: {why}"));
                }
                Err(Ended::NotLeader(None)) => {}
            }
        }
        Err(named)
    }

    async fn connect_and_register(&self, address: &str) -> Result<(PeerConnection, u64), Ended> {
        let deadline = Duration::from_millis(CONNECT_DEADLINE_MS);
        let kept = locked(&self.standing)
            .get(address)
            .filter(|kept| kept.is_open())
            .cloned();
        let standing = kept.is_some();
        let connection = match kept {
            Some(connection) => connection,
            None => tokio::time::timeout(deadline, self.client.connect_to(address, ALPN_AGENT))
                .await
                .map_err(|_| Ended::Lost("connect timed out".to_string()))?
                .map_err(|error| Ended::Lost(error.to_string()))?,
        };
        // Out of the pool while in use: it leads now, or it is put back, or it failed.
        if standing {
            locked(&self.standing).remove(address);
        }
        let actual = self.actual();
        let cluster = self.sim().cluster;
        let sent_at = Instant::now();
        let request = AgentRequest::Register {
            inventory: self.inventory.clone(),
            actual,
            cluster,
        };
        let answer = connection
            .request::<_, AgentResponse>(&request, deadline)
            .await
            .map_err(|error| Ended::Lost(error.to_string()));
        match answer {
            Ok(AgentResponse::Registered {
                agent_lease_ms,
                heartbeat_ms,
                cluster,
                ..
            }) => {
                let mut sim = self.sim();
                sim.cluster = Some(cluster);
                sim.lease_ms = agent_lease_ms;
                sim.last_ack = Some(sent_at);
                sim.registered_at = Some(Instant::now());
                drop(sim);
                self.stats.registrations.fetch_add(1, Ordering::Relaxed);
                if standing {
                    self.stats
                        .standing_registrations
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok((connection, heartbeat_ms.max(50)))
            }
            Ok(AgentResponse::Error(error)) => {
                let ended = ended_by(error);
                if matches!(ended, Ended::NotLeader(_)) {
                    self.keep_standing(address, connection);
                } else {
                    connection.close();
                }
                Err(ended)
            }
            Ok(other) => {
                connection.close();
                Err(Ended::Lost(format!(
                    "unexpected answer to Register: {other:?}"
                )))
            }
            Err(ended) => {
                connection.close();
                Err(ended)
            }
        }
    }

    async fn heartbeat_loop(&self, connection: &PeerConnection, heartbeat_ms: u64) -> Ended {
        let mut ticks = tokio::time::interval(Duration::from_millis(heartbeat_ms));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The registration was the first acknowledgement.
        ticks.tick().await;
        let mut patience = LeaderPatience::new(self.sim().lease_ms);
        loop {
            ticks.tick().await;
            let sent_at = Instant::now();
            let request = AgentRequest::Heartbeat {
                node: self.name.clone(),
                gpus: self.inventory.gpus.clone(),
                actual: self.actual(),
            };
            let deadline = Duration::from_millis(HEARTBEAT_DEADLINE_MS);
            let heard = connection.datagrams_received();
            let result = connection
                .request::<_, AgentResponse>(&request, deadline)
                .await;
            match HeartbeatAnswer::of(result, connection.datagrams_received() > heard) {
                HeartbeatAnswer::Acknowledged => {
                    patience.acknowledged();
                    self.sim().last_ack = Some(sent_at);
                    self.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                HeartbeatAnswer::Unavailable(_) => {
                    self.stats
                        .heartbeats_refused
                        .fetch_add(1, Ordering::Relaxed);
                }
                HeartbeatAnswer::Late => {
                    self.stats.heartbeats_late.fetch_add(1, Ordering::Relaxed);
                }
                HeartbeatAnswer::Error(error) => {
                    return match ended_by(error) {
                        Ended::Lost(why) => Ended::Refused(why),
                        ended => ended,
                    }
                }
                HeartbeatAnswer::Failed(why) => return Ended::Lost(why),
            }
            if let Err(failing) = patience.unacknowledged(sent_at.into_std()) {
                return Ended::Refused(format!(
                    "no heartbeat acknowledged for {} ms",
                    failing.as_millis()
                ));
            }
        }
    }

    async fn watch_loop(&self, connection: &PeerConnection) -> Ended {
        let deadline = Duration::from_millis(WATCH_TIMEOUT_MS + WATCH_DEADLINE_MARGIN_MS);
        loop {
            let after_fence = self.sim().fence;
            let asked = Instant::now();
            let request = AgentRequest::WatchDesired {
                node: self.name.clone(),
                after_fence,
            };
            match connection
                .request::<_, AgentResponse>(&request, deadline)
                .await
            {
                Ok(AgentResponse::Desired(desired)) => {
                    if desired.fence > after_fence && desired.node == self.name {
                        self.stats.desired_states.fetch_add(1, Ordering::Relaxed);
                        self.apply(desired);
                    } else if asked.elapsed() < Duration::from_millis(WATCH_REPOLL_MS) {
                        tokio::time::sleep(Duration::from_millis(WATCH_REPOLL_MS)).await;
                    }
                }
                Ok(AgentResponse::Error(error)) => return ended_by(error),
                Ok(other) => return Ended::Lost(format!("unexpected answer: {other:?}")),
                Err(error) => return Ended::Lost(error.to_string()),
            }
        }
    }

    /// Starts what `desired` runs that is not running, stops what it stops, and ends what it
    /// no longer names.
    fn apply(&self, desired: DesiredState) {
        let now = Instant::now();
        let mut reports = Vec::new();
        let mut sim = self.sim();
        sim.fence = desired.fence;
        let mut wanted = BTreeMap::new();
        for allocation in &desired.allocations {
            wanted.insert(allocation.job, allocation.attempt);
            let current = sim.jobs.get(&allocation.job).map(|job| job.attempt);
            match allocation.intent {
                WireIntent::Run if current.is_none_or(|attempt| attempt < allocation.attempt) => {
                    let exit = allocation
                        .spec
                        .env
                        .get(RUN_MS_ENV)
                        .and_then(|ms| ms.parse::<u64>().ok())
                        .map(|ms| {
                            let code = allocation
                                .spec
                                .env
                                .get(EXIT_CODE_ENV)
                                .and_then(|code| code.parse().ok())
                                .unwrap_or(0);
                            (now + Duration::from_millis(ms), JobEvent::Exited { code })
                        });
                    sim.jobs.insert(
                        allocation.job,
                        SimJob {
                            attempt: allocation.attempt,
                            phase: ActualPhase::Running,
                            exit,
                        },
                    );
                    for event in [JobEvent::Started, JobEvent::Running] {
                        reports.push((allocation.job, allocation.attempt, event));
                    }
                }
                WireIntent::Stop => {
                    if let Some(job) = sim.jobs.get_mut(&allocation.job) {
                        if job.attempt == allocation.attempt && job.phase != ActualPhase::Stopping {
                            job.phase = ActualPhase::Stopping;
                            let exit_at = now + Duration::from_millis(self.config.grace_ms);
                            job.exit =
                                Some((exit_at, JobEvent::ExitedAfterSignal { code: Some(0) }));
                            locked(&self.stats.stops)
                                .entry(allocation.job)
                                .or_insert(now);
                        }
                    }
                }
                WireIntent::Run => {}
            }
        }
        let unwanted: Vec<JobId> = sim
            .jobs
            .iter()
            .filter(|(job, sim_job)| wanted.get(job) != Some(&sim_job.attempt))
            .map(|(job, _)| *job)
            .collect();
        for job in unwanted {
            if let Some(gone) = sim.jobs.remove(&job) {
                reports.push((
                    job,
                    gone.attempt,
                    JobEvent::ExitedAfterSignal { code: None },
                ));
            }
        }
        for (job, attempt, event) in reports {
            sim.pending.push_back(JobReport {
                job,
                attempt,
                node: self.name.clone(),
                event,
            });
        }
        drop(sim);
        self.reports_ready.notify_one();
        self.jobs_changed.notify_one();
    }

    async fn report_loop(&self, connection: &PeerConnection) -> Ended {
        loop {
            let batch: Vec<JobReport> = {
                let sim = self.sim();
                sim.pending
                    .iter()
                    .take(REPORTS_PER_REQUEST_MAX)
                    .cloned()
                    .collect()
            };
            if batch.is_empty() {
                tokio::select! {
                    () = self.reports_ready.notified() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let sent = batch.len();
            let request = AgentRequest::Report {
                node: self.name.clone(),
                reports: batch,
            };
            let deadline = Duration::from_millis(REPORT_DEADLINE_MS);
            match connection
                .request::<_, AgentResponse>(&request, deadline)
                .await
            {
                Ok(AgentResponse::Reported { .. }) => {
                    // Rejected reports (stale attempts) are dropped, as the real agent does.
                    let mut sim = self.sim();
                    let delivered = sent.min(sim.pending.len());
                    sim.pending.drain(..delivered);
                    drop(sim);
                    self.stats.reports.fetch_add(sent as u64, Ordering::Relaxed);
                }
                Ok(AgentResponse::Error(error)) => return ended_by(error),
                Ok(other) => return Ended::Lost(format!("unexpected answer: {other:?}")),
                Err(error) => return Ended::Lost(error.to_string()),
            }
        }
    }

    /// Ends jobs at their exit time, and every job once the lease has run out (self-fencing).
    async fn run_jobs(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            let next = {
                let now = Instant::now();
                let mut sim = self.sim();
                let fenced = sim
                    .last_ack
                    .is_some_and(|ack| now >= ack + Duration::from_millis(sim.lease_ms));
                let due: Vec<(JobId, u32, JobEvent)> = sim
                    .jobs
                    .iter()
                    .filter_map(|(job, sim_job)| match &sim_job.exit {
                        Some((at, event)) if *at <= now => {
                            Some((*job, sim_job.attempt, event.clone()))
                        }
                        _ if fenced => Some((
                            *job,
                            sim_job.attempt,
                            JobEvent::ExitedAfterSignal { code: None },
                        )),
                        _ => None,
                    })
                    .collect();
                for (job, attempt, event) in due {
                    if fenced && matches!(event, JobEvent::ExitedAfterSignal { code: None }) {
                        self.stats.fenced.fetch_add(1, Ordering::Relaxed);
                    }
                    sim.jobs.remove(&job);
                    sim.pending.push_back(JobReport {
                        job,
                        attempt,
                        node: self.name.clone(),
                        event,
                    });
                    self.reports_ready.notify_one();
                }
                let next_exit = sim
                    .jobs
                    .values()
                    .filter_map(|job| job.exit.as_ref().map(|e| e.0))
                    .min();
                let lease_end = sim
                    .last_ack
                    .filter(|_| !sim.jobs.is_empty())
                    .map(|ack| ack + Duration::from_millis(sim.lease_ms));
                match (next_exit, lease_end) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            let wait = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.max(Instant::now())).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = wait => {}
                () = self.jobs_changed.notified() => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }
}

/// Answers the leader's requests on the connection (log reads): a simulated node keeps no
/// logs. Returns once the connection is closed.
async fn refuse_leader_requests(connection: &PeerConnection) {
    while let Ok(Some(mut stream)) = connection.accept_request().await {
        let deadline = Duration::from_millis(HEARTBEAT_DEADLINE_MS);
        if stream
            .read_request::<LeaderRequest>(deadline)
            .await
            .is_err()
        {
            continue;
        }
        let answer = LeaderResponse::Error(AgentError::NotFound(
            "a simulated node keeps no logs".to_string(),
        ));
        let _ = stream.respond(&answer, deadline).await;
    }
}
