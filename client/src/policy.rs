//! How hard a call tries: the deadlines, the redirect limit and the pauses of the one retry
//! policy every client of the API follows (the CLI, a follower forwarding to the leader, the
//! tests and the benchmarks).
//!
//! One set of numbers, so that the CLI and the coordinator's forwarding never disagree about
//! what a coordinator that does not answer means. Callers change a deadline for what they
//! know (a follower forwards within its own request's deadline; `dev up` waits for the first
//! election) and keep the rest.

use std::time::Duration;

use quotient_common::api::ApiRequest;

/// Deadline of a whole call, redirects, elections and retries included (milliseconds).
pub const CALL_DEADLINE_MS: u64 = 30_000;
/// Deadline of one request to one coordinator (milliseconds). Above the coordinator's own
/// deadline for answering (10 s, `API_REQUEST_TIMEOUT_MS`), so that a write that could not
/// commit in time comes back as the coordinator's answer rather than as silence.
pub const ATTEMPT_DEADLINE_MS: u64 = 12_000;
/// Deadline of a membership change or a cluster bootstrap, a call and each of its attempts
/// (milliseconds): the coordinator waits up to 100 s for a new member to catch up.
pub const MEMBERSHIP_DEADLINE_MS: u64 = 130_000;
/// Longest wait for one QUIC handshake (milliseconds). A coordinator that was killed never
/// answers one, so this bounds what a dead address costs when no other one is connected.
pub const CONNECT_DEADLINE_MS: u64 = 2_000;
/// Longest wait for a handshake still under way, counted from its start, while another
/// coordinator is connected (milliseconds). Any live coordinator will do for a call, and a
/// live one completes a handshake in one round trip, so a leader that has not answered by then
/// is most likely the one just killed: the call asks the follower again instead of waiting
/// out [`CONNECT_DEADLINE_MS`]. The handshake goes on in the background; once it completes,
/// the next try uses it.
pub const CONNECT_PATIENCE_MS: u64 = 250;
/// Most redirects followed in a row before the call pauses as if no leader were known (two
/// coordinators naming each other during a leader change).
pub const REDIRECTS_MAX: u32 = 5;
/// First pause while no leader is known (milliseconds); doubles up to the maximum.
pub const BACKOFF_MS: u64 = 50;
/// Longest pause while no leader is known (milliseconds). Short, because a killed leader is
/// replaced within about a second and the first try after that should come at once.
pub const BACKOFF_MAX_MS: u64 = 100;

/// How hard a call tries; [`RetryPolicy::default`] holds the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Deadline of a whole call.
    pub call_deadline: Duration,
    /// Deadline of one request to one coordinator.
    pub attempt_deadline: Duration,
    /// Deadline of a membership change, its call and each attempt.
    pub membership_deadline: Duration,
    /// Longest wait for one handshake.
    pub connect_deadline: Duration,
    /// Longest wait for a handshake under way while another coordinator is connected.
    pub connect_patience: Duration,
    /// Most redirects followed in a row before pausing.
    pub redirects_max: u32,
    /// First and longest pause while no leader is known.
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// Whether a client that never reached a coordinator gives up when none answers its
    /// first handshakes, instead of trying until the deadline: for a person at the command
    /// line, who should hear at once that the cluster is not running. Off by default, for
    /// programs started alongside the cluster (tests, tools), which wait for it to come up.
    pub fail_fast_unreachable: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            call_deadline: Duration::from_millis(CALL_DEADLINE_MS),
            attempt_deadline: Duration::from_millis(ATTEMPT_DEADLINE_MS),
            membership_deadline: Duration::from_millis(MEMBERSHIP_DEADLINE_MS),
            connect_deadline: Duration::from_millis(CONNECT_DEADLINE_MS),
            connect_patience: Duration::from_millis(CONNECT_PATIENCE_MS),
            redirects_max: REDIRECTS_MAX,
            backoff: Duration::from_millis(BACKOFF_MS),
            backoff_max: Duration::from_millis(BACKOFF_MAX_MS),
            fail_fast_unreachable: false,
        }
    }
}

impl RetryPolicy {
    /// The deadlines of a call of `request` and of each of its attempts: a membership change
    /// gets at least [`RetryPolicy::membership_deadline`] for both, since the coordinator
    /// answers only once the new member caught up.
    pub fn deadlines(&self, request: &ApiRequest) -> (Duration, Duration) {
        match request.unwrapped() {
            ApiRequest::AddMember { .. }
            | ApiRequest::RemoveMember { .. }
            | ApiRequest::InitCluster => (
                self.call_deadline.max(self.membership_deadline),
                self.attempt_deadline.max(self.membership_deadline),
            ),
            _ => (self.call_deadline, self.attempt_deadline),
        }
    }
}

/// Whether sending `request` twice is harmless: reads, submits with an idempotency key (the
/// leader answers a repeated key with the first submit's job), and writes tagged with their
/// client's session ([`ApiRequest::InSession`]; the leader applies each once).
pub fn is_retry_safe(request: &ApiRequest) -> bool {
    if request.write_tag().is_some() {
        // The coordinators apply each write of a session once, however many copies come.
        return true;
    }
    match request.unwrapped() {
        ApiRequest::SubmitJob(spec) => spec.idempotency_key.is_some(),
        other => !other.is_write(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::JobSpec;

    #[test]
    fn membership_changes_get_the_long_deadline_and_others_the_short() {
        // Proves an add-member (which waits for a learner to catch up) is not cut off at the
        // deadline of an ordinary request, wrapped or not.
        let policy = RetryPolicy::default();
        let add = ApiRequest::AddMember {
            id: 4,
            address: "a:1".into(),
        };
        let long = Duration::from_millis(MEMBERSHIP_DEADLINE_MS);
        assert_eq!(policy.deadlines(&add), (long, long));
        assert_eq!(
            policy.deadlines(&ApiRequest::ViaLeader(Box::new(add))),
            (long, long)
        );
        assert_eq!(
            policy.deadlines(&ApiRequest::ListShares),
            (
                Duration::from_millis(CALL_DEADLINE_MS),
                Duration::from_millis(ATTEMPT_DEADLINE_MS)
            )
        );
    }

    #[test]
    fn only_reads_and_keyed_submits_are_safe_to_send_twice() {
        // Proves which requests the client may send again after losing an answer.
        let mut submit = JobSpec::new("qs1", 0, 1, vec!["true".into()]);
        assert!(!is_retry_safe(&ApiRequest::SubmitJob(submit.clone())));
        submit.idempotency_key = Some("k".into());
        assert!(is_retry_safe(&ApiRequest::SubmitJob(submit.clone())));
        assert!(is_retry_safe(&ApiRequest::ViaLeader(Box::new(
            ApiRequest::SubmitJob(submit)
        ))));
        assert!(is_retry_safe(&ApiRequest::ListShares));
        assert!(!is_retry_safe(&ApiRequest::CancelJob {
            job: quotient_common::JobId(1)
        }));
    }
}
