//! The Raft network between coordinators: openraft's [`RaftNetworkFactory`] and
//! [`RaftNetwork`] over QUIC with mutual TLS (ALPN `quotient-raft/1`).
//!
//! Each Raft RPC is one request on its own QUIC stream ([`quotient_common::transport`]): a
//! [`RaftRequest`] frame out, a [`RaftResponse`] frame back, within the deadline openraft
//! gives (`RPCOption::soft_ttl`, capped by [`RAFT_RPC_TIMEOUT_MAX_MS`]). All RPCs to one peer
//! share one connection, kept in a [`PeerConnections`] pool and replaced when it fails;
//! openraft's own backoff spaces out reconnects to a peer that is down. Snapshots go in
//! chunks of `config::SNAPSHOT_CHUNK_BYTES` through openraft's default `full_snapshot`, so
//! every frame stays under the frame limit. The peer must present a coordinator certificate,
//! or the connection is dropped as unreachable.
//!
//! The pool also records when each peer last answered, which `quotient cluster status`
//! reports as `reachable`.
//!
//! Every request travels in a [`RaftEnvelope`] that names the sender's cluster, the member it
//! is for, and whether the sender counts that member as a voter. The receiver refuses
//! ([`RaftRefusal`]) a request of another cluster, for another member, a vote request while it
//! has joined no cluster, and entries it would take as a voter while its data directory is
//! empty (see `identity`); the sender takes a refusal as the peer being unreachable, so
//! openraft backs off, logs it (at most every `identity::REFUSAL_LOG_INTERVAL_MS`) and shows
//! it in `quotient cluster status`.
//!
//! The commit index an AppendEntries carries is never ahead of this node's committed id on
//! disk: the log store lets openraft count the leader's own entries before they are synced
//! (see `store::log_writer`), so a follower must not apply an entry that the leader could
//! still lose. Holding it back instead of waiting keeps replication going at once; followers
//! learn the newer commit index with the next AppendEntries or heartbeat, and so save it in
//! the same write as the entries that come with it.
//!
//! An AppendEntries of several entries carries a limited number of bytes of them: openraft
//! 0.9 gives it only the heartbeat interval to be answered, and sends a follower that fell
//! behind up to `config::APPEND_ENTRIES_MAX` entries at once, which with large entries would
//! miss that deadline on every try. The limit adapts to each peer ([`BatchBytes`]: halved on a
//! timeout, doubled back on answers, at most `config::APPEND_ENTRIES_BYTES_MAX`). Over the
//! limit, openraft is told the payload is too large, with how many entries fit
//! ([`PayloadTooLarge`]), and sends those.
//!
//! An AppendEntries that would tell a follower nothing is not sent ([`Acknowledged`]).
//! openraft 0.9 sends each follower an empty AppendEntries whenever the leader's commit index
//! moves; at that moment the leader's own committed id is still being synced, so the commit
//! index above holds it back to what the follower already has, and the request would carry the
//! same vote, log position and commit index the follower acknowledged a moment before. Within
//! [`REDUNDANT_APPEND_WINDOW_MS`] of that acknowledgement such a request is answered here with
//! the follower's last answer, success. That spares each follower a request and an answer per
//! write, and the CPU to handle them (BENCHMARKS.md has the measurements).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, LogId, RPCTypes, RaftMetrics, Vote};
use quotient_common::certs::Role;
use quotient_common::frame::{FrameError, WireMessage};
use quotient_common::transport::{Client, PeerConnection, RequestError, ALPN_RAFT};
use quotient_common::version::{Encoding, RAFT_WIRE};
use quotient_common::ClusterId;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::APPEND_ENTRIES_BYTES_MAX;
use crate::identity::{ClusterIdentity, REFUSAL_HEALTH_WINDOW_MS, REFUSAL_LOG_INTERVAL_MS};
use crate::store::codec::encoded_len;
use crate::store::log_store::LogDurability;
use crate::store::type_config::Entry;
use crate::store::{MemberId, QuotientStateMachine, TypeConfig};

/// The longest any single Raft RPC may take, whatever openraft asks (milliseconds).
pub const RAFT_RPC_TIMEOUT_MAX_MS: u64 = 30_000;
/// How often, at most, a coordinator says that its Raft timing is too tight for the network
/// to one peer (milliseconds).
pub const SLOW_NETWORK_SAID_EVERY_MS: u64 = 60_000;
/// A peer that answered within this long counts as reachable (milliseconds).
pub const REACHABLE_WINDOW_MS: u64 = 3_000;
/// Consecutive timed-out RPCs after which a peer's connection is presumed dead and
/// replaced. One timeout alone may be a slow disk on a healthy connection (openraft gives
/// an AppendEntries only a heartbeat interval), and reconnecting then would only add a
/// handshake to the delay; a connection to a peer that restarted never answers again.
pub const RECONNECT_AFTER_TIMEOUTS: u32 = 3;
/// How long after a follower acknowledged an AppendEntries an empty one that repeats it
/// exactly is answered without sending it (milliseconds). Far below the heartbeat interval
/// and the election timeout, so a follower still hears from its leader as often as before;
/// openraft counts the answer as the follower's at the time of the call, which is at most this
/// much later than the follower's real one, against the one-second quorum-ack bound agents are
/// served under (`agent_service::LEADER_QUORUM_ACK_MAX_MS`).
pub const REDUNDANT_APPEND_WINDOW_MS: u64 = 5;

/// One Raft RPC on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<MemberId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

/// A [`RaftRequest`] with what the receiver checks before its Raft sees it.
#[derive(Debug, Serialize, Deserialize)]
pub struct RaftEnvelope {
    /// The sender's cluster.
    pub cluster: ClusterId,
    /// The member the sender means to reach.
    pub to: MemberId,
    /// Whether the sender's membership counts `to` as a voter (in either half of a joint one).
    pub to_voter: bool,
    pub request: RaftRequest,
}

impl WireMessage for RaftRequest {
    const ENCODING: Encoding = RAFT_WIRE;
}

impl WireMessage for RaftEnvelope {
    const ENCODING: Encoding = RAFT_WIRE;
}

/// The answer to a [`RaftRequest`]: the receiving Raft's result, error included, or the
/// receiver's refusal to hand it to its Raft at all.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftResponse {
    AppendEntries(Result<AppendEntriesResponse<MemberId>, RaftError<MemberId>>),
    Vote(Result<VoteResponse<MemberId>, RaftError<MemberId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<MemberId>, RaftError<MemberId, InstallSnapshotError>>,
    ),
    Refused(RaftRefusal),
}

impl WireMessage for RaftResponse {
    const ENCODING: Encoding = RAFT_WIRE;
}

/// Why a coordinator would not hand a Raft request to its Raft. Each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RaftRefusal {
    #[error("coordinator {member} belongs to cluster {member_cluster}, but a coordinator of cluster {sender_cluster} sent it a Raft request: two clusters' members are listed together (a data directory copied from another cluster, or a wrong --peers or add-member address); give each cluster its own members and data directories")]
    OtherCluster {
        member: MemberId,
        member_cluster: ClusterId,
        sender_cluster: ClusterId,
    },
    #[error("a Raft request for coordinator {addressed} reached coordinator {member}: the address the cluster has for {addressed} leads to {member}; correct it (`quotient cluster remove-member --id {addressed}`, then `add-member` with the right address)")]
    OtherMember {
        member: MemberId,
        addressed: MemberId,
    },
    #[error("coordinator {member} has joined no cluster (its data directory holds no Raft state), so it does not vote; bootstrap a new cluster with `quotient cluster init`, or add it to this one with `quotient cluster add-member --id {member} --address ADDR`")]
    NotJoined { member: MemberId },
    #[error("cluster {cluster} counts coordinator {member} as a voter, but its data directory is empty (wiped or replaced?): a voter that lost its log and vote cannot vote or acknowledge entries safely. Remove it and add it back, as a new member that copies the log first: `quotient cluster remove-member --id {member}`, then `quotient cluster add-member --id {member} --address ADDR`")]
    EmptyVoter {
        member: MemberId,
        cluster: ClusterId,
    },
}

impl RaftRefusal {
    /// A fixed name per kind, for logs and the health report.
    pub fn kind(&self) -> &'static str {
        match self {
            RaftRefusal::OtherCluster { .. } => "other-cluster",
            RaftRefusal::OtherMember { .. } => "other-member",
            RaftRefusal::NotJoined { .. } => "not-joined",
            RaftRefusal::EmptyVoter { .. } => "empty-voter",
        }
    }
}

/// A pooled connection to one peer: the address it was made to, and the connection.
#[derive(Debug, Clone)]
struct Pooled {
    address: String,
    connection: PeerConnection,
}

/// A peer's latest refusal, and when it was last logged.
#[derive(Debug)]
struct PeerRefusal {
    refusal: RaftRefusal,
    seen: Instant,
    logged: Instant,
}

#[derive(Debug, Default)]
struct PoolInner {
    connections: BTreeMap<MemberId, Pooled>,
    last_answer: BTreeMap<MemberId, Instant>,
    timeouts_in_a_row: BTreeMap<MemberId, u32>,
    refusals: BTreeMap<MemberId, PeerRefusal>,
    /// When a slow network to each peer was last said ([`PeerConnections::slow_network`]).
    slow_said: BTreeMap<MemberId, Instant>,
}

/// Connections to the other coordinators, one per peer, shared by every Raft RPC; cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct PeerConnections {
    client: Arc<Client>,
    durability: LogDurability<MemberId>,
    identity: ClusterIdentity,
    /// This node's Raft metrics, for the membership: set once Raft exists
    /// ([`PeerConnections::watch_membership`]).
    metrics: Arc<OnceLock<watch::Receiver<RaftMetrics<MemberId, BasicNode>>>>,
    /// The replicated state, for its revocations: nothing is sent to a member whose
    /// certificate is revoked ([`PeerConnections::with_revocations`]).
    state: Option<QuotientStateMachine>,
    inner: Arc<Mutex<PoolInner>>,
}

impl PeerConnections {
    /// A pool that connects with `client` (this coordinator's certificate), sends requests
    /// as a member of `identity`'s cluster, and holds the commit index it sends to what
    /// `durability` says is on this node's disk.
    pub fn new(
        client: Arc<Client>,
        durability: LogDurability<MemberId>,
        identity: ClusterIdentity,
    ) -> Self {
        PeerConnections {
            client,
            durability,
            identity,
            metrics: Arc::new(OnceLock::new()),
            state: None,
            inner: Arc::new(Mutex::new(PoolInner::default())),
        }
    }

    /// Sends nothing to a member whose certificate `state` has revoked (its name, or its
    /// serial): a coordinator whose key leaked is cut off from the cluster's entries.
    pub fn with_revocations(mut self, state: QuotientStateMachine) -> Self {
        self.state = Some(state);
        self
    }

    /// Why the member behind `connection` may be sent nothing: its certificate is revoked.
    fn revoked(&self, connection: &PeerConnection) -> Option<String> {
        let state = self.state.as_ref()?;
        let peer = connection.peer();
        state.is_revoked(peer, connection.serial()).then(|| {
            format!(
                "the certificate of {} is revoked: nothing is sent to it",
                peer.name
            )
        })
    }

    /// Reads the membership from `metrics` (this node's Raft's) from now on.
    pub fn watch_membership(&self, metrics: watch::Receiver<RaftMetrics<MemberId, BasicNode>>) {
        let _ = self.metrics.set(metrics);
    }

    /// Whether this node's membership counts `peer` as a voter; `true` when it cannot tell,
    /// the cautious answer (an empty member then refuses rather than joins).
    fn counts_as_voter(&self, peer: MemberId) -> bool {
        self.metrics.get().is_none_or(|metrics| {
            metrics
                .borrow()
                .membership_config
                .membership()
                .voter_ids()
                .any(|voter| voter == peer)
        })
    }

    /// Why `peer` last refused this node's Raft requests, if it did within
    /// `identity::REFUSAL_HEALTH_WINDOW_MS`.
    pub fn refusal(&self, peer: MemberId) -> Option<String> {
        self.lock().refusals.get(&peer).and_then(|refused| {
            (refused.seen.elapsed() < Duration::from_millis(REFUSAL_HEALTH_WINDOW_MS))
                .then(|| refused.refusal.to_string())
        })
    }

    /// Records that `peer` refused a request, and logs it unless the same refusal was logged
    /// within `identity::REFUSAL_LOG_INTERVAL_MS`.
    fn record_refusal(&self, peer: MemberId, refusal: &RaftRefusal) {
        let now = Instant::now();
        let mut inner = self.lock();
        let logged = match inner.refusals.get(&peer) {
            Some(previous)
                if previous.refusal == *refusal
                    && now.duration_since(previous.logged)
                        < Duration::from_millis(REFUSAL_LOG_INTERVAL_MS) =>
            {
                previous.logged
            }
            _ => {
                tracing::error!(peer, "coordinator {peer} refused a Raft request: {refusal}");
                now
            }
        };
        inner.refusals.insert(
            peer,
            PeerRefusal {
                refusal: refusal.clone(),
                seen: now,
                logged,
            },
        );
    }

    /// The QUIC client the pool connects with (this coordinator's certificate).
    pub fn client(&self) -> Arc<Client> {
        Arc::clone(&self.client)
    }

    fn lock(&self) -> MutexGuard<'_, PoolInner> {
        // The pool holds no invariant a panic could break; keep using it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `peer` answered a Raft RPC within [`REACHABLE_WINDOW_MS`].
    pub fn is_reachable(&self, peer: MemberId) -> bool {
        self.lock()
            .last_answer
            .get(&peer)
            .is_some_and(|at| at.elapsed() < Duration::from_millis(REACHABLE_WINDOW_MS))
    }

    fn record_answer(&self, peer: MemberId) {
        let mut inner = self.lock();
        inner.last_answer.insert(peer, Instant::now());
        inner.timeouts_in_a_row.remove(&peer);
    }

    /// Says, at most once a minute per peer, that Raft requests to `peer` time out after
    /// `deadline` while the network's round trip to it, as QUIC measures it, is `rtt`: at half
    /// the deadline or more, the Raft timing is too tight for the network, and only an
    /// operator can change it (found by probing: with 120 ms between coordinators every
    /// AppendEntries and vote timed out, the term climbed past 150 and no log said why).
    fn slow_network(&self, peer: MemberId, address: &str, deadline: Duration, rtt: Duration) {
        if rtt * 2 < deadline {
            return;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        let said = inner.slow_said.get(&peer).is_some_and(|at| {
            now.duration_since(*at) < Duration::from_millis(SLOW_NETWORK_SAID_EVERY_MS)
        });
        if said {
            return;
        }
        inner.slow_said.insert(peer, now);
        tracing::warn!(
            peer,
            %address,
            deadline_ms = deadline.as_millis() as u64,
            rtt_ms = rtt.as_millis() as u64,
            "Raft requests to coordinator {peer} time out after {} ms, while the network's round trip to it is {} ms: the Raft timing is too tight for this network, and the cluster may lose its leader again and again. Raise --heartbeat-ms to at least 3 round trips, and --election-timeout-min-ms and --election-timeout-max-ms to about 5 and 8 times that, on every coordinator (see \"The network between coordinators, and to agents\" in the operations guide)",
            deadline.as_millis(),
            rtt.as_millis()
        );
    }

    /// Counts a timed-out RPC; whether the connection should now be replaced.
    fn record_timeout(&self, peer: MemberId) -> bool {
        let mut inner = self.lock();
        let count = inner.timeouts_in_a_row.entry(peer).or_insert(0);
        *count += 1;
        if *count >= RECONNECT_AFTER_TIMEOUTS {
            *count = 0;
            return true;
        }
        false
    }

    /// The pooled connection to `peer` at `address`, or a new one.
    async fn connection(&self, peer: MemberId, address: &str) -> Result<PeerConnection, String> {
        if let Some(pooled) = self.lock().connections.get(&peer) {
            if pooled.address == address && pooled.connection.is_open() {
                return Ok(pooled.connection.clone());
            }
        }
        let connection = self
            .client
            .connect_to(address, ALPN_RAFT)
            .await
            .map_err(|error| format!("{error:#}"))?;
        if connection.peer().role != Role::Coordinator {
            connection.close();
            return Err(format!(
                "{address} presented {} instead of a coordinator certificate",
                connection.peer()
            ));
        }
        tracing::debug!(peer, %address, "connected to raft peer");
        self.lock().connections.insert(
            peer,
            Pooled {
                address: address.to_string(),
                connection: connection.clone(),
            },
        );
        Ok(connection)
    }

    /// Drops `connection` from the pool if it is still the pooled one, so the next RPC
    /// reconnects.
    fn discard(&self, peer: MemberId, connection: &PeerConnection) {
        let mut inner = self.lock();
        let same = inner
            .connections
            .get(&peer)
            .is_some_and(|pooled| pooled.connection.is_same(connection));
        if same {
            inner.connections.remove(&peer);
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerConnections {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: MemberId, node: &BasicNode) -> PeerNetwork {
        PeerNetwork {
            pool: self.clone(),
            target,
            address: node.addr.clone(),
            acknowledged: None,
            batch: BatchBytes::default(),
        }
    }
}

/// The Raft network to one peer.
///
/// openraft keeps one per replication stream, and makes a new one for each of its
/// leadership checks (`ensure_linearizable`), which therefore always reach the follower.
#[derive(Debug)]
pub struct PeerNetwork {
    pool: PeerConnections,
    target: MemberId,
    address: String,
    /// The last AppendEntries through this client that the peer answered with success.
    acknowledged: Option<Acknowledged>,
    /// How many bytes of entries an AppendEntries of several may carry to this peer now.
    batch: BatchBytes,
}

/// How many bytes of entries an AppendEntries of several entries may carry to one peer.
/// openraft 0.9 gives an AppendEntries only the heartbeat interval (100 ms) to be answered,
/// and sends it again, whole, when that passes; so a request too large for what the network,
/// the peer and its disk manage in that time now never gets through, and the follower never
/// catches up. On a saturated 2-vCPU host, 2 MiB of entries to a follower that fell behind
/// timed out every time, the followers called elections, and the cluster lost its leader
/// again and again (BENCHMARKS.md, "A fleet of simulated agents"). So the limit starts at
/// [`APPEND_ENTRIES_BYTES_START`], halves after each timeout down to
/// [`APPEND_ENTRIES_BYTES_MIN`], and doubles after each answered request that used more than
/// half of it, up to `config::APPEND_ENTRIES_BYTES_MAX`. One entry alone always goes, whatever
/// its size (the proposer keeps entries under the maximum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchBytes(usize);

/// Where [`BatchBytes`] starts (bytes).
pub const APPEND_ENTRIES_BYTES_START: usize = 256 * 1024;
/// The least [`BatchBytes`] halves to (bytes).
pub const APPEND_ENTRIES_BYTES_MIN: usize = 32 * 1024;

impl Default for BatchBytes {
    fn default() -> Self {
        BatchBytes(APPEND_ENTRIES_BYTES_START)
    }
}

impl BatchBytes {
    fn timed_out(&mut self) {
        self.0 = (self.0 / 2).max(APPEND_ENTRIES_BYTES_MIN);
    }

    /// A request that carried `bytes` of entries (0: one entry, not counted) was answered.
    fn answered(&mut self, bytes: usize) {
        if bytes > self.0 / 2 {
            self.0 = (self.0 * 2).min(APPEND_ENTRIES_BYTES_MAX);
        }
    }
}

/// The last log id a follower holds once it accepts `rpc`: its last entry, or where it
/// starts when it carries none.
pub fn last_log_id_sent(rpc: &AppendEntriesRequest<TypeConfig>) -> Option<LogId<MemberId>> {
    rpc.entries
        .last()
        .map(|entry| entry.log_id)
        .or(rpc.prev_log_id)
}

/// What a follower acknowledged: the leader's vote, the follower's last log id and the commit
/// index it was told, and when the request was sent.
#[derive(Debug)]
pub struct Acknowledged {
    vote: Vote<MemberId>,
    last_log_id: Option<LogId<MemberId>>,
    commit: Option<LogId<MemberId>>,
    sent: Instant,
}

impl Acknowledged {
    /// What the follower holds once it answers `rpc`, sent at `sent`, with success.
    pub fn of(rpc: &AppendEntriesRequest<TypeConfig>, sent: Instant) -> Acknowledged {
        Acknowledged {
            vote: rpc.vote,
            last_log_id: last_log_id_sent(rpc),
            commit: rpc.leader_commit,
            sent,
        }
    }

    /// Whether `rpc`, about to be sent at `now`, would tell the follower nothing: no entries,
    /// and the vote, log position and commit index it acknowledged within
    /// [`REDUNDANT_APPEND_WINDOW_MS`].
    pub fn covers(&self, rpc: &AppendEntriesRequest<TypeConfig>, now: Instant) -> bool {
        rpc.entries.is_empty()
            && rpc.vote == self.vote
            && rpc.prev_log_id == self.last_log_id
            && rpc.leader_commit == self.commit
            && now.saturating_duration_since(self.sent)
                < Duration::from_millis(REDUNDANT_APPEND_WINDOW_MS)
    }
}

/// What went wrong with one RPC, before it is shaped into openraft's error for the caller.
enum SendError {
    Unreachable(String),
    Refused(RaftRefusal),
    Timeout(Duration),
    TooLarge,
    Network(String),
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

impl PeerNetwork {
    async fn send(
        &self,
        request: RaftRequest,
        option: &RPCOption,
    ) -> Result<RaftResponse, SendError> {
        // The soft deadline, so that this side sees the timeout (and counts it) before
        // openraft's own hard deadline cancels the call.
        let deadline = option
            .soft_ttl()
            .min(Duration::from_millis(RAFT_RPC_TIMEOUT_MAX_MS));
        let Some(cluster) = self.pool.identity.cluster() else {
            return Err(SendError::Unreachable(
                "this coordinator has joined no cluster yet".to_string(),
            ));
        };
        let envelope = RaftEnvelope {
            cluster,
            to: self.target,
            to_voter: self.pool.counts_as_voter(self.target),
            request,
        };
        let connection = self
            .pool
            .connection(self.target, &self.address)
            .await
            .map_err(SendError::Unreachable)?;
        if let Some(why) = self.pool.revoked(&connection) {
            return Err(SendError::Unreachable(why));
        }
        match connection
            .request::<_, RaftResponse>(&envelope, deadline)
            .await
        {
            Ok(RaftResponse::Refused(refusal)) => {
                self.pool.record_answer(self.target);
                self.pool.record_refusal(self.target, &refusal);
                Err(SendError::Refused(refusal))
            }
            Ok(response) => {
                self.pool.record_answer(self.target);
                Ok(response)
            }
            Err(RequestError::Frame(FrameError::TooLarge { .. })) => Err(SendError::TooLarge),
            Err(RequestError::Timeout { after }) => {
                self.pool.slow_network(
                    self.target,
                    &self.address,
                    deadline,
                    connection.connection().rtt(),
                );
                if self.pool.record_timeout(self.target) {
                    tracing::debug!(
                        peer = self.target,
                        "replacing a connection that keeps timing out"
                    );
                    self.pool.discard(self.target, &connection);
                }
                Err(SendError::Timeout(after))
            }
            Err(error) => {
                self.pool.discard(self.target, &connection);
                Err(match error {
                    RequestError::ConnectionLost(lost) => {
                        SendError::Unreachable(format!("connection lost: {lost}"))
                    }
                    other => SendError::Network(format!("{other:#}")),
                })
            }
        }
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        error: SendError,
        action: RPCTypes,
        vote_from: MemberId,
    ) -> RPCError<MemberId, BasicNode, E> {
        match error {
            SendError::Unreachable(text) => RPCError::Unreachable(Unreachable::new(&Message(
                format!("coordinator {} at {}: {text}", self.target, self.address),
            ))),
            // Unreachable, so that openraft backs off instead of retrying at once: the peer
            // will refuse again until an operator acts.
            SendError::Refused(refusal) => RPCError::Unreachable(Unreachable::new(&refusal)),
            SendError::Timeout(after) => RPCError::Timeout(Timeout {
                action,
                id: vote_from,
                target: self.target,
                timeout: after,
            }),
            // Halving is what openraft does with no better hint; it retries with fewer entries.
            SendError::TooLarge => RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(1)),
            SendError::Network(text) => RPCError::Network(NetworkError::new(&Message(format!(
                "coordinator {} at {}: {text}",
                self.target, self.address
            )))),
        }
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<MemberId, BasicNode, E> {
        RPCError::Network(NetworkError::new(&Message(format!(
            "coordinator {} answered with a response of the wrong kind",
            self.target
        ))))
    }
}

/// When `entries` are more than one and take more than `bytes_max` bytes encoded: `Err` with
/// how many of the first fit (one at least, which goes alone whatever its size). Else `Ok`
/// with the bytes they take (0 for a single entry, which is not counted). Counts only as far
/// as the limit.
fn entries_within(entries: &[Entry], bytes_max: usize) -> Result<usize, u64> {
    if entries.len() < 2 {
        return Ok(0);
    }
    let mut bytes = 0usize;
    for (index, entry) in entries.iter().enumerate() {
        // An entry that cannot be encoded fails when the request is, as before.
        bytes += encoded_len(entry).unwrap_or(0);
        if bytes > bytes_max {
            return Err(index.max(1) as u64);
        }
    }
    Ok(bytes)
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<MemberId>, RPCError<MemberId, BasicNode, RaftError<MemberId>>>
    {
        rpc.leader_commit = self.pool.durability.commit_to_send(rpc.leader_commit);
        let sent = Instant::now();
        if self
            .acknowledged
            .as_ref()
            .is_some_and(|acknowledged| acknowledged.covers(&rpc, sent))
        {
            tracing::trace!(
                target = self.target,
                "append entries: nothing new, not sent"
            );
            return Ok(AppendEntriesResponse::Success);
        }
        let bytes = match entries_within(&rpc.entries, self.batch.0) {
            Ok(bytes) => bytes,
            Err(fit) => {
                // openraft sends the first `fit` entries at once, and so for its next requests.
                tracing::debug!(
                    target = self.target,
                    entries = rpc.entries.len(),
                    fit,
                    limit = self.batch.0,
                    "append entries: over the byte limit, fewer entries"
                );
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(fit),
                ));
            }
        };
        let sending = Acknowledged::of(&rpc, sent);
        self.acknowledged = None;
        let from = rpc.vote.leader_id().voted_for().unwrap_or_default();
        let entries = rpc.entries.len() as u64;
        tracing::trace!(target = self.target, entries, "append entries");
        let sent = self.send(RaftRequest::AppendEntries(rpc), &option).await;
        match &sent {
            Ok(_) => self.batch.answered(bytes),
            Err(SendError::Timeout(_)) => self.batch.timed_out(),
            Err(_) => {}
        }
        let response = sent.map_err(|error| match error {
            SendError::TooLarge if entries > 1 => {
                RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries / 2))
            }
            other => self.rpc_error(other, RPCTypes::AppendEntries, from),
        })?;
        match response {
            RaftResponse::AppendEntries(result) => {
                if matches!(result, Ok(AppendEntriesResponse::Success)) {
                    self.acknowledged = Some(sending);
                }
                result.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<MemberId>,
        RPCError<MemberId, BasicNode, RaftError<MemberId, InstallSnapshotError>>,
    > {
        let from = rpc.vote.leader_id().voted_for().unwrap_or_default();
        let response = self
            .send(RaftRequest::InstallSnapshot(rpc), &option)
            .await
            .map_err(|error| self.rpc_error(error, RPCTypes::InstallSnapshot, from))?;
        match response {
            RaftResponse::InstallSnapshot(result) => {
                result.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<MemberId>,
        option: RPCOption,
    ) -> Result<VoteResponse<MemberId>, RPCError<MemberId, BasicNode, RaftError<MemberId>>> {
        let from = rpc.vote.leader_id().voted_for().unwrap_or_default();
        let response = self
            .send(RaftRequest::Vote(rpc), &option)
            .await
            .map_err(|error| self.rpc_error(error, RPCTypes::Vote, from))?;
        match response {
            RaftResponse::Vote(result) => {
                result.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
            }
            _ => Err(self.unexpected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload};

    fn log_id(term: u64, index: u64) -> LogId<MemberId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn append(
        term: u64,
        prev: Option<LogId<MemberId>>,
        entries: &[LogId<MemberId>],
        commit: Option<LogId<MemberId>>,
    ) -> AppendEntriesRequest<TypeConfig> {
        let mut vote = Vote::new(term, 1);
        vote.commit();
        AppendEntriesRequest {
            vote,
            prev_log_id: prev,
            entries: entries
                .iter()
                .map(|log_id| Entry {
                    log_id: *log_id,
                    payload: EntryPayload::Blank,
                })
                .collect(),
            leader_commit: commit,
        }
    }

    /// An entry of one command whose encoding is about `bytes` long.
    fn entry_of(index: u64, bytes: usize) -> Entry<TypeConfig> {
        let command = quotient_core::Command::DisableShare {
            name: "x".repeat(bytes),
        };
        Entry {
            log_id: log_id(1, index),
            payload: EntryPayload::Normal(crate::store::Request::one(command, 0)),
        }
    }

    /// Several entries go together up to the byte limit and no further; a single entry goes
    /// whatever its size.
    #[test]
    fn an_append_of_several_entries_is_cut_to_what_fits_the_byte_limit() {
        let limit = 10_000;
        let small: Vec<_> = (1..=5).map(|index| entry_of(index, 1_000)).collect();
        let all = entries_within(&small, limit).expect("5 KB in all");
        assert!((5_000..limit).contains(&all), "{all} bytes counted");
        let large: Vec<_> = (1..=5).map(|index| entry_of(index, 3_000)).collect();
        assert_eq!(
            entries_within(&large, limit),
            Err(3),
            "three of 3 KB fit in 10 KB"
        );
        let huge: Vec<_> = (1..=3).map(|index| entry_of(index, 20_000)).collect();
        assert_eq!(entries_within(&huge, limit), Err(1), "the first goes alone");
        assert_eq!(
            entries_within(&huge[..1], limit),
            Ok(0),
            "one entry always goes, uncounted"
        );
    }

    /// The byte limit halves after each timeout, to its floor, and doubles again after each
    /// answer that used more than half of it, to its ceiling; small answers leave it.
    #[test]
    fn the_byte_limit_halves_on_timeouts_and_grows_back_on_answers() {
        let mut batch = BatchBytes::default();
        assert_eq!(batch.0, APPEND_ENTRIES_BYTES_START);
        batch.timed_out();
        assert_eq!(batch.0, APPEND_ENTRIES_BYTES_START / 2);
        for _ in 0..20 {
            batch.timed_out();
        }
        assert_eq!(batch.0, APPEND_ENTRIES_BYTES_MIN);
        batch.answered(0);
        batch.answered(APPEND_ENTRIES_BYTES_MIN / 2);
        assert_eq!(batch.0, APPEND_ENTRIES_BYTES_MIN, "small answers leave it");
        batch.answered(APPEND_ENTRIES_BYTES_MIN / 2 + 1);
        assert_eq!(batch.0, 2 * APPEND_ENTRIES_BYTES_MIN);
        for _ in 0..20 {
            let full = batch.0;
            batch.answered(full);
        }
        assert_eq!(batch.0, APPEND_ENTRIES_BYTES_MAX);
    }

    /// Only an empty AppendEntries that repeats what the follower acknowledged, soon after, is
    /// answered without being sent: new entries, a newer commit index, another vote or a
    /// position the follower did not acknowledge are always sent.
    #[test]
    fn only_an_append_that_tells_the_follower_nothing_is_left_unsent() {
        let sent = Instant::now();
        let acknowledged = Acknowledged::of(
            &append(2, Some(log_id(2, 6)), &[log_id(2, 7)], Some(log_id(2, 6))),
            sent,
        );
        let soon = sent + Duration::from_millis(1);
        let notice = append(2, Some(log_id(2, 7)), &[], Some(log_id(2, 6)));
        assert!(acknowledged.covers(&notice, soon));

        let refused = [
            (
                "new entries",
                append(2, Some(log_id(2, 7)), &[log_id(2, 8)], Some(log_id(2, 6))),
            ),
            (
                "a newer commit index",
                append(2, Some(log_id(2, 7)), &[], Some(log_id(2, 7))),
            ),
            (
                "another vote",
                append(3, Some(log_id(2, 7)), &[], Some(log_id(2, 6))),
            ),
            (
                "another position",
                append(2, Some(log_id(2, 6)), &[], Some(log_id(2, 6))),
            ),
        ];
        for (what, rpc) in refused {
            assert!(!acknowledged.covers(&rpc, soon), "{what} must be sent");
        }
        let late = sent + Duration::from_millis(REDUNDANT_APPEND_WINDOW_MS);
        assert!(
            !acknowledged.covers(&notice, late),
            "a repeat after the window (a heartbeat) must be sent"
        );
    }
}
