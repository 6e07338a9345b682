//! The workload: concurrent clients on the host, each an async task with its own
//! [`ApiClient`] (the client every front end uses: redirects, forwarding through a follower,
//! retries of what is safe to send twice), making random operations until the episode's end
//! and recording each in the [`History`].
//!
//! A submit carries an idempotency key, which is also the job's name, and is sent again with
//! the same key after an outcome that is not definite, as a real client does. Priority
//! updates and share updates write values no other operation of the episode writes, so the
//! final state says which operation's write it holds.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quotient_client::{ApiClient, ClientError, RetryPolicy};
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::{
    ErrorCode, GpuClass, JobId, JobSpec, ShareSpec, ShareState, ShareUpdate, Strategy,
};
use tokio::time::Instant;

use super::history::{History, Op, OpKind, Outcome};
use super::rng::Rng;

/// The GPU class of every simulated GPU and every share.
pub const GPU_CLASS: &str = "a10g";
/// The grace period of every job: short, so that fencing and preemptions end within an episode.
pub const GRACE_PERIOD_MS: u64 = 2_000;
/// Calls of one submit at most (the first and the resends with the same key).
pub const SUBMIT_CALLS_MAX: u32 = 4;
/// Calls of any other operation at most.
pub const CALLS_MAX: u32 = 3;
/// The first value of the unique priorities and share caps (submits use 0-9).
pub const UNIQUE_BASE: u32 = 100;

/// The job every submit runs (busybox sh, in the agent's container). `$1` is how long it runs,
/// in seconds. It appends to two files of the folder every agent shares, with the shared
/// clock (µs since the epoch, from adjtimex: every container reads this kernel's clock):
/// - `runs/JOB-ATTEMPT-NODE`: `start JOB ATTEMPT NODE GPU T` when it starts, and
///   `stop JOB ATTEMPT NODE GPU T WHY` when it ends (done, or the checkpoint signal: SIGTERM,
///   trapped);
/// - `gpus/GPU` (its GPU's UUID from `NVIDIA_VISIBLE_DEVICES`, unique per node): `hold GPU JOB
///   ATTEMPT NODE T` first and `release GPU JOB ATTEMPT NODE T` last: the GPU's lock, whose
///   holds must never overlap.
///
/// It waits with `sleep 1 & wait`, which a trapped signal cuts short at once.
///
/// adjtimex's `time.tv_usec` is in nanoseconds while the kernel's clock is in nanosecond mode
/// (`STA_NANO`, 8192 in `status`, which a time daemon on the host may set): `now` divides it by
/// 1,000 then, or times of 19 digits and of 16 would be compared (seen in CI as GPUs "held
/// twice at once" for 50 years).
pub const JOB_SCRIPT: &str = r#"now() { adjtimex | awk '$1 == "status:" {nano = int($2 / 8192) % 2} /tv_sec/ {s = $2} /tv_usec/ {u = $2} END {if (nano) u = int(u / 1000); printf "%d%06d", s, u}'; }
node=$(hostname)
gpu=${NVIDIA_VISIBLE_DEVICES:-none}
job=$QUOTIENT_JOB_ID
attempt=$QUOTIENT_ATTEMPT
mkdir -p /chaos/runs /chaos/gpus
run=/chaos/runs/$job-$attempt-$node
lock=/chaos/gpus/$gpu
echo "hold $gpu $job $attempt $node $(now)" >> "$lock"
echo "start $job $attempt $node $gpu $(now)" >> "$run"
finish() {
    echo "stop $job $attempt $node $gpu $(now) $1" >> "$run"
    echo "release $gpu $job $attempt $node $(now)" >> "$lock"
    exit 0
}
trap 'finish term' TERM
trap 'finish int' INT
end=$(( $(date +%s) + $1 ))
while [ "$(date +%s)" -lt "$end" ]; do sleep 1 & wait $!; done
finish done
"#;

/// What the clients share: the jobs and shares they may act on, and the counter of unique
/// values.
#[derive(Debug, Default)]
pub struct Shared {
    pub jobs: Mutex<Vec<String>>,
    pub shares: Mutex<Vec<String>>,
    pub unique: AtomicU32,
}

impl Shared {
    fn unique(&self) -> u32 {
        UNIQUE_BASE + self.unique.fetch_add(1, Ordering::SeqCst)
    }

    fn pick_job(&self, rng: &mut Rng) -> Option<String> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        (!jobs.is_empty()).then(|| rng.pick(&jobs).clone())
    }

    fn pick_share(&self, rng: &mut Rng) -> String {
        let shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
        rng.pick(&shares).clone()
    }
}

/// The retry policy of the workload's clients: deadlines shorter than the CLI's, so that an
/// operation ends within a few seconds of a fault instead of outliving the episode.
pub fn policy() -> RetryPolicy {
    RetryPolicy {
        call_deadline: Duration::from_secs(8),
        attempt_deadline: Duration::from_secs(4),
        ..RetryPolicy::default()
    }
}

/// How an error ends an attempt.
pub fn classify(error: &ClientError) -> Outcome {
    match error.code() {
        ErrorCode::Uncertain | ErrorCode::Internal | ErrorCode::Local => Outcome::Unknown,
        ErrorCode::Unavailable | ErrorCode::NotLeader => Outcome::Unavailable,
        ErrorCode::InvalidArgument
        | ErrorCode::NotFound
        | ErrorCode::Conflict
        | ErrorCode::FailedPrecondition
        | ErrorCode::LimitExceeded
        | ErrorCode::Forbidden => Outcome::Refused,
    }
}

/// A share of `limit` a10g GPUs that lends and borrows without a limit: quota never stops a
/// job that finds a free GPU, so "nothing stuck while GPUs are free" is a check of the
/// scheduler alone.
pub fn share_spec(name: &str, limit: u32, in_share_preemption: bool) -> anyhow::Result<ShareSpec> {
    Ok(ShareSpec {
        name: name.to_string(),
        limits: [(GpuClass::parse(GPU_CLASS)?, limit)].into(),
        strategy: Strategy::LendAndBorrow,
        borrow_limit_percent: None,
        in_share_preemption,
        state: ShareState::Enabled,
        members: Vec::new(),
        max_jobs_per_user: None,
    })
}

/// The spec of a submit with `key` (also its name).
pub fn job_spec(key: &str, share: &str, priority: u32, run_s: u32) -> JobSpec {
    let command = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        JOB_SCRIPT.to_string(),
        "chaos-job".to_string(),
        run_s.to_string(),
    ];
    let mut spec = JobSpec::new(share, priority, 1, command);
    spec.name = Some(key.to_string());
    spec.idempotency_key = Some(key.to_string());
    spec.grace_period_ms = GRACE_PERIOD_MS;
    spec
}

/// Sends `request` up to `calls` times while the outcome is not definite; the outcome of the
/// operation, the last answer and the number of calls made.
async fn call(
    client: &ApiClient,
    request: ApiRequest,
    calls: u32,
) -> (Outcome, Option<ApiResponse>, Option<ClientError>, u32) {
    let mut unknown = false;
    let mut last_error = None;
    for attempt in 1..=calls {
        match client.call(request.clone()).await {
            Ok(response) => return (Outcome::Ack, Some(response), None, attempt),
            Err(error) => {
                let outcome = classify(&error);
                unknown |= outcome == Outcome::Unknown;
                let definite = outcome == Outcome::Refused;
                last_error = Some(error);
                if definite {
                    let outcome = if unknown {
                        Outcome::Unknown
                    } else {
                        Outcome::Refused
                    };
                    return (outcome, None, last_error, attempt);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    let outcome = if unknown {
        Outcome::Unknown
    } else {
        Outcome::Unavailable
    };
    (outcome, None, last_error, calls)
}

/// One client: random operations until `until`.
pub async fn run_client(
    id: u32,
    tag: String,
    client: ApiClient,
    history: History,
    shared: Arc<Shared>,
    mut rng: Rng,
    until: Instant,
) {
    let mut seq = 0u32;
    while Instant::now() < until {
        seq += 1;
        let roll = rng.below(100);
        let op = if roll < 42 {
            let key = format!("{tag}-c{id}-{seq}");
            submit(&client, &history, &shared, &mut rng, id, key).await
        } else if roll < 62 {
            match shared.pick_job(&mut rng) {
                Some(job) => priority(&client, &history, &shared, id, job).await,
                None => continue,
            }
        } else if roll < 72 {
            match shared.pick_job(&mut rng) {
                Some(job) => cancel(&client, &history, id, job).await,
                None => continue,
            }
        } else if roll < 94 {
            share_update(&client, &history, &shared, &mut rng, id).await
        } else {
            let name = format!("{tag}-s{id}-{seq}");
            share_create(&client, &history, &shared, &mut rng, id, name).await
        };
        drop(op);
        tokio::time::sleep(Duration::from_millis(150 + rng.below(500))).await;
    }
}

fn finish(
    history: &History,
    mut op: Op,
    outcome: Outcome,
    error: Option<ClientError>,
    calls: u32,
) -> Op {
    op.attempts = calls;
    if let Some(error) = error {
        op.code = Some(error.code().as_str().to_string());
        op.detail = Some(error.to_string());
    }
    history.complete(op, outcome)
}

async fn submit(
    client: &ApiClient,
    history: &History,
    shared: &Shared,
    rng: &mut Rng,
    id: u32,
    key: String,
) -> Op {
    let share = shared.pick_share(rng);
    let priority = rng.below(10) as u32;
    let run_s = 2 + rng.below(14) as u32;
    let mut op = Op::new(id, OpKind::Submit);
    op.key = Some(key.clone());
    op.share = Some(share.clone());
    op.priority = Some(priority);
    op.run_s = Some(run_s);
    history.invoke(&mut op);
    let request = ApiRequest::SubmitJob(job_spec(&key, &share, priority, run_s));
    let (outcome, response, error, calls) = call(client, request, SUBMIT_CALLS_MAX).await;
    if let Some(ApiResponse::JobSubmitted { job, duplicate }) = response {
        op.job = Some(job.to_string());
        op.duplicate = Some(duplicate);
        shared
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(job.to_string());
    }
    finish(history, op, outcome, error, calls)
}

async fn priority(
    client: &ApiClient,
    history: &History,
    shared: &Shared,
    id: u32,
    job: String,
) -> Op {
    let value = shared.unique();
    let mut op = Op::new(id, OpKind::Priority);
    op.job = Some(job.clone());
    op.priority = Some(value);
    history.invoke(&mut op);
    let Ok(parsed) = job.parse::<JobId>() else {
        return history.complete(op, Outcome::Refused);
    };
    let request = ApiRequest::UpdateJobPriority {
        job: parsed,
        priority: value,
    };
    let (outcome, _, error, calls) = call(client, request, CALLS_MAX).await;
    finish(history, op, outcome, error, calls)
}

async fn cancel(client: &ApiClient, history: &History, id: u32, job: String) -> Op {
    let mut op = Op::new(id, OpKind::Cancel);
    op.job = Some(job.clone());
    history.invoke(&mut op);
    let Ok(parsed) = job.parse::<JobId>() else {
        return history.complete(op, Outcome::Refused);
    };
    let (outcome, _, error, calls) =
        call(client, ApiRequest::CancelJob { job: parsed }, CALLS_MAX).await;
    finish(history, op, outcome, error, calls)
}

async fn share_update(
    client: &ApiClient,
    history: &History,
    shared: &Shared,
    rng: &mut Rng,
    id: u32,
) -> Op {
    let share = shared.pick_share(rng);
    let cap = shared.unique();
    let limit = 1 + rng.below(3) as u32;
    let mut op = Op::new(id, OpKind::ShareUpdate);
    op.share = Some(share.clone());
    op.cap = Some(cap);
    op.limit = Some(limit);
    history.invoke(&mut op);
    let Ok(class) = GpuClass::parse(GPU_CLASS) else {
        return history.complete(op, Outcome::Refused);
    };
    let update = ShareUpdate {
        limits: Some([(class, limit)].into()),
        max_jobs_per_user: Some(Some(cap)),
        ..ShareUpdate::default()
    };
    let request = ApiRequest::UpdateShare {
        name: share,
        update,
    };
    let (outcome, _, error, calls) = call(client, request, CALLS_MAX).await;
    finish(history, op, outcome, error, calls)
}

async fn share_create(
    client: &ApiClient,
    history: &History,
    shared: &Shared,
    rng: &mut Rng,
    id: u32,
    name: String,
) -> Op {
    let limit = 1 + rng.below(2) as u32;
    let preemption = rng.chance(0.5);
    let mut op = Op::new(id, OpKind::ShareCreate);
    op.share = Some(name.clone());
    op.limit = Some(limit);
    history.invoke(&mut op);
    let spec = match share_spec(&name, limit, preemption) {
        Ok(spec) => spec,
        Err(_) => return history.complete(op, Outcome::Refused),
    };
    let (outcome, _, error, calls) = call(client, ApiRequest::CreateShare(spec), CALLS_MAX).await;
    if outcome == Outcome::Ack {
        shared
            .shares
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name);
    }
    finish(history, op, outcome, error, calls)
}

#[cfg(test)]
mod tests {
    use super::JOB_SCRIPT;
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// What busybox's `adjtimex` prints, with `status` and `time.tv_usec` given.
    fn adjtimex_output(status: u32, tv_usec: u64) -> String {
        format!(
            "    mode:         0\n-o  offset:       0 us\n-f  freq.adjust:  0 (65536 = 1ppm)\n    maxerror:     16000000\n    esterror:     16000000\n    status:       {status} ( UNSYNC )\n-p  timeconstant: 2\n    precision:    1 us\n    tolerance:    32768000\n-t  tick:         10000 us\n    time.tv_sec:  1796573698\n    time.tv_usec: {tv_usec}\n    return value: 5 (clock not synchronized)\n"
        )
    }

    /// The job script's `now`, run by this host's awk on `input`.
    fn now(input: &str) -> String {
        let program = JOB_SCRIPT
            .split_once("awk '")
            .and_then(|(_, rest)| rest.split_once('\''))
            .expect("the job script's now() runs an awk program")
            .0;
        let mut awk = Command::new("awk")
            .arg(program)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("awk runs");
        awk.stdin
            .take()
            .expect("awk's stdin")
            .write_all(input.as_bytes())
            .expect("awk reads");
        let out = awk.wait_with_output().expect("awk ends");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("awk prints digits")
    }

    #[test]
    fn the_job_clock_is_in_microseconds_whether_the_kernel_counts_micro_or_nanoseconds() {
        // 64 is STA_UNSYNC; 8192 is STA_NANO.
        assert_eq!(now(&adjtimex_output(64, 91_919)), "1796573698091919");
        assert_eq!(
            now(&adjtimex_output(64 + 8192, 91_919_386)),
            "1796573698091919"
        );
        assert_eq!(now(&adjtimex_output(8192, 235_049_229)), "1796573698235049");
        assert_eq!(now(&adjtimex_output(8192 + 1, 386)), "1796573698000000");
    }
}
