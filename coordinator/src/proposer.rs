//! The proposer: turns client commands into Raft log entries, several commands per entry.
//!
//! openraft 0.9 flushes the leader's log once per entry, with its core waiting for the
//! flush, so proposing one entry per command caps a cluster at one command per fsync however
//! many clients write at once. The proposer queues commands from every API request and one
//! task takes whatever has arrived (up to [`PROPOSAL_BATCH_MAX`] commands and
//! [`PROPOSAL_BYTES_MAX`] bytes of them) into one entry, with up to [`PROPOSALS_IN_FLIGHT_MAX`]
//! entries in flight. Alone, a command still goes out at once; under load, entries grow with
//! the load. Each caller gets its own command's outcome once the entry is committed and
//! applied.
//!
//! An entry the log cannot store stops Raft on the leader, so entries are bounded by bytes as
//! well as by count: a command that would take an entry past [`PROPOSAL_BYTES_MAX`] waits for
//! the next one, in its turn, and a command larger than that alone is refused
//! ([`NotProposed::TooLarge`]) before it is queued. Each command is measured on its caller's
//! task.
//!
//! On a follower `client_write` refuses every entry with ForwardToLeader, which each caller
//! gets as its error, so the client follows the redirect as before.

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;
use quotient_core::{Command, Outcome};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::config::APPEND_ENTRIES_BYTES_MAX;
use crate::store::codec::{encoded_len, MAX_ENTRY_BYTES};
use crate::store::type_config::Raft;
use crate::store::{MemberId, Request};

/// Most commands in one log entry: bounds the work of applying it.
pub const PROPOSAL_BATCH_MAX: usize = 1_024;
/// What an entry holds besides its commands' encodings, with room to spare: the length of
/// the command list, the leader's time and the entry's log id in the log; on the wire, the
/// AppendEntries that carries a single entry and the envelope around it (bytes).
pub const ENTRY_OVERHEAD_BYTES_MAX: usize = 64 * 1024;
/// Most encoded bytes of commands in one log entry: what an AppendEntries may carry
/// (`config::APPEND_ENTRIES_BYTES_MAX`, 2 MiB, so that an entry reaches a follower within the
/// deadline openraft 0.9 gives it; much larger entries miss it every time and nothing commits) less the room around the commands. Enough for the largest command
/// the API takes (a job at the launch limit of 1 MiB, with its image and names), and far
/// under the log's entry limit and the frame limit.
pub const PROPOSAL_BYTES_MAX: usize = APPEND_ENTRIES_BYTES_MAX - ENTRY_OVERHEAD_BYTES_MAX;

const _: () = assert!(APPEND_ENTRIES_BYTES_MAX <= MAX_ENTRY_BYTES);
/// Most entries proposed and not yet applied at once. One, because openraft 0.9's core flushes
/// entries one at a time anyway, so a second entry in flight only splits the waiting commands
/// into more entries and more fsyncs (BENCHMARKS.md has the sweep of 1, 2, 4 and 8).
pub const PROPOSALS_IN_FLIGHT_MAX: usize = 1;
/// Most commands waiting to be proposed; callers wait for room beyond it.
pub const PROPOSALS_QUEUED_MAX: usize = 16_384;

/// Why a proposal failed; the API maps it to its errors.
pub type ProposalError = RaftError<MemberId, ClientWriteError<MemberId, BasicNode>>;

/// Why a command was not proposed at all.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NotProposed {
    /// The proposer stopped (the coordinator is shutting down): another coordinator may
    /// take it.
    #[error("the coordinator is shutting down")]
    Stopped,
    /// The command alone is larger than a log entry may hold: no retry can help.
    #[error(
        "the command takes {bytes} bytes, more than the {max} bytes a log entry holds; send          less in one command"
    )]
    TooLarge { bytes: usize, max: usize },
    /// The command cannot be encoded (a programming error in a command type).
    #[error("the command cannot be encoded: {0}")]
    Unencodable(String),
}

struct Proposal {
    command: Command,
    /// The command's encoded length.
    bytes: usize,
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
    ) -> Result<Result<Outcome, ProposalError>, NotProposed> {
        let bytes =
            encoded_len(&command).map_err(|error| NotProposed::Unencodable(error.to_string()))?;
        if bytes > PROPOSAL_BYTES_MAX {
            return Err(NotProposed::TooLarge {
                bytes,
                max: PROPOSAL_BYTES_MAX,
            });
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Proposal {
                command,
                bytes,
                reply,
            })
            .await
            .map_err(|_| NotProposed::Stopped)?;
        answer.await.map_err(|_| NotProposed::Stopped)
    }
}

/// The commands of one entry and where each one's outcome goes, in order.
struct Batch {
    commands: Vec<Command>,
    replies: Vec<oneshot::Sender<Result<Outcome, ProposalError>>>,
    /// The commands' encoded lengths, added up.
    bytes: usize,
}

/// The next entry: `first`, then what is waiting, while the entry stays within
/// [`PROPOSAL_BATCH_MAX`] commands and [`PROPOSAL_BYTES_MAX`] bytes. A proposal that would
/// take it past either is put in `held`, to open the next entry, so the order is kept.
fn next_batch(
    first: Proposal,
    receiver: &mut mpsc::Receiver<Proposal>,
    held: &mut Option<Proposal>,
) -> Batch {
    // Sized once for what is waiting, rather than grown one push at a time and then split,
    // which cost the leader noticeable CPU under load (BENCHMARKS.md).
    let room = (receiver.len() + 1).min(PROPOSAL_BATCH_MAX);
    let mut batch = Batch {
        commands: Vec::with_capacity(room),
        replies: Vec::with_capacity(room),
        bytes: 0,
    };
    let mut next = Some(first);
    while let Some(proposal) = next.take() {
        if !batch.commands.is_empty() && batch.bytes + proposal.bytes > PROPOSAL_BYTES_MAX {
            *held = Some(proposal);
            break;
        }
        batch.bytes += proposal.bytes;
        batch.commands.push(proposal.command);
        batch.replies.push(proposal.reply);
        if batch.commands.len() < PROPOSAL_BATCH_MAX {
            next = receiver.try_recv().ok();
        }
    }
    batch
}

async fn run(raft: Raft, mut receiver: mpsc::Receiver<Proposal>) {
    let in_flight = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT_MAX));
    // A proposal that did not fit the last entry: it opens the next.
    let mut held = None;
    loop {
        // Wait for room first, so that commands keep gathering while entries are in flight.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let first = match held.take() {
            Some(first) => first,
            None => match receiver.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let Batch {
            commands, replies, ..
        } = next_batch(first, &mut receiver, &mut held);
        let raft = raft.clone();
        tokio::spawn(async move {
            let request = Request {
                commands,
                // The time the leader stamps on the entry, as the process keeps it (a step of
                // the host's clock is not followed at once).
                time_ms: quotient_common::steady_clock::now_ms(),
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

#[cfg(test)]
mod tests {
    use openraft::raft::AppendEntriesRequest;
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};
    use quotient_common::frame::{encode_body, MAX_FRAME_BYTES};
    use quotient_common::{ClusterId, JobSpec};

    use super::*;
    use crate::network::{RaftEnvelope, RaftRequest};
    use crate::store::codec::encode_value;
    use crate::store::type_config::Entry;

    /// A submit whose command encodes to about `bytes` bytes.
    fn submit_of(bytes: usize) -> Command {
        let mut spec = JobSpec::new("team", 1, 1, vec!["x".repeat(bytes)]);
        spec.name = Some("job".into());
        Command::SubmitJob(spec)
    }

    fn proposal(command: Command) -> (Proposal, oneshot::Receiver<Result<Outcome, ProposalError>>) {
        let (reply, answer) = oneshot::channel();
        let bytes = encoded_len(&command).expect("encodable");
        let proposal = Proposal {
            command,
            bytes,
            reply,
        };
        (proposal, answer)
    }

    #[test]
    fn entries_are_cut_by_bytes_in_order_and_each_fits() {
        // Proves the byte bound: 50 commands of 100 KiB queued at once make entries of at
        // most PROPOSAL_BYTES_MAX bytes (19 commands each, not 50 in one), in the order
        // queued, and nothing is lost between them.
        let (queue, mut receiver) = mpsc::channel(64);
        let mut answers = Vec::new();
        for _ in 0..50 {
            let (proposal, answer) = proposal(submit_of(100 << 10));
            answers.push(answer);
            queue
                .try_send(proposal)
                .map_err(|_| "room")
                .expect("queued");
        }
        let mut held = None;
        let mut sizes = Vec::new();
        let mut order = Vec::new();
        while let Some(first) = held.take().or_else(|| receiver.try_recv().ok()) {
            let batch = next_batch(first, &mut receiver, &mut held);
            assert!(batch.bytes <= PROPOSAL_BYTES_MAX, "{} bytes", batch.bytes);
            let commands: usize = batch.commands.iter().map(|c| encoded_len(c).unwrap()).sum();
            assert_eq!(commands, batch.bytes);
            sizes.push(batch.commands.len());
            for reply in batch.replies {
                order.push(reply);
            }
        }
        let per_entry = PROPOSAL_BYTES_MAX / encoded_len(&submit_of(100 << 10)).unwrap();
        assert_eq!(per_entry, 19);
        assert_eq!(sizes, vec![19, 19, 12]);
        // The replies come back in the order the proposals went in.
        for (index, reply) in order.into_iter().enumerate() {
            let _ = reply.send(Ok(Outcome::JobSubmitted {
                job: quotient_common::JobId(index as u64),
                duplicate: false,
            }));
        }
        for (index, mut answer) in answers.into_iter().enumerate() {
            match answer.try_recv() {
                Ok(Ok(Outcome::JobSubmitted { job, .. })) => assert_eq!(job.0, index as u64),
                other => panic!("proposal {index} got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_command_larger_than_an_entry_is_refused_before_it_is_queued() {
        // Proves a command that no entry could hold is refused to its caller, saying so,
        // and never reaches the queue (nor the log, where it would stop Raft).
        let (queue, mut receiver) = mpsc::channel(4);
        let proposer = Proposer { queue };
        let command = submit_of(PROPOSAL_BYTES_MAX);
        let bytes = encoded_len(&command).unwrap();
        match proposer.propose(command).await {
            Err(NotProposed::TooLarge { bytes: said, max }) => {
                assert_eq!((said, max), (bytes, PROPOSAL_BYTES_MAX));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(receiver.try_recv().is_err(), "nothing was queued");
        // One that fits is queued.
        let proposed = tokio::spawn(async move { proposer.propose(submit_of(1 << 20)).await });
        let queued = receiver.recv().await.expect("queued");
        assert_eq!(queued.bytes, encoded_len(&queued.command).unwrap());
        drop(queued);
        assert!(matches!(proposed.await, Ok(Err(NotProposed::Stopped))));
    }

    #[test]
    fn small_commands_are_still_cut_by_count() {
        // Proves the count bound still holds for commands far under the byte bound.
        let (queue, mut receiver) = mpsc::channel(PROPOSAL_BATCH_MAX + 10);
        for _ in 0..PROPOSAL_BATCH_MAX + 10 {
            let (proposal, _answer) = proposal(submit_of(10));
            queue
                .try_send(proposal)
                .map_err(|_| "room")
                .expect("queued");
        }
        let first = receiver.try_recv().expect("queued");
        let mut held = None;
        let batch = next_batch(first, &mut receiver, &mut held);
        assert_eq!(batch.commands.len(), PROPOSAL_BATCH_MAX);
        assert!(held.is_none(), "the next one waits in the queue");
        assert_eq!(receiver.len(), 10);
    }

    #[test]
    fn a_full_entry_fits_the_log_and_one_append_entries_fits_a_frame() {
        // Proves the overhead allowed for is enough: an entry of PROPOSAL_BYTES_MAX bytes of
        // commands (with the largest term, index and time) encodes within
        // APPEND_ENTRIES_BYTES_MAX, in the log and as an AppendEntries in its envelope, and so
        // within the log's entry limit and the frame limit.
        let chunk = 256 << 10;
        let mut commands = Vec::new();
        let mut bytes = 0;
        loop {
            let left = PROPOSAL_BYTES_MAX - bytes;
            let command = if left > chunk + 1024 {
                submit_of(chunk)
            } else {
                // The last one fills what is left, up to a few bytes.
                let probe = encoded_len(&submit_of(0)).unwrap();
                submit_of(left.saturating_sub(probe + 8))
            };
            let len = encoded_len(&command).unwrap();
            if bytes + len > PROPOSAL_BYTES_MAX {
                break;
            }
            bytes += len;
            commands.push(command);
        }
        assert!(PROPOSAL_BYTES_MAX - bytes < 64, "{bytes} bytes of commands");
        let log_id = LogId::new(CommittedLeaderId::new(u64::MAX, u64::MAX), u64::MAX);
        let entry = Entry {
            log_id,
            payload: EntryPayload::Normal(Request {
                commands,
                time_ms: u64::MAX,
            }),
        };
        let stored = encode_value(&entry).expect("an entry within the log's limit");
        assert!(stored.len() <= APPEND_ENTRIES_BYTES_MAX);
        let envelope = RaftEnvelope {
            cluster: ClusterId::from_bytes([0xff; 16]),
            to: u64::MAX,
            to_voter: true,
            request: RaftRequest::AppendEntries(AppendEntriesRequest {
                vote: Vote::new_committed(u64::MAX, u64::MAX),
                prev_log_id: Some(log_id),
                leader_commit: Some(log_id),
                entries: vec![entry],
            }),
        };
        let frame = encode_body(&envelope).expect("one entry within the frame limit");
        assert!(frame.len() <= APPEND_ENTRIES_BYTES_MAX);
        assert!(frame.len() <= MAX_FRAME_BYTES);
    }
}
