//! The job history: one record per finished job (`api::HistoryRecord`), kept on every
//! coordinator in `history.redb` in its data directory, outside the replicated state, for
//! longer than the live state keeps the job (docs/accounting.md).
//!
//! Records are written when the entry that ends a job is applied: every coordinator applies
//! every entry, so every coordinator writes the same records. The state machine hands them to
//! a writer thread, which commits them in batches (a few hundred milliseconds apart), off the
//! write path. What a crash loses before a commit, and what a follower skips when it installs
//! a snapshot instead of applying entries, is written again from the live state: when the
//! coordinator starts and after each snapshot it installs, every finished job the state holds
//! gets its record if it has none. A job that ended and was removed by retention within one
//! such gap has no record here; the other coordinators have it.
//!
//! Records are keyed by (end time, job id), so a page is a range read, newest end first.
//! Each value holds its encoding's version (`version::JOB_HISTORY`), then the record in
//! bincode, at most [`HISTORY_RECORD_BYTES_MAX`]; a value over it, or of a version this build
//! does not read, is an error that names the file, never a guess. Records older than the
//! history's retention are removed by the writer, when it starts and every 10 minutes after.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use quotient_common::api::{history_page_token, HistoryPage, HistoryRecord};
use quotient_common::version::{Writer, JOB_HISTORY};
use quotient_common::{JobId, JobState};
use redb::{Database, ReadableTable, TableDefinition};

/// The history's file in a coordinator's data directory.
pub const HISTORY_FILE_NAME: &str = "history.redb";
/// The largest record value read back: a record holds at most 32 attempts of short strings.
pub const HISTORY_RECORD_BYTES_MAX: usize = 256 * 1024;
/// How long the writer gathers records before it commits them.
const COMMIT_EVERY: Duration = Duration::from_millis(200);
/// Records waiting for the writer at most; past it, the state machine waits for room.
const QUEUE_MAX: usize = 64;
/// How often the writer removes records older than the retention.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// (end time in ms, job id) to the versioned record.
const RECORDS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("records");
/// Job id to its end time: finds a job's record, and whether it has one.
const BY_JOB: TableDefinition<u64, u64> = TableDefinition::new("by_job");

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("job history {path}: {message}")]
    Store { path: PathBuf, message: String },
    #[error("job history {path}: a record of {size} bytes, over the limit of {max}: the file is damaged; move it away and the coordinator writes the records of the jobs it still holds again")]
    TooLarge {
        path: PathBuf,
        size: usize,
        max: usize,
    },
    #[error("job history {path}: {source}")]
    Version {
        path: PathBuf,
        source: quotient_common::version::VersionError,
    },
}

enum Message {
    /// Records to keep; one already kept for the same job (the same id and end) is left as
    /// it is.
    Records(Vec<HistoryRecord>),
    /// Answer once everything sent before is committed.
    Flush(mpsc::Sender<()>),
}

/// What a history page asks for.
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    pub share: Option<String>,
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
    pub state: Option<JobState>,
    pub job: Option<JobId>,
    pub limit: usize,
    /// Continue below this record (end, job), from a page token.
    pub before: Option<(u64, JobId)>,
}

/// See the module docs.
pub struct History {
    db: Arc<Database>,
    path: PathBuf,
    sender: Mutex<Option<SyncSender<Message>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").field("path", &self.path).finish()
    }
}

impl History {
    /// Opens (or creates) the history in `data_dir` and starts its writer, which keeps
    /// records for `retain_ms` after their end.
    pub fn open(data_dir: &Path, retain_ms: u64) -> Result<History, HistoryError> {
        let path = data_dir.join(HISTORY_FILE_NAME);
        let error = |message: String| HistoryError::Store {
            path: path.clone(),
            message,
        };
        let db = crate::store::open_database(
            &path,
            "the history is this coordinator's own copy: stop it, move the file away and start \
             it again (it makes a new one; docs/operations.md says what is kept)",
        )
        .map_err(error)?;
        let txn = db.begin_write().map_err(|e| error(e.to_string()))?;
        txn.open_table(RECORDS).map_err(|e| error(e.to_string()))?;
        txn.open_table(BY_JOB).map_err(|e| error(e.to_string()))?;
        txn.commit().map_err(|e| error(e.to_string()))?;
        let db = Arc::new(db);
        let (sender, receiver) = mpsc::sync_channel(QUEUE_MAX);
        let writer = {
            let db = Arc::clone(&db);
            let path = path.clone();
            std::thread::Builder::new()
                .name("job-history".into())
                .spawn(move || write_loop(&db, &path, receiver, retain_ms))
                .map_err(|e| error(e.to_string()))?
        };
        Ok(History {
            db,
            path,
            sender: Mutex::new(Some(sender)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Hands `records` to the writer; waits only while its queue is full.
    pub fn append(&self, records: Vec<HistoryRecord>) {
        if records.is_empty() {
            return;
        }
        let sender = self
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(sender) = sender {
            if sender.send(Message::Records(records)).is_err() {
                tracing::error!(path = %self.path.display(), "the job history's writer stopped; records are lost until the coordinator restarts");
            }
        }
    }

    /// Waits until everything appended so far is committed, at most `within`; whether it was.
    pub fn flush(&self, within: Duration) -> bool {
        let sender = self
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(sender) = sender else {
            return false;
        };
        let (done, wait) = mpsc::channel();
        if sender.send(Message::Flush(done)).is_err() {
            return false;
        }
        wait.recv_timeout(within).is_ok()
    }

    /// Commits what is pending and stops the writer.
    pub fn close(&self) {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = writer.join();
        }
    }

    fn error(&self, message: impl std::fmt::Display) -> HistoryError {
        HistoryError::Store {
            path: self.path.clone(),
            message: message.to_string(),
        }
    }

    /// One page of the records `query` asks for that `visible` lets the caller see, newest
    /// end first.
    pub fn page(
        &self,
        query: &HistoryQuery,
        visible: impl Fn(&HistoryRecord) -> bool,
    ) -> Result<HistoryPage, HistoryError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        let records = txn.open_table(RECORDS).map_err(|e| self.error(e))?;
        let matches = |record: &HistoryRecord| {
            query.share.as_ref().is_none_or(|s| &record.share == s)
                && query.state.is_none_or(|s| record.state == s.as_str())
                && visible(record)
        };
        if let Some(job) = query.job {
            let by_job = txn.open_table(BY_JOB).map_err(|e| self.error(e))?;
            let Some(ended) = by_job.get(job.0).map_err(|e| self.error(e))? else {
                return Ok(HistoryPage::default());
            };
            let ended = ended.value();
            let value = records
                .get((ended, job.0))
                .map_err(|e| self.error(e))?
                .map(|value| self.decode(value.value()))
                .transpose()?;
            return Ok(HistoryPage {
                records: value.into_iter().filter(|r| matches(r)).collect(),
                next_page_token: None,
            });
        }
        let end = match (query.before, query.until_ms) {
            (Some((ended, job)), until) => (ended, job.0).min((until.unwrap_or(u64::MAX), 0)),
            (None, Some(until)) => (until, 0),
            (None, None) => (u64::MAX, u64::MAX),
        };
        let since = query.since_ms.unwrap_or(0);
        let mut page = Vec::new();
        let mut next_page_token = None;
        for item in records.range(..end).map_err(|e| self.error(e))?.rev() {
            let (key, value) = item.map_err(|e| self.error(e))?;
            let (ended, job) = key.value();
            if ended < since {
                break;
            }
            let record = self.decode(value.value())?;
            if !matches(&record) {
                continue;
            }
            if page.len() == query.limit {
                let (last_ended, last_job) = page
                    .last()
                    .map(|r: &HistoryRecord| {
                        (r.ended_ms, r.id.parse::<JobId>().unwrap_or(JobId(job)))
                    })
                    .unwrap_or((ended, JobId(job)));
                next_page_token = Some(history_page_token(last_ended, last_job));
                break;
            }
            page.push(record);
        }
        Ok(HistoryPage {
            records: page,
            next_page_token,
        })
    }

    /// Whether `job` has a record.
    pub fn has(&self, job: JobId) -> Result<bool, HistoryError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        let by_job = txn.open_table(BY_JOB).map_err(|e| self.error(e))?;
        Ok(by_job.get(job.0).map_err(|e| self.error(e))?.is_some())
    }

    fn decode(&self, bytes: &[u8]) -> Result<HistoryRecord, HistoryError> {
        decode_record(bytes, &self.path)
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.close();
    }
}

fn encode_record(record: &HistoryRecord) -> Vec<u8> {
    let mut bytes = JOB_HISTORY.current.to_le_bytes().to_vec();
    bincode::serde::encode_into_std_write(record, &mut bytes, bincode::config::standard())
        .expect("a record encodes into memory");
    bytes
}

fn decode_record(bytes: &[u8], path: &Path) -> Result<HistoryRecord, HistoryError> {
    if bytes.len() > HISTORY_RECORD_BYTES_MAX {
        return Err(HistoryError::TooLarge {
            path: path.to_path_buf(),
            size: bytes.len(),
            max: HISTORY_RECORD_BYTES_MAX,
        });
    }
    let damaged = |message: String| HistoryError::Store {
        path: path.to_path_buf(),
        message,
    };
    let Some((version, body)) = bytes.split_at_checked(2) else {
        return Err(damaged("a record without its version".into()));
    };
    let version = u16::from_le_bytes([version[0], version[1]]);
    JOB_HISTORY
        .check(version, Writer::File(path.display().to_string()))
        .map_err(|source| HistoryError::Version {
            path: path.to_path_buf(),
            source,
        })?;
    let config = bincode::config::standard().with_limit::<HISTORY_RECORD_BYTES_MAX>();
    let (record, _) = bincode::serde::decode_from_slice(body, config)
        .map_err(|e| damaged(format!("a record does not decode: {e}")))?;
    Ok(record)
}

/// The writer thread: gathers records, commits them in batches, prunes old ones.
fn write_loop(db: &Database, path: &Path, receiver: Receiver<Message>, retain_ms: u64) {
    let mut pending: Vec<HistoryRecord> = Vec::new();
    let mut waiting: Vec<mpsc::Sender<()>> = Vec::new();
    prune(db, path, retain_ms);
    let mut last_prune = Instant::now();
    loop {
        let message = if pending.is_empty() && waiting.is_empty() {
            // Idle: wakes for the next prune even when no job ends.
            match receiver.recv_timeout(PRUNE_EVERY) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match receiver.recv_timeout(COMMIT_EVERY) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    commit(db, path, &mut pending);
                    return;
                }
            }
        };
        match message {
            Some(Message::Records(records)) => {
                pending.extend(records);
                if pending.len() < 1_000 {
                    continue;
                }
            }
            Some(Message::Flush(done)) => waiting.push(done),
            None => {}
        }
        commit(db, path, &mut pending);
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = Instant::now();
            prune(db, path, retain_ms);
        }
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

fn commit(db: &Database, path: &Path, pending: &mut Vec<HistoryRecord>) {
    if pending.is_empty() {
        return;
    }
    let result = (|| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let txn = db.begin_write()?;
        {
            let mut records = txn.open_table(RECORDS)?;
            let mut by_job = txn.open_table(BY_JOB)?;
            for record in pending.iter() {
                let Ok(job) = record.id.parse::<JobId>() else {
                    continue;
                };
                // The same job again (a replay, the reconciling after a restart) ends at the
                // same time: kept as first written. Another job under an id given again (by a
                // cluster restored from a backup) is kept too, and found by the id from then on.
                if by_job
                    .get(job.0)?
                    .is_some_and(|ended| ended.value() == record.ended_ms)
                {
                    continue;
                }
                records.insert((record.ended_ms, job.0), encode_record(record).as_slice())?;
                by_job.insert(job.0, record.ended_ms)?;
            }
        }
        txn.commit()?;
        Ok(())
    })();
    match result {
        Ok(()) => pending.clear(),
        Err(error) => {
            // Kept for the next commit; the live state still holds these jobs.
            tracing::error!(path = %path.display(), %error, records = pending.len(), "could not write the job history");
        }
    }
}

/// Removes the records that ended more than `retain_ms` ago.
fn prune(db: &Database, path: &Path, retain_ms: u64) {
    // As the process keeps time: a step of the host's clock forward does not prune at once.
    let now = quotient_common::steady_clock::now_ms();
    let before = now.saturating_sub(retain_ms);
    let result = (|| -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
        let txn = db.begin_write()?;
        let mut removed = 0;
        {
            let mut records = txn.open_table(RECORDS)?;
            let mut by_job = txn.open_table(BY_JOB)?;
            let old: Vec<(u64, u64)> = records
                .range(..(before, 0))?
                .map(|item| item.map(|(key, _)| key.value()))
                .collect::<Result<_, _>>()?;
            for (ended, job) in old {
                records.remove((ended, job))?;
                // Unless the id now finds a later job's record.
                let found = by_job.get(job)?.map(|found| found.value());
                if found == Some(ended) {
                    by_job.remove(job)?;
                }
                removed += 1;
            }
        }
        txn.commit()?;
        Ok(removed)
    })();
    match result {
        Ok(0) => {}
        Ok(removed) => tracing::info!(removed, "removed job history records past their retention"),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "could not prune the job history")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, share: &str, ended_ms: u64, state: &str) -> HistoryRecord {
        HistoryRecord {
            id: JobId(id).to_string(),
            share: share.into(),
            state: state.into(),
            ended_ms,
            gpu_class: "a10g".into(),
            gpus: 1,
            nodes: 1,
            ..HistoryRecord::default()
        }
    }

    #[test]
    fn pages_go_newest_end_first_filtered_and_a_record_is_kept_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = History::open(dir.path(), u64::MAX).expect("opens");
        let mut records: Vec<HistoryRecord> = (1..=25)
            .map(|n| {
                let share = if n % 2 == 0 { "even" } else { "odd" };
                let state = if n % 5 == 0 { "FAILED" } else { "SUCCEEDED" };
                record(n, share, 1_000 + n * 10, state)
            })
            .collect();
        history.append(records.clone());
        // The same job again (a replay, or the reconciling after a restart): kept once, as
        // first written.
        let mut again = records[0].clone();
        again.reason = Some("changed".into());
        history.append(vec![again]);
        assert!(history.flush(Duration::from_secs(10)));
        records.reverse();

        let mut query = HistoryQuery {
            limit: 10,
            ..HistoryQuery::default()
        };
        let mut seen = Vec::new();
        loop {
            let page = history.page(&query, |_| true).expect("a page");
            assert!(page.records.len() <= 10);
            seen.extend(page.records);
            match page.next_page_token {
                Some(token) => {
                    query.before = quotient_common::api::parse_history_page_token(&token)
                }
                None => break,
            }
        }
        assert_eq!(seen, records, "every record once, newest end first");
        assert_eq!(
            seen.last().expect("the first job").reason,
            None,
            "kept as first written"
        );

        let failed_odd = history
            .page(
                &HistoryQuery {
                    share: Some("odd".into()),
                    state: Some(JobState::Failed),
                    limit: 100,
                    ..HistoryQuery::default()
                },
                |_| true,
            )
            .expect("a page");
        let ids: Vec<&str> = failed_odd.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, vec!["j-25", "j-15", "j-5"]);

        let window = history
            .page(
                &HistoryQuery {
                    since_ms: Some(1_100),
                    until_ms: Some(1_150),
                    limit: 100,
                    ..HistoryQuery::default()
                },
                |record| record.share == "even",
            )
            .expect("a page");
        let ids: Vec<&str> = window.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, vec!["j-14", "j-12", "j-10"]);

        let one = first_page(&history, Some(JobId(7)));
        assert_eq!(one.records.len(), 1);
        assert!(history.has(JobId(7)).expect("reads"));
        assert!(!history.has(JobId(99)).expect("reads"));
    }

    #[test]
    fn a_job_under_an_id_given_again_is_kept_beside_the_first() {
        // Proves that a cluster restored from a backup, which gives again the ids given after
        // it, has the new job's record kept (found by probing: it was taken for the first
        // job's and dropped), found by the id, and the first job's still listed; pruning the
        // first leaves the id finding the second.
        let dir = tempfile::tempdir().expect("tempdir");
        // The clock `prune` reads.
        let now = quotient_common::steady_clock::now_ms();
        {
            let history = History::open(dir.path(), u64::MAX).expect("opens");
            let first = record(1, "team", now - 10 * 86_400_000, "SUCCEEDED");
            let mut second = record(1, "team", now - 1_000, "FAILED");
            second.name = Some("after".into());
            history.append(vec![first, second.clone()]);
            history.append(vec![second]);
            assert!(history.flush(Duration::from_secs(10)));
            let all = first_page(&history, None);
            let states: Vec<&str> = all.records.iter().map(|r| r.state.as_str()).collect();
            assert_eq!(states, vec!["FAILED", "SUCCEEDED"]);
        }
        let history = History::open(dir.path(), 86_400_000).expect("opens, pruning the first");
        assert!(history.flush(Duration::from_secs(10)));
        let by_id = first_page(&history, Some(JobId(1)));
        assert_eq!(by_id.records.len(), 1);
        assert_eq!(by_id.records[0].name.as_deref(), Some("after"));
    }

    #[test]
    fn records_survive_a_reopen_and_old_ones_are_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The clock `prune` reads.
        let now = quotient_common::steady_clock::now_ms();
        {
            let history = History::open(dir.path(), u64::MAX).expect("opens");
            history.append(vec![
                record(1, "team", now - 10 * 86_400_000, "SUCCEEDED"),
                record(2, "team", now - 1_000, "SUCCEEDED"),
            ]);
            assert!(history.flush(Duration::from_secs(10)));
        }
        // Reopened with a retention of a day: the writer prunes the old record as it starts.
        let history = History::open(dir.path(), 86_400_000).expect("opens again");
        history.append(vec![record(3, "team", now, "FAILED")]);
        assert!(history.flush(Duration::from_secs(10)));
        let page = first_page(&history, None);
        let ids: Vec<&str> = page.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, vec!["j-3", "j-2"]);
    }

    /// The first 100 records, of every job or of `job`, as any caller may read them.
    fn first_page(history: &History, job: Option<JobId>) -> HistoryPage {
        history
            .page(
                &HistoryQuery {
                    job,
                    limit: 100,
                    ..HistoryQuery::default()
                },
                |_| true,
            )
            .expect("a page")
    }

    #[test]
    fn a_record_over_the_limit_or_of_a_newer_version_is_an_error() {
        let path = Path::new("/var/lib/quotient/history.redb");
        let huge = vec![0u8; HISTORY_RECORD_BYTES_MAX + 1];
        assert!(matches!(
            decode_record(&huge, path),
            Err(HistoryError::TooLarge { .. })
        ));
        let mut newer = encode_record(&record(1, "team", 5, "SUCCEEDED"));
        newer[..2].copy_from_slice(&(JOB_HISTORY.current + 1).to_le_bytes());
        let error = decode_record(&newer, path).expect_err("a newer version");
        assert!(error.to_string().contains("version"), "{error}");
        let good = encode_record(&record(1, "team", 5, "SUCCEEDED"));
        assert_eq!(
            decode_record(&good, path).expect("decodes").id,
            "j-1".to_string()
        );
        assert!(decode_record(&good[..good.len() - 1], path).is_err());
    }
}
