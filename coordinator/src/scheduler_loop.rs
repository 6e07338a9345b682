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
//! A plan larger than one log entry holds (`proposer::PROPOSAL_BYTES_MAX`; a round that places
//! tens of thousands of jobs at once, or names as many reasons) is committed as consecutive
//! pieces, its actions and then its reasons in order: apply re-checks each action against the
//! state it meets, as for a plan in one piece, so a piece applied after another write only
//! drops what became stale.
//!
//! After a failover the new leader plans from the replicated state: running jobs hold their
//! GPUs there, so nothing is restarted.

use std::time::Duration;

use openraft::ServerState;
use quotient_core::{Command, Outcome, Plan, PlanReport};

use crate::applied;
use crate::context::Context;
use crate::proposer::{NotProposed, ProposalError, Proposer, PROPOSAL_BYTES_MAX};
use crate::store::codec::{encoded_len, CodecError};

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
pub async fn run(ctx: Context) {
    let Context {
        raft,
        state_machine,
        proposer,
        scheduler: trigger,
        desired,
        leases,
        config,
        metrics: counts,
        ..
    } = ctx;
    let topology_key = config.scheduling.topology_key.clone();
    let borrow_order = config.scheduling.borrow_order;
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
        let round = std::time::Instant::now();
        let plan = state_machine.read(|state| {
            let unreachable = leases.unreachable(state, round);
            quotient_core::plan_ordered(state, &unreachable, &topology_key, borrow_order)
        });
        counts.scheduler_round(round.elapsed());
        if plan.is_empty() {
            continue;
        }
        let actions = plan.actions.len();
        let committed = tokio::time::timeout(
            Duration::from_millis(PLAN_COMMIT_TIMEOUT_MS),
            commit(&proposer, plan),
        )
        .await;
        let Ok(committed) = committed else {
            tracing::warn!("a plan was not committed within {PLAN_COMMIT_TIMEOUT_MS} ms");
            continue;
        };
        match committed {
            Ok(report) => {
                if !report.rejected.is_empty() {
                    tracing::debug!(rejected = ?report.rejected, "parts of a plan were stale");
                }
                let stale = actions > 0 && report.rejected.len() == actions;
                counts.placed(u64::from(report.placed));
                // A debug line: one per round that placed or stopped anything, which under
                // churn is most of a busy leader's log (found by a soak); each job's
                // placements and preemptions are in its events (`job events`).
                if report.placed + report.preempted > 0 {
                    tracing::debug!(
                        actions,
                        placed = report.placed,
                        preempted = report.preempted,
                        nominated = report.nominated,
                        "plan committed"
                    );
                }
                let term = raft.metrics().borrow().current_term;
                applied::follow(&state_machine, &desired, &trigger, &counts, term);
                if stale {
                    tracing::warn!("every action of a plan was stale; backing off");
                    tokio::time::sleep(Duration::from_millis(SCHEDULER_STALE_BACKOFF_MS)).await;
                }
            }
            Err(Uncommitted::Unexpected(other)) => {
                tracing::warn!(outcome = ?other, "unexpected outcome of a plan")
            }
            Err(Uncommitted::Raft(error)) => {
                tracing::debug!(error = %error, "could not commit a plan")
            }
            Err(Uncommitted::NotProposed(NotProposed::Stopped)) => return,
            Err(Uncommitted::NotProposed(error)) => {
                tracing::error!(error = %error, "a plan was not proposed; backing off");
                tokio::time::sleep(Duration::from_millis(SCHEDULER_STALE_BACKOFF_MS)).await;
            }
        }
    }
}

/// Why a plan (or a piece of it) was not committed.
enum Uncommitted {
    Unexpected(Outcome),
    Raft(ProposalError),
    NotProposed(NotProposed),
}

/// Commits `plan`, in pieces that each fit a log entry, one after the other; what applying
/// them did, with each rejected action at its position in the whole plan.
async fn commit(proposer: &Proposer, plan: Plan) -> Result<PlanReport, Uncommitted> {
    let pieces = pieces(plan, PROPOSAL_BYTES_MAX)
        .map_err(|error| Uncommitted::NotProposed(NotProposed::Unencodable(error.to_string())))?;
    let mut report = PlanReport::default();
    let mut first_action = 0u32;
    for piece in pieces {
        let actions = piece.actions.len() as u32;
        let applied = match proposer.propose(Command::ApplyPlan(piece)).await {
            Ok(Ok(Outcome::PlanApplied(applied))) => applied,
            Ok(Ok(other)) => return Err(Uncommitted::Unexpected(other)),
            Ok(Err(error)) => return Err(Uncommitted::Raft(error)),
            Err(error) => return Err(Uncommitted::NotProposed(error)),
        };
        report.placed += applied.placed;
        report.preempted += applied.preempted;
        report.nominated += applied.nominated;
        report.rejected.extend(
            applied
                .rejected
                .into_iter()
                .map(|(position, rejection)| (first_action + position, rejection)),
        );
        first_action += actions;
    }
    Ok(report)
}

/// `plan` as plans of at most `bytes_max` encoded bytes each (as an `ApplyPlan` command),
/// which applied in order do what it does: its actions, in order, then its reasons. A plan
/// that fits is itself.
fn pieces(plan: Plan, bytes_max: usize) -> Result<Vec<Plan>, CodecError> {
    // An empty `ApplyPlan` (its tag and two empty lists) plus the most that the two lists'
    // lengths can grow by.
    let empty_command = encoded_len(&Command::ApplyPlan(Plan::default()))?;
    let tag = empty_command - encoded_len(&Plan::default())?;
    if tag + encoded_len(&plan)? <= bytes_max {
        return Ok(vec![plan]);
    }
    let empty = empty_command + 2 * 9;
    let mut pieces = Pieces {
        plans: vec![Plan::default()],
        bytes: empty,
        empty,
        bytes_max,
    };
    for action in plan.actions {
        let len = encoded_len(&action)?;
        pieces.room_for(len).actions.push(action);
    }
    for waiting in plan.waiting {
        let len = encoded_len(&waiting)?;
        pieces.room_for(len).waiting.push(waiting);
    }
    Ok(pieces.plans)
}

/// The pieces of a plan being cut, the last one filling.
struct Pieces {
    plans: Vec<Plan>,
    /// The last piece's encoded bytes, as counted.
    bytes: usize,
    /// What an empty piece counts.
    empty: usize,
    bytes_max: usize,
}

impl Pieces {
    /// The piece to add something of `len` bytes to: the last one, or a new one if it would
    /// take the last past the limit (a piece holds one thing at least).
    fn room_for(&mut self, len: usize) -> &mut Plan {
        let last = self.plans.last().expect("one piece at least");
        if self.bytes + len > self.bytes_max && !last.is_empty() {
            self.plans.push(Plan::default());
            self.bytes = self.empty;
        }
        self.bytes += len;
        self.plans.last_mut().expect("one piece at least")
    }
}

#[cfg(test)]
mod tests {
    use quotient_common::JobId;
    use quotient_core::{NodeId, PlanAction, WaitReason};

    use super::*;

    fn plan(actions: u64, reasons: &[usize]) -> Plan {
        Plan {
            actions: (0..actions)
                .map(|id| PlanAction::Place {
                    job: JobId(id),
                    node: NodeId(id as u32),
                    gpu_mask: 1,
                })
                .collect(),
            waiting: reasons
                .iter()
                .enumerate()
                .map(|(id, bytes)| (JobId(id as u64), WaitReason::Ended("x".repeat(*bytes))))
                .collect(),
        }
    }

    #[test]
    fn a_plan_that_fits_an_entry_is_one_piece() {
        // Proves a plan whose command is exactly the limit stays whole, and one byte over
        // is cut.
        let small = plan(1_000, &[100; 10]);
        assert_eq!(
            pieces(small.clone(), PROPOSAL_BYTES_MAX).expect("encodable"),
            vec![small.clone()]
        );
        let exact = encoded_len(&Command::ApplyPlan(small.clone())).unwrap();
        assert_eq!(pieces(small.clone(), exact).unwrap(), vec![small.clone()]);
        assert!(pieces(small, exact - 1).unwrap().len() > 1);
    }

    #[test]
    fn a_plan_larger_than_an_entry_is_cut_into_pieces_that_fit_in_order() {
        // Proves the pieces of a plan over the limit each fit it as a command, and together
        // are the plan: its actions in order, then its reasons in order.
        let bytes_max = 64 * 1024;
        let big = plan(20_000, &[10_000; 20]);
        assert!(encoded_len(&Command::ApplyPlan(big.clone())).unwrap() > bytes_max);
        let pieces = pieces(big.clone(), bytes_max).expect("encodable");
        assert!(pieces.len() > 4, "{} pieces", pieces.len());
        for piece in &pieces {
            let len = encoded_len(&Command::ApplyPlan(piece.clone())).unwrap();
            assert!(len <= bytes_max, "a piece of {len} bytes");
            assert!(!piece.is_empty());
        }
        let actions: Vec<PlanAction> = pieces.iter().flat_map(|p| p.actions.clone()).collect();
        let waiting: Vec<_> = pieces.iter().flat_map(|p| p.waiting.clone()).collect();
        assert_eq!((actions, waiting), (big.actions, big.waiting));
        let last_actions = pieces.iter().rposition(|p| !p.actions.is_empty()).unwrap();
        let first_reasons = pieces.iter().position(|p| !p.waiting.is_empty()).unwrap();
        assert!(first_reasons >= last_actions, "no reason before an action");
    }
}
