//! The history of one episode: every operation the clients invoked, with when it was invoked,
//! when its outcome came back and what the outcome was, kept in memory for the checker and
//! appended as JSON lines to `history.jsonl` in the episode's folder (an `invoke` line when an
//! operation starts, a `complete` line when it ends, so an operation cut short by a crash of
//! this program still shows up).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch on this host's clock: the clock every container shares
/// (they run on this kernel), which the job scripts read too.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// What came of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The cluster said it was done (for a submit: the job's id).
    Ack,
    /// The state refused it (bad request, not found, conflict, precondition, limit,
    /// forbidden): by the API's contract nothing was done.
    Refused,
    /// No coordinator could serve it (no leader, no quorum) before the deadline, and no
    /// attempt's answer was lost: by the API's contract nothing was done.
    Unavailable,
    /// An answer was lost, or the deadline passed after the write was sent: it may or may not
    /// have been applied.
    Unknown,
}

/// The kinds of operations the clients make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// `job submit` with an idempotency key (also the job's name), retried with the same key.
    Submit,
    /// `job update --priority` to a value no other operation of the episode writes.
    Priority,
    /// `job cancel`.
    Cancel,
    /// `share create`.
    ShareCreate,
    /// `share update` of the limit and of `max_jobs_per_user`, the latter a value no other
    /// operation of the episode writes.
    ShareUpdate,
}

/// One operation: what was asked, and what came of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    pub id: u64,
    pub client: u32,
    pub kind: OpKind,
    /// Submit: the idempotency key, which is also the job's name.
    pub key: Option<String>,
    /// The job (`j-N`): the one a submit got, or the one updated or cancelled.
    pub job: Option<String>,
    pub share: Option<String>,
    /// Submit: the job's priority; priority update: the new one.
    pub priority: Option<u32>,
    /// Share create or update: the a10g limit.
    pub limit: Option<u32>,
    /// Share update: `max_jobs_per_user` (unique within the episode).
    pub cap: Option<u32>,
    /// Submit: how long the job runs, in seconds.
    pub run_s: Option<u32>,
    pub invoke_us: u64,
    /// When the outcome came back (0 while in flight).
    pub complete_us: u64,
    pub outcome: Option<Outcome>,
    /// The error's code (docs/errors.md) of the last attempt, when it failed.
    pub code: Option<String>,
    pub detail: Option<String>,
    /// Calls made (a submit is sent again with the same key after an unknown outcome).
    pub attempts: u32,
    /// Submit: whether the cluster answered that the key was already known.
    pub duplicate: Option<bool>,
}

impl Op {
    /// A new operation of `kind` by `client`, invoked now.
    pub fn new(client: u32, kind: OpKind) -> Op {
        Op {
            id: 0,
            client,
            kind,
            key: None,
            job: None,
            share: None,
            priority: None,
            limit: None,
            cap: None,
            run_s: None,
            invoke_us: now_us(),
            complete_us: 0,
            outcome: None,
            code: None,
            detail: None,
            attempts: 0,
            duplicate: None,
        }
    }

    pub fn acked(&self) -> bool {
        self.outcome == Some(Outcome::Ack)
    }

    /// Refused by the state or by an unavailable cluster: by the contract, not applied.
    pub fn not_applied(&self) -> bool {
        matches!(
            self.outcome,
            Some(Outcome::Refused) | Some(Outcome::Unavailable)
        )
    }
}

#[derive(Debug)]
struct Inner {
    ops: Vec<Op>,
    file: Option<File>,
    next_id: u64,
}

/// The episode's history; cheap to clone, shared by the clients.
#[derive(Debug, Clone)]
pub struct History {
    inner: Arc<Mutex<Inner>>,
}

impl History {
    /// A history written to `path` as JSON lines.
    pub fn create(path: &Path) -> std::io::Result<History> {
        let file = File::create(path)?;
        Ok(History {
            inner: Arc::new(Mutex::new(Inner {
                ops: Vec::new(),
                file: Some(file),
                next_id: 1,
            })),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(inner: &mut Inner, event: &str, op: &Op) {
        let Some(file) = inner.file.as_mut() else {
            return;
        };
        let mut line = serde_json::json!({ "event": event });
        if let (Some(map), Ok(serde_json::Value::Object(fields))) =
            (line.as_object_mut(), serde_json::to_value(op))
        {
            map.extend(fields);
        }
        if writeln!(file, "{line}").is_err() {
            inner.file = None;
        }
    }

    /// Records that `op` was invoked; its id.
    pub fn invoke(&self, op: &mut Op) -> u64 {
        let mut inner = self.lock();
        op.id = inner.next_id;
        inner.next_id += 1;
        History::write(&mut inner, "invoke", op);
        op.id
    }

    /// Records `op`'s outcome (now).
    pub fn complete(&self, mut op: Op, outcome: Outcome) -> Op {
        op.complete_us = now_us();
        op.outcome = Some(outcome);
        let mut inner = self.lock();
        History::write(&mut inner, "complete", &op);
        inner.ops.push(op.clone());
        op
    }

    /// Every completed operation, in completion order.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().ops.clone()
    }
}
