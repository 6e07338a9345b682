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
//! A coordinator is one of several, and only its leader stamps entries; the cluster's time
//! should not jump when another member, whose clock was wrong when it started, takes over
//! (found by probing with libfaketime: a member started 3 h ahead stamped that time once it
//! led). So while a coordinator follows a leader ([`set_following`]), its kept time is the
//! cluster's: the newest stamp it applied from its leader ([`observe`]), counted on from
//! there on the monotonic clock. Should it lead, it goes on from that time, under the rules
//! above: a wall clock within [`FOLLOW_MS`] of it is taken at once, a wrong one is met at 1%.
//!
//! [`problem`] says when the wall clock differs from the kept time by more than [`FOLLOW_MS`],
//! or from the cluster's by more than [`CLUSTER_DIFFERENCE_MS`], for health reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Differences of the wall clock from the kept time up to this (milliseconds) are followed at
/// once.
pub const FOLLOW_MS: i128 = 1_000;
/// How much faster or slower than the monotonic clock the kept time may run while it meets
/// a wall clock that stepped, in thousandths.
pub const SLEW_PER_MILLE: i128 = 10;
/// A follower's wall clock further than this (milliseconds) from the cluster's time is
/// reported: its leader's stamps reach it a few milliseconds after they were made, and the
/// leader follows its own wall clock within [`FOLLOW_MS`].
pub const CLUSTER_DIFFERENCE_MS: i128 = 2_000;

/// The kept time: nanoseconds since the epoch at a monotonic instant, and the wall clock's
/// difference from it at that moment.
#[derive(Debug, Clone, Copy)]
struct Kept {
    at: Instant,
    ns: i128,
    wall_minus_kept_ns: i128,
}

static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

/// The newest stamp applied from a leader (nanoseconds since the epoch), and when it was.
#[derive(Debug, Clone, Copy)]
struct Observed {
    at: Instant,
    ns: i128,
}

static OBSERVED: Mutex<Option<Observed>> = Mutex::new(None);
static FOLLOWING: AtomicBool = AtomicBool::new(false);

/// Says whether this process follows a leader's time (a coordinator that is not the leader)
/// or keeps its own (the leader, or any other process).
pub fn set_following(following: bool) {
    let was = FOLLOWING.swap(following, Ordering::SeqCst);
    if following && !was {
        // A stamp seen before this process led is older than its own since: it keeps its
        // own time until it sees its next leader's.
        *OBSERVED.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Records `stamp_ms`, the time of an entry just applied from the leader, as the cluster's
/// time now. Ignored unless following: a leader applies its own stamps. Call it only for
/// entries that arrive while the process runs, not for its own log replayed at start,
/// whose stamps are old.
pub fn observe(stamp_ms: u64) {
    if !FOLLOWING.load(Ordering::SeqCst) {
        return;
    }
    let observed = Observed {
        at: Instant::now(),
        ns: i128::from(stamp_ms) * 1_000_000,
    };
    *OBSERVED.lock().unwrap_or_else(|p| p.into_inner()) = Some(observed);
}

/// The cluster's time at `now` from the last stamp observed, while following.
fn cluster_ns(now: Instant) -> Option<i128> {
    if !FOLLOWING.load(Ordering::SeqCst) {
        return None;
    }
    let observed = (*OBSERVED.lock().unwrap_or_else(|p| p.into_inner()))?;
    Some(observed.ns + now.saturating_duration_since(observed.at).as_nanos() as i128)
}

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
    let cluster = cluster_ns(now);
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let next = reading(*kept, cluster, now, wall);
    *kept = Some(next);
    next
}

/// The kept time at `now` after `before`, with the wall clock reading `wall` and, while
/// following, the cluster's time reading `cluster`.
fn reading(before: Option<Kept>, cluster: Option<i128>, now: Instant, wall: i128) -> Kept {
    match (before, cluster) {
        // A follower keeps the cluster's time: should it lead, it goes on from there.
        (_, Some(ns)) => Kept {
            at: now,
            ns,
            wall_minus_kept_ns: wall - ns,
        },
        (None, None) => Kept {
            at: now,
            ns: wall,
            wall_minus_kept_ns: 0,
        },
        (Some(before), None) => advance(before, now, wall),
    }
}

/// Milliseconds since the Unix epoch, as this process keeps them (module docs).
pub fn now_ms() -> u64 {
    u64::try_from(read().ns / 1_000_000).unwrap_or(0)
}

/// What to tell an operator while the wall clock is more than [`FOLLOW_MS`] from the kept
/// time (more than [`CLUSTER_DIFFERENCE_MS`] from the cluster's, while following); `None`
/// otherwise.
pub fn problem() -> Option<String> {
    let following = cluster_ns(Instant::now()).is_some();
    let kept = read();
    let difference_ms = kept.wall_minus_kept_ns / 1_000_000;
    if following {
        return (difference_ms.abs() > CLUSTER_DIFFERENCE_MS).then(|| {
            let way = if difference_ms > 0 { "ahead of" } else { "behind" };
            format!(
                "the host's wall clock is {} {way} the cluster's time (the leader's stamps): should this coordinator lead, it keeps the cluster's time and moves it toward this clock by at most 1% (36 s an hour); check the time sync of this host and of the leader's",
                crate::duration::human_duration(difference_ms.unsigned_abs() as u64)
            )
        });
    }
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
    fn a_follower_keeps_the_clusters_time_and_leads_on_from_it() {
        // Found by probing with libfaketime: a coordinator started with its clock 3 h ahead
        // stamped that time once it led. A follower keeps the cluster's time whatever its
        // wall clock says, and a leader goes on from it, meeting its wall clock at 1%.
        let start = Instant::now();
        let cluster = 1_000_000 * MS;
        let wall = cluster + 3 * HOUR;
        let first = reading(None, Some(cluster), start, wall);
        assert_eq!(first.ns, cluster);
        assert_eq!(first.wall_minus_kept_ns, 3 * HOUR);
        let t = start + Duration::from_secs(10);
        let later = reading(
            Some(first),
            Some(cluster + 10_000 * MS),
            t,
            wall + 10_000 * MS,
        );
        assert_eq!(later.ns, cluster + 10_000 * MS);
        // It leads: 10 s on, the cluster's time has gained 1% more than 10 s, not 3 h.
        let t2 = t + Duration::from_secs(10);
        let led = reading(Some(later), None, t2, wall + 20_000 * MS);
        assert_eq!(led.ns, cluster + 20_000 * MS + 100 * MS);
        // A follower's wall clock that agrees is taken at once when it leads.
        let agreeing = reading(Some(later), None, t2, cluster + 20_300 * MS);
        assert_eq!(agreeing.ns, cluster + 20_300 * MS);
    }

    #[test]
    fn the_clock_reads_the_wall_clock_and_says_nothing_while_they_agree() {
        let wall = wall_ns() / MS;
        let kept = now_ms() as i128;
        assert!((kept - wall).abs() < 1_000, "{kept} {wall}");
        assert_eq!(problem(), None);
    }
}
