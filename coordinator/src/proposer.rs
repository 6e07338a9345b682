//! The proposer: turns client commands into Raft log entries, several commands per entry.
//!
//! openraft 0.9 flushes the leader's log once per entry, with its core waiting for the
//! flush, so proposing one entry per command caps a cluster at one command per fsync however
//! many clients write at once. The proposer queues commands from every API request and one
//! task takes whatever has arrived (up to [`PROPOSAL_BATCH_MAX`]) into one entry, with up to
//! [`PROPOSALS_IN_FLIGHT_MAX`] entries in flight. Alone, a command still goes out at once;
//! under load, entries grow with the load. Each caller gets its own command's outcome once
//! the entry is committed and applied.
//!
//! On a follower `client_write` refuses every entry with ForwardToLeader, which each caller
//! gets as its error, so the client follows the redirect as before.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;
use quotient_core::{Command, Outcome};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::store::type_config::Raft;
use crate::store::{NodeId, Request};

/// Most commands in one log entry: bounds an entry's size and the work of applying it.
pub const PROPOSAL_BATCH_MAX: usize = 1_024;
/// Most entries proposed and not yet applied at once. One, because openraft 0.9's core flushes
/// entries one at a time anyway, so a second entry in flight only splits the waiting commands
/// into more entries and more fsyncs (BENCHMARKS.md has the sweep of 1, 2, 4 and 8).
pub const PROPOSALS_IN_FLIGHT_MAX: usize = 1;
/// Most commands waiting to be proposed; callers wait for room beyond it.
pub const PROPOSALS_QUEUED_MAX: usize = 16_384;

/// Why a proposal failed; the API maps it to its errors.
pub type ProposalError = RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>;

/// The proposer stopped (the coordinator is shutting down).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the coordinator is shutting down")]
pub struct Stopped;

struct Proposal {
    command: Command,
    reply: oneshot::Sender<Result<Outcome, ProposalError>>,
}

/// Queues commands for Raft; cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::Sender<Proposal>,
}

impl std::fmt::Debug for Proposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposer").finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch: the time the leader stamps on an entry.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

impl Proposer {
    /// Starts the proposing task on the current tokio runtime; it ends when every
    /// `Proposer` clone is dropped.
    pub fn start(raft: Raft) -> Proposer {
        let (queue, receiver) = mpsc::channel(PROPOSALS_QUEUED_MAX);
        tokio::spawn(run(raft, receiver));
        Proposer { queue }
    }

    /// Proposes `command` and waits until its entry is committed and applied; its outcome.
    pub async fn propose(
        &self,
        command: Command,
    ) -> Result<Result<Outcome, ProposalError>, Stopped> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Proposal { command, reply })
            .await
            .map_err(|_| Stopped)?;
        answer.await.map_err(|_| Stopped)
    }
}

async fn run(raft: Raft, mut receiver: mpsc::Receiver<Proposal>) {
    let in_flight = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT_MAX));
    loop {
        // Wait for room first, so that commands keep gathering while entries are in flight.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = receiver.recv().await else {
            return;
        };
        // Sized once for what is waiting, rather than grown one push at a time and then split,
        // which cost the leader noticeable CPU under load (BENCHMARKS.md).
        let room = (receiver.len() + 1).min(PROPOSAL_BATCH_MAX);
        let mut commands = Vec::with_capacity(room);
        let mut replies = Vec::with_capacity(room);
        commands.push(first.command);
        replies.push(first.reply);
        while commands.len() < PROPOSAL_BATCH_MAX {
            match receiver.try_recv() {
                Ok(proposal) => {
                    commands.push(proposal.command);
                    replies.push(proposal.reply);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let request = Request {
                commands,
                time_ms: now_ms(),
            };
            match raft.client_write(request).await {
                Ok(response) => {
                    // The state machine gives one outcome per command, in order.
                    debug_assert_eq!(response.data.len(), replies.len());
                    let mut outcomes = response.data.into_iter();
                    for reply in replies {
                        let outcome = outcomes.next().unwrap_or(Outcome::Done);
                        let _ = reply.send(Ok(outcome));
                    }
                }
                Err(error) => {
                    for reply in replies {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}
