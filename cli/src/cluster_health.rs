//! `quotient cluster health [-o json]`: asks every coordinator the config lists about itself
//! (its id, the leader it knows, its term, applied index, state digest, cluster id, and what
//! it reports wrong with itself), without redirects, and exits 1 if any is unreachable or
//! unhealthy. It answers "is each process up?", where `cluster status` answers "what does the
//! leader think?".
//!
//! A coordinator is unhealthy when it says so (it has joined no cluster, it refused or was
//! refused Raft requests, its state diverged from the leader's, Raft stopped), and also, as
//! seen here, when it names another cluster than the leader does, or holds another state
//! digest than the leader at the same applied index.
//!
//! With `-o json`: an array of `{"address", "healthy", "problems": [...], "health": {id,
//! leader, term, last_applied, healthy, state_digest, cluster_id, problems} | null,
//! "error": null | "..."}`.

use quotient_common::api::{ApiRequest, ApiResponse, HealthView};
use quotient_common::ErrorCode;
use serde::Serialize;

use crate::client::{unexpected, Session};
use crate::failure::RequestFailed;
use crate::output::{self, OutputFormat, Table};
use crate::GlobalArgs;

/// Arguments of `quotient cluster health` (none besides the global ones).
#[derive(Debug, clap::Args)]
pub struct ClusterHealthArgs {}

/// What one coordinator said, and the verdict on it.
#[derive(Debug, Clone, Serialize)]
pub struct HealthEntry {
    pub address: String,
    /// Answered, said it is healthy, and agrees with the leader.
    pub healthy: bool,
    /// Everything wrong with it: its own problems and its disagreements with the leader.
    pub problems: Vec<String>,
    pub health: Option<HealthView>,
    pub error: Option<String>,
}

/// Fills in each entry's verdict: its own problems, and its disagreements with the leader
/// that answered (the member that says it is the leader).
pub fn judge(entries: &mut [HealthEntry]) {
    // The leader is the one that says so in the highest term: a coordinator removed while it
    // led may go on saying it leads the term it led (found by probing: two "leaders").
    let leader = entries
        .iter()
        .filter_map(|entry| entry.health.clone())
        .filter(|view| view.leader == Some(view.id))
        .max_by_key(|view| view.term);
    for entry in entries.iter_mut() {
        let Some(view) = &entry.health else {
            entry.healthy = false;
            entry.problems = entry.error.iter().cloned().collect();
            continue;
        };
        let mut problems = view.problems.clone();
        if !view.healthy && problems.is_empty() {
            problems.push("it reports itself unhealthy; see its log".to_string());
        }
        if let Some(leader) = leader.as_ref().filter(|leader| leader.id != view.id) {
            // A member that still says it leads an older term, or campaigns in terms past the
            // leader's without ever winning, is out of the cluster: removed, or cut off from
            // it. One that merely has not heard of a new leader yet is left alone.
            if view.leader == Some(view.id) {
                problems.push(format!(
                    "it says it leads term {}, but coordinator {} leads term {}: it was removed from the cluster or is cut off from it",
                    view.term, leader.id, leader.term
                ));
            } else if view.leader.is_none() && view.term > leader.term {
                problems.push(format!(
                    "it knows no leader and campaigns in term {}, past the term {} that coordinator {} leads: it was removed from the cluster or is cut off from it",
                    view.term, leader.term, leader.id
                ));
            }
            if let (Some(mine), Some(leaders)) = (&view.cluster_id, &leader.cluster_id) {
                if mine != leaders {
                    problems.push(format!(
                        "it belongs to cluster {mine}, but the leader (coordinator {}) to cluster {leaders}",
                        leader.id
                    ));
                }
            }
            if view.last_applied == leader.last_applied && view.state_digest != leader.state_digest
            {
                problems.push(format!(
                    "its state digest {:016x} differs from the leader's {:016x} at the same applied index {}: its state has diverged",
                    view.state_digest, leader.state_digest, view.last_applied
                ));
            }
        }
        entry.healthy = problems.is_empty();
        entry.problems = problems;
    }
}

/// Asks each address for its health; an error is recorded, not returned.
pub fn probe(session: &mut Session) -> Vec<HealthEntry> {
    let addresses = session.addresses().to_vec();
    let mut entries = addresses
        .into_iter()
        .map(|address| {
            let request = ApiRequest::Health;
            let result = match session.call_one(&address, request.clone()) {
                Ok(ApiResponse::Health(view)) => Ok(view),
                Ok(other) => Err(unexpected(&request, &other)),
                Err(error) => Err(error),
            };
            match result {
                Ok(view) => HealthEntry {
                    address,
                    healthy: view.healthy,
                    problems: Vec::new(),
                    health: Some(view),
                    error: None,
                },
                Err(error) => {
                    let text = format!("{error:#}");
                    // The address has its own column; do not repeat it in the error.
                    let text = text
                        .strip_prefix(&format!("{address}: "))
                        .map(str::to_string)
                        .unwrap_or(text);
                    HealthEntry {
                        address,
                        healthy: false,
                        problems: Vec::new(),
                        health: None,
                        error: Some(text),
                    }
                }
            }
        })
        .collect::<Vec<_>>();
    judge(&mut entries);
    entries
}

fn table(entries: &[HealthEntry]) -> String {
    let mut table = Table::new(&[
        "ADDRESS", "ID", "HEALTHY", "LEADER", "TERM", "APPLIED", "DIGEST", "ERROR",
    ]);
    for entry in entries {
        let row = match &entry.health {
            Some(view) => vec![
                entry.address.clone(),
                view.id.to_string(),
                if entry.healthy { "yes" } else { "no" }.to_string(),
                view.leader.map(|id| id.to_string()).unwrap_or_default(),
                view.term.to_string(),
                view.last_applied.to_string(),
                format!("{:016x}", view.state_digest),
                String::new(),
            ],
            None => vec![
                entry.address.clone(),
                String::new(),
                "no".to_string(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                entry.error.clone().unwrap_or_default(),
            ],
        };
        table.row(row);
    }
    let mut text = table.render();
    for entry in entries {
        if let Some(view) = entry.health.as_ref().filter(|_| !entry.problems.is_empty()) {
            for problem in &entry.problems {
                text.push_str(&format!("coordinator {}: {problem}\n", view.id));
            }
        }
    }
    text
}

pub fn run(global: &GlobalArgs, _args: &ClusterHealthArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let entries = probe(&mut session);
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&table(&entries))?,
        OutputFormat::Json => output::print_json(&entries)?,
    }
    let unhealthy = entries.iter().filter(|entry| !entry.healthy).count();
    if unhealthy > 0 {
        return Err(RequestFailed::error(
            ErrorCode::Unavailable,
            format!(
                "{unhealthy} of {} coordinators are unreachable or unhealthy; see their logs",
                entries.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, applied: u64, digest: u64, cluster: &str) -> HealthEntry {
        HealthEntry {
            address: format!("127.0.0.1:740{id}"),
            healthy: true,
            problems: Vec::new(),
            health: Some(HealthView {
                id,
                leader: Some(1),
                term: 2,
                last_applied: applied,
                healthy: true,
                state_digest: digest,
                cluster_id: Some(cluster.repeat(32)),
                problems: Vec::new(),
            }),
            error: None,
        }
    }

    #[test]
    fn a_member_that_disagrees_with_the_leader_is_not_healthy() {
        // Proves a self-declared healthy member is judged unhealthy when its digest differs
        // from the leader's at the same applied index, or when it names another cluster; a
        // member merely behind, and the leader itself, stay healthy.
        let mut entries = vec![
            entry(1, 10, 0xaaaa, "a"),
            entry(2, 10, 0xbbbb, "a"),
            entry(3, 9, 0xcccc, "a"),
            entry(4, 12, 0xdddd, "b"),
        ];
        judge(&mut entries);
        assert!(entries[0].healthy, "{:?}", entries[0].problems);
        assert!(!entries[1].healthy);
        assert!(
            entries[1].problems[0].contains("diverged"),
            "{:?}",
            entries[1].problems
        );
        assert!(entries[2].healthy, "{:?}", entries[2].problems);
        assert!(!entries[3].healthy);
        assert!(
            entries[3].problems[0].contains(&"b".repeat(32))
                && entries[3].problems[0].contains(&"a".repeat(32)),
            "{:?}",
            entries[3].problems
        );
        let text = table(&entries);
        assert!(text.contains("coordinator 2: its state digest"), "{text}");
    }

    #[test]
    fn a_stale_leader_and_members_without_the_leader_are_not_healthy() {
        // Proves the leader is the one of the highest term: a coordinator removed while it
        // led, still saying it leads its old term, is unhealthy rather than taken for the
        // leader (found by probing), and so is a member that campaigns past the leader's term.
        let mut entries = vec![
            entry(1, 10, 1, "a"),
            entry(2, 12, 1, "a"),
            entry(3, 12, 1, "a"),
            entry(4, 12, 1, "a"),
        ];
        for (i, leader, term) in [
            (0, Some(1), 2),
            (1, Some(2), 3),
            (2, Some(2), 3),
            (3, None, 9),
        ] {
            let view = entries[i].health.as_mut().unwrap();
            view.leader = leader;
            view.term = term;
        }
        judge(&mut entries);
        assert!(!entries[0].healthy);
        assert!(
            entries[0].problems[0].contains("leads term 2, but coordinator 2 leads term 3"),
            "{:?}",
            entries[0].problems
        );
        assert!(entries[1].healthy, "{:?}", entries[1].problems);
        assert!(entries[2].healthy, "{:?}", entries[2].problems);
        assert!(!entries[3].healthy);
        assert!(entries[3].problems[0].contains("campaigns in term 9"));
    }

    #[test]
    fn a_member_that_reports_a_problem_is_not_healthy() {
        // Proves the problems a coordinator reports about itself make it unhealthy here.
        let mut entries = vec![entry(1, 10, 1, "a"), entry(2, 10, 1, "a")];
        if let Some(view) = entries[1].health.as_mut() {
            view.healthy = false;
            view.problems = vec!["coordinator 2 has joined no cluster".to_string()];
        }
        judge(&mut entries);
        assert!(!entries[1].healthy);
        assert_eq!(
            entries[1].problems,
            vec!["coordinator 2 has joined no cluster"]
        );
    }
}
