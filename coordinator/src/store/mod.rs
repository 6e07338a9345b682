//! Raft storage for the coordinator: the durable log, the state machine around
//! `quotient_core::State` with its snapshot file, and the openraft type config that ties them
//! together. Everything lives in one data directory: `raft-wal/` (the log entries and the
//! committed log id, [`wal`]), `raft.redb` (the vote and the last purged log id) and
//! `snapshot.bin` (the last snapshot). On restart the state is loaded from the snapshot and
//! openraft re-applies the committed log after it.
//!
//! # Layout
//! - [`codec`]: bincode 2 (through serde) with size limits; how stored values become bytes, and
//!   the version of the Raft log encoding each is read back with.
//! - [`log_store`]: [`RaftLogStore`], openraft's storage-v2 log store and log reader.
//! - [`wal`]: the log's segment files: append-only records, synced, replayed on open.
//! - [`log_writer`]: the log store's writer thread (group commit), and [`LogDurability`],
//!   what the Raft network waits on before it lets a commit be seen.
//! - [`state_machine`]: [`QuotientStateMachine`], openraft's storage-v2 state machine, and the
//!   snapshot file.
//! - [`type_config`]: [`TypeConfig`], with [`Request`] (a batch of commands) as the entry
//!   data and [`Outcomes`] (one `quotient_core::Outcome` per command) as the response.

pub mod codec;
pub mod log_store;
pub mod log_writer;
pub mod state_machine;
pub mod type_config;
pub mod wal;

use std::path::Path;

use openraft::StorageError;

pub use log_store::{LogDurability, RaftLogStore};
pub use state_machine::QuotientStateMachine;
pub use type_config::{LogStore, MemberId, Outcomes, Request, TypeConfig};

/// Makes a member that was the leader when it stopped start as a follower, by saving its vote
/// for itself again as not committed; whether it did. Call it before Raft starts on the store.
///
/// openraft 0.9 restarts a node whose saved vote is a committed one for itself as the leader
/// of that same term, on the assumption that every entry it sent is in its own log. This
/// store breaks that assumption on purpose: a leader sends entries while its own write of
/// them is under way (`log_writer`), so one that crashed, or whose disk failed, may come back
/// without the last entries it sent. Leading the same term again, it would write new entries
/// at those indexes under the same log ids the followers already hold with other contents,
/// and Raft's log matching, which trusts equal log ids, would never repair the difference:
/// the replicas' states would part for good (found by `quotient-chaos`: a leader's full disk,
/// then its restart, RELIABILITY.md). Not committed, the vote still says whom it voted for in
/// that term, so it votes for no one else there; it campaigns in a new term, where every log
/// id it writes is new.
pub async fn resume_as_follower(
    log: &mut LogStore,
    id: MemberId,
) -> Result<bool, StorageError<MemberId>> {
    use openraft::storage::RaftLogStorage;
    let Some(mut vote) = log.read_vote().await? else {
        return Ok(false);
    };
    if !vote.is_committed() || vote.leader_id().voted_for() != Some(id) {
        return Ok(false);
    }
    vote.committed = false;
    log.save_vote(&vote).await?;
    Ok(true)
}

/// Opens (or creates) the redb database at `path`, saying what went wrong in words that name
/// the file: one that is not a regular file, one another process holds open (another
/// coordinator on the same data dir), and one so damaged that redb gives up on it (it panics
/// on some damage, a cut or a hugely grown file among them: found by probing). `fix` says what
/// to do about a damaged one. Blocks on file I/O.
pub fn open_database(path: &Path, fix: &str) -> Result<redb::Database, String> {
    if let Ok(metadata) = std::fs::metadata(path) {
        if !metadata.is_file() {
            return Err(format!(
                "{} is not a regular file (a directory, a device or a pipe): {fix}",
                path.display()
            ));
        }
    }
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        redb::Database::create(path)
    }));
    match opened {
        Ok(Ok(database)) => Ok(database),
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => Err(format!(
            "{} is open in another process: is another coordinator using this data directory?",
            path.display()
        )),
        Ok(Err(error)) => Err(format!("cannot open {}: {error}; {fix}", path.display())),
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no reason given");
            Err(format!(
                "{} is damaged: the database library gave up reading it ({why}); {fix}",
                path.display()
            ))
        }
    }
}

/// What to do about a damaged `raft.redb`: the member's Raft state cannot be trusted.
pub const RAFT_DB_FIX: &str = "this member's Raft state cannot be trusted: move the data \
    directory away, start the coordinator on an empty one, then remove it from the cluster and \
    add it back as a new member (`quotient cluster remove-member --id ID`, then `quotient cluster \
    add-member --id ID --address ADDR`)";

/// Opens (or creates) both halves of a coordinator's Raft storage in `data_dir`.
///
/// Blocks on file I/O: call it at startup.
#[allow(clippy::result_large_err)] // openraft's StorageError, kept so callers see one error type.
pub fn open(data_dir: &Path) -> Result<(LogStore, QuotientStateMachine), StorageError<MemberId>> {
    let log = LogStore::open(data_dir)?;
    let state_machine = QuotientStateMachine::open(data_dir)?;
    Ok((log, state_machine))
}
