//! What `quotient node cordon`, `uncordon` and `drain` share: send the change, then say what
//! became of the node, as a line or, with `-o json`, the node read back.

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Sends `request`, a change of node `name`; prints `node NAME: DONE` or the node's JSON.
pub fn run(global: &GlobalArgs, name: &str, request: ApiRequest, done: &str) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    match session.call(request.clone())? {
        ApiResponse::Done => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("node {name}: {done}\n"))
        }
        OutputFormat::Json => {
            let node = crate::node_list::fetch(&mut session, name)
                .context("the node was changed, but reading it back failed")?;
            output::print_json(&node)
        }
    }
}
