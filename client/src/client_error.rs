//! Why a call failed, with the stable code of each case ([`ClientError::code`]).
//!
//! Either a coordinator answered with an error ([`ClientError::Api`], its code its own), or no
//! answer came: no coordinator reachable, none able to serve before the deadline, or a write
//! whose answer was lost. The texts say what happened and what to check, in words any front
//! end can show; the command line adds which of its commands helps.

use quotient_common::api::ApiError;
use quotient_common::tls::TlsError;
use quotient_common::ErrorCode;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A coordinator answered with an error (other than a redirect, which the client follows).
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("cannot load the client's certificate: {0}")]
    Tls(#[from] TlsError),
    /// No coordinator answered a handshake, tried all at once: the cluster is down, or the
    /// addresses are wrong. Only a client that fails fast ([`crate::RetryPolicy`]) and never
    /// reached the cluster gives up this soon, and a call to one coordinator alone.
    #[error("cannot reach any coordinator ({tried}); is the cluster running, and are these its addresses?")]
    Unreachable { tried: String },
    /// No coordinator could serve before the deadline (no leader elected, no quorum); nothing
    /// was done.
    #[error("no coordinator could serve this within {after_ms} ms ({last}); is a quorum of coordinators up?")]
    Unavailable { after_ms: u64, last: String },
    /// A write was sent but its answer was lost: it may or may not have been applied.
    #[error("the answer to a write was lost ({0}); it may or may not have been applied: check before retrying")]
    Uncertain(String),
    #[error("no coordinator addresses given")]
    NoAddresses,
}

impl ClientError {
    /// The stable code of this failure (docs/errors.md).
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Api(error) => error.code(),
            ClientError::Tls(_) | ClientError::NoAddresses => ErrorCode::Local,
            ClientError::Unreachable { .. } | ClientError::Unavailable { .. } => {
                ErrorCode::Unavailable
            }
            ClientError::Uncertain(_) => ErrorCode::Uncertain,
        }
    }

    /// Whether the same call, made again later with nothing changed, can succeed: a cluster
    /// that could not serve may have elected a leader by then.
    pub fn retryable(&self) -> bool {
        match self {
            ClientError::Api(error) => error.retryable(),
            ClientError::Unreachable { .. } | ClientError::Unavailable { .. } => true,
            ClientError::Tls(_) | ClientError::Uncertain(_) | ClientError::NoAddresses => false,
        }
    }
}
