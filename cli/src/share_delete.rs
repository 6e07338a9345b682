//! `quotient share delete NAME`: removes a share (admin only). The coordinators refuse to
//! delete an enabled share or one with jobs; disable it first with `share update --state
//! disabled`.

use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::parse_share_name;
use crate::GlobalArgs;

/// Arguments of `quotient share delete`.
#[derive(Debug, clap::Args)]
pub struct ShareDeleteArgs {
    /// The share's name.
    #[arg(value_parser = parse_share_name)]
    pub name: String,
}

pub fn run(global: &GlobalArgs, args: &ShareDeleteArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::DeleteShare {
        name: args.name.clone(),
    };
    match session.call(request.clone())? {
        ApiResponse::Done => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("deleted share {}\n", args.name))
        }
        OutputFormat::Json => output::print_json(&serde_json::json!({ "deleted": args.name })),
    }
}
