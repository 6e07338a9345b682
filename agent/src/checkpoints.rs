//! Seeing a job checkpoint: the agent looks at each running attempt's checkpoint directory
//! (`$QUOTIENT_CHECKPOINT_DIR`) about once a second and reports `JobEvent::Checkpointed`
//! when it finds a checkpoint newer than the last it saw in this attempt.
//!
//! The convention (docs/quota-shares.md, "Checkpoints"): a job that has written a whole
//! checkpoint touches [`MARKER`] in the directory (or writes it, with anything in it). A job
//! that does not is judged by its files: the newest modification time among the directory's
//! entries (not recursive, at most [`ENTRIES_MAX`] of them). The marker, when present, is the
//! only thing read, so a job that uses it is never taken to have checkpointed while it is
//! still writing one. Checkpoints older than the attempt's start on this agent are not
//! reported: they are what the attempt resumed from.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use quotient_common::JobId;

/// The file a job touches once a checkpoint is whole.
pub const MARKER: &str = ".quotient-checkpointed";
/// How many of a directory's entries are looked at, at most, when it has no marker.
pub const ENTRIES_MAX: usize = 4_096;
/// How often one attempt's directory is looked at (the executor's clock, ms).
pub const SCAN_EVERY_MS: u64 = 1_000;

/// The time of the newest checkpoint in `dir`, by the convention above; `None` when there is
/// none (or the directory cannot be read).
pub fn newest(dir: &Path) -> Option<SystemTime> {
    // The marker and the entries as they are, never through a link: the agent runs as root,
    // and a link's target's time is not the job's to learn (nor a checkpoint of its own).
    if let Ok(meta) = std::fs::symlink_metadata(dir.join(MARKER)) {
        return meta.modified().ok();
    }
    std::fs::read_dir(dir)
        .ok()?
        .take(ENTRIES_MAX)
        .filter_map(|entry| entry.ok()?.metadata().ok()?.modified().ok())
        .max()
}

/// What the agent knows of one attempt's checkpoints.
#[derive(Debug, Clone, Copy)]
struct Watch {
    /// The newest checkpoint reported, or the attempt's start here: only newer ones count.
    seen: SystemTime,
    /// When the directory is looked at next (executor clock, ms).
    next_scan_ms: u64,
}

/// The attempts being watched.
#[derive(Debug, Default)]
pub struct Watches {
    by_attempt: BTreeMap<(JobId, u32), Watch>,
}

impl Watches {
    /// Looks at `dir` for attempt `attempt` of `job` when due, and says whether it holds a
    /// checkpoint newer than the last one reported. An attempt seen for the first time starts
    /// its watch now.
    pub fn due(&mut self, job: JobId, attempt: u32, dir: &Path, now_ms: u64) -> bool {
        let watch = self
            .by_attempt
            .entry((job, attempt))
            .or_insert_with(|| Watch {
                seen: SystemTime::now(),
                next_scan_ms: now_ms,
            });
        if now_ms < watch.next_scan_ms {
            return false;
        }
        watch.next_scan_ms = now_ms + SCAN_EVERY_MS;
        match newest(dir) {
            Some(at) if at > watch.seen => {
                watch.seen = at;
                true
            }
            _ => false,
        }
    }

    /// Stops watching every attempt for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(JobId, u32) -> bool) {
        self.by_attempt
            .retain(|(job, attempt), _| keep(*job, *attempt));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn touch(path: &Path, at: SystemTime) {
        let file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        file.set_modified(at).unwrap();
    }

    #[test]
    fn the_marker_decides_when_there_is_one_and_the_newest_file_otherwise() {
        // Proves the convention: files alone count by their newest time; once the marker is
        // there, only it does, so a checkpoint being written after it is not taken for one.
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(newest(dir.path()), None);
        let base = SystemTime::now() - Duration::from_secs(100);
        touch(&dir.path().join("step-10.pt"), base);
        touch(
            &dir.path().join("step-20.pt"),
            base + Duration::from_secs(20),
        );
        assert_eq!(newest(dir.path()), Some(base + Duration::from_secs(20)));
        touch(&dir.path().join(MARKER), base + Duration::from_secs(10));
        touch(
            &dir.path().join("step-30.pt.partial"),
            base + Duration::from_secs(30),
        );
        assert_eq!(newest(dir.path()), Some(base + Duration::from_secs(10)));
        assert_eq!(newest(&dir.path().join("missing")), None);
    }

    #[test]
    fn a_checkpoint_is_reported_once_and_only_if_newer_than_the_attempt() {
        // Proves what the executor is told: nothing for what the attempt resumed from, one
        // report per new checkpoint, and no look at the directory more than once a second.
        let dir = tempfile::tempdir().unwrap();
        touch(
            &dir.path().join("old.pt"),
            SystemTime::now() - Duration::from_secs(60),
        );
        let mut watches = Watches::default();
        let job = JobId(7);
        assert!(!watches.due(job, 1, dir.path(), 0), "resumed from, not new");
        touch(
            &dir.path().join(MARKER),
            SystemTime::now() + Duration::from_secs(1),
        );
        assert!(!watches.due(job, 1, dir.path(), 500), "not due yet");
        assert!(watches.due(job, 1, dir.path(), 1_000));
        assert!(!watches.due(job, 1, dir.path(), 2_000), "reported already");
        touch(
            &dir.path().join(MARKER),
            SystemTime::now() + Duration::from_secs(2),
        );
        assert!(watches.due(job, 1, dir.path(), 3_000));
        watches.retain(|_, _| false);
        assert!(watches.by_attempt.is_empty());
    }
}
