//! Parsers for command-line values that clap does not know: `CLASS=N` limits, `30s`
//! durations, `KEY=VALUE` environment entries, GPU classes, signals and names.
//!
//! They run inside clap (`value_parser = ...`), so a bad value is a usage error (exit 2)
//! caught before any connection is made, with a message that shows a valid value.
//! [`UsageError`] covers the checks that need several arguments at once; `main` exits 2 for it.

use quotient_common::job::{
    CPU_MILLIS_MAX, CPU_MILLIS_MIN, GRACE_PERIOD_MAX_MS, MEMORY_BYTES_MAX, MEMORY_BYTES_MIN,
    PRIORITY_MAX, TIME_LIMIT_MS_MAX, TIME_LIMIT_MS_MIN,
};
use quotient_common::name::validate_name;
use quotient_common::share::{BORROW_LIMIT_PERCENT_MAX, SHARE_LIMIT_GPUS_MAX};
use quotient_common::{GpuClass, RetryRule, Signal, GPUS_PER_NODE_MAX};

/// A usage error found after clap parsed the arguments (e.g. a combination of flags, or a
/// spec the shared validation refuses); `main` exits 2 for it, as clap does for its own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

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
    // Checked here, in GPUs: the state machine's own refusal words it as a length, and its
    // words are part of the replicated audit log, so they stay.
    if count > SHARE_LIMIT_GPUS_MAX {
        return Err(format!(
            "invalid limit {text:?}: a limit is at most {SHARE_LIMIT_GPUS_MAX} GPUs"
        ));
    }
    Ok((class, count))
}

pub use quotient_common::duration::parse_duration_ms;

/// `--max-jobs-per-user`: a number, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub Option<u32>);

/// Parses `--max-jobs-per-user`: 1 or more jobs, or `none`.
pub fn parse_cap(text: &str) -> Result<Cap, String> {
    if text == "none" {
        return Ok(Cap(None));
    }
    match text.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(Cap(Some(n))),
        _ => Err(format!(
            "invalid cap {text:?}: use a number of jobs, 1 or more, or none"
        )),
    }
}

/// `--borrow-limit`: a percentage, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BorrowLimit(pub Option<u32>);

/// Parses `--borrow-limit`: a percentage, or `none` (no cap).
pub fn parse_borrow_limit(text: &str) -> Result<BorrowLimit, String> {
    if text == "none" {
        return Ok(BorrowLimit(None));
    }
    match text.parse::<u32>() {
        Ok(percent) if percent <= BORROW_LIMIT_PERCENT_MAX => Ok(BorrowLimit(Some(percent))),
        _ => Err(format!(
            "invalid borrow limit {text:?}: use a percentage 0-{BORROW_LIMIT_PERCENT_MAX}, or none"
        )),
    }
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

/// Parses a time limit: a duration from 1s to 365d.
pub fn parse_time_limit_ms(text: &str) -> Result<u64, String> {
    let ms = parse_duration_ms(text)?;
    if !(TIME_LIMIT_MS_MIN..=TIME_LIMIT_MS_MAX).contains(&ms) {
        return Err(format!("time limit {text} is out of range: use 1s to 365d"));
    }
    Ok(ms)
}

/// Parses a CPU count, `4` or `0.5` (at most three decimals), into thousandths of a CPU.
pub fn parse_cpus(text: &str) -> Result<u32, String> {
    let hint =
        || format!("invalid CPU count {text:?}: write a number such as 4 or 0.5 (0.01 to 1024)");
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > 3
        || whole.len() > 5
    {
        return Err(hint());
    }
    let whole: u32 = whole.parse().map_err(|_| hint())?;
    let fraction: u32 = format!("{fraction:0<3}").parse().map_err(|_| hint())?;
    let millis = whole * 1000 + fraction;
    if !(CPU_MILLIS_MIN..=CPU_MILLIS_MAX).contains(&millis) {
        return Err(hint());
    }
    Ok(millis)
}

/// Parses an amount of memory, `512Mi`, `16G`, `16GiB` or bytes, into bytes (K, M, G and T
/// are powers of 1024, as in Docker and Slurm).
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let hint = || {
        format!("invalid memory {text:?}: write a whole number with K, M, G or T, e.g. 16G or 512Mi (8Mi to 64Ti)")
    };
    let trimmed = text.trim_end_matches('B').trim_end_matches('i');
    let (number, shift) = match trimmed.char_indices().last() {
        Some((i, 'K' | 'k')) => (&trimmed[..i], 10),
        Some((i, 'M' | 'm')) => (&trimmed[..i], 20),
        Some((i, 'G' | 'g')) => (&trimmed[..i], 30),
        Some((i, 'T' | 't')) => (&trimmed[..i], 40),
        _ if trimmed.len() == text.len() => (trimmed, 0),
        _ => return Err(hint()),
    };
    if number.is_empty() || number.len() > 15 || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(hint());
    }
    let bytes = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(hint)?;
    if !(MEMORY_BYTES_MIN..=MEMORY_BYTES_MAX).contains(&bytes) {
        return Err(hint());
    }
    Ok(bytes)
}

/// Parses a retry rule, `retry:exit-code=137` or `exit:reason=time limit`
/// (`quotient_common::RetryRule::parse`).
pub fn parse_retry_rule(text: &str) -> Result<RetryRule, String> {
    RetryRule::parse(text).map_err(|error| error.to_string())
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

/// Parses a priority, 0-9999. A negative one is read as a number (the flag takes
/// `allow_negative_numbers`), so it gets this message rather than clap's "unexpected argument".
pub fn parse_priority(text: &str) -> Result<u32, String> {
    let out_of_range = || {
        format!(
            "priority {text} is out of range: priorities are 0 to {PRIORITY_MAX}, and higher \
             runs first"
        )
    };
    if text.parse::<i64>().is_ok_and(|number| number < 0) {
        return Err(out_of_range());
    }
    let priority = text.parse::<u32>().map_err(|_| {
        format!(
            "invalid priority {text:?}: priorities are whole numbers 0 to {PRIORITY_MAX}, and \
             higher runs first"
        )
    })?;
    if priority > PRIORITY_MAX {
        return Err(out_of_range());
    }
    Ok(priority)
}

/// Parses the GPUs a job needs: 1 to the most a node may have (all of a job's GPUs are on
/// one node).
pub fn parse_job_gpus(text: &str) -> Result<u32, String> {
    let range =
        format!("a job needs 1 to {GPUS_PER_NODE_MAX} GPUs on a node (several nodes: --nodes)");
    match text.parse::<i64>() {
        Ok(number) if number < 1 => Err(format!("{number} GPUs: {range}")),
        Ok(number) if number as u64 > GPUS_PER_NODE_MAX as u64 => {
            Err(format!("{number} GPUs is too many: {range}"))
        }
        Ok(number) => Ok(number as u32),
        Err(_) => Err(format!(
            "invalid GPU count {text:?}: {range}, e.g. --gpus 2"
        )),
    }
}

/// Parses how many nodes a job runs on: 1 to [`quotient_common::job::JOB_NODES_MAX`].
pub fn parse_job_nodes(text: &str) -> Result<u32, String> {
    let max = quotient_common::job::JOB_NODES_MAX;
    let range = format!("a job runs on 1 to {max} nodes, --gpus on each");
    match text.parse::<i64>() {
        Ok(number) if (1..=i64::from(max)).contains(&number) => Ok(number as u32),
        Ok(number) => Err(format!("{number} nodes: {range}")),
        Err(_) => Err(format!(
            "invalid node count {text:?}: {range}, e.g. --nodes 2"
        )),
    }
}

/// Parses a certificate's serial as the coordinators check it
/// ([`quotient_common::name::is_serial_text`]); caught here, it is a usage error.
pub fn parse_serial(text: &str) -> Result<String, String> {
    if quotient_common::name::is_serial_text(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "invalid serial {text:?}: use the hexadecimal digits `quotient certs issue` or `openssl x509 -serial -noout -in CERT.pem` prints"
        ))
    }
}

/// Parses a coordinator's id (`cluster add-member --id`, `remove-member --id`): a whole
/// number from 1, the `--id` the coordinator was started with.
pub fn parse_member_id(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(id) if id >= 1 => Ok(id),
        _ => Err(format!(
            "invalid coordinator id {text:?}: use the whole number (1 or more) the coordinator \
             was started with (`quotient-coordinator --id N`); `quotient cluster status` \
             lists the members' ids"
        )),
    }
}

/// Parses `--max-preemptions`: 0 or more (0 fails the job at its first preemption).
pub fn parse_max_preemptions(text: &str) -> Result<u32, String> {
    match text.parse::<i64>() {
        Ok(number) if (0..=i64::from(u32::MAX)).contains(&number) => Ok(number as u32),
        _ => Err(format!(
            "invalid --max-preemptions {text:?}: use 0 or more (0 fails the job at its first preemption; leave it out for no limit)"
        )),
    }
}

/// Parses a GPU class name such as `a10g`.
pub fn parse_gpu_class(text: &str) -> Result<GpuClass, String> {
    GpuClass::parse(text).map_err(|error| error.to_string())
}

/// Parses a checkpoint signal: `SIGTERM`, `TERM` or `term`.
pub fn parse_signal(text: &str) -> Result<Signal, String> {
    Signal::parse(text).map_err(|error| error.to_string())
}

/// `text` if it is a valid name of a `kind` (share, job, node, ...), else why not.
fn name_of(kind: &str, text: &str) -> Result<String, String> {
    validate_name(kind, text)
        .map(|()| text.to_string())
        .map_err(|error| error.to_string())
}

/// Parses a share name.
pub fn parse_share_name(text: &str) -> Result<String, String> {
    name_of("share", text)
}

/// Parses a group name.
pub fn parse_group_name(text: &str) -> Result<String, String> {
    name_of("group", text)
}

/// Parses a user name (the name in a user's certificate).
pub fn parse_user_name(text: &str) -> Result<String, String> {
    name_of("user", text)
}

/// Parses a certificate's name (a user, an admin, a coordinator or an agent's node).
pub fn parse_certificate_name(text: &str) -> Result<String, String> {
    name_of("certificate", text)
}

/// Parses a subject alternative name: an IP address or a DNS host name.
pub fn parse_san(text: &str) -> Result<String, String> {
    quotient_common::certs::parse_san(text)
        .map(|_| text.to_string())
        .map_err(|error| error.to_string())
}

/// Parses a job name.
pub fn parse_job_name(text: &str) -> Result<String, String> {
    name_of("job", text)
}

/// Parses a node name.
pub fn parse_node_name(text: &str) -> Result<String, String> {
    name_of("node", text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_out_of_range_say_the_range_and_none_means_no_cap() {
        // Found by probing: `-1` for these was taken for a flag, with clap's tip to write
        // `-- -1`, which makes it the job's command; `share create --borrow-limit none`
        // was offered by the help and refused.
        assert_eq!(parse_job_nodes("2"), Ok(2));
        for bad in ["-1", "0", "257", "two"] {
            let error = parse_job_nodes(bad).unwrap_err();
            assert!(error.contains("1 to 256 nodes"), "{error}");
        }
        assert_eq!(parse_max_preemptions("0"), Ok(0));
        assert!(parse_max_preemptions("-1")
            .unwrap_err()
            .contains("use 0 or more"));
        assert_eq!(parse_borrow_limit("none"), Ok(BorrowLimit(None)));
        assert_eq!(parse_borrow_limit("150"), Ok(BorrowLimit(Some(150))));
        assert!(parse_borrow_limit("-5").unwrap_err().contains("0-10000"));
        assert!(parse_serial("zz").unwrap_err().contains("hexadecimal"));
        assert_eq!(parse_serial("3A:7F"), Ok("3A:7F".to_string()));
        assert_eq!(parse_cap("none"), Ok(Cap(None)));
        // Found by probing: `cluster add-member --id x` said only "invalid digit found in
        // string".
        assert_eq!(parse_member_id("4"), Ok(4));
        for bad in ["x", "0", "-1", ""] {
            assert!(
                parse_member_id(bad).unwrap_err().contains("cluster status"),
                "{bad}"
            );
        }
        assert_eq!(parse_cap("3"), Ok(Cap(Some(3))));
        assert!(parse_cap("0").is_err());
    }

    #[test]
    fn durations_take_ms_s_m_h_and_d() {
        // Proves the units and that a bare number or a fraction is refused.
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
        assert_eq!(parse_duration_ms("10h"), Ok(36_000_000));
        assert_eq!(parse_duration_ms("1d"), Ok(86_400_000));
        for bad in [
            "30",
            "1.5s",
            "s",
            "-1s",
            "10x",
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
        assert!(parse_priority("10000").unwrap_err().contains("0 to 9999"));
        let negative = parse_priority("-1").unwrap_err();
        assert!(
            negative.contains("0 to 9999") && negative.contains("higher runs first"),
            "{negative}"
        );
        assert!(parse_priority("high").unwrap_err().contains("0 to 9999"));
        assert_eq!(parse_job_gpus("64"), Ok(64));
        assert!(parse_job_gpus("0").unwrap_err().contains("1 to 64 GPUs"));
        assert!(parse_job_gpus("-2").unwrap_err().contains("1 to 64 GPUs"));
        assert!(parse_job_gpus("65").unwrap_err().contains("too many"));
        assert_eq!(parse_env("A=b=c"), Ok(("A".to_string(), "b=c".to_string())));
        assert!(parse_env("A").is_err());
        assert!(parse_env("=x").is_err());
        assert_eq!(parse_signal("usr1"), Ok(Signal::Sigusr1));
        assert!(parse_signal("SIGKILL").is_err());
    }
}

#[cfg(test)]
mod resource_tests {
    use super::*;

    #[test]
    fn cpus_memory_and_time_limits_parse_with_their_units() {
        // Proves each unit is read as documented and out-of-range values are refused.
        assert_eq!(parse_cpus("4"), Ok(4_000));
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert_eq!(parse_cpus("1.25"), Ok(1_250));
        for bad in ["0", "-1", "1.2345", "abc", "", "2000"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_memory("16G"), Ok(16 << 30));
        assert_eq!(parse_memory("512Mi"), Ok(512 << 20));
        assert_eq!(parse_memory("2GiB"), Ok(2 << 30));
        assert_eq!(parse_memory("1T"), Ok(1 << 40));
        for bad in ["1M", "16X", "G", "", "100Ti"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_time_limit_ms("12h"), Ok(12 * 3_600_000));
        assert_eq!(parse_time_limit_ms("2d"), Ok(2 * 86_400_000));
        assert!(parse_time_limit_ms("500ms").is_err());
        assert!(parse_time_limit_ms("400d").is_err());
    }
}
