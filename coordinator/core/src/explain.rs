//! `explain`: why a job waits, why it was preempted, or how it ended, in words.

use quotient_common::{JobId, JobState};

use crate::accounting::share_accounts;
use crate::reason::WaitReason;
use crate::state::{State, StopCause};

/// What `quotient job explain` prints: a one-line summary and supporting lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub summary: String,
    pub details: Vec<String>,
}

/// Explains a job; `None` when there is no such job.
pub fn explain(state: &State, id: JobId) -> Option<Explanation> {
    let job = state.job(id)?;
    let class = job.class();
    let mut details = Vec::new();
    let summary = match job.state {
        JobState::Runnable => {
            let queue = state.queue(&job.spec.share, class);
            let head = queue.first().copied();
            let reason = match (&job.reason, head) {
                (Some(reason), _) => reason.to_string(),
                (None, Some(head)) if head != id => {
                    WaitReason::QueuedBehind { job: head }.to_string()
                }
                _ => "queued; the scheduler has not considered it yet".to_string(),
            };
            let accounts = share_accounts(state);
            let mut holders: Vec<String> = accounts
                .iter()
                .filter_map(|(name, account)| {
                    let usage = account.usage.get(class).copied().unwrap_or(0);
                    (usage > 0).then(|| {
                        let borrowed = account.borrowed.get(class).copied().unwrap_or(0);
                        format!("{name} holds {usage} (borrowing {borrowed})")
                    })
                })
                .collect();
            if holders.is_empty() {
                holders.push("no share holds any".into());
            }
            details.push(format!("{class} GPUs: {}", holders.join(", ")));
            format!("{id} waits: {reason}")
        }
        JobState::Preempting => match &job.stop {
            Some(StopCause::Cancelled) => {
                format!("{id} is stopping because it was cancelled")
            }
            Some(StopCause::Preempted(p)) => {
                let target = match (p.for_job, &p.for_share) {
                    (Some(f), Some(s)) => format!(" for {f} of share {s}"),
                    _ => String::new(),
                };
                format!(
                    "{id} is being preempted ({}){target} on {}; it returns to the queue when it exits",
                    p.kind.as_str(),
                    p.node
                )
            }
            None => format!("{id} is stopping"),
        },
        JobState::Scheduled | JobState::Starting | JobState::Running => {
            let alloc = job.allocation.expect("holding jobs have an allocation");
            let node = state.node(alloc.node).map_or("?", |n| n.name.as_str());
            let borrowed = if state.is_borrowed(job) {
                " on borrowed capacity (it can be reclaimed)"
            } else {
                " within its share's limit"
            };
            format!(
                "{id} is {} on {node}, GPUs {:?}{borrowed}",
                job.state,
                alloc.gpu_indices()
            )
        }
        JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
            let why = job
                .reason
                .as_ref()
                .map_or_else(String::new, |r| format!(": {r}"));
            format!("{id} is {}{why}", job.state)
        }
    };
    if let Some(p) = &job.last_preemption {
        let target = match (p.for_job, &p.for_share) {
            (Some(f), Some(s)) => format!(" for {f} of share {s}"),
            _ => String::new(),
        };
        details.push(format!(
            "preempted {} time(s); last: {}{target} on {} at {} ms",
            job.preemptions,
            p.kind.as_str(),
            p.node,
            p.at_ms
        ));
    }
    Some(Explanation { summary, details })
}
