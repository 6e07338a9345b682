//! The Raft state machine: openraft's storage-v2 [`RaftStateMachine`] around the pure
//! `quotient_core::State`. Each command of a Normal entry is applied in order with
//! `quotient_core::apply` and `ApplyCtx { log_index, time_ms }` (the entry's index and the time
//! the leader stamped on the [`Request`]), giving one outcome per command; Blank and
//! Membership entries yield a single [`Outcome::Done`], and a Membership entry also becomes
//! the last membership. The state itself lives in memory; what makes it durable is the snapshot, the
//! serialized `State` plus its [`SnapshotMeta`], persisted to `DATA_DIR/snapshot.bin` (written to
//! a temporary file, fsynced, renamed over the old one, directory fsynced). On restart the state
//! is loaded from that snapshot and openraft re-applies the committed log after it. A temporary
//! file left by a write that never finished (a crash, a full disk) is removed on open: it is
//! never read, and on a full disk it holds the space the next snapshot needs.
//!
//! The snapshot file is `QSNAP | version (3 ASCII digits) | meta length (u64 LE) | state length
//! (u64 LE) | meta | state | CRC32 (u32 LE, of everything before it; from version 3)`, with
//! the metadata in the store's codec and the state in
//! `State::to_snapshot_bytes`; every length is checked against a named limit before anything
//! is allocated. The version is the file's layout (`quotient_common::version::SNAPSHOT_FILE`):
//! in version 1 (`QSNAP001`) the state had no header of its own and was version 1 of the
//! state's encoding; in version 2 it starts with its own version, as it travels to followers;
//! version 3 ends with a checksum, so that a byte changed on disk is refused when the file is
//! read instead of loaded as the state (found by probing: a change that still decoded was
//! served until the digest check caught it).
//! A file of version 1 is read as the state it holds, with that header added, so what a
//! follower is sent is always the same form. Building one holds
//! the state's lock only to capture it (`State::capture_snapshot`: the small fields encoded,
//! the job table and the idempotency keys cloned copy-on-write); the jobs and keys are encoded
//! after, while applies go on.
//!
//! Applying also notes what each command changed (`quotient_core::apply_noting`) into one
//! [`AppliedChanges`], which the leader drains with [`QuotientStateMachine::read_changes`]
//! (see `crate::applied`). It starts as everything (the state was loaded, not applied here),
//! and a snapshot install makes it everything again.

// `StorageError` is openraft's error type, which its storage traits require; its size is theirs.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Cursor, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use quotient_common::version::{VersionError, Writer, SNAPSHOT_FILE};
use quotient_core::limits::SNAPSHOT_BYTES_MAX;
use quotient_core::{ApplyCtx, Command, Outcome, SnapshotError, State, SNAPSHOT_STATE_MAGIC};

use super::codec::{decode_value, encode_value, CodecError, MAX_ENTRY_BYTES};
use super::type_config::{Entry, MemberId, Outcomes, Request, TypeConfig};
use crate::applied::AppliedChanges;
use crate::digest_check::DigestChecks;
use crate::history::History;
use crate::views;

/// The snapshot file name inside the data directory.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot.bin";

/// The temporary file a new snapshot is written to before it is renamed over the old one.
pub const SNAPSHOT_TMP_FILE_NAME: &str = "snapshot.bin.tmp";

/// The first bytes of a snapshot file; its version follows, in three ASCII digits.
const SNAPSHOT_MAGIC: [u8; 5] = *b"QSNAP";

/// Magic, version, metadata length, state length.
const SNAPSHOT_HEADER_BYTES: usize = SNAPSHOT_MAGIC.len() + 3 + 8 + 8;
/// The CRC32 that ends a snapshot file of version 3 and later.
const SNAPSHOT_CHECKSUM_BYTES: usize = 4;

/// The largest snapshot file that is read back: header, metadata and the largest state.
pub const MAX_SNAPSHOT_FILE_BYTES: u64 =
    (SNAPSHOT_HEADER_BYTES + MAX_ENTRY_BYTES + SNAPSHOT_BYTES_MAX + SNAPSHOT_CHECKSUM_BYTES) as u64;

type Meta = SnapshotMeta<MemberId, BasicNode>;
type Membership = StoredMembership<MemberId, BasicNode>;

/// Why the snapshot file could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    /// Reading, writing, syncing or renaming the file failed.
    #[error("snapshot file I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with the snapshot magic and a version.
    #[error("not a Quotient snapshot file (bad magic)")]
    BadMagic,
    /// The file's layout is a version this build does not read.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// The lengths in the header do not match the file, or exceed their limits.
    #[error("corrupted snapshot file: {0}")]
    Corrupted(String),
    /// The metadata could not be encoded or decoded.
    #[error("snapshot metadata: {0}")]
    Meta(#[from] CodecError),
    /// The state bytes are not a valid state.
    #[error("snapshot state: {0}")]
    State(#[from] SnapshotError),
}

/// What has been applied: the state, the last applied log id and the last membership.
struct Applied {
    state: State,
    last_applied: Option<LogId<MemberId>>,
    last_membership: Membership,
}

struct Shared {
    data_dir: PathBuf,
    applied: RwLock<Applied>,
    /// Serialises snapshot file writes; holds the metadata of the snapshot on disk, if any.
    on_disk: Mutex<Option<Meta>>,
    /// The snapshot file as `open` read it, kept for the first `get_current_snapshot`:
    /// openraft asks for the current snapshot as it starts (for its metadata), and reading
    /// the file a second time cost a start from a million jobs about half a second
    /// (BENCHMARKS.md, the restart). Dropped by that call, or by the next snapshot written.
    opened: Mutex<Option<(Meta, Vec<u8>)>>,
    /// Makes snapshot ids unique within this process.
    snapshot_seq: AtomicU64,
    /// This replica's state digests at the leader's checks, and its verdict.
    digest_checks: DigestChecks,
    /// What the entries applied since the leader last looked changed. Locked after
    /// `applied`, never before it.
    changes: Mutex<AppliedChanges>,
    /// Where the records of the jobs that end go, once the coordinator attached it.
    history: std::sync::OnceLock<Arc<History>>,
    /// The last index of this replica's log at start: entries up to it are replays, with old
    /// stamps, and are not observed as the cluster's time.
    replayed_until: AtomicU64,
}

impl Shared {
    // A panic inside `apply` already stops the Raft node; a poisoned lock is recovered only so
    // that diagnostics can still read the state.
    fn read_applied(&self) -> RwLockReadGuard<'_, Applied> {
        self.applied.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_applied(&self) -> RwLockWriteGuard<'_, Applied> {
        self.applied.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_changes(&self) -> MutexGuard<'_, AppliedChanges> {
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_on_disk(&self) -> MutexGuard<'_, Option<Meta>> {
        self.on_disk.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_opened(&self) -> Option<(Meta, Vec<u8>)> {
        self.opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn snapshot_path(&self) -> PathBuf {
        self.data_dir.join(SNAPSHOT_FILE_NAME)
    }

    /// Writes a snapshot file unless (when `force` is false) the one on disk is newer.
    /// Returns whether it wrote.
    fn persist(&self, meta: &Meta, state: &[u8], force: bool) -> Result<bool, SnapshotFileError> {
        let mut on_disk = self.lock_on_disk();
        if !force {
            if let Some(current) = on_disk.as_ref() {
                if current.last_log_id > meta.last_log_id {
                    return Ok(false);
                }
            }
        }
        write_snapshot_file(&self.data_dir, meta, state)?;
        *on_disk = Some(meta.clone());
        self.take_opened();
        Ok(true)
    }

    fn storage_error(
        &self,
        subject: ErrorSubject<MemberId>,
        verb: ErrorVerb,
        error: &(dyn std::error::Error + 'static),
    ) -> StorageError<MemberId> {
        let source = AnyError::from_dyn(error, None)
            .add_context(|| format!("raft snapshot {}", self.snapshot_path().display()));
        StorageIOError::new(subject, verb, source).into()
    }
}

/// The Raft state machine over `quotient_core::State`; cheap to clone, and each clone shares
/// the same state (the snapshot builder is a clone, and so can be the coordinator's read handle).
#[derive(Clone)]
pub struct QuotientStateMachine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for QuotientStateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotientStateMachine")
            .field("data_dir", &self.shared.data_dir)
            .field("last_applied", &self.last_applied())
            .finish()
    }
}

/// How long a snapshot waits for the job history to commit what it was given.
const HISTORY_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The history records of every finished job `state` holds.
fn finished_records(state: &State) -> Vec<quotient_common::api::HistoryRecord> {
    state
        .jobs()
        .filter(|job| job.state.is_terminal())
        .map(|job| views::history_record(state, job))
        .collect()
}

impl QuotientStateMachine {
    /// Opens the state machine for `data_dir`: loads `data_dir/snapshot.bin` if it exists,
    /// else starts from `State::new()`. Creates the directory if missing. Blocks on file I/O,
    /// so call it at startup (or from a blocking task).
    ///
    /// A snapshot file that cannot be read or decoded, or whose state fails validation, is an
    /// error: starting empty instead could lose the history the purged log no longer has.
    pub fn open(data_dir: &Path) -> Result<Self, StorageError<MemberId>> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            let source = AnyError::new(&e)
                .add_context(|| format!("creating raft data directory {}", data_dir.display()));
            StorageIOError::new(ErrorSubject::StateMachine, ErrorVerb::Write, source)
        })?;
        remove_leftover_tmp_file(data_dir);
        let shared = Shared {
            data_dir: data_dir.to_path_buf(),
            applied: RwLock::new(Applied {
                state: State::new(),
                last_applied: None,
                last_membership: Membership::default(),
            }),
            on_disk: Mutex::new(None),
            opened: Mutex::new(None),
            snapshot_seq: AtomicU64::new(0),
            digest_checks: DigestChecks::default(),
            replayed_until: AtomicU64::new(0),
            changes: Mutex::new(AppliedChanges::Everything),
            history: std::sync::OnceLock::new(),
        };
        let loaded = read_snapshot_file(data_dir)
            .map_err(|e| shared.storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))?;
        if let Some((meta, bytes)) = loaded {
            let state = State::from_snapshot_bytes(&bytes).map_err(|e| {
                let e = SnapshotFileError::State(e);
                shared.storage_error(
                    ErrorSubject::Snapshot(Some(meta.signature())),
                    ErrorVerb::Read,
                    &e,
                )
            })?;
            tracing::info!(
                path = %shared.snapshot_path().display(),
                last_log_id = ?meta.last_log_id,
                "loaded raft snapshot"
            );
            *shared.write_applied() = Applied {
                state,
                last_applied: meta.last_log_id,
                last_membership: meta.last_membership.clone(),
            };
            *shared.lock_on_disk() = Some(meta.clone());
            *shared.opened.lock().unwrap_or_else(PoisonError::into_inner) = Some((meta, bytes));
        }
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// From now on, writes a record to `history` for every job that ends; first, one for
    /// every finished job the state holds that has none (`crate::history` says why).
    pub fn attach_history(&self, history: Arc<History>) {
        let mut applied = self.shared.write_applied();
        applied.state.collect_finished();
        history.append(finished_records(&applied.state));
        let _ = self.shared.history.set(history);
    }

    /// The job history, once attached.
    pub fn history(&self) -> Option<&Arc<History>> {
        self.shared.history.get()
    }

    /// Runs `f` on the current state (under a read lock: keep it short).
    pub fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.shared.read_applied().state)
    }

    /// Whether the certificate of `peer` (of serial `serial`, when known) is revoked in the
    /// current state: every door (API, agents, Raft both ways) asks this.
    pub fn is_revoked(
        &self,
        peer: &quotient_common::certs::PeerIdentity,
        serial: Option<&str>,
    ) -> bool {
        self.read(|state| state.is_revoked(&peer.name, serial))
    }

    /// Runs `f` on the current state and what the entries applied since the last call
    /// changed (under the read lock, so the two agree), leaving nothing changed.
    pub fn read_changes<R>(&self, f: impl FnOnce(&State, AppliedChanges) -> R) -> R {
        let applied = self.shared.read_applied();
        let changes = self.shared.lock_changes().take();
        f(&applied.state, changes)
    }

    /// This replica's state digests at the leader's checks, and whether its state diverged.
    pub fn digest_checks(&self) -> &DigestChecks {
        &self.shared.digest_checks
    }

    /// Says that entries up to `index` (the last of this replica's log at start) are replays
    /// of its own log: their digest checks are not compared, and their stamps are not taken
    /// for the cluster's time (`quotient_common::steady_clock::observe`).
    pub fn replays_until(&self, index: u64) {
        self.shared.digest_checks.compare_only_after(index);
        self.shared.replayed_until.store(index, Ordering::SeqCst);
    }

    /// Runs `f` on the current state and the index of the last entry it includes, read under
    /// one lock so that the two agree (Raft's metrics report an apply a moment after it).
    pub fn read_at<R>(&self, f: impl FnOnce(&State) -> R) -> (u64, R) {
        let applied = self.shared.read_applied();
        let index = applied.last_applied.map_or(0, |log_id| log_id.index);
        (index, f(&applied.state))
    }

    /// The id of the last applied log entry, if any.
    pub fn last_applied(&self) -> Option<LogId<MemberId>> {
        self.shared.read_applied().last_applied
    }

    /// The path of the snapshot file.
    pub fn snapshot_path(&self) -> PathBuf {
        self.shared.snapshot_path()
    }

    /// Runs `f` on tokio's blocking pool with the shared state.
    async fn blocking<R, F>(
        &self,
        subject: ErrorSubject<MemberId>,
        verb: ErrorVerb,
        f: F,
    ) -> Result<R, StorageError<MemberId>>
    where
        F: FnOnce(&Shared) -> Result<R, StorageError<MemberId>> + Send + 'static,
        R: Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        match tokio::task::spawn_blocking(move || f(&shared)).await {
            Ok(result) => result,
            Err(join) => Err(self.shared.storage_error(subject, verb, &join)),
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for QuotientStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<MemberId>> {
        let seq = self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let subject = ErrorSubject::Snapshot(None);
        if let Some(history) = self.shared.history.get().cloned() {
            // The records of the jobs the snapshot's entries ended are committed before the log
            // behind it may be purged (a job removed by retention since is in no snapshot).
            let flushed =
                tokio::task::spawn_blocking(move || history.flush(HISTORY_FLUSH_WAIT)).await;
            if !matches!(flushed, Ok(true)) {
                tracing::warn!("the job history was not committed before a snapshot");
            }
        }
        let (meta, bytes) = self
            .blocking(subject.clone(), ErrorVerb::Write, move |shared| {
                // Only the capture holds the lock (the small fields encoded, the job table and
                // the idempotency keys cloned copy-on-write); the rest is encoded after, while
                // applies go on.
                let (capture, last_log_id, last_membership) = {
                    let applied = shared.read_applied();
                    (
                        applied.state.capture_snapshot(),
                        applied.last_applied,
                        applied.last_membership.clone(),
                    )
                };
                let bytes = capture.into_bytes();
                let snapshot_id = match &last_log_id {
                    Some(id) => format!("{id}-{seq}"),
                    None => format!("empty-{seq}"),
                };
                let meta = Meta {
                    last_log_id,
                    last_membership,
                    snapshot_id,
                };
                let wrote = shared
                    .persist(&meta, &bytes, false)
                    .map_err(|e| shared.storage_error(subject, ErrorVerb::Write, &e))?;
                if !wrote {
                    tracing::debug!(
                        snapshot = %meta,
                        "a newer snapshot is already on disk; not replacing it"
                    );
                }
                Ok((meta, bytes))
            })
            .await?;
        tracing::info!(snapshot = %meta, bytes = bytes.len(), "built raft snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for QuotientStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<MemberId>>, Membership), StorageError<MemberId>> {
        let applied = self.shared.read_applied();
        Ok((applied.last_applied, applied.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcomes>, StorageError<MemberId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut applied = self.shared.write_applied();
        let mut changes = self.shared.lock_changes();
        let mut outcomes = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            let outcome = match entry.payload {
                EntryPayload::Blank => vec![Outcome::Done],
                EntryPayload::Normal(Request { commands, time_ms }) => {
                    if log_id.index > self.shared.replayed_until.load(Ordering::Relaxed) {
                        quotient_common::steady_clock::observe(time_ms);
                    }
                    let ctx = ApplyCtx {
                        log_index: log_id.index,
                        time_ms,
                    };
                    let mut checked = false;
                    let outcomes = commands
                        .into_iter()
                        .map(|command| {
                            if let Command::CheckDigest { leader } = &command {
                                checked = true;
                                if let Some(leader) = leader {
                                    self.shared.digest_checks.compare(log_id.index, *leader);
                                }
                            }
                            match changes.noting() {
                                Some(noted) => quotient_core::apply_noting(
                                    &mut applied.state,
                                    command,
                                    ctx,
                                    noted,
                                ),
                                None => quotient_core::apply(&mut applied.state, command, ctx),
                            }
                        })
                        .collect();
                    changes.bound();
                    if let Some(history) = self.shared.history.get() {
                        let ended = applied.state.take_finished();
                        if !ended.is_empty() {
                            history.append(views::history_records(&applied.state, &ended));
                        }
                    }
                    if checked {
                        self.shared
                            .digest_checks
                            .record(log_id.index, applied.state.capture_snapshot());
                    }
                    outcomes
                }
                EntryPayload::Membership(membership) => {
                    applied.last_membership = Membership::new(Some(log_id), membership);
                    vec![Outcome::Done]
                }
            };
            applied.last_applied = Some(log_id);
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<MemberId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<MemberId>> {
        let bytes = snapshot.into_inner();
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let owned_meta = meta.clone();
        let state = self
            .blocking(subject.clone(), ErrorVerb::Write, move |shared| {
                // Validate before persisting: a bad snapshot must not replace a good one.
                let state = State::from_snapshot_bytes(&bytes).map_err(|e| {
                    let e = SnapshotFileError::State(e);
                    shared.storage_error(subject.clone(), ErrorVerb::Read, &e)
                })?;
                shared
                    .persist(&owned_meta, &bytes, true)
                    .map_err(|e| shared.storage_error(subject, ErrorVerb::Write, &e))?;
                Ok(state)
            })
            .await?;
        let mut applied = self.shared.write_applied();
        *applied = Applied {
            state,
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
        };
        if let Some(history) = self.shared.history.get() {
            // The entries the snapshot stands for were not applied here: their jobs' records
            // are written from the state (those it still holds).
            applied.state.collect_finished();
            history.append(finished_records(&applied.state));
        }
        *self.shared.lock_changes() = AppliedChanges::Everything;
        drop(applied);
        tracing::info!(snapshot = %meta, "installed raft snapshot");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<MemberId>> {
        if let Some((meta, bytes)) = self.shared.take_opened() {
            return Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(bytes)),
            }));
        }
        let subject = ErrorSubject::Snapshot(None);
        let loaded = self
            .blocking(subject.clone(), ErrorVerb::Read, move |shared| {
                read_snapshot_file(&shared.data_dir)
                    .map_err(|e| shared.storage_error(subject, ErrorVerb::Read, &e))
            })
            .await?;
        Ok(loaded.map(|(meta, bytes)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}

/// Writes `dir/snapshot.bin` atomically: temporary file, fsync, rename, directory fsync.
fn write_snapshot_file(dir: &Path, meta: &Meta, state: &[u8]) -> Result<(), SnapshotFileError> {
    let meta_bytes = encode_value(meta)?;
    if state.len() > SNAPSHOT_BYTES_MAX {
        return Err(SnapshotFileError::Corrupted(format!(
            "state of {} bytes exceeds the limit of {SNAPSHOT_BYTES_MAX} bytes",
            state.len()
        )));
    }
    let tmp = dir.join(SNAPSHOT_TMP_FILE_NAME);
    let path = dir.join(SNAPSHOT_FILE_NAME);
    let file = File::create(&tmp)?;
    let mut writer = BufWriter::new(file);
    let mut crc = crc32fast::Hasher::new();
    let version = format!("{:03}", SNAPSHOT_FILE.current);
    let lengths = [
        (meta_bytes.len() as u64).to_le_bytes(),
        (state.len() as u64).to_le_bytes(),
    ];
    for part in [
        &SNAPSHOT_MAGIC[..],
        version.as_bytes(),
        &lengths[0],
        &lengths[1],
        &meta_bytes,
        state,
    ] {
        crc.update(part);
        writer.write_all(part)?;
    }
    writer.write_all(&crc.finalize().to_le_bytes())?;
    let file = writer.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    Ok(())
}

/// Removes the temporary file of a snapshot write that never finished (the process died, or
/// the disk filled up, before the rename). Nothing reads it, and on a full disk it holds the
/// space the next snapshot needs. A failure to remove it is logged, not fatal: the next
/// snapshot write truncates it anyway.
fn remove_leftover_tmp_file(dir: &Path) {
    let tmp = dir.join(SNAPSHOT_TMP_FILE_NAME);
    let bytes = match std::fs::metadata(&tmp) {
        Ok(metadata) => metadata.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!(path = %tmp.display(), error = %e, "cannot inspect a leftover snapshot temporary file");
            return;
        }
    };
    match std::fs::remove_file(&tmp) {
        Ok(()) => tracing::info!(
            path = %tmp.display(),
            bytes,
            "removed the temporary file of a snapshot write that never finished (a crash or a full disk)"
        ),
        Err(e) => tracing::warn!(
            path = %tmp.display(),
            bytes,
            error = %e,
            "cannot remove the temporary file of an unfinished snapshot write; remove it by hand to free its space"
        ),
    }
}

/// Makes a rename in `dir` durable.
#[cfg(unix)]
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
pub(crate) fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Reads `dir/snapshot.bin`: its metadata and its state bytes, or `None` if there is none.
fn read_snapshot_file(dir: &Path) -> Result<Option<(Meta, Vec<u8>)>, SnapshotFileError> {
    let path = dir.join(SNAPSHOT_FILE_NAME);
    let file = match quotient_common::bounded_read::open_regular(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let len = file.metadata()?.len();
    if len > MAX_SNAPSHOT_FILE_BYTES {
        return Err(SnapshotFileError::Corrupted(format!(
            "file of {len} bytes exceeds the limit of {MAX_SNAPSHOT_FILE_BYTES} bytes"
        )));
    }
    // The limit holds while reading too: a file that grows meanwhile is refused.
    let bytes = quotient_common::bounded_read::read_bytes_at_most(file, MAX_SNAPSHOT_FILE_BYTES)?
        .ok_or_else(|| {
        SnapshotFileError::Corrupted(format!(
            "file grew past the limit of {MAX_SNAPSHOT_FILE_BYTES} bytes while read"
        ))
    })?;
    let (meta, state) = snapshot_of_file(bytes, &path)?;
    Ok(Some((meta, state)))
}

/// The metadata and the state (in the form it travels in) of a whole snapshot file's `bytes`,
/// read from `path`.
fn snapshot_of_file(mut bytes: Vec<u8>, path: &Path) -> Result<(Meta, Vec<u8>), SnapshotFileError> {
    let (version, meta, state) = parse_snapshot_header(&bytes, path)?;
    let state_start = state.start;
    // What follows the state (version 3's checksum, checked by `parse_snapshot_header`).
    bytes.truncate(state.end);
    // One arm per layout this build reads: the state in the form it travels in.
    match version {
        1 => {
            // The state of the first layout is version 1 of its encoding, without a header.
            let mut header = SNAPSHOT_STATE_MAGIC.to_vec();
            header.extend_from_slice(&1u16.to_le_bytes());
            bytes.splice(..state_start, header);
        }
        _ => {
            bytes.drain(..state_start);
        }
    }
    Ok((meta, bytes))
}

/// One piece of the snapshot file on disk, for a backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPiece {
    pub snapshot_id: String,
    /// The log index the snapshot's state includes (0 for none).
    pub last_log_index: u64,
    pub total_bytes: u64,
    pub data: Vec<u8>,
}

/// The snapshot file of `dir` from `offset`, at most `max` bytes, with its metadata; `None`
/// when there is no snapshot. Reads only the header, the metadata and the piece.
pub fn snapshot_piece(
    dir: &Path,
    offset: u64,
    max: usize,
) -> Result<Option<SnapshotPiece>, SnapshotFileError> {
    use std::io::{Seek, SeekFrom};
    let path = dir.join(SNAPSHOT_FILE_NAME);
    let mut file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let total_bytes = file.metadata()?.len();
    let mut header = [0u8; SNAPSHOT_HEADER_BYTES];
    file.read_exact(&mut header)?;
    let (_, meta_len, _) = parse_header_prefix(&header, &path)?;
    let mut meta_bytes = vec![0u8; meta_len];
    file.read_exact(&mut meta_bytes)?;
    let meta: Meta = decode_value(&meta_bytes)?;
    let want = usize::try_from(total_bytes.saturating_sub(offset))
        .unwrap_or(usize::MAX)
        .min(max);
    file.seek(SeekFrom::Start(offset))?;
    let mut data = vec![0u8; want];
    file.read_exact(&mut data)?;
    Ok(Some(SnapshotPiece {
        snapshot_id: meta.snapshot_id,
        last_log_index: meta.last_log_id.map_or(0, |id| id.index),
        total_bytes,
        data,
    }))
}

/// Makes `dir` (empty) hold the state of `file_bytes`, a whole snapshot file of another
/// coordinator (a backup), as its snapshot, with `members` as its voters: a restore. The
/// state is decoded and checked first. Returns the log id the state includes.
pub fn write_restored_snapshot(
    dir: &Path,
    file_bytes: Vec<u8>,
    members: BTreeMap<MemberId, BasicNode>,
) -> Result<LogId<MemberId>, SnapshotFileError> {
    let (meta, state) = snapshot_of_file(file_bytes, Path::new("the backup"))?;
    State::from_snapshot_bytes(&state)?;
    let last = meta.last_log_id.ok_or_else(|| {
        SnapshotFileError::Corrupted("the backup's state includes no log entry".to_string())
    })?;
    let voters = members.keys().copied().collect();
    let membership = openraft::Membership::new(vec![voters], members);
    let meta = Meta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), membership),
        snapshot_id: format!("restored-{last}"),
    };
    std::fs::create_dir_all(dir)?;
    write_snapshot_file(dir, &meta, &state)?;
    Ok(last)
}

/// Checks the magic, version and lengths at the start of a snapshot file at `path`: its
/// layout's version, the metadata's and the state's lengths.
fn parse_header_prefix(
    bytes: &[u8],
    path: &Path,
) -> Result<(u16, usize, usize), SnapshotFileError> {
    let (magic, rest) = bytes
        .split_at_checked(SNAPSHOT_MAGIC.len())
        .ok_or(SnapshotFileError::BadMagic)?;
    if magic != SNAPSHOT_MAGIC {
        return Err(SnapshotFileError::BadMagic);
    }
    let (digits, rest) = rest
        .split_at_checked(3)
        .ok_or(SnapshotFileError::BadMagic)?;
    let version = std::str::from_utf8(digits)
        .ok()
        .filter(|digits| digits.bytes().all(|byte| byte.is_ascii_digit()))
        .and_then(|digits| digits.parse::<u16>().ok())
        .ok_or(SnapshotFileError::BadMagic)?;
    let version = SNAPSHOT_FILE.check(version, Writer::File(path.display().to_string()))?;
    if bytes.len() < SNAPSHOT_HEADER_BYTES {
        return Err(SnapshotFileError::Corrupted(format!(
            "file of {} bytes is shorter than the header",
            bytes.len()
        )));
    }
    let (meta_len, rest) = read_len(rest)?;
    let (state_len, _) = read_len(rest)?;
    if meta_len > MAX_ENTRY_BYTES {
        return Err(SnapshotFileError::Corrupted(format!(
            "metadata length {meta_len} exceeds the limit of {MAX_ENTRY_BYTES} bytes"
        )));
    }
    if state_len > SNAPSHOT_BYTES_MAX {
        return Err(SnapshotFileError::Corrupted(format!(
            "state length {state_len} exceeds the limit of {SNAPSHOT_BYTES_MAX} bytes"
        )));
    }
    Ok((version, meta_len, state_len))
}

/// Checks the header (and, from version 3, the checksum) of a whole snapshot file at `path`;
/// returns its layout's version, the metadata and where the state is.
fn parse_snapshot_header(
    bytes: &[u8],
    path: &Path,
) -> Result<(u16, Meta, std::ops::Range<usize>), SnapshotFileError> {
    let (version, meta_len, state_len) = parse_header_prefix(bytes, path)?;
    let state_start = SNAPSHOT_HEADER_BYTES + meta_len;
    let checksum = if version >= 3 {
        SNAPSHOT_CHECKSUM_BYTES
    } else {
        0
    };
    let end = state_start + state_len;
    if end + checksum != bytes.len() {
        return Err(SnapshotFileError::Corrupted(format!(
            "header says {} bytes, file has {}",
            end + checksum,
            bytes.len()
        )));
    }
    if checksum > 0 {
        let stored = u32::from_le_bytes(bytes[end..].try_into().expect("four bytes"));
        if crc32fast::hash(&bytes[..end]) != stored {
            return Err(SnapshotFileError::Corrupted(
                "its checksum does not match: the file changed after it was written".to_string(),
            ));
        }
    }
    let meta = decode_value(&bytes[SNAPSHOT_HEADER_BYTES..state_start])?;
    Ok((version, meta, state_start..end))
}

/// Reads one little-endian u64 length as a usize.
fn read_len(bytes: &[u8]) -> Result<(usize, &[u8]), SnapshotFileError> {
    let (head, rest) = bytes.split_at_checked(8).ok_or_else(|| {
        SnapshotFileError::Corrupted("file is shorter than the header".to_string())
    })?;
    let mut raw = [0u8; 8];
    raw.copy_from_slice(head);
    let len = usize::try_from(u64::from_le_bytes(raw))
        .map_err(|_| SnapshotFileError::Corrupted("length does not fit in memory".to_string()))?;
    Ok((len, rest))
}
