//! `explain`: why a job waits, why it was preempted, or how it ended, in words.

use quotient_common::duration::human_duration;
use quotient_common::{JobId, JobState};

use crate::accounting::share_accounts;
use crate::limits::{LAUNCH_REQUEUES_MAX, QUEUE_HEAD_SCAN_MAX};
use crate::state::{State, StopCause, WaitReasons};

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
            let mut reasons = WaitReasons::default();
            let reason = match reasons.of(state, job) {
                Some(reason) => reason.to_string(),
                // It can fit, so with no head found among the queue's first jobs, it is
                // behind them all, and they can never fit.
                None if reasons.head(state, &job.spec.share, class).is_none() => format!(
                    "queued behind more than {QUEUE_HEAD_SCAN_MAX} jobs of its share's queue, none of which can ever fit (`quotient job list --share {}` gives their reasons); cancel them, or change what they exceed",
                    job.spec.share
                ),
                None => "queued; the scheduler has not considered it yet".to_string(),
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
            if let Some(share) = state.share(&job.spec.share) {
                let name = &share.spec.name;
                if !share.spec.in_share_preemption {
                    details.push(format!(
                        "in-share preemption is off for share {name}: this job never preempts the share's own lower-priority jobs"
                    ));
                } else {
                    let lower = state
                        .holding(name, class)
                        .into_iter()
                        .filter_map(|j| state.job(j))
                        .filter(|j| j.priority() < job.priority())
                        .count();
                    details.push(format!(
                        "in-share preemption is on for share {name}: {lower} of its running {class} jobs have a lower priority than this job's {} (only those can be preempted for it)",
                        job.priority()
                    ));
                }
            }
            format!("{id} waits: {reason}")
        }
        JobState::Preempting => match job.stop.as_deref() {
            Some(StopCause::Cancelled) => {
                format!("{id} is stopping because it was cancelled")
            }
            Some(StopCause::TimeLimit) => format!(
                "{id} is stopping because its attempt reached its time limit ({})",
                crate::apply::duration_words(job.spec.time_limit_ms.unwrap_or(0))
            ),
            Some(StopCause::MemberEnded { rank, node, event }) => {
                let what = match event {
                    crate::command::JobEvent::Exited { code }
                    | crate::command::JobEvent::ExitedWithReason { code, .. } => {
                        format!("exited with code {code}")
                    }
                    crate::command::JobEvent::LaunchFailed { .. } => "could not be launched".into(),
                    _ => "was stopped by its agent".into(),
                };
                let left = job.placement.iter().filter(|m| !m.stage.exited()).count();
                format!(
                    "{id} is stopping: its rank {rank} on {node} {what}, so the attempt ends for every member ({left} still to exit)"
                )
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
            let borrowed = if state.is_borrowed(job) {
                " on borrowed capacity (it can be reclaimed)"
            } else {
                " within its share's limit"
            };
            let members: Vec<String> = job
                .placement
                .iter()
                .map(|alloc| {
                    let node = state.node(alloc.node).map_or("?", |n| n.name.as_str());
                    format!("{node}, GPUs {:?}", alloc.gpu_indices())
                })
                .collect();
            if job.is_gang() {
                let ranks: Vec<String> = members
                    .iter()
                    .enumerate()
                    .map(|(rank, m)| format!("rank {rank} on {m}"))
                    .collect();
                format!(
                    "{id} is {} on {} nodes ({}){borrowed}",
                    job.state,
                    members.len(),
                    ranks.join("; ")
                )
            } else {
                format!("{id} is {} on {}{borrowed}", job.state, members.join(""))
            }
        }
        JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
            let why = job
                .reason
                .as_ref()
                .map_or_else(String::new, |r| format!(": {r}"));
            format!("{id} is {}{why}", job.state)
        }
    };
    if let Some(line) = work_at_risk_line(state, job) {
        details.push(line);
    }
    let launch_requeues = job.launch_requeues;
    if launch_requeues > 0 && !job.state.is_terminal() {
        details.push(format!(
            "went back to the queue {launch_requeues} time(s) because a node could not launch it; past {LAUNCH_REQUEUES_MAX} it fails"
        ));
    }
    if job.spec.retry.retries > 0 {
        details.push(format!(
            "retries used: {} of {}",
            job.retries_used, job.spec.retry.retries
        ));
    }
    if let Some(p) = job.last_preemption.as_deref() {
        let target = match (p.for_job, &p.for_share) {
            (Some(f), Some(s)) => format!(" for {f} of share {s}"),
            _ => String::new(),
        };
        let max = job
            .spec
            .max_preemptions
            .map_or_else(String::new, |max| format!(" of at most {max}"));
        details.push(format!(
            "preempted {} time(s), {} by the scheduling rules{max} (drains and lost nodes do not count); last: {}{target} on {} at {}",
            job.preemptions,
            job.counted_preemptions,
            p.kind.as_str(),
            p.node,
            utc_time(p.at_ms)
        ));
    }
    Some(Explanation { summary, details })
}

/// For a job that runs or is being preempted: what a preemption costs it, which is how the
/// scheduler picks among victims of equal priority (least work at risk first).
fn work_at_risk_line(state: &State, job: &crate::state::JobRecord) -> Option<String> {
    use crate::state::PreemptionKind;
    let started = job.started_ms?;
    let since = match state.checkpoint_in_attempt(job) {
        Some(at) => (at, format!("its last checkpoint at {}", utc_time(at))),
        None => (
            started,
            format!(
                "it started at {} (no checkpoint seen since)",
                utc_time(started)
            ),
        ),
    };
    let lost = |at_ms: u64| human_duration(at_ms.saturating_sub(since.0));
    let gpus = job.total_gpus();
    let what = &since.1;
    match (job.state, job.stop.as_deref()) {
        // A running job's risk as of the last entry.
        (JobState::Running, _) => Some(format!(
            "a preemption now would lose {} on {gpus} GPU(s): the time since {what}",
            lost(state.data().clock_ms)
        )),
        // A victim's, when it was chosen.
        (JobState::Preempting, Some(StopCause::Preempted(p)))
            if matches!(p.kind, PreemptionKind::Reclaim | PreemptionKind::InShare) =>
        {
            Some(format!(
                "it was chosen among victims of its priority for losing the least work: {} on \
                 {gpus} GPU(s) since {what} (victims are taken lowest priority first, then \
                 least work at risk)",
                lost(p.at_ms)
            ))
        }
        _ => None,
    }
}

/// A time in ms since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (the civil-from-days
/// algorithm; explain reads no clock, so it cannot say "3 s ago").
pub fn utc_time(ms: u64) -> String {
    let seconds = ms / 1000;
    let days = (seconds / 86_400) as i64;
    let (hour, minute, second) = (seconds % 86_400 / 3600, seconds % 3600 / 60, seconds % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} UTC")
}

#[cfg(test)]
mod tests {
    use super::utc_time;

    #[test]
    fn times_print_as_utc_dates() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_time(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_time(1_796_210_407_256), "2026-12-02 11:20:07 UTC");
    }
}
