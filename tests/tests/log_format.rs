//! `--log-format json` (here through `QUOTIENT_LOG_FORMAT`, which `dev up`'s processes
//! inherit): every line a coordinator and an agent write is one JSON object with its level,
//! time and fields, for log collectors.

use quotient_tests::DevCluster;
use serde_json::Value;

#[test]
fn coordinators_and_agents_log_one_json_object_per_line() {
    let cluster = DevCluster::up_with_env(
        &["--coordinators", "1", "--nodes", "1"],
        &[("QUOTIENT_LOG_FORMAT", "json")],
    );
    for log in ["coord-1/coordinator.log", "node-1/agent.log"] {
        let text = std::fs::read_to_string(cluster.dir.join(log)).expect("the log");
        let lines: Vec<&str> = text.lines().filter(|line| !line.is_empty()).collect();
        assert!(lines.len() >= 2, "{log}: {text}");
        for line in lines {
            let entry: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{log}: not JSON ({e}): {line}"));
            assert!(entry["level"].is_string(), "{log}: {line}");
            assert!(entry["timestamp"].is_string(), "{log}: {line}");
            assert!(entry["fields"]["message"].is_string(), "{log}: {line}");
        }
    }
}
