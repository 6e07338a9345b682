//! A coordinator whose wall clock was wrong when it started, through real processes: it runs
//! under libfaketime (Debian's `faketime`) 3 h ahead, its monotonic clock real. Found by
//! probing: such a member stamped its time once it led, and every time limit, retention and
//! the accounting jumped 3 h with it. A member that follows keeps the cluster's time from its
//! leader's stamps, and goes on from it when it leads (`quotient_common::steady_clock`).

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_tests::libfaketime;
use support::{create_share, job, poll_until, submit, Cluster, CONVERGE};

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64
}

/// How far the cluster's time may be from this host's: stamps are made as a request is
/// proposed, and a leader meets a wrong wall clock at 1% of the time since it led.
const AGREE_MS: u64 = 30_000;
const HOUR_MS: u64 = 3_600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_started_with_its_clock_ahead_leads_on_the_clusters_time() {
    let Some(library) = libfaketime() else {
        return;
    };
    let library = library.display().to_string();
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    create_share(&cluster.admin(), "team").await;
    let ahead = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");

    eprintln!("--- coordinator {ahead} starts again with its clock 3 h ahead");
    cluster.kill(ahead);
    cluster.set_env(
        ahead,
        &[
            ("LD_PRELOAD", &library),
            ("FAKETIME", "+3h"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("FAKETIME_NO_CACHE", "1"),
        ],
    );
    cluster.start_member(ahead);
    let client = cluster.client_of("bob", cluster.addresses());
    submit(&client, job("team", 1)).await;
    cluster.wait_converged(&[1, 2, 3]).await;
    poll_until(
        "the member to say its clock is ahead of the cluster's",
        CONVERGE,
        || {
            let cluster = &cluster;
            async move {
                let health = cluster.health(ahead).await?;
                health
                    .problems
                    .iter()
                    .any(|problem| problem.contains("ahead of the cluster's time"))
                    .then_some(())
            }
        },
    )
    .await;

    eprintln!("--- its peers are killed and started again until it leads");
    let mut tries = 0;
    loop {
        let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
        if leader == ahead {
            break;
        }
        tries += 1;
        assert!(tries <= 12, "coordinator {ahead} never led");
        cluster.kill(leader);
        let others = cluster.ids_except(&[leader]);
        if cluster.wait_for_leader(&others).await == ahead {
            cluster.start_member(leader);
            break;
        }
        cluster.start_member(leader);
        cluster.wait_converged(&[1, 2, 3]).await;
    }

    eprintln!("--- a job it stamps is stamped with the cluster's time, not its clock's");
    // A new client: the old one's connections were to members killed since.
    client.close();
    let client = cluster.client_of("bob", cluster.addresses());
    let before = wall_ms();
    let id = submit(&client, job("team", 2)).await;
    let view = match client.call(ApiRequest::GetJob { job: id }).await {
        Ok(ApiResponse::Job(view)) => *view,
        other => panic!("getting {id} failed: {other:?}"),
    };
    let stamped = view.submitted_ms;
    assert!(
        stamped + AGREE_MS >= before && stamped <= wall_ms() + AGREE_MS,
        "stamped {stamped}, this host's clock {before}: {} h ahead",
        stamped.saturating_sub(before) as f64 / HOUR_MS as f64
    );
    let health = cluster.health(ahead).await.expect("its health");
    assert!(
        health
            .problems
            .iter()
            .any(|problem| problem.contains("ahead of the time this process keeps")),
        "as the leader it names the difference from its own clock: {:?}",
        health.problems
    );
}
