//! Backup and restore through real processes: `quotient cluster backup` from a running
//! cluster, every data directory lost, `quotient-coordinator restore` of each member from the
//! one file, and the restored cluster serving the state of the backup.

use std::process::Command;

use quotient_tests::{binaries, DevCluster};
use serde_json::Value;

/// `quotient-coordinator restore --from BACKUP --data-dir DATA_DIR --id ID --peers PEERS`;
/// its output.
fn restore(backup: &str, data_dir: &str, id: &str, peers: &str) -> std::process::Output {
    Command::new(binaries().join("quotient-coordinator"))
        .args([
            "restore",
            "--from",
            backup,
            "--data-dir",
            data_dir,
            "--id",
            id,
        ])
        .args(["--peers", peers])
        .output()
        .expect("quotient-coordinator runs")
}

fn job_names(cluster: &DevCluster) -> Vec<(String, String)> {
    let mut jobs: Vec<(String, String)> = cluster
        .jobs(&[])
        .iter()
        .map(|job| {
            (
                job["id"].as_str().unwrap_or_default().to_string(),
                job["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    jobs.sort();
    jobs
}

#[test]
fn a_cluster_restored_from_a_backup_serves_the_backups_state() {
    // Proves backup and restore end to end: what was committed before the backup comes back
    // (shares, queued and cancelled jobs, the cluster id), what came after it does not, the
    // restored members elect a leader without `cluster init` and take writes; and restore
    // refuses a data directory in use, a file that is no backup, an endless device and a
    // damaged backup; backup refuses an `--out` that is a directory.
    let cluster = DevCluster::up(&["--nodes", "0"]);
    cluster.create_share("team", 2, "lend", &[]);
    let queued = cluster.submit("team", &["--name", "queued"], &["sleep", "100"]);
    let cancelled = cluster.submit("team", &["--name", "cancelled"], &["sleep", "100"]);
    cluster.ok(&["job", "cancel", &cancelled]);
    let before = job_names(&cluster);
    let status = cluster.json(&["cluster", "status", "-o", "json"]);
    let cluster_id = status["cluster_id"]
        .as_str()
        .expect("a cluster id")
        .to_string();

    let backup = cluster.root.path().join("state.qbackup");
    let backup_text = backup.display().to_string();
    let written: Value = serde_json::from_str(&cluster.ok(&[
        "cluster",
        "backup",
        "--out",
        &backup_text,
        "-o",
        "json",
    ]))
    .expect("backup prints JSON");
    assert_eq!(written["cluster"], cluster_id.as_str(), "{written}");
    assert!(written["bytes"].as_u64().unwrap_or(0) > 0, "{written}");
    // An `--out` that is a directory is refused before anything is written, and a file
    // beside the backup that happens to be named like its partial file is left alone.
    let into_dir = cluster.run(&[
        "cluster",
        "backup",
        "--out",
        &cluster.root.path().display().to_string(),
    ]);
    assert_eq!(into_dir.status.code(), Some(2), "{into_dir:?}");
    let beside = cluster.root.path().join("state.partial");
    std::fs::write(&beside, b"not ours").expect("a file");
    cluster.ok(&["cluster", "backup", "--out", &backup_text]);
    assert_eq!(std::fs::read(&beside).expect("still there"), b"not ours");
    let after_backup = cluster.submit("team", &["--name", "after"], &["sleep", "100"]);

    let file = cluster.cluster_file();
    let members = file["coordinators"]
        .as_array()
        .expect("coordinators")
        .clone();
    let peers = members
        .iter()
        .map(|entry| {
            format!(
                "{}={}",
                entry["id"],
                entry["address"].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let data_dir = |entry: &Value| entry["data_dir"].as_str().expect("a data dir").to_string();

    let in_use = restore(&backup_text, &data_dir(&members[0]), "1", &peers);
    assert!(!in_use.status.success());
    let said = String::from_utf8_lossy(&in_use.stderr);
    assert!(
        said.contains("already holds a coordinator's data"),
        "{said}"
    );

    let dir = cluster.dir.display().to_string();
    cluster.ok(&["dev", "down", "--dir", &dir]);
    for entry in &members {
        let data = data_dir(entry);
        std::fs::rename(&data, format!("{data}.lost")).expect("the data directory moves away");
    }
    let not_a_backup = cluster.root.path().join("nothing");
    std::fs::write(&not_a_backup, b"QSNAP002 is not a backup").expect("a file");
    let not_a_backup = not_a_backup.display().to_string();
    let refused = restore(&not_a_backup, &data_dir(&members[0]), "1", &peers);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("not a Quotient backup"), "{said}");
    // A device that never ends is refused on its first bytes, not read into memory.
    let endless = restore("/dev/zero", &data_dir(&members[0]), "1", &peers);
    assert!(!endless.status.success());
    let said = String::from_utf8_lossy(&endless.stderr);
    assert!(said.contains("not a Quotient backup"), "{said}");
    // One byte changed inside the state (a job's priority, say) is caught by the checksum.
    let mut damaged = std::fs::read(&backup).expect("the backup");
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x10;
    let damaged_path = cluster.root.path().join("damaged.qbackup");
    std::fs::write(&damaged_path, &damaged).expect("a file");
    let refused = restore(
        &damaged_path.display().to_string(),
        &data_dir(&members[0]),
        "1",
        &peers,
    );
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("damaged"), "{said}");

    for entry in &members {
        let id = entry["id"].to_string();
        let output = restore(&backup_text, &data_dir(entry), &id, &peers);
        assert!(
            output.status.success(),
            "restore of member {id}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    cluster.ok(&["dev", "up", "--dir", &dir, "--nodes", "0"]);
    let status = cluster.json(&["cluster", "status", "-o", "json"]);
    assert_eq!(status["cluster_id"], cluster_id.as_str(), "{status}");
    assert_eq!(
        job_names(&cluster),
        before,
        "the jobs of the backup, none after"
    );
    assert!(cluster.run(&["job", "get", &after_backup]).status.code() != Some(0));
    let share = cluster.json(&["share", "get", "team", "-o", "json"]);
    assert_eq!(share["limits"]["a10g"], 2, "{share}");
    let new = cluster.submit("team", &["--name", "new"], &["sleep", "100"]);
    let job = cluster.json(&["job", "get", &new, "-o", "json"]);
    assert_eq!(job["state"], "RUNNABLE", "{job}");
    assert!(before
        .iter()
        .any(|(id, state)| *id == queued && state == "RUNNABLE"));
}
