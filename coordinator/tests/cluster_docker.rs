//! Three coordinators on hosts of their own: each in a Docker container with its own host
//! name, address and network interface on a private network (`support::docker_hosts`), the
//! others reaching it by name through Docker's DNS and the tests reaching it at its address.
//! A client of any one host is served (a follower forwards to the leader across the network);
//! a leader unplugged from the network is replaced, and when it is plugged back in it drops
//! what it could not commit and holds exactly the others' state; a frozen host (its cgroup
//! frozen) and a killed one come back and catch up; and a rolling restart (each host stopped
//! with `docker stop` and started again in turn) loses no acknowledged write.
//!
//! The `quotient` CLI, given only a follower's address, is served through that follower too.
//! And two agents on hosts of their own (containers with one simulated GPU each, the process
//! runtime): when the host of the one running a job is unplugged, it stops the job within its
//! lease, and the leader runs the job on the other host only after that.
//!
//! Docker must be reachable: under `CI=true` these tests fail without it, elsewhere they skip
//! with a message.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use quotient_client::ClientError;
use quotient_common::api::ApiRequest;
use quotient_common::JobId;
use support::{create_share, holds_exactly, job, submit, Cluster};

/// A call to the unplugged leader gives up after this.
const CALL_TO_THE_UNPLUGGED_LEADER: Duration = Duration::from_secs(5);

/// A cluster in containers with a leader, a share and one job through each coordinator
/// alone; `None` when Docker is not reachable outside CI.
async fn started() -> Option<(Cluster, u64, Vec<JobId>)> {
    let cluster = Cluster::start_in_docker(3, &[])?;
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    eprintln!("--- coordinator {leader} leads; one job through each host alone");
    create_share(&cluster.admin(), "team").await;
    let mut acknowledged = Vec::new();
    for id in cluster.ids() {
        let alone = cluster.client_of_ids("bob", &[id]);
        acknowledged.push(submit(&alone, job("team", id as u32)).await);
        alone.close();
    }
    cluster.wait_converged(&[1, 2, 3]).await;
    holds_exactly(&cluster, &acknowledged).await;
    Some((cluster, leader, acknowledged))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_unplugged_from_the_network_is_replaced_and_rejoins_with_the_others_state() {
    let Some((cluster, leader, mut acknowledged)) = started().await else {
        return;
    };
    let others = cluster.ids_except(&[leader]);

    eprintln!("--- coordinator {leader} unplugged");
    cluster.unplug(leader);
    let unplugged = cluster
        .client_of("bob", vec![cluster.address(leader)])
        .with_call_timeout(CALL_TO_THE_UNPLUGGED_LEADER);
    let answer = unplugged.call(ApiRequest::Health).await;
    assert!(
        matches!(answer, Err(ClientError::Unavailable { .. })),
        "an unplugged host cannot answer: {answer:?}"
    );
    unplugged.close();

    let new_leader = cluster.wait_for_leader(&others).await;
    assert_ne!(new_leader, leader);
    eprintln!("--- coordinator {new_leader} leads the two left; they take writes");
    let majority = cluster.client_of_ids("bob", &others);
    for priority in [11, 12, 13] {
        acknowledged.push(submit(&majority, job("team", priority)).await);
    }

    eprintln!("--- coordinator {leader} plugged back in");
    cluster.plug(leader);
    let leader_after = cluster.wait_for_leader(&[1, 2, 3]).await;
    cluster.wait_converged(&[1, 2, 3]).await;
    eprintln!("coordinator {leader_after} leads after the heal");
    holds_exactly(&cluster, &acknowledged).await;

    let everyone = cluster.client_of("bob", cluster.addresses());
    acknowledged.push(submit(&everyone, job("team", 14)).await);
    cluster.wait_converged(&[1, 2, 3]).await;
    holds_exactly(&cluster, &acknowledged).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_host_and_a_killed_one_come_back_and_catch_up() {
    let Some((mut cluster, leader, mut acknowledged)) = started().await else {
        return;
    };
    let others = cluster.ids_except(&[leader]);

    eprintln!("--- coordinator {leader}'s container frozen");
    cluster.pause(leader);
    let new_leader = cluster.wait_for_leader(&others).await;
    assert_ne!(new_leader, leader);
    let majority = cluster.client_of_ids("bob", &others);
    acknowledged.push(submit(&majority, job("team", 21)).await);
    majority.close();
    cluster.resume(leader);
    cluster.wait_for_leader(&[1, 2, 3]).await;
    cluster.wait_converged(&[1, 2, 3]).await;
    holds_exactly(&cluster, &acknowledged).await;

    let follower = cluster.ids_except(&[new_leader])[0];
    eprintln!("--- coordinator {follower}'s container killed; writes go on without it");
    cluster.kill(follower);
    let two = cluster.client_of_ids("bob", &cluster.ids_except(&[follower]));
    for priority in [22, 23] {
        acknowledged.push(submit(&two, job("team", priority)).await);
    }
    two.close();
    eprintln!("--- coordinator {follower} started again on its data directory");
    cluster.start_member(follower);
    cluster.wait_for_leader(&[1, 2, 3]).await;
    cluster.wait_converged(&[1, 2, 3]).await;
    holds_exactly(&cluster, &acknowledged).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_host_keeps_every_acknowledged_write() {
    let Some((mut cluster, _, mut acknowledged)) = started().await else {
        return;
    };
    let everyone = cluster.client_of("bob", cluster.addresses());
    for id in cluster.ids() {
        eprintln!("--- coordinator {id} stopped (docker stop, SIGTERM); writes go on without it");
        let status = cluster.stop(id).await;
        assert!(
            status.success(),
            "coordinator {id} must exit cleanly when stopped: {status}"
        );
        for priority in [1, 2] {
            acknowledged.push(submit(&everyone, job("team", 30 + id as u32 * 2 + priority)).await);
        }
        eprintln!("--- coordinator {id} started again");
        cluster.start_member(id);
        cluster.wait_for_leader(&[1, 2, 3]).await;
        cluster.wait_converged(&[1, 2, 3]).await;
    }
    holds_exactly(&cluster, &acknowledged).await;
}

/// The `quotient` CLI the workspace built next to the coordinator binary.
fn cli_binary() -> PathBuf {
    let path = Path::new(support::BINARY).with_file_name("quotient");
    assert!(
        path.is_file(),
        "{} is missing: build the workspace first (`cargo build` at its root, with the tests' \
         profile), so that quotient sits next to quotient-coordinator",
        path.display()
    );
    path
}

/// Runs `quotient ARGUMENTS` with the client config `config`; it must succeed. Its stdout.
fn quotient(config: &Path, arguments: &[&str]) -> String {
    let output = Command::new(cli_binary())
        .args(arguments)
        .env("QUOTIENT_CONFIG", config)
        .output()
        .expect("the quotient CLI runs");
    assert!(
        output.status.success(),
        "quotient {arguments:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_given_only_a_follower_is_served_through_it() {
    let Some((cluster, leader, _)) = started().await else {
        return;
    };
    let follower = cluster.ids_except(&[leader])[0];
    // The follower redirects to the leader's host name, which only the containers resolve:
    // the CLI then asks the follower to serve its requests through the leader.
    let files = cluster.certs.files("alice");
    let config = cluster.root.path().join("client.toml");
    std::fs::write(
        &config,
        format!(
            "coordinators = [\"{}\"]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
            cluster.address(follower),
            files.ca,
            files.cert,
            files.key
        ),
    )
    .expect("a client config");
    eprintln!("--- quotient, configured with coordinator {follower} (a follower) alone");
    quotient(
        &config,
        &[
            "share",
            "create",
            "cli-team",
            "--limit",
            "a10g=2",
            "--strategy",
            "lend",
        ],
    );
    let job = quotient(
        &config,
        &[
            "job",
            "submit",
            "--share",
            "cli-team",
            "--priority",
            "5",
            "--gpus",
            "1",
            "--",
            "sleep",
            "60",
        ],
    );
    let job = job.trim();
    let listed: serde_json::Value =
        serde_json::from_str(&quotient(&config, &["job", "list", "-o", "json"]))
            .expect("job list -o json is JSON");
    assert!(
        listed["jobs"]
            .as_array()
            .expect("a page of jobs")
            .iter()
            .any(|entry| entry["id"] == job),
        "the job submitted through the follower is listed: {listed}"
    );
    let status: serde_json::Value =
        serde_json::from_str(&quotient(&config, &["cluster", "status", "-o", "json"]))
            .expect("cluster status -o json is JSON");
    assert_eq!(status["leader"], leader, "{status}");
    cluster.wait_converged(&[1, 2, 3]).await;
}

/// The state and node of job `id` as the leader sees it.
async fn placement(
    client: &quotient_client::ApiClient,
    id: &str,
) -> Option<(String, Option<String>, u32)> {
    support::jobs(client)
        .await
        .into_iter()
        .find(|job| job.id == id)
        .map(|job| (job.state, job.node, job.attempts))
}

/// Whether node `name` is `ready` as the leader sees it.
async fn is_ready(client: &quotient_client::ApiClient, name: &str) -> bool {
    match client.call(ApiRequest::list_nodes()).await {
        Ok(quotient_common::api::ApiResponse::Nodes(page)) => page
            .nodes
            .iter()
            .any(|node| node.name == name && node.state == "ready"),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_host_unplugged_stops_its_job_before_it_runs_again_on_another_host() {
    // Short leases: the agent stops its jobs 2 s after it last heard a leader; the leader
    // marks its node lost after 2 s + the job's 1 s grace + 3 s (the smallest margin).
    let timing = [
        "--agent-lease-ms",
        "2000",
        "--agent-heartbeat-ms",
        "250",
        "--node-lease-margin-ms",
        "3000",
    ];
    let Some(cluster) = Cluster::start_in_docker(3, &timing) else {
        return;
    };
    let hosts = cluster.docker_hosts();
    cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let mut agents: Vec<std::process::Child> = (1..=2)
        .map(|node| {
            hosts.start_agent(
                node,
                3,
                &cluster.certs.dir,
                &cluster.root.path().join(format!("state-{node}")),
                2_000,
                &cluster.root.path().join(format!("agent-{node}.log")),
            )
        })
        .collect();
    for node in ["node-1", "node-2"] {
        support::poll_until(&format!("{node} ready"), support::CONVERGE, || async {
            is_ready(&admin, node).await.then_some(())
        })
        .await;
    }

    let mut spec =
        quotient_common::JobSpec::new("team", 5, 1, vec!["sleep".to_string(), "600".to_string()]);
    spec.grace_period_ms = 1_000;
    let id = submit(&admin, spec).await.to_string();
    let first = support::poll_until("the job running", support::CONVERGE, || async {
        match placement(&admin, &id).await? {
            (state, Some(node), _) if state == "RUNNING" => Some(node),
            _ => None,
        }
    })
    .await;
    let first_node: u64 = first
        .strip_prefix("node-")
        .and_then(|n| n.parse().ok())
        .expect("a node-N name");
    let first_host = hosts.agent_host(first_node);
    assert!(
        hosts.processes(&first_host).contains("sleep 600"),
        "the job runs on {first_host}"
    );

    eprintln!("--- {first}'s host unplugged");
    hosts.unplug_host(&first_host);
    let second = support::poll_until(
        "the job running again on the other host",
        support::CONVERGE,
        || async {
            match placement(&admin, &id).await? {
                (state, Some(node), attempts) if state == "RUNNING" && node != first => {
                    Some((node, attempts))
                }
                _ => None,
            }
        },
    )
    .await;
    eprintln!("the job runs on {} (attempt {})", second.0, second.1);
    assert_eq!(second.1, 2, "a second attempt");
    assert!(
        !hosts.processes(&first_host).contains("sleep 600"),
        "the unplugged host stopped its job before the job ran anywhere else: {}",
        hosts.processes(&first_host)
    );

    eprintln!("--- {first}'s host plugged back in");
    hosts.plug_host(&first_host, &hosts.agent_ip(first_node));
    support::poll_until(
        &format!("{first} ready again"),
        support::CONVERGE,
        || async { is_ready(&admin, &first).await.then_some(()) },
    )
    .await;
    assert!(!hosts.processes(&first_host).contains("sleep 600"));
    assert_eq!(
        placement(&admin, &id).await,
        Some(("RUNNING".to_string(), Some(second.0.clone()), 2)),
        "the job stays where it runs now"
    );
    for agent in &mut agents {
        let _ = agent.kill();
        let _ = agent.wait();
    }
}
