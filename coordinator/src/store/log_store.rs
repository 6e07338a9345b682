//! The durable Raft log: openraft's storage-v2 [`RaftLogStorage`] and [`RaftLogReader`] over one
//! redb database file, `DATA_DIR/raft.redb`, which holds the log entries (keyed by index), the
//! vote and the last purged log id, and the last committed log id in
//! `DATA_DIR/raft-committed.bin` ([`CommittedFile`]: openraft saves it on every commit, in the
//! path of every write, and one synced page there costs a fraction of a redb transaction).
//! Every write is acknowledged only once it is durable: append, vote, truncate and purge are
//! each one redb write transaction committed with [`Durability::Immediate`], that is fsynced,
//! and a committed id is a page written and fdatasynced. `append` calls openraft's
//! [`LogFlushed`] callback only after its transaction committed. Nothing is cached: every read
//! goes to the disk, so a reader handle never sees stale state. Writes and large reads block, so
//! they run on tokio's blocking pool; reads of a few entries run in place
//! ([`INLINE_READ_ENTRIES_MAX`]).

// `StorageError` is openraft's error type, which its storage traits require; its size is theirs.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogId, RaftLogReader,
    RaftTypeConfig, StorageError, StorageIOError, Vote,
};
use redb::{
    Database, Durability, ReadTransaction, ReadableTable, TableDefinition, WriteTransaction,
};

use super::codec::{decode_value, encode_value};
use super::committed_file::CommittedFile;

/// The database file name inside the data directory.
pub const DB_FILE_NAME: &str = "raft.redb";

/// The table of log entries: log index to encoded entry.
pub const LOGS_TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");

/// The table of single values: the vote and the last purged log id.
pub const META_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// [`META_TABLE`] key of the vote.
pub const KEY_VOTE: &str = "vote";
/// [`META_TABLE`] key of the last purged log id.
pub const KEY_LAST_PURGED: &str = "last_purged";

/// A redb error, boxed: redb's error type is large and is only ever passed up.
#[derive(Debug)]
struct DbError(Box<redb::Error>);

impl<E: Into<redb::Error>> From<E> for DbError {
    fn from(e: E) -> Self {
        Self(Box::new(e.into()))
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

type DbResult<T> = Result<T, DbError>;

/// The database and where it lives, shared by the store and its reader handles.
struct Inner {
    db: Database,
    path: PathBuf,
    committed: CommittedFile,
}

impl Inner {
    /// Runs `f` in a write transaction and commits it with fsync before returning.
    fn write<R>(&self, f: impl FnOnce(&WriteTransaction) -> DbResult<R>) -> DbResult<R> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate);
        match f(&txn) {
            Ok(r) => {
                txn.commit()?;
                Ok(r)
            }
            Err(e) => {
                if let Err(abort) = txn.abort() {
                    tracing::warn!(path = %self.path.display(), error = %abort, "aborting a failed raft log transaction");
                }
                Err(e)
            }
        }
    }

    /// Runs `f` in a read transaction.
    fn read<R>(&self, f: impl FnOnce(&ReadTransaction) -> DbResult<R>) -> DbResult<R> {
        let txn = self.db.begin_read()?;
        f(&txn)
    }

    fn read_meta(&self, key: &str) -> DbResult<Option<Vec<u8>>> {
        self.read(|txn| {
            let table = txn.open_table(META_TABLE)?;
            let value = table.get(key)?.map(|v| v.value().to_vec());
            Ok(value)
        })
    }

    fn write_meta(&self, key: &str, value: Option<&[u8]>) -> DbResult<()> {
        self.write(|txn| {
            let mut table = txn.open_table(META_TABLE)?;
            match value {
                Some(bytes) => {
                    table.insert(key, bytes)?;
                }
                None => {
                    table.remove(key)?;
                }
            }
            Ok(())
        })
    }
}

/// The redb-backed Raft log store; cheap to clone, and each clone is also its log reader.
///
/// Generic over the type config `C`; its entries are encoded with the store's codec
/// (bincode 2 through serde, with a size limit).
pub struct RedbLogStore<C: RaftTypeConfig> {
    inner: Arc<Inner>,
    _config: PhantomData<fn() -> C>,
}

impl<C: RaftTypeConfig> Clone for RedbLogStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            _config: PhantomData,
        }
    }
}

impl<C: RaftTypeConfig> Debug for RedbLogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbLogStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl<C: RaftTypeConfig> RedbLogStore<C> {
    /// Opens the log at `data_dir/raft.redb`, creating the directory and the database if
    /// missing. Blocks on file I/O, so call it at startup (or from a blocking task).
    ///
    /// Fails if the file cannot be created or opened, is not a redb database, or is already open
    /// (in this process or another: redb locks the file).
    pub fn open(data_dir: &Path) -> Result<Self, StorageError<C::NodeId>> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            let source = AnyError::new(&e)
                .add_context(|| format!("creating raft data directory {}", data_dir.display()));
            StorageIOError::new(ErrorSubject::Store, ErrorVerb::Write, source)
        })?;
        let path = data_dir.join(DB_FILE_NAME);
        let db = Database::create(&path).map_err(|e| {
            let source = AnyError::new(&e)
                .add_context(|| format!("opening raft log database {}", path.display()));
            StorageIOError::new(ErrorSubject::Store, ErrorVerb::Read, source)
        })?;
        let committed = CommittedFile::open(data_dir).map_err(|e| {
            StorageIOError::new(ErrorSubject::Store, ErrorVerb::Read, AnyError::new(&e))
        })?;
        let inner = Inner {
            db,
            path,
            committed,
        };
        // Create both tables up front so that read transactions always find them.
        inner
            .write(|txn| {
                txn.open_table(LOGS_TABLE)?;
                txn.open_table(META_TABLE)?;
                Ok(())
            })
            .map_err(|e| store_error(&inner.path, ErrorSubject::Store, ErrorVerb::Write, e))?;
        tracing::debug!(path = %inner.path.display(), "opened raft log store");
        Ok(Self {
            inner: Arc::new(inner),
            _config: PhantomData,
        })
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs a database operation on tokio's blocking pool, mapping its error to a
    /// [`StorageError`] about `subject` that names the database file.
    async fn blocking<R, E, F>(
        &self,
        subject: ErrorSubject<C::NodeId>,
        verb: ErrorVerb,
        f: F,
    ) -> Result<R, StorageError<C::NodeId>>
    where
        F: FnOnce(&Inner) -> Result<R, E> + Send + 'static,
        E: std::error::Error + Send + 'static,
        R: Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let joined = tokio::task::spawn_blocking(move || f(&inner)).await;
        match joined {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(store_error(&self.inner.path, subject, verb, e)),
            Err(join) => Err(store_error(&self.inner.path, subject, verb, join)),
        }
    }

    async fn read_meta_value<T>(
        &self,
        key: &'static str,
        subject: ErrorSubject<C::NodeId>,
    ) -> Result<Option<T>, StorageError<C::NodeId>>
    where
        T: serde::de::DeserializeOwned,
    {
        let bytes = self
            .blocking(subject.clone(), ErrorVerb::Read, move |inner| {
                inner.read_meta(key)
            })
            .await?;
        match bytes {
            None => Ok(None),
            Some(bytes) => decode_value(&bytes)
                .map(Some)
                .map_err(|e| store_error(&self.inner.path, subject, ErrorVerb::Read, e)),
        }
    }

    async fn write_meta_value<T>(
        &self,
        key: &'static str,
        value: Option<&T>,
        subject: ErrorSubject<C::NodeId>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        T: serde::Serialize,
    {
        let bytes = match value {
            None => None,
            Some(v) => Some(encode_value(v).map_err(|e| {
                store_error(&self.inner.path, subject.clone(), ErrorVerb::Write, e)
            })?),
        };
        self.blocking(subject, ErrorVerb::Write, move |inner| {
            inner.write_meta(key, bytes.as_deref())
        })
        .await
    }

    fn decode_entry(&self, index: u64, bytes: &[u8]) -> Result<C::Entry, StorageError<C::NodeId>> {
        decode_value(bytes).map_err(|e| {
            store_error(
                &self.inner.path,
                ErrorSubject::LogIndex(index),
                ErrorVerb::Read,
                e,
            )
        })
    }
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
/// blocking pool. Replication and apply read the few entries just appended, which redb's
/// cache holds: reading them in place costs microseconds, the hop to another thread and back
/// more. Larger reads (a follower catching up) still go to the blocking pool.
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

impl<C: RaftTypeConfig> RaftLogReader<C> for RedbLogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        let Some(bounds) = owned_bounds(&range) else {
            return Ok(Vec::new());
        };
        let read = move |inner: &Inner| {
            inner.read(|txn| {
                let table = txn.open_table(LOGS_TABLE)?;
                let mut out = Vec::new();
                for item in table.range::<u64>(bounds)? {
                    let (k, v) = item?;
                    out.push((k.value(), v.value().to_vec()));
                }
                Ok(out)
            })
        };
        let raw = if is_small(bounds) {
            read(&self.inner).map_err(|e| {
                store_error(&self.inner.path, ErrorSubject::Logs, ErrorVerb::Read, e)
            })?
        } else {
            self.blocking(ErrorSubject::Logs, ErrorVerb::Read, read)
                .await?
        };
        raw.iter()
            .map(|(index, bytes)| self.decode_entry(*index, bytes))
            .collect()
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for RedbLogStore<C> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let (last, purged) = self
            .blocking(ErrorSubject::Logs, ErrorVerb::Read, |inner| {
                inner.read(|txn| {
                    let logs = txn.open_table(LOGS_TABLE)?;
                    let last = logs.last()?.map(|(k, v)| (k.value(), v.value().to_vec()));
                    let meta = txn.open_table(META_TABLE)?;
                    let purged = meta.get(KEY_LAST_PURGED)?.map(|v| v.value().to_vec());
                    Ok((last, purged))
                })
            })
            .await?;
        let last_purged_log_id: Option<LogId<C::NodeId>> = match purged {
            None => None,
            Some(bytes) => Some(decode_value(&bytes).map_err(|e| {
                store_error(&self.inner.path, ErrorSubject::Logs, ErrorVerb::Read, e)
            })?),
        };
        let last_log_id = match last {
            Some((index, bytes)) => Some(self.decode_entry(index, &bytes)?.get_log_id().clone()),
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
        self.write_meta_value(KEY_VOTE, Some(vote), ErrorSubject::Vote)
            .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        self.read_meta_value(KEY_VOTE, ErrorSubject::Vote).await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        let bytes = encode_value(&committed)
            .map_err(|e| store_error(&self.inner.path, ErrorSubject::Store, ErrorVerb::Write, e))?;
        self.blocking(ErrorSubject::Store, ErrorVerb::Write, move |inner| {
            inner.committed.save(&bytes)
        })
        .await
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        let bytes = self
            .blocking(ErrorSubject::Store, ErrorVerb::Read, |inner| {
                inner.committed.read()
            })
            .await?;
        match bytes {
            None => Ok(None),
            Some(bytes) => decode_value(&bytes).map_err(|e| {
                let path = self.inner.committed.path();
                store_error(path, ErrorSubject::Store, ErrorVerb::Read, e)
            }),
        }
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
        let mut encoded = Vec::new();
        for entry in entries {
            let log_id = entry.get_log_id().clone();
            let bytes = encode_value(&entry).map_err(|e| {
                store_error(
                    &self.inner.path,
                    ErrorSubject::Log(log_id.clone()),
                    ErrorVerb::Write,
                    e,
                )
            })?;
            encoded.push((log_id.index, bytes));
        }
        if !encoded.is_empty() {
            self.blocking(ErrorSubject::Logs, ErrorVerb::Write, move |inner| {
                inner.write(|txn| {
                    let mut table = txn.open_table(LOGS_TABLE)?;
                    for (index, bytes) in &encoded {
                        table.insert(*index, bytes.as_slice())?;
                    }
                    Ok(())
                })
            })
            .await?;
        }
        // The transaction is committed and fsynced: only now tell openraft.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "truncating raft log from this id on");
        let since = log_id.index;
        self.blocking(ErrorSubject::Logs, ErrorVerb::Delete, move |inner| {
            inner.write(|txn| {
                let mut table = txn.open_table(LOGS_TABLE)?;
                table.retain_in::<u64, _>(since.., |_, _| false)?;
                Ok(())
            })
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "purging raft log up to this id");
        let upto = log_id.index;
        let purged = encode_value(&log_id)
            .map_err(|e| store_error(&self.inner.path, ErrorSubject::Logs, ErrorVerb::Delete, e))?;
        self.blocking(ErrorSubject::Logs, ErrorVerb::Delete, move |inner| {
            inner.write(|txn| {
                let mut meta = txn.open_table(META_TABLE)?;
                meta.insert(KEY_LAST_PURGED, purged.as_slice())?;
                let mut logs = txn.open_table(LOGS_TABLE)?;
                logs.retain_in::<u64, _>(..=upto, |_, _| false)?;
                Ok(())
            })
        })
        .await
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
