//! A job's retry strategy: how many times a failed attempt is tried again, and rules on its
//! exit code or reason that decide whether a given failure is retried (AWS Batch's
//! `retryStrategy` with `evaluateOnExit`). See docs/quota-shares.md ("Retries").
//!
//! A failure is an attempt that ended on its own with a non-zero exit code, that reached its
//! time limit, or that could not be launched for a fault of the job. Preemptions, node loss,
//! drains and launch failures of the node's making are not failures of the job: they send it
//! back to the queue without using a retry.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::SpecError;

/// The most retries a job may ask for: with its first attempt, ten attempts, as AWS Batch.
pub const RETRIES_MAX: u32 = 9;
/// The most rules a retry strategy may hold.
pub const RETRY_RULES_MAX: usize = 5;
/// The longest pattern of a rule.
pub const RETRY_PATTERN_BYTES_MAX: usize = 512;

/// What a matching rule does with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RetryAction {
    /// Try again, if retries are left.
    Retry,
    /// End the job FAILED, whatever retries are left.
    Exit,
}

impl RetryAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RetryAction::Retry => "retry",
            RetryAction::Exit => "exit",
        }
    }
}

/// One rule: when every pattern it has matches the failed attempt, `action` decides.
/// A pattern matches exactly, or, ending in `*`, matches every text that starts with what
/// comes before the `*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryRule {
    /// Matched against the exit code in decimal (`137`, `1*`); an attempt without an exit
    /// code (never launched, or killed at its time limit) matches only `*`.
    pub on_exit_code: Option<String>,
    /// Matched against the attempt's reason, e.g. `exited with code 3`, `time limit`,
    /// `launch failed*`.
    pub on_reason: Option<String>,
    pub action: RetryAction,
}

/// How a job's failed attempts are retried. The default retries nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts after the first that a failure may start, 0 to [`RETRIES_MAX`].
    pub retries: u32,
    /// Checked in order; the first that matches decides. When none matches (or there are
    /// none) a failure is retried while retries are left.
    pub rules: Vec<RetryRule>,
}

impl RetryPolicy {
    /// Checks the counts and patterns.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.retries > RETRIES_MAX {
            return Err(SpecError::Retries(self.retries));
        }
        if self.rules.len() > RETRY_RULES_MAX {
            return Err(SpecError::TooMany {
                field: "retry rules".into(),
                max: RETRY_RULES_MAX as u32,
            });
        }
        for rule in &self.rules {
            rule.validate()?;
        }
        Ok(())
    }

    /// Whether a failed attempt (`exit_code`, `reason`) is retried, given `used` retries so
    /// far.
    pub fn retries_failure(&self, used: u32, exit_code: Option<i32>, reason: &str) -> bool {
        if used >= self.retries {
            return false;
        }
        self.rules
            .iter()
            .find(|rule| rule.matches(exit_code, reason))
            .is_none_or(|rule| rule.action == RetryAction::Retry)
    }
}

impl RetryRule {
    fn validate(&self) -> Result<(), SpecError> {
        if self.on_exit_code.is_none() && self.on_reason.is_none() {
            return Err(SpecError::RetryRule(
                "a rule needs an exit code or a reason pattern".into(),
            ));
        }
        if let Some(code) = &self.on_exit_code {
            let digits = code.strip_suffix('*').unwrap_or(code);
            let digits = digits.strip_prefix('-').unwrap_or(digits);
            let valid = code.len() <= 12
                && digits.bytes().all(|b| b.is_ascii_digit())
                && (code.ends_with('*') || !digits.is_empty());
            if !valid {
                return Err(SpecError::RetryRule(format!(
                    "exit code pattern {code:?} is not a number, a number's first digits followed by '*', or '*'"
                )));
            }
        }
        if let Some(reason) = &self.on_reason {
            if reason.is_empty() || reason.len() > RETRY_PATTERN_BYTES_MAX {
                return Err(SpecError::RetryRule(format!(
                    "a reason pattern needs 1 to {RETRY_PATTERN_BYTES_MAX} bytes"
                )));
            }
            if reason.chars().any(char::is_control) {
                return Err(SpecError::RetryRule(
                    "a reason pattern may not contain control characters".into(),
                ));
            }
        }
        Ok(())
    }

    /// Whether every pattern of the rule matches.
    pub fn matches(&self, exit_code: Option<i32>, reason: &str) -> bool {
        let code_matches = match (&self.on_exit_code, exit_code) {
            (None, _) => true,
            (Some(pattern), Some(code)) => pattern_matches(pattern, &code.to_string()),
            (Some(pattern), None) => pattern == "*",
        };
        let reason_matches = self
            .on_reason
            .as_ref()
            .is_none_or(|pattern| pattern_matches(pattern, reason));
        code_matches && reason_matches
    }

    /// Parses `retry:exit-code=137`, `exit:reason=time limit`, or both conditions joined by
    /// `,` (`retry:exit-code=1*,reason=exited*`): the form of `job submit --retry-on`.
    pub fn parse(text: &str) -> Result<RetryRule, SpecError> {
        let bad = |why: &str| SpecError::RetryRule(format!("{text:?}: {why}"));
        let (action, conditions) = text
            .split_once(':')
            .ok_or_else(|| bad("write ACTION:CONDITION, e.g. retry:exit-code=137"))?;
        let action = match action.trim() {
            "retry" => RetryAction::Retry,
            "exit" => RetryAction::Exit,
            _ => return Err(bad("the action is retry or exit")),
        };
        let mut rule = RetryRule {
            on_exit_code: None,
            on_reason: None,
            action,
        };
        for condition in conditions.split(',') {
            match condition.split_once('=') {
                Some(("exit-code", pattern)) => rule.on_exit_code = Some(pattern.trim().into()),
                Some(("reason", pattern)) => rule.on_reason = Some(pattern.into()),
                _ => return Err(bad("a condition is exit-code=PATTERN or reason=PATTERN")),
            }
        }
        rule.validate()?;
        Ok(rule)
    }
}

impl fmt::Display for RetryRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.action.as_str())?;
        let mut parts = Vec::new();
        if let Some(code) = &self.on_exit_code {
            parts.push(format!("exit-code={code}"));
        }
        if let Some(reason) = &self.on_reason {
            parts.push(format!("reason={reason}"));
        }
        f.write_str(&parts.join(","))
    }
}

fn pattern_matches(pattern: &str, text: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => text.starts_with(prefix),
        None => pattern == text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(retries: u32, rules: &[&str]) -> RetryPolicy {
        RetryPolicy {
            retries,
            rules: rules
                .iter()
                .map(|r| RetryRule::parse(r).expect("a rule"))
                .collect(),
        }
    }

    #[test]
    fn without_rules_every_failure_is_retried_while_retries_are_left() {
        // Proves the count is the only limit when no rule is given.
        let p = policy(2, &[]);
        assert!(p.retries_failure(0, Some(1), "exited with code 1"));
        assert!(p.retries_failure(1, None, "time limit"));
        assert!(!p.retries_failure(2, Some(1), "exited with code 1"));
        assert!(!RetryPolicy::default().retries_failure(0, Some(1), "x"));
    }

    #[test]
    fn the_first_matching_rule_decides_and_no_match_retries() {
        // Proves rules are checked in order, prefix patterns match, and exit stops retries.
        let p = policy(
            3,
            &[
                "exit:exit-code=2",
                "retry:exit-code=1*",
                "exit:reason=time*",
            ],
        );
        assert!(!p.retries_failure(0, Some(2), "exited with code 2"));
        assert!(p.retries_failure(0, Some(137), "exited with code 137"));
        assert!(!p.retries_failure(0, None, "time limit"));
        assert!(
            p.retries_failure(0, Some(42), "exited with code 42"),
            "no rule matches"
        );
        let both = policy(1, &["exit:exit-code=*,reason=launch failed*"]);
        assert!(!both.retries_failure(0, None, "launch failed on node n: x"));
        assert!(both.retries_failure(0, Some(1), "exited with code 1"));
    }

    #[test]
    fn bad_rules_and_counts_are_refused_with_the_form_to_use() {
        // Proves validation refuses what could never match or is out of range.
        for bad in [
            "retry",
            "again:exit-code=1",
            "retry:exit-code=abc",
            "retry:exit-code=",
            "retry:color=red",
        ] {
            let error = RetryRule::parse(bad).unwrap_err().to_string();
            assert!(
                error.contains(bad) || error.contains("pattern"),
                "{bad}: {error}"
            );
        }
        assert!(policy(RETRIES_MAX + 1, &[]).validate().is_err());
        let too_many = policy(1, &["retry:exit-code=1"; RETRY_RULES_MAX + 1]);
        assert!(too_many.validate().is_err());
        assert_eq!(
            RetryRule::parse("retry:exit-code=1*,reason=exited*")
                .unwrap()
                .to_string(),
            "retry:exit-code=1*,reason=exited*"
        );
    }
}
