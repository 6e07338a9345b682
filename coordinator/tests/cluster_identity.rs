//! Cluster identity and explicit bootstrap, against real coordinator processes: a member that
//! belongs to another cluster is refused by name, a voter whose data directory was wiped never
//! votes until it is removed and added back, and a replica whose state diverged from the
//! leader's says so in its health.

mod support;

use std::time::{Duration, Instant};

use quotient_client::ClientError;
use quotient_common::api::{ApiError, ApiRequest, ApiResponse};
use quotient_common::ErrorCode;
use quotient_core::{apply, ApplyCtx, Command, State};
use support::{
    create_share, holds_exactly, job, poll_until, submit, Cluster, CONVERGE, INIT_WITHIN,
};

/// How long a cut-off pair is watched for an election that must not happen.
const NO_ELECTION_FOR: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_of_another_cluster_is_refused_by_every_exchange_naming_both_ids() {
    // Proves that a data directory of another cluster (here: coordinator 3 wiped and made a
    // cluster of its own) is refused by the cluster's Raft, its API and its health, each
    // naming both ids, while the cluster goes on without it; and that init runs once.
    let mut cluster = Cluster::start(3, &[]);
    let ours = cluster.cluster_id.expect("initialised");
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let mut acknowledged = vec![submit(&admin, job("team", 1)).await];

    eprintln!("--- a second init is refused");
    let again = cluster
        .client_of("alice", vec![cluster.address(2)])
        .call(ApiRequest::InitCluster)
        .await;
    match again {
        Err(ClientError::Api(error @ ApiError::Precondition(_))) => {
            assert_eq!(error.code(), ErrorCode::FailedPrecondition);
            assert!(error.to_string().contains(&ours.to_string()), "{error}")
        }
        other => panic!("a second init must be refused: {other:?}"),
    }

    eprintln!("--- init is refused by an initial peer that is not the lowest id");
    // A follower of an id above 1, so that a lower one is among its peers.
    let other_member = *cluster
        .ids_except(&[leader])
        .iter()
        .max()
        .expect("two followers");
    cluster.kill(other_member);
    std::fs::remove_dir_all(cluster.data_dir(other_member)).expect("wipe");
    cluster.start_member_with_peers(
        other_member,
        format!(
            "1={},{other_member}={}",
            cluster.address(1),
            cluster.address(other_member)
        ),
    );
    let refused = cluster
        .client_of("alice", vec![cluster.address(other_member)])
        .with_call_timeout(INIT_WITHIN)
        .call(ApiRequest::InitCluster)
        .await;
    match refused {
        Err(ClientError::Api(error @ ApiError::Precondition(_))) => {
            assert!(error.to_string().contains("coordinator 1"), "{error}")
        }
        other => panic!("init by a peer not of the lowest id must be refused: {other:?}"),
    }

    eprintln!("--- coordinator 3 becomes a cluster of its own");
    cluster.kill(other_member);
    std::fs::remove_dir_all(cluster.data_dir(other_member)).expect("wipe");
    cluster.start_member_alone(other_member);
    let init = cluster
        .client_of("alice", vec![cluster.address(other_member)])
        .with_call_timeout(INIT_WITHIN)
        .call(ApiRequest::InitCluster)
        .await;
    let theirs = match init {
        Ok(ApiResponse::ClusterInitialised(view)) => view.cluster_id,
        other => panic!("init of the other cluster: {other:?}"),
    };
    assert_ne!(theirs, ours.to_string());

    eprintln!("--- it refuses our leader's requests, naming both clusters");
    let names_both = |text: &str| text.contains(&ours.to_string()) && text.contains(&theirs);
    let health = poll_until("the foreign member to report the refusal", CONVERGE, || {
        let cluster = &cluster;
        async move {
            let health = cluster.health(other_member).await?;
            health
                .problems
                .iter()
                .any(|problem| names_both(problem))
                .then_some(health)
        }
    })
    .await;
    assert!(!health.healthy, "{health:?}");
    assert_eq!(health.cluster_id.as_deref(), Some(theirs.as_str()));
    let status = poll_until("the leader to show the refusal", CONVERGE, || {
        let admin = &admin;
        let cluster = &cluster;
        async move {
            let status = cluster.status(admin).await;
            status
                .members
                .iter()
                .any(|member| {
                    member.id == other_member && member.problem.as_deref().is_some_and(names_both)
                })
                .then_some(status)
        }
    })
    .await;
    assert_eq!(
        status.cluster_id.as_deref(),
        Some(ours.to_string().as_str())
    );
    assert!(cluster.log_text(leader).contains(&theirs));

    eprintln!("--- adding it again at its address is refused, saying it refuses the leader");
    let again = admin
        .call(ApiRequest::AddMember {
            id: other_member,
            address: cluster.address(other_member),
        })
        .await;
    match again {
        Err(ClientError::Api(error @ ApiError::Precondition(_))) => {
            assert!(error.to_string().contains("refuses the leader"), "{error}")
        }
        other => panic!("adding a voter that refuses the leader must be refused: {other:?}"),
    }

    eprintln!("--- a client of our cluster is refused by it, naming both");
    let refused = cluster
        .client_of("alice", vec![cluster.address(other_member)])
        .call(ApiRequest::ListShares)
        .await;
    match refused {
        Err(ClientError::Api(ApiError::OtherCluster {
            coordinator_cluster,
            client_cluster,
            ..
        })) => {
            assert_eq!(coordinator_cluster, theirs);
            assert_eq!(client_cluster, ours.to_string());
        }
        other => panic!("a client of another cluster must be refused: {other:?}"),
    }

    eprintln!("--- our cluster goes on with the other two, and none of its jobs reach theirs");
    acknowledged.push(submit(&admin, job("team", 2)).await);
    let rest = cluster.ids_except(&[other_member]);
    cluster.wait_converged(&rest).await;
    let foreign = cluster
        .client_of("alice", vec![cluster.address(other_member)])
        .with_cluster(None)
        .call(ApiRequest::list_jobs(0))
        .await;
    assert!(
        matches!(&foreign, Ok(ApiResponse::Jobs(page)) if page.jobs.is_empty()),
        "{foreign:?}"
    );
    let seen = support::jobs_on_each(&cluster, &rest).await;
    for (id, jobs) in seen {
        assert_eq!(
            support::ids_of(&jobs),
            acknowledged
                .iter()
                .map(|j| j.to_string())
                .collect::<Vec<_>>(),
            "coordinator {id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_voter_never_votes_until_it_is_removed_and_added_back() {
    // Proves that a voter restarted on an empty data directory does not bootstrap, refuses the
    // leader's entries and every vote request, saying how to rejoin; that with the leader gone
    // it cannot help elect one; and that removing it and adding it back makes it a full member.
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let mut acknowledged = Vec::new();
    for n in 0..5 {
        acknowledged.push(submit(&admin, job("team", n)).await);
    }
    cluster.wait_converged(&[1, 2, 3]).await;
    let followers = cluster.ids_except(&[leader]);
    let (wiped, other) = (followers[0], followers[1]);

    eprintln!("--- coordinator {wiped} loses its disk and starts again on an empty one");
    cluster.kill(wiped);
    std::fs::remove_dir_all(cluster.data_dir(wiped)).expect("wipe");
    cluster.start_member(wiped);
    let health = poll_until("the wiped voter to refuse the leader", CONVERGE, || {
        let cluster = &cluster;
        async move {
            let health = cluster.health(wiped).await?;
            health
                .problems
                .iter()
                .any(|problem| problem.contains("as a voter, but its data directory is empty"))
                .then_some(health)
        }
    })
    .await;
    assert!(!health.healthy);
    assert_eq!(health.cluster_id, None);
    let advice = health
        .problems
        .iter()
        .find(|problem| problem.contains("as a voter"))
        .expect("the refusal");
    assert!(
        advice.contains(&format!("quotient cluster remove-member --id {wiped}"))
            && advice.contains("add-member"),
        "{advice}"
    );
    let log = cluster.log_text(wiped);
    assert!(!log.contains("bootstrapping"), "{log}");

    eprintln!("--- the leader is killed: the other follower must not be elected with the wiped one's vote");
    cluster.kill(leader);
    let watched = Instant::now();
    while watched.elapsed() < NO_ELECTION_FOR {
        for id in [wiped, other] {
            if let Some(health) = cluster.health(id).await {
                assert!(
                    health.leader.is_none() || health.leader == Some(leader),
                    "coordinator {id} sees leader {:?} elected with a wiped voter's vote",
                    health.leader
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cluster.log_text(wiped).contains("does not vote"),
        "the wiped voter refused no vote request"
    );

    eprintln!("--- the leader comes back; the wiped one is removed and added back");
    cluster.start_member(leader);
    cluster.wait_for_leader(&[leader, other]).await;
    let admin = cluster.admin();
    match admin.call(ApiRequest::RemoveMember { id: wiped }).await {
        Ok(ApiResponse::Done) => {}
        other => panic!("removing the wiped voter: {other:?}"),
    }
    match admin
        .call(ApiRequest::AddMember {
            id: wiped,
            address: cluster.advertised_address(wiped),
        })
        .await
    {
        Ok(ApiResponse::Done) => {}
        other => panic!("adding it back: {other:?}"),
    }
    acknowledged.push(submit(&admin, job("team", 9)).await);
    cluster.wait_converged(&[1, 2, 3]).await;
    holds_exactly(&cluster, &acknowledged).await;
    let health = cluster.health(wiped).await.expect("it answers");
    assert!(health.healthy, "{health:?}");
    assert_eq!(
        health.cluster_id,
        cluster.cluster_id.map(|id| id.to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_state_diverged_reports_itself_unhealthy() {
    // Proves the leader's digest checks: a follower whose snapshot was altered on disk (its
    // state now differs from the leader's at the same index) reports itself unhealthy, with
    // the reason, instead of healthy with another digest.
    let mut cluster = Cluster::start(
        3,
        &["--digest-check-interval-ms", "300", "--snapshot-logs", "5"],
    );
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    for n in 0..12 {
        submit(&admin, job("team", n)).await;
    }
    cluster.wait_converged(&[1, 2, 3]).await;
    let follower = cluster.ids_except(&[leader])[0];
    let healthy = cluster.health(follower).await.expect("it answers");
    assert!(healthy.healthy, "{healthy:?}");

    eprintln!("--- coordinator {follower}'s snapshot is altered while it is down");
    cluster.kill(follower);
    alter_snapshot(&cluster.data_dir(follower).join("snapshot.bin"));
    cluster.start_member(follower);

    let health = poll_until(
        "the altered follower to report divergence",
        CONVERGE,
        || {
            let cluster = &cluster;
            async move {
                let health = cluster.health(follower).await?;
                (!health.healthy).then_some(health)
            }
        },
    )
    .await;
    assert!(
        health
            .problems
            .iter()
            .any(|problem| problem.contains("has diverged")),
        "{health:?}"
    );
    assert!(cluster.log_text(follower).contains("has diverged"));
    let leader_health = cluster.health(leader).await.expect("the leader answers");
    assert!(leader_health.healthy, "{leader_health:?}");

    eprintln!("--- the leader stops: the diverged member votes, but never leads");
    poll_until("the diverged member to stop campaigning", CONVERGE, || {
        let cluster = &cluster;
        async move {
            cluster
                .log_text(follower)
                .contains("no longer campaigns")
                .then_some(())
        }
    })
    .await;
    cluster.kill(leader);
    let others = cluster.ids_except(&[leader]);
    let new_leader = cluster.wait_for_leader(&others).await;
    assert_ne!(new_leader, follower, "the diverged member led");
    submit(&cluster.client_of_ids("alice", &others), job("team", 99)).await;
}

/// Adds a share to the state in a snapshot file, keeping its header and metadata: the file
/// is the magic and its version (8 bytes), the metadata's and the state's lengths (8 bytes
/// each, little endian), the metadata, the state, then a CRC32 of the rest.
fn alter_snapshot(path: &std::path::Path) {
    let bytes = std::fs::read(path).expect("the follower has a snapshot");
    let length = |at: usize| {
        usize::try_from(u64::from_le_bytes(
            bytes[at..at + 8].try_into().expect("8 bytes"),
        ))
        .expect("a length")
    };
    let (meta_len, state_len) = (length(8), length(16));
    let state_at = 24 + meta_len;
    let mut state =
        State::from_snapshot_bytes(&bytes[state_at..state_at + state_len]).expect("a state");
    let ctx = ApplyCtx {
        log_index: state.data().last_applied_index,
        time_ms: 1,
    };
    let outcome = apply(
        &mut state,
        Command::CreateShare(support::share("smuggled")),
        ctx,
    );
    assert!(!outcome.is_rejected(), "{outcome:?}");
    let altered = state.to_snapshot_bytes();
    let mut out = bytes[..state_at].to_vec();
    out[16..24].copy_from_slice(&(altered.len() as u64).to_le_bytes());
    out.extend_from_slice(&altered);
    // The file's own checksum (layout 3) made again, as a bug rather than the disk would.
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(path, out).expect("rewrite the snapshot");
}
