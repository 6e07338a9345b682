//! The HTTP door a coordinator or an agent serves at `--metrics-listen ADDR`:
//!
//! - `GET /metrics`: its metrics in the Prometheus (OpenMetrics) text format;
//! - `GET /healthz`: 200 while the process serves at all (a liveness probe);
//! - `GET /readyz`: 200 when it is ready for work, 503 with the reason otherwise (a
//!   readiness probe; what "ready" means is the process's own, [`MetricsSource::ready`]).
//!
//! Plain HTTP: it says nothing that is secret (share names, counts, timings) and changes
//! nothing, and Prometheus and Kubernetes probes speak it without client certificates. Bind
//! it to an address only the monitoring network reaches. Every request is a GET without a
//! body, so no request body is read; axum answers anything else with 404 or 405. Its
//! connections are limited in number and time as every HTTP door's ([`crate::http_door`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// The content type of `/metrics`: prometheus-client writes OpenMetrics text.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the door shows: a process's metrics and readiness.
pub trait MetricsSource: Send + Sync + 'static {
    /// Its metrics, encoded (refreshed first where they are read off its state).
    fn render(&self) -> String;
    /// `Ok` when ready for work; otherwise why not, in words.
    fn ready(&self) -> Result<(), String>;
}

/// A running door; dropping it does not stop it (it runs until the runtime ends), call
/// [`MetricsServer::stop`].
pub struct MetricsServer {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free one) and serves `source` there.
    pub async fn start(
        addr: SocketAddr,
        source: Arc<dyn MetricsSource>,
    ) -> std::io::Result<MetricsServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(source);
        // Connections counted and timed as every HTTP door's (`http_door`).
        let limits = crate::http_door::DOOR_LIMITS;
        let task = tokio::spawn(crate::http_door::accept_each(
            listener,
            limits,
            "metrics",
            move |stream, peer| {
                let app = app.clone();
                async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    if let Err(error) = crate::http_door::serve_http1(io, app, limits).await {
                        tracing::debug!(%peer, %error, "a metrics connection ended");
                    }
                }
            },
        ));
        tracing::info!(%local_addr, "serving /metrics, /healthz and /readyz");
        Ok(MetricsServer { local_addr, task })
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.task.abort();
    }
}

async fn metrics(State(source): State<Arc<dyn MetricsSource>>) -> impl IntoResponse {
    // Rendering reads the process's state under its locks: off the async workers.
    let body = tokio::task::spawn_blocking(move || source.render())
        .await
        .unwrap_or_else(|error| format!("# the metrics could not be rendered: {error}\n"));
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body)
}

async fn readyz(State(source): State<Arc<dyn MetricsSource>>) -> impl IntoResponse {
    match source.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// Encodes `registry` as OpenMetrics text.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, registry) {
        text = format!("# the metrics could not be encoded: {error}\n");
    }
    text
}
