//! `quotient-agent`: parses flags, sets up logging and runs one command. Everything else lives
//! in the library.
//!
//! `quotient-agent inventory [--simulated-gpus SPEC] [-o json]` prints the host's GPUs. Without
//! a subcommand (or with `run`) it is the long-running agent: `quotient_agent::run::run` until
//! SIGTERM or SIGINT, which stop the agent and leave its jobs running.

use anyhow::{Context, Result};
use clap::Parser;
use quotient_agent::config::{
    node_name, AgentCommand, AgentFlags, ContainerWatchdogFlags, InventoryFlags, OutputFormat,
    RunFlags,
};
use quotient_agent::gpu::nvml::NvmlBackend;
use quotient_agent::gpu::simulated::SimulatedBackend;
use quotient_agent::gpu::{DeviceStatus, GpuBackend};
use quotient_agent::runtime::docker::{
    connect_docker, watch_container, watchdog_lock, watchdog_log, watchdog_stop_record, WatchEnd,
};
use quotient_agent::runtime::process::WATCHDOG_POLL_S;
use quotient_common::log_format::LogFormat;
use quotient_common::Signal;
use tracing_subscriber::EnvFilter;

fn main() {
    let flags = AgentFlags::parse();
    let run_flags = match &flags.command {
        Some(AgentCommand::Run(run_flags)) => run_flags,
        _ => &flags.run,
    };
    init_tracing(LogFormat::chosen(run_flags.log_format, run_flags.log_json));
    let result = match flags.command {
        Some(AgentCommand::Inventory(inventory)) => print_inventory(inventory),
        Some(AgentCommand::Run(run_flags)) => run(*run_flags),
        Some(AgentCommand::ContainerWatchdog(watchdog)) => container_watchdog(watchdog),
        None => run(flags.run),
    };
    if let Err(error) = result {
        eprintln!("quotient-agent: {error:#}");
        std::process::exit(1);
    }
}

/// Watches one container (see `quotient_agent::runtime::docker`): exits at once when another
/// watchdog holds the container's lock.
fn container_watchdog(flags: ContainerWatchdogFlags) -> Result<()> {
    use std::os::fd::AsRawFd;
    let signal = Signal::parse(&flags.signal).context("invalid --signal")?;
    if flags.container.is_empty()
        || !flags
            .container
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        anyhow::bail!(
            "--container {:?} is not a container id or name",
            flags.container
        );
    }
    std::fs::create_dir_all(&flags.dir)
        .with_context(|| format!("cannot create {}", flags.dir.display()))?;
    let lock_path = watchdog_lock(&flags.dir, &flags.container);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    // SAFETY: flock on a descriptor this process owns; it is released when the process ends.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        // Another watchdog watches this container.
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let stop_record = watchdog_stop_record(&flags.dir, &flags.container);
    let end = runtime.block_on(async {
        // A daemon that does not answer now may later: the watchdog keeps trying, since a
        // container left without one would outlive the agent's lease (found by probing: a
        // daemon hung as the watchdog started, the agent killed, and the job ran twice).
        let docker = loop {
            match connect_docker().await {
                Ok(docker) => break docker,
                Err(error) => {
                    tracing::warn!(container = %flags.container, error = %error, "cannot reach the Docker daemon; trying again");
                    tokio::time::sleep(std::time::Duration::from_secs(WATCHDOG_POLL_S)).await;
                }
            }
        };
        watch_container(
            &docker,
            &flags.container,
            &flags.lease_file,
            &stop_record,
            signal,
            flags.grace_period_ms,
        )
        .await
    });
    let _ = std::fs::remove_file(&lock_path);
    if end == WatchEnd::Gone {
        // Nothing happened worth keeping.
        let _ = std::fs::remove_file(watchdog_log(&flags.dir, &flags.container));
    }
    Ok(())
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log file or a pipe gets plain text.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        );
    if format == LogFormat::Json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn run(flags: RunFlags) -> Result<()> {
    let config = flags.into_config().context("invalid agent flags")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = shutdown_signal().context("cannot listen for SIGTERM and SIGINT")?;
        quotient_agent::run::run(config, shutdown)
            .await
            .context("the agent stopped")
    })
}

/// Completes on the first SIGTERM or SIGINT.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
        }
    })
}

fn print_inventory(flags: InventoryFlags) -> Result<()> {
    let name = node_name(flags.name).context("cannot name this node")?;
    let backend: Box<dyn GpuBackend> = match &flags.simulated_gpus {
        Some(spec) => Box::new(SimulatedBackend::new(
            &name,
            spec,
            flags.state_dir.as_deref(),
        )?),
        None => Box::new(NvmlBackend::new()?),
    };
    let gpus = backend
        .inventory()
        .context("cannot read the GPU inventory")?;
    match flags.output {
        OutputFormat::Json => {
            let document = serde_json::json!({
                "node": name,
                "simulated": backend.is_simulated(),
                "gpus": gpus,
            });
            println!("{}", serde_json::to_string_pretty(&document)?);
        }
        OutputFormat::Table => print_table(&name, backend.is_simulated(), &gpus),
    }
    Ok(())
}

fn print_table(name: &str, simulated: bool, gpus: &[DeviceStatus]) {
    let kind = if simulated { "simulated" } else { "NVML" };
    println!("node {name}: {} GPUs ({kind})", gpus.len());
    println!(
        "{:<5} {:<40} {:<12} {:>15} {:>5} {:>5} {:>8} {:>9} {:<5} {:<4} HEALTH",
        "INDEX", "UUID", "CLASS", "MEMORY MiB", "UTIL", "TEMP", "POWER W", "ECC c/u", "MIG", "XID"
    );
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".to_string());
    for gpu in gpus {
        const MIB: u64 = 1024 * 1024;
        let memory = match (gpu.memory_used_bytes, gpu.memory_total_bytes) {
            (Some(used), Some(total)) => format!("{}/{}", used / MIB, total / MIB),
            _ => "-".to_string(),
        };
        let ecc = match (gpu.ecc_corrected_errors, gpu.ecc_uncorrected_errors) {
            (None, None) => "-".to_string(),
            (corrected, uncorrected) => format!(
                "{}/{}",
                or_dash(corrected.map(|c| c.to_string())),
                or_dash(uncorrected.map(|u| u.to_string()))
            ),
        };
        let health = if gpu.healthy {
            "healthy".to_string()
        } else {
            format!("UNHEALTHY: {}", gpu.problems.join("; "))
        };
        println!(
            "{:<5} {:<40} {:<12} {:>15} {:>5} {:>5} {:>8} {:>9} {:<5} {:<4} {}",
            gpu.index,
            gpu.uuid,
            gpu.class.as_str(),
            memory,
            or_dash(gpu.utilization_percent.map(|u| format!("{u}%"))),
            or_dash(gpu.temperature_celsius.map(|t| format!("{t}C"))),
            or_dash(
                gpu.power_milliwatts
                    .map(|p| format!("{:.1}", f64::from(p) / 1000.0))
            ),
            ecc,
            or_dash(
                gpu.mig_enabled
                    .map(|m| if m { "on" } else { "off" }.to_string())
            ),
            or_dash(gpu.xid_events.as_ref().map(|x| x.len().to_string())),
            health
        );
    }
}
