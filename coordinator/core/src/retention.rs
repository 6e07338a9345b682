//! Retention: a finished job (SUCCEEDED, FAILED, CANCELLED) leaves the live state once it has
//! been finished for the retention period, or sooner when more finished jobs are kept than the
//! retention count (oldest end first). The leader proposes [`Command::ExpireFinished`] with its
//! settings when something is due; the removal happens where the command is applied, at the
//! time the leader stamped on its entry, so every replica removes the same jobs.
//!
//! A removed job's id is never issued again, and `job get` of it says it was removed. Its
//! idempotency key outlives it by the key window: a client that retries its submit after the
//! job was removed is answered with the removed job's id (a duplicate), never given a second
//! job; once the window is over the key may be used again.
//!
//! [`Command::ExpireFinished`]: crate::command::Command::ExpireFinished

use quotient_common::JobId;
use serde::{Deserialize, Serialize};

use crate::command::{ApplyCtx, Outcome, Rejection};
use crate::state::State;

/// How long finished jobs and their idempotency keys stay; the leader's settings, carried in
/// the command so that every replica applies the same ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionRule {
    /// How long a finished job stays after its end (milliseconds).
    pub finished_ms: u64,
    /// The most finished jobs kept; the ones that ended first go first.
    pub finished_max: u64,
    /// How long an idempotency key outlives its removed job (milliseconds); the most keys
    /// kept for removed jobs is `finished_max`.
    pub key_window_ms: u64,
    /// How long the hourly usage of the shares is kept (`crate::usage`), in milliseconds.
    pub usage_ms: u64,
}

/// The most jobs one `ExpireFinished` removes, so that one entry's apply stays short; the
/// leader proposes the next one at once while more is due.
pub const EXPIRE_BATCH_MAX: usize = 10_000;

impl State {
    /// Whether applying `ExpireFinished` with `rule` at `now_ms` would remove anything.
    pub fn expiry_due(&self, rule: &RetentionRule, now_ms: u64) -> bool {
        let finished = &self.index.finished;
        let old_job = finished
            .first()
            .is_some_and(|(ended, _)| ended.saturating_add(rule.finished_ms) <= now_ms);
        let old_key = self
            .data
            .key_expiry
            .get_min()
            .is_some_and(|(removed, _)| removed.saturating_add(rule.key_window_ms) <= now_ms);
        let old_usage = self.data.usage.get_min().is_some_and(|(hour, _)| {
            (hour + crate::usage::USAGE_BUCKET_MS).saturating_add(rule.usage_ms) <= now_ms
        });
        old_job
            || old_key
            || old_usage
            || finished.len() as u64 > rule.finished_max
            || self.data.key_expiry.len() as u64 > rule.finished_max
    }

    /// Why there is no job `id`: it was removed by retention, or never was.
    pub fn missing_job(&self, id: JobId) -> Rejection {
        if self.was_removed(id) {
            Rejection::JobRemoved(id)
        } else {
            Rejection::UnknownJob(id)
        }
    }

    /// Whether `id` was issued to a job that has since been removed by retention.
    pub fn was_removed(&self, id: JobId) -> bool {
        id.0 >= 1 && id.0 <= self.data.jobs.issued() as u64 && self.job(id).is_none()
    }

    pub(crate) fn expire_finished(&mut self, rule: RetentionRule, ctx: ApplyCtx) -> Outcome {
        let now = ctx.time_ms;
        let mut removed = 0usize;
        while removed < EXPIRE_BATCH_MAX {
            let Some(&(ended, id)) = self.index.finished.first() else {
                break;
            };
            let expired = ended.saturating_add(rule.finished_ms) <= now;
            let over = self.index.finished.len() as u64 > rule.finished_max;
            if !expired && !over {
                break;
            }
            self.remove_finished(id, now);
            removed += 1;
        }
        while let Some((at, key)) = self.data.key_expiry.get_min().cloned() {
            let expired = at.saturating_add(rule.key_window_ms) <= now;
            let over = self.data.key_expiry.len() as u64 > rule.finished_max;
            if !expired && !over {
                break;
            }
            self.data.key_expiry.remove(&(at, key.clone()));
            // Only while the key still names a removed job (it always does: a key in use is
            // never queued here).
            if self
                .data
                .idempotency
                .get(&key)
                .is_some_and(|job| self.job(*job).is_none())
            {
                self.data.idempotency.remove(&key);
            }
        }
        // Credited up to now first, so that no hour older than the retention is made again
        // after the pruning.
        self.advance_usage(now);
        self.prune_usage(now.saturating_sub(rule.usage_ms));
        Outcome::Done
    }

    /// Takes a finished job out of the live state.
    fn remove_finished(&mut self, id: JobId, now: u64) {
        let Some(job) = self.job(id).cloned() else {
            return;
        };
        debug_assert!(job.state.is_terminal());
        self.index.remove_job(&job, &self.data);
        let slot = usize::try_from(id.0 - 1).expect("a slot");
        self.data.jobs.remove(slot);
        self.forget_service_job(id);
        if let Some(key) = &job.spec.idempotency_key {
            if self.data.idempotency.get(key) == Some(&id) {
                self.data.key_expiry.insert((now, key.clone()));
            }
        }
        if let Some(changes) = self.changes.as_mut() {
            // Named as a changed job whose record is gone.
            changes.job_changed(&job, &job);
        }
    }
}
