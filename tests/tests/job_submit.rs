//! `quotient job submit`'s defaults through real processes (three coordinators, one agent):
//! a job submitted without `--priority` has priority 0, and one without `--name` gets a name
//! the leader generates once, which every replica then holds.

use std::time::Duration;

use quotient_tests::DevCluster;
use serde_json::Value;

/// How long the replicas may take to apply the same entries.
const SETTLE: Duration = Duration::from_secs(30);

/// Whether `name` is `STEM-` and five characters of the suffix alphabet.
fn is_generated(name: &str, stem: &str) -> bool {
    let alphabet = quotient_common::job_name::SUFFIX_ALPHABET;
    name.strip_prefix(stem)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|suffix| {
            suffix.len() == quotient_common::job_name::SUFFIX_CHARS
                && suffix.bytes().all(|byte| alphabet.contains(&byte))
        })
}

/// Without `--priority` and `--name`, a job gets priority 0 and a generated name, in `job get`
/// and `job list`; a resend with the same idempotency key keeps the first name; every
/// coordinator holds the same state (the name was made once, not by each replica).
#[test]
fn a_job_submitted_without_priority_or_name_gets_priority_0_and_a_generated_name() {
    let cluster = DevCluster::up(&["--coordinators", "3", "--nodes", "1"]);
    cluster.create_share("team", 1, "lend", &[]);
    let script = cluster.root.path().join("train.sh");
    std::fs::write(&script, "exit 0\n").expect("the script is written");
    let script = script.display().to_string();
    let submit = |extra: &[&str]| {
        let mut arguments = vec!["job", "submit", "--share", "team", "--gpus", "1"];
        arguments.extend_from_slice(extra);
        arguments.extend_from_slice(&["--", "sh", &script]);
        cluster.ok(&arguments).trim().to_string()
    };

    let first = submit(&[]);
    let view = cluster.json(&["job", "get", &first, "-o", "json"]);
    assert_eq!(view["priority"], 0, "{view}");
    let first_name = view["name"].as_str().unwrap_or_default().to_string();
    assert!(is_generated(&first_name, "train"), "{view}");

    let second = submit(&[]);
    let second_name = cluster.json(&["job", "get", &second, "-o", "json"])["name"].clone();
    assert_ne!(
        second_name,
        Value::from(first_name.clone()),
        "two jobs, two suffixes"
    );

    let keyed = submit(&["--idempotency-key", "resend-me"]);
    let again = submit(&["--idempotency-key", "resend-me"]);
    assert_eq!(keyed, again, "the same key is the same job");
    let keyed_name = cluster.json(&["job", "get", &keyed, "-o", "json"])["name"].clone();
    assert!(is_generated(
        keyed_name.as_str().unwrap_or_default(),
        "train"
    ));

    let named = submit(&["--name", "mine", "--priority", "7"]);
    let view = cluster.json(&["job", "get", &named, "-o", "json"]);
    assert_eq!(
        (view["name"].clone(), view["priority"].clone()),
        ("mine".into(), 7.into())
    );

    let jobs = cluster.jobs(&[]);
    let list = Value::from(jobs.clone());
    assert_eq!(jobs.len(), 4, "{list}");
    assert!(jobs.iter().all(|job| job["name"].is_string()), "{list}");
    let listed: Vec<&Value> = jobs.iter().map(|job| &job["name"]).collect();
    assert_eq!(listed[0], &Value::from(first_name), "{list}");
    assert_eq!(
        listed[2], &keyed_name,
        "the resend kept the first name: {list}"
    );

    // Every replica applied the same entries to the same state.
    cluster.wait_replicas_agree(3, SETTLE);
}
