//! `quotient job update ID --priority N`: changes a queued or running job's priority.

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::JobId;

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::parse_priority;
use crate::GlobalArgs;

/// Arguments of `quotient job update`.
#[derive(Debug, clap::Args)]
pub struct JobUpdateArgs {
    /// The job's id, e.g. j-42.
    #[arg(value_name = "ID")]
    pub job: JobId,
    /// The new priority, 0-9999; higher runs first.
    #[arg(long, value_parser = parse_priority, allow_negative_numbers = true)]
    pub priority: u32,
}

pub fn run(global: &GlobalArgs, args: &JobUpdateArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::UpdateJobPriority {
        job: args.job,
        priority: args.priority,
    };
    match session.call(request.clone())? {
        ApiResponse::Done | ApiResponse::Job(_) => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&format!(
            "job {}: priority set to {}\n",
            args.job, args.priority
        )),
        OutputFormat::Json => {
            let view = crate::job_get::fetch(&mut session, args.job)
                .context("the priority was changed, but reading the job back failed")?;
            output::print_json(&view)
        }
    }
}
