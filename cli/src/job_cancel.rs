//! `quotient job cancel ID`: stops a job for good; a running one gets its checkpoint signal
//! and grace period first, then ends CANCELLED.

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::JobId;

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient job cancel`.
#[derive(Debug, clap::Args)]
pub struct JobCancelArgs {
    /// The job's id, e.g. j-42.
    #[arg(value_name = "ID")]
    pub job: JobId,
}

pub fn run(global: &GlobalArgs, args: &JobCancelArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::CancelJob { job: args.job };
    match session.call(request.clone())? {
        ApiResponse::Done | ApiResponse::Job(_) => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("cancelled job {}\n", args.job))
        }
        OutputFormat::Json => {
            let view = crate::job_get::fetch(&mut session, args.job)
                .context("the job was cancelled, but reading it back failed")?;
            output::print_json(&view)
        }
    }
}
