//! `quotient-coordinator log`: prints what a data directory's Raft log holds, for an operator
//! (or a test) looking into a member whose state differs from the others'.
//!
//! One line for the vote, the committed id and the last purged id, then one line per entry:
//! its index, its log id, and what it carries (a membership, a blank, or the commands of a
//! normal entry with the leader's time). With `--digests`, the entries are also applied, in
//! order, to a state that starts empty, and every entry that holds a digest check (the
//! leader's `CheckDigest`) is followed by the digest of the state after it: the digest every
//! replica compares (`digest_check`). Replaying two members' logs side by side shows the first
//! entry after which their states part. Replaying needs the log from its first entry: a log
//! purged by a snapshot cannot be replayed from an empty state, and the digests are then left
//! out, with a line that says so.
//!
//! Opening the log recovers it as a starting coordinator does (a write torn by a crash is cut
//! off), so run it on a stopped member's data directory or on a copy.

use std::io::Write;
use std::path::Path;

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::EntryPayload;
use quotient_core::{ApplyCtx, Command, State};

use crate::store::LogStore;
use crate::views;

/// The most characters of one command's description printed.
pub const COMMAND_TEXT_MAX: usize = 400;

/// Entries read from the log at a time.
const READ_CHUNK: u64 = 512;

/// Prints the log of `data_dir` to `out` (see the module docs); `from..=to` bounds the
/// entries printed (the replay still starts at the first entry).
pub async fn print_log(
    data_dir: &Path,
    from: u64,
    to: Option<u64>,
    digests: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if !data_dir
        .join(crate::store::log_store::DB_FILE_NAME)
        .is_file()
    {
        anyhow::bail!(
            "{} holds no coordinator's data (no {}): pass the --data-dir a coordinator ran with",
            data_dir.display(),
            crate::store::log_store::DB_FILE_NAME
        );
    }
    let mut store = LogStore::open(data_dir)?;
    let vote = store.read_vote().await?;
    let committed = store.read_committed().await?;
    let log_state = store.get_log_state().await?;
    writeln!(
        out,
        "vote {} committed {} last-purged {} last {}",
        display(vote.as_ref()),
        display(committed.as_ref()),
        display(log_state.last_purged_log_id.as_ref()),
        display(log_state.last_log_id.as_ref()),
    )?;
    let Some(last) = log_state.last_log_id.map(|id| id.index) else {
        return Ok(());
    };
    let first = log_state.last_purged_log_id.map_or(0, |id| id.index + 1);
    let mut replay = if digests && first <= 1 {
        Some(State::new())
    } else {
        if digests {
            writeln!(
                out,
                "no digests: the log was purged up to {} (a snapshot holds the state before it)",
                first - 1
            )?;
        }
        None
    };
    let end = to.map_or(last, |to| to.min(last));
    let mut next = if replay.is_some() {
        first
    } else {
        first.max(from)
    };
    while next <= end {
        let chunk_end = (next + READ_CHUNK - 1).min(end);
        let entries = store.try_get_log_entries(next..=chunk_end).await?;
        if entries.is_empty() {
            writeln!(out, "entries {next}..={chunk_end} are missing from the log")?;
            break;
        }
        for entry in entries {
            let index = entry.log_id.index;
            let shown = index >= from;
            match entry.payload {
                EntryPayload::Blank => {
                    if shown {
                        writeln!(out, "{index} {} blank", entry.log_id)?;
                    }
                }
                EntryPayload::Membership(membership) => {
                    if shown {
                        writeln!(out, "{index} {} membership {membership}", entry.log_id)?;
                    }
                }
                EntryPayload::Normal(request) => {
                    if shown {
                        writeln!(
                            out,
                            "{index} {} normal time_ms={} commands={}",
                            entry.log_id,
                            request.time_ms,
                            request.commands.len()
                        )?;
                        for command in &request.commands {
                            writeln!(out, "    {}", describe(command))?;
                        }
                    }
                    if let Some(state) = replay.as_mut() {
                        let ctx = ApplyCtx {
                            log_index: index,
                            time_ms: request.time_ms,
                        };
                        let mut checked = false;
                        for command in request.commands {
                            checked |= matches!(command, Command::CheckDigest { .. });
                            quotient_core::apply(state, command, ctx);
                        }
                        if checked && shown {
                            let digest =
                                views::digest_of_bytes(&state.capture_snapshot().into_bytes());
                            writeln!(out, "    digest after {index}: {digest:016x}")?;
                        }
                    }
                }
            }
            next = index + 1;
        }
    }
    Ok(())
}

fn display<T: std::fmt::Display>(value: Option<&T>) -> String {
    value.map_or_else(|| "-".to_string(), ToString::to_string)
}

/// A command's description, cut at [`COMMAND_TEXT_MAX`] characters.
fn describe(command: &Command) -> String {
    let text = format!("{command:?}");
    match text.char_indices().nth(COMMAND_TEXT_MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
