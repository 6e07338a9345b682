//! `quotient cluster health [-o json]`: asks every coordinator the config lists about itself
//! (its id, the leader it knows, its term, applied index and state digest: replicas at the
//! same applied index must show the same digest), without redirects, and exits 1
//! if any is unreachable or unhealthy. It answers "is each process up?", where `cluster
//! status` answers "what does the leader think?".
//!
//! With `-o json`: an array of `{"address", "health": {id, leader, term, last_applied,
//! healthy, state_digest} | null, "error": null | "..."}`.

use anyhow::bail;
use quotient_common::api::{ApiRequest, ApiResponse, HealthView};
use serde::Serialize;

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat, Table};
use crate::GlobalArgs;

/// Arguments of `quotient cluster health` (none besides the global ones).
#[derive(Debug, clap::Args)]
pub struct ClusterHealthArgs {}

/// What one coordinator said.
#[derive(Debug, Clone, Serialize)]
pub struct HealthEntry {
    pub address: String,
    pub health: Option<HealthView>,
    pub error: Option<String>,
}

/// Asks each address for its health; an error is recorded, not returned.
pub fn probe(session: &mut Session) -> Vec<HealthEntry> {
    let addresses = session.addresses().to_vec();
    addresses
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
                        health: None,
                        error: Some(text),
                    }
                }
            }
        })
        .collect()
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
                if view.healthy { "yes" } else { "no" }.to_string(),
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
    table.render()
}

pub fn run(global: &GlobalArgs, _args: &ClusterHealthArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let entries = probe(&mut session);
    match global.output {
        OutputFormat::Table => output::print_text(&table(&entries))?,
        OutputFormat::Json => output::print_json(&entries)?,
    }
    let unhealthy = entries
        .iter()
        .filter(|entry| !entry.health.as_ref().is_some_and(|view| view.healthy))
        .count();
    if unhealthy > 0 {
        bail!(
            "{unhealthy} of {} coordinators are unreachable or unhealthy; see their logs",
            entries.len()
        );
    }
    Ok(())
}
