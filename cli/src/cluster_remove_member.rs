//! `quotient cluster remove-member --id N`: removes a coordinator from the voters (admin
//! only); returns once the leader has committed the change. Stop that coordinator afterwards.

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient cluster remove-member`.
#[derive(Debug, clap::Args)]
pub struct ClusterRemoveMemberArgs {
    /// The coordinator's id, as `quotient cluster status` shows it.
    #[arg(long, value_name = "N", value_parser = crate::parse::parse_member_id)]
    pub id: u64,
}

pub fn run(global: &GlobalArgs, args: &ClusterRemoveMemberArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::RemoveMember { id: args.id };
    match session.call(request.clone())? {
        ApiResponse::Done | ApiResponse::Cluster(_) => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("removed coordinator {}\n", args.id))
        }
        OutputFormat::Json => {
            let view = crate::cluster_status::fetch(&mut session)
                .context("the member was removed, but reading the cluster status failed")?;
            output::print_json(&view)
        }
    }
}
