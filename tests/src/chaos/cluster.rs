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
//! - Each coordinator's data directory is on a disk of its own: a fixed-size ext4 file system
//!   in a file of the episode's folder (`disks/coord-N.img`), loop-mounted on the host at
//!   `disks/coord-N` and bind-mounted into the container, so that the `disk-full` fault can
//!   fill it from the host and free it again, and it keeps its data across container restarts
//!   (a tmpfs mount or tmpfs volume would not: its contents go when the container stops).
//!   Without loop devices (not root, or none here), the data directories stay in the
//!   containers' own file systems and `disk-full` faults are skipped.
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
/// Where a coordinator's data directory is inside its container.
pub const COORDINATOR_DATA_DIR: &str = "/var/lib/quotient-coordinator";
/// The size of each coordinator's data disk: far more than an episode writes (a few MiB of
/// log), so that only the `disk-full` fault ever fills it.
pub const DATA_DISK_BYTES: u64 = 256 * 1024 * 1024;
/// The file the `disk-full` fault fills a data disk with, at the disk's root (beside the data
/// directory, not in it).
pub const FILL_FILE: &str = "chaos-fill";

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
    /// Whether every coordinator's data directory is on a data disk of its own (a loop-mounted
    /// file system under `dir/disks`); otherwise `disk-full` faults cannot be carried out.
    pub data_disks: bool,
    /// Why there are no data disks, when there are none.
    pub data_disks_missing: Option<String>,
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

/// `program ARGS` on the host, which must succeed within a minute.
fn host(program: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> anyhow::Result<()> {
    let mut command = Command::new(program);
    for arg in args {
        command.arg(arg);
    }
    let output = run_with_deadline(&mut command, Duration::from_secs(60))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            text(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The bytes an unprivileged writer may still allocate on the file system of `path`.
fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `name` is a NUL-terminated path and `stats` a zeroed statvfs for the call to fill.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both outlive the call.
    if unsafe { libc::statvfs(name.as_ptr(), &mut stats) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", path.display()));
    }
    // Both are narrower than u64 on some targets.
    #[allow(clippy::useless_conversion)]
    let bytes = u64::from(stats.f_bavail) * u64::from(stats.f_frsize);
    Ok(bytes)
}

/// The mount points under `dir`, deepest first, as this process's mount table lists them.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    // Spaces and the like are written as octal escapes (`\040`).
    fn unescape(field: &str) -> PathBuf {
        use std::os::unix::ffi::OsStringExt;
        let bytes = field.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'\\' && i + 3 < bytes.len() {
                let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
                if let Ok(value) = u8::from_str_radix(digits, 8) {
                    out.push(value);
                    i += 4;
                    continue;
                }
            }
            out.push(bytes[i]);
            i += 1;
        }
        PathBuf::from(std::ffi::OsString::from_vec(out))
    }
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let table = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut found: Vec<PathBuf> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(1))
        .map(unescape)
        .filter(|point| point.starts_with(&dir) && *point != dir)
        .collect();
    found.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    found.dedup();
    found
}

/// Unmounts every file system mounted under `dir` (the data disks of a cluster, or those a
/// run killed from outside left); what could not be unmounted.
pub fn unmount_under(dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    for point in mounts_under(dir) {
        if let Err(error) = host("umount", &[&point]) {
            // Busy (a container not yet gone): detach it now, free it when unused.
            if let Err(lazy) = host("umount", &[&"-l", &point]) {
                errors.push(format!("{error:#}; {lazy:#}"));
            }
        }
    }
    errors
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
            data_disks: false,
            data_disks_missing: None,
        };
        let prefix = cluster.create_network(salt)?;
        cluster.make_certificates(shape)?;
        let ports = crate::free_ports(shape.coordinators as usize);
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
        match cluster.make_data_disks() {
            Ok(()) => cluster.data_disks = true,
            Err(error) => {
                let why = format!("{error:#}");
                say!("disk-full faults are skipped: no data disk of a fixed size for the coordinators ({why})"
                );
                cluster.remove_data_disks();
                cluster.data_disks_missing = Some(why);
            }
        }
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
        if self.data_disks {
            args.extend([
                "-v".into(),
                format!(
                    "{}:{COORDINATOR_DATA_DIR}",
                    self.disk_mount(member).join("data").display()
                ),
            ]);
        }
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
            COORDINATOR_DATA_DIR.into(),
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
                say!("partitions fall back to network disconnect (iptables in a container's network namespace: {error:#})"
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

    /// Drops the packets of one direction only between `member` and the addresses `others`:
    /// with `inbound`, what comes from them (`member` sends but does not hear), else what goes
    /// to them (`member` hears but cannot answer). Rules added before a failure are removed.
    pub fn block_one_way(
        &self,
        member: &Member,
        others: &[String],
        inbound: bool,
    ) -> anyhow::Result<()> {
        let result = others.iter().try_for_each(|ip| {
            if inbound {
                self.iptables_in(member, &["-A", "INPUT", "-s", ip, "-j", "DROP"])
            } else {
                self.iptables_in(member, &["-A", "OUTPUT", "-d", ip, "-j", "DROP"])
            }
        });
        if result.is_err() {
            let _ = self.unblock(member);
        }
        result
    }

    /// Removes every rule `block` added to `member`.
    pub fn unblock(&self, member: &Member) -> anyhow::Result<()> {
        self.iptables_in(member, &["-F", "INPUT"])?;
        self.iptables_in(member, &["-F", "OUTPUT"])
    }

    /// The folder of the coordinators' data disks (their images and mount points).
    fn disks_dir(&self) -> PathBuf {
        self.dir.join("disks")
    }

    /// Where `member`'s data disk is mounted on the host; its data directory is `data` in it.
    pub fn disk_mount(&self, member: &Member) -> PathBuf {
        self.disks_dir().join(&member.name)
    }

    /// Makes every coordinator a data disk: a sparse file of [`DATA_DISK_BYTES`], an ext4 file
    /// system in it (no blocks reserved for root), loop-mounted on the host.
    fn make_data_disks(&self) -> anyhow::Result<()> {
        for member in &self.coordinators {
            let mount = self.disk_mount(member);
            let image = self.disks_dir().join(format!("{}.img", member.name));
            std::fs::create_dir_all(&mount)
                .with_context(|| format!("cannot create {}", mount.display()))?;
            std::fs::File::create(&image)
                .and_then(|file| file.set_len(DATA_DISK_BYTES))
                .with_context(|| format!("cannot create {}", image.display()))?;
            host("mkfs.ext4", &[&"-q", &"-F", &"-m", &"0", &image])?;
            host("mount", &[&"-o", &"loop", &image, &mount])?;
            let data = mount.join("data");
            std::fs::create_dir_all(&data)
                .with_context(|| format!("cannot create {}", data.display()))?;
        }
        Ok(())
    }

    /// Unmounts the data disks and removes their images (when unmounted).
    fn remove_data_disks(&self) {
        let disks = self.disks_dir();
        if !disks.exists() {
            return;
        }
        for error in unmount_under(&disks) {
            say!("{error}");
        }
        if mounts_under(&disks).is_empty() {
            if let Err(error) = std::fs::remove_dir_all(&disks) {
                say!("cannot remove {}: {error}", disks.display());
            }
        }
    }

    /// Fills `member`'s data disk (a coordinator's) from the host, with a file beside its data
    /// directory, until not one more block can be allocated there; the bytes it took.
    pub fn fill_disk(&self, member: &Member) -> anyhow::Result<u64> {
        use std::os::unix::fs::FileExt;
        use std::os::unix::io::AsRawFd;
        if !self.data_disks {
            bail!(
                "no data disk of a fixed size for the coordinators ({})",
                self.data_disks_missing.as_deref().unwrap_or("not made")
            );
        }
        let mount = self.disk_mount(member);
        let path = mount.join(FILL_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let free = free_bytes(&mount)?;
        let start = file.metadata()?.len();
        // Allocates what it can: on ext4 it keeps what it got when it runs out (ENOSPC).
        // SAFETY: a valid descriptor of a file open for writing; the range is in bounds.
        unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                0,
                start as libc::off_t,
                free.max(1) as libc::off_t,
            );
        }
        // The blocks fallocate could not take (its extents' own): written until none is left.
        let mut end = file.metadata()?.len();
        let zeros = [0u8; 1024];
        for _ in 0..65_536 {
            match file.write_at(&zeros, end) {
                Ok(0) | Err(_) => break,
                Ok(n) => end += n as u64,
            }
        }
        let _ = file.sync_all();
        let left = free_bytes(&mount)?;
        if left > 0 {
            bail!(
                "{} still has {left} bytes free after filling",
                mount.display()
            );
        }
        Ok(file.metadata()?.len())
    }

    /// Gives the blocks of the zeros at the end of every Raft log segment in `member`'s data
    /// directory back to its disk (holes punched in them; what the files read is unchanged):
    /// the segments are filled with zeros ahead of the log's writes (coordinator/src/store/
    /// wal.rs), so on a full disk the next write that needs a block comes only after up to a
    /// MiB of log, which an episode rarely writes. Without those blocks the next log write
    /// needs one, as on a file system that does not keep preallocated space (copy-on-write
    /// ones). Only whole 4 KiB blocks past the last byte that is not zero are punched; the
    /// container must be paused, so that no write is under way. The bytes given back.
    pub fn release_log_tail(&self, member: &Member) -> anyhow::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        let wal = self.disk_mount(member).join("data").join("raft-wal");
        let mut released = 0;
        let Ok(entries) = std::fs::read_dir(&wal) else {
            return Ok(0);
        };
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_none_or(|ext| ext != "wal") {
                continue;
            }
            let bytes =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            // The file system's block: a hole is made of whole ones.
            let block = file.metadata()?.blksize().max(512);
            let used = bytes.iter().rposition(|b| *b != 0).map_or(0, |at| at + 1) as u64;
            let from = used.div_ceil(block) * block;
            let size = bytes.len() as u64;
            if from >= size {
                continue;
            }
            // SAFETY: a valid descriptor of a file open for writing; the range is in the file.
            let punched = unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    from as libc::off_t,
                    (size - from) as libc::off_t,
                )
            };
            if punched != 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("cannot punch a hole in {}", path.display()));
            }
            released += size - from;
        }
        Ok(released)
    }

    /// Removes what [`fill_disk`](Self::fill_disk) wrote (nothing when it wrote nothing).
    pub fn free_disk(&self, member: &Member) -> anyhow::Result<()> {
        if !self.data_disks {
            return Ok(());
        }
        let path = self.disk_mount(member).join(FILL_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error).with_context(|| format!("cannot remove {}", path.display())),
        }
    }

    /// Whether `member`'s container runs (`None`), or its exit status.
    pub fn exit_status(&self, member: &Member) -> anyhow::Result<Option<i64>> {
        let state = docker(&[
            "inspect",
            "-f",
            "{{.State.Running}} {{.State.ExitCode}}",
            &member.container,
        ])?;
        let mut fields = state.split_whitespace();
        match (
            fields.next(),
            fields.next().and_then(|code| code.parse().ok()),
        ) {
            (Some("true"), _) => Ok(None),
            (Some(_), Some(code)) => Ok(Some(code)),
            _ => bail!("docker inspect of {}: {state}", member.container),
        }
    }

    /// The lines of `member`'s log since `since_us` (µs since the epoch) that hold any of
    /// `needles`.
    pub fn log_lines(&self, member: &Member, since_us: u64, needles: &[&str]) -> Vec<String> {
        let since = format!("{}.{:06}", since_us / 1_000_000, since_us % 1_000_000);
        let Ok(output) = Command::new("docker")
            .args(["logs", "--since", &since, &member.container])
            .output()
        else {
            return Vec::new();
        };
        let mut all = text(&output.stdout);
        all.push_str(&text(&output.stderr));
        all.lines()
            .filter(|line| needles.iter().any(|needle| line.contains(needle)))
            .map(str::to_string)
            .collect()
    }

    /// Undoes every fault on every container: data disks freed, running, unpaused, connected,
    /// no partition rules, agent processes continued. Errors are collected, not fatal: each
    /// step is tried.
    pub fn heal(&self) -> Vec<String> {
        let mut errors = Vec::new();
        // Before any coordinator starts again: one that exited on a full disk must find room.
        for member in &self.coordinators {
            if let Err(error) = self.free_disk(member) {
                errors.push(format!("{error:#}"));
            }
        }
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

    /// Copies every coordinator's data directory (its Raft log, vote, snapshots and job
    /// history) into `data/coord-N` of the episode's folder, for a look after a violation:
    /// from its data disk, or out of its container without one. The folders it wrote.
    pub fn save_data(&self) -> Vec<PathBuf> {
        let saved_dir = self.dir.join("data");
        let _ = std::fs::create_dir_all(&saved_dir);
        let mut saved = Vec::new();
        for member in &self.coordinators {
            let to = saved_dir.join(&member.name);
            let _ = std::fs::remove_dir_all(&to);
            let copied = if self.data_disks {
                let from = self.disk_mount(member).join("data");
                host("cp", &[&"-a", &from, &to])
            } else {
                docker(&[
                    "cp",
                    &format!("{}:{COORDINATOR_DATA_DIR}", member.container),
                    &to.display().to_string(),
                ])
                .map(|_| ())
            };
            match copied {
                Ok(()) => saved.push(to),
                Err(error) => say!("cannot save {}'s data: {error:#}", member.name),
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
                    say!("{error:#}");
                }
            }
        }
        if docker(&["network", "inspect", &self.network]).is_ok() {
            if let Err(error) = docker(&["network", "rm", &self.network]) {
                say!("{error:#}");
            }
        }
        // The containers are gone: nothing holds the data disks any more.
        self.remove_data_disks();
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
