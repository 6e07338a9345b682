//! `quotient cluster init [--coordinator HOST:PORT]`: bootstraps a new cluster, once (admin
//! only). Start every initial coordinator first (each with the same `--peers`), then run this
//! against one of them: it becomes the first voter, makes the cluster id, and adds the others
//! as learners, then voters, as they catch up. Prints the cluster id, to put in client configs
//! as `cluster_id`, and any initial coordinator that did not join in time with what to do.
//!
//! A coordinator never bootstraps a cluster because its data directory is empty; this is the
//! only way a cluster begins (`quotient dev up` runs it for a local cluster).

use std::time::Duration;

use anyhow::bail;
use quotient_common::api::{ApiRequest, ApiResponse, ClusterInitView};

use crate::client::{unexpected, Session};
use crate::cluster_add_member::parse_address;
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// How long the coordinator may take: it waits up to 30 s for the other initial coordinators
/// to catch up, and leading, adding and promoting them takes a few seconds more (milliseconds).
pub const INIT_DEADLINE_MS: u64 = 60_000;

/// Arguments of `quotient cluster init`.
#[derive(Debug, clap::Args)]
pub struct ClusterInitArgs {
    /// The coordinator to bootstrap the cluster on, HOST:PORT [default: the first of the
    /// client config's `coordinators`]. Its `--peers` are the initial members.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_address)]
    pub coordinator: Option<String>,
}

/// Sends `InitCluster` to the coordinator at `address`.
pub fn init(session: &mut Session, address: &str) -> anyhow::Result<ClusterInitView> {
    let request = ApiRequest::InitCluster;
    match session.call_one_within(
        address,
        request.clone(),
        Duration::from_millis(INIT_DEADLINE_MS),
    )? {
        ApiResponse::ClusterInitialised(view) => Ok(view),
        other => Err(unexpected(&request, &other)),
    }
}

/// What `cluster init` prints as text.
pub fn text(view: &ClusterInitView) -> String {
    let voters = view
        .voters
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let mut text = format!(
        "cluster {} initialised by coordinator {}; voters: {voters}\n\
         add `cluster_id = \"{}\"` to client configs, so that they refuse coordinators of any other cluster\n",
        view.cluster_id, view.bootstrapped_by, view.cluster_id
    );
    for member in &view.pending {
        text.push_str(&format!(
            "coordinator {} ({}) is not a voter yet: {}\n",
            member.id, member.address, member.reason
        ));
    }
    text
}

pub fn run(global: &GlobalArgs, args: &ClusterInitArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let address = match &args.coordinator {
        Some(address) => address.clone(),
        None => match session.addresses().first() {
            Some(address) => address.clone(),
            None => bail!("the client config lists no coordinators; pass --coordinator HOST:PORT"),
        },
    };
    let view = init(&mut session, &address)?;
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&text(&view)),
        OutputFormat::Json => output::print_json(&view),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::api::PendingMember;

    #[test]
    fn the_text_gives_the_id_for_client_configs_and_what_to_do_about_stragglers() {
        // Proves the printed text names the id, the config line, and each pending member.
        let view = ClusterInitView {
            cluster_id: "ab".repeat(16),
            bootstrapped_by: 1,
            voters: vec![1, 2],
            pending: vec![PendingMember {
                id: 3,
                address: "10.0.0.3:7401".into(),
                reason: "start it, then add it".into(),
            }],
        };
        let text = text(&view);
        assert!(
            text.contains(&format!("cluster_id = \"{}\"", "ab".repeat(16))),
            "{text}"
        );
        assert!(text.contains("voters: 1, 2"), "{text}");
        assert!(
            text.contains("coordinator 3 (10.0.0.3:7401) is not a voter yet: start it"),
            "{text}"
        );
    }
}
