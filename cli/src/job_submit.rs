//! `quotient job submit --share NAME [--priority N] --gpus N [...] -- COMMAND [ARGS ...]`:
//! queues a job and prints its id alone on stdout (`-o json`: the job's JSON).
//!
//! Defaults are AWS Batch's: without `--priority` a job gets priority 0 (the lowest), and
//! without `--name` the coordinators name it after what it runs, with a random suffix
//! (`quotient_common::job_name`), so that every job has a name to find it by.
//!
//! The spec is checked locally with the shared validation, so a bad one is a usage error
//! (exit 2) before anything is sent. Every submit carries an idempotency key: the user's
//! `--idempotency-key`, else a fresh one made here, so the client may resend a submit whose
//! answer was lost without making a second job.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::job::GRACE_PERIOD_DEFAULT_MS;
use quotient_common::{GpuClass, JobPayload, JobSpec, RetryPolicy, RetryRule, Signal};

use crate::client::{unexpected, Session};
use crate::output::{self, OutputFormat};
use crate::parse::{
    parse_cpus, parse_env, parse_gpu_class, parse_grace_period_ms, parse_job_gpus, parse_job_name,
    parse_memory, parse_priority, parse_retry_rule, parse_share_name, parse_signal,
    parse_time_limit_ms, UsageError,
};
use crate::GlobalArgs;

/// Arguments of `quotient job submit`.
#[derive(Debug, clap::Args)]
pub struct JobSubmitArgs {
    /// The share the job runs under.
    #[arg(long, value_parser = parse_share_name)]
    pub share: String,
    /// 0-9999; higher runs first and may preempt lower (see docs/quota-shares.md).
    #[arg(long, value_parser = parse_priority, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: u32,
    /// GPUs the job needs on each of its nodes, 1-64.
    #[arg(long, value_parser = parse_job_gpus, allow_negative_numbers = true)]
    pub gpus: u32,
    /// How many distinct nodes the job runs on, --gpus on each (1-256). A job of several
    /// nodes is placed, stopped and preempted as one unit and counts nodes x gpus against
    /// its share; each member gets its rank and its peers (QUOTIENT_NODE_RANK, MASTER_ADDR,
    /// ...).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = crate::parse::parse_job_nodes, allow_negative_numbers = true)]
    pub nodes: u32,
    /// A node label key (e.g. rack) whose value all of the job's nodes must share [default:
    /// the job prefers few racks but takes any nodes].
    #[arg(long, value_name = "KEY")]
    pub same: Option<String>,
    /// The GPU class; may be left out when the share has limits for one class only.
    #[arg(long, value_name = "CLASS", value_parser = parse_gpu_class)]
    pub gpu_class: Option<GpuClass>,
    /// A name to find the job by in tables [default: generated from the command or image,
    /// e.g. train-k7x2q].
    #[arg(long, value_parser = parse_job_name)]
    pub name: Option<String>,
    /// The signal that asks the job to checkpoint and stop when it is preempted.
    #[arg(long, value_name = "SIGNAL", value_parser = parse_signal, default_value = "SIGTERM")]
    pub checkpoint_signal: Signal,
    /// Time between the checkpoint signal and the kill: e.g. 500ms, 30s, 5m (at most 60m)
    /// [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_grace_period_ms)]
    pub grace_period: Option<u64>,
    /// Fail the job instead of requeueing it after this many preemptions (default: no limit).
    #[arg(long, value_name = "N", value_parser = crate::parse::parse_max_preemptions, allow_negative_numbers = true)]
    pub max_preemptions: Option<u32>,
    /// Run in this container image instead of as a process on the agent's host.
    #[arg(long)]
    pub image: Option<String>,
    /// An environment variable for the job, KEY=VALUE; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// CPUs for the job, e.g. 4 or 0.5 [default: its share of the node's CPUs, in proportion
    /// to the GPUs it takes there]. Enforced with cgroups (processes) or Docker's limits.
    #[arg(long, value_name = "N", value_parser = parse_cpus)]
    pub cpus: Option<u32>,
    /// Memory for the job, e.g. 16G or 512Mi [default: its share of the node's memory, as for
    /// --cpus]. Past it, the kernel kills the job.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<u64>,
    /// How long an attempt may run, e.g. 90m, 12h or 2d [default: no limit]. At the limit the
    /// job gets its checkpoint signal and grace period, then fails with reason "time limit".
    #[arg(long, value_name = "DURATION", value_parser = parse_time_limit_ms)]
    pub time_limit: Option<u64>,
    /// Start a failed attempt again up to N times (0-9): a non-zero exit, the time limit, or
    /// a launch failure of the job's own making. Node loss and preemptions never use a retry.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub retries: u32,
    /// A rule deciding whether a failure is retried, ACTION:CONDITION[,CONDITION]: ACTION is
    /// retry or exit; a CONDITION is exit-code=PATTERN or reason=PATTERN, where a trailing *
    /// matches any rest (retry:exit-code=137, exit:reason=time*). The first rule that matches
    /// decides; with none matching, the failure is retried. Repeat for several (at most 5).
    #[arg(long = "retry-on", value_name = "RULE", value_parser = parse_retry_rule)]
    pub retry_on: Vec<RetryRule>,
    /// Retrying a submit with the same key returns the same job instead of a new one.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// The command and its arguments, after `--` (may be empty with --image).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Builds the job spec and checks it as the state machine would. `fresh_key` is used as the
/// idempotency key when the user gave none.
pub fn spec(args: &JobSubmitArgs, fresh_key: String) -> Result<JobSpec, UsageError> {
    let mut env = BTreeMap::new();
    for (key, value) in &args.env {
        if env.insert(key.clone(), value.clone()).is_some() {
            return Err(UsageError(format!(
                "--env sets {key} twice: give each variable once"
            )));
        }
    }
    if args.image.is_none() && args.command.is_empty() {
        return Err(UsageError(
            "no command: put it after `--`, e.g. `quotient job submit ... -- python train.py`, \
             or give --image"
                .to_string(),
        ));
    }
    let spec = JobSpec {
        name: args.name.clone(),
        share: args.share.clone(),
        priority: args.priority,
        gpus: args.gpus,
        gpu_class: args.gpu_class.clone(),
        payload: JobPayload {
            image: args.image.clone(),
            command: args.command.clone().into(),
        },
        env: env.into(),
        checkpoint_signal: args.checkpoint_signal,
        grace_period_ms: args.grace_period.unwrap_or(GRACE_PERIOD_DEFAULT_MS),
        max_preemptions: args.max_preemptions,
        idempotency_key: Some(args.idempotency_key.clone().unwrap_or(fresh_key)),
        cpu_millis: args.cpus,
        memory_bytes: args.memory,
        time_limit_ms: args.time_limit,
        retry: RetryPolicy {
            retries: args.retries,
            rules: args.retry_on.clone(),
        },
        nodes: args.nodes,
        same: args.same.clone(),
        // Set by the coordinators from the caller's certificate.
        owner: None,
    };
    if !spec.retry.rules.is_empty() && spec.retry.retries == 0 {
        return Err(UsageError(
            "--retry-on needs --retries N: rules decide which failures use a retry".to_string(),
        ));
    }
    spec.validate_new()
        .map_err(|error| UsageError(error.to_string()))?;
    Ok(spec)
}

/// Whether a submit failed because its share does not exist (the only thing a submit can
/// name that is not found), so that the error can offer a near share's name.
fn is_unknown_share(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<crate::failure::RequestFailed>()
        .is_some_and(|failed| {
            failed.code == quotient_common::ErrorCode::NotFound
                && failed.message.contains("no share named")
        })
}

/// An idempotency key unique to this invocation: process id and the clock in nanoseconds.
fn fresh_idempotency_key() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!("cli-{}-{nanos}", std::process::id())
}

pub fn run(global: &GlobalArgs, args: &JobSubmitArgs) -> anyhow::Result<()> {
    let spec = spec(args, fresh_idempotency_key())?;
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::SubmitJob(spec);
    let answer = match session.call(request.clone()) {
        Err(error) if is_unknown_share(&error) => {
            return Err(crate::share_list::unknown_share(&mut session, &args.share))
        }
        answer => answer?,
    };
    let (job, duplicate) = match answer {
        ApiResponse::JobSubmitted { job, duplicate } => (job, duplicate),
        other => return Err(unexpected(&request, &other)),
    };
    if duplicate && args.idempotency_key.is_some() {
        eprintln!("note: a job with this idempotency key already exists; this is that job");
    }
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&format!("{job}\n")),
        OutputFormat::Json => {
            let view = crate::job_get::fetch(&mut session, job)
                .with_context(|| format!("job {job} was submitted, but reading it back failed"))?;
            output::print_json(&view)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: JobSubmitArgs,
    }

    fn parse(arguments: &[&str]) -> Result<JobSubmitArgs, clap::Error> {
        Wrapper::try_parse_from(std::iter::once("submit").chain(arguments.iter().copied()))
            .map(|wrapper| wrapper.args)
    }

    #[test]
    fn every_flag_lands_in_the_spec() {
        // Proves the spec's flags, the `--` command and the grace-period units.
        let args = parse(&[
            "--share",
            "qs1",
            "--priority",
            "3",
            "--gpus",
            "2",
            "--gpu-class",
            "a10g",
            "--name",
            "high",
            "--checkpoint-signal",
            "SIGUSR1",
            "--grace-period",
            "45s",
            "--max-preemptions",
            "2",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--idempotency-key",
            "k1",
            "--",
            "python",
            "train.py",
            "--lr",
            "3",
        ])
        .unwrap();
        let spec = spec(&args, "fresh".into()).unwrap();
        assert_eq!(spec.share, "qs1");
        assert_eq!((spec.priority, spec.gpus), (3, 2));
        assert_eq!(spec.gpu_class.unwrap().as_str(), "a10g");
        assert_eq!(spec.checkpoint_signal, Signal::Sigusr1);
        assert_eq!(spec.grace_period_ms, 45_000);
        assert_eq!(spec.max_preemptions, Some(2));
        assert_eq!(&spec.env["B"], "x=y");
        assert_eq!(spec.idempotency_key.as_deref(), Some("k1"));
        assert_eq!(spec.payload.command, ["python", "train.py", "--lr", "3"]);
    }

    #[test]
    fn a_submit_without_a_key_gets_a_fresh_one() {
        // Proves a resend after a lost answer cannot make a second job.
        let args = parse(&[
            "--share",
            "qs1",
            "--priority",
            "1",
            "--gpus",
            "1",
            "--",
            "true",
        ])
        .unwrap();
        let spec = spec(&args, "fresh".into()).unwrap();
        assert_eq!(spec.idempotency_key.as_deref(), Some("fresh"));
        assert_eq!(spec.grace_period_ms, GRACE_PERIOD_DEFAULT_MS);
        assert!(fresh_idempotency_key().starts_with("cli-"));
    }

    #[test]
    fn a_submit_without_priority_or_name_gets_priority_0_and_no_name_yet() {
        // Proves the defaults: priority 0 as in AWS Batch, and no name from the CLI, so that
        // the coordinators generate one (a name given with --name is sent as it is).
        let args = parse(&["--share", "qs1", "--gpus", "1", "--", "train.sh"]).unwrap();
        let defaults = spec(&args, "fresh".into()).unwrap();
        assert_eq!(defaults.priority, 0);
        assert_eq!(defaults.name, None);
        let named = parse(&["--share", "qs1", "--gpus", "1", "--name", "mine", "--", "x"]).unwrap();
        assert_eq!(
            spec(&named, "k".into()).unwrap().name.as_deref(),
            Some("mine")
        );
    }

    #[test]
    fn bad_values_are_usage_errors() {
        // Proves cheap checks fail before any request: priority, gpus, duration, command, env.
        let base = ["--share", "qs1", "--gpus", "1"];
        let with = |extra: &[&str]| {
            let mut all: Vec<&str> = base.to_vec();
            all.extend_from_slice(extra);
            parse(&all)
        };
        assert!(with(&["--priority", "10000", "--", "true"]).is_err());
        assert!(with(&["--priority", "1", "--grace-period", "30", "--", "true"]).is_err());
        assert!(parse(&[
            "--share",
            "qs1",
            "--priority",
            "1",
            "--gpus",
            "0",
            "--",
            "true"
        ])
        .is_err());
        let no_command = with(&["--priority", "1"]).unwrap();
        assert!(spec(&no_command, "k".into()).unwrap_err().0.contains("--"));
        let reserved = with(&[
            "--priority",
            "1",
            "--env",
            "CUDA_VISIBLE_DEVICES=0",
            "--",
            "true",
        ])
        .unwrap();
        assert!(spec(&reserved, "k".into()).is_err());
    }
}
