//! `quotient node remove NAME`: forgets a decommissioned node (admin only). The coordinators
//! refuse a node that is ready (cordon or drain it first), one that still holds a job (drain
//! it and wait), and one whose agent is still connected (stop the agent first). An agent that
//! runs again on that host later registers it as a new, ready node.

use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::parse_node_name;
use crate::GlobalArgs;

/// Arguments of `quotient node remove`.
#[derive(Debug, clap::Args)]
pub struct NodeRemoveArgs {
    /// The node's name, as `quotient node list` shows it.
    #[arg(value_parser = parse_node_name)]
    pub name: String,
}

/// What the table output says after a removal.
pub fn removed_text(name: &str) -> String {
    format!(
        "removed node {name}\nAn agent started again on that host registers it as a new, ready \
         node.\n"
    )
}

pub fn run(global: &GlobalArgs, args: &NodeRemoveArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::RemoveNode {
        node: args.name.clone(),
    };
    match session.call(request.clone())? {
        ApiResponse::Done => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&removed_text(&args.name)),
        OutputFormat::Json => output::print_json(&serde_json::json!({ "removed": args.name })),
    }
}
