//! The agent protocol's coordinator side, against a fake agent speaking `quotient-agent/1`
//! with an agent certificate: who may speak it, registration, desired state as a long poll,
//! reports, reclaim through desired state, node leases, and a leader cut off from the others
//! refusing heartbeats.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use quotient_client::ApiClient;
use quotient_common::agent_api::{
    ActualAttempt, ActualPhase, AgentError, AgentRequest, AgentResponse, DesiredState, Fence,
    WireIntent, ACTUAL_ATTEMPTS_MAX, WATCH_TIMEOUT_MS,
};
use quotient_common::api::{ApiRequest, ApiResponse, JobView, NodeView};
use quotient_common::job::{LaunchFault, LAUNCH_MESSAGE_BYTES_MAX};
use quotient_common::tls::TlsIdentity;
use quotient_common::transport::{Client, PeerConnection, ALPN_AGENT};
use quotient_common::version::AGENT_WIRE;
use quotient_common::{
    ClusterId, GpuDevice, JobEvent, JobId, JobReport, NodeInventory, ShareSpec, ShareState,
    Strategy,
};
use quotient_coordinator::agent_service::LEADER_QUORUM_ACK_MAX_MS;
use quotient_coordinator::config::AGENT_LEASE_DEFAULT_MS;
use support::{class, poll_until, Cluster, CONVERGE};

/// Deadline of one fake-agent request (a watch adds the server's long-poll time).
const AGENT_CALL: Duration = Duration::from_secs(15);

/// A fake agent: one connection to the leader, with the certificate of `name`.
struct FakeAgent {
    client: Client,
    connection: PeerConnection,
}

impl FakeAgent {
    /// Connects with the certificate of `cert_name` to whichever coordinator leads.
    async fn connect(cluster: &Cluster, cert_name: &str) -> FakeAgent {
        FakeAgent::connect_among(cluster, cert_name, cluster.addresses()).await
    }

    /// Connects with the certificate of `cert_name` to whichever of `addresses` leads.
    async fn connect_among(
        cluster: &Cluster,
        cert_name: &str,
        addresses: Vec<String>,
    ) -> FakeAgent {
        let tls = TlsIdentity::load(&cluster.certs.files(cert_name)).expect("agent TLS files");
        let client = Client::new(tls);
        let connection = poll_until("a connection to the leader", CONVERGE, || async {
            for address in &addresses {
                let Ok(connection) = client.connect_to(address, ALPN_AGENT).await else {
                    continue;
                };
                // A watch for a node nobody registered is cheap and tells leader from follower.
                let probe = AgentRequest::WatchDesired {
                    node: cert_name.to_string(),
                    after_fence: Fence::default(),
                };
                match connection
                    .request::<_, AgentResponse>(&probe, AGENT_CALL)
                    .await
                {
                    Ok(AgentResponse::Error(AgentError::NotLeader { .. })) | Err(_) => continue,
                    Ok(_) => return Some(connection),
                }
            }
            None
        })
        .await;
        FakeAgent { client, connection }
    }

    async fn call(&self, request: AgentRequest) -> AgentResponse {
        self.connection
            .request(&request, AGENT_CALL)
            .await
            .expect("an answer from the coordinator")
    }

    async fn register(&self, name: &str, gpus: u32) -> u64 {
        match self
            .call(AgentRequest::Register {
                inventory: inventory(name, gpus),
                actual: Vec::new(),
                cluster: None,
            })
            .await
        {
            AgentResponse::Registered {
                node_incarnation, ..
            } => node_incarnation,
            other => panic!("registering {name} failed: {other:?}"),
        }
    }

    async fn heartbeat(&self, name: &str, gpus: u32) -> AgentResponse {
        self.call(AgentRequest::Heartbeat {
            node: name.to_string(),
            gpus: inventory(name, gpus).gpus,
            actual: Vec::new(),
        })
        .await
    }

    async fn watch(&self, name: &str, after_fence: Fence) -> DesiredState {
        match self
            .call(AgentRequest::WatchDesired {
                node: name.to_string(),
                after_fence,
            })
            .await
        {
            AgentResponse::Desired(state) => state,
            other => panic!("watching {name} failed: {other:?}"),
        }
    }

    /// Watches until `check` holds for the desired state.
    async fn watch_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&DesiredState) -> bool,
    ) -> DesiredState {
        let started = Instant::now();
        let mut fence = Fence::default();
        loop {
            let state = self.watch(name, fence).await;
            if check(&state) {
                return state;
            }
            assert!(
                started.elapsed() < CONVERGE,
                "gave up waiting for {what}; last desired state {state:?}"
            );
            fence = state.fence;
        }
    }

    async fn report(&self, name: &str, reports: Vec<JobReport>) -> Vec<(JobId, u32, String)> {
        match self
            .call(AgentRequest::Report {
                node: name.to_string(),
                reports,
            })
            .await
        {
            AgentResponse::Reported { rejected } => rejected,
            other => panic!("reporting for {name} failed: {other:?}"),
        }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.connection.close();
        self.client.close();
    }
}

fn inventory(name: &str, gpus: u32) -> NodeInventory {
    NodeInventory {
        name: name.to_string(),
        host: quotient_common::HostInfo::process_only(),
        gpus: (0..gpus)
            .map(|index| GpuDevice {
                index,
                uuid: format!("GPU-{name}-{index}"),
                class: class(),
                healthy: true,
                nvlink_peers: 0,
            })
            .collect(),
    }
}

/// A report of node-1, the node every test's fake agent reports for.
fn report(job: JobId, attempt: u32, event: JobEvent) -> JobReport {
    JobReport {
        job,
        attempt,
        node: "node-1".to_string(),
        event,
    }
}

fn share_of(name: &str, strategy: Strategy, limit: u32) -> ShareSpec {
    ShareSpec {
        name: name.to_string(),
        limits: BTreeMap::from([(class(), limit)]),
        strategy,
        borrow_limit_percent: (strategy == Strategy::LendAndBorrow).then_some(100),
        in_share_preemption: false,
        state: ShareState::Enabled,
        members: Vec::new(),
        max_jobs_per_user: None,
    }
}

async fn create(client: &ApiClient, spec: ShareSpec) {
    match client.call(ApiRequest::CreateShare(spec)).await {
        Ok(ApiResponse::Done) => {}
        other => panic!("creating a share failed: {other:?}"),
    }
}

async fn nodes(client: &ApiClient) -> Vec<NodeView> {
    match client.call(ApiRequest::list_nodes()).await {
        Ok(ApiResponse::Nodes(page)) => page.nodes,
        other => panic!("listing nodes failed: {other:?}"),
    }
}

async fn job(client: &ApiClient, id: JobId) -> JobView {
    match client.call(ApiRequest::GetJob { job: id }).await {
        Ok(ApiResponse::Job(view)) => *view,
        other => panic!("getting {id} failed: {other:?}"),
    }
}

async fn wait_job_state(client: &ApiClient, id: JobId, state: &str) -> JobView {
    poll_until(&format!("{id} {state}"), CONVERGE, || async {
        let view = job(client, id).await;
        (view.state == state).then_some(view)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_of_another_cluster_is_refused_naming_both_and_one_of_this_cluster_registers() {
    // Proves that an agent's registration carries its cluster: another cluster's agent is
    // refused with both ids and registers nothing; this cluster's is answered with the id.
    let cluster = Cluster::start(1, &[]);
    cluster.wait_for_leader(&[1]).await;
    let ours = cluster.cluster_id.expect("initialised");
    let admin = cluster.admin();
    let agent = FakeAgent::connect(&cluster, "node-1").await;
    let theirs = ClusterId::from_bytes([7; 16]);

    let answer = agent
        .call(AgentRequest::Register {
            inventory: inventory("node-1", 1),
            actual: Vec::new(),
            cluster: Some(theirs),
        })
        .await;
    match answer {
        AgentResponse::Error(error @ AgentError::OtherCluster { .. }) => {
            let text = error.to_string();
            assert!(
                text.contains(&ours.to_string()) && text.contains(&theirs.to_string()),
                "{text}"
            );
        }
        other => panic!("another cluster's agent must be refused: {other:?}"),
    }
    assert!(nodes(&admin).await.is_empty(), "nothing was registered");

    let answer = agent
        .call(AgentRequest::Register {
            inventory: inventory("node-1", 1),
            actual: Vec::new(),
            cluster: Some(ours),
        })
        .await;
    assert!(
        matches!(answer, AgentResponse::Registered { cluster, .. } if cluster == ours),
        "{answer:?}"
    );
    assert_eq!(nodes(&admin).await.len(), 1);
    admin.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_node_is_refused_and_nothing_written() {
    // Proves that an agent may speak only for the node its certificate names, and that only
    // agent certificates may speak the agent protocol.
    let cluster = Cluster::start(1, &[]);
    cluster.wait_for_leader(&[1]).await;
    let admin = cluster.admin();
    let agent = FakeAgent::connect(&cluster, "node-1").await;

    let answer = agent
        .call(AgentRequest::Register {
            inventory: inventory("node-2", 1),
            actual: Vec::new(),
            cluster: None,
        })
        .await;
    assert!(
        matches!(answer, AgentResponse::Error(AgentError::Unauthorized(_))),
        "{answer:?}"
    );
    let answer = agent.heartbeat("node-2", 1).await;
    assert!(
        matches!(answer, AgentResponse::Error(AgentError::Unauthorized(_))),
        "{answer:?}"
    );
    assert!(nodes(&admin).await.is_empty(), "nothing was registered");

    // An admin certificate on the agent protocol loses its connection.
    let tls = TlsIdentity::load(&cluster.certs.files("alice")).expect("admin TLS files");
    let client = Client::new(tls);
    let connection = client
        .connect_to(&cluster.address(1), ALPN_AGENT)
        .await
        .expect("the handshake itself succeeds");
    let answer = connection
        .request::<_, AgentResponse>(
            &AgentRequest::Register {
                inventory: inventory("alice", 1),
                actual: Vec::new(),
                cluster: None,
            },
            AGENT_CALL,
        )
        .await;
    assert!(answer.is_err(), "an admin got an answer: {answer:?}");
    assert!(nodes(&admin).await.is_empty(), "nothing was registered");
    admin.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_failure_requeues_or_fails_the_job_and_frees_its_gpu() {
    // Proves that a LaunchFailed report reaches the replicated state: the node's fault puts
    // the job back in the queue (placed again as attempt 2, not counted as a preemption), a
    // stale report of attempt 1 is then refused, the job's fault fails it with the reason
    // `job get` shows (the runtime's message cut to its limit), and its GPU goes to the next
    // job.
    let cluster = Cluster::start(1, &[]);
    cluster.wait_for_leader(&[1]).await;
    let admin = cluster.admin();
    let agent = FakeAgent::connect(&cluster, "node-1").await;
    agent.register("node-1", 1).await;
    create(&admin, share_of("team", Strategy::Lend, 1)).await;
    let id = support::submit(&admin, support::job("team", 5)).await;
    let next = support::submit(&admin, support::job("team", 1)).await;
    let placed = |attempt: u32| {
        move |state: &DesiredState| {
            state
                .allocations
                .iter()
                .any(|a| a.job == id && a.attempt == attempt && a.intent == WireIntent::Run)
        }
    };
    agent
        .watch_until("node-1", "attempt 1 placed", placed(1))
        .await;
    let failed = |fault: LaunchFault, message: String| JobEvent::LaunchFailed {
        fault,
        tries: 3,
        message,
    };

    eprintln!("--- the node's fault: back to the queue, placed again");
    let node_fault = failed(
        LaunchFault::Node,
        "docker create container: connection refused".into(),
    );
    let rejected = agent
        .report("node-1", vec![report(id, 1, node_fault.clone())])
        .await;
    assert!(rejected.is_empty(), "{rejected:?}");
    agent
        .watch_until("node-1", "attempt 2 placed", placed(2))
        .await;
    let view = job(&admin, id).await;
    assert_eq!((view.attempts, view.preemptions), (2, 0), "{view:?}");

    eprintln!("--- a stale report of attempt 1 is refused");
    let rejected = agent
        .report("node-1", vec![report(id, 1, node_fault)])
        .await;
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(rejected[0].2.contains("another attempt"), "{rejected:?}");
    assert_eq!(job(&admin, id).await.attempts, 2, "nothing changed");

    eprintln!("--- the job's fault: FAILED with the reason, the GPU free");
    let long = format!("exec: \"train\": not found{}", " in $PATH".repeat(1_000));
    let rejected = agent
        .report(
            "node-1",
            vec![report(id, 2, failed(LaunchFault::Job, long))],
        )
        .await;
    assert!(rejected.is_empty(), "{rejected:?}");
    let view = wait_job_state(&admin, id, "FAILED").await;
    let reason = view.reason.expect("a reason");
    assert!(
        reason
            .starts_with("launch failed on node node-1 after 3 tries: exec: \"train\": not found"),
        "{reason}"
    );
    assert!(reason.contains("fix its command"), "{reason}");
    assert!(
        reason.len() < LAUNCH_MESSAGE_BYTES_MAX + 200,
        "the message is cut: {} bytes",
        reason.len()
    );
    assert_eq!(view.node, None);
    agent
        .watch_until("node-1", "the next job placed", |state| {
            state.allocations.iter().any(|a| a.job == next)
        })
        .await;
    admin.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_node_runs_a_submitted_job_and_unknown_reports_are_rejected() {
    // Proves Register -> node ready, a submit -> a desired allocation (Run) on the long
    // poll, reports -> RUNNING, that reports of allocations it does not hold are rejected, and
    // that a heartbeat's GPU health change is recorded.
    let cluster = Cluster::start(1, &[]);
    cluster.wait_for_leader(&[1]).await;
    let admin = cluster.admin();
    let agent = FakeAgent::connect(&cluster, "node-1").await;

    let incarnation = agent.register("node-1", 2).await;
    assert!(incarnation >= 1);
    let listed = nodes(&admin).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, "ready");
    assert_eq!(listed[0].gpus.len(), 2);
    assert!(matches!(
        agent.heartbeat("node-1", 2).await,
        AgentResponse::HeartbeatAck
    ));
    // A heartbeat lists at most the protocol's ACTUAL_ATTEMPTS_MAX attempts.
    let listing = |count: usize| AgentRequest::Heartbeat {
        node: "node-1".to_string(),
        gpus: inventory("node-1", 2).gpus,
        actual: (0..count)
            .map(|index| ActualAttempt {
                job: JobId(1_000 + index as u64),
                attempt: 1,
                phase: ActualPhase::Running,
            })
            .collect(),
    };
    assert!(matches!(
        agent.call(listing(ACTUAL_ATTEMPTS_MAX)).await,
        AgentResponse::HeartbeatAck
    ));
    assert!(matches!(
        agent.call(listing(ACTUAL_ATTEMPTS_MAX + 1)).await,
        AgentResponse::Error(AgentError::BadRequest(_))
    ));

    let empty = agent.watch("node-1", Fence::default()).await;
    assert!(empty.allocations.is_empty());
    // Nothing new: the long poll waits for its timeout and answers the same fence.
    let started = Instant::now();
    let same = agent.watch("node-1", empty.fence).await;
    assert_eq!(same.fence, empty.fence);
    assert!(started.elapsed() >= Duration::from_millis(WATCH_TIMEOUT_MS / 2));

    create(&admin, share_of("team", Strategy::LendAndBorrow, 2)).await;
    // Heard from just now: a node silent past a heartbeat is unreachable, and gets no job.
    agent.heartbeat("node-1", 2).await;
    let id = support::submit(&admin, support::job("team", 5)).await;
    let desired = agent
        .watch_until("node-1", "the job placed on node-1", |state| {
            state.allocations.iter().any(|a| a.job == id)
        })
        .await;
    assert!(desired.fence > empty.fence);
    let allocation = &desired.allocations[0];
    assert_eq!(allocation.intent, WireIntent::Run);
    assert_eq!(allocation.attempt, 1);
    assert_eq!(allocation.gpu_indices.len(), 1);
    assert_eq!(
        allocation.gpu_uuids,
        vec![format!("GPU-node-1-{}", allocation.gpu_indices[0])]
    );
    assert_eq!(job(&admin, id).await.state, "SCHEDULED");

    let rejected = agent
        .report(
            "node-1",
            vec![
                report(id, 1, JobEvent::Started),
                report(id, 1, JobEvent::Running),
            ],
        )
        .await;
    assert!(rejected.is_empty(), "{rejected:?}");
    wait_job_state(&admin, id, "RUNNING").await;

    let rejected = agent
        .report(
            "node-1",
            vec![
                report(JobId(999), 1, JobEvent::Running),
                report(id, 7, JobEvent::Exited { code: 0 }),
            ],
        )
        .await;
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    assert_eq!(job(&admin, id).await.state, "RUNNING", "nothing changed");

    // A report that names another node than the agent's own is refused whole.
    let mut elsewhere = report(id, 1, JobEvent::Exited { code: 0 });
    elsewhere.node = "node-2".to_string();
    let refused = agent
        .call(AgentRequest::Report {
            node: "node-1".to_string(),
            reports: vec![elsewhere],
        })
        .await;
    match refused {
        AgentResponse::Error(AgentError::BadRequest(why)) => {
            assert!(why.contains("names node node-2"), "{why}")
        }
        other => panic!("a report for another node was not refused: {other:?}"),
    }
    assert_eq!(job(&admin, id).await.state, "RUNNING", "nothing changed");

    let rejected = agent
        .report("node-1", vec![report(id, 1, JobEvent::Exited { code: 0 })])
        .await;
    assert!(rejected.is_empty(), "{rejected:?}");
    wait_job_state(&admin, id, "SUCCEEDED").await;
    agent
        .watch_until("node-1", "the finished job gone", |state| {
            state.allocations.is_empty()
        })
        .await;

    // A GPU reported unhealthy in a heartbeat is recorded (only the change is committed).
    let mut gpus = inventory("node-1", 2).gpus;
    gpus[1].healthy = false;
    let answer = agent
        .call(AgentRequest::Heartbeat {
            node: "node-1".into(),
            gpus,
            actual: Vec::new(),
        })
        .await;
    assert!(matches!(answer, AgentResponse::HeartbeatAck), "{answer:?}");
    poll_until("GPU 1 of node-1 unhealthy", CONVERGE, || async {
        let listed = nodes(&admin).await;
        let health: Vec<bool> = listed[0].gpus.iter().map(|gpu| gpu.healthy).collect();
        (health == [true, false]).then_some(())
    })
    .await;
    admin.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_turns_the_victims_intent_to_stop_and_frees_its_gpu_for_the_lender() {
    // Proves that the scheduling loop commits a reclaim, the victim's desired intent becomes
    // Stop, and once the agent reports its exit the lender's job is placed on the freed GPU.
    let cluster = Cluster::start(1, &[]);
    cluster.wait_for_leader(&[1]).await;
    let admin = cluster.admin();
    let agent = FakeAgent::connect(&cluster, "node-1").await;
    agent.register("node-1", 2).await;
    create(&admin, share_of("lender", Strategy::Lend, 1)).await;
    create(&admin, share_of("borrower", Strategy::LendAndBorrow, 1)).await;

    let own = support::submit(&admin, support::job("borrower", 2)).await;
    let borrowed = support::submit(&admin, support::job("borrower", 1)).await;
    agent
        .watch_until("node-1", "both borrower jobs placed", |state| {
            state.allocations.len() == 2
        })
        .await;
    for id in [own, borrowed] {
        let rejected = agent
            .report("node-1", vec![report(id, 1, JobEvent::Running)])
            .await;
        assert!(rejected.is_empty(), "{rejected:?}");
        wait_job_state(&admin, id, "RUNNING").await;
    }

    let lender = support::submit(&admin, support::job("lender", 1)).await;
    let desired = agent
        .watch_until("node-1", "the borrowed job told to stop", |state| {
            state
                .allocations
                .iter()
                .any(|a| a.job == borrowed && a.intent == WireIntent::Stop)
        })
        .await;
    let kept = desired
        .allocations
        .iter()
        .find(|a| a.job == own)
        .expect("the borrower's own job stays");
    assert_eq!(kept.intent, WireIntent::Run);
    assert_eq!(job(&admin, borrowed).await.state, "PREEMPTING");
    assert_eq!(job(&admin, lender).await.state, "RUNNABLE");

    let rejected = agent
        .report(
            "node-1",
            vec![report(
                borrowed,
                1,
                JobEvent::ExitedAfterSignal { code: Some(0) },
            )],
        )
        .await;
    assert!(rejected.is_empty(), "{rejected:?}");
    let requeued = wait_job_state(&admin, borrowed, "RUNNABLE").await;
    assert_eq!(requeued.preemptions, 1);
    assert_eq!(requeued.last_preemption.as_deref(), Some("reclaim"));
    agent
        .watch_until("node-1", "the lender's job placed", |state| {
            state
                .allocations
                .iter()
                .any(|a| a.job == lender && a.intent == WireIntent::Run)
                && !state.allocations.iter().any(|a| a.job == borrowed)
        })
        .await;
    admin.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_lost_only_after_agent_lease_grace_and_margin() {
    // Proves the node lease: a node whose heartbeats stop is marked lost no sooner than the
    // agent lease + its jobs' largest grace period + the margin, and its job is requeued.
    const LEASE_MS: u64 = 1_000;
    const HEARTBEAT_MS: u64 = 200;
    const MARGIN_MS: u64 = quotient_coordinator::config::NODE_LEASE_MARGIN_MIN_MS;
    const GRACE_MS: u64 = 1_500;
    let cluster = Cluster::start(
        1,
        &[
            "--agent-lease-ms",
            &LEASE_MS.to_string(),
            "--agent-heartbeat-ms",
            &HEARTBEAT_MS.to_string(),
            "--node-lease-margin-ms",
            &MARGIN_MS.to_string(),
        ],
    );
    cluster.wait_for_leader(&[1]).await;
    let admin = cluster.admin();
    let agent = FakeAgent::connect(&cluster, "node-1").await;
    match agent
        .call(AgentRequest::Register {
            inventory: inventory("node-1", 1),
            actual: Vec::new(),
            cluster: None,
        })
        .await
    {
        AgentResponse::Registered {
            agent_lease_ms,
            heartbeat_ms,
            ..
        } => {
            assert_eq!(agent_lease_ms, LEASE_MS);
            assert_eq!(heartbeat_ms, HEARTBEAT_MS);
        }
        other => panic!("registration failed: {other:?}"),
    }
    create(&admin, share_of("team", Strategy::LendAndBorrow, 1)).await;
    let mut spec = support::job("team", 1);
    spec.grace_period_ms = GRACE_MS;
    let id = support::submit(&admin, spec).await;
    agent
        .watch_until("node-1", "the job placed", |state| {
            !state.allocations.is_empty()
        })
        .await;
    agent
        .report("node-1", vec![report(id, 1, JobEvent::Running)])
        .await;
    wait_job_state(&admin, id, "RUNNING").await;

    // Heartbeats keep it alive well past the lease.
    let alive_until = Instant::now() + Duration::from_millis(LEASE_MS + GRACE_MS + MARGIN_MS);
    while Instant::now() < alive_until {
        assert!(matches!(
            agent.heartbeat("node-1", 1).await,
            AgentResponse::HeartbeatAck
        ));
        tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS)).await;
    }
    assert_eq!(nodes(&admin).await[0].state, "ready");

    let silent_since = Instant::now();
    let last = agent.heartbeat("node-1", 1).await;
    assert!(matches!(last, AgentResponse::HeartbeatAck));
    poll_until("node-1 lost", CONVERGE, || async {
        (nodes(&admin).await[0].state == "lost").then_some(())
    })
    .await;
    let silent = silent_since.elapsed();
    assert!(
        silent >= Duration::from_millis(LEASE_MS + GRACE_MS + MARGIN_MS),
        "lost after only {silent:?}"
    );
    let requeued = job(&admin, id).await;
    assert_eq!(requeued.last_preemption.as_deref(), Some("node-lost"));
    assert!(
        requeued.state == "RUNNABLE",
        "the job is requeued (no other node): {requeued:?}"
    );
    // The lost node must register again before anything else.
    let answer = agent.heartbeat("node-1", 1).await;
    assert!(
        matches!(answer, AgentResponse::Error(AgentError::NotRegistered)),
        "{answer:?}"
    );
    agent.register("node-1", 1).await;
    agent
        .watch_until("node-1", "the job placed again, attempt 2", |state| {
            state
                .allocations
                .iter()
                .any(|a| a.job == id && a.attempt == 2 && a.intent == WireIntent::Run)
        })
        .await;
    admin.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_names_the_leader_and_writes_nothing() {
    // Proves that followers answer every agent request with NotLeader and the leader's
    // address, so an agent finds the leader from any coordinator.
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let follower = [1, 2, 3]
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    let tls = TlsIdentity::load(&cluster.certs.files("node-1")).expect("agent TLS files");
    let client = Client::new(tls);
    let connection = client
        .connect_to(&cluster.address(follower), ALPN_AGENT)
        .await
        .expect("a connection to the follower");
    let answer = connection
        .request::<_, AgentResponse>(
            &AgentRequest::Register {
                inventory: inventory("node-1", 1),
                actual: Vec::new(),
                cluster: None,
            },
            AGENT_CALL,
        )
        .await
        .expect("an answer");
    match answer {
        AgentResponse::Error(AgentError::NotLeader {
            leader_id,
            leader_address,
        }) => {
            assert_eq!(leader_id, Some(leader));
            assert_eq!(leader_address, Some(cluster.advertised_address(leader)));
        }
        other => panic!("a follower answered {other:?}"),
    }
    let admin = cluster.admin();
    assert!(nodes(&admin).await.is_empty(), "nothing was registered");
    admin.close();
    connection.close();
    client.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_others_stops_answering_heartbeats_and_the_agent_moves_on() {
    // Proves that a leader without a quorum cannot keep an agent's lease alive (it may already
    // be deposed, and the new leader counts the node's lease from its own heartbeats): it
    // refuses heartbeats within about LEADER_QUORUM_ACK_MAX_MS, the agent finds the new
    // leader, and after the heal the old one names it.
    let cluster = Cluster::start_behind_proxies(3, &[]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let others = cluster.ids_except(&[leader]);
    let agent = FakeAgent::connect(&cluster, "node-1").await;
    agent.register("node-1", 1).await;
    assert_eq!(
        agent.heartbeat("node-1", 1).await,
        AgentResponse::HeartbeatAck
    );

    eprintln!("--- coordinator {leader} cut off from the others; the agent still reaches it");
    cluster.isolate(leader);
    let cut = Instant::now();
    let refusal = poll_until(
        "the cut-off leader refusing heartbeats",
        CONVERGE,
        || async {
            match agent.heartbeat("node-1", 1).await {
                AgentResponse::HeartbeatAck => None,
                other => Some(other),
            }
        },
    )
    .await;
    let took = cut.elapsed();
    eprintln!("refused after {took:?}: {refusal:?}");
    assert!(
        matches!(refusal, AgentResponse::Error(AgentError::Unavailable(_))),
        "{refusal:?}"
    );
    // Well inside the agent's lease, so the agent has time to find the new leader.
    assert!(
        took < Duration::from_millis(LEADER_QUORUM_ACK_MAX_MS + AGENT_LEASE_DEFAULT_MS / 4),
        "the cut-off leader answered heartbeats for {took:?}"
    );

    eprintln!("--- the agent finds the new leader among {others:?}");
    let new_leader = cluster.wait_for_leader(&others).await;
    let moved = FakeAgent::connect_among(
        &cluster,
        "node-1",
        others.iter().map(|id| cluster.address(*id)).collect(),
    )
    .await;
    assert_eq!(
        moved.heartbeat("node-1", 1).await,
        AgentResponse::HeartbeatAck
    );

    eprintln!("--- healed: coordinator {leader} names coordinator {new_leader}");
    cluster.heal();
    let after = cluster.wait_for_leader(&[1, 2, 3]).await;
    match agent.heartbeat("node-1", 1).await {
        AgentResponse::Error(AgentError::NotLeader { leader_id, .. }) => {
            assert_eq!(leader_id, Some(after))
        }
        AgentResponse::HeartbeatAck => assert_eq!(after, leader, "only a leader answers"),
        other => panic!("the old leader answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_or_garbled_frame_costs_only_its_stream() {
    // Proves that a frame announcing more than the frame limit, or one that does not decode,
    // is refused before anything is written, and that the agent's connection stays usable.
    let cluster = Cluster::start(1, &[]);
    cluster.wait_for_leader(&[1]).await;
    let admin = cluster.admin();
    let agent = FakeAgent::connect(&cluster, "node-1").await;
    let header = |length: u32| {
        let mut header = quotient_common::frame::FRAME_MAGIC.to_vec();
        header.extend_from_slice(&AGENT_WIRE.current.to_be_bytes());
        header.extend_from_slice(&length.to_be_bytes());
        header
    };
    let oversized = header(
        u32::try_from(quotient_common::frame::MAX_FRAME_BYTES + 1).expect("the limit fits a u32"),
    );
    let mut garbled = header(8);
    garbled.extend_from_slice(&[0xff; 8]);
    for bytes in [oversized, garbled] {
        let (mut send, mut recv) = agent
            .connection
            .connection()
            .open_bi()
            .await
            .expect("a stream");
        send.write_all(&bytes).await.expect("the bytes are sent");
        let _ = send.finish();
        let answer = tokio::time::timeout(AGENT_CALL, recv.read_to_end(1 << 20))
            .await
            .expect("the coordinator reacts within the deadline");
        assert!(answer.is_err(), "a bad frame got an answer: {answer:?}");
    }
    assert!(nodes(&admin).await.is_empty(), "nothing was registered");
    agent.register("node-1", 1).await;
    assert_eq!(nodes(&admin).await.len(), 1, "the connection still works");
    admin.close();
}
