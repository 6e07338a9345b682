//! The bounds of the coordinators' retention of finished jobs, shared with the command line
//! so that `quotient dev up --retain-finished` refuses what its coordinators would refuse to
//! start with (docs/retention.md).

/// The shortest retention of finished jobs allowed: a second.
pub const RETAIN_FINISHED_MIN_MS: u64 = 1_000;
/// Default time the job history keeps a record: a year and a month, for a year's reports.
/// Finished jobs may not stay in the live state longer than the history keeps them.
pub const RETAIN_HISTORY_DEFAULT_MS: u64 = 400 * 86_400_000;

/// Whether `ms` is a retention of finished jobs that coordinators with the default history
/// retention accept; the reason, worded for a user, if not.
pub fn check_retain_finished_ms(ms: u64) -> Result<(), String> {
    if ms < RETAIN_FINISHED_MIN_MS {
        return Err(format!(
            "finished jobs must stay at least {} s (a finished job must stay long enough to be seen), not {ms} ms",
            RETAIN_FINISHED_MIN_MS / 1_000
        ));
    }
    if ms > RETAIN_HISTORY_DEFAULT_MS {
        return Err(format!(
            "finished jobs may stay at most {} days, as long as the job history keeps them, not {ms} ms",
            RETAIN_HISTORY_DEFAULT_MS / 86_400_000
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_to_the_history_retention_is_accepted() {
        assert!(check_retain_finished_ms(0)
            .unwrap_err()
            .contains("at least 1 s"));
        assert!(check_retain_finished_ms(999).is_err());
        assert_eq!(check_retain_finished_ms(1_000), Ok(()));
        assert_eq!(check_retain_finished_ms(RETAIN_HISTORY_DEFAULT_MS), Ok(()));
        assert!(check_retain_finished_ms(RETAIN_HISTORY_DEFAULT_MS + 1)
            .unwrap_err()
            .contains("at most 400 days"));
    }
}
