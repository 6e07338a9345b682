//! The `quotient-agent` binary as a person or a script runs it: the inventory print (simulated
//! and, on this driverless machine, NVML's clear error) and the long-running agent's checks of
//! its flags and certificate files.

use std::process::{Command, Output};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quotient-agent"))
        .args(args)
        .env_remove("QUOTIENT_SIMULATED_GPUS")
        .env_remove("QUOTIENT_COORDINATORS")
        .output()
        .expect("run quotient-agent")
}

/// `inventory -o json` prints one JSON document of simulated GPUs, honouring the unhealthy file.
#[test]
fn inventory_prints_simulated_gpus_as_json() {
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("unhealthy-gpus"), "1\n").unwrap();
    let output = agent(&[
        "inventory",
        "--simulated-gpus",
        "2xa10g,1xh100-80gb",
        "--name",
        "node-7",
        "--state-dir",
        state.path().to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["node"], "node-7");
    assert_eq!(document["simulated"], true);
    let gpus = document["gpus"].as_array().unwrap();
    let classes: Vec<&str> = gpus.iter().map(|g| g["class"].as_str().unwrap()).collect();
    assert_eq!(classes, vec!["a10g", "a10g", "h100-80gb"]);
    let healthy: Vec<bool> = gpus
        .iter()
        .map(|g| g["healthy"].as_bool().unwrap())
        .collect();
    assert_eq!(healthy, vec![true, false, true]);
    assert_eq!(
        gpus[0]["uuid"],
        quotient_agent::gpu::simulated::simulated_uuid("node-7", 0)
    );
}

/// The table form names every GPU and says which are unhealthy.
#[test]
fn inventory_prints_a_table_for_people() {
    let output = agent(&[
        "inventory",
        "--simulated-gpus",
        "2xa10g",
        "--name",
        "node-7",
    ]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("node node-7: 2 GPUs (simulated)"), "{text}");
    assert_eq!(text.matches("healthy").count(), 2, "{text}");
}

/// Without an NVIDIA driver, the NVML inventory fails with a message that names the way out.
#[test]
fn inventory_without_nvml_names_the_simulated_alternative() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        eprintln!("this host has an NVIDIA driver: the no-driver error is not checked here");
        return;
    }
    let output = agent(&["inventory"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("libnvidia-ml.so.1"), "{stderr}");
    assert!(stderr.contains("--simulated-gpus"), "{stderr}");
    assert!(output.stdout.is_empty());
}

/// A bad simulated spec is refused with the form it should take.
#[test]
fn a_bad_simulated_spec_is_refused() {
    let output = agent(&["inventory", "--simulated-gpus", "eight-a10g"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("COUNTxCLASS"), "{stderr}");
}

/// The long-running agent checks its flags and refuses missing certificate files by name.
#[test]
fn running_the_agent_checks_its_flags_and_certificate_files() {
    let output = agent(&[
        "--name",
        "node-1",
        "--coordinators",
        "127.0.0.1:7401",
        "--ca",
        "ca.pem",
        "--cert",
        "node-1.pem",
        "--key",
        "node-1-key.pem",
        // As root (CI) the agent would otherwise refuse first, for want of a job user.
        "--allow-root-jobs",
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot read the cluster CA certificate ca.pem"),
        "{stderr}"
    );

    let output = agent(&["--name", "node-1"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--coordinators is required"), "{stderr}");
}
