//! The AWS Batch–compatible endpoint against real AWS clients: `tests/aws/test_aws_batch.py`
//! drives a dev cluster with boto3 and the AWS CLI (the AWS launch walkthrough, pagination and
//! filters, idempotent submits, refused signatures and members, a SageMaker training container).
//!
//! The clients live in a virtual environment that `.ci/run` makes with packages from PyPI:
//! `target/aws-venv`, or the one `QUOTIENT_AWS_VENV` names. The jobs run as containers of the
//! offline test image on this host's Docker engine. Under `CI=true` a missing virtual
//! environment or Docker fails this test; elsewhere it is skipped, saying why.

use std::path::{Path, PathBuf};
use std::process::Command;

use quotient_tests::{binaries, docker_ready, DevCluster};

/// The image the jobs run.
const IMAGE: &str = "quotient-test-busybox:latest";

/// The virtual environment with boto3 and awscli, if there is one.
fn venv() -> Option<PathBuf> {
    let venv = match std::env::var_os("QUOTIENT_AWS_VENV") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/aws-venv"),
    };
    if venv.join("bin/python").is_file() && venv.join("bin/aws").is_file() {
        return Some(venv);
    }
    let why = format!(
        "no virtual environment with boto3 and awscli at {}: make it with \
         `python3 -m venv {0} && {0}/bin/pip install boto3 awscli` (.ci/run does)",
        venv.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("SKIPPED: {why}");
    None
}

#[test]
fn boto3_and_the_aws_cli_drive_the_cluster_through_the_aws_batch_endpoint() {
    let Some(venv) = venv() else { return };
    if !docker_ready(IMAGE) {
        return;
    }
    let cluster = DevCluster::up(&["--nodes", "3"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("aws/test_aws_batch.py");
    let output = Command::new(venv.join("bin/python"))
        .arg(&script)
        .env("QUOTIENT_BIN", binaries().join("quotient"))
        .env("QUOTIENT_CONFIG", &cluster.config)
        .env("QUOTIENT_DEV_DIR", &cluster.dir)
        .env("QUOTIENT_TEST_IMAGE", IMAGE)
        .env("AWS_CLI", venv.join("bin/aws"))
        // Nothing of the host's AWS setup may leak into the clients.
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_BATCH")
        .output()
        .expect("the virtual environment's python runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "the AWS client tests failed:\n{stderr}{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        cluster.logs()
    );
}
