//! What happened, as the replicated state records it (`quotient events`): each event is made
//! by applying a log entry, so every coordinator makes the same events, numbered alike.

use serde::{Deserialize, Serialize};

use crate::{JobId, JobState};

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Events are numbered from 1 in the order they happened; a reader that saw up to N asks
    /// for those after N.
    pub seq: u64,
    /// The time the leader stamped on the entry that made it (ms since the Unix epoch).
    pub at_ms: u64,
    pub what: EventKind,
}

/// What happened. `by` names who asked (a certificate's name), when a person or a script
/// did; `None` for what the coordinators decided themselves (the scheduler, a node lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    JobSubmitted {
        job: JobId,
        name: String,
        share: String,
        by: Option<String>,
    },
    /// A job changed state; `node` is where it is placed (or last ran), `reason` why it waits
    /// or why it ended.
    JobState {
        job: JobId,
        share: String,
        from: JobState,
        to: JobState,
        node: Option<String>,
        reason: Option<String>,
        by: Option<String>,
    },
    /// A running job was told to stop for another (or for its node): its checkpoint signal
    /// goes out; `cause` is `reclaim`, `in-share`, `node-drain`, `node-lost`, `agent-stopped`
    /// or `start-timeout`.
    Preempted {
        job: JobId,
        share: String,
        node: String,
        cause: String,
        for_job: Option<JobId>,
        for_share: Option<String>,
    },
    PriorityChanged {
        job: JobId,
        share: String,
        from: u32,
        to: u32,
        by: Option<String>,
    },
    /// A node registered, changed state (`ready`, `cordoned`, `draining`, `lost`) or was
    /// removed (`removed`).
    Node {
        node: String,
        state: String,
        by: Option<String>,
    },
    /// A share was `created`, `updated` or `deleted`.
    Share {
        share: String,
        change: String,
        by: Option<String>,
    },
}

impl EventKind {
    /// The job it is about, if any.
    pub fn job(&self) -> Option<JobId> {
        match self {
            EventKind::JobSubmitted { job, .. }
            | EventKind::JobState { job, .. }
            | EventKind::Preempted { job, .. }
            | EventKind::PriorityChanged { job, .. } => Some(*job),
            EventKind::Node { .. } | EventKind::Share { .. } => None,
        }
    }

    /// The share of the job it is about, if it is about a job.
    pub fn job_share(&self) -> Option<&str> {
        match self {
            EventKind::JobSubmitted { share, .. }
            | EventKind::JobState { share, .. }
            | EventKind::Preempted { share, .. }
            | EventKind::PriorityChanged { share, .. } => Some(share),
            EventKind::Node { .. } | EventKind::Share { .. } => None,
        }
    }

    /// Whether it is about share `name`: a job of it, a preemption for it, or the share.
    pub fn concerns_share(&self, name: &str) -> bool {
        match self {
            EventKind::JobSubmitted { share, .. }
            | EventKind::JobState { share, .. }
            | EventKind::PriorityChanged { share, .. }
            | EventKind::Share { share, .. } => share == name,
            EventKind::Preempted {
                share, for_share, ..
            } => share == name || for_share.as_deref() == Some(name),
            EventKind::Node { .. } => false,
        }
    }

    /// Whether it is about node `name`: the node, or a job placed there.
    pub fn concerns_node(&self, name: &str) -> bool {
        match self {
            EventKind::Node { node, .. } | EventKind::Preempted { node, .. } => node == name,
            EventKind::JobState { node, .. } => node.as_deref() == Some(name),
            _ => false,
        }
    }

    /// A short name of its kind, for tables and JSON: `job-submitted`, `job-state`,
    /// `preempted`, `priority`, `node`, `share`.
    pub fn kind(&self) -> &'static str {
        match self {
            EventKind::JobSubmitted { .. } => "job-submitted",
            EventKind::JobState { .. } => "job-state",
            EventKind::Preempted { .. } => "preempted",
            EventKind::PriorityChanged { .. } => "priority",
            EventKind::Node { .. } => "node",
            EventKind::Share { .. } => "share",
        }
    }
}

impl std::fmt::Display for EventKind {
    /// One line for people, e.g. `j-4 RUNNING -> PREEMPTING on node-2`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by = |by: &Option<String>| {
            by.as_ref()
                .map(|by| format!(" by {by}"))
                .unwrap_or_default()
        };
        match self {
            EventKind::JobSubmitted {
                job,
                name,
                share,
                by: who,
            } => write!(f, "{job} ({name}) submitted to {share}{}", by(who)),
            EventKind::JobState {
                job,
                share,
                from,
                to,
                node,
                reason,
                by: who,
            } => {
                write!(f, "{job} of {share} {} -> {}", from.as_str(), to.as_str())?;
                if let Some(node) = node {
                    write!(f, " on {node}")?;
                }
                if let Some(reason) = reason {
                    write!(f, ": {reason}")?;
                }
                write!(f, "{}", by(who))
            }
            EventKind::Preempted {
                job,
                share,
                node,
                cause,
                for_job,
                for_share,
            } => {
                write!(f, "{job} of {share} preempted on {node} ({cause})")?;
                match (for_job, for_share) {
                    (Some(for_job), Some(for_share)) => write!(f, " for {for_job} of {for_share}"),
                    (Some(for_job), None) => write!(f, " for {for_job}"),
                    _ => Ok(()),
                }
            }
            EventKind::PriorityChanged {
                job,
                share,
                from,
                to,
                by: who,
            } => write!(f, "{job} of {share} priority {from} -> {to}{}", by(who)),
            EventKind::Node {
                node,
                state,
                by: who,
            } => write!(f, "node {node} {state}{}", by(who)),
            EventKind::Share {
                share,
                change,
                by: who,
            } => write!(f, "share {share} {change}{}", by(who)),
        }
    }
}
