//! `quotient cluster status [-o json]`: the leader, the term and every coordinator's role and
//! reachability, as the leader sees them.
//!
//! The leader counts a member reachable for a few seconds after its last answer, and keeps
//! calling a stopped voter a follower; so this command also asks each member for its health
//! itself, at once, within [`MEMBER_PROBE_DEADLINE_MS`]. A member that neither the leader
//! reaches nor answers here shows `unreachable` in the ROLE column, and with `-o json` each
//! member gets `"status"`: its role, or `unreachable` (`role` stays the Raft role).

use std::time::Duration;

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse, ClusterView};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient cluster status` (none besides the global ones).
#[derive(Debug, clap::Args)]
pub struct ClusterStatusArgs {}

/// Reads the cluster view (also used by add-member, remove-member and dev up).
pub fn fetch(session: &mut Session) -> anyhow::Result<ClusterView> {
    let request = ApiRequest::ClusterStatus;
    match session.call(request.clone())? {
        ApiResponse::Cluster(view) => Ok(view),
        other => Err(unexpected(&request, &other)),
    }
}

/// How long a member may take to answer this command's own health request (milliseconds).
pub const MEMBER_PROBE_DEADLINE_MS: u64 = 1_500;

/// What `status` says of a member that neither the leader reaches nor answers here.
pub const UNREACHABLE: &str = "unreachable";

/// How long the leader counts a member reachable after its last answer (the coordinators'
/// `REACHABLE_WINDOW_MS`), and a little more.
pub const LEADER_REACHABLE_WINDOW_MS: u64 = 3_500;

/// Which members answer this command's own health request, at once, each within
/// [`MEMBER_PROBE_DEADLINE_MS`].
fn answering(session: &mut Session, view: &ClusterView) -> Vec<bool> {
    let addresses: Vec<String> = view
        .members
        .iter()
        .map(|member| member.address.clone())
        .collect();
    session
        .call_each(
            &addresses,
            &ApiRequest::Health,
            Duration::from_millis(MEMBER_PROBE_DEADLINE_MS),
        )
        .into_iter()
        .map(|answer| matches!(answer, Ok(ApiResponse::Health(_))))
        .collect()
}

/// Reads the cluster view and each member's status: its role, or [`UNREACHABLE`] when it
/// does not answer here and the leader does not reach it either. A member that does not
/// answer here while the leader still counts it reachable (it may have just stopped, or be
/// out of this machine's reach only) is settled by the leader's view once its window has
/// passed.
pub fn fetch_with_statuses(session: &mut Session) -> anyhow::Result<(ClusterView, Vec<String>)> {
    let mut view = fetch(session)?;
    let answered: Vec<(u64, bool)> = view
        .members
        .iter()
        .map(|member| member.id)
        .zip(answering(session, &view))
        .collect();
    let unsure = view
        .members
        .iter()
        .zip(&answered)
        .any(|(member, (_, answered))| member.reachable && !answered);
    if unsure {
        std::thread::sleep(Duration::from_millis(LEADER_REACHABLE_WINDOW_MS));
        view = fetch(session)?;
    }
    let statuses = view
        .members
        .iter()
        .map(|member| {
            let answered_here = answered
                .iter()
                .any(|(id, answered)| *id == member.id && *answered);
            if member.reachable || answered_here {
                member.role.clone()
            } else {
                UNREACHABLE.to_string()
            }
        })
        .collect();
    Ok((view, statuses))
}

pub fn run(global: &GlobalArgs, _args: &ClusterStatusArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let (mut view, statuses) = fetch_with_statuses(&mut session)?;
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            for (member, status) in view.members.iter_mut().zip(&statuses) {
                member.role = status.clone();
            }
            output::print_text(&output::cluster_table(&view))
        }
        OutputFormat::Json => {
            let mut json = serde_json::to_value(&view).context("cannot render JSON")?;
            if let Some(members) = json["members"].as_array_mut() {
                for (member, status) in members.iter_mut().zip(statuses) {
                    member["status"] = serde_json::Value::String(status);
                }
            }
            output::print_json(&json)
        }
    }
}
