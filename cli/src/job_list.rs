//! `quotient job list [--share NAME] [--state STATE] [-o json]`: the jobs, optionally of one
//! share or in one state, in submit order. `--share` of a share that does not exist is an
//! error (NotFound, with "did you mean" when a share's name is near), not an empty list.

use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::JobState;

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::parse_share_name;
use crate::GlobalArgs;

/// Arguments of `quotient job list`.
#[derive(Debug, clap::Args)]
pub struct JobListArgs {
    /// Only the jobs of this share.
    #[arg(long, value_parser = parse_share_name)]
    pub share: Option<String>,
    /// Only the jobs in this state: RUNNABLE, SCHEDULED, STARTING, RUNNING, PREEMPTING,
    /// SUCCEEDED, FAILED or CANCELLED.
    #[arg(long)]
    pub state: Option<JobState>,
    /// Only your own jobs (a user sees the jobs of the shares they may submit to).
    #[arg(long)]
    pub mine: bool,
}

pub fn run(global: &GlobalArgs, args: &JobListArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::ListJobs {
        share: args.share.clone(),
        state: args.state,
        mine: args.mine,
    };
    let jobs = match session.call(request.clone())? {
        ApiResponse::Jobs(jobs) => jobs,
        other => return Err(unexpected(&request, &other)),
    };
    if let (Some(share), true) = (&args.share, jobs.is_empty()) {
        // The coordinators answer an empty list for a share that does not exist.
        crate::share_list::require(&mut session, share)?;
    }
    match global.output {
        OutputFormat::Table => output::print_text(&output::job_table(&jobs)),
        OutputFormat::Json => output::print_json(&jobs),
    }
}
