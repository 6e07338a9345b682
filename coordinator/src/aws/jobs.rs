//! Service jobs: a SageMaker CreateTrainingJob request (`serviceRequestPayload`) becomes a
//! Quotient job of the image it names, on `InstanceCount` nodes with the GPUs of its
//! `InstanceType`; the agent gives the container the SageMaker training contract from the
//! job's `QUOTIENT_SAGEMAKER` variable (agent `runtime::sagemaker`). The request itself is
//! kept with the job, for DescribeServiceJob.

use std::collections::BTreeMap;

use quotient_common::api::{ApiRequest, ApiResponse, AttemptView, JobView};
use quotient_common::certs::PeerIdentity;
use quotient_common::job::{PRIORITY_MAX, TIME_LIMIT_MS_MAX, TIME_LIMIT_MS_MIN};
use quotient_common::retry::{RetryAction, RetryPolicy, RetryRule};
use quotient_common::{JobId, JobSpec, JobState};
use serde_json::{json, Map, Value};

use super::{
    integer, millis, name_of, required, string, AwsError, Door, InstanceTypes, ACCOUNT_ID,
};

/// The variable that carries the SageMaker training contract to the agent.
pub const SAGEMAKER_ENV: &str = "QUOTIENT_SAGEMAKER";
/// Where the checkpoint directory is mounted when the request names no `LocalPath`.
pub const CHECKPOINT_PATH_DEFAULT: &str = "/opt/ml/checkpoints";
/// Service jobs on one page of `ListServiceJobs` when `maxResults` is not given.
const PAGE_DEFAULT: usize = 100;
/// How many pages of the job list one `ListServiceJobs` answer reads before it answers with
/// what it found and a token to go on.
const LIST_PAGES_MAX: usize = 10;
/// How many of a job's latest preempted attempts DescribeServiceJob shows.
const RECENT_PREEMPTIONS_MAX: usize = 5;

fn job_id(text: &str) -> Result<JobId, AwsError> {
    name_of(text)
        .parse()
        .map_err(|error: String| AwsError::client(error))
}

fn object<'a>(value: &'a Value, name: &str) -> Result<Option<&'a Map<String, Value>>, AwsError> {
    match value.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(_) => Err(AwsError::client(format!("{name} must be an object"))),
    }
}

fn strings(value: &Value, name: &str) -> Result<Option<Vec<String>>, AwsError> {
    match value.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| AwsError::client(format!("{name} must be a list of strings")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(AwsError::client(format!(
            "{name} must be a list of strings"
        ))),
    }
}

fn string_map(value: &Value, name: &str) -> Result<BTreeMap<String, String>, AwsError> {
    let Some(map) = object(value, name)? else {
        return Ok(BTreeMap::new());
    };
    map.iter()
        .map(|(key, value)| {
            value
                .as_str()
                .map(|text| (key.clone(), text.to_string()))
                .ok_or_else(|| AwsError::client(format!("{name}.{key} must be a string")))
        })
        .collect()
}

/// The job a SubmitServiceJob request asks for.
fn spec_of(types: &InstanceTypes, input: &Value) -> Result<JobSpec, AwsError> {
    let job_name = required(input, "jobName")?;
    let kind = required(input, "serviceJobType")?;
    if kind != "SAGEMAKER_TRAINING" {
        return Err(AwsError::client(format!(
            "serviceJobType {kind:?} must be SAGEMAKER_TRAINING"
        )));
    }
    let share = match (
        string(input, "quotaShareName")?,
        string(input, "shareIdentifier")?,
    ) {
        (Some(share), _) | (None, Some(share)) => share,
        (None, None) => {
            return Err(AwsError::client(
                "name the quota share the job runs in: quotaShareName",
            ))
        }
    };
    let payload: Value =
        serde_json::from_str(required(input, "serviceRequestPayload")?).map_err(|error| {
            AwsError::client(format!(
                "serviceRequestPayload is not a JSON CreateTrainingJob request: {error}"
            ))
        })?;
    let algorithm = payload
        .get("AlgorithmSpecification")
        .ok_or_else(|| AwsError::client("serviceRequestPayload needs AlgorithmSpecification"))?;
    let image = required(algorithm, "TrainingImage")?;
    let entrypoint = strings(algorithm, "ContainerEntrypoint")?;
    let arguments = strings(algorithm, "ContainerArguments")?;
    let resources = payload
        .get("ResourceConfig")
        .ok_or_else(|| AwsError::client("serviceRequestPayload needs ResourceConfig"))?;
    let instance_type = required(resources, "InstanceType")?;
    let instance = types.get(instance_type).map_err(AwsError::client)?;
    let count = integer(resources, "InstanceCount")?.unwrap_or(1);
    let nodes = u32::try_from(count)
        .ok()
        .filter(|n| (1..=quotient_common::job::JOB_NODES_MAX).contains(n))
        .ok_or_else(|| {
            AwsError::client(format!(
                "InstanceCount must be 1 to {}",
                quotient_common::job::JOB_NODES_MAX
            ))
        })?;
    let mut spec = JobSpec::new(
        share,
        0,
        instance.gpus,
        match (&entrypoint, arguments) {
            (_, Some(arguments)) => arguments,
            (Some(_), None) => Vec::new(),
            // As SageMaker runs an image: its own entrypoint, with the argument `train`.
            (None, None) => vec!["train".to_string()],
        },
    );
    spec.name = Some(job_name.to_string());
    spec.payload.image = Some(image.to_string());
    spec.gpu_class = Some(instance.class.clone());
    spec.nodes = nodes;
    if let Some(priority) = integer(input, "schedulingPriority")? {
        spec.priority = scheduling_priority(priority)?;
    }
    spec.env = string_map(&payload, "Environment")?.into();
    let seconds_of = |value: Option<&Value>, holder: &str, field: &str| {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        if !value.is_object() {
            return Err(AwsError::client(format!(
                "{holder} must be a JSON object (with {field})"
            )));
        }
        let Some(seconds) = integer(value, field)? else {
            return Ok(None);
        };
        let (min, max) = (TIME_LIMIT_MS_MIN / 1_000, TIME_LIMIT_MS_MAX / 1_000);
        u64::try_from(seconds)
            .ok()
            .filter(|s| (min..=max).contains(s))
            .map(Some)
            .ok_or_else(|| {
                AwsError::client(format!(
                    "{field} {seconds} must be {min} to {max} (a year) seconds"
                ))
            })
    };
    let limits = [
        seconds_of(
            payload.get("StoppingCondition"),
            "StoppingCondition",
            "MaxRuntimeInSeconds",
        )?,
        seconds_of(
            input.get("timeoutConfig"),
            "timeoutConfig",
            "attemptDurationSeconds",
        )?,
    ];
    if let Some(seconds) = limits.into_iter().flatten().min() {
        spec.time_limit_ms = Some(seconds * 1_000);
    }
    if let Some(retry) = input.get("retryStrategy") {
        let attempts = integer(retry, "attempts")?
            .ok_or_else(|| AwsError::client("retryStrategy.attempts is required"))?;
        let attempts = u32::try_from(attempts)
            .ok()
            .filter(|n| (1..=10).contains(n))
            .ok_or_else(|| AwsError::client("retryStrategy.attempts must be 1 to 10"))?;
        let mut rules = Vec::new();
        let list = match retry.get("evaluateOnExit") {
            None | Some(Value::Null) => &Vec::new(),
            Some(Value::Array(list)) => list,
            Some(_) => {
                return Err(AwsError::client(
                    "retryStrategy.evaluateOnExit must be a list of {action, onStatusReason}",
                ))
            }
        };
        for rule in list {
            let action = match required(rule, "action")?.to_ascii_uppercase().as_str() {
                "RETRY" => RetryAction::Retry,
                "EXIT" => RetryAction::Exit,
                other => {
                    return Err(AwsError::client(format!(
                        "evaluateOnExit action {other:?} must be RETRY or EXIT"
                    )))
                }
            };
            rules.push(RetryRule {
                on_exit_code: None,
                on_reason: Some(string(rule, "onStatusReason")?.unwrap_or("*").to_string()),
                action,
            });
        }
        spec.retry = RetryPolicy {
            retries: attempts - 1,
            rules,
        };
    }
    if let Some(preemption) = input.get("preemptionConfiguration") {
        if let Some(retries) = integer(preemption, "preemptionRetriesBeforeTermination")? {
            spec.max_preemptions = Some(u32::try_from(retries).map_err(|_| {
                AwsError::client(format!(
                    "preemptionRetriesBeforeTermination {retries} must be 0 to {}",
                    u32::MAX
                ))
            })?);
        }
    }
    if let Some(token) = string(input, "clientToken")? {
        spec.idempotency_key = Some(format!("aws:{token}"));
    }
    // What the agent needs to give the container SageMaker's training contract.
    let checkpoint = payload
        .get("CheckpointConfig")
        .and_then(|config| config.get("LocalPath"))
        .and_then(Value::as_str)
        .unwrap_or(CHECKPOINT_PATH_DEFAULT);
    let channels: Map<String, Value> = payload
        .get("InputDataConfig")
        .and_then(Value::as_array)
        .map(|channels| {
            channels
                .iter()
                .filter_map(|channel| {
                    let name = channel.get("ChannelName")?.as_str()?.to_string();
                    let mut config = Map::new();
                    for field in [
                        "ContentType",
                        "TrainingInputMode",
                        "S3DistributionType",
                        "RecordWrapperType",
                        "CompressionType",
                    ] {
                        if let Some(value) = channel.get(field) {
                            config.insert(field.to_string(), value.clone());
                        }
                    }
                    if let Some(mode) = channel
                        .get("DataSource")
                        .and_then(|source| source.get("S3DataSource"))
                        .and_then(|s3| s3.get("S3DataDistributionType"))
                    {
                        config.insert("S3DistributionType".to_string(), mode.clone());
                    }
                    config
                        .entry("TrainingInputMode".to_string())
                        .or_insert_with(|| json!("File"));
                    Some((name, Value::Object(config)))
                })
                .collect()
        })
        .unwrap_or_default();
    let contract = json!({
        "job_name": payload.get("TrainingJobName").and_then(Value::as_str).unwrap_or(job_name),
        "instance_type": instance_type,
        "entrypoint": entrypoint,
        "hyperparameters": string_map(&payload, "HyperParameters")?,
        "input_data_config": channels,
        "checkpoint_path": checkpoint,
    });
    let contract = contract.to_string();
    // The contract travels as one variable, held to the limit of every variable's value.
    if contract.len() > quotient_common::job::FIELD_BYTES_MAX {
        return Err(AwsError::client(format!(
            "the payload's HyperParameters, InputDataConfig, entrypoint and names take {} bytes \
             as the container's training contract ({SAGEMAKER_ENV}); together they may take at \
             most {}: pass large settings in a channel's data instead",
            contract.len(),
            quotient_common::job::FIELD_BYTES_MAX
        )));
    }
    spec.env.insert(SAGEMAKER_ENV.to_string(), contract);
    spec.validate()
        .map_err(|error| AwsError::client(error.to_string()))?;
    Ok(spec)
}

pub(super) async fn submit(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let queue = name_of(required(input, "jobQueue")?).to_string();
    super::objects::require_queue(door, caller, &queue).await?;
    let spec = spec_of(&door.settings.instance_types, input)?;
    let name = spec.name.clone().unwrap_or_default();
    let response = door
        .call(
            caller,
            ApiRequest::SubmitServiceJob {
                spec,
                request: input.to_string(),
            },
        )
        .await?;
    let ApiResponse::JobSubmitted { job, .. } = response else {
        return Err(AwsError::server("unexpected answer to a submit"));
    };
    Ok(json!({
        "jobArn": door.arn("service-job", &job.to_string()),
        "jobName": name,
        "jobId": job.to_string(),
    }))
}

/// A job and the request it came in, or `ClientException` for a job that did not come
/// through this endpoint.
async fn service_job(
    door: &Door,
    caller: &PeerIdentity,
    job: JobId,
) -> Result<(JobView, Value), AwsError> {
    let response = door.call(caller, ApiRequest::GetServiceJob { job }).await?;
    let ApiResponse::ServiceJob { job: view, request } = response else {
        return Err(AwsError::server("unexpected answer to a job read"));
    };
    let request = request
        .and_then(|request| serde_json::from_str(&request).ok())
        .ok_or_else(|| {
            AwsError::client(format!(
                "{job} was not submitted through the AWS Batch API: read it with `quotient job get {job}`"
            ))
        })?;
    Ok((*view, request))
}

/// Quotient's state as AWS Batch's status: a job being preempted still runs until it stops,
/// and a cancelled one is FAILED (and `isTerminated`).
fn status(state: &str) -> &'static str {
    match state {
        "RUNNABLE" => "RUNNABLE",
        "SCHEDULED" => "SCHEDULED",
        "STARTING" => "STARTING",
        "RUNNING" | "PREEMPTING" => "RUNNING",
        "SUCCEEDED" => "SUCCEEDED",
        _ => "FAILED",
    }
}

/// The Quotient states of an AWS status.
fn states_of(status: &str) -> Result<Vec<JobState>, AwsError> {
    Ok(match status {
        "SUBMITTED" | "PENDING" => Vec::new(),
        "RUNNABLE" => vec![JobState::Runnable],
        "SCHEDULED" => vec![JobState::Scheduled],
        "STARTING" => vec![JobState::Starting],
        "RUNNING" => vec![JobState::Running, JobState::Preempting],
        "SUCCEEDED" => vec![JobState::Succeeded],
        "FAILED" => vec![JobState::Failed, JobState::Cancelled],
        other => {
            return Err(AwsError::client(format!(
                "jobStatus {other:?} is not a service job status"
            )))
        }
    })
}

fn training_job_arn(door: &Door, view: &JobView, attempt: u32) -> Value {
    json!({
        "name": "TrainingJobArn",
        "value": format!(
            "arn:aws:sagemaker:{}:{ACCOUNT_ID}:training-job/{}-{}-{attempt}",
            door.settings.region,
            view.name.as_deref().unwrap_or("job"),
            view.id
        ),
    })
}

fn attempt_detail(door: &Door, view: &JobView, attempt: &AttemptView) -> Value {
    let mut detail = json!({ "serviceResourceId": training_job_arn(door, view, attempt.attempt) });
    if let Some(started) = attempt.started_ms {
        detail["startedAt"] = millis(started);
    }
    if let Some(stopped) = attempt.ended_ms {
        detail["stoppedAt"] = millis(stopped);
    }
    if let Some(outcome) = &attempt.outcome {
        detail["statusReason"] = json!(outcome);
    }
    detail
}

/// What a summary and a description share.
fn summary(door: &Door, view: &JobView, request: &Value) -> Value {
    let share = request
        .get("quotaShareName")
        .or_else(|| request.get("shareIdentifier"))
        .cloned()
        .unwrap_or_else(|| json!(view.share));
    let instance_type = request
        .get("serviceRequestPayload")
        .and_then(Value::as_str)
        .and_then(|payload| serde_json::from_str::<Value>(payload).ok())
        .and_then(|payload| {
            payload
                .get("ResourceConfig")
                .and_then(|r| r.get("InstanceType"))
                .cloned()
        })
        .unwrap_or_else(|| json!(view.gpu_class));
    let mut summary = json!({
        "jobArn": door.arn("service-job", &view.id),
        "jobId": view.id,
        "jobName": view.name.clone().unwrap_or_default(),
        "serviceJobType": "SAGEMAKER_TRAINING",
        "status": status(&view.state),
        "createdAt": millis(view.submitted_ms),
        "isTerminated": view.state == "CANCELLED",
        "quotaShareName": share,
        "capacityUsage": [{ "capacityUnit": instance_type, "quantity": f64::from(view.node_count) }],
    });
    if request.get("shareIdentifier").is_some() {
        summary["shareIdentifier"] = request["shareIdentifier"].clone();
    }
    if let Some(reason) = &view.reason {
        summary["statusReason"] = json!(reason);
    }
    if let Some(first) = view.attempt_history.first() {
        summary["scheduledAt"] = millis(first.placed_ms);
    }
    if let Some(started) = view.started_ms {
        summary["startedAt"] = millis(started);
    }
    if let Some(ended) = view.ended_ms {
        summary["stoppedAt"] = millis(ended);
    }
    if let Some(last) = view.attempt_history.last() {
        summary["latestAttempt"] =
            json!({ "serviceResourceId": training_job_arn(door, view, last.attempt) });
    }
    summary
}

pub(super) async fn describe(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let job = job_id(required(input, "jobId")?)?;
    let (view, request) = service_job(door, caller, job).await?;
    let mut detail = summary(door, &view, &request);
    detail["jobQueue"] = json!(door.arn(
        "job-queue",
        name_of(request["jobQueue"].as_str().unwrap_or_default())
    ));
    detail["schedulingPriority"] = json!(view.priority);
    for field in [
        "serviceRequestPayload",
        "retryStrategy",
        "timeoutConfig",
        "preemptionConfiguration",
    ] {
        if let Some(value) = request.get(field) {
            detail[field] = value.clone();
        }
    }
    detail["tags"] = request.get("tags").cloned().unwrap_or_else(|| json!({}));
    detail["attempts"] = json!(view
        .attempt_history
        .iter()
        .map(|attempt| attempt_detail(door, &view, attempt))
        .collect::<Vec<_>>());
    let preempted: Vec<Value> = view
        .attempt_history
        .iter()
        .filter(|attempt| {
            attempt
                .outcome
                .as_deref()
                .is_some_and(|outcome| outcome.starts_with("preempted"))
        })
        .rev()
        .take(RECENT_PREEMPTIONS_MAX)
        .map(|attempt| attempt_detail(door, &view, attempt))
        .collect();
    detail["preemptionSummary"] = json!({
        "preemptedAttemptCount": view.preemptions,
        "recentPreemptedAttempts": preempted,
    });
    Ok(detail)
}

/// A `filters` entry of ListServiceJobs.
enum Filter {
    Name { prefix: bool, text: String },
    Before(u64),
    After(u64),
    Share(String),
}

fn filters(input: &Value) -> Result<Vec<Filter>, AwsError> {
    let Some(list) = input.get("filters").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for filter in list {
        let name = required(filter, "name")?;
        let values = strings(filter, "values")?.unwrap_or_default();
        let [value] = &values[..] else {
            return Err(AwsError::client(format!(
                "filter {name} needs exactly one value"
            )));
        };
        let time = |value: &str| {
            value.parse::<u64>().map_err(|_| {
                AwsError::client(format!(
                    "filter {name}: {value:?} is not milliseconds since the epoch"
                ))
            })
        };
        found.push(match name {
            "JOB_NAME" => match value.strip_suffix('*') {
                Some(prefix) => Filter::Name {
                    prefix: true,
                    text: prefix.to_lowercase(),
                },
                None => Filter::Name {
                    prefix: false,
                    text: value.to_lowercase(),
                },
            },
            "BEFORE_CREATED_AT" => Filter::Before(time(value)?),
            "AFTER_CREATED_AT" => Filter::After(time(value)?),
            "SHARE_IDENTIFIER" | "QUOTA_SHARE_NAME" => Filter::Share(value.clone()),
            other => {
                return Err(AwsError::client(format!(
                    "unknown filter {other}: use JOB_NAME, BEFORE_CREATED_AT, AFTER_CREATED_AT, \
                     SHARE_IDENTIFIER or QUOTA_SHARE_NAME"
                )))
            }
        });
    }
    Ok(found)
}

pub(super) async fn list(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let limit = match integer(input, "maxResults")? {
        None => PAGE_DEFAULT,
        Some(n) if (1..=1000).contains(&n) => n as usize,
        Some(_) => return Err(AwsError::client("maxResults must be 1 to 1000")),
    };
    let queue = string(input, "jobQueue")?.map(|queue| name_of(queue).to_string());
    let filters = filters(input)?;
    let share = filters.iter().find_map(|filter| match filter {
        Filter::Share(share) => Some(share.clone()),
        _ => None,
    });
    // As AWS: with a filter other than a share's, jobStatus is ignored.
    let status_counts = filters.is_empty() || share.is_some();
    let states = match string(input, "jobStatus")? {
        Some(status) if status_counts => Some(states_of(status)?),
        _ => None,
    };
    let mut token = string(input, "nextToken")?.map(str::to_string);
    let mut found = Vec::new();
    for _ in 0..LIST_PAGES_MAX {
        let want = limit - found.len();
        let request = ApiRequest::ListJobs {
            share: share.clone(),
            state: match states.as_deref() {
                Some([one]) => Some(*one),
                _ => None,
            },
            mine: false,
            name_prefix: None,
            limit: u32::try_from(want).unwrap_or(1000),
            page_token: token.clone(),
        };
        let ApiResponse::Jobs(page) = door.call(caller, request).await? else {
            return Err(AwsError::server("unexpected answer to a job list"));
        };
        let requests: Vec<Option<Value>> = door.ctx.state_machine.read(|state| {
            page.jobs
                .iter()
                .map(|view| {
                    let id: JobId = view.id.parse().ok()?;
                    serde_json::from_str(state.service_job(id)?).ok()
                })
                .collect()
        });
        for (view, request) in page.jobs.iter().zip(requests) {
            let Some(request) = request else { continue };
            if queue.as_ref().is_some_and(|queue| {
                name_of(request["jobQueue"].as_str().unwrap_or_default()) != queue
            }) {
                continue;
            }
            if let Some(states) = &states {
                if !states.iter().any(|state| state.as_str() == view.state) {
                    continue;
                }
            }
            let name = view.name.as_deref().unwrap_or_default().to_lowercase();
            let kept = filters.iter().all(|filter| match filter {
                Filter::Name { prefix: true, text } => name.starts_with(text.as_str()),
                Filter::Name {
                    prefix: false,
                    text,
                } => name == *text,
                Filter::Before(ms) => view.submitted_ms < *ms,
                Filter::After(ms) => view.submitted_ms > *ms,
                Filter::Share(_) => true,
            });
            if kept {
                found.push(summary(door, view, &request));
            }
        }
        token = page.next_page_token;
        if token.is_none() || found.len() >= limit {
            break;
        }
    }
    let mut answer = json!({ "jobSummaryList": found });
    if let Some(token) = token {
        answer["nextToken"] = json!(token);
    }
    Ok(answer)
}

/// `schedulingPriority` as a job's priority, or why not.
fn scheduling_priority(priority: i64) -> Result<u32, AwsError> {
    u32::try_from(priority)
        .ok()
        .filter(|p| *p <= PRIORITY_MAX)
        .ok_or_else(|| {
            AwsError::client(format!(
                "schedulingPriority {priority} must be 0 to {PRIORITY_MAX}"
            ))
        })
}

pub(super) async fn update(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let job = job_id(required(input, "jobId")?)?;
    let priority = integer(input, "schedulingPriority")?.ok_or_else(|| {
        AwsError::client(format!(
            "schedulingPriority is required: the new priority, 0 to {PRIORITY_MAX}"
        ))
    })?;
    let priority = scheduling_priority(priority)?;
    let (view, _) = service_job(door, caller, job).await?;
    door.call(caller, ApiRequest::UpdateJobPriority { job, priority })
        .await?;
    Ok(json!({
        "jobArn": door.arn("service-job", &view.id),
        "jobName": view.name.unwrap_or_default(),
        "jobId": view.id,
    }))
}

pub(super) async fn terminate(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let job = job_id(required(input, "jobId")?)?;
    required(input, "reason")?;
    service_job(door, caller, job).await?;
    door.call(caller, ApiRequest::CancelJob { job }).await?;
    Ok(json!({}))
}

pub(super) async fn terminate_many(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let jobs = strings(input, "jobs")?.ok_or_else(|| AwsError::client("jobs is required"))?;
    if jobs.len() > 100 {
        return Err(AwsError::client("terminate at most 100 jobs at once"));
    }
    let reason = required(input, "reason")?;
    let mut successful = Vec::new();
    let mut errors = Vec::new();
    for text in jobs {
        let one = json!({ "jobId": text, "reason": reason });
        match terminate(door, caller, &one).await {
            Ok(_) => successful.push(json!(text)),
            Err(error) => {
                errors.push(json!({ "job": text, "code": error.code, "message": error.message }))
            }
        }
    }
    Ok(json!({ "successful": successful, "errors": errors }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submit(payload: Value, extra: Value) -> Value {
        let mut input = json!({
            "jobName": "train-1",
            "jobQueue": "q1",
            "serviceJobType": "SAGEMAKER_TRAINING",
            "quotaShareName": "QS1",
            "serviceRequestPayload": payload.to_string(),
        });
        for (key, value) in extra.as_object().unwrap() {
            input[key] = value.clone();
        }
        input
    }

    #[test]
    fn a_training_request_becomes_a_job() {
        let payload = json!({
            "AlgorithmSpecification": {"TrainingImage": "repo/train:1"},
            "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
            "Environment": {"MODE": "fast"},
            "HyperParameters": {"epochs": "3"},
            "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
            "CheckpointConfig": {"LocalPath": "/ckpt"},
        });
        let extra = json!({
            "schedulingPriority": 7,
            "retryStrategy": {"attempts": 3, "evaluateOnExit": [
                {"action": "EXIT", "onStatusReason": "*OutOfMemory*"},
                {"action": "retry", "onStatusReason": "*"}]},
            "timeoutConfig": {"attemptDurationSeconds": 3600},
            "preemptionConfiguration": {"preemptionRetriesBeforeTermination": 2},
            "clientToken": "t-1",
        });
        let spec = spec_of(&InstanceTypes::default(), &submit(payload, extra)).unwrap();
        assert_eq!(spec.name.as_deref(), Some("train-1"));
        assert_eq!(spec.share, "QS1");
        assert_eq!(spec.priority, 7);
        assert_eq!(spec.payload.image.as_deref(), Some("repo/train:1"));
        // No entrypoint given: the image's own, with the argument `train`.
        assert_eq!(spec.payload.command, vec!["train".to_string()]);
        assert_eq!(spec.gpu_class.as_ref().map(|c| c.as_str()), Some("a100"));
        assert_eq!((spec.gpus, spec.nodes), (8, 2));
        assert_eq!(&spec.env["MODE"], "fast");
        // The smaller of the two limits.
        assert_eq!(spec.time_limit_ms, Some(3_600_000));
        assert_eq!(spec.retry.retries, 2);
        assert_eq!(spec.retry.rules.len(), 2);
        assert_eq!(spec.retry.rules[0].action, RetryAction::Exit);
        assert_eq!(
            spec.retry.rules[0].on_reason.as_deref(),
            Some("*OutOfMemory*")
        );
        assert_eq!(spec.max_preemptions, Some(2));
        assert_eq!(spec.idempotency_key.as_deref(), Some("aws:t-1"));
        let contract: Value = serde_json::from_str(&spec.env[SAGEMAKER_ENV]).unwrap();
        assert_eq!(contract["checkpoint_path"], "/ckpt");
        assert_eq!(contract["hyperparameters"], json!({"epochs": "3"}));
        assert_eq!(contract["instance_type"], "ml.p4d.24xlarge");
        assert_eq!(contract["entrypoint"], Value::Null);
    }

    #[test]
    fn an_entrypoint_and_arguments_replace_the_images() {
        let payload = json!({
            "AlgorithmSpecification": {"TrainingImage": "img:1",
                "ContainerEntrypoint": ["python", "-m"], "ContainerArguments": ["trainer"]},
            "ResourceConfig": {"InstanceType": "ml.g5.xlarge"},
        });
        let spec = spec_of(&InstanceTypes::default(), &submit(payload, json!({}))).unwrap();
        assert_eq!(spec.payload.command, vec!["trainer".to_string()]);
        let contract: Value = serde_json::from_str(&spec.env[SAGEMAKER_ENV]).unwrap();
        assert_eq!(contract["entrypoint"], json!(["python", "-m"]));
        assert_eq!(contract["checkpoint_path"], CHECKPOINT_PATH_DEFAULT);
        assert_eq!((spec.gpus, spec.nodes), (1, 1));
    }

    #[test]
    fn bad_requests_are_refused_saying_what_to_fix() {
        let types = InstanceTypes::default();
        let good = json!({
            "AlgorithmSpecification": {"TrainingImage": "img:1"},
            "ResourceConfig": {"InstanceType": "ml.g5.xlarge"},
        });
        let refused = |input: Value| spec_of(&types, &input).unwrap_err().message;
        let unknown = json!({
            "AlgorithmSpecification": {"TrainingImage": "img:1"},
            "ResourceConfig": {"InstanceType": "ml.m5.large"},
        });
        assert!(refused(submit(unknown, json!({}))).contains("--aws-instance-type"));
        assert!(
            refused(submit(good.clone(), json!({"schedulingPriority": 10_000})))
                .contains("0 to 9999")
        );
        assert!(refused(submit(
            good.clone(),
            json!({"retryStrategy": {"attempts": 11}})
        ))
        .contains("1 to 10"));
        assert!(
            refused(submit(good.clone(), json!({"serviceJobType": "OTHER"})))
                .contains("SAGEMAKER_TRAINING")
        );
        let mut negative = good.clone();
        negative["StoppingCondition"] = json!({"MaxRuntimeInSeconds": -5});
        assert!(refused(submit(negative, json!({}))).contains("MaxRuntimeInSeconds -5 must be"));
        for (extra, needle) in [
            (
                json!({"timeoutConfig": 5}),
                "timeoutConfig must be a JSON object",
            ),
            (
                json!({"retryStrategy": {"attempts": 2, "evaluateOnExit": "x"}}),
                "evaluateOnExit must be a list",
            ),
            (
                json!({"preemptionConfiguration": {"preemptionRetriesBeforeTermination": 1_i64 << 40}}),
                "must be 0 to",
            ),
        ] {
            assert!(
                refused(submit(good.clone(), extra)).contains(needle),
                "{needle}"
            );
        }
        let mut large = good.clone();
        large["HyperParameters"] = json!({"a": "x".repeat(9_000), "b": "y".repeat(9_000)});
        assert!(refused(submit(large, json!({}))).contains("HyperParameters"));
        let mut no_share = submit(good, json!({}));
        no_share.as_object_mut().unwrap().remove("quotaShareName");
        assert!(refused(no_share).contains("quotaShareName"));
        let mut not_json = submit(json!({}), json!({}));
        not_json["serviceRequestPayload"] = json!("{not json");
        assert!(refused(not_json).contains("not a JSON"));
    }

    #[test]
    fn statuses_map_both_ways() {
        for state in JobState::ALL {
            let status = status(state.as_str());
            assert!(
                states_of(status).unwrap().contains(&state),
                "{state:?} shows as {status}, which lists it"
            );
        }
        assert!(states_of("DONE").is_err());
    }
}
