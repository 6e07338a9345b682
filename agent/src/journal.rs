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
//! error naming it, since guessing could start a finished attempt twice.
//!
//! Its `version` field is the version of its encoding (`version::AGENT_JOURNAL`). Each version
//! this build reads has its decoder below: version 1 kept each report without its node (the
//! reports were only ever this node's), and is read by giving them this agent's node name;
//! version 2 keeps the `JobReport` the leader replicates. A journal of a version this build
//! does not read stops the agent with both versions and what to do. Both lists are
//! bounded: past [`PENDING_REPORTS_MAX`] the oldest progress reports (started, running) go
//! first, exits last; past [`FINISHED_KEPT_MAX`] the oldest finished attempts are forgotten
//! (the coordinators have long moved on by then).

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use quotient_common::bounded_read::read_text_at_most;
use quotient_common::version::{VersionError, Writer, AGENT_JOURNAL};
use quotient_common::{JobEvent, JobId, JobReport};
use serde::{Deserialize, Serialize};

/// The journal's file name in the state dir.
pub const JOURNAL_FILE: &str = "agent-journal.json";
/// The largest journal file read back.
pub const JOURNAL_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// The most unacknowledged reports kept.
pub const PENDING_REPORTS_MAX: usize = 4_096;
/// The most finished attempts remembered.
pub const FINISHED_KEPT_MAX: usize = 4_096;

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
    /// Written in a version of the journal this build does not read.
    #[error(transparent)]
    Version(#[from] VersionError),
}

/// One report waiting for a leader's acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReport {
    /// Increases by one per report, across restarts.
    pub sequence: u64,
    pub report: JobReport,
}

/// The journal file of the current version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct JournalFile {
    version: u16,
    next_sequence: u64,
    pending: VecDeque<PendingReport>,
    finished: VecDeque<(JobId, u32)>,
    last_ack_unix_ms: Option<u64>,
    /// The same acknowledgement on the boot clock, with the boot it is of (added within
    /// version 2: a journal without it reads as `None`, and an older agent ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_ack_boot: Option<BootStamp>,
}

/// A moment on the boot clock (`CLOCK_BOOTTIME`, milliseconds) of one boot of the host,
/// which is how long ago it was whatever the wall clock did since.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootStamp {
    /// `/proc/sys/kernel/random/boot_id` of that boot.
    pub boot_id: String,
    pub boot_ms: u64,
}

/// Only the version of a journal file, read first to choose its decoder.
#[derive(Deserialize)]
struct VersionField {
    version: u64,
}

/// The journal file of version 1: its reports have no node.
#[derive(Deserialize)]
struct JournalFileV1 {
    next_sequence: u64,
    pending: VecDeque<PendingReportV1>,
    finished: VecDeque<(JobId, u32)>,
    last_ack_unix_ms: Option<u64>,
}

#[derive(Deserialize)]
struct PendingReportV1 {
    sequence: u64,
    report: JobReportV1,
}

#[derive(Deserialize)]
struct JobReportV1 {
    job: JobId,
    attempt: u32,
    event: JobEvent,
}

impl JournalFileV1 {
    /// The same journal in the current version: its reports were all `node`'s.
    fn upgrade(self, node: &str) -> JournalFile {
        let pending = self
            .pending
            .into_iter()
            .map(|pending| PendingReport {
                sequence: pending.sequence,
                report: JobReport {
                    job: pending.report.job,
                    attempt: pending.report.attempt,
                    node: node.to_string(),
                    event: pending.report.event,
                },
            })
            .collect();
        JournalFile {
            version: AGENT_JOURNAL.current,
            next_sequence: self.next_sequence,
            pending,
            finished: self.finished,
            last_ack_unix_ms: self.last_ack_unix_ms,
            last_ack_boot: None,
        }
    }
}

/// Decodes a journal of any version this build reads, as the current version. `node` is this
/// agent's node name, which version 1 did not keep.
fn decode(text: &str, node: &str, path: &Path) -> Result<JournalFile, JournalError> {
    let corrupt = |error: serde_json::Error| JournalError::Corrupt {
        path: path.to_path_buf(),
        problem: error.to_string(),
    };
    let VersionField { version } = serde_json::from_str(text).map_err(corrupt)?;
    // A number past u16 is a version no build wrote; it is refused like any unknown one.
    let version = u16::try_from(version).unwrap_or(u16::MAX);
    match AGENT_JOURNAL.check(version, Writer::File(path.display().to_string()))? {
        1 => {
            let file: JournalFileV1 = serde_json::from_str(text).map_err(corrupt)?;
            Ok(file.upgrade(node))
        }
        _ => serde_json::from_str(text).map_err(corrupt),
    }
}

/// The agent's journal, loaded in memory and written through on every change.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: JournalFile,
}

impl Journal {
    /// Opens the journal in `state_dir` of the agent of node `node`; an absent file is an empty
    /// journal.
    pub fn open(state_dir: &Path, node: &str) -> Result<Journal, JournalError> {
        let path = state_dir.join(JOURNAL_FILE);
        let corrupt = |problem: String| JournalError::Corrupt {
            path: path.clone(),
            problem,
        };
        let file = match quotient_common::bounded_read::open_regular(&path) {
            Ok(file) => {
                let text = read_text_at_most(file, JOURNAL_BYTES_MAX)
                    .map_err(|source| JournalError::Io {
                        action: "read",
                        path: path.clone(),
                        source,
                    })?
                    .ok_or_else(|| {
                        corrupt(format!("it is over the limit of {JOURNAL_BYTES_MAX} bytes"))
                    })?;
                return Journal::from_text(&text, node, path);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => JournalFile {
                version: AGENT_JOURNAL.current,
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

    /// The journal whose file at `path` holds `text` (read within the size limit), checked as
    /// [`Journal::open`] checks it; nothing is read or written here.
    pub fn from_text(text: &str, node: &str, path: PathBuf) -> Result<Journal, JournalError> {
        let file = decode(text, node, &path)?;
        let mut journal = Journal { path, file };
        journal.trim();
        Ok(journal)
    }

    /// Appends reports (an exit or a launch given up also marks its attempt finished) and
    /// writes the journal.
    pub fn push(&mut self, reports: Vec<JobReport>) -> Result<(), JournalError> {
        if reports.is_empty() {
            return Ok(());
        }
        for report in reports {
            if report.event.ends_attempt()
                && !self.file.finished.contains(&(report.job, report.attempt))
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

    /// When a leader last acknowledged a heartbeat, on the boot clock, if it was recorded.
    pub fn last_ack_boot(&self) -> Option<&BootStamp> {
        self.file.last_ack_boot.as_ref()
    }

    /// Records a heartbeat acknowledgement (its send time, ms since the epoch, and on the boot
    /// clock when it could be read).
    pub fn record_ack(
        &mut self,
        unix_ms: u64,
        boot: Option<BootStamp>,
    ) -> Result<(), JournalError> {
        self.file.last_ack_unix_ms = Some(unix_ms);
        self.file.last_ack_boot = boot;
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
                    JobEvent::Started | JobEvent::Running | JobEvent::Checkpointed
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

    fn report(job: u64, event: JobEvent) -> JobReport {
        JobReport {
            job: JobId(job),
            attempt: 1,
            node: NODE.into(),
            event,
        }
    }

    const NODE: &str = "gpu-a";

    /// Reports and finished attempts survive a reopen; acknowledged ones are gone.
    #[test]
    fn the_journal_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), NODE).unwrap();
        journal
            .push(vec![
                report(1, JobEvent::Running),
                report(1, JobEvent::ExitedAfterSignal { code: Some(0) }),
            ])
            .unwrap();
        journal.record_ack(1_234, None).unwrap();
        let first = journal.pending(1)[0].sequence;
        journal.acknowledge(&[first]).unwrap();

        let journal = Journal::open(dir.path(), NODE).unwrap();
        let pending = journal.pending(10);
        assert_eq!(pending.len(), 1);
        assert_eq!(
            pending[0].report.event,
            JobEvent::ExitedAfterSignal { code: Some(0) }
        );
        assert_eq!(journal.finished().collect::<Vec<_>>(), vec![(JobId(1), 1)]);
        assert_eq!(journal.last_ack_unix_ms(), Some(1_234));
    }

    /// An attempt whose launch was given up is finished, like one that exited: a restarted
    /// agent never tries it again, and the report waits for a leader.
    #[test]
    fn a_launch_given_up_is_a_finished_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), NODE).unwrap();
        let failed = report(
            5,
            JobEvent::LaunchFailed {
                fault: quotient_common::job::LaunchFault::Node,
                tries: 3,
                message: "docker create container: connection refused".into(),
            },
        );
        journal.push(vec![failed.clone()]).unwrap();
        let journal = Journal::open(dir.path(), NODE).unwrap();
        assert_eq!(journal.finished().collect::<Vec<_>>(), vec![(JobId(5), 1)]);
        assert_eq!(journal.pending(10)[0].report, failed);
    }

    /// A journal over the size limit or garbled is refused with a message naming the file.
    #[test]
    fn an_oversized_or_garbled_journal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        std::fs::write(&path, "{not json").unwrap();
        let error = Journal::open(dir.path(), NODE).unwrap_err().to_string();
        assert!(error.contains(JOURNAL_FILE), "{error}");
        std::fs::write(&path, vec![b' '; JOURNAL_BYTES_MAX as usize + 1]).unwrap();
        let error = Journal::open(dir.path(), NODE).unwrap_err().to_string();
        assert!(error.contains("over the limit"), "{error}");
    }

    /// Past the limit, progress reports are dropped before exits.
    #[test]
    fn exits_outlive_progress_reports_when_the_journal_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), NODE).unwrap();
        journal
            .push(vec![report(0, JobEvent::Exited { code: 3 })])
            .unwrap();
        let progress: Vec<JobReport> = (1..=PENDING_REPORTS_MAX as u64)
            .map(|job| report(job, JobEvent::Running))
            .collect();
        journal.push(progress).unwrap();
        assert_eq!(journal.pending_count(), PENDING_REPORTS_MAX);
        assert_eq!(
            journal.pending(1)[0].report,
            report(0, JobEvent::Exited { code: 3 })
        );
    }

    /// The journal fixture of `version`, as an agent of that version left it.
    fn fixture(version: u16) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(format!("agent-journal-v{version}.json"))
    }

    /// What every journal fixture holds: four reports waiting (the first of five was
    /// acknowledged), three finished attempts and the last acknowledgement.
    fn check_fixture_content(journal: &Journal) {
        let pending = journal.pending(10);
        let sequences: Vec<u64> = pending.iter().map(|pending| pending.sequence).collect();
        assert_eq!(sequences, vec![2, 3, 4, 5]);
        let reports: Vec<JobReport> = pending.into_iter().map(|pending| pending.report).collect();
        let at = |job: u64, attempt: u32, event: JobEvent| JobReport {
            attempt,
            ..report(job, event)
        };
        assert_eq!(
            reports,
            vec![
                at(1, 1, JobEvent::Running),
                at(2, 1, JobEvent::Exited { code: 3 }),
                at(3, 2, JobEvent::ExitedAfterSignal { code: None }),
                at(
                    4,
                    1,
                    JobEvent::LaunchFailed {
                        fault: quotient_common::job::LaunchFault::Job,
                        tries: 1,
                        message: "no such image: trainer:v2".into(),
                    }
                ),
            ]
        );
        assert_eq!(
            journal.finished().collect::<Vec<_>>(),
            vec![(JobId(2), 1), (JobId(3), 2), (JobId(4), 1)]
        );
        assert_eq!(journal.last_ack_unix_ms(), Some(1_750_000_123_456));
    }

    /// A journal written by every version this build reads opens with the same content, and
    /// its sequence numbers go on where it left off.
    #[test]
    fn a_journal_of_every_version_reads_back() {
        for version in AGENT_JOURNAL.oldest..=AGENT_JOURNAL.current {
            let dir = tempfile::tempdir().unwrap();
            std::fs::copy(fixture(version), dir.path().join(JOURNAL_FILE)).unwrap();
            let mut journal = Journal::open(dir.path(), NODE)
                .unwrap_or_else(|error| panic!("version {version}: {error}"));
            check_fixture_content(&journal);
            journal.push(vec![report(9, JobEvent::Started)]).unwrap();
            assert_eq!(journal.pending(10)[4].sequence, 6, "version {version}");
        }
    }

    /// This build writes its version as the fixture of that version, byte for byte: a change
    /// to the journal's types that forgot to bump its version fails here.
    #[test]
    fn this_build_writes_the_fixture_of_the_current_version() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture(AGENT_JOURNAL.oldest), dir.path().join(JOURNAL_FILE)).unwrap();
        let mut journal = Journal::open(dir.path(), NODE).unwrap();
        // The same acknowledgement again: the journal is rewritten unchanged.
        journal.record_ack(1_750_000_123_456, None).unwrap();
        let written = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
        let expected = std::fs::read_to_string(fixture(AGENT_JOURNAL.current)).unwrap();
        assert_eq!(written, expected);
    }

    /// A journal of a version this build does not read stops the agent with both versions and
    /// what to do; the file is left as it was.
    #[test]
    fn a_journal_of_an_unknown_version_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let newer = format!(
            r#"{{"version":{},"next_sequence":1,"pending":[],"finished":[],"last_ack_unix_ms":null,"added":true}}"#,
            AGENT_JOURNAL.current + 1
        );
        std::fs::write(&path, &newer).unwrap();
        let error = Journal::open(dir.path(), NODE).unwrap_err();
        assert!(matches!(error, JournalError::Version(_)), "{error:?}");
        let message = error.to_string();
        assert!(message.contains(JOURNAL_FILE), "{message}");
        assert!(
            message.contains(&format!("version {}", AGENT_JOURNAL.current + 1)),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "versions {} to {}",
                AGENT_JOURNAL.oldest, AGENT_JOURNAL.current
            )),
            "{message}"
        );
        assert!(message.contains("newer build"), "{message}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), newer);
        std::fs::write(&path, r#"{"version":0}"#).unwrap();
        let error = Journal::open(dir.path(), NODE).unwrap_err().to_string();
        assert!(error.contains("older than this build reads"), "{error}");
    }
}
