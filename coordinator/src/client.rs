//! A small Rust client of the coordinator API, for tests, benchmarks and tools: it connects
//! to any of the given coordinators, follows `NotLeader` redirects, and moves on to another
//! address when one is down, until the call's deadline.
//!
//! A request is retried only when it cannot have been carried out twice: when it never
//! reached a coordinator (connect failed, a follower redirected it, no leader yet), or when
//! it is a read or an idempotent submit (one with an idempotency key). Any other write whose
//! answer was lost comes back as [`ClientError::Uncertain`], for the caller to check.
//! (The `quotient` CLI has its own client in the cli crate; this one exists so that the
//! coordinator's tests need no CLI.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use quotient_common::api::{how_to_narrow, ApiError, ApiRequest, ApiResponse};
use quotient_common::frame::FrameError;
use quotient_common::tls::{TlsError, TlsFiles, TlsIdentity};
use quotient_common::transport::{Client, PeerConnection, RequestError, ALPN_API};
use quotient_common::ClusterId;

/// Default deadline of one [`ApiClient::call`], retries and redirects included (milliseconds).
pub const CALL_TIMEOUT_DEFAULT_MS: u64 = 30_000;
/// Deadline of one attempt on one coordinator (milliseconds); a coordinator that died with
/// the request in flight costs no more than this.
pub const ATTEMPT_TIMEOUT_MS: u64 = 5_000;
/// Deadline of one membership change, which waits for a new member to catch up
/// (milliseconds).
pub const MEMBERSHIP_ATTEMPT_TIMEOUT_MS: u64 = 130_000;
/// Deadline of connecting to one coordinator (milliseconds); a dead one is skipped after it.
pub const CONNECT_ATTEMPT_TIMEOUT_MS: u64 = 2_000;
/// Pause before retrying when no coordinator could serve (milliseconds).
pub const RETRY_PAUSE_MS: u64 = 100;
/// Most redirects followed in a row before pausing (guards against a redirect loop).
pub const REDIRECTS_MAX: u32 = 8;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinators answered with an error (other than a redirect).
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("cannot load the client's TLS files: {0}")]
    Tls(#[from] TlsError),
    /// No coordinator answered before the deadline.
    #[error("no coordinator answered within {after_ms} ms; last error: {last}; check the addresses and `quotient cluster status`")]
    Unavailable { after_ms: u64, last: String },
    /// A write was sent but its answer was lost: it may or may not have been applied.
    #[error("the answer to a write was lost ({0}); it may or may not have been applied: check before retrying")]
    Uncertain(String),
    #[error("no coordinator addresses given")]
    NoAddresses,
}

/// A client of the coordinator API. Cheap to clone; clones share connections.
#[derive(Debug, Clone)]
pub struct ApiClient {
    client: Arc<Client>,
    addresses: Vec<String>,
    state: Arc<Mutex<ClientState>>,
    call_timeout: Duration,
    /// The cluster every request is for ([`ApiRequest::InCluster`]), when known.
    cluster: Option<ClusterId>,
}

#[derive(Debug, Default)]
struct ClientState {
    /// The address that last answered (the leader, most likely).
    preferred: Option<String>,
    connections: BTreeMap<String, PeerConnection>,
    /// Set once a follower redirected a call to an address this client could not reach:
    /// from then on every request asks to be served through the leader
    /// ([`ApiRequest::ViaLeader`]), so that a follower forwards it.
    via_leader: bool,
}

/// What one attempt on one address gave.
enum Attempt {
    Answer(Box<ApiResponse>),
    Redirect(Option<String>),
    /// Never reached a coordinator that would act on it: safe to retry anywhere.
    Retry(String),
    /// Reached a coordinator but the answer was lost.
    Lost(String),
}

impl ApiClient {
    /// A client of the coordinators at `addresses` (`HOST:PORT`, any subset of the cluster)
    /// presenting the certificate in `tls`. Connects lazily.
    pub fn connect(addresses: Vec<String>, tls: &TlsFiles) -> Result<Self, ClientError> {
        let identity = TlsIdentity::load(tls)?;
        Self::with_identity(addresses, identity)
    }

    /// As [`ApiClient::connect`], with TLS material already loaded.
    pub fn with_identity(
        addresses: Vec<String>,
        identity: TlsIdentity,
    ) -> Result<Self, ClientError> {
        Self::over(Arc::new(Client::new(identity)), addresses)
    }

    /// A client of the coordinators at `addresses` that connects with `client`, already
    /// set up (a coordinator's own, to forward requests to the leader).
    pub fn over(client: Arc<Client>, addresses: Vec<String>) -> Result<Self, ClientError> {
        if addresses.is_empty() {
            return Err(ClientError::NoAddresses);
        }
        Ok(ApiClient {
            client,
            addresses,
            state: Arc::new(Mutex::new(ClientState::default())),
            call_timeout: Duration::from_millis(CALL_TIMEOUT_DEFAULT_MS),
            cluster: None,
        })
    }

    /// Another client of the same coordinators with its own connections, sharing this one's
    /// UDP socket and TLS settings: many clients in one process (a benchmark, a tool) without
    /// a socket and an endpoint task each.
    pub fn sibling(&self) -> ApiClient {
        ApiClient {
            client: Arc::clone(&self.client),
            addresses: self.addresses.clone(),
            state: Arc::new(Mutex::new(ClientState::default())),
            call_timeout: self.call_timeout,
            cluster: self.cluster,
        }
    }

    /// The same client, sending every request for `cluster` only: a coordinator of another
    /// cluster refuses it with [`ApiError::OtherCluster`]. `None` sends requests bare.
    pub fn with_cluster(mut self, cluster: Option<ClusterId>) -> Self {
        self.cluster = cluster;
        self
    }

    /// The same client with another deadline per call.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    fn lock(&self) -> MutexGuard<'_, ClientState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `request` to the leader (found by redirects) and returns its answer; an
    /// `ApiResponse::Error` other than a redirect becomes [`ClientError::Api`].
    pub async fn call(&self, request: ApiRequest) -> Result<ApiResponse, ClientError> {
        let started = Instant::now();
        let call_timeout = match request {
            ApiRequest::AddMember { .. }
            | ApiRequest::RemoveMember { .. }
            | ApiRequest::InitCluster => self
                .call_timeout
                .max(Duration::from_millis(MEMBERSHIP_ATTEMPT_TIMEOUT_MS)),
            _ => self.call_timeout,
        };
        let retry_after_loss = !request.is_write()
            || matches!(&request, ApiRequest::SubmitJob(spec) if spec.idempotency_key.is_some());
        let mut last = String::from("none yet");
        let mut next: Option<String> = self.lock().preferred.clone();
        let mut redirects = 0u32;
        let mut round = 0usize;
        // The follower that redirected this call, while the redirect is being followed.
        let mut redirected_by: Option<String> = None;
        let mut via_leader: Option<ApiRequest> = None;
        let wrapped = matches!(
            request,
            ApiRequest::ViaLeader(_) | ApiRequest::Forwarded { .. }
        );
        while started.elapsed() < call_timeout {
            let address = match next.take() {
                Some(address) => address,
                None => {
                    let address = self.addresses[round % self.addresses.len()].clone();
                    round += 1;
                    if round > 1 && round % self.addresses.len() == 1 {
                        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                    }
                    address
                }
            };
            if via_leader.is_none() && !wrapped && self.lock().via_leader {
                via_leader = Some(ApiRequest::ViaLeader(Box::new(request.clone())));
            }
            let sent = via_leader.as_ref().unwrap_or(&request);
            let following = redirected_by.take();
            match self.attempt(&address, sent).await {
                Attempt::Answer(response) => {
                    self.lock().preferred = Some(address);
                    return match *response {
                        ApiResponse::Error(error) => Err(ClientError::Api(error)),
                        response => Ok(response),
                    };
                }
                Attempt::Redirect(leader) => {
                    last = format!("{address} is not the leader");
                    redirects += 1;
                    if redirects > REDIRECTS_MAX {
                        redirects = 0;
                        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                    }
                    match leader {
                        Some(leader) if leader != address => {
                            next = Some(leader);
                            redirected_by = Some(address);
                        }
                        _ => tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await,
                    }
                }
                Attempt::Retry(why) => {
                    last = format!("{address}: {why}");
                    if let Some(follower) = following {
                        // The leader's address as the coordinators know it is out of this
                        // client's reach: the follower serves it through the leader instead.
                        self.lock().via_leader = true;
                        next = Some(follower);
                    }
                }
                Attempt::Lost(why) => {
                    if !retry_after_loss {
                        return Err(ClientError::Uncertain(format!("{address}: {why}")));
                    }
                    last = format!("{address}: {why}");
                }
            }
        }
        Err(ClientError::Unavailable {
            after_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            last,
        })
    }

    async fn attempt(&self, address: &str, request: &ApiRequest) -> Attempt {
        let cached = self.lock().connections.get(address).cloned();
        let connection = match cached {
            Some(connection) if connection.connection().close_reason().is_none() => connection,
            _ => match tokio::time::timeout(
                Duration::from_millis(CONNECT_ATTEMPT_TIMEOUT_MS),
                self.client.connect_to(address, ALPN_API),
            )
            .await
            {
                Err(_) => {
                    return Attempt::Retry(format!(
                        "no handshake within {CONNECT_ATTEMPT_TIMEOUT_MS} ms"
                    ))
                }
                Ok(Ok(connection)) => {
                    self.lock()
                        .connections
                        .insert(address.to_string(), connection.clone());
                    connection
                }
                Ok(Err(error)) => return Attempt::Retry(format!("{error:#}")),
            },
        };
        let attempt_timeout_ms = match request {
            ApiRequest::AddMember { .. }
            | ApiRequest::RemoveMember { .. }
            | ApiRequest::InitCluster => MEMBERSHIP_ATTEMPT_TIMEOUT_MS,
            _ => ATTEMPT_TIMEOUT_MS,
        };
        let in_cluster = self.cluster.map(|cluster| ApiRequest::InCluster {
            cluster,
            request: Box::new(request.clone()),
        });
        let result = connection
            .request::<_, ApiResponse>(
                in_cluster.as_ref().unwrap_or(request),
                Duration::from_millis(attempt_timeout_ms),
            )
            .await;
        match result {
            Ok(ApiResponse::Error(ApiError::NotLeader { leader_address, .. })) => {
                Attempt::Redirect(leader_address)
            }
            // A read, or a write the coordinator gave up on before it could commit (a write
            // that timed out may still commit, so it is not retried unless idempotent).
            Ok(ApiResponse::Error(ApiError::Unavailable(why))) => {
                if request.is_write() {
                    Attempt::Lost(why)
                } else {
                    Attempt::Retry(why)
                }
            }
            Ok(response) => Attempt::Answer(Box::new(response)),
            Err(error) => {
                self.lock().connections.remove(address);
                match error {
                    // Refused before it was read (too large, undecodable): not retried.
                    RequestError::Refused { .. } | RequestError::Frame(_) => {
                        Attempt::Answer(Box::new(ApiResponse::Error(ApiError::BadRequest(
                            format!("{error:#}"),
                        ))))
                    }
                    // The coordinator speaks no version of the API this one does (a cluster
                    // half upgraded): not carried out, and not retried, since it would be
                    // refused again until one of them is upgraded.
                    RequestError::Version(mismatch) => Attempt::Answer(Box::new(
                        ApiResponse::Error(ApiError::Unavailable(mismatch.to_string())),
                    )),
                    // The request was fine; its answer was not readable. Not retried either:
                    // the same request gets the same answer.
                    RequestError::Answer(error) => Attempt::Answer(Box::new(ApiResponse::Error(
                        unreadable_answer(address, request, error),
                    ))),
                    other => Attempt::Lost(format!("{other:#}")),
                }
            }
        }
    }

    /// Closes every connection.
    pub fn close(&self) {
        self.close_connections();
        self.client.close();
    }

    /// Drops this client's connections but leaves the QUIC client it was made
    /// [`over`](ApiClient::over), and that client's other connections, open.
    pub fn close_connections(&self) {
        self.lock().connections.clear();
    }
}

/// What to report when the answer from `address` to `request` could not be read: over the
/// frame limit (as [`ApiError::AnswerTooLarge`], like a coordinator that caught it itself), cut
/// short (a coordinator that could not send it whole: one before answers over the limit were
/// caught), or undecodable (another version). Never a bad request: the request was sent whole.
pub fn unreadable_answer(address: &str, request: &ApiRequest, error: FrameError) -> ApiError {
    let narrow = how_to_narrow(request);
    match error {
        FrameError::TooLarge { size, limit } => ApiError::AnswerTooLarge {
            size_bytes: size,
            limit_bytes: limit as u64,
            narrow: narrow.to_string(),
        },
        FrameError::Truncated { expected, received } => ApiError::AnswerUnreadable(format!(
            "the answer from {address} was cut short ({received} of {expected} bytes): the \
             coordinator could not send it whole, most likely because it was over the frame \
             limit (its log says); {narrow}"
        )),
        other => ApiError::AnswerUnreadable(format!(
            "the answer from {address} does not decode ({other}); do both sides run the same \
             version?"
        )),
    }
}
