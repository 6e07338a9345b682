//! `quotient node uncordon NAME`: the node takes new jobs again (admin only).

use quotient_common::api::ApiRequest;

use crate::parse::parse_node_name;
use crate::GlobalArgs;

/// Arguments of `quotient node uncordon`.
#[derive(Debug, clap::Args)]
pub struct NodeUncordonArgs {
    /// The node's name, as `quotient node list` shows it.
    #[arg(value_parser = parse_node_name)]
    pub name: String,
}

pub fn run(global: &GlobalArgs, args: &NodeUncordonArgs) -> anyhow::Result<()> {
    let request = ApiRequest::UncordonNode {
        node: args.name.clone(),
    };
    crate::node_change::run(global, &args.name, request, "uncordoned")
}
