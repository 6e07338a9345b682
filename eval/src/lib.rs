//! A trace-driven evaluation of Quotient's scheduling decisions: a workload trace replayed on
//! a fleet and a quota design in virtual time, over the real state machine and scheduler
//! (`quotient-core`), with the figures an admin weighs a design by: utilisation, queueing
//! delay per share, GPU-hours own, borrowed and lent, reclaim latency, preemptions and the
//! work they lost. `quotient what-if` runs it on an admin's own files; docs/what-if.md says
//! what every figure means.
//!
//! # Layout
//! - [`trace`]: the trace format (`jobs.jsonl`) and its reading.
//! - [`design`]: the shares (`shares.toml`) and the fleet (`fleet.toml`).
//! - [`generate`]: synthetic traces shaped on published GPU-cluster studies, from a seed.
//! - [`engine`]: the replay, and the policies it compares.
//! - [`report`]: the figures, as JSON and as tables.

use std::path::Path;

use quotient_common::bounded_read::read_text_at_most;

pub mod design;
pub mod engine;
pub mod generate;
pub mod report;
pub mod trace;

pub use design::{read_design, Design};
pub use engine::{evaluate, Options, Policy};
pub use quotient_core::BorrowOrder;
pub use report::{Comparison, RunReport};
pub use trace::{read_trace, Job, TraceJob};

/// Why an evaluation could not run, worded to say what to fix.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    // `error`, not `source`: the message already says it, and a chain printed whole would
    // say it twice.
    #[error("cannot read {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path} is larger than {max} bytes; give a smaller file")]
    TooLarge { path: String, max: u64 },
    #[error("{path}, line {line}: {message}")]
    Trace {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Design { path: String, message: String },
    #[error("the trace's job on line {line} was refused: {message}; make the trace and the shares file agree")]
    Job { line: usize, message: String },
    #[error("the state machine refused {what}: {why} (a bug in the evaluation; please report it)")]
    Refused { what: String, why: String },
    #[error("an invariant broke: {0} (a bug; please report it)")]
    Invariant(String),
}

/// Reads a whole file of at most `max` bytes, checked before reading, and at most that many
/// read whatever the file grows to meanwhile. A byte-order mark at its start (some Windows
/// editors write one) is dropped, so that the first line parses like the others.
pub fn read_limited(path: &Path, max: u64) -> Result<String, EvalError> {
    let io = |error| EvalError::Io {
        path: path.display().to_string(),
        error,
    };
    let too_large = || EvalError::TooLarge {
        path: path.display().to_string(),
        max,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() > max {
        return Err(too_large());
    }
    let mut text = read_text_at_most(file, max)
        .map_err(io)?
        .ok_or_else(too_large)?;
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    Ok(text)
}
