//! The one coordinator context: what a coordinator's services and loops share, built once by
//! `Coordinator::start` and handed to each of them, instead of each taking its own long list
//! of handles in its own order.
//!
//! Every field is a handle (an `Arc` inside), so a clone is cheap and every clone sees the
//! same Raft node, state and registries. What is replicated lives behind `raft` and
//! `state_machine`; the registries below them are the leader's own memory (agent connections,
//! heartbeat clocks, disk reports, desired states), rebuilt by a new leader.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::agent_links::AgentLinks;
use crate::config::CoordinatorConfig;
use crate::desired::DesiredTracker;
use crate::identity::ClusterIdentity;
use crate::metrics::CoordinatorMetrics;
use crate::network::PeerConnections;
use crate::node_disks::NodeDisks;
use crate::node_leases::NodeLeases;
use crate::proposer::Proposer;
use crate::store::log_store::LogDurability;
use crate::store::type_config::Raft;
use crate::store::{MemberId, QuotientStateMachine};

/// What every part of one coordinator shares; cheap to clone.
#[derive(Clone)]
pub struct Context {
    /// The settings it was started with.
    pub config: Arc<CoordinatorConfig>,
    /// Its cluster, as its data directory records it, and what it refused for it.
    pub identity: ClusterIdentity,
    pub raft: Raft,
    /// The replicated state, read without Raft.
    pub state_machine: QuotientStateMachine,
    /// Client commands into Raft entries.
    pub proposer: Proposer,
    /// Connections to the other coordinators (Raft), and who answered lately.
    pub peers: PeerConnections,
    /// What of the log is on this coordinator's disk (the Raft service waits on it).
    pub durability: LogDurability<MemberId>,
    /// The agents connected to this coordinator, for the leader's requests to them.
    pub agent_links: AgentLinks,
    /// Each node's last reported disk use.
    pub node_disks: NodeDisks,
    /// Each node's desired state, on the leader.
    pub desired: DesiredTracker,
    /// Each node's heartbeat clock, on the leader.
    pub leases: NodeLeases,
    /// Wakes the scheduling loop.
    pub scheduler: Arc<Notify>,
    /// What `/metrics` shows ([`crate::metrics`]).
    pub metrics: CoordinatorMetrics,
}

impl Context {
    /// This coordinator's id as a Raft member.
    pub fn id(&self) -> MemberId {
        self.config.id
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("id", &self.config.id)
            .finish_non_exhaustive()
    }
}
