//! An agent's Prometheus metrics (`--metrics-listen ADDR`, `GET /metrics`), read at each
//! scrape: its GPUs as the backend reports them (NVML, or the simulated ones), its lease, and
//! the attempts it runs by phase.
//!
//! `quotient_gpu_xid_errors_total` counts the critical XID errors the backend holds for a GPU:
//! NVML's backend keeps the newest 16 per device (`gpu::nvml::XID_EVENTS_KEPT_MAX`), so past
//! 16 the count stops growing; one such error already makes the GPU unhealthy, which the node
//! reports to the leader. A reading the device does not give is left out, not shown as 0.
//!
//! Ready (`/readyz`) means a leader acknowledged this process's registration or a heartbeat
//! and the lease has not run out since.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use quotient_common::agent_api::ActualPhase;
use quotient_common::metrics_http::MetricsSource;

use crate::session::Shared;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    connection: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    state: &'static str,
}

/// The agent's door: its metrics and readiness, from what the session shares.
pub struct AgentDoor {
    pub shared: Arc<Shared>,
    /// The agent's certificate and CA, for their expiry.
    pub tls: quotient_common::tls::TlsIdentity,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

impl AgentDoor {
    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        let utilization = Family::<GpuLabels, FloatGauge>::default();
        let memory = Family::<GpuLabels, Gauge>::default();
        let temperature = Family::<GpuLabels, Gauge>::default();
        let power = Family::<GpuLabels, FloatGauge>::default();
        let xid = Family::<GpuLabels, Counter>::default();
        let healthy = Family::<GpuLabels, Gauge>::default();
        match self.shared.backend.inventory() {
            Ok(gpus) => {
                for gpu in gpus {
                    let labels = GpuLabels {
                        gpu: gpu.index.to_string(),
                        uuid: gpu.uuid.clone(),
                    };
                    if let Some(percent) = gpu.utilization_percent {
                        utilization
                            .get_or_create(&labels)
                            .set(f64::from(percent) / 100.0);
                    }
                    if let Some(bytes) = gpu.memory_used_bytes {
                        memory
                            .get_or_create(&labels)
                            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                    }
                    if let Some(celsius) = gpu.temperature_celsius {
                        temperature.get_or_create(&labels).set(i64::from(celsius));
                    }
                    if let Some(milliwatts) = gpu.power_milliwatts {
                        power
                            .get_or_create(&labels)
                            .set(f64::from(milliwatts) / 1_000.0);
                    }
                    if let Some(events) = &gpu.xid_events {
                        xid.get_or_create(&labels).inc_by(events.len() as u64);
                    }
                    healthy.get_or_create(&labels).set(i64::from(gpu.healthy));
                }
            }
            Err(error) => tracing::warn!("cannot read the GPUs for /metrics: {error}"),
        }
        registry.register(
            "quotient_gpu_utilization_ratio",
            "How busy the GPU was over the driver's last sample period, 0 to 1",
            utilization,
        );
        registry.register(
            "quotient_gpu_memory_used_bytes",
            "GPU memory in use",
            memory,
        );
        registry.register(
            "quotient_gpu_temperature_celsius",
            "GPU temperature",
            temperature,
        );
        registry.register("quotient_gpu_power_watts", "GPU power draw", power);
        registry.register(
            "quotient_gpu_xid_errors",
            "Critical XID errors held for the GPU (the newest 16 at most)",
            xid,
        );
        registry.register(
            "quotient_gpu_healthy",
            "1 while the GPU is healthy, 0 once it is not (XID errors, ECC, lost)",
            healthy,
        );
        let lease = FloatGauge::default();
        lease.set(self.shared.lease().remaining(Instant::now()).as_secs_f64());
        registry.register(
            "quotient_agent_lease_remaining_seconds",
            "What is left of the agent's lease: at zero it stops its jobs",
            lease,
        );
        let jobs = Family::<PhaseLabels, Gauge>::default();
        for state in ["starting", "running", "stopping"] {
            jobs.get_or_create(&PhaseLabels { state }).set(0);
        }
        for attempt in self.shared.actual.borrow().iter() {
            let state = match attempt.phase {
                ActualPhase::Starting => "starting",
                ActualPhase::Running => "running",
                ActualPhase::Stopping => "stopping",
            };
            jobs.get_or_create(&PhaseLabels { state }).inc();
        }
        let links = &self.shared.links;
        let standing = Gauge::<i64>::default();
        standing.set(i64::try_from(links.standing_open()).unwrap_or(i64::MAX));
        registry.register(
            "quotient_agent_standing_connections",
            "Idle connections open to coordinators other than the leader, for a failover without a handshake",
            standing,
        );
        let registrations = Family::<ConnectionLabels, Counter>::default();
        for (connection, count) in [
            ("new", &links.registered_new),
            ("standing", &links.registered_standing),
        ] {
            registrations
                .get_or_create(&ConnectionLabels { connection })
                .inc_by(count.load(Ordering::Relaxed));
        }
        registry.register(
            "quotient_agent_registrations",
            "Registrations a leader acknowledged, by connection: new (a handshake first) or standing (none)",
            registrations,
        );
        for (name, help, count) in [
            (
                "quotient_agent_heartbeats_refused",
                "Heartbeats the leader refused as unavailable (it could not show a quorum's recent acknowledgement)",
                &links.heartbeats_refused,
            ),
            (
                "quotient_agent_heartbeats_late",
                "Heartbeats unanswered within their deadline while the leader's side of the connection still sent datagrams (busy, not gone)",
                &links.heartbeats_late,
            ),
        ] {
            let counter = Counter::<u64>::default();
            counter.inc_by(count.load(Ordering::Relaxed));
            registry.register(name, help, counter);
        }
        registry.register(
            "quotient_agent_jobs",
            "Attempts on this host by phase (stopping: the checkpoint signal was sent)",
            jobs,
        );
        quotient_common::metrics_http::register_certificate_expiry(&mut registry, &self.tls);
        registry
    }
}

impl MetricsSource for AgentDoor {
    fn render(&self) -> String {
        quotient_common::metrics_http::encode(&self.registry())
    }

    fn ready(&self) -> Result<(), String> {
        let lease = self.shared.lease();
        if !lease.acknowledged() {
            return Err("no leader has acknowledged this agent yet".into());
        }
        if lease.expired(Instant::now()) {
            return Err("the lease ran out: no leader answered in time".into());
        }
        Ok(())
    }
}
