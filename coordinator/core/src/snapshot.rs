//! Snapshots: the canonical state to bytes and back (bincode 2, size-limited).
//!
//! Only `StateData` is written; the index is rebuilt on load, then the whole state is
//! validated, so a corrupt or hand-edited snapshot is refused rather than trusted.

use crate::index::Index;
use crate::limits::SNAPSHOT_BYTES_MAX;
use crate::state::{State, StateData};

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

impl State {
    /// The canonical state as bytes; equal states give equal bytes.
    pub fn to_snapshot_bytes(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(&self.data, config())
            .expect("encoding in-memory state cannot fail")
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
        let state = State { data, index };
        state
            .validate()
            .map_err(|e| SnapshotError::Invalid(e.to_string()))?;
        Ok(state)
    }
}
