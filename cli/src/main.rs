//! The `quotient` binary: parses the command line and runs one command (spec/cli.md).
//!
//! Kept thin on purpose: each command's arguments and code live in the library, in a module
//! named noun then verb. To add a command group, add a variant to [`Command`] with its own
//! subcommand enum, and a match arm in [`run`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use quotient_cli::certs_init::{self, CertsInitArgs};
use quotient_cli::certs_issue::{self, CertsIssueArgs};

/// Exit status of a command that was understood but failed (clap exits 2 for usage errors).
const EXIT_FAILED: u8 = 1;

/// Quotient: quota shares of a GPU fleet.
#[derive(Debug, Parser)]
#[command(name = "quotient", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make the cluster's certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Create the cluster CA: DIR/ca.pem and DIR/ca-key.pem.
    Init(CertsInitArgs),
    /// Issue a certificate signed by DIR's CA: DIR/NAME.pem and DIR/NAME-key.pem.
    Issue(CertsIssueArgs),
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Certs(CertsCommand::Init(args)) => certs_init::run(&args),
        Command::Certs(CertsCommand::Issue(args)) => certs_issue::run(&args),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
