//! Snapshots and log compaction on a real three-coordinator cluster with a low snapshot
//! threshold: a coordinator that was down while the others compacted their logs catches up
//! from a snapshot sent by the leader, and its job history holds the jobs that ended while it
//! was down; the history of every coordinator survives a restart of all of them.

mod support;

use openraft::storage::RaftLogStorage;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::JobId;
use quotient_coordinator::store::{self, LogStore};
use support::{create_share, job, jobs, poll_until, submit, Cluster, CONVERGE};

/// The jobs coordinator `id`'s own history holds, newest end first (asked of it alone: each
/// coordinator answers from its own copy). Polled until its writer has committed them.
async fn history_of(cluster: &Cluster, id: u64) -> Vec<JobId> {
    let client = cluster.client_of_ids("alice", &[id]);
    let request = ApiRequest::JobHistory {
        share: None,
        since_ms: None,
        until_ms: None,
        state: None,
        job: None,
        limit: 1_000,
        page_token: None,
    };
    let mut last = Vec::new();
    for _ in 0..50 {
        last = match client.call(request.clone()).await {
            Ok(ApiResponse::History(page)) => page
                .records
                .iter()
                .map(|record| record.id.parse().expect("a job id"))
                .collect(),
            other => panic!("coordinator {id}'s history: {other:?}"),
        };
        if last.len() as u32 >= SUBMITS_WHILE_DOWN / 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    client.close();
    last
}

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
    let mut cancelled = Vec::new();
    for n in 0..SUBMITS_WHILE_DOWN {
        let id = submit(&admin, job("team", n % 100)).await;
        if n % 2 == 0 {
            match admin.call(ApiRequest::CancelJob { job: id }).await {
                Ok(ApiResponse::Done) => cancelled.push(id),
                other => panic!("cancelling {id}: {other:?}"),
            }
        }
    }
    cancelled.reverse();
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

    eprintln!("--- every coordinator's history, {down}'s too, holds the cancelled jobs");
    for id in cluster.ids() {
        assert_eq!(
            history_of(&cluster, id).await,
            cancelled,
            "coordinator {id}"
        );
    }

    eprintln!("--- every coordinator restarts; the histories stay");
    for id in cluster.ids() {
        cluster.kill(id);
    }
    for id in [1, 2, 3] {
        cluster.start_member(id);
    }
    cluster.wait_converged(&[1, 2, 3]).await;
    for id in cluster.ids() {
        assert_eq!(
            history_of(&cluster, id).await,
            cancelled,
            "coordinator {id}"
        );
    }
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;

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
