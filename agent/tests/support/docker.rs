//! Helpers of the tests that need the Docker daemon: the test image (built offline on first
//! use), failing in CI when Docker is missing (never skipping there), and cleaning up
//! containers.

use std::process::{Command, Stdio};
use std::sync::Mutex;

pub const IMAGE: &str = "quotient-test-busybox:latest";

/// Serialises building the test image across the tests of this binary.
static IMAGE_BUILD: Mutex<()> = Mutex::new(());

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true" || value == "1")
}

/// Fails in CI, skips loudly elsewhere.
pub fn unavailable(why: String) {
    if in_ci() {
        panic!("Docker tests cannot run in CI: {why}");
    }
    eprintln!(
        "\n!!!!!!!! SKIPPING a Docker runtime test: {why}\n!!!!!!!! (with CI=true this fails)\n"
    );
}

pub fn ensure_image() -> Result<(), String> {
    let _guard = IMAGE_BUILD
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let present = Command::new("docker")
        .args(["image", "inspect", IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|error| format!("cannot run the docker CLI: {error}"))?
        .success();
    if present {
        return Ok(());
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/docker/build-test-image.sh"
    );
    let output = Command::new("bash")
        .arg(script)
        .output()
        .map_err(|error| format!("cannot run {script}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{script} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Removes every container of a test's node when the test ends, pass or fail.
pub struct RemoveContainers(pub Vec<String>);

impl Drop for RemoveContainers {
    fn drop(&mut self) {
        for filter in &self.0 {
            let Ok(output) = Command::new("docker")
                .args(["ps", "-aq", "--filter", filter])
                .output()
            else {
                continue;
            };
            let ids: Vec<String> = String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .args(["rm", "-f"])
                    .args(&ids)
                    .stdout(Stdio::null())
                    .status();
            }
        }
    }
}

/// The daemon's socket: `DOCKER_HOST` when it names one, else the default.
pub fn daemon_socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".to_string())
}

/// A proxy in front of the Docker daemon whose answers to chosen calls can be held back, as a
/// frozen or slow daemon would: the call is carried out, and its caller times out waiting.
pub struct DaemonProxy {
    pub socket: std::path::PathBuf,
    /// Answers to requests whose first line holds one of these texts are held.
    hold: std::sync::Arc<Mutex<Vec<String>>>,
    /// Requests whose first line holds one of these texts are never passed on.
    swallow: std::sync::Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl DaemonProxy {
    pub fn start(dir: &std::path::Path) -> DaemonProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = dir.join("proxied-docker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let hold: std::sync::Arc<Mutex<Vec<String>>> = Default::default();
        let held = hold.clone();
        let swallow: std::sync::Arc<Mutex<Vec<String>>> = Default::default();
        let swallowed = swallow.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::UnixStream::connect(daemon_socket()).await else {
                    continue;
                };
                let (mut in_read, mut in_write) = inbound.into_split();
                let (mut out_read, mut out_write) = outbound.into_split();
                // Whether the request in flight on this connection is one to hold.
                let holding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (hold, flag) = (held.clone(), holding.clone());
                let swallow = swallowed.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut swallowing = false;
                    while let Ok(n @ 1..) = in_read.read(&mut buf).await {
                        let head = String::from_utf8_lossy(&buf[..n.min(512)]).into_owned();
                        let first_line = head.lines().next().unwrap_or_default().to_string();
                        if first_line.ends_with("HTTP/1.1") {
                            let held = hold
                                .lock()
                                .unwrap()
                                .iter()
                                .any(|pattern| first_line.contains(pattern.as_str()));
                            flag.store(held, std::sync::atomic::Ordering::SeqCst);
                            swallowing = swallow
                                .lock()
                                .unwrap()
                                .iter()
                                .any(|pattern| first_line.contains(pattern.as_str()));
                        }
                        if swallowing {
                            continue;
                        }
                        if out_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    // The caller hung up: the daemon's side stays open, so that the call it
                    // is carrying out is not cut short.
                });
                let hold = held.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = out_read.read(&mut buf).await {
                        while holding.load(std::sync::atomic::Ordering::SeqCst)
                            && !hold.lock().unwrap().is_empty()
                        {
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        }
                        // A caller that gave up reads nothing more: its answer is dropped.
                        let _ = in_write.write_all(&buf[..n]).await;
                    }
                });
            }
        });
        DaemonProxy {
            socket,
            hold,
            swallow,
            task,
        }
    }

    /// Holds back the answers to calls whose request line holds one of `patterns` until
    /// [`DaemonProxy::release`].
    pub fn hold(&self, patterns: &[&str]) {
        *self.hold.lock().unwrap() = patterns.iter().map(|p| p.to_string()).collect();
    }

    /// Passes no call whose request line holds one of `patterns` on to the daemon (its caller
    /// waits for an answer that never comes) until [`DaemonProxy::release`].
    pub fn swallow(&self, patterns: &[&str]) {
        *self.swallow.lock().unwrap() = patterns.iter().map(|p| p.to_string()).collect();
    }

    pub fn release(&self) {
        self.hold.lock().unwrap().clear();
        self.swallow.lock().unwrap().clear();
    }

    /// A client of the daemon through this proxy, whose calls time out after `timeout_s`.
    pub async fn client(&self, timeout_s: u64) -> bollard::Docker {
        bollard::Docker::connect_with_unix(
            &self.socket.display().to_string(),
            timeout_s,
            bollard::API_DEFAULT_VERSION,
        )
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
    }
}

impl Drop for DaemonProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pids of the running watchdogs of container `id`.
pub fn watchdog_pids(id: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = state
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            cmdline.contains("container-watchdog") && cmdline.contains(id) && !zombie
        })
        .collect()
}
