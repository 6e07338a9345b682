//! What the agent's minutely disk sweep holds in memory: a few bytes per job, never a path per
//! log. Found by a soak: each sweep held a path and a list entry for every log (and `measure`
//! a path for every file), the allocator kept that memory between sweeps, and the agent's
//! memory grew with its logs for the days of their retention (1 KiB per log file; 100,000
//! logs, the sweep's cap, would have taken 35 MB per sweep).
//!
//! The test binary counts every allocation (its own global allocator), so it holds this one
//! test alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use quotient_agent::config::{DiskSettings, Retention};
use quotient_agent::disk::DiskKeeper;
use quotient_agent::reconcile::Desired;
use quotient_agent::runtime::log_path;
use quotient_common::JobId;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator as it is; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(live, Ordering::SeqCst);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Logs of this many jobs, one attempt each.
const JOBS: u64 = 20_000;
/// What a sweep of them may hold at its peak: 100 bytes a job. Holding a path per log, it
/// held about 360.
const PEAK_BYTES_PER_JOB_MAX: usize = 100;

#[test]
fn a_sweep_holds_a_few_bytes_per_job_and_nothing_per_log() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let checkpoints = state.join("checkpoints");
    for job in 0..JOBS {
        let log = log_path(&state, JobId(job), 1);
        if job == 0 {
            std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        }
        std::fs::write(&log, b"a line\n").unwrap();
    }
    let keeper = DiskKeeper::new(
        DiskSettings {
            log_max_bytes: 1 << 20,
            // Made an hour ago: every log but the last job's goes, in the second pass.
            log_retention: Retention::after_ms(1_000),
            checkpoint_retention: Retention::OFF,
        },
        &state,
        &checkpoints,
    );
    let in_use = Desired {
        fence: 1,
        allocations: Vec::new(),
    };
    keeper.set_in_use(Some(&in_use), [(JobId(JOBS - 1), 1)].into_iter());
    let later = SystemTime::now() + Duration::from_secs(3_600);

    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let sweep = keeper.sweep(later);
    let peak = PEAK.load(Ordering::SeqCst) - before;

    assert_eq!(
        sweep.removed_jobs.len() as u64,
        JOBS - 1,
        "the expired logs went"
    );
    assert!(
        log_path(&state, JobId(JOBS - 1), 1).exists(),
        "the one in use stays"
    );
    assert!(!log_path(&state, JobId(0), 1).exists());
    let per_job = peak / JOBS as usize;
    assert!(
        per_job <= PEAK_BYTES_PER_JOB_MAX,
        "a sweep of {JOBS} jobs' logs held {peak} bytes at its peak, {per_job} a job"
    );
}
