//! The coordinator's data directory as earlier builds wrote it, read back by this one.
//!
//! `fixtures/` holds small data directories written by the store itself (log segments, the
//! redb file of the vote and the purged id, the snapshot file), one per version of the
//! encodings (fixtures/README.md). Each is opened the way a coordinator opens its own at start,
//! and must give the same log, vote, committed id and, after the snapshot plus the committed
//! entries past it, the same shares, jobs and nodes. The fixture of the current version must
//! also be what this build writes, byte for byte: a change to a persisted type that forgot to
//! bump its version fails there before any data directory in the field meets it.
//!
//! The fixture of the current versions is named after them (`current_fixture`); to write it
//! when a version is bumped: `QUOTIENT_WRITE_FIXTURE=1 cargo test -p quotient-coordinator
//! --test encoding_fixtures -- write_the_fixture`, then commit it beside the older ones.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    BasicNode, CommittedLeaderId, EntryPayload, LogId, Membership, RaftLogReader,
    RaftSnapshotBuilder, Vote,
};
use quotient_common::version::{RAFT_LOG, SNAPSHOT_FILE, SNAPSHOT_STATE};
use quotient_common::{
    GpuClass, GpuDevice, JobId, JobSpec, JobState, NodeInventory, NodeState, ShareSpec, ShareState,
    ShareUpdate, Strategy,
};
use quotient_coordinator::store::log_store::DB_FILE_NAME;
use quotient_coordinator::store::state_machine::SNAPSHOT_FILE_NAME;
use quotient_coordinator::store::type_config::Entry;
use quotient_coordinator::store::wal::{Wal, WAL_DIR_NAME, ZERO_AHEAD_BYTES};
use quotient_coordinator::store::{self, Request};
use quotient_core::{Command, JobEvent, JobReport, State};

/// The last entry the fixture's snapshot covers.
const SNAPSHOT_INDEX: u64 = 12;
/// The log is purged up to here.
const PURGED_INDEX: u64 = 10;
/// The last committed entry; the one after it is in the log but not committed.
const COMMITTED_INDEX: u64 = 16;
/// The last entry in the log.
const LAST_INDEX: u64 = 17;
/// The term of the entries after [`PURGED_INDEX`] and of the vote.
const TERM: u64 = 2;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The name of the fixture written in this build's versions.
fn current_fixture() -> String {
    format!(
        "data-dir-log{}-snapshot{}-state{}",
        RAFT_LOG.current, SNAPSHOT_FILE.current, SNAPSHOT_STATE.current
    )
}

/// Every data directory fixture, by name.
fn every_fixture() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures())
        .expect("the fixtures")
        .map(|item| {
            item.expect("an item")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.starts_with("data-dir-"))
        .collect();
    names.sort();
    names
}

fn log_id(index: u64) -> LogId<u64> {
    let term = if index > PURGED_INDEX { TERM } else { 1 };
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn class() -> GpuClass {
    GpuClass::parse("a10g").expect("a class")
}

fn job(share: &str, name: &str, priority: u32, gpus: u32) -> JobSpec {
    let mut spec = JobSpec::new(
        share,
        priority,
        gpus,
        vec!["train".into(), "--epochs=3".into()],
    );
    spec.name = Some(name.into());
    spec
}

fn report(job: u64, event: JobEvent) -> Command {
    Command::ReportJob(JobReport {
        job: JobId(job),
        attempt: 1,
        node: "gpu-a".into(),
        event,
    })
}

/// The fixture's log, every entry from 1 to [`LAST_INDEX`]. The plan is the scheduler's own
/// for the state before it, so the entries are what a leader would have written.
/// The fixture's log as a build of Raft log `version` wrote it: from version 4 on, one entry
/// also holds a retention command.
fn fixture_log(version: u16) -> Vec<Entry> {
    let mut commands: Vec<Vec<Command>> = vec![
        vec![Command::CreateShare(ShareSpec {
            name: "research".into(),
            limits: BTreeMap::from([(class(), 3)]),
            strategy: Strategy::LendAndBorrow,
            borrow_limit_percent: Some(50),
            in_share_preemption: false,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        })],
        vec![Command::CreateShare(ShareSpec {
            name: "prod".into(),
            limits: BTreeMap::from([(class(), 1)]),
            strategy: Strategy::Reserve,
            borrow_limit_percent: None,
            in_share_preemption: true,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        })],
        vec![Command::RegisterNode(NodeInventory {
            name: "gpu-a".into(),
            host: quotient_common::HostInfo::process_only(),
            gpus: (0..4)
                .map(|index| GpuDevice {
                    index,
                    uuid: format!("GPU-fixture-{index}"),
                    class: class(),
                    healthy: true,
                    nvlink_peers: 0,
                })
                .collect(),
        })],
        vec![
            Command::SubmitJob({
                let mut spec = job("research", "train-1", 5, 2);
                spec.idempotency_key = Some("run-1".into());
                spec.env = quotient_common::EnvVars::from([("SEED".into(), "7".into())]);
                spec
            }),
            Command::SubmitJob(job("research", "train-2", 1, 1)),
            Command::SubmitJob(job("prod", "serve-1", 9, 1)),
        ],
    ];
    // Entries 1 and 2 are the membership and a blank; the commands start at 3.
    let mut state = State::new();
    let mut index = 2;
    let apply = |state: &mut State, batch: &[Command], index: u64| {
        for command in batch {
            quotient_core::apply(
                state,
                command.clone(),
                quotient_core::ApplyCtx {
                    log_index: index,
                    time_ms: time_ms(index),
                },
            );
        }
    };
    for batch in &commands {
        index += 1;
        apply(&mut state, batch, index);
    }
    let plan = quotient_core::plan(&state);
    assert!(!plan.is_empty(), "the fixture's jobs fit gpu-a");
    commands.push(vec![Command::ApplyPlan(plan)]);
    commands.extend([
        vec![report(1, JobEvent::Started)],
        // A checkpoint of train-1 (Raft log 6, snapshot state 7), in the snapshot.
        [
            report(1, JobEvent::Running),
            report(3, JobEvent::Started),
            report(1, JobEvent::Checkpointed),
        ]
        .into_iter()
        .take(if version >= 6 { 3 } else { 2 })
        .collect(),
        vec![report(3, JobEvent::Exited { code: 0 })],
        // A client's write in its session (Raft log 6, snapshot state 7), in the snapshot.
        vec![in_session(
            version,
            1,
            Command::UpdateJobPriority {
                job: JobId(2),
                priority: 3,
            },
        )],
        [
            Command::CheckDigest { leader: None },
            // The AWS endpoint's state (Raft log 5, snapshot state 6), in the snapshot.
            Command::CreateAccessKey {
                id: "AKQTFIXTURE".into(),
                user: "alice".into(),
                admin: false,
                secret: "s".repeat(quotient_core::aws::SECRET_CHARS),
            },
            Command::PutAwsObject {
                key: "queue/q1".into(),
                value: Some("{\"jobQueueName\":\"q1\"}".into()),
            },
        ]
        .into_iter()
        .take(if version >= 5 { 3 } else { 1 })
        .collect(),
        // The snapshot covers everything up to here (entry 12).
        vec![Command::CancelJob { job: JobId(2) }],
        vec![in_session(
            version,
            2,
            Command::UpdateShare {
                name: "research".into(),
                update: ShareUpdate {
                    borrow_limit_percent: Some(Some(25)),
                    ..ShareUpdate::default()
                },
            },
        )],
        vec![Command::SubmitJob(job("research", "eval-1", 0, 4))],
        [
            vec![Command::SetGpuHealth {
                node: "gpu-a".into(),
                index: 3,
                healthy: false,
            }],
            // Retention that removes nothing yet (Raft log 4): serve-1 ended a few seconds
            // before, and a day is kept.
            vec![Command::ExpireFinished(
                quotient_core::retention::RetentionRule {
                    finished_ms: 86_400_000,
                    finished_max: 1_000,
                    key_window_ms: 86_400_000,
                    usage_ms: 86_400_000,
                },
            )],
        ]
        .into_iter()
        .take(if version >= 4 { 2 } else { 1 })
        .flatten()
        .collect(),
        // Written but never committed: opening must not apply it.
        vec![Command::CordonNode {
            node: "gpu-a".into(),
        }],
    ]);
    let membership = Membership::from(BTreeMap::from([(1u64, BasicNode::new("127.0.0.1:7001"))]));
    let mut entries = vec![
        Entry {
            log_id: log_id(1),
            payload: EntryPayload::Membership(membership),
        },
        Entry {
            log_id: log_id(2),
            payload: EntryPayload::Blank,
        },
    ];
    for (offset, batch) in commands.into_iter().enumerate() {
        let index = 3 + offset as u64;
        entries.push(Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(Request {
                commands: batch,
                time_ms: time_ms(index),
            }),
        });
    }
    assert_eq!(entries.len() as u64, LAST_INDEX);
    entries
}

/// `command` as write `seq` of a client's session, from Raft log version 6 on.
fn in_session(version: u16, seq: u64, command: Command) -> Command {
    if version < 6 {
        return command;
    }
    Command::InSession {
        tag: quotient_common::api::WriteTag {
            session: 0x5e55,
            seq,
            low: seq,
        },
        command: Box::new(command),
    }
}

/// The leader's time stamped on entry `index`.
fn time_ms(index: u64) -> u64 {
    1_750_000_000_000 + index * 1_000
}

/// Writes the fixture's data directory into `dir` with this build's store.
async fn write_data_dir(dir: &Path) {
    let (mut log, mut state_machine) = store::open(dir).expect("open the store");
    let entries = fixture_log(RAFT_LOG.current);
    log.save_vote(&Vote::new_committed(TERM, 1))
        .await
        .expect("vote");
    log.blocking_append(entries.clone()).await.expect("append");
    state_machine
        .apply(entries[..SNAPSHOT_INDEX as usize].to_vec())
        .await
        .expect("apply");
    state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("snapshot");
    log.save_committed(Some(log_id(COMMITTED_INDEX)))
        .await
        .expect("committed");
    log.purge(log_id(PURGED_INDEX)).await.expect("purge");
    drop(log);
    drop(state_machine);
    // redb leaves room to grow; the fixture keeps only what it holds.
    let mut database = redb::Database::open(dir.join(DB_FILE_NAME)).expect("open the database");
    while database.compact().expect("compact the database") {}
    drop(database);
    // The segment is filled with zeros ahead of the writes; the fixture keeps its records,
    // and the tests give the zeros back (`pad_segments`) before they open it.
    for segment in std::fs::read_dir(dir.join(WAL_DIR_NAME)).expect("the log's directory") {
        let path = segment.expect("a segment").path();
        let bytes = std::fs::read(&path).expect("read a segment");
        let end = bytes
            .iter()
            .rposition(|byte| *byte != 0)
            .map_or(0, |at| at + 1);
        std::fs::write(&path, &bytes[..end.div_ceil(8) * 8]).expect("trim a segment");
    }
}

/// The Raft log version of fixture `name` (`data-dir-logN-...`; 1 for the unrecorded one).
fn log_version_of(name: &str) -> u16 {
    name.strip_prefix("data-dir-log")
        .and_then(|rest| rest.split('-').next())
        .and_then(|version| version.parse().ok())
        .unwrap_or(1)
}

/// Copies a fixture's data dir to `to` as the build that wrote it left it: with the zeros its
/// log segments were written ahead with, which were cut from the fixtures to keep them small
/// (a segment shorter than that is one cut short, and is refused).
fn copy_fixture(from: &Path, to: &Path) {
    support::copy_dir(from, to);
    pad_segments(to);
}

/// Gives the log segments of the data dir `dir` back the zeros that were cut from them.
fn pad_segments(dir: &Path) {
    let log = dir.join(WAL_DIR_NAME);
    for item in std::fs::read_dir(&log).expect("the fixture's log") {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(item.expect("a segment").path())
            .expect("open a segment");
        let written = file.metadata().expect("its size").len();
        file.set_len(written.div_ceil(4096).max(1) * 4096)
            .expect("its zeros");
        if written < ZERO_AHEAD_BYTES {
            file.set_len(ZERO_AHEAD_BYTES).expect("its zeros");
        }
    }
}

/// Opens a copy of the fixture `name` as a coordinator does, checks the log, vote and committed
/// id, and returns the state after the snapshot and the committed entries past it.
async fn open_fixture(name: &str) -> State {
    let copy = tempfile::tempdir().expect("tempdir");
    copy_fixture(&fixtures().join(name), copy.path());
    let (mut log, mut state_machine) = store::open(copy.path()).expect("the fixture opens");
    assert_eq!(
        log.read_vote().await.expect("vote"),
        Some(Vote::new_committed(TERM, 1))
    );
    assert_eq!(
        log.read_committed().await.expect("committed"),
        Some(log_id(COMMITTED_INDEX))
    );
    let log_state = log.get_log_state().await.expect("log state");
    assert_eq!(log_state.last_purged_log_id, Some(log_id(PURGED_INDEX)));
    assert_eq!(log_state.last_log_id, Some(log_id(LAST_INDEX)));
    let entries = log
        .try_get_log_entries(PURGED_INDEX + 1..=LAST_INDEX)
        .await
        .expect("the entries decode");
    assert_eq!(
        entries,
        fixture_log(log_version_of(name))[PURGED_INDEX as usize..]
    );

    let (applied, membership) = state_machine.applied_state().await.expect("applied");
    assert_eq!(
        applied,
        Some(log_id(SNAPSHOT_INDEX)),
        "loaded from the snapshot"
    );
    assert_eq!(membership.log_id(), &Some(log_id(1)));
    // What a follower would be sent is the state in the form it travels in, whatever the
    // file's layout.
    let snapshot = state_machine
        .get_current_snapshot()
        .await
        .expect("the snapshot reads")
        .expect("a snapshot");
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(SNAPSHOT_INDEX)));
    let sent = State::from_snapshot_bytes(snapshot.snapshot.get_ref()).expect("a state");
    assert_eq!(
        sent.to_snapshot_bytes(),
        state_machine.read(State::to_snapshot_bytes),
        "the state sent is the state loaded"
    );
    let committed: Vec<Entry> = entries
        .into_iter()
        .filter(|entry| (SNAPSHOT_INDEX + 1..=COMMITTED_INDEX).contains(&entry.log_id.index))
        .collect();
    state_machine.apply(committed).await.expect("apply");
    state_machine.read(|state| {
        State::from_snapshot_bytes(&state.to_snapshot_bytes()).expect("a valid state")
    })
}

/// What the fixture's state is after its committed entries, checked field by field.
fn check_state(state: &State) {
    state.validate().expect("the invariants hold");
    assert_eq!(state.data().last_applied_index, COMMITTED_INDEX);

    let research = state.share("research").expect("share research");
    assert_eq!(research.spec.limits, BTreeMap::from([(class(), 3)]));
    assert_eq!(research.spec.strategy, Strategy::LendAndBorrow);
    assert_eq!(
        research.spec.borrow_limit_percent,
        Some(25),
        "updated after the snapshot"
    );
    let prod = state.share("prod").expect("share prod");
    assert_eq!(prod.spec.strategy, Strategy::Reserve);
    assert!(prod.spec.in_share_preemption);
    assert_eq!(state.shares().count(), 2);

    let node = state.node_by_name("gpu-a").expect("node gpu-a");
    assert_eq!(
        node.state,
        NodeState::Ready,
        "the uncommitted cordon is not applied"
    );
    assert_eq!(node.gpus.len(), 4);
    assert!(!node.gpus[3].healthy, "marked unhealthy after the snapshot");
    assert_eq!(state.node_count(), 1);

    let jobs: Vec<(u64, &str, JobState)> = state
        .jobs()
        .map(|job| (job.id.0, job.spec.name.as_deref().unwrap_or(""), job.state))
        .collect();
    assert_eq!(
        jobs,
        vec![
            (1, "train-1", JobState::Running),
            // Cancelled while placed: it holds its GPU until its agent stops it.
            (2, "train-2", JobState::Preempting),
            (3, "serve-1", JobState::Succeeded),
            (4, "eval-1", JobState::Runnable),
        ]
    );
    let train = state.job(JobId(1)).expect("train-1");
    assert_eq!(train.spec.env.get("SEED"), Some("7"));
    assert_eq!(train.spec.idempotency_key.as_deref(), Some("run-1"));
    assert_eq!(train.allocation().map(|a| a.gpu_indices().len()), Some(2));
    assert_eq!(state.job(JobId(2)).expect("train-2").spec.priority, 3);
    assert_eq!(state.job(JobId(3)).expect("serve-1").exit_code, Some(0));
    assert_eq!(state.data().idempotency.get("run-1"), Some(&JobId(1)));
}

#[tokio::test]
async fn a_data_directory_written_before_versions_were_recorded_reads_back() {
    // Proves this build opens what the first released store wrote (no version on its log
    // records or redb values, a snapshot file of the first layout) and gets its state.
    check_state(&open_fixture("data-dir-unrecorded").await);
}

#[tokio::test]
async fn a_data_directory_of_every_version_reads_back() {
    // Proves every committed fixture, old and current, opens with the same content.
    let names = every_fixture();
    assert!(names.contains(&current_fixture()), "{names:?}");
    for name in names {
        eprintln!("--- {name}");
        let state = open_fixture(&name).await;
        check_state(&state);
        if name == current_fixture() {
            // What the AWS endpoint keeps came back from the snapshot.
            let key = state.access_key("AKQTFIXTURE").expect("the access key");
            assert_eq!(key.user, "alice");
            assert_eq!(
                state.aws_object("queue/q1"),
                Some("{\"jobQueueName\":\"q1\"}")
            );
            // The client's session, from the snapshot and the entry after it.
            let session = state.sessions().get(0x5e55).expect("the session");
            assert_eq!((session.low, session.applied.len()), (2, 1));
            assert_eq!(state.data().checkpoints.get(&JobId(1)), Some(&time_ms(9)));
            assert_eq!(state.data().clock_ms, time_ms(COMMITTED_INDEX));
        }
    }
}

#[tokio::test]
async fn this_build_writes_the_fixture_of_its_versions_byte_for_byte() {
    // Proves this build's log records (each payload and its version) and snapshot file are
    // exactly the fixture of its versions: an encoding that changed without a new version
    // fails here. The records are compared one by one, not the segment as a whole, since
    // which of them share a write (their batch numbers) depends on the writer's timing.
    let name = current_fixture();
    let fixture = fixtures().join(&name);
    assert!(
        fixture.exists(),
        "no fixture {name}: a version was bumped; write it (module docs) and keep the others"
    );
    let written = tempfile::tempdir().expect("tempdir");
    write_data_dir(written.path()).await;
    pad_segments(written.path());
    let committed = tempfile::tempdir().expect("tempdir");
    copy_fixture(&fixture, committed.path());
    let records = |dir: &Path| {
        let (wal, recovered) = Wal::open(dir, None).expect("the log opens");
        let entries = wal.read(0, u64::MAX - 1).expect("the entries read");
        (entries, recovered.committed)
    };
    let changed = "an encoding changed without a new version (quotient_common::version says \
                   what to do)";
    let (ours, theirs) = (records(written.path()), records(committed.path()));
    assert_eq!(ours.0.len(), theirs.0.len(), "the fixture's entries");
    for ((index, ours), (_, theirs)) in ours.0.iter().zip(&theirs.0) {
        assert!(
            ours == theirs,
            "log entry {index} differs from {name}'s: {changed}"
        );
    }
    assert!(
        ours.1 == theirs.1,
        "the committed id differs from {name}'s: {changed}"
    );
    let ours = std::fs::read(written.path().join(SNAPSHOT_FILE_NAME)).expect("written");
    let theirs = std::fs::read(fixture.join(SNAPSHOT_FILE_NAME)).expect("in the fixture");
    assert!(
        ours == theirs,
        "{SNAPSHOT_FILE_NAME} differs from {name}'s: {changed}"
    );
}

#[tokio::test]
async fn write_the_fixture() {
    // Writes the fixture of this build's versions when QUOTIENT_WRITE_FIXTURE is set; see the
    // module docs.
    if std::env::var_os("QUOTIENT_WRITE_FIXTURE").is_none() {
        return;
    }
    let dir = fixtures().join(current_fixture());
    assert!(!dir.exists(), "{} exists; never change one", dir.display());
    write_data_dir(&dir).await;
    assert!(dir.join(SNAPSHOT_FILE_NAME).exists());
}
