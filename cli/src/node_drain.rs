//! `quotient node drain NAME`: cordons the node and moves its jobs elsewhere (checkpoint signal, grace period, requeue) (admin only).

use quotient_common::api::ApiRequest;

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
    let request = ApiRequest::DrainNode {
        node: args.name.clone(),
    };
    crate::node_change::run(global, &args.name, request, "draining")
}
