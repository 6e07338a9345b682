//! `quotient cluster init`: bootstraps a new cluster on the coordinator it is sent to, once.
//!
//! A cluster is never bootstrapped because a data directory is empty: a voter whose disk was
//! wiped would otherwise start a cluster of its own, or rejoin as if it still held the vote and
//! the entries it had acknowledged. Here the coordinator that receives the request, which must
//! have joined no cluster yet:
//!
//! 0. is the initial peer of the lowest id (so two inits cannot make two clusters), and takes
//!    one init at a time;
//! 1. makes the cluster id (`--cluster-id` when given, else 128 random bits) and records it in
//!    its data directory;
//! 2. initialises Raft with itself as the only voter, and waits to lead;
//! 3. adds each other initial peer (its `--peers`) as a learner, which joins the cluster when
//!    the first entries reach it (`raft_service::admit`), and waits up to
//!    [`INIT_CATCH_UP_MS`] for them to catch up;
//! 4. makes the learners that caught up voters, in one membership change.
//!
//! Peers that did not catch up (not started yet, unreachable, or refusing: another cluster's)
//! stay learners and are reported, each with what to do: `quotient cluster add-member` once it
//! is up makes it a voter. So every member, the first excepted, enters the cluster as a
//! learner that copies the log before it ever votes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::{BasicNode, ChangeMembers, ServerState};
use quotient_common::api::{ApiError, ClusterInitView, PendingMember};
use quotient_common::ClusterId;
use ring::rand::{SecureRandom, SystemRandom};

use crate::identity::ClusterIdentity;
use crate::network::PeerConnections;
use crate::store::type_config::Raft;
use crate::store::MemberId;

/// How long `cluster init` waits to lead its one-member cluster (milliseconds).
pub const INIT_LEAD_TIMEOUT_MS: u64 = 10_000;
/// How long `cluster init` waits for the other initial peers to catch up as learners before it
/// makes the ones that did voters (milliseconds). Below the API's membership deadline.
pub const INIT_CATCH_UP_MS: u64 = 30_000;
/// How often the catch-up is looked at (milliseconds).
const CATCH_UP_POLL_MS: u64 = 50;

/// Makes a new cluster id from the system's secure random source.
pub fn new_cluster_id() -> Result<ClusterId, ApiError> {
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| ApiError::Internal("the system's random source failed".to_string()))?;
    Ok(ClusterId::from_bytes(bytes))
}

/// Bootstraps a cluster whose initial members are `peers` (this coordinator's among them).
pub async fn init(
    raft: &Raft,
    identity: &ClusterIdentity,
    connections: &PeerConnections,
    peers: &BTreeMap<MemberId, String>,
) -> Result<ClusterInitView, ApiError> {
    let me = identity.member();
    if let Some(cluster) = identity.cluster() {
        return Err(ApiError::Precondition(format!(
            "coordinator {me} already belongs to cluster {cluster}: a cluster is initialised once; add coordinators to it as members"
        )));
    }
    let initialised = raft
        .is_initialized()
        .await
        .map_err(|error| ApiError::Internal(format!("reading the raft state: {error}")))?;
    if initialised {
        return Err(ApiError::Precondition(format!(
            "coordinator {me} already holds Raft state: a cluster is initialised once"
        )));
    }
    let my_address = peers.get(&me).cloned().ok_or_else(|| {
        ApiError::BadRequest(format!("coordinator {me} is not among its own --peers"))
    })?;
    // One coordinator may bootstrap: the lowest id of the initial peers. Two inits sent at
    // once to two coordinators would otherwise make two clusters, each taking some of the
    // peers (found by probing); sent to this one, they are taken one at a time below.
    if let Some((&first, address)) = peers.iter().next().filter(|(id, _)| **id != me) {
        return Err(ApiError::Precondition(format!(
            "a cluster is initialised by its initial peer of the lowest id, coordinator {first}: \
             send `quotient cluster init --coordinator {address}` there"
        )));
    }
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ONE_AT_A_TIME.lock().await;
    if let Some(cluster) = identity.cluster() {
        return Err(ApiError::Precondition(format!(
            "coordinator {me} already belongs to cluster {cluster}: a cluster is initialised once; add coordinators to it as members"
        )));
    }
    let cluster = match identity.configured() {
        Some(cluster) => cluster,
        None => new_cluster_id()?,
    };
    let joining = identity.clone();
    tokio::task::spawn_blocking(move || joining.join(cluster))
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .map_err(|error| ApiError::Internal(error.to_string()))?;
    tracing::info!(%cluster, member = me, "bootstrapping a new cluster with this coordinator as its first voter");
    raft.initialize(BTreeMap::from([(me, BasicNode::new(my_address))]))
        .await
        .map_err(|error| ApiError::Internal(format!("initialising raft: {error}")))?;
    raft.wait(Some(Duration::from_millis(INIT_LEAD_TIMEOUT_MS)))
        .state(ServerState::Leader, "lead the new cluster")
        .await
        .map_err(|error| {
            ApiError::Internal(format!(
                "the new cluster {cluster} was initialised, but this coordinator did not lead it in time: {error}"
            ))
        })?;

    let others: BTreeMap<MemberId, String> = peers
        .iter()
        .filter(|(id, _)| **id != me)
        .map(|(id, address)| (*id, address.clone()))
        .collect();
    for (id, address) in &others {
        tracing::info!(id, %address, "adding an initial peer as a learner");
        raft.add_learner(*id, BasicNode::new(address.clone()), false)
            .await
            .map_err(|error| ApiError::Internal(format!("adding coordinator {id}: {error}")))?;
    }
    let caught_up = wait_caught_up(
        raft,
        others.keys().copied().collect(),
        Duration::from_millis(INIT_CATCH_UP_MS),
    )
    .await;
    if !caught_up.is_empty() {
        raft.change_membership(ChangeMembers::AddVoterIds(caught_up.clone()), false)
            .await
            .map_err(|error| {
                ApiError::Internal(format!("making the initial peers voters: {error}"))
            })?;
    }
    let pending = others
        .iter()
        .filter(|(id, _)| !caught_up.contains(id))
        .map(|(id, address)| PendingMember {
            id: *id,
            address: address.clone(),
            reason: connections.refusal(*id).unwrap_or_else(|| {
                format!(
                    "it did not catch up within {} s: start it, then `quotient cluster add-member --id {id} --address {address}`",
                    INIT_CATCH_UP_MS / 1_000
                )
            }),
        })
        .collect::<Vec<_>>();
    for member in &pending {
        tracing::warn!(id = member.id, reason = %member.reason, "an initial peer is not a voter yet");
    }
    let mut voters = vec![me];
    voters.extend(caught_up);
    tracing::info!(%cluster, ?voters, "cluster initialised");
    Ok(ClusterInitView {
        cluster_id: cluster.to_string(),
        bootstrapped_by: me,
        voters,
        pending,
    })
}

/// The learners among `learners` whose replication reached the leader's last log index within
/// `within` (all of them as soon as they all did). openraft's own blocking `add_learner` gives
/// up waiting after a short default and answers as if the learner had caught up; a learner
/// made a voter before it holds the log only weakens the quorum, and one that refuses (another
/// cluster's) would be counted on in vain.
pub async fn wait_caught_up(
    raft: &Raft,
    learners: BTreeSet<MemberId>,
    within: Duration,
) -> BTreeSet<MemberId> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let caught_up: BTreeSet<MemberId> = {
            let metrics = raft.metrics().borrow().clone();
            let last = metrics.last_log_index.unwrap_or(0);
            metrics
                .replication
                .iter()
                .flatten()
                .filter(|(id, matched)| {
                    learners.contains(id) && matched.is_some_and(|log_id| log_id.index >= last)
                })
                .map(|(id, _)| *id)
                .collect()
        };
        if caught_up.len() == learners.len() || tokio::time::Instant::now() >= deadline {
            return caught_up;
        }
        tokio::time::sleep(Duration::from_millis(CATCH_UP_POLL_MS)).await;
    }
}
