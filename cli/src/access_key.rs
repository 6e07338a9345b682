//! `quotient access-key create|list|delete` (admin): the access keys AWS clients sign
//! requests to the AWS Batch–compatible endpoint with (docs/aws-batch.md).

use quotient_common::api::{AccessKeyView, ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, rfc3339, OutputFormat, Table};
use crate::parse::parse_user_name;
use crate::GlobalArgs;

/// Arguments of `quotient access-key create`.
#[derive(Debug, clap::Args)]
pub struct AccessKeyCreateArgs {
    /// The user the key signs as (the name a certificate of theirs would carry): their shares
    /// and jobs are the key's.
    #[arg(long, value_parser = parse_user_name)]
    pub user: String,
    /// The key signs as an admin (creates and changes quota shares) instead of a user.
    #[arg(long)]
    pub admin: bool,
}

/// Arguments of `quotient access-key delete`.
#[derive(Debug, clap::Args)]
pub struct AccessKeyDeleteArgs {
    /// The access key id (AKQT...).
    pub id: String,
}

/// Arguments of `quotient access-key list`.
#[derive(Debug, clap::Args)]
pub struct AccessKeyListArgs {}

fn call(global: &GlobalArgs, request: ApiRequest) -> anyhow::Result<ApiResponse> {
    let mut session = Session::open(global.config.as_deref())?;
    session.call(request)
}

pub fn create(global: &GlobalArgs, args: &AccessKeyCreateArgs) -> anyhow::Result<()> {
    let request = ApiRequest::CreateAccessKey {
        user: args.user.clone(),
        admin: args.admin,
    };
    let key = match call(global, request.clone())? {
        ApiResponse::AccessKey(key) => key,
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Json => output::print_json(&key),
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&format!(
            "access key for {} ({}); the secret is shown this once, keep it:\n\
             AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\n",
            key.user,
            key.role,
            key.access_key_id,
            key.secret_access_key.as_deref().unwrap_or_default()
        )),
    }
}

pub fn list(global: &GlobalArgs, _args: &AccessKeyListArgs) -> anyhow::Result<()> {
    let request = ApiRequest::ListAccessKeys;
    let keys: Vec<AccessKeyView> = match call(global, request.clone())? {
        ApiResponse::AccessKeys(keys) => keys,
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Json => output::print_json(&keys),
        OutputFormat::Table | OutputFormat::Csv => {
            let mut table = Table::new(&["ACCESS KEY ID", "USER", "ROLE", "CREATED"]);
            for key in &keys {
                table.row(vec![
                    key.access_key_id.clone(),
                    key.user.clone(),
                    key.role.clone(),
                    rfc3339(key.created_ms),
                ]);
            }
            output::print_text(&table.render())
        }
    }
}

pub fn delete(global: &GlobalArgs, args: &AccessKeyDeleteArgs) -> anyhow::Result<()> {
    let request = ApiRequest::DeleteAccessKey {
        id: args.id.clone(),
    };
    let text = format!("deleted access key {}", args.id);
    match call(global, request.clone())? {
        ApiResponse::Done => match global.output {
            OutputFormat::Json => output::print_json(&serde_json::json!({ "done": text })),
            _ => output::print_text(&format!("{text}\n")),
        },
        other => Err(unexpected(&request, &other)),
    }
}
