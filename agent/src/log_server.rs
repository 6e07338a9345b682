//! Answers the leader's requests on the agent's own connection (common/src/agent_api.rs,
//! [`LeaderRequest`]): so far, reads of an attempt's log for `quotient job logs`.
//!
//! The session ([`crate::session`]) starts [`serve`] on each connection it registered on; it
//! ends when that connection closes. The agent listens on no port: the leader opens a stream on
//! the connection the agent made.
//!
//! - **Who may ask**: only a peer whose certificate says `coordinator`, and only about this
//!   node ([`AgentError::Unauthorized`] otherwise).
//! - **What is read**: this agent's own attempts only: the attempt's log file under the state
//!   dir ([`runtime::log_path`], named by job id and attempt number, so no request can name
//!   another file). Both runtimes write it, a process job itself and a container's follower
//!   ([`crate::runtime::docker`]), so a container's log is read the same way, live and after
//!   the container is gone. A file log whose middle the agent dropped to keep it under its cap
//!   ([`crate::disk`]) reads as its start, one line `[... N bytes dropped ...]` and its newest
//!   part, never as the hole's zeros; offsets still count the file's bytes.
//! - **Limits**: at most [`LOG_CHUNK_BYTES_MAX`] bytes per answer, requests read within
//!   [`REQUEST_READ_DEADLINE_MS`], each read done within [`LOG_READ_DEADLINE_MS`] (under the
//!   leader's [`quotient_common::agent_api::LEADER_REQUEST_TIMEOUT_MS`]), and at most
//!   [`REQUESTS_IN_FLIGHT_MAX`] at once; further ones are refused.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quotient_common::agent_api::{AgentError, LeaderRequest, LeaderResponse, LOG_CHUNK_BYTES_MAX};
use quotient_common::certs::Role;
use quotient_common::transport::{
    PeerConnection, RequestStream, RESPONSE_WRITE_TIMEOUT_MS, STREAM_CODE_REFUSED,
};
use quotient_common::JobId;
use tokio::sync::Semaphore;

use crate::disk;
use crate::runtime::{self};
use crate::session::Shared;

/// Deadline for the leader to deliver its request once it opened the stream (milliseconds).
pub const REQUEST_READ_DEADLINE_MS: u64 = 2_000;
/// Deadline of one log read (milliseconds).
pub const LOG_READ_DEADLINE_MS: u64 = 4_000;
/// Requests served at once on one connection; more are refused.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 16;

/// Where this agent's job logs are: one file per attempt under the state dir, whichever
/// runtime ran it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogSource {
    Files { state_dir: PathBuf },
}

/// Serves the leader's requests on `connection` until it closes.
pub async fn serve(connection: PeerConnection, shared: Arc<Shared>) {
    let peer = connection.peer().clone();
    if peer.role != Role::Coordinator {
        tracing::warn!(%peer, "not serving requests of a peer that is no coordinator");
        return;
    }
    let in_flight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
    loop {
        let stream = match connection.accept_request().await {
            Ok(Some(stream)) => stream,
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%peer, "leader connection ended: {error}");
                break;
            }
        };
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "refused a leader request: {REQUESTS_IN_FLIGHT_MAX} in flight");
            stream.refuse(STREAM_CODE_REFUSED);
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            serve_request(stream, &shared).await;
            drop(permit);
        });
    }
}

async fn serve_request(mut stream: RequestStream, shared: &Shared) {
    let request: LeaderRequest = match stream
        .read_request(Duration::from_millis(REQUEST_READ_DEADLINE_MS))
        .await
    {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!("refused a bad leader request: {error}");
            return;
        }
    };
    let response = answer(&shared.node, &shared.logs, request).await;
    if let Err(error) = stream
        .respond(&response, Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS))
        .await
    {
        tracing::debug!("could not answer a leader request: {error}");
    }
}

/// Answers one request about node `node`, whose logs are in `source`.
pub async fn answer(node: &str, source: &LogSource, request: LeaderRequest) -> LeaderResponse {
    match request {
        LeaderRequest::ReadLogs {
            node: asked,
            job,
            attempt,
            offset,
            max_bytes,
        } => {
            if asked != node {
                return LeaderResponse::Error(AgentError::Unauthorized(format!(
                    "this is the agent of node {node:?}, not {asked:?}"
                )));
            }
            let max_bytes = max_bytes.min(LOG_CHUNK_BYTES_MAX);
            let read = read_logs(source, job, attempt, offset, max_bytes);
            match tokio::time::timeout(Duration::from_millis(LOG_READ_DEADLINE_MS), read).await {
                Ok(Ok(chunk)) => LeaderResponse::Logs {
                    data: chunk.data,
                    next_offset: chunk.next_offset,
                    end: chunk.end,
                },
                Ok(Err(error)) => LeaderResponse::Error(error),
                Err(_) => LeaderResponse::Error(AgentError::Unavailable(format!(
                    "reading the log of {job} attempt {attempt} took over {LOG_READ_DEADLINE_MS} ms"
                ))),
            }
        }
    }
}

/// A piece of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    pub data: Vec<u8>,
    pub next_offset: u64,
    /// `data` reaches the end of the log as it is now.
    pub end: bool,
}

async fn read_logs(
    source: &LogSource,
    job: JobId,
    attempt: u32,
    offset: u64,
    max_bytes: u32,
) -> Result<LogChunk, AgentError> {
    let LogSource::Files { state_dir } = source;
    let path = runtime::log_path(state_dir, job, attempt);
    tokio::task::spawn_blocking(move || read_file_chunk(&path, offset, max_bytes))
        .await
        .map_err(|error| AgentError::Unavailable(format!("the log read failed: {error}")))?
}

/// Up to `max_bytes` of the file from `offset` on. A missing file is an empty log (the attempt
/// has not started yet); an offset past the end gives nothing. A span the agent dropped from a
/// log over its cap ([`crate::disk`]) reads as one line, [`disk::dropped_marker`] (after a
/// line break if the kept start ended mid-line), which may take the chunk past `max_bytes`
/// by its own length; `next_offset` counts file bytes, so it then jumps the span.
pub fn read_file_chunk(path: &Path, offset: u64, max_bytes: u32) -> Result<LogChunk, AgentError> {
    use std::os::unix::fs::FileExt;
    let unavailable = |error: std::io::Error| {
        AgentError::Unavailable(format!("read {}: {error}", path.display()))
    };
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogChunk {
                data: Vec::new(),
                next_offset: offset,
                end: true,
            })
        }
        Err(error) => return Err(unavailable(error)),
    };
    let length = file.metadata().map_err(unavailable)?.len();
    let limit = u64::from(max_bytes);
    let mut data = Vec::new();
    let mut position = offset;
    while position < length && (data.len() as u64) < limit {
        if let Some(resumes) = disk::dropped_until(&file, position, length).map_err(unavailable)? {
            let mid_line = match data.last() {
                Some(last) => *last != b'\n',
                None if position > 0 => {
                    let mut before = [0u8; 1];
                    file.read_exact_at(&mut before, position - 1)
                        .map_err(unavailable)?;
                    before[0] != b'\n'
                }
                None => false,
            };
            if mid_line {
                data.push(b'\n');
            }
            data.extend_from_slice(disk::dropped_marker(resumes - position).as_bytes());
            position = resumes;
            continue;
        }
        let until = match disk::data_until(&file, position, length).map_err(unavailable)? {
            until if until > position => until,
            _ => length,
        };
        let wanted = (until - position).min(limit - data.len() as u64);
        file.seek(SeekFrom::Start(position)).map_err(unavailable)?;
        let read = (&mut file)
            .take(wanted)
            .read_to_end(&mut data)
            .map_err(unavailable)?;
        if read == 0 {
            // The file shrank under the reader.
            break;
        }
        position += read as u64;
    }
    Ok(LogChunk {
        data,
        next_offset: position,
        end: position >= length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads go from the offset, stop at the limit, and say when they reached the end.
    #[test]
    fn file_reads_go_by_offset_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j-1-1.log");
        std::fs::write(&path, b"hello\nworld\n").unwrap();
        let chunk = read_file_chunk(&path, 0, 6).unwrap();
        assert_eq!(chunk.data, b"hello\n");
        assert_eq!(chunk.next_offset, 6);
        assert!(!chunk.end);
        let chunk = read_file_chunk(&path, 6, 100).unwrap();
        assert_eq!(chunk.data, b"world\n");
        assert_eq!(chunk.next_offset, 12);
        assert!(chunk.end);
        let chunk = read_file_chunk(&path, 12, 100).unwrap();
        assert!(chunk.data.is_empty() && chunk.end && chunk.next_offset == 12);
        let missing = read_file_chunk(&dir.path().join("none.log"), 0, 100).unwrap();
        assert!(missing.data.is_empty() && missing.end);
    }

    /// A log whose middle was dropped reads as its start, one marker line with the number of
    /// bytes dropped, and its newest part, whatever the chunk size; offsets count file bytes.
    #[test]
    fn a_capped_log_reads_as_start_marker_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j-1-1.log");
        let mut written = b"first line\n".to_vec();
        while written.len() < 4 << 20 {
            written.extend_from_slice(b"a line in the middle of the output\n");
        }
        written.extend_from_slice(b"last line\n");
        std::fs::write(&path, &written).unwrap();
        let cap = 256 * 1024;
        assert!(disk::cap_log(&path, cap).unwrap());

        for chunk_bytes in [LOG_CHUNK_BYTES_MAX, 10_000, 100] {
            let mut text = Vec::new();
            let mut offset = 0;
            loop {
                let chunk = read_file_chunk(&path, offset, chunk_bytes).unwrap();
                assert!(chunk.next_offset > offset || chunk.end);
                text.extend_from_slice(&chunk.data);
                offset = chunk.next_offset;
                if chunk.end {
                    break;
                }
            }
            assert_eq!(offset, written.len() as u64, "offsets count file bytes");
            let text = String::from_utf8(text).unwrap();
            assert!(text.starts_with("first line\n"), "{chunk_bytes}");
            assert!(text.ends_with("last line\n"), "{chunk_bytes}");
            assert!(!text.contains('\0'), "no zeros from the hole");
            let markers: Vec<&str> = text
                .lines()
                .filter(|line| line.starts_with("[... ") && line.ends_with(" bytes dropped ...]"))
                .collect();
            assert_eq!(markers.len(), 1, "{chunk_bytes}: {markers:?}");
            assert!(text.len() < 2 * cap as usize, "{}", text.len());
        }
    }

    /// A request about another node is refused, and reads are capped at the chunk limit.
    #[tokio::test]
    async fn only_this_nodes_logs_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let source = LogSource::Files {
            state_dir: dir.path().to_path_buf(),
        };
        let request = |node: &str, max_bytes| LeaderRequest::ReadLogs {
            node: node.to_string(),
            job: JobId(3),
            attempt: 1,
            offset: 0,
            max_bytes,
        };
        let refused = answer("node-1", &source, request("node-2", 10)).await;
        assert!(matches!(
            refused,
            LeaderResponse::Error(AgentError::Unauthorized(_))
        ));
        let path = runtime::log_path(dir.path(), JobId(3), 1);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let big = vec![b'x'; LOG_CHUNK_BYTES_MAX as usize + 10];
        std::fs::write(&path, &big).unwrap();
        match answer("node-1", &source, request("node-1", u32::MAX)).await {
            LeaderResponse::Logs {
                data,
                next_offset,
                end,
            } => {
                assert_eq!(data.len(), LOG_CHUNK_BYTES_MAX as usize);
                assert_eq!(next_offset, u64::from(LOG_CHUNK_BYTES_MAX));
                assert!(!end);
            }
            other => panic!("unexpected answer: {other:?}"),
        }
    }
}
