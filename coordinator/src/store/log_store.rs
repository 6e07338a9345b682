//! The durable Raft log: openraft's storage-v2 [`RaftLogStorage`] and [`RaftLogReader`] over
//! the log's segment files, `DATA_DIR/raft-wal/` ([`Wal`]: the entries and the committed id),
//! and one redb database file, `DATA_DIR/raft.redb` (the vote and the last purged log id,
//! written once an election or a compaction, where a B-tree's cost does not matter).
//!
//! Every write goes through one [`LogWriter`] thread, in the order openraft makes them, and is
//! synced before it counts: a run of entries, truncations and committed ids is one log write
//! and one `fdatasync`, a vote or a purge one redb transaction committed with
//! [`redb::Durability::Immediate`]. The vote, truncate, purge and the committed id are
//! acknowledged only once durable. Appended entries are the exception, and the writer's module
//! says why it is safe: openraft's [`LogFlushed`] callback is called as soon as the entries are
//! queued, so that the leader replicates while it writes, and every way a commit can be seen
//! waits for the disk instead ([`LogDurability`]). Entries not yet on disk are read from the
//! writer's in-memory tail; the rest from the log's files. Large reads run on tokio's blocking
//! pool; reads of a few entries run in place ([`INLINE_READ_ENTRIES_MAX`]).

// `StorageError` is openraft's error type, which its storage traits require; its size is theirs.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogId, RaftLogReader,
    RaftTypeConfig, StorageError, StorageIOError, Vote,
};
use redb::Database;

use super::codec::{
    check_version, decode_stored, encode_value, VersionedEntries, VERSION_OF_UNRECORDED,
};
pub use super::log_writer::{
    check_committed_mark, version_key, LogDurability, KEY_COMMITTED_MARK, KEY_LAST_PURGED,
    KEY_VOTE, META_TABLE,
};
use super::log_writer::{EncodedEntry, LogWriter};
use super::wal::{Stored, Wal, WAL_DIR_NAME};
use quotient_common::version::RAFT_LOG;

/// The database file name inside the data directory.
pub const DB_FILE_NAME: &str = "raft.redb";

/// The redb-backed Raft log store; cheap to clone, and each clone is also its log reader.
///
/// Generic over the type config `C`; its entries are encoded with the store's codec
/// (bincode 2 through serde, with a size limit).
pub struct RaftLogStore<C: RaftTypeConfig> {
    writer: Arc<LogWriter<C::NodeId>>,
    _config: PhantomData<fn() -> C>,
}

impl<C: RaftTypeConfig> Clone for RaftLogStore<C> {
    fn clone(&self) -> Self {
        Self {
            writer: Arc::clone(&self.writer),
            _config: PhantomData,
        }
    }
}

impl<C: RaftTypeConfig> Debug for RaftLogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLogStore")
            .field("path", &self.writer.path())
            .finish()
    }
}

/// Turns an error of opening the store into a [`StorageError`] naming `what`.
fn open_error<NID: openraft::NodeId>(
    verb: ErrorVerb,
    what: impl Fn() -> String,
) -> impl FnOnce(&dyn std::error::Error) -> StorageError<NID> {
    move |error| {
        let source = AnyError::error(format!("{}: {error}", what()));
        StorageIOError::new(ErrorSubject::Store, verb, source).into()
    }
}

impl<C: VersionedEntries> RaftLogStore<C> {
    /// Opens the store in `data_dir`: the database `raft.redb` (vote, purged id) and the log
    /// in `raft-wal/`, creating them when missing, and starts the writer thread. Blocks on file
    /// I/O, so call it at startup (or from a blocking task).
    ///
    /// Fails if a file cannot be created or opened, is not a redb database, is already open
    /// (in this process or another: redb locks the file), or the log is damaged.
    pub fn open(data_dir: &Path) -> Result<Self, StorageError<C::NodeId>> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            open_error(ErrorVerb::Write, || {
                format!("creating raft data directory {}", data_dir.display())
            })(&e)
        })?;
        let path = data_dir.join(DB_FILE_NAME);
        let opening = || format!("opening raft log database {}", path.display());
        let db = super::open_database(&path, super::RAFT_DB_FIX).map_err(|message| {
            StorageError::from(StorageIOError::new(
                ErrorSubject::Store,
                ErrorVerb::Read,
                AnyError::error(message),
            ))
        })?;
        // Create the table up front so that read transactions always find it.
        let created = (|| -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(META_TABLE)?;
            txn.commit()?;
            Ok(())
        })();
        created.map_err(|e| open_error(ErrorVerb::Write, opening)(&e))?;
        let purged: Option<LogId<C::NodeId>> = read_meta(&db, KEY_LAST_PURGED)
            .map_err(|e| open_error(ErrorVerb::Read, opening)(&e))?
            .map(|stored| decode_stored(stored.version, &stored.bytes, &path))
            .transpose()
            .map_err(|e| store_error(&path, ErrorSubject::Store, ErrorVerb::Read, e))?;
        let purged = purged.map(|log_id| log_id.index);
        let wal_dir = data_dir.join(WAL_DIR_NAME);
        let (wal, recovered) = Wal::open(data_dir, purged)
            .map_err(|e| store_error(&wal_dir, ErrorSubject::Logs, ErrorVerb::Read, e))?;
        // The log must reach the committed mark recorded beside it (`check_committed_mark`).
        let mark: Option<u64> = read_meta(&db, KEY_COMMITTED_MARK)
            .map_err(|e| open_error(ErrorVerb::Read, opening)(&e))?
            .map(|stored| decode_stored(stored.version, &stored.bytes, &path))
            .transpose()
            .map_err(|e| store_error(&path, ErrorSubject::Store, ErrorVerb::Read, e))?;
        let log_end = wal.bounds().map(|(_, last)| last).max(purged);
        check_committed_mark(log_end, mark, &wal_dir, &path).map_err(|message| {
            StorageError::from(StorageIOError::new(
                ErrorSubject::Logs,
                ErrorVerb::Read,
                AnyError::error(message),
            ))
        })?;
        let committed: Option<LogId<C::NodeId>> = match recovered.committed {
            None => None,
            Some(stored) => decode_stored(stored.version, &stored.bytes, &wal_dir)
                .map_err(|e| store_error(&wal_dir, ErrorSubject::Store, ErrorVerb::Read, e))?,
        };
        let writer = LogWriter::start(db, path.clone(), wal, committed, purged).map_err(|e| {
            open_error(ErrorVerb::Write, || {
                format!("starting the writer of {}", path.display())
            })(&e)
        })?;
        tracing::debug!(path = %path.display(), "opened raft log store");
        Ok(Self {
            writer: Arc::new(writer),
            _config: PhantomData,
        })
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        self.writer.path()
    }

    /// A watch on what of this log is durable: the Raft network's two sides wait on it
    /// before they let a commit be seen (see the writer's module).
    pub fn durability(&self) -> LogDurability<C::NodeId> {
        self.writer.durability()
    }

    /// The database (vote, purged id), for inspection.
    pub fn database(&self) -> &Database {
        self.writer.db()
    }

    /// The log of entries and committed ids, for inspection; [`Wal::stall`] holds its writes
    /// back, as a slow disk would.
    pub fn wal(&self) -> &Wal {
        self.writer.wal()
    }

    /// Runs a read on tokio's blocking pool, mapping its error to a
    /// [`StorageError`] about `subject` that names the database file.
    async fn blocking<R, E, F>(
        &self,
        subject: ErrorSubject<C::NodeId>,
        verb: ErrorVerb,
        f: F,
    ) -> Result<R, StorageError<C::NodeId>>
    where
        F: FnOnce(&LogWriter<C::NodeId>) -> Result<R, E> + Send + 'static,
        E: std::error::Error + Send + 'static,
        R: Send + 'static,
    {
        let writer = Arc::clone(&self.writer);
        let joined = tokio::task::spawn_blocking(move || f(&writer)).await;
        match joined {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(store_error(self.path(), subject, verb, e)),
            Err(join) => Err(store_error(self.path(), subject, verb, join)),
        }
    }

    /// Maps a writer's failure to a [`StorageError`].
    fn write_error(
        &self,
        subject: ErrorSubject<C::NodeId>,
        verb: ErrorVerb,
    ) -> impl FnOnce(Arc<str>) -> StorageError<C::NodeId> {
        move |reason| StorageIOError::new(subject, verb, AnyError::error(reason)).into()
    }

    async fn read_meta_value<T>(
        &self,
        key: &'static str,
        subject: ErrorSubject<C::NodeId>,
    ) -> Result<Option<T>, StorageError<C::NodeId>>
    where
        T: serde::de::DeserializeOwned,
    {
        let stored = self
            .blocking(subject.clone(), ErrorVerb::Read, move |writer| {
                read_meta(writer.db(), key)
            })
            .await?;
        match stored {
            None => Ok(None),
            Some(stored) => decode_stored(stored.version, &stored.bytes, self.path())
                .map(Some)
                .map_err(|e| store_error(self.path(), subject, ErrorVerb::Read, e)),
        }
    }

    fn encode<T: serde::Serialize>(
        &self,
        value: &T,
        subject: ErrorSubject<C::NodeId>,
        verb: ErrorVerb,
    ) -> Result<Vec<u8>, StorageError<C::NodeId>> {
        encode_value(value).map_err(|e| store_error(self.path(), subject, verb, e))
    }

    /// The entry at `index`, stored in `version`, with that version's decoder.
    fn decode_entry(
        &self,
        index: u64,
        version: u16,
        bytes: &[u8],
    ) -> Result<C::Entry, StorageError<C::NodeId>> {
        let dir = self.writer.wal().dir();
        check_version(version, dir)
            .and_then(|version| C::decode_entry(version, bytes))
            .map_err(|e| store_error(dir, ErrorSubject::LogIndex(index), ErrorVerb::Read, e))
    }
}

/// The value under `key` of the meta table and the version it is in.
fn read_meta(db: &Database, key: &'static str) -> Result<Option<Stored>, redb::Error> {
    let txn = db.begin_read()?;
    let table = txn.open_table(META_TABLE)?;
    let Some(bytes) = table.get(key)?.map(|v| v.value().to_vec()) else {
        return Ok(None);
    };
    let version = match table.get(version_key(key))? {
        Some(raw) => match <[u8; 2]>::try_from(raw.value()) {
            Ok(raw) => u16::from_le_bytes(raw),
            // Not a version this or any build wrote: refused as unreadable by the codec.
            Err(_) => u16::MAX,
        },
        None => VERSION_OF_UNRECORDED,
    };
    Ok(Some(Stored { version, bytes }))
}

/// Builds a [`StorageError`] whose message names the database file.
fn store_error<NID, E>(
    path: &Path,
    subject: ErrorSubject<NID>,
    verb: ErrorVerb,
    error: E,
) -> StorageError<NID>
where
    NID: openraft::NodeId,
    E: std::error::Error + 'static,
{
    let source = AnyError::new(&error).add_context(|| format!("raft log store {}", path.display()));
    StorageIOError::new(subject, verb, source).into()
}

/// Most entries a read may ask for and still run on the calling task instead of tokio's
/// blocking pool. Replication and apply read the few entries just appended, which the
/// writer's tail or redb's cache holds: reading them in place costs microseconds, the hop to
/// another thread and back more. Larger reads (a follower catching up) still go to the
/// blocking pool.
pub const INLINE_READ_ENTRIES_MAX: u64 = 64;

/// Whether a read of `bounds` (from [`owned_bounds`]) is small enough to run in place.
fn is_small((start, end): (Bound<u64>, Bound<u64>)) -> bool {
    let Bound::Included(start) = start else {
        return false;
    };
    match end {
        Bound::Included(end) => end.saturating_sub(start) < INLINE_READ_ENTRIES_MAX,
        Bound::Excluded(end) => end.saturating_sub(start) <= INLINE_READ_ENTRIES_MAX,
        Bound::Unbounded => false,
    }
}

/// Turns any `u64` range into owned bounds, or `None` when it is empty.
fn owned_bounds<RB: RangeBounds<u64>>(range: &RB) -> Option<(Bound<u64>, Bound<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => Bound::Included(e),
        Bound::Excluded(&e) => Bound::Excluded(e),
        Bound::Unbounded => Bound::Unbounded,
    };
    let empty = match end {
        Bound::Included(e) => e < start,
        Bound::Excluded(e) => e <= start,
        Bound::Unbounded => false,
    };
    (!empty).then_some((Bound::Included(start), end))
}

/// The last index within `bounds` (from [`owned_bounds`]), `None` when unbounded.
fn last_in((_, end): (Bound<u64>, Bound<u64>)) -> Option<u64> {
    match end {
        Bound::Included(e) => Some(e),
        // `owned_bounds` never returns an empty range, so `e` is above the start.
        Bound::Excluded(e) => Some(e - 1),
        Bound::Unbounded => None,
    }
}

impl<C: VersionedEntries> RaftLogReader<C> for RaftLogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        let Some(bounds) = owned_bounds(&range) else {
            return Ok(Vec::new());
        };
        let Bound::Included(start) = bounds.0 else {
            unreachable!("owned_bounds starts inclusive");
        };
        // The queued tail first: whatever leaves it has reached the log's files by then, so the
        // read that follows finds it.
        let (tail, last_index) = self.writer.tail(start, last_in(bounds));
        let Some(last_index) = last_index else {
            return Ok(Vec::new());
        };
        // The files hold the rest: from `start` up to the first queued entry, never past the
        // log's end (a queued truncation may not have reached the disk yet).
        let disk_end = tail.first().map_or(last_index, |(first, _)| {
            first.saturating_sub(1).min(last_index)
        });
        let disk_end = last_in(bounds).map_or(disk_end, |end| end.min(disk_end));
        let mut raw: Vec<(u64, Stored)> = Vec::new();
        if tail.first().is_none_or(|(first, _)| *first > start) && disk_end >= start {
            let disk = (Bound::Included(start), Bound::Included(disk_end));
            raw = if is_small(disk) {
                self.writer
                    .wal()
                    .read(start, disk_end)
                    .map_err(|e| store_error(self.path(), ErrorSubject::Logs, ErrorVerb::Read, e))?
            } else {
                self.blocking(ErrorSubject::Logs, ErrorVerb::Read, move |writer| {
                    writer.wal().read(start, disk_end)
                })
                .await?
            };
        }
        let mut out = Vec::with_capacity(raw.len() + tail.len());
        for (index, stored) in &raw {
            out.push(self.decode_entry(*index, stored.version, &stored.bytes)?);
        }
        // Queued by this process: the current version.
        for (index, bytes) in &tail {
            out.push(self.decode_entry(*index, RAFT_LOG.current, bytes)?);
        }
        Ok(out)
    }
}

impl<C: VersionedEntries> RaftLogStorage<C> for RaftLogStore<C> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        self.writer
            .barrier()
            .await
            .map_err(self.write_error(ErrorSubject::Logs, ErrorVerb::Read))?;
        // Everything queued is on disk now, so the files alone answer.
        let last_purged_log_id: Option<LogId<C::NodeId>> = self
            .read_meta_value(KEY_LAST_PURGED, ErrorSubject::Logs)
            .await?;
        let last = match self.writer.wal().bounds() {
            None => Vec::new(),
            Some((_, last)) => {
                self.blocking(ErrorSubject::Logs, ErrorVerb::Read, move |writer| {
                    writer.wal().read(last, last)
                })
                .await?
            }
        };
        let last_log_id = match last.first() {
            Some((index, stored)) => Some(
                self.decode_entry(*index, stored.version, &stored.bytes)?
                    .get_log_id()
                    .clone(),
            ),
            None => last_purged_log_id.clone(),
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let bytes = self.encode(vote, ErrorSubject::Vote, ErrorVerb::Write)?;
        self.writer
            .save_vote(bytes)
            .await
            .map_err(self.write_error(ErrorSubject::Vote, ErrorVerb::Write))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        self.read_meta_value(KEY_VOTE, ErrorSubject::Vote).await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        let bytes = self.encode(&committed, ErrorSubject::Store, ErrorVerb::Write)?;
        self.writer
            .save_committed(committed, bytes)
            .await
            .map_err(self.write_error(ErrorSubject::Store, ErrorVerb::Write))
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(self.writer.durability().durable().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded: Vec<(u64, EncodedEntry)> = Vec::new();
        for entry in entries {
            let log_id = entry.get_log_id().clone();
            let bytes = self.encode(&entry, ErrorSubject::Log(log_id.clone()), ErrorVerb::Write)?;
            encoded.push((log_id.index, bytes.into()));
        }
        self.writer
            .append(encoded)
            .map_err(self.write_error(ErrorSubject::Logs, ErrorVerb::Write))?;
        // Queued, readable, not yet durable: see the writer's module for why openraft may
        // count it now, and what waits for the disk instead.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "truncating raft log from this id on");
        self.writer
            .truncate(log_id.index)
            .await
            .map_err(self.write_error(ErrorSubject::Logs, ErrorVerb::Delete))
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "purging raft log up to this id");
        let purged = self.encode(&log_id, ErrorSubject::Logs, ErrorVerb::Delete)?;
        self.writer
            .purge(log_id.index, purged)
            .await
            .map_err(self.write_error(ErrorSubject::Logs, ErrorVerb::Delete))
    }
}

#[cfg(test)]
mod tests {
    use super::owned_bounds;
    use std::ops::Bound;

    #[test]
    #[allow(clippy::reversed_empty_ranges)]
    fn bounds_normalise_and_detect_empty() {
        assert_eq!(
            owned_bounds(&(3..7)),
            Some((Bound::Included(3), Bound::Excluded(7)))
        );
        assert_eq!(
            owned_bounds(&(..=4)),
            Some((Bound::Included(0), Bound::Included(4)))
        );
        assert_eq!(
            owned_bounds(&(5..)),
            Some((Bound::Included(5), Bound::Unbounded))
        );
        assert_eq!(owned_bounds(&(5..5)), None);
        assert!(super::is_small(owned_bounds(&(5..69)).unwrap()));
        assert!(!super::is_small(owned_bounds(&(5..70)).unwrap()));
        assert!(super::is_small(owned_bounds(&(5..=68)).unwrap()));
        assert!(!super::is_small(owned_bounds(&(5..)).unwrap()));
        assert_eq!(owned_bounds(&(6..=5)), None);
        assert_eq!(
            owned_bounds(&(Bound::Excluded(u64::MAX), Bound::Unbounded)),
            None
        );
    }
}
