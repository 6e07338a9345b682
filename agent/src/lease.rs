//! The self-fencing lease clock: how long ago a leader last answered a heartbeat, and whether
//! that is longer than the agent's lease.
//!
//! The clock is renewed with the *send* time of an acknowledged heartbeat (or registration),
//! never its answer time: the leader received that heartbeat after it was sent, so the agent's
//! lease always runs out no later than the coordinators' count, which starts at receipt (the
//! timing contract is in [`crate::session`]). Time is passed in, so the rules are unit-tested
//! without sleeping.
//!
//! # The lease file
//! The agent also publishes its lease to its jobs' wrappers, so that a job outlives a dead or
//! frozen agent by no more than the lease ([`crate::runtime::process`] and
//! [`crate::runtime::docker`] have the watchdogs). The
//! file is `<state_dir>/`[`LEASE_FILE`], one line, replaced whole (written to a temporary file,
//! then renamed) on every acknowledged heartbeat or registration:
//!
//! ```text
//! EXPIRY_MS [fencing]
//! ```
//!
//! `EXPIRY_MS` is when the agent's lease runs out, in milliseconds of `CLOCK_BOOTTIME` (the
//! clock of `/proc/uptime`, which keeps counting while the agent is frozen or the host
//! suspended, so the wrapper never counts less time than the coordinators do). It is computed
//! from the same basis as [`LeaseClock`], never later. The word `fencing` is added once the
//! agent itself has begun stopping its jobs for an expired lease (it sent their checkpoint
//! signals): the wrapper then sends no second checkpoint signal and only makes sure of the
//! kill.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use quotient_common::bounded_read::read_text_at_most;

/// The lease file's name under the state dir.
pub const LEASE_FILE: &str = "agent-lease";
/// The marker the agent adds to the lease file once it is stopping its jobs itself.
pub const LEASE_FENCING_MARK: &str = "fencing";

/// The agent's view of its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseClock {
    /// The send time of the last acknowledged heartbeat (or where counting started).
    basis: Instant,
    lease_ms: u64,
    /// Whether a leader acknowledged anything since this process started.
    acknowledged: bool,
}

impl LeaseClock {
    /// A lease of `lease_ms` counted from `basis`.
    pub fn new(basis: Instant, lease_ms: u64) -> LeaseClock {
        LeaseClock {
            basis,
            lease_ms,
            acknowledged: false,
        }
    }

    /// The lease of an agent (re)starting at `now` (`now_unix_ms` on some clock) whose
    /// journal last recorded an acknowledgement at `last_ack_unix_ms` (on the same clock:
    /// the boot clock when the journal has it for this boot, else the wall clock): counted
    /// from that acknowledgement, so that a restart does not extend the lease, and never from
    /// further back than the lease itself (expired is expired); from `now` on a first start.
    pub fn resumed(
        last_ack_unix_ms: Option<u64>,
        lease_ms: u64,
        now: Instant,
        now_unix_ms: u64,
    ) -> LeaseClock {
        let basis = last_ack_unix_ms
            .and_then(|last_ack| {
                let since = now_unix_ms.saturating_sub(last_ack);
                now.checked_sub(Duration::from_millis(since.min(lease_ms + 1)))
            })
            .unwrap_or(now);
        LeaseClock::new(basis, lease_ms)
    }

    /// A leader acknowledged a heartbeat sent at `sent_at`. An older send time (a slow answer
    /// that overtook nothing) never moves the basis back.
    pub fn renew(&mut self, sent_at: Instant) {
        self.basis = self.basis.max(sent_at);
        self.acknowledged = true;
    }

    /// Whether a leader acknowledged a heartbeat or registration of this process.
    pub fn acknowledged(&self) -> bool {
        self.acknowledged
    }

    /// What is left of the lease at `now` (zero once it ran out).
    pub fn remaining(&self, now: Instant) -> Duration {
        Duration::from_millis(self.lease_ms).saturating_sub(self.since_ack(now))
    }

    /// The lease the leader gave (in `Registered`).
    pub fn set_lease_ms(&mut self, lease_ms: u64) {
        self.lease_ms = lease_ms;
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// Whether the lease has run out at `now`: the agent must stop its jobs.
    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.basis) > Duration::from_millis(self.lease_ms)
    }

    /// How long since the basis, at `now`.
    pub fn since_ack(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.basis)
    }
}

/// Milliseconds of `CLOCK_BOOTTIME` now (the clock of `/proc/uptime`); `None` if unreadable.
pub fn boot_time_ms() -> Option<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    if result != 0 {
        return None;
    }
    let seconds = u64::try_from(now.tv_sec).ok()?;
    let nanos = u64::try_from(now.tv_nsec).ok()?;
    Some(seconds * 1_000 + nanos / 1_000_000)
}

/// This boot of the host: `/proc/sys/kernel/random/boot_id`; `None` if unreadable. Read once
/// per process (it cannot change while the process runs), not on every recorded
/// acknowledgement.
pub fn boot_id() -> Option<String> {
    static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            let file = std::fs::File::open("/proc/sys/kernel/random/boot_id").ok()?;
            let text = read_text_at_most(file, 64).ok()??;
            let id = text.trim();
            (!id.is_empty()).then(|| id.to_string())
        })
        .clone()
}

/// The lease file's line for `clock` at `now` (`boot_now_ms` = [`boot_time_ms`] at `now`).
pub fn lease_file_line(
    clock: &LeaseClock,
    now: Instant,
    boot_now_ms: u64,
    fencing: bool,
) -> String {
    let since_ack = clock.since_ack(now).as_millis() as u64;
    let expiry = boot_now_ms.saturating_sub(since_ack) + clock.lease_ms;
    if fencing {
        format!("{expiry} {LEASE_FENCING_MARK}\n")
    } else {
        format!("{expiry}\n")
    }
}

/// The largest lease file read back; a longer one is not the agent's.
pub const LEASE_FILE_BYTES_MAX: u64 = 256;

/// Reads the lease file at `path`: the expiry (milliseconds of the boot clock) and whether
/// the agent marked it `fencing`. `None` when it is missing, too long or not a lease line.
pub fn read_lease_file(path: &Path) -> Option<(u64, bool)> {
    let file = std::fs::File::open(path).ok()?;
    let text = read_text_at_most(file, LEASE_FILE_BYTES_MAX).ok()??;
    let mut words = text.split_whitespace();
    let expiry = words.next()?.parse().ok()?;
    let fencing = match words.next() {
        None => false,
        Some(LEASE_FENCING_MARK) => true,
        Some(_) => return None,
    };
    Some((expiry, fencing))
}

/// Writes the lease file at `path` whole (temporary file, then rename); see the module docs.
pub fn write_lease_file(path: &Path, clock: &LeaseClock, fencing: bool) -> std::io::Result<()> {
    let now = Instant::now();
    let boot_now_ms = boot_time_ms().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "CLOCK_BOOTTIME is unreadable",
        )
    })?;
    let line = lease_file_line(clock, now, boot_now_ms, fencing);
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(line.as_bytes())?;
    drop(file);
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restart counts the lease from the journal's last acknowledgement: never from later
    /// than now (a wall clock set back since cannot lengthen it past a fresh lease), never from
    /// further back than the lease (expired is expired), and from now on a first start.
    #[test]
    fn a_resumed_lease_counts_from_the_last_acknowledgement() {
        let now = Instant::now() + Duration::from_secs(3_600);
        let lease = LeaseClock::resumed(Some(1_000_000), 10_000, now, 1_004_000);
        assert_eq!(lease.since_ack(now), Duration::from_millis(4_000));
        assert!(!lease.acknowledged());
        let long_ago = LeaseClock::resumed(Some(1_000_000), 10_000, now, 9_000_000);
        assert!(long_ago.expired(now));
        assert_eq!(long_ago.since_ack(now), Duration::from_millis(10_001));
        let set_back = LeaseClock::resumed(Some(1_000_000), 10_000, now, 900_000);
        assert_eq!(set_back.since_ack(now), Duration::ZERO);
        let first = LeaseClock::resumed(None, 10_000, now, 900_000);
        assert_eq!(first.since_ack(now), Duration::ZERO);
    }

    /// The file names the expiry on the boot clock, counted from the last acknowledged send.
    #[test]
    fn the_lease_file_names_the_expiry_on_the_boot_clock() {
        let start = Instant::now();
        let clock = LeaseClock::new(start, 1_000);
        let now = start + Duration::from_millis(300);
        assert_eq!(lease_file_line(&clock, now, 50_000, false), "50700\n");
        assert_eq!(
            lease_file_line(&clock, now, 50_000, true),
            "50700 fencing\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LEASE_FILE);
        write_lease_file(&path, &clock, false).unwrap();
        let expiry: u64 = std::fs::read_to_string(&path)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let boot = boot_time_ms().unwrap();
        assert!(
            expiry <= boot + 1_000 && expiry + 2_000 > boot,
            "{expiry} vs {boot}"
        );
    }

    /// What the agent writes reads back; anything else reads as no lease.
    #[test]
    fn the_lease_file_reads_back_and_refuses_what_is_not_a_lease() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LEASE_FILE);
        assert_eq!(read_lease_file(&path), None, "missing");
        for (text, read) in [
            ("50700\n", Some((50_700, false))),
            ("50700 fencing\n", Some((50_700, true))),
            ("", None),
            ("soon\n", None),
            ("50700 maybe\n", None),
        ] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(read_lease_file(&path), read, "{text:?}");
        }
        std::fs::write(&path, "1".repeat(LEASE_FILE_BYTES_MAX as usize + 1)).unwrap();
        assert_eq!(read_lease_file(&path), None, "too long");
    }

    /// The lease runs out lease_ms after the last acknowledged send, and only moves forward.
    #[test]
    fn the_lease_runs_from_the_last_acknowledged_send() {
        let start = Instant::now();
        let mut clock = LeaseClock::new(start, 1_000);
        assert!(!clock.expired(start + Duration::from_millis(1_000)));
        assert!(clock.expired(start + Duration::from_millis(1_001)));
        clock.renew(start + Duration::from_millis(800));
        assert!(!clock.expired(start + Duration::from_millis(1_700)));
        clock.renew(start + Duration::from_millis(100));
        assert!(clock.expired(start + Duration::from_millis(1_801)));
        clock.set_lease_ms(5_000);
        assert!(!clock.expired(start + Duration::from_millis(1_801)));
    }
}
