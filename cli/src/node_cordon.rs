//! `quotient node cordon NAME`: no new jobs are placed on the node; running ones stay (admin only).

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::parse_node_name;
use crate::GlobalArgs;

/// Arguments of `quotient node cordon`.
#[derive(Debug, clap::Args)]
pub struct NodeCordonArgs {
    /// The node's name, as `quotient node list` shows it.
    #[arg(value_parser = parse_node_name)]
    pub name: String,
}

pub fn run(global: &GlobalArgs, args: &NodeCordonArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::CordonNode {
        node: args.name.clone(),
    };
    match session.call(request.clone())? {
        ApiResponse::Done => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("node {}: cordoned\n", args.name))
        }
        OutputFormat::Json => {
            let node = crate::node_list::fetch(&mut session, &args.name)
                .context("the node was changed, but reading it back failed")?;
            output::print_json(&node)
        }
    }
}
