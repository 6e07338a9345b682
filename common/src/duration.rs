//! Durations as people write them on command lines (a whole number and a unit), and as they
//! read them.

/// The largest number a duration may hold before its unit (about 35 years in milliseconds).
const DURATION_NUMBER_MAX: u64 = 1 << 40;

/// Parses a duration with a unit, `500ms`, `30s`, `5m`, `12h` or `2d`, into milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let hint = || {
        format!("invalid duration {text:?}: write a whole number with ms, s, m, h or d, e.g. 30s")
    };
    let (number, unit_ms) = if let Some(number) = text.strip_suffix("ms") {
        (number, 1)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1_000)
    } else if let Some(number) = text.strip_suffix('m') {
        (number, 60_000)
    } else if let Some(number) = text.strip_suffix('h') {
        (number, 3_600_000)
    } else if let Some(number) = text.strip_suffix('d') {
        (number, 86_400_000)
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

/// Days since 1970-01-01 of a date in the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`): for the timestamps read from outside (Docker's log stamps, SigV4's
/// `X-Amz-Date`).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// A duration in milliseconds for people: `850ms`, `42s`, `3m07s`, `5h02m`, `2d03h`.
pub fn human_duration(ms: u64) -> String {
    let seconds = ms / 1000;
    match seconds {
        0 => format!("{ms}ms"),
        1..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d{:02}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}
