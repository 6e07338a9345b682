//! The Raft-replicated Quotient coordinator: openraft glue around the pure `quotient-core`
//! state machine, a QUIC network between coordinators, and the client API.
//!
//! # Layout
//! - [`store`]: Raft storage: the openraft type config, the redb log store, the state machine
//!   adapter with its snapshot file, and their codec.
//! - [`context`]: the one context a coordinator's services and loops share.
//! - [`config`]: the coordinator's flags / TOML config and the openraft config they give.
//! - [`network`]: the Raft network over QUIC (client side), with one connection per peer.
//! - [`raft_service`]: the Raft network's server side; only coordinators may speak Raft, and
//!   only those of this coordinator's cluster.
//! - [`identity`]: which cluster this coordinator belongs to (its data directory's
//!   `cluster-identity.toml`), and what it refused for it.
//! - [`cluster_init`]: `quotient cluster init`, the one explicit bootstrap of a cluster.
//! - [`digest_check`]: the leader's periodic check that every replica holds its state.
//! - [`api`]: the client API's server side: authorisation, writes through Raft,
//!   linearizable reads, redirects to the leader, membership changes.
//! - [`agent_service`]: the agent protocol's server side (`quotient-agent/1`): registration,
//!   heartbeats, desired state as a long poll, job reports.
//! - [`agent_links`]: the agents' open connections, for the leader's requests to agents.
//! - [`job_logs`]: `quotient job logs`: finds the attempt's node and reads from its agent.
//! - [`desired`]: each node's desired allocations and their fence.
//! - [`applied`]: what the applied entries changed, and the leader's refresh that follows.
//! - [`scheduler_loop`]: the leader's scheduling rounds, committed as plans.
//! - [`node_leases`]: the leader's in-memory heartbeat clocks; silent nodes are marked lost.
//! - [`node_disks`]: the leader's in-memory record of each agent's disk use.
//! - [`retention_loop`]: the leader asks for finished jobs to be removed when their retention is over.
//! - [`proposer`]: batches client commands into Raft entries (one fsync for many writes).
//! - [`views`]: the API's views of shares, jobs, nodes and the cluster.
//! - [`coordinator`]: one coordinator wired up: `Coordinator::start` and `run`.

pub mod access_keys;
pub mod agent_links;
pub mod agent_service;
pub mod api;
pub mod applied;
pub mod aws;
pub mod backup;
pub mod cluster_init;
pub mod config;
pub mod context;
pub mod coordinator;
pub mod desired;
pub mod digest_check;
pub mod history;
pub mod identity;
pub mod inspect;
pub mod job_logs;
pub mod metrics;
pub mod network;
pub mod node_disks;
pub mod node_leases;
pub mod proposer;
pub mod raft_service;
pub mod retention_loop;
pub mod scheduler_loop;
pub mod store;
pub mod views;

#[cfg(test)]
mod test_log;

pub use config::CoordinatorConfig;
pub use coordinator::{run, Coordinator, CoordinatorError};
