//! Data directories written before the log had its own files ([`super::wal`]) kept the log
//! entries in the redb table `raft_log` and the committed id in `raft-committed.bin`. Opening
//! one moves them into the log, in an order that a crash at any point can resume:
//!
//! 1. the log directory is emptied and the table's entries written to it (synced);
//! 2. the table is emptied, in a synced transaction: from here on the log is the only copy;
//! 3. the committed id of the old file is written to the log when it is newer than what the
//!    log holds, then the file is removed.
//!
//! A crash before step 2 leaves the table full, so the next open starts again at step 1; a
//! crash after it leaves at most the old file, which step 3 handles again.

use std::path::Path;

use openraft::{LogId, NodeId};
use redb::{Database, Durability, ReadableTable, ReadableTableMetadata};

use super::codec::{decode_value, encode_value, CodecError};
use super::committed_file::{CommittedFile, CommittedFileError, COMMITTED_FILE_NAME};
use super::log_writer::LOGS_TABLE;
use super::wal::{Record, Wal, WalError};

/// How many entries one log write of the move carries.
const MOVE_BATCH_ENTRIES: usize = 1_024;

/// Why the move failed.
#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    #[error("reading the old log table: {0}")]
    Db(Box<redb::Error>),
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error(transparent)]
    Committed(#[from] CommittedFileError),
    #[error("the old committed id: {0}")]
    Codec(#[from] CodecError),
    #[error("removing the old committed file: {0}")]
    Io(#[from] std::io::Error),
}

fn db_error(error: impl Into<redb::Error>) -> LegacyError {
    LegacyError::Db(Box::new(error.into()))
}

/// Whether the old table still holds entries.
pub fn has_legacy_entries(db: &Database) -> Result<bool, LegacyError> {
    let txn = db.begin_read().map_err(db_error)?;
    let table = txn.open_table(LOGS_TABLE).map_err(db_error)?;
    Ok(!table.is_empty().map_err(db_error)?)
}

/// Steps 1 and 2: writes the old table's entries to `wal` (freshly emptied), then empties the
/// table.
pub fn move_legacy_entries(db: &Database, wal: &Wal) -> Result<(), LegacyError> {
    let mut moved = 0usize;
    {
        let txn = db.begin_read().map_err(db_error)?;
        let table = txn.open_table(LOGS_TABLE).map_err(db_error)?;
        let mut batch: Vec<(u64, Vec<u8>)> = Vec::with_capacity(MOVE_BATCH_ENTRIES);
        let write = |batch: &mut Vec<(u64, Vec<u8>)>| -> Result<(), WalError> {
            wal.write(&Record::entries(batch))?;
            batch.clear();
            Ok(())
        };
        for item in table.iter().map_err(db_error)? {
            let (index, bytes) = item.map_err(db_error)?;
            batch.push((index.value(), bytes.value().to_vec()));
            moved += 1;
            if batch.len() == MOVE_BATCH_ENTRIES {
                write(&mut batch)?;
            }
        }
        write(&mut batch)?;
    }
    let mut txn = db.begin_write().map_err(db_error)?;
    txn.set_durability(Durability::Immediate);
    {
        let mut table = txn.open_table(LOGS_TABLE).map_err(db_error)?;
        table.retain(|_, _| false).map_err(db_error)?;
    }
    txn.commit().map_err(db_error)?;
    tracing::info!(entries = moved, dir = %wal.dir().display(), "moved the raft log out of redb into its own files");
    Ok(())
}

/// Step 3: the committed id to go on with, the old file's when it is newer than `committed`.
pub fn move_legacy_committed<NID: NodeId>(
    data_dir: &Path,
    wal: &Wal,
    committed: Option<LogId<NID>>,
) -> Result<Option<LogId<NID>>, LegacyError> {
    let path = data_dir.join(COMMITTED_FILE_NAME);
    if !path.exists() {
        return Ok(committed);
    }
    let old: Option<LogId<NID>> = match CommittedFile::open(data_dir)?.read()? {
        None => None,
        Some(bytes) => decode_value(&bytes)?,
    };
    let committed = if old > committed {
        wal.write(&[Record::Committed {
            bytes: &encode_value(&old)?,
        }])?;
        old
    } else {
        committed
    };
    std::fs::remove_file(&path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(committed)
}
