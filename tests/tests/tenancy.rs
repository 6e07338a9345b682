//! Who may do what, through real processes with real certificates (docs/tenancy.md): a
//! share's member submits and a non-member is refused with nothing written; another user
//! cannot cancel, update or read the logs of the owner's job, an admin can; the per-user cap
//! refuses the extra submit; a revoked user and admin are refused by every coordinator, one
//! of them down when the revocation was committed, and a revoked agent's node is lost and
//! stays so; a certificate revoked by its serial is refused while the next one of the same
//! name works; the audit log shows each of these; two users' submits with one idempotency
//! key make a job each.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use quotient_tests::{binaries, poll_until, DevCluster};
use serde_json::Value;

const SETTLE: Duration = Duration::from_secs(60);

fn run_as(config: &Path, arguments: &[&str]) -> Output {
    Command::new(binaries().join("quotient"))
        .args(arguments)
        .env("QUOTIENT_CONFIG", config)
        .output()
        .expect("the quotient binary runs")
}

fn ok_as(config: &Path, arguments: &[&str]) -> String {
    let output = run_as(config, arguments);
    assert!(
        output.status.success(),
        "{arguments:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Runs a command that must be refused for lack of rights: exit status and code.
fn forbidden(config: &Path, arguments: &[&str]) -> String {
    let output = run_as(config, arguments);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success(), "{arguments:?} was not refused");
    assert!(
        stderr.contains("error[Forbidden]"),
        "{arguments:?}: {stderr}"
    );
    stderr
}

fn coordinators(cluster: &DevCluster) -> Vec<(u64, i64, String)> {
    let file = std::fs::read_to_string(cluster.dir.join("cluster.json")).expect("cluster.json");
    let file: Value = serde_json::from_str(&file).expect("cluster.json is JSON");
    file["coordinators"]
        .as_array()
        .expect("coordinators")
        .iter()
        .map(|c| {
            (
                c["id"].as_u64().unwrap_or(0),
                c["pid"].as_i64().unwrap_or(0),
                c["address"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn members_owners_caps_revocation_and_the_audit_log() {
    let cluster = DevCluster::up(&["--coordinators", "3", "--nodes", "2"]);
    let admin = cluster.config.clone();
    let alice = cluster.identity("user", "alice", &[]);
    let bob = cluster.identity("user", "bob", &[]);
    let ops = cluster.identity("admin", "ops", &[]);
    cluster.create_share(
        "vision",
        2,
        "lend",
        &["--member", "alice", "--max-jobs-per-user", "2"],
    );
    cluster.create_share("open", 2, "lend", &[]);
    let share = cluster.json(&["share", "get", "vision", "-o", "json"]);
    assert_eq!(share["members"], serde_json::json!(["alice"]));
    assert_eq!(share["open"], false);
    assert_eq!(
        cluster.json(&["share", "get", "open", "-o", "json"])["open"],
        true
    );

    eprintln!("--- a member submits; a non-member is refused and nothing is written");
    let submit = [
        "job",
        "submit",
        "--share",
        "vision",
        "--gpus",
        "1",
        "--grace-period",
        "1s",
        "--",
        "sleep",
        "600",
    ];
    let job = ok_as(&alice, &submit);
    let view = cluster.wait_for_state(&job, "RUNNING", SETTLE);
    assert_eq!(view["owner"], "alice");
    let before = cluster.json(&["job", "list", "-o", "json"]);
    let refused = forbidden(&bob, &submit);
    assert!(
        refused.contains("not a member of share vision"),
        "{refused}"
    );
    assert_eq!(
        cluster.json(&["job", "list", "-o", "json"]),
        before,
        "nothing written"
    );
    // A user sees the jobs of the shares they may use: bob none of vision's.
    let bobs_view = ok_as(&bob, &["job", "list", "-o", "json"]);
    let bobs_view: Value = serde_json::from_str(&bobs_view).expect("JSON");
    assert_eq!(bobs_view["jobs"], serde_json::json!([]));
    let bob_job = ok_as(
        &bob,
        &[
            "job", "submit", "--share", "open", "--gpus", "1", "--", "true",
        ],
    );
    let mine = ok_as(&bob, &["job", "list", "--mine", "-o", "json"]);
    assert!(mine.contains(&bob_job), "{mine}");

    eprintln!("--- an idempotency key is its user's own: the same key makes each user a job");
    let keyed = |config: &Path| {
        ok_as(
            config,
            &[
                "job",
                "submit",
                "--share",
                "open",
                "--gpus",
                "1",
                "--idempotency-key",
                "nightly-1",
                "--",
                "true",
            ],
        )
    };
    let alices = keyed(&alice);
    let bobs = keyed(&bob);
    assert_ne!(alices, bobs, "bob was answered with alice's job");
    assert_eq!(keyed(&alice), alices, "alice's resend made another job");
    assert_eq!(keyed(&bob), bobs, "bob's resend made another job");
    let bobs_view = cluster.json(&["job", "get", &bobs, "-o", "json"]);
    assert_eq!(bobs_view["owner"], "bob");

    eprintln!("--- another user may not cancel, update or read the owner's job; an admin may");
    forbidden(&bob, &["job", "cancel", &job]);
    forbidden(&bob, &["job", "update", &job, "--priority", "5"]);
    forbidden(&bob, &["job", "logs", &job]);
    // Nor read it: vision is not his share (job list showed him none of its jobs).
    forbidden(&bob, &["job", "get", &job]);
    forbidden(&bob, &["job", "explain", &job]);
    ok_as(&alice, &["job", "get", &job]);
    ok_as(&bob, &["job", "get", &bob_job]);
    ok_as(&alice, &["job", "update", &job, "--priority", "3"]);
    ok_as(&admin, &["job", "update", &job, "--priority", "4"]);
    ok_as(&admin, &["job", "logs", &job]);
    ok_as(&alice, &["job", "logs", &job]);

    eprintln!("--- the per-user cap refuses alice's third job");
    ok_as(&alice, &submit);
    let third = run_as(&alice, &submit);
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(!third.status.success());
    assert!(stderr.contains("error[LimitExceeded]"), "{stderr}");
    assert!(stderr.contains("already has 2 jobs"), "{stderr}");

    eprintln!("--- a coordinator is down while bob, ops and node-2 are revoked");
    ok_as(&ops, &["share", "list"]);
    let status = cluster.json(&["cluster", "status", "-o", "json"]);
    let leader = status["leader"].as_u64().expect("a leader");
    let all = coordinators(&cluster);
    let (down_id, down_pid, _) = all
        .iter()
        .find(|(id, _, _)| *id != leader)
        .cloned()
        .expect("a follower");
    // SAFETY: kill(2) on a coordinator this cluster started.
    unsafe {
        libc::kill(down_pid as libc::pid_t, libc::SIGKILL);
    }
    for name in ["bob", "ops"] {
        ok_as(&admin, &["certs", "revoke", "--name", name]);
    }
    eprintln!("--- coordinator {down_id} starts again and catches up; node-2 is revoked");
    cluster.ok(&["dev", "up", "--dir", &cluster.dir.display().to_string()]);
    cluster.wait_healthy(SETTLE);
    ok_as(&admin, &["certs", "revoke", "--name", "node-2"]);
    let revoked = ok_as(&admin, &["certs", "revoked", "-o", "json"]);
    for name in ["bob", "ops", "node-2"] {
        assert!(revoked.contains(&format!("\"{name}\"")), "{revoked}");
    }
    for (id, _, address) in coordinators(&cluster) {
        let only = [address.clone()];
        for (role, name) in [("user", "bob"), ("admin", "ops")] {
            let config = cluster.identity(role, name, &only);
            let stderr = poll_until(
                &format!("{name} refused by coordinator {id}"),
                SETTLE,
                || {
                    let output = run_as(&config, &["share", "list"]);
                    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
                    if !output.status.success() && stderr.contains("revoked") {
                        Ok(stderr)
                    } else {
                        Err(stderr)
                    }
                },
            );
            assert!(stderr.contains("error[Forbidden]"), "{stderr}");
        }
    }
    // Cordoned at once; lost once its lease runs out (its agent is refused from now on).
    let node = poll_until("node-2 lost", SETTLE, || match cluster.node("node-2") {
        Some(view) if view["state"] == "lost" => Ok(view),
        other => Err(format!("{other:?}")),
    });
    assert_eq!(node["state"], "lost");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        cluster.node("node-2").expect("node-2")["state"],
        "lost",
        "a revoked agent cannot register its node again"
    );
    // alice is not revoked.
    ok_as(&alice, &["job", "list"]);

    eprintln!("--- one certificate of carol's is revoked by its serial; her next one works");
    let carol = cluster.identity("user", "carol", &[]);
    ok_as(&carol, &["share", "list"]);
    let certs = cluster.dir.join("certs");
    let serial = quotient_common::certs::certificate_facts(&certs.join("carol.pem"))
        .expect("carol's certificate")
        .serial;
    ok_as(
        &admin,
        &["certs", "revoke", "--name", "carol", "--serial", &serial],
    );
    let revoked = ok_as(&admin, &["certs", "revoked", "-o", "json"]);
    assert!(revoked.contains(&format!("\"{serial}\"")), "{revoked}");
    for (id, _, address) in coordinators(&cluster) {
        let config = cluster.identity("user", "carol", &[address]);
        poll_until(
            &format!("carol refused by coordinator {id}"),
            SETTLE,
            || {
                let output = run_as(&config, &["share", "list"]);
                let stderr = String::from_utf8_lossy(&output.stderr).to_string();
                if !output.status.success() && stderr.contains("revoked") {
                    Ok(())
                } else {
                    Err(stderr)
                }
            },
        );
    }
    // A new key, so a new serial: she is herself again, on every coordinator, and her writes
    // through a follower (forwarded to the leader, which checks the name only) go through.
    std::fs::remove_file(certs.join("carol.pem")).expect("remove the old certificate");
    std::fs::remove_file(certs.join("carol-key.pem")).expect("remove the old key");
    let renewed = cluster.identity("user", "carol", &[]);
    let new_serial = quotient_common::certs::certificate_facts(&certs.join("carol.pem"))
        .expect("carol's new certificate")
        .serial;
    assert_ne!(new_serial, serial);
    ok_as(&renewed, &["share", "list"]);
    for (id, _, address) in coordinators(&cluster) {
        let config = cluster.identity("user", "carol", &[address]);
        let submitted = run_as(
            &config,
            &[
                "job", "submit", "--share", "open", "--gpus", "1", "--", "true",
            ],
        );
        assert!(
            submitted.status.success(),
            "carol's new certificate through coordinator {id}: {}",
            String::from_utf8_lossy(&submitted.stderr)
        );
    }

    eprintln!("--- the audit log shows each of these");
    let audit = cluster.json(&["audit", "-o", "json"]);
    let entries = audit.as_array().expect("entries");
    let has = |who: &str, action: &str, outcome: &str| {
        entries.iter().any(|e| {
            e["who"] == who
                && e["action"].as_str().is_some_and(|a| a.starts_with(action))
                && e["outcome"]
                    .as_str()
                    .is_some_and(|o| o.starts_with(outcome))
        })
    };
    assert!(
        has("quotient://admin/admin", "share create vision", "ok"),
        "{audit}"
    );
    assert!(
        has(
            "quotient://user/bob",
            "job submit to share vision",
            "refused"
        ),
        "{audit}"
    );
    assert!(
        has(
            "quotient://user/bob",
            &format!("job cancel {job}"),
            "refused"
        ),
        "{audit}"
    );
    assert!(
        has("quotient://user/bob", &format!("job logs {job}"), "refused"),
        "{audit}"
    );
    assert!(
        has("quotient://user/bob", &format!("job get {job}"), "refused"),
        "{audit}"
    );
    assert!(
        has("quotient://admin/admin", "certs revoke bob", "ok"),
        "{audit}"
    );
    let bobs = cluster.json(&["audit", "--user", "bob", "-o", "json"]);
    assert!(bobs
        .as_array()
        .expect("entries")
        .iter()
        .all(|e| e["who"] == "quotient://user/bob"));
}
