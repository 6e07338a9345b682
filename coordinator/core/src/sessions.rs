//! Client write sessions: each write of a client applied at most once, however many copies of
//! it reach the log and in whatever order (the Raft dissertation's §6.3).
//!
//! A client process tags each write with its session, the write's number and the lowest
//! number of its writes still waiting for an answer ([`WriteTag`]); the coordinators log the
//! write as [`crate::Command::InSession`]. Here, per session, the state keeps the highest
//! `low` seen and the numbers applied at or above it. A copy whose number was applied is a
//! duplicate: it changes nothing and answers `Done`, as the first copy did. A copy whose
//! number is below `low` is late: its client had its answer (or gave up) before sending a
//! later write, so it is refused and changes nothing. Only the first copy applies.
//!
//! Numbers are kept exactly, not as "the highest applied": one client's concurrent writes may
//! commit out of order, and a later number committed first must not make an earlier one look
//! like a duplicate. A refused write is not recorded, so sending it again is refused again
//! (or applies, if what refused it changed) instead of answering `Done`.
//!
//! Sessions are dropped when idle for [`SESSION_IDLE_MS`] of leader time, or, the least
//! recently used first, when there are more than [`SESSIONS_MAX`]; a copy of a dropped
//! session's write that arrives later still would apply as new. Both bounds are far beyond the
//! seconds a stalled coordinator has been seen to hold a request.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use quotient_common::api::WriteTag;
use quotient_common::SpecError;

use crate::command::{ApplyCtx, Command, Outcome, Rejection};
use crate::state::State;

/// How long a session is kept after its last write, in leader time.
pub const SESSION_IDLE_MS: u64 = 60 * 60 * 1_000;
/// The most sessions kept; past it the least recently used are dropped.
pub const SESSIONS_MAX: usize = 20_000;
/// The most applied write numbers one session keeps at or above its `low`: that many writes
/// of one client answered out of order while an older one is still in flight. A write past it
/// is refused until the older one ends.
pub const SESSION_APPLIED_MAX: usize = 1_024;

/// Every live session, by id, and by when it was last used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sessions {
    by_id: BTreeMap<u64, Session>,
    /// `(last_ms, id)` of every session in `by_id`, oldest use first.
    by_use: BTreeSet<(u64, u64)>,
}

/// One client session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The highest `low` of the session's writes: every number below it is done with.
    pub low: u64,
    /// The numbers applied at or above `low`.
    pub applied: BTreeSet<u64>,
    /// The leader time of the session's last write.
    pub last_ms: u64,
}

/// What a session makes of one copy of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The first copy: apply it.
    Apply,
    /// Applied before.
    Duplicate,
    /// Below the session's `low`.
    Late,
    /// The session holds [`SESSION_APPLIED_MAX`] numbers already.
    Full,
}

impl Sessions {
    /// How many sessions are kept.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The session `id`, if kept.
    pub fn get(&self, id: u64) -> Option<&Session> {
        self.by_id.get(&id)
    }

    /// Every kept session, by id.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Session)> {
        self.by_id.iter().map(|(id, session)| (*id, session))
    }

    /// Drops the sessions idle since before `now - SESSION_IDLE_MS`, and the least recently
    /// used past [`SESSIONS_MAX`] - `room`.
    fn prune(&mut self, now: u64, room: usize) {
        let idle_before = now.saturating_sub(SESSION_IDLE_MS);
        while let Some(&(last, id)) = self.by_use.first() {
            if last >= idle_before && self.by_id.len() + room <= SESSIONS_MAX {
                break;
            }
            self.by_use.pop_first();
            self.by_id.remove(&id);
        }
    }

    /// Looks `tag` up at leader time `now`, raising its session's `low` and marking it used.
    /// On [`Verdict::Apply`] the caller applies the write and then calls [`Sessions::record`]
    /// unless it was refused.
    fn admit(&mut self, tag: WriteTag, now: u64) -> Verdict {
        let room = usize::from(!self.by_id.contains_key(&tag.session));
        self.prune(now, room);
        let session = self.by_id.entry(tag.session).or_insert_with(|| Session {
            low: tag.low,
            applied: BTreeSet::new(),
            last_ms: now,
        });
        self.by_use.remove(&(session.last_ms, tag.session));
        // Leader time never runs back, but a snapshot of another build might hold a later
        // one: keep the latest.
        session.last_ms = session.last_ms.max(now);
        self.by_use.insert((session.last_ms, tag.session));
        if tag.low > session.low {
            session.low = tag.low;
            session.applied = session.applied.split_off(&tag.low);
        }
        if tag.seq < session.low {
            Verdict::Late
        } else if session.applied.contains(&tag.seq) {
            Verdict::Duplicate
        } else if session.applied.len() >= SESSION_APPLIED_MAX {
            Verdict::Full
        } else {
            Verdict::Apply
        }
    }

    /// Notes that the write `tag` applied.
    fn record(&mut self, tag: WriteTag) {
        if let Some(session) = self.by_id.get_mut(&tag.session) {
            session.applied.insert(tag.seq);
        }
    }

    /// Whether the two maps agree and every session's numbers are at or above its `low`.
    pub fn check(&self) -> Result<(), String> {
        if self.by_id.len() > SESSIONS_MAX {
            return Err(format!(
                "{} client sessions, over the limit of {SESSIONS_MAX}",
                self.by_id.len()
            ));
        }
        if self.by_id.len() != self.by_use.len() {
            return Err(format!(
                "{} sessions but {} by use",
                self.by_id.len(),
                self.by_use.len()
            ));
        }
        for (id, session) in &self.by_id {
            if !self.by_use.contains(&(session.last_ms, *id)) {
                return Err(format!(
                    "session {id:016x} is missing from the sessions by use"
                ));
            }
            if session
                .applied
                .first()
                .is_some_and(|seq| *seq < session.low)
            {
                return Err(format!(
                    "session {id:016x} keeps a write below its lowest in flight"
                ));
            }
        }
        Ok(())
    }
}

impl State {
    /// The clients' write sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.data.sessions
    }

    /// Applies `command`, a client's write tagged `tag`, at most once (module docs).
    pub(crate) fn apply_in_session(
        &mut self,
        tag: WriteTag,
        command: Command,
        ctx: ApplyCtx,
    ) -> Outcome {
        if let Err(why) = tag.check() {
            return Outcome::Rejected(Rejection::Invalid(SpecError::Field(why)));
        }
        if matches!(command, Command::InSession { .. }) {
            return Outcome::Rejected(Rejection::Invalid(SpecError::Field(
                "a write in a session cannot hold another one".to_string(),
            )));
        }
        match self.data.sessions.admit(tag, ctx.time_ms) {
            Verdict::Apply => {
                let outcome = crate::apply::apply_inner(self, command, ctx);
                if !outcome.is_rejected() {
                    self.data.sessions.record(tag);
                }
                outcome
            }
            Verdict::Duplicate => Outcome::Done,
            Verdict::Late => Outcome::Rejected(Rejection::Invalid(SpecError::Field(format!(
                "write {} of session {:016x} arrived after its client moved on (a late copy of a \
                 write that was answered or given up): not applied",
                tag.seq, tag.session
            )))),
            Verdict::Full => Outcome::Rejected(Rejection::TooMany {
                what: "writes of one client session answered while an older one is in flight"
                    .to_string(),
                max: SESSION_APPLIED_MAX as u64,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(session: u64, seq: u64, low: u64) -> WriteTag {
        WriteTag { session, seq, low }
    }

    #[test]
    fn a_number_applies_once_and_late_copies_are_dropped() {
        // Proves the verdicts: first copy, duplicate, a later write raising the low mark, and
        // a late copy of a write below it, even one never applied.
        let mut sessions = Sessions::default();
        assert_eq!(sessions.admit(tag(7, 1, 1), 10), Verdict::Apply);
        sessions.record(tag(7, 1, 1));
        assert_eq!(sessions.admit(tag(7, 1, 1), 11), Verdict::Duplicate);
        // Writes 2 and 3 in flight together; 3 commits first.
        assert_eq!(sessions.admit(tag(7, 3, 2), 12), Verdict::Apply);
        sessions.record(tag(7, 3, 2));
        assert_eq!(sessions.admit(tag(7, 2, 2), 13), Verdict::Apply);
        sessions.record(tag(7, 2, 2));
        assert_eq!(sessions.admit(tag(7, 4, 4), 14), Verdict::Apply);
        assert_eq!(sessions.admit(tag(7, 2, 2), 15), Verdict::Late);
        assert_eq!(sessions.admit(tag(7, 3, 3), 15), Verdict::Late);
        assert_eq!(sessions.get(7).map(|s| s.low), Some(4));
        assert!(sessions.get(7).is_some_and(|s| s.applied.is_empty()));
        sessions.check().expect("consistent");
    }

    #[test]
    fn idle_and_surplus_sessions_are_dropped_oldest_first() {
        // Proves the two bounds: an hour idle, and the count.
        let mut sessions = Sessions::default();
        assert_eq!(sessions.admit(tag(1, 1, 1), 0), Verdict::Apply);
        assert_eq!(sessions.admit(tag(2, 1, 1), 1_000), Verdict::Apply);
        assert_eq!(
            sessions.admit(tag(3, 1, 1), SESSION_IDLE_MS + 1),
            Verdict::Apply
        );
        assert!(sessions.get(1).is_none(), "idle for over an hour");
        assert!(sessions.get(2).is_some());
        for id in 10..(10 + SESSIONS_MAX as u64) {
            sessions.admit(tag(id, 1, 1), SESSION_IDLE_MS + 2);
        }
        assert_eq!(sessions.len(), SESSIONS_MAX);
        assert!(sessions.get(2).is_none() && sessions.get(3).is_none());
        sessions.check().expect("consistent");
    }

    #[test]
    fn a_session_with_too_many_answered_writes_refuses_more() {
        // Proves the per-session bound while write 1 stays in flight.
        let mut sessions = Sessions::default();
        for seq in 2..(2 + SESSION_APPLIED_MAX as u64) {
            assert_eq!(sessions.admit(tag(5, seq, 1), 1), Verdict::Apply);
            sessions.record(tag(5, seq, 1));
        }
        let next = 2 + SESSION_APPLIED_MAX as u64;
        assert_eq!(sessions.admit(tag(5, next, 1), 1), Verdict::Full);
        assert_eq!(sessions.admit(tag(5, 1, 1), 1), Verdict::Full);
        // Write 1 ends: the numbers below the new low are forgotten.
        assert_eq!(sessions.admit(tag(5, next, next), 2), Verdict::Apply);
    }
}
