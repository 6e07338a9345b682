//! `quotient events` through real processes: `--follow` prints each event as it happens, in
//! order, as one JSON line; `--job` keeps one job's; `job get` shows the job's last events; a
//! user reads the events of the shares they may use, not of others' jobs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use quotient_tests::{binaries, DevCluster};
use serde_json::Value;

const SETTLE: Duration = Duration::from_secs(60);

#[test]
fn events_follow_what_happens_and_each_reader_sees_what_it_may() {
    let cluster = DevCluster::one_gpu();
    cluster.create_share("private", 1, "lend", &["--member", "carol"]);

    // `events --follow -o json` from before anything of the job happens.
    let mut follow = Command::new(binaries().join("quotient"))
        .args(["events", "--follow", "-o", "json", "--share", "team"])
        .env("QUOTIENT_CONFIG", &cluster.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("quotient events runs");
    let stdout = follow.stdout.take().expect("its stdout");
    let (lines, received) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let event: Value = serde_json::from_str(&line).expect("one JSON event per line");
            if lines.send(event).is_err() {
                return;
            }
        }
    });

    let job = cluster.submit("team", &["--name", "sleeper"], &["sleep", "300"]);
    cluster.wait_for_state(&job, "RUNNING", SETTLE);
    cluster.ok(&["job", "cancel", &job]);
    cluster.wait_for_state(&job, "CANCELLED", SETTLE);

    // The share's events of the job, in order, ending with its cancel.
    let mut seen: Vec<Value> = Vec::new();
    while !seen
        .iter()
        .any(|event| event["to"] == "CANCELLED" && event["job"] == job.as_str())
    {
        match received.recv_timeout(SETTLE) {
            Ok(event) => seen.push(event),
            Err(_) => panic!("no CANCELLED event followed; saw {seen:#?}"),
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let of_job: Vec<String> = seen
        .iter()
        .filter(|event| event["job"] == job.as_str())
        .map(|event| match event["kind"].as_str() {
            Some("job-state") => format!("{}->{}", event["from"], event["to"]).replace('"', ""),
            other => other.unwrap_or_default().to_string(),
        })
        .collect();
    assert_eq!(of_job[0], "job-submitted", "{of_job:?}");
    assert!(
        of_job.contains(&"STARTING->RUNNING".to_string()),
        "{of_job:?}"
    );
    // A running job cancelled gets its stop signal (PREEMPTING), then ends when it exits.
    assert_eq!(
        of_job[of_job.len() - 2..],
        [
            "RUNNING->PREEMPTING".to_string(),
            "PREEMPTING->CANCELLED".to_string()
        ],
        "{of_job:?}"
    );
    assert!(seen
        .windows(2)
        .all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64()));
    assert!(
        seen.iter().all(|event| event["share"] == "team"),
        "{seen:#?}"
    );
    let stopped = seen
        .iter()
        .find(|event| event["to"] == "PREEMPTING")
        .expect("seen");
    assert_eq!(stopped["by"], "admin", "{stopped}");

    // `job get` shows the job's last events.
    let view = cluster.json(&["job", "get", &job, "-o", "json"]);
    let events = view["events"].as_array().expect("events in job get");
    assert_eq!(
        events.last().map(|e| &e["to"]),
        Some(&Value::from("CANCELLED"))
    );
    let text = cluster.ok(&["job", "get", &job]);
    assert!(text.contains("events:"), "{text}");

    // Another user's job in a share carol may not use: her events leave it out, the share
    // itself and the node stay; the admin sees it.
    let private = cluster.submit("private", &["--name", "secret"], &["sleep", "1"]);
    let carol = cluster.identity("user", "carol", &[]);
    let dave = cluster.identity("user", "dave", &[]);
    let read_as = |config: &std::path::Path| -> Vec<Value> {
        let output = Command::new(binaries().join("quotient"))
            .args(["events", "-o", "json"])
            .env("QUOTIENT_CONFIG", config)
            .output()
            .expect("quotient events runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice::<Value>(&output.stdout)
            .expect("a JSON array")
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let mentions = |events: &[Value], id: &str| events.iter().any(|e| e["job"] == id);
    assert!(mentions(&read_as(&carol), &private));
    let dave_sees = read_as(&dave);
    assert!(!mentions(&dave_sees, &private), "{dave_sees:#?}");
    assert!(dave_sees
        .iter()
        .any(|e| e["kind"] == "share" && e["share"] == "private"));
    assert!(dave_sees.iter().any(|e| e["kind"] == "node"));
    let admin = cluster.json(&["events", "--job", &private, "-o", "json"]);
    assert!(mentions(admin.as_array().expect("an array"), &private));

    // A job, share or node that nothing knows is an error that names it, not an empty list.
    for (flag, name, said) in [
        ("--job", "j-999", "no job j-999"),
        ("--share", "nope", "no share named nope"),
        ("--node", "nowhere", "no node named nowhere"),
    ] {
        let out = cluster.run(&["events", flag, name]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {name}: {stderr}");
        assert!(
            stderr.contains("NotFound") && stderr.contains(said),
            "{stderr}"
        );
    }
}
