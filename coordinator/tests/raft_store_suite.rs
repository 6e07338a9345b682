//! Tests of the coordinator's Raft storage: openraft's own storage `Suite` run against the redb
//! log store (each store in its own temporary directory), and this project's checks that the
//! log survives reopening, that truncate and purge behave, and that corrupted or oversized
//! values give errors rather than panics.
//!
//! The `Suite` needs a state machine next to the log store. It runs twice: with the real
//! system's type config and `QuotientStateMachine`, and with [`MemStateMachine`], a minimal
//! in-memory one over a test-only type config, so that the log store is also tested on its own
//! (and with entries whose size the test chooses).

use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
    Vote,
};
use quotient_common::version::RAFT_LOG;
use quotient_coordinator::store::codec::{
    decode_value, encode_value, VersionedEntries, MAX_ENTRY_BYTES,
};
use quotient_coordinator::store::log_store::{version_key, DB_FILE_NAME, KEY_VOTE, META_TABLE};
use quotient_coordinator::store::wal::{Record, Wal, WAL_DIR_NAME};
use quotient_coordinator::store::{self, RaftLogStore};
use serde::{Deserialize, Serialize};

/// The application data of the test type config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestRequest(pub String);

/// The application response of the test type config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestResponse(pub Option<String>);

openraft::declare_raft_types!(
    /// A type config for testing the log store on its own.
    pub TestConfig:
        D = TestRequest,
        R = TestResponse,
        NodeId = u64,
        Node = BasicNode,
        Entry = Entry<TestConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

/// The test entries have one version, as the real ones so far.
impl VersionedEntries for TestConfig {}

type MemberId = u64;
type Store = RaftLogStore<TestConfig>;

// ---------------------------------------------------------------------------------------------
// A minimal in-memory state machine, only for the Suite.

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct MemData {
    last_applied: Option<LogId<MemberId>>,
    last_membership: StoredMembership<MemberId, BasicNode>,
    values: Vec<String>,
}

#[derive(Debug, Default)]
struct MemInner {
    data: MemData,
    current: Option<(SnapshotMeta<MemberId, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// An in-memory state machine: applied values in a list, snapshots as encoded bytes.
#[derive(Debug, Clone, Default)]
pub struct MemStateMachine {
    inner: Arc<Mutex<MemInner>>,
}

impl MemStateMachine {
    fn lock(&self) -> MutexGuard<'_, MemInner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn sm_error(e: impl std::error::Error + 'static) -> StorageError<MemberId> {
    StorageIOError::write_state_machine(&e).into()
}

impl RaftSnapshotBuilder<TestConfig> for MemStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TestConfig>, StorageError<MemberId>> {
        let mut inner = self.lock();
        let bytes = encode_value(&inner.data).map_err(sm_error)?;
        inner.snapshots_built += 1;
        let meta = SnapshotMeta {
            last_log_id: inner.data.last_applied,
            last_membership: inner.data.last_membership.clone(),
            snapshot_id: format!("mem-{}", inner.snapshots_built),
        };
        inner.current = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TestConfig> for MemStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<MemberId>>,
            StoredMembership<MemberId, BasicNode>,
        ),
        StorageError<MemberId>,
    > {
        let inner = self.lock();
        Ok((inner.data.last_applied, inner.data.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<TestResponse>, StorageError<MemberId>>
    where
        I: IntoIterator<Item = Entry<TestConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.lock();
        let mut out = Vec::new();
        for entry in entries {
            inner.data.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => out.push(TestResponse(None)),
                EntryPayload::Normal(TestRequest(value)) => {
                    inner.data.values.push(value.clone());
                    out.push(TestResponse(Some(value)));
                }
                EntryPayload::Membership(m) => {
                    inner.data.last_membership = StoredMembership::new(Some(entry.log_id), m);
                    out.push(TestResponse(None));
                }
            }
        }
        Ok(out)
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
        meta: &SnapshotMeta<MemberId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<MemberId>> {
        let bytes = snapshot.into_inner();
        let data: MemData = decode_value(&bytes).map_err(sm_error)?;
        let mut inner = self.lock();
        inner.data = data;
        inner.current = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TestConfig>>, StorageError<MemberId>> {
        let inner = self.lock();
        Ok(inner.current.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.clone())),
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// openraft's Suite.

/// Builds each store in a fresh temporary directory, removed when the guard drops.
struct LogStoreBuilder;

impl StoreBuilder<TestConfig, Store, MemStateMachine, tempfile::TempDir> for LogStoreBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, Store, MemStateMachine), StorageError<MemberId>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let store = Store::open(dir.path())?;
        Ok((dir, store, MemStateMachine::default()))
    }
}

#[test]
fn openraft_suite_on_the_log_store() -> anyhow::Result<()> {
    Suite::test_all(LogStoreBuilder)?;
    Ok(())
}

/// Builds the real system's log store and state machine in a fresh temporary directory.
struct QuotientBuilder;

impl
    StoreBuilder<store::TypeConfig, store::LogStore, store::QuotientStateMachine, tempfile::TempDir>
    for QuotientBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            tempfile::TempDir,
            store::LogStore,
            store::QuotientStateMachine,
        ),
        StorageError<MemberId>,
    > {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let (log, state_machine) = store::open(dir.path())?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn openraft_suite_on_quotient_stores() -> anyhow::Result<()> {
    Suite::test_all(QuotientBuilder)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// This project's tests.

fn log_id(term: u64, index: u64) -> LogId<MemberId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn normal(term: u64, index: u64, value: &str) -> Entry<TestConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(TestRequest(value.to_string())),
    }
}

fn entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry<TestConfig>> {
    indexes.map(|i| normal(term, i, &format!("v{i}"))).collect()
}

fn indexes(entries: &[Entry<TestConfig>]) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

async fn read_all(store: &mut Store) -> Vec<Entry<TestConfig>> {
    store
        .try_get_log_entries(0..u64::MAX)
        .await
        .expect("read entries")
}

/// Writes `bytes` as the entry at `index` straight into the log's files, with the store
/// closed: a whole record holding garbage, as a bug or a bad disk could leave.
fn poke_log(dir: &Path, index: u64, bytes: &[u8]) {
    let (wal, _) = Wal::open(dir, None).expect("open the log");
    wal.write(&[Record::Entry { index, bytes }]).expect("write");
}

/// The log's only segment file.
fn segment_file(dir: &Path) -> std::path::PathBuf {
    let segments: Vec<_> = std::fs::read_dir(dir.join(WAL_DIR_NAME))
        .expect("log dir")
        .map(|item| item.expect("item").path())
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    segments[0].clone()
}

/// The offset of the last nonzero byte of `path`: inside its last record.
fn last_written_byte(path: &Path) -> usize {
    let bytes = std::fs::read(path).expect("read");
    bytes
        .iter()
        .rposition(|b| *b != 0)
        .expect("something written")
}

/// XORs the byte at `offset` of `path` with 0xff.
fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = std::fs::read(path).expect("read");
    bytes[offset] ^= 0xff;
    std::fs::write(path, bytes).expect("write");
}

fn poke_meta(dir: &Path, key: &str, bytes: &[u8]) {
    let db = redb::Database::create(dir.join(DB_FILE_NAME)).expect("open db");
    let txn = db.begin_write().expect("begin");
    {
        let mut table = txn.open_table(META_TABLE).expect("table");
        table.insert(key, bytes).expect("insert");
    }
    txn.commit().expect("commit");
}

/// A bincode varint length prefix claiming u64::MAX bytes: must be refused, never allocated.
fn huge_length_prefix() -> Vec<u8> {
    let mut bytes = vec![253u8];
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes
}

#[tokio::test]
async fn data_survives_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vote = Vote::new_committed(3, 2);
    {
        let mut store = Store::open(dir.path()).expect("open");
        store.save_vote(&vote).await.expect("vote");
        store
            .blocking_append(entries(1, 1..=10))
            .await
            .expect("append");
        store
            .save_committed(Some(log_id(1, 7)))
            .await
            .expect("committed");
        store.purge(log_id(1, 3)).await.expect("purge");
    }
    let mut store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
    assert_eq!(
        store.read_committed().await.expect("committed"),
        Some(log_id(1, 7))
    );
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(1, 10)));
    let all = read_all(&mut store).await;
    assert_eq!(indexes(&all), (4..=10).collect::<Vec<_>>());
    assert_eq!(all[0], normal(1, 4, "v4"));
}

#[tokio::test]
async fn fresh_store_is_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(&dir.path().join("nested").join("data")).expect("open");
    assert_eq!(store.read_vote().await.expect("vote"), None);
    assert_eq!(store.read_committed().await.expect("committed"), None);
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, None);
    assert_eq!(state.last_log_id, None);
    assert!(read_all(&mut store).await.is_empty());
    assert!(store.path().ends_with(DB_FILE_NAME));
}

#[tokio::test]
async fn committed_can_be_cleared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path()).expect("open");
    store
        .save_committed(Some(log_id(2, 5)))
        .await
        .expect("save");
    store.save_committed(None).await.expect("clear");
    assert_eq!(store.read_committed().await.expect("read"), None);
}

#[tokio::test]
async fn truncate_removes_the_tail_and_allows_rewriting_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path()).expect("open");
    store
        .blocking_append(entries(1, 1..=10))
        .await
        .expect("append");
    store.truncate(log_id(1, 6)).await.expect("truncate");
    assert_eq!(
        indexes(&read_all(&mut store).await),
        (1..=5).collect::<Vec<_>>()
    );
    assert_eq!(
        store.get_log_state().await.expect("state").last_log_id,
        Some(log_id(1, 5))
    );

    // A new leader's entries replace the truncated ones.
    store
        .blocking_append(entries(2, 6..=8))
        .await
        .expect("append");
    let all = read_all(&mut store).await;
    assert_eq!(indexes(&all), (1..=8).collect::<Vec<_>>());
    assert_eq!(all[5], normal(2, 6, "v6"));
    assert_eq!(
        store.get_log_state().await.expect("state").last_log_id,
        Some(log_id(2, 8))
    );

    // Truncating past the end is a no-op; truncating everything leaves no entry.
    store.truncate(log_id(2, 100)).await.expect("truncate");
    assert_eq!(read_all(&mut store).await.len(), 8);
    store.truncate(log_id(1, 1)).await.expect("truncate");
    assert!(read_all(&mut store).await.is_empty());
    assert_eq!(
        store.get_log_state().await.expect("state").last_log_id,
        None
    );
}

#[tokio::test]
async fn purge_everything_keeps_the_last_purged_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut store = Store::open(dir.path()).expect("open");
        store
            .blocking_append(entries(1, 1..=5))
            .await
            .expect("append");
        store.purge(log_id(1, 2)).await.expect("purge");
        assert_eq!(
            indexes(&read_all(&mut store).await),
            (3..=5).collect::<Vec<_>>()
        );

        // Purging beyond the last entry (as after installing a snapshot) removes everything.
        store.purge(log_id(3, 9)).await.expect("purge");
        assert!(read_all(&mut store).await.is_empty());
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(3, 9)));
        assert_eq!(state.last_log_id, Some(log_id(3, 9)));
    }
    let mut store = Store::open(dir.path()).expect("reopen");
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(3, 9)));
    assert_eq!(state.last_log_id, Some(log_id(3, 9)));

    // The log goes on after the purged id.
    store
        .blocking_append(entries(3, 10..=11))
        .await
        .expect("append");
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(3, 9)));
    assert_eq!(state.last_log_id, Some(log_id(3, 11)));
}

#[tokio::test]
#[allow(clippy::reversed_empty_ranges)]
async fn reader_sees_later_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path()).expect("open");
    let mut reader = store.get_log_reader().await;
    store
        .blocking_append(entries(1, 1..=3))
        .await
        .expect("append");
    assert_eq!(
        indexes(&reader.try_get_log_entries(1..=3).await.expect("read")),
        vec![1, 2, 3]
    );
    store.truncate(log_id(1, 2)).await.expect("truncate");
    assert_eq!(
        indexes(&reader.try_get_log_entries(..).await.expect("read")),
        vec![1]
    );
    assert!(reader
        .try_get_log_entries(5..2)
        .await
        .expect("empty range")
        .is_empty());
}

#[tokio::test]
async fn corrupted_entry_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut store = Store::open(dir.path()).expect("open");
        store
            .blocking_append(entries(1, 1..=3))
            .await
            .expect("append");
    }
    poke_log(dir.path(), 2, b"\xff\xff\xff\xff garbage");
    poke_log(dir.path(), 3, &huge_length_prefix());

    let mut store = Store::open(dir.path()).expect("reopen");
    assert_eq!(
        indexes(
            &store
                .try_get_log_entries(1..2)
                .await
                .expect("entry 1 is fine")
        ),
        vec![1]
    );
    let err = store
        .try_get_log_entries(1..=2)
        .await
        .expect_err("entry 2 is garbage");
    assert!(err.to_string().contains(WAL_DIR_NAME), "{err}");
    store
        .try_get_log_entries(3..=3)
        .await
        .expect_err("entry 3 claims a huge length");
    store
        .get_log_state()
        .await
        .expect_err("the last entry is corrupted");
}

#[tokio::test]
async fn a_record_claiming_more_than_the_limit_is_refused_before_anything_is_allocated() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut store = Store::open(dir.path()).expect("open");
        store
            .blocking_append(entries(1, 1..=1))
            .await
            .expect("append");
        // On disk before the next write starts, so that the two are separate writes.
        let durability = store.durability();
        durability
            .wait_log(durability.generation(), 1)
            .await
            .expect("durable");
        store
            .blocking_append(entries(1, 2..=2))
            .await
            .expect("append");
    }
    // The first record's length field (bytes 8..12) claims 4 GiB; a later write follows it.
    let segment = segment_file(dir.path());
    let mut bytes = std::fs::read(&segment).expect("read");
    bytes[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&segment, bytes).expect("write");
    let error = Store::open(dir.path()).expect_err("damaged");
    let text = error.to_string();
    assert!(text.contains("length over the limit"), "{text}");
    assert!(text.contains("move the data directory away"), "{text}");
    assert!(MAX_ENTRY_BYTES < u32::MAX as usize);
}

#[tokio::test]
async fn a_corrupted_vote_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(Store::open(dir.path()).expect("open"));
    poke_meta(dir.path(), KEY_VOTE, &huge_length_prefix());
    let mut store = Store::open(dir.path()).expect("reopen");
    store.read_vote().await.expect_err("corrupted vote");
}

/// Sets the version field of the log record at `offset` of `segment` and mends its checksum,
/// as a newer build would have written it.
fn restamp_record(segment: &Path, offset: usize, version: u16) {
    let mut bytes = std::fs::read(segment).expect("read");
    let record = &mut bytes[offset..];
    let len = u32::from_le_bytes(record[8..12].try_into().expect("4 bytes")) as usize;
    record[5..7].copy_from_slice(&version.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&record[4..28]);
    crc.update(&record[40..40 + len]);
    record[28..32].copy_from_slice(&crc.finalize().to_le_bytes());
    std::fs::write(segment, bytes).expect("write");
}

#[tokio::test]
async fn values_of_a_newer_version_of_the_log_are_refused_naming_both_versions() {
    // Proves that an entry or a vote written by a build with a newer Raft log encoding is not
    // read as this build's: reading it fails, naming both versions, the file and what to do,
    // while the entries before it still read.
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut store = Store::open(dir.path()).expect("open");
        store
            .blocking_append(entries(1, 1..=2))
            .await
            .expect("append");
        store
            .save_vote(&Vote::new_committed(1, 1))
            .await
            .expect("vote");
    }
    let segment = segment_file(dir.path());
    let first_len = u32::from_le_bytes(
        std::fs::read(&segment).expect("read")[8..12]
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    let newer = RAFT_LOG.current + 1;
    restamp_record(&segment, (40 + first_len).div_ceil(8) * 8, newer);
    poke_meta(dir.path(), version_key(KEY_VOTE), &newer.to_le_bytes());

    let mut store = Store::open(dir.path()).expect("reopen");
    store
        .try_get_log_entries(1..=2)
        .await
        .expect_err("a read of both fails whole");
    let first = store
        .try_get_log_entries(1..=1)
        .await
        .expect("the first entry is of this version");
    assert_eq!(first, entries(1, 1..=1));
    let expected = [
        format!("version {newer} of the Raft log"),
        "written by a newer build".to_string(),
    ];
    let error = store
        .try_get_log_entries(2..=2)
        .await
        .expect_err("the newer entry is refused")
        .to_string();
    for part in expected.iter().chain([&WAL_DIR_NAME.to_string()]) {
        assert!(error.contains(part.as_str()), "{error}");
    }
    let error = store
        .read_vote()
        .await
        .expect_err("the newer vote is refused")
        .to_string();
    for part in expected.iter().chain([&DB_FILE_NAME.to_string()]) {
        assert!(error.contains(part.as_str()), "{error}");
    }
}

#[tokio::test]
async fn committed_survives_reopen_and_a_torn_save() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id = |index| LogId::new(CommittedLeaderId::new(1, 0), index);
    let mut store = Store::open(dir.path()).expect("open");
    assert_eq!(store.read_committed().await.expect("read"), None);
    store.save_committed(Some(id(7))).await.expect("save");
    store.save_committed(Some(id(8))).await.expect("save");
    drop(store);
    let mut store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.read_committed().await.expect("read"), Some(id(8)));
    drop(store);
    // Tear the last save, as a crash during its write would: the one before remains.
    let segment = segment_file(dir.path());
    flip_byte(&segment, last_written_byte(&segment));
    let mut store = Store::open(dir.path()).expect("reopen after a torn save");
    assert_eq!(store.read_committed().await.expect("read"), Some(id(7)));
}

#[tokio::test]
async fn oversized_entry_is_refused_on_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path()).expect("open");
    store
        .blocking_append(entries(1, 1..=2))
        .await
        .expect("append");
    let big = Entry {
        log_id: log_id(1, 3),
        payload: EntryPayload::Normal(TestRequest("x".repeat(MAX_ENTRY_BYTES + 1))),
    };
    store
        .blocking_append([normal(1, 3, "fits"), big])
        .await
        .expect_err("too big");
    // Nothing of the refused batch was written.
    assert_eq!(indexes(&read_all(&mut store).await), vec![1, 2]);
}

#[tokio::test]
async fn open_errors_name_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = Store::open(dir.path()).expect("open");
    let err = Store::open(dir.path()).expect_err("already open");
    assert!(err.to_string().contains(DB_FILE_NAME), "{err}");

    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    let err = Store::open(&file).expect_err("data dir is a file");
    assert!(err.to_string().contains("not-a-dir"), "{err}");

    let junk = tempfile::tempdir().expect("tempdir");
    std::fs::write(junk.path().join(DB_FILE_NAME), vec![7u8; 8192]).expect("write");
    let err = Store::open(junk.path()).expect_err("not a redb file");
    assert!(err.to_string().contains(DB_FILE_NAME), "{err}");
}

#[tokio::test]
async fn membership_entries_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path()).expect("open");
    let members = std::collections::BTreeMap::from([
        (1u64, BasicNode::new("127.0.0.1:7001")),
        (2u64, BasicNode::new("127.0.0.1:7002")),
    ]);
    let entry = Entry::<TestConfig> {
        log_id: log_id(1, 1),
        payload: EntryPayload::Membership(Membership::from(members)),
    };
    let blank = Entry::<TestConfig> {
        log_id: log_id(1, 2),
        payload: EntryPayload::Blank,
    };
    store
        .blocking_append([entry.clone(), blank.clone()])
        .await
        .expect("append");
    assert_eq!(read_all(&mut store).await, vec![entry, blank]);
}
