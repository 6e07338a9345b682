//! Wall-clock time that does not jump: what a coordinator stamps on entries and judges
//! leases, time limits and retention by.
//!
//! The cluster's time is its leader's wall clock, and a wall clock can be stepped: by hand, by
//! an NTP daemon that found it far off, by a hypervisor. Followed blindly, a step forward of a
//! leader's clock killed jobs for their time limits after seconds, removed every finished job
//! from the replicated state at once and billed days of GPU time in a moment; a step back kept
//! jobs past their limits and stopped the GPU accounting (found by probing with
//! libfaketime). So a process keeps its own time:
//!
//! - at the first reading it takes the wall clock;
//! - after that it counts on the monotonic clock (`Instant`), and takes the wall clock again
//!   whenever the two differ by at most [`FOLLOW_MS`] (the slewing an NTP daemon does, and
//!   steps too small to matter, are followed at once);
//! - a larger difference is not followed at once: the kept time runs up to 1% faster or slower
//!   than the monotonic clock ([`SLEW_PER_MILLE`]) until it meets the wall clock again: 36 s
//!   an hour, so a wall clock set right after a wrong start is met within days, while a
//!   step of hours moves the kept time by no more than a few minutes in a day;
//! - it never runs backwards.
//!
//! [`problem`] says when the two differ by more than [`FOLLOW_MS`], for health reports.

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Differences of the wall clock from the kept time up to this (milliseconds) are followed at
/// once.
pub const FOLLOW_MS: i128 = 1_000;
/// How much faster or slower than the monotonic clock the kept time may run while it meets
/// a wall clock that stepped, in thousandths.
pub const SLEW_PER_MILLE: i128 = 10;

/// The kept time: nanoseconds since the epoch at a monotonic instant, and the wall clock's
/// difference from it at that moment.
#[derive(Debug, Clone, Copy)]
struct Kept {
    at: Instant,
    ns: i128,
    wall_minus_kept_ns: i128,
}

static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

fn wall_ns() -> i128 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => since.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}

/// The next kept time from `kept`, with the wall clock reading `wall_ns` at `now`.
fn advance(kept: Kept, now: Instant, wall_ns: i128) -> Kept {
    let elapsed = now.saturating_duration_since(kept.at).as_nanos() as i128;
    let counted = kept.ns + elapsed;
    let difference = wall_ns - counted;
    let ns = if difference.abs() <= FOLLOW_MS * 1_000_000 {
        wall_ns
    } else {
        let slew = elapsed * SLEW_PER_MILLE / 1_000;
        counted + difference.clamp(-slew, slew)
    };
    // Never backwards, not even by a followed step back.
    let ns = ns.max(kept.ns);
    Kept {
        at: now,
        ns,
        wall_minus_kept_ns: wall_ns - ns,
    }
}

/// The kept time now, advanced from the last reading.
fn read() -> Kept {
    let now = Instant::now();
    let wall = wall_ns();
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let next = match *kept {
        None => Kept {
            at: now,
            ns: wall,
            wall_minus_kept_ns: 0,
        },
        Some(before) => advance(before, now, wall),
    };
    *kept = Some(next);
    next
}

/// Milliseconds since the Unix epoch, as this process keeps them (module docs).
pub fn now_ms() -> u64 {
    u64::try_from(read().ns / 1_000_000).unwrap_or(0)
}

/// What to tell an operator while the wall clock is more than [`FOLLOW_MS`] from the kept
/// time; `None` otherwise.
pub fn problem() -> Option<String> {
    let kept = read();
    let difference_ms = kept.wall_minus_kept_ns / 1_000_000;
    (difference_ms.abs() > FOLLOW_MS).then(|| {
        let way = if difference_ms > 0 { "ahead of" } else { "behind" };
        format!(
            "the host's wall clock is {} {way} the time this process keeps: it was stepped while the process ran, and the step is followed by at most 1% (36 s an hour); check the host's time sync, then restart the process to take the clock's time at once",
            crate::duration::human_duration(difference_ms.unsigned_abs() as u64)
        )
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: i128 = 1_000_000;
    const HOUR: i128 = 3_600_000 * MS;

    #[test]
    fn small_differences_are_followed_and_steps_are_met_at_one_percent() {
        let start = Instant::now();
        let kept = Kept {
            at: start,
            ns: 1_000_000 * MS,
            wall_minus_kept_ns: 0,
        };
        // The wall clock as the monotonic one, then half a second off: followed.
        let t = start + Duration::from_secs(10);
        let next = advance(kept, t, 1_000_000 * MS + 10_500 * MS);
        assert_eq!(next.ns, 1_000_000 * MS + 10_500 * MS);
        // A step of 3 h forward: 10 s later the kept time has gained 1% of 10 s.
        let t2 = t + Duration::from_secs(10);
        let stepped = advance(next, t2, next.ns + 10_000 * MS + 3 * HOUR);
        assert_eq!(stepped.ns, next.ns + 10_000 * MS + 100 * MS);
        assert!(stepped.wall_minus_kept_ns > 2 * HOUR);
        // A step back of 3 h: the kept time runs 1% slow, and never backwards.
        let t3 = t2 + Duration::from_secs(10);
        let back = advance(stepped, t3, stepped.ns - 3 * HOUR);
        assert_eq!(back.ns, stepped.ns + 9_900 * MS);
        let same = advance(back, t3, back.ns - 500 * MS);
        assert_eq!(
            same.ns, back.ns,
            "a followed step back does not go backwards"
        );
        // The wall clock set right again: met at once once within a second.
        let t4 = t3 + Duration::from_secs(1);
        let right = advance(back, t4, back.ns + 1_000 * MS + 400 * MS);
        assert_eq!(right.ns, back.ns + 1_400 * MS);
    }

    #[test]
    fn the_clock_reads_the_wall_clock_and_says_nothing_while_they_agree() {
        let wall = wall_ns() / MS;
        let kept = now_ms() as i128;
        assert!((kept - wall).abs() < 1_000, "{kept} {wall}");
        assert_eq!(problem(), None);
    }
}
