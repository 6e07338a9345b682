//! A three-coordinator cluster of real processes on loopback: it elects a leader, takes
//! writes through any coordinator, keeps every acknowledged write across the loss of its
//! leader, and comes back intact after every process is killed; five coordinators serve with
//! two down and write nothing with three down.

mod support;

use std::time::Duration;

use quotient_client::ClientError;
use quotient_common::api::{ApiError, ApiRequest, ApiResponse, HealthView};
use support::{create_share, ids_of, job, jobs, jobs_on_each, shares, submit, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_cluster_takes_writes_through_any_node_and_every_node_agrees() {
    // Proves leader election, redirects from followers, a follower forwarding to the leader,
    // idempotent submit and replication.
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    eprintln!("--- coordinator {leader} leads");

    eprintln!("--- a share and a job through each coordinator alone");
    let mut submitted = Vec::new();
    for id in cluster.ids() {
        let admin = cluster.client_of("alice", vec![cluster.address(id)]);
        let user = cluster.client_of("bob", vec![cluster.address(id)]);
        let name = format!("team-{id}");
        create_share(&admin, &name).await;
        submitted.push(submit(&user, job(&name, 5)).await);
    }

    eprintln!("--- the same idempotency key through two coordinators gives one job");
    let mut spec = job("team-1", 7);
    spec.idempotency_key = Some("retry-me".to_string());
    let first = submit(
        &cluster.client_of("bob", vec![cluster.address(2)]),
        spec.clone(),
    )
    .await;
    let again = cluster
        .client_of("bob", vec![cluster.address(3)])
        .call(ApiRequest::SubmitJob(spec))
        .await;
    match again {
        Ok(ApiResponse::JobSubmitted { job, duplicate }) => {
            assert_eq!(job, first);
            assert!(duplicate, "a retried submit must say it is a duplicate");
        }
        other => panic!("the retried submit failed: {other:?}"),
    }
    submitted.push(first);

    let follower = cluster.ids_except(&[leader])[0];
    eprintln!("--- coordinator {follower}, a follower, serves requests through the leader");
    // What a client sends once the leader's address is out of its reach (`ViaLeader`).
    let user = cluster.client_of("bob", vec![cluster.address(follower)]);
    let via_leader = |request: ApiRequest| ApiRequest::ViaLeader(Box::new(request));
    match user
        .call(via_leader(ApiRequest::SubmitJob(job("team-1", 8))))
        .await
    {
        Ok(ApiResponse::JobSubmitted { job, duplicate }) => {
            assert!(!duplicate);
            submitted.push(job);
        }
        other => panic!("a submit forwarded by a follower failed: {other:?}"),
    }
    match user.call(via_leader(ApiRequest::ClusterStatus)).await {
        Ok(ApiResponse::Cluster(view)) => assert_eq!(view.leader, Some(leader)),
        other => panic!("a read forwarded by a follower failed: {other:?}"),
    }

    eprintln!("--- every coordinator holds the same state");
    cluster.wait_converged(&[1, 2, 3]).await;
    let mut views = Vec::new();
    for id in cluster.ids() {
        let client = cluster.client_of("bob", vec![cluster.address(id)]);
        views.push((shares(&client).await, jobs(&client).await));
    }
    assert!(views.windows(2).all(|pair| pair[0] == pair[1]));
    let (share_views, job_views) = &views[0];
    assert_eq!(share_views.len(), 3);
    let ids: Vec<String> = job_views.iter().map(|j| j.id.clone()).collect();
    let expected: Vec<String> = submitted.iter().map(|j| j.to_string()).collect();
    assert_eq!(ids, expected);

    eprintln!("--- cluster status names the leader and three voters");
    let status = cluster.status(&cluster.admin()).await;
    assert_eq!(status.leader, Some(leader));
    assert_eq!(status.members.len(), 3);
    for member in &status.members {
        let role = if member.id == leader {
            "leader"
        } else {
            "follower"
        };
        assert_eq!(member.role, role, "{status:?}");
        assert!(member.reachable, "{status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_loses_no_acknowledged_submit_and_it_catches_up_on_restart() {
    // Proves failover: a new leader, every acked submit kept, new writes served, and the
    // old leader recovering from its own disk.
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let mut acknowledged = Vec::new();
    for n in 0..20 {
        let mut spec = job("team", n % 10);
        spec.idempotency_key = Some(format!("before-{n}"));
        acknowledged.push(submit(&admin, spec).await);
    }

    eprintln!("--- kill -9 coordinator {leader}, the leader");
    cluster.kill(leader);
    let survivors = cluster.ids_except(&[leader]);
    let new_leader = cluster.wait_for_leader(&survivors).await;
    assert_ne!(new_leader, leader);
    eprintln!("--- coordinator {new_leader} leads now");

    let admin = cluster.admin();
    let listed: Vec<String> = jobs(&admin).await.into_iter().map(|j| j.id).collect();
    for job_id in &acknowledged {
        assert!(listed.contains(&job_id.to_string()), "{job_id} was lost");
    }
    for n in 0..5 {
        let mut spec = job("team", 3);
        spec.idempotency_key = Some(format!("after-{n}"));
        acknowledged.push(submit(&admin, spec).await);
    }

    eprintln!("--- coordinator {leader} restarts from its disk and catches up");
    cluster.start_member(leader);
    cluster.wait_converged(&[1, 2, 3]).await;
    let health = cluster
        .health(leader)
        .await
        .expect("the restarted coordinator answers");
    assert_eq!(health.leader, Some(new_leader));
    let listed: Vec<String> = jobs(&admin).await.into_iter().map(|j| j.id).collect();
    assert_eq!(listed.len(), acknowledged.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_every_coordinator_and_restarting_them_keeps_the_state() {
    // Proves durability: the redb log (fsynced) brings back exactly the state acknowledged.
    let mut cluster = Cluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team-a").await;
    create_share(&admin, "team-b").await;
    for n in 0..10 {
        submit(&admin, job(if n % 2 == 0 { "team-a" } else { "team-b" }, n)).await;
    }
    let digest = cluster.wait_converged(&[1, 2, 3]).await;
    let before = (shares(&admin).await, jobs(&admin).await);
    admin.close();

    eprintln!("--- kill -9 all three");
    for id in cluster.ids() {
        cluster.kill(id);
    }
    eprintln!("--- restart all three");
    for id in cluster.ids() {
        cluster.start_member(id);
    }
    cluster.wait_for_leader(&[1, 2, 3]).await;
    assert_eq!(cluster.wait_converged(&[1, 2, 3]).await, digest);
    let admin = cluster.admin();
    let after = (shares(&admin).await, jobs(&admin).await);
    assert_eq!(after, before);
    // And it still takes writes.
    submit(&admin, job("team-a", 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_joins_as_learner_then_voter_and_can_be_removed() {
    // Proves AddMember (learner, catch up, voter) and RemoveMember through the API.
    let mut cluster = Cluster::start_partial(4, 3, &[]);
    cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    submit(&admin, job("team", 1)).await;

    eprintln!("--- coordinator 4 starts empty and is added");
    cluster.start_member(4);
    let added = admin
        .call(ApiRequest::AddMember {
            id: 4,
            address: cluster.advertised_address(4),
        })
        .await;
    assert!(matches!(added, Ok(ApiResponse::Done)), "{added:?}");
    let status = cluster.status(&admin).await;
    assert_eq!(status.members.len(), 4, "{status:?}");
    let fourth = status.members.iter().find(|m| m.id == 4).expect("member 4");
    assert_eq!(fourth.role, "follower", "{status:?}");
    cluster.wait_converged(&[1, 2, 3, 4]).await;

    eprintln!("--- adding it again: the same address is done already, another is refused");
    let again = admin
        .call(ApiRequest::AddMember {
            id: 4,
            address: cluster.advertised_address(4),
        })
        .await;
    assert!(matches!(again, Ok(ApiResponse::Done)), "{again:?}");
    let moved = admin
        .call(ApiRequest::AddMember {
            id: 4,
            address: "127.0.0.1:1".into(),
        })
        .await;
    let Err(ClientError::Api(ApiError::Precondition(why))) = &moved else {
        panic!("an existing voter at another address is refused: {moved:?}");
    };
    assert!(
        why.contains("already a voter") && why.contains("remove-member --id 4"),
        "{why}"
    );
    // Another id at a member's address is refused at once, not waited for.
    let twin = admin
        .call(ApiRequest::AddMember {
            id: 5,
            address: cluster.advertised_address(4),
        })
        .await;
    let Err(ClientError::Api(ApiError::Precondition(why))) = &twin else {
        panic!("a second id at a member's address is refused: {twin:?}");
    };
    assert!(why.contains("address of coordinator 4"), "{why}");
    let status = cluster.status(&admin).await;
    assert_eq!(status.members.len(), 4, "{status:?}");

    eprintln!("--- coordinator 4 is removed");
    let removed = admin.call(ApiRequest::RemoveMember { id: 4 }).await;
    assert!(matches!(removed, Ok(ApiResponse::Done)), "{removed:?}");
    let status = cluster.status(&admin).await;
    assert_eq!(
        status.members.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    submit(&admin, job("team", 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_each_get_their_own_job_and_one_key_gives_one_job() {
    // Proves the proposer's batching: many commands per entry, one outcome each, idempotency
    // kept even for two submits with one key in the same entry.
    const SUBMITS: usize = 64;
    let cluster = Cluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let mut tasks = Vec::new();
    for n in 0..SUBMITS {
        let client = cluster.client_of("bob", cluster.addresses());
        tasks.push(tokio::spawn(async move {
            let mut spec = job("team", 1);
            // The last two share a key.
            let key = if n >= SUBMITS - 2 {
                "same".to_string()
            } else {
                format!("k-{n}")
            };
            spec.idempotency_key = Some(key);
            submit(&client, spec).await
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.expect("the submit task runs"));
    }
    assert_eq!(ids[SUBMITS - 1], ids[SUBMITS - 2], "one key, one job");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), SUBMITS - 1);
    assert_eq!(jobs(&admin).await.len(), SUBMITS - 1);
    cluster.wait_converged(&[1, 2, 3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_node_cluster_serves_with_two_down_and_stops_writing_with_three() {
    // Proves the five-coordinator shape: a quorum of three keeps it serving through the loss
    // of two (the leader among them), a minority of two writes nothing, and the three back
    // again catch up to one state.
    let all = [1, 2, 3, 4, 5];
    let mut cluster = Cluster::start(5, &[]);
    let leader = cluster.wait_for_leader(&all).await;
    create_share(&cluster.admin(), "team").await;
    let client = cluster.client_of("bob", cluster.addresses());
    let keyed = |name: &str| {
        let mut spec = job("team", 5);
        spec.idempotency_key = Some(name.to_string());
        spec
    };
    let mut acknowledged = vec![submit(&client, keyed("five-up")).await];

    let follower = *all.iter().find(|id| **id != leader).expect("a follower");
    eprintln!("--- kill -9 the leader {leader} and coordinator {follower}");
    cluster.kill(leader);
    cluster.kill(follower);
    let up = cluster.ids_except(&[leader, follower]);
    let new_leader = cluster.wait_for_leader(&up).await;
    eprintln!("--- coordinator {new_leader} leads {up:?}");
    acknowledged.push(submit(&client, keyed("three-up")).await);

    let third = *up.iter().find(|id| **id != new_leader).expect("a follower");
    eprintln!("--- kill -9 coordinator {third} too: two of five are left");
    cluster.kill(third);
    let minority = cluster
        .client_of_ids("bob", &cluster.ids_except(&[leader, follower, third]))
        .with_call_timeout(Duration::from_secs(8));
    let refused = minority.call(ApiRequest::SubmitJob(keyed("two-up"))).await;
    eprintln!("a write with two of five up: {refused:?}");
    assert!(
        refused.is_err(),
        "two of five must not acknowledge a write: {refused:?}"
    );
    minority.close();

    eprintln!("--- the three come back");
    for id in [leader, follower, third] {
        cluster.start_member(id);
    }
    cluster.wait_for_leader(&all).await;
    cluster.wait_converged(&all).await;
    acknowledged.push(submit(&client, keyed("five-back")).await);
    cluster.wait_converged(&all).await;
    // The refused write may still commit once a quorum is back (its entry may sit in the
    // log of the minority's leader), but only once; every acknowledged write is there.
    for (id, seen) in jobs_on_each(&cluster, &all).await {
        let listed = ids_of(&seen);
        for job_id in &acknowledged {
            assert!(
                listed.contains(&job_id.to_string()),
                "{job_id} was lost on coordinator {id}"
            );
        }
        assert!(
            listed.len() == acknowledged.len() || listed.len() == acknowledged.len() + 1,
            "coordinator {id} holds {listed:?}, acknowledged {acknowledged:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_hands_over_quietly_and_it_can_be_added_back() {
    // Proves the maintenance path: the leader itself removed, the other two elect one of
    // them, the removed coordinator (still running) does not disturb them, and it joins
    // again from its own data directory.
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let mut acknowledged = vec![submit(&admin, job("team", 1)).await];

    eprintln!("--- coordinator {leader}, the leader, is removed");
    let removed = admin.call(ApiRequest::RemoveMember { id: leader }).await;
    assert!(matches!(removed, Ok(ApiResponse::Done)), "{removed:?}");
    let others = cluster.ids_except(&[leader]);
    let new_leader = cluster.wait_for_leader(&others).await;
    let remaining = cluster.client_of_ids("alice", &others);
    let status = cluster.status(&remaining).await;
    assert_eq!(
        status.members.iter().map(|m| m.id).collect::<Vec<_>>(),
        others,
        "{status:?}"
    );
    acknowledged.push(submit(&remaining, job("team", 2)).await);

    eprintln!("--- coordinator {new_leader} leads; the removed one, still up, changes nothing");
    let term = |health: Option<HealthView>| health.map(|h| (h.leader, h.term));
    let before = term(cluster.health(new_leader).await);
    tokio::time::sleep(QUIET_FOR).await;
    assert_eq!(
        term(cluster.health(new_leader).await),
        before,
        "no election may follow the removal"
    );

    eprintln!("--- coordinator {leader} is added back and catches up");
    let added = remaining
        .call(ApiRequest::AddMember {
            id: leader,
            address: cluster.advertised_address(leader),
        })
        .await;
    assert!(matches!(added, Ok(ApiResponse::Done)), "{added:?}");
    acknowledged.push(submit(&admin, job("team", 3)).await);
    cluster.wait_converged(&[1, 2, 3]).await;
    let status = cluster.status(&admin).await;
    assert_eq!(status.members.len(), 3, "{status:?}");
    let expected: Vec<String> = acknowledged.iter().map(|j| j.to_string()).collect();
    for (id, seen) in jobs_on_each(&cluster, &cluster.ids()).await {
        assert_eq!(ids_of(&seen), expected, "coordinator {id}");
    }
}

/// How long a cluster must stay without an election after a member's removal: several
/// election timeouts (600-1,200 ms by default).
const QUIET_FOR: Duration = Duration::from_secs(4);
