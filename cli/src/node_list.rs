//! `quotient node list [-o json]`: the GPU hosts, their state and their GPUs.

use quotient_common::api::{ApiRequest, ApiResponse, NodeView};
use quotient_common::ErrorCode;

use crate::client::{unexpected, Session};
use crate::failure::RequestFailed;
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient node list` (none besides the global ones).
#[derive(Debug, clap::Args)]
pub struct NodeListArgs {}

/// Reads every node.
pub fn fetch_all(session: &mut Session) -> anyhow::Result<Vec<NodeView>> {
    let request = ApiRequest::ListNodes;
    match session.call(request.clone())? {
        ApiResponse::Nodes(nodes) => Ok(nodes),
        other => Err(unexpected(&request, &other)),
    }
}

/// Reads one node by name (for cordon, uncordon and drain to print the result).
pub fn fetch(session: &mut Session, name: &str) -> anyhow::Result<NodeView> {
    fetch_all(session)?
        .into_iter()
        .find(|node| node.name == name)
        .ok_or_else(|| {
            RequestFailed::error(
                ErrorCode::NotFound,
                format!("node {name} is not in `quotient node list`"),
            )
        })
}

pub fn run(global: &GlobalArgs, _args: &NodeListArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let nodes = fetch_all(&mut session)?;
    match global.output {
        OutputFormat::Table => output::print_text(&output::node_table(&nodes)),
        OutputFormat::Json => output::print_json(&nodes),
    }
}
