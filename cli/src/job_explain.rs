//! `quotient job explain ID`: why a job waits, runs where it does, or ended, in words.
//!
//! With `-o json`: `{"summary": "...", "details": ["...", ...]}`.

use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::JobId;

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient job explain`.
#[derive(Debug, clap::Args)]
pub struct JobExplainArgs {
    /// The job's id, e.g. j-42.
    #[arg(value_name = "ID")]
    pub job: JobId,
}

pub fn run(global: &GlobalArgs, args: &JobExplainArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::ExplainJob { job: args.job };
    let (summary, details) = match session.call(request.clone())? {
        ApiResponse::Explanation { summary, details } => (summary, details),
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            let mut text = format!("{summary}\n");
            for detail in &details {
                text.push_str(&format!("  - {detail}\n"));
            }
            output::print_text(&text)
        }
        OutputFormat::Json => output::print_json(&serde_json::json!({
            "summary": summary,
            "details": details,
        })),
    }
}
