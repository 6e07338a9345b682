//! What an agent saw happen to an attempt of a job: one type from the runtime to the
//! replicated state. The agent's executor makes a [`JobReport`], its journal keeps it until a
//! leader acknowledges it, `AgentRequest::Report` carries it, and the leader proposes it
//! unchanged as `quotient_core::Command::ReportJob`. So a report is never converted on its way,
//! and the agent needs no scheduler to speak of one.
//!
//! Both types are in the Raft log (inside `Command::ReportJob`), in the agent protocol and in
//! the agent's journal: a change to them is a new version of all three encodings
//! ([`crate::version`]).

use serde::{Deserialize, Serialize};

use crate::job::LaunchFault;
use crate::JobId;

/// What an agent saw happen to a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobEvent {
    /// The agent is launching it.
    Started,
    Running,
    /// It exited on its own.
    Exited {
        code: i32,
    },
    /// It exited after the agent sent its checkpoint signal (or was killed after the grace
    /// period): a preemption, not a failure.
    ExitedAfterSignal {
        code: Option<i32>,
    },
    /// The agent tried `tries` times to launch it and gave up: the attempt never ran.
    /// `message` is the runtime's last error, at most `LAUNCH_MESSAGE_BYTES_MAX` bytes.
    LaunchFailed {
        fault: LaunchFault,
        tries: u32,
        message: String,
    },
    /// It exited on its own with a code other than 0 and said why: the text a SageMaker
    /// training image wrote to `/opt/ml/output/failure`, at most [`EXIT_REASON_BYTES_MAX`]
    /// bytes. Otherwise as [`JobEvent::Exited`].
    ExitedWithReason {
        code: i32,
        reason: String,
    },
    /// It checkpointed: the agent saw its marker, or a newer file, in its checkpoint
    /// directory. The coordinators note the time they learn it (leader time), which the
    /// scheduler reads as how much work a preemption would lose.
    Checkpointed,
}

/// The most bytes of a job's own failure reason that a report carries (and that the
/// coordinators keep): as much as of a launch failure's message.
pub const EXIT_REASON_BYTES_MAX: usize = crate::job::LAUNCH_MESSAGE_BYTES_MAX;

impl JobEvent {
    /// Whether the attempt is over: it exited, or was never launched.
    pub fn ends_attempt(&self) -> bool {
        matches!(
            self,
            JobEvent::Exited { .. }
                | JobEvent::ExitedAfterSignal { .. }
                | JobEvent::LaunchFailed { .. }
                | JobEvent::ExitedWithReason { .. }
        )
    }

    /// The exit code an end carries (`None`: none, or not an end).
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            JobEvent::Exited { code } | JobEvent::ExitedWithReason { code, .. } => Some(*code),
            JobEvent::ExitedAfterSignal { code } => *code,
            _ => None,
        }
    }
}

/// An agent's report about one attempt of one job on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReport {
    pub job: JobId,
    pub attempt: u32,
    /// The node the attempt ran on: the reporting agent's. The leader refuses a report that
    /// names another node than the agent's certificate.
    pub node: String,
    pub event: JobEvent,
}
