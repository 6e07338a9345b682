//! Snapshots and log compaction on a real three-coordinator cluster with a low snapshot
//! threshold: a coordinator that was down while the others compacted their logs catches up
//! from a snapshot sent by the leader.

mod support;

use openraft::storage::RaftLogStorage;
use quotient_coordinator::store::{self, LogStore};
use support::{create_share, job, jobs, poll_until, submit, Cluster, CONVERGE};

/// Entries between snapshots in this test.
const SNAPSHOT_LOGS: u64 = 20;
/// Submits while one coordinator is down: several snapshots' worth.
const SUBMITS_WHILE_DOWN: u32 = 70;

fn log_text(cluster: &Cluster, id: u64) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(cluster.root.path())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("coord-{id}.")) {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_through_a_compaction_catches_up_from_a_snapshot() {
    // Proves snapshots are built, logs are purged, and a lagging node is sent a snapshot.
    let snapshot_logs = SNAPSHOT_LOGS.to_string();
    let mut cluster = Cluster::start(
        3,
        &[
            "--snapshot-logs",
            &snapshot_logs,
            "--logs-kept-after-snapshot",
            "0",
        ],
    );
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let down = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    cluster.wait_converged(&[1, 2, 3]).await;

    eprintln!(
        "--- coordinator {down} goes down; {SUBMITS_WHILE_DOWN} submits compact the others' logs"
    );
    cluster.kill(down);
    for n in 0..SUBMITS_WHILE_DOWN {
        submit(&admin, job("team", n % 100)).await;
    }
    poll_until("the leader to build a snapshot", CONVERGE, || async {
        log_text(&cluster, leader)
            .contains("built raft snapshot")
            .then_some(())
    })
    .await;
    assert!(cluster.data_dir(leader).join("snapshot.bin").exists());

    eprintln!("--- coordinator {down} restarts and is sent a snapshot");
    cluster.start_member(down);
    let live = cluster.ids();
    cluster.wait_converged(&live).await;
    assert!(
        log_text(&cluster, down).contains("installed raft snapshot"),
        "coordinator {down} caught up without a snapshot"
    );
    let listed = jobs(&admin).await;
    assert_eq!(listed.len(), SUBMITS_WHILE_DOWN as usize);

    eprintln!("--- the leader's log was purged up to a snapshot");
    admin.close();
    cluster.kill(leader);
    let data_dir = cluster.data_dir(leader);
    let (mut log_store, _state_machine): (LogStore, _) =
        tokio::task::spawn_blocking(move || store::open(&data_dir).map_err(|e| e.to_string()))
            .await
            .expect("the open task runs")
            .expect("the leader's store opens");
    let state = log_store
        .get_log_state()
        .await
        .expect("the log state reads");
    let purged = state
        .last_purged_log_id
        .expect("some of the log was purged");
    assert!(purged.index >= SNAPSHOT_LOGS, "purged only up to {purged}");
}
