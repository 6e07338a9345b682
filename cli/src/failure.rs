//! How a failed command reports itself: every error the command line prints carries a stable
//! code (docs/errors.md), in text as `error[CODE]: message` and with `-o json` as one JSON
//! document on stderr, `{"error": {"code", "message", "retryable"}}`.
//!
//! The exit status keeps the command line's contract: 2 for a usage error (code
//! `InvalidArgument`, found before anything is sent), 1 for every other failure, whatever its
//! code. Distinct statuses per code were rejected: the contract promises 1 for any failed
//! request, and scripts that test for it would break. The code is what a script reads to tell
//! a missing job from a cluster without a leader.
//!
//! A coordinator's refusal keeps its code through `anyhow` as a [`RequestFailed`] in the
//! error's chain; a [`UsageError`] is `InvalidArgument`; anything else failed on this machine
//! (`Local`: the config, a certificate, a file, a process).

use quotient_common::ErrorCode;
use serde::Serialize;

use crate::output::OutputFormat;
use crate::parse::UsageError;

/// Exit status of a command that was understood but failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit status of a usage error (clap uses the same for its own).
pub const EXIT_USAGE: u8 = 2;

/// A request the cluster refused or could not serve, with its code; `message` says what
/// happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestFailed {
    pub code: ErrorCode,
    pub retryable: bool,
    pub message: String,
}

impl RequestFailed {
    /// A failure with `code` that a retry does not help, as an `anyhow` error.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(RequestFailed {
            code,
            retryable: false,
            message: message.into(),
        })
    }

    /// Whether `error` is a request that failed with `code`.
    pub fn has_code(error: &anyhow::Error, code: ErrorCode) -> bool {
        error
            .downcast_ref::<RequestFailed>()
            .is_some_and(|failed| failed.code == code)
    }
}

/// What a failed command prints and how it exits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
    #[serde(skip)]
    pub exit_status: u8,
}

impl Failure {
    /// Sorts `error` by its code; the message is its whole cause chain.
    pub fn of(error: &anyhow::Error) -> Failure {
        let message = format!("{error:#}");
        if error.chain().any(|cause| cause.is::<UsageError>()) {
            return Failure::usage(message);
        }
        match error
            .chain()
            .find_map(|cause| cause.downcast_ref::<RequestFailed>())
        {
            Some(failed) => Failure {
                code: failed.code,
                message,
                retryable: failed.retryable,
                exit_status: EXIT_FAILED,
            },
            None => Failure {
                code: ErrorCode::Local,
                message,
                retryable: false,
                exit_status: EXIT_FAILED,
            },
        }
    }

    /// A usage error: `InvalidArgument`, exit status 2.
    pub fn usage(message: String) -> Failure {
        Failure {
            code: ErrorCode::InvalidArgument,
            message,
            retryable: false,
            exit_status: EXIT_USAGE,
        }
    }

    /// What goes to stderr in `format`: `error[CODE]: message`, or one JSON document.
    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Table | OutputFormat::Csv => {
                format!("error[{}]: {}\n", self.code, self.message)
            }
            OutputFormat::Json => {
                let document = serde_json::json!({ "error": self });
                format!("{document}\n")
            }
        }
    }
}

/// The output format the raw arguments ask for, read without clap (for clap's own errors):
/// `-o json`, `-ojson`, `--output json` or `--output=json` before a `--`.
pub fn format_in_arguments(arguments: &[String]) -> OutputFormat {
    let mut words = arguments.iter().take_while(|word| *word != "--");
    while let Some(word) = words.next() {
        let value = match word.as_str() {
            "-o" | "--output" => words.next().map(String::as_str),
            other => other
                .strip_prefix("--output=")
                .or_else(|| other.strip_prefix("-o")),
        };
        if value == Some("json") {
            return OutputFormat::Json;
        }
    }
    OutputFormat::Table
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn every_failure_prints_its_code_in_text_and_in_json() {
        // Proves the two shapes on stderr: `error[CODE]: message` and one JSON document with
        // the code, the message and whether a retry helps.
        let failure = Failure::of(&RequestFailed::error(
            ErrorCode::NotFound,
            "no job j-9; `quotient job list` shows the jobs",
        ));
        assert_eq!(
            failure.render(OutputFormat::Table),
            "error[NotFound]: no job j-9; `quotient job list` shows the jobs\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(&failure.render(OutputFormat::Json)).expect("one JSON document");
        assert_eq!(
            json,
            serde_json::json!({"error": {
                "code": "NotFound",
                "message": "no job j-9; `quotient job list` shows the jobs",
                "retryable": false,
            }})
        );
        assert_eq!(failure.exit_status, EXIT_FAILED);
    }

    #[test]
    fn the_code_survives_context_and_local_and_usage_errors_have_theirs() {
        // Proves a request's code is found under context a command adds, a usage error is
        // InvalidArgument with exit status 2, and any other error is Local with 1.
        let wrapped = Err::<(), _>(RequestFailed::error(ErrorCode::Unavailable, "no leader"))
            .context("the member was added, but reading the cluster status failed")
            .unwrap_err();
        let failure = Failure::of(&wrapped);
        assert_eq!(failure.code, ErrorCode::Unavailable);
        assert!(
            failure.message.ends_with(": no leader"),
            "{}",
            failure.message
        );

        let usage = Failure::of(&anyhow::Error::new(UsageError("pass --gpus".into())));
        assert_eq!(
            (usage.code, usage.exit_status),
            (ErrorCode::InvalidArgument, EXIT_USAGE)
        );
        let local = Failure::of(&anyhow::anyhow!("cannot read /nowhere"));
        assert_eq!(
            (local.code, local.exit_status),
            (ErrorCode::Local, EXIT_FAILED)
        );
    }

    #[test]
    fn json_output_is_found_in_raw_arguments_but_not_in_a_jobs_command() {
        // Proves clap's own errors are printed as JSON when `-o json` was asked for, in each
        // of its spellings, and not when `-o json` belongs to the job's command after `--`.
        let words = |text: &str| -> Vec<String> { text.split(' ').map(str::to_string).collect() };
        for asked in [
            "job list -o json --bad",
            "job list -ojson",
            "job list --output json",
            "--output=json job list",
        ] {
            assert_eq!(
                format_in_arguments(&words(asked)),
                OutputFormat::Json,
                "{asked}"
            );
        }
        for not_asked in [
            "job list",
            "job submit --bad -- tool -o json",
            "job list -o table",
        ] {
            assert_eq!(
                format_in_arguments(&words(not_asked)),
                OutputFormat::Table,
                "{not_asked}"
            );
        }
    }
}
