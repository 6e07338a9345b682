//! `quotient job logs` on the leader: find the node that ran (or runs) the attempt from the
//! replicated job record, then read the log from that node's agent over the connection the
//! agent made ([`AgentLinks`]).
//!
//! Which node ran which attempt:
//! - the latest attempt: the node of its allocation while it holds GPUs, else the job's
//!   `last_node` (set on every placement);
//! - the attempt before it, while the latest one holds GPUs: every attempt but the last ends
//!   by a preemption, so it is the node of `last_preemption`;
//! - older attempts are not recorded, and are refused with a message that says so.
//!
//! An answer is `complete` once the attempt has ended and the data reaches the end of its log.
//! Whether it ended is read from the state *before* the agent is asked: an attempt is reported
//! ended only after its process exited, so a log read after that is whole.

use quotient_common::agent_api::{AgentError, LeaderRequest, LeaderResponse};
use quotient_common::api::{ApiError, ApiResponse, LOG_READ_BYTES_MAX};
use quotient_common::JobId;
use quotient_core::State;

use crate::agent_links::{AgentLinks, AskError};

/// Where an attempt's log is, and whether the attempt has ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTarget {
    /// 0 when the job was never placed.
    pub attempt: u32,
    /// `None` when the job was never placed.
    pub node: Option<String>,
    pub ended: bool,
}

/// Finds attempt `attempt` (the latest when `None`) of member `rank` of `job` in `state`.
pub fn log_target(
    state: &State,
    job: JobId,
    attempt: Option<u32>,
    rank: u32,
) -> Result<LogTarget, ApiError> {
    let record = state
        .job(job)
        .ok_or_else(|| ApiError::Rejected(state.missing_job(job)))?;
    if rank >= record.node_count() {
        return Err(ApiError::NotFound(format!(
            "{job} runs on {} node(s): its ranks are 0 to {}",
            record.node_count(),
            record.node_count() - 1
        )));
    }
    let latest = record.attempts;
    let holds_gpus = !record.placement.is_empty();
    let allocation_node = record
        .allocation()
        .and_then(|allocation| state.node(allocation.node))
        .map(|node| node.name.clone());
    let wanted = attempt.unwrap_or(latest);
    if latest == 0 {
        return match attempt {
            None | Some(0) => Ok(LogTarget {
                attempt: 0,
                node: None,
                ended: record.state.is_terminal(),
            }),
            Some(n) => Err(ApiError::NotFound(format!(
                "{job} has not run yet, so it has no attempt {n}"
            ))),
        };
    }
    if wanted == 0 || wanted > latest {
        return Err(ApiError::NotFound(format!(
            "{job} has no attempt {wanted}: its attempts are 1 to {latest}"
        )));
    }
    // The attempt's record names its nodes in rank order.
    if let Some(entry) = record.history.iter().find(|entry| entry.attempt == wanted) {
        let member_running = record
            .placement
            .get(rank as usize)
            .is_some_and(|member| !member.stage.exited());
        return Ok(LogTarget {
            attempt: wanted,
            node: entry.nodes.get(rank as usize).cloned(),
            ended: wanted != latest || !member_running,
        });
    }
    if wanted == latest {
        return Ok(LogTarget {
            attempt: wanted,
            node: allocation_node.or_else(|| record.last_node.clone()),
            ended: !holds_gpus,
        });
    }
    match &record.last_preemption {
        Some(preemption) if holds_gpus && wanted + 1 == latest => Ok(LogTarget {
            attempt: wanted,
            node: Some(preemption.node.clone()),
            ended: true,
        }),
        _ => Err(ApiError::NotFound(format!(
            "which node ran attempt {wanted} of {job} is not recorded: only the last attempt's \
             node (and the one before it while the last runs) is kept"
        ))),
    }
}

/// Reads up to `max_bytes` of the target's log from `offset` on, from its node's agent.
pub async fn read_logs(
    links: &AgentLinks,
    job: JobId,
    target: LogTarget,
    offset: u64,
    max_bytes: u32,
) -> Result<ApiResponse, ApiError> {
    let Some(node) = target.node else {
        return Ok(ApiResponse::Logs {
            attempt: target.attempt,
            data: Vec::new(),
            next_offset: offset,
            complete: target.ended,
        });
    };
    let request = LeaderRequest::ReadLogs {
        node: node.clone(),
        job,
        attempt: target.attempt,
        offset,
        max_bytes: max_bytes.min(LOG_READ_BYTES_MAX),
    };
    let response = links
        .ask(&node, &request)
        .await
        .map_err(|error: AskError| {
            ApiError::AgentUnavailable(format!("cannot read the logs of {job}: {error}"))
        })?;
    match response {
        LeaderResponse::Logs {
            data,
            next_offset,
            end,
        } => Ok(ApiResponse::Logs {
            attempt: target.attempt,
            data,
            next_offset,
            complete: target.ended && end,
        }),
        LeaderResponse::Error(AgentError::NotFound(why)) => Err(ApiError::NotFound(why)),
        LeaderResponse::Error(error) => Err(ApiError::AgentUnavailable(format!(
            "the agent of node {node:?} cannot read the logs of {job} attempt {}: {error}",
            target.attempt
        ))),
    }
}

#[cfg(test)]
mod tests {
    use quotient_common::JobSpec;
    use quotient_core::{Command, JobEvent, JobReport, Rejection};

    use super::*;
    use crate::test_log::Log;

    /// Users and admins may read logs; agents and coordinators may not, and it is a read.
    #[test]
    fn users_and_admins_may_read_logs() {
        use quotient_common::api::ApiRequest;
        use quotient_common::certs::{PeerIdentity, Role};
        let request = ApiRequest::JobLogs {
            job: JobId(1),
            attempt: None,
            offset: 0,
            max_bytes: LOG_READ_BYTES_MAX,
            rank: 0,
        };
        assert!(!request.is_write() && !request.needs_admin());
        let peer = |role| PeerIdentity {
            role,
            name: "someone".into(),
        };
        for role in [Role::User, Role::Admin] {
            assert!(
                crate::api::authorise(&peer(role), &request).is_ok(),
                "{role:?}"
            );
        }
        for role in [Role::Agent, Role::Coordinator] {
            assert!(matches!(
                crate::api::authorise(&peer(role), &request),
                Err(ApiError::Unauthorized(_))
            ));
        }
    }

    /// An unplaced job has no node; a running attempt is on its allocation's node and not
    /// ended; a finished one is still found on its last node, ended; other attempts are
    /// refused.
    #[test]
    fn attempts_are_found_on_the_node_that_ran_them() {
        let mut log = Log::new();
        log.register_node("node-1", 1);
        log.create_share("team", 1);
        log.apply(Command::SubmitJob(JobSpec::new(
            "team",
            1,
            1,
            vec!["x".into()],
        )));
        let job = JobId(1);
        let unplaced = log_target(&log.state, job, None, 0).expect("a known job");
        assert_eq!(
            unplaced,
            LogTarget {
                attempt: 0,
                node: None,
                ended: false
            }
        );
        assert!(matches!(
            log_target(&log.state, JobId(99), None, 0),
            Err(ApiError::Rejected(Rejection::UnknownJob(_)))
        ));

        log.schedule();
        let running = log_target(&log.state, job, None, 0).expect("a known job");
        assert_eq!(running.attempt, 1);
        assert_eq!(running.node.as_deref(), Some("node-1"));
        assert!(!running.ended);

        log.apply(Command::ReportJob(JobReport {
            job,
            attempt: 1,
            node: "node-1".into(),
            event: JobEvent::Exited { code: 0 },
        }));
        let finished = log_target(&log.state, job, Some(1), 0).expect("attempt 1");
        assert_eq!(finished.node.as_deref(), Some("node-1"));
        assert!(finished.ended);
        assert!(matches!(
            log_target(&log.state, job, Some(2), 0),
            Err(ApiError::NotFound(_))
        ));
    }
}
