//! The session with the coordinators (ALPN `quotient-agent/1`, common/src/agent_api.rs): find
//! the leader, register, heartbeat, long-poll the desired state, deliver reports.
//!
//! # Lifecycle
//! The session looks for the leader at every coordinator address at once (and at the last
//! leader, or the one a `NotLeader` answer named): each connect has a short deadline
//! ([`CONNECT_DEADLINE_MS`]), the first coordinator that registers this node wins and the other
//! attempts are dropped. A `NotLeader` answer naming an address not being tried yet adds it
//! (at most [`REDIRECTS_MAX`] of them); an address that fails or answers `NotLeader` is tried
//! again after its own backoff ([`BACKOFF_MIN_MS`] doubling to [`BACKOFF_MAX_MS`], each up to
//! half again longer at random), or at once
//! when a `NotLeader` answer names it, so a dead coordinator never delays the others. `Register` is the first request on every connection
//! and carries the inventory and the attempts running here (found after a restart, too). Once
//! registered four loops share the connection, one request per QUIC stream, each with a
//! deadline:
//! - heartbeats every `heartbeat_ms` with device health and actual attempts; each answer renews
//!   the self-fencing lease ([`crate::lease`]) and the lease file the jobs' wrappers watch;
//! - `WatchDesired`: each new [`DesiredState`] is checked (node name, size, GPU indices this
//!   node has) and handed to the executor loop at once; bad ones are refused and logged;
//! - `Report`: job events from the [`Journal`], retried until a leader acknowledges them;
//! - `DiskUsage`: what the agent's files take ([`crate::disk`]), on each new connection and
//!   after each measurement.
//!
//! A `NotLeader` answer, a closed connection (QUIC close or idle timeout) or a single heartbeat
//! without an answer within [`heartbeat_deadline`] end the connection, and the session finds
//! the leader again: at once after a `NotLeader` naming it, else after its backoff and, when
//! the leader was lost, up to [`RECONNECT_SPREAD_MS`] more at random, so that a whole fleet
//! does not come back in one burst. Reconnecting early is cheap and never extends the lease: the lease
//! runs from the send time of the last *acknowledged* heartbeat whatever the connection does.
//! So a leader killed outright is left within a heartbeat interval + its deadline (about 2 s
//! with the coordinators' defaults), and the new one (elected in 1-2 s) is found by the next
//! retry, about a second later, well inside the lease. None of this touches a running job: only the executor loop
//! does, from the desired state and the lease.
//!
//! # Standing connections
//! A failover costs every agent a new connection to the new leader, and a new connection costs
//! a TLS handshake on both sides: at thousands of agents the new leader's CPU spent on
//! handshakes, not the election, decided how long a failover took (BENCHMARKS.md, "A fleet of
//! simulated agents"). So the session keeps an idle connection open to every coordinator, not
//! only the leader:
//! - a connection that answered `NotLeader` (during a leader search, or a leader that stepped
//!   down) is kept rather than closed: the search already paid for its handshake; so is a
//!   leader's connection when the leader refused a heartbeat (it could not show a quorum's
//!   recent acknowledgement), so that registering with it again costs no handshake either;
//! - once registered, the session opens the ones it lacks at a random moment within
//!   `--standing-connections-within` (default [`STANDING_WITHIN_DEFAULT_MS`]), so that a fleet
//!   that registered together does not open them together, and looks again as often;
//! - a leader search registers over a standing connection first, with no handshake; a
//!   standing connection that is closed (the coordinator went away: QUIC's idle timeout) or
//!   does not answer is dropped, and the address is tried with a new connection as before.
//!
//! Each costs the coordinator a QUIC connection's memory and a keep-alive every
//! [`quotient_common::transport::KEEP_ALIVE_INTERVAL_MS`]. Every connection the agent makes
//! serves the log reads a coordinator asks of it ([`crate::log_server`]), so a new leader can
//! read logs over a standing connection before the node has registered with it.
//!
//! # Self-fencing timing contract
//! The agent stops all its jobs (checkpoint signal, grace period, kill) once no heartbeat has
//! been acknowledged by a leader for `agent_lease_ms` (from `Registered`; `--lease-ms` before
//! the first registration), counted from the *send* time of the last acknowledged heartbeat,
//! which is never later than when the leader received it. A restarted agent counts from the
//! last acknowledgement recorded in its journal, not from its own start. So a job of a node
//! cut off from the leaders has exited by
//! `last heartbeat received + agent_lease_ms + the job's grace period` (plus the executor's
//! tick, [`crate::run::CORE_TICK_MS`]). The coordinators must requeue a lost node's jobs only
//! after `agent_lease_ms + grace period + a margin` since the last heartbeat they received
//! (the margin covers clock-rate drift and the tick), so a requeued job never runs twice at
//! once. Exits caused by fencing are reported, as `ExitedAfterSignal`, once a leader answers
//! again.
//!
//! The same bound holds for an agent that cannot fence because it was killed or is frozen:
//! each job's watchdog (the wrapper of a process job, a watchdog process per container on the
//! Docker runtime) watches the lease file the agent renews with every acknowledgement and
//! stops the job itself, adding at most [`crate::runtime::process::WATCHDOG_SLACK_MS`] and two
//! polls of [`crate::runtime::process::WATCHDOG_POLL_S`] (2.5 s), inside the coordinators'
//! default 5 s margin.
//!
//! A desired state whose fence is the default (term 0) is "none yet" and is not acted on: a
//! real leader's term is at least 1, and acting on an empty state would kill re-found jobs.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::stream::{FuturesUnordered, StreamExt};

use quotient_common::agent_api::{
    ActualAttempt, AgentError, AgentRequest, AgentResponse, DesiredState, DiskUsage, Fence,
    HeartbeatAnswer, LeaderPatience, WireAllocation, WireIntent, DESIRED_ALLOCATIONS_MAX,
    REPORTS_PER_REQUEST_MAX, WATCH_TIMEOUT_MS,
};
use quotient_common::transport::{Client, PeerConnection, RequestError, ALPN_AGENT};
use quotient_common::{GpuDevice, HostInfo, JobReport, NodeInventory};
use tokio::sync::{watch, Notify};

use crate::gpu::{to_gpu_devices, GpuBackend};
use crate::journal::Journal;
use crate::lease::{write_lease_file, LeaseClock};
use crate::reconcile::{Desired, DesiredAllocation, Intent};

/// Deadline of a connect, handshake included. Short, as every address is tried at once and
/// retried: a dead coordinator costs only its own attempt. Each failed attempt at an address
/// doubles the next one's, up to [`CONNECT_DEADLINE_MAX_MS`], so that a path whose round
/// trip is near a second still gets its handshake through (found by probing: at 1 s a round
/// trip every handshake was given up, and the agent stopped its jobs with its lease).
pub const CONNECT_DEADLINE_MS: u64 = 1_000;
/// The longest a connect's deadline grows to in one leader search.
pub const CONNECT_DEADLINE_MAX_MS: u64 = 4_000;
/// Deadline of a `Register`.
pub const REGISTER_DEADLINE_MS: u64 = 5_000;
/// Deadline of a heartbeat (at most a quarter of the lease, see [`heartbeat_deadline`]); one
/// heartbeat unanswered by then ends the connection. Heartbeats are answered from the
/// leader's memory, not replicated, so a healthy leader answers well within it.
pub const HEARTBEAT_DEADLINE_MS: u64 = 1_000;
/// Heartbeat deadlines per lease at least.
pub const HEARTBEAT_DEADLINES_PER_LEASE_MIN: u64 = 4;
/// Deadline of a `Report` (answered once committed).
pub const REPORT_DEADLINE_MS: u64 = 5_000;
/// How much longer than the leader's hold a `WatchDesired` may take.
pub const WATCH_DEADLINE_MARGIN_MS: u64 = 2_000;
/// The pause before polling again when the leader answered with nothing new at once.
pub const WATCH_REPOLL_MS: u64 = 200;
/// The shortest heartbeat interval taken from a leader.
pub const HEARTBEAT_MIN_MS: u64 = 50;
/// Heartbeats per lease at least: a leader's `heartbeat_ms` is capped at lease / this.
pub const HEARTBEATS_PER_LEASE_MIN: u64 = 3;
/// Backoff between rounds over all coordinators, and between retries of a failed report.
pub const BACKOFF_MIN_MS: u64 = 100;
pub const BACKOFF_MAX_MS: u64 = 2_000;
/// After losing its leader an agent waits its backoff and up to this long more, at random,
/// before it looks for the new one: a fleet of thousands that lost its leader at once comes
/// back spread over a second instead of in one burst of TLS handshakes (BENCHMARKS.md, "A
/// fleet of simulated agents": the burst of 5,000 at once collapsed the new leader). Well
/// inside the lease, so no job is stopped for it.
pub const RECONNECT_SPREAD_MS: u64 = 1_000;
/// Addresses learnt from `NotLeader` answers that one leader search adds to the configured ones.
pub const REDIRECTS_MAX: usize = 8;
/// How often a leader search that has found nothing says so.
pub const SEARCH_WARN_INTERVAL_MS: u64 = 5_000;
/// The longest leader address taken from a `NotLeader` answer.
pub const LEADER_ADDRESS_BYTES_MAX: usize = 256;
/// The journal records a heartbeat acknowledgement at most this often.
pub const ACK_RECORD_INTERVAL_MS: u64 = 1_000;
/// The longest the report loop sleeps before looking at the journal again.
pub const REPORT_RECHECK_MS: u64 = 1_000;
/// Deadline of a `DiskUsage` (answered from the leader's memory).
pub const DISK_USAGE_DEADLINE_MS: u64 = 5_000;
/// The default of `--standing-connections-within`: once registered, the session opens its
/// missing standing connections at a random moment within this long, and looks again as
/// often. A fleet of 10,000 agents then opens about 170 connections a second on each
/// coordinator (a few percent of one core), not 10,000 at once.
pub const STANDING_WITHIN_DEFAULT_MS: u64 = 60_000;
/// Deadline of opening a standing connection (nothing waits on it).
pub const STANDING_CONNECT_DEADLINE_MS: u64 = 5_000;

/// What the session shares with the executor loop ([`crate::run`]).
pub struct Shared {
    pub node: String,
    pub lease: Mutex<LeaseClock>,
    pub journal: Mutex<Journal>,
    /// Wakes the report loop when the journal has new reports.
    pub reports_ready: Notify,
    /// The attempts running here, as the executor loop last saw them.
    pub actual: watch::Receiver<Vec<ActualAttempt>>,
    /// Checked desired states for the executor loop.
    pub desired: watch::Sender<Option<Desired>>,
    /// Set by the executor loop when it dropped its desired state (self-fencing) and a leader
    /// answers again: the next poll asks for the leader's state at once, even if not newer.
    pub desired_wanted: AtomicBool,
    pub backend: Arc<dyn GpuBackend>,
    /// Where the lease is published for the jobs' wrappers ([`crate::lease`]); `None` writes
    /// nothing.
    pub lease_file: Option<PathBuf>,
    /// Where this agent's job logs are, for the leader's log reads ([`crate::log_server`]).
    pub logs: crate::log_server::LogSource,
    /// The cluster this agent belongs to, sent with every registration ([`crate::cluster`]).
    pub cluster: crate::cluster::AgentCluster,
    /// The disk use last measured ([`crate::disk`]), sent to the leader.
    pub disk_usage: watch::Receiver<Option<DiskUsage>>,
    /// What the node reports besides its GPUs ([`crate::host_info`]); when it changes the
    /// session registers again.
    pub host: watch::Receiver<HostInfo>,
    /// How the session's connections went, for the metrics ([`crate::metrics`]).
    pub links: LinkCounts,
}

/// The session's connections besides the leader's, and how registrations went: read by the
/// metrics.
#[derive(Debug, Default)]
pub struct LinkCounts {
    /// Connections to coordinators other than the leader, by address (see "Standing
    /// connections" above); some may have closed since they were kept.
    standing: Mutex<BTreeMap<String, PeerConnection>>,
    /// Registrations acknowledged over a connection made for them.
    pub registered_new: AtomicU64,
    /// Registrations acknowledged over a standing connection (no handshake).
    pub registered_standing: AtomicU64,
    /// Heartbeats the leader refused as unavailable (see `leader_patience_ms`).
    pub heartbeats_refused: AtomicU64,
    /// Heartbeats unanswered within their deadline while the leader's side of the connection
    /// still sent datagrams (see `leader_patience_ms`).
    pub heartbeats_late: AtomicU64,
}

impl LinkCounts {
    fn standing(&self) -> MutexGuard<'_, BTreeMap<String, PeerConnection>> {
        self.standing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Standing connections open now.
    pub fn standing_open(&self) -> usize {
        self.standing()
            .values()
            .filter(|kept| kept.is_open())
            .count()
    }
}

impl Shared {
    pub fn lease(&self) -> MutexGuard<'_, LeaseClock> {
        self.lease
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A leader acknowledged a heartbeat (or registration) sent at `sent_at`: renews the
    /// lease clock and the lease file.
    pub fn renew_lease(&self, sent_at: Instant, lease_ms: Option<u64>) {
        let mut lease = self.lease();
        if let Some(lease_ms) = lease_ms {
            lease.set_lease_ms(lease_ms);
        }
        lease.renew(sent_at);
        self.publish_lease(&lease, false);
    }

    /// Marks the lease file: the agent has sent its jobs their checkpoint signals itself.
    pub fn publish_fencing(&self) {
        let lease = self.lease();
        self.publish_lease(&lease, true);
    }

    /// Writes the lease file; called with the lease locked, so writes never reorder.
    fn publish_lease(&self, lease: &LeaseClock, fencing: bool) {
        if let Some(path) = &self.lease_file {
            if let Err(error) = write_lease_file(path, lease, fencing) {
                // The wrappers then stop the jobs once the last written lease runs out: safe.
                tracing::warn!(path = %path.display(), "cannot write the lease file: {error}");
            }
        }
    }

    pub fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds the executor's reports to the journal and wakes the report loop.
    pub fn record_reports(&self, reports: Vec<JobReport>) {
        if reports.is_empty() {
            return;
        }
        if let Err(error) = self.journal().push(reports) {
            // Kept in memory and retried on the next write; a restart before then loses them.
            tracing::error!("cannot write the journal: {error}");
        }
        self.reports_ready.notify_one();
    }
}

/// A pause of up to `max_ms`, at random (a hash of `node` with a per-process random key and
/// the time), so that agents that lost their leader together come back apart.
fn spread(node: &str, max_ms: u64) -> Duration {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    node.hash(&mut hasher);
    Instant::now().hash(&mut hasher);
    Duration::from_millis(hasher.finish() % (max_ms + 1))
}

/// The wait before an address is tried again in a leader search: `backoff_ms` and up to half
/// as long again, at random, so that a fleet whose searches began together (a coordinator
/// restarted, or one refusing handshakes while it is busy) does not retry in step.
fn retry_delay(node: &str, backoff_ms: u64) -> Duration {
    Duration::from_millis(backoff_ms) + spread(node, backoff_ms / 2)
}

/// Why a connection to a leader ended.
#[derive(Debug)]
enum Ended {
    /// Not (or no longer) the leader; maybe with the leader's address.
    NotLeader(Option<String>),
    /// The leader forgot this node: register again.
    NotRegistered,
    /// The connection is gone or unanswered.
    Lost(String),
    /// The leader answered a heartbeat with a refusal (it cannot show a quorum's recent
    /// acknowledgement, say): handled as [`Ended::Lost`], but the connection stays open as a
    /// standing one, since the coordinator is there and answering.
    Refused(String),
}

/// How often and how long: what `Registered` said, clamped to sane values.
#[derive(Debug, Clone, Copy)]
struct Timing {
    heartbeat_ms: u64,
    lease_ms: u64,
}

/// The lease and heartbeat interval an agent takes from a leader's `Registered`: the lease
/// no shorter than `lease_min_ms`, and at least [`HEARTBEATS_PER_LEASE_MIN`] heartbeats per
/// lease, none more often than [`HEARTBEAT_MIN_MS`]. Returns `(lease_ms, heartbeat_ms)`.
pub fn agreed_timing(agent_lease_ms: u64, heartbeat_ms: u64, lease_min_ms: u64) -> (u64, u64) {
    let lease_ms = agent_lease_ms.max(lease_min_ms);
    let heartbeat_ms = heartbeat_ms
        .min(lease_ms / HEARTBEATS_PER_LEASE_MIN)
        .max(HEARTBEAT_MIN_MS);
    (lease_ms, heartbeat_ms)
}

/// The deadline of one heartbeat under a lease of `lease_ms`.
pub fn heartbeat_deadline(lease_ms: u64) -> Duration {
    Duration::from_millis(
        HEARTBEAT_DEADLINE_MS
            .min(lease_ms / HEARTBEAT_DEADLINES_PER_LEASE_MIN)
            .max(HEARTBEAT_MIN_MS),
    )
}

/// The deadline of one heartbeat under a lease of `lease_ms` on a connection whose round trip
/// QUIC measures at `rtt`: [`heartbeat_deadline`], or three round trips where that is longer,
/// never more than a quarter of the lease (found by probing: at a round trip of 1 s every
/// heartbeat missed its deadline of 1 s, and the agent stopped its jobs).
pub fn heartbeat_deadline_on(lease_ms: u64, rtt: Duration) -> Duration {
    let quarter = Duration::from_millis(lease_ms / HEARTBEAT_DEADLINES_PER_LEASE_MIN);
    heartbeat_deadline(lease_ms).max((rtt * 3).min(quarter))
}

/// One attempt of a leader search: an address and how it went.
type Attempt<'a> =
    Pin<Box<dyn Future<Output = (String, Result<(PeerConnection, Timing), Ended>)> + Send + 'a>>;

/// The agent's session with whichever coordinator leads.
pub struct LeaderSession {
    shared: Arc<Shared>,
    client: Client,
    coordinators: Vec<String>,
    /// Minimum lease accepted from a leader.
    lease_min_ms: u64,
    /// The newest fence handed to the executor loop.
    last_fence: Mutex<Fence>,
    /// The last inventory read, for checking desired states.
    gpus: Mutex<Vec<GpuDevice>>,
    last_ack_recorded: Mutex<Option<Instant>>,
    /// The host info of the last registration a leader acknowledged.
    registered_host: Mutex<Option<HostInfo>>,
    /// Opens the missing standing connections within this long; `None`: keeps none.
    standing_within: Option<Duration>,
}

impl LeaderSession {
    pub fn new(
        shared: Arc<Shared>,
        client: Client,
        coordinators: Vec<String>,
        lease_min_ms: u64,
    ) -> LeaderSession {
        LeaderSession {
            shared,
            client,
            coordinators,
            lease_min_ms,
            last_fence: Mutex::new(Fence::default()),
            gpus: Mutex::new(Vec::new()),
            last_ack_recorded: Mutex::new(None),
            registered_host: Mutex::new(None),
            standing_within: Some(Duration::from_millis(STANDING_WITHIN_DEFAULT_MS)),
        }
    }

    /// Opens the missing standing connections within `within` of registering (and looks again
    /// as often); `None` keeps none, closing every connection that is not the leader's.
    pub fn with_standing_connections(mut self, within: Option<Duration>) -> LeaderSession {
        self.standing_within = within;
        self
    }

    fn standing(&self) -> MutexGuard<'_, BTreeMap<String, PeerConnection>> {
        self.shared.links.standing()
    }

    /// The open standing connection to `address`, if any; it stays in the pool until
    /// [`Self::drop_standing`], so an attempt cancelled mid-way loses nothing.
    fn standing_to(&self, address: &str) -> Option<PeerConnection> {
        self.standing()
            .get(address)
            .filter(|kept| kept.is_open())
            .cloned()
    }

    /// Takes `connection` out of the pool: it leads now, or it failed (then closed too).
    fn drop_standing(&self, address: &str, connection: &PeerConnection, close: bool) {
        let mut standing = self.standing();
        if standing
            .get(address)
            .is_some_and(|kept| kept.is_same(connection))
        {
            standing.remove(address);
        }
        drop(standing);
        if close {
            connection.close();
        }
    }

    /// Keeps `connection` to `address` as a standing one, serving the log reads its
    /// coordinator asks for unless it does already (`serving`). Closes it instead when
    /// standing connections are off, or one to that address is kept already.
    fn keep_standing(&self, address: String, connection: PeerConnection, serving: bool) {
        if self.standing_within.is_none() || !connection.is_open() {
            connection.close();
            return;
        }
        let mut standing = self.standing();
        standing.retain(|_, kept| kept.is_open());
        match standing.get(&address) {
            Some(kept) if kept.is_same(&connection) => {}
            Some(_) => connection.close(),
            None => {
                if !serving {
                    self.serve_logs(&connection);
                }
                standing.insert(address, connection);
            }
        }
    }

    /// Serves the log reads the coordinator asks for on `connection`, as long as it lives.
    fn serve_logs(&self, connection: &PeerConnection) {
        tokio::spawn(crate::log_server::serve(
            connection.clone(),
            self.shared.clone(),
        ));
    }

    /// A new connection to `address`, within `deadline`.
    async fn connect(&self, address: &str, deadline: Duration) -> Result<PeerConnection, Ended> {
        match tokio::time::timeout(deadline, self.client.connect_to(address, ALPN_AGENT)).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(error)) => Err(Ended::Lost(format!("cannot connect: {error}"))),
            Err(_) => Err(Ended::Lost("connect timed out".to_string())),
        }
    }

    /// Once registered with the leader at `leader`: after a random pause within
    /// `standing_within`, opens a connection to every configured coordinator that has no open
    /// one, and again after each such pause. Never ends by itself.
    async fn standing_loop(&self, leader: &str) -> Ended {
        let Some(within) = self.standing_within else {
            return std::future::pending().await;
        };
        let within_ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        loop {
            tokio::time::sleep(spread(&self.shared.node, within_ms)).await;
            for address in &self.coordinators {
                if address == leader || self.standing_to(address).is_some() {
                    continue;
                }
                match self
                    .connect(address, Duration::from_millis(STANDING_CONNECT_DEADLINE_MS))
                    .await
                {
                    Ok(connection) => {
                        tracing::debug!(coordinator = %address, "standing connection open");
                        self.keep_standing(address.clone(), connection, false);
                    }
                    Err(ended) => {
                        tracing::debug!(coordinator = %address, "no standing connection: {ended:?}");
                    }
                }
            }
        }
    }

    /// Runs until `shutdown` turns true; never touches a job.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut preferred: Option<String> = None;
        let mut backoff_ms = BACKOFF_MIN_MS;
        loop {
            if *shutdown.borrow() {
                break;
            }
            let (connection, address, timing) = tokio::select! {
                found = self.find_leader(preferred.take()) => found,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let connected_at = Instant::now();
            let ended = tokio::select! {
                reason = connection.connection().closed() => {
                    Ended::Lost(format!("the connection closed: {reason}"))
                }
                ended = self.heartbeat_loop(&connection, timing) => ended,
                ended = self.watch_loop(&connection) => ended,
                ended = self.report_loop(&connection) => ended,
                ended = self.disk_usage_loop(&connection) => ended,
                ended = self.host_loop(&connection) => ended,
                ended = self.standing_loop(&address) => ended,
                _ = shutdown.wait_for(|stop| *stop) => {
                    connection.close();
                    break;
                }
            };
            match &ended {
                // Still a coordinator, only not (or no longer) this node's leader: its
                // connection stays as a standing one.
                Ended::NotLeader(_) | Ended::NotRegistered | Ended::Refused(_) => {
                    self.keep_standing(address.clone(), connection, true)
                }
                Ended::Lost(_) => connection.close(),
            }
            // A connection that ends soon after it was made backs off like a failed round, so
            // a flapping leader is not hammered; one that lasted starts the backoff afresh.
            if connected_at.elapsed() >= Duration::from_millis(BACKOFF_MAX_MS) {
                backoff_ms = BACKOFF_MIN_MS;
            }
            let follow = matches!(&ended, Ended::NotLeader(Some(_)));
            let lost = matches!(&ended, Ended::Lost(_) | Ended::Refused(_));
            match ended {
                Ended::NotLeader(hint) => {
                    tracing::info!(coordinator = %address, leader = ?hint, "no longer the leader; finding the new one");
                    preferred = hint;
                }
                Ended::NotRegistered => {
                    tracing::info!(coordinator = %address, "the leader asks this node to register again");
                    preferred = Some(address);
                }
                Ended::Lost(why) | Ended::Refused(why) => {
                    tracing::warn!(coordinator = %address, "lost the leader: {why}");
                    // Tried first again, alongside every other address.
                    preferred = Some(address);
                }
            }
            if !follow {
                let pause = Duration::from_millis(backoff_ms)
                    + if lost {
                        spread(&self.shared.node, RECONNECT_SPREAD_MS)
                    } else {
                        Duration::ZERO
                    };
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.wait_for(|stop| *stop) => break,
                }
                backoff_ms = (backoff_ms * 2).min(BACKOFF_MAX_MS);
            }
        }
        for (_, connection) in std::mem::take(&mut *self.standing()) {
            connection.close();
        }
        self.client.close();
        tracing::info!("session with the coordinators closed; jobs left running");
    }

    /// Looks for the leader at every address at once (`preferred` and the configured ones,
    /// plus those `NotLeader` answers name) until one registers this node; each failed address
    /// is retried after its own backoff. Runs until found (the caller selects on shutdown).
    async fn find_leader(&self, preferred: Option<String>) -> (PeerConnection, String, Timing) {
        let gpus = self.read_gpus().await;
        let started = Instant::now();
        let mut pending: FuturesUnordered<Attempt<'_>> = FuturesUnordered::new();
        let mut in_flight: BTreeSet<String> = BTreeSet::new();
        let mut backoff: BTreeMap<String, u64> = BTreeMap::new();
        // Each address's connect deadline ([`CONNECT_DEADLINE_MS`], doubled per failure).
        let mut connect_ms: BTreeMap<String, u64> = BTreeMap::new();
        // Why each address has not registered this node yet, for the search's warning.
        let mut why_not: BTreeMap<String, String> = BTreeMap::new();
        let first = Duration::from_millis(CONNECT_DEADLINE_MS);
        // Wakes an address's attempt from its backoff when a `NotLeader` answer names it.
        let mut wake: BTreeMap<String, Arc<Notify>> = BTreeMap::new();
        let mut redirects = 0;
        for address in preferred
            .into_iter()
            .chain(self.coordinators.iter().cloned())
        {
            if in_flight.insert(address.clone()) {
                let waker = wake.entry(address.clone()).or_default().clone();
                pending.push(self.attempt(address, Duration::ZERO, first, waker, &gpus));
            }
        }
        let warn_every = Duration::from_millis(SEARCH_WARN_INTERVAL_MS);
        let mut warn =
            tokio::time::interval_at(tokio::time::Instant::now() + warn_every, warn_every);
        loop {
            let next = tokio::select! {
                next = pending.next() => next,
                _ = warn.tick() => {
                    // Each address with what it last said: an expired or foreign certificate,
                    // say, shows here (found by probing: an agent whose certificate had
                    // expired said only that it found no leader).
                    let last: Vec<String> = why_not
                        .iter()
                        .map(|(address, why)| format!("{address}: {why}"))
                        .collect();
                    tracing::warn!(
                        coordinators = ?self.coordinators,
                        searching_ms = started.elapsed().as_millis() as u64,
                        "no leader found yet; still trying every coordinator (last: {})",
                        last.join("; ")
                    );
                    continue;
                }
            };
            let Some((address, result)) = next else {
                // No address at all (the configuration requires one): wait, then start over.
                tokio::time::sleep(Duration::from_millis(BACKOFF_MAX_MS)).await;
                for address in &self.coordinators {
                    if in_flight.insert(address.clone()) {
                        let waker = wake.entry(address.clone()).or_default().clone();
                        pending.push(self.attempt(
                            address.clone(),
                            Duration::ZERO,
                            first,
                            waker,
                            &gpus,
                        ));
                    }
                }
                continue;
            };
            in_flight.remove(&address);
            let configured = |address: &String| self.coordinators.contains(address);
            match result {
                Ok((connection, timing)) => {
                    tracing::info!(coordinator = %address, heartbeat_ms = timing.heartbeat_ms,
                        lease_ms = timing.lease_ms, searching_ms = started.elapsed().as_millis() as u64,
                        "registered with the leader");
                    return (connection, address, timing);
                }
                Err(Ended::NotLeader(Some(leader))) => {
                    tracing::debug!(coordinator = %address, %leader, "not the leader");
                    if in_flight.contains(&leader) {
                        // Being tried already: now rather than after its backoff.
                        if let Some(waker) = wake.get(&leader) {
                            waker.notify_one();
                        }
                    } else if configured(&leader) || redirects < REDIRECTS_MAX {
                        if !configured(&leader) {
                            redirects += 1;
                        }
                        tracing::info!(coordinator = %address, %leader, "not the leader; following");
                        in_flight.insert(leader.clone());
                        let waker = wake.entry(leader.clone()).or_default().clone();
                        let connect = connect_ms
                            .get(&leader)
                            .copied()
                            .unwrap_or(CONNECT_DEADLINE_MS);
                        pending.push(self.attempt(
                            leader,
                            Duration::ZERO,
                            Duration::from_millis(connect),
                            waker,
                            &gpus,
                        ));
                    }
                }
                Err(ended) => {
                    tracing::debug!(coordinator = %address, "no registration: {ended:?}");
                    let why = match ended {
                        Ended::Lost(why) | Ended::Refused(why) => why,
                        Ended::NotLeader(None) => "not the leader, and knows none".to_string(),
                        other => format!("{other:?}"),
                    };
                    why_not.insert(address.clone(), why);
                }
            }
            // Configured addresses are tried again, each after its own backoff.
            if configured(&address) && in_flight.insert(address.clone()) {
                let delay_ms = backoff.entry(address.clone()).or_insert(BACKOFF_MIN_MS);
                let delay = retry_delay(&self.shared.node, *delay_ms);
                *delay_ms = (*delay_ms * 2).min(BACKOFF_MAX_MS);
                let connect = connect_ms
                    .entry(address.clone())
                    .or_insert(CONNECT_DEADLINE_MS);
                *connect = (*connect * 2).min(CONNECT_DEADLINE_MAX_MS);
                let connect = Duration::from_millis(*connect);
                let waker = wake.entry(address.clone()).or_default().clone();
                pending.push(self.attempt(address, delay, connect, waker, &gpus));
            }
        }
    }

    /// After `delay` (or once `waker` is notified): connect to `address` (within
    /// `connect_deadline`) and register.
    fn attempt(
        &self,
        address: String,
        delay: Duration,
        connect_deadline: Duration,
        waker: Arc<Notify>,
        gpus: &[GpuDevice],
    ) -> Attempt<'_> {
        let gpus = gpus.to_vec();
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = waker.notified() => {}
                }
            }
            let (connection, standing) = match self.standing_to(&address) {
                Some(connection) => (connection, true),
                None => match self.connect(&address, connect_deadline).await {
                    Ok(connection) => (connection, false),
                    Err(ended) => return (address, Err(ended)),
                },
            };
            match self.register(&connection, gpus).await {
                Ok(timing) => {
                    let links = &self.shared.links;
                    if standing {
                        // It leads now: no longer a standing one (it serves logs already).
                        self.drop_standing(&address, &connection, false);
                        links.registered_standing.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.serve_logs(&connection);
                        links.registered_new.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(coordinator = %address, standing, "registered");
                    (address, Ok((connection, timing)))
                }
                Err(ended @ Ended::NotLeader(_)) => {
                    self.keep_standing(address.clone(), connection, standing);
                    (address, Err(ended))
                }
                Err(ended) => {
                    if standing {
                        self.drop_standing(&address, &connection, true);
                    } else {
                        connection.close();
                    }
                    (address, Err(ended))
                }
            }
        })
    }

    async fn register(
        &self,
        connection: &PeerConnection,
        gpus: Vec<GpuDevice>,
    ) -> Result<Timing, Ended> {
        let host = self.shared.host.borrow().clone();
        let inventory = NodeInventory {
            name: self.shared.node.clone(),
            host: host.clone(),
            gpus,
        };
        let actual = self.shared.actual.borrow().clone();
        let sent_at = Instant::now();
        let request = AgentRequest::Register {
            inventory,
            actual,
            cluster: self.shared.cluster.get(),
        };
        let response = connection
            .request::<_, AgentResponse>(&request, Duration::from_millis(REGISTER_DEADLINE_MS))
            .await
            .map_err(|error| Ended::Lost(error.to_string()))?;
        match response {
            AgentResponse::Registered {
                node_incarnation,
                agent_lease_ms,
                heartbeat_ms,
                cluster,
            } => {
                if let Err(error) = self.shared.cluster.learn(cluster) {
                    tracing::error!(
                        "a coordinator registered this node in another cluster: {error}"
                    );
                    return Err(Ended::Lost(error.to_string()));
                }
                let (lease_ms, heartbeat_ms) =
                    agreed_timing(agent_lease_ms, heartbeat_ms, self.lease_min_ms);
                self.shared.renew_lease(sent_at, Some(lease_ms));
                self.record_ack(sent_at);
                *self
                    .registered_host
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(host);
                tracing::debug!(node_incarnation, "registration acknowledged");
                Ok(Timing {
                    heartbeat_ms,
                    lease_ms,
                })
            }
            AgentResponse::Error(error @ AgentError::OtherCluster { .. }) => {
                tracing::error!("refused by the coordinators: {error}");
                Err(ended_by(error))
            }
            AgentResponse::Error(error) => Err(ended_by(error)),
            other => Err(Ended::Lost(format!(
                "unexpected answer to Register: {}",
                other.kind()
            ))),
        }
    }

    /// The inventory now (NVML calls block, so off the async threads); the last one read if
    /// the backend fails.
    async fn read_gpus(&self) -> Vec<GpuDevice> {
        let backend = self.shared.backend.clone();
        let read = tokio::task::spawn_blocking(move || backend.inventory()).await;
        let mut gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
        match read {
            Ok(Ok(statuses)) => *gpus = to_gpu_devices(&statuses),
            Ok(Err(error)) => tracing::warn!("cannot read the GPUs: {error}"),
            Err(error) => tracing::warn!("the GPU read failed: {error}"),
        }
        gpus.clone()
    }

    fn record_ack(&self, sent_at: Instant) {
        let mut last = self
            .last_ack_recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < Duration::from_millis(ACK_RECORD_INTERVAL_MS)) {
            return;
        }
        let unix_ms = SystemTime::now()
            .checked_sub(sent_at.elapsed())
            .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
            .map(|since| since.as_millis() as u64);
        let boot = crate::lease::boot_id().and_then(|boot_id| {
            let boot_ms =
                crate::lease::boot_time_ms()?.checked_sub(sent_at.elapsed().as_millis() as u64)?;
            Some(crate::journal::BootStamp { boot_id, boot_ms })
        });
        if let Some(unix_ms) = unix_ms {
            match self.shared.journal().record_ack(unix_ms, boot) {
                Ok(()) => *last = Some(Instant::now()),
                Err(error) => tracing::warn!("cannot record the heartbeat answer: {error}"),
            }
        }
    }

    async fn heartbeat_loop(&self, connection: &PeerConnection, timing: Timing) -> Ended {
        let mut interval = tokio::time::interval(Duration::from_millis(timing.heartbeat_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A leader that is there but acknowledges no heartbeat gets `leader_patience_ms`
        // before the search for the leader; the lease runs from the last acknowledged
        // heartbeat either way.
        let mut patience = LeaderPatience::new(timing.lease_ms);
        loop {
            interval.tick().await;
            let gpus = self.read_gpus().await;
            let actual = self.shared.actual.borrow().clone();
            let request = AgentRequest::Heartbeat {
                node: self.shared.node.clone(),
                gpus,
                actual,
            };
            let sent_at = Instant::now();
            let heard = connection.datagrams_received();
            let deadline = heartbeat_deadline_on(timing.lease_ms, connection.connection().rtt());
            let result = connection
                .request::<_, AgentResponse>(&request, deadline)
                .await;
            let heard_meanwhile = connection.datagrams_received() > heard;
            let unacknowledged = match HeartbeatAnswer::of(result, heard_meanwhile) {
                HeartbeatAnswer::Acknowledged => {
                    if let Some(failing) = patience.acknowledged() {
                        tracing::info!(
                            "the leader acknowledges heartbeats again, after {} ms",
                            failing.as_millis()
                        );
                    }
                    self.shared.renew_lease(sent_at, None);
                    self.record_ack(sent_at);
                    continue;
                }
                HeartbeatAnswer::Unavailable(why) => {
                    self.shared
                        .links
                        .heartbeats_refused
                        .fetch_add(1, Ordering::Relaxed);
                    format!("refused: {why}")
                }
                HeartbeatAnswer::Late => {
                    self.shared
                        .links
                        .heartbeats_late
                        .fetch_add(1, Ordering::Relaxed);
                    format!("unanswered within {} ms", deadline.as_millis())
                }
                // Any other error is enough to look for the leader again.
                HeartbeatAnswer::Error(error) => {
                    return match ended_by(error) {
                        Ended::Lost(why) => Ended::Refused(format!("heartbeat refused: {why}")),
                        ended => ended,
                    }
                }
                HeartbeatAnswer::Failed(why) => return Ended::Lost(why),
            };
            match patience.unacknowledged(sent_at) {
                Ok(()) => tracing::debug!(
                    "heartbeat {unacknowledged}; the leader is there, trying it again"
                ),
                // Still there: its connection stays as a standing one.
                Err(failing) => {
                    return Ended::Refused(format!(
                        "no heartbeat acknowledged for {} ms, the last {unacknowledged}",
                        failing.as_millis()
                    ))
                }
            }
        }
    }

    async fn watch_loop(&self, connection: &PeerConnection) -> Ended {
        // The first poll on a connection asks for whatever the leader has, at once.
        let mut after = Fence::default();
        let deadline = Duration::from_millis(WATCH_TIMEOUT_MS + WATCH_DEADLINE_MARGIN_MS);
        let mut backoff_ms = BACKOFF_MIN_MS;
        loop {
            if self.shared.desired_wanted.swap(false, Ordering::SeqCst) {
                after = Fence::default();
            }
            let request = AgentRequest::WatchDesired {
                node: self.shared.node.clone(),
                after_fence: after,
            };
            match connection
                .request::<_, AgentResponse>(&request, deadline)
                .await
            {
                Ok(AgentResponse::Desired(state)) => {
                    backoff_ms = BACKOFF_MIN_MS;
                    let newer = state.fence > after;
                    let first = after == Fence::default();
                    after = after.max(state.fence);
                    if newer || first {
                        self.accept_desired(state).await;
                    }
                    if !newer {
                        tokio::time::sleep(Duration::from_millis(WATCH_REPOLL_MS)).await;
                    }
                    continue;
                }
                Ok(AgentResponse::Error(error)) => match ended_by(error) {
                    ended @ (Ended::NotLeader(_) | Ended::NotRegistered) => return ended,
                    Ended::Lost(why) | Ended::Refused(why) => {
                        tracing::warn!("desired-state poll refused: {why}")
                    }
                },
                Ok(other) => tracing::warn!(
                    "unexpected answer to a desired-state poll: {}",
                    other.kind()
                ),
                Err(RequestError::ConnectionLost(error)) => return Ended::Lost(error.to_string()),
                Err(RequestError::Timeout { .. }) => {
                    tracing::debug!("desired-state poll unanswered; polling again");
                    continue;
                }
                Err(error) => tracing::warn!("refused a bad desired-state answer: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(BACKOFF_MAX_MS);
        }
    }

    /// Checks a desired state and hands it to the executor loop; refuses (and logs) a whole
    /// state for another node, an older or empty fence, or too many allocations, and each
    /// allocation that is malformed for this node. A refused allocation is absent from the
    /// state the executor sees: nothing of it is started, and an attempt of it already running
    /// here is stopped, the safe direction when the leader's view of this node is wrong.
    async fn accept_desired(&self, state: DesiredState) {
        if state.node != self.shared.node {
            tracing::error!(node = %state.node, "refused a desired state for another node");
            return;
        }
        if state.fence == Fence::default() {
            tracing::debug!("the leader has no desired state for this node yet");
            return;
        }
        if state.allocations.len() > DESIRED_ALLOCATIONS_MAX {
            tracing::error!(
                allocations = state.allocations.len(),
                "refused a desired state with more than {DESIRED_ALLOCATIONS_MAX} allocations"
            );
            return;
        }
        {
            let mut last = self.last_fence.lock().unwrap_or_else(|p| p.into_inner());
            if state.fence < *last {
                tracing::warn!(fence = ?state.fence, last = ?*last, "ignored a desired state older than the last one");
                return;
            }
            *last = state.fence;
        }
        let gpus = {
            let gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
            gpus.iter()
                .map(|gpu| (gpu.index, gpu.uuid.clone()))
                .collect::<BTreeMap<u32, String>>()
        };
        let gpus = if gpus.is_empty() {
            self.read_gpus()
                .await
                .into_iter()
                .map(|gpu| (gpu.index, gpu.uuid))
                .collect()
        } else {
            gpus
        };
        let actual: BTreeSet<(quotient_common::JobId, u32)> = self
            .shared
            .actual
            .borrow()
            .iter()
            .map(|attempt| (attempt.job, attempt.attempt))
            .collect();
        let mut allocations = Vec::new();
        for mut allocation in state.allocations {
            if let Err(problem) = check_allocation(&allocation, &gpus) {
                let here = actual.contains(&(allocation.job, allocation.attempt));
                if !here || allocation.intent == WireIntent::Stop {
                    tracing::error!(job = %allocation.job, attempt = allocation.attempt, fence = ?state.fence,
                        "refused an allocation: {problem}; nothing started");
                    continue;
                }
                // An attempt running here that its allocation no longer fits (the node came
                // back without its GPU, say): stopped as a stop is, with its checkpoint
                // signal and grace period, rather than killed for want of an allocation.
                // The coordinators stop such a job themselves once they see the node.
                tracing::warn!(job = %allocation.job, attempt = allocation.attempt, fence = ?state.fence,
                    "the allocation of an attempt running here does not fit this node: {problem}; stopping it with its checkpoint signal");
                allocation.intent = WireIntent::Stop;
                if let Err(problem) = check_allocation(&allocation, &gpus) {
                    tracing::error!(job = %allocation.job, attempt = allocation.attempt, fence = ?state.fence,
                        "refused an allocation: {problem}");
                    continue;
                }
            }
            if allocation.intent == WireIntent::Stop
                && !actual.contains(&(allocation.job, allocation.attempt))
            {
                // Usual when a job is preempted before it started: the executor stops it if it
                // starts it meanwhile, or reports it stopped (a warning here read as if the
                // agent reported a stop of an attempt it then started; found by probing).
                tracing::debug!(job = %allocation.job, attempt = allocation.attempt,
                    "asked to stop an attempt not running here yet");
            }
            allocations.push(desired_allocation(allocation));
        }
        // One per change of this node's state: a debug line (found by a soak: with the
        // scheduler's "plan committed" it made most of a busy agent's 60-85 KB of log a
        // minute; each attempt's start, signal and exit has its own line).
        tracing::debug!(fence = ?state.fence, allocations = allocations.len(), "new desired state");
        self.shared.desired.send_replace(Some(Desired {
            fence: state.fence.as_u64(),
            allocations,
        }));
    }

    async fn report_loop(&self, connection: &PeerConnection) -> Ended {
        let mut backoff_ms = BACKOFF_MIN_MS;
        loop {
            let batch = self.shared.journal().pending(REPORTS_PER_REQUEST_MAX);
            if batch.is_empty() {
                tokio::select! {
                    _ = self.shared.reports_ready.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(REPORT_RECHECK_MS)) => {}
                }
                continue;
            }
            let sequences: Vec<u64> = batch.iter().map(|pending| pending.sequence).collect();
            let request = AgentRequest::Report {
                node: self.shared.node.clone(),
                reports: batch.into_iter().map(|pending| pending.report).collect(),
            };
            let failure = match connection
                .request::<_, AgentResponse>(&request, Duration::from_millis(REPORT_DEADLINE_MS))
                .await
            {
                Ok(AgentResponse::Reported { rejected }) => {
                    for (job, attempt, why) in rejected.iter().take(REPORTS_PER_REQUEST_MAX) {
                        tracing::info!(%job, attempt, "the leader rejected a report: {why}");
                    }
                    if let Err(error) = self.shared.journal().acknowledge(&sequences) {
                        tracing::error!("cannot write the journal: {error}");
                    }
                    tracing::debug!(reports = sequences.len(), "reports acknowledged");
                    backoff_ms = BACKOFF_MIN_MS;
                    continue;
                }
                Ok(AgentResponse::Error(AgentError::BadRequest(why))) => {
                    // A refusal for good: retrying the same batch would block every later one.
                    tracing::error!(
                        "the leader refused {} reports for good: {why}; dropping them",
                        sequences.len()
                    );
                    if let Err(error) = self.shared.journal().acknowledge(&sequences) {
                        tracing::error!("cannot write the journal: {error}");
                    }
                    continue;
                }
                Ok(AgentResponse::Error(error)) => match ended_by(error) {
                    ended @ (Ended::NotLeader(_) | Ended::NotRegistered) => return ended,
                    Ended::Lost(why) | Ended::Refused(why) => why,
                },
                Ok(other) => format!("unexpected answer: {}", other.kind()),
                Err(RequestError::ConnectionLost(error)) => return Ended::Lost(error.to_string()),
                Err(error) => error.to_string(),
            };
            tracing::warn!("reports not delivered, retrying: {failure}");
            tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(BACKOFF_MAX_MS);
        }
    }

    /// Registers again on this connection whenever the host info differs from what the
    /// leader last acknowledged (an image loaded, Docker started or stopped): the
    /// coordinators update the node's record, and jobs on GPUs it still reports keep running
    /// (`register_node`). A failed registration ends the connection; the next one registers
    /// afresh.
    async fn host_loop(&self, connection: &PeerConnection) -> Ended {
        let mut host = self.shared.host.clone();
        host.mark_changed();
        loop {
            if host.changed().await.is_err() {
                // The host task ended (shutdown): nothing more to send.
                std::future::pending::<()>().await;
            }
            let current = host.borrow_and_update().clone();
            let registered = self
                .registered_host
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if registered.as_ref() == Some(&current) {
                continue;
            }
            tracing::info!(runtimes = ?current.runtimes, images = current.images.len(),
                cpu_millis = current.cpu_millis, memory_bytes = current.memory_bytes,
                "the host changed; registering again");
            let gpus = self.read_gpus().await;
            if let Err(ended) = self.register(connection, gpus).await {
                return ended;
            }
        }
    }

    /// Sends the disk use to the leader: the last measured on each new connection, then each
    /// new measurement. Only a lost connection or a leader change ends it: a refusal (a
    /// coordinator too old to know the request refuses its frame) is logged and the next
    /// measurement tried.
    async fn disk_usage_loop(&self, connection: &PeerConnection) -> Ended {
        let mut measured = self.shared.disk_usage.clone();
        measured.mark_changed();
        loop {
            if measured.changed().await.is_err() {
                // The disk task ended (shutdown): nothing more to send.
                std::future::pending::<()>().await;
            }
            let Some(usage) = *measured.borrow_and_update() else {
                continue;
            };
            let request = AgentRequest::DiskUsage {
                node: self.shared.node.clone(),
                usage,
            };
            let failure = match connection
                .request::<_, AgentResponse>(
                    &request,
                    Duration::from_millis(DISK_USAGE_DEADLINE_MS),
                )
                .await
            {
                Ok(AgentResponse::DiskUsageRecorded) => continue,
                Ok(AgentResponse::Error(error)) => match ended_by(error) {
                    ended @ (Ended::NotLeader(_) | Ended::NotRegistered) => return ended,
                    Ended::Lost(why) | Ended::Refused(why) => why,
                },
                Ok(other) => format!("unexpected answer: {}", other.kind()),
                Err(RequestError::ConnectionLost(error)) => return Ended::Lost(error.to_string()),
                Err(error) => error.to_string(),
            };
            tracing::debug!("the leader did not take the disk use: {failure}");
        }
    }
}

fn ended_by(error: AgentError) -> Ended {
    match error {
        AgentError::NotLeader { leader_address, .. } => Ended::NotLeader(
            leader_address
                .filter(|address| !address.is_empty() && address.len() <= LEADER_ADDRESS_BYTES_MAX),
        ),
        AgentError::NotRegistered => Ended::NotRegistered,
        other => Ended::Lost(other.to_string()),
    }
}

/// Whether one allocation fits this node: GPU indices it has, each once, UUIDs (when given)
/// that match them. A stop needs no GPU: an allocation to stop may name GPUs this node no
/// longer has (it came back without them), and is taken, so that the attempt is stopped, or
/// reported stopped when it does not run here.
pub fn check_allocation(
    allocation: &WireAllocation,
    gpus: &BTreeMap<u32, String>,
) -> Result<(), String> {
    let stop = allocation.intent == WireIntent::Stop;
    let mut seen = BTreeSet::new();
    for index in &allocation.gpu_indices {
        if !stop && !gpus.contains_key(index) {
            return Err(format!(
                "GPU index {index} does not exist on this node (it has {})",
                gpus.len()
            ));
        }
        if !seen.insert(*index) {
            return Err(format!("GPU index {index} is named twice"));
        }
    }
    if !allocation.gpu_uuids.is_empty() && !stop {
        if allocation.gpu_uuids.len() != allocation.gpu_indices.len() {
            return Err("GPU UUIDs and indices differ in number".to_string());
        }
        for (index, uuid) in allocation.gpu_indices.iter().zip(&allocation.gpu_uuids) {
            if gpus.get(index) != Some(uuid) {
                return Err(format!("GPU {index} is not {uuid:?} on this node"));
            }
        }
    }
    if let Some(gang) = &allocation.gang {
        let nodes = gang.hosts.len();
        if nodes < 2 || nodes > quotient_common::job::JOB_NODES_MAX as usize {
            return Err(format!(
                "a job of {nodes} nodes is not a job of several nodes"
            ));
        }
        if gang.rank as usize >= nodes {
            return Err(format!("rank {} of a job of {nodes} nodes", gang.rank));
        }
        if let Some(host) = gang.hosts.iter().find(|h| h.is_empty() || h.len() > 255) {
            return Err(format!(
                "peer address {host:?} is not a host name or address"
            ));
        }
    }
    Ok(())
}

/// The reconcile form of a wire allocation.
pub fn desired_allocation(allocation: WireAllocation) -> DesiredAllocation {
    DesiredAllocation {
        job: allocation.job,
        attempt: allocation.attempt,
        gpu_indices: allocation.gpu_indices,
        spec: allocation.spec,
        intent: match allocation.intent {
            WireIntent::Run => Intent::Run,
            WireIntent::Stop => Intent::Stop,
        },
        limits: crate::runtime::JobLimits {
            cpu_millis: allocation.cpu_millis,
            memory_bytes: allocation.memory_bytes,
        },
        gang: allocation.gang,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::{JobId, JobSpec};

    #[test]
    fn reconnects_after_a_lost_leader_are_spread_and_bounded() {
        // Proves the spread: never past its bound, and not one value for a fleet.
        let pauses: BTreeSet<Duration> = (0..200)
            .map(|i| spread(&format!("node-{i}"), RECONNECT_SPREAD_MS))
            .collect();
        assert!(pauses
            .iter()
            .all(|pause| *pause <= Duration::from_millis(RECONNECT_SPREAD_MS)));
        assert!(pauses.len() > 100, "{} distinct pauses", pauses.len());
    }

    #[test]
    fn a_fleet_retries_an_address_apart_and_within_half_again_its_backoff() {
        for backoff_ms in [BACKOFF_MIN_MS, BACKOFF_MAX_MS] {
            let delays: BTreeSet<Duration> = (0..200)
                .map(|i| retry_delay(&format!("node-{i}"), backoff_ms))
                .collect();
            assert!(delays.iter().all(|delay| {
                *delay >= Duration::from_millis(backoff_ms)
                    && *delay <= Duration::from_millis(backoff_ms + backoff_ms / 2)
            }));
            assert!(
                delays.len() > 30,
                "{backoff_ms}: {} distinct delays",
                delays.len()
            );
        }
    }

    fn allocation(indices: Vec<u32>, uuids: Vec<&str>) -> WireAllocation {
        WireAllocation {
            job: JobId(1),
            attempt: 1,
            gpu_indices: indices,
            gpu_uuids: uuids.into_iter().map(str::to_string).collect(),
            spec: JobSpec::new("qs1", 1, 1, vec!["true".into()]),
            intent: WireIntent::Run,
            cpu_millis: 0,
            memory_bytes: 0,
            gang: None,
        }
    }

    /// Allocations naming GPUs the node lacks, twice, or with the wrong UUID are refused.
    #[test]
    fn allocations_must_name_this_nodes_gpus() {
        let gpus = BTreeMap::from([(0, "GPU-a".to_string()), (1, "GPU-b".to_string())]);
        assert_eq!(
            check_allocation(&allocation(vec![1], vec![]), &gpus),
            Ok(())
        );
        assert_eq!(
            check_allocation(&allocation(vec![0, 1], vec!["GPU-a", "GPU-b"]), &gpus),
            Ok(())
        );
        assert!(check_allocation(&allocation(vec![5], vec![]), &gpus)
            .unwrap_err()
            .contains("does not exist"));
        assert!(check_allocation(&allocation(vec![0, 0], vec![]), &gpus).is_err());
        assert!(check_allocation(&allocation(vec![0], vec!["GPU-b"]), &gpus).is_err());
        // A stop is taken even on GPUs the node no longer has, UUID and all: it starts
        // nothing, and its attempt must be stopped or reported stopped.
        let mut stop = allocation(vec![5], vec![""]);
        stop.intent = WireIntent::Stop;
        assert_eq!(check_allocation(&stop, &gpus), Ok(()));
    }

    /// Heartbeat deadlines stay within a quarter of the lease.
    #[test]
    fn heartbeat_deadline_fits_the_lease() {
        assert_eq!(heartbeat_deadline(1_000), Duration::from_millis(250));
        assert_eq!(
            heartbeat_deadline(60_000),
            Duration::from_millis(HEARTBEAT_DEADLINE_MS)
        );
        // A near path keeps the deadline; a far one gets three round trips, within a
        // quarter of the lease.
        let ms = Duration::from_millis;
        assert_eq!(
            heartbeat_deadline_on(10_000, ms(1)),
            ms(HEARTBEAT_DEADLINE_MS)
        );
        assert_eq!(heartbeat_deadline_on(10_000, ms(600)), ms(1_800));
        assert_eq!(heartbeat_deadline_on(10_000, ms(2_000)), ms(2_500));
        assert_eq!(heartbeat_deadline_on(1_000, ms(600)), ms(250));
    }
}
