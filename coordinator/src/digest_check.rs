//! Checks that every replica holds the leader's state, so that a member whose state diverged
//! says so loudly instead of reporting healthy.
//!
//! Every `raft.digest_check_interval_ms` the leader proposes `Command::CheckDigest`, carrying
//! the digest its own state had after the entry of the previous such command. Every replica,
//! on applying the entry that holds one:
//!
//! 1. compares the leader's digest with its own record for that entry's index, when it has
//!    one (a replica that received a snapshot since has none), and on a difference marks
//!    itself diverged, for good: an error log, and `healthy: false` with the reason in its
//!    health report (`quotient cluster health`);
//! 2. records its own digest after this entry, for the next check. Only the capture of the
//!    state happens on the apply path (copy-on-write, as a snapshot's); encoding and hashing it
//!    run on the blocking pool.
//!
//! A replica marked diverged stops campaigning (`raft.runtime_config().elect(false)`, checked every
//! interval): it still follows, so the cluster keeps its quorum, but it never leads, since a
//! leader's digest is the one the others are measured against (found by probing: a member
//! whose snapshot was changed on disk won an election, and `cluster health` then named the
//! two healthy members diverged).
//!
//! Replicas that applied the same log hold the same state, so their digests at the same index
//! are equal; a difference means the state came from elsewhere (a data directory restored from
//! another cluster or time), a disk fault the log's checksums missed, or a bug.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use quotient_core::{Command, DigestAt, SnapshotCapture};

use crate::context::Context;
use crate::proposer::NotProposed;
use crate::views;

/// Digests kept, newest first out: the leader asks about the previous check only, a few more
/// cover a check proposed while an earlier digest was still being computed.
pub const DIGEST_RECORDS_MAX: usize = 8;

#[derive(Debug, Default)]
struct Inner {
    /// This replica's digest after the entry at each index (a key) that held a check.
    records: BTreeMap<u64, u64>,
    diverged: Option<String>,
}

/// One replica's digest records and verdict; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct DigestChecks {
    inner: Arc<Mutex<Inner>>,
}

impl DigestChecks {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Compares the leader's digest with this replica's record at the same index.
    pub fn compare(&self, leader: DigestAt) {
        let mut inner = self.lock();
        let Some(mine) = inner.records.get(&leader.index).copied() else {
            return;
        };
        if mine == leader.digest || inner.diverged.is_some() {
            return;
        }
        let text = format!(
            "this coordinator's state after log index {index} has digest {mine:016x}, but the leader's has {theirs:016x}: its state has diverged from the cluster's (a data directory restored from elsewhere, a disk fault, or a bug). Stop it, move its data directory away, start it again and add it back (`quotient cluster remove-member --id ID`, then `quotient cluster add-member --id ID --address ADDR`, with its id), so that it copies the leader's state",
            index = leader.index,
            theirs = leader.digest,
        );
        tracing::error!("{text}");
        inner.diverged = Some(text);
    }

    /// Records this replica's digest after the entry at `index`, from `capture` (taken under
    /// the apply lock), computed on the blocking pool.
    pub fn record(&self, index: u64, capture: SnapshotCapture) {
        let checks = self.clone();
        tokio::task::spawn_blocking(move || {
            let digest = views::digest_of_bytes(&capture.into_bytes());
            let mut inner = checks.lock();
            inner.records.insert(index, digest);
            while inner.records.len() > DIGEST_RECORDS_MAX {
                inner.records.pop_first();
            }
        });
    }

    /// This replica's newest recorded digest.
    pub fn latest(&self) -> Option<DigestAt> {
        self.lock()
            .records
            .last_key_value()
            .map(|(index, digest)| DigestAt {
                index: *index,
                digest: *digest,
            })
    }

    /// Why this replica is unhealthy, when its state diverged.
    pub fn problem(&self) -> Option<String> {
        self.lock().diverged.clone()
    }
}

/// On the leader, proposes a check every `raft.digest_check_interval_ms` (none when 0);
/// returns when Raft stops.
pub async fn run(ctx: Context) {
    let interval_ms = ctx.config.raft.digest_check_interval_ms;
    if interval_ms == 0 {
        return;
    }
    let interval = Duration::from_millis(interval_ms);
    let Context {
        raft,
        state_machine,
        proposer,
        ..
    } = ctx;
    // The first check one interval after start, not at once: a new leader has nothing to
    // compare yet.
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut campaigns = true;
    loop {
        ticks.tick().await;
        if campaigns && state_machine.digest_checks().problem().is_some() {
            campaigns = false;
            raft.runtime_config().elect(false);
            tracing::error!("this coordinator's state diverged from the leader's: it no longer campaigns to lead (it still follows); replace its data directory as its health says");
        }
        let (running, leader) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            (
                metrics.running_state.is_ok(),
                metrics.state == openraft::ServerState::Leader,
            )
        };
        if !running {
            return;
        }
        if !leader {
            continue;
        }
        let leader = state_machine.digest_checks().latest();
        match proposer.propose(Command::CheckDigest { leader }).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::debug!(error = %error, "a digest check was not committed"),
            Err(NotProposed::Stopped) => {
                tracing::debug!("the proposer stopped; no more digest checks");
                return;
            }
            Err(error) => tracing::warn!(error = %error, "a digest check was not proposed"),
        }
    }
}
