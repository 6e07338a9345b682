//! The journal: what the agent must not forget across a restart, in one small JSON file in
//! its state dir.
//!
//! It holds three things. **Pending reports**: job events not yet acknowledged by a leader,
//! retried until one is, so that a restart or a failover never loses an exit report. **Finished
//! attempts**: attempts that ran here and exited (or could not be launched and were given
//! up), so that a restarted agent never starts one
//! again even if a stale desired state still lists it (the runtime's pid file or container is
//! gone by then). **The last heartbeat acknowledged**, as wall-clock time, so that a restarted
//! agent keeps counting its self-fencing lease from the last answer of a leader rather than
//! from its own start (see [`crate::session`]).
//!
//! The file is rewritten whole (temporary file, fsync, rename) on every change and read back
//! with a size limit; one that is over the limit or does not parse stops the agent with an
//! error naming it, since guessing could start a finished attempt twice. Both lists are
//! bounded: past [`PENDING_REPORTS_MAX`] the oldest progress reports (started, running) go
//! first, exits last; past [`FINISHED_KEPT_MAX`] the oldest finished attempts are forgotten
//! (the coordinators have long moved on by then).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use quotient_common::agent_api::{WireJobEvent, WireJobReport};
use quotient_common::JobId;
use serde::{Deserialize, Serialize};

/// The journal's file name in the state dir.
pub const JOURNAL_FILE: &str = "agent-journal.json";
/// The largest journal file read back.
pub const JOURNAL_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// The most unacknowledged reports kept.
pub const PENDING_REPORTS_MAX: usize = 4_096;
/// The most finished attempts remembered.
pub const FINISHED_KEPT_MAX: usize = 4_096;
/// The journal format written by this agent.
pub const JOURNAL_VERSION: u32 = 1;

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot {action} the agent journal {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent journal {} is unreadable ({problem}); it lists exit reports not yet delivered and finished attempts. Move it away only if this node's jobs may safely be started again", path.display())]
    Corrupt { path: PathBuf, problem: String },
}

/// One report waiting for a leader's acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReport {
    /// Increases by one per report, across restarts.
    pub sequence: u64,
    pub report: WireJobReport,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct JournalFile {
    version: u32,
    next_sequence: u64,
    pending: VecDeque<PendingReport>,
    finished: VecDeque<(JobId, u32)>,
    last_ack_unix_ms: Option<u64>,
}

/// The agent's journal, loaded in memory and written through on every change.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: JournalFile,
}

impl Journal {
    /// Opens the journal in `state_dir`; an absent file is an empty journal.
    pub fn open(state_dir: &Path) -> Result<Journal, JournalError> {
        let path = state_dir.join(JOURNAL_FILE);
        let corrupt = |problem: String| JournalError::Corrupt {
            path: path.clone(),
            problem,
        };
        let file = match std::fs::File::open(&path) {
            Ok(file) => {
                let mut text = String::new();
                file.take(JOURNAL_BYTES_MAX + 1)
                    .read_to_string(&mut text)
                    .map_err(|source| JournalError::Io {
                        action: "read",
                        path: path.clone(),
                        source,
                    })?;
                if text.len() as u64 > JOURNAL_BYTES_MAX {
                    return Err(corrupt(format!(
                        "it is over the limit of {JOURNAL_BYTES_MAX} bytes"
                    )));
                }
                let file: JournalFile =
                    serde_json::from_str(&text).map_err(|error| corrupt(error.to_string()))?;
                if file.version != JOURNAL_VERSION {
                    return Err(corrupt(format!(
                        "format version {} is not {JOURNAL_VERSION}",
                        file.version
                    )));
                }
                file
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => JournalFile {
                version: JOURNAL_VERSION,
                next_sequence: 1,
                ..JournalFile::default()
            },
            Err(source) => {
                return Err(JournalError::Io {
                    action: "open",
                    path,
                    source,
                })
            }
        };
        let mut journal = Journal { path, file };
        journal.trim();
        Ok(journal)
    }

    /// Appends reports (an exit or a launch given up also marks its attempt finished) and
    /// writes the journal.
    pub fn push(&mut self, reports: Vec<WireJobReport>) -> Result<(), JournalError> {
        if reports.is_empty() {
            return Ok(());
        }
        for report in reports {
            if matches!(
                report.event,
                WireJobEvent::Exited { .. }
                    | WireJobEvent::ExitedAfterSignal { .. }
                    | WireJobEvent::LaunchFailed { .. }
            ) && !self.file.finished.contains(&(report.job, report.attempt))
            {
                self.file.finished.push_back((report.job, report.attempt));
            }
            let sequence = self.file.next_sequence;
            self.file.next_sequence += 1;
            self.file
                .pending
                .push_back(PendingReport { sequence, report });
        }
        self.trim();
        self.write()
    }

    /// The oldest `count_max` unacknowledged reports, in order.
    pub fn pending(&self, count_max: usize) -> Vec<PendingReport> {
        self.file.pending.iter().take(count_max).cloned().collect()
    }

    /// How many reports wait for an acknowledgement.
    pub fn pending_count(&self) -> usize {
        self.file.pending.len()
    }

    /// Drops the reports with these sequence numbers (a leader acknowledged them).
    pub fn acknowledge(&mut self, sequences: &[u64]) -> Result<(), JournalError> {
        let before = self.file.pending.len();
        self.file
            .pending
            .retain(|pending| !sequences.contains(&pending.sequence));
        if self.file.pending.len() == before {
            return Ok(());
        }
        self.write()
    }

    /// Attempts that ran here and exited, oldest first.
    pub fn finished(&self) -> impl Iterator<Item = (JobId, u32)> + '_ {
        self.file.finished.iter().copied()
    }

    /// When a leader last acknowledged a heartbeat (its send time), in ms since the epoch.
    pub fn last_ack_unix_ms(&self) -> Option<u64> {
        self.file.last_ack_unix_ms
    }

    /// Records a heartbeat acknowledgement (its send time, ms since the epoch).
    pub fn record_ack(&mut self, unix_ms: u64) -> Result<(), JournalError> {
        self.file.last_ack_unix_ms = Some(unix_ms);
        self.write()
    }

    fn trim(&mut self) {
        while self.file.finished.len() > FINISHED_KEPT_MAX {
            self.file.finished.pop_front();
        }
        while self.file.pending.len() > PENDING_REPORTS_MAX {
            let progress = self.file.pending.iter().position(|pending| {
                matches!(
                    pending.report.event,
                    WireJobEvent::Started | WireJobEvent::Running
                )
            });
            let dropped = match progress {
                Some(position) => self.file.pending.remove(position),
                None => self.file.pending.pop_front(),
            };
            if let Some(dropped) = dropped {
                tracing::error!(job = %dropped.report.job, attempt = dropped.report.attempt, event = ?dropped.report.event,
                    "more than {PENDING_REPORTS_MAX} reports wait for a leader: dropping the oldest");
            }
        }
    }

    fn write(&self) -> Result<(), JournalError> {
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| JournalError::Io {
                action,
                path,
                source,
            }
        };
        let text = serde_json::to_vec(&self.file).map_err(|error| JournalError::Corrupt {
            path: self.path.clone(),
            problem: error.to_string(),
        })?;
        let temporary = self.path.with_extension("json.tmp");
        let mut file = std::fs::File::create(&temporary).map_err(io("create", &temporary))?;
        file.write_all(&text).map_err(io("write", &temporary))?;
        file.sync_all().map_err(io("sync", &temporary))?;
        std::fs::rename(&temporary, &self.path).map_err(io("replace", &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(job: u64, event: WireJobEvent) -> WireJobReport {
        WireJobReport {
            job: JobId(job),
            attempt: 1,
            event,
        }
    }

    /// Reports and finished attempts survive a reopen; acknowledged ones are gone.
    #[test]
    fn the_journal_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal
            .push(vec![
                report(1, WireJobEvent::Running),
                report(1, WireJobEvent::ExitedAfterSignal { code: Some(0) }),
            ])
            .unwrap();
        journal.record_ack(1_234).unwrap();
        let first = journal.pending(1)[0].sequence;
        journal.acknowledge(&[first]).unwrap();

        let journal = Journal::open(dir.path()).unwrap();
        let pending = journal.pending(10);
        assert_eq!(pending.len(), 1);
        assert_eq!(
            pending[0].report.event,
            WireJobEvent::ExitedAfterSignal { code: Some(0) }
        );
        assert_eq!(journal.finished().collect::<Vec<_>>(), vec![(JobId(1), 1)]);
        assert_eq!(journal.last_ack_unix_ms(), Some(1_234));
    }

    /// An attempt whose launch was given up is finished, like one that exited: a restarted
    /// agent never tries it again, and the report waits for a leader.
    #[test]
    fn a_launch_given_up_is_a_finished_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        let failed = report(
            5,
            WireJobEvent::LaunchFailed {
                fault: quotient_common::job::LaunchFault::Node,
                tries: 3,
                message: "docker create container: connection refused".into(),
            },
        );
        journal.push(vec![failed.clone()]).unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        assert_eq!(journal.finished().collect::<Vec<_>>(), vec![(JobId(5), 1)]);
        assert_eq!(journal.pending(10)[0].report, failed);
    }

    /// A journal over the size limit or garbled is refused with a message naming the file.
    #[test]
    fn an_oversized_or_garbled_journal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        std::fs::write(&path, "{not json").unwrap();
        let error = Journal::open(dir.path()).unwrap_err().to_string();
        assert!(error.contains(JOURNAL_FILE), "{error}");
        std::fs::write(&path, vec![b' '; JOURNAL_BYTES_MAX as usize + 1]).unwrap();
        let error = Journal::open(dir.path()).unwrap_err().to_string();
        assert!(error.contains("over the limit"), "{error}");
    }

    /// Past the limit, progress reports are dropped before exits.
    #[test]
    fn exits_outlive_progress_reports_when_the_journal_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal
            .push(vec![report(0, WireJobEvent::Exited { code: 3 })])
            .unwrap();
        let progress: Vec<WireJobReport> = (1..=PENDING_REPORTS_MAX as u64)
            .map(|job| report(job, WireJobEvent::Running))
            .collect();
        journal.push(progress).unwrap();
        assert_eq!(journal.pending_count(), PENDING_REPORTS_MAX);
        assert_eq!(
            journal.pending(1)[0].report,
            report(0, WireJobEvent::Exited { code: 3 })
        );
    }
}
