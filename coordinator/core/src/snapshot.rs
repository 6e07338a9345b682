//! Snapshots: the canonical state to bytes and back (bincode 2, size-limited).
//!
//! Only `StateData` is written; the index is rebuilt on load, then the whole state is
//! validated, so a corrupt or hand-edited snapshot is refused rather than trusted.
//!
//! The bytes start with [`SNAPSHOT_STATE_MAGIC`] and the version of the encoding they are in
//! (`quotient_common::version::SNAPSHOT_STATE`, u16 little-endian), the same in the snapshot
//! file and in the snapshot a leader sends a follower, so that a state written by another
//! build is read with its own version's decoder ([`State::from_snapshot_version`]) or
//! refused naming both versions.

use quotient_common::version::{VersionError, Writer, SNAPSHOT_STATE};

use crate::index::Index;
use crate::job_table::JobTable;
use crate::limits::SNAPSHOT_BYTES_MAX;
use crate::state::{IdempotencyKeys, State, StateData};

/// The first bytes of a snapshot of the state; its version follows.
pub const SNAPSHOT_STATE_MAGIC: [u8; 2] = *b"QS";
/// Magic and version.
pub const SNAPSHOT_STATE_HEADER_BYTES: usize = 4;

/// Why snapshot bytes could not be turned back into a state.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is {size} bytes, over the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("not a snapshot of the state: it does not start with its header")]
    NoHeader,
    /// In a version of the state's encoding this build does not read.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// A version this build reads has no decoder (a programming error: the version was bumped
    /// without [`State::from_snapshot_version`] learning it).
    #[error("this build has no decoder for version {0} of the snapshot state")]
    NoCodec(u16),
    #[error("snapshot does not decode: {0}")]
    Decode(String),
    #[error("snapshot has {0} trailing bytes")]
    Trailing(usize),
    #[error("snapshot violates an invariant: {0}")]
    Invalid(String),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<SNAPSHOT_BYTES_MAX>()
}

fn encode<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    bincode::serde::encode_into_std_write(value, out, config())
        .expect("encoding in-memory state into memory cannot fail");
}

/// A snapshot taken but not yet encoded: the small fields of [`StateData`] already as bytes,
/// the jobs as a copy-on-write clone of their table and the idempotency keys as a clone of
/// their persistent map, which shares its nodes with the state's. Taking one costs the
/// encoding of the small fields, one pointer per 4,096 jobs and one for the keys, so a caller
/// holding a lock over the state can take it, let go, and encode the jobs and keys (nearly all
/// of a large state) after: [`SnapshotCapture::into_bytes`].
#[derive(Debug)]
pub struct SnapshotCapture {
    /// The fields before `jobs`, encoded.
    head: Vec<u8>,
    jobs: JobTable,
    /// The fields between `jobs` and `idempotency`, encoded.
    middle: Vec<u8>,
    idempotency: IdempotencyKeys,
    /// The fields between `idempotency` and `audit`, encoded.
    tail: Vec<u8>,
    audit: imbl::Vector<crate::state::AuditEntry>,
    key_expiry: imbl::OrdSet<(u64, String)>,
    usage: imbl::OrdMap<u64, crate::usage::UsageHour>,
    /// The fields between `usage` and `events`, encoded.
    end: Vec<u8>,
    events: imbl::Vector<quotient_common::event::Event>,
    /// The fields after `events`, encoded.
    last: Vec<u8>,
}

impl SnapshotCapture {
    /// The snapshot's bytes: exactly [`State::to_snapshot_bytes`] at the time of capture.
    /// bincode writes a struct as its fields one after another, with nothing around them, so
    /// the fields may be encoded apart and joined.
    pub fn into_bytes(self) -> Vec<u8> {
        let mut bytes = self.head;
        encode(&self.jobs, &mut bytes);
        bytes.extend_from_slice(&self.middle);
        encode(&self.idempotency, &mut bytes);
        bytes.extend_from_slice(&self.tail);
        encode(&self.audit, &mut bytes);
        encode(&self.key_expiry, &mut bytes);
        encode(&self.usage, &mut bytes);
        bytes.extend_from_slice(&self.end);
        encode(&self.events, &mut bytes);
        bytes.extend_from_slice(&self.last);
        bytes
    }
}

impl State {
    /// The canonical state as bytes; equal states give equal bytes.
    pub fn to_snapshot_bytes(&self) -> Vec<u8> {
        self.capture_snapshot().into_bytes()
    }

    /// Takes a snapshot to encode later; see [`SnapshotCapture`].
    pub fn capture_snapshot(&self) -> SnapshotCapture {
        // Spelled out so that a new field cannot be forgotten; keep the order of the struct.
        let StateData {
            shares,
            jobs,
            node_ids,
            nodes,
            idempotency,
            last_applied_index,
            groups,
            revoked,
            audit,
            key_expiry,
            usage,
            usage_clock_ms,
            events,
            events_issued,
            aws,
            sessions,
            checkpoints,
            clock_ms,
        } = &self.data;
        let mut head = SNAPSHOT_STATE_MAGIC.to_vec();
        head.extend_from_slice(&SNAPSHOT_STATE.current.to_le_bytes());
        encode(shares, &mut head);
        let mut middle = Vec::new();
        encode(node_ids, &mut middle);
        encode(nodes, &mut middle);
        let mut tail = Vec::new();
        encode(last_applied_index, &mut tail);
        encode(groups, &mut tail);
        encode(revoked, &mut tail);
        SnapshotCapture {
            head,
            jobs: jobs.clone(),
            middle,
            idempotency: idempotency.clone(),
            tail,
            audit: audit.clone(),
            key_expiry: key_expiry.clone(),
            usage: usage.clone(),
            end: {
                let mut end = Vec::new();
                encode(usage_clock_ms, &mut end);
                end
            },
            events: events.clone(),
            last: {
                let mut last = Vec::new();
                encode(events_issued, &mut last);
                encode(aws, &mut last);
                encode(sessions, &mut last);
                encode(checkpoints, &mut last);
                encode(clock_ms, &mut last);
                last
            },
        }
    }

    /// Loads a snapshot (header and body, as [`State::to_snapshot_bytes`] gives them),
    /// rebuilding and validating the derived index.
    pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<State, SnapshotError> {
        let Some((header, body)) = bytes.split_at_checked(SNAPSHOT_STATE_HEADER_BYTES) else {
            return Err(SnapshotError::NoHeader);
        };
        if header[..2] != SNAPSHOT_STATE_MAGIC {
            return Err(SnapshotError::NoHeader);
        }
        State::from_snapshot_version(u16::from_le_bytes([header[2], header[3]]), body)
    }

    /// Loads the body of a snapshot of `version` (without its header: a snapshot file of the
    /// first layout held the state of version 1 so), with that version's decoder.
    pub fn from_snapshot_version(version: u16, body: &[u8]) -> Result<State, SnapshotError> {
        SNAPSHOT_STATE.check(version, Writer::File("the snapshot".to_string()))?;
        if body.len() > SNAPSHOT_BYTES_MAX {
            return Err(SnapshotError::TooLarge {
                size: body.len(),
                max: SNAPSHOT_BYTES_MAX,
            });
        }
        // One arm per version this build reads; a bumped version keeps the previous one's
        // `StateData` and converts it here (quotient_common::version says how).
        let data: StateData = match version {
            version if version == SNAPSHOT_STATE.current => decode_data(body)?,
            1 => decode_data::<crate::v1::StateDataV1>(body)?.into(),
            2 => decode_data::<crate::v2::StateDataV2>(body)?.into(),
            3 => decode_data::<crate::v3::StateDataV3>(body)?.into(),
            4 => decode_data::<crate::v4::StateDataV4>(body)?.into(),
            5 => decode_data::<crate::v5::StateDataV5>(body)?.into(),
            6 => decode_data::<crate::v6::StateDataV6>(body)?.into(),
            other => return Err(SnapshotError::NoCodec(other)),
        };
        // What building the index relies on, checked first (the rest after, by `validate`):
        // a job without its class made the rebuild panic (found by the snapshot_state fuzz
        // target).
        if let Some(job) = data.jobs.iter().find(|job| job.spec.gpu_class.is_none()) {
            return Err(SnapshotError::Invalid(format!(
                "{} has no GPU class",
                job.id
            )));
        }
        let index = Index::rebuild(&data);
        let state = State {
            data,
            index,
            changes: None,
            rates: None,
            finished: None,
            acting: None,
            applying_ms: 0,
        };
        // The index was just built from the records: only the records need checking.
        state
            .validate_records()
            .map_err(|e| SnapshotError::Invalid(e.to_string()))?;
        Ok(state)
    }
}

/// How many bytes decoding may claim per byte of the snapshot (bincode's limit counts every
/// length and integer at its in-memory size): a snapshot's lists of small records claim a few
/// times their encoded size, never this much.
const CLAIMED_PER_SNAPSHOT_BYTE_MAX: usize = 16;

/// The whole `body` as `StateData` of the current version. What decoding may claim grows with
/// the body (the smallest of a few limits that covers [`CLAIMED_PER_SNAPSHOT_BYTE_MAX`] times
/// its length): bincode allocates a string or list of the length it reads before reading its
/// bytes, so under one large limit a few bytes claiming a 4 GiB string would allocate 4 GiB.
/// Found by the `snapshot_state` fuzz target.
fn decode_data<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SnapshotError> {
    let claims = body.len().saturating_mul(CLAIMED_PER_SNAPSHOT_BYTE_MAX);
    let decoded = if claims <= 1 << 20 {
        decode_within::<T, { 1 << 20 }>(body)
    } else if claims <= 1 << 24 {
        decode_within::<T, { 1 << 24 }>(body)
    } else if claims <= 1 << 28 {
        decode_within::<T, { 1 << 28 }>(body)
    } else if claims <= 1 << 30 {
        decode_within::<T, { 1 << 30 }>(body)
    } else {
        decode_within::<T, SNAPSHOT_BYTES_MAX>(body)
    };
    let (data, read) = decoded.map_err(|e| SnapshotError::Decode(e.to_string()))?;
    if read != body.len() {
        return Err(SnapshotError::Trailing(body.len() - read));
    }
    Ok(data)
}

fn decode_within<T: serde::de::DeserializeOwned, const LIMIT: usize>(
    body: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    bincode::serde::decode_from_slice(body, bincode::config::standard().with_limit::<LIMIT>())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use quotient_common::JobId;

    use super::{config, encode};
    use crate::state::IdempotencyKeys;

    /// The keys moved from a `BTreeMap` to a persistent map: both encode to the same bytes, so
    /// snapshots written before the move still load and equal states still give equal bytes.
    #[test]
    fn idempotency_keys_encode_and_decode_as_a_btree_map_does() {
        let pairs = [("run-b", 2), ("run-a", 1), ("run-c", 30_000)];
        let keys: IdempotencyKeys = pairs
            .iter()
            .map(|(key, job)| (key.to_string(), JobId(*job)))
            .collect();
        let btree: BTreeMap<String, JobId> = pairs
            .iter()
            .map(|(key, job)| (key.to_string(), JobId(*job)))
            .collect();
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        encode(&keys, &mut ours);
        encode(&btree, &mut theirs);
        assert_eq!(ours, theirs);
        let (decoded, read): (IdempotencyKeys, usize) =
            bincode::serde::decode_from_slice(&theirs, config()).expect("decodes");
        assert_eq!(read, theirs.len());
        assert_eq!(decoded, keys);
    }

    /// A snapshot carries its version: this build's reads back; another is refused naming
    /// both versions, and bytes without the header are not taken for a state.
    #[test]
    fn a_few_bytes_claiming_a_huge_string_are_refused_without_allocating_it() {
        // Found by the snapshot_state fuzz target: a share name claiming 4 GiB. The limit
        // scales with the body, so this is a decode error, not a 4 GiB allocation.
        let mut body = vec![1u8]; // one share
        body.push(0xFC); // a u32 length follows (varint)
        body.extend_from_slice(&0xF000_0000u32.to_le_bytes());
        body.extend_from_slice(b"abc");
        let error = super::decode_data::<super::StateData>(&body).unwrap_err();
        // Refused for its claim before any allocation (with a 4 GiB limit it was allocated,
        // then found short of bytes).
        assert!(error.to_string().contains("LimitExceeded"), "{error}");
    }

    #[test]
    fn a_few_bytes_claiming_countless_idempotency_keys_are_an_error_not_an_abort() {
        // Found by the snapshot_state fuzz target: imbl's map reserved room for the 2^53 keys
        // the input claimed, and the process aborted. Empty shares, jobs, node names and nodes,
        // then a map of 2^53 keys and no bytes for them.
        let mut body = vec![0u8, 0, 0, 0, 0xFD];
        body.extend_from_slice(&(1u64 << 53).to_le_bytes());
        let error = super::decode_data::<super::StateData>(&body).unwrap_err();
        assert!(matches!(error, super::SnapshotError::Decode(_)), "{error}");
    }

    #[test]
    fn a_job_without_a_class_is_an_invalid_snapshot_not_a_panic() {
        // Found by the snapshot_state fuzz target: the index was rebuilt before the state was
        // validated, and a job without its class made the rebuild panic.
        let mut state = crate::State::new();
        let mut job = crate::state::JobRecord::new(
            JobId(1),
            quotient_common::JobSpec::new("s", 1, 1, vec!["x".into()]),
            0,
        );
        job.spec.gpu_class = None;
        state.data.jobs.push(job);
        let bytes = state.to_snapshot_bytes();
        let error = crate::State::from_snapshot_bytes(&bytes).unwrap_err();
        assert!(error.to_string().contains("has no GPU class"), "{error}");
    }

    #[test]
    fn a_version_3_state_reads_back_with_its_one_serial_per_revoked_name() {
        // Version 3 kept one serial (or none: the whole name) per revoked name; version 4 keeps
        // a set. The state as version 3 wrote it: the same fields, in order, with its revocation.
        #[derive(serde::Serialize)]
        struct RevocationV3 {
            serial: Option<String>,
            at_ms: u64,
        }
        let state = crate::State::new();
        let data = &state.data;
        let revoked = BTreeMap::from([
            (
                "bob".to_string(),
                RevocationV3 {
                    serial: Some("a1b".into()),
                    at_ms: 5,
                },
            ),
            (
                "ops".to_string(),
                RevocationV3 {
                    serial: None,
                    at_ms: 6,
                },
            ),
        ]);
        let mut body = Vec::new();
        encode(&data.shares, &mut body);
        // Version 3's job table: the records alone (none here).
        encode(&Vec::<crate::state::JobRecord>::new(), &mut body);
        encode(&data.node_ids, &mut body);
        encode(&data.nodes, &mut body);
        encode(&data.idempotency, &mut body);
        encode(&data.last_applied_index, &mut body);
        encode(&data.groups, &mut body);
        encode(&revoked, &mut body);
        encode(&data.audit, &mut body);
        let state = crate::State::from_snapshot_version(3, &body).expect("version 3 reads");
        assert!(state.is_revoked("bob", Some("A1B")));
        assert!(!state.is_revoked("bob", Some("a1c")));
        assert!(state.is_revoked("ops", None));
        assert_eq!(state.data.revoked["bob"].at_ms, 5);
    }

    #[test]
    fn a_version_4_state_reads_back_without_events_and_events_round_trip() {
        // Version 5 added the events at the end; version 4 is every field before them. A
        // state with events reads back with them, numbered as they were.
        use crate::command::{ApplyCtx, Command};
        let mut state = crate::State::new();
        let spec = quotient_common::ShareSpec {
            name: "qs1".into(),
            limits: BTreeMap::from([(
                quotient_common::GpuClass::parse("a10g").expect("a class"),
                1,
            )]),
            strategy: quotient_common::Strategy::Lend,
            borrow_limit_percent: None,
            in_share_preemption: false,
            state: quotient_common::ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        };
        let ctx = ApplyCtx {
            log_index: 1,
            time_ms: 7_000,
        };
        let outcome = crate::apply(&mut state, Command::CreateShare(spec), ctx);
        assert!(!outcome.is_rejected(), "{outcome:?}");
        let bytes = state.to_snapshot_bytes();
        let back = crate::State::from_snapshot_bytes(&bytes).expect("reads back");
        assert_eq!(back.data.events, state.data.events);
        assert_eq!(back.data.events_issued, 1);
        assert_eq!(back.data.events[0].at_ms, 7_000);

        let mut body = Vec::new();
        let data = &state.data;
        encode(&data.shares, &mut body);
        encode(&data.jobs, &mut body);
        encode(&data.node_ids, &mut body);
        encode(&data.nodes, &mut body);
        encode(&data.idempotency, &mut body);
        encode(&data.last_applied_index, &mut body);
        encode(&data.groups, &mut body);
        encode(&data.revoked, &mut body);
        encode(&data.audit, &mut body);
        encode(&data.key_expiry, &mut body);
        encode(&data.usage, &mut body);
        encode(&data.usage_clock_ms, &mut body);
        let v4 = crate::State::from_snapshot_version(4, &body).expect("version 4 reads");
        assert!(v4.share("qs1").is_some());
        assert!(v4.data.events.is_empty());
        assert_eq!(v4.data.events_issued, 0);
    }

    #[test]
    fn a_snapshot_carries_its_version_and_another_is_refused_naming_both() {
        use crate::state::State;
        use quotient_common::version::SNAPSHOT_STATE;

        let bytes = State::new().to_snapshot_bytes();
        assert_eq!(&bytes[..2], b"QS");
        assert_eq!(
            u16::from_le_bytes([bytes[2], bytes[3]]),
            SNAPSHOT_STATE.current
        );
        assert!(State::from_snapshot_bytes(&bytes).is_ok());
        assert!(State::from_snapshot_version(SNAPSHOT_STATE.current, &bytes[4..]).is_ok());

        let mut newer = bytes.clone();
        newer[2..4].copy_from_slice(&(SNAPSHOT_STATE.current + 1).to_le_bytes());
        let error = State::from_snapshot_bytes(&newer).unwrap_err().to_string();
        assert!(
            error.contains(&format!("version {}", SNAPSHOT_STATE.current + 1))
                && error.contains("newer build"),
            "{error}"
        );
        assert!(matches!(
            State::from_snapshot_bytes(&bytes[4..]),
            Err(super::SnapshotError::NoHeader)
        ));
    }
}
