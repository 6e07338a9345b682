//! `quotient job list [--share NAME] [--state STATE] [--name PREFIX] [--mine] [--limit N]
//! [--page-token TOKEN | --all] [-o json]`: one page of jobs, newest first, filtered on the
//! coordinators (docs/cli.md). `-o json` prints `{"jobs": [...], "next_page_token": ...}`;
//! a table says on stderr how to ask for the next page. `--all` walks every page. `--share` of
//! a share that does not exist is an error (NotFound, with "did you mean" when a share's name
//! is near), not an empty list.

use quotient_common::api::{ApiRequest, JobPage, JOB_PAGE_MAX};
use quotient_common::JobState;

use crate::client::Session;
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
    /// Only the jobs whose name starts with this.
    #[arg(long, value_name = "PREFIX")]
    pub name: Option<String>,
    /// Only your own jobs (a user sees the jobs of the shares they may submit to).
    #[arg(long)]
    pub mine: bool,
    /// Jobs on the page, newest first, 1-1000.
    #[arg(long, default_value_t = quotient_common::api::JOB_PAGE_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=JOB_PAGE_MAX as i64))]
    pub limit: u32,
    /// The page after the one that gave this token (its `next_page_token`).
    #[arg(long, value_name = "TOKEN", conflicts_with = "all")]
    pub page_token: Option<String>,
    /// Every page, one after the other: every job that matches.
    #[arg(long)]
    pub all: bool,
}

impl JobListArgs {
    fn request(&self, page_token: Option<String>) -> ApiRequest {
        ApiRequest::ListJobs {
            share: self.share.clone(),
            state: self.state,
            mine: self.mine,
            name_prefix: self.name.clone(),
            limit: self.limit,
            page_token,
        }
    }
}

pub fn run(global: &GlobalArgs, args: &JobListArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let listed = if args.all {
        JobPage {
            jobs: session.every_job(args.request(None))?,
            next_page_token: None,
        }
    } else {
        session.job_page(args.request(args.page_token.clone()))?
    };
    if let (Some(share), true) = (&args.share, listed.jobs.is_empty()) {
        // The coordinators answer an empty list for a share that does not exist.
        crate::share_list::require(&mut session, share)?;
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&output::job_table(&listed.jobs))?;
            if let Some(token) = &listed.next_page_token {
                eprintln!(
                    "more jobs: `quotient job list --page-token {token} --limit {limit}` (the \
                     same filters) shows the next {limit}, `--all` every one",
                    limit = args.limit
                );
            }
            Ok(())
        }
        OutputFormat::Json => output::print_json(&listed),
    }
}
