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
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// The content type of `/metrics`: prometheus-client writes OpenMetrics text.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long one render of the metrics answers the scrapes that follow it. Scrapes at once
/// share one render, and the connections that hold its answer hold one buffer between them
/// (found by probing: 127 connections that sent many scrapes and read no answer held about
/// 2 MB each, a render apiece); scrapers come every 15 s or so and never see the difference.
pub const RENDER_REUSE: Duration = Duration::from_secs(1);

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
        let door = Arc::new(Door {
            source,
            last: tokio::sync::Mutex::new(None),
        });
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(door);
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

/// The door's state: the source, and its last render with when it was made.
struct Door {
    source: Arc<dyn MetricsSource>,
    last: tokio::sync::Mutex<Option<(Instant, axum::body::Bytes)>>,
}

async fn metrics(State(door): State<Arc<Door>>) -> impl IntoResponse {
    // One render at a time; those who waited for it take it ([`RENDER_REUSE`]).
    let mut last = door.last.lock().await;
    let body = match last.as_ref() {
        Some((at, body)) if at.elapsed() < RENDER_REUSE => body.clone(),
        _ => {
            // Rendering reads the process's state under its locks: off the async workers.
            let source = door.source.clone();
            let text = tokio::task::spawn_blocking(move || source.render())
                .await
                .unwrap_or_else(|error| format!("# the metrics could not be rendered: {error}\n"));
            let body = axum::body::Bytes::from(text);
            *last = Some((Instant::now(), body.clone()));
            body
        }
    };
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body)
}

async fn readyz(State(door): State<Arc<Door>>) -> impl IntoResponse {
    match door.source.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// The labels of [`register_certificate_expiry`]'s gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct CertificateLabels {
    certificate: &'static str,
}

/// Registers `quotient_certificate_expiry_timestamp_seconds` in `registry`: when the process's
/// own certificate (`certificate="own"`) and the first of the CA certificates it trusts
/// (`certificate="ca"`) stop being valid, in seconds since the epoch. An alert on it minus
/// `time()` warns well before either runs out (deploy/prometheus/alerts.yml).
pub fn register_certificate_expiry(
    registry: &mut prometheus_client::registry::Registry,
    tls: &crate::tls::TlsIdentity,
) {
    let expiry = prometheus_client::metrics::family::Family::<
        CertificateLabels,
        prometheus_client::metrics::gauge::Gauge,
    >::default();
    for (certificate, not_after) in [("own", tls.not_after()), ("ca", tls.ca_not_after())] {
        if let Some(not_after) = not_after {
            expiry
                .get_or_create(&CertificateLabels { certificate })
                .set(not_after);
        }
    }
    registry.register(
        "quotient_certificate_expiry_timestamp_seconds",
        "When this process's certificate (own) and its cluster CA (ca) stop being valid, in seconds since the Unix epoch",
        expiry,
    );
}

/// Encodes `registry` as OpenMetrics text.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, registry) {
        text = format!("# the metrics could not be encoded: {error}\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    struct Counting(AtomicUsize);

    impl MetricsSource for Counting {
        fn render(&self) -> String {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            format!("renders {n}\n")
        }
        fn ready(&self) -> Result<(), String> {
            Ok(())
        }
    }

    async fn scrape(addr: SocketAddr) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: door\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn scrapes_at_once_share_one_render_and_a_later_one_renders_again() {
        // Proves that many scrapes at once cost one render, which they all get (so the
        // connections holding its answer hold one buffer), and that a scrape past
        // RENDER_REUSE sees a fresh render.
        let source = Arc::new(Counting(AtomicUsize::new(0)));
        let door = MetricsServer::start("127.0.0.1:0".parse().unwrap(), source.clone())
            .await
            .unwrap();
        let addr = door.local_addr();
        let scrapes: Vec<_> = (0..16).map(|_| tokio::spawn(scrape(addr))).collect();
        let mut answers = Vec::new();
        for scrape in scrapes {
            answers.push(scrape.await.unwrap());
        }
        assert!(
            answers.iter().all(|answer| answer.ends_with("renders 1\n")),
            "{answers:?}"
        );
        assert_eq!(source.0.load(Ordering::SeqCst), 1);
        tokio::time::sleep(RENDER_REUSE + Duration::from_millis(50)).await;
        assert!(scrape(addr).await.ends_with("renders 2\n"));
        door.stop();
    }
}
