//! `quotient node cordon NAME`: no new jobs are placed on the node; running ones stay (admin only).

use quotient_common::api::ApiRequest;

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
    let request = ApiRequest::CordonNode {
        node: args.name.clone(),
    };
    crate::node_change::run(global, &args.name, request, "cordoned")
}
