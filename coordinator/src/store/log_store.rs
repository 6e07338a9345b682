//! The durable Raft log: openraft's storage-v2 [`RaftLogStorage`] and [`RaftLogReader`] over one
//! redb database file, `DATA_DIR/raft.redb`. It holds the log entries (keyed by index), the vote,
//! the last committed log id and the last purged log id.
//!
//! Writes go through one writer thread that commits them in groups: it takes every write
//! waiting in its queue (up to [`GROUP_COMMIT_OPS_MAX`]), applies them in order in one redb
//! write transaction committed with [`Durability::Immediate`] (fsynced), and only then
//! acknowledges each of them. `append` returns as soon as its entries are queued and readable
//! (openraft's storage-v2 contract) and calls openraft's [`LogFlushed`] callback once they are
//! durable; vote, committed, truncate and purge wait for their commit before returning. This
//! is what lets many client writes share one fsync: openraft 0.9 hands the store one
//! `append` per client write, and a store that fsynced inside `append` would cap the cluster
//! at one write per fsync.
//!
//! Entries that are queued but not yet committed are kept in memory ("pending") and readers
//! see them over the database's contents, so a reader handle never sees stale state. redb
//! reads block, so they run on tokio's blocking pool.

// `StorageError` is openraft's error type, which its storage traits require; its size is theirs.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogId, RaftLogReader,
    RaftTypeConfig, StorageError, StorageIOError, Vote,
};
use redb::{
    Database, Durability, ReadTransaction, ReadableTable, TableDefinition, WriteTransaction,
};

use super::codec::{decode_value, encode_value};

/// The database file name inside the data directory.
pub const DB_FILE_NAME: &str = "raft.redb";

/// The most queued writes one group commit takes: bounds one transaction's size.
pub const GROUP_COMMIT_OPS_MAX: usize = 4_096;

/// Capacity of the queue of writes waiting for the writer thread; `append` waits for room.
pub const WRITE_QUEUE_MAX: usize = 16_384;

/// The table of log entries: log index to encoded entry.
pub const LOGS_TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");

/// The table of single values: the vote, the committed log id, the last purged log id.
pub const META_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// [`META_TABLE`] key of the vote.
pub const KEY_VOTE: &str = "vote";
/// [`META_TABLE`] key of the last committed log id.
pub const KEY_COMMITTED: &str = "committed";
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

/// Entries queued for the writer but not yet committed: index to (append generation, bytes).
type PendingEntries = BTreeMap<u64, (u64, Arc<[u8]>)>;

/// The database and where it lives, shared by the store, its reader handles and the writer.
struct Inner {
    db: Database,
    path: PathBuf,
    /// Entries appended but not yet durable; readers see them over the database.
    pending: Mutex<PendingEntries>,
    /// Numbers appends, so that committing one never drops a later append's pending entry
    /// at the same index (after a truncation).
    generation: AtomicU64,
}

/// What the writer thread calls once a write committed (or failed).
type Completion = Box<dyn FnOnce(Result<(), String>) + Send>;

/// One write for the writer thread.
enum WriteOp {
    Append {
        entries: Vec<(u64, Arc<[u8]>)>,
        generation: u64,
    },
    Meta {
        key: &'static str,
        value: Option<Vec<u8>>,
    },
    Truncate {
        since: u64,
    },
    Purge {
        upto: u64,
        purged: Vec<u8>,
    },
}

struct WriteJob {
    op: WriteOp,
    done: Completion,
}

/// The writer thread and the sending end of its queue; dropping it (with the last store
/// clone) closes the queue and waits for the thread to finish what was queued, so the
/// database file is closed when the store is gone.
struct Writer {
    sender: Option<tokio::sync::mpsc::Sender<WriteJob>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the raft log writer thread panicked");
            }
        }
    }
}

/// The writer thread failed or stopped.
#[derive(Debug, thiserror::Error)]
#[error("raft log writer: {0}")]
struct WriterError(String);

/// The writer thread: group-commits everything queued, in order, then acknowledges it.
fn run_writer(inner: Arc<Inner>, mut queue: tokio::sync::mpsc::Receiver<WriteJob>) {
    while let Some(first) = queue.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < GROUP_COMMIT_OPS_MAX {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let result = inner.write(|txn| {
            let mut logs = txn.open_table(LOGS_TABLE)?;
            let mut meta = txn.open_table(META_TABLE)?;
            for job in &batch {
                match &job.op {
                    WriteOp::Append { entries, .. } => {
                        for (index, bytes) in entries {
                            logs.insert(*index, &bytes[..])?;
                        }
                    }
                    WriteOp::Meta { key, value } => match value {
                        Some(bytes) => {
                            meta.insert(*key, bytes.as_slice())?;
                        }
                        None => {
                            meta.remove(*key)?;
                        }
                    },
                    WriteOp::Truncate { since } => {
                        logs.retain_in::<u64, _>(*since.., |_, _| false)?;
                    }
                    WriteOp::Purge { upto, purged } => {
                        meta.insert(KEY_LAST_PURGED, purged.as_slice())?;
                        logs.retain_in::<u64, _>(..=*upto, |_, _| false)?;
                    }
                }
            }
            Ok(())
        });
        let outcome = result.map_err(|error| error.to_string());
        tracing::trace!(
            ops = batch.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "raft log group commit"
        );
        if outcome.is_ok() {
            let mut pending = inner.lock_pending();
            for job in &batch {
                if let WriteOp::Append {
                    entries,
                    generation,
                } = &job.op
                {
                    for (index, _) in entries {
                        if pending.get(index).is_some_and(|(g, _)| g == generation) {
                            pending.remove(index);
                        }
                    }
                }
            }
        } else {
            tracing::error!(path = %inner.path.display(), error = ?outcome, "raft log group commit failed");
        }
        for job in batch {
            (job.done)(outcome.clone());
        }
    }
}

impl Inner {
    fn lock_pending(&self) -> MutexGuard<'_, PendingEntries> {
        // The map is only ever changed by whole inserts and removals; a panic cannot leave it
        // half-updated.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

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
}

/// The redb-backed Raft log store; cheap to clone, and each clone is also its log reader.
///
/// Generic over the type config `C`; its entries are encoded with the store's codec
/// (bincode 2 through serde, with a size limit).
pub struct RedbLogStore<C: RaftTypeConfig> {
    // Field order matters on drop: this handle's `inner` goes first, then (with the last
    // clone) the writer, which joins its thread, which holds the last `inner`.
    inner: Arc<Inner>,
    writer: Arc<Writer>,
    _config: PhantomData<fn() -> C>,
}

impl<C: RaftTypeConfig> Clone for RedbLogStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            writer: Arc::clone(&self.writer),
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
        let inner = Inner {
            db,
            path,
            pending: Mutex::new(BTreeMap::new()),
            generation: AtomicU64::new(0),
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
        let inner = Arc::new(inner);
        let (sender, queue) = tokio::sync::mpsc::channel(WRITE_QUEUE_MAX);
        let writer_inner = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".to_string())
            .spawn(move || run_writer(writer_inner, queue))
            .map_err(|e| {
                let source = AnyError::new(&e).add_context(|| "starting the raft log writer");
                StorageIOError::new(ErrorSubject::Store, ErrorVerb::Write, source)
            })?;
        Ok(Self {
            inner,
            writer: Arc::new(Writer {
                sender: Some(sender),
                thread: Some(thread),
            }),
            _config: PhantomData,
        })
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs a database operation on tokio's blocking pool, mapping its error to a
    /// [`StorageError`] about `subject` that names the database file.
    async fn blocking<R, F>(
        &self,
        subject: ErrorSubject<C::NodeId>,
        verb: ErrorVerb,
        f: F,
    ) -> Result<R, StorageError<C::NodeId>>
    where
        F: FnOnce(&Inner) -> DbResult<R> + Send + 'static,
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
        self.write_and_wait(WriteOp::Meta { key, value: bytes }, subject)
            .await
    }

    /// Queues `op` for the writer; `done` runs once it committed or failed.
    async fn queue(&self, op: WriteOp, done: Completion) -> Result<(), WriterError> {
        let sender = self
            .writer
            .sender
            .as_ref()
            .ok_or_else(|| WriterError("the writer is closed".to_string()))?;
        sender
            .send(WriteJob { op, done })
            .await
            .map_err(|_| WriterError("the writer thread stopped".to_string()))
    }

    /// Queues `op` and waits until it is committed (fsynced).
    async fn write_and_wait(
        &self,
        op: WriteOp,
        subject: ErrorSubject<C::NodeId>,
    ) -> Result<(), StorageError<C::NodeId>> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let done: Completion = Box::new(move |result| {
            let _ = sender.send(result);
        });
        let fail = |error: WriterError| {
            store_error(&self.inner.path, subject.clone(), ErrorVerb::Write, error)
        };
        self.queue(op, done).await.map_err(fail)?;
        match receiver.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(text)) => Err(fail(WriterError(text))),
            Err(_) => Err(fail(WriterError(
                "the writer dropped the write unanswered".to_string(),
            ))),
        }
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
        // Pending first, then the database: an entry committed in between is then seen
        // twice (and merged), never missed.
        let pending: Vec<(u64, Arc<[u8]>)> = self
            .inner
            .lock_pending()
            .range(bounds)
            .map(|(index, (_, bytes))| (*index, Arc::clone(bytes)))
            .collect();
        let raw = self
            .blocking(ErrorSubject::Logs, ErrorVerb::Read, move |inner| {
                inner.read(|txn| {
                    let table = txn.open_table(LOGS_TABLE)?;
                    let mut out = Vec::new();
                    for item in table.range::<u64>(bounds)? {
                        let (k, v) = item?;
                        out.push((k.value(), v.value().to_vec()));
                    }
                    Ok(out)
                })
            })
            .await?;
        let mut merged: BTreeMap<u64, Arc<[u8]>> = raw
            .into_iter()
            .map(|(index, bytes)| (index, Arc::from(bytes)))
            .collect();
        merged.extend(pending);
        merged
            .iter()
            .map(|(index, bytes)| self.decode_entry(*index, bytes))
            .collect()
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for RedbLogStore<C> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        // Pending entries are always after the committed ones (a truncation is committed
        // before it returns), so the last pending entry, if any, is the last entry.
        let last_pending = self
            .inner
            .lock_pending()
            .last_key_value()
            .map(|(index, (_, bytes))| (*index, bytes.to_vec()));
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
        let last_log_id = match last_pending.or(last) {
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
        self.write_meta_value(KEY_COMMITTED, committed.as_ref(), ErrorSubject::Store)
            .await
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        self.read_meta_value(KEY_COMMITTED, ErrorSubject::Store)
            .await
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
            encoded.push((log_id.index, Arc::<[u8]>::from(bytes)));
        }
        if encoded.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = self.inner.lock_pending();
            for (index, bytes) in &encoded {
                pending.insert(*index, (generation, Arc::clone(bytes)));
            }
        }
        // openraft hears of durability only once the group commit holding these entries
        // is fsynced.
        let done: Completion = Box::new(move |result| {
            callback.log_io_completed(result.map_err(std::io::Error::other));
        });
        self.queue(
            WriteOp::Append {
                entries: encoded,
                generation,
            },
            done,
        )
        .await
        .map_err(|e| store_error(&self.inner.path, ErrorSubject::Logs, ErrorVerb::Write, e))
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "truncating raft log from this id on");
        let since = log_id.index;
        // Readers stop seeing the truncated entries now; the database follows in order,
        // after any append still queued.
        drop(self.inner.lock_pending().split_off(&since));
        self.write_and_wait(WriteOp::Truncate { since }, ErrorSubject::Logs)
            .await
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "purging raft log up to this id");
        let upto = log_id.index;
        let purged = encode_value(&log_id)
            .map_err(|e| store_error(&self.inner.path, ErrorSubject::Logs, ErrorVerb::Delete, e))?;
        self.inner.lock_pending().retain(|index, _| *index > upto);
        self.write_and_wait(WriteOp::Purge { upto, purged }, ErrorSubject::Logs)
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
        assert_eq!(owned_bounds(&(6..=5)), None);
        assert_eq!(
            owned_bounds(&(Bound::Excluded(u64::MAX), Bound::Unbounded)),
            None
        );
    }
}
