//! The server side of the client API (ALPN `quotient-api/1`): authorises each request by the
//! caller's certificate, turns writes into Raft commands and reads into views.
//!
//! - **Authorisation** is checked on every request, from the role in the peer certificate:
//!   share, node and membership management need `admin`; jobs and reads need `user` or
//!   `admin`; `Health` is open to every certificate of the cluster. Anything else gets
//!   [`ApiError::Unauthorized`].
//! - **Removing a node** is refused on the leader while the node's agent is connected to it
//!   (the agent would register the host again at once); the state machine refuses the rest
//!   (a ready node, one with jobs).
//! - **Writes** go through the [`Proposer`] (several commands per Raft entry) and are
//!   acknowledged once committed and applied; a rejection by the state machine comes back as [`ApiError::Rejected`] with the
//!   core's words. Specs are also checked before proposing, so a malformed one never reaches
//!   the log. A job submitted without a name is named here, before it is proposed
//!   ([`generated_job_name`]: part of the name is random, and the state machine must stay
//!   deterministic).
//! - **Reads** are linearizable: `ensure_linearizable` on the leader, then the state machine.
//!   `JobLogs` then asks the agent that ran the attempt ([`crate::job_logs`]).
//! - A follower answers [`ApiError::NotLeader`] with the leader's id and address, which the
//!   client follows (`quotient_client::ApiClient`, which the CLI uses too).
//! - An answer over the frame limit ([`API_FRAME_BYTES_MAX`], e.g. `ListJobs` of a few
//!   hundred thousand jobs) is not sent: the client gets [`ApiError::AnswerTooLarge`], which
//!   says its size and how to narrow the request, and a warning is logged ([`answer_frame`]).
//!
//! Every request is read within [`API_REQUEST_READ_TIMEOUT_MS`] and answered within
//! [`API_REQUEST_TIMEOUT_MS`] ([`MEMBERSHIP_TIMEOUT_MS`] for membership changes, which wait
//! for a learner to catch up).

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use openraft::{BasicNode, ChangeMembers};
use quotient_client::{ApiClient, ClientError, QuicExchange, RetryPolicy};
use quotient_common::api::{
    how_to_narrow, parse_history_page_token, parse_job_page_token, parse_node_page_token, ApiError,
    ApiRequest, ApiResponse, EventPage, HealthView, WriteTag, API_FRAME_BYTES_MAX, EVENT_PAGE_MAX,
    JOB_PAGE_DEFAULT, JOB_PAGE_MAX, NODE_PAGE_MAX,
};
use quotient_common::certs::{PeerIdentity, Role};
use quotient_common::frame::{self, FrameError, HEADER_BYTES};
use quotient_common::job::validate_priority;
use quotient_common::job_name::generated_job_name;
use quotient_common::transport::{
    Client, PeerConnection, RequestStream, RESPONSE_WRITE_TIMEOUT_MS,
};
use quotient_common::version::API_WIRE;
use quotient_common::NodeState;
use quotient_core::{Command, Outcome, Rejection};

use crate::context::Context;
use crate::history::HistoryQuery;
use crate::identity::ClusterIdentity;
use crate::proposer::NotProposed;
use crate::store::MemberId;
use crate::views;
use crate::{cluster_init, job_logs};

/// Deadline for a client to deliver its request once it opened the stream (milliseconds).
pub const API_REQUEST_READ_TIMEOUT_MS: u64 = 10_000;
/// Deadline for answering one request, Raft commit included (milliseconds).
pub const API_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Longest a follower spends forwarding one request to the leader (milliseconds): less than
/// a client's deadline for one attempt (`quotient_client::policy::ATTEMPT_DEADLINE_MS`, 12 s),
/// so that a forward that reached no leader comes back as "no leader yet", which the client
/// retries, rather than as a lost answer.
pub const FORWARD_TIMEOUT_MS: u64 = 3_000;
/// Deadline for a membership change: the new member must catch up first (milliseconds).
pub const MEMBERSHIP_TIMEOUT_MS: u64 = 120_000;
/// How long `AddMember` waits for the new learner to catch up before it makes it a voter
/// (milliseconds); under [`MEMBERSHIP_TIMEOUT_MS`], so the answer says why when it does not.
pub const LEARNER_CATCH_UP_MS: u64 = 100_000;

/// The client API's handlers, over the coordinator's [`Context`]; cheap to clone.
#[derive(Clone)]
pub struct ApiService {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Context,
    forwarder: Forwarder,
}

/// The client a follower forwards requests to the leader with, over this coordinator's own
/// QUIC client; one connection to the leader last forwarded to, kept between requests.
struct Forwarder {
    client: Arc<Client>,
    identity: ClusterIdentity,
    leader: Mutex<Option<(String, ApiClient)>>,
}

impl Forwarder {
    fn client_of(&self, leader: &str) -> Result<ApiClient, ClientError> {
        let mut cached = self.leader.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((address, client)) = cached.as_ref() {
            if address == leader {
                return Ok(client.clone());
            }
        }
        let exchange = QuicExchange::over(Arc::clone(&self.client), self.identity.cluster());
        let client =
            ApiClient::with_exchange(exchange, vec![leader.to_string()], RetryPolicy::default())?;
        if let Some((_, old)) = cached.replace((leader.to_string(), client.clone())) {
            old.close();
        }
        Ok(client)
    }
}

impl std::fmt::Debug for ApiService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiService")
            .field("id", &self.inner.ctx.id())
            .finish()
    }
}

/// Who may send `request`: `Ok` or the reason for refusing.
pub fn authorise(peer: &PeerIdentity, request: &ApiRequest) -> Result<(), ApiError> {
    let allowed: &[Role] = if matches!(request, ApiRequest::Health) {
        &Role::ALL
    } else if request.needs_admin() {
        &[Role::Admin]
    } else {
        &[Role::Admin, Role::User]
    };
    if allowed.contains(&peer.role) {
        return Ok(());
    }
    let needed = if request.needs_admin() {
        "an admin certificate"
    } else {
        "a user or admin certificate"
    };
    Err(ApiError::Unauthorized(format!(
        "{peer} may not do this; it needs {needed}"
    )))
}

/// Who a request is served for and the request itself, out of its wrapper, and whether the
/// caller asked for it to be served through the leader ([`ApiRequest::ViaLeader`]). A
/// [`ApiRequest::Forwarded`] one is served for the caller it names, and only a coordinator may
/// send it (the follower that forwarded it authenticated that caller).
fn unwrap_request(
    peer: &PeerIdentity,
    request: ApiRequest,
) -> Result<(PeerIdentity, ApiRequest, bool), ApiError> {
    let (caller, request, via_leader) = match request {
        ApiRequest::ViaLeader(request) => (peer.clone(), *request, true),
        ApiRequest::Forwarded { caller, request } => {
            if peer.role != Role::Coordinator {
                return Err(ApiError::Unauthorized(format!(
                    "{peer} may not forward requests for others; only coordinators do"
                )));
            }
            let caller = match PeerIdentity::from_uri(&caller) {
                Ok(Some(caller)) => caller,
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "a forwarded request must name its caller as quotient://ROLE/NAME, not {caller:?}"
                    )))
                }
            };
            (caller, *request, false)
        }
        request => (peer.clone(), request, false),
    };
    if matches!(
        request,
        ApiRequest::ViaLeader(_) | ApiRequest::Forwarded { .. } | ApiRequest::InCluster { .. }
    ) {
        return Err(ApiError::BadRequest(
            "a request served through the leader cannot hold another one".to_string(),
        ));
    }
    Ok((caller, request, via_leader))
}

tokio::task_local! {
    /// The session tag of the write being answered, if its client sent one: the writes made
    /// through [`ApiService::write_done_as`] carry it into the log (`Command::InSession`).
    static WRITE_TAG: Option<WriteTag>;
}

/// `request` out of its [`ApiRequest::InSession`] wrapper, with the tag; refused when the
/// wrapper holds what may not travel in a session, or the tag does not hold together.
fn out_of_session(request: ApiRequest) -> Result<(Option<WriteTag>, ApiRequest), ApiError> {
    let ApiRequest::InSession { tag, request } = request else {
        return Ok((None, request));
    };
    if !request.is_session_write() {
        return Err(ApiError::BadRequest(format!(
            "a {} request cannot travel in a write session; send it bare",
            request.name()
        )));
    }
    tag.check().map_err(ApiError::BadRequest)?;
    Ok((Some(tag), *request))
}

/// `request` back in its session's wrapper, to forward it whole.
fn in_session(tag: Option<WriteTag>, request: ApiRequest) -> ApiRequest {
    match tag {
        Some(tag) => ApiRequest::InSession {
            tag,
            request: Box::new(request),
        },
        None => request,
    }
}

/// The idempotency key the coordinators keep for `caller`'s submit with `key`: the caller's
/// own ([`quotient_common::JobSpec::caller_scoped_key`]), so that another user's submit with
/// the same key makes its own job and learns nothing of this one. A key that a build before
/// this scoping kept as it was sent, for a live job of this caller, stays as it is, so that
/// a submit resent across the upgrade is still answered with the job it made. A pure
/// function of the replicated state, so every coordinator keeps the same key.
fn stored_idempotency_key(state: &quotient_core::State, caller: &str, key: String) -> String {
    let kept_unscoped = state
        .idempotent_job(&key)
        .and_then(|job| state.job(job))
        .is_some_and(|record| record.spec.owner.as_deref() == Some(caller));
    if kept_unscoped {
        key
    } else {
        quotient_common::JobSpec::caller_scoped_key(caller, &key)
    }
}

/// `command` made for `caller`: an admin's or a user's is checked and audited by `apply`
/// ([`Command::As`]); another role's (none reaches a write) as it is.
fn as_caller(caller: &PeerIdentity, command: Command) -> Command {
    match caller.role {
        Role::Admin | Role::User => Command::As {
            caller: quotient_core::Caller {
                name: caller.name.clone(),
                admin: caller.role == Role::Admin,
            },
            command: Box::new(command),
        },
        Role::Coordinator | Role::Agent => command,
    }
}

fn not_leader(forward: &ForwardToLeader<MemberId, BasicNode>) -> ApiError {
    ApiError::NotLeader {
        leader_id: forward.leader_id,
        leader_address: forward.leader_node.as_ref().map(|node| node.addr.clone()),
    }
}

fn invalid(error: quotient_common::SpecError) -> ApiError {
    ApiError::Rejected(Rejection::Invalid(error))
}

impl ApiService {
    pub fn new(ctx: &Context) -> Self {
        ApiService {
            inner: Arc::new(Inner {
                forwarder: Forwarder {
                    client: ctx.peers.client(),
                    identity: ctx.identity.clone(),
                    leader: Mutex::new(None),
                },
                ctx: ctx.clone(),
            }),
        }
    }

    /// Serves one connection on the API ALPN until it closes; each request on its own task.
    pub async fn serve_connection(self, connection: PeerConnection) {
        let peer = connection.peer().clone();
        let serial: Option<Arc<str>> = connection.serial().map(Arc::from);
        let address = connection.remote_address();
        tracing::debug!(%peer, %address, "api client connected");
        loop {
            let stream = match connection.accept_request().await {
                Ok(Some(stream)) => stream,
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%peer, %address, error = %error, "api connection ended");
                    break;
                }
            };
            let service = self.clone();
            let peer = peer.clone();
            let serial = serial.clone();
            tokio::spawn(
                async move { service.serve_request(peer, serial.as_deref(), stream).await },
            );
        }
    }

    async fn serve_request(
        &self,
        peer: PeerIdentity,
        serial: Option<&str>,
        mut stream: RequestStream,
    ) {
        let request: ApiRequest = match stream
            .read_request(Duration::from_millis(API_REQUEST_READ_TIMEOUT_MS))
            .await
        {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%peer, error = %error, "refused a bad api request");
                return;
            }
        };
        let kind = request.unwrapped().name();
        let narrow = how_to_narrow(&request);
        let response = self.handle(&peer, serial, request).await;
        let version = stream.version().unwrap_or(API_WIRE.current);
        let frame = match answer_frame(&response, narrow, version) {
            Ok(Answer::Whole(frame)) => frame,
            Ok(Answer::TooLarge { frame, size_bytes }) => {
                tracing::warn!(
                    %peer,
                    request = kind,
                    size_bytes,
                    limit_bytes = API_FRAME_BYTES_MAX,
                    "an answer is over the frame limit; sent an error saying so instead"
                );
                frame
            }
            Err(error) => {
                tracing::error!(%peer, request = kind, error = %error, "could not encode an api answer");
                return;
            }
        };
        if let Err(error) = stream
            .respond_frame(&frame, Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS))
            .await
        {
            tracing::debug!(%peer, error = %error, "could not answer an api request");
        }
    }

    /// Authorises and answers one request, within its deadline. `serial` is the serial number
    /// of the peer's certificate.
    pub async fn handle(
        &self,
        peer: &PeerIdentity,
        serial: Option<&str>,
        request: ApiRequest,
    ) -> ApiResponse {
        let request = match self.for_this_cluster(request) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%peer, error = %error, "refused an api request for another cluster");
                return ApiResponse::Error(error);
            }
        };
        // A forwarded request's caller is another coordinator's client, whose certificate (and
        // serial) that coordinator checked; here only a revocation of the whole name counts.
        // The coordinator that forwards it must not be revoked itself: a coordinator's key
        // that leaked would act for any caller it names (found by probing: revoking a
        // coordinator's name was acknowledged and changed nothing).
        let serial = match request {
            ApiRequest::Forwarded { .. } => {
                if self.inner.ctx.state_machine.is_revoked(peer, serial) {
                    tracing::warn!(%peer, "refused a request forwarded by a revoked certificate");
                    return ApiResponse::Error(ApiError::Rejected(Rejection::Forbidden(format!(
                        "the certificate of {} is revoked: it may forward nothing",
                        peer.name
                    ))));
                }
                None
            }
            _ => serial,
        };
        let (caller, request, via_leader) = match unwrap_request(peer, request) {
            Ok(parts) => parts,
            Err(error) => {
                tracing::warn!(%peer, error = %error, "refused a wrapped api request");
                return ApiResponse::Error(error);
            }
        };
        let (tag, request) = match out_of_session(request) {
            Ok(parts) => parts,
            Err(error) => {
                tracing::warn!(%peer, error = %error, "refused a wrapped api request");
                return ApiResponse::Error(error);
            }
        };
        let peer = &caller;
        let revoked = self.inner.ctx.state_machine.is_revoked(peer, serial);
        if revoked && !matches!(request, ApiRequest::Health) {
            tracing::warn!(%peer, request = request.name(), "refused a revoked certificate");
            return ApiResponse::Error(ApiError::Rejected(Rejection::Forbidden(format!(
                "the certificate of {} is revoked: ask an admin for a new one",
                peer.name
            ))));
        }
        if let Err(error) = authorise(peer, &request) {
            tracing::warn!(%peer, request = request.name(), "refused an unauthorised api request");
            self.record_refusal(peer, request.name(), &error);
            return ApiResponse::Error(error);
        }
        let deadline = Duration::from_millis(match request {
            ApiRequest::AddMember { .. }
            | ApiRequest::RemoveMember { .. }
            | ApiRequest::InitCluster
            | ApiRequest::Backup { .. } => MEMBERSHIP_TIMEOUT_MS,
            _ => API_REQUEST_TIMEOUT_MS,
        });
        let started = tokio::time::Instant::now();
        let write = request.is_write();
        let kind = request.name();
        let forwardable = via_leader.then(|| in_session(tag, request.clone()));
        let answer =
            tokio::time::timeout(deadline, WRITE_TAG.scope(tag, self.answer(peer, request))).await;
        let response = match answer {
            Ok(Ok(response)) => response,
            Ok(Err(ApiError::NotLeader {
                leader_address: Some(leader),
                ..
            })) if forwardable.is_some() => {
                let request = forwardable.expect("checked by the guard");
                let within = deadline.saturating_sub(started.elapsed());
                // Boxed: inline, the forwarding client's future made every request's task
                // (a submit's included) twice as large to spawn and move (7 KB against 3.4).
                Box::pin(self.forward(peer, request, leader, within)).await
            }
            Ok(Err(error)) => {
                if write && !matches!(error, ApiError::NotLeader { .. }) {
                    tracing::info!(%peer, error = %error, "api write refused");
                }
                ApiResponse::Error(error)
            }
            // A write may still commit after its deadline: the caller must not take this for a
            // refusal. A read changed nothing, and is worth asking again.
            Err(_) if write => ApiResponse::Error(ApiError::Uncertain(format!(
                "no commit within {} ms (is a quorum of coordinators up?)",
                deadline.as_millis()
            ))),
            Err(_) => ApiResponse::Error(ApiError::Unavailable(format!(
                "no answer within {} ms (is a quorum of coordinators up?)",
                deadline.as_millis()
            ))),
        };
        self.inner.ctx.metrics.api_request(kind, started.elapsed());
        response
    }

    /// `request` out of its [`ApiRequest::InCluster`] wrapper, when the cluster it names is
    /// this coordinator's (or this coordinator has joined none yet, and so cannot tell).
    /// `Health` is answered whatever the cluster: it is about the coordinator that answers,
    /// and names its cluster, so that `quotient cluster health` can show the mismatch.
    fn for_this_cluster(&self, request: ApiRequest) -> Result<ApiRequest, ApiError> {
        let ApiRequest::InCluster { cluster, request } = request else {
            return Ok(request);
        };
        match self.inner.ctx.identity.cluster() {
            _ if matches!(*request, ApiRequest::Health) => Ok(*request),
            Some(mine) if mine != cluster => Err(ApiError::OtherCluster {
                coordinator_id: self.inner.ctx.id(),
                coordinator_cluster: mine.to_string(),
                client_cluster: cluster.to_string(),
            }),
            _ if matches!(*request, ApiRequest::InCluster { .. }) => Err(ApiError::BadRequest(
                "a request for a cluster cannot hold another one".to_string(),
            )),
            _ => Ok(*request),
        }
    }

    /// Sends `request` of `caller` to the leader at `leader` (its address among the
    /// coordinators) and returns its answer, within `within`.
    async fn forward(
        &self,
        caller: &PeerIdentity,
        request: ApiRequest,
        leader: String,
        within: Duration,
    ) -> ApiResponse {
        let within = within.min(Duration::from_millis(FORWARD_TIMEOUT_MS));
        let client = match self.inner.forwarder.client_of(&leader) {
            Ok(client) => client.with_call_timeout(within),
            Err(error) => return ApiResponse::Error(ApiError::Internal(error.to_string())),
        };
        let forwarded = ApiRequest::Forwarded {
            caller: caller.uri(),
            request: Box::new(request),
        };
        match client.call(forwarded).await {
            Ok(response) => response,
            Err(ClientError::Api(error)) => ApiResponse::Error(error),
            // It reached no leader that would carry it out (the one this coordinator knows
            // is gone, or none is elected yet): as "no leader yet", which clients retry.
            Err(error @ (ClientError::Unavailable { .. } | ClientError::Unreachable { .. })) => {
                tracing::debug!(%leader, %error, "could not forward a request to the leader");
                ApiResponse::Error(ApiError::NotLeader {
                    leader_id: None,
                    leader_address: None,
                })
            }
            Err(ClientError::Uncertain(why)) => ApiResponse::Error(ApiError::Uncertain(format!(
                "forwarding to the leader at {leader}: {why}"
            ))),
            Err(error) => ApiResponse::Error(ApiError::Internal(format!(
                "forwarding to the leader at {leader}: {error}"
            ))),
        }
    }

    async fn answer(
        &self,
        caller: &PeerIdentity,
        request: ApiRequest,
    ) -> Result<ApiResponse, ApiError> {
        match request {
            ApiRequest::Health => Ok(ApiResponse::Health(self.health())),
            ApiRequest::CreateShare(spec) => {
                spec.validate().map_err(invalid)?;
                self.write_done_as(caller, Command::CreateShare(spec)).await
            }
            ApiRequest::UpdateShare { name, update } => {
                self.write_done_as(caller, Command::UpdateShare { name, update })
                    .await
            }
            ApiRequest::DeleteShare { name } => {
                self.write_done_as(caller, Command::DeleteShare { name })
                    .await
            }
            ApiRequest::SubmitJob(mut spec) => {
                spec.validate_new().map_err(invalid)?;
                self.scope_idempotency_key(caller, &mut spec);
                if spec.name.is_none() {
                    spec.name = Some(generated_job_name(&spec, name_bits()));
                }
                match self
                    .write(as_caller(caller, Command::SubmitJob(spec)))
                    .await?
                {
                    Outcome::JobSubmitted { job, duplicate } => {
                        Ok(ApiResponse::JobSubmitted { job, duplicate })
                    }
                    other => Err(ApiError::Internal(format!(
                        "unexpected outcome of a submit: {other:?}"
                    ))),
                }
            }
            ApiRequest::UpdateJobPriority { job, priority } => {
                validate_priority(priority).map_err(invalid)?;
                self.write_done_as(caller, Command::UpdateJobPriority { job, priority })
                    .await
            }
            ApiRequest::CancelJob { job } => {
                self.write_done_as(caller, Command::CancelJob { job }).await
            }
            ApiRequest::CordonNode { node } => {
                self.write_done_as(caller, Command::CordonNode { node })
                    .await
            }
            ApiRequest::UncordonNode { node } => {
                self.write_done_as(
                    caller,
                    Command::SetNodeState {
                        node,
                        state: NodeState::Ready,
                    },
                )
                .await
            }
            ApiRequest::DrainNode { node } => {
                self.write_done_as(caller, Command::DrainNode { node })
                    .await
            }
            ApiRequest::RemoveNode { node } => {
                self.check_node_removable(&node)?;
                self.write_done_as(caller, Command::RemoveNode { node })
                    .await
            }
            // Reads and membership changes await larger futures than a write; boxed, they do
            // not make every request's task (a submit's included) that large to spawn and move.
            ApiRequest::CreateGroup { name, users } => {
                self.write_done_as(caller, Command::CreateGroup { name, users })
                    .await
            }
            ApiRequest::UpdateGroup { name, add, remove } => {
                self.write_done_as(caller, Command::UpdateGroup { name, add, remove })
                    .await
            }
            ApiRequest::DeleteGroup { name } => {
                self.write_done_as(caller, Command::DeleteGroup { name })
                    .await
            }
            ApiRequest::Revoke { name, serial } => {
                self.write_done_as(caller, Command::Revoke { name, serial })
                    .await
            }
            ApiRequest::Unrevoke { name } => {
                self.write_done_as(caller, Command::Unrevoke { name }).await
            }
            ApiRequest::CreateAccessKey { user, admin } => {
                let (id, secret) = crate::access_keys::new_key().map_err(|_| {
                    ApiError::Internal("the system's random source failed".to_string())
                })?;
                let command = Command::CreateAccessKey {
                    id: id.clone(),
                    user: user.clone(),
                    admin,
                    secret: secret.clone(),
                };
                self.write(as_caller(caller, command)).await?;
                let key = quotient_core::aws::AccessKey {
                    user,
                    admin,
                    secret,
                    created_ms: self
                        .inner
                        .ctx
                        .state_machine
                        .read(|state| state.access_key(&id).map_or(0, |key| key.created_ms)),
                };
                Ok(ApiResponse::AccessKey(crate::access_keys::view(
                    &id, &key, true,
                )))
            }
            ApiRequest::DeleteAccessKey { id } => {
                self.write_done_as(caller, Command::DeleteAccessKey { id })
                    .await
            }
            ApiRequest::PutAwsObject { key, value } => {
                self.write_done_as(caller, Command::PutAwsObject { key, value })
                    .await
            }
            ApiRequest::SubmitServiceJob { mut spec, request } => {
                spec.validate_new().map_err(invalid)?;
                self.scope_idempotency_key(caller, &mut spec);
                match self
                    .write(as_caller(
                        caller,
                        Command::SubmitServiceJob { spec, request },
                    ))
                    .await?
                {
                    Outcome::JobSubmitted { job, duplicate } => {
                        Ok(ApiResponse::JobSubmitted { job, duplicate })
                    }
                    other => Err(ApiError::Internal(format!(
                        "unexpected outcome of a submit: {other:?}"
                    ))),
                }
            }
            read_or_membership => {
                Box::pin(self.answer_read_or_membership(caller, read_or_membership)).await
            }
        }
    }

    /// [`Self::answer`] for the requests that are not plain writes.
    async fn answer_read_or_membership(
        &self,
        caller: &PeerIdentity,
        request: ApiRequest,
    ) -> Result<ApiResponse, ApiError> {
        let user = (caller.role != Role::Admin).then_some(caller.name.as_str());
        match request {
            ApiRequest::AddMember { id, address } => self.add_member(id, address).await,
            ApiRequest::InitCluster => cluster_init::init(
                &self.inner.ctx.raft,
                &self.inner.ctx.identity,
                &self.inner.ctx.peers,
                &self.inner.ctx.config.peers,
            )
            .await
            .map(ApiResponse::ClusterInitialised),
            ApiRequest::RemoveMember { id } => self.remove_member(id).await,
            ApiRequest::ListShares => {
                self.linearizable().await?;
                Ok(ApiResponse::Shares(
                    self.inner.ctx.state_machine.read(views::share_views),
                ))
            }
            ApiRequest::GetShare { name } => {
                self.linearizable().await?;
                self.inner
                    .ctx
                    .state_machine
                    .read(|state| views::share_view_named(state, &name))
                    .map(ApiResponse::Share)
                    .ok_or_else(|| ApiError::Rejected(Rejection::UnknownShare(name.clone())))
            }
            ApiRequest::GetJob { job } => {
                self.linearizable().await?;
                self.check_job_visible(caller, user, job, "job get")?;
                self.inner
                    .ctx
                    .state_machine
                    .read(|state| views::job_view_by_id(state, job))
                    .map(|view| ApiResponse::Job(Box::new(view)))
                    .ok_or_else(|| self.missing_job(job))
            }
            ApiRequest::ListJobs {
                share,
                state,
                mine,
                name_prefix,
                limit,
                page_token,
            } => {
                let limit = page_limit(limit)?;
                let before = page_token
                    .as_deref()
                    .map(|token| parse_token(token, parse_job_page_token))
                    .transpose()?;
                self.linearizable().await?;
                let filter = views::JobFilter {
                    share: share.as_deref(),
                    state,
                    name_prefix: name_prefix.as_deref(),
                    user,
                    owner: mine.then_some(caller.name.as_str()),
                };
                Ok(ApiResponse::Jobs(self.inner.ctx.state_machine.read(|s| {
                    views::job_page(s, filter, before, limit as usize)
                })))
            }
            ApiRequest::JobHistory {
                share,
                since_ms,
                until_ms,
                state,
                job,
                limit,
                page_token,
            } => {
                let limit = page_limit(limit)?;
                let before = page_token
                    .as_deref()
                    .map(|token| parse_token(token, parse_history_page_token))
                    .transpose()?;
                // This coordinator's own copy: no leader, no quorum needed.
                let Some(history) = self.inner.ctx.state_machine.history().cloned() else {
                    return Err(ApiError::Unavailable(
                        "this coordinator keeps no job history yet".into(),
                    ));
                };
                // A user reads the records of their own jobs and of their shares' jobs.
                let visible: Option<(String, BTreeSet<String>)> = user.map(|user| {
                    let shares = self.inner.ctx.state_machine.read(|s| {
                        s.shares()
                            .filter(|share| s.user_may_use(user, &share.spec.name))
                            .map(|share| share.spec.name.clone())
                            .collect()
                    });
                    (user.to_string(), shares)
                });
                let query = HistoryQuery {
                    share,
                    since_ms,
                    until_ms,
                    state,
                    job,
                    limit: limit as usize,
                    before,
                };
                let page = tokio::task::spawn_blocking(move || {
                    history.page(&query, |record| {
                        visible.as_ref().is_none_or(|(user, shares)| {
                            record.owner.as_deref() == Some(user.as_str())
                                || shares.contains(&record.share)
                        })
                    })
                })
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?
                .map_err(|e| ApiError::Internal(e.to_string()))?;
                Ok(ApiResponse::History(page))
            }
            ApiRequest::ShareUsage {
                share,
                since_ms,
                until_ms,
                by_day,
            } => {
                self.linearizable().await?;
                let now = crate::node_leases::wall_ms();
                let until = until_ms.unwrap_or(now);
                Ok(ApiResponse::Usage(self.inner.ctx.state_machine.read(|s| {
                    views::usage_rows(s, share.as_deref(), since_ms, until, by_day, now)
                })))
            }
            ApiRequest::Events {
                after,
                since_ms,
                job,
                share,
                node,
                limit,
            } => {
                self.linearizable().await?;
                let limit = match limit {
                    0 => EVENT_PAGE_MAX,
                    limit => limit.min(EVENT_PAGE_MAX),
                } as usize;
                // A user reads the events of the shares they may use (and of nodes and
                // shares); an admin every event.
                let filter = quotient_core::events::EventFilter {
                    after,
                    since_ms,
                    job,
                    share,
                    node,
                    user: user.map(str::to_string),
                };
                // A first page with nothing, for a job, share or node that neither exists
                // nor left an event, is a typo rather than a quiet thing.
                self.inner
                    .ctx
                    .state_machine
                    .read(|state| {
                        let (events, newest) = state.events(&filter, limit);
                        let unknown = (after == 0 && events.is_empty())
                            .then(|| state.unknown_event_subject(&filter))
                            .flatten();
                        match unknown {
                            Some(rejection) => Err(ApiError::Rejected(rejection)),
                            None => Ok(EventPage {
                                events,
                                newest,
                                oldest: state.oldest_event(),
                            }),
                        }
                    })
                    .map(ApiResponse::Events)
            }
            ApiRequest::Backup { snapshot, offset } => {
                if snapshot.is_none() {
                    // Everything committed when asked is in the backup.
                    self.linearizable().await?;
                }
                crate::backup::chunk(&self.inner.ctx, snapshot, offset).await
            }
            ApiRequest::ListGroups => {
                self.linearizable().await?;
                Ok(ApiResponse::Groups(
                    self.inner.ctx.state_machine.read(views::group_views),
                ))
            }
            ApiRequest::Audit { since_ms, user } => {
                self.linearizable().await?;
                Ok(ApiResponse::Audit(self.inner.ctx.state_machine.read(|s| {
                    views::audit_views(s, since_ms, user.as_deref())
                })))
            }
            ApiRequest::ListRevoked => {
                self.linearizable().await?;
                Ok(ApiResponse::Revoked(
                    self.inner.ctx.state_machine.read(views::revoked_views),
                ))
            }
            ApiRequest::ListAccessKeys => {
                self.linearizable().await?;
                Ok(ApiResponse::AccessKeys(self.inner.ctx.state_machine.read(
                    |state| {
                        state
                            .access_keys()
                            .map(|(id, key)| crate::access_keys::view(id, key, false))
                            .collect()
                    },
                )))
            }
            ApiRequest::ListAwsObjects { prefix } => {
                self.linearizable().await?;
                Ok(ApiResponse::AwsObjects(self.inner.ctx.state_machine.read(
                    |state| {
                        state
                            .aws_objects(&prefix)
                            .map(|(key, value)| (key.to_string(), value.to_string()))
                            .collect()
                    },
                )))
            }
            ApiRequest::GetServiceJob { job } => {
                self.linearizable().await?;
                self.check_job_visible(caller, user, job, "job get")?;
                self.inner
                    .ctx
                    .state_machine
                    .read(|state| {
                        let view = views::job_view_by_id(state, job)?;
                        Some(ApiResponse::ServiceJob {
                            job: Box::new(view),
                            request: state.service_job(job).map(str::to_string),
                        })
                    })
                    .ok_or_else(|| self.missing_job(job))
            }
            ApiRequest::ExplainJob { job } => {
                self.linearizable().await?;
                self.check_job_visible(caller, user, job, "job explain")?;
                self.inner
                    .ctx
                    .state_machine
                    .read(|state| quotient_core::explain(state, job))
                    .map(|explanation| ApiResponse::Explanation {
                        summary: explanation.summary,
                        details: explanation.details,
                    })
                    .ok_or_else(|| self.missing_job(job))
            }
            ApiRequest::JobLogs {
                job,
                attempt,
                offset,
                max_bytes,
                rank,
            } => {
                self.linearizable().await?;
                let owner = self
                    .inner
                    .ctx
                    .state_machine
                    .read(|state| state.job(job).and_then(|record| record.spec.owner.clone()));
                if let (Some(user), Some(owner)) = (user, owner) {
                    if owner != user {
                        let error = ApiError::Rejected(Rejection::Forbidden(format!(
                            "{job} belongs to {owner}: only its owner or an admin may read its logs"
                        )));
                        self.record_refusal(caller, &format!("job logs {job}"), &error);
                        return Err(error);
                    }
                }
                let target = self
                    .inner
                    .ctx
                    .state_machine
                    .read(|state| job_logs::log_target(state, job, attempt, rank))?;
                job_logs::read_logs(&self.inner.ctx.agent_links, job, target, offset, max_bytes)
                    .await
            }
            ApiRequest::ListNodes { limit, page_token } => {
                let limit = match limit {
                    0 => NODE_PAGE_MAX,
                    limit if limit <= NODE_PAGE_MAX => limit,
                    limit => {
                        return Err(ApiError::BadRequest(format!(
                            "a page of {limit} nodes: ask for at most {NODE_PAGE_MAX}, and for \
                             the next page with its token"
                        )))
                    }
                };
                let after = page_token
                    .as_deref()
                    .map(|token| parse_token(token, parse_node_page_token))
                    .transpose()?;
                self.linearizable().await?;
                let mut page = self
                    .inner
                    .ctx
                    .state_machine
                    .read(|state| views::node_page(state, after.as_deref(), limit as usize));
                let now = std::time::Instant::now();
                for node in &mut page.nodes {
                    views::add_disk_usage(node, self.inner.ctx.node_disks.of(&node.name));
                    views::add_heartbeat(node, self.inner.ctx.leases.heard(&node.name, now));
                }
                Ok(ApiResponse::Nodes(page))
            }
            ApiRequest::ClusterStatus => {
                self.linearizable().await?;
                let metrics = self.inner.ctx.raft.metrics().borrow().clone();
                let peers = &self.inner.ctx.peers;
                Ok(ApiResponse::Cluster(views::cluster_view(
                    self.inner.ctx.identity.cluster(),
                    &metrics,
                    |id| peers.is_reachable(id),
                    |id| peers.refusal(id),
                )))
            }
            write => unreachable!("{} is answered by `answer`", write.name()),
        }
    }

    /// Makes `spec`'s idempotency key its caller's own ([`stored_idempotency_key`]).
    fn scope_idempotency_key(&self, caller: &PeerIdentity, spec: &mut quotient_common::JobSpec) {
        if !matches!(caller.role, Role::Admin | Role::User) {
            return;
        }
        let Some(key) = spec.idempotency_key.take() else {
            return;
        };
        spec.idempotency_key = Some(
            self.inner
                .ctx
                .state_machine
                .read(|state| stored_idempotency_key(state, &caller.name, key)),
        );
    }

    /// Why job `job` is not there: removed by retention, or unknown.
    fn missing_job(&self, job: quotient_common::JobId) -> ApiError {
        ApiError::Rejected(
            self.inner
                .ctx
                .state_machine
                .read(|state| state.missing_job(job)),
        )
    }

    /// `Forbidden` (recorded in the audit log) when `user` (`None`: an admin) may not read
    /// `job`: a user reads their own jobs and those of the shares they may submit to, as
    /// `job list` shows them. An unknown job passes, to be answered as unknown.
    fn check_job_visible(
        &self,
        caller: &PeerIdentity,
        user: Option<&str>,
        job: quotient_common::JobId,
        action: &str,
    ) -> Result<(), ApiError> {
        let Some(user) = user else {
            return Ok(());
        };
        let hidden = self.inner.ctx.state_machine.read(|state| {
            let record = state.job(job)?;
            let visible = record.spec.owner.as_deref() == Some(user)
                || state.user_may_use(user, &record.spec.share);
            (!visible).then(|| record.spec.share.clone())
        });
        let Some(share) = hidden else {
            return Ok(());
        };
        let error = ApiError::Rejected(Rejection::Forbidden(format!(
            "{job} is in share {share}, which {user} is not a member of: only its owner, the share's \
             members and admins may read it"
        )));
        self.record_refusal(caller, &format!("{action} {job}"), &error);
        Err(error)
    }

    /// On the leader, `Err` when node `node` may not be removed: what the state machine would
    /// refuse (said first, as it is what to do first: cordon or drain; stopping the agent of a
    /// node with jobs would stop them), else its agent is connected here. An agent that still
    /// runs registers its host again as soon as the node is removed (a new, ready node), so a
    /// removal waits until the agent is stopped. Agents keep a connection only to the leader,
    /// so a follower does not check: the write it redirects is checked by the leader. The
    /// connection is not replicated: like a heartbeat, it is the leader's knowledge.
    fn check_node_removable(&self, node: &str) -> Result<(), ApiError> {
        let leads = views::is_leader(&self.inner.ctx.raft.metrics().borrow());
        if !leads {
            return Ok(());
        }
        self.inner
            .ctx
            .state_machine
            .read(|state| state.check_remove_node(node))
            .map_err(ApiError::Rejected)?;
        if self.inner.ctx.agent_links.get(node).is_some() {
            return Err(ApiError::Precondition(format!(
                "the agent of node {node} is still connected: stop it on its host first, or it \
                 registers the host again at once as a new, ready node; then remove the node \
                 again"
            )));
        }
        Ok(())
    }

    /// This coordinator's own view of itself; never forwarded. Unhealthy while Raft stopped,
    /// while it has joined no cluster, for a while after it refused or was refused a Raft
    /// request, and for good once its state diverged from the leader's.
    fn health(&self) -> HealthView {
        let metrics = self.inner.ctx.raft.metrics().borrow().clone();
        let mut problems = Vec::new();
        if let Err(fatal) = &metrics.running_state {
            problems.push(format!("raft stopped: {fatal}"));
        }
        problems.extend(crate::metrics::removed(&metrics));
        problems.extend(quotient_common::steady_clock::problem());
        problems.extend(self.inner.ctx.identity.problems());
        problems.extend(self.inner.ctx.state_machine.digest_checks().problem());
        // The index and the digest of one state: Raft's metrics say an entry was applied a
        // moment after it was, so pairing them with a digest read now could put a state's
        // digest beside the index before it (a chaos check once took that for divergence).
        let (last_applied, state_digest) =
            self.inner.ctx.state_machine.read_at(views::state_digest);
        HealthView {
            id: self.inner.ctx.id(),
            leader: metrics.current_leader,
            term: metrics.current_term,
            last_applied,
            healthy: problems.is_empty(),
            state_digest,
            cluster_id: self.inner.ctx.identity.cluster().map(|id| id.to_string()),
            problems,
        }
    }

    /// Proposes `command` and waits until it is committed and applied; a rejection is an
    /// error. A stopped proposer means this coordinator is shutting down: another serves.
    async fn write(&self, command: Command) -> Result<Outcome, ApiError> {
        match self.inner.ctx.proposer.propose(command).await {
            Ok(Ok(Outcome::Rejected(rejection))) => Err(ApiError::Rejected(rejection)),
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(error)) => Err(write_error(error)),
            Err(NotProposed::Stopped) => {
                Err(ApiError::Unavailable(NotProposed::Stopped.to_string()))
            }
            Err(refused) => Err(ApiError::BadRequest(refused.to_string())),
        }
    }

    async fn write_done(&self, command: Command) -> Result<ApiResponse, ApiError> {
        self.write(command).await.map(|_| ApiResponse::Done)
    }

    /// [`Self::write_done`] of `command` made for `caller` ([`Command::As`]), in the client's
    /// write session when it sent one ([`WRITE_TAG`]).
    async fn write_done_as(
        &self,
        caller: &PeerIdentity,
        command: Command,
    ) -> Result<ApiResponse, ApiError> {
        let command = as_caller(caller, command);
        let command = match WRITE_TAG.try_with(|tag| *tag).ok().flatten() {
            Some(tag) => Command::InSession {
                tag,
                command: Box::new(command),
            },
            None => command,
        };
        self.write_done(command).await
    }

    /// Records in the audit log that `caller` was refused `action` for lack of rights. Off the
    /// request's path: the caller is answered at once, and a record that cannot be committed
    /// (no quorum) is dropped.
    fn record_refusal(&self, caller: &PeerIdentity, action: &str, error: &ApiError) {
        if !matches!(caller.role, Role::Admin | Role::User) {
            return;
        }
        let command = Command::RecordRefusal {
            caller: quotient_core::Caller {
                name: caller.name.clone(),
                admin: caller.role == Role::Admin,
            },
            action: action.to_string(),
            reason: error.to_string(),
        };
        let proposer = self.inner.ctx.proposer.clone();
        tokio::spawn(async move {
            let _ = proposer.propose(command).await;
        });
    }

    /// Confirms leadership with a quorum and waits for the state machine to catch up.
    async fn linearizable(&self) -> Result<(), ApiError> {
        match self.inner.ctx.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
                Err(not_leader(&forward))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(quorum))) => Err(
                ApiError::Unavailable(format!("the leader cannot reach a quorum: {quorum}")),
            ),
            Err(RaftError::Fatal(fatal)) => Err(raft_stopped(&fatal)),
        }
    }

    async fn add_member(&self, id: MemberId, address: String) -> Result<ApiResponse, ApiError> {
        if id == 0 {
            return Err(ApiError::BadRequest(
                "member id 0 is reserved: number coordinators from 1".into(),
            ));
        }
        if address.rsplit_once(':').is_none() {
            return Err(ApiError::BadRequest(format!(
                "address {address:?} has no port: write HOST:PORT"
            )));
        }
        // Only the leader's membership says who is a voter (a follower redirects).
        self.linearizable().await?;
        let membership = self
            .inner
            .ctx
            .raft
            .metrics()
            .borrow()
            .membership_config
            .clone();
        let membership = membership.membership();
        // Raft keeps a member's first address: adding it again at another one would answer
        // as done and change nothing, so that is refused, learner or voter.
        if let Some(known) = membership.get_node(&id).map(|node| node.addr.clone()) {
            let voter = membership.voter_ids().any(|voter| voter == id);
            if known != address {
                let role = if voter { "a voter" } else { "a learner" };
                return Err(ApiError::Precondition(format!(
                    "coordinator {id} is already {role}, at {known}: to move it to {address}, remove it first (`quotient cluster remove-member --id {id}`), then add it with the new address and an empty data directory"
                )));
            }
            if voter {
                // A voter that refuses the leader (its data directory was lost, say) is not
                // made whole by adding it again: say what is.
                if let Some(why) = self.inner.ctx.peers.refusal(id) {
                    return Err(ApiError::Precondition(format!(
                        "coordinator {id} is a voter already, but it refuses the leader: {why}; a \
                         voter whose data directory was lost is removed first (`quotient cluster \
                         remove-member --id {id}`), then added again with an empty one"
                    )));
                }
                // Already done: a retried add-member is answered as the first one was.
                return Ok(ApiResponse::Done);
            }
            // A learner at the same address (an earlier add that did not catch up in time):
            // wait for it again and make it a voter.
        }
        if let Some(other) = membership
            .nodes()
            .find(|(other, node)| **other != id && node.addr == address)
            .map(|(other, _)| *other)
        {
            return Err(ApiError::Precondition(format!(
                "{address} is the address of coordinator {other} already: each coordinator needs \
                 an address of its own"
            )));
        }
        tracing::info!(id, %address, "adding a coordinator as a learner");
        self.inner
            .ctx
            .raft
            .add_learner(id, BasicNode::new(address.clone()), false)
            .await
            .map_err(write_error)?;
        let caught_up = cluster_init::wait_caught_up(
            &self.inner.ctx.raft,
            BTreeSet::from([id]),
            Duration::from_millis(LEARNER_CATCH_UP_MS),
        )
        .await;
        if caught_up.is_empty() {
            let why = self.inner.ctx.peers.refusal(id).unwrap_or_else(|| {
                format!("is it running, and reachable from the leader at {address}?")
            });
            return Err(ApiError::Precondition(format!(
                "coordinator {id} was added as a learner but did not catch up within {} s, so it is not a voter: {why}; add it again once it is fixed",
                LEARNER_CATCH_UP_MS / 1_000
            )));
        }
        tracing::info!(id, "learner caught up; making it a voter");
        self.inner
            .ctx
            .raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(write_error)?;
        Ok(ApiResponse::Done)
    }

    async fn remove_member(&self, id: MemberId) -> Result<ApiResponse, ApiError> {
        // Only the leader's membership says whether `id` is a member: a follower behind, or a
        // coordinator that has joined no cluster (and knows no members), redirects instead.
        self.linearizable().await?;
        let metrics = self.inner.ctx.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        if membership.get_node(&id).is_none() {
            return Err(ApiError::NotFound(format!(
                "coordinator {id} is not a member: `quotient cluster status` lists the members"
            )));
        }
        tracing::info!(id, "removing a coordinator");
        let change = if membership.voter_ids().any(|voter| voter == id) {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.inner
            .ctx
            .raft
            .change_membership(change, false)
            .await
            .map_err(write_error)?;
        Ok(ApiResponse::Done)
    }
}

/// An answer encoded as a frame, as [`answer_frame`] gives it.
#[derive(Debug)]
pub enum Answer {
    /// The response itself.
    Whole(Vec<u8>),
    /// The response was `size_bytes` long, over [`API_FRAME_BYTES_MAX`]: the frame holds an
    /// [`ApiError::AnswerTooLarge`] instead.
    TooLarge { frame: Vec<u8>, size_bytes: u64 },
}

/// Random bits for the suffix of a job's generated name ([`generated_job_name`]): a job
/// submitted without a name is named here, at the edge, because the state machine must
/// give the same bytes on every replica. Not a secret, so std's per-process random hash
/// keys, a counter and the clock will do (no system call per submit).
fn name_bits() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(nanos);
    hasher.finish()
}

/// `response` as a frame of `version` (the request's), or, when it would be over
/// [`API_FRAME_BYTES_MAX`], the frame of an [`ApiError::AnswerTooLarge`] that says how large it
/// was and how to ask for less (`narrow`). Without this the client got a stream cut short,
/// and blamed a version mismatch.
pub fn answer_frame(
    response: &ApiResponse,
    narrow: &str,
    version: u16,
) -> Result<Answer, FrameError> {
    let size_bytes = match frame::encode_frame_version(response, version) {
        Ok(frame) if frame.len() - HEADER_BYTES <= API_FRAME_BYTES_MAX => {
            return Ok(Answer::Whole(frame))
        }
        Ok(frame) => (frame.len() - HEADER_BYTES) as u64,
        Err(FrameError::TooLarge { size, .. }) => size,
        Err(error) => return Err(error),
    };
    let refusal = ApiResponse::Error(ApiError::AnswerTooLarge {
        size_bytes,
        limit_bytes: API_FRAME_BYTES_MAX as u64,
        narrow: narrow.to_string(),
    });
    Ok(Answer::TooLarge {
        frame: frame::encode_frame_version(&refusal, version)?,
        size_bytes,
    })
}

fn write_error(error: RaftError<MemberId, ClientWriteError<MemberId, BasicNode>>) -> ApiError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => not_leader(&forward),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(change)) => {
            ApiError::Precondition(format!("membership change refused: {change}"))
        }
        RaftError::Fatal(fatal) => raft_stopped(&fatal),
    }
}

/// What a page token stands for, read with `parse`; a token this cluster never gave is a bad
/// request that says what to pass instead.
fn parse_token<T>(token: &str, parse: impl Fn(&str) -> Option<T>) -> Result<T, ApiError> {
    parse(token).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "page token {token:?} is not one this cluster gave: pass the `next_page_token` of \
             the page before, or start without one"
        ))
    })
}

/// The jobs on a page asked for with `limit` (0: the default).
fn page_limit(limit: u32) -> Result<u32, ApiError> {
    match limit {
        0 => Ok(JOB_PAGE_DEFAULT),
        limit if limit <= JOB_PAGE_MAX => Ok(limit),
        limit => Err(ApiError::BadRequest(format!(
            "a page of {limit} jobs: ask for at most {JOB_PAGE_MAX}, and for the next page with \
             its token"
        ))),
    }
}

/// A Raft that stopped for good (a storage write failed, say): this coordinator serves
/// nothing until it is restarted, so the error is `Stopped`, which a client takes to another
/// coordinator and never back to this one.
pub(crate) fn raft_stopped(fatal: &openraft::error::Fatal<MemberId>) -> ApiError {
    ApiError::Stopped(format!("raft stopped: {fatal}; its log says why"))
}

#[cfg(test)]
mod tests {
    use quotient_common::api::JobView;

    use super::*;

    #[test]
    fn a_key_kept_unscoped_answers_only_its_own_users_live_job() {
        use crate::test_log::Log;
        let mut log = Log::new();
        log.create_share("s", 1);
        // An earlier build kept alice's key as she sent it.
        let mut spec = quotient_common::JobSpec::new("s", 1, 1, vec!["true".into()]);
        spec.idempotency_key = Some("k".into());
        log.apply(Command::As {
            caller: quotient_core::Caller {
                name: "alice".into(),
                admin: false,
            },
            command: Box::new(Command::SubmitJob(spec)),
        });
        assert_eq!(stored_idempotency_key(&log.state, "alice", "k".into()), "k");
        let bobs = stored_idempotency_key(&log.state, "bob", "k".into());
        assert_eq!(
            bobs,
            quotient_common::JobSpec::caller_scoped_key("bob", "k")
        );
        assert_eq!(
            stored_idempotency_key(&log.state, "alice", "other".into()),
            quotient_common::JobSpec::caller_scoped_key("alice", "other")
        );
    }

    /// A job view with every name at its longest.
    fn long_job_view() -> JobView {
        JobView {
            id: "j-1000000".into(),
            name: Some("n".repeat(quotient_common::name::NAME_BYTES_MAX)),
            share: "s".repeat(quotient_common::name::NAME_BYTES_MAX),
            priority: 1,
            state: "RUNNABLE".into(),
            gpus: 1,
            gpu_class: "c".repeat(quotient_common::gpu_class::GPU_CLASS_BYTES_MAX),
            node: None,
            attempts: 0,
            preemptions: 0,
            reason: Some("r".repeat(200)),
            last_preemption: None,
            preempted_for: None,
            gpu_indices: Vec::new(),
            submitted_ms: 1_700_000_000_000,
            ..JobView::default()
        }
    }

    #[test]
    fn an_answer_over_the_frame_limit_is_replaced_by_an_error_that_says_so() {
        // Proves that an answer over the frame limit is not sent: its frame holds an
        // AnswerTooLarge naming its size, the limit and the job list's filters instead; and
        // that an answer within the limit is sent whole, and a client decodes it.
        let list = ApiRequest::ListJobs {
            share: None,
            state: None,
            mine: false,
            name_prefix: None,
            limit: 0,
            page_token: None,
        };
        let view = long_job_view();
        let per_job = frame::encode_body(&view).expect("encodes").len();
        let fits = API_FRAME_BYTES_MAX / per_job - 1;
        let whole = ApiResponse::Jobs(quotient_common::api::JobPage {
            jobs: vec![view.clone(); fits],
            next_page_token: None,
        });
        match answer_frame(&whole, how_to_narrow(&list), API_WIRE.current) {
            Ok(Answer::Whole(bytes)) => {
                // As a client reads it: it claims more than the frame limit to decode.
                let decoded = frame::decode_answer_body::<ApiResponse>(&bytes[HEADER_BYTES..]);
                assert!(
                    decoded.is_ok_and(|decoded| decoded == whole),
                    "the answer does not decode"
                );
            }
            other => panic!("{fits} jobs should fit: {other:?}"),
        }

        let over = ApiResponse::Jobs(quotient_common::api::JobPage {
            jobs: vec![view; fits + 2],
            next_page_token: None,
        });
        let Ok(Answer::TooLarge { frame, size_bytes }) =
            answer_frame(&over, how_to_narrow(&list), API_WIRE.current)
        else {
            panic!("{} jobs should not fit", fits + 2);
        };
        assert!(size_bytes > API_FRAME_BYTES_MAX as u64, "{size_bytes}");
        let decoded: ApiResponse = frame::decode_body(&frame[HEADER_BYTES..]).expect("decodes");
        match decoded {
            ApiResponse::Error(error @ ApiError::AnswerTooLarge { .. }) => {
                let text = error.to_string();
                assert!(
                    text.contains(&format!(
                        "too large ({size_bytes} bytes, limit {API_FRAME_BYTES_MAX})"
                    )) && text.contains("quotient job list --limit N"),
                    "{text}"
                );
            }
            other => panic!("expected AnswerTooLarge, got {other:?}"),
        }
    }
}
