//! The openraft type config of the real system: log entries carry a [`Request`] (a
//! batch of `quotient_core::Command`s stamped with the leader's clock), applying one yields
//! their `quotient_core::Outcome`s, nodes are `u64` ids with a [`BasicNode`] address, and snapshots are
//! the serialized `State` in memory (`Cursor<Vec<u8>>`).

use std::io::Cursor;

use openraft::{BasicNode, TokioRuntime};
use quotient_core::{Command, Outcome};
use serde::{Deserialize, Serialize};

/// What one Normal log entry holds: commands, applied in order, and the leader's time when
/// it proposed them.
///
/// Several client commands travel in one entry when they arrive together (see
/// `crate::proposer`): openraft 0.9 flushes the log once per entry on the leader, so one
/// entry per command would cap the cluster at one command per fsync. `apply` never reads a
/// clock; every command of the entry gets `time_ms` and the entry's log index through
/// `ApplyCtx`, so every replica applies them identically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The commands to apply, in order.
    pub commands: Vec<Command>,
    /// Milliseconds since the Unix epoch on the leader when it proposed the commands.
    pub time_ms: u64,
}

impl Request {
    /// An entry holding one command.
    pub fn one(command: Command, time_ms: u64) -> Request {
        Request {
            commands: vec![command],
            time_ms,
        }
    }
}

/// What applying one entry yields: one outcome per command of a Normal entry, in order; a
/// single `Outcome::Done` for a Blank or Membership entry.
pub type Outcomes = Vec<Outcome>;

openraft::declare_raft_types!(
    /// The openraft type config of Quotient's coordinators.
    pub TypeConfig:
        D = Request,
        R = Outcomes,
        NodeId = MemberId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = TokioRuntime,
);

/// Entries of version 1 of the Raft log encoding, the only one so far, are read as they are.
impl super::codec::VersionedEntries for TypeConfig {
    fn decode_entry(version: u16, bytes: &[u8]) -> Result<Entry, super::codec::CodecError> {
        match version {
            1 => Ok(super::codec::decode_value::<EntryV1>(bytes)?.into()),
            _ => super::codec::decode_current(version, bytes),
        }
    }
}

/// A log entry as version 1 of the Raft log encoded it: openraft's `Entry` field for field,
/// with the commands of version 1 (`quotient_core::v1`).
#[derive(Deserialize)]
struct EntryV1 {
    log_id: openraft::LogId<MemberId>,
    payload: PayloadV1,
}

#[derive(Deserialize)]
enum PayloadV1 {
    Blank,
    Normal(RequestV1),
    Membership(openraft::Membership<MemberId, BasicNode>),
}

#[derive(Deserialize)]
struct RequestV1 {
    commands: Vec<quotient_core::v1::CommandV1>,
    time_ms: u64,
}

impl From<EntryV1> for Entry {
    fn from(v1: EntryV1) -> Entry {
        let payload = match v1.payload {
            PayloadV1::Blank => openraft::EntryPayload::Blank,
            PayloadV1::Normal(request) => openraft::EntryPayload::Normal(Request {
                commands: request.commands.into_iter().map(Command::from).collect(),
                time_ms: request.time_ms,
            }),
            PayloadV1::Membership(membership) => openraft::EntryPayload::Membership(membership),
        };
        Entry {
            log_id: v1.log_id,
            payload,
        }
    }
}

/// A coordinator's id as a Raft member (openraft's `NodeId`). "Node" means a GPU host
/// everywhere else in Quotient (`quotient_core::NodeId`).
pub type MemberId = u64;

/// The Raft handle of a coordinator.
pub type Raft = openraft::Raft<TypeConfig>;

/// A log entry of the real system.
pub type Entry = openraft::Entry<TypeConfig>;

/// The log store of the real system.
pub type LogStore = super::RaftLogStore<TypeConfig>;
