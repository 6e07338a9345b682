//! Jobs of several nodes through real processes (one coordinator, one-GPU agents, the CLI):
//! members that really rendezvous, all or nothing while capacity is short, reclaim that stops
//! every member, a node lost under one member, and `--same rack`.

use std::path::Path;
use std::time::Duration;

use quotient_tests::{binaries, poll_until, DevCluster};
use serde_json::Value;

/// How long a change may take to settle (placement, signal, exit, report, placement).
const SETTLE: Duration = Duration::from_secs(90);

fn job(cluster: &DevCluster, id: &str) -> Value {
    cluster.json(&["job", "get", id, "-o", "json"])
}

/// The nodes of a job's current placement, in rank order.
fn placement(view: &Value) -> Vec<String> {
    view["placement"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["node"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A shared folder every member (whatever user it runs as) may write in.
fn shared_dir(cluster: &DevCluster) -> String {
    let dir = cluster.root.path().join("shared");
    std::fs::create_dir_all(&dir).expect("the shared folder");
    let mut permissions = std::fs::metadata(&dir).expect("the folder").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o777);
    std::fs::set_permissions(&dir, permissions).expect("the folder is writable by all");
    dir.display().to_string()
}

/// A member that says it runs, records its pid as `$DIR/alive-ATTEMPT-RANK` (first noting in
/// `$DIR/overlap` any member of another attempt still alive), and on SIGTERM says so and
/// exits 0.
const MEMBER: &str = r#"
for f in "$DIR"/alive-*; do
  [ -e "$f" ] || continue
  case "$f" in *"alive-$QUOTIENT_ATTEMPT-"*) continue ;; esac
  if kill -0 "$(cat "$f")" 2>/dev/null; then echo "$f" >> "$DIR/overlap"; fi
done
echo $$ > "$DIR/alive-$QUOTIENT_ATTEMPT-$QUOTIENT_NODE_RANK"
trap 'echo "rank $QUOTIENT_NODE_RANK got SIGTERM"; rm -f "$DIR/alive-$QUOTIENT_ATTEMPT-$QUOTIENT_NODE_RANK"; exit 0' TERM
echo "rank $QUOTIENT_NODE_RANK of $QUOTIENT_NUM_NODES running at $MASTER_ADDR:$MASTER_PORT"
while true; do sleep 0.2; done
"#;

fn logs(cluster: &DevCluster, id: &str, rank: u32) -> String {
    let rank = rank.to_string();
    cluster.ok(&["job", "logs", id, "--rank", &rank])
}

fn attempt_logs(cluster: &DevCluster, id: &str, attempt: u32, rank: u32) -> String {
    let (attempt, rank) = (attempt.to_string(), rank.to_string());
    cluster.ok(&["job", "logs", id, "--attempt", &attempt, "--rank", &rank])
}

fn wait_logs(cluster: &DevCluster, id: &str, rank: u32, needle: &str) -> String {
    poll_until(
        &format!("{id} rank {rank} to log {needle:?}"),
        SETTLE,
        || {
            let text = logs(cluster, id, rank);
            if text.contains(needle) {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
}

#[test]
fn a_two_node_job_rendezvouses_on_one_rack_and_succeeds() {
    // Proves the rendezvous: rank 0 listens on MASTER_PORT, rank 1 connects to MASTER_ADDR
    // and both see each other; `--same rack` keeps both members on one rack of two; the job
    // SUCCEEDS once both exit 0, and each rank's log is read with --rank.
    let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "4", "--racks", "2"]);
    cluster.create_share("team", 4, "lend", &[]);
    let check = binaries().join("quotient-rendezvous-check");
    assert!(
        check.is_file(),
        "{} is built with the tests",
        check.display()
    );
    let check = check.display().to_string();
    let id = cluster.submit("team", &["--nodes", "2", "--same", "rack"], &[&check]);
    let view = cluster.wait_for_state(&id, "SUCCEEDED", SETTLE);
    assert_eq!(view["node_count"], 2);
    let nodes: Vec<String> = view["attempt_history"][0]["nodes"]
        .as_array()
        .expect("the attempt's nodes")
        .iter()
        .map(|n| n.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(nodes.len(), 2, "{view}");
    let rack = |name: &str| {
        cluster.node(name).expect("a known node")["labels"]["rack"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(rack(&nodes[0]), rack(&nodes[1]), "--same rack: {nodes:?}");
    let rank0 = logs(&cluster, &id, 0);
    assert!(rank0.contains("rank 0 of 2: met ranks [1]"), "{rank0}");
    let rank1 = logs(&cluster, &id, 1);
    assert!(rank1.contains("rank 1 of 2: rank 0 at"), "{rank1}");
    assert!(rank1.contains("answered met [1]"), "{rank1}");
    let table = cluster.ok(&["job", "list"]);
    assert!(table.contains("2x(1xa10g)"), "{table}");
    let bad = cluster.run(&["job", "logs", &id, "--rank", "2"]);
    assert!(!bad.status.success(), "a rank the job does not have");
}

#[test]
fn a_gang_waits_whole_and_reclaim_stops_every_member() {
    // Proves all or nothing: with one node free, a job of two nodes waits and no member of
    // it starts; and reclaim as a unit: a job of two nodes within its share's limit takes
    // back the quota a borrowing job of three nodes holds, which is one victim: every member
    // gets its checkpoint signal, and it goes back to the queue.
    let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "4"]);
    cluster.create_share("team", 1, "lend-and-borrow", &["--borrow-limit", "400"]);
    cluster.create_share("prod", 3, "lend", &[]);
    let dir = shared_dir(&cluster);
    let env = format!("DIR={dir}");
    let gang = cluster.submit(
        "team",
        &["--nodes", "3", "--env", &env, "--grace-period", "10s"],
        &["sh", "-c", MEMBER],
    );
    let view = cluster.wait_for_state(&gang, "RUNNING", SETTLE);
    assert_eq!(placement(&view).len(), 3);
    for rank in 0..3 {
        wait_logs(&cluster, &gang, rank, "running at");
    }
    let waiting = cluster.submit(
        "team",
        &["--nodes", "2", "--env", &env],
        &["sh", "-c", MEMBER],
    );
    poll_until("the second gang's reason", SETTLE, || {
        let view = job(&cluster, &waiting);
        if view["reason"].is_string() {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    });
    std::thread::sleep(Duration::from_secs(2));
    let view = job(&cluster, &waiting);
    assert_eq!(view["state"], "RUNNABLE", "{view}");
    assert!(placement(&view).is_empty(), "no member of it was placed");
    cluster.ok(&["job", "cancel", &waiting]);
    // prod's job of two nodes finds one node free and reclaims the borrowing gang whole.
    let ddp = cluster.submit("prod", &["--nodes", "2"], &["sleep", "600"]);
    for rank in 0..3 {
        wait_logs(&cluster, &gang, rank, &format!("rank {rank} got SIGTERM"));
    }
    let view = cluster.wait_for_state(&ddp, "RUNNING", SETTLE);
    assert_eq!(placement(&view).len(), 2);
    let view = poll_until("the gang back in the queue", SETTLE, || {
        let view = job(&cluster, &gang);
        if view["state"] == "RUNNABLE" {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    });
    assert_eq!(view["last_preemption"], "reclaim");
    assert_eq!(
        view["attempt_history"][0]["outcome"],
        format!("preempted (reclaim) for {ddp}")
    );
    assert!(!Path::new(&dir).join("overlap").exists());
}

#[test]
fn a_node_lost_under_one_member_stops_the_attempt_and_it_runs_again_elsewhere() {
    // Proves one fate: the host of rank 1 dies (its agent and its member are killed); once
    // its node is lost, rank 0 gets its checkpoint signal, the job goes back to the queue and
    // runs again as attempt 2 on the nodes left, and no member of attempt 2 started while a
    // member of attempt 1 was alive.
    let cluster = DevCluster::up(&["--coordinators", "1", "--nodes", "3"]);
    cluster.create_share("team", 2, "lend", &[]);
    let dir = shared_dir(&cluster);
    let env = format!("DIR={dir}");
    let id = cluster.submit(
        "team",
        &["--nodes", "2", "--env", &env, "--grace-period", "2s"],
        &["sh", "-c", MEMBER],
    );
    let view = cluster.wait_for_state(&id, "RUNNING", SETTLE);
    let nodes = placement(&view);
    wait_logs(&cluster, &id, 1, "running at");
    let member_pid: libc::pid_t = std::fs::read_to_string(Path::new(&dir).join("alive-1-1"))
        .expect("rank 1 recorded its pid")
        .trim()
        .parse()
        .expect("a pid");
    let agent = cluster.agent_pid(&nodes[1]);
    eprintln!("--- the host of rank 1 ({}) dies", nodes[1]);
    // SAFETY: kill(2) on processes this test's cluster started: the agent, and the member's
    // process group (the process runtime starts each job in a group of its own).
    unsafe {
        libc::kill(agent, libc::SIGKILL);
        libc::kill(-member_pid, libc::SIGKILL);
    }
    let view = poll_until("attempt 2 running", SETTLE, || {
        let view = job(&cluster, &id);
        if view["state"] == "RUNNING" && view["attempts"] == 2 {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    });
    let again = placement(&view);
    assert_eq!(again.len(), 2);
    assert!(
        !again.contains(&nodes[1]),
        "not on the lost node: {again:?}"
    );
    assert_eq!(
        view["attempt_history"][0]["outcome"], "preempted (node-lost)",
        "{view}"
    );
    let rank0 = attempt_logs(&cluster, &id, 1, 0);
    assert!(rank0.contains("rank 0 got SIGTERM"), "{rank0}");
    assert!(
        !Path::new(&dir).join("overlap").exists(),
        "a member of attempt 2 started while one of attempt 1 was alive"
    );
}
