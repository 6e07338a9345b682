//! One episode's cluster: every coordinator and every agent in a Docker container of its own,
//! on a Docker network the episode creates (`quotient-chaos-<pid>-<episode>`), from an image
//! built offline from the workspace's binaries (deploy/image/build-offline.sh).
//!
//! - The network gets a /24 subnet of its own and every container a fixed address in it, so a
//!   container keeps its address across `docker network disconnect`/`connect` and restarts,
//!   and partitions can name peers by address.
//! - Coordinators publish their QUIC port (UDP 7401) on 127.0.0.1; the clients of this
//!   program run on the host and reach them there. The coordinators know each other as
//!   `coord-N:7401`, which the host cannot resolve, so the client has a follower forward
//!   (`ViaLeader`), as with the compose cluster.
//! - Agents run under a supervisor loop (`while :; do quotient-agent run ...; done`, with
//!   `--init` reaping orphans), so the agent *process* can be killed or stopped alone while
//!   its jobs go on, and the container (the host) can be killed as a whole. They run the
//!   process runtime with simulated GPUs, as `quotient dev up` starts them, and mount the
//!   episode's shared folder at `/chaos` (where the job scripts record what they do).
//! - Certificates come from the host's `quotient certs init`/`certs issue`, as compose's
//!   certs.sh makes them, in a folder mounted read-only at `/certs`.
//!
//! [`DockerCluster`] removes its containers and its network when dropped, however the
//! episode ended.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde_json::Value;

/// The port every coordinator listens on inside its container.
pub const COORDINATOR_PORT: u16 = 7401;
/// The agents' self-fencing lease and the coordinators' agent lease, shortened from the
/// default (10 s) so that a node is counted lost within an episode.
pub const AGENT_LEASE_MS: u64 = 3_000;
/// What the leader adds to the lease and the grace period before a silent node is lost: above
/// the orphan watchdog's bound (`WATCHDOG_SLACK_MS` + a poll: 1.5 s), as agent/src/session.rs's
/// self-fencing timing contract requires.
pub const NODE_LEASE_MARGIN_MS: u64 = 3_000;
/// How often the leader has the replicas compare state digests.
pub const DIGEST_CHECK_INTERVAL_MS: u64 = 2_000;
/// Where the shared folder is mounted in every agent's container.
pub const SHARED_MOUNT: &str = "/chaos";

/// What a container runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Coordinator,
    Agent,
}

/// One container of the cluster.
#[derive(Debug, Clone)]
pub struct Member {
    pub role: Role,
    /// `coord-N` or `node-N`: its host name on the network and its certificate's name.
    pub name: String,
    /// The coordinator's Raft id (0 for agents).
    pub id: u64,
    pub container: String,
    pub ip: String,
    /// The coordinator's published port on 127.0.0.1 (0 for agents).
    pub port: u16,
    /// The agent's simulated GPUs (0 for coordinators).
    pub gpus: u32,
}

/// How large the episode's cluster is.
#[derive(Debug, Clone)]
pub struct ClusterShape {
    pub coordinators: u32,
    /// GPUs of each agent.
    pub agent_gpus: Vec<u32>,
}

/// The running cluster of one episode.
#[derive(Debug)]
pub struct DockerCluster {
    pub network: String,
    pub image: String,
    pub dir: PathBuf,
    pub shared: PathBuf,
    pub certs: PathBuf,
    pub config: PathBuf,
    pub quotient: PathBuf,
    pub coordinator_binary: PathBuf,
    pub coordinators: Vec<Member>,
    pub agents: Vec<Member>,
    /// Whether partitions can use iptables in the containers' network namespaces (nsenter
    /// and iptables on this host, as root); otherwise they disconnect the minority instead.
    pub iptables: bool,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `program ARGS` with a deadline; its output. A command past the deadline is killed.
pub fn run_with_deadline(command: &mut Command, deadline: Duration) -> anyhow::Result<Output> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {command:?}"))?;
    let started = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            return Ok(child.wait_with_output()?);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output()?;
            bail!(
                "{command:?} did not finish within {deadline:?}: {}",
                text(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `docker ARGS`; its stdout, or an error with its stderr.
pub fn docker(args: &[&str]) -> anyhow::Result<String> {
    let output = run_with_deadline(Command::new("docker").args(args), Duration::from_secs(60))?;
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        bail!(
            "docker {} failed: {}",
            args.join(" "),
            text(&output.stderr).trim()
        )
    }
}

/// Whether this host's Docker engine answers.
pub fn docker_reachable() -> bool {
    Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Builds `tag` with deploy/image/build-offline.sh from the binaries in `bin_dir` (a no-op
/// when the image already holds them).
pub fn build_image(workspace: &Path, bin_dir: &Path, tag: &str) -> anyhow::Result<()> {
    let script = workspace.join("deploy/image/build-offline.sh");
    let output = run_with_deadline(
        Command::new("bash")
            .arg(&script)
            .arg("--bin-dir")
            .arg(bin_dir)
            .args(["--tag", tag]),
        Duration::from_secs(600),
    )?;
    if !output.status.success() {
        bail!(
            "{} failed: {}{}",
            script.display(),
            text(&output.stdout),
            text(&output.stderr)
        );
    }
    eprint!("{}", text(&output.stdout));
    Ok(())
}

/// Free UDP ports on 127.0.0.1, held together while picked so that they differ.
fn free_udp_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let sockets = (0..count)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    sockets
        .iter()
        .map(|socket| Ok(socket.local_addr()?.port()))
        .collect()
}

impl DockerCluster {
    /// Creates the network, the certificates and every container, bootstraps the cluster
    /// and waits until every agent's node is ready.
    pub fn start(
        name: &str,
        image: &str,
        bin_dir: &Path,
        dir: &Path,
        shape: &ClusterShape,
        salt: u64,
    ) -> anyhow::Result<DockerCluster> {
        let shared = dir.join("shared");
        let certs = dir.join("certs");
        for folder in [&shared, &certs] {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
        }
        // Job scripts run as the agents' user; the folder is theirs to write.
        std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
        let mut cluster = DockerCluster {
            network: name.to_string(),
            image: image.to_string(),
            dir: dir.to_path_buf(),
            shared,
            certs,
            config: dir.join("client.toml"),
            quotient: bin_dir.join("quotient"),
            coordinator_binary: bin_dir.join("quotient-coordinator"),
            coordinators: Vec::new(),
            agents: Vec::new(),
            iptables: false,
        };
        let prefix = cluster.create_network(salt)?;
        cluster.make_certificates(shape)?;
        let ports = free_udp_ports(shape.coordinators as usize)?;
        for (index, port) in ports.iter().enumerate() {
            let id = index as u64 + 1;
            cluster.coordinators.push(Member {
                role: Role::Coordinator,
                name: format!("coord-{id}"),
                id,
                container: format!("{name}-coord-{id}"),
                ip: format!("{prefix}.{}", 10 + id),
                port: *port,
                gpus: 0,
            });
        }
        for (index, gpus) in shape.agent_gpus.iter().enumerate() {
            let n = index + 1;
            cluster.agents.push(Member {
                role: Role::Agent,
                name: format!("node-{n}"),
                id: 0,
                container: format!("{name}-node-{n}"),
                ip: format!("{prefix}.{}", 100 + n),
                port: 0,
                gpus: *gpus,
            });
        }
        cluster.write_client_config()?;
        for member in cluster.coordinators.clone() {
            cluster.run_coordinator(&member)?;
        }
        cluster.init()?;
        for member in cluster.agents.clone() {
            cluster.run_agent(&member)?;
        }
        cluster.iptables = cluster.probe_iptables();
        cluster.wait_nodes_ready(Duration::from_secs(90))?;
        Ok(cluster)
    }

    /// Creates the network with a /24 of its own; the first three octets of its addresses.
    fn create_network(&self, salt: u64) -> anyhow::Result<String> {
        let mut last = String::new();
        for attempt in 0..40u64 {
            let mixed = salt.wrapping_add(attempt.wrapping_mul(0x9e37_79b9));
            let prefix = format!("10.{}.{}", 200 + (mixed % 50), (mixed >> 8) % 256);
            let subnet = format!("{prefix}.0/24");
            match docker(&[
                "network",
                "create",
                "--subnet",
                &subnet,
                "--label",
                &format!("quotient-chaos={}", self.network),
                &self.network,
            ]) {
                Ok(_) => return Ok(prefix),
                Err(error) => last = error.to_string(),
            }
        }
        bail!("cannot create the Docker network {}: {last}", self.network)
    }

    fn make_certificates(&self, shape: &ClusterShape) -> anyhow::Result<()> {
        let dir = self.certs.display().to_string();
        self.cli_ok(&["certs", "init", "--dir", &dir])?;
        for id in 1..=shape.coordinators {
            let name = format!("coord-{id}");
            self.cli_ok(&[
                "certs",
                "issue",
                "--dir",
                &dir,
                "--role",
                "coordinator",
                "--name",
                &name,
                "--san",
                &name,
            ])?;
        }
        for n in 1..=shape.agent_gpus.len() {
            let name = format!("node-{n}");
            self.cli_ok(&[
                "certs", "issue", "--dir", &dir, "--role", "agent", "--name", &name,
            ])?;
        }
        self.cli_ok(&[
            "certs", "issue", "--dir", &dir, "--role", "admin", "--name", "admin",
        ])?;
        Ok(())
    }

    /// The published addresses of the coordinators, as the host's clients reach them.
    pub fn addresses(&self) -> Vec<String> {
        self.coordinators
            .iter()
            .map(|member| format!("127.0.0.1:{}", member.port))
            .collect()
    }

    /// The admin's certificate files.
    pub fn admin_tls(&self) -> quotient_common::tls::TlsFiles {
        quotient_common::tls::TlsFiles::in_dir(&self.certs, "admin")
    }

    fn write_client_config(&self) -> anyhow::Result<()> {
        let list: Vec<String> = self
            .addresses()
            .iter()
            .map(|address| format!("\"{address}\""))
            .collect();
        let tls = self.admin_tls();
        let config = format!(
            "coordinators = [{}]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            list.join(", "),
            tls.ca.display(),
            tls.cert.display(),
            tls.key.display()
        );
        std::fs::write(&self.config, config)?;
        Ok(())
    }

    fn peers(&self) -> String {
        self.coordinators
            .iter()
            .map(|member| format!("{}={}:{COORDINATOR_PORT}", member.id, member.name))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn common_run_args(&self, member: &Member) -> Vec<String> {
        vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            member.container.clone(),
            "--hostname".into(),
            member.name.clone(),
            "--network".into(),
            self.network.clone(),
            "--ip".into(),
            member.ip.clone(),
            "--network-alias".into(),
            member.name.clone(),
            "--user".into(),
            "0:0".into(),
            "--label".into(),
            format!("quotient-chaos={}", self.network),
            "-v".into(),
            format!("{}:/certs:ro", self.certs.display()),
            "-e".into(),
            "TOKIO_WORKER_THREADS=2".into(),
        ]
    }

    fn run_coordinator(&self, member: &Member) -> anyhow::Result<()> {
        let mut args = self.common_run_args(member);
        args.extend([
            "-p".into(),
            format!("127.0.0.1:{}:{COORDINATOR_PORT}/udp", member.port),
            self.image.clone(),
            "coordinator".into(),
            "--id".into(),
            member.id.to_string(),
            "--listen".into(),
            format!("0.0.0.0:{COORDINATOR_PORT}"),
            "--data-dir".into(),
            "/var/lib/quotient-coordinator".into(),
            "--peers".into(),
            self.peers(),
            "--ca".into(),
            "/certs/ca.pem".into(),
            "--cert".into(),
            format!("/certs/{}.pem", member.name),
            "--key".into(),
            format!("/certs/{}-key.pem", member.name),
            "--agent-lease-ms".into(),
            AGENT_LEASE_MS.to_string(),
            "--node-lease-margin-ms".into(),
            NODE_LEASE_MARGIN_MS.to_string(),
            "--digest-check-interval-ms".into(),
            DIGEST_CHECK_INTERVAL_MS.to_string(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args)?;
        Ok(())
    }

    fn run_agent(&self, member: &Member) -> anyhow::Result<()> {
        let coordinators = self
            .coordinators
            .iter()
            .map(|c| format!("{}:{COORDINATOR_PORT}", c.name))
            .collect::<Vec<_>>()
            .join(",");
        let agent = format!(
            "quotient-agent run --name {name} --coordinators {coordinators} --ca /certs/ca.pem \
             --cert /certs/{name}.pem --key /certs/{name}-key.pem \
             --state-dir /var/lib/quotient-agent --checkpoint-root {SHARED_MOUNT}/checkpoints \
             --runtime process --allow-root-jobs --simulated-gpus {gpus}xa10g \
             --lease-ms {AGENT_LEASE_MS}",
            name = member.name,
            gpus = member.gpus,
        );
        let supervisor = format!(
            "while :; do {agent}; echo \"quotient-agent exited with status $?\" >&2; sleep 0.5; done"
        );
        let mut args = self.common_run_args(member);
        args.extend([
            "--init".into(),
            "-v".into(),
            format!("{}:{SHARED_MOUNT}", self.shared.display()),
            "--entrypoint".into(),
            "/bin/sh".into(),
            self.image.clone(),
            "-c".into(),
            supervisor,
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args)?;
        Ok(())
    }

    /// `quotient cluster init` on coordinator 1, retried while the coordinators start.
    fn init(&self) -> anyhow::Result<()> {
        let first = format!("127.0.0.1:{}", self.coordinators[0].port);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let output = self.cli(
                &["cluster", "init", "--coordinator", &first],
                Duration::from_secs(150),
            )?;
            let stderr = text(&output.stderr);
            if output.status.success() || stderr.contains("already belongs to cluster") {
                break;
            }
            if Instant::now() > deadline {
                bail!("cluster init failed: {stderr}{}", text(&output.stdout));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        self.wait_for("a leader and every coordinator a voter", 60, || {
            let status = self.cli_json(&["cluster", "status", "-o", "json"])?;
            let voters = status["members"]
                .as_array()
                .map(|members| {
                    members
                        .iter()
                        .filter(|m| m["role"] == "leader" || m["role"] == "follower")
                        .count()
                })
                .unwrap_or(0);
            if status["leader"].is_u64() && voters == self.coordinators.len() {
                Ok(())
            } else {
                Err(anyhow!("{status}"))
            }
        })
    }

    /// Polls `check` every half second until it succeeds, or fails after `seconds`.
    pub fn wait_for(
        &self,
        what: &str,
        seconds: u64,
        mut check: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            let error = match check() {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if Instant::now() > deadline {
                bail!("gave up after {seconds} s waiting for {what}; last seen: {error:#}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until every agent's node is `ready` and reachable in `node list`.
    pub fn wait_nodes_ready(&self, within: Duration) -> anyhow::Result<()> {
        self.wait_for("every node ready", within.as_secs(), || {
            let nodes = self.cli_json(&["node", "list", "-o", "json"])?;
            let ready: Vec<&str> = nodes
                .as_array()
                .into_iter()
                .flatten()
                .filter(|node| node["state"] == "ready" && node["unreachable"] != true)
                .filter_map(|node| node["name"].as_str())
                .collect();
            if self
                .agents
                .iter()
                .all(|agent| ready.contains(&agent.name.as_str()))
            {
                Ok(())
            } else {
                Err(anyhow!("ready: {ready:?}"))
            }
        })
    }

    /// Runs the host's `quotient` with this cluster's client config, within `deadline`.
    pub fn cli(&self, args: &[&str], deadline: Duration) -> anyhow::Result<Output> {
        run_with_deadline(
            Command::new(&self.quotient)
                .args(args)
                .env("QUOTIENT_CONFIG", &self.config),
            deadline,
        )
    }

    /// A `quotient` command that must succeed; its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = self.cli(args, Duration::from_secs(60))?;
        if !output.status.success() {
            bail!(
                "quotient {} failed: {}{}",
                args.join(" "),
                text(&output.stderr),
                text(&output.stdout)
            );
        }
        Ok(text(&output.stdout))
    }

    /// A `quotient ... -o json` command that must succeed; its document.
    pub fn cli_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let output = self.cli(args, Duration::from_secs(30))?;
        let stdout = text(&output.stdout);
        if !output.status.success() && stdout.trim().is_empty() {
            bail!(
                "quotient {} failed: {}",
                args.join(" "),
                text(&output.stderr).trim()
            );
        }
        serde_json::from_str(&stdout)
            .with_context(|| format!("quotient {}: not JSON: {stdout}", args.join(" ")))
    }

    /// The coordinator that leads now, as `cluster status` says (within a few seconds).
    pub fn leader(&self) -> Option<Member> {
        let output = self
            .cli(&["cluster", "status", "-o", "json"], Duration::from_secs(5))
            .ok()?;
        let status: Value = serde_json::from_slice(&output.stdout).ok()?;
        let leader = status["leader"].as_u64()?;
        self.coordinators.iter().find(|c| c.id == leader).cloned()
    }

    /// Every container of the cluster.
    pub fn members(&self) -> Vec<Member> {
        self.coordinators
            .iter()
            .chain(self.agents.iter())
            .cloned()
            .collect()
    }

    // --- faults -----------------------------------------------------------------------

    /// SIGKILLs the whole container (the host crashes: for an agent, its jobs die with it).
    pub fn kill(&self, member: &Member) -> anyhow::Result<()> {
        docker(&["kill", "-s", "KILL", &member.container]).map(|_| ())
    }

    /// Starts a stopped container again, on its old data.
    pub fn start_again(&self, member: &Member) -> anyhow::Result<()> {
        docker(&["start", &member.container]).map(|_| ())
    }

    /// Freezes every process of the container (the cgroup freezer).
    pub fn pause(&self, member: &Member) -> anyhow::Result<()> {
        docker(&["pause", &member.container]).map(|_| ())
    }

    pub fn unpause(&self, member: &Member) -> anyhow::Result<()> {
        docker(&["unpause", &member.container]).map(|_| ())
    }

    /// Sends `signal` to the agent process alone (its jobs and their watchdogs go on).
    pub fn signal_agent(&self, member: &Member, signal: &str) -> anyhow::Result<()> {
        let script = format!("pids=$(pidof quotient-agent) || exit 3; kill -{signal} $pids");
        docker(&["exec", &member.container, "/bin/sh", "-c", &script]).map(|_| ())
    }

    pub fn disconnect(&self, member: &Member) -> anyhow::Result<()> {
        docker(&["network", "disconnect", &self.network, &member.container]).map(|_| ())
    }

    pub fn connect(&self, member: &Member) -> anyhow::Result<()> {
        docker(&[
            "network",
            "connect",
            "--ip",
            &member.ip,
            "--alias",
            &member.name,
            &self.network,
            &member.container,
        ])
        .map(|_| ())
    }

    fn pid_of(&self, member: &Member) -> anyhow::Result<String> {
        let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &member.container])?
            .trim()
            .to_string();
        if pid.is_empty() || pid == "0" {
            bail!("{} is not running", member.container);
        }
        Ok(pid)
    }

    /// `iptables ARGS` in `member`'s network namespace, with this host's iptables.
    fn iptables_in(&self, member: &Member, args: &[&str]) -> anyhow::Result<()> {
        let pid = self.pid_of(member)?;
        let output = run_with_deadline(
            Command::new("nsenter")
                .args(["-t", &pid, "-n", "iptables", "-w"])
                .args(args),
            Duration::from_secs(20),
        )?;
        if !output.status.success() {
            bail!(
                "iptables {} in {} failed: {}",
                args.join(" "),
                member.container,
                text(&output.stderr).trim()
            );
        }
        Ok(())
    }

    fn probe_iptables(&self) -> bool {
        let Some(member) = self.coordinators.first() else {
            return false;
        };
        match self.iptables_in(member, &["-L", "INPUT", "-n"]) {
            Ok(()) => true,
            Err(error) => {
                eprintln!(
                    "chaos: partitions fall back to network disconnect (iptables in a container's network namespace: {error:#})"
                );
                false
            }
        }
    }

    /// Drops every packet between `member` and the addresses `from` (both ways).
    pub fn block(&self, member: &Member, from: &[String]) -> anyhow::Result<()> {
        for ip in from {
            self.iptables_in(member, &["-A", "INPUT", "-s", ip, "-j", "DROP"])?;
            self.iptables_in(member, &["-A", "OUTPUT", "-d", ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Removes every rule `block` added to `member`.
    pub fn unblock(&self, member: &Member) -> anyhow::Result<()> {
        self.iptables_in(member, &["-F", "INPUT"])?;
        self.iptables_in(member, &["-F", "OUTPUT"])
    }

    /// Undoes every fault on every container: running, unpaused, connected, no partition
    /// rules, agent processes continued. Errors are collected, not fatal: each step is tried.
    pub fn heal(&self) -> Vec<String> {
        let mut errors = Vec::new();
        for member in self.members() {
            let state = docker(&[
                "inspect",
                "-f",
                "{{.State.Status}} {{.State.Paused}}",
                &member.container,
            ])
            .unwrap_or_default();
            let state = state.trim();
            if state.ends_with("true") {
                if let Err(error) = self.unpause(&member) {
                    errors.push(format!("{error:#}"));
                }
            } else if !state.starts_with("running") {
                if let Err(error) = self.start_again(&member) {
                    errors.push(format!("{error:#}"));
                }
            }
            let networks = docker(&[
                "inspect",
                "-f",
                "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}",
                &member.container,
            ])
            .unwrap_or_default();
            if !networks.split_whitespace().any(|name| name == self.network) {
                if let Err(error) = self.connect(&member) {
                    errors.push(format!("{error:#}"));
                }
            }
            if self.iptables {
                if let Err(error) = self.unblock(&member) {
                    errors.push(format!("{error:#}"));
                }
            }
            if member.role == Role::Agent {
                // Not running (restarting after a kill) is fine: nothing to continue.
                let _ = self.signal_agent(&member, "CONT");
            }
        }
        errors
    }

    /// Writes the end of every container's log into the episode's folder; their paths.
    pub fn save_logs(&self) -> Vec<PathBuf> {
        let logs = self.dir.join("logs");
        let _ = std::fs::create_dir_all(&logs);
        let mut saved = Vec::new();
        for member in self.members() {
            let Ok(output) = Command::new("docker")
                .args(["logs", "--tail", "3000", &member.container])
                .output()
            else {
                continue;
            };
            let path = logs.join(format!("{}.log", member.name));
            let mut all = output.stdout;
            all.extend_from_slice(&output.stderr);
            if std::fs::write(&path, all).is_ok() {
                saved.push(path);
            }
        }
        saved
    }

    /// Removes every container and the network (also done when dropped).
    pub fn teardown(&mut self) {
        let filter = format!("label=quotient-chaos={}", self.network);
        if let Ok(ids) = docker(&["ps", "-aq", "--filter", &filter]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f", "-v"];
                args.extend(ids);
                if let Err(error) = docker(&args) {
                    eprintln!("chaos: {error:#}");
                }
            }
        }
        if docker(&["network", "inspect", &self.network]).is_ok() {
            if let Err(error) = docker(&["network", "rm", &self.network]) {
                eprintln!("chaos: {error:#}");
            }
        }
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Removes whatever a cluster named `network` left (containers by label, the network), for
/// a start that failed before a [`DockerCluster`] existed.
pub fn remove_leftovers(network: &str) {
    let filter = format!("label=quotient-chaos={network}");
    if let Ok(ids) = docker(&["ps", "-aq", "--filter", &filter]) {
        for id in ids.split_whitespace() {
            let _ = docker(&["rm", "-f", "-v", id]);
        }
    }
    let _ = docker(&["network", "rm", network]);
}
