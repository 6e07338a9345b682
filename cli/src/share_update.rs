//! `quotient share update NAME [--limit CLASS=N ...] [--strategy S] [--borrow-limit PERCENT]
//! [--in-share-preemption true|false] [--state enabled|disabled]`: changes a share (admin only).
//!
//! Only the named fields change; `--limit` sets the classes it names and keeps the others.
//! `--borrow-limit none` removes the borrow cap.

use std::collections::BTreeMap;

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::{GpuClass, ShareState, ShareUpdate, Strategy};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::{
    parse_borrow_limit, parse_cap, parse_limit, parse_share_name, BorrowLimit, Cap, UsageError,
};
use crate::GlobalArgs;

/// Arguments of `quotient share update`.
#[derive(Debug, clap::Args)]
pub struct ShareUpdateArgs {
    /// The share's name.
    #[arg(value_parser = parse_share_name)]
    pub name: String,
    /// A new limit for one class, as CLASS=N; repeat for several. Classes not named keep theirs.
    #[arg(long = "limit", value_name = "CLASS=N", value_parser = parse_limit)]
    pub limits: Vec<(GpuClass, u32)>,
    /// reserve, lend or lend-and-borrow.
    #[arg(long, value_name = "STRATEGY")]
    pub strategy: Option<Strategy>,
    /// Borrow cap in percent of the limit (lend-and-borrow only), or `none` for no cap.
    #[arg(long = "borrow-limit", value_name = "PERCENT|none", value_parser = parse_borrow_limit, allow_negative_numbers = true)]
    pub borrow_limit_percent: Option<BorrowLimit>,
    /// Whether a higher-priority job may preempt a lower one of the same share.
    #[arg(long, value_name = "true|false")]
    pub in_share_preemption: Option<bool>,
    /// enabled or disabled (a disabled share takes no new jobs).
    #[arg(long, value_name = "STATE")]
    pub state: Option<ShareState>,
    /// Replaces the members with these (a user or `group:NAME`; repeat for several).
    #[arg(long = "member", value_name = "USER|group:NAME")]
    pub members: Vec<String>,
    /// Opens the share to every user (removes every member).
    #[arg(long, conflicts_with_all = ["members", "add_members"])]
    pub open: bool,
    /// Adds a member; repeat for several.
    #[arg(long = "add-member", value_name = "USER|group:NAME")]
    pub add_members: Vec<String>,
    /// Removes a member; repeat for several.
    #[arg(long = "remove-member", value_name = "USER|group:NAME")]
    pub remove_members: Vec<String>,
    /// The most jobs one user may have queued or running in the share, or `none`.
    #[arg(long, value_name = "N|none", value_parser = parse_cap, allow_negative_numbers = true)]
    pub max_jobs_per_user: Option<Cap>,
}

/// Builds the update from the flags given; at least one must be.
pub fn update(args: &ShareUpdateArgs) -> Result<ShareUpdate, UsageError> {
    // Found by probing: both were taken, the remove winning, with no word.
    if let Some(both) = args
        .add_members
        .iter()
        .find(|member| args.remove_members.contains(member))
    {
        return Err(UsageError(format!(
            "--add-member and --remove-member both name {both}: give it once"
        )));
    }
    let limits = if args.limits.is_empty() {
        None
    } else {
        let mut limits = BTreeMap::new();
        for (class, count) in &args.limits {
            if limits.insert(class.clone(), *count).is_some() {
                return Err(UsageError(format!(
                    "--limit names GPU class {class} twice: give each class once"
                )));
            }
        }
        Some(limits)
    };
    let update = ShareUpdate {
        limits,
        strategy: args.strategy,
        borrow_limit_percent: args.borrow_limit_percent.map(|limit| limit.0),
        in_share_preemption: args.in_share_preemption,
        state: args.state,
        members: if args.open {
            Some(Vec::new())
        } else {
            (!args.members.is_empty()).then(|| args.members.clone())
        },
        add_members: args.add_members.clone(),
        remove_members: args.remove_members.clone(),
        max_jobs_per_user: args.max_jobs_per_user.map(|cap| cap.0),
    };
    for member in update
        .members
        .iter()
        .flatten()
        .chain(&update.add_members)
        .chain(&update.remove_members)
    {
        quotient_common::share::validate_member(member)
            .map_err(|error| UsageError(error.to_string()))?;
    }
    if update == ShareUpdate::default() {
        return Err(UsageError(
            "nothing to update: give at least one of --limit, --strategy, --borrow-limit, \
             --in-share-preemption, --state, --member, --open, --add-member, --remove-member or \
             --max-jobs-per-user"
                .to_string(),
        ));
    }
    Ok(update)
}

pub fn run(global: &GlobalArgs, args: &ShareUpdateArgs) -> anyhow::Result<()> {
    let update = update(args)?;
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::UpdateShare {
        name: args.name.clone(),
        update,
    };
    match session.call(request.clone())? {
        ApiResponse::Done | ApiResponse::Share(_) => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&format!("updated share {}\n", args.name))
        }
        OutputFormat::Json => {
            let share = crate::share_get::fetch(&mut session, &args.name)
                .context("the share was updated, but reading it back failed")?;
            output::print_json(&share)
        }
    }
}
