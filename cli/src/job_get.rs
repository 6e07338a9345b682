//! `quotient job get ID [-o json]`: one job's state, placement, attempts and reason.

use quotient_common::api::{ApiRequest, ApiResponse, JobView};
use quotient_common::JobId;

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient job get`.
#[derive(Debug, clap::Args)]
pub struct JobGetArgs {
    /// The job's id, e.g. j-42.
    #[arg(value_name = "ID")]
    pub job: JobId,
}

/// Reads one job (also used by submit, update and cancel to print the result).
pub fn fetch(session: &mut Session, job: JobId) -> anyhow::Result<JobView> {
    let request = ApiRequest::GetJob { job };
    match session.call(request.clone())? {
        ApiResponse::Job(view) => Ok(*view),
        other => Err(unexpected(&request, &other)),
    }
}

pub fn run(global: &GlobalArgs, args: &JobGetArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let job = fetch(&mut session, args.job)?;
    let events = crate::events::job_events(&mut session, args.job)?;
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            let mut text = output::job_detail(&job);
            if !events.is_empty() {
                text.push_str("events:\n");
                for event in &events {
                    text.push_str(&format!("  {}\n", crate::events::event_line(event)));
                }
            }
            output::print_text(&text)
        }
        OutputFormat::Json => {
            let mut json = serde_json::to_value(&job)?;
            json["events"] =
                serde_json::Value::Array(events.iter().map(crate::events::event_json).collect());
            output::print_json(&json)
        }
    }
}
