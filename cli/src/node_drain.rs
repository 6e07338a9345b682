//! `quotient node drain NAME`: cordons the node and moves its jobs elsewhere (checkpoint signal, grace period, requeue) (admin only).

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::parse_node_name;
use crate::GlobalArgs;

/// Arguments of `quotient node drain`.
#[derive(Debug, clap::Args)]
pub struct NodeDrainArgs {
    /// The node's name, as `quotient node list` shows it.
    #[arg(value_parser = parse_node_name)]
    pub name: String,
}

pub fn run(global: &GlobalArgs, args: &NodeDrainArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::DrainNode {
        node: args.name.clone(),
    };
    match session.call(request.clone())? {
        ApiResponse::Done => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("node {}: draining\n", args.name))
        }
        OutputFormat::Json => {
            let node = crate::node_list::fetch(&mut session, &args.name)
                .context("the node was changed, but reading it back failed")?;
            output::print_json(&node)
        }
    }
}
