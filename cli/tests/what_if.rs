//! `quotient what-if` as the real binary, without a cluster: it writes a synthetic starting
//! point, replays it with every policy, compares two designs, and refuses bad files with the
//! line or field to fix.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn quotient(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quotient"))
        .args(arguments)
        .env_remove("QUOTIENT_CONFIG")
        .output()
        .expect("the quotient binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// `shares.toml` with share `a` (lend, 8 h100) and `fleet.toml` with one node of 8, in `dir`.
fn one_share_one_node(dir: &Path) {
    std::fs::write(
        dir.join("shares.toml"),
        "[[share]]\nname = \"a\"\nstrategy = \"lend\"\nlimits = { h100 = 8 }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("fleet.toml"),
        "[[pool]]\nclass = \"h100\"\nnodes = 1\ngpus_per_node = 8\n",
    )
    .unwrap();
}

#[test]
fn a_generated_design_replays_with_every_policy_and_compares() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("try");
    let generated = quotient(&[
        "what-if",
        "--generate",
        "--seed",
        "4",
        "--out",
        out.to_str().unwrap(),
        "--gpus",
        "64",
        "--days",
        "2",
        "--share-count",
        "4",
        "-o",
        "json",
    ]);
    assert!(generated.status.success(), "{}", text(&generated.stderr));
    let written: Value = serde_json::from_slice(&generated.stdout).unwrap();
    assert_eq!(written["gpus"], 64);
    assert!(written["jobs"].as_u64().unwrap() > 50, "{written}");

    // A second design: every share lends and borrows.
    let shares = std::fs::read_to_string(out.join("shares.toml")).unwrap();
    let open = shares
        .replace("\"reserve\"", "\"lend-and-borrow\"")
        .replace("\"lend\"", "\"lend-and-borrow\"");
    std::fs::write(out.join("open.toml"), open).unwrap();

    let (s, f, t, o) = (
        path(&out, "shares.toml"),
        path(&out, "fleet.toml"),
        path(&out, "jobs.jsonl"),
        path(&out, "open.toml"),
    );
    let compared = quotient(&[
        "what-if",
        "--shares",
        &s,
        "--fleet",
        &f,
        "--trace",
        &t,
        "--compare",
        &o,
        "-o",
        "json",
    ]);
    assert!(compared.status.success(), "{}", text(&compared.stderr));
    let document: Value = serde_json::from_slice(&compared.stdout).unwrap();
    let runs = document["runs"].as_array().unwrap();
    let policies: Vec<(&str, &str)> = runs
        .iter()
        .map(|r| (r["policy"].as_str().unwrap(), r["design"].as_str().unwrap()))
        .collect();
    assert_eq!(
        policies,
        [
            ("quotient", s.as_str()),
            ("naive-victims", s.as_str()),
            ("static", s.as_str()),
            ("quotient", o.as_str()),
            ("naive-victims", o.as_str()),
            ("static", o.as_str()),
        ]
    );
    for run in runs {
        for field in ["utilisation", "lost_gpu_hours", "preemptions", "shares"] {
            assert!(!run[field].is_null(), "{field} missing from {run}");
        }
        assert_eq!(run["shares"].as_object().unwrap().len(), 4);
        let utilisation = run["utilisation"].as_f64().unwrap();
        assert!(utilisation > 0.0 && utilisation <= 1.0, "{run}");
    }
    // Static partitions are the same whatever the strategies: both designs give one result.
    let strip = |run: &Value| {
        let mut run = run.clone();
        run["design"] = Value::Null;
        run
    };
    assert_eq!(strip(&runs[2]), strip(&runs[5]));
    // No share borrows under static partitions.
    for share in runs[2]["shares"].as_object().unwrap().values() {
        assert_eq!(share["borrowed_gpu_hours"], 0.0);
    }

    assert!(runs.iter().all(|r| r["borrow_order"] == "fifo"));
    let both = quotient(&[
        "what-if",
        "--shares",
        &s,
        "--fleet",
        &f,
        "--trace",
        &t,
        "--policy",
        "quotient,static",
        "--borrow-order",
        "both",
        "-o",
        "json",
    ]);
    assert!(both.status.success(), "{}", text(&both.stderr));
    let both: Value = serde_json::from_slice(&both.stdout).unwrap();
    let runs: Vec<(&str, &str)> = both["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["policy"].as_str().unwrap(),
                r["borrow_order"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            ("quotient", "fifo"),
            ("quotient", "fair"),
            ("static", "fifo")
        ]
    );

    let table = quotient(&[
        "what-if", "--shares", &s, "--fleet", &f, "--trace", &t, "--policy", "static",
    ]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    let table = text(&table.stdout);
    assert!(table.starts_with("POLICY"), "{table}");
    assert!(
        table.contains("team-a") && !table.contains("naive-victims"),
        "{table}"
    );
}

#[test]
fn a_generate_that_fails_midway_leaves_the_earlier_files_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    std::fs::write(dir.path().join("shares.toml"), "earlier").unwrap();
    // The trace cannot be written: a folder is in its way.
    std::fs::create_dir(dir.path().join("jobs.jsonl.partial")).unwrap();
    let output = quotient(&[
        "what-if",
        "--generate",
        "--out",
        &out,
        "--gpus",
        "64",
        "--days",
        "1",
        "--share-count",
        "2",
    ]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("jobs.jsonl.partial"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("shares.toml")).unwrap(),
        "earlier"
    );
    assert!(!dir.path().join("fleet.toml").exists());
    assert!(!dir.path().join("shares.toml.partial").exists());
}

#[test]
fn bad_files_and_flags_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    one_share_one_node(d);
    std::fs::write(
        d.join("jobs.jsonl"),
        "{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 1, \"run_s\": 60}\n{\"submit_s\": 5, \"share\": \"a\", \"gpus\": 1}\n",
    )
    .unwrap();
    std::fs::write(
        d.join("other.jsonl"),
        "{\"submit_s\": 0, \"share\": \"b\", \"gpus\": 1, \"run_s\": 60}\n",
    )
    .unwrap();
    let (s, f) = (path(d, "shares.toml"), path(d, "fleet.toml"));
    let cases: [(&[&str], &str); 5] = [
        (
            &["--trace", &path(d, "jobs.jsonl")],
            "line 2: missing field `run_s`",
        ),
        (&["--trace", &path(d, "other.jsonl")], "line 1 was refused"),
        (
            &["--trace", &path(d, "other.jsonl")],
            &format!("replaying on {s}"),
        ),
        (&["--trace", &path(d, "none.jsonl")], "cannot read"),
        (
            &["--trace", &path(d, "jobs.jsonl"), "--policy", "fifo"],
            "unknown policy",
        ),
    ];
    let replay = |extra: &[&str]| {
        let mut arguments = vec!["what-if", "--shares", &s, "--fleet", &f];
        arguments.extend_from_slice(extra);
        quotient(&arguments)
    };
    for (extra, needle) in cases {
        let output = replay(extra);
        assert!(!output.status.success(), "{extra:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
    }
    let missing = quotient(&["what-if", "--shares", &s]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing.stderr));
    // The OS's reason once, not repeated by the error chain.
    let output = replay(&["--trace", &path(d, "none.jsonl")]);
    assert_eq!(
        text(&output.stderr).matches("os error 2").count(),
        1,
        "{}",
        text(&output.stderr)
    );
    // A policy named twice runs once; a job no node could hold is named before the replay.
    std::fs::write(
        d.join("big.jsonl"),
        "{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 16, \"run_s\": 60}\n",
    )
    .unwrap();
    let big = path(d, "big.jsonl");
    let twice = ["--trace", &big, "--policy", "static", "--policy", "static"];
    let output = replay(&[&twice[..], &["-o", "json"]].concat());
    assert!(output.status.success(), "{}", text(&output.stderr));
    let runs: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("1 jobs of the trace can never start") && stderr.contains("line 1"),
        "{stderr}"
    );
}

#[test]
fn a_job_history_turns_into_a_trace_that_replays() {
    use quotient_common::api::{HistoryPage, HistoryRecord};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let records = (0..6u64)
        .map(|n| HistoryRecord {
            id: format!("j-{}", n + 1),
            share: "a".into(),
            gpu_class: "h100".into(),
            gpus: 2,
            nodes: 1,
            state: "SUCCEEDED".into(),
            submitted_ms: 1_000_000 + n * 60_000,
            first_started_ms: (n != 3).then_some(1_000_000 + n * 60_000),
            ended_ms: 2_000_000 + n * 60_000,
            gpu_ms: if n == 3 { 0 } else { 2 * 600_000 },
            ..HistoryRecord::default()
        })
        .collect();
    let page = HistoryPage {
        records,
        next_page_token: None,
    };
    std::fs::write(
        d.join("history.json"),
        serde_json::to_string(&page).unwrap(),
    )
    .unwrap();
    let out = d.join("from-history");
    let converted = quotient(&[
        "what-if",
        "--from-history",
        &path(d, "history.json"),
        "--out",
        out.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(converted.status.success(), "{}", text(&converted.stderr));
    let summary: Value = serde_json::from_slice(&converted.stdout).unwrap();
    assert_eq!(
        (summary["jobs"].as_u64(), summary["skipped"].as_u64()),
        (Some(5), Some(1))
    );
    one_share_one_node(d);
    let replayed = quotient(&[
        "what-if",
        "--shares",
        &path(d, "shares.toml"),
        "--fleet",
        &path(d, "fleet.toml"),
        "--trace",
        &path(&out, "jobs.jsonl"),
        "--policy",
        "quotient",
        "-o",
        "json",
    ]);
    assert!(replayed.status.success(), "{}", text(&replayed.stderr));
    let document: Value = serde_json::from_slice(&replayed.stdout).unwrap();
    let run = &document["runs"][0];
    assert_eq!(run["completed"], 5);
    // Five jobs of 2 GPUs for 10 minutes each.
    let used = run["used_gpu_hours"].as_f64().unwrap();
    assert!((used - 5.0 * 2.0 * 600.0 / 3_600.0).abs() < 1e-9, "{run}");
    let bad = quotient(&[
        "what-if",
        "--from-history",
        &path(d, "shares.toml"),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("job history --all -o json"));
}
