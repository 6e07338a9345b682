//! Tests of what waits for the disk now that the log store lets openraft go on before an
//! append is synced (`store::log_writer`): appended entries are readable at once, while the
//! committed id, a follower's answer to an AppendEntries and the commit index a leader sends
//! all wait for the entries to be durable.
//!
//! The disk is "stalled" with `Wal::stall`: the store's writer thread then waits, exactly as
//! it would for a slow fsync.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{
    BasicNode, CommittedLeaderId, Config, Entry, EntryPayload, LogId, RaftLogReader, Vote,
};
use quotient_coordinator::raft_service;
use quotient_coordinator::store::log_writer::NotDurable;
use quotient_coordinator::store::{self, LogStore, MemberId, Request, TypeConfig};
use quotient_core::Command;
use support::no_network::NoNetwork;

/// How long a stalled wait is watched to make sure it does not end.
const STALL: Duration = Duration::from_millis(300);
/// How long a released wait may take to end.
const RELEASE: Duration = Duration::from_secs(10);

fn log_id(term: u64, index: u64) -> LogId<MemberId> {
    LogId::new(CommittedLeaderId::new(term, 2), index)
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn blanks(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry<TypeConfig>> {
    indexes.map(|index| blank(term, index)).collect()
}

async fn read_indexes(store: &mut LogStore) -> Vec<u64> {
    store
        .try_get_log_entries(0..u64::MAX)
        .await
        .expect("read entries")
        .iter()
        .map(|entry| entry.log_id.index)
        .collect()
}

/// Closes `store`, opens the log again from `dir` and returns what it recovered: the entries'
/// indexes and the committed id.
async fn after_restart(
    store: LogStore,
    dir: &std::path::Path,
) -> (Vec<u64>, Option<LogId<MemberId>>) {
    drop(store);
    let mut store = LogStore::open(dir).expect("reopen");
    let committed = store.read_committed().await.expect("read committed");
    (read_indexes(&mut store).await, committed)
}

/// Whether `future` is still pending after [`STALL`].
async fn stays_pending<F: std::future::Future>(future: &mut std::pin::Pin<Box<F>>) -> bool {
    tokio::time::timeout(STALL, future.as_mut()).await.is_err()
}

#[tokio::test]
async fn appended_entries_are_readable_at_once_and_the_committed_id_waits_for_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = LogStore::open(dir.path()).expect("open");
    let durability = store.durability();

    tracing::info!("--- the disk stalls; an append returns and is readable");
    let stalled = store.clone();
    let stall = stalled.wal().stall();
    store
        .blocking_append(blanks(1, 0..=2))
        .await
        .expect("append returns without the disk");
    assert_eq!(read_indexes(&mut store).await, vec![0, 1, 2]);
    assert_eq!(
        durability.durable().last_index,
        None,
        "nothing is on disk yet"
    );

    tracing::info!("--- the committed id, an entry's durability and the commit to send all wait");
    let mut committed_saved = Box::pin({
        let mut store = store.clone();
        async move { store.save_committed(Some(log_id(1, 2))).await }
    });
    assert!(stays_pending(&mut committed_saved).await);
    let mut entries_durable = Box::pin(durability.wait_log(durability.generation(), 2));
    assert!(stays_pending(&mut entries_durable).await);
    assert_eq!(durability.commit_to_send(Some(log_id(1, 2))), None);

    tracing::info!("--- the disk comes back");
    drop(stall);
    drop(stalled);
    tokio::time::timeout(RELEASE, committed_saved)
        .await
        .expect("the committed id is saved")
        .expect("save");
    tokio::time::timeout(RELEASE, entries_durable)
        .await
        .expect("the entries are durable")
        .expect("durable");
    let durable = durability.durable();
    assert_eq!(durable.last_index, Some(2));
    assert_eq!(durable.committed, Some(log_id(1, 2)));
    assert_eq!(
        durability.commit_to_send(Some(log_id(1, 5))),
        Some(log_id(1, 2)),
        "a leader never tells more than its disk holds"
    );
    assert_eq!(
        durability.commit_to_send(Some(log_id(1, 1))),
        Some(log_id(1, 1))
    );

    tracing::info!("--- all of it survives a restart");
    assert_eq!(
        after_restart(store, dir.path()).await,
        (vec![0, 1, 2], Some(log_id(1, 2)))
    );
}

#[tokio::test]
async fn a_truncation_supersedes_a_wait_for_the_entries_it_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = LogStore::open(dir.path()).expect("open");
    let durability = store.durability();
    let stalled = store.clone();
    let stall = stalled.wal().stall();
    store
        .blocking_append(blanks(1, 0..=4))
        .await
        .expect("append");
    let before = durability.generation();
    let mut old_entries = Box::pin(durability.wait_log(before, 4));
    let mut truncated = Box::pin({
        let mut store = store.clone();
        async move { store.truncate(log_id(1, 3)).await }
    });
    assert!(stays_pending(&mut truncated).await);
    assert!(durability.generation() > before);
    assert_eq!(
        read_indexes(&mut store).await,
        vec![0, 1, 2],
        "a queued truncation hides the entries it removes at once"
    );

    drop(stall);
    drop(stalled);
    tokio::time::timeout(RELEASE, truncated)
        .await
        .expect("the truncation lands")
        .expect("truncate");
    let waited = tokio::time::timeout(RELEASE, old_entries.as_mut())
        .await
        .expect("the wait ends");
    assert_eq!(waited, Err(NotDurable::Superseded));

    tracing::info!("--- entries of a new term in their place are durable in the new generation");
    let now = durability.generation();
    store
        .blocking_append(blanks(2, 3..=3))
        .await
        .expect("append");
    tokio::time::timeout(RELEASE, durability.wait_log(now, 3))
        .await
        .expect("the new entry is durable")
        .expect("durable");
    let entries = store.try_get_log_entries(3..4).await.expect("read");
    assert_eq!(entries[0].log_id, log_id(2, 3));
}

#[tokio::test]
async fn writes_queued_together_share_one_sync() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = LogStore::open(dir.path()).expect("open");
    store
        .blocking_append(blanks(1, 0..=3))
        .await
        .expect("append");
    store
        .save_committed(Some(log_id(1, 1)))
        .await
        .expect("a committed id alone");

    tracing::info!("--- appends and a commit queued while the disk is busy go out together");
    let before = store.wal().sync_count();
    let stalled = store.clone();
    let stall = stalled.wal().stall();
    store
        .blocking_append(blanks(1, 4..=5))
        .await
        .expect("append");
    let saved = {
        let mut store = store.clone();
        tokio::spawn(async move { store.save_committed(Some(log_id(1, 4))).await })
    };
    store
        .blocking_append(blanks(1, 6..=6))
        .await
        .expect("append");
    tokio::time::sleep(STALL).await;
    drop(stall);
    drop(stalled);
    tokio::time::timeout(RELEASE, saved)
        .await
        .expect("saved in time")
        .expect("task")
        .expect("save");
    tokio::time::timeout(RELEASE, store.durability().wait_log(0, 6))
        .await
        .expect("durable in time")
        .expect("durable");
    let syncs = store.wal().sync_count() - before;
    assert!(
        syncs <= 2,
        "three queued writes took {syncs} syncs; the writer batches what queued up (at most \
         one write was taken before the stall began)"
    );

    tracing::info!("--- both survive a restart");
    assert_eq!(
        after_restart(store, dir.path()).await,
        (vec![0, 1, 2, 3, 4, 5, 6], Some(log_id(1, 4)))
    );
}

#[tokio::test]
async fn a_follower_answers_an_append_only_once_its_entries_are_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, state_machine) = store::open(dir.path()).expect("open");
    let durability = log.durability();
    let config = Config::default().validate().expect("config");
    let raft = openraft::Raft::new(1, config.into(), NoNetwork, log.clone(), state_machine)
        .await
        .expect("raft");
    let leader = Vote::new_committed(1, 2);
    let request =
        |prev: Option<LogId<MemberId>>, entries: Vec<Entry<TypeConfig>>| AppendEntriesRequest::<
            TypeConfig,
        > {
            vote: leader,
            prev_log_id: prev,
            entries,
            leader_commit: None,
        };

    tracing::info!("--- the leader's vote is saved with an empty append");
    let answer = raft_service::append_entries(&raft, &durability, request(None, Vec::new()))
        .await
        .expect("answered");
    assert_eq!(answer.expect("accepted"), AppendEntriesResponse::Success);

    tracing::info!("--- with the disk stalled, Raft takes the entries but no answer leaves");
    let stalled = log.clone();
    let stall = stalled.wal().stall();
    let mut answer = Box::pin({
        let raft = raft.clone();
        let durability = durability.clone();
        async move {
            raft_service::append_entries(&raft, &durability, request(None, blanks(1, 0..=1))).await
        }
    });
    assert!(stays_pending(&mut answer).await);
    assert_eq!(
        raft.metrics().borrow().last_log_index,
        Some(1),
        "Raft accepted the entries; only the answer waits"
    );

    tracing::info!("--- the disk comes back, and so does the answer");
    drop(stall);
    drop(stalled);
    let answer = tokio::time::timeout(RELEASE, answer)
        .await
        .expect("answered in time")
        .expect("answered");
    assert_eq!(answer.expect("accepted"), AppendEntriesResponse::Success);
    assert_eq!(durability.durable().last_index, Some(1));
    raft.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_committed_id_waits_for_its_entries_not_for_a_sync_of_its_own() {
    // Proves a write's acknowledgement waits for no second sync: once the entries are durable,
    // saving the committed id returns without writing anything, the commit may be sent to
    // followers at once, and the id itself reaches the disk with the next write.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = LogStore::open(dir.path()).expect("open");
    let durability = store.durability();
    store
        .blocking_append(blanks(1, 0..=3))
        .await
        .expect("append");
    tokio::time::timeout(RELEASE, durability.wait_log(durability.generation(), 3))
        .await
        .expect("durable in time")
        .expect("durable");
    let before = store.wal().sync_count();
    tokio::time::timeout(RELEASE, store.save_committed(Some(log_id(1, 3))))
        .await
        .expect("saved at once")
        .expect("save");
    assert_eq!(
        store.wal().sync_count(),
        before,
        "the committed id took a sync of its own"
    );
    assert_eq!(
        durability.commit_to_send(Some(log_id(1, 3))),
        Some(log_id(1, 3))
    );

    tracing::info!("--- the next write carries it");
    store
        .blocking_append(blanks(1, 4..=4))
        .await
        .expect("append");
    tokio::time::timeout(RELEASE, durability.wait_log(durability.generation(), 4))
        .await
        .expect("durable in time")
        .expect("durable");
    assert_eq!(store.wal().sync_count(), before + 1);
    assert_eq!(
        after_restart(store, dir.path()).await,
        (vec![0, 1, 2, 3, 4], Some(log_id(1, 3)))
    );
}

/// A single-member Raft on `log` and `state_machine`, with no network.
async fn start_raft(
    log: LogStore,
    state_machine: store::QuotientStateMachine,
) -> store::type_config::Raft {
    let config = Config {
        cluster_name: "quotient-test".to_string(),
        ..Config::default()
    }
    .validate()
    .expect("config");
    openraft::Raft::new(1, config.into(), NoNetwork, log, state_machine)
        .await
        .expect("raft")
}

fn check() -> Request {
    Request::one(Command::CheckDigest { leader: None }, 1_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_lost_unsynced_entries_comes_back_in_a_new_term() {
    // Proves that a leader whose last entries never reached its disk (a crash, or a full
    // disk, while it sent them) does not lead the same term again when it restarts: the
    // next entry at the index it lost gets a log id of a new term, never the lost entry's
    // log id with other contents, which a follower holding the lost entry would take for the
    // same entry (quotient-chaos found replicas that parted this way).
    let dir = tempfile::tempdir().expect("tempdir");
    let image = tempfile::tempdir().expect("tempdir");
    let (log, state_machine) = store::open(dir.path()).expect("open the stores");
    let raft = start_raft(log.clone(), state_machine).await;
    raft.initialize(BTreeMap::from([(1u64, BasicNode::new("127.0.0.1:0"))]))
        .await
        .expect("initialize");
    raft.wait(Some(RELEASE))
        .current_leader(1, "leader elected")
        .await
        .expect("leader");
    let durable = raft.client_write(check()).await.expect("a durable write");
    let term = durable.log_id.leader_id.term;

    tracing::info!("--- the disk stalls while the leader appends its next entry");
    let stall = log.wal().stall();
    let lost_index = durable.log_id.index + 1;
    let pending = tokio::spawn({
        let raft = raft.clone();
        async move { raft.client_write(check()).await }
    });
    // The entry reaches the log's in-memory tail (the store's readers see it); a lone
    // member's core then waits in `save_committed` for the disk, so its metrics lag.
    let mut reader = log.clone();
    let appended = tokio::time::timeout(RELEASE, async {
        while read_indexes(&mut reader).await.last() != Some(&lost_index) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    appended.await.expect("the entry is in the leader's log");
    // What the disk holds at this moment: the leader crashing now would come back to this.
    support::copy_dir(dir.path(), image.path());
    drop(stall);
    tokio::time::timeout(RELEASE, pending)
        .await
        .expect("the write ends once the disk is back")
        .expect("joined")
        .expect("written");
    raft.shutdown().await.expect("shutdown");
    drop(log);

    tracing::info!("--- restarted on the crash image, it campaigns in a new term");
    let (mut log, state_machine) = store::open(image.path()).expect("open the image");
    assert!(
        store::resume_as_follower(&mut log, 1)
            .await
            .expect("vote saved"),
        "the member led when it stopped"
    );
    let vote = log.read_vote().await.expect("vote").expect("a vote");
    assert!(!vote.is_committed(), "{vote}");
    let raft = start_raft(log.clone(), state_machine).await;
    assert_eq!(
        read_indexes(&mut log).await.last(),
        Some(&durable.log_id.index),
        "the image lacks the entry the disk never got"
    );
    raft.wait(Some(RELEASE))
        .current_leader(1, "leader again")
        .await
        .expect("leader");
    let next = raft.client_write(check()).await.expect("a write");
    assert!(next.log_id.index >= lost_index, "{next:?}");
    let at_lost = log
        .try_get_log_entries(lost_index..=lost_index)
        .await
        .expect("read")
        .pop()
        .expect("the lost index holds an entry again");
    assert!(
        at_lost.log_id.leader_id.term > term,
        "the entry at the lost index has the log id {} of the old term {term}",
        at_lost.log_id
    );
    raft.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_log_that_lost_committed_records_is_refused_and_a_shorter_uncommitted_tail_is_not() {
    // Proves the committed mark kept beside the vote shows a loss the segment files alone
    // cannot: a log that ends before what this member had committed does not open (found by
    // probing the files on disk: whole records cut on a 4 KiB boundary, or a segment file
    // removed, read as a shorter log). Entries past the mark that a leader truncates away
    // leave a log that opens.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = LogStore::open(dir.path()).expect("open");
    store
        .blocking_append(blanks(1, 0..=20))
        .await
        .expect("append");
    store
        .save_committed(Some(log_id(1, 20)))
        .await
        .expect("save committed");
    // The committed id, and the mark with it, are written with the next write.
    store
        .blocking_append(blanks(1, 21..=30))
        .await
        .expect("append");
    store.truncate(log_id(1, 25)).await.expect("truncate");
    drop(store);

    tracing::info!("--- an uncommitted tail truncated: the log opens");
    let store = LogStore::open(dir.path()).expect("a log past its mark opens");
    drop(store);

    tracing::info!("--- the log directory is lost, the vote and the mark kept");
    std::fs::remove_dir_all(dir.path().join(store::wal::WAL_DIR_NAME)).expect("remove the log");
    let error = LogStore::open(dir.path())
        .expect_err("a log that lost committed records does not open")
        .to_string();
    assert!(
        error.contains("committed entries up to index 20")
            && error.contains("records were lost")
            && error.contains("add-member"),
        "{error}"
    );
}
