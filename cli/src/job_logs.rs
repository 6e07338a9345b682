//! `quotient job logs ID [--follow] [--attempt N] [--rank R]`: an attempt's stdout and
//! stderr, read by the leader from the agent of the node that ran it (for a job of several
//! nodes, the node of member R, rank 0 by default).
//!
//! Without `--attempt`, the job's current attempt, or its last one. The log is read in
//! pieces of at most [`LOG_READ_BYTES_MAX`] bytes and written to stdout as it is, bytes and
//! all. Without `--follow` it prints what the log holds now and returns; with it, it keeps
//! polling every [`FOLLOW_POLL_INTERVAL_MS`] from where it left off until the attempt has
//! ended and all of its log is printed (a job not yet placed is waited for, saying so on
//! stderr).
//!
//! An attempt that never launched has no log: when the attempt read has ended with nothing
//! in its log and the job's reason is a launch failure (`launch failed on node ...`, the
//! agent's message as the coordinators recorded it), that reason is the error and the exit
//! status 1, instead of an empty output that looks like success.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse, LOG_READ_BYTES_MAX};
use quotient_common::{ErrorCode, JobId};

use crate::client::{unexpected, Session};
use crate::failure::RequestFailed;
use crate::GlobalArgs;

/// How the coordinators' reason for a job starts when its last attempt failed to launch
/// (`quotient_core`'s `WaitReason::LaunchFailed`).
pub const LAUNCH_FAILED_PREFIX: &str = "launch failed on node ";

/// How long `--follow` goes on asking while reads fail as unavailable (the agent busy with
/// other reads, or gone for a moment) before it gives up.
pub const FOLLOW_UNAVAILABLE_MAX_MS: u64 = 60_000;

/// Pause between two polls of `--follow` when nothing new came.
pub const FOLLOW_POLL_INTERVAL_MS: u64 = 500;

/// Arguments of `quotient job logs`.
#[derive(Debug, clap::Args)]
pub struct JobLogsArgs {
    /// The job's id, e.g. j-42.
    #[arg(value_name = "ID")]
    pub job: JobId,
    /// Keep printing what the attempt writes until it ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Which attempt (QUOTIENT_ATTEMPT) [default: the current one, or the last].
    #[arg(long, value_name = "N")]
    pub attempt: Option<u32>,
    /// Which member of a job of several nodes (QUOTIENT_NODE_RANK).
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub rank: u32,
}

/// One piece of a log, as the coordinator answered it.
struct Piece {
    attempt: u32,
    data: Vec<u8>,
    next_offset: u64,
    complete: bool,
}

fn read(
    session: &mut Session,
    job: JobId,
    attempt: Option<u32>,
    rank: u32,
    offset: u64,
) -> anyhow::Result<Piece> {
    let request = ApiRequest::JobLogs {
        job,
        attempt,
        offset,
        max_bytes: LOG_READ_BYTES_MAX,
        rank,
    };
    match session.call(request.clone())? {
        ApiResponse::Logs {
            attempt,
            data,
            next_offset,
            complete,
        } => Ok(Piece {
            attempt,
            data,
            next_offset,
            complete,
        }),
        other => Err(unexpected(&request, &other)),
    }
}

/// The launch failure of `attempt` of `job`, when the job's reason says its last attempt,
/// this one, never launched.
fn launch_failure(
    session: &mut Session,
    job: JobId,
    attempt: u32,
) -> anyhow::Result<Option<String>> {
    let view = crate::job_get::fetch(session, job)?;
    Ok(view
        .reason
        .filter(|reason| view.attempts == attempt && reason.starts_with(LAUNCH_FAILED_PREFIX)))
}

pub fn run(global: &GlobalArgs, args: &JobLogsArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let mut stdout = std::io::stdout().lock();
    let mut attempt = args.attempt;
    let mut offset = 0;
    let mut printed = 0_usize;
    let mut said_waiting = false;
    // Since when reads have failed for a while (the agent busy or unreachable), in --follow.
    let mut failing_since: Option<std::time::Instant> = None;
    loop {
        let piece = match read(&mut session, args.job, attempt, args.rank, offset) {
            Ok(piece) => {
                failing_since = None;
                piece
            }
            // A follower rides out an agent that is busy or away for a while, as it rides
            // out a job that writes nothing (found by probing: 100 followers of one log made
            // the agent refuse some reads, and 20 of them ended).
            Err(error)
                if args.follow && RequestFailed::has_code(&error, ErrorCode::Unavailable) =>
            {
                let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= Duration::from_millis(FOLLOW_UNAVAILABLE_MAX_MS) {
                    return Err(error);
                }
                std::thread::sleep(Duration::from_millis(FOLLOW_POLL_INTERVAL_MS));
                continue;
            }
            Err(error) => return Err(error),
        };
        if piece.attempt == 0 && !args.follow {
            // A job that ended without ever being placed (cancelled while queued) waits for
            // nothing (found by probing: it was told to ask why it waits).
            let view = crate::job_get::fetch(&mut session, args.job)?;
            if matches!(view.state.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED") {
                eprintln!(
                    "{} ended {} without ever being placed on a node, so it has no logs",
                    args.job, view.state
                );
            } else {
                eprintln!(
                    "{} has not been placed on a node yet, so it has no logs; `quotient job explain {}` says why it waits",
                    args.job, args.job
                );
            }
            return Ok(());
        }
        if piece.attempt == 0 && !piece.complete && !said_waiting {
            eprintln!(
                "{} has not started yet: waiting for it to start, then following its log \
                 (`quotient job explain {}` says why it waits)",
                args.job, args.job
            );
            said_waiting = true;
        }
        if piece.attempt != 0 {
            // Stay with this attempt, even if the job moves on to another.
            attempt = Some(piece.attempt);
        }
        stdout
            .write_all(&piece.data)
            .and_then(|()| stdout.flush())
            .context("cannot write the log to stdout")?;
        printed += piece.data.len();
        offset = piece.next_offset;
        if piece.complete {
            if printed == 0 && piece.attempt != 0 {
                if let Some(reason) = launch_failure(&mut session, args.job, piece.attempt)? {
                    return Err(RequestFailed::error(
                        ErrorCode::FailedPrecondition,
                        format!(
                            "{} attempt {} never started, so it has no logs: {reason}",
                            args.job, piece.attempt
                        ),
                    ));
                }
            }
            return Ok(());
        }
        let full = piece.data.len() >= LOG_READ_BYTES_MAX as usize;
        if full {
            continue;
        }
        if !args.follow {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(FOLLOW_POLL_INTERVAL_MS));
    }
}
