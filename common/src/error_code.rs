//! The stable, machine-readable code of every error a client of Quotient can get.
//!
//! A coordinator's answer ([`crate::api::ApiError`]), a state-machine rejection
//! ([`crate::rejection::Rejection`]) and the client library's own failures (no coordinator
//! reachable, an answer lost) each map to one [`ErrorCode`], so that a program decides what to
//! do from the code and a person reads the message. The codes are part of the command line's
//! contract (`error[CODE]: ...`, and `{"error": {"code": ...}}` with `-o json`) and will be the
//! status of an HTTP door, so a code is never renamed or removed; new ones are added at the
//! end. docs/errors.md lists them with what to do about each.

use serde::{Deserialize, Serialize};

/// What kind of failure an error is, and so what its caller should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request is malformed or inconsistent with itself (a bad spec, a GPU class the
    /// share has no limit for). Fix the request; sending it again fails the same way.
    InvalidArgument,
    /// What the request names (a share, job, node, member, attempt) does not exist.
    NotFound,
    /// The request clashes with what exists: a share by that name, or (between the leader
    /// and agents) a report or plan made stale by a newer change.
    Conflict,
    /// The state does not allow it now, and something must change first (disable the share,
    /// cordon the node, stop its agent); the message says what.
    FailedPrecondition,
    /// A declared limit was reached: the cluster's maximum of shares, jobs or nodes, or an
    /// answer over the frame limit (narrow the request).
    LimitExceeded,
    /// The caller's certificate does not carry a role allowed to do this.
    Forbidden,
    /// The coordinator asked is not the leader; the client follows it to the leader, so a
    /// person only sees it when that keeps failing.
    NotLeader,
    /// The cluster (or the part of it the request needs) cannot serve now: no leader, no
    /// quorum, an agent not connected. Nothing was done; the same request may succeed later.
    Unavailable,
    /// A write was sent but its answer was lost or its deadline passed: it may or may not
    /// have been applied. Check the state before sending it again, unless it is idempotent
    /// (a submit with an idempotency key).
    Uncertain,
    /// A bug, or a coordinator that cannot go on (its Raft stopped on a storage error): not
    /// helped by a retry; the coordinator's log says more.
    Internal,
    /// This machine, not the cluster: the client config, a certificate or a local file could
    /// not be read, or a local process failed. Only the command line reports it; a
    /// coordinator never answers with it.
    Local,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::FailedPrecondition,
        ErrorCode::LimitExceeded,
        ErrorCode::Forbidden,
        ErrorCode::NotLeader,
        ErrorCode::Unavailable,
        ErrorCode::Uncertain,
        ErrorCode::Internal,
        ErrorCode::Local,
    ];

    /// The code as the command line prints it (its variant's name).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "InvalidArgument",
            ErrorCode::NotFound => "NotFound",
            ErrorCode::Conflict => "Conflict",
            ErrorCode::FailedPrecondition => "FailedPrecondition",
            ErrorCode::LimitExceeded => "LimitExceeded",
            ErrorCode::Forbidden => "Forbidden",
            ErrorCode::NotLeader => "NotLeader",
            ErrorCode::Unavailable => "Unavailable",
            ErrorCode::Uncertain => "Uncertain",
            ErrorCode::Internal => "Internal",
            ErrorCode::Local => "Local",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_prints_as_its_name_in_text_and_json() {
        // Proves the printed code, its JSON string and its variant name agree for every code,
        // so that scripts can match either output on the names docs/errors.md lists.
        for code in ErrorCode::ALL {
            assert_eq!(format!("{code:?}"), code.as_str());
            assert_eq!(code.to_string(), code.as_str());
            assert_eq!(
                serde_json::to_string(&code).expect("encodes"),
                format!("\"{}\"", code.as_str())
            );
        }
    }
}
