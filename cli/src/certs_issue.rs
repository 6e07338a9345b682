//! `quotient certs issue --dir DIR --role ROLE --name NAME [--san HOST ...]`: a certificate
//! and key for one coordinator, agent, admin or user, signed by DIR's CA.
//!
//! The role and name go into the certificate, and the coordinators authorise by them. The
//! role and the name are checked while parsing, so a bad one is a usage error (exit 2).

use std::path::PathBuf;

use anyhow::Context;
use quotient_common::certs::{self, Role};

use crate::parse::{parse_certificate_name, parse_san};

/// The role as spelled on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    Coordinator,
    Agent,
    Admin,
    User,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Self {
        match role {
            RoleArg::Coordinator => Role::Coordinator,
            RoleArg::Agent => Role::Agent,
            RoleArg::Admin => Role::Admin,
            RoleArg::User => Role::User,
        }
    }
}

/// Arguments of `quotient certs issue`.
#[derive(Debug, clap::Args)]
pub struct CertsIssueArgs {
    /// Directory holding the CA (from `quotient certs init`); NAME.pem and NAME-key.pem go here.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// What the holder is in the cluster.
    #[arg(long, value_enum)]
    pub role: RoleArg,
    /// The holder's name: 1-128 characters of A-Z, a-z, 0-9, '_' and '-'.
    #[arg(long, value_name = "NAME", value_parser = parse_certificate_name)]
    pub name: String,
    /// Another host name or IP address the holder serves on (coordinators and agents); repeat
    /// for several. localhost and 127.0.0.1 are always included for them.
    #[arg(long = "san", value_name = "HOST", value_parser = parse_san)]
    pub sans: Vec<String>,
    /// How many days it is valid, 1-3650 [default: 365 for admins and users, 1825 for
    /// coordinators and agents]. The CLI warns in the last 14 days of its own.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub days: Option<u64>,
}

/// Issues the certificate and says where it went.
pub fn run(args: &CertsIssueArgs) -> anyhow::Result<()> {
    let role = Role::from(args.role);
    let days = args.days.unwrap_or(certs::default_validity_days(role));
    let files =
        certs::issue_for(&args.dir, role, &args.name, &args.sans, days).with_context(|| {
            // "an admin", "an agent", but "a user" (found by probing: "an user").
            let article = if role.to_string().starts_with(['a', 'e', 'i', 'o']) {
                "an"
            } else {
                "a"
            };
            format!(
                "cannot issue {article} {role} certificate for {} in {}",
                args.name,
                args.dir.display()
            )
        })?;
    println!(
        "wrote {} and {} ({role} {})",
        files.cert.display(),
        files.key.display(),
        args.name
    );
    // The serial is what revokes this one certificate and no other of the name.
    if let Ok(facts) = certs::certificate_facts(&files.cert) {
        // What it got, which the CA's own end may cut short (found by probing: "valid for
        // 1825 days" printed for a certificate of 50).
        let now = certs::unix_now_s();
        let got = ((facts.expires_at - now).max(0) + 43_200) / 86_400;
        let until =
            crate::output::rfc3339(u64::try_from(facts.expires_at.max(0)).unwrap_or(0) * 1000);
        let plural = |count: i64| if count == 1 { "" } else { "s" };
        println!(
            "serial {}, valid for {got} day{} (until {until})",
            facts.serial,
            plural(got)
        );
        if (got as u64) < days.saturating_sub(1) {
            println!(
                "note: cut short from the {days} day{} asked for: no certificate outlives its CA, which ends then; plan the move to a new CA before it (\"Rotating the CA\" in docs/operations.md)",
                plural(days as i64)
            );
        }
    }
    Ok(())
}
