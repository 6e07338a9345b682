//! `quotient cluster backup --out FILE`: a copy of the replicated state, for
//! `quotient-coordinator restore` (docs/operations.md, *Backup and restore*).
//!
//! The leader takes a fresh snapshot and sends its file in pieces; they are written after a
//! header naming the cluster to `FILE.partial`, which is synced and renamed to `FILE` once
//! whole, so `FILE` is never a piece of a backup. If the leader replaces the snapshot before
//! the last piece (a newer snapshot, a new leader), the backup starts again, up to
//! [`BACKUP_TRIES`] times.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::backup::backup_header;
use quotient_common::ErrorCode;

use crate::client::{unexpected, Session};
use crate::failure::RequestFailed;
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// How many times a backup starts over after its snapshot was replaced.
pub const BACKUP_TRIES: u32 = 3;

/// Arguments of `quotient cluster backup`.
#[derive(Debug, clap::Args)]
pub struct ClusterBackupArgs {
    /// Where to write the backup (replaced if it exists).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// What a backup wrote.
#[derive(Debug, serde::Serialize)]
struct Written {
    file: String,
    cluster: String,
    last_log_index: u64,
    bytes: u64,
}

pub fn run(global: &GlobalArgs, args: &ClusterBackupArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let mut tries = 0;
    let written = loop {
        tries += 1;
        match backup(&mut session, &args.out) {
            Ok(written) => break written,
            Err(error) if tries < BACKUP_TRIES && replaced(&error) => {
                eprintln!("the snapshot changed during the backup; starting again");
            }
            Err(error) => return Err(error),
        }
    };
    match global.output {
        OutputFormat::Json => output::print_json(&written),
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&format!(
            "wrote {} ({} bytes): the state of cluster {} up to log index {}\n",
            written.file, written.bytes, written.cluster, written.last_log_index
        )),
    }
}

/// Whether `error` is the leader's "the snapshot was replaced".
fn replaced(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<RequestFailed>()
        .is_some_and(|failed| failed.code == ErrorCode::FailedPrecondition)
}

/// One try: every piece of one snapshot into `out`.
fn backup(session: &mut Session, out: &Path) -> anyhow::Result<Written> {
    let partial = out.with_extension("partial");
    let mut file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut snapshot: Option<String> = None;
    let mut offset = 0u64;
    let mut written = None;
    loop {
        let request = ApiRequest::Backup {
            snapshot: snapshot.clone(),
            offset,
        };
        let (cluster, id, last_log_index, total_bytes, data) =
            match session.call(request.clone())? {
                ApiResponse::BackupChunk {
                    cluster,
                    snapshot,
                    last_log_index,
                    total_bytes,
                    data,
                } => (cluster, snapshot, last_log_index, total_bytes, data),
                other => return Err(unexpected(&request, &other)),
            };
        if snapshot.is_none() {
            file.write_all(&backup_header(cluster))
                .with_context(|| format!("cannot write {}", partial.display()))?;
            snapshot = Some(id);
            written = Some(Written {
                file: out.display().to_string(),
                cluster: cluster.to_string(),
                last_log_index,
                bytes: 0,
            });
        }
        if data.is_empty() && offset < total_bytes {
            anyhow::bail!(
                "the leader sent an empty piece of the backup at offset {offset} of {total_bytes}"
            );
        }
        file.write_all(&data)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        offset += data.len() as u64;
        if offset >= total_bytes {
            break;
        }
    }
    file.sync_all()
        .with_context(|| format!("cannot sync {}", partial.display()))?;
    drop(file);
    std::fs::rename(&partial, out)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), out.display()))?;
    let mut written = written.expect("the first piece names the backup");
    written.bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or_default();
    Ok(written)
}
