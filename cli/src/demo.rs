//! `quotient demo`: the walkthrough of docs/quota-shares.md on a fresh local cluster.
//!
//! It starts 3 coordinators and 3 agents with one simulated GPU each (`quotient dev up`, the
//! process runtime), makes the three shares of the walkthrough, and plays its three steps with
//! real jobs: a small shell script that counts steps, writes a checkpoint when it gets its
//! checkpoint signal, and resumes from it on its next attempt. After each step it waits until
//! the cluster shows exactly the states the spec promises, prints the share and job tables with
//! a few words on what happened, and at the end stops the cluster (unless `--keep`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use quotient_common::api::{ApiRequest, ApiResponse, JobView, ShareView};
use quotient_common::{
    GpuClass, JobId, JobPayload, JobSpec, ShareSpec, ShareState, Signal, Strategy,
};

use crate::client::Session;
use crate::client_config::{self, ClientConfig};
use crate::dev_cluster::CLIENT_CONFIG_FILE;
use crate::dev_down::{self, DevDownArgs};
use crate::dev_up::{self, DevUpArgs};
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// How long one step may take to reach the spec's states.
pub const STEP_DEADLINE_MS: u64 = 90_000;
/// How often the demo looks at the cluster while it waits.
pub const POLL_INTERVAL_MS: u64 = 200;
/// The demo jobs' grace period: how long a job has to checkpoint after its signal.
pub const GRACE_PERIOD_MS: u64 = 10_000;

/// The job every demo job runs: counts steps, checkpoints on SIGTERM, resumes on restart.
const JOB_SCRIPT: &str = r#"#!/bin/sh
checkpoint="$QUOTIENT_CHECKPOINT_DIR/step"
step=0
[ -f "$checkpoint" ] && step=$(cat "$checkpoint")
echo "$QUOTIENT_JOB_ID attempt $QUOTIENT_ATTEMPT starts at step $step on GPU $CUDA_VISIBLE_DEVICES"
echo "$QUOTIENT_ATTEMPT $step" >> "$QUOTIENT_CHECKPOINT_DIR/attempts"
trap 'echo "$step" > "$checkpoint"; echo "checkpointed at step $step"; exit 0' TERM
while true; do
  step=$((step + 1))
  sleep 0.2
done
"#;

/// Arguments of `quotient demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where the demo cluster lives [default: a new folder in the system's temp dir].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Leave the cluster running at the end (stop it with `quotient dev down --dir DIR`).
    #[arg(long)]
    pub keep: bool,
}

/// Stops the demo cluster when the demo ends, however it ends.
struct ClusterGuard {
    dir: PathBuf,
    keep: bool,
    /// The folder is the demo's own temporary one: remove it once the cluster is down.
    remove: bool,
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        if self.keep {
            println!(
                "\nThe cluster is still running. Stop it with: quotient dev down --dir {}",
                self.dir.display()
            );
            return;
        }
        println!("\n--- stopping the cluster");
        let stopped = match dev_down::stop_cluster(&DevDownArgs {
            dir: self.dir.clone(),
        }) {
            Ok(stopped) => stopped,
            Err(error) => {
                eprintln!("error: could not stop the demo cluster: {error:#}");
                return;
            }
        };
        let what = format!(
            "Stopped {} coordinators and {} agents",
            stopped.coordinators, stopped.agents
        );
        if !self.remove {
            println!(
                "{what}. Their data stays in {}: `quotient dev up --dir {}` starts the cluster \
                 again.",
                stopped.dir.display(),
                self.dir.display()
            );
            return;
        }
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => println!(
                "{what} and removed the demo's folder {} (use --dir DIR to keep it).",
                self.dir.display()
            ),
            Err(error) => eprintln!(
                "{what}, but could not remove the demo's folder {}: {error}",
                self.dir.display()
            ),
        }
    }
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("quotient-demo-{}", std::process::id())),
    };
    if dir.join("cluster.json").exists() {
        bail!(
            "{} already holds a cluster: the demo needs a fresh one; pick another --dir",
            dir.display()
        );
    }
    println!("Quotient demo: the walkthrough of docs/quota-shares.md on a local cluster.");
    println!(
        "--- starting 3 coordinators and 3 agents with one simulated a10g GPU each in {}",
        dir.display()
    );
    let global = GlobalArgs {
        config: None,
        output: OutputFormat::Table,
    };
    let up = DevUpArgs {
        dir: dir.clone(),
        coordinators: Some(3),
        nodes: Some(3),
        gpus_per_node: Some(1),
        gpu_class: Some(GpuClass::parse("a10g").expect("a valid class")),
        racks: None,
        retain_finished: None,
        // A folder the demo removes at its end is no use to export (found by probing).
        no_export: args.dir.is_none() && !args.keep,
    };
    let _guard = ClusterGuard {
        dir: dir.clone(),
        keep: args.keep,
        remove: args.dir.is_none(),
    };
    dev_up::run(&global, &up)?;
    let config: ClientConfig = client_config::load(Some(&dir.join(CLIENT_CONFIG_FILE)))?;
    let mut demo = Demo {
        session: Session::from_config(&config)?,
        script: write_job_script(&dir)?,
    };
    demo.walkthrough()
}

fn write_job_script(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("demo-job.sh");
    fs::write(&path, JOB_SCRIPT).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))?;
    Ok(path)
}

struct Demo {
    session: Session,
    script: PathBuf,
}

/// What one job must be for a step to be reached.
struct Expect<'a> {
    job: &'a JobId,
    state: &'a str,
}

impl Demo {
    fn walkthrough(&mut self) -> anyhow::Result<()> {
        println!("\n--- three shares, each entitled to 1 a10g GPU");
        self.share("QS1", Strategy::LendAndBorrow, Some(200), true)?;
        self.share("QS2", Strategy::Lend, None, false)?;
        self.share("QS3", Strategy::Reserve, None, false)?;
        println!("QS1 lends and borrows (up to 200% more), and lets its high-priority jobs preempt its own low ones.");
        println!("QS2 lends its idle GPU. QS3 reserves its GPU: it never lends it.");

        println!("\n--- step 1: submit high (priority 3), med (2) and low (1) to QS1");
        let high = self.submit("QS1", "high", 3)?;
        let med = self.submit("QS1", "med", 2)?;
        let low = self.submit("QS1", "low", 1)?;
        self.wait_for(&[
            Expect {
                job: &high,
                state: "RUNNING",
            },
            Expect {
                job: &med,
                state: "RUNNING",
            },
            Expect {
                job: &low,
                state: "RUNNABLE",
            },
        ])?;
        self.show()?;
        println!("high runs on QS1's own GPU; med runs on the GPU QS2 lends; low waits: QS3 never lends its idle GPU.");

        println!("\n--- step 2: QS2 submits a job of its own");
        let qs2 = self.submit("QS2", "qs2-job", 1)?;
        self.wait_for(&[
            Expect {
                job: &high,
                state: "RUNNING",
            },
            Expect {
                job: &med,
                state: "RUNNABLE",
            },
            Expect {
                job: &low,
                state: "RUNNABLE",
            },
            Expect {
                job: &qs2,
                state: "RUNNING",
            },
        ])?;
        self.show()?;
        let med_view = self.job(&med)?;
        println!(
            "QS2 took its GPU back: med (borrowed) got its checkpoint signal and went back to the queue ({} preemption: {}). QS3 is untouched.",
            med_view.preemptions,
            med_view.last_preemption.unwrap_or_default()
        );

        println!("\n--- step 3: raise low's priority from 1 to 4");
        self.call(ApiRequest::UpdateJobPriority {
            job: low,
            priority: 4,
        })?;
        self.wait_for(&[
            Expect {
                job: &high,
                state: "RUNNABLE",
            },
            Expect {
                job: &med,
                state: "RUNNABLE",
            },
            Expect {
                job: &low,
                state: "RUNNING",
            },
            Expect {
                job: &qs2,
                state: "RUNNING",
            },
        ])?;
        self.show()?;
        println!("With nothing left to borrow, QS1's in-share preemption stopped high (priority 3) for low (priority 4).");
        if let ApiResponse::Explanation { summary, details } =
            self.call(ApiRequest::ExplainJob { job: high })?
        {
            println!("\n$ quotient job explain {high}\n{summary}");
            for line in details {
                println!("  {line}");
            }
        }
        println!("\nThe walkthrough reached exactly the states of docs/quota-shares.md.");
        Ok(())
    }

    fn call(&mut self, request: ApiRequest) -> anyhow::Result<ApiResponse> {
        self.session.call(request)
    }

    fn share(
        &mut self,
        name: &str,
        strategy: Strategy,
        borrow: Option<u32>,
        in_share: bool,
    ) -> anyhow::Result<()> {
        let spec = ShareSpec {
            name: name.into(),
            limits: [(GpuClass::parse("a10g").expect("valid"), 1)].into(),
            strategy,
            borrow_limit_percent: borrow,
            in_share_preemption: in_share,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        };
        self.call(ApiRequest::CreateShare(spec))?;
        Ok(())
    }

    fn submit(&mut self, share: &str, name: &str, priority: u32) -> anyhow::Result<JobId> {
        let spec = JobSpec {
            name: Some(name.into()),
            share: share.into(),
            priority,
            gpus: 1,
            gpu_class: None,
            payload: JobPayload {
                image: None,
                command: vec![self.script.display().to_string()].into(),
            },
            env: Default::default(),
            checkpoint_signal: Signal::Sigterm,
            grace_period_ms: GRACE_PERIOD_MS,
            max_preemptions: None,
            idempotency_key: Some(format!("demo-{}-{name}", std::process::id())),
            cpu_millis: None,
            memory_bytes: None,
            time_limit_ms: None,
            retry: Default::default(),
            nodes: 1,
            same: None,
            owner: None,
        };
        match self.call(ApiRequest::SubmitJob(spec))? {
            ApiResponse::JobSubmitted { job, .. } => {
                println!("submitted {name} as {job}");
                Ok(job)
            }
            other => bail!("unexpected answer to a submit: {other:?}"),
        }
    }

    fn job(&mut self, id: &JobId) -> anyhow::Result<JobView> {
        match self.call(ApiRequest::GetJob { job: *id })? {
            ApiResponse::Job(job) => Ok(*job),
            other => bail!("unexpected answer to job get: {other:?}"),
        }
    }

    /// Every job, in submit order.
    fn jobs(&mut self) -> anyhow::Result<Vec<JobView>> {
        let first = ApiRequest::list_jobs(quotient_common::api::JOB_PAGE_MAX);
        let mut jobs = self.session.every_job(first)?;
        jobs.reverse();
        Ok(jobs)
    }

    fn shares(&mut self) -> anyhow::Result<Vec<ShareView>> {
        match self.call(ApiRequest::ListShares)? {
            ApiResponse::Shares(shares) => Ok(shares),
            other => bail!("unexpected answer to share list: {other:?}"),
        }
    }

    /// Polls until every expected job is in its state, within `STEP_DEADLINE_MS`.
    fn wait_for(&mut self, expected: &[Expect<'_>]) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(STEP_DEADLINE_MS);
        loop {
            let jobs = self.jobs()?;
            let state_of = |id: &JobId| {
                let id = id.to_string();
                jobs.iter().find(|j| j.id == id).map(|j| j.state.clone())
            };
            let missing: Vec<String> = expected
                .iter()
                .filter(|e| state_of(e.job).as_deref() != Some(e.state))
                .map(|e| {
                    format!(
                        "{} should be {} but is {:?}",
                        e.job,
                        e.state,
                        state_of(e.job)
                    )
                })
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the cluster did not reach the walkthrough's states within {} s: {}; the logs are in the cluster's folder",
                    STEP_DEADLINE_MS / 1000,
                    missing.join("; ")
                );
            }
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
    }

    fn show(&mut self) -> anyhow::Result<()> {
        let shares = self.shares()?;
        let jobs = self.jobs()?;
        println!("\nShares (usage, borrowed and lent are in GPUs):");
        print!("{}", output::share_table(&shares));
        println!("Jobs:");
        print!("{}", output::job_table(&jobs));
        Ok(())
    }
}
