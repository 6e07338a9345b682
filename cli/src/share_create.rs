//! `quotient share create NAME --limit CLASS=N ... --strategy S [--borrow-limit PERCENT]
//! [--in-share-preemption]`: a new quota share (admin only).
//!
//! The spec is checked locally with the same validation the state machine runs, so a bad
//! share is a usage error before anything is sent. With `-o json` the new share is fetched and
//! printed, so a script gets the same document as `share get`.

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::{GpuClass, ShareSpec, ShareState, Strategy};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::{parse_limit, parse_share_name, UsageError};
use crate::GlobalArgs;

/// Arguments of `quotient share create`.
#[derive(Debug, clap::Args)]
pub struct ShareCreateArgs {
    /// The share's name: 1-128 characters of A-Z, a-z, 0-9, '_' and '-'.
    #[arg(value_parser = parse_share_name)]
    pub name: String,
    /// GPUs of one class the share is entitled to, as CLASS=N; repeat for each class (1-5).
    #[arg(long = "limit", value_name = "CLASS=N", value_parser = parse_limit, required = true)]
    pub limits: Vec<(GpuClass, u32)>,
    /// reserve (never lent), lend (lent when idle) or lend-and-borrow (also borrows).
    #[arg(long, value_name = "STRATEGY")]
    pub strategy: Strategy,
    /// With lend-and-borrow: how much it may borrow, in percent of its limit, or `none` for no
    /// cap (the default).
    #[arg(long = "borrow-limit", value_name = "PERCENT|none", value_parser = crate::parse::parse_borrow_limit, allow_negative_numbers = true)]
    pub borrow_limit_percent: Option<crate::parse::BorrowLimit>,
    /// Let a higher-priority job of this share preempt a lower one of the same share.
    #[arg(long)]
    pub in_share_preemption: bool,
    /// A user (the name in their certificate) or `group:NAME` who may submit to the share;
    /// repeat for several. Without any, every user may (an open share).
    #[arg(long = "member", value_name = "USER|group:NAME")]
    pub members: Vec<String>,
    /// The most jobs one user may have queued or running in the share at once, or `none` for
    /// no cap (the default).
    #[arg(long, value_name = "N|none", value_parser = crate::parse::parse_cap, allow_negative_numbers = true)]
    pub max_jobs_per_user: Option<crate::parse::Cap>,
}

/// Builds the spec and checks it as the state machine would.
pub fn spec(args: &ShareCreateArgs) -> Result<ShareSpec, UsageError> {
    let mut limits = std::collections::BTreeMap::new();
    for (class, count) in &args.limits {
        if limits.insert(class.clone(), *count).is_some() {
            return Err(UsageError(format!(
                "--limit names GPU class {class} twice: give each class once"
            )));
        }
    }
    let spec = ShareSpec {
        name: args.name.clone(),
        limits,
        strategy: args.strategy,
        borrow_limit_percent: args.borrow_limit_percent.and_then(|limit| limit.0),
        in_share_preemption: args.in_share_preemption,
        state: ShareState::Enabled,
        members: {
            let mut members = args.members.clone();
            members.sort();
            members.dedup();
            members
        },
        max_jobs_per_user: args.max_jobs_per_user.and_then(|cap| cap.0),
    };
    spec.validate()
        .map_err(|error| UsageError(error.to_string()))?;
    Ok(spec)
}

pub fn run(global: &GlobalArgs, args: &ShareCreateArgs) -> anyhow::Result<()> {
    let spec = spec(args)?;
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::CreateShare(spec);
    match session.call(request.clone())? {
        ApiResponse::Done | ApiResponse::Share(_) => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("created share {}\n", args.name))
        }
        OutputFormat::Json => {
            let share = crate::share_get::fetch(&mut session, &args.name)
                .context("the share was created, but reading it back failed")?;
            output::print_json(&share)
        }
    }
}
