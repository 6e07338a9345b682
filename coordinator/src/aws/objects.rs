//! Job queues, service environments and scheduling policies: AWS Batch's setup steps, kept so
//! that the AWS guide's steps run and read back. In Quotient one cluster is one pool of GPUs:
//! a queue is a name that quota shares and service jobs belong to, a service environment's
//! capacity limits (in instance types) are checked and shown, and a scheduling policy's
//! `quotaSharePolicy` is the only policy there is (FIFO within a share, as AWS's). Each is kept
//! as its detail's JSON in the replicated state (`queue/NAME`, `environment/NAME`,
//! `policy/NAME`).

use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::certs::PeerIdentity;
use serde_json::{json, Value};

use super::{integer, name_of, required, string, AwsError, Door};

/// `(key, JSON)` of every object whose key starts with `prefix`.
pub(super) async fn list(
    door: &Door,
    caller: &PeerIdentity,
    prefix: &str,
) -> Result<Vec<(String, String)>, AwsError> {
    match door
        .call(
            caller,
            ApiRequest::ListAwsObjects {
                prefix: prefix.to_string(),
            },
        )
        .await?
    {
        ApiResponse::AwsObjects(objects) => Ok(objects),
        _ => Err(AwsError::server("unexpected answer to an object list")),
    }
}

/// The object `kind/name`, parsed.
pub(super) async fn get(
    door: &Door,
    caller: &PeerIdentity,
    kind: &str,
    name: &str,
) -> Result<Option<Value>, AwsError> {
    let key = format!("{kind}/{name}");
    Ok(list(door, caller, &key)
        .await?
        .into_iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, value)| serde_json::from_str(&value).ok()))
}

/// `Ok` when queue `name` exists, else a `ClientException` that says how to make it.
pub(super) async fn require_queue(
    door: &Door,
    caller: &PeerIdentity,
    name: &str,
) -> Result<Value, AwsError> {
    get(door, caller, "queue", name).await?.ok_or_else(|| {
        AwsError::client(format!(
            "no job queue {name}: create it first (CreateJobQueue, or `aws batch create-job-queue`)"
        ))
    })
}

async fn put_new(
    door: &Door,
    caller: &PeerIdentity,
    kind: &str,
    name: &str,
    what: &str,
    detail: &Value,
) -> Result<(), AwsError> {
    quotient_common::name::validate_name(what, name)
        .map_err(|error| AwsError::client(error.to_string()))?;
    if get(door, caller, kind, name).await?.is_some() {
        return Err(AwsError::client(format!(
            "a {what} named {name} already exists"
        )));
    }
    door.call(
        caller,
        ApiRequest::PutAwsObject {
            key: format!("{kind}/{name}"),
            value: Some(detail.to_string()),
        },
    )
    .await?;
    Ok(())
}

/// The objects of `kind` named (by name or ARN) in `names`, or all of them, one page.
async fn describe(
    door: &Door,
    caller: &PeerIdentity,
    kind: &str,
    input: &Value,
    names_field: &str,
    name_field: &str,
) -> Result<(Vec<Value>, Option<String>), AwsError> {
    let wanted: Option<Vec<String>> =
        input
            .get(names_field)
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|name| name_of(name).to_string())
                    .collect()
            });
    let limit = match integer(input, "maxResults")? {
        None => 100,
        Some(n) if (1..=1000).contains(&n) => n as usize,
        Some(_) => return Err(AwsError::client("maxResults must be 1 to 1000")),
    };
    let after = next_token(input)?;
    let prefix = format!("{kind}/");
    let mut found = Vec::new();
    let mut next = None;
    for (key, value) in list(door, caller, &prefix).await? {
        let name = key[prefix.len()..].to_string();
        if wanted
            .as_ref()
            .is_some_and(|wanted| !wanted.contains(&name))
        {
            continue;
        }
        if after.as_ref().is_some_and(|after| name <= *after) {
            continue;
        }
        if found.len() == limit {
            next = found
                .last()
                .and_then(|last: &Value| last[name_field].as_str().map(str::to_string));
            break;
        }
        if let Ok(detail) = serde_json::from_str(&value) {
            found.push(detail);
        }
    }
    Ok((found, next))
}

/// The `nextToken` of a list of names (objects, quota shares): the last name of the page
/// before, so a token that is no name is none this endpoint gave.
pub(super) fn next_token(input: &Value) -> Result<Option<String>, AwsError> {
    let Some(token) = string(input, "nextToken")? else {
        return Ok(None);
    };
    if quotient_common::name::validate_name("nextToken", token).is_err() {
        return Err(AwsError::client(
            "nextToken is not one this endpoint gave: pass the nextToken of the answer before, or none to start from the first page",
        ));
    }
    Ok(Some(token.to_string()))
}

fn with_next(mut answer: Value, next: Option<String>) -> Value {
    if let Some(next) = next {
        answer["nextToken"] = json!(next);
    }
    answer
}

fn state(input: &Value) -> Result<&str, AwsError> {
    match string(input, "state")? {
        None | Some("ENABLED") => Ok("ENABLED"),
        Some("DISABLED") => Ok("DISABLED"),
        Some(other) => Err(AwsError::client(format!(
            "state {other:?} must be ENABLED or DISABLED"
        ))),
    }
}

fn tags(input: &Value) -> Value {
    input.get("tags").cloned().unwrap_or_else(|| json!({}))
}

pub(super) async fn create_queue(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let name = required(input, "jobQueueName")?;
    let priority =
        integer(input, "priority")?.ok_or_else(|| AwsError::client("priority is required"))?;
    let arn = door.arn("job-queue", name);
    let detail = json!({
        "jobQueueName": name,
        "jobQueueArn": arn,
        "state": state(input)?,
        "status": "VALID",
        "statusReason": "JobQueue Healthy",
        "priority": priority,
        "schedulingPolicyArn": input.get("schedulingPolicyArn").cloned().unwrap_or(Value::Null),
        "computeEnvironmentOrder": input.get("computeEnvironmentOrder").cloned().unwrap_or_else(|| json!([])),
        "serviceEnvironmentOrder": input.get("serviceEnvironmentOrder").cloned().unwrap_or_else(|| json!([])),
        "jobQueueType": input.get("jobQueueType").cloned().unwrap_or_else(|| json!("SAGEMAKER_TRAINING")),
        "tags": tags(input),
    });
    put_new(door, caller, "queue", name, "job queue", &detail).await?;
    Ok(json!({ "jobQueueName": name, "jobQueueArn": arn }))
}

pub(super) async fn describe_queues(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let (found, next) = describe(door, caller, "queue", input, "jobQueues", "jobQueueName").await?;
    Ok(with_next(json!({ "jobQueues": found }), next))
}

pub(super) async fn create_environment(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let name = required(input, "serviceEnvironmentName")?;
    let kind = required(input, "serviceEnvironmentType")?;
    if kind != "SAGEMAKER_TRAINING" {
        return Err(AwsError::client(format!(
            "serviceEnvironmentType {kind:?} must be SAGEMAKER_TRAINING"
        )));
    }
    let limits = input
        .get("capacityLimits")
        .and_then(Value::as_array)
        .ok_or_else(|| AwsError::client("capacityLimits must be a list"))?;
    for limit in limits {
        if let Some(unit) = string(limit, "capacityUnit")? {
            door.settings
                .instance_types
                .get(unit)
                .map_err(AwsError::client)?;
        }
    }
    let arn = door.arn("service-environment", name);
    let detail = json!({
        "serviceEnvironmentName": name,
        "serviceEnvironmentArn": arn,
        "serviceEnvironmentType": kind,
        "state": state(input)?,
        "status": "VALID",
        "capacityLimits": limits,
        "tags": tags(input),
    });
    put_new(
        door,
        caller,
        "environment",
        name,
        "service environment",
        &detail,
    )
    .await?;
    Ok(json!({ "serviceEnvironmentName": name, "serviceEnvironmentArn": arn }))
}

pub(super) async fn describe_environments(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let (found, next) = describe(
        door,
        caller,
        "environment",
        input,
        "serviceEnvironments",
        "serviceEnvironmentName",
    )
    .await?;
    Ok(with_next(json!({ "serviceEnvironments": found }), next))
}

pub(super) async fn create_policy(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let name = required(input, "name")?;
    if input.get("fairsharePolicy").is_some() {
        return Err(AwsError::client(
            "fairsharePolicy is not supported: Quotient schedules by quota shares; give a \
             quotaSharePolicy",
        ));
    }
    if let Some(policy) = input.get("quotaSharePolicy") {
        let strategy = required(policy, "idleResourceAssignmentStrategy")?;
        if strategy != "FIFO" {
            return Err(AwsError::client(format!(
                "idleResourceAssignmentStrategy {strategy:?} must be FIFO"
            )));
        }
    }
    let arn = door.arn("scheduling-policy", name);
    let detail = json!({
        "name": name,
        "arn": arn,
        "quotaSharePolicy": input.get("quotaSharePolicy").cloned().unwrap_or_else(|| json!({"idleResourceAssignmentStrategy": "FIFO"})),
        "tags": tags(input),
    });
    put_new(door, caller, "policy", name, "scheduling policy", &detail).await?;
    Ok(json!({ "name": name, "arn": arn }))
}

pub(super) async fn describe_policies(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let (found, _) = describe(door, caller, "policy", input, "arns", "name").await?;
    Ok(json!({ "schedulingPolicies": found }))
}
