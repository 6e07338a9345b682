//! The openraft type config of the real system: log entries carry a [`Request`] (a
//! `quotient_core::Command` stamped with the leader's clock), applying one yields a
//! `quotient_core::Outcome`, nodes are `u64` ids with a [`BasicNode`] address, and snapshots are
//! the serialized `State` in memory (`Cursor<Vec<u8>>`).

use std::io::Cursor;

use openraft::{BasicNode, TokioRuntime};
use quotient_core::{Command, Outcome};
use serde::{Deserialize, Serialize};

/// What one Normal log entry holds: a command and the leader's time when it proposed it.
///
/// `apply` never reads a clock; it gets `time_ms` from here through `ApplyCtx`, so every
/// replica applies the same command at the same time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The command to apply.
    pub command: Command,
    /// Milliseconds since the Unix epoch on the leader when it proposed the command.
    pub time_ms: u64,
}

openraft::declare_raft_types!(
    /// The openraft type config of Quotient's coordinators.
    pub TypeConfig:
        D = Request,
        R = Outcome,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = TokioRuntime,
);

/// A coordinator's Raft node id.
pub type NodeId = u64;

/// The Raft handle of a coordinator.
pub type Raft = openraft::Raft<TypeConfig>;

/// A log entry of the real system.
pub type Entry = openraft::Entry<TypeConfig>;

/// The log store of the real system.
pub type LogStore = super::RedbLogStore<TypeConfig>;
