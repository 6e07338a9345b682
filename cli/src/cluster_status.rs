//! `quotient cluster status [-o json]`: the leader, the term and every coordinator's role and
//! reachability, as the leader sees them.

use quotient_common::api::{ApiRequest, ApiResponse, ClusterView};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient cluster status` (none besides the global ones).
#[derive(Debug, clap::Args)]
pub struct ClusterStatusArgs {}

/// Reads the cluster view (also used by add-member, remove-member and dev up).
pub fn fetch(session: &mut Session) -> anyhow::Result<ClusterView> {
    let request = ApiRequest::ClusterStatus;
    match session.call(request.clone())? {
        ApiResponse::Cluster(view) => Ok(view),
        other => Err(unexpected(&request, &other)),
    }
}

pub fn run(global: &GlobalArgs, _args: &ClusterStatusArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let view = fetch(&mut session)?;
    match global.output {
        OutputFormat::Table => output::print_text(&output::cluster_table(&view)),
        OutputFormat::Json => output::print_json(&view),
    }
}
