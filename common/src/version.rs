//! The version of every encoding that outlives a process, and the error that refuses one this
//! build does not read.
//!
//! Quotient's bytes live on in two places: messages between processes of different builds (a
//! cluster is upgraded one process at a time) and files that the next build opens. Each such
//! encoding has an [`Encoding`]: the version this build writes and the oldest it still reads.
//! Every message and every stored value carries the version it was written in (a frame's
//! header, a log record's header, a snapshot's first bytes, the journal's `version` field), so
//! a reader knows which decoder to use, and refuses what it cannot read with a
//! [`VersionError`] that names both versions and says which side to upgrade, instead of
//! misreading it.
//!
//! # Changing a persisted or wire type
//!
//! A type that is encoded (anything reachable from the messages and values listed below) may
//! not change its encoding under the same version: bincode writes fields in order with no
//! names, so an added field or variant in the middle makes old bytes decode wrong or not at
//! all. To change one:
//! 1. bump `current` of every encoding that contains it;
//! 2. keep the previous type (renamed, e.g. `JobSpecV1`) and teach the reader to decode the
//!    previous version into it and convert (the `match` on the version in each decoder);
//!    leave `oldest` where it is, so that the new build reads what the old one wrote;
//! 3. for a wire encoding, also teach the writer to answer an older peer in its version
//!    (`frame::WireMessage::encode_version`), or raise `oldest` and say in the release notes
//!    that peers must be upgraded together;
//! 4. add a fixture of the new version next to the old ones (`coordinator/tests/fixtures/`,
//!    `agent/tests/fixtures/`); the old ones must still read back.
//!
//! Raising `oldest` drops a version: only after a release that rewrote everything stored in
//! it (a snapshot and a purge rewrite the Raft log; the journal is rewritten on every change).
//!
//! The state digests the leader has every replica compare (`Command::CheckDigest`) hash the
//! snapshot state's bytes, version included: while replicas of two [`SNAPSHOT_STATE`] versions
//! run together they report a divergence, unless the new build hashes the previous encoding
//! until every replica runs it.

/// One versioned encoding: what it is, the version this build writes and the oldest it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    /// What is encoded, in words for error messages ("the client API").
    pub name: &'static str,
    /// The version this build writes.
    pub current: u16,
    /// The oldest version this build reads; every version from here to `current` is read.
    pub oldest: u16,
}

/// The client API (ALPN `quotient-api/1`): `api::ApiRequest` and `api::ApiResponse`, in the
/// header of every frame. Version 4: `job list` in pages (`ListJobs` and `JobPage`), job
/// history and share usage, a removed job's rejection; the CLI and the coordinators of this
/// release go together. Version 5: backups (`Backup`) and events (`Events`); again together.
/// Version 6: access keys for the AWS endpoint (`CreateAccessKey`...); again together.
/// Version 7: writes in a client's session (`InSession`, added at the end), so that a late
/// copy of a write is applied once, and a job's last checkpoint in its view; together again.
pub const API_WIRE: Encoding = Encoding {
    name: "the client API",
    current: 7,
    oldest: 7,
};

/// The agent protocol (ALPN `quotient-agent/1`): `agent_api::AgentRequest`, `AgentResponse`,
/// `LeaderRequest` and `LeaderResponse`, in the header of every frame. Version 4: a job's own
/// failure reason in its exit report (`JobEvent::ExitedWithReason`); agents and coordinators
/// of this release go together (docs/operations.md). Version 5: a job's checkpoints
/// (`JobEvent::Checkpointed`); together again.
pub const AGENT_WIRE: Encoding = Encoding {
    name: "the agent protocol",
    current: 5,
    oldest: 5,
};

/// Raft between coordinators (ALPN `quotient-raft/1`): the coordinator's `RaftEnvelope` and
/// `RaftResponse`, in the header of every frame. They carry log entries and snapshot chunks,
/// so a new version of [`RAFT_LOG`] or [`SNAPSHOT_STATE`] is a new version of this too.
/// Version 4 carries [`RAFT_LOG`] 4 and [`SNAPSHOT_STATE`] 4; a job table with removed jobs
/// has no version 3 form, so coordinators of 3 and 4 do not replicate to each other: upgrade
/// them together (docs/operations.md). Version 5 carries [`SNAPSHOT_STATE`] 5 (the events),
/// which version 4 cannot read: upgrade them together again. Version 6 carries [`RAFT_LOG`] 5
/// and [`SNAPSHOT_STATE`] 6 (the AWS endpoint's state): together again. Version 7 carries
/// [`RAFT_LOG`] 6 and [`SNAPSHOT_STATE`] 7 (client write sessions): together again.
pub const RAFT_WIRE: Encoding = Encoding {
    name: "the Raft protocol",
    current: 7,
    oldest: 7,
};

/// The Raft log on disk: every log entry (the coordinator's `Request`: a batch of
/// `quotient_core::Command`s) and committed id in `raft-wal/`, whose record header holds its
/// version, and the vote and the last purged id in `raft.redb`, written with their version.
/// Records and values written before versions were recorded hold none; they are version 1.
/// Version 2: jobs carry CPUs, memory, a time limit and a retry strategy, nodes what they can
/// run (`quotient_core::v1` reads version 1). Version 3: jobs of several nodes (a job's
/// `nodes` and `same`, an allocation per member), GPUs' NVLink peers (`quotient_core::v2`
/// reads version 2). Version 4: the leader's `ExpireFinished`, which removes finished jobs
/// once their retention is over and prunes old usage (version 3's entries read as they are).
/// Version 5: the AWS endpoint's commands (`CreateAccessKey`, `DeleteAccessKey`,
/// `PutAwsObject`, `SubmitServiceJob`), added at the end (version 4's entries read as they are).
/// Version 6: a client's write in its session (`InSession`), and a job's checkpoint
/// (`JobEvent::Checkpointed` in `ReportJob`), both added at the end (version 5's entries read
/// as they are).
pub const RAFT_LOG: Encoding = Encoding {
    name: "the Raft log",
    current: 6,
    oldest: 1,
};

/// The snapshot file's layout (`snapshot.bin`: header, metadata, state), in its first bytes
/// (`QSNAP001`, `QSNAP002`, `QSNAP003`). Version 1 held the state without a version of its
/// own, as [`SNAPSHOT_STATE`] version 1; version 2 holds the state as it travels, with its
/// version; version 3 ends with a CRC32 of the rest, checked when it is read. Only the file
/// changes, not what travels: coordinators of versions 2 and 3 replicate to each other.
pub const SNAPSHOT_FILE: Encoding = Encoding {
    name: "the snapshot file",
    current: 3,
    oldest: 1,
};

/// The replicated state as a snapshot holds it (`quotient_core::State::to_snapshot_bytes`),
/// in the snapshot file and in the snapshot a leader sends a follower, in its first bytes.
/// Version 2: as [`RAFT_LOG`] 2, and each job's attempt history and counters. Version 3: as
/// [`RAFT_LOG`] 3. Version 4: as [`RAFT_LOG`] 4 (finished jobs removed, so the job table
/// holds the ids issued; idempotency keys of removed jobs waiting to expire), every revoked
/// serial of a name, and the shares' GPU time by the hour (`quotient_core::usage`)
/// (`quotient_core::v3` reads version 3). Version 5: the recent events
/// (`quotient_core::events`; `quotient_core::v4` reads version 4). Version 6: the AWS
/// endpoint's access keys, objects and service jobs (`quotient_core::aws`; `quotient_core::v5`
/// reads version 5). Version 7: the clients' write sessions (`quotient_core::sessions`) and
/// jobs' last checkpoints and the clock of the last entry (`StateData::checkpoints`,
/// `clock_ms`; `quotient_core::v6` reads version 6).
pub const SNAPSHOT_STATE: Encoding = Encoding {
    name: "the snapshot state",
    current: 7,
    oldest: 1,
};

/// A coordinator's job history (`history.redb` in its data dir): each record's value starts
/// with this version (u16 little-endian), then `api::HistoryRecord` in bincode.
pub const JOB_HISTORY: Encoding = Encoding {
    name: "the job history",
    current: 1,
    oldest: 1,
};

/// The agent's journal (`agent-journal.json` in its state dir), in its `version` field.
/// Version 1 kept reports without their node; version 2 keeps the whole `JobReport`.
/// Version 3 may hold `Checkpointed` reports (versions 1 and 2 read as they are).
pub const AGENT_JOURNAL: Encoding = Encoding {
    name: "the agent journal",
    current: 3,
    oldest: 1,
};

/// Every versioned encoding, for documentation and tests.
pub const ENCODINGS: [Encoding; 8] = [
    API_WIRE,
    AGENT_WIRE,
    RAFT_WIRE,
    RAFT_LOG,
    SNAPSHOT_FILE,
    SNAPSHOT_STATE,
    JOB_HISTORY,
    AGENT_JOURNAL,
];

/// What wrote a version this build does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writer {
    /// A process at the other end of a connection, named for people ("the coordinator at
    /// 10.0.0.1:7401").
    Peer(String),
    /// A file, by its path.
    File(String),
}

/// A peer or a file uses a version of an encoding that this build does not read.
///
/// `theirs` is what the other side uses: the version of a frame or file it wrote (oldest and
/// current equal), or the versions a peer reads when it refused ours. Version 0 is a peer of
/// a build from before frames carried a version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct VersionError {
    pub encoding: &'static str,
    pub writer: Writer,
    /// The other side's oldest and current version.
    pub theirs: (u16, u16),
    /// This build's oldest and current version.
    pub ours: (u16, u16),
}

impl Encoding {
    /// Whether this build reads `version`.
    pub fn reads(&self, version: u16) -> bool {
        (self.oldest..=self.current).contains(&version)
    }

    /// `version`, when this build reads it; else the error that names both sides' versions.
    pub fn check(&self, version: u16, writer: Writer) -> Result<u16, VersionError> {
        if self.reads(version) {
            return Ok(version);
        }
        Err(self.mismatch(writer, (version, version)))
    }

    /// The error for a peer or file that uses `theirs` (oldest, current).
    pub fn mismatch(&self, writer: Writer, theirs: (u16, u16)) -> VersionError {
        VersionError {
            encoding: self.name,
            writer,
            theirs,
            ours: (self.oldest, self.current),
        }
    }
}

impl VersionError {
    /// Whether the other side is newer than this build (else it is older).
    pub fn theirs_is_newer(&self) -> bool {
        self.theirs.0 > self.ours.1
    }

    fn describe(&self) -> String {
        let theirs = match self.theirs {
            (0, 0) => "no version (a build from before messages carried one)".to_string(),
            (oldest, current) => versions(oldest, current),
        };
        let ours = versions(self.ours.0, self.ours.1);
        let encoding = self.encoding;
        match (&self.writer, self.theirs_is_newer()) {
            (Writer::Peer(peer), true) => format!(
                "{peer} speaks {theirs} of {encoding}, newer than this build ({ours}): upgrade \
                 this program to the peer's release"
            ),
            (Writer::Peer(peer), false) => format!(
                "{peer} speaks {theirs} of {encoding}, older than this build ({ours}): upgrade \
                 {peer} to this release"
            ),
            (Writer::File(path), true) => format!(
                "{path} holds {theirs} of {encoding}, written by a newer build; this build reads \
                 {ours}: run the release that wrote it, or a newer one"
            ),
            (Writer::File(path), false) => format!(
                "{path} holds {theirs} of {encoding}, older than this build reads ({ours}): open \
                 it first with a release that reads both, so that it is rewritten"
            ),
        }
    }
}

fn versions(oldest: u16, current: u16) -> String {
    if oldest == current {
        format!("version {current}")
    } else {
        format!("versions {oldest} to {current}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: Encoding = Encoding {
        name: "the sample encoding",
        current: 3,
        oldest: 2,
    };

    #[test]
    fn every_version_from_the_oldest_to_the_current_is_read() {
        // Proves the range is inclusive at both ends and nothing outside it passes.
        assert!(!SAMPLE.reads(1));
        assert!(SAMPLE.reads(2));
        assert!(SAMPLE.reads(3));
        assert!(!SAMPLE.reads(4));
        assert_eq!(SAMPLE.check(2, Writer::File("f".into())), Ok(2));
    }

    #[test]
    fn a_refusal_names_both_versions_and_which_side_to_upgrade() {
        // Proves each way of not matching says whose upgrade helps.
        let peer = || Writer::Peer("the coordinator at 10.0.0.1:7401".into());
        let newer = SAMPLE.check(4, peer()).unwrap_err().to_string();
        assert!(
            newer.contains("version 4") && newer.contains("versions 2 to 3"),
            "{newer}"
        );
        assert!(newer.contains("upgrade this program"), "{newer}");
        let older = SAMPLE.check(1, peer()).unwrap_err().to_string();
        assert!(
            older.contains("upgrade the coordinator at 10.0.0.1:7401"),
            "{older}"
        );
        let unversioned = SAMPLE.check(0, peer()).unwrap_err().to_string();
        assert!(unversioned.contains("no version"), "{unversioned}");
        // A peer that refused ours names the versions it reads.
        let refused = SAMPLE.mismatch(peer(), (5, 6)).to_string();
        assert!(refused.contains("versions 5 to 6"), "{refused}");
        assert!(refused.contains("upgrade this program"), "{refused}");
        let file = SAMPLE
            .check(9, Writer::File("/data/snapshot.bin".into()))
            .unwrap_err()
            .to_string();
        assert!(
            file.contains("/data/snapshot.bin") && file.contains("written by a newer build"),
            "{file}"
        );
    }

    #[test]
    fn every_encoding_reads_its_own_version() {
        // Proves no encoding was declared with its oldest version past its current one.
        for encoding in ENCODINGS {
            assert!(
                encoding.oldest >= 1,
                "{}: version 0 is no version",
                encoding.name
            );
            assert!(encoding.reads(encoding.current), "{}", encoding.name);
        }
    }
}
