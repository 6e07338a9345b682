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

/// Entries of earlier versions of the Raft log encoding are read with their commands of that
/// version (`quotient_core::v1`, `quotient_core::v2`) and converted; versions 3's to 5's
/// commands are a subset of today's.
impl super::codec::VersionedEntries for TypeConfig {
    fn decode_entry(version: u16, bytes: &[u8]) -> Result<Entry, super::codec::CodecError> {
        match version {
            1 => Ok(
                super::codec::decode_value::<OldEntry<quotient_core::v1::CommandV1>>(bytes)?.into(),
            ),
            2 => Ok(
                super::codec::decode_value::<OldEntry<quotient_core::v2::CommandV2>>(bytes)?.into(),
            ),
            // Versions 4 to 6 only added commands (`ExpireFinished`; the AWS endpoint's; a
            // write in a client's session): version 3's to 5's bytes are this build's commands.
            3..=5 => super::codec::decode_value(bytes),
            _ => super::codec::decode_current(version, bytes),
        }
    }
}

/// A log entry as an earlier version of the Raft log encoded it: openraft's `Entry` field for
/// field, with the commands `C` of that version.
#[derive(Deserialize)]
struct OldEntry<C> {
    log_id: openraft::LogId<MemberId>,
    payload: OldPayload<C>,
}

#[derive(Deserialize)]
enum OldPayload<C> {
    Blank,
    Normal(OldRequest<C>),
    Membership(openraft::Membership<MemberId, BasicNode>),
}

#[derive(Deserialize)]
struct OldRequest<C> {
    commands: Vec<C>,
    time_ms: u64,
}

impl<C: Into<Command>> From<OldEntry<C>> for Entry {
    fn from(old: OldEntry<C>) -> Entry {
        let payload = match old.payload {
            OldPayload::Blank => openraft::EntryPayload::Blank,
            OldPayload::Normal(request) => openraft::EntryPayload::Normal(Request {
                commands: request.commands.into_iter().map(Into::into).collect(),
                time_ms: request.time_ms,
            }),
            OldPayload::Membership(membership) => openraft::EntryPayload::Membership(membership),
        };
        Entry {
            log_id: old.log_id,
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
