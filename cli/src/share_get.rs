//! `quotient share get NAME [-o json]`: one share's limits, usage, borrowing and jobs.

use quotient_common::api::{ApiRequest, ApiResponse, ShareView};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::parse_share_name;
use crate::GlobalArgs;

/// Arguments of `quotient share get`.
#[derive(Debug, clap::Args)]
pub struct ShareGetArgs {
    /// The share's name.
    #[arg(value_parser = parse_share_name)]
    pub name: String,
}

/// Reads one share (also used by create and update to print the result).
pub fn fetch(session: &mut Session, name: &str) -> anyhow::Result<ShareView> {
    let request = ApiRequest::GetShare {
        name: name.to_string(),
    };
    match session.call(request.clone())? {
        ApiResponse::Share(share) => Ok(share),
        other => Err(unexpected(&request, &other)),
    }
}

pub fn run(global: &GlobalArgs, args: &ShareGetArgs) -> anyhow::Result<()> {
    let mut session = crate::client::Session::open(global.config.as_deref())?;
    let share = fetch(&mut session, &args.name)?;
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&output::share_detail(&share))
        }
        OutputFormat::Json => output::print_json(&share),
    }
}
