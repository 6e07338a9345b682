//! One coordinator process, wired up: the TLS identity, the Raft storage in the data
//! directory, the Raft node with its QUIC network, and one QUIC endpoint that serves both the
//! client API (`quotient-api/1`) and Raft (`quotient-raft/1`).
//!
//! [`Coordinator::start`] returns once the endpoint is bound, so tests can run a coordinator
//! in-process and read its address; [`run`] is start, wait for `shutdown`, stop (the shape
//! the binary uses). A coordinator never bootstraps a cluster by itself: one on an empty data
//! directory waits until `quotient cluster init` is sent to it (`cluster_init`) or a leader adds
//! it as a learner (`cluster add-member`, or `cluster init` on another initial peer); a restart
//! finds its cluster identity, log and snapshot on disk and rejoins (`identity`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use quotient_common::certs::Role;
use quotient_common::metrics_http::MetricsServer;
use quotient_common::tls::{TlsError, TlsIdentity};
use quotient_common::transport::{Client, Server, TransportError, ALPN_AGENT, ALPN_API, ALPN_RAFT};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::agent_links::AgentLinks;
use crate::agent_service::AgentService;
use crate::api::ApiService;
use crate::config::{ConfigError, CoordinatorConfig};
use crate::context::Context;
use crate::desired::DesiredTracker;
use crate::identity::{ClusterIdentity, IdentityError};
use crate::metrics::{CoordinatorDoor, CoordinatorMetrics};
use crate::network::PeerConnections;
use crate::node_disks::NodeDisks;
use crate::node_leases::NodeLeases;
use crate::proposer::Proposer;
use crate::store::type_config::Raft;
use crate::store::{self, MemberId, QuotientStateMachine};
use crate::{applied, digest_check, node_leases, raft_service, scheduler_loop};

/// How long shutdown waits for connections to close cleanly (milliseconds).
pub const SHUTDOWN_GRACE_MS: u64 = 2_000;

/// Why a coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("the certificate names {0}, but a coordinator needs a coordinator certificate; issue one with `quotient certs issue --role coordinator --name NAME`")]
    WrongRole(String),
    #[error("cannot open the raft storage: {0}")]
    Storage(String),
    #[error("cannot start raft: {0}")]
    Raft(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Raft stopped by itself while serving: a storage write failed, say. Nothing unsynced
    /// was reported durable; the data directory holds everything synced before.
    #[error("raft stopped: {0}")]
    RaftStopped(String),
    #[error("cannot serve the AWS endpoint on {0}: {1}; pick a free address for --aws-listen")]
    Aws(SocketAddr, std::io::Error),
    #[error("--aws-instance-type: {0}")]
    AwsSettings(String),
    #[error("cannot serve metrics on {0}: {1}; pick a free address for --metrics-listen")]
    Metrics(SocketAddr, std::io::Error),
}

/// A running coordinator.
pub struct Coordinator {
    id: MemberId,
    raft: Raft,
    state_machine: QuotientStateMachine,
    server: Arc<Server>,
    client: Arc<Client>,
    local_addr: SocketAddr,
    accept_task: JoinHandle<()>,
    /// The leader's loops (scheduling, node leases, desired-state refresh).
    loops: Vec<JoinHandle<()>>,
    /// What of the Raft log is durable, and whether a write of it failed.
    durability: crate::store::LogDurability<MemberId>,
    /// `/metrics` and health, when `metrics_listen` is set.
    metrics_server: Option<MetricsServer>,
    /// The AWS Batch–compatible endpoint, when `aws.listen` is set.
    aws_server: Option<crate::aws::AwsServer>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("id", &self.id)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Coordinator {
    /// Opens the storage and the cluster identity, starts Raft and binds the endpoint.
    pub async fn start(config: CoordinatorConfig) -> Result<Coordinator, CoordinatorError> {
        config.validate()?;
        let tls = TlsIdentity::load(&config.tls_files())?;
        if tls.identity().role != Role::Coordinator {
            return Err(CoordinatorError::WrongRole(tls.identity().to_string()));
        }
        if config.data_dir.exists() && !config.data_dir.is_dir() {
            return Err(CoordinatorError::Config(ConfigError::Invalid(format!(
                "the data directory {} is not a directory: give --data-dir a directory (an \
                 empty or missing one for a new coordinator)",
                config.data_dir.display()
            ))));
        }
        let data_dir = config.data_dir.clone();
        let (mut log_store, state_machine) =
            tokio::task::spawn_blocking(move || store::open(&data_dir).map_err(|e| e.to_string()))
                .await
                .map_err(|error| CoordinatorError::Storage(error.to_string()))?
                .map_err(CoordinatorError::Storage)?;
        let (data_dir, retain_history_ms) = (config.data_dir.clone(), config.retention.history_ms);
        let history = tokio::task::spawn_blocking(move || {
            crate::history::History::open(&data_dir, retain_history_ms).map_err(|e| e.to_string())
        })
        .await
        .map_err(|error| CoordinatorError::Storage(error.to_string()))?
        .map_err(CoordinatorError::Storage)?;
        state_machine.attach_history(Arc::new(history));
        let log_state = log_store
            .get_log_state()
            .await
            .map_err(|error| CoordinatorError::Storage(error.to_string()))?;
        let raft_state_present = has_raft_state(&log_state, &mut log_store, &state_machine).await?;
        // Entries up to the log's end now are replays of this member's own log: their digest
        // checks were computed by whatever release ran then, and are not compared; their
        // stamps are old, not the cluster's time now.
        state_machine.replays_until(log_state.last_log_id.map_or(0, |id| id.index));
        if store::resume_as_follower(&mut log_store, config.id)
            .await
            .map_err(|error| CoordinatorError::Storage(error.to_string()))?
        {
            tracing::info!(
                id = config.id,
                "this member led the cluster when it stopped; it starts as a follower and campaigns in a new term"
            );
        }
        let (data_dir, id, configured) = (config.data_dir.clone(), config.id, config.cluster_id);
        let identity = tokio::task::spawn_blocking(move || {
            ClusterIdentity::open(&data_dir, id, raft_state_present, configured)
        })
        .await
        .map_err(|error| CoordinatorError::Storage(error.to_string()))??;
        let raft_config = config.raft_config()?;
        let durability = log_store.durability();
        let ctx_durability = durability.clone();
        let client = Arc::new(Client::new(tls.clone()));
        let peers = PeerConnections::new(client.clone(), durability.clone(), identity.clone())
            .with_revocations(state_machine.clone());
        let raft = Raft::new(
            config.id,
            raft_config,
            peers.clone(),
            log_store,
            state_machine.clone(),
        )
        .await
        .map_err(|error| CoordinatorError::Raft(error.to_string()))?;
        peers.watch_membership(raft.metrics());

        let metrics = CoordinatorMetrics::for_identity(&tls);
        let server = Arc::new(
            Server::bind(config.listen, &tls, &[ALPN_API, ALPN_RAFT, ALPN_AGENT])?
                .counting_refusals_in(metrics.handshakes_refused_source()),
        );
        let local_addr = server.local_addr()?;
        let ctx = Context {
            config: Arc::new(config.clone()),
            identity: identity.clone(),
            proposer: Proposer::start(raft.clone()),
            raft: raft.clone(),
            state_machine: state_machine.clone(),
            peers,
            durability,
            agent_links: AgentLinks::new(),
            node_disks: NodeDisks::new(),
            desired: DesiredTracker::new(),
            leases: NodeLeases::new(config.agents.clone()),
            scheduler: Arc::new(Notify::new()),
            metrics,
        };
        let metrics_server = match config.metrics_listen {
            Some(addr) => Some(
                MetricsServer::start(addr, Arc::new(CoordinatorDoor { ctx: ctx.clone() }))
                    .await
                    .map_err(|error| CoordinatorError::Metrics(addr, error))?,
            ),
            None => None,
        };
        let aws_server = match config.aws.listen {
            Some(addr) => {
                let instance_types =
                    crate::aws::InstanceTypes::with_overrides(&config.aws.instance_types)
                        .map_err(CoordinatorError::AwsSettings)?;
                let settings = crate::aws::AwsSettings {
                    region: config.aws.region.clone(),
                    instance_types,
                };
                Some(
                    crate::aws::AwsServer::start(
                        addr,
                        tls.https_server_config()?,
                        ctx.clone(),
                        settings,
                    )
                    .await
                    .map_err(|error| CoordinatorError::Aws(addr, error))?,
                )
            }
            None => None,
        };
        let loops = vec![
            // Said in the log ahead of time: a coordinator whose certificate expires can
            // connect to no other, and with a second fault the cluster loses its quorum
            // (found by probing: silent until then).
            tokio::spawn(tls.clone().log_expiry_notices()),
            tokio::spawn(scheduler_loop::run(ctx.clone())),
            tokio::spawn(node_leases::run(ctx.clone())),
            tokio::spawn(crate::retention_loop::run(ctx.clone())),
            tokio::spawn(follow_applies(ctx.clone())),
            tokio::spawn(digest_check::run(ctx.clone())),
        ];
        let accept_task = tokio::spawn(accept_loop(server.clone(), ctx));
        tracing::info!(
            id = config.id,
            %local_addr,
            data_dir = %config.data_dir.display(),
            identity = %tls.identity(),
            "coordinator listening"
        );
        match identity.cluster() {
            Some(cluster) => tracing::info!(%cluster, "rejoining the cluster recorded in the data directory"),
            None => tracing::info!(
                "the data directory holds no Raft state: waiting to be added to a cluster (`quotient cluster add-member`), or for `quotient cluster init` to bootstrap a new one here; this coordinator does not vote until then"
            ),
        }
        Ok(Coordinator {
            id: config.id,
            raft,
            state_machine,
            server,
            client,
            local_addr,
            accept_task,
            loops,
            durability: ctx_durability,
            metrics_server,
            aws_server,
        })
    }

    /// This coordinator's Raft id.
    pub fn id(&self) -> MemberId {
        self.id
    }

    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address the AWS endpoint is served on, when it is.
    pub fn aws_addr(&self) -> Option<SocketAddr> {
        self.aws_server
            .as_ref()
            .map(crate::aws::AwsServer::local_addr)
    }

    /// The address `/metrics` is served on, when it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(MetricsServer::local_addr)
    }

    /// The Raft handle (metrics, tests).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The state machine (reads without Raft, for tests).
    pub fn state_machine(&self) -> &QuotientStateMachine {
        &self.state_machine
    }

    /// Completes when Raft stops by itself (a fatal error: a storage write failed, say),
    /// with the reason; never while Raft runs.
    pub async fn raft_stopped(&self) -> String {
        // The server metrics change only with elections and membership, not with every
        // write as the full metrics do, and their channel closes when Raft's core ends,
        // after it has put the reason in the full metrics.
        let mut server = self.raft.server_metrics();
        let core_ended = async { while server.changed().await.is_ok() {} };
        tokio::select! {
            () = core_ended => {}
            // A failed log write ends this member at once, not at Raft's next write, which
            // may be long in coming (found by `quotient-chaos`: an idle member with a full
            // disk stayed up 37 s answering nothing).
            reason = self.durability.failed() => {
                return format!("when writing the raft log: {reason}");
            }
        }
        match &self.raft.metrics().borrow().running_state {
            Err(fatal) => fatal.to_string(),
            Ok(()) => "raft stopped without saying why".to_string(),
        }
    }

    /// Stops Raft and closes the endpoint.
    pub async fn shutdown(self) {
        tracing::info!(id = self.id, "coordinator shutting down");
        if let Err(error) = self.raft.shutdown().await {
            tracing::warn!(error = %error, "raft did not shut down cleanly");
        }
        self.server.close();
        self.client.close();
        let _ = tokio::time::timeout(
            Duration::from_millis(SHUTDOWN_GRACE_MS),
            self.server.wait_idle(),
        )
        .await;
        self.accept_task.abort();
        if let Some(server) = &self.metrics_server {
            server.stop();
        }
        if let Some(server) = &self.aws_server {
            server.stop();
        }
        for task in self.loops {
            task.abort();
        }
        if let Some(history) = self.state_machine.history() {
            history.close();
        }
    }
}

/// Starts a coordinator, serves until `shutdown` completes, then stops it.
///
/// If Raft stops by itself first (a log write failed: a full or failing disk), this stops
/// the rest and returns [`CoordinatorError::RaftStopped`], so that the process exits and its
/// supervisor sees it, rather than staying up as a member that answers nothing. A write is
/// never retried after a failed sync, whose outcome on disk is unknown; a restart reads back
/// what the disk holds.
pub async fn run(
    config: CoordinatorConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), CoordinatorError> {
    let coordinator = Coordinator::start(config).await?;
    let stopped = tokio::select! {
        () = shutdown => None,
        reason = coordinator.raft_stopped() => Some(reason),
    };
    if let Some(reason) = &stopped {
        tracing::error!(id = coordinator.id, reason = %reason, "raft stopped; the coordinator exits");
    }
    coordinator.shutdown().await;
    match stopped {
        None => Ok(()),
        Some(reason) => Err(CoordinatorError::RaftStopped(reason)),
    }
}

/// Whether the data directory holds any Raft state: a vote, log entries (or a purge mark), or
/// a snapshot.
async fn has_raft_state(
    log: &openraft::storage::LogState<store::TypeConfig>,
    log_store: &mut store::LogStore,
    state_machine: &QuotientStateMachine,
) -> Result<bool, CoordinatorError> {
    let storage =
        |error: openraft::StorageError<MemberId>| CoordinatorError::Storage(error.to_string());
    let vote = log_store.read_vote().await.map_err(storage)?;
    Ok(log.last_log_id.is_some()
        || log.last_purged_log_id.is_some()
        || vote.is_some()
        || state_machine.last_applied().is_some())
}

/// On the leader, after every applied batch of log entries (and every change of term),
/// refreshes the desired state of the nodes the batch changed, which wakes their agents' long
/// polls, and triggers a scheduling round if anything changed ([`applied::follow`]).
/// Watching Raft's metrics, rather than hooking the state machine, keeps the storage code
/// free of leader concerns; what a batch applied between two looks changed is still drained
/// once, by this or by the next write's own refresh.
async fn follow_applies(ctx: Context) {
    let Context {
        raft,
        state_machine,
        desired,
        scheduler,
        metrics: counts,
        ..
    } = ctx;
    let mut metrics = raft.metrics();
    let mut seen = (0u64, None);
    loop {
        let (term, applied, running, leader) = {
            let current = metrics.borrow_and_update();
            (
                current.current_term,
                current.last_applied,
                current.running_state.is_ok(),
                current.state == openraft::ServerState::Leader,
            )
        };
        if !running {
            return;
        }
        // A member that does not lead keeps the cluster's time, from its leader's stamps.
        quotient_common::steady_clock::set_following(!leader);
        // Only the leader serves desired state and schedules; a follower that becomes
        // leader sees a new term, so it refreshes at once.
        if leader && (term, applied) != seen {
            seen = (term, applied);
            applied::follow(&state_machine, &desired, &scheduler, &counts, term);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Accepts connections and hands each to the service of its ALPN.
async fn accept_loop(server: Arc<Server>, ctx: Context) {
    let api = ApiService::new(&ctx);
    let agents = AgentService::new(&ctx);
    while let Some(incoming) = server.accept().await {
        let ctx = ctx.clone();
        let api = api.clone();
        let agents = agents.clone();
        tokio::spawn(async move {
            let address = incoming.remote_address();
            let connection = match incoming.handshake().await {
                Ok(connection) => connection,
                Err(error) => {
                    tracing::warn!(%address, error = %error, "refused a connection");
                    return;
                }
            };
            if connection.alpn() == ALPN_RAFT {
                raft_service::serve_connection(ctx, connection).await;
            } else if connection.alpn() == ALPN_API {
                api.serve_connection(connection).await;
            } else if connection.alpn() == ALPN_AGENT {
                agents.serve_connection(connection).await;
            } else {
                tracing::warn!(%address, "refused a connection with an unknown protocol");
                connection.close();
            }
        });
    }
}
