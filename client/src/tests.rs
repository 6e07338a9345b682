//! The call loop against a scripted set of coordinators: redirects, elections, forwarding
//! through a follower, a killed leader, lost answers and refusals.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use quotient_common::api::{how_to_narrow, ApiError, ApiRequest, ApiResponse, HealthView};
use quotient_common::{ErrorCode, JobId, JobSpec, Rejection};

use crate::{ApiClient, ClientError, Exchange, ExchangeError, HandshakeWait, RetryPolicy};

type Answer = Result<ApiResponse, ExchangeError>;

/// A scripted coordinator set: each address answers from its own queue (unscripted:
/// unreachable), addresses in `down` fail the first handshake, and every try is recorded.
#[derive(Default)]
struct FakeExchange {
    scripts: Mutex<BTreeMap<String, VecDeque<Answer>>>,
    down: BTreeSet<String>,
    /// Addresses whose first handshake is refused for the server's load.
    busy: BTreeSet<String>,
    tried: Mutex<Vec<String>>,
    sent: Mutex<Vec<ApiRequest>>,
}

impl FakeExchange {
    fn script(self, address: &str, answer: Answer) -> Self {
        self.scripts
            .lock()
            .unwrap()
            .entry(address.to_string())
            .or_default()
            .push_back(answer);
        self
    }

    fn down(mut self, address: &str) -> Self {
        self.down.insert(address.to_string());
        self
    }

    fn busy(mut self, address: &str) -> Self {
        self.busy.insert(address.to_string());
        self
    }
}

impl Exchange for FakeExchange {
    async fn connect_first(
        &self,
        addresses: &[String],
        _deadline: Duration,
    ) -> Result<String, BTreeMap<String, String>> {
        addresses
            .iter()
            .find(|address| !self.down.contains(*address) && !self.busy.contains(*address))
            .cloned()
            .ok_or_else(|| {
                addresses
                    .iter()
                    .map(|address| {
                        let why = if self.busy.contains(address) {
                            format!(
                                "handshake with {address} failed: refused{}",
                                quotient_common::transport::HANDSHAKE_BUSY_HINT
                            )
                        } else {
                            "no handshake".to_string()
                        };
                        (address.clone(), why)
                    })
                    .collect()
            })
    }

    fn has_open_connection(&self) -> bool {
        false
    }

    async fn exchange(
        &self,
        address: &str,
        request: &ApiRequest,
        _deadline: Duration,
        _wait: HandshakeWait,
    ) -> Answer {
        self.tried.lock().unwrap().push(address.to_string());
        self.sent.lock().unwrap().push(request.clone());
        self.scripts
            .lock()
            .unwrap()
            .get_mut(address)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| Err(ExchangeError::Unreachable("not scripted".into())))
    }

    fn close(&self) {}
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        call_deadline: Duration::from_millis(2_000),
        attempt_deadline: Duration::from_millis(100),
        redirects_max: 3,
        backoff: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
        ..RetryPolicy::default()
    }
}

fn addresses() -> Vec<String> {
    vec!["a:1".into(), "b:1".into(), "c:1".into()]
}

fn health() -> ApiResponse {
    ApiResponse::Health(HealthView {
        id: 2,
        leader: Some(2),
        term: 1,
        last_applied: 0,
        healthy: true,
        state_digest: 0,
        cluster_id: None,
        problems: Vec::new(),
    })
}

fn not_leader(address: Option<&str>) -> Answer {
    Ok(ApiResponse::Error(ApiError::NotLeader {
        leader_id: address.map(|_| 2),
        leader_address: address.map(str::to_string),
    }))
}

/// Runs `request` through a client of [`addresses`] over `fake`; the answer, and what was
/// tried and sent, in order.
fn run(
    fake: FakeExchange,
    request: &ApiRequest,
    policy: &RetryPolicy,
) -> (
    Result<ApiResponse, ClientError>,
    Vec<String>,
    Vec<ApiRequest>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = ApiClient::with_exchange(fake, addresses(), *policy).unwrap();
    let answer = runtime.block_on(client.call(request.clone()));
    let tried = client.exchange().tried.lock().unwrap().clone();
    let sent = client.exchange().sent.lock().unwrap().clone();
    (answer, tried, sent)
}

#[test]
fn a_follower_redirect_is_followed_to_the_leader() {
    // Proves NotLeader with an address goes straight to that address, unseen by the caller.
    let fake = FakeExchange::default()
        .script("a:1", not_leader(Some("b:1")))
        .script("b:1", Ok(health()));
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &fast());
    assert_eq!(answer.unwrap(), health());
    assert_eq!(tried, ["a:1", "b:1"]);
}

#[test]
fn the_first_coordinator_to_answer_a_handshake_is_asked_first() {
    // Proves a stopped coordinator early in the list costs nothing: the call starts with the
    // first whose handshake completed.
    let fake = FakeExchange::default()
        .down("a:1")
        .script("b:1", Ok(health()));
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &fast());
    assert_eq!(answer.unwrap(), health());
    assert_eq!(tried, ["b:1"]);
}

#[test]
fn a_redirect_out_of_reach_goes_back_to_the_follower_to_be_forwarded() {
    // Proves that when the leader's address is not one of the client's and cannot be
    // reached, the follower that redirected gets the request again, asking it to serve it
    // through the leader.
    let fake = FakeExchange::default()
        .script("a:1", not_leader(Some("leader.internal:7400")))
        .script(
            "leader.internal:7400",
            Err(ExchangeError::Unreachable("no such host".into())),
        )
        .script("a:1", Ok(health()));
    let (answer, tried, sent) = run(fake, &ApiRequest::ListShares, &fast());
    assert_eq!(answer.unwrap(), health());
    assert_eq!(tried, ["a:1", "leader.internal:7400", "a:1"]);
    assert_eq!(
        sent,
        [
            ApiRequest::ListShares,
            ApiRequest::ListShares,
            ApiRequest::ViaLeader(Box::new(ApiRequest::ListShares)),
        ]
    );
}

#[test]
fn a_killed_leader_that_a_follower_still_names_is_not_waited_on_nor_forwarded_to() {
    // Proves the fast failover path: the leader the follower names is one of the client's
    // own addresses and does not answer, so it was most likely just killed; the client asks
    // the follower again (not wrapped: forwarding to a dead leader would wait out the
    // follower's deadline) until it names the new leader.
    let fake = FakeExchange::default()
        .script("b:1", not_leader(Some("a:1")))
        .script(
            "a:1",
            Err(ExchangeError::Unreachable("no handshake yet".into())),
        )
        .script("b:1", not_leader(Some("a:1")))
        .script(
            "a:1",
            Err(ExchangeError::Unreachable("no handshake yet".into())),
        )
        .script("b:1", not_leader(Some("c:1")))
        .script("c:1", Ok(ApiResponse::Done))
        .down("a:1");
    let cancel = ApiRequest::CancelJob { job: JobId(1) };
    let (answer, tried, sent) = run(fake, &cancel, &fast());
    assert_eq!(answer.unwrap(), ApiResponse::Done);
    assert_eq!(tried, ["b:1", "a:1", "b:1", "a:1", "b:1", "c:1"]);
    // Every copy is the same write of the session, never wrapped to be forwarded.
    assert!(
        matches!(&sent[0], ApiRequest::InSession { tag, request } if tag.seq == 1 && tag.low == 1 && **request == cancel),
        "{sent:?}"
    );
    assert!(sent.iter().all(|request| *request == sent[0]), "{sent:?}");
}

#[test]
fn redirects_in_a_loop_pause_between_bursts_and_end_at_the_deadline() {
    // Proves two coordinators naming each other are not followed without end: at most
    // `redirects_max` hops in a row, then a pause, and the call ends at its deadline saying
    // what it saw.
    let mut fake = FakeExchange::default();
    for _ in 0..1_000 {
        fake = fake
            .script("a:1", not_leader(Some("b:1")))
            .script("b:1", not_leader(Some("a:1")))
            .script("c:1", not_leader(Some("a:1")));
    }
    let policy = RetryPolicy {
        call_deadline: Duration::from_millis(200),
        backoff: Duration::from_millis(50),
        backoff_max: Duration::from_millis(50),
        ..fast()
    };
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &policy);
    let error = answer.unwrap_err();
    assert!(
        matches!(error, ClientError::Unavailable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("redirected"), "{error}");
    // Five bursts at most in 200 ms of 50 ms pauses, each of 4 tries (3 hops) and maybe one
    // more on the next address; without the bound, hundreds.
    assert!(tried.len() <= 25, "{tried:?}");
}

#[test]
fn an_election_is_waited_out() {
    // Proves Unavailable and "no leader" are retried, and the next answer is returned.
    let fake = FakeExchange::default()
        .script("a:1", not_leader(None))
        .script(
            "b:1",
            Ok(ApiResponse::Error(ApiError::Unavailable("electing".into()))),
        )
        .script("c:1", Ok(health()));
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &fast());
    assert_eq!(answer.unwrap(), health());
    assert_eq!(tried, ["a:1", "b:1", "c:1"]);
}

#[test]
fn an_endless_election_ends_at_the_deadline() {
    // Proves the overall deadline bounds the retries and the error says what was seen.
    let mut fake = FakeExchange::default();
    for _ in 0..1_000 {
        for address in addresses() {
            fake = fake.script(&address, not_leader(None));
        }
    }
    let policy = RetryPolicy {
        call_deadline: Duration::from_millis(50),
        ..fast()
    };
    let (answer, _, _) = run(fake, &ApiRequest::ListShares, &policy);
    let error = answer.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unavailable);
    assert!(error.retryable());
    assert!(error.to_string().contains("no leader yet"), "{error}");
}

#[test]
fn a_bug_an_agent_gone_or_a_refusal_is_not_retried() {
    // Proves the errors a retry cannot help come back at once, with their codes: a bug
    // (Internal), an agent that is not connected, a refusal.
    for (error, code) in [
        (ApiError::Internal("a bug".into()), ErrorCode::Internal),
        (
            ApiError::AgentUnavailable("node-1 is not connected".into()),
            ErrorCode::Unavailable,
        ),
        (
            ApiError::Rejected(Rejection::ShareDisabled("qs1".into())),
            ErrorCode::FailedPrecondition,
        ),
    ] {
        let fake = FakeExchange::default()
            .script("a:1", Ok(ApiResponse::Error(error.clone())))
            .script("b:1", Ok(health()));
        let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &fast());
        let failure = answer.unwrap_err();
        assert_eq!(failure.code(), code, "{failure:?}");
        assert!(matches!(failure, ClientError::Api(ref e) if *e == error));
        assert_eq!(tried, ["a:1"]);
    }
}

#[test]
fn an_unreachable_coordinator_is_skipped() {
    // Proves a connection failure moves on to the next address.
    let fake = FakeExchange::default()
        .script("a:1", Err(ExchangeError::Unreachable("refused".into())))
        .script("b:1", Ok(health()));
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &fast());
    assert_eq!(answer.unwrap(), health());
    assert_eq!(tried, ["a:1", "b:1"]);
}

#[test]
fn no_reachable_coordinator_fails_after_one_sweep_when_failing_fast() {
    // Proves a stopped cluster fails at once for the command line's policy, naming every
    // address, as Unavailable.
    let mut fake = FakeExchange::default();
    for address in addresses() {
        fake = fake.down(&address);
    }
    let policy = RetryPolicy {
        fail_fast_unreachable: true,
        ..fast()
    };
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &policy);
    let error = answer.unwrap_err();
    assert!(
        matches!(error, ClientError::Unreachable { .. }),
        "{error:?}"
    );
    assert_eq!(error.code(), ErrorCode::Unavailable);
    for address in addresses() {
        assert!(error.to_string().contains(&address), "{error}");
    }
    assert!(tried.is_empty(), "{tried:?}");
}

#[test]
fn coordinators_that_refuse_handshakes_for_their_load_are_tried_again_even_when_failing_fast() {
    // Proves a cluster that answered "busy" is not taken for a stopped one: the command
    // line's policy goes on trying, and gets its answer (found by probing: of 400 commands
    // started at once, 321 gave up after 2 s, told the cluster might not be running).
    let mut fake = FakeExchange::default().script("a:1", Ok(health()));
    for address in addresses() {
        fake = fake.busy(&address);
    }
    let policy = RetryPolicy {
        fail_fast_unreachable: true,
        ..fast()
    };
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &policy);
    assert_eq!(answer.unwrap(), health());
    assert_eq!(tried, ["a:1"]);
}

#[test]
fn a_lost_write_is_not_retried_but_a_keyed_submit_and_a_session_write_are() {
    // Proves only retry-safe requests are sent again after a lost answer: a write outside the
    // session (an access key's creation) is not; a keyed submit is, and so is a write of the
    // session, with the same tag.
    let lost = || Err(ExchangeError::Lost("connection lost".into()));
    let fake = FakeExchange::default()
        .script("a:1", lost())
        .script("b:1", Ok(ApiResponse::Done));
    let create = ApiRequest::CreateAccessKey {
        user: "alice".into(),
        admin: false,
    };
    let (answer, tried, _) = run(fake, &create, &fast());
    let error = answer.unwrap_err();
    assert!(matches!(error, ClientError::Uncertain(_)), "{error:?}");
    assert_eq!(error.code(), ErrorCode::Uncertain);
    assert!(error.to_string().contains("may or may not"), "{error}");
    assert_eq!(tried, ["a:1"]);

    let fake = FakeExchange::default()
        .script("a:1", lost())
        .script("b:1", Ok(ApiResponse::Done));
    let cancel = ApiRequest::CancelJob { job: JobId(1) };
    let (answer, tried, sent) = run(fake, &cancel, &fast());
    assert_eq!(answer.unwrap(), ApiResponse::Done);
    assert_eq!(tried, ["a:1", "b:1"]);
    assert_eq!(sent[0], sent[1], "the retry is the same write");
    assert!(sent[0].write_tag().is_some(), "{sent:?}");

    let mut spec = JobSpec::new("qs1", 1, 1, vec!["true".into()]);
    spec.idempotency_key = Some("k".into());
    let submit = ApiRequest::SubmitJob(spec);
    let fake = FakeExchange::default()
        .script("a:1", lost())
        .script("b:1", Ok(ApiResponse::Done));
    assert_eq!(run(fake, &submit, &fast()).0.unwrap(), ApiResponse::Done);
}

#[test]
fn a_keyed_submit_whose_answers_were_lost_ends_uncertain_not_unavailable() {
    // Proves a retried write that ran out of time after losing an answer is not reported as
    // "nothing was done": it may have been applied.
    let mut spec = JobSpec::new("qs1", 1, 1, vec!["true".into()]);
    spec.idempotency_key = Some("k".into());
    let mut fake =
        FakeExchange::default().script("a:1", Err(ExchangeError::Lost("connection lost".into())));
    for _ in 0..1_000 {
        for address in addresses() {
            fake = fake.script(&address, not_leader(None));
        }
    }
    let policy = RetryPolicy {
        call_deadline: Duration::from_millis(50),
        ..fast()
    };
    let (answer, _, _) = run(fake, &ApiRequest::SubmitJob(spec), &policy);
    let error = answer.unwrap_err();
    assert!(matches!(error, ClientError::Uncertain(_)), "{error:?}");
}

#[test]
fn a_coordinator_that_could_not_commit_in_time_is_asked_again_for_a_keyed_submit_only() {
    // Proves the coordinator's own Uncertain (its deadline passed with the write proposed)
    // is retried for an idempotent submit and returned for any other write.
    let uncertain = || {
        Ok(ApiResponse::Error(ApiError::Uncertain(
            "no commit within 10000 ms".into(),
        )))
    };
    let create = ApiRequest::CreateAccessKey {
        user: "alice".into(),
        admin: false,
    };
    let fake = FakeExchange::default()
        .script("a:1", uncertain())
        .script("b:1", Ok(ApiResponse::Done));
    let (answer, tried, _) = run(fake, &create, &fast());
    assert_eq!(answer.unwrap_err().code(), ErrorCode::Uncertain);
    assert_eq!(tried, ["a:1"]);

    let mut spec = JobSpec::new("qs1", 1, 1, vec!["true".into()]);
    spec.idempotency_key = Some("k".into());
    let fake = FakeExchange::default()
        .script("a:1", uncertain())
        .script("b:1", Ok(ApiResponse::Done));
    let (answer, tried, _) = run(fake, &ApiRequest::SubmitJob(spec), &fast());
    assert_eq!(answer.unwrap(), ApiResponse::Done);
    assert_eq!(tried, ["a:1", "b:1"]);
}

#[test]
fn an_answer_too_large_is_not_retried() {
    // Proves an answer that could not be read comes back once, from the first coordinator,
    // with what it was and how to narrow the request.
    let list = ApiRequest::list_jobs(0);
    let too_large = ApiError::AnswerTooLarge {
        size_bytes: 20_000_000,
        limit_bytes: 16_777_216,
        narrow: how_to_narrow(&list).to_string(),
    };
    let fake = FakeExchange::default()
        .script("a:1", Err(ExchangeError::Refused(too_large.clone())))
        .script("b:1", Ok(health()));
    let (answer, tried, _) = run(fake, &list, &fast());
    let error = answer.unwrap_err();
    assert_eq!(tried, ["a:1"]);
    assert_eq!(error.code(), ErrorCode::LimitExceeded);
    assert!(
        error
            .to_string()
            .starts_with("the answer is too large (20000000 bytes, limit 16777216)"),
        "{error}"
    );
}

#[test]
fn a_cluster_that_is_not_up_yet_is_waited_for_by_default() {
    // Proves a program started alongside the cluster is not refused because no coordinator
    // answered its first handshakes: it goes on trying until one answers.
    let mut fake = FakeExchange::default()
        .script("a:1", Err(ExchangeError::Unreachable("starting".into())))
        .script("b:1", Err(ExchangeError::Unreachable("starting".into())))
        .script("c:1", Err(ExchangeError::Unreachable("starting".into())))
        .script("a:1", Ok(health()));
    for address in addresses() {
        fake = fake.down(&address);
    }
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &fast());
    assert_eq!(answer.unwrap(), health());
    assert_eq!(tried, ["a:1", "b:1", "c:1", "a:1"]);
}

#[test]
fn a_coordinator_whose_raft_stopped_is_left_for_the_others() {
    // Proves a stopped coordinator is never asked again in the call while the others are
    // (a keyed submit, a read), that a write not safe to send twice is uncertain, and that
    // with every coordinator stopped the call ends with that error, not at its deadline.
    let stopped = || {
        Ok(ApiResponse::Error(ApiError::Stopped(
            "raft stopped: the disk is full".into(),
        )))
    };
    let mut spec = JobSpec::new("qs1", 1, 1, vec!["true".into()]);
    spec.idempotency_key = Some("k".into());
    let submit = ApiRequest::SubmitJob(spec);
    let fake = FakeExchange::default()
        .script("a:1", stopped())
        .script("a:1", Ok(ApiResponse::Done))
        .script("b:1", not_leader(Some("a:1")))
        .script("b:1", not_leader(None))
        .script("c:1", Ok(ApiResponse::Done));
    let (answer, tried, _) = run(fake, &submit, &fast());
    assert_eq!(answer.unwrap(), ApiResponse::Done);
    assert_eq!(tried, ["a:1", "b:1", "c:1"], "a:1 asked again");

    let cancel = ApiRequest::CancelJob { job: JobId(1) };
    let fake = FakeExchange::default().script("a:1", stopped());
    let (answer, _, _) = run(fake, &cancel, &fast());
    assert!(
        matches!(answer, Err(ClientError::Uncertain(_))),
        "{answer:?}"
    );

    let mut fake = FakeExchange::default();
    for address in addresses() {
        fake = fake.script(&address, stopped());
    }
    let policy = RetryPolicy {
        call_deadline: Duration::from_secs(60),
        ..fast()
    };
    let started = std::time::Instant::now();
    let (answer, tried, _) = run(fake, &ApiRequest::ListShares, &policy);
    let error = answer.unwrap_err();
    assert!(
        matches!(error, ClientError::Api(ApiError::Stopped(_))),
        "{error:?}"
    );
    assert_eq!(error.code(), ErrorCode::Unavailable);
    assert_eq!(tried, ["a:1", "b:1", "c:1"]);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the deadline"
    );
}

#[test]
fn a_session_numbers_its_writes_and_names_the_lowest_in_flight() {
    // Proves the tags a client's writes carry: one session for the client and its clones,
    // numbers from 1, `low` the oldest write still waiting (so a write that ended, answered
    // or not, raises it), and none on reads, submits or writes outside the session.
    let fake = FakeExchange::default();
    let client = ApiClient::with_exchange(fake, addresses(), fast()).unwrap();
    let first = crate::api_client::SessionWrite::begin(&client.state);
    let second = crate::api_client::SessionWrite::begin(&client.clone().state);
    let cancel = ApiRequest::CancelJob { job: JobId(1) };
    let tag = |write: &crate::api_client::SessionWrite| *write.wrap(&cancel).write_tag().unwrap();
    let (one, two) = (tag(&first), tag(&second));
    assert_eq!(one.session, two.session);
    assert_eq!((one.seq, one.low), (1, 1));
    assert_eq!((two.seq, two.low), (2, 1));
    drop(first);
    assert_eq!(tag(&second).low, 2);
    drop(second);
    let third = crate::api_client::SessionWrite::begin(&client.state);
    assert_eq!((tag(&third).seq, tag(&third).low), (3, 3));
    let other = ApiClient::with_exchange(FakeExchange::default(), addresses(), fast()).unwrap();
    let elsewhere = crate::api_client::SessionWrite::begin(&other.state);
    assert_ne!(
        tag(&elsewhere).session,
        one.session,
        "another client, another session"
    );
    assert!(!ApiRequest::ListShares.is_session_write());
    assert!(
        !ApiRequest::SubmitJob(JobSpec::new("qs1", 1, 1, vec!["true".into()])).is_session_write()
    );
    assert!(!ApiRequest::CreateAccessKey {
        user: "a".into(),
        admin: false
    }
    .is_session_write());
}
