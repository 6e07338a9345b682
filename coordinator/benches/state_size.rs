//! The live state at a million jobs: `cargo bench -p quotient-coordinator --bench state_size`.
//!
//! With the coordinator's allocator (mimalloc), builds a state of 1,000,000 jobs as a busy
//! fleet submits them (a name, a command with arguments, two environment variables, an
//! idempotency key and an owner, over 100 shares), and measures:
//! - the memory the process grows by (RSS) per queued job, then per finished job once every
//!   job has ended (each cancelled: a finished job the retention still keeps);
//! - the snapshot's bytes per job, and the time to read the state back from them (decoding,
//!   rebuilding the index, checking every invariant): what a coordinator does at start
//!   before it replays the log after its snapshot;
//! - one page of `job list` (100 jobs, newest first) at the server, unfiltered and filtered
//!   by share, by state and by name prefix, with the 1,000,000 jobs in the state.
//!
//! `BENCH_JOBS` changes the job count. The last line printed is one JSON object.

use std::time::{Duration, Instant};

use quotient_common::{JobId, JobState};
use quotient_coordinator::views::{job_page, JobFilter};
use quotient_core::{apply, ApplyCtx, Command, Outcome, State};

mod support;

use support::{rss_bytes, SHARES};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Pages of each kind timed.
const PAGES: usize = 50;

fn median_ms(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e3
}

fn max_ms(samples: &[Duration]) -> f64 {
    samples.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// [`PAGES`] pages of 100 jobs matching `filter`, from the first and from deep in the list;
/// the time of each.
fn timed(state: &State, jobs: usize, filter: JobFilter<'_>) -> Vec<Duration> {
    let mut samples = Vec::new();
    for n in 0..PAGES {
        let before = (n % 2 == 1).then_some(JobId((jobs / 2) as u64));
        let began = Instant::now();
        let page = job_page(state, filter, before, 100);
        samples.push(began.elapsed());
        assert!(page.jobs.len() <= 100);
    }
    samples
}

fn main() {
    let jobs: usize = std::env::var("BENCH_JOBS")
        .map(|v| v.parse().expect("BENCH_JOBS is a count"))
        .unwrap_or(1_000_000);
    let mut state = State::default();
    let mut index = 0;
    let mut run = |state: &mut State, command: Command| -> Outcome {
        index += 1;
        apply(
            state,
            command,
            ApplyCtx {
                log_index: index,
                time_ms: 1_700_000_000_000 + index,
            },
        )
    };
    for command in support::create_shares() {
        run(&mut state, command);
    }
    let rss_empty = rss_bytes("self");
    let began = Instant::now();
    for n in 0..jobs {
        let command = support::submit(n);
        let outcome = run(&mut state, command);
        assert!(
            matches!(outcome, Outcome::JobSubmitted { .. }),
            "{outcome:?}"
        );
    }
    let submit_s = began.elapsed().as_secs_f64();
    let rss_queued = rss_bytes("self");
    let per_queued = rss_queued.saturating_sub(rss_empty) as f64 / jobs as f64;
    eprintln!("{jobs} queued jobs: {per_queued:.0} bytes each ({submit_s:.1} s to submit)");

    eprintln!("--- pages of job list with {jobs} jobs");
    let first = timed(&state, jobs, JobFilter::default());
    let by_share = timed(
        &state,
        jobs,
        JobFilter {
            share: Some("team-042"),
            ..JobFilter::default()
        },
    );
    let by_prefix = timed(
        &state,
        jobs,
        JobFilter {
            name_prefix: Some("train-99"),
            ..JobFilter::default()
        },
    );
    let by_user = timed(
        &state,
        jobs,
        JobFilter {
            user: Some("user-7"),
            ..JobFilter::default()
        },
    );

    eprintln!("--- the snapshot, read back");
    let bytes = state.to_snapshot_bytes();
    let snapshot_bytes_per_job = bytes.len() as f64 / jobs as f64;
    let began = Instant::now();
    let back = State::from_snapshot_bytes(&bytes).expect("the snapshot reads back");
    let load_s = began.elapsed().as_secs_f64();
    assert_eq!(back.jobs().count(), jobs);
    drop(back);
    drop(bytes);

    eprintln!("--- every job ends");
    let rss_before_end = rss_bytes("self");
    for n in 0..jobs {
        run(
            &mut state,
            Command::CancelJob {
                job: JobId(n as u64 + 1),
            },
        );
    }
    assert!(state.jobs().all(|job| job.state == JobState::Cancelled));
    let rss_finished = rss_bytes("self");
    let per_finished = rss_finished.saturating_sub(rss_empty) as f64 / jobs as f64;
    let by_state = timed(
        &state,
        jobs,
        JobFilter {
            state: Some(JobState::Runnable),
            ..JobFilter::default()
        },
    );
    // A filter matching nothing walks the whole state in answers of at most JOB_SCAN_MAX
    // jobs: how many answers, and their time together.
    let (walk_answers, walk_total) = {
        let filter = JobFilter {
            state: Some(JobState::Runnable),
            ..JobFilter::default()
        };
        let (mut answers, mut total, mut before) = (0u32, Duration::ZERO, None);
        loop {
            let began = Instant::now();
            let page = job_page(&state, filter, before, 100);
            total += began.elapsed();
            answers += 1;
            match page.next_page_token {
                Some(token) => {
                    before = quotient_common::api::parse_job_page_token(&token);
                }
                None => break,
            }
        }
        (answers, total)
    };
    eprintln!(
        "{jobs} finished jobs: {per_finished:.0} bytes each (RSS {} MiB before they ended, {} MiB after)",
        rss_before_end >> 20,
        rss_finished >> 20
    );

    println!(
        "{{\"bench\":\"state-size\",\"jobs\":{jobs},\"shares\":{SHARES},\"rss_bytes_per_queued_job\":{per_queued:.0},\"rss_bytes_per_finished_job\":{per_finished:.0},\"snapshot_bytes_per_job\":{snapshot_bytes_per_job:.0},\"snapshot_load_s\":{load_s:.2},\"job_page_ms_p50\":{:.3},\"job_page_ms_max\":{:.3},\"job_page_share_ms_p50\":{:.3},\"job_page_share_ms_max\":{:.3},\"job_page_prefix_ms_p50\":{:.3},\"job_page_prefix_ms_max\":{:.3},\"job_page_user_ms_p50\":{:.3},\"job_page_user_ms_max\":{:.3},\"job_page_none_match_ms_p50\":{:.3},\"job_page_none_match_ms_max\":{:.3},\"job_page_none_match_answers\":{walk_answers},\"job_page_none_match_total_ms\":{:.3}}}",
        median_ms(first.clone()),
        max_ms(&first),
        median_ms(by_share.clone()),
        max_ms(&by_share),
        median_ms(by_prefix.clone()),
        max_ms(&by_prefix),
        median_ms(by_user.clone()),
        max_ms(&by_user),
        median_ms(by_state.clone()),
        max_ms(&by_state),
        walk_total.as_secs_f64() * 1e3,
    );
}
