//! The AWS Batch–compatible endpoint (docs/aws-batch.md): HTTPS with the cluster's
//! certificate at `--aws-listen`, the AWS Batch API's rest-json protocol as botocore's service
//! model describes it, SigV4 checked against the access keys in the replicated state.
//!
//! A thin door: each operation becomes one or a few [`ApiRequest`]s, answered by the same
//! handler as the QUIC API ([`ApiService::handle`]) for the user the access key stands for,
//! served through the leader when this coordinator is a follower. Only signature checking
//! reads this coordinator's own copy of the state (the keys), and reads of what the door
//! itself kept (queues, service environments) go through the handler like any other read.

mod error;
mod instance_types;
mod jobs;
mod objects;
mod shares;
pub mod sigv4;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::TokioIo;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::certs::PeerIdentity;
use quotient_common::http_door;
use serde_json::Value;

use crate::api::ApiService;
use crate::context::Context;

pub use error::AwsError;
pub use instance_types::{InstanceType, InstanceTypes};

/// The largest request body read: a service job's payload is at most 64 KiB, and every other
/// request is far smaller. Checked before the body is parsed.
pub const AWS_BODY_BYTES_MAX: usize = 256 * 1024;
/// How long a client has to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// How long a request's body may take to arrive after its headers.
pub const BODY_READ_TIMEOUT_MS: u64 = 10_000;
/// How long a follower waits for an access key it does not know yet to be replicated to it,
/// before it answers that the key is unknown.
pub const KEY_CATCH_UP_MS: u64 = 2_000;
/// How often it looks again meanwhile.
const KEY_CATCH_UP_POLL_MS: u64 = 50;
/// The account id in the ARNs the endpoint makes: one cluster is one account.
pub const ACCOUNT_ID: &str = "000000000000";

/// What the endpoint is configured with.
#[derive(Debug, Clone)]
pub struct AwsSettings {
    /// The region a request's signature must be scoped to (`us-east-1` by default).
    pub region: String,
    pub instance_types: InstanceTypes,
}

/// What each operation reaches: the API handler, the state (for keys), the settings.
#[derive(Clone)]
pub(crate) struct Door {
    api: ApiService,
    ctx: Context,
    settings: Arc<AwsSettings>,
}

impl Door {
    /// `request` answered for `caller`, through the leader when this is a follower.
    async fn call(
        &self,
        caller: &PeerIdentity,
        request: ApiRequest,
    ) -> Result<ApiResponse, AwsError> {
        match self
            .api
            .handle(caller, None, ApiRequest::ViaLeader(Box::new(request)))
            .await
        {
            ApiResponse::Error(error) => Err(AwsError::from_api(error)),
            response => Ok(response),
        }
    }

    /// Whether this coordinator leads now.
    fn is_leader(&self) -> bool {
        self.ctx.raft.metrics().borrow().current_leader == Some(self.ctx.id())
    }

    fn arn(&self, kind: &str, name: &str) -> String {
        format!(
            "arn:aws:batch:{}:{ACCOUNT_ID}:{kind}/{name}",
            self.settings.region
        )
    }
}

/// A running endpoint; [`AwsServer::stop`] stops it.
pub struct AwsServer {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl AwsServer {
    /// Binds `addr` and serves the endpoint there with `tls` (the coordinator's certificate).
    pub async fn start(
        addr: SocketAddr,
        tls: rustls::ServerConfig,
        ctx: Context,
        settings: AwsSettings,
    ) -> std::io::Result<AwsServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let door = Door {
            api: ApiService::new(&ctx),
            ctx,
            settings: Arc::new(settings),
        };
        // The body is read by `handle` itself, within its limits of size and time.
        let app = Router::new()
            .fallback(handle)
            .layer(DefaultBodyLimit::disable())
            .with_state(door);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(accept_loop(listener, acceptor, app));
        tracing::info!(%local_addr, "serving the AWS Batch API over HTTPS");
        Ok(AwsServer { local_addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
) {
    // Connections counted and timed as every HTTP door's (`http_door`): the handshake
    // included, so that unfinished handshakes cannot pile up either.
    let limits = http_door::DOOR_LIMITS;
    http_door::accept_each(listener, limits, "aws", move |stream, peer| {
        let acceptor = acceptor.clone();
        let app = app.clone();
        async move {
            let handshake = tokio::time::timeout(
                Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS),
                acceptor.accept(stream),
            )
            .await;
            let stream = match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "an AWS endpoint client failed its TLS handshake");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "an AWS endpoint client did not finish its TLS handshake");
                    return;
                }
            };
            if let Err(error) = http_door::serve_http1(TokioIo::new(stream), app, limits).await {
                tracing::debug!(%peer, %error, "an AWS endpoint connection ended");
            }
        }
    })
    .await;
}

/// The body of a request, read within [`BODY_READ_TIMEOUT_MS`] and [`AWS_BODY_BYTES_MAX`]:
/// a client that sends less than it declared, or more than the limit, is answered with an
/// AWS error rather than held.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, AwsError> {
    let too_large = || AwsError {
        status: 413,
        code: "ClientException",
        message: format!(
            "the request body is larger than {AWS_BODY_BYTES_MAX} bytes: a request of this API \
             is far smaller"
        ),
    };
    // A body declared too large is refused before any of it is read.
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|bytes| bytes > AWS_BODY_BYTES_MAX as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(
        Duration::from_millis(BODY_READ_TIMEOUT_MS),
        axum::body::to_bytes(body, AWS_BODY_BYTES_MAX),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(error)) => {
            let error = error.into_inner();
            if error.is::<http_body_util::LengthLimitError>() {
                Err(too_large())
            } else {
                Err(AwsError::client(format!(
                    "the request body could not be read ({error}): send it whole, as its \
                     Content-Length or chunks declare"
                )))
            }
        }
        Err(_) => Err(AwsError {
            status: 408,
            code: "ClientException",
            message: format!(
                "the request body did not arrive within {} s: send it whole with the headers",
                BODY_READ_TIMEOUT_MS / 1000
            ),
        }),
    }
}

/// Every request: the operation by its path, the caller by its signature, then the operation.
async fn handle(
    State(door): State<Door>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let operation = uri.path().trim_end_matches('/').to_ascii_lowercase();
    let result = match read_body(&headers, body).await {
        Ok(body) => answer(&door, &method, &uri, &headers, &body, &operation).await,
        Err(error) => Err(error),
    };
    match result {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(error) => {
            tracing::debug!(operation, code = error.code, message = %error.message, "refused an AWS request");
            error.into_response()
        }
    }
}

async fn answer(
    door: &Door,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    operation: &str,
) -> Result<Value, AwsError> {
    let started = tokio::time::Instant::now();
    let caller = loop {
        let keys = |id: &str| {
            door.ctx
                .state_machine
                .read(|state| state.access_key(id).cloned())
        };
        let verified = sigv4::verify(
            method,
            uri,
            headers,
            body,
            &door.settings.region,
            std::time::SystemTime::now(),
            keys,
        );
        match verified {
            // A key just issued may not have reached this follower yet (the leader answered
            // its creation once a majority had it): give replication a moment.
            Err(error)
                if error.code == sigv4::UNKNOWN_KEY
                    && !door.is_leader()
                    && started.elapsed() < Duration::from_millis(KEY_CATCH_UP_MS) =>
            {
                tokio::time::sleep(Duration::from_millis(KEY_CATCH_UP_POLL_MS)).await;
            }
            verified => break verified?,
        }
    };
    if method != Method::POST {
        return Err(AwsError::unknown_operation(method.as_str(), uri.path()));
    }
    let input: Value = if body.is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(body)
            .map_err(|error| AwsError::client(format!("the request body is not JSON: {error}")))?
    };
    if !input.is_object() {
        return Err(AwsError::client("the request body must be a JSON object"));
    }
    match operation {
        "/v1/createquotashare" => shares::create(door, &caller, &input).await,
        "/v1/updatequotashare" => shares::update(door, &caller, &input).await,
        "/v1/describequotashare" => shares::describe(door, &caller, &input).await,
        "/v1/listquotashares" => shares::list(door, &caller, &input).await,
        "/v1/deletequotashare" => shares::delete(door, &caller, &input).await,
        "/v1/submitservicejob" => jobs::submit(door, &caller, &input).await,
        "/v1/updateservicejob" => jobs::update(door, &caller, &input).await,
        "/v1/describeservicejob" => jobs::describe(door, &caller, &input).await,
        "/v1/listservicejobs" => jobs::list(door, &caller, &input).await,
        "/v1/terminateservicejob" => jobs::terminate(door, &caller, &input).await,
        "/v1/terminateservicejobs" => jobs::terminate_many(door, &caller, &input).await,
        "/v1/createschedulingpolicy" => objects::create_policy(door, &caller, &input).await,
        "/v1/describeschedulingpolicies" => objects::describe_policies(door, &caller, &input).await,
        "/v1/createserviceenvironment" => objects::create_environment(door, &caller, &input).await,
        "/v1/describeserviceenvironments" => {
            objects::describe_environments(door, &caller, &input).await
        }
        "/v1/createjobqueue" => objects::create_queue(door, &caller, &input).await,
        "/v1/describejobqueues" => objects::describe_queues(door, &caller, &input).await,
        _ => Err(AwsError::unknown_operation(method.as_str(), uri.path())),
    }
}

/// `value` as a JSON answer with `status`.
fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// Field `name` of `input` as a string, if present.
fn string<'a>(input: &'a Value, name: &str) -> Result<Option<&'a str>, AwsError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(AwsError::client(format!("{name} must be a string"))),
    }
}

/// Field `name` of `input`, a string that must be there.
fn required<'a>(input: &'a Value, name: &str) -> Result<&'a str, AwsError> {
    string(input, name)?.ok_or_else(|| AwsError::client(format!("{name} is required")))
}

/// Field `name` of `input` as an integer, if present.
fn integer(input: &Value, name: &str) -> Result<Option<i64>, AwsError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_i64()
            .map(Some)
            .ok_or_else(|| AwsError::client(format!("{name} must be an integer"))),
    }
}

/// The last part of an ARN (`arn:...:kind/NAME`), or the text itself when it is a name.
fn name_of(arn_or_name: &str) -> &str {
    if arn_or_name.starts_with("arn:") {
        arn_or_name.rsplit('/').next().unwrap_or(arn_or_name)
    } else {
        arn_or_name
    }
}

/// Milliseconds since the epoch as AWS's `Long` timestamps.
fn millis(ms: u64) -> Value {
    Value::from(ms)
}
