//! `quotient dev up --dir DIR [--coordinators 3] [--nodes 3] [--gpus-per-node 1]
//! [--gpu-class a10g]`: a local cluster of real processes on loopback (docs/cli.md).
//!
//! It makes the certificates in DIR/certs, picks free UDP ports on 127.0.0.1, starts
//! `quotient-coordinator` processes (found next to this executable) in the background with
//! their own data dir and log, bootstraps the cluster on coordinator 1 (`quotient cluster
//! init`; a DIR whose cluster was initialised before is not initialised again), waits until a
//! leader is elected and every coordinator answers, writes DIR/client.toml (with the cluster's
//! id) and DIR/cluster.json, and prints `export QUOTIENT_CONFIG=...`
//! (with `-o json`: `{"export", "client_config", "cluster"}`, the last as in cluster.json).
//! Run again on the same DIR, it starts only the processes that are not running, on their old
//! data and ports (the layout is in [`crate::dev_cluster`]).
//!
//! Agents: with `--nodes N` (default 3, as the spec says) it issues agent certificates
//! node-1..node-N, starts one `quotient-agent` per node (next to this executable) with
//! `--gpus-per-node` simulated GPUs of `--gpu-class` on the process runtime, its state dir and
//! log under DIR/node-N, records them in cluster.json (`agents: [{name, pid, ...}]`) and waits
//! until every node is ready in `node list`. A DIR that already has agents keeps its nodes,
//! and cluster.json records the GPUs per node and class they were made with, so agents
//! restarted by a later `dev up` come back as they were (a folder of an older `dev up`,
//! which does not record them, takes them from the coordinators' node list).
//! `--nodes 0` starts the coordinators only.

use std::collections::BTreeMap;
use std::fs;
use std::net::UdpSocket;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use quotient_client::RetryPolicy;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::certs::{self, Role};
use quotient_common::{ClusterId, ErrorCode, GpuClass, GPUS_PER_NODE_MAX};

use crate::client::Session;
use crate::client_config::ClientConfig;
use crate::dev_cluster::{
    self, AgentEntry, ClusterFile, CoordinatorEntry, ADMIN_CERT_NAME, CERTS_DIR,
    CLIENT_CONFIG_FILE, POLL_INTERVAL_MS,
};
use crate::failure::RequestFailed;
use crate::output::{self, OutputFormat};
use crate::parse::{parse_gpu_class, UsageError};
use crate::GlobalArgs;

/// The coordinator binary's name, looked for next to `quotient`.
pub const COORDINATOR_BINARY: &str = "quotient-coordinator";
/// The folder in DIR that every local agent keeps jobs' checkpoints in.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// The agent binary's name, looked for next to `quotient`.
pub const AGENT_BINARY: &str = "quotient-agent";
/// Coordinators when `--coordinators` is not given on a new DIR.
pub const COORDINATORS_DEFAULT: u64 = 3;
/// Most coordinators a local cluster may have (the coordinator's own peer limit).
pub const COORDINATORS_MAX: u64 = 9;
/// Most nodes a local cluster may have.
pub const NODES_MAX: u32 = 64;
/// How long to wait for a leader and for every coordinator to answer (milliseconds).
pub const READY_DEADLINE_MS: u64 = 60_000;
/// Most starts of a coordinator whose ports `dev up` picked, each time on ports picked anew,
/// when another process took one of them between the pick and the start.
pub const PORT_TRIES: u32 = 3;
/// How long `dev up` waits for a coordinator on ports it picked to say it listens before it
/// starts the next (milliseconds); one that takes longer is checked later, as before.
pub const LISTENING_WAIT_MS: u64 = 3_000;
/// Deadline of one readiness probe (milliseconds); the probes repeat until the deadline above.
pub const PROBE_DEADLINE_MS: u64 = 2_000;
/// How long to wait for every agent to register and its node to be ready (milliseconds).
pub const AGENTS_READY_DEADLINE_MS: u64 = 60_000;
/// The agents' self-fencing lease in a local cluster (milliseconds): the coordinators'
/// default agent lease, so both sides agree.
pub const AGENT_LEASE_MS: u64 = 10_000;

/// Arguments of `quotient dev up`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Each node is a quotient-agent process with simulated GPUs on the process \
    runtime: jobs run as local processes. Use --nodes 0 to start the coordinators only.\n\n\
    Run again on a DIR that holds a cluster, it starts only what is not running, with the \
    settings DIR recorded: its coordinators, its nodes, and their GPUs per node and class. \
    --coordinators, --gpus-per-node or --gpu-class that differ from them are refused; \
    --nodes is ignored once DIR has nodes."
)]
pub struct DevUpArgs {
    /// The cluster's folder: certificates, data, logs, client.toml and cluster.json.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Coordinators to run, 1-9 (3 or 5 tolerate failures) [default: 3, or as DIR has them].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=COORDINATORS_MAX))]
    pub coordinators: Option<u64>,
    /// GPU hosts to simulate, each an agent process, 0-64 [default: 3; a DIR that has nodes
    /// keeps them].
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=NODES_MAX as i64))]
    pub nodes: Option<u32>,
    /// Simulated GPUs per node, 1-64 [default: 1, or as DIR's nodes have them].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=GPUS_PER_NODE_MAX as i64))]
    pub gpus_per_node: Option<u32>,
    /// The simulated GPUs' class [default: a10g, or as DIR's nodes have it].
    #[arg(long, value_name = "CLASS", value_parser = parse_gpu_class)]
    pub gpu_class: Option<GpuClass>,
    /// Spread the new nodes round-robin over K racks: node-1 gets the label rack=rack-1,
    /// node-2 rack=rack-2, ... node-K+1 rack=rack-1 again [default: no labels; a DIR that has
    /// nodes keeps theirs].
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=NODES_MAX as i64))]
    pub racks: Option<u32>,
    /// How long finished jobs stay in the live state, e.g. 1h or 30s, passed to every
    /// coordinator as --retain-finished and kept in cluster.json for the ones started later
    /// [default: the coordinators' own, 7d; or as DIR has it].
    #[arg(long, value_name = "DURATION", value_parser = parse_retain_finished)]
    pub retain_finished: Option<u64>,
    /// Not a flag: set by `quotient demo` when it removes the cluster at its end, so that no
    /// `export` line names a folder that will be gone.
    #[arg(skip)]
    pub no_export: bool,
}

/// `--retain-finished`: a duration the coordinators accept, refused as a usage error (exit 2)
/// before anything is written to DIR.
fn parse_retain_finished(text: &str) -> Result<u64, String> {
    let ms = crate::parse::parse_duration_ms(text)?;
    quotient_common::retention::check_retain_finished_ms(ms)?;
    Ok(ms)
}

/// Nodes when `--nodes` is not given on a DIR without nodes.
pub const NODES_DEFAULT: u32 = 3;
/// Simulated GPUs per node when `--gpus-per-node` is not given on a new DIR.
pub const GPUS_PER_NODE_DEFAULT: u32 = 1;
/// The simulated GPUs' class when `--gpu-class` is not given on a new DIR.
pub const GPU_CLASS_DEFAULT: &str = "a10g";

/// Where coordinator `id`'s files go.
fn coordinator_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("coord-{id}"))
}

fn coordinator_cert_name(id: u64) -> String {
    format!("coord-{id}")
}

/// Free UDP ports on 127.0.0.1: all sockets are held until every port is picked, so none is
/// picked twice; a race with another program remains and shows as a bind error in the log.
fn free_addresses(count: u64) -> anyhow::Result<Vec<String>> {
    let sockets = (0..count)
        .map(|_| UdpSocket::bind("127.0.0.1:0").context("cannot find a free UDP port"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    sockets
        .iter()
        .map(|socket| {
            socket
                .local_addr()
                .map(|address| address.to_string())
                .context("cannot read a bound UDP port")
        })
        .collect()
}

/// A process's metrics address: the one it had, else a free TCP port on 127.0.0.1 (kept in
/// cluster.json, so a restart serves on the same one).
fn metrics_address(recorded: &mut Option<String>) -> anyhow::Result<String> {
    if let Some(address) = recorded {
        return Ok(address.clone());
    }
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .context("cannot find a free TCP port for metrics")?
        .to_string();
    *recorded = Some(address.clone());
    Ok(address)
}

/// A coordinator's AWS endpoint address: the one its recorded URL names, else a free TCP
/// port on 127.0.0.1, recorded as `https://ADDRESS`.
fn aws_address(recorded: &mut Option<String>) -> anyhow::Result<String> {
    let mut address = recorded
        .as_deref()
        .and_then(|url| url.strip_prefix("https://"))
        .map(str::to_string);
    let address = metrics_address(&mut address)?;
    *recorded = Some(format!("https://{address}"));
    Ok(address)
}

/// The CA, one certificate per coordinator and the admin certificate; existing ones are kept.
fn make_certificates(certs_dir: &Path, ids: &[u64]) -> anyhow::Result<()> {
    if !certs::ca_files(certs_dir).cert.exists() {
        certs::init_ca(certs_dir)
            .with_context(|| format!("cannot create a CA in {}", certs_dir.display()))?;
    }
    let mut wanted: Vec<(Role, String)> = ids
        .iter()
        .map(|id| (Role::Coordinator, coordinator_cert_name(*id)))
        .collect();
    wanted.push((Role::Admin, ADMIN_CERT_NAME.to_string()));
    for (role, name) in wanted {
        if certs::issued_files(certs_dir, &name).cert.exists() {
            continue;
        }
        certs::issue(certs_dir, role, &name, &[])
            .with_context(|| format!("cannot issue the {role} certificate {name}"))?;
    }
    Ok(())
}

/// A new cluster's entries: ids 1..=count, free ports, folders under DIR.
fn new_cluster(dir: &Path, count: u64) -> anyhow::Result<ClusterFile> {
    let addresses = free_addresses(count)?;
    let coordinators = (1..=count)
        .zip(addresses)
        .map(|(id, address)| {
            let home = coordinator_dir(dir, id);
            CoordinatorEntry {
                id,
                pid: None,
                address,
                data_dir: home.join("data"),
                log: home.join("coordinator.log"),
                metrics: None,
                aws_endpoint: None,
            }
        })
        .collect();
    Ok(ClusterFile {
        cluster_id: None,
        coordinators,
        agents: Vec::new(),
        gpus_per_node: None,
        gpu_class: None,
        retain_finished_ms: None,
    })
}

/// Refuses `--gpus-per-node` or `--gpu-class` that differ from what DIR's nodes were made
/// with (its agents are restarted as they were, not changed); notes an ignored `--nodes`.
fn check_node_settings(dir: &Path, cluster: &ClusterFile, args: &DevUpArgs) -> anyhow::Result<()> {
    if let (Some(wanted), Some(recorded)) = (args.gpus_per_node, cluster.gpus_per_node) {
        if wanted != recorded {
            return Err(UsageError(format!(
                "{} already holds nodes of {recorded} GPUs each, not {wanted}; leave out \
                 --gpus-per-node, or use a new --dir",
                dir.display()
            ))
            .into());
        }
    }
    if let (Some(wanted), Some(recorded)) = (&args.gpu_class, &cluster.gpu_class) {
        if wanted.as_str() != recorded {
            return Err(UsageError(format!(
                "{} already holds nodes of class {recorded}, not {wanted}; leave out \
                 --gpu-class, or use a new --dir",
                dir.display(),
                wanted = wanted.as_str()
            ))
            .into());
        }
    }
    let count = cluster.agents.len() as u32;
    if let Some(wanted) = args.nodes.filter(|wanted| count > 0 && *wanted != count) {
        eprintln!(
            "note: {} already holds {count} nodes; --nodes {wanted} is ignored",
            dir.display()
        );
    }
    if let Some(racks) = args.racks.filter(|_| count > 0) {
        eprintln!(
            "note: {} already holds its nodes, with their labels; --racks {racks} is ignored",
            dir.display()
        );
    }
    Ok(())
}

/// The GPUs per node and class of DIR's nodes, for a folder whose cluster.json does not
/// record them (made by an older `dev up`): as the coordinators know its first node, else
/// the flags or their defaults.
fn node_settings_of(
    session: &mut Session,
    cluster: &ClusterFile,
    args: &DevUpArgs,
) -> anyhow::Result<(u32, GpuClass)> {
    let flags = || -> anyhow::Result<(u32, GpuClass)> {
        let class = match &args.gpu_class {
            Some(class) => class.clone(),
            None => GpuClass::parse(GPU_CLASS_DEFAULT).map_err(anyhow::Error::from)?,
        };
        Ok((args.gpus_per_node.unwrap_or(GPUS_PER_NODE_DEFAULT), class))
    };
    if let (Some(count), Some(class)) = (cluster.gpus_per_node, &cluster.gpu_class) {
        return Ok((count, GpuClass::parse(class).map_err(anyhow::Error::from)?));
    }
    if cluster.agents.is_empty() || args.gpus_per_node.is_some() {
        return flags();
    }
    let known = crate::node_list::fetch_all(session).ok().and_then(|nodes| {
        nodes
            .into_iter()
            .find(|node| node.name == cluster.agents[0].name && !node.gpus.is_empty())
    });
    match known {
        Some(node) => {
            let class = match &args.gpu_class {
                Some(class) => class.clone(),
                None => GpuClass::parse(&node.gpus[0].class).map_err(anyhow::Error::from)?,
            };
            Ok((node.gpus.len() as u32, class))
        }
        None => flags(),
    }
}

/// Starts `command` in the background, its output appended to `log`, in its own process
/// group (a Ctrl-C in this shell must not stop the cluster). The binaries themselves write
/// no colour codes where their stderr is not a terminal, so the log is plain text.
fn spawn_logged(mut command: Command, log: &Path) -> anyhow::Result<Child> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open the log {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("cannot open the log {}", log.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {:?}", command.get_program()))
}

/// Starts one coordinator in the background, its output appended to its log.
fn start_coordinator(
    binary: &Path,
    certs_dir: &Path,
    entry: &mut CoordinatorEntry,
    peers: &str,
    retain_finished_ms: Option<u64>,
) -> anyhow::Result<Child> {
    fs::create_dir_all(&entry.data_dir)
        .with_context(|| format!("cannot create {}", entry.data_dir.display()))?;
    let tls = quotient_common::tls::TlsFiles::in_dir(certs_dir, &coordinator_cert_name(entry.id));
    let mut command = Command::new(binary);
    command
        .arg("--id")
        .arg(entry.id.to_string())
        .arg("--listen")
        .arg(&entry.address)
        .arg("--data-dir")
        .arg(&entry.data_dir)
        .arg("--peers")
        .arg(peers)
        .args(tls.flags())
        .arg("--metrics-listen")
        .arg(metrics_address(&mut entry.metrics)?)
        .arg("--aws-listen")
        .arg(aws_address(&mut entry.aws_endpoint)?);
    if let Some(ms) = retain_finished_ms {
        command.arg("--retain-finished").arg(format!("{ms}ms"));
    }
    spawn_logged(command, &entry.log)
}

/// Whether `child`, a coordinator just started, exited because a port it was given is taken,
/// as its log from byte `logged` on says; waits for it to say it listens, at most
/// [`LISTENING_WAIT_MS`].
fn exited_for_a_taken_port(child: &mut Child, log: &Path, logged: u64) -> bool {
    let since_start = || {
        fs::read(log)
            .ok()
            .and_then(|bytes| bytes.get(logged as usize..).map(<[u8]>::to_vec))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_millis(LISTENING_WAIT_MS);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return since_start().contains("Address already in use");
        }
        if since_start().contains("coordinator listening") {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Fails when a coordinator just started has exited, with the end of its log.
fn check_started(started: &mut BTreeMap<u64, (Child, PathBuf)>) -> anyhow::Result<()> {
    for (id, (child, log)) in started.iter_mut() {
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "coordinator {id} exited at start ({status}); the end of its log {}:\n{}",
                log.display(),
                dev_cluster::log_tail(log)
            );
        }
    }
    Ok(())
}

/// Bootstraps the cluster on the coordinator at `first` once it answers (`quotient cluster
/// init`), or reads the cluster it already belongs to (a DIR whose cluster.json lost the id);
/// returns the cluster's id.
fn initialise(
    session: &mut Session,
    first: &str,
    started: &mut BTreeMap<u64, (Child, PathBuf)>,
) -> anyhow::Result<ClusterId> {
    let deadline = Instant::now() + Duration::from_millis(READY_DEADLINE_MS);
    loop {
        check_started(started)?;
        let attempt = session
            .call_one(first, ApiRequest::Health)
            .and_then(|answer| match answer {
                ApiResponse::Health(view) => match view.cluster_id {
                    Some(joined) => Ok(joined),
                    None => {
                        let view = crate::cluster_init::init(session, first)?;
                        for member in &view.pending {
                            eprintln!(
                                "coordinator {} did not join in time: {}",
                                member.id, member.reason
                            );
                        }
                        Ok(view.cluster_id)
                    }
                },
                other => Err(crate::client::unexpected(&ApiRequest::Health, &other)),
            })
            .and_then(|text| text.parse::<ClusterId>().map_err(anyhow::Error::from));
        let problem = match attempt {
            Ok(cluster_id) => {
                eprintln!("cluster {cluster_id} initialised");
                return Ok(cluster_id);
            }
            Err(problem) => problem,
        };
        if Instant::now() >= deadline {
            return Err(RequestFailed::error(
                ErrorCode::Unavailable,
                format!(
                    "could not initialise the cluster on {first} within {} s (last: \
                     {problem:#}); see the logs in each coord-N folder",
                    READY_DEADLINE_MS / 1_000
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

/// Waits until a leader is elected and every coordinator answers its health request, while
/// checking that the processes just started have not died.
fn wait_until_ready(
    session: &mut Session,
    started: &mut BTreeMap<u64, (Child, PathBuf)>,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_millis(READY_DEADLINE_MS);
    loop {
        check_started(started)?;
        let problem = match probe(session) {
            Ok(leader) => return Ok(leader),
            Err(problem) => problem,
        };
        if Instant::now() >= deadline {
            return Err(RequestFailed::error(
                ErrorCode::Unavailable,
                format!(
                    "the coordinators did not elect a leader and answer within {} s (last: \
                     {problem:#}); see the logs in each coord-N folder",
                    READY_DEADLINE_MS / 1_000
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

/// One readiness check: the leader's id, once there is one and every coordinator answers.
fn probe(session: &mut Session) -> anyhow::Result<u64> {
    let view = crate::cluster_status::fetch(session)?;
    let leader = view.leader.context("no leader yet")?;
    let addresses = session.addresses().to_vec();
    for address in addresses {
        session.call_one(&address, ApiRequest::Health)?;
    }
    Ok(leader)
}

/// Where node `index`'s files go.
fn agent_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// New agent entries node-1..node-`count`.
fn new_agents(dir: &Path, count: u32, racks: Option<u32>) -> Vec<AgentEntry> {
    (1..=count)
        .map(|index| {
            let name = format!("node-{index}");
            let home = agent_dir(dir, &name);
            let labels = racks
                .map(|racks| {
                    let rack = (index - 1) % racks + 1;
                    [("rack".to_string(), format!("rack-{rack}"))].into()
                })
                .unwrap_or_default();
            AgentEntry {
                name,
                pid: None,
                state_dir: home.join("state"),
                log: home.join("agent.log"),
                labels,
                metrics: None,
            }
        })
        .collect()
}

/// One agent certificate per node; existing ones are kept.
fn make_agent_certificates(certs_dir: &Path, agents: &[AgentEntry]) -> anyhow::Result<()> {
    for agent in agents {
        if certs::issued_files(certs_dir, &agent.name).cert.exists() {
            continue;
        }
        certs::issue(certs_dir, Role::Agent, &agent.name, &[])
            .with_context(|| format!("cannot issue the agent certificate {}", agent.name))?;
    }
    Ok(())
}

/// Starts one agent in the background, its output appended to its log.
fn start_agent(
    binary: &Path,
    dir: &Path,
    entry: &mut AgentEntry,
    coordinators: &str,
    gpus: &str,
) -> anyhow::Result<Child> {
    fs::create_dir_all(&entry.state_dir)
        .with_context(|| format!("cannot create {}", entry.state_dir.display()))?;
    let tls = quotient_common::tls::TlsFiles::in_dir(&dir.join(CERTS_DIR), &entry.name);
    let mut command = Command::new(binary);
    command
        .arg("run")
        .arg("--name")
        .arg(&entry.name)
        .arg("--coordinators")
        .arg(coordinators)
        .args(tls.flags())
        .arg("--state-dir")
        .arg(&entry.state_dir)
        // Every node of a one-host cluster shares the checkpoints, as shared storage would:
        // a job preempted on one node resumes from its checkpoint on another.
        .arg("--checkpoint-root")
        .arg(dir.join(CHECKPOINTS_DIR))
        // The agent runs processes, and containers too where Docker is reachable.
        // A dev cluster runs jobs as whoever runs it, root included (a no-op for anyone else).
        .arg("--allow-root-jobs")
        .arg("--simulated-gpus")
        .arg(gpus)
        .arg("--lease-ms")
        .arg(AGENT_LEASE_MS.to_string())
        .arg("--metrics-listen")
        .arg(metrics_address(&mut entry.metrics)?);
    for (key, value) in &entry.labels {
        command.arg("--label").arg(format!("{key}={value}"));
    }
    spawn_logged(command, &entry.log)
}

/// Waits until every agent's node is ready in `node list`, while checking that the agents
/// just started have not died.
fn wait_until_nodes_ready(
    session: &mut Session,
    agents: &[AgentEntry],
    started: &mut BTreeMap<String, (Child, PathBuf)>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(AGENTS_READY_DEADLINE_MS);
    loop {
        for (name, (child, log)) in started.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                bail!(
                    "agent {name} exited at start ({status}); the end of its log {}:\n{}",
                    log.display(),
                    dev_cluster::log_tail(log)
                );
            }
        }
        let waiting: Vec<String> = match crate::node_list::fetch_all(session) {
            Ok(nodes) => agents
                .iter()
                .filter(|agent| {
                    // Up: heard from, whether it takes work or an admin cordoned or drains it
                    // (that state outlives `dev down`; `node uncordon` ends it).
                    !nodes.iter().any(|node| {
                        node.name == agent.name
                            && !node.unreachable
                            && matches!(node.state.as_str(), "ready" | "cordoned" | "draining")
                    })
                })
                .map(|agent| agent.name.clone())
                .collect(),
            Err(_) => agents.iter().map(|agent| agent.name.clone()).collect(),
        };
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "nodes {} were not ready within {} s; see DIR/node-N/agent.log",
                waiting.join(", "),
                AGENTS_READY_DEADLINE_MS / 1_000
            );
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

pub fn run(global: &GlobalArgs, args: &DevUpArgs) -> anyhow::Result<()> {
    fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", args.dir.display()))?;
    let binary = dev_cluster::sibling_binary(COORDINATOR_BINARY)?;
    if !binary.is_file() {
        bail!(
            "{COORDINATOR_BINARY} is not next to quotient (looked for {}); build it with \
             `cargo build --release` (or `cargo build` for target/debug), which builds all the \
             binaries",
            binary.display()
        );
    }

    let mut cluster = match dev_cluster::ClusterFile::read(&dir)? {
        Some(existing) => {
            let count = existing.coordinators.len() as u64;
            if let Some(wanted) = args.coordinators.filter(|wanted| *wanted != count) {
                return Err(UsageError(format!(
                    "{} already holds a cluster of {count} coordinators, not {wanted}; leave \
                     out --coordinators, or use a new --dir",
                    dir.display()
                ))
                .into());
            }
            check_node_settings(&dir, &existing, args)?;
            existing
        }
        None => new_cluster(&dir, args.coordinators.unwrap_or(COORDINATORS_DEFAULT))?,
    };

    if args.retain_finished.is_some() {
        cluster.retain_finished_ms = args.retain_finished;
    }
    let certs_dir = dir.join(CERTS_DIR);
    let ids: Vec<u64> = cluster.coordinators.iter().map(|entry| entry.id).collect();
    make_certificates(&certs_dir, &ids)?;
    let admin = quotient_common::tls::TlsFiles::in_dir(&certs_dir, ADMIN_CERT_NAME);
    let mut client_config = ClientConfig {
        coordinators: cluster
            .coordinators
            .iter()
            .map(|entry| entry.address.clone())
            .collect(),
        ca: admin.ca,
        cert: admin.cert,
        key: admin.key,
        cluster_id: cluster.cluster_id,
    };
    let client_config_path = dir.join(CLIENT_CONFIG_FILE);
    fs::write(&client_config_path, client_config.to_toml()?)
        .with_context(|| format!("cannot write {}", client_config_path.display()))?;

    let peers = cluster
        .coordinators
        .iter()
        .map(|entry| format!("{}={}", entry.id, entry.address))
        .collect::<Vec<_>>()
        .join(",");
    let mut started: BTreeMap<u64, (Child, PathBuf)> = BTreeMap::new();
    for entry in &mut cluster.coordinators {
        if entry
            .pid
            .is_some_and(|pid| dev_cluster::is_running(pid, &entry.data_dir))
        {
            continue;
        }
        // Ports picked here (bound, then released for the coordinator) can be taken by
        // another process in between: then the coordinator exits saying so, and is started
        // again on ports picked anew. Recorded ports are the cluster's, and stay.
        let picked_here = entry.metrics.is_none() && entry.aws_endpoint.is_none();
        let mut tries = 0;
        let child = loop {
            tries += 1;
            let logged = fs::metadata(&entry.log).map_or(0, |meta| meta.len());
            let mut child = start_coordinator(
                &binary,
                &certs_dir,
                entry,
                &peers,
                cluster.retain_finished_ms,
            )?;
            if !picked_here
                || tries >= PORT_TRIES
                || !exited_for_a_taken_port(&mut child, &entry.log, logged)
            {
                break child;
            }
            eprintln!(
                "coordinator {} found a port picked for it taken meanwhile; starting it again on others",
                entry.id
            );
            entry.metrics = None;
            entry.aws_endpoint = None;
        };
        entry.pid = Some(child.id());
        started.insert(entry.id, (child, entry.log.clone()));
    }
    // Written before waiting, so `dev down` can stop what was started even if the wait fails.
    cluster.write(&dir)?;
    eprintln!(
        "started {} of {} coordinators in {}; waiting for a leader",
        started.len(),
        cluster.coordinators.len(),
        dir.display()
    );

    let policy = RetryPolicy {
        call_deadline: Duration::from_millis(PROBE_DEADLINE_MS),
        ..RetryPolicy::default()
    };
    let mut session = Session::from_config(&client_config)?.with_policy(policy);
    if cluster.cluster_id.is_none() {
        let first = client_config.coordinators[0].clone();
        let cluster_id = initialise(&mut session, &first, &mut started)?;
        cluster.cluster_id = Some(cluster_id);
        cluster.write(&dir)?;
        client_config.cluster_id = Some(cluster_id);
        fs::write(&client_config_path, client_config.to_toml()?)
            .with_context(|| format!("cannot write {}", client_config_path.display()))?;
        session = Session::from_config(&client_config)?.with_policy(policy);
    }
    let leader = wait_until_ready(&mut session, &mut started)?;
    eprintln!("coordinator {leader} is the leader");

    let nodes = args.nodes.unwrap_or(NODES_DEFAULT);
    if cluster.agents.is_empty() && nodes > 0 {
        cluster.agents = new_agents(&dir, nodes, args.racks);
    }
    let (gpus_per_node, gpu_class) = node_settings_of(&mut session, &cluster, args)?;
    if !cluster.agents.is_empty() {
        cluster.gpus_per_node = Some(gpus_per_node);
        cluster.gpu_class = Some(gpu_class.as_str().to_string());
    }
    if !cluster.agents.is_empty() {
        let agent_binary = dev_cluster::sibling_binary(AGENT_BINARY)?;
        if !agent_binary.is_file() {
            bail!(
                "{AGENT_BINARY} is not next to quotient (looked for {}); build it with \
                 `cargo build --release` (or `cargo build`), or use --nodes 0; the coordinators \
                 run: stop them with `quotient dev down --dir {}`",
                agent_binary.display(),
                args.dir.display()
            );
        }
        make_agent_certificates(&certs_dir, &cluster.agents)?;
        let coordinators = client_config.coordinators.join(",");
        let gpus = format!("{gpus_per_node}x{}", gpu_class.as_str());
        let mut agents_started: BTreeMap<String, (Child, PathBuf)> = BTreeMap::new();
        for entry in &mut cluster.agents {
            if entry
                .pid
                .is_some_and(|pid| dev_cluster::is_running(pid, &entry.state_dir))
            {
                continue;
            }
            let child = start_agent(&agent_binary, &dir, entry, &coordinators, &gpus)?;
            entry.pid = Some(child.id());
            agents_started.insert(entry.name.clone(), (child, entry.log.clone()));
        }
        cluster.write(&dir)?;
        eprintln!(
            "started {} of {} agents; waiting for their nodes to be ready",
            agents_started.len(),
            cluster.agents.len()
        );
        wait_until_nodes_ready(&mut session, &cluster.agents, &mut agents_started)?;
        eprintln!("{} nodes are ready", cluster.agents.len());
    }

    let export = format!("export QUOTIENT_CONFIG={}", client_config_path.display());
    if args.no_export {
        return Ok(());
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&format!("{export}\n"))?,
        OutputFormat::Json => output::print_json(&serde_json::json!({
            "export": export,
            "client_config": client_config_path,
            "cluster": cluster,
        }))?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that appends `text` to `log`, then exits or waits.
    fn writer(log: &Path, text: &str, then: &str) -> Child {
        Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\n' \"$1\" >> \"$2\"; {then}"))
            .arg("sh")
            .arg(text)
            .arg(log)
            .spawn()
            .expect("sh starts")
    }

    #[test]
    fn a_coordinator_that_exits_for_a_taken_port_is_told_apart_from_one_that_listens() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("coordinator.log");
        let taken = "error: coordinator 1 failed: cannot serve the AWS endpoint on \
                     127.0.0.1:41445: Address already in use (os error 98)";

        let mut child = writer(&log, taken, "exit 1");
        assert!(exited_for_a_taken_port(&mut child, &log, 0));

        // The next start's part of the log is read, not the failure before it.
        let logged = fs::metadata(&log).expect("the log").len();
        let mut child = writer(&log, "INFO coordinator listening id=1", "sleep 10");
        assert!(!exited_for_a_taken_port(&mut child, &log, logged));
        child.kill().expect("stops");
        child.wait().expect("reaped");

        let logged = fs::metadata(&log).expect("the log").len();
        let mut child = writer(&log, "error: the data directory is locked", "exit 1");
        assert!(!exited_for_a_taken_port(&mut child, &log, logged));
    }
}
