//! Checks that every replica holds the leader's state, so that a member whose state diverged
//! says so loudly instead of reporting healthy.
//!
//! Every `raft.digest_check_interval_ms` the leader proposes `Command::CheckDigest`, carrying
//! the digest its own state had after the entry of the previous such command. Every replica,
//! on applying the entry that holds one:
//!
//! 1. compares the leader's digest with its own record for that entry's index, when it has
//!    one (a replica that received a snapshot since has none), and on a difference marks
//!    itself diverged: an error log, and `healthy: false` with the reason in its health
//!    report (`quotient cluster health`). The mark stays until a later check agrees: the
//!    states are the same again (a leader of another release than this replica's, during an
//!    upgrade, computes some entries otherwise; once it runs this release and has replayed
//!    its log, they agree). Entries this replica replays from its own log at start are not
//!    compared: their digests were computed by whatever release ran then (found by probing an
//!    upgrade: every restart of a new member flagged it again, or not, by a race with the
//!    digest's computation);
//! 2. records its own digest after this entry, for the next check. Only the capture of the
//!    state happens on the apply path (copy-on-write, as a snapshot's); encoding and hashing it
//!    run on the blocking pool.
//!
//! A replica marked diverged stops campaigning (`raft.runtime_config().elect(false)`, within
//! [`CAMPAIGN_CHECK_MS`] of the mark) until the mark goes: it still follows, so the cluster
//! keeps its quorum, but it does not lead, since a leader's digest is the one the others are
//! measured against (found by probing: a member whose snapshot was changed on disk won an
//! election, and `cluster health` then named the two healthy members diverged; and, checked
//! only at each digest interval, a member marked diverged won an election 2 s later).
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

/// How often a replica looks whether its mark changed, to stop or resume campaigning
/// (milliseconds).
pub const CAMPAIGN_CHECK_MS: u64 = 200;

#[derive(Debug, Default)]
struct Inner {
    /// This replica's digest after the entry at each index (a key) that held a check.
    records: BTreeMap<u64, u64>,
    diverged: Option<String>,
    /// The last index of this replica's log when it started: checks in entries up to it are
    /// replays, not compared.
    live_after: u64,
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

    /// Checks in entries at or before `index` (the last of this replica's log at start) are
    /// replays and are not compared.
    pub fn compare_only_after(&self, index: u64) {
        self.lock().live_after = index;
    }

    /// Compares the leader's digest, carried by the entry at `entry_index`, with this
    /// replica's record at the same index; a mark goes when they agree.
    pub fn compare(&self, entry_index: u64, leader: DigestAt) {
        let mut inner = self.lock();
        if entry_index <= inner.live_after {
            return;
        }
        let Some(mine) = inner.records.get(&leader.index).copied() else {
            return;
        };
        if mine == leader.digest {
            if inner.diverged.take().is_some() {
                tracing::warn!(
                    index = leader.index,
                    "this coordinator's state agrees with the leader's again: it is no longer marked diverged"
                );
            }
            return;
        }
        if inner.diverged.is_some() {
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

/// Stops this replica campaigning within [`CAMPAIGN_CHECK_MS`] of its mark, or of a Raft
/// request it could not decode (`raft_service`: a leader of a newer release), and lets it
/// campaign again once neither holds; returns when Raft stops.
async fn campaign_while_not_diverged(
    raft: crate::store::type_config::Raft,
    checks: DigestChecks,
    identity: crate::identity::ClusterIdentity,
) {
    let mut ticks = tokio::time::interval(Duration::from_millis(CAMPAIGN_CHECK_MS));
    let mut campaigns = true;
    loop {
        ticks.tick().await;
        if raft.metrics().borrow().running_state.is_err() {
            return;
        }
        let diverged = checks.problem().is_some();
        let unreadable = identity.refused_recently(crate::raft_service::UNREADABLE_RAFT_REQUEST);
        if campaigns && (diverged || unreadable) {
            campaigns = false;
            raft.runtime_config().elect(false);
            if diverged {
                tracing::error!("this coordinator's state diverged from the leader's: it no longer campaigns to lead (it still follows); replace its data directory as its health says");
            } else {
                tracing::error!("this coordinator cannot read another coordinator's Raft requests: it no longer campaigns to lead until it can (upgrade it)");
            }
        } else if !campaigns && !diverged && !unreadable {
            campaigns = true;
            raft.runtime_config().elect(true);
            tracing::warn!("this coordinator campaigns again: its state agrees with the leader's, and it reads every Raft request");
        }
    }
}

/// On the leader, proposes a check every `raft.digest_check_interval_ms` (none when 0), and
/// on every member stops or resumes campaigning as its marks say; returns when Raft stops.
pub async fn run(ctx: Context) {
    // Whether this member may campaign is watched even with checks off: a Raft request it
    // cannot read stops it too.
    let campaigns = campaign_while_not_diverged(
        ctx.raft.clone(),
        ctx.state_machine.digest_checks().clone(),
        ctx.identity.clone(),
    );
    tokio::join!(campaigns, propose_checks(ctx));
}

/// On the leader, proposes a check every `raft.digest_check_interval_ms` (none when 0);
/// returns when Raft stops.
async fn propose_checks(ctx: Context) {
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
    loop {
        ticks.tick().await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn checks_with(records: &[(u64, u64)], live_after: u64) -> DigestChecks {
        let checks = DigestChecks::default();
        checks.compare_only_after(live_after);
        checks.lock().records.extend(records.iter().copied());
        checks
    }

    #[test]
    fn replays_are_not_compared_and_a_mark_goes_when_a_later_check_agrees() {
        let at = |index, digest| DigestAt { index, digest };
        // A check replayed from this member's own log (entry 10, at most 12 at start): not
        // compared, whatever it says (found by probing an upgrade).
        let checks = checks_with(&[(5, 0xaa)], 12);
        checks.compare(10, at(5, 0xbb));
        assert_eq!(checks.problem(), None);
        // A live one that differs marks it.
        checks.compare(13, at(5, 0xbb));
        assert!(checks.problem().unwrap().contains("has diverged"));
        // A later one that differs keeps the first reason; one that agrees clears it.
        checks.lock().records.insert(13, 0xcc);
        checks.compare(20, at(13, 0xdd));
        assert!(checks.problem().unwrap().contains("after log index 5"));
        checks.lock().records.insert(20, 0xee);
        checks.compare(27, at(20, 0xee));
        assert_eq!(checks.problem(), None);
    }
}
