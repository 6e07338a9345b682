//! `quotient cluster backup --out FILE`: a copy of the replicated state, for
//! `quotient-coordinator restore` (docs/operations.md, *Backup and restore*).
//!
//! The leader takes a fresh snapshot and sends its file in pieces; they are written after a
//! header naming the cluster to `FILE.partial`, then their checksum; the file is synced and
//! renamed to `FILE` once whole, so `FILE` is never a piece of a backup. An `--out` that is a
//! directory or a device is refused. If the leader replaces the snapshot before
//! the last piece (a newer snapshot, a new leader), the backup starts again, up to
//! [`BACKUP_TRIES`] times.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::backup::{backup_header, BackupChecksum};
use quotient_common::ErrorCode;

use crate::client::{unexpected, Session};
use crate::failure::RequestFailed;
use crate::output::{self, OutputFormat};
use crate::parse::UsageError;
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
    check_out(&args.out)?;
    let mut session = Session::open(global.config.as_deref())?;
    let mut tries = 0;
    let written = loop {
        tries += 1;
        match backup(&mut session, &args.out) {
            Ok(written) => break written,
            // The leader's "the snapshot was replaced".
            Err(error)
                if tries < BACKUP_TRIES
                    && RequestFailed::has_code(&error, ErrorCode::FailedPrecondition) =>
            {
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

/// `out` with `.partial` added to its name: `state.qbackup` becomes `state.qbackup.partial`.
fn partial_of(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_os_string();
    name.push(".partial");
    PathBuf::from(name)
}

/// Refuses an `--out` that names something other than a file (a directory, a device such as
/// `/dev/null`, a pipe): the backup is renamed over it once whole.
fn check_out(out: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(out) {
        Ok(found) if !found.is_file() => Err(UsageError(format!(
            "--out {} is not a regular file (a directory or a device): give the path of a file to write",
            out.display()
        ))
        .into()),
        _ => Ok(()),
    }
}

/// One try: every piece of one snapshot into `out`.
fn backup(session: &mut Session, out: &Path) -> anyhow::Result<Written> {
    let partial = partial_of(out);
    let mut file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut checksum = BackupChecksum::default();
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
            let header = backup_header(cluster);
            checksum.update(&header);
            file.write_all(&header)
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
        checksum.update(&data);
        file.write_all(&data)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        offset += data.len() as u64;
        if offset >= total_bytes {
            break;
        }
    }
    file.write_all(&checksum.finish())
        .with_context(|| format!("cannot write {}", partial.display()))?;
    file.sync_all()
        .with_context(|| format!("cannot sync {}", partial.display()))?;
    drop(file);
    std::fs::rename(&partial, out)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), out.display()))?;
    let mut written = written.expect("the first piece names the backup");
    written.bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or_default();
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partial_file_adds_to_the_name_and_keeps_other_files() {
        assert_eq!(
            partial_of(Path::new("/b/state.qbackup")),
            Path::new("/b/state.qbackup.partial")
        );
        assert_eq!(partial_of(Path::new("x")), Path::new("x.partial"));
    }

    #[test]
    fn an_out_that_is_a_directory_or_a_device_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for out in [dir.path(), Path::new("/dev/null")] {
            let error = check_out(out).unwrap_err();
            assert!(error.downcast_ref::<UsageError>().is_some(), "{error}");
            assert!(error.to_string().contains("not a regular file"), "{error}");
        }
        let file = dir.path().join("state.qbackup");
        check_out(&file).unwrap();
        std::fs::write(&file, b"an older backup").unwrap();
        check_out(&file).unwrap();
    }
}
