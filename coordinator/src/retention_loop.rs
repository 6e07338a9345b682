//! The leader's retention loop: proposes `ExpireFinished` with this coordinator's settings
//! whenever a finished job's retention, the retention count or a removed job's idempotency
//! key window is due (docs/retention.md). The removal itself happens where the command is
//! applied, at the time the leader stamped on its entry, so every replica removes the same
//! jobs; this loop only decides when to ask.

use std::time::Duration;

use openraft::ServerState;
use quotient_core::{Command, Outcome};

use crate::context::Context;
use crate::node_leases::wall_ms;
use crate::proposer::NotProposed;

/// How often the leader looks for something due. Retention is counted in hours or days; a
/// few seconds late is nothing, and the check reads two index entries.
pub const RETENTION_CHECK_MS: u64 = 2_000;

/// How long one proposal may take before the loop tries again at its next check.
const EXPIRE_TIMEOUT_MS: u64 = 10_000;

/// Runs until the Raft node shuts down.
pub async fn run(ctx: Context) {
    let rule = ctx.config.retention.rule();
    let mut tick = tokio::time::interval(Duration::from_millis(RETENTION_CHECK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let metrics = ctx.raft.metrics().borrow().clone();
        if metrics.running_state.is_err() {
            return;
        }
        if metrics.state != ServerState::Leader {
            continue;
        }
        // One batch per proposal; go on at once while more is due.
        while ctx
            .state_machine
            .read(|state| state.expiry_due(&rule, wall_ms()))
        {
            let proposal = ctx.proposer.propose(Command::ExpireFinished(rule));
            match tokio::time::timeout(Duration::from_millis(EXPIRE_TIMEOUT_MS), proposal).await {
                Ok(Err(NotProposed::Stopped)) => return,
                Ok(Ok(Ok(Outcome::Done))) => {}
                Ok(outcome) => {
                    tracing::warn!(?outcome, "removing finished jobs did not go through");
                    break;
                }
                Err(_) => {
                    tracing::warn!("removing finished jobs was not committed in time");
                    break;
                }
            }
        }
    }
}
