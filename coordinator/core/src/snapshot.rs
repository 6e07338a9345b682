//! Snapshots: the canonical state to bytes and back (bincode 2, size-limited).
//!
//! Only `StateData` is written; the index is rebuilt on load, then the whole state is
//! validated, so a corrupt or hand-edited snapshot is refused rather than trusted.

use crate::index::Index;
use crate::job_table::JobTable;
use crate::limits::SNAPSHOT_BYTES_MAX;
use crate::state::{IdempotencyKeys, State, StateData};

/// Why snapshot bytes could not be turned back into a state.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is {size} bytes, over the limit of {max}")]
    TooLarge { size: usize, max: usize },
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
    /// The fields after `idempotency`, encoded.
    tail: Vec<u8>,
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
        } = &self.data;
        let mut head = Vec::new();
        encode(shares, &mut head);
        let mut middle = Vec::new();
        encode(node_ids, &mut middle);
        encode(nodes, &mut middle);
        let mut tail = Vec::new();
        encode(last_applied_index, &mut tail);
        SnapshotCapture {
            head,
            jobs: jobs.clone(),
            middle,
            idempotency: idempotency.clone(),
            tail,
        }
    }

    /// Loads a snapshot, rebuilding and validating the derived index.
    pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<State, SnapshotError> {
        if bytes.len() > SNAPSHOT_BYTES_MAX {
            return Err(SnapshotError::TooLarge {
                size: bytes.len(),
                max: SNAPSHOT_BYTES_MAX,
            });
        }
        let (data, read): (StateData, usize) = bincode::serde::decode_from_slice(bytes, config())
            .map_err(|e| SnapshotError::Decode(e.to_string()))?;
        if read != bytes.len() {
            return Err(SnapshotError::Trailing(bytes.len() - read));
        }
        let index = Index::rebuild(&data);
        let state = State {
            data,
            index,
            changes: None,
        };
        state
            .validate()
            .map_err(|e| SnapshotError::Invalid(e.to_string()))?;
        Ok(state)
    }
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
}
