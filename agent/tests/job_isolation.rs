//! What a process job gets of its host: a clean environment (nothing of the agent's own), a
//! fresh working dir of its own, and an unprivileged user; and the agent's refusal to run jobs
//! as root unless told.
//!
//! The tests that switch users need root (CI runs as root): elsewhere they fail when
//! `CI=true` and otherwise skip with a loud message.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use quotient_agent::runtime::process::ProcessRuntime;
use quotient_agent::runtime::{lookup_user, Runtime, JOB_PATH_DEFAULT};
use support::docker::in_ci;
use support::*;

/// A variable only the agent (this test process) has.
const AGENT_ONLY_VARIABLE: &str = "QUOTIENT_TEST_AGENT_ONLY_SECRET";

/// Whether a test that needs root can run; fails in CI without root, skips loudly elsewhere.
fn root_or_skip(test: &str) -> bool {
    if running_as_root() {
        return true;
    }
    assert!(!in_ci(), "{test} needs root, which CI runs as");
    eprintln!("\n!!!!!!!! SKIPPING {test}: it needs root (with CI=true this fails)\n");
    false
}

/// A state dir the job user can pass through, as the agent checks at start (a temporary dir
/// is 0700).
fn open_state_dir() -> tempfile::TempDir {
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    state
}

/// A job sees its own variables, Quotient's and a minimal PATH, HOME and LANG, and nothing
/// of the agent's environment; it runs in its own fresh working dir, which is its HOME.
#[tokio::test]
async fn a_process_job_gets_a_clean_environment_and_a_fresh_work_dir() {
    std::env::set_var(AGENT_ONLY_VARIABLE, "the agent's own");
    assert!(std::env::var("PATH").is_ok(), "the agent has a PATH");
    let state = open_state_dir();
    let runtime = ProcessRuntime::new(state.path());
    let spec = launch(
        state.path(),
        61,
        1,
        None,
        shell(
            r#"env > "$QUOTIENT_CHECKPOINT_DIR/env.txt"; pwd > "$QUOTIENT_CHECKPOINT_DIR/pwd.txt"; ls -A > "$QUOTIENT_CHECKPOINT_DIR/ls.txt"; echo scratch > scratch"#,
        ),
    );
    // Whatever an earlier try of this attempt left in its working dir is gone.
    std::fs::create_dir_all(&spec.work_dir).unwrap();
    std::fs::write(spec.work_dir.join("left-over"), b"stale").unwrap();
    let handle = runtime.start(&spec).await.unwrap();
    assert_eq!(
        runtime.wait(&handle, WAIT_DEADLINE).await.unwrap(),
        Some(Some(0))
    );
    let read = |name: &str| std::fs::read_to_string(spec.checkpoint_dir.join(name)).unwrap();
    let env = read("env.txt");
    let work_dir = spec.work_dir.display().to_string();
    for line in [
        format!("PATH={JOB_PATH_DEFAULT}"),
        format!("HOME={work_dir}"),
        "LANG=C.UTF-8".to_string(),
        format!("QUOTIENT_WORK_DIR={work_dir}"),
        "QUOTIENT_JOB_ID=j-61".to_string(),
        "TRAIN_EPOCHS=3".to_string(),
        // A job on one node is rank 0 of one, meeting itself on loopback.
        "QUOTIENT_NODE_RANK=0".to_string(),
        "QUOTIENT_NUM_NODES=1".to_string(),
        "MASTER_ADDR=127.0.0.1".to_string(),
        "NNODES=1".to_string(),
        "NODE_RANK=0".to_string(),
        format!("WORLD_SIZE={}", spec.gpu_indices.len()),
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from:\n{env}"
        );
    }
    assert!(
        !env.contains(AGENT_ONLY_VARIABLE),
        "the agent's environment leaked into the job:\n{env}"
    );
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TRAIN_EPOCHS",
        "QUOTIENT_JOB_ID",
        "QUOTIENT_ATTEMPT",
        "QUOTIENT_CHECKPOINT_DIR",
        "QUOTIENT_WORK_DIR",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "QUOTIENT_NODE_RANK",
        "QUOTIENT_NUM_NODES",
        "QUOTIENT_HOSTS",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NNODES",
        "NODE_RANK",
        "WORLD_SIZE",
        // Set by the shell itself.
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
    ];
    for line in env.lines() {
        let key = line.split('=').next().unwrap();
        assert!(
            allowed.contains(&key),
            "unexpected variable {key} in:\n{env}"
        );
    }
    assert_eq!(read("pwd.txt").trim(), work_dir);
    assert_eq!(read("ls.txt").trim(), "", "the working dir starts empty");
    assert!(spec.work_dir.join("scratch").exists());
    assert!(!spec.work_dir.join("left-over").exists());
}

/// As root with a job user, the job runs as that user (never uid 0), with no supplementary
/// groups, and can write its working dir and checkpoint dir.
#[tokio::test]
async fn a_process_job_runs_as_the_job_user() {
    if !root_or_skip("a_process_job_runs_as_the_job_user") {
        return;
    }
    let nobody = lookup_user("nobody").expect("the user nobody exists");
    assert_ne!(nobody.uid, 0);
    let state = open_state_dir();
    let runtime = ProcessRuntime::new(state.path()).with_job_user(nobody.clone());
    let spec = launch(
        state.path(),
        62,
        1,
        None,
        shell(
            r#"id -u > "$QUOTIENT_CHECKPOINT_DIR/uid"; id -G > "$QUOTIENT_CHECKPOINT_DIR/groups"; echo here > "$HOME/file" && echo written > "$QUOTIENT_CHECKPOINT_DIR/home"; exit 5"#,
        ),
    );
    let handle = runtime.start(&spec).await.unwrap();
    assert_eq!(
        runtime.wait(&handle, WAIT_DEADLINE).await.unwrap(),
        Some(Some(5)),
        "the exit code is recorded although the job user cannot write the jobs dir"
    );
    let read = |name: &str| std::fs::read_to_string(spec.checkpoint_dir.join(name)).unwrap();
    assert_eq!(read("uid").trim(), nobody.uid.to_string());
    assert_eq!(read("groups").trim(), nobody.gid.to_string());
    assert_eq!(read("home").trim(), "written");
    let owner = std::fs::metadata(&spec.work_dir).unwrap();
    assert_eq!((owner.uid(), owner.gid()), (nobody.uid, nobody.gid));
    let owner = std::fs::metadata(&spec.checkpoint_dir).unwrap();
    assert_eq!(owner.uid(), nobody.uid);
}

/// With `--job-user per-job`, each job runs as a uid of its own (the same one on every
/// attempt), and another job on the node can neither read its working dir, checkpoint dir or
/// log nor change the exit code recorded for it.
#[tokio::test]
async fn with_a_uid_per_job_jobs_cannot_reach_each_other() {
    use quotient_agent::runtime::{JobUser, PER_JOB_UID_FIRST};
    if !root_or_skip("with_a_uid_per_job_jobs_cannot_reach_each_other") {
        return;
    }
    let state = open_state_dir();
    let runtime = ProcessRuntime::new(state.path()).with_job_user(JobUser::per_job());
    let victim = launch(
        state.path(),
        72,
        1,
        None,
        shell(
            r#"echo secret > "$QUOTIENT_CHECKPOINT_DIR/kept"; echo secret > "$HOME/scratch"; echo secret; id -u > "$QUOTIENT_CHECKPOINT_DIR/uid"; exit 3"#,
        ),
    );
    let handle = runtime.start(&victim).await.unwrap();
    assert_eq!(
        runtime.wait(&handle, WAIT_DEADLINE).await.unwrap(),
        Some(Some(3))
    );
    let kept = std::fs::read_to_string(victim.checkpoint_dir.join("uid")).unwrap();
    assert_eq!(kept.trim(), (PER_JOB_UID_FIRST + 72).to_string());

    let victims_exit = state.path().join("jobs").join("j-72-1.exit");
    let script = format!(
        r#"id -u > "$QUOTIENT_CHECKPOINT_DIR/uid"
try() {{ if "$@" >/dev/null 2>&1; then echo "$1 $2: allowed"; else echo "$1 $2: denied"; fi; }}
{{ try cat {kept}; try cat {scratch}; try cat {log}; try ls {checkpoints};
   try sh -c 'echo 0 > {exit}'; }} > "$QUOTIENT_CHECKPOINT_DIR/tries""#,
        kept = victim.checkpoint_dir.join("kept").display(),
        scratch = victim.work_dir.join("scratch").display(),
        log = victim.log_path.display(),
        checkpoints = victim.checkpoint_dir.display(),
        exit = victims_exit.display(),
    );
    let snoop = launch(state.path(), 71, 1, None, shell(&script));
    let handle = runtime.start(&snoop).await.unwrap();
    assert_eq!(
        runtime.wait(&handle, WAIT_DEADLINE).await.unwrap(),
        Some(Some(0))
    );
    let read = |name: &str| std::fs::read_to_string(snoop.checkpoint_dir.join(name)).unwrap();
    assert_eq!(read("uid").trim(), (PER_JOB_UID_FIRST + 71).to_string());
    let tries = read("tries");
    assert_eq!(tries.matches("denied").count(), 5, "{tries}");
    assert_eq!(std::fs::read_to_string(&victims_exit).unwrap().trim(), "3");
}

fn agent(args: &[&str]) -> std::process::Output {
    let state = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_quotient-agent"))
        .args([
            "--name",
            "node-1",
            "--coordinators",
            "127.0.0.1:1",
            "--ca",
            "/nonexistent/ca.pem",
            "--cert",
            "/nonexistent/node-1.pem",
            "--key",
            "/nonexistent/node-1-key.pem",
            "--simulated-gpus",
            "1xa10g",
            "--state-dir",
        ])
        .arg(state.path())
        .args(args)
        .env_remove("QUOTIENT_AGENT_JOB_USER")
        .env_remove("QUOTIENT_AGENT_ALLOW_ROOT_JOBS")
        .output()
        .expect("run quotient-agent")
}

/// An agent running as root refuses to start unless told who jobs run as, and says how; with
/// either flag it gets past that check (to the certificate, which these tests lack).
#[test]
fn a_root_agent_refuses_to_start_without_a_job_user() {
    if !root_or_skip("a_root_agent_refuses_to_start_without_a_job_user") {
        return;
    }
    let output = agent(&[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("--job-user USER") && stderr.contains("--allow-root-jobs"),
        "{stderr}"
    );
    for flags in [&["--job-user", "nobody"][..], &["--allow-root-jobs"][..]] {
        let output = agent(flags);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "no certificate: {stderr}");
        assert!(!stderr.contains("--job-user USER"), "{flags:?}: {stderr}");
        assert!(stderr.contains("/nonexistent/"), "{flags:?}: {stderr}");
    }
    let output = agent(&["--job-user", "no-such-user-quotient"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no such user") && stderr.contains("no-such-user-quotient"),
        "{stderr}"
    );
}
