//! `quotient share list [-o json]`: every share with its limits, usage, borrowing and jobs.

use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient share list` (none besides the global ones).
#[derive(Debug, clap::Args)]
pub struct ShareListArgs {}

pub fn run(global: &GlobalArgs, _args: &ShareListArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::ListShares;
    let shares = match session.call(request.clone())? {
        ApiResponse::Shares(shares) => shares,
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Table => output::print_text(&output::share_table(&shares)),
        OutputFormat::Json => output::print_json(&shares),
    }
}
