//! Preemption latency benchmark: `cargo bench -p quotient-tests --bench preemption`.
//!
//! A local cluster (`quotient dev up --nodes 2`: 3 coordinators, 2 agents with one simulated
//! GPU each, process runtime). Share `a` (lend-and-borrow) runs one job on its own GPU and one
//! on the GPU that share `b` (lend) lends. Each round, `b` submits a job: the borrowed job is
//! reclaimed. Measured per round, from timestamps the jobs themselves write:
//! - submit -> signal: from the client sending `b`'s submit to the victim process receiving
//!   its checkpoint signal;
//! - exit -> running: from the victim's exit to `b`'s job process running.
//!
//! Then both are cancelled and the next round starts. `QUOTIENT_BENCH_ROUNDS` (default 200)
//! sets the rounds. The last line printed is one JSON object.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::{GpuClass, JobId, JobSpec, ShareSpec, ShareState, Strategy};
use quotient_tests::{poll_until, DevCluster};

const ROUNDS_DEFAULT: usize = 200;
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes `<dir>/<job>-<attempt>.start` when it starts, `.signal` when its checkpoint signal
/// arrives and `.exit` just before it exits (nanoseconds since the epoch).
const SCRIPT: &str = r#"#!/bin/sh
d="$BENCH_DIR/$QUOTIENT_JOB_ID-$QUOTIENT_ATTEMPT"
date +%s%N > "$d.start.tmp" && mv "$d.start.tmp" "$d.start"
trap 'date +%s%N > "$d.signal.tmp"; mv "$d.signal.tmp" "$d.signal"; date +%s%N > "$d.exit.tmp"; mv "$d.exit.tmp" "$d.exit"; exit 0' TERM
while true; do sleep 0.05; done
"#;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos()
}

fn read_ns(path: &Path) -> Result<u128, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Bench {
    client: ApiClient,
    runtime: tokio::runtime::Runtime,
    script: String,
    marks: PathBuf,
}

impl Bench {
    fn call(&self, request: ApiRequest) -> ApiResponse {
        self.runtime
            .block_on(self.client.call(request))
            .expect("the cluster answers")
    }

    fn submit(&self, share: &str, priority: u32) -> JobId {
        let mut spec = JobSpec::new(share, priority, 1, vec![self.script.clone()]);
        spec.env
            .insert("BENCH_DIR".into(), self.marks.display().to_string());
        spec.grace_period_ms = 5_000;
        match self.call(ApiRequest::SubmitJob(spec)) {
            ApiResponse::JobSubmitted { job, .. } => job,
            other => panic!("submit: {other:?}"),
        }
    }

    fn state(&self, job: JobId) -> String {
        match self.call(ApiRequest::GetJob { job }) {
            ApiResponse::Job(view) => view.state,
            other => panic!("job get: {other:?}"),
        }
    }

    fn mark(&self, job: JobId, attempt: u32, what: &str) -> PathBuf {
        self.marks.join(format!("{job}-{attempt}.{what}"))
    }

    fn wait_mark(&self, path: &Path) -> u128 {
        poll_until(&path.display().to_string(), STEP_TIMEOUT, || read_ns(path))
    }
}

fn main() {
    let rounds: usize = std::env::var("QUOTIENT_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS_DEFAULT);
    let cluster = DevCluster::up(&["--nodes", "2"]);
    let marks = cluster.dir.join("marks");
    std::fs::create_dir_all(&marks).expect("the marks folder");
    let script = cluster.dir.join("bench-job.sh");
    std::fs::write(&script, SCRIPT).expect("the job script");
    let mut permissions = std::fs::metadata(&script)
        .expect("the script")
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&script, permissions).expect("the script is executable");
    let (addresses, tls) = cluster.admin_tls();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let client = {
        let _entered = runtime.enter();
        ApiClient::connect(addresses, &tls).expect("a client")
    };
    let bench = Bench {
        client,
        runtime,
        script: script.display().to_string(),
        marks,
    };
    let class = GpuClass::parse("a10g").expect("a class");
    for (name, strategy) in [("a", Strategy::LendAndBorrow), ("b", Strategy::Lend)] {
        bench.call(ApiRequest::CreateShare(ShareSpec {
            name: name.into(),
            limits: [(class.clone(), 1)].into(),
            strategy,
            borrow_limit_percent: None,
            in_share_preemption: false,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        }));
    }
    let own = bench.submit("a", 10);
    bench.wait_mark(&bench.mark(own, 1, "start"));

    let mut to_signal = Vec::with_capacity(rounds);
    let mut to_running = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let borrower = bench.submit("a", 1);
        bench.wait_mark(&bench.mark(borrower, 1, "start"));
        let submitted = now_ns();
        let lender = bench.submit("b", 1);
        let signalled = bench.wait_mark(&bench.mark(borrower, 1, "signal"));
        let exited = bench.wait_mark(&bench.mark(borrower, 1, "exit"));
        let started = bench.wait_mark(&bench.mark(lender, 1, "start"));
        to_signal.push((signalled.saturating_sub(submitted)) as f64 / 1e6);
        to_running.push((started.saturating_sub(exited)) as f64 / 1e6);
        for job in [borrower, lender] {
            bench.call(ApiRequest::CancelJob { job });
        }
        poll_until("the round's jobs to end", STEP_TIMEOUT, || {
            let states = [bench.state(borrower), bench.state(lender)];
            if states.iter().all(|s| s == "CANCELLED") {
                Ok(())
            } else {
                Err(format!("{states:?}"))
            }
        });
    }
    to_signal.sort_by(|a, b| a.total_cmp(b));
    to_running.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{{\"bench\":\"preemption\",\"rounds\":{rounds},\"submit_to_signal_ms_p50\":{:.1},\"submit_to_signal_ms_p99\":{:.1},\"exit_to_running_ms_p50\":{:.1},\"exit_to_running_ms_p99\":{:.1}}}",
        percentile(&to_signal, 0.5),
        percentile(&to_signal, 0.99),
        percentile(&to_running, 0.5),
        percentile(&to_running, 0.99),
    );
}
