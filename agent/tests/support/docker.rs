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
