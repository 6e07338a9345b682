//! A fake leading coordinator for the agent's session tests: it speaks `quotient-agent/1`
//! over the real transport with a coordinator certificate, registers agents, acknowledges
//! heartbeats, serves a desired state the test sets, records reports and disk use, and can
//! misbehave on demand (answer NotLeader, stop answering, send an oversized frame).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use quotient_common::agent_api::{
    ActualAttempt, AgentError, AgentRequest, AgentResponse, DesiredState, DiskUsage, Fence,
};
use quotient_common::certs::{self, Role};
use quotient_common::frame::{self, MAX_FRAME_BYTES};
use quotient_common::tls::{TlsFiles, TlsIdentity};
use quotient_common::transport::{quinn, Server, ALPN_AGENT};
use quotient_common::version::AGENT_WIRE;
use quotient_common::{ClusterId, GpuDevice, JobReport, NodeInventory};

/// How long the fake holds a WatchDesired with nothing new (the real leader's is longer).
pub const WATCH_HOLD: Duration = Duration::from_millis(1_000);
/// How long a silent fake holds a request before dropping it unanswered.
pub const SILENT_HOLD: Duration = Duration::from_secs(60);
/// How often a held request looks at the state again.
const HOLD_POLL: Duration = Duration::from_millis(20);

/// How the fake answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Serve,
    /// Every request: NotLeader, naming this address as the leader.
    NotLeader(String),
    /// Accepts connections and requests but never answers.
    Silent,
    /// Answers WatchDesired with a frame over the size limit; serves the rest.
    OversizedDesired,
    /// Refuses heartbeats as a leader without a quorum's recent acknowledgement does
    /// (`Unavailable`); serves the rest.
    RefuseHeartbeats,
    /// Answers heartbeats only after [`SLOW_HOLD`], past the agent's deadline (a busy
    /// leader: its QUIC side still acknowledges packets); everything else as `Serve`.
    SlowHeartbeats,
}

/// How long [`Mode::SlowHeartbeats`] holds a heartbeat before it answers.
pub const SLOW_HOLD: Duration = Duration::from_millis(1_500);

/// What the fake has seen and will serve.
#[derive(Debug)]
pub struct LeaderState {
    pub mode: Mode,
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    pub registrations: Vec<(NodeInventory, Vec<ActualAttempt>)>,
    pub heartbeat_count: u64,
    /// Heartbeats refused as unavailable in [`Mode::RefuseHeartbeats`].
    pub refused_heartbeats: u64,
    /// Heartbeats held in [`Mode::SlowHeartbeats`].
    pub slow_heartbeats: u64,
    pub last_heartbeat: Option<(Vec<GpuDevice>, Vec<ActualAttempt>)>,
    pub reports: Vec<JobReport>,
    pub desired: Option<DesiredState>,
    /// The cluster the fake says it leads, in `Registered`.
    pub cluster: ClusterId,
    /// The cluster each registration said the agent belongs to.
    pub registered_clusters: Vec<Option<ClusterId>>,
    /// The last disk use the agent reported.
    pub disk_usage: Option<DiskUsage>,
    /// Agent connections accepted (each a TLS handshake).
    pub connections: u64,
}

/// The cluster a fake leader leads unless a test sets another.
pub const FAKE_CLUSTER: ClusterId = ClusterId::from_bytes([0x42; 16]);

/// A fake leader listening on 127.0.0.1.
pub struct FakeLeader {
    state: Arc<Mutex<LeaderState>>,
    address: SocketAddr,
    server: Arc<Server>,
    task: tokio::task::JoinHandle<()>,
}

/// Makes the cluster CA in `dir` and issues certificates for coordinator `coord-1` and the
/// agents named.
pub fn make_certs(dir: &Path, agents: &[&str]) {
    certs::init_ca(dir).expect("make the CA");
    certs::issue(dir, Role::Coordinator, "coord-1", &[]).expect("issue coordinator cert");
    for agent in agents {
        certs::issue(dir, Role::Agent, agent, &[]).expect("issue agent cert");
    }
}

impl FakeLeader {
    /// Starts a fake leader with the coordinator certificate in `cert_dir`.
    pub fn start(cert_dir: &Path, lease_ms: u64, heartbeat_ms: u64) -> FakeLeader {
        let tls = TlsIdentity::load(&TlsFiles::in_dir(cert_dir, "coord-1")).expect("load tls");
        let server = Arc::new(
            Server::bind("127.0.0.1:0".parse().unwrap(), &tls, &[ALPN_AGENT]).expect("bind"),
        );
        let address = server.local_addr().expect("local address");
        let state = Arc::new(Mutex::new(LeaderState {
            mode: Mode::Serve,
            lease_ms,
            heartbeat_ms,
            registrations: Vec::new(),
            heartbeat_count: 0,
            refused_heartbeats: 0,
            slow_heartbeats: 0,
            last_heartbeat: None,
            reports: Vec::new(),
            desired: None,
            cluster: FAKE_CLUSTER,
            registered_clusters: Vec::new(),
            disk_usage: None,
            connections: 0,
        }));
        let task = tokio::spawn(accept_loop(server.clone(), state.clone()));
        FakeLeader {
            state,
            address,
            server,
            task,
        }
    }

    /// `127.0.0.1:PORT`, as an agent's `--coordinators` names it.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    pub fn state(&self) -> MutexGuard<'_, LeaderState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state().mode = mode;
    }

    pub fn set_desired(&self, desired: DesiredState) {
        self.state().desired = Some(desired);
    }
}

impl Drop for FakeLeader {
    fn drop(&mut self) {
        self.server.close();
        self.task.abort();
    }
}

async fn accept_loop(server: Arc<Server>, state: Arc<Mutex<LeaderState>>) {
    while let Some(incoming) = server.accept().await {
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(connection) = incoming.handshake().await else {
                return;
            };
            if connection.require_role(&[Role::Agent]).is_err() {
                return;
            }
            lock(&state).connections += 1;
            while let Ok((send, recv)) = connection.connection().accept_bi().await {
                tokio::spawn(serve_stream(send, recv, state.clone()));
            }
        });
    }
}

fn lock(state: &Mutex<LeaderState>) -> MutexGuard<'_, LeaderState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    state: Arc<Mutex<LeaderState>>,
) {
    let Ok(request) = frame::read_frame::<AgentRequest>(&mut recv, MAX_FRAME_BYTES).await else {
        return;
    };
    let mode = lock(&state).mode.clone();
    let response = match mode {
        Mode::Silent => {
            tokio::time::sleep(SILENT_HOLD).await;
            return;
        }
        Mode::NotLeader(address) => not_leader(address),
        Mode::OversizedDesired if matches!(request, AgentRequest::WatchDesired { .. }) => {
            let mut bytes = frame::FRAME_MAGIC.to_vec();
            bytes.extend_from_slice(&AGENT_WIRE.current.to_be_bytes());
            bytes.extend_from_slice(&((MAX_FRAME_BYTES + 1) as u32).to_be_bytes());
            bytes.extend_from_slice(&[0u8; 1024]);
            let _ = send.write_all(&bytes).await;
            let _ = send.finish();
            let _ = send.stopped().await;
            return;
        }
        Mode::RefuseHeartbeats if matches!(request, AgentRequest::Heartbeat { .. }) => {
            lock(&state).refused_heartbeats += 1;
            AgentResponse::Error(AgentError::Unavailable(
                "no quorum acknowledged this leader within the last second".into(),
            ))
        }
        Mode::SlowHeartbeats if matches!(request, AgentRequest::Heartbeat { .. }) => {
            lock(&state).slow_heartbeats += 1;
            tokio::time::sleep(SLOW_HOLD).await;
            match answer(request, &state).await {
                Some(response) => response,
                None => return,
            }
        }
        Mode::Serve | Mode::OversizedDesired | Mode::RefuseHeartbeats | Mode::SlowHeartbeats => {
            match answer(request, &state).await {
                Some(response) => response,
                None => return,
            }
        }
    };
    if let Ok(bytes) = frame::encode_frame(&response) {
        let _ = send.write_all(&bytes).await;
        let _ = send.finish();
        let _ = send.stopped().await;
    }
}

fn not_leader(address: String) -> AgentResponse {
    AgentResponse::Error(AgentError::NotLeader {
        leader_id: Some(2),
        leader_address: Some(address),
    })
}

async fn answer(request: AgentRequest, state: &Mutex<LeaderState>) -> Option<AgentResponse> {
    match request {
        AgentRequest::Register {
            inventory,
            actual,
            cluster,
        } => {
            let mut state = lock(state);
            state.registrations.push((inventory, actual));
            state.registered_clusters.push(cluster);
            Some(AgentResponse::Registered {
                node_incarnation: state.registrations.len() as u64,
                agent_lease_ms: state.lease_ms,
                heartbeat_ms: state.heartbeat_ms,
                cluster: state.cluster,
            })
        }
        AgentRequest::Heartbeat { gpus, actual, .. } => {
            let mut state = lock(state);
            state.heartbeat_count += 1;
            state.last_heartbeat = Some((gpus, actual));
            Some(AgentResponse::HeartbeatAck)
        }
        AgentRequest::DiskUsage { usage, .. } => {
            lock(state).disk_usage = Some(usage);
            Some(AgentResponse::DiskUsageRecorded)
        }
        AgentRequest::Report { reports, .. } => {
            lock(state).reports.extend(reports);
            Some(AgentResponse::Reported {
                rejected: Vec::new(),
            })
        }
        AgentRequest::WatchDesired { node, after_fence } => {
            let held_until = Instant::now() + WATCH_HOLD;
            loop {
                {
                    let state = lock(state);
                    match &state.mode {
                        Mode::Silent => return None,
                        Mode::NotLeader(address) => return Some(not_leader(address.clone())),
                        _ => {}
                    }
                    let current = state.desired.clone();
                    if let Some(desired) = &current {
                        if desired.fence > after_fence {
                            return Some(AgentResponse::Desired(desired.clone()));
                        }
                    }
                    if Instant::now() >= held_until {
                        return Some(AgentResponse::Desired(current.unwrap_or(DesiredState {
                            node,
                            fence: Fence::default(),
                            allocations: Vec::new(),
                        })));
                    }
                }
                tokio::time::sleep(HOLD_POLL).await;
            }
        }
    }
}
