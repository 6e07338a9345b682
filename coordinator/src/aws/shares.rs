//! Quota shares: AWS Batch's quota shares are Quotient's shares, one for one. Capacity is in
//! instance types there and in GPUs of a class here ([`super::InstanceTypes`]); the strategy,
//! `borrowLimit` (a percentage, −1 for none), `inSharePreemption` and `state` are the share's
//! own. The job queue a share was created in, the units its limits were given in and its
//! tags are kept beside it (`share/NAME`). A share made with the command line is in every
//! queue.

use std::collections::BTreeMap;

use quotient_common::api::{ApiRequest, ApiResponse, ShareView};
use quotient_common::certs::PeerIdentity;
use quotient_common::share::{
    ShareSpec, ShareState, ShareUpdate, Strategy, BORROW_LIMIT_PERCENT_MAX,
};
use quotient_common::GpuClass;
use serde_json::{json, Value};

use super::{integer, name_of, required, string, AwsError, Door};

/// Quota shares on one page of `ListQuotaShares` when `maxResults` is not given.
const PAGE_DEFAULT: usize = 100;

/// What the endpoint keeps beside a share (`objects::get(door, caller, "share", NAME)` reads it).
fn object_key(share: &str) -> String {
    format!("share/{share}")
}

/// `capacityLimits` as GPUs per class.
fn limits(door: &Door, input: &Value) -> Result<BTreeMap<GpuClass, u32>, AwsError> {
    let Some(list) = input.get("capacityLimits").and_then(Value::as_array) else {
        return Err(AwsError::client("capacityLimits must be a list"));
    };
    let mut limits = BTreeMap::new();
    for limit in list {
        let unit = required(limit, "capacityUnit")?;
        let count = integer(limit, "maxCapacity")?
            .ok_or_else(|| AwsError::client("maxCapacity is required"))?;
        let instance = door
            .settings
            .instance_types
            .get(unit)
            .map_err(AwsError::client)?;
        let count = u32::try_from(count)
            .ok()
            .filter(|count| *count >= 1)
            .ok_or_else(|| AwsError::client(format!("maxCapacity of {unit} must be at least 1")))?;
        let gpus = count
            .checked_mul(instance.gpus)
            .ok_or_else(|| AwsError::client(format!("maxCapacity of {unit} is too large")))?;
        let total: &mut u32 = limits.entry(instance.class.clone()).or_default();
        *total = total.saturating_add(gpus);
    }
    Ok(limits)
}

fn strategy(text: &str) -> Result<Strategy, AwsError> {
    match text {
        "RESERVE" => Ok(Strategy::Reserve),
        "LEND" => Ok(Strategy::Lend),
        "LEND_AND_BORROW" => Ok(Strategy::LendAndBorrow),
        other => Err(AwsError::client(format!(
            "strategy {other:?} must be RESERVE, LEND or LEND_AND_BORROW"
        ))),
    }
}

fn enabled(field: &str, text: &str) -> Result<bool, AwsError> {
    match text {
        "ENABLED" => Ok(true),
        "DISABLED" => Ok(false),
        other => Err(AwsError::client(format!(
            "{field} {other:?} must be ENABLED or DISABLED"
        ))),
    }
}

/// `borrowLimit` of a share of `strategy`: −1 (or absent) is no cap; only a
/// `LEND_AND_BORROW` share takes one.
fn borrow_limit(strategy: Strategy, sharing: &Value) -> Result<Option<u32>, AwsError> {
    let percent = match integer(sharing, "borrowLimit")? {
        None | Some(-1) => return Ok(None),
        Some(percent) => percent,
    };
    if strategy != Strategy::LendAndBorrow {
        return Err(AwsError::client(
            "borrowLimit applies only to the LEND_AND_BORROW strategy",
        ));
    }
    u32::try_from(percent)
        .ok()
        .filter(|p| *p <= BORROW_LIMIT_PERCENT_MAX)
        .map(Some)
        .ok_or_else(|| {
            AwsError::client(format!(
                "borrowLimit {percent} must be -1 (no cap) or a percentage, 0 to \
                 {BORROW_LIMIT_PERCENT_MAX}"
            ))
        })
}

pub(super) async fn create(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let name = required(input, "quotaShareName")?;
    let queue = name_of(required(input, "jobQueue")?).to_string();
    super::objects::require_queue(door, caller, &queue).await?;
    let sharing = input
        .get("resourceSharingConfiguration")
        .ok_or_else(|| AwsError::client("resourceSharingConfiguration is required"))?;
    let strategy = strategy(required(sharing, "strategy")?)?;
    let borrow_limit_percent = borrow_limit(strategy, sharing)?;
    let preemption = input
        .get("preemptionConfiguration")
        .ok_or_else(|| AwsError::client("preemptionConfiguration is required"))?;
    let in_share_preemption = enabled(
        "inSharePreemption",
        required(preemption, "inSharePreemption")?,
    )?;
    let state = match string(input, "state")? {
        None => ShareState::Enabled,
        Some(text) if enabled("state", text)? => ShareState::Enabled,
        Some(_) => ShareState::Disabled,
    };
    let spec = ShareSpec {
        name: name.to_string(),
        limits: limits(door, input)?,
        strategy,
        borrow_limit_percent,
        in_share_preemption,
        state,
        members: Vec::new(),
        max_jobs_per_user: None,
    };
    spec.validate()
        .map_err(|error| AwsError::client(error.to_string()))?;
    door.call(caller, ApiRequest::CreateShare(spec)).await?;
    let kept = json!({
        "jobQueue": queue,
        "capacityLimits": input.get("capacityLimits").cloned().unwrap_or(Value::Null),
        "tags": input.get("tags").cloned().unwrap_or_else(|| json!({})),
    });
    door.call(
        caller,
        ApiRequest::PutAwsObject {
            key: object_key(name),
            value: Some(kept.to_string()),
        },
    )
    .await?;
    Ok(json!({ "quotaShareName": name, "quotaShareArn": door.arn("quota-share", name) }))
}

pub(super) async fn update(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let name = name_of(required(input, "quotaShareArn")?).to_string();
    let mut update = ShareUpdate::default();
    if input.get("capacityLimits").is_some() {
        update.limits = Some(limits(door, input)?);
    }
    if let Some(sharing) = input.get("resourceSharingConfiguration") {
        let strategy = strategy(required(sharing, "strategy")?)?;
        update.strategy = Some(strategy);
        update.borrow_limit_percent = Some(borrow_limit(strategy, sharing)?);
    }
    if let Some(preemption) = input.get("preemptionConfiguration") {
        update.in_share_preemption = Some(enabled(
            "inSharePreemption",
            required(preemption, "inSharePreemption")?,
        )?);
    }
    if let Some(state) = string(input, "state")? {
        update.state = Some(if enabled("state", state)? {
            ShareState::Enabled
        } else {
            ShareState::Disabled
        });
    }
    door.call(
        caller,
        ApiRequest::UpdateShare {
            name: name.clone(),
            update,
        },
    )
    .await?;
    if let Some(limits) = input.get("capacityLimits") {
        let mut kept = kept(door, caller, &name)
            .await?
            .unwrap_or_else(|| json!({}));
        kept["capacityLimits"] = limits.clone();
        door.call(
            caller,
            ApiRequest::PutAwsObject {
                key: object_key(&name),
                value: Some(kept.to_string()),
            },
        )
        .await?;
    }
    Ok(json!({ "quotaShareName": name, "quotaShareArn": door.arn("quota-share", &name) }))
}

/// What the endpoint kept beside share `name`, if anything.
async fn kept(door: &Door, caller: &PeerIdentity, name: &str) -> Result<Option<Value>, AwsError> {
    super::objects::get(door, caller, "share", name).await
}

/// A share as AWS shows it: its limits in the units they were given in where they still add
/// up to the share's GPUs, else in the smallest instance type of each class.
fn detail(door: &Door, share: &ShareView, kept: Option<&Value>, with_tags: bool) -> Value {
    let given: Vec<(String, i64)> = kept
        .and_then(|kept| kept.get("capacityLimits"))
        .and_then(Value::as_array)
        .map(|limits| {
            limits
                .iter()
                .filter_map(|limit| {
                    Some((
                        limit.get("capacityUnit")?.as_str()?.to_string(),
                        limit.get("maxCapacity")?.as_i64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let types = &door.settings.instance_types;
    let mut capacity = Vec::new();
    for (class, gpus) in &share.limits {
        let from_given: Vec<Value> = given
            .iter()
            .filter(|(unit, _)| types.get(unit).is_ok_and(|t| t.class.as_str() == class))
            .map(|(unit, count)| json!({ "capacityUnit": unit, "maxCapacity": count }))
            .collect();
        let given_gpus: i64 = given
            .iter()
            .filter_map(|(unit, count)| {
                let t = types.get(unit).ok()?;
                (t.class.as_str() == class).then(|| count * i64::from(t.gpus))
            })
            .sum();
        if given_gpus == i64::from(*gpus) && !from_given.is_empty() {
            capacity.extend(from_given);
            continue;
        }
        let unit = GpuClass::parse(class).ok().and_then(|class| {
            types
                .smallest_of(&class)
                .map(|(n, t)| (n.to_string(), t.gpus))
        });
        capacity.push(match unit {
            Some((unit, per)) => json!({ "capacityUnit": unit, "maxCapacity": gpus / per }),
            None => json!({ "capacityUnit": format!("gpu.{class}"), "maxCapacity": gpus }),
        });
    }
    let queue = kept
        .and_then(|kept| kept.get("jobQueue"))
        .and_then(Value::as_str)
        .map(|queue| door.arn("job-queue", queue));
    let strategy = match share.strategy.as_str() {
        "reserve" => "RESERVE",
        "lend" => "LEND",
        _ => "LEND_AND_BORROW",
    };
    let mut sharing = json!({ "strategy": strategy });
    if strategy == "LEND_AND_BORROW" {
        sharing["borrowLimit"] = json!(share.borrow_limit_percent.map_or(-1, i64::from));
    }
    let mut detail = json!({
        "quotaShareName": share.name,
        "quotaShareArn": door.arn("quota-share", &share.name),
        "capacityLimits": capacity,
        "resourceSharingConfiguration": sharing,
        "preemptionConfiguration": {
            "inSharePreemption": if share.in_share_preemption { "ENABLED" } else { "DISABLED" }
        },
        "state": if share.state == "enabled" { "ENABLED" } else { "DISABLED" },
        "status": "VALID",
    });
    if let Some(queue) = queue {
        detail["jobQueueArn"] = json!(queue);
    }
    if with_tags {
        detail["tags"] = kept
            .and_then(|kept| kept.get("tags"))
            .cloned()
            .unwrap_or_else(|| json!({}));
    }
    detail
}

pub(super) async fn describe(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let name = name_of(required(input, "quotaShareArn")?).to_string();
    let ApiResponse::Share(share) = door
        .call(caller, ApiRequest::GetShare { name: name.clone() })
        .await?
    else {
        return Err(AwsError::server("unexpected answer to a share read"));
    };
    let kept = kept(door, caller, &name).await?;
    Ok(detail(door, &share, kept.as_ref(), true))
}

pub(super) async fn list(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let queue = name_of(required(input, "jobQueue")?).to_string();
    let limit = match integer(input, "maxResults")? {
        None => PAGE_DEFAULT,
        Some(n) if (1..=1000).contains(&n) => n as usize,
        Some(_) => return Err(AwsError::client("maxResults must be 1 to 1000")),
    };
    let after = super::objects::next_token(input)?;
    let ApiResponse::Shares(shares) = door.call(caller, ApiRequest::ListShares).await? else {
        return Err(AwsError::server("unexpected answer to a share list"));
    };
    let kept: BTreeMap<String, Value> = super::objects::list(door, caller, "share/")
        .await?
        .into_iter()
        .filter_map(|(key, value)| {
            Some((
                key.strip_prefix("share/")?.to_string(),
                serde_json::from_str(&value).ok()?,
            ))
        })
        .collect();
    let mut page = Vec::new();
    let mut next = None;
    for share in shares.iter().filter(|share| {
        after
            .as_deref()
            .is_none_or(|after| share.name.as_str() > after)
    }) {
        let kept = kept.get(&share.name);
        let in_queue = kept
            .and_then(|kept| kept.get("jobQueue"))
            .and_then(Value::as_str)
            .is_none_or(|q| q == queue);
        if !in_queue {
            continue;
        }
        if page.len() == limit {
            next = page
                .last()
                .and_then(|last: &Value| last["quotaShareName"].as_str().map(str::to_string));
            break;
        }
        page.push(detail(door, share, kept, false));
    }
    let mut answer = json!({ "quotaShares": page });
    if let Some(next) = next {
        answer["nextToken"] = json!(next);
    }
    Ok(answer)
}

pub(super) async fn delete(
    door: &Door,
    caller: &PeerIdentity,
    input: &Value,
) -> Result<Value, AwsError> {
    let name = name_of(required(input, "quotaShareArn")?).to_string();
    door.call(caller, ApiRequest::DeleteShare { name: name.clone() })
        .await?;
    // What was kept beside it goes with it; a share made with the command line had nothing.
    match door
        .call(
            caller,
            ApiRequest::PutAwsObject {
                key: object_key(&name),
                value: None,
            },
        )
        .await
    {
        Ok(_) => {}
        Err(error) if error.message.starts_with("no share/") => {}
        Err(error) => return Err(error),
    }
    Ok(json!({}))
}
