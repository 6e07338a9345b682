//! `quotient cluster add-member --id N --address ADDR`: adds a coordinator (admin only). It
//! joins as a learner, catches up on the log, then becomes a voter; the command returns once
//! the leader has committed the change. Start the new coordinator first.

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient cluster add-member`.
#[derive(Debug, clap::Args)]
pub struct ClusterAddMemberArgs {
    /// The new coordinator's id (its `--id`), unused by any member.
    #[arg(long, value_name = "N", value_parser = crate::parse::parse_member_id)]
    pub id: u64,
    /// The new coordinator's address, HOST:PORT (its `--listen`).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_address)]
    pub address: String,
}

/// Checks the HOST:PORT shape; the name itself is resolved by the coordinators.
pub fn parse_address(text: &str) -> Result<String, String> {
    let valid = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if valid {
        Ok(text.to_string())
    } else {
        Err(format!(
            "invalid address {text:?}: write HOST:PORT, e.g. 10.0.0.4:7401"
        ))
    }
}

pub fn run(global: &GlobalArgs, args: &ClusterAddMemberArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::AddMember {
        id: args.id,
        address: args.address.clone(),
    };
    match session.call(request.clone())? {
        ApiResponse::Done | ApiResponse::Cluster(_) => {}
        other => return Err(unexpected(&request, &other)),
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&format!(
            "added coordinator {} at {}\n",
            args.id, args.address
        )),
        OutputFormat::Json => {
            let view = crate::cluster_status::fetch(&mut session)
                .context("the member was added, but reading the cluster status failed")?;
            output::print_json(&view)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_need_a_host_and_a_port() {
        // Proves the HOST:PORT check.
        assert!(parse_address("127.0.0.1:7401").is_ok());
        assert!(parse_address("[::1]:7401").is_ok());
        assert!(parse_address("coord-4.example.org:7401").is_ok());
        assert!(parse_address("127.0.0.1").is_err());
        assert!(parse_address(":7401").is_err());
        assert!(parse_address("host:99999").is_err());
    }
}
