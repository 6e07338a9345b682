//! The `quotient` binary: parses the command line and runs one command (docs/cli.md).
//!
//! Kept thin on purpose: each command's arguments and code live in the library, in a module
//! named noun then verb. To add a command group, add a variant to [`Command`] with its own
//! subcommand enum, and a match arm in [`run`].

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use quotient_cli::failure::{self, Failure};
use quotient_cli::*;

/// Quotient: quota shares of a GPU fleet.
#[derive(Debug, Parser)]
#[command(name = "quotient", version, about)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make the cluster's certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Quota shares: GPUs per class that a team is entitled to.
    #[command(subcommand)]
    Share(ShareCommand),
    /// Training jobs: submit, inspect, reprioritise, cancel.
    #[command(subcommand)]
    Job(JobCommand),
    /// GPU hosts.
    #[command(subcommand)]
    Node(NodeCommand),
    /// The coordinators: status, health and membership.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// A local cluster of real processes on loopback, for trying Quotient out.
    #[command(subcommand)]
    Dev(DevCommand),
    /// Run the walkthrough of docs/quota-shares.md on a fresh local cluster, narrated.
    Demo(demo::DemoArgs),
    /// Groups of users, for shares' members (admin).
    #[command(subcommand)]
    Group(GroupCommand),
    /// Who did what: admin actions and refusals for lack of rights (admin).
    Audit(tenancy::AuditArgs),
    /// What happened, oldest first: jobs' state changes, preemptions, nodes, shares.
    Events(events::EventsArgs),
    /// Access keys for the AWS Batch–compatible endpoint (admin).
    #[command(subcommand)]
    AccessKey(AccessKeyCommand),
    /// Try a share design on a workload trace in virtual time, against static partitions and
    /// the naive victim choice; or --generate a synthetic starting point.
    WhatIf(what_if::WhatIfArgs),
}

#[derive(Debug, Subcommand)]
enum AccessKeyCommand {
    /// Issue a key for a user; its secret is printed this once (admin).
    Create(access_key::AccessKeyCreateArgs),
    /// The keys, without their secrets (admin).
    List(access_key::AccessKeyListArgs),
    /// Delete a key: requests signed with it are refused from then on (admin).
    Delete(access_key::AccessKeyDeleteArgs),
}

#[derive(Debug, Subcommand)]
enum GroupCommand {
    /// Declare a group of users (admin).
    Create(tenancy::GroupCreateArgs),
    /// Add or remove users (admin).
    Update(tenancy::GroupUpdateArgs),
    /// Delete a group (admin).
    Delete(tenancy::GroupDeleteArgs),
    /// List the groups.
    List(tenancy::GroupListArgs),
}

#[derive(Debug, Subcommand)]
enum DevCommand {
    /// Start (or resume) a local cluster in DIR and print the export line for its config.
    Up(dev_up::DevUpArgs),
    /// Stop the local cluster in DIR; its data stays.
    Down(dev_down::DevDownArgs),
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Create the cluster CA: DIR/ca.pem and DIR/ca-key.pem.
    Init(certs_init::CertsInitArgs),
    /// Issue a certificate signed by DIR's CA: DIR/NAME.pem and DIR/NAME-key.pem.
    Issue(certs_issue::CertsIssueArgs),
    /// Revoke the certificates of a name on the cluster: refused from now on (admin).
    Revoke(tenancy::CertsRevokeArgs),
    /// Take a name back out of the revoked list (admin).
    Unrevoke(tenancy::CertsUnrevokeArgs),
    /// List the revoked names (admin).
    Revoked(tenancy::CertsRevokedArgs),
}

#[derive(Debug, Subcommand)]
enum ShareCommand {
    /// Create a share (admin).
    Create(share_create::ShareCreateArgs),
    /// Change a share's limits, strategy, borrow limit, preemption or state (admin).
    Update(share_update::ShareUpdateArgs),
    /// Delete a disabled share, cancelling its jobs (admin).
    Delete(share_delete::ShareDeleteArgs),
    /// List the shares with their usage.
    List(share_list::ShareListArgs),
    /// Show one share.
    Get(share_get::ShareGetArgs),
    /// GPU time each share used of its own quota, borrowed and lent, per class.
    Usage(accounting::ShareUsageArgs),
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Submit a job; prints its id.
    Submit(Box<job_submit::JobSubmitArgs>),
    /// Show one job.
    Get(job_get::JobGetArgs),
    /// List jobs.
    List(job_list::JobListArgs),
    /// Change a job's priority.
    Update(job_update::JobUpdateArgs),
    /// Cancel a job.
    Cancel(job_cancel::JobCancelArgs),
    /// Say why a job waits, runs where it does, or ended.
    Explain(job_explain::JobExplainArgs),
    /// Print a job's logs from the node that ran it (the current or last attempt).
    Logs(job_logs::JobLogsArgs),
    /// The finished jobs the coordinator's history keeps, newest end first.
    History(accounting::JobHistoryArgs),
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// List the nodes and their GPUs.
    List(node_list::NodeListArgs),
    /// Place no new jobs on a node (admin).
    Cordon(node_cordon::NodeCordonArgs),
    /// Let a cordoned node take jobs again (admin).
    Uncordon(node_uncordon::NodeUncordonArgs),
    /// Cordon a node and move its jobs elsewhere (admin).
    Drain(node_drain::NodeDrainArgs),
    /// Forget a node that is cordoned, draining or lost, holds no job and whose agent is
    /// stopped (admin).
    Remove(node_remove::NodeRemoveArgs),
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Bootstrap a new cluster on one coordinator, once; the others join it (admin).
    Init(cluster_init::ClusterInitArgs),
    /// The leader, the term and each coordinator's role.
    Status(cluster_status::ClusterStatusArgs),
    /// Ask each configured coordinator whether it is up; exits 1 if any is not.
    Health(cluster_health::ClusterHealthArgs),
    /// Add a coordinator: it joins as a learner, then becomes a voter (admin).
    AddMember(cluster_add_member::ClusterAddMemberArgs),
    /// Remove a coordinator (admin).
    RemoveMember(cluster_remove_member::ClusterRemoveMemberArgs),
    /// Write a copy of the replicated state to a file, for `quotient-coordinator restore`
    /// (admin).
    Backup(cluster_backup::ClusterBackupArgs),
}

fn run(global: &GlobalArgs, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Certs(CertsCommand::Init(args)) => certs_init::run(&args),
        Command::Certs(CertsCommand::Issue(args)) => certs_issue::run(&args),
        Command::Share(ShareCommand::Create(args)) => share_create::run(global, &args),
        Command::Share(ShareCommand::Update(args)) => share_update::run(global, &args),
        Command::Share(ShareCommand::Delete(args)) => share_delete::run(global, &args),
        Command::Share(ShareCommand::List(args)) => share_list::run(global, &args),
        Command::Share(ShareCommand::Get(args)) => share_get::run(global, &args),
        Command::Share(ShareCommand::Usage(args)) => accounting::share_usage(global, &args),
        Command::Job(JobCommand::Submit(args)) => job_submit::run(global, &args),
        Command::Job(JobCommand::Get(args)) => job_get::run(global, &args),
        Command::Job(JobCommand::List(args)) => job_list::run(global, &args),
        Command::Job(JobCommand::Update(args)) => job_update::run(global, &args),
        Command::Job(JobCommand::Cancel(args)) => job_cancel::run(global, &args),
        Command::Job(JobCommand::Explain(args)) => job_explain::run(global, &args),
        Command::Job(JobCommand::Logs(args)) => job_logs::run(global, &args),
        Command::Job(JobCommand::History(args)) => accounting::job_history(global, &args),
        Command::Node(NodeCommand::List(args)) => node_list::run(global, &args),
        Command::Node(NodeCommand::Cordon(args)) => node_cordon::run(global, &args),
        Command::Node(NodeCommand::Uncordon(args)) => node_uncordon::run(global, &args),
        Command::Node(NodeCommand::Drain(args)) => node_drain::run(global, &args),
        Command::Cluster(ClusterCommand::Init(args)) => cluster_init::run(global, &args),
        Command::Node(NodeCommand::Remove(args)) => node_remove::run(global, &args),
        Command::Cluster(ClusterCommand::Status(args)) => cluster_status::run(global, &args),
        Command::Cluster(ClusterCommand::Backup(args)) => cluster_backup::run(global, &args),
        Command::Cluster(ClusterCommand::Health(args)) => cluster_health::run(global, &args),
        Command::Cluster(ClusterCommand::AddMember(args)) => cluster_add_member::run(global, &args),
        Command::Cluster(ClusterCommand::RemoveMember(args)) => {
            cluster_remove_member::run(global, &args)
        }
        Command::Dev(DevCommand::Up(args)) => dev_up::run(global, &args),
        Command::Dev(DevCommand::Down(args)) => dev_down::run(global, &args),
        Command::Demo(args) => demo::run(&args),
        Command::AccessKey(AccessKeyCommand::Create(args)) => access_key::create(global, &args),
        Command::AccessKey(AccessKeyCommand::List(args)) => access_key::list(global, &args),
        Command::AccessKey(AccessKeyCommand::Delete(args)) => access_key::delete(global, &args),
        Command::Group(GroupCommand::Create(args)) => tenancy::group_create(global, &args),
        Command::Group(GroupCommand::Update(args)) => tenancy::group_update(global, &args),
        Command::Group(GroupCommand::Delete(args)) => tenancy::group_delete(global, &args),
        Command::Group(GroupCommand::List(args)) => tenancy::group_list(global, &args),
        Command::Audit(args) => tenancy::audit(global, &args),
        Command::Events(args) => events::run(global, &args),
        Command::WhatIf(args) => what_if::run(global, &args),
        Command::Certs(CertsCommand::Revoke(args)) => tenancy::certs_revoke(global, &args),
        Command::Certs(CertsCommand::Unrevoke(args)) => tenancy::certs_unrevoke(global, &args),
        Command::Certs(CertsCommand::Revoked(args)) => tenancy::certs_revoked(global, &args),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    let tabular = matches!(
        cli.command,
        Command::Job(JobCommand::History(_)) | Command::Share(ShareCommand::Usage(_))
    );
    if cli.global.output == output::OutputFormat::Csv && !tabular {
        let error = clap::Error::raw(
            clap::error::ErrorKind::InvalidValue,
            "-o csv is for `job history` and `share usage`; use -o table or -o json here\n",
        );
        return usage_error(error);
    }
    match run(&cli.global, cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => report(&Failure::of(&error), cli.global.output),
    }
}

/// Prints `failure` on stderr in `format` and gives its exit status.
fn report(failure: &Failure, format: output::OutputFormat) -> ExitCode {
    eprint!("{}", failure.render(format));
    ExitCode::from(failure.exit_status)
}

/// clap's own usage errors carry a code like every other (help and version print as clap
/// prints them).
fn usage_error(error: clap::Error) -> ExitCode {
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        error.exit();
    }
    let rendered = error.render().to_string();
    let message = rendered.trim_end();
    let message = message.strip_prefix("error: ").unwrap_or(message);
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    report(
        &Failure::usage(message.to_string()),
        failure::format_in_arguments(&arguments),
    )
}
