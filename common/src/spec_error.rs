//! The error returned when a share, job or node spec is invalid.
//!
//! Every variant names the field and says what a valid value looks like, because these
//! messages reach the user of the command line unchanged.

use serde::{Deserialize, Serialize};

/// Why a spec was refused. Serializable, because the state machine replicates rejections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum SpecError {
    #[error("invalid {kind} name {name:?}: use 1-{max} characters of A-Z, a-z, 0-9, '_' and '-'")]
    Name {
        kind: String,
        name: String,
        max: u32,
    },
    #[error("invalid GPU class {0:?}: use 1-64 lowercase characters of a-z, 0-9 and '-', e.g. a10g or h100-80gb")]
    GpuClass(String),
    #[error("priority {0} is out of range: use 0-9999 (higher runs first)")]
    Priority(u32),
    #[error("a share needs 1 to 5 GPU class limits, got {0}: give one limit per class")]
    LimitCount(u32),
    #[error("the limit for GPU class {0} must be at least 1 GPU")]
    LimitZero(String),
    #[error("a borrow limit is only allowed with strategy lend-and-borrow (this share is {0}): leave out --borrow-limit, or give --strategy lend-and-borrow with it")]
    BorrowLimitWithoutBorrowing(String),
    #[error("a job needs at least 1 GPU")]
    GpusZero,
    #[error("a job may ask for at most {max} GPUs on one node, got {got}")]
    GpusTooMany { got: u32, max: u32 },
    #[error("a job needs a command or a container image to run")]
    NoPayload,
    #[error("{field} is too long: at most {max} bytes")]
    TooLong { field: String, max: u32 },
    #[error("{field} has too many entries: at most {max}")]
    TooMany { field: String, max: u32 },
    #[error("invalid environment variable name {0:?}: use A-Z, a-z, 0-9 and '_', not starting with a digit")]
    EnvName(String),
    #[error("environment variable {0} is set by Quotient and cannot be overridden")]
    EnvReserved(String),
    #[error("grace period {0} ms is too long: at most 3600000 ms (1 hour)")]
    GracePeriod(u64),
    #[error("unknown signal {0:?}: use a name such as SIGTERM, SIGINT or SIGUSR1")]
    Signal(String),
    #[error("node {node}: {problem}")]
    Inventory { node: String, problem: String },
    #[error("the job's command and environment take {bytes} bytes at launch, over the limit of {max} bytes (each argument and variable counts, plus 9 bytes for its end and pointer, as execve counts them): pass large data through a file, e.g. in the checkpoint dir or on shared storage, and give its path in a variable")]
    LaunchTooLarge { bytes: u64, max: u64 },
    #[error("{0} retries is too many: use 0 to 9 (with the first attempt, at most 10 attempts)")]
    Retries(u32),
    #[error("invalid retry rule {0}")]
    RetryRule(String),
    #[error("{field} {value} is out of range: use {range}")]
    OutOfRange {
        field: String,
        value: String,
        range: String,
    },
    #[error("--same: {0}")]
    Same(String),
    /// Any other field's problem, in words that say what to change (the AWS endpoint's).
    #[error("{0}")]
    Field(String),
}
