//! Why the state machine refused a command: the structured refusal that the core replicates
//! and that reaches a client unchanged, as [`crate::api::ApiError::Rejected`].
//!
//! It lives here rather than in `quotient-core` so that the client API carries it whole: a
//! client decides by [`Rejection::code`] and by the variant (the command line adds its own
//! hints, such as which command enables a share), instead of parsing a sentence. The texts
//! say what is wrong and what must change, in words any front end can show; none names a
//! command-line command or flag.

use serde::{Deserialize, Serialize};

use crate::error_code::ErrorCode;
use crate::{JobId, JobState, SpecError};

/// Why a command was refused. Nothing in the state changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("{0}")]
    Invalid(SpecError),
    #[error("no share named {0}")]
    UnknownShare(String),
    #[error("a share named {0} already exists: pick another name, or update that share")]
    DuplicateShare(String),
    #[error("share {0} is enabled: disable it before deleting it")]
    ShareEnabled(String),
    #[error("share {0} is disabled and refuses new jobs: enable it first")]
    ShareDisabled(String),
    #[error("share {share} has no limit for GPU class {class}: use one of {classes}")]
    UnknownClass {
        share: String,
        class: String,
        classes: String,
    },
    #[error(
        "share {share} has limits for several GPU classes ({classes}): name the class the job \
         needs"
    )]
    ClassRequired { share: String, classes: String },
    #[error("no job {0}")]
    UnknownJob(JobId),
    #[error("job {job} is {state} and can no longer change")]
    JobTerminal { job: JobId, state: JobState },
    #[error("no node named {0}")]
    UnknownNode(String),
    #[error("node {0} is lost: it must register again before its state can change")]
    NodeLost(String),
    #[error("node {node} has no GPU with index {index}")]
    UnknownGpu { node: String, index: u32 },
    #[error("the cluster holds its maximum of {max} {what}")]
    TooMany { what: String, max: u64 },
    #[error("stale report for {job} attempt {attempt} from {node}: {why}")]
    StaleReport {
        job: JobId,
        attempt: u32,
        node: String,
        why: String,
    },
    #[error("stale plan action: {0}")]
    StalePlan(String),
    #[error(
        "node {0} is ready and may be given jobs at any moment: it is removed only once it is \
         cordoned or drained and its agent stopped"
    )]
    NodeReady(String),
    #[error(
        "node {node} still holds {jobs} job(s), {first} first: drain it, and remove it once none \
         of its GPUs is held"
    )]
    NodeHasJobs {
        node: String,
        jobs: u64,
        first: JobId,
    },
    /// The caller may not do this: not a member of the share, not the job's owner.
    #[error("{0}")]
    Forbidden(String),
    #[error("no group named {0}")]
    UnknownGroup(String),
    #[error("a group named {0} already exists: pick another name, or update that group")]
    DuplicateGroup(String),
    /// A share's cap of jobs per user is reached.
    #[error(
        "user {user} already has {jobs} jobs queued or running in share {share}, its limit per user: wait for one to end, or ask an admin to raise it (share update --max-jobs-per-user)"
    )]
    UserJobLimit {
        user: String,
        share: String,
        jobs: u32,
    },
    #[error("{0} is not revoked")]
    NotRevoked(String),
    #[error("{0} finished and was removed from the live state when its retention ended")]
    JobRemoved(JobId),
    #[error("no access key {0}")]
    UnknownAccessKey(String),
    #[error("no {0}")]
    UnknownAwsObject(String),
    /// A share is created under the name of a deleted one whose jobs still hold GPUs while
    /// they stop: they would count against the new share.
    #[error(
        "share {share} was deleted and {jobs} of its job(s), {first} first, still hold GPUs while \
         they stop: create it again once they have exited"
    )]
    ShareStillStopping {
        share: String,
        jobs: u64,
        first: JobId,
    },
}

impl Rejection {
    /// The stable code of this rejection (docs/errors.md).
    pub fn code(&self) -> ErrorCode {
        match self {
            Rejection::Invalid(_)
            | Rejection::UnknownClass { .. }
            | Rejection::ClassRequired { .. } => ErrorCode::InvalidArgument,
            Rejection::UnknownShare(_)
            | Rejection::UnknownJob(_)
            | Rejection::UnknownNode(_)
            | Rejection::UnknownGpu { .. } => ErrorCode::NotFound,
            Rejection::DuplicateShare(_)
            | Rejection::StaleReport { .. }
            | Rejection::StalePlan(_) => ErrorCode::Conflict,
            Rejection::ShareEnabled(_)
            | Rejection::ShareDisabled(_)
            | Rejection::JobTerminal { .. }
            | Rejection::NodeLost(_)
            | Rejection::NodeReady(_)
            | Rejection::NodeHasJobs { .. }
            | Rejection::ShareStillStopping { .. } => ErrorCode::FailedPrecondition,
            Rejection::TooMany { .. } | Rejection::UserJobLimit { .. } => ErrorCode::LimitExceeded,
            Rejection::Forbidden(_) => ErrorCode::Forbidden,
            Rejection::UnknownGroup(_)
            | Rejection::NotRevoked(_)
            | Rejection::JobRemoved(_)
            | Rejection::UnknownAccessKey(_)
            | Rejection::UnknownAwsObject(_) => ErrorCode::NotFound,
            Rejection::DuplicateGroup(_) => ErrorCode::Conflict,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One rejection of every variant, and of a few invalid specs.
    fn every_rejection() -> Vec<Rejection> {
        vec![
            Rejection::Invalid(SpecError::GpusZero),
            Rejection::Invalid(SpecError::LimitCount(0)),
            Rejection::Invalid(SpecError::Priority(10_000)),
            Rejection::Invalid(SpecError::LaunchTooLarge {
                bytes: 2_000_000,
                max: 1_048_576,
            }),
            Rejection::UnknownShare("qs1".into()),
            Rejection::DuplicateShare("qs1".into()),
            Rejection::ShareEnabled("qs1".into()),
            Rejection::ShareDisabled("qs1".into()),
            Rejection::UnknownClass {
                share: "qs1".into(),
                class: "h100".into(),
                classes: "a10g".into(),
            },
            Rejection::ClassRequired {
                share: "qs1".into(),
                classes: "a10g, h100".into(),
            },
            Rejection::UnknownJob(JobId(7)),
            Rejection::JobRemoved(JobId(7)),
            Rejection::JobTerminal {
                job: JobId(7),
                state: JobState::Succeeded,
            },
            Rejection::UnknownNode("node-1".into()),
            Rejection::NodeLost("node-1".into()),
            Rejection::UnknownGpu {
                node: "node-1".into(),
                index: 9,
            },
            Rejection::TooMany {
                what: "shares".into(),
                max: 100,
            },
            Rejection::StaleReport {
                job: JobId(7),
                attempt: 1,
                node: "node-1".into(),
                why: "an older attempt".into(),
            },
            Rejection::StalePlan("place j-7: gone".into()),
            Rejection::NodeReady("node-1".into()),
            Rejection::NodeHasJobs {
                node: "node-1".into(),
                jobs: 1,
                first: JobId(7),
            },
        ]
    }

    #[test]
    fn no_rejection_names_a_command_line_command_or_flag() {
        // Proves the core's refusals read the same through any front end: none names a
        // `quotient` command or a `--flag` (the command line adds those as hints by code).
        for rejection in every_rejection() {
            let text = rejection.to_string();
            assert!(!text.contains("quotient"), "{text}");
            assert!(!text.contains("--"), "{text}");
            assert!(!text.contains('`'), "{text}");
        }
    }

    #[test]
    fn each_rejection_has_the_code_of_what_to_do_about_it() {
        // Proves the mapping a client decides by: unknown names are NotFound, a name taken is
        // a Conflict, a state that must change first is a FailedPrecondition, a bad request
        // is an InvalidArgument and a cluster maximum a LimitExceeded.
        let code_of = |rejection: &Rejection| rejection.code();
        let rejections = every_rejection();
        let codes: Vec<ErrorCode> = rejections.iter().map(code_of).collect();
        assert_eq!(
            codes,
            [
                ErrorCode::InvalidArgument,
                ErrorCode::InvalidArgument,
                ErrorCode::InvalidArgument,
                ErrorCode::InvalidArgument,
                ErrorCode::NotFound,
                ErrorCode::Conflict,
                ErrorCode::FailedPrecondition,
                ErrorCode::FailedPrecondition,
                ErrorCode::InvalidArgument,
                ErrorCode::InvalidArgument,
                ErrorCode::NotFound,
                ErrorCode::NotFound,
                ErrorCode::FailedPrecondition,
                ErrorCode::NotFound,
                ErrorCode::FailedPrecondition,
                ErrorCode::NotFound,
                ErrorCode::LimitExceeded,
                ErrorCode::Conflict,
                ErrorCode::Conflict,
                ErrorCode::FailedPrecondition,
                ErrorCode::FailedPrecondition,
            ]
        );
    }
}
