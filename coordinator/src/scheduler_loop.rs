//! The leader's scheduling loop: runs `quotient_core::plan` on the replicated state and
//! commits the plan, whenever something that can matter changed.
//!
//! Triggers arrive through a [`tokio::sync::Notify`] (one after every applied batch of log
//! entries that changed something, `crate::applied`: submits, priority updates, cancels,
//! reports, node and share changes all go through the log) and a periodic tick as a safety
//! net. Triggers that arrive while a round
//! runs coalesce into one more round; a short debounce lets a burst of writes gather first.
//! Only the leader plans; a plan that changes nothing is not committed, so the loop reaches a
//! fixed point instead of feeding itself. After a commit the nodes it changed get their
//! desired state refreshed at once, which wakes their agents' long polls, and the loop plans
//! again, as after any write.
//!
//! After a failover the new leader plans from the replicated state: running jobs hold their
//! GPUs there, so nothing is restarted.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use quotient_core::{Command, Outcome};
use tokio::sync::Notify;

use crate::applied;
use crate::desired::DesiredTracker;
use crate::proposer::Proposer;
use crate::store::type_config::Raft;
use crate::store::QuotientStateMachine;

/// The safety-net period of the loop (milliseconds).
pub const SCHEDULER_TICK_MS: u64 = 1_000;
/// How long a trigger waits for more to gather before the round (milliseconds).
pub const SCHEDULER_DEBOUNCE_MS: u64 = 2;
/// Deadline of committing one plan (milliseconds); a leader that lost its quorum gives up
/// and plans again from the state it then has.
pub const PLAN_COMMIT_TIMEOUT_MS: u64 = 10_000;
/// The pause after a plan whose every action was stale, so that a scheduler/apply
/// disagreement cannot fill the log with plans (milliseconds).
pub const SCHEDULER_STALE_BACKOFF_MS: u64 = 200;

/// Runs the loop until the Raft node shuts down.
pub async fn run(
    raft: Raft,
    state_machine: QuotientStateMachine,
    proposer: Proposer,
    trigger: Arc<Notify>,
    desired: DesiredTracker,
) {
    loop {
        tokio::select! {
            _ = trigger.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(SCHEDULER_TICK_MS)) => {}
        }
        tokio::time::sleep(Duration::from_millis(SCHEDULER_DEBOUNCE_MS)).await;
        let metrics = raft.metrics().borrow().clone();
        if metrics.running_state.is_err() {
            return;
        }
        if metrics.state != ServerState::Leader {
            continue;
        }
        let plan = state_machine.read(quotient_core::plan);
        if plan.is_empty() {
            continue;
        }
        let actions = plan.actions.len();
        let committed = tokio::time::timeout(
            Duration::from_millis(PLAN_COMMIT_TIMEOUT_MS),
            proposer.propose(Command::ApplyPlan(plan)),
        )
        .await;
        let Ok(committed) = committed else {
            tracing::warn!("a plan was not committed within {PLAN_COMMIT_TIMEOUT_MS} ms");
            continue;
        };
        match committed {
            Ok(Ok(Outcome::PlanApplied(report))) => {
                if !report.rejected.is_empty() {
                    tracing::debug!(rejected = ?report.rejected, "parts of a plan were stale");
                }
                let stale = actions > 0 && report.rejected.len() == actions;
                if report.placed + report.preempted > 0 {
                    tracing::info!(
                        actions,
                        placed = report.placed,
                        preempted = report.preempted,
                        nominated = report.nominated,
                        "plan committed"
                    );
                }
                let term = raft.metrics().borrow().current_term;
                applied::follow(&state_machine, &desired, &trigger, term);
                if stale {
                    tracing::warn!("every action of a plan was stale; backing off");
                    tokio::time::sleep(Duration::from_millis(SCHEDULER_STALE_BACKOFF_MS)).await;
                }
            }
            Ok(Ok(other)) => tracing::warn!(outcome = ?other, "unexpected outcome of a plan"),
            Ok(Err(error)) => tracing::debug!(error = %error, "could not commit a plan"),
            Err(_) => return,
        }
    }
}
