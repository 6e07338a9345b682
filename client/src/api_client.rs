//! [`ApiClient`]: sends a request to the cluster and finds the leader on the way.
//!
//! The client is given any subset of the coordinators. A client that has no connection yet
//! connects to all of them at once and starts with the first that answers; if none does, it
//! keeps trying until its deadline, or, with [`RetryPolicy::fail_fast_unreachable`] (the
//! command line's), fails at once with what each said, so that a stopped cluster does not
//! cost a person the whole deadline. Then, within one deadline per call ([`RetryPolicy`]):
//!
//! - A follower answers `NotLeader` with the leader's address, which is followed at once (at
//!   most [`RetryPolicy::redirects_max`] hops in a row before a pause), so the caller never
//!   sees "not leader".
//! - A leader named by a follower that does not answer a handshake is handled by whether this
//!   client could reach it when up. When its address is one of the client's, it is most likely
//!   the leader just killed, and the follower has not noticed yet: the client waits briefly and
//!   asks the follower again, until the follower names the new leader (the coordinators'
//!   default Raft timing replaces a dead leader within about a second). When it is not (the coordinators know each other by names or addresses of a network
//!   this client is not on), the request goes back to the follower wrapped as
//!   [`ApiRequest::ViaLeader`], and the follower forwards it; the client remembers to wrap
//!   from then on.
//! - While a leader is being elected (an error that is [`ApiError::retryable`]) it pauses
//!   briefly ([`RetryPolicy::backoff`], doubling) and asks again.
//! - A coordinator whose Raft stopped ([`ApiError::Stopped`]) is not asked again in the call;
//!   the others are, until none is left. A write it refused may still be applied by the
//!   others, so one that is not safe to send twice fails as [`ClientError::Uncertain`].
//! - A request whose answer was lost after it was sent may have been carried out, so it is
//!   sent again only when that is harmless ([`is_retry_safe`]: reads, submits with an
//!   idempotency key, and the writes that travel in the client's session). Any other write
//!   fails as [`ClientError::Uncertain`], for the caller to check; so does a retried write
//!   whose deadline ran out after one of its answers was lost.
//! - Each client (and its clones) is one write session: every write that
//!   [`ApiRequest::is_session_write`] names is numbered and sent as [`ApiRequest::InSession`]
//!   with the lowest number still waiting for an answer ([`WriteTag`]), every copy of it
//!   with the same number. The coordinators apply each number once, and drop a late copy of a
//!   write this client is done with, so that a copy held up in a stalled coordinator cannot
//!   undo a newer write when it finally reaches the leader.
//!
//! The coordinator's forwarding to the leader, the command line (through its synchronous
//! wrapper), the tests and the benchmarks all use this one client, so they follow the same
//! rules and deadlines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use quotient_common::api::{ApiError, ApiRequest, ApiResponse, WriteTag};
use quotient_common::tls::{TlsFiles, TlsIdentity};
use quotient_common::transport;
use quotient_common::ClusterId;
use tokio::time::Instant;

use crate::client_error::ClientError;
use crate::exchange::{Exchange, ExchangeError, HandshakeWait};
use crate::policy::{is_retry_safe, RetryPolicy};
use crate::quic_exchange::QuicExchange;

/// A client of the coordinator API. Cheap to clone; clones share connections.
#[derive(Debug)]
pub struct ApiClient<E: Exchange = QuicExchange> {
    exchange: Arc<E>,
    addresses: Arc<Vec<String>>,
    policy: RetryPolicy,
    pub(crate) state: Arc<Mutex<ClientState>>,
}

impl<E: Exchange> Clone for ApiClient<E> {
    fn clone(&self) -> Self {
        ApiClient {
            exchange: Arc::clone(&self.exchange),
            addresses: Arc::clone(&self.addresses),
            policy: self.policy,
            state: Arc::clone(&self.state),
        }
    }
}

/// What a client learnt from earlier calls.
#[derive(Debug, Default)]
pub(crate) struct ClientState {
    /// The address that last answered (the leader, most likely): the next call starts there.
    preferred: Option<String>,
    /// Set once a follower redirected a call to an address this client could not reach and
    /// that is not among its own: from then on every request asks to be served through the
    /// leader ([`ApiRequest::ViaLeader`]).
    via_leader: bool,
    /// Whether any coordinator ever answered this client: one that did keeps trying until
    /// its deadline whatever [`RetryPolicy::fail_fast_unreachable`] says (a restart, a
    /// failover).
    reached: bool,
    /// The write session (module docs).
    session: WriteSession,
}

/// A client's write session: its random id, the number of its last write, and the numbers of
/// its writes still waiting for an answer.
#[derive(Debug)]
struct WriteSession {
    id: u64,
    last_seq: u64,
    in_flight: BTreeSet<u64>,
}

impl Default for WriteSession {
    fn default() -> Self {
        WriteSession {
            id: random_session_id(),
            last_seq: 0,
            in_flight: BTreeSet::new(),
        }
    }
}

/// A random session id: from the system's generator, or, should it fail, from the clock and
/// the process id (two clients with one id would drop each other's writes as late copies).
fn random_session_id() -> u64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// One write of the session in flight; its number leaves the in-flight set when dropped,
/// answered or not (a call cancelled by its caller included).
pub(crate) struct SessionWrite {
    state: Arc<Mutex<ClientState>>,
    session: u64,
    seq: u64,
}

impl SessionWrite {
    pub(crate) fn begin(state: &Arc<Mutex<ClientState>>) -> SessionWrite {
        let mut guard = state.lock().unwrap_or_else(PoisonError::into_inner);
        let session = &mut guard.session;
        session.last_seq += 1;
        let seq = session.last_seq;
        session.in_flight.insert(seq);
        SessionWrite {
            state: Arc::clone(state),
            session: session.id,
            seq,
        }
    }

    /// `request` tagged with this write's number and the lowest still in flight now.
    pub(crate) fn wrap(&self, request: &ApiRequest) -> ApiRequest {
        let low = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .session
            .in_flight
            .first()
            .copied()
            .unwrap_or(self.seq)
            .min(self.seq);
        ApiRequest::InSession {
            tag: WriteTag {
                session: self.session,
                seq: self.seq,
                low,
            },
            request: Box::new(request.clone()),
        }
    }
}

impl Drop for SessionWrite {
    fn drop(&mut self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .session
            .in_flight
            .remove(&self.seq);
    }
}

impl ApiClient<QuicExchange> {
    /// A client of the coordinators at `addresses` (`HOST:PORT`, any subset of the cluster)
    /// presenting the certificate in `tls`. Connects on the first call.
    pub fn connect(addresses: Vec<String>, tls: &TlsFiles) -> Result<Self, ClientError> {
        Self::with_identity(addresses, TlsIdentity::load(tls)?)
    }

    /// As [`ApiClient::connect`], with TLS material already loaded.
    pub fn with_identity(
        addresses: Vec<String>,
        identity: TlsIdentity,
    ) -> Result<Self, ClientError> {
        Self::over(Arc::new(transport::Client::new(identity)), addresses)
    }

    /// A client of the coordinators at `addresses` that connects with `client`, already set
    /// up (a coordinator's own, to forward requests to the leader).
    pub fn over(
        client: Arc<transport::Client>,
        addresses: Vec<String>,
    ) -> Result<Self, ClientError> {
        Self::with_exchange(
            QuicExchange::over(client, None),
            addresses,
            RetryPolicy::default(),
        )
    }

    /// Another client of the same coordinators with its own connections, sharing this one's
    /// UDP socket and TLS settings: many clients in one process (a benchmark, a tool) without
    /// a socket and an endpoint task each.
    pub fn sibling(&self) -> ApiClient {
        ApiClient {
            exchange: Arc::new(self.exchange.sibling(self.exchange.cluster())),
            addresses: Arc::clone(&self.addresses),
            policy: self.policy,
            state: Arc::new(Mutex::new(ClientState::default())),
        }
    }

    /// The same coordinators, sending every request for `cluster` only: a coordinator of
    /// another cluster refuses it with [`ApiError::OtherCluster`]. `None` sends requests bare.
    /// The new client has connections of its own.
    pub fn with_cluster(self, cluster: Option<ClusterId>) -> Self {
        ApiClient {
            exchange: Arc::new(self.exchange.sibling(cluster)),
            addresses: self.addresses,
            policy: self.policy,
            state: Arc::new(Mutex::new(ClientState::default())),
        }
    }
}

impl<E: Exchange> ApiClient<E> {
    /// A client of `addresses` over `exchange` (a scripted one in tests).
    pub fn with_exchange(
        exchange: E,
        addresses: Vec<String>,
        policy: RetryPolicy,
    ) -> Result<Self, ClientError> {
        if addresses.is_empty() {
            return Err(ClientError::NoAddresses);
        }
        Ok(ApiClient {
            exchange: Arc::new(exchange),
            addresses: Arc::new(addresses),
            policy,
            state: Arc::new(Mutex::new(ClientState::default())),
        })
    }

    /// The same client (sharing its connections) with another retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The same client (sharing its connections) with another deadline per call.
    pub fn with_call_timeout(mut self, deadline: Duration) -> Self {
        self.policy.call_deadline = deadline;
        self
    }

    /// The coordinators this client was given.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// The retry policy it follows.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The exchange it sends requests over.
    pub fn exchange(&self) -> &E {
        &self.exchange
    }

    fn handshake(&self, patience: Option<Duration>) -> HandshakeWait {
        HandshakeWait {
            deadline: self.policy.connect_deadline,
            patience,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClientState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One page of `first` (an [`ApiRequest::ListJobs`]) as full as its limit asks: a
    /// coordinator looks at no more than `JOB_SCAN_MAX` jobs per answer, so a filter that
    /// matches few jobs of a large state comes back short with a token; this asks on from the
    /// token until the page is full or the list ends. The page's token is where it ends.
    pub async fn job_page(
        &self,
        first: ApiRequest,
    ) -> Result<quotient_common::api::JobPage, ClientError> {
        let mut request = first;
        let mut jobs = Vec::new();
        loop {
            let page = self.list_jobs(&request).await?;
            jobs.extend(page.jobs);
            let (
                ApiRequest::ListJobs {
                    limit, page_token, ..
                },
                Some(token),
            ) = (&mut request, page.next_page_token)
            else {
                return Ok(quotient_common::api::JobPage {
                    jobs,
                    next_page_token: None,
                });
            };
            let wanted = match *limit {
                0 => quotient_common::api::JOB_PAGE_DEFAULT,
                limit => limit,
            };
            if jobs.len() >= wanted as usize {
                return Ok(quotient_common::api::JobPage {
                    jobs,
                    next_page_token: Some(token),
                });
            }
            *limit = wanted - jobs.len() as u32;
            *page_token = Some(token);
        }
    }

    /// One answer to a `ListJobs`.
    async fn list_jobs(
        &self,
        request: &ApiRequest,
    ) -> Result<quotient_common::api::JobPage, ClientError> {
        match self.call(request.clone()).await? {
            ApiResponse::Jobs(page) => Ok(page),
            other => Err(ClientError::Api(ApiError::Internal(format!(
                "a coordinator answered a job list with {other:?}"
            )))),
        }
    }

    /// Every job that `first` (an [`ApiRequest::ListJobs`]) and the pages after it list,
    /// newest first: each page asked for with the token of the one before.
    pub async fn every_job(
        &self,
        first: ApiRequest,
    ) -> Result<Vec<quotient_common::api::JobView>, ClientError> {
        let mut jobs = Vec::new();
        let mut request = first;
        loop {
            let page = self.list_jobs(&request).await?;
            jobs.extend(page.jobs);
            let Some(token) = page.next_page_token else {
                return Ok(jobs);
            };
            match &mut request {
                ApiRequest::ListJobs { page_token, .. } => *page_token = Some(token),
                _ => return Ok(jobs),
            }
        }
    }

    /// Sends `request` to the leader (found by redirects) and returns its answer; an
    /// `ApiResponse::Error` other than a redirect or "no leader yet" becomes
    /// [`ClientError::Api`]. The rules are in the module docs.
    pub async fn call(&self, request: ApiRequest) -> Result<ApiResponse, ClientError> {
        let (call_deadline, attempt_deadline) = self.policy.deadlines(&request);
        let started = Instant::now();
        let deadline = started + call_deadline;
        let write = request.is_write();
        let wrapped = matches!(
            request,
            ApiRequest::ViaLeader(_) | ApiRequest::Forwarded { .. }
        );
        // Held until the call returns: the write is in flight until then.
        let session_write = request
            .is_session_write()
            .then(|| SessionWrite::begin(&self.state));
        let retry_safe = is_retry_safe(&request) || session_write.is_some();
        let request = match &session_write {
            Some(session_write) => session_write.wrap(&request),
            None => request,
        };
        // What each address said last, for the final error.
        let mut last_errors: BTreeMap<String, String> = BTreeMap::new();
        let mut next: Option<String> = self.lock().preferred.clone();
        if !self.exchange.has_open_connection() {
            let within = self.policy.connect_deadline.min(call_deadline);
            match self.exchange.connect_first(&self.addresses, within).await {
                Ok(first) => next = Some(first),
                // A coordinator that refused a handshake for its load is up: the call goes on
                // trying until its deadline (found by probing: of 400 commands started at
                // once, 321 gave up after 2 s, told the cluster might not be running).
                Err(errors)
                    if self.policy.fail_fast_unreachable
                        && !self.lock().reached
                        && !errors
                            .values()
                            .any(|why| why.contains(transport::HANDSHAKE_BUSY_HINT)) =>
                {
                    return Err(ClientError::Unreachable {
                        tried: describe(&errors),
                    })
                }
                Err(errors) => last_errors.extend(errors),
            }
        }
        // The rotation goes on from the address tried first.
        let mut round = next
            .as_ref()
            .and_then(|first| self.addresses.iter().position(|a| a == first))
            .map_or(0, |index| index + 1);
        let mut redirects = 0u32;
        let mut unreachable_in_a_row = 0usize;
        let mut backoff = self.policy.backoff;
        // The follower whose redirect is being followed.
        let mut redirected_by: Option<String> = None;
        let mut via_leader: Option<ApiRequest> = None;
        // Whether a write may have been carried out by an attempt whose answer was lost.
        let mut maybe_applied = false;
        // Coordinators whose Raft stopped: not asked again in this call.
        let mut stopped: BTreeSet<String> = BTreeSet::new();
        loop {
            let now = Instant::now();
            if now >= deadline {
                let after_ms = u64::try_from(call_deadline.as_millis()).unwrap_or(u64::MAX);
                return Err(if write && maybe_applied {
                    ClientError::Uncertain(format!(
                        "no answer within {after_ms} ms after an answer was lost: {}",
                        describe(&last_errors)
                    ))
                } else {
                    ClientError::Unavailable {
                        after_ms,
                        last: describe(&last_errors),
                    }
                });
            }
            let address = match next.take() {
                Some(address) => address,
                None => loop {
                    // Not every address is stopped: the call ends when the last one is.
                    let address = &self.addresses[round % self.addresses.len()];
                    round += 1;
                    if !stopped.contains(address) {
                        break address.clone();
                    }
                },
            };
            if via_leader.is_none() && !wrapped && self.lock().via_leader {
                via_leader = Some(ApiRequest::ViaLeader(Box::new(request.clone())));
            }
            let sent = via_leader.as_ref().unwrap_or(&request);
            let following = redirected_by.take();
            let within = attempt_deadline.min(deadline - now);
            let mut pause = |last_errors: &mut BTreeMap<String, String>, why: String| {
                last_errors.insert(address.clone(), why);
                let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
                backoff = (backoff * 2).min(self.policy.backoff_max);
                pause
            };
            match self
                .exchange
                .exchange(
                    &address,
                    sent,
                    within,
                    self.handshake(Some(self.policy.connect_patience)),
                )
                .await
            {
                Ok(ApiResponse::Error(ApiError::NotLeader {
                    leader_address: Some(leader),
                    ..
                })) if leader != address && !stopped.contains(&leader) => {
                    self.lock().reached = true;
                    unreachable_in_a_row = 0;
                    redirects += 1;
                    if redirects > self.policy.redirects_max {
                        // Two coordinators naming each other: a leader change under way.
                        redirects = 0;
                        let why =
                            format!("redirected {} times in a row", self.policy.redirects_max);
                        tokio::time::sleep(pause(&mut last_errors, why)).await;
                        continue;
                    }
                    last_errors.insert(address.clone(), format!("redirected to {leader}"));
                    next = Some(leader);
                    redirected_by = Some(address);
                }
                Ok(ApiResponse::Error(ApiError::Stopped(why))) => {
                    // This coordinator serves nothing until restarted; the others may. A write
                    // it took may still be applied by them.
                    self.lock().reached = true;
                    unreachable_in_a_row = 0;
                    let error = ApiError::Stopped(why);
                    if write && !retry_safe {
                        return Err(ClientError::Uncertain(format!("{address}: {error}")));
                    }
                    maybe_applied |= write;
                    last_errors.insert(address.clone(), error.to_string());
                    stopped.insert(address);
                    if self.addresses.iter().all(|known| stopped.contains(known)) {
                        return Err(ClientError::Api(error));
                    }
                    next = following;
                }
                Ok(ApiResponse::Error(error)) if error.retryable() => {
                    self.lock().reached = true;
                    unreachable_in_a_row = 0;
                    redirects = 0;
                    let why = match &error {
                        ApiError::NotLeader { .. } => "no leader yet".to_string(),
                        other => other.to_string(),
                    };
                    tokio::time::sleep(pause(&mut last_errors, why)).await;
                }
                Ok(ApiResponse::Error(ApiError::Uncertain(why))) if retry_safe => {
                    // The coordinator's deadline passed with the write proposed; sending a
                    // keyed submit again gets the first one's job if it did commit.
                    self.lock().reached = true;
                    unreachable_in_a_row = 0;
                    maybe_applied = true;
                    tokio::time::sleep(pause(&mut last_errors, why)).await;
                }
                Ok(response) => {
                    let mut state = self.lock();
                    state.reached = true;
                    state.preferred = Some(address);
                    drop(state);
                    return match response {
                        ApiResponse::Error(error) => Err(ClientError::Api(error)),
                        response => Ok(response),
                    };
                }
                Err(ExchangeError::Unreachable(why)) => {
                    last_errors.insert(address.clone(), why);
                    if let Some(follower) = following {
                        if self.addresses.contains(&address) {
                            // Reachable when up, and silent: most likely the leader just lost,
                            // that the follower has not given up on yet. Ask it again soon.
                            let why = format!("leader {address} does not answer");
                            tokio::time::sleep(pause(&mut last_errors, why)).await;
                        } else if !wrapped {
                            // Out of this client's reach: the follower serves it through the
                            // leader instead.
                            self.lock().via_leader = true;
                            via_leader = Some(ApiRequest::ViaLeader(Box::new(request.clone())));
                        }
                        next = Some(follower);
                    } else {
                        unreachable_in_a_row += 1;
                        if unreachable_in_a_row >= self.addresses.len() {
                            // A whole sweep without a coordinator: pause before the next.
                            unreachable_in_a_row = 0;
                            let why = last_errors.get(&address).cloned().unwrap_or_default();
                            tokio::time::sleep(pause(&mut last_errors, why)).await;
                        }
                    }
                }
                Err(ExchangeError::Lost(why)) => {
                    if !retry_safe {
                        return Err(ClientError::Uncertain(format!("{address}: {why}")));
                    }
                    maybe_applied |= write;
                    unreachable_in_a_row = 0;
                    last_errors.insert(address.clone(), why);
                }
                Err(ExchangeError::Refused(error)) => return Err(ClientError::Api(error)),
            }
        }
    }

    /// Sends `request` to the coordinator at `address` only, within `deadline`: no
    /// redirects, no retries (`Health`, which is about the coordinator that answers;
    /// `InitCluster`, which bootstraps the one it is sent to).
    pub async fn call_one(
        &self,
        address: &str,
        request: ApiRequest,
        deadline: Duration,
    ) -> Result<ApiResponse, ClientError> {
        let answer = self
            .exchange
            .exchange(address, &request, deadline, self.handshake(None))
            .await;
        match answer {
            Ok(ApiResponse::Error(error)) => Err(ClientError::Api(error)),
            Ok(response) => Ok(response),
            Err(ExchangeError::Unreachable(why)) => Err(ClientError::Unreachable {
                tried: format!("{address}: {why}"),
            }),
            Err(ExchangeError::Lost(why)) if request.is_write() => {
                Err(ClientError::Uncertain(format!("{address}: {why}")))
            }
            Err(ExchangeError::Lost(why)) => Err(ClientError::Unavailable {
                after_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
                last: format!("{address}: {why}"),
            }),
            Err(ExchangeError::Refused(error)) => Err(ClientError::Api(error)),
        }
    }

    /// Closes every connection of this client (and of its clones); the client serves no
    /// call after it. A QUIC client it was made [`over`](ApiClient::over), and that client's
    /// other connections, stay open.
    pub fn close(&self) {
        self.exchange.close();
    }
}

/// "ADDRESS: what it said; ..." for error messages.
fn describe(errors: &BTreeMap<String, String>) -> String {
    if errors.is_empty() {
        return "no coordinator answered".to_string();
    }
    errors
        .iter()
        .map(|(address, why)| format!("{address}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}
