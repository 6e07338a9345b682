//! One request to one coordinator, and what its failure means for the call that made it.
//!
//! The retry logic of [`crate::ApiClient`] is generic over [`Exchange`], so it is tested with a
//! scripted fake; the real one is [`crate::QuicExchange`]. A failed exchange is sorted by what
//! the caller may do next ([`ExchangeError`]): try another coordinator, treat a write as
//! uncertain, or give up because the same bytes get the same refusal anywhere.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use quotient_common::api::{how_to_narrow, ApiError, ApiRequest, ApiResponse};
use quotient_common::frame::FrameError;
use quotient_common::transport::{RequestError, STREAM_CODE_BAD_FRAME};

/// Why one exchange with one coordinator failed, sorted by what the caller may do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeError {
    /// No connection could be made; the request never left. Try another coordinator.
    Unreachable(String),
    /// The connection broke or the deadline passed after the request was sent: it may or may
    /// not have been carried out.
    Lost(String),
    /// The coordinator refused the request's bytes, or its answer could not be read (over the
    /// frame limit, cut short, undecodable); retrying the same bytes elsewhere will not help.
    /// Said as the API error it amounts to ([`exchange_error`]).
    Refused(ApiError),
}

/// How long an exchange waits for a handshake with a coordinator it has no connection to,
/// counted from the handshake's start (one may be under way already, from an earlier try).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeWait {
    /// The longest wait: then the handshake has failed.
    pub deadline: Duration,
    /// With `Some`, the longest wait while another coordinator is connected: any live one
    /// will do for a call, which asks another rather than wait for one that is most likely
    /// down. The handshake goes on in the background up to `deadline`. `None` for a request
    /// meant for this coordinator alone (`call_one`).
    pub patience: Option<Duration>,
}

/// One request to one coordinator, and the connections behind it. The real one is
/// [`crate::QuicExchange`].
pub trait Exchange: Send + Sync + 'static {
    /// Connects to every address at once, each handshake within `deadline`, and returns the
    /// first that completes, or what each one said. The others go on in the background.
    fn connect_first(
        &self,
        addresses: &[String],
        deadline: Duration,
    ) -> impl Future<Output = Result<String, BTreeMap<String, String>>> + Send;

    /// Whether a connection made earlier is still open.
    fn has_open_connection(&self) -> bool;

    /// Sends `request` to the coordinator at `address` and waits for its answer, all within
    /// `deadline`, connecting first as `wait` says when there is no connection.
    fn exchange(
        &self,
        address: &str,
        request: &ApiRequest,
        deadline: Duration,
        wait: HandshakeWait,
    ) -> impl Future<Output = Result<ApiResponse, ExchangeError>> + Send;

    /// Closes every connection.
    fn close(&self);
}

/// Sorts a failed request to `address` by what the caller may do next, in words that say
/// which side was at fault. An answer over the frame limit or cut short (a coordinator that
/// could not send it whole) is about the answer's size, not a version mismatch; only bytes
/// that do not decode are.
pub fn exchange_error(address: &str, request: &ApiRequest, error: RequestError) -> ExchangeError {
    match error {
        RequestError::Answer(FrameError::Io(error)) => {
            ExchangeError::Lost(format!("reading the answer failed: {error}"))
        }
        RequestError::Answer(error) => {
            ExchangeError::Refused(unreadable_answer(address, request, error))
        }
        RequestError::Frame(FrameError::TooLarge { size, limit }) => {
            ExchangeError::Refused(ApiError::BadRequest(format!(
                "the request is too large to send ({size} bytes, limit {limit})"
            )))
        }
        RequestError::Refused { code } if code == u64::from(STREAM_CODE_BAD_FRAME) => {
            ExchangeError::Refused(ApiError::BadRequest(format!(
                "{}; do this client and the coordinators run the same version?",
                RequestError::Refused { code }
            )))
        }
        error @ (RequestError::Frame(_) | RequestError::Refused { .. }) => {
            ExchangeError::Refused(ApiError::BadRequest(error.to_string()))
        }
        // The coordinator reads no version of the API this client writes (a cluster half
        // upgraded): not carried out, and refused again until one side is upgraded, which the
        // text names.
        RequestError::Version(mismatch) => {
            ExchangeError::Refused(ApiError::Precondition(mismatch.to_string()))
        }
        error => ExchangeError::Lost(error.to_string()),
    }
}

/// What to report when the answer from `address` to `request` could not be read: over the
/// frame limit (as [`ApiError::AnswerTooLarge`], like a coordinator that caught it itself), cut
/// short (a coordinator that could not send it whole: one from before answers over the limit
/// were caught), or undecodable (another version). Never a bad request: the request was sent
/// whole.
pub fn unreadable_answer(address: &str, request: &ApiRequest, error: FrameError) -> ApiError {
    let narrow = how_to_narrow(request);
    match error {
        FrameError::TooLarge { size, limit } => ApiError::AnswerTooLarge {
            size_bytes: size,
            limit_bytes: limit as u64,
            narrow: narrow.to_string(),
        },
        FrameError::Truncated { expected, received } => ApiError::AnswerUnreadable(format!(
            "the answer from {address} was cut short ({received} of {expected} bytes): the \
             coordinator could not send it whole, most likely because it was over the frame \
             limit (its log says); {narrow}"
        )),
        other => ApiError::AnswerUnreadable(format!(
            "the answer from {address} does not decode ({other}); do this client and the \
             coordinators run the same version?"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::api::API_FRAME_BYTES_MAX;

    fn list() -> ApiRequest {
        ApiRequest::list_jobs(0)
    }

    fn refused(error: RequestError) -> ApiError {
        match exchange_error("leader:7401", &list(), error) {
            ExchangeError::Refused(error) => error,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_answer_too_large_or_cut_short_is_not_blamed_on_versions() {
        // Proves that an answer over the frame limit, or one a coordinator cut short (what
        // coordinators did with an answer over the limit), says so and how to narrow the
        // request; only bytes that do not decode ask about versions. None is a bad request:
        // the request was sent whole.
        let too_large = refused(RequestError::Answer(FrameError::TooLarge {
            size: 20_000_000,
            limit: API_FRAME_BYTES_MAX,
        }));
        assert!(
            matches!(
                too_large,
                ApiError::AnswerTooLarge {
                    size_bytes: 20_000_000,
                    ..
                }
            ),
            "{too_large:?}"
        );
        let cut_short = refused(RequestError::Answer(FrameError::Truncated {
            expected: 4,
            received: 0,
        }));
        for text in [too_large.to_string(), cut_short.to_string()] {
            assert!(!text.contains("version"), "{text}");
            assert!(!text.contains("bad request"), "{text}");
            assert!(
                text.contains("--share NAME") && text.contains("--state"),
                "{text}"
            );
        }
        assert!(
            too_large.to_string().contains(&format!(
                "too large (20000000 bytes, limit {API_FRAME_BYTES_MAX})"
            )),
            "{too_large}"
        );
        assert!(cut_short.to_string().contains("cut short"), "{cut_short}");
        let undecodable = refused(RequestError::Answer(FrameError::TrailingBytes {
            trailing: 3,
        }));
        assert!(
            undecodable.to_string().contains("same version"),
            "{undecodable}"
        );
    }

    #[test]
    fn a_coordinator_of_another_api_version_refuses_without_retry_naming_the_side_to_upgrade() {
        // Proves a version refusal is a precondition (not retried, not a bad request) whose
        // text says which side to upgrade.
        let mismatch = quotient_common::version::API_WIRE.mismatch(
            quotient_common::version::Writer::Peer("the peer at 10.0.0.1:7401".into()),
            (9, 9),
        );
        match exchange_error(
            "10.0.0.1:7401",
            &ApiRequest::ListShares,
            RequestError::Version(mismatch),
        ) {
            ExchangeError::Refused(error) => {
                assert_eq!(error.code(), quotient_common::ErrorCode::FailedPrecondition);
                assert!(!error.retryable());
                let text = error.to_string();
                assert!(
                    text.contains("version 9") && text.contains("upgrade this program"),
                    "{text}"
                );
            }
            other => panic!("a version refusal must be refused: {other:?}"),
        }
    }

    #[test]
    fn a_request_refused_for_its_bytes_is_invalid_and_a_broken_stream_is_lost() {
        // Proves a request the coordinator could not take is an InvalidArgument (not sent
        // again), and a deadline or a lost connection may have been carried out.
        let too_large = refused(RequestError::Frame(FrameError::TooLarge {
            size: 20_000_000,
            limit: API_FRAME_BYTES_MAX,
        }));
        assert_eq!(
            too_large.code(),
            quotient_common::ErrorCode::InvalidArgument
        );
        assert!(
            too_large.to_string().contains("too large to send"),
            "{too_large}"
        );
        let timeout = exchange_error(
            "a:1",
            &list(),
            RequestError::Timeout {
                after: Duration::from_millis(5),
            },
        );
        assert!(matches!(timeout, ExchangeError::Lost(_)), "{timeout:?}");
    }
}
