//! The log store's writer: one thread that makes the Raft log's writes durable, in the order
//! they were made, as many at a time as have queued up (group commit).
//!
//! # Why appends are acknowledged before they are durable
//!
//! openraft 0.9's core waits for the leader's own log flush before it replicates an entry
//! (its `append_to_log` is "a temp wrapper to make non-blocking append_to_log a blocking"), so
//! with a store that calls the flush callback only after its fsync, every write pays the
//! leader's fsync and then a follower's, one after the other. Raft does not need that order:
//! the leader may send an entry while it writes it, as long as nothing that depends on the
//! entry being committed happens before a majority has it on disk. So [`LogWriter::append`]
//! puts the entries in an in-memory tail (which every reader sees at once) and in the queue of
//! this thread, and the store calls openraft's callback right away; openraft replicates and
//! counts the leader's own copy at once. Everything a commit can be seen through waits for
//! the disk instead, through [`LogDurability`]:
//!
//! 1. **The committed id** (`save_committed`) returns only once this node's own copy of every
//!    entry up to it is durable, and openraft applies an entry, answers its client, serves a
//!    read that needs it or builds a snapshot with it only after that returns. The committed
//!    id itself is written lazily, with the next write (or at close): Raft does not need it
//!    durable (a restarted member learns the commit index from the leader, and one read back
//!    older than it was only re-applies less at start), so a write's acknowledgement waits for
//!    one sync on the leader and one on a follower, at the same time, not for a second one.
//! 2. **A follower's answer** to an AppendEntries is sent only once the entries it reports are
//!    durable in the same *generation* of the log (`raft_service`): the leader counts a
//!    follower only for entries on its disk, as before.
//! 3. **The commit index sent to followers** never runs ahead of the newest committed id whose
//!    entries are durable on the leader ([`Durable::committed`], set by `save_committed`;
//!    `network`), so no follower applies an entry whose leader could still lose it.
//!
//! Together: an entry is seen as committed (applied anywhere, answered to a client) only once
//! it is on the disks of a majority that includes the leader, which is Raft's condition. A
//! leader that crashes before its own write lands loses only entries nobody saw committed.
//! A write that fails poisons the writer: every later write and wait fails, openraft stops
//! the node, and nothing unsynced is ever reported durable.
//!
//! Entries a node holds but has not synced still count as its log in elections, which only
//! makes it harder for others to win its vote; a node that crashes before the sync restarts
//! as if they had never arrived, and nobody saw them committed. Its vote itself is synced
//! before it is given.
//!
//! A leader that crashes before its own write lands may have sent those entries: a follower
//! holds them, and the leader's log, when it comes back, does not. So it must never lead
//! that term again (openraft 0.9 would restore it as the leader of its committed vote's
//! term, and its next entries would reuse the lost entries' log ids with other contents):
//! the coordinator uncommits its vote before Raft starts ([`super::resume_as_follower`]).
//!
//! A *generation* counts the log's truncations: an index is durable "in generation g" when it
//! reached the disk with no truncation queued since g, so an answer for entries that a later
//! truncation replaced is never sent.
//!
//! # When the writer syncs
//!
//! At once, whenever anything but a committed id is queued: a leader's entries go to its disk
//! while they travel to the followers. Whatever queued while a write was under way goes into
//! the next one together (group commit). A committed id alone does not wake the writer; it
//! rides with the next write.

// redb's error is large, but it only ever travels up once, to become a message.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use openraft::{LogId, NodeId};
use redb::{Database, Durability};
use tokio::sync::{oneshot, watch};

use quotient_common::version::RAFT_LOG;

use super::codec::encode_value;
use super::wal::{Record, Wal};

/// The table of single values: the vote and the last purged log id.
pub const META_TABLE: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("raft_meta");
/// [`META_TABLE`] key of the vote.
pub const KEY_VOTE: &str = "vote";
/// [`META_TABLE`] key of the last purged log id.
pub const KEY_LAST_PURGED: &str = "last_purged";
/// [`META_TABLE`] key of the committed mark: an index (a `u64`, encoded as every stored value
/// is, `codec::encode_value`) up to which this
/// member's log held committed entries, written at most once per [`COMMITTED_MARK_INTERVAL`].
/// A log that opens ending before it lost records the segment files alone cannot show (whole
/// records cut at a 4 KiB boundary, a segment file removed): [`check_committed_mark`].
pub const KEY_COMMITTED_MARK: &str = "committed_mark";
/// How often at most the committed mark is written: one synced redb transaction this often
/// costs nothing next to the log's own syncs, and a loss of what was committed before it is
/// caught.
pub const COMMITTED_MARK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The [`META_TABLE`] key of the version of the Raft log encoding the value under `key` is in
/// (u16, little-endian), written in the same transaction. A value written before versions
/// were recorded has none: it is `codec::VERSION_OF_UNRECORDED`.
pub fn version_key(key: &str) -> &'static str {
    match key {
        KEY_VOTE => "vote_version",
        KEY_LAST_PURGED => "last_purged_version",
        KEY_COMMITTED_MARK => "committed_mark_version",
        other => unreachable!("the meta key {other} has no version key"),
    }
}

/// Most queued writes the thread takes into one log write; bounds a write's size.
pub const WRITE_BATCH_OPS_MAX: usize = 4_096;

/// An encoded log entry, shared by the tail and the queue.
pub type EncodedEntry = Arc<[u8]>;

/// What is on disk now, as the writer last published it.
#[derive(Debug, Clone)]
pub struct Durable<NID: NodeId> {
    /// The generation of the last write that reached the disk.
    pub generation: u64,
    /// The last log index on disk; `None` when the log on disk is empty.
    pub last_index: Option<u64>,
    /// The newest committed log id whose entries are durable here (what `save_committed` last
    /// returned for; at start, the one read back). The record itself reaches the disk lazily.
    pub committed: Option<LogId<NID>>,
    /// Why the writer stopped writing, once a write failed; nothing is durable after it.
    pub failed: Option<Arc<str>>,
}

/// Why a wait for durability ended without it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotDurable {
    /// A truncation replaced entries after the waiter's generation: what it waited for is gone.
    #[error("the log was truncated while waiting for its entries to be durable")]
    Superseded,
    /// A write failed or the store closed.
    #[error("the raft log store stopped writing: {0}")]
    Stopped(Arc<str>),
}

/// A queued write.
enum Op {
    Append {
        generation: u64,
        entries: Vec<(u64, EncodedEntry)>,
    },
    Vote {
        bytes: Vec<u8>,
        done: Done,
    },
    Truncate {
        generation: u64,
        since: u64,
        done: Done,
    },
    Purge {
        upto: u64,
        purged: Vec<u8>,
        done: Done,
    },
    /// Written with the next write; nobody waits for it. `index` is the committed id's.
    Committed {
        index: Option<u64>,
        bytes: Vec<u8>,
    },
    /// Completes once everything queued before it is durable.
    Barrier {
        done: Done,
    },
}

type Done = oneshot::Sender<Result<(), Arc<str>>>;

/// The queue and the in-memory view of the log, behind one lock so that they change together.
struct Queue {
    ops: VecDeque<Op>,
    /// Appended entries that are not yet durable, by index: readers see them before the disk.
    tail: BTreeMap<u64, EncodedEntry>,
    /// The log's last index as openraft sees it (after queued appends and truncations).
    last_index: Option<u64>,
    stopping: bool,
    failed: Option<Arc<str>>,
    /// Queued writes other than committed ids: the writer works while there are any.
    urgent: usize,
}

/// What the store's handles and the writer thread share.
struct Shared<NID: NodeId> {
    db: Database,
    path: PathBuf,
    wal: Wal,
    pending: Arc<Pending>,
    generation: Arc<AtomicU64>,
    durable: watch::Sender<Durable<NID>>,
}

/// The queue and the writer's wake-up.
struct Pending {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every change under the lock is completed before it is released; keep going.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<NID: NodeId> Shared<NID> {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.pending.lock()
    }
}

/// The writer thread and the queue it serves; dropping it drains the queue and joins the
/// thread, so the database is closed once the last store handle is gone.
pub struct LogWriter<NID: NodeId> {
    shared: Arc<Shared<NID>>,
    thread: Option<JoinHandle<()>>,
}

impl<NID: NodeId> std::fmt::Debug for LogWriter<NID> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

/// Watches what is durable; cheap to clone, and holds nothing of the store open.
#[derive(Clone)]
pub struct LogDurability<NID: NodeId> {
    generation: Arc<AtomicU64>,
    durable: watch::Receiver<Durable<NID>>,
}

impl<NID: NodeId> std::fmt::Debug for LogDurability<NID> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogDurability")
            .field("durable", &*self.durable.borrow())
            .finish_non_exhaustive()
    }
}

impl<NID: NodeId> LogDurability<NID> {
    /// The log's current generation: take it before a call whose entries you then wait for.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// What is durable now.
    pub fn durable(&self) -> Durable<NID> {
        self.durable.borrow().clone()
    }

    /// Completes with the reason once a write has failed (the writer is poisoned); never
    /// while writes succeed. Raft itself stops only at its next call into the store, which
    /// an idle cluster or one without a quorum may not make for a long while.
    pub async fn failed(&self) -> Arc<str> {
        let mut receiver = self.durable.clone();
        let mut reason = None;
        let waited = receiver
            .wait_for(|durable| {
                reason = durable.failed.clone();
                reason.is_some()
            })
            .await
            .is_ok();
        match reason.filter(|_| waited) {
            Some(reason) => reason,
            // The writer is gone (the store closed): nothing will ever fail; wait forever.
            None => std::future::pending().await,
        }
    }

    /// The commit index a leader may tell its followers: `commit`, or the newest committed id
    /// whose entries are durable here when that is older, so that no follower applies an
    /// entry before the leader's own copy of it is durable.
    pub fn commit_to_send(&self, commit: Option<LogId<NID>>) -> Option<LogId<NID>> {
        std::cmp::min(commit, self.durable.borrow().committed.clone())
    }

    /// Waits until every entry up to `index` is durable with no truncation since
    /// `generation`.
    pub async fn wait_log(&self, generation: u64, index: u64) -> Result<(), NotDurable> {
        let reached = |durable: &Durable<NID>| {
            durable.generation == generation && durable.last_index >= Some(index)
        };
        let mut receiver = self.durable.clone();
        let mut outcome = Ok(());
        let waited = receiver
            .wait_for(|durable| {
                if let Some(reason) = &durable.failed {
                    outcome = Err(NotDurable::Stopped(reason.clone()));
                    return true;
                }
                if durable.generation > generation {
                    outcome = Err(NotDurable::Superseded);
                    return true;
                }
                reached(durable)
            })
            .await;
        if waited.is_err() {
            return Err(NotDurable::Stopped("the raft log store is closed".into()));
        }
        outcome
    }
}

impl<NID: NodeId> LogWriter<NID> {
    /// Starts the writer over the open database (vote, purged id) and log. `committed` is
    /// what the log holds now, `purged` the index of the last purged entry.
    pub fn start(
        db: Database,
        path: PathBuf,
        wal: Wal,
        committed: Option<LogId<NID>>,
        purged: Option<u64>,
    ) -> std::io::Result<LogWriter<NID>> {
        // The log's last index counts the purged ones: a log purged whole still ends there.
        let last_index = wal.bounds().map(|(_, last)| last).max(purged);
        let (durable, _) = watch::channel(Durable {
            generation: 0,
            last_index,
            committed,
            failed: None,
        });
        let shared = Arc::new(Shared {
            db,
            path,
            wal,
            pending: Arc::new(Pending {
                queue: Mutex::new(Queue {
                    ops: VecDeque::new(),
                    tail: BTreeMap::new(),
                    last_index,
                    stopping: false,
                    failed: None,
                    urgent: 0,
                }),
                wake: Condvar::new(),
            }),
            generation: Arc::new(AtomicU64::new(0)),
            durable,
        });
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".to_string())
            .spawn({
                let shared = shared.clone();
                move || run(&shared, last_index)
            })?;
        Ok(LogWriter {
            shared,
            thread: Some(thread),
        })
    }

    /// The database, for reads.
    pub fn db(&self) -> &Database {
        &self.shared.db
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The log of entries, for reads.
    pub fn wal(&self) -> &Wal {
        &self.shared.wal
    }

    /// A watch on what is durable.
    pub fn durability(&self) -> LogDurability<NID> {
        LogDurability {
            generation: self.shared.generation.clone(),
            durable: self.shared.durable.subscribe(),
        }
    }

    /// Queues `entries` (index and encoded entry, in order); readers see them at once.
    pub fn append(&self, entries: Vec<(u64, EncodedEntry)>) -> Result<(), Arc<str>> {
        let Some((last, _)) = entries.last() else {
            return Ok(());
        };
        let last = *last;
        let mut queue = self.shared.lock();
        if let Some(reason) = &queue.failed {
            return Err(reason.clone());
        }
        for (index, bytes) in &entries {
            queue.tail.insert(*index, bytes.clone());
        }
        queue.last_index = Some(last);
        let generation = self.shared.generation.load(Ordering::SeqCst);
        // A writer with something urgent queued already is busy or about to be: only an idle
        // one needs waking.
        let idle = queue.urgent == 0;
        queue.urgent += 1;
        queue.ops.push_back(Op::Append {
            generation,
            entries,
        });
        drop(queue);
        if idle {
            self.shared.pending.wake.notify_one();
        }
        Ok(())
    }

    /// Queues a write and waits until it is durable.
    async fn queue_and_wait(
        &self,
        make: impl FnOnce(&mut Queue, &AtomicU64, Done) -> Op,
    ) -> Result<(), Arc<str>> {
        let (done, finished) = oneshot::channel();
        {
            let mut queue = self.shared.lock();
            if let Some(reason) = &queue.failed {
                return Err(reason.clone());
            }
            let op = make(&mut queue, &self.shared.generation, done);
            queue.urgent += 1;
            queue.ops.push_back(op);
        }
        self.shared.pending.wake.notify_one();
        finished
            .await
            .unwrap_or_else(|_| Err("the raft log writer stopped".into()))
    }

    /// Saves the vote; returns once it is durable (after every write queued before it).
    pub async fn save_vote(&self, bytes: Vec<u8>) -> Result<(), Arc<str>> {
        self.queue_and_wait(|_, _, done| Op::Vote { bytes, done })
            .await
    }

    /// Removes the entries from `since` on; returns once that is durable.
    pub async fn truncate(&self, since: u64) -> Result<(), Arc<str>> {
        self.queue_and_wait(|queue, generation, done| {
            let generation = generation.fetch_add(1, Ordering::SeqCst) + 1;
            queue.tail.retain(|index, _| *index < since);
            if queue.last_index >= Some(since) {
                queue.last_index = since.checked_sub(1);
            }
            Op::Truncate {
                generation,
                since,
                done,
            }
        })
        .await
    }

    /// Removes the entries up to `upto` and records `purged` (the encoded last purged id);
    /// returns once that is durable.
    pub async fn purge(&self, upto: u64, purged: Vec<u8>) -> Result<(), Arc<str>> {
        self.queue_and_wait(|queue, _, done| {
            queue.tail.retain(|index, _| *index > upto);
            queue.last_index = queue.last_index.max(Some(upto));
            Op::Purge { upto, purged, done }
        })
        .await
    }

    /// Saves the committed id (`bytes` is its encoding): queues it to be written with the next
    /// write, and returns once every entry up to it is durable here (see the module docs).
    pub async fn save_committed(
        &self,
        log_id: Option<LogId<NID>>,
        bytes: Vec<u8>,
    ) -> Result<(), Arc<str>> {
        let (generation, wait_for) = {
            let mut queue = self.shared.lock();
            if let Some(reason) = &queue.failed {
                return Err(reason.clone());
            }
            queue.ops.push_back(Op::Committed {
                index: log_id.as_ref().map(|id| id.index),
                bytes,
            });
            // Taken under the lock: the entries up to the committed id were appended in this
            // generation or before (committed entries are never truncated). Entries this log
            // does not hold cannot be waited for (openraft never commits past its log).
            let wait_for = log_id
                .as_ref()
                .and_then(|id| queue.last_index.map(|last| id.index.min(last)));
            (self.shared.generation.load(Ordering::SeqCst), wait_for)
        };
        if let Some(index) = wait_for {
            let mut receiver = self.shared.durable.subscribe();
            let mut outcome = Ok(());
            let waited = receiver
                .wait_for(|durable| {
                    if let Some(reason) = &durable.failed {
                        outcome = Err(reason.clone());
                        return true;
                    }
                    durable.generation >= generation && durable.last_index >= Some(index)
                })
                .await;
            if waited.is_err() {
                return Err("the raft log store is closed".into());
            }
            outcome?;
        }
        // openraft saves committed ids one at a time, in order.
        self.shared
            .durable
            .send_modify(|durable| durable.committed = log_id);
        Ok(())
    }

    /// Returns once everything queued so far is durable.
    pub async fn barrier(&self) -> Result<(), Arc<str>> {
        self.queue_and_wait(|_, _, done| Op::Barrier { done }).await
    }

    /// The queued, not yet durable entries within `start..=end` and the log's last index;
    /// the disk holds everything before the first of them, up to that last index.
    pub fn tail(&self, start: u64, end: Option<u64>) -> (Vec<(u64, EncodedEntry)>, Option<u64>) {
        let queue = self.shared.lock();
        let entries = match end {
            Some(end) if end < start => Vec::new(),
            Some(end) => queue
                .tail
                .range(start..=end)
                .map(|(i, b)| (*i, b.clone()))
                .collect(),
            None => queue
                .tail
                .range(start..)
                .map(|(i, b)| (*i, b.clone()))
                .collect(),
        };
        (entries, queue.last_index)
    }
}

impl<NID: NodeId> Drop for LogWriter<NID> {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.pending.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(path = %self.shared.path.display(), "the raft log writer panicked");
            }
        }
    }
}

/// The writer thread: takes every queued write, makes them durable together, publishes what
/// is durable, then answers them. Ends once stopping with nothing queued.
fn run<NID: NodeId>(shared: &Shared<NID>, mut last_index: Option<u64>) {
    let mut generation = 0;
    let mut mark = CommittedMark::default();
    loop {
        let batch: Vec<Op> = {
            let wake = &shared.pending.wake;
            let mut queue = shared.lock();
            // Committed ids alone wait for the next write; at close they are written too.
            while queue.urgent == 0 && !queue.stopping {
                queue = wake.wait(queue).unwrap_or_else(PoisonError::into_inner);
            }
            if queue.ops.is_empty() {
                return;
            }
            let take = queue.ops.len().min(WRITE_BATCH_OPS_MAX);
            let batch: Vec<Op> = queue.ops.drain(..take).collect();
            let committed_ids = batch
                .iter()
                .filter(|op| matches!(op, Op::Committed { .. }))
                .count();
            queue.urgent -= batch.len() - committed_ids;
            batch
        };
        let written = write_batch(shared, &batch, last_index, generation, &mut mark);
        match written {
            Ok((new_last, new_generation)) => {
                last_index = new_last;
                generation = new_generation;
                shared.durable.send_modify(|durable| {
                    durable.generation = generation;
                    durable.last_index = last_index;
                });
                let mut queue = shared.lock();
                for op in &batch {
                    if let Op::Append { entries, .. } = op {
                        for (index, bytes) in entries {
                            // A later append may have replaced this index already.
                            if queue
                                .tail
                                .get(index)
                                .is_some_and(|queued| Arc::ptr_eq(queued, bytes))
                            {
                                queue.tail.remove(index);
                            }
                        }
                    }
                }
                drop(queue);
                answer(batch, &Ok(()));
            }
            Err(reason) => {
                tracing::error!(path = %shared.path.display(), error = %reason, "a raft log write failed; this coordinator stops writing");
                shared.lock().failed = Some(reason.clone());
                shared.durable.send_modify(|durable| {
                    durable.failed = Some(reason.clone());
                });
                answer(batch, &Err(reason.clone()));
                // Fail whatever was queued meanwhile; later writes fail when queued.
                let rest: Vec<Op> = {
                    let mut queue = shared.lock();
                    queue.urgent = 0;
                    queue.ops.drain(..).collect()
                };
                answer(rest, &Err(reason));
            }
        }
    }
}

fn answer(batch: Vec<Op>, result: &Result<(), Arc<str>>) {
    for op in batch {
        match op {
            Op::Append { .. } | Op::Committed { .. } => {}
            Op::Vote { done, .. }
            | Op::Truncate { done, .. }
            | Op::Purge { done, .. }
            | Op::Barrier { done } => {
                let _ = done.send(result.clone());
            }
        }
    }
}

/// Writes one batch, in order: runs of entries, truncations and committed ids as one log
/// write each (one `fdatasync`), a vote or purge as one redb transaction committed with fsync;
/// a purge removes the log's old segments once its id is durable. The disk's last index and
/// generation after it.
fn write_batch<NID: NodeId>(
    shared: &Shared<NID>,
    batch: &[Op],
    mut last_index: Option<u64>,
    mut generation: u64,
    mark: &mut CommittedMark,
) -> Result<(Option<u64>, u64), Arc<str>> {
    // The log's own errors name their segment file; redb's name nothing, so they get its path.
    let context = |error: &dyn std::fmt::Display| -> Arc<str> {
        format!("raft log store {}: {error}", shared.path.display()).into()
    };
    let wal_error = |error: &dyn std::fmt::Display| -> Arc<str> { error.to_string().into() };
    let mut records: Vec<Record<'_>> = Vec::new();
    let flush = |records: &mut Vec<Record<'_>>| -> Result<(), Arc<str>> {
        shared
            .wal
            .write(records)
            .map_err(|error| wal_error(&error))?;
        records.clear();
        Ok(())
    };
    for op in batch {
        match op {
            Op::Append {
                generation: g,
                entries,
            } => {
                for (index, bytes) in entries {
                    records.push(Record::Entry {
                        index: *index,
                        bytes,
                    });
                }
                last_index = entries.last().map(|(index, _)| *index);
                generation = *g;
            }
            Op::Truncate {
                generation: g,
                since,
                ..
            } => {
                records.push(Record::Truncate { since: *since });
                if last_index >= Some(*since) {
                    last_index = since.checked_sub(1);
                }
                generation = *g;
            }
            Op::Committed { bytes, .. } => {
                records.push(Record::Committed { bytes });
            }
            Op::Vote { bytes, .. } => {
                flush(&mut records)?;
                write_meta(&shared.db, KEY_VOTE, bytes).map_err(|error| context(&error))?;
            }
            Op::Purge { upto, purged, .. } => {
                flush(&mut records)?;
                write_meta(&shared.db, KEY_LAST_PURGED, purged).map_err(|error| context(&error))?;
                shared.wal.purge(*upto).map_err(|error| wal_error(&error))?;
                last_index = last_index.max(Some(*upto));
            }
            Op::Barrier { .. } => {}
        }
    }
    flush(&mut records)?;
    // Up to the newest committed index whose entries are on this disk now: a committed id
    // may run ahead of a follower's log (a snapshot being installed), and committed entries
    // are never truncated, so the log never legitimately ends before it.
    let committed = batch
        .iter()
        .filter_map(|op| match op {
            Op::Committed { index, .. } => *index,
            _ => None,
        })
        .max();
    if let Some(index) = committed.min(last_index) {
        if mark.due(index) {
            let bytes = encode_value(&index).map_err(|error| context(&error))?;
            write_meta(&shared.db, KEY_COMMITTED_MARK, &bytes).map_err(|error| context(&error))?;
            mark.written(index);
        }
    }
    Ok((last_index, generation))
}

/// When the committed mark ([`KEY_COMMITTED_MARK`]) was last written, and what it holds.
#[derive(Default)]
struct CommittedMark {
    written: Option<(std::time::Instant, u64)>,
}

impl CommittedMark {
    /// Whether `index` is to be written now: it is past the mark, and the mark is older than
    /// [`COMMITTED_MARK_INTERVAL`] (or none was written by this run).
    fn due(&self, index: u64) -> bool {
        match self.written {
            None => true,
            Some((at, marked)) => index > marked && at.elapsed() >= COMMITTED_MARK_INTERVAL,
        }
    }

    fn written(&mut self, index: u64) {
        self.written = Some((std::time::Instant::now(), index));
    }
}

/// Refuses a log that ends before the committed mark `mark` recorded beside it: records this
/// member had on disk, and that were committed, are gone (whole records cut from a segment's
/// end on a 4 KiB boundary, a segment file or the whole log directory removed), which a
/// replay of the segments alone cannot tell from a shorter log. Such a member would vote and
/// answer as if it never had them, and Raft's safety rests on what a voter acknowledged
/// staying on its disk. `log_end` is the log's last index, purged entries counted.
pub fn check_committed_mark(
    log_end: Option<u64>,
    mark: Option<u64>,
    wal_dir: &Path,
    db_path: &Path,
) -> Result<(), String> {
    match mark {
        Some(mark) if log_end < Some(mark) => Err(format!(
            "the raft log in {} ends {}, but {} records that this member held committed \
             entries up to index {mark}: records were lost from the log (a segment file cut \
             short or removed?), so this node's log cannot be trusted: move the data directory \
             away, start the coordinator on an empty one, then remove it from the cluster and \
             add it back as a new member (`quotient cluster remove-member --id ID`, then \
             `quotient cluster add-member --id ID --address ADDR`): it copies the log from the \
             leader before it votes",
            wal_dir.display(),
            match log_end {
                Some(end) => format!("at index {end}"),
                None => "empty".to_string(),
            },
            db_path.display()
        )),
        _ => Ok(()),
    }
}

/// Writes `value` under `key` of the meta table, with the version it is encoded in, in one
/// transaction, synced.
fn write_meta(db: &Database, key: &str, value: &[u8]) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    {
        let mut meta = txn.open_table(META_TABLE)?;
        meta.insert(key, value)?;
        meta.insert(version_key(key), RAFT_LOG.current.to_le_bytes().as_slice())?;
    }
    txn.commit()?;
    Ok(())
}
