//! Shared scaffolding of the cluster tests: certificates, a cluster of real
//! `quotient-coordinator` processes on loopback (killed when the test ends, pass or fail),
//! API clients, and deadline-bounded polling.

#![allow(dead_code)] // Each test binary uses a different part of this module.

pub mod docker_hosts;
pub use quotient_tests::fault_proxy;
pub mod no_network;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse, ClusterView, HealthView};
use quotient_common::certs::{self, Role};
use quotient_common::tls::TlsFiles;
use quotient_common::{ClusterId, GpuClass, JobSpec, ShareSpec, ShareState, Strategy};

use docker_hosts::{DockerHosts, DOCKER_PORT};
use fault_proxy::{udp_ports_of, FaultProxy};

/// How long a cluster may take to elect a leader or converge, on a slow CI machine.
pub const CONVERGE: Duration = Duration::from_secs(60);
/// How long `cluster init` may take, the wait for the coordinators to listen included.
pub const INIT_WITHIN: Duration = Duration::from_secs(90);
/// Pause between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Deadline of a call through a health client (one address, no redirects).
pub const HEALTH_CALL: Duration = Duration::from_secs(2);
/// How long a coordinator may take to exit once told to stop (`docker stop` kills it after
/// 10 s).
pub const STOP_WITHIN: Duration = Duration::from_secs(20);
/// The coordinator binary built by cargo for these tests.
pub const BINARY: &str = env!("CARGO_BIN_EXE_quotient-coordinator");

/// A certificate directory: the CA, coordinators coord-1..5, admin `alice`, user `bob`,
/// agent `node-1`; and a second CA with its own admin `mallory`.
pub struct Certs {
    pub dir: PathBuf,
    pub other_dir: PathBuf,
}

impl Certs {
    /// The certificates under `root`, coordinator `id`'s also naming `sans(id)`.
    pub fn create(root: &Path, sans: impl Fn(u64) -> Vec<String>) -> Certs {
        let dir = root.join("certs");
        let other_dir = root.join("other-certs");
        certs::init_ca(&dir).expect("a CA");
        for id in 1..=5 {
            certs::issue(&dir, Role::Coordinator, &format!("coord-{id}"), &sans(id))
                .expect("a coordinator certificate");
        }
        certs::issue(&dir, Role::Admin, "alice", &[]).expect("an admin certificate");
        certs::issue(&dir, Role::User, "bob", &[]).expect("a user certificate");
        for node in ["node-1", "node-2"] {
            certs::issue(&dir, Role::Agent, node, &[]).expect("an agent certificate");
        }
        certs::init_ca(&other_dir).expect("another CA");
        certs::issue(&other_dir, Role::Admin, "mallory", &[]).expect("a foreign admin");
        certs::issue(&other_dir, Role::Coordinator, "coord-9", &[]).expect("a foreign coordinator");
        Certs { dir, other_dir }
    }

    pub fn files(&self, name: &str) -> TlsFiles {
        TlsFiles::in_dir(&self.dir, name)
    }
}

/// One coordinator process.
struct Member {
    /// Where the other coordinators know it (its entry in `--peers`).
    address: String,
    /// Where it listens: its `address` too, unless the cluster runs behind fault proxies or
    /// in containers.
    listen: String,
    /// Where the tests' clients reach it: `listen`, or its container's address.
    client: String,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// How many times it was started, to keep each start's log.
    starts: u32,
    /// Environment variables its next starts get (`Cluster::set_env`).
    env: Vec<(String, String)>,
}

impl Member {
    fn new(root: &Path, id: u64, address: &str, listen: &str, client: &str) -> Member {
        Member {
            address: address.to_string(),
            listen: listen.to_string(),
            client: client.to_string(),
            data_dir: root.join(format!("data-{id}")),
            log: root.join(format!("coord-{id}.log")),
            child: None,
            starts: 0,
            env: Vec::new(),
        }
    }
}

/// A cluster of coordinator processes; every process is killed when this is dropped.
pub struct Cluster {
    pub root: tempfile::TempDir,
    pub certs: Certs,
    members: BTreeMap<u64, Member>,
    /// The ids that bootstrap the cluster; the others join later with `AddMember`.
    initial: u64,
    extra_args: Vec<String>,
    /// The relay in front of each coordinator, when the cluster was started behind them.
    proxies: BTreeMap<u64, FaultProxy>,
    /// The network the coordinators' containers run on, when each runs in its own.
    docker: Option<DockerHosts>,
    /// The cluster's id, once [`Cluster::init`] made it; every client of
    /// [`Cluster::client_of`] sends its requests for this cluster.
    pub cluster_id: Option<ClusterId>,
}

impl Cluster {
    /// Starts `size` coordinators (ids 1..=size) with `extra_args` each, and waits for none.
    pub fn start(size: u64, extra_args: &[&str]) -> Cluster {
        Cluster::start_partial(size, size, extra_args)
    }

    /// Makes room for `size` coordinators but starts only ids 1..=`initial`, which form the
    /// cluster; start the others with [`Cluster::start_member`] and add them with
    /// `ApiRequest::AddMember`.
    pub fn start_partial(size: u64, initial: u64, extra_args: &[&str]) -> Cluster {
        let mut cluster = Cluster::prepare(size, initial, extra_args);
        cluster.start_initial();
        cluster
    }

    /// Starts `size` coordinators, each advertised to the others at its own
    /// [`FaultProxy`], so that [`Cluster::isolate`] can cut one off.
    pub async fn start_behind_proxies(size: u64, extra_args: &[&str]) -> Cluster {
        let mut cluster = Cluster::prepare(size, size, extra_args);
        for (id, member) in cluster.members.iter_mut() {
            let target = member.listen.parse().expect("a loopback address");
            let proxy = FaultProxy::start(target).await;
            member.address = proxy.address().to_string();
            cluster.proxies.insert(*id, proxy);
        }
        cluster.start_initial();
        cluster
    }

    fn start_initial(&mut self) {
        for id in 1..=self.initial {
            self.start_member(id);
        }
        eprintln!(
            "cluster of {} under {}",
            self.members.len(),
            self.root.path().display()
        );
        self.init();
    }

    /// Bootstraps the cluster on coordinator 1 (`ApiRequest::InitCluster`, as `quotient
    /// cluster init` does) and records its id. Blocks: it runs on a thread of its own, so that
    /// any test runtime may call it.
    pub fn init(&mut self) {
        let client = self
            .client_of("alice", vec![self.address(1)])
            .with_call_timeout(INIT_WITHIN);
        let health = self
            .client_of("alice", vec![self.address(1)])
            .with_call_timeout(HEALTH_CALL);
        let cluster_id = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let answer = client.call(ApiRequest::InitCluster).await;
                client.close();
                let text = match answer {
                    Ok(ApiResponse::ClusterInitialised(view)) => {
                        assert!(view.pending.is_empty(), "{view:?}");
                        view.cluster_id
                    }
                    // The answer was lost, or an earlier init ran: coordinator 1 knows.
                    other => match health.call(ApiRequest::Health).await {
                        Ok(ApiResponse::Health(view)) => view
                            .cluster_id
                            .unwrap_or_else(|| panic!("cluster init failed: {other:?}")),
                        again => panic!("cluster init failed: {other:?}, then {again:?}"),
                    },
                };
                health.close();
                text.parse::<ClusterId>().expect("a cluster id")
            })
        })
        .join()
        .expect("the init thread");
        eprintln!("cluster {cluster_id} initialised");
        self.cluster_id = Some(cluster_id);
    }

    /// The cluster's directories and addresses; starts nothing.
    fn prepare(size: u64, initial: u64, extra_args: &[&str]) -> Cluster {
        let ports = quotient_tests::free_ports(size as usize);
        Cluster::assemble(size, initial, extra_args, None, |id| {
            let address = format!("127.0.0.1:{}", ports[id as usize - 1]);
            [address.clone(), address.clone(), address]
        })
    }

    /// Starts `size` coordinators, each in its own container on a network of its own (see
    /// [`DockerHosts`]): a host name, an address and a network interface each, reached from
    /// this process at their containers' addresses. `None` (skip, said loudly) where Docker
    /// is not reachable, except under `CI=true`, where that fails the test.
    pub fn start_in_docker(size: u64, extra_args: &[&str]) -> Option<Cluster> {
        let docker = DockerHosts::create()?;
        let addresses = |id| {
            [
                format!("{}:{DOCKER_PORT}", docker.host(id)),
                format!("0.0.0.0:{DOCKER_PORT}"),
                format!("{}:{DOCKER_PORT}", docker.ip(id)),
            ]
        };
        let mut cluster = Cluster::assemble(size, size, extra_args, Some(&docker), addresses);
        cluster.docker = Some(docker);
        cluster.start_initial();
        Some(cluster)
    }

    /// The cluster's certificates and members, coordinator `id` known to the others, listening
    /// and reached by clients at the three `addresses(id)`; starts nothing. Coordinators in
    /// `docker` containers also carry their host names and addresses in their certificates.
    fn assemble(
        size: u64,
        initial: u64,
        extra_args: &[&str],
        docker: Option<&DockerHosts>,
        addresses: impl Fn(u64) -> [String; 3],
    ) -> Cluster {
        let root = tempfile::tempdir().expect("a temporary directory");
        let certs = Certs::create(root.path(), |id| {
            docker.map_or_else(Vec::new, |docker| vec![docker.host(id), docker.ip(id)])
        });
        let members = (1..=size)
            .map(|id| {
                let [address, listen, client] = addresses(id);
                (id, Member::new(root.path(), id, &address, &listen, &client))
            })
            .collect();
        Cluster {
            root,
            certs,
            members,
            initial,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            proxies: BTreeMap::new(),
            docker: None,
            cluster_id: None,
        }
    }

    /// The initial members, plus `id` itself when it joins later.
    fn peers_flag(&self, id: u64) -> String {
        self.members
            .iter()
            .filter(|(member, _)| **member <= self.initial || **member == id)
            .map(|(id, member)| format!("{id}={}", member.address))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts (or restarts) coordinator `id` on its data directory.
    /// Gives coordinator `id` these environment variables from its next start on.
    pub fn set_env(&mut self, id: u64, env: &[(&str, &str)]) {
        let member = self.members.get_mut(&id).expect("a member of the cluster");
        member.env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
    }

    pub fn start_member(&mut self, id: u64) {
        let peers = self.peers_flag(id);
        self.start_member_with_peers(id, peers);
    }

    /// Starts coordinator `id` with only itself in `--peers`: `cluster init` sent to it then
    /// makes a cluster of its own.
    pub fn start_member_alone(&mut self, id: u64) {
        let peers = format!("{id}={}", self.members[&id].address);
        self.start_member_with_peers(id, peers);
    }

    pub fn start_member_with_peers(&mut self, id: u64, peers: String) {
        let certs_dir = self.certs.dir.clone();
        let extra = self.extra_args.clone();
        let member = self.members.get_mut(&id).expect("a member of the cluster");
        let env = member.env.clone();
        assert!(
            member.child.is_none(),
            "coordinator {id} is already running"
        );
        member.starts += 1;
        let log_path = member.log.with_extension(format!("{}.log", member.starts));
        let mut log = File::create(&log_path).expect("a log file");
        let (mut command, files, data_dir) = match &self.docker {
            None => (
                Command::new(BINARY),
                TlsFiles::in_dir(&certs_dir, &format!("coord-{id}")),
                member.data_dir.clone(),
            ),
            Some(docker) => docker.run(id, &certs_dir, &member.data_dir),
        };
        // SAFETY: between fork and exec the closure calls only `signal`, which is
        // async-signal-safe, and touches no memory of the parent.
        unsafe {
            // A write past a file size limit (`Cluster::limit_file_size`) then fails with
            // EFBIG, as a full disk fails with ENOSPC, instead of killing the process.
            command.pre_exec(|| {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
        let mut child = command
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&member.listen)
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--peers")
            .arg(&peers)
            .args(files.flags())
            .args(&extra)
            .env("RUST_LOG", "info,openraft=warn,quinn=warn")
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Through a pipe, so that the log is written by this process, under no limit
            // set on the coordinator's own files.
            .stderr(Stdio::piped())
            .spawn()
            .expect("the coordinator binary starts");
        let mut stderr = child.stderr.take().expect("the coordinator's stderr");
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stderr, &mut log);
        });
        member.child = Some(child);
    }

    /// Kills coordinator `id` with SIGKILL and reaps it.
    pub fn kill(&mut self, id: u64) {
        if let Some(docker) = &self.docker {
            docker.remove(id);
        }
        let member = self.members.get_mut(&id).expect("a member of the cluster");
        if let Some(mut child) = member.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops coordinator `id` the way an operator does (SIGTERM; `docker stop` in a
    /// container) and waits for it to exit; its exit status.
    pub async fn stop(&mut self, id: u64) -> std::process::ExitStatus {
        match &self.docker {
            None => self.signal(id, libc::SIGTERM),
            Some(docker) => docker.container_command(id, "stop"),
        }
        self.wait_exit(id, STOP_WITHIN).await
    }

    /// Lets coordinator `id` write no file at or past `bytes` from now on (RLIMIT_FSIZE):
    /// its next write there fails with EFBIG, as on a full disk.
    pub fn limit_file_size(&self, id: u64, bytes: u64) {
        let pid = self.pid(id);
        let limit = libc::rlimit {
            rlim_cur: bytes,
            rlim_max: bytes,
        };
        // SAFETY: `limit` is a valid rlimit; a null old-limit pointer is allowed.
        let result = unsafe {
            libc::prlimit(
                pid as libc::pid_t,
                libc::RLIMIT_FSIZE,
                &limit,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(
            result,
            0,
            "prlimit on coordinator {id}: {}",
            std::io::Error::last_os_error()
        );
    }

    /// The process id of running coordinator `id`.
    fn pid(&self, id: u64) -> u32 {
        self.members[&id]
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("coordinator {id} is not running"))
            .id()
    }

    /// Freezes coordinator `id` (SIGSTOP, or its container's cgroup frozen), as a long stall
    /// of its machine would.
    pub fn pause(&self, id: u64) {
        match &self.docker {
            None => self.signal(id, libc::SIGSTOP),
            Some(docker) => docker.container_command(id, "pause"),
        }
    }

    /// Lets a paused coordinator `id` run again.
    pub fn resume(&self, id: u64) {
        match &self.docker {
            None => self.signal(id, libc::SIGCONT),
            Some(docker) => docker.container_command(id, "unpause"),
        }
    }

    /// Unplugs coordinator `id`'s container from the network: nothing reaches it or leaves
    /// it, clients included, and its name no longer resolves. Docker clusters only.
    pub fn unplug(&self, id: u64) {
        self.docker_hosts().unplug(id);
    }

    /// Plugs coordinator `id`'s container back in, at the same address.
    pub fn plug(&self, id: u64) {
        self.docker_hosts().plug(id);
    }

    pub fn docker_hosts(&self) -> &DockerHosts {
        self.docker
            .as_ref()
            .expect("start the cluster with Cluster::start_in_docker to unplug a coordinator")
    }

    fn signal(&self, id: u64, signal: libc::c_int) {
        let pid = self.pid(id);
        // SAFETY: kill has no memory effects; the pid is our own child, not yet reaped.
        let result = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(result, 0, "signal {signal} to coordinator {id}");
    }

    /// Waits up to `timeout` for coordinator `id` to exit by itself; its exit status.
    pub async fn wait_exit(&mut self, id: u64, timeout: Duration) -> std::process::ExitStatus {
        let member = self.members.get_mut(&id).expect("a member of the cluster");
        let child = member.child.as_mut().expect("a running coordinator");
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("the coordinator's status") {
                member.child = None;
                return status;
            }
            assert!(
                started.elapsed() < timeout,
                "coordinator {id} still runs after {timeout:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Everything coordinator `id` logged, over all its starts.
    pub fn log_text(&self, id: u64) -> String {
        let member = &self.members[&id];
        (1..=member.starts)
            .map(|start| {
                std::fs::read_to_string(member.log.with_extension(format!("{start}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Where a client reaches coordinator `id` (never through a fault proxy).
    pub fn address(&self, id: u64) -> String {
        self.members[&id].client.clone()
    }

    /// Where the other coordinators reach coordinator `id`.
    pub fn advertised_address(&self, id: u64) -> String {
        self.members[&id].address.clone()
    }

    /// Cuts coordinator `id` off from every other coordinator, both ways (clients still
    /// reach it). The cluster must have been started with [`Cluster::start_behind_proxies`].
    pub fn isolate(&self, id: u64) {
        let ports = self.proxied_ports(id);
        for (other, proxy) in &self.proxies {
            if *other == id {
                proxy.drop_all();
            } else {
                proxy.block_ports(&ports);
            }
        }
    }

    /// A one-way fault: what coordinator `id` sends still reaches the others, but nothing
    /// from them reaches it, neither answers nor their own requests.
    pub fn deafen(&self, id: u64) {
        let ports = self.proxied_ports(id);
        for (other, proxy) in &self.proxies {
            if *other == id {
                proxy.drop_all();
            } else {
                proxy.deafen_ports(&ports);
            }
        }
    }

    /// The UDP ports coordinator `id` sends from, which must be behind a proxy.
    fn proxied_ports(&self, id: u64) -> BTreeSet<u16> {
        assert!(
            self.proxies.contains_key(&id),
            "start the cluster with Cluster::start_behind_proxies to cut a coordinator off"
        );
        let pid = self.pid(id);
        let ports = udp_ports_of(pid);
        assert!(
            !ports.is_empty(),
            "coordinator {id} (pid {pid}) holds no UDP socket"
        );
        ports
    }

    /// Loses `percent` of the datagrams between coordinators, each way, at random.
    pub fn lose(&self, percent: u32) {
        for (id, proxy) in &self.proxies {
            proxy.lose(percent, 0x9e37_79b9_7f4a_7c15 ^ id);
        }
    }

    /// Holds every datagram between coordinators `delay` at each hop: a Raft round trip
    /// takes twice that longer.
    pub fn delay(&self, delay: Duration) {
        for proxy in self.proxies.values() {
            proxy.delay(delay);
        }
    }

    /// Ends every partition and loss.
    pub fn heal(&self) {
        for proxy in self.proxies.values() {
            proxy.heal();
        }
    }

    /// The client addresses of the initial members.
    pub fn addresses(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|(id, _)| **id <= self.initial)
            .map(|(_, m)| m.client.clone())
            .collect()
    }

    /// The ids of the initial members.
    pub fn ids(&self) -> Vec<u64> {
        (1..=self.initial).collect()
    }

    /// The ids of the initial members but `excluded`.
    pub fn ids_except(&self, excluded: &[u64]) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| !excluded.contains(id))
            .collect()
    }

    /// A client of coordinators `ids` alone, with the certificate of `name`.
    pub fn client_of_ids(&self, name: &str, ids: &[u64]) -> ApiClient {
        self.client_of(name, ids.iter().map(|id| self.address(*id)).collect())
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.members[&id].data_dir.clone()
    }

    /// A client of `addresses` with the certificate of `name`.
    pub fn client_of(&self, name: &str, addresses: Vec<String>) -> ApiClient {
        ApiClient::connect(addresses, &self.certs.files(name))
            .expect("a client")
            .with_cluster(self.cluster_id)
    }

    /// An admin client of every coordinator.
    pub fn admin(&self) -> ApiClient {
        self.client_of("alice", self.addresses())
    }

    /// Asks coordinator `id` alone about itself.
    pub async fn health(&self, id: u64) -> Option<HealthView> {
        let client = self
            .client_of("alice", vec![self.address(id)])
            .with_call_timeout(HEALTH_CALL);
        let answer = client.call(ApiRequest::Health).await;
        client.close();
        match answer {
            Ok(ApiResponse::Health(view)) => Some(view),
            _ => None,
        }
    }

    /// Waits until a leader is elected among `ids` and every one of them knows it.
    pub async fn wait_for_leader(&self, ids: &[u64]) -> u64 {
        poll_until(
            "a leader known to every live coordinator",
            CONVERGE,
            || async {
                let mut leaders = BTreeSet::new();
                for id in ids {
                    let health = self.health(*id).await?;
                    leaders.insert(health.leader?);
                }
                let leader = *leaders.iter().next()?;
                (leaders.len() == 1 && ids.contains(&leader)).then_some(leader)
            },
        )
        .await
    }

    /// Waits until `ids` have applied the same log and hold the same state; returns the
    /// digest.
    pub async fn wait_converged(&self, ids: &[u64]) -> u64 {
        poll_until(
            "every live coordinator holding the same state",
            CONVERGE,
            || async {
                let mut seen = BTreeSet::new();
                for id in ids {
                    let health = self.health(*id).await?;
                    seen.insert((health.last_applied, health.state_digest));
                }
                (seen.len() == 1)
                    .then(|| seen.iter().next().map(|(_, d)| *d))
                    .flatten()
            },
        )
        .await
    }

    /// The cluster as the leader sees it.
    pub async fn status(&self, client: &ApiClient) -> ClusterView {
        match client.call(ApiRequest::ClusterStatus).await {
            Ok(ApiResponse::Cluster(view)) => view,
            other => panic!("cluster status failed: {other:?}"),
        }
    }

    /// Prints the end of every coordinator log (call before panicking to help debugging).
    pub fn dump_logs(&self) {
        for entry in std::fs::read_dir(self.root.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                eprintln!("==== {} (last lines)", path.display());
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for (id, member) in self.members.iter_mut() {
            if let Some(docker) = &self.docker {
                docker.remove(*id);
            }
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Calls `check` every [`POLL_INTERVAL`] until it gives `Some`, or panics after `timeout`
/// saying what it waited for.
pub async fn poll_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if started.elapsed() > timeout {
            panic!("gave up after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

pub fn class() -> GpuClass {
    GpuClass::parse("a10g").expect("a GPU class")
}

/// A lend-and-borrow share with 4 a10g GPUs.
pub fn share(name: &str) -> ShareSpec {
    ShareSpec {
        name: name.to_string(),
        limits: BTreeMap::from([(class(), 4)]),
        strategy: Strategy::LendAndBorrow,
        borrow_limit_percent: Some(100),
        in_share_preemption: true,
        state: ShareState::Enabled,
        members: Vec::new(),
        max_jobs_per_user: None,
    }
}

/// A one-GPU job of `share`.
pub fn job(share: &str, priority: u32) -> JobSpec {
    JobSpec::new(
        share,
        priority,
        1,
        vec!["sleep".to_string(), "60".to_string()],
    )
}

/// Creates a share through `client`, which must succeed.
pub async fn create_share(client: &ApiClient, name: &str) {
    match client.call(ApiRequest::CreateShare(share(name))).await {
        Ok(ApiResponse::Done) => {}
        other => panic!("creating share {name} failed: {other:?}"),
    }
}

/// Submits a job through `client`, which must succeed; returns its id.
pub async fn submit(client: &ApiClient, spec: JobSpec) -> quotient_common::JobId {
    match client.call(ApiRequest::SubmitJob(spec)).await {
        Ok(ApiResponse::JobSubmitted { job, .. }) => job,
        other => panic!("submitting a job failed: {other:?}"),
    }
}

/// Every job as the leader sees it, in submit order.
pub async fn jobs(client: &ApiClient) -> Vec<quotient_common::api::JobView> {
    let mut jobs = client
        .every_job(ApiRequest::list_jobs(quotient_common::api::JOB_PAGE_MAX))
        .await
        .unwrap_or_else(|error| panic!("listing jobs failed: {error}"));
    jobs.reverse();
    jobs
}

/// Every job as each of `ids` sees it, asked alone (a linearizable read through each).
pub async fn jobs_on_each(
    cluster: &Cluster,
    ids: &[u64],
) -> Vec<(u64, Vec<quotient_common::api::JobView>)> {
    let mut seen = Vec::new();
    for id in ids {
        let alone = cluster.client_of("bob", vec![cluster.address(*id)]);
        seen.push((*id, jobs(&alone).await));
        alone.close();
    }
    seen
}

/// Checks that every initial member of `cluster`, asked alone, holds exactly the
/// `acknowledged` jobs, in order; returns what each one holds.
pub async fn holds_exactly(
    cluster: &Cluster,
    acknowledged: &[quotient_common::JobId],
) -> Vec<(u64, Vec<quotient_common::api::JobView>)> {
    let expected: Vec<String> = acknowledged.iter().map(|job| job.to_string()).collect();
    let seen = jobs_on_each(cluster, &cluster.ids()).await;
    for (id, jobs) in &seen {
        assert_eq!(
            ids_of(jobs),
            expected,
            "coordinator {id} must hold every acknowledged job and nothing else"
        );
    }
    seen
}

/// The ids of `jobs`, in order.
pub fn ids_of(jobs: &[quotient_common::api::JobView]) -> Vec<String> {
    jobs.iter().map(|job| job.id.clone()).collect()
}

/// Every share as the leader sees it.
pub async fn shares(client: &ApiClient) -> Vec<quotient_common::api::ShareView> {
    match client.call(ApiRequest::ListShares).await {
        Ok(ApiResponse::Shares(shares)) => shares,
        other => panic!("listing shares failed: {other:?}"),
    }
}

/// Copies the directory `from` into `to` (made), files and folders.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    for item in std::fs::read_dir(from).expect("read the directory") {
        let item = item.expect("an item");
        let target = to.join(item.file_name());
        if item.file_type().expect("a type").is_dir() {
            copy_dir(&item.path(), &target);
        } else {
            std::fs::copy(item.path(), &target).expect("copy");
        }
    }
}
