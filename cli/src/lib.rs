//! The `quotient` command line (spec/cli.md): one module per command, named noun then verb.
//!
//! `main.rs` only parses arguments with clap and calls the command's `run`; each command
//! module owns its clap `Args` struct and returns `anyhow::Result`, so the binary prints the
//! whole cause chain and exits 1 for a failed command, while clap exits 2 for a usage error.
//!
//! # Layout
//! - [`certs_init`]: `quotient certs init`, a new cluster CA.
//! - [`certs_issue`]: `quotient certs issue`, a certificate for a coordinator, agent, admin
//!   or user, signed by that CA.

pub mod certs_init;
pub mod certs_issue;
