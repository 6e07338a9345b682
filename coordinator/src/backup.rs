//! Backup and restore of the replicated state.
//!
//! **Backup** (`quotient cluster backup`, [`ApiRequest::Backup`]): the coordinator asked takes
//! a fresh snapshot of its state (everything it applied when asked) and sends its snapshot
//! file in pieces of [`BACKUP_CHUNK_BYTES`]; the CLI writes them after a header naming the
//! cluster (`quotient_common::backup`). A coordinator keeps serving while it does: building a
//! snapshot holds the state's lock only to capture it.
//!
//! **Restore** (`quotient-coordinator restore`): makes an empty data directory hold that
//! state as the snapshot of a new cluster of the given members (every member restored from
//! the same file, with the same `--peers`), recording the backup's cluster id, so that agents
//! and client configs of that cluster are taken back. The members then elect a leader among
//! themselves without `cluster init`, and go on from the backup's log index. What happened
//! after the backup is lost, as with any restore: use it when a quorum of data directories is
//! gone, not to replace one member (`cluster add-member` does that, from the others).
//!
//! The job history (`history.redb`) is each coordinator's own and is not in a backup: a
//! restored member writes the records of the finished jobs the state still holds.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Vote};
use quotient_common::api::{ApiError, ApiResponse, BACKUP_CHUNK_BYTES};
use quotient_common::backup::{
    parse_backup, parse_backup_header, BACKUP_HEADER_BYTES, BACKUP_TRAILER_BYTES,
};
use quotient_common::ClusterId;

use crate::context::Context;
use crate::identity::{ClusterIdentity, IDENTITY_FILE_NAME};
use crate::store::state_machine::{
    snapshot_piece, write_restored_snapshot, MAX_SNAPSHOT_FILE_BYTES, SNAPSHOT_FILE_NAME,
};
use crate::store::{LogStore, MemberId};

/// How long a backup waits for its snapshot to be built.
pub const BACKUP_SNAPSHOT_TIMEOUT_MS: u64 = 60_000;
/// The largest backup file read back: its header, the largest snapshot file and the checksum.
pub const BACKUP_FILE_BYTES_MAX: u64 =
    (BACKUP_HEADER_BYTES + BACKUP_TRAILER_BYTES) as u64 + MAX_SNAPSHOT_FILE_BYTES;

/// Answers one [`ApiRequest::Backup`](quotient_common::api::ApiRequest::Backup).
pub async fn chunk(
    ctx: &Context,
    snapshot: Option<String>,
    offset: u64,
) -> Result<ApiResponse, ApiError> {
    let cluster = ctx.identity.cluster().ok_or_else(|| {
        ApiError::Unavailable(
            "this coordinator belongs to no cluster yet: nothing to back up".into(),
        )
    })?;
    if snapshot.is_none() {
        if offset != 0 {
            return Err(ApiError::BadRequest(
                "a backup starts at offset 0 without a snapshot".into(),
            ));
        }
        fresh_snapshot(ctx).await?;
    }
    let dir = ctx.config.data_dir.clone();
    let piece =
        tokio::task::spawn_blocking(move || snapshot_piece(&dir, offset, BACKUP_CHUNK_BYTES))
            .await
            .map_err(|error| ApiError::Internal(error.to_string()))?
            .map_err(|error| ApiError::Internal(format!("cannot read the snapshot: {error}")))?
            .ok_or_else(|| {
                ApiError::Unavailable("this coordinator holds no snapshot yet".into())
            })?;
    if let Some(wanted) = snapshot.filter(|wanted| *wanted != piece.snapshot_id) {
        return Err(ApiError::Precondition(format!(
            "the coordinator replaced snapshot {wanted} by {} during the backup: start the backup again",
            piece.snapshot_id
        )));
    }
    Ok(ApiResponse::BackupChunk {
        cluster,
        snapshot: piece.snapshot_id,
        last_log_index: piece.last_log_index,
        total_bytes: piece.total_bytes,
        data: piece.data,
    })
}

/// Has Raft build a snapshot of everything applied now, and waits until it is on disk.
async fn fresh_snapshot(ctx: &Context) -> Result<(), ApiError> {
    let applied = ctx.raft.metrics().borrow().last_applied;
    if ctx.raft.metrics().borrow().snapshot >= applied {
        return Ok(());
    }
    ctx.raft
        .trigger()
        .snapshot()
        .await
        .map_err(|error| ApiError::Unavailable(format!("cannot take a snapshot: {error}")))?;
    let mut metrics = ctx.raft.metrics();
    let built = tokio::time::timeout(
        Duration::from_millis(BACKUP_SNAPSHOT_TIMEOUT_MS),
        metrics.wait_for(|metrics| metrics.snapshot >= applied),
    )
    .await;
    match built {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(ApiError::Unavailable(
            "raft stopped during the backup".into(),
        )),
        Err(_) => Err(ApiError::Unavailable(format!(
            "no snapshot within {BACKUP_SNAPSHOT_TIMEOUT_MS} ms: try again"
        ))),
    }
}

/// Why a restore did not happen; nothing is left half-written in the data directory but the
/// snapshot file of a restore that failed afterwards (remove the directory and try again).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot read the backup {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the backup {} is {bytes} bytes or more, more than the largest state ({BACKUP_FILE_BYTES_MAX} bytes): is it a backup?", path.display())]
    TooLarge { path: PathBuf, bytes: u64 },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{} already holds a coordinator's data ({found}): restore into an empty directory (move the old one away first)", dir.display())]
    NotEmpty { dir: PathBuf, found: String },
    #[error("--id {id} is not one of --peers ({peers}): give every member's id and address, this one's included")]
    NotAPeer { id: MemberId, peers: String },
    #[error("cannot write {}: {reason}", dir.display())]
    Write { dir: PathBuf, reason: String },
}

/// What a restore made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub cluster: ClusterId,
    /// The log index the restored state includes.
    pub last_log_index: u64,
    pub members: Vec<MemberId>,
}

/// Makes the empty `data_dir` of member `id` hold the state of the backup at `backup`, in a
/// cluster of `peers` (id to address). See the module docs.
pub async fn restore(
    backup: &Path,
    data_dir: &Path,
    id: MemberId,
    peers: &BTreeMap<MemberId, String>,
) -> Result<Restored, RestoreError> {
    if !peers.contains_key(&id) {
        return Err(RestoreError::NotAPeer {
            id,
            peers: peers
                .iter()
                .map(|(id, address)| format!("{id}={address}"))
                .collect::<Vec<_>>()
                .join(","),
        });
    }
    if data_dir.exists() && !data_dir.is_dir() {
        return Err(RestoreError::Write {
            dir: data_dir.to_path_buf(),
            reason: "it is not a directory: give --data-dir an empty or missing directory".into(),
        });
    }
    for name in [SNAPSHOT_FILE_NAME, "raft.redb", IDENTITY_FILE_NAME] {
        if data_dir.join(name).exists() {
            return Err(RestoreError::NotEmpty {
                dir: data_dir.to_path_buf(),
                found: name.to_string(),
            });
        }
    }
    let read = |source| RestoreError::Read {
        path: backup.to_path_buf(),
        source,
    };
    let bytes = std::fs::metadata(backup).map_err(read)?.len();
    let too_large = |bytes| RestoreError::TooLarge {
        path: backup.to_path_buf(),
        bytes,
    };
    if bytes > BACKUP_FILE_BYTES_MAX {
        return Err(too_large(bytes));
    }
    let invalid = |reason: String| RestoreError::Invalid {
        path: backup.to_path_buf(),
        reason,
    };
    // The size on disk says nothing for a device or a pipe (`/dev/zero`): the header is
    // checked before the rest is read, and the limit holds while reading.
    let mut opened = std::fs::File::open(backup).map_err(read)?;
    let mut file = Vec::new();
    (&mut opened)
        .take(BACKUP_HEADER_BYTES as u64)
        .read_to_end(&mut file)
        .map_err(read)?;
    parse_backup_header(&file).map_err(invalid)?;
    // Read on into the same buffer (a backup of several GiB is held once, not twice), sized
    // for the file as it is on disk (a device or a pipe says 0 and grows as read).
    file.reserve_exact(
        usize::try_from(bytes)
            .unwrap_or(0)
            .saturating_sub(file.len()),
    );
    opened
        .take(BACKUP_FILE_BYTES_MAX + 1 - BACKUP_HEADER_BYTES as u64)
        .read_to_end(&mut file)
        .map_err(read)?;
    if file.len() as u64 > BACKUP_FILE_BYTES_MAX {
        return Err(too_large(BACKUP_FILE_BYTES_MAX + 1));
    }
    let (cluster, snapshot) = parse_backup(&file).map_err(invalid)?;
    // The snapshot follows the header: keep just it, moved in place rather than copied.
    debug_assert_eq!(snapshot.as_ptr(), file[BACKUP_HEADER_BYTES..].as_ptr());
    let snapshot_bytes = snapshot.len();
    file.truncate(BACKUP_HEADER_BYTES + snapshot_bytes);
    file.drain(..BACKUP_HEADER_BYTES);
    let snapshot = file;
    let members: BTreeMap<MemberId, BasicNode> = peers
        .iter()
        .map(|(id, address)| (*id, BasicNode::new(address)))
        .collect();
    let write = |reason: String| RestoreError::Write {
        dir: data_dir.to_path_buf(),
        reason,
    };
    let last = write_restored_snapshot(data_dir, snapshot, members)
        .map_err(|error| invalid(format!("not a state this build can restore: {error}")))?;
    // The members start voting after the backup's term: a vote below the term of the last
    // entry would let a leader write entries that sort before the ones it holds.
    // The log store alone: the state machine would decode the snapshot again.
    let mut log = LogStore::open(data_dir).map_err(|error| write(error.to_string()))?;
    log.save_vote(&Vote::new(last.leader_id.term, id))
        .await
        .map_err(|error| write(error.to_string()))?;
    drop(log);
    ClusterIdentity::open(data_dir, id, false, None)
        .and_then(|identity| identity.join(cluster))
        .map_err(|error| write(error.to_string()))?;
    Ok(Restored {
        cluster,
        last_log_index: last.index,
        members: peers.keys().copied().collect(),
    })
}
