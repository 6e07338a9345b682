//! Parsers for command-line values that clap does not know: `CLASS=N` limits, `30s`
//! durations, `KEY=VALUE` environment entries, GPU classes, signals and names.
//!
//! They run inside clap (`value_parser = ...`), so a bad value is a usage error (exit 2)
//! caught before any connection is made, with a message that shows a valid value.
//! [`UsageError`] covers the checks that need several arguments at once; `main` exits 2 for it.

use quotient_common::job::{GRACE_PERIOD_MAX_MS, PRIORITY_MAX};
use quotient_common::name::validate_name;
use quotient_common::{GpuClass, Signal};

/// A usage error found after clap parsed the arguments (e.g. a combination of flags, or a
/// spec the shared validation refuses); `main` exits 2 for it, as clap does for its own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Largest number accepted in a duration, before its unit (keeps the millisecond count in u64).
const DURATION_NUMBER_MAX: u64 = 1 << 40;

/// Parses `CLASS=N`, e.g. `a10g=4`.
pub fn parse_limit(text: &str) -> Result<(GpuClass, u32), String> {
    let (class, count) = text
        .split_once('=')
        .ok_or_else(|| format!("invalid limit {text:?}: write CLASS=N, e.g. a10g=4"))?;
    let class = GpuClass::parse(class).map_err(|error| error.to_string())?;
    let count = count.parse::<u32>().map_err(|_| {
        format!("invalid limit {text:?}: N must be a whole number of GPUs, e.g. a10g=4")
    })?;
    if count == 0 {
        return Err(format!(
            "invalid limit {text:?}: a limit must be at least 1 GPU"
        ));
    }
    Ok((class, count))
}

/// Parses a duration with a unit, `500ms`, `30s` or `5m`, into milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let hint =
        || format!("invalid duration {text:?}: write a whole number with ms, s or m, e.g. 30s");
    let (number, unit_ms) = if let Some(number) = text.strip_suffix("ms") {
        (number, 1)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1_000)
    } else if let Some(number) = text.strip_suffix('m') {
        (number, 60_000)
    } else {
        return Err(hint());
    };
    if number.is_empty() || !number.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(hint());
    }
    let number: u64 = number.parse().map_err(|_| hint())?;
    if number > DURATION_NUMBER_MAX {
        return Err(hint());
    }
    Ok(number * unit_ms)
}

/// Parses a grace period: a duration of at most an hour.
pub fn parse_grace_period_ms(text: &str) -> Result<u64, String> {
    let ms = parse_duration_ms(text)?;
    if ms > GRACE_PERIOD_MAX_MS {
        return Err(format!(
            "grace period {text} is too long: at most {}m",
            GRACE_PERIOD_MAX_MS / 60_000
        ));
    }
    Ok(ms)
}

/// Parses `KEY=VALUE`; the value may contain `=`.
pub fn parse_env(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("invalid environment entry {text:?}: write KEY=VALUE"))?;
    if key.is_empty() {
        return Err(format!(
            "invalid environment entry {text:?}: the KEY before '=' is empty"
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

/// Parses a priority, 0-9999.
pub fn parse_priority(text: &str) -> Result<u32, String> {
    let priority = text
        .parse::<u32>()
        .map_err(|_| format!("invalid priority {text:?}: use a whole number 0-{PRIORITY_MAX}"))?;
    if priority > PRIORITY_MAX {
        return Err(format!(
            "priority {priority} is out of range: use 0-{PRIORITY_MAX} (higher runs first)"
        ));
    }
    Ok(priority)
}

/// Parses a GPU class name such as `a10g`.
pub fn parse_gpu_class(text: &str) -> Result<GpuClass, String> {
    GpuClass::parse(text).map_err(|error| error.to_string())
}

/// Parses a checkpoint signal: `SIGTERM`, `TERM` or `term`.
pub fn parse_signal(text: &str) -> Result<Signal, String> {
    Signal::parse(text).map_err(|error| error.to_string())
}

/// Parses a share name.
pub fn parse_share_name(text: &str) -> Result<String, String> {
    validate_name("share", text)
        .map(|()| text.to_string())
        .map_err(|error| error.to_string())
}

/// Parses a job name.
pub fn parse_job_name(text: &str) -> Result<String, String> {
    validate_name("job", text)
        .map(|()| text.to_string())
        .map_err(|error| error.to_string())
}

/// Parses a node name.
pub fn parse_node_name(text: &str) -> Result<String, String> {
    validate_name("node", text)
        .map(|()| text.to_string())
        .map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_ms_s_and_m() {
        // Proves the three units and that a bare number or a fraction is refused.
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
        for bad in [
            "30",
            "1.5s",
            "s",
            "-1s",
            "10h",
            "",
            " 3s",
            "99999999999999999999s",
        ] {
            let error = parse_duration_ms(bad).unwrap_err();
            assert!(error.contains("e.g. 30s"), "{bad}: {error}");
        }
        assert!(parse_grace_period_ms("60m").is_ok());
        assert!(parse_grace_period_ms("61m")
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn limits_are_class_equals_count() {
        // Proves CLASS=N parses and every malformed form says how to write it.
        let (class, count) = parse_limit("a10g=4").unwrap();
        assert_eq!((class.as_str(), count), ("a10g", 4));
        assert!(parse_limit("a10g").unwrap_err().contains("CLASS=N"));
        assert!(parse_limit("a10g=x").unwrap_err().contains("whole number"));
        assert!(parse_limit("a10g=-1").unwrap_err().contains("whole number"));
        assert!(parse_limit("a10g=0").unwrap_err().contains("at least 1"));
        assert!(parse_limit("A 10=1").unwrap_err().contains("GPU class"));
    }

    #[test]
    fn priorities_env_and_signals_are_checked_locally() {
        // Proves the cheap checks happen before any request is sent.
        assert_eq!(parse_priority("9999"), Ok(9_999));
        assert!(parse_priority("10000").unwrap_err().contains("0-9999"));
        assert!(parse_priority("-1").is_err());
        assert_eq!(parse_env("A=b=c"), Ok(("A".to_string(), "b=c".to_string())));
        assert!(parse_env("A").is_err());
        assert!(parse_env("=x").is_err());
        assert_eq!(parse_signal("usr1"), Ok(Signal::Sigusr1));
        assert!(parse_signal("SIGKILL").is_err());
    }
}
