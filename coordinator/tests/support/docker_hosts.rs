//! Coordinators on hosts of their own: each in a Docker container on a bridge network made for
//! one test, with its own host name (which the others resolve through Docker's DNS), address
//! and network interface. What the tests do to them is what happens to machines: a container
//! unplugged from the network (`docker network disconnect`), frozen (`docker pause`, the
//! cgroup freezer) or killed.
//!
//! Nothing is pulled or built for it: the containers run the image the agent's Docker tests
//! use (`agent/tests/docker/build-test-image.sh`, which CI runs first) with the coordinator
//! binary cargo built for the tests and the shared libraries it links mounted read-only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use quotient_common::tls::TlsFiles;

use super::BINARY;

/// The image the containers run.
pub const IMAGE: &str = "quotient-test-busybox:latest";
/// The port every coordinator listens on in its container.
pub const DOCKER_PORT: u16 = 7400;
/// Where the data directory, the certificates and the binary are inside a container.
const DATA_IN_CONTAINER: &str = "/data";
const CERTS_IN_CONTAINER: &str = "/certs";
const BINARY_IN_CONTAINER: &str = "/usr/bin/quotient-coordinator";
const AGENT_IN_CONTAINER: &str = "/usr/bin/quotient-agent";

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("docker {args:?} could not run: {error}"))
}

/// Runs `docker args`, which must succeed.
fn docker_ok(args: &[&str]) {
    let output = docker(args);
    assert!(
        output.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

/// A Docker network of one test and the names and addresses of its coordinators' containers;
/// the network and every container on it are removed when this is dropped.
pub struct DockerHosts {
    network: String,
    /// The first three octets of the network's /24.
    subnet: String,
    /// The containers' names (and host names) are this, a dash and the coordinator's id.
    prefix: String,
    /// `-v` arguments that mount the coordinator binary and the libraries it links.
    binary_mounts: Vec<String>,
}

/// The agent binary the workspace built next to the coordinator's.
pub fn agent_binary() -> PathBuf {
    let path = Path::new(BINARY).with_file_name("quotient-agent");
    assert!(
        path.is_file(),
        "{} is missing: build the workspace first (`cargo build` at its root, with the tests' \
         profile), so that quotient-agent sits next to quotient-coordinator",
        path.display()
    );
    path
}

impl DockerHosts {
    /// Creates a network of its own for this test; `None` where Docker is not reachable and
    /// this is not CI (which must run these tests, so there it panics).
    pub fn create() -> Option<DockerHosts> {
        let reachable = Command::new("docker")
            .arg("info")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !reachable {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "Docker is not reachable, and CI must run the multi-host tests: start the Docker engine"
            );
            eprintln!("SKIPPED: Docker is not reachable; these tests need it (CI runs them)");
            return None;
        }
        assert!(
            docker(&["image", "inspect", IMAGE]).status.success(),
            "the image {IMAGE} is missing: build it with `bash agent/tests/docker/build-test-image.sh`"
        );
        remove_leftovers();
        let prefix = format!("{PREFIX}{}-{}", std::process::id(), unique());
        // A /24 of 172.30.0.0/16 that no other network holds; another test may take one at
        // the same time, so a refused one is skipped.
        for attempt in 0..64u32 {
            let octet = (std::process::id() + attempt * 37 + unique()) % 250 + 1;
            let subnet = format!("172.30.{octet}");
            let output = docker(&[
                "network",
                "create",
                "--driver",
                "bridge",
                "--subnet",
                &format!("{subnet}.0/24"),
                &prefix,
            ]);
            if output.status.success() {
                return Some(DockerHosts {
                    network: prefix.clone(),
                    subnet,
                    prefix,
                    binary_mounts: binary_mounts(Path::new(BINARY), BINARY_IN_CONTAINER),
                });
            }
        }
        panic!("no free /24 in 172.30.0.0/16 for a Docker network");
    }

    /// Coordinator `id`'s container and host name.
    pub fn host(&self, id: u64) -> String {
        format!("{}-{id}", self.prefix)
    }

    /// Coordinator `id`'s address on the network.
    pub fn ip(&self, id: u64) -> String {
        format!("{}.{}", self.subnet, 10 + id)
    }

    /// The command that runs coordinator `id` in a new container, attached (its log comes
    /// out of the command's stderr); the certificate files and data directory to pass it.
    pub fn run(&self, id: u64, certs_dir: &Path, data_dir: &Path) -> (Command, TlsFiles, PathBuf) {
        let mut command = self.container(&self.host(id), &self.ip(id), certs_dir, data_dir);
        for mount in &self.binary_mounts {
            command.arg("-v").arg(mount);
        }
        command.arg(IMAGE).arg(BINARY_IN_CONTAINER);
        let files = TlsFiles::in_dir(Path::new(CERTS_IN_CONTAINER), &format!("coord-{id}"));
        (command, files, PathBuf::from(DATA_IN_CONTAINER))
    }

    /// `docker run` of a new container `host` at `ip`, attached, with the certificates and a
    /// data directory mounted (the image and command follow); an earlier one of that name
    /// goes first.
    fn container(&self, host: &str, ip: &str, certs_dir: &Path, data_dir: &Path) -> Command {
        let _ = docker(&["rm", "--force", host]);
        std::fs::create_dir_all(data_dir).expect("a data directory");
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let user = unsafe { format!("{}:{}", libc::getuid(), libc::getgid()) };
        let mut command = Command::new("docker");
        command
            .args(["run", "--rm"])
            .args(["--name", host, "--hostname", host])
            .args(["--network", &self.network, "--ip", ip])
            .args(["--user", &user])
            .args(["-e", "RUST_LOG=info,openraft=warn,quinn=warn"])
            .arg("-v")
            .arg(format!("{}:{CERTS_IN_CONTAINER}:ro", certs_dir.display()))
            .arg("-v")
            .arg(format!("{}:{DATA_IN_CONTAINER}", data_dir.display()));
        command
    }

    /// The container name of the agent of node `node-N`.
    pub fn agent_host(&self, node: u64) -> String {
        format!("{}-node-{node}", self.prefix)
    }

    /// Starts the agent of node `node-N` (certificate `node-N`) in a container of its own with
    /// one simulated a10g GPU and the process runtime, talking to coordinators
    /// `1..=coordinators` by name; its log goes to `log`. Killing the returned child does not
    /// stop the container: removing it (or the network's teardown) does.
    pub fn start_agent(
        &self,
        node: u64,
        coordinators: u64,
        certs_dir: &Path,
        state_dir: &Path,
        lease_ms: u64,
        log: &Path,
    ) -> std::process::Child {
        let host = self.agent_host(node);
        let ip = self.agent_ip(node);
        let mut command = self.container(&host, &ip, certs_dir, state_dir);
        for mount in binary_mounts(&agent_binary(), AGENT_IN_CONTAINER) {
            command.arg("-v").arg(mount);
        }
        let name = format!("node-{node}");
        let addresses: Vec<String> = (1..=coordinators)
            .map(|id| format!("{}:{DOCKER_PORT}", self.host(id)))
            .collect();
        let files = TlsFiles::in_dir(Path::new(CERTS_IN_CONTAINER), &name);
        command
            .arg(IMAGE)
            .arg(AGENT_IN_CONTAINER)
            .args(["--name", &name])
            .arg("--coordinators")
            .arg(addresses.join(","))
            .args(files.flags())
            .args(["--state-dir", DATA_IN_CONTAINER])
            .args(["--runtime", "process"])
            // The container runs as the test's user, root in CI.
            .arg("--allow-root-jobs")
            .args(["--lease-ms", &lease_ms.to_string()])
            .args(["--simulated-gpus", "1xa10g"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("an agent log file"));
        command.spawn().expect("docker runs the agent")
    }

    /// The command lines of the processes running in container `host`.
    pub fn processes(&self, host: &str) -> String {
        let output = docker(&["exec", host, "ps", "-o", "args"]);
        assert!(
            output.status.success(),
            "docker exec {host} ps failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Unplugs container `host` from the network.
    pub fn unplug_host(&self, host: &str) {
        docker_ok(&["network", "disconnect", "--force", &self.network, host]);
    }

    /// Plugs container `host` back in at `ip`.
    pub fn plug_host(&self, host: &str, ip: &str) {
        docker_ok(&["network", "connect", "--ip", ip, &self.network, host]);
    }

    /// The address of the agent of node `node-N`.
    pub fn agent_ip(&self, node: u64) -> String {
        format!("{}.{}", self.subnet, 100 + node)
    }

    /// `docker VERB` on coordinator `id`'s container, which must succeed.
    pub fn container_command(&self, id: u64, verb: &str) {
        docker_ok(&[verb, &self.host(id)]);
    }

    /// Kills and removes coordinator `id`'s container, if there is one.
    pub fn remove(&self, id: u64) {
        let _ = docker(&["rm", "--force", &self.host(id)]);
    }

    pub fn unplug(&self, id: u64) {
        self.unplug_host(&self.host(id));
    }

    pub fn plug(&self, id: u64) {
        docker_ok(&[
            "network",
            "connect",
            "--ip",
            &self.ip(id),
            &self.network,
            &self.host(id),
        ]);
    }
}

impl Drop for DockerHosts {
    fn drop(&mut self) {
        let listed = docker(&[
            "ps",
            "--all",
            "--quiet",
            "--filter",
            &format!("network={}", self.network),
        ]);
        for container in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
            let _ = docker(&["rm", "--force", container]);
        }
        let _ = docker(&["network", "rm", &self.network]);
    }
}

/// What the names of the networks and containers of these tests start with, followed by the
/// test process's id.
const PREFIX: &str = "quotient-test-";

/// Removes the networks (and their containers) that test processes no longer running left
/// behind, killed before they could clean up, so that their addresses are free again.
fn remove_leftovers() {
    let listed = docker(&[
        "network",
        "ls",
        "--quiet",
        "--format",
        "{{.Name}}",
        "--filter",
        &format!("name={PREFIX}"),
    ]);
    for network in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
        let pid = network
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let containers = docker(&[
            "ps",
            "--all",
            "--quiet",
            "--filter",
            &format!("network={network}"),
        ]);
        for container in String::from_utf8_lossy(&containers.stdout).split_whitespace() {
            let _ = docker(&["rm", "--force", container]);
        }
        let _ = docker(&["network", "rm", network]);
    }
}

/// A number that differs between the networks one test process creates.
fn unique() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// `-v` arguments mounting `binary` at `inside` and every shared library `ldd` says it loads,
/// each read-only at its own path, so that the binary runs in an image without a C library.
fn binary_mounts(binary: &Path, inside: &str) -> Vec<String> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .expect("ldd runs (Debian's libc-bin)");
    let text = String::from_utf8_lossy(&output.stdout);
    let libraries: BTreeSet<&str> = text
        .lines()
        .flat_map(|line| line.split_whitespace())
        .filter(|word| word.starts_with('/'))
        .collect();
    let mut mounts = vec![format!("{}:{inside}:ro", binary.display())];
    mounts.extend(libraries.iter().map(|path| format!("{path}:{path}:ro")));
    mounts
}
