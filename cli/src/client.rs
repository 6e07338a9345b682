//! The API client: sends one request to the cluster and finds the leader on the way.
//!
//! The config lists any subset of the coordinators. [`Session`] first connects to all of them
//! at once and starts with the first that answers (so a stopped coordinator early in the list
//! costs nothing); [`call`] then tries them in order; a follower
//! answers `NotLeader` with the leader's address, which is followed at once (at most
//! [`REDIRECTS_MAX`] hops), so the user never sees "not leader". When that address cannot be
//! reached from here (the coordinators know each other by names or addresses of a network this
//! client is not on), the request goes back to the follower wrapped as
//! [`ApiRequest::ViaLeader`], and the follower forwards it to the leader. While a leader is being
//! elected (`Unavailable`, or `NotLeader` naming no leader) it backs off briefly and asks
//! again, within one overall deadline. An address that cannot be reached is skipped for the
//! next; if none can be reached the call fails with what each one said.
//!
//! A request whose connection broke after it was sent may have been carried out, so it is
//! retried only when that is harmless: reads, and submits (which always carry an idempotency
//! key, see `job_submit`). Other writes fail with a message saying to check before retrying.
//!
//! The retry logic is generic over [`Exchange`], so it is tested with a scripted fake; the
//! real one is [`QuicExchange`] (QUIC with mutual TLS, ALPN `quotient-api/1`). [`Session`]
//! wraps both in a small tokio runtime, so command modules stay synchronous.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use quotient_common::api::{how_to_narrow, ApiError, ApiRequest, ApiResponse};
use quotient_common::frame::FrameError;
use quotient_common::tls::TlsIdentity;
use quotient_common::transport::{self, PeerConnection, RequestError, STREAM_CODE_BAD_FRAME};
use quotient_common::ClusterId;
use tokio::time::Instant;

use crate::client_config::{self, ClientConfig};

/// Most `NotLeader` redirects followed for one request; a healthy cluster needs one.
pub const REDIRECTS_MAX: u32 = 5;
/// Deadline of one connection attempt, handshake included (milliseconds). Short, because a
/// stopped coordinator never answers a QUIC handshake and the next address should be tried.
pub const CONNECT_DEADLINE_MS: u64 = 3_000;
/// Deadline of one request on an open connection (milliseconds): a write waits for a commit.
pub const ATTEMPT_DEADLINE_MS: u64 = 10_000;
/// Deadline of the whole call, retries and elections included (milliseconds).
pub const CALL_DEADLINE_MS: u64 = 20_000;
/// First pause while a leader is being elected (milliseconds); doubles up to the maximum.
pub const ELECTION_BACKOFF_MS: u64 = 100;
/// Longest pause between two tries while a leader is being elected (milliseconds).
pub const ELECTION_BACKOFF_MAX_MS: u64 = 1_000;

/// How long a finished session waits for its close frames to leave (milliseconds).
pub const CLOSE_FLUSH_MS: u64 = 10;

/// How hard [`call`] tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Deadline of the whole call.
    pub call_deadline: Duration,
    /// Deadline of one request to one coordinator.
    pub attempt_deadline: Duration,
    /// Most redirects followed.
    pub redirects_max: u32,
    /// First and longest pause while there is no leader.
    pub backoff: Duration,
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            call_deadline: Duration::from_millis(CALL_DEADLINE_MS),
            attempt_deadline: Duration::from_millis(ATTEMPT_DEADLINE_MS),
            redirects_max: REDIRECTS_MAX,
            backoff: Duration::from_millis(ELECTION_BACKOFF_MS),
            backoff_max: Duration::from_millis(ELECTION_BACKOFF_MAX_MS),
        }
    }
}

/// Why one exchange with one coordinator failed, sorted by what the caller may do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeError {
    /// No connection could be made; the request never left. Try another coordinator.
    Unreachable(String),
    /// The connection broke or the deadline passed after the request was sent: it may or may
    /// not have been carried out.
    Lost(String),
    /// The coordinator refused the request's bytes, or its answer could not be read (over the
    /// frame limit, cut short, undecodable); retrying the same bytes elsewhere will not help.
    /// The text says what happened and what to do ([`exchange_error`]).
    Refused(String),
}

/// One request to one coordinator. The real one is [`QuicExchange`].
pub trait Exchange {
    fn exchange(
        &mut self,
        address: &str,
        request: &ApiRequest,
        deadline: Duration,
    ) -> impl Future<Output = Result<ApiResponse, ExchangeError>>;
}

/// Whether sending `request` twice is harmless: reads, and submits with an idempotency key.
pub fn is_retry_safe(request: &ApiRequest) -> bool {
    match request {
        ApiRequest::SubmitJob(spec) => spec.idempotency_key.is_some(),
        other => !other.is_write(),
    }
}

/// Sends `request` to the cluster behind `addresses`, following redirects and waiting out
/// elections (module docs). Returns the first answer that is not a redirect or "no leader";
/// it may be `ApiResponse::Error` (see [`into_result`]).
pub async fn call<E: Exchange>(
    exchange: &mut E,
    addresses: &[String],
    request: &ApiRequest,
    policy: &RetryPolicy,
) -> anyhow::Result<ApiResponse> {
    if addresses.is_empty() {
        bail!(
            "no coordinator addresses to try; list them under `coordinators` in the client config"
        );
    }
    let started = Instant::now();
    let deadline = started + policy.call_deadline;
    let retry_safe = is_retry_safe(request);
    let mut redirects = 0;
    let mut redirect_to: Option<String> = None;
    // The follower whose redirect is being followed, and the request as sent once a redirect
    // led out of this client's reach: wrapped, so that a follower forwards it to the leader.
    let mut redirected_by: Option<String> = None;
    let mut via_leader: Option<ApiRequest> = None;
    let mut next_index = 0;
    let mut backoff = policy.backoff;
    // What each address said last, for the final error message.
    let mut last_errors: BTreeMap<String, String> = BTreeMap::new();
    // Addresses tried in a row without reaching any coordinator.
    let mut unreachable_in_a_row = 0;
    loop {
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "no answer from the cluster within {} ms ({}); check `quotient cluster status` \
                 and the coordinators' logs",
                policy.call_deadline.as_millis(),
                describe(&last_errors)
            );
        }
        let address = match redirect_to.take() {
            Some(address) => address,
            None => {
                let address = addresses[next_index % addresses.len()].clone();
                next_index += 1;
                address
            }
        };
        let attempt_deadline = policy.attempt_deadline.min(deadline - now);
        let mut wait_for_leader = |last_errors: &mut BTreeMap<String, String>, why: String| {
            last_errors.insert(address.clone(), why);
            let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
            backoff = (backoff * 2).min(policy.backoff_max);
            pause
        };
        let following = redirected_by.take();
        let sent = via_leader.as_ref().unwrap_or(request);
        match exchange.exchange(&address, sent, attempt_deadline).await {
            Ok(ApiResponse::Error(ApiError::NotLeader {
                leader_address: Some(leader),
                ..
            })) => {
                unreachable_in_a_row = 0;
                redirects += 1;
                if redirects > policy.redirects_max {
                    bail!(
                        "the coordinators redirected this request {} times without reaching \
                         a leader; a leader change may be under way: retry, or check \
                         `quotient cluster status`",
                        policy.redirects_max
                    );
                }
                last_errors.insert(address.clone(), format!("redirected to {leader}"));
                redirect_to = Some(leader);
                redirected_by = Some(address);
            }
            Ok(ApiResponse::Error(ApiError::NotLeader {
                leader_address: None,
                ..
            })) => {
                unreachable_in_a_row = 0;
                let pause = wait_for_leader(&mut last_errors, "no leader yet".to_string());
                tokio::time::sleep(pause).await;
            }
            Ok(ApiResponse::Error(ApiError::Unavailable(why))) => {
                unreachable_in_a_row = 0;
                let pause = wait_for_leader(&mut last_errors, format!("unavailable: {why}"));
                tokio::time::sleep(pause).await;
            }
            Ok(response) => return Ok(response),
            Err(ExchangeError::Unreachable(why)) if following.is_some() => {
                // The leader's address as the coordinators know it is out of this client's
                // reach (another network, a name only they resolve): the follower that
                // redirected serves the request through the leader instead.
                last_errors.insert(address.clone(), why);
                via_leader = Some(ApiRequest::ViaLeader(Box::new(request.clone())));
                redirect_to = following;
            }
            Err(ExchangeError::Unreachable(why)) => {
                last_errors.insert(address.clone(), why);
                unreachable_in_a_row += 1;
                if unreachable_in_a_row >= addresses.len() {
                    return Err(unreachable_error(&last_errors));
                }
            }
            Err(ExchangeError::Lost(why)) => {
                if !retry_safe {
                    bail!(
                        "lost the answer from {address} ({why}); the change may or may not \
                         have been made: check its state (e.g. `quotient share list`, \
                         `quotient job get`) before retrying"
                    );
                }
                unreachable_in_a_row = 0;
                last_errors.insert(address.clone(), why);
            }
            Err(ExchangeError::Refused(why)) => {
                bail!("coordinator {address}: {why}");
            }
        }
    }
}

/// The error when no coordinator can be reached, with what each address said.
fn unreachable_error(errors: &BTreeMap<String, String>) -> anyhow::Error {
    anyhow!(
        "cannot reach any coordinator ({}); is the cluster running? Check `coordinators` in \
         the client config, or start a local cluster with `quotient dev up`",
        describe(errors)
    )
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

/// Turns an `ApiResponse::Error` into an error that says what to do; other answers pass.
pub fn into_result(request: &ApiRequest, response: ApiResponse) -> anyhow::Result<ApiResponse> {
    let ApiResponse::Error(error) = response else {
        return Ok(response);
    };
    let hint = match (&error, request) {
        (ApiError::Unauthorized(_), _) => {
            "; this needs an admin certificate: point `cert` and `key` in the client config at \
             one (`quotient certs issue --role admin`)"
        }
        (
            ApiError::NotFound(_),
            ApiRequest::GetShare { .. }
            | ApiRequest::UpdateShare { .. }
            | ApiRequest::DeleteShare { .. },
        ) => "; `quotient share list` shows the shares",
        (ApiError::NotFound(_), ApiRequest::SubmitJob(_)) => {
            "; `quotient share list` shows the shares"
        }
        (
            ApiError::NotFound(_),
            ApiRequest::GetJob { .. }
            | ApiRequest::UpdateJobPriority { .. }
            | ApiRequest::CancelJob { .. }
            | ApiRequest::ExplainJob { .. },
        ) => "; `quotient job list` shows the jobs",
        (
            ApiError::NotFound(_),
            ApiRequest::CordonNode { .. }
            | ApiRequest::UncordonNode { .. }
            | ApiRequest::DrainNode { .. }
            | ApiRequest::RemoveNode { .. },
        ) => "; `quotient node list` shows the nodes",
        (ApiError::NotFound(_), ApiRequest::RemoveMember { .. }) => {
            "; `quotient cluster status` shows the members"
        }
        (ApiError::NotLeader { .. }, _) => {
            "; a leader change is under way: retry, or check `quotient cluster status`"
        }
        _ => "",
    };
    let text = error.to_string();
    // The coordinators' own messages often say what to do already; do not say it twice.
    if text.contains("`quotient ") {
        return Err(anyhow!("{text}"));
    }
    Err(anyhow!("{text}{hint}"))
}

/// The error for an answer of the wrong kind (a version mismatch, or a coordinator bug).
pub fn unexpected(request: &ApiRequest, response: &ApiResponse) -> anyhow::Error {
    anyhow!(
        "unexpected answer to {}: {response:?}; are this quotient and the coordinators the same \
         version?",
        request_name(request)
    )
}

fn request_name(request: &ApiRequest) -> String {
    let debug = format!("{request:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("the request")
        .to_string()
}

/// The real [`Exchange`]: QUIC with mutual TLS, one cached connection per address.
pub struct QuicExchange {
    // Shared with the tasks of [`QuicExchange::connect_first`].
    client: Arc<transport::Client>,
    connections: BTreeMap<String, PeerConnection>,
    connect_deadline: Duration,
    /// The cluster every request is sent for ([`ApiRequest::InCluster`]), when the config
    /// names one.
    cluster: Option<ClusterId>,
}

impl QuicExchange {
    /// An exchange presenting `identity`, sending requests for `cluster` when it is known.
    pub fn new(identity: TlsIdentity, cluster: Option<ClusterId>) -> Self {
        QuicExchange {
            client: Arc::new(transport::Client::new(identity)),
            connections: BTreeMap::new(),
            connect_deadline: Duration::from_millis(CONNECT_DEADLINE_MS),
            cluster,
        }
    }

    /// Whether a connection made earlier is still open.
    pub fn has_open_connection(&self) -> bool {
        self.connections
            .values()
            .any(|connection| connection.connection().close_reason().is_none())
    }

    /// Connects to every address at once and keeps the first that completes its handshake;
    /// returns that address, or what each one said. Asking in turn instead would make every
    /// command wait out the connect deadline of each stopped coordinator listed before a
    /// live one (a killed leader is often the first in the list).
    pub async fn connect_first(
        &mut self,
        addresses: &[String],
    ) -> Result<String, BTreeMap<String, String>> {
        let mut attempts = tokio::task::JoinSet::new();
        for address in addresses {
            let client = Arc::clone(&self.client);
            let address = address.clone();
            let deadline = self.connect_deadline;
            attempts.spawn(async move {
                let connecting = client.connect_to(&address, transport::ALPN_API);
                let result = match tokio::time::timeout(deadline, connecting).await {
                    Ok(Ok(connection)) => Ok(connection),
                    Ok(Err(error)) => Err(format!("{:#}", anyhow!(error))),
                    Err(_) => Err(format!("no handshake within {} ms", deadline.as_millis())),
                };
                (address, result)
            });
        }
        let mut errors = BTreeMap::new();
        while let Some(joined) = attempts.join_next().await {
            match joined {
                Ok((address, Ok(connection))) => {
                    self.connections.insert(address.clone(), connection);
                    // Dropping the set aborts the attempts still under way.
                    return Ok(address);
                }
                Ok((address, Err(why))) => {
                    errors.insert(address, why);
                }
                Err(error) => {
                    errors.insert("a connection attempt".to_string(), error.to_string());
                }
            }
        }
        Err(errors)
    }

    /// The cached connection to `address`, or a new one made within `deadline` (at most
    /// [`CONNECT_DEADLINE_MS`]).
    async fn connection(
        &mut self,
        address: &str,
        deadline: Duration,
    ) -> Result<PeerConnection, ExchangeError> {
        if let Some(connection) = self.connections.get(address) {
            if connection.connection().close_reason().is_none() {
                return Ok(connection.clone());
            }
            self.connections.remove(address);
        }
        let connecting = self.client.connect_to(address, transport::ALPN_API);
        let connect_deadline = deadline.min(self.connect_deadline);
        let connection = tokio::time::timeout(connect_deadline, connecting)
            .await
            .map_err(|_| {
                ExchangeError::Unreachable(format!(
                    "no handshake within {} ms",
                    connect_deadline.as_millis()
                ))
            })?
            .map_err(|error| ExchangeError::Unreachable(format!("{:#}", anyhow!(error))))?;
        self.connections
            .insert(address.to_string(), connection.clone());
        Ok(connection)
    }

    /// Closes every connection.
    pub fn close(&mut self) {
        for connection in self.connections.values() {
            connection.close();
        }
        self.connections.clear();
        self.client.close();
    }
}

impl Exchange for QuicExchange {
    async fn exchange(
        &mut self,
        address: &str,
        request: &ApiRequest,
        deadline: Duration,
    ) -> Result<ApiResponse, ExchangeError> {
        let connection = self.connection(address, deadline).await?;
        let in_cluster = self.cluster.map(|cluster| ApiRequest::InCluster {
            cluster,
            request: Box::new(request.clone()),
        });
        match connection
            .request::<ApiRequest, ApiResponse>(in_cluster.as_ref().unwrap_or(request), deadline)
            .await
        {
            Ok(response) => Ok(response),
            Err(error) => {
                let error = exchange_error(request, error);
                if matches!(error, ExchangeError::Lost(_)) {
                    self.connections.remove(address);
                }
                Err(error)
            }
        }
    }
}

/// Sorts a failed request by what the caller may do next, in words that say which side was at
/// fault. An answer over the frame limit or cut short (a coordinator that could not send it
/// whole) is about the answer's size, not a version mismatch; only bytes that do not decode
/// are.
pub fn exchange_error(request: &ApiRequest, error: RequestError) -> ExchangeError {
    let narrow = how_to_narrow(request);
    match error {
        RequestError::Answer(FrameError::TooLarge { size, limit }) => ExchangeError::Refused(
            format!("the answer is too large ({size} bytes, limit {limit}); {narrow}"),
        ),
        RequestError::Answer(FrameError::Truncated { expected, received }) => {
            ExchangeError::Refused(format!(
                "the answer was cut short ({received} of {expected} bytes): the coordinator \
                 could not send it whole, most likely because it was over the frame limit (its \
                 log says); {narrow}"
            ))
        }
        RequestError::Answer(FrameError::Io(error)) => {
            ExchangeError::Lost(format!("reading the answer failed: {error}"))
        }
        RequestError::Answer(error) => ExchangeError::Refused(format!(
            "the answer does not decode ({error}); are this quotient and the coordinators the \
             same version?"
        )),
        RequestError::Frame(FrameError::TooLarge { size, limit }) => ExchangeError::Refused(
            format!("the request is too large to send ({size} bytes, limit {limit})"),
        ),
        RequestError::Refused { code } if code == u64::from(STREAM_CODE_BAD_FRAME) => {
            ExchangeError::Refused(format!(
                "{}; are this quotient and the coordinators the same version?",
                RequestError::Refused { code }
            ))
        }
        // Not carried out; the error says which side to upgrade.
        RequestError::Version(mismatch) => ExchangeError::Refused(mismatch.to_string()),
        error @ (RequestError::Frame(_) | RequestError::Refused { .. }) => {
            ExchangeError::Refused(format!("{:#}", anyhow!(error)))
        }
        error => ExchangeError::Lost(format!("{:#}", anyhow!(error))),
    }
}

/// A connected client for synchronous command code: the config's addresses, the QUIC
/// exchange and a small runtime to drive it.
pub struct Session {
    // An Option so that `Drop` can close it while the runtime is still there.
    exchange: Option<QuicExchange>,
    addresses: Vec<String>,
    policy: RetryPolicy,
    runtime: tokio::runtime::Runtime,
}

impl Session {
    /// Finds the client config (`--config`, `$QUOTIENT_CONFIG`, `~/.config/quotient`) and
    /// loads its certificates.
    pub fn open(config_flag: Option<&Path>) -> anyhow::Result<Session> {
        let config = client_config::load(config_flag)?;
        Session::from_config(&config)
    }

    /// A session for the coordinators and certificates of `config`.
    pub fn from_config(config: &ClientConfig) -> anyhow::Result<Session> {
        let identity = TlsIdentity::load(&config.tls_files())
            .context("cannot load the certificate named by the client config")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        Ok(Session {
            exchange: Some(QuicExchange::new(identity, config.cluster_id)),
            addresses: config.coordinators.clone(),
            policy: RetryPolicy::default(),
            runtime,
        })
    }

    /// Replaces the retry policy (dev up waits longer for the first election).
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The coordinators the config lists.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// Sends `request` to the cluster (following redirects) and returns its answer, or the
    /// coordinator's refusal as an error that says what to do.
    pub fn call(&mut self, request: ApiRequest) -> anyhow::Result<ApiResponse> {
        let exchange = self.exchange.as_mut().context("the session is closed")?;
        let mut addresses = self.addresses.clone();
        if !exchange.has_open_connection() {
            let first = self
                .runtime
                .block_on(exchange.connect_first(&addresses))
                .map_err(|errors| unreachable_error(&errors))?;
            // Start with the coordinator that answered first; the others stay as fallbacks.
            addresses.retain(|address| *address != first);
            addresses.insert(0, first);
        }
        let response = self
            .runtime
            .block_on(call(exchange, &addresses, &request, &self.policy))?;
        into_result(&request, response)
    }

    /// Sends `request` to the coordinator at `address` only: no redirects, no retries (for
    /// `Health`, which is about the coordinator that answers).
    pub fn call_one(&mut self, address: &str, request: ApiRequest) -> anyhow::Result<ApiResponse> {
        let deadline = self.policy.attempt_deadline;
        self.call_one_within(address, request, deadline)
    }

    /// [`Session::call_one`] with a deadline of its own (`cluster init` waits for the other
    /// coordinators to catch up).
    pub fn call_one_within(
        &mut self,
        address: &str,
        request: ApiRequest,
        deadline: Duration,
    ) -> anyhow::Result<ApiResponse> {
        let exchange = self.exchange.as_mut().context("the session is closed")?;
        let response = self
            .runtime
            .block_on(exchange.exchange(address, &request, deadline))
            .map_err(|error| match error {
                ExchangeError::Unreachable(why)
                | ExchangeError::Lost(why)
                | ExchangeError::Refused(why) => anyhow!("{address}: {why}"),
            })?;
        into_result(&request, response)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _entered = self.runtime.enter();
        if let Some(mut exchange) = self.exchange.take() {
            exchange.close();
            // Let the endpoint's driver send the close frames, so the coordinators drop these
            // connections now rather than after their idle timeout.
            self.runtime
                .block_on(tokio::time::sleep(Duration::from_millis(CLOSE_FLUSH_MS)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::api::HealthView;
    use quotient_common::JobSpec;
    use std::collections::VecDeque;

    /// A scripted coordinator set: each address answers from its own queue, and every try is
    /// recorded.
    #[derive(Default)]
    struct FakeExchange {
        scripts: BTreeMap<String, VecDeque<Result<ApiResponse, ExchangeError>>>,
        tried: Vec<String>,
        sent: Vec<ApiRequest>,
    }

    impl FakeExchange {
        fn script(mut self, address: &str, answer: Result<ApiResponse, ExchangeError>) -> Self {
            self.scripts
                .entry(address.to_string())
                .or_default()
                .push_back(answer);
            self
        }
    }

    impl Exchange for FakeExchange {
        async fn exchange(
            &mut self,
            address: &str,
            request: &ApiRequest,
            _deadline: Duration,
        ) -> Result<ApiResponse, ExchangeError> {
            self.tried.push(address.to_string());
            self.sent.push(request.clone());
            self.scripts
                .get_mut(address)
                .and_then(|queue| queue.pop_front())
                .unwrap_or_else(|| Err(ExchangeError::Unreachable("not scripted".into())))
        }
    }

    fn fast() -> RetryPolicy {
        RetryPolicy {
            call_deadline: Duration::from_millis(2_000),
            attempt_deadline: Duration::from_millis(100),
            redirects_max: 3,
            backoff: Duration::from_millis(1),
            backoff_max: Duration::from_millis(5),
        }
    }

    fn addresses() -> Vec<String> {
        vec!["a:1".into(), "b:1".into(), "c:1".into()]
    }

    fn health() -> ApiResponse {
        ApiResponse::Health(HealthView {
            id: 2,
            leader: Some(2),
            term: 1,
            last_applied: 0,
            healthy: true,
            state_digest: 0,
            cluster_id: None,
            problems: Vec::new(),
        })
    }

    fn not_leader(address: Option<&str>) -> Result<ApiResponse, ExchangeError> {
        Ok(ApiResponse::Error(ApiError::NotLeader {
            leader_id: address.map(|_| 2),
            leader_address: address.map(str::to_string),
        }))
    }

    fn run(
        fake: &mut FakeExchange,
        request: &ApiRequest,
        policy: &RetryPolicy,
    ) -> anyhow::Result<ApiResponse> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(call(fake, &addresses(), request, policy))
    }

    #[test]
    fn a_follower_redirect_is_followed_to_the_leader() {
        // Proves NotLeader with an address goes straight to that address, unseen by the user.
        let mut fake = FakeExchange::default()
            .script("a:1", not_leader(Some("b:1")))
            .script("b:1", Ok(health()));
        let answer = run(&mut fake, &ApiRequest::ListShares, &fast()).unwrap();
        assert_eq!(answer, health());
        assert_eq!(fake.tried, ["a:1", "b:1"]);
    }

    #[test]
    fn a_redirect_out_of_reach_goes_back_to_the_follower_to_be_forwarded() {
        // Proves that when the leader's address cannot be reached, the follower that
        // redirected gets the request again, asking it to serve it through the leader.
        let mut fake = FakeExchange::default()
            .script("a:1", not_leader(Some("leader.internal:7400")))
            .script(
                "leader.internal:7400",
                Err(ExchangeError::Unreachable("no such host".into())),
            )
            .script("a:1", Ok(health()));
        let answer = run(&mut fake, &ApiRequest::ListShares, &fast()).unwrap();
        assert_eq!(answer, health());
        assert_eq!(fake.tried, ["a:1", "leader.internal:7400", "a:1"]);
        assert_eq!(
            fake.sent,
            [
                ApiRequest::ListShares,
                ApiRequest::ListShares,
                ApiRequest::ViaLeader(Box::new(ApiRequest::ListShares)),
            ]
        );
    }

    #[test]
    fn redirects_are_bounded() {
        // Proves a redirect loop ends with a clear error after the allowed hops.
        let mut fake = FakeExchange::default();
        for _ in 0..10 {
            fake = fake
                .script("a:1", not_leader(Some("b:1")))
                .script("b:1", not_leader(Some("a:1")));
        }
        let error = run(&mut fake, &ApiRequest::ListShares, &fast()).unwrap_err();
        assert!(error.to_string().contains("redirected"), "{error}");
        assert_eq!(fake.tried.len(), 4, "{:?}", fake.tried);
    }

    #[test]
    fn an_election_is_waited_out() {
        // Proves Unavailable and "no leader" are retried, and the next answer is returned.
        let mut fake = FakeExchange::default()
            .script("a:1", not_leader(None))
            .script(
                "b:1",
                Ok(ApiResponse::Error(ApiError::Unavailable("electing".into()))),
            )
            .script("c:1", Ok(health()));
        let answer = run(&mut fake, &ApiRequest::ListShares, &fast()).unwrap();
        assert_eq!(answer, health());
        assert_eq!(fake.tried, ["a:1", "b:1", "c:1"]);
    }

    #[test]
    fn an_endless_election_ends_at_the_deadline() {
        // Proves the overall deadline bounds the retries and the error says what was seen.
        let mut fake = FakeExchange::default();
        for _ in 0..1_000 {
            for address in addresses() {
                fake = fake.script(&address, not_leader(None));
            }
        }
        let policy = RetryPolicy {
            call_deadline: Duration::from_millis(50),
            ..fast()
        };
        let error = run(&mut fake, &ApiRequest::ListShares, &policy).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("no leader yet"), "{text}");
        assert!(text.contains("cluster status"), "{text}");
    }

    #[test]
    fn an_unreachable_coordinator_is_skipped() {
        // Proves a connection failure moves on to the next address.
        let mut fake = FakeExchange::default()
            .script("a:1", Err(ExchangeError::Unreachable("refused".into())))
            .script("b:1", Ok(health()));
        let answer = run(&mut fake, &ApiRequest::ListShares, &fast()).unwrap();
        assert_eq!(answer, health());
        assert_eq!(fake.tried, ["a:1", "b:1"]);
    }

    #[test]
    fn no_reachable_coordinator_fails_after_one_sweep() {
        // Proves a stopped cluster fails fast, naming every address and what to do.
        let mut fake = FakeExchange::default();
        let error = run(&mut fake, &ApiRequest::ListShares, &fast()).unwrap_err();
        let text = error.to_string();
        for address in addresses() {
            assert!(text.contains(&address), "{text}");
        }
        assert!(text.contains("quotient dev up"), "{text}");
        assert_eq!(fake.tried.len(), 3);
    }

    #[test]
    fn a_lost_write_is_not_retried_but_a_keyed_submit_is() {
        // Proves only retry-safe requests are sent again after a lost answer.
        let lost = || Err(ExchangeError::Lost("connection lost".into()));
        let mut fake = FakeExchange::default()
            .script("a:1", lost())
            .script("b:1", Ok(ApiResponse::Done));
        let cancel = ApiRequest::CancelJob {
            job: quotient_common::JobId(1),
        };
        let error = run(&mut fake, &cancel, &fast()).unwrap_err();
        assert!(error.to_string().contains("may or may not"), "{error}");
        assert_eq!(fake.tried, ["a:1"]);

        let mut spec = JobSpec::new("qs1", 1, 1, vec!["true".into()]);
        spec.idempotency_key = Some("k".into());
        let submit = ApiRequest::SubmitJob(spec);
        let mut fake = FakeExchange::default()
            .script("a:1", lost())
            .script("b:1", Ok(ApiResponse::Done));
        assert_eq!(run(&mut fake, &submit, &fast()).unwrap(), ApiResponse::Done);
    }

    #[test]
    fn an_answer_too_large_or_cut_short_is_not_blamed_on_versions() {
        // Proves that an answer over the frame limit, or one a coordinator cut short (what
        // coordinators did with an answer over the limit), says so and how to narrow the
        // request, and is not retried; only bytes that do not decode ask about versions.
        let list = ApiRequest::ListJobs {
            share: None,
            state: None,
        };
        let said = |error| match exchange_error(&list, error) {
            ExchangeError::Refused(text) => text,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let too_large = said(RequestError::Answer(FrameError::TooLarge {
            size: 20_000_000,
            limit: 16_777_216,
        }));
        let cut_short = said(RequestError::Answer(FrameError::Truncated {
            expected: 4,
            received: 0,
        }));
        for text in [&too_large, &cut_short] {
            assert!(!text.contains("version"), "{text}");
            assert!(
                text.contains("--share NAME") && text.contains("--state"),
                "{text}"
            );
        }
        assert!(
            too_large.contains("too large (20000000 bytes, limit 16777216)"),
            "{too_large}"
        );
        assert!(cut_short.contains("cut short"), "{cut_short}");
        let undecodable = said(RequestError::Answer(FrameError::TrailingBytes {
            trailing: 3,
        }));
        assert!(undecodable.contains("same version"), "{undecodable}");
        // A coordinator of another version of the API refused the request: not carried out,
        // and the text says which side to upgrade.
        let mismatch = quotient_common::version::API_WIRE.mismatch(
            quotient_common::version::Writer::Peer("the peer at 10.0.0.1:7401".into()),
            (9, 9),
        );
        let other_version = said(RequestError::Version(mismatch));
        assert!(
            other_version.contains("version 9") && other_version.contains("upgrade this program"),
            "{other_version}"
        );

        // Through the retry loop: one answer, no retry, the coordinator named.
        let mut fake = FakeExchange::default()
            .script("a:1", Err(ExchangeError::Refused(too_large.clone())))
            .script("b:1", Ok(health()));
        let error = run(&mut fake, &list, &fast()).unwrap_err().to_string();
        assert_eq!(fake.tried, ["a:1"]);
        assert!(
            error.contains("a:1") && error.contains(&too_large),
            "{error}"
        );
        assert!(!error.contains("version"), "{error}");

        // The coordinator's own refusal reads the same way.
        let refused = into_result(
            &list,
            ApiResponse::Error(ApiError::AnswerTooLarge {
                size_bytes: 20_000_000,
                limit_bytes: 16_777_216,
                narrow: how_to_narrow(&list).to_string(),
            }),
        )
        .unwrap_err()
        .to_string();
        assert!(
            refused.starts_with("the answer is too large (20000000 bytes, limit 16777216)")
                && refused.contains("quotient job list --share NAME"),
            "{refused}"
        );
    }

    #[test]
    fn refusals_carry_a_hint() {
        // Proves API errors become messages that say what to do.
        let request = ApiRequest::GetShare { name: "x".into() };
        let error = into_result(
            &request,
            ApiResponse::Error(ApiError::NotFound("share x".into())),
        )
        .unwrap_err();
        assert!(error.to_string().contains("quotient share list"), "{error}");
        let error = into_result(
            &ApiRequest::ListShares,
            ApiResponse::Error(ApiError::Unauthorized("user alice".into())),
        )
        .unwrap_err();
        assert!(error.to_string().contains("--role admin"), "{error}");
        assert_eq!(request_name(&request), "GetShare");
    }
}
