//! The commands of tenancy (admin): `quotient group create|update|delete|list`, `quotient
//! audit`, and `quotient certs revoke|unrevoke|revoked` (sent to the cluster, unlike `certs
//! init` and `certs issue`, which work on local files). docs/tenancy.md says what they mean.

use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, rfc3339, OutputFormat, Table};
use crate::parse::{parse_certificate_name, parse_group_name, parse_user_name, UsageError};
use crate::GlobalArgs;

/// Arguments of `quotient group create`.
#[derive(Debug, clap::Args)]
pub struct GroupCreateArgs {
    /// The group's name; shares name it as a member with `group:NAME`.
    #[arg(value_parser = parse_group_name)]
    pub name: String,
    /// A user of the group (the name in their certificate); repeat for several.
    #[arg(long = "user", value_name = "USER", value_parser = parse_user_name)]
    pub users: Vec<String>,
}

/// Arguments of `quotient group update`.
#[derive(Debug, clap::Args)]
pub struct GroupUpdateArgs {
    #[arg(value_parser = parse_group_name)]
    pub name: String,
    /// A user to add; repeat for several.
    #[arg(long = "add-user", value_name = "USER", value_parser = parse_user_name)]
    pub add: Vec<String>,
    /// A user to remove; repeat for several.
    #[arg(long = "remove-user", value_name = "USER", value_parser = parse_user_name)]
    pub remove: Vec<String>,
}

/// Arguments of `quotient group delete`.
#[derive(Debug, clap::Args)]
pub struct GroupDeleteArgs {
    #[arg(value_parser = parse_group_name)]
    pub name: String,
}

/// Arguments of `quotient group list`.
#[derive(Debug, clap::Args)]
pub struct GroupListArgs {}

/// Arguments of `quotient audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Only the entries since then: how long ago (24h, 90m, 7d) or an RFC 3339 time, as for
    /// `job history`.
    #[arg(long, value_name = "TIME", value_parser = crate::accounting::parse_time_ms)]
    pub since: Option<u64>,
    /// Only the entries of this user (the name in the certificate).
    #[arg(long, value_name = "NAME", value_parser = parse_user_name)]
    pub user: Option<String>,
}

/// Arguments of `quotient certs revoke`.
#[derive(Debug, clap::Args)]
pub struct CertsRevokeArgs {
    /// The certificate's name (a user, an admin or an agent's node).
    #[arg(long, value_parser = parse_certificate_name)]
    pub name: String,
    /// Only the certificate of this serial number (hex, as `certs issue` or `openssl x509
    /// -serial` prints it) [default: every certificate of the name].
    #[arg(long, value_name = "HEX", value_parser = crate::parse::parse_serial)]
    pub serial: Option<String>,
}

/// Arguments of `quotient certs unrevoke`.
#[derive(Debug, clap::Args)]
pub struct CertsUnrevokeArgs {
    #[arg(long, value_parser = parse_certificate_name)]
    pub name: String,
}

/// Arguments of `quotient certs revoked`.
#[derive(Debug, clap::Args)]
pub struct CertsRevokedArgs {}

fn done(global: &GlobalArgs, request: ApiRequest, text: String) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    match session.call(request.clone())? {
        ApiResponse::Done => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&format!("{text}\n")),
        OutputFormat::Json => output::print_json(&serde_json::json!({ "done": text })),
    }
}

pub fn group_create(global: &GlobalArgs, args: &GroupCreateArgs) -> anyhow::Result<()> {
    let request = ApiRequest::CreateGroup {
        name: args.name.clone(),
        users: args.users.clone(),
    };
    done(global, request, format!("created group {}", args.name))
}

pub fn group_update(global: &GlobalArgs, args: &GroupUpdateArgs) -> anyhow::Result<()> {
    if args.add.is_empty() && args.remove.is_empty() {
        return Err(
            UsageError("nothing to update: give --add-user or --remove-user".into()).into(),
        );
    }
    let request = ApiRequest::UpdateGroup {
        name: args.name.clone(),
        add: args.add.clone(),
        remove: args.remove.clone(),
    };
    done(global, request, format!("updated group {}", args.name))
}

pub fn group_delete(global: &GlobalArgs, args: &GroupDeleteArgs) -> anyhow::Result<()> {
    let request = ApiRequest::DeleteGroup {
        name: args.name.clone(),
    };
    done(global, request, format!("deleted group {}", args.name))
}

pub fn group_list(global: &GlobalArgs, _args: &GroupListArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::ListGroups;
    let groups = match session.call(request.clone())? {
        ApiResponse::Groups(groups) => groups,
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            let mut table = Table::new(&["NAME", "USERS"]);
            for group in &groups {
                table.row(vec![group.name.clone(), group.users.join(",")]);
            }
            output::print_text(&table.render())
        }
        OutputFormat::Json => output::print_json(&groups),
    }
}

pub fn audit(global: &GlobalArgs, args: &AuditArgs) -> anyhow::Result<()> {
    let since_ms = args.since;
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::Audit {
        since_ms,
        user: args.user.clone(),
    };
    let entries = match session.call(request.clone())? {
        ApiResponse::Audit(entries) => entries,
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            let mut table = Table::new(&["AT", "WHO", "ACTION", "OUTCOME"]);
            for entry in &entries {
                table.row(vec![
                    rfc3339(entry.at_ms),
                    entry.who.clone(),
                    entry.action.clone(),
                    entry.outcome.clone(),
                ]);
            }
            output::print_text(&table.render())
        }
        OutputFormat::Json => output::print_json(&entries),
    }
}

pub fn certs_revoke(global: &GlobalArgs, args: &CertsRevokeArgs) -> anyhow::Result<()> {
    let request = ApiRequest::Revoke {
        name: args.name.clone(),
        serial: args.serial.clone(),
    };
    let said = match &args.serial {
        Some(serial) => format!(
            "revoked the certificate of {} with serial {serial}",
            args.name
        ),
        None => format!("revoked every certificate of {}", args.name),
    };
    done(global, request, said)
}

pub fn certs_unrevoke(global: &GlobalArgs, args: &CertsUnrevokeArgs) -> anyhow::Result<()> {
    let request = ApiRequest::Unrevoke {
        name: args.name.clone(),
    };
    done(
        global,
        request,
        format!("{} is no longer revoked", args.name),
    )
}

pub fn certs_revoked(global: &GlobalArgs, _args: &CertsRevokedArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::ListRevoked;
    let revoked = match session.call(request.clone())? {
        ApiResponse::Revoked(revoked) => revoked,
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            let mut table = Table::new(&["NAME", "SERIAL", "REVOKED"]);
            for entry in &revoked {
                table.row(vec![
                    entry.name.clone(),
                    entry.serial.clone().unwrap_or_else(|| "-".into()),
                    rfc3339(entry.at_ms),
                ]);
            }
            output::print_text(&table.render())
        }
        OutputFormat::Json => output::print_json(&revoked),
    }
}
