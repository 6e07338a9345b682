//! Tests of the state machine adapter over `quotient_core`: what applying each kind of entry
//! yields, that the snapshot file brings the state back after a restart (and that a bad one or
//! one of a newer version is refused, and a temporary file left by an unfinished write is
//! removed), and, end to end, that a single-node Raft cluster on the real stores recovers its
//! state from snapshot plus log after it is shut down and started again.

mod support;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    BasicNode, CommittedLeaderId, EntryPayload, LogId, Membership, RaftLogReader,
    RaftSnapshotBuilder, SnapshotMeta, StoredMembership,
};
use quotient_common::version::{SNAPSHOT_FILE, SNAPSHOT_STATE};
use quotient_common::{GpuClass, GpuDevice, NodeInventory};
use quotient_coordinator::applied::AppliedChanges;
use quotient_coordinator::store::state_machine::{
    snapshot_piece, write_restored_snapshot, SNAPSHOT_FILE_NAME, SNAPSHOT_TMP_FILE_NAME,
};
use quotient_coordinator::store::type_config::{Entry, Raft};
use quotient_coordinator::store::{self, QuotientStateMachine, Request};
use quotient_core::{Changes, Command, NodeId, Outcome, State};
use support::no_network::NoNetwork;

const TIMEOUT: Duration = Duration::from_secs(10);

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn inventory(name: &str) -> NodeInventory {
    NodeInventory {
        name: name.to_string(),
        host: quotient_common::HostInfo::process_only(),
        gpus: vec![GpuDevice {
            index: 0,
            uuid: format!("GPU-{name}-0"),
            class: GpuClass::parse("h100-80gb").expect("class"),
            healthy: true,
            nvlink_peers: 0,
        }],
    }
}

fn register(name: &str, time_ms: u64) -> Request {
    Request::one(Command::RegisterNode(inventory(name)), time_ms)
}

fn normal(index: u64, request: Request) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(request),
    }
}

fn membership(index: u64) -> (Entry, Membership<u64, BasicNode>) {
    let m = Membership::from(BTreeMap::from([(1u64, BasicNode::new("127.0.0.1:7001"))]));
    let entry = Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Membership(m.clone()),
    };
    (entry, m)
}

fn has_node(sm: &QuotientStateMachine, name: &str) -> bool {
    sm.read(|state| state.node_by_name(name).is_some())
}

fn state_bytes(sm: &QuotientStateMachine) -> Vec<u8> {
    sm.read(State::to_snapshot_bytes)
}

#[tokio::test]
async fn apply_yields_outcomes_and_tracks_applied_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sm = QuotientStateMachine::open(dir.path()).expect("open");
    assert_eq!(
        sm.applied_state().await.expect("state"),
        (None, StoredMembership::default())
    );

    let (member_entry, m) = membership(2);
    let blank = Entry {
        log_id: log_id(1, 1),
        payload: EntryPayload::Blank,
    };
    let outcomes = sm
        .apply([
            blank,
            member_entry,
            normal(3, register("gpu-a", 1_000)),
            normal(
                4,
                Request::one(
                    Command::CordonNode {
                        node: "no-such-node".to_string(),
                    },
                    2_000,
                ),
            ),
        ])
        .await
        .expect("apply");
    assert_eq!(outcomes.len(), 4);
    assert_eq!(outcomes[0], vec![Outcome::Done]);
    assert_eq!(outcomes[1], vec![Outcome::Done]);
    assert!(
        matches!(outcomes[2][..], [Outcome::NodeRegistered { .. }]),
        "{:?}",
        outcomes[2]
    );
    assert!(outcomes[3][0].is_rejected(), "{:?}", outcomes[3]);

    let (last_applied, last_membership) = sm.applied_state().await.expect("state");
    assert_eq!(last_applied, Some(log_id(1, 4)));
    assert_eq!(
        last_membership,
        StoredMembership::new(Some(log_id(1, 2)), m)
    );
    assert_eq!(sm.last_applied(), Some(log_id(1, 4)));
    assert!(has_node(&sm, "gpu-a"));
    assert_eq!(sm.read(|s| s.data().last_applied_index), 4);
}

#[tokio::test]
async fn snapshot_file_restores_state_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (expected_meta, expected_bytes) = {
        let mut sm = QuotientStateMachine::open(dir.path()).expect("open");
        let (member_entry, _) = membership(1);
        sm.apply([member_entry, normal(2, register("gpu-a", 1_000))])
            .await
            .expect("apply");
        let snapshot = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 2)));
        assert_eq!(snapshot.snapshot.get_ref(), &state_bytes(&sm));
        // Applied after the snapshot: only the log would bring this back.
        sm.apply([normal(3, register("gpu-b", 2_000))])
            .await
            .expect("apply");
        (snapshot.meta, snapshot.snapshot.into_inner())
    };
    assert!(dir.path().join(SNAPSHOT_FILE_NAME).exists());
    assert!(!dir.path().join("snapshot.bin.tmp").exists());

    let mut sm = QuotientStateMachine::open(dir.path()).expect("reopen");
    let (last_applied, last_membership) = sm.applied_state().await.expect("state");
    assert_eq!(last_applied, expected_meta.last_log_id);
    assert_eq!(last_membership, expected_meta.last_membership);
    assert!(has_node(&sm, "gpu-a"));
    assert!(!has_node(&sm, "gpu-b"));
    assert_eq!(state_bytes(&sm), expected_bytes);

    let current = sm
        .get_current_snapshot()
        .await
        .expect("read")
        .expect("a snapshot");
    assert_eq!(current.meta, expected_meta);
    assert_eq!(current.snapshot.into_inner(), expected_bytes);
    // The first answer came from the copy `open` kept; the next is read from the file.
    let again = sm
        .get_current_snapshot()
        .await
        .expect("read")
        .expect("a snapshot");
    assert_eq!(again.meta, expected_meta);
    assert_eq!(again.snapshot.into_inner(), expected_bytes);

    // Reopened, and a newer snapshot written before anyone asked: the copy `open` kept is
    // not the current snapshot any more.
    let mut sm = QuotientStateMachine::open(dir.path()).expect("reopen");
    sm.apply([normal(3, register("gpu-b", 2_000))])
        .await
        .expect("apply");
    let newer = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
    assert_eq!(newer.meta.last_log_id, Some(log_id(1, 3)));
    let current = sm
        .get_current_snapshot()
        .await
        .expect("read")
        .expect("a snapshot");
    assert_eq!(current.meta, newer.meta);
    assert_eq!(current.snapshot.into_inner(), newer.snapshot.into_inner());
}

#[tokio::test]
async fn a_snapshot_read_in_pieces_restores_the_same_state_under_new_members() {
    // Proves the backup path: the snapshot file read back piece by piece (pieces of 7 bytes, so
    // every boundary is crossed) is the whole file, and a restore of it gives the same state
    // and log id, with the members the restore names as the only voters.
    let dir = tempfile::tempdir().expect("tempdir");
    write_a_snapshot_of_gpu_a(dir.path()).await;
    let sm = QuotientStateMachine::open(dir.path()).expect("open");
    let whole = std::fs::read(dir.path().join(SNAPSHOT_FILE_NAME)).expect("the file");
    let mut read = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    while (read.len() as u64) < whole.len() as u64 {
        let piece = snapshot_piece(dir.path(), read.len() as u64, 7)
            .expect("a piece")
            .expect("a snapshot");
        assert_eq!(piece.total_bytes, whole.len() as u64);
        assert_eq!(piece.last_log_index, 1);
        assert!(!piece.data.is_empty());
        ids.insert(piece.snapshot_id);
        read.extend_from_slice(&piece.data);
    }
    assert_eq!(read, whole);
    assert_eq!(ids.len(), 1, "{ids:?}");

    let restored = tempfile::tempdir().expect("tempdir");
    let members: BTreeMap<u64, BasicNode> =
        [(7, BasicNode::new("a:1")), (8, BasicNode::new("b:1"))]
            .into_iter()
            .collect();
    let last = write_restored_snapshot(restored.path(), read, members).expect("restored");
    assert_eq!(last, log_id(1, 1));
    let mut back = QuotientStateMachine::open(restored.path()).expect("open the restored");
    let (applied, membership) = back.applied_state().await.expect("state");
    assert_eq!(applied, Some(log_id(1, 1)));
    let voters: Vec<u64> = membership.membership().voter_ids().collect();
    assert_eq!(voters, vec![7, 8]);
    assert_eq!(state_bytes(&back), state_bytes(&sm));
    assert!(has_node(&back, "gpu-a"));
    assert!(
        write_restored_snapshot(restored.path(), b"QSNAP002".to_vec(), BTreeMap::new()).is_err()
    );
}

#[tokio::test]
async fn install_snapshot_replaces_state_and_persists() {
    let leader_dir = tempfile::tempdir().expect("tempdir");
    let follower_dir = tempfile::tempdir().expect("tempdir");
    let mut leader = QuotientStateMachine::open(leader_dir.path()).expect("open");
    let mut follower = QuotientStateMachine::open(follower_dir.path()).expect("open");
    follower
        .apply([normal(1, register("stale", 500))])
        .await
        .expect("apply");

    let (member_entry, _) = membership(1);
    leader
        .apply([
            member_entry,
            normal(2, register("gpu-a", 1_000)),
            normal(3, register("gpu-b", 1_500)),
        ])
        .await
        .expect("apply");
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");

    let mut receiving = follower.begin_receiving_snapshot().await.expect("begin");
    *receiving = *snapshot.snapshot.clone();
    follower
        .install_snapshot(&snapshot.meta, receiving)
        .await
        .expect("install");
    assert_eq!(state_bytes(&follower), state_bytes(&leader));
    assert!(!has_node(&follower, "stale"));
    assert_eq!(
        follower.applied_state().await.expect("state").0,
        Some(log_id(1, 3))
    );
    drop(follower);

    let follower = QuotientStateMachine::open(follower_dir.path()).expect("reopen");
    assert_eq!(state_bytes(&follower), state_bytes(&leader));
    assert_eq!(follower.last_applied(), Some(log_id(1, 3)));
}

#[tokio::test]
async fn bad_snapshot_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sm = QuotientStateMachine::open(dir.path()).expect("open");
    sm.apply([normal(1, register("gpu-a", 1_000))])
        .await
        .expect("apply");
    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
    let before = state_bytes(&sm);
    let on_disk = std::fs::read(dir.path().join(SNAPSHOT_FILE_NAME)).expect("read");

    let meta = SnapshotMeta {
        last_log_id: Some(log_id(2, 9)),
        last_membership: StoredMembership::default(),
        snapshot_id: "garbage".to_string(),
    };
    let garbage = Box::new(Cursor::new(vec![0xffu8; 64]));
    let err = sm
        .install_snapshot(&meta, garbage)
        .await
        .expect_err("garbage snapshot");
    assert!(err.to_string().contains(SNAPSHOT_FILE_NAME), "{err}");
    assert_eq!(state_bytes(&sm), before);
    assert_eq!(sm.last_applied(), built.meta.last_log_id);
    assert_eq!(
        std::fs::read(dir.path().join(SNAPSHOT_FILE_NAME)).expect("read"),
        on_disk
    );
}

fn write_snapshot_file(dir: &Path, bytes: &[u8]) {
    std::fs::write(dir.join(SNAPSHOT_FILE_NAME), bytes).expect("write");
}

/// Leaves in `dir` a snapshot file of a state that holds node gpu-a.
async fn write_a_snapshot_of_gpu_a(dir: &Path) {
    let mut sm = QuotientStateMachine::open(dir).expect("open");
    sm.apply([normal(1, register("gpu-a", 1_000))])
        .await
        .expect("apply");
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
}

#[tokio::test]
async fn corrupted_snapshot_file_is_an_error_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_a_snapshot_of_gpu_a(dir.path()).await;
    let good = std::fs::read(dir.path().join(SNAPSHOT_FILE_NAME)).expect("read");

    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", good[..good.len() - 1].to_vec()),
        ("extended", [good.as_slice(), &[0]].concat()),
        ("bad magic", [b"XXXXXXXX".as_slice(), &good[8..]].concat()),
    ];
    // A header claiming a huge metadata length must be refused before any allocation.
    let mut huge = good.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(("huge length", huge));
    // Valid framing, but the state bytes are not a state: their header is gone. (Flipping
    // the last bytes no longer does it: the state now ends with a time, which any bytes
    // encode.)
    let mut bad_state = good.clone();
    let header = [
        quotient_core::SNAPSHOT_STATE_MAGIC.as_slice(),
        &quotient_common::version::SNAPSHOT_STATE
            .current
            .to_le_bytes(),
    ]
    .concat();
    let at = bad_state
        .windows(header.len())
        .rposition(|window| window == header.as_slice())
        .expect("the state's header in the file");
    bad_state[at] ^= 0xff;
    cases.push(("bad state", bad_state));

    for (what, bytes) in cases {
        write_snapshot_file(dir.path(), &bytes);
        let err = QuotientStateMachine::open(dir.path()).expect_err(what);
        assert!(
            err.to_string().contains(SNAPSHOT_FILE_NAME),
            "{what}: {err}"
        );
    }

    write_snapshot_file(dir.path(), &good);
    let sm = QuotientStateMachine::open(dir.path()).expect("the good file loads again");
    assert!(has_node(&sm, "gpu-a"));
}

/// Runs `f` with the INFO-level log lines it emits collected; returns its result and them.
fn logged<R>(f: impl FnOnce() -> R) -> (R, String) {
    let lines = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink = Arc::clone(&lines);
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || LogSink(Arc::clone(&sink)))
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&lines.lock().expect("the log buffer")).into_owned();
    (result, text)
}

/// A log writer into a shared buffer.
struct LogSink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("the log buffer")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_snapshot_temporary_file_left_by_an_unfinished_write_is_removed_on_open() {
    // Proves that the half-written temporary file of a snapshot write that never finished (a
    // crash, a full disk) is removed, with an info line, when the data directory is opened
    // again, and that the snapshot beside it still loads.
    let dir = tempfile::tempdir().expect("tempdir");
    write_a_snapshot_of_gpu_a(dir.path()).await;
    let tmp = dir.path().join(SNAPSHOT_TMP_FILE_NAME);
    std::fs::write(&tmp, vec![0u8; 64 * 1024]).expect("a half-written snapshot");

    let (sm, log) =
        logged(|| QuotientStateMachine::open(dir.path()).expect("the data directory opens"));
    assert!(!tmp.exists(), "the temporary file is still there");
    assert!(has_node(&sm, "gpu-a"), "the snapshot still loads");
    assert!(
        log.contains("INFO") && log.contains(SNAPSHOT_TMP_FILE_NAME) && log.contains("65536"),
        "no info line names the removed file and its size: {log}"
    );

    // Opening a directory without one says nothing about it.
    let (_, log) = logged(|| QuotientStateMachine::open(dir.path()).expect("reopen"));
    assert!(!log.contains(SNAPSHOT_TMP_FILE_NAME), "{log}");
}

#[tokio::test]
async fn restart_recovers_from_snapshot_plus_log_at_store_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (member_entry, _) = membership(1);
    let entries = vec![
        member_entry,
        normal(2, register("gpu-a", 1_000)),
        normal(3, register("gpu-b", 2_000)),
        normal(4, register("gpu-c", 3_000)),
    ];
    let expected = {
        let (mut log, mut sm) = store::open(dir.path()).expect("open");
        log.blocking_append(entries.clone()).await.expect("append");
        log.save_committed(Some(log_id(1, 4)))
            .await
            .expect("committed");
        sm.apply(entries[..2].to_vec()).await.expect("apply");
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        sm.apply(entries[2..].to_vec()).await.expect("apply");
        log.purge(log_id(1, 2)).await.expect("purge");
        state_bytes(&sm)
    };

    // What openraft does on startup: load the snapshot, re-apply the committed log after it.
    let (mut log, mut sm) = store::open(dir.path()).expect("reopen");
    let applied = sm.applied_state().await.expect("state").0;
    assert_eq!(applied, Some(log_id(1, 2)));
    let committed = log.read_committed().await.expect("committed");
    assert_eq!(committed, Some(log_id(1, 4)));
    let start = applied.map_or(0, |id| id.index + 1);
    let end = committed.map_or(0, |id| id.index + 1);
    let replay = log.try_get_log_entries(start..end).await.expect("read");
    assert_eq!(replay.len(), 2);
    sm.apply(replay).await.expect("replay");
    assert_eq!(state_bytes(&sm), expected);
}

// ---------------------------------------------------------------------------------------------
// End to end: a single-node Raft cluster on the real stores, restarted.

async fn start_node(dir: &Path) -> (Raft, QuotientStateMachine) {
    let (log, sm) = store::open(dir).expect("open stores");
    let config = openraft::Config {
        cluster_name: "quotient-test".to_string(),
        ..openraft::Config::default()
    }
    .validate()
    .expect("config");
    let raft = Raft::new(1, Arc::new(config), NoNetwork, log, sm.clone())
        .await
        .expect("raft");
    (raft, sm)
}

/// A new single-member cluster on `dir`, once it has elected itself.
async fn start_leader(dir: &Path) -> (Raft, QuotientStateMachine) {
    let (raft, sm) = start_node(dir).await;
    raft.initialize(BTreeMap::from([(1u64, BasicNode::new("127.0.0.1:0"))]))
        .await
        .expect("initialize");
    raft.wait(Some(TIMEOUT))
        .current_leader(1, "leader elected")
        .await
        .expect("leader");
    (raft, sm)
}

async fn write(raft: &Raft, request: Request) -> Outcome {
    let mut outcomes = raft.client_write(request).await.expect("client write").data;
    assert_eq!(outcomes.len(), 1, "one outcome per command");
    outcomes.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_restart_recovers_from_snapshot_plus_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let expected = {
        let (raft, sm) = start_leader(dir.path()).await;

        let outcome = write(&raft, register("gpu-a", 1_000)).await;
        assert!(
            matches!(outcome, Outcome::NodeRegistered { .. }),
            "{outcome:?}"
        );
        raft.trigger().snapshot().await.expect("trigger snapshot");
        raft.wait(Some(TIMEOUT))
            .metrics(|m| m.snapshot.is_some(), "snapshot built")
            .await
            .expect("snapshot");
        let outcome = write(&raft, register("gpu-b", 2_000)).await;
        assert!(
            matches!(outcome, Outcome::NodeRegistered { .. }),
            "{outcome:?}"
        );
        assert!(has_node(&sm, "gpu-a") && has_node(&sm, "gpu-b"));
        let expected = (state_bytes(&sm), sm.last_applied());
        raft.shutdown().await.expect("shutdown");
        expected
    };

    let (raft, sm) = start_node(dir.path()).await;
    let want = expected.1.expect("something was applied");
    raft.wait(Some(TIMEOUT))
        .applied_index_at_least(Some(want.index), "log replayed after the snapshot")
        .await
        .expect("replay");
    assert_eq!(state_bytes(&sm), expected.0);
    assert!(has_node(&sm, "gpu-a") && has_node(&sm, "gpu-b"));

    // It is the leader again and takes writes.
    raft.wait(Some(TIMEOUT))
        .current_leader(1, "leader again")
        .await
        .expect("leader");
    let outcome = write(&raft, register("gpu-c", 3_000)).await;
    assert!(
        matches!(outcome, Outcome::NodeRegistered { .. }),
        "{outcome:?}"
    );
    raft.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn an_entry_of_several_commands_applies_them_in_order_with_one_outcome_each() {
    // Proves a batched entry (the proposer's) gives each command its own outcome, in order.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sm = QuotientStateMachine::open(dir.path()).expect("open");
    let request = Request {
        commands: vec![
            Command::RegisterNode(inventory("gpu-a")),
            Command::CordonNode {
                node: "no-such-node".to_string(),
            },
            Command::CordonNode {
                node: "gpu-a".to_string(),
            },
        ],
        time_ms: 1_000,
    };
    let outcomes = sm.apply([normal(1, request)]).await.expect("apply");
    assert_eq!(outcomes.len(), 1);
    let outcomes = &outcomes[0];
    assert!(
        matches!(
            outcomes[..],
            [
                Outcome::NodeRegistered { .. },
                Outcome::Rejected(_),
                Outcome::Done
            ]
        ),
        "{outcomes:?}"
    );
    assert!(has_node(&sm, "gpu-a"));
}

#[tokio::test]
async fn applying_names_what_changed_until_the_leader_drains_it_and_a_snapshot_install_means_everything(
) {
    // Proves the changes reach the leader from the state machine's apply: a fresh state
    // machine counts as everything changed; after a drain, the entries applied since name
    // exactly the nodes they changed (a rejected command none), across entries, until the
    // next drain; installing a snapshot makes it everything again.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sm = QuotientStateMachine::open(dir.path()).expect("open");
    let drain = |sm: &QuotientStateMachine| sm.read_changes(|_, changes| changes);
    assert_eq!(
        drain(&sm),
        AppliedChanges::Everything,
        "loaded, not applied"
    );
    assert!(drain(&sm).is_empty(), "drained");

    let (member_entry, _) = membership(1);
    let cordon_unknown = Request::one(
        Command::CordonNode {
            node: "no-such-node".to_string(),
        },
        1_500,
    );
    sm.apply([
        member_entry,
        normal(2, register("gpu-a", 1_000)),
        normal(3, cordon_unknown),
    ])
    .await
    .expect("apply");
    sm.apply([normal(4, register("gpu-b", 2_000))])
        .await
        .expect("apply");
    let ids: Vec<NodeId> = ["gpu-a", "gpu-b"]
        .iter()
        .map(|name| sm.read(|state| state.node_by_name(name).expect("registered").id))
        .collect();
    let expected = Changes {
        nodes: ids.into_iter().collect(),
        ..Changes::new()
    };
    assert_eq!(drain(&sm), AppliedChanges::Named(expected));
    assert!(drain(&sm).is_empty(), "each change is drained once");

    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build");
    let mut receiving = sm.begin_receiving_snapshot().await.expect("begin");
    *receiving = *snapshot.snapshot.clone();
    sm.install_snapshot(&snapshot.meta, receiving)
        .await
        .expect("install");
    assert_eq!(drain(&sm), AppliedChanges::Everything, "a snapshot install");
}

#[tokio::test]
async fn a_snapshot_file_of_a_newer_layout_or_state_is_refused_naming_both_versions() {
    // Proves a snapshot file written by a newer build is not misread: opening fails with the
    // file, both versions and what to do, whether its layout or the state in it is newer.
    let dir = tempfile::tempdir().expect("tempdir");
    write_a_snapshot_of_gpu_a(dir.path()).await;
    let path = dir.path().join(SNAPSHOT_FILE_NAME);
    let written = std::fs::read(&path).expect("read");
    assert_eq!(
        &written[..8],
        format!("QSNAP{:03}", SNAPSHOT_FILE.current).as_bytes()
    );

    let mut newer_layout = written.clone();
    newer_layout[5..8].copy_from_slice(format!("{:03}", SNAPSHOT_FILE.current + 1).as_bytes());
    std::fs::write(&path, &newer_layout).expect("write");
    let error = QuotientStateMachine::open(dir.path())
        .expect_err("a newer layout is refused")
        .to_string();
    assert!(
        error.contains(SNAPSHOT_FILE_NAME)
            && error.contains(&format!(
                "version {} of the snapshot file",
                SNAPSHOT_FILE.current + 1
            ))
            && error.contains("newer build"),
        "{error}"
    );

    // The state's own version is after the 24-byte header and the metadata.
    let meta_len = u64::from_le_bytes(written[8..16].try_into().expect("8 bytes")) as usize;
    let state_at = 24 + meta_len;
    assert_eq!(&written[state_at..state_at + 2], b"QS");
    let mut newer_state = written.clone();
    newer_state[state_at + 2..state_at + 4]
        .copy_from_slice(&(SNAPSHOT_STATE.current + 1).to_le_bytes());
    reseal(&mut newer_state);
    std::fs::write(&path, &newer_state).expect("write");
    let error = QuotientStateMachine::open(dir.path())
        .expect_err("a newer state is refused")
        .to_string();
    assert!(
        error.contains(&format!(
            "version {} of the snapshot state",
            SNAPSHOT_STATE.current + 1
        )),
        "{error}"
    );

    std::fs::write(&path, &written).expect("write");
    let sm = QuotientStateMachine::open(dir.path()).expect("this build's file opens");
    assert!(has_node(&sm, "gpu-a"));
}

/// A snapshot file with its checksum made again for `bytes` (the CRC32 of all but its last
/// four bytes, in them).
fn reseal(bytes: &mut [u8]) {
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
}

#[tokio::test]
async fn a_snapshot_file_changed_on_disk_is_refused_by_its_checksum() {
    // Proves a byte changed in a snapshot file, even one that still decodes (a job's command,
    // say), is refused when the file is read, naming the file, instead of loaded as the state.
    let dir = tempfile::tempdir().expect("tempdir");
    write_a_snapshot_of_gpu_a(dir.path()).await;
    let path = dir.path().join(SNAPSHOT_FILE_NAME);
    let written = std::fs::read(&path).expect("read");
    let name_at = written
        .windows(5)
        .position(|window| window == b"gpu-a")
        .expect("the node's name is in the file");
    let mut changed = written.clone();
    changed[name_at + 4] = b'b';
    std::fs::write(&path, &changed).expect("write");
    let error = QuotientStateMachine::open(dir.path())
        .expect_err("a changed file is refused")
        .to_string();
    assert!(
        error.contains(SNAPSHOT_FILE_NAME) && error.contains("checksum"),
        "{error}"
    );
    // A change to the checksum itself is refused the same way; the file as written opens.
    let mut changed = written.clone();
    *changed.last_mut().expect("bytes") ^= 1;
    std::fs::write(&path, &changed).expect("write");
    let error = QuotientStateMachine::open(dir.path())
        .expect_err("a changed checksum is refused")
        .to_string();
    assert!(error.contains("checksum"), "{error}");
    std::fs::write(&path, &written).expect("write");
    let sm = QuotientStateMachine::open(dir.path()).expect("the file as written opens");
    assert!(has_node(&sm, "gpu-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_command_prints_the_entries_and_replays_the_live_digest() {
    // Proves `quotient-coordinator log --digests` shows a stopped member's entries and that
    // its replay from the first entry reaches the digest the live state machine had: the
    // tool an operator compares members' logs with, and a check that applying is a function
    // of the log alone.
    let dir = tempfile::tempdir().expect("tempdir");
    let (raft, sm) = start_leader(dir.path()).await;
    write(&raft, register("gpu-a", 1_000)).await;
    write(
        &raft,
        Request::one(Command::CheckDigest { leader: None }, 1_500),
    )
    .await;
    write(&raft, register("gpu-b", 2_000)).await;
    let last = raft
        .client_write(Request::one(Command::CheckDigest { leader: None }, 2_500))
        .await
        .expect("a check")
        .log_id
        .index;
    let live = quotient_coordinator::views::digest_of_bytes(
        &sm.read(|state| state.capture_snapshot()).into_bytes(),
    );
    raft.shutdown().await.expect("shutdown");
    drop(raft);
    drop(sm);

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_quotient-coordinator"))
        .args(["log", "--digests", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("quotient-coordinator runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("vote T"), "{stdout}");
    assert_eq!(stdout.matches("RegisterNode").count(), 2, "{stdout}");
    let want = format!("digest after {last}: {live:016x}");
    assert!(
        stdout.lines().any(|line| line.trim() == want),
        "no line `{want}` in:\n{stdout}"
    );

    let empty = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_quotient-coordinator"))
        .args(["log", "--data-dir"])
        .arg(empty.path())
        .output()
        .expect("quotient-coordinator runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("holds no coordinator's data"), "{stderr}");
}
