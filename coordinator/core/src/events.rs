//! The recent events (`quotient events`): what happened, made while commands apply, so that
//! every replica makes the same ones, numbered alike, at the time the leader stamped on their
//! entry. The state keeps the newest [`EVENTS_MAX`]; the oldest go first. A job's events
//! come from [`State::update_job`], the one way jobs change (a state change, with its node and
//! its reason; a preemption, with its cause and beneficiary; a priority change), and from its
//! submit; a node's from its registration (new, or back from lost), its state changes and its
//! removal; a share's from its creation, update and deletion. `by` is the caller of the
//! command ([`crate::Command::As`]) when there is one.

use std::collections::BTreeMap;

use quotient_common::event::{Event, EventKind};
use quotient_common::JobId;

use crate::command::Rejection;
use crate::state::{JobRecord, State, StopCause};

/// The most events the state keeps (about 150 bytes each).
pub const EVENTS_MAX: usize = 50_000;

/// Which events a reader wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only those after this number (0: from the oldest kept).
    pub after: u64,
    /// Only those at or after this time (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    pub job: Option<JobId>,
    pub share: Option<String>,
    pub node: Option<String>,
    /// The events `user` may read: of the jobs of the shares they may use, and every node's
    /// and share's. `None`: every event (an admin).
    pub user: Option<String>,
}

impl EventFilter {
    fn admits(&self, event: &Event) -> bool {
        event.seq > self.after
            && self.since_ms.is_none_or(|since| event.at_ms >= since)
            && self.job.is_none_or(|job| event.what.job() == Some(job))
            && self
                .share
                .as_deref()
                .is_none_or(|share| event.what.concerns_share(share))
            && self
                .node
                .as_deref()
                .is_none_or(|node| event.what.concerns_node(node))
    }
}

impl State {
    /// Records that `what` happened, in the command being applied.
    pub(crate) fn record_event(&mut self, what: EventKind) {
        self.data.events_issued += 1;
        if self.data.events.len() >= EVENTS_MAX {
            self.data.events.pop_front();
        }
        self.data.events.push_back(Event {
            seq: self.data.events_issued,
            at_ms: self.applying_ms,
            what,
        });
    }

    /// The caller of the command being applied, if any.
    pub(crate) fn acting(&self) -> Option<String> {
        self.acting.clone()
    }

    /// Why a reader whose query found no event is told it asked about something unknown: the
    /// job, share or node `filter` names is not in the live state. `None` when each one it
    /// names exists (its events are merely none yet, or not the reader's to see). A share or
    /// node deleted since still has its kept events read; only a query that finds none of
    /// them (past `--since`, say) is answered this way.
    pub fn unknown_event_subject(&self, filter: &EventFilter) -> Option<Rejection> {
        if let Some(job) = filter.job.filter(|job| self.job(*job).is_none()) {
            return Some(self.missing_job(job));
        }
        if let Some(share) = filter.share.as_ref().filter(|s| self.share(s).is_none()) {
            return Some(Rejection::UnknownShare(share.clone()));
        }
        if let Some(node) = filter
            .node
            .as_ref()
            .filter(|node| self.node_by_name(node).is_none())
        {
            return Some(Rejection::UnknownNode(node.clone()));
        }
        None
    }

    /// The events `filter` admits, oldest first, at most `limit`; and the number of the newest
    /// event there is (a reader that follows asks for those after it once it saw them all).
    /// A user's events count toward `limit` only if the user may read them, so a page shorter
    /// than `limit` means every event up to the newest was looked at.
    pub fn events(&self, filter: &EventFilter, limit: usize) -> (Vec<Event>, u64) {
        let events = &self.data.events;
        // Numbers are consecutive, so the first after `filter.after` is found by position.
        let oldest = events.front().map_or(1, |event| event.seq);
        let skip = usize::try_from(filter.after.saturating_sub(oldest.saturating_sub(1)))
            .unwrap_or(usize::MAX)
            .min(events.len());
        // Whether the filter's user may use each share met, asked once per share.
        let mut usable: BTreeMap<&str, bool> = BTreeMap::new();
        let found = events
            .iter()
            .skip(skip)
            .filter(|event| filter.admits(event))
            .filter(
                |event| match (filter.user.as_deref(), event.what.job_share()) {
                    (Some(user), Some(share)) => *usable
                        .entry(share)
                        .or_insert_with(|| self.user_may_use(user, share)),
                    _ => true,
                },
            )
            .take(limit)
            .cloned()
            .collect();
        (found, self.data.events_issued)
    }

    /// The number of the oldest event kept (the next one's when none is).
    pub fn oldest_event(&self) -> u64 {
        self.data
            .events
            .front()
            .map_or(self.data.events_issued + 1, |event| event.seq)
    }

    /// The newest `count` events of `job`, oldest first.
    pub fn job_events(&self, job: JobId, count: usize) -> Vec<Event> {
        let mut found: Vec<Event> = self
            .data
            .events
            .iter()
            .rev()
            .filter(|event| event.what.job() == Some(job))
            .take(count)
            .cloned()
            .collect();
        found.reverse();
        found
    }

    /// The events of a job that changed from `old` to `new` ([`State::update_job`]).
    pub(crate) fn job_changed_events(&mut self, old: &JobRecord, new: &JobRecord) {
        let share = || new.spec.share.clone();
        if old.spec.priority != new.spec.priority {
            self.record_event(EventKind::PriorityChanged {
                job: new.id,
                share: share(),
                from: old.spec.priority,
                to: new.spec.priority,
                by: self.acting(),
            });
        }
        let decided = match new.stop.as_deref() {
            Some(StopCause::Preempted(p)) if old.stop != new.stop => Some(p),
            _ => None,
        };
        // A preemption without a signal (a lost node) ends the attempt in one change.
        let ended = (new.preemptions > old.preemptions
            && !matches!(old.stop.as_deref(), Some(StopCause::Preempted(_))))
        .then_some(new.last_preemption.as_deref())
        .flatten();
        if let Some(p) = decided.or(ended) {
            self.record_event(EventKind::Preempted {
                job: new.id,
                share: share(),
                node: p.node.clone(),
                cause: p.kind.as_str().to_string(),
                for_job: p.for_job,
                for_share: p.for_share.clone(),
            });
        }
        if old.state != new.state {
            // A change a member's end made names that member's node, not the first member's
            // (found by probing: rank 1's failure was told on rank 0's node).
            let member_node = |job: &JobRecord| match job.stop.as_deref() {
                Some(StopCause::MemberEnded { node, .. }) => Some(node.clone()),
                _ => None,
            };
            self.record_event(EventKind::JobState {
                job: new.id,
                share: share(),
                from: old.state,
                to: new.state,
                node: member_node(new).or_else(|| new.last_node.clone()),
                reason: new.reason.as_ref().map(ToString::to_string),
                by: self.acting(),
            });
        }
    }
}
