//! The self-fencing lease clock: how long ago a leader last answered a heartbeat, and whether
//! that is longer than the agent's lease.
//!
//! The clock is renewed with the *send* time of an acknowledged heartbeat (or registration),
//! never its answer time: the leader received that heartbeat after it was sent, so the agent's
//! lease always runs out no later than the coordinators' count, which starts at receipt (the
//! timing contract is in [`crate::session`]). Time is passed in, so the rules are unit-tested
//! without sleeping.

use std::time::{Duration, Instant};

/// The agent's view of its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseClock {
    /// The send time of the last acknowledged heartbeat (or where counting started).
    basis: Instant,
    lease_ms: u64,
}

impl LeaseClock {
    /// A lease of `lease_ms` counted from `basis`.
    pub fn new(basis: Instant, lease_ms: u64) -> LeaseClock {
        LeaseClock { basis, lease_ms }
    }

    /// A leader acknowledged a heartbeat sent at `sent_at`. An older send time (a slow answer
    /// that overtook nothing) never moves the basis back.
    pub fn renew(&mut self, sent_at: Instant) {
        self.basis = self.basis.max(sent_at);
    }

    /// The lease the leader gave (in `Registered`).
    pub fn set_lease_ms(&mut self, lease_ms: u64) {
        self.lease_ms = lease_ms;
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// Whether the lease has run out at `now`: the agent must stop its jobs.
    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.basis) > Duration::from_millis(self.lease_ms)
    }

    /// How long since the basis, at `now`.
    pub fn since_ack(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.basis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease runs out lease_ms after the last acknowledged send, and only moves forward.
    #[test]
    fn the_lease_runs_from_the_last_acknowledged_send() {
        let start = Instant::now();
        let mut clock = LeaseClock::new(start, 1_000);
        assert!(!clock.expired(start + Duration::from_millis(1_000)));
        assert!(clock.expired(start + Duration::from_millis(1_001)));
        clock.renew(start + Duration::from_millis(800));
        assert!(!clock.expired(start + Duration::from_millis(1_700)));
        clock.renew(start + Duration::from_millis(100));
        assert!(clock.expired(start + Duration::from_millis(1_801)));
        clock.set_lease_ms(5_000);
        assert!(!clock.expired(start + Duration::from_millis(1_801)));
    }
}
