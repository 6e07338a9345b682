//! Snapshot capture benchmark: `cargo bench -p quotient-core --bench snapshot`.
//!
//! Builds a state of 1,000,000 submitted jobs, each with an idempotency key as the CLI gives
//! every submit, then takes five snapshots and measures (a) the capture, which the
//! coordinator does while holding the state's lock, so every apply and linearizable read
//! waits for it, and (b) the encoding after, which runs with the lock released.
//! `BENCH_JOBS` changes the job count. The last line printed is one JSON object.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use quotient_common::{GpuClass, JobSpec, ShareSpec, ShareState, Strategy};
use quotient_core::{apply, ApplyCtx, Command, Outcome, State};

fn main() {
    let jobs: usize = std::env::var("BENCH_JOBS")
        .map(|v| v.parse().expect("BENCH_JOBS is a count"))
        .unwrap_or(1_000_000);
    let class = GpuClass::parse("a10g").expect("a class name");
    let mut state = State::default();
    let mut index = 0;
    let mut run = |state: &mut State, command: Command| -> Outcome {
        index += 1;
        apply(
            state,
            command,
            ApplyCtx {
                log_index: index,
                time_ms: index,
            },
        )
    };
    run(
        &mut state,
        Command::CreateShare(ShareSpec {
            name: "team".into(),
            limits: BTreeMap::from([(class.clone(), 8)]),
            strategy: Strategy::Reserve,
            borrow_limit_percent: None,
            in_share_preemption: false,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        }),
    );
    let began = Instant::now();
    for n in 0..jobs {
        let mut spec = JobSpec::new("team", 50, 1, vec!["train".into()]);
        spec.gpu_class = Some(class.clone());
        spec.idempotency_key = Some(format!("quotient-cli-{n:012}-{:08x}", n * 7919));
        let outcome = run(&mut state, Command::SubmitJob(spec));
        assert!(
            matches!(
                outcome,
                Outcome::JobSubmitted {
                    duplicate: false,
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
    let submits = began.elapsed();

    let (mut captures, mut encodes) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..5 {
        let began = Instant::now();
        let capture = state.capture_snapshot();
        captures.push(began.elapsed());
        let began = Instant::now();
        bytes = capture.into_bytes().len();
        encodes.push(began.elapsed());
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let median = |mut v: Vec<Duration>| {
        v.sort();
        ms(&v[v.len() / 2])
    };
    println!(
        "{{\"bench\":\"snapshot\",\"jobs\":{jobs},\"snapshot_bytes\":{bytes},\"submit_apply_us\":{:.3},\"capture_under_lock_ms\":{:.4},\"capture_max_ms\":{:.4},\"encode_after_ms\":{:.1}}}",
        submits.as_secs_f64() * 1e6 / jobs as f64,
        median(captures.clone()),
        captures.iter().map(ms).fold(0.0, f64::max),
        median(encodes),
    );
}
