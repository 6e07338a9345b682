//! The `quotient` command line (docs/cli.md): one module per command, named noun then verb.
//!
//! `main.rs` only parses arguments with clap and calls the command's `run`; each command
//! module owns its clap `Args` struct and returns `anyhow::Result`, so the binary prints the
//! whole cause chain with its code ([`failure`]) and exits 1 for a failed command, 2 for a
//! usage error (clap's own, or a [`parse::UsageError`] found after parsing).
//!
//! # Layout
//! - [`client_config`]: the client config file and where it is looked for.
//! - [`client`]: the synchronous wrapper around the API client (`quotient-client`, which
//!   tries the coordinators, follows redirects and waits out elections within deadlines),
//!   and this program's hints for each refusal.
//! - [`failure`]: how a failed command prints its code (`error[CODE]: ...`, or JSON on
//!   stderr with `-o json`) and which exit status it gives.
//! - [`output`]: tables for people, `-o json` for machines.
//! - [`parse`]: value parsers (`CLASS=N`, `30s`, `KEY=VALUE`, ...) and [`parse::UsageError`].
//! - [`certs_init`], [`certs_issue`]: `quotient certs`.
//! - `share_create`, `share_update`, `share_delete`, `share_list`, `share_get`.
//! - `job_submit`, `job_get`, `job_list`, `job_update`, `job_cancel`, `job_explain`,
//!   `job_logs`.
//! - `node_list`, `node_cordon`, `node_uncordon`, `node_drain`, `node_remove`.
//! - `cluster_init`, `cluster_status`, `cluster_health`, `cluster_add_member`,
//!   `cluster_remove_member`.
//! - [`demo`]: `quotient demo`, the spec's walkthrough on a fresh local cluster.
//! - [`what_if`]: `quotient what-if`, a share design tried on a workload trace offline
//!   (`quotient-eval`).
//! - [`dev_cluster`]: the local cluster's directory layout, `cluster.json` and processes;
//!   [`dev_up`] and [`dev_down`] are `quotient dev up` and `quotient dev down`.

use std::path::PathBuf;

pub mod access_key;
pub mod accounting;
pub mod certs_init;
pub mod certs_issue;
pub mod client;
pub mod client_config;
pub mod cluster_add_member;
pub mod cluster_backup;
pub mod cluster_health;
pub mod cluster_init;
pub mod cluster_remove_member;
pub mod cluster_status;
pub mod demo;
pub mod dev_cluster;
pub mod dev_down;
pub mod dev_up;
pub mod events;
pub mod failure;
pub mod job_cancel;
pub mod job_explain;
pub mod job_get;
pub mod job_list;
pub mod job_logs;
pub mod job_submit;
pub mod job_update;
pub mod node_change;
pub mod node_cordon;
pub mod node_drain;
pub mod node_list;
pub mod node_remove;
pub mod node_uncordon;
pub mod output;
pub mod parse;
pub mod share_create;
pub mod share_delete;
pub mod share_get;
pub mod share_list;
pub mod share_update;
pub mod tenancy;
pub mod what_if;

/// Flags every command takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GlobalArgs {
    /// The client config file [default: $QUOTIENT_CONFIG, else ~/.config/quotient/config.toml].
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Output format: aligned tables, one JSON document on stdout, or CSV (job history and
    /// share usage).
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        value_name = "FORMAT",
        default_value_t = output::OutputFormat::Table
    )]
    pub output: output::OutputFormat,
}
