//! `quotient certs init --dir DIR`: creates the cluster CA, DIR/ca.pem and DIR/ca-key.pem.
//!
//! The CA signs every certificate of one cluster; it is never overwritten (the library
//! refuses), because a new CA would lock out everything the old one signed.

use std::path::PathBuf;

use anyhow::Context;
use quotient_common::certs;

/// Arguments of `quotient certs init`.
#[derive(Debug, clap::Args)]
pub struct CertsInitArgs {
    /// Directory for ca.pem and ca-key.pem (created if missing).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Creates the CA and says where it went and what to do next.
pub fn run(args: &CertsInitArgs) -> anyhow::Result<()> {
    let files = certs::init_ca(&args.dir)
        .with_context(|| format!("cannot create a CA in {}", args.dir.display()))?;
    println!("wrote {} and {}", files.cert.display(), files.key.display());
    println!(
        "next: quotient certs issue --dir {} --role coordinator --name coord-1",
        args.dir.display()
    );
    Ok(())
}
