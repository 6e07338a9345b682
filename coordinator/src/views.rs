//! The client API's views, built from the replicated state and Raft's metrics: what
//! `quotient share/job/node list` and `quotient cluster status` show. Pure functions of their
//! inputs, so the same state gives the same view on every coordinator.

use std::collections::BTreeMap;

use openraft::{RaftMetrics, ServerState};
use quotient_common::agent_api::DiskUsage;
use quotient_common::api::{
    job_page_token, node_page_token, AttemptView, AuditView, ClusterView, GpuView, GroupView,
    HistoryRecord, JobPage, JobView, MemberView, NodePage, NodeView, PlacementView, RevokedView,
    ShareView, UsageRow, JOB_SCAN_MAX,
};
use quotient_common::{ClusterId, JobId, JobState, NodeState};
use quotient_core::{
    share_accounts, JobRecord, MemberStage, NodeRecord, ShareAccount, ShareRecord, State,
    WaitReasons,
};

use crate::store::MemberId;

/// A share with its accounts (usage, borrowed, lent, runnable, running).
pub fn share_view(share: &ShareRecord, account: Option<&ShareAccount>) -> ShareView {
    let spec = &share.spec;
    let by_name =
        |map: Option<&BTreeMap<quotient_common::GpuClass, u64>>| -> BTreeMap<String, u64> {
            map.map(|m| m.iter().map(|(c, n)| (c.to_string(), *n)).collect())
                .unwrap_or_default()
        };
    ShareView {
        name: spec.name.clone(),
        strategy: spec.strategy.as_str().to_string(),
        limits: spec
            .limits
            .iter()
            .map(|(class, limit)| (class.to_string(), *limit))
            .collect(),
        borrow_limit_percent: spec.borrow_limit_percent,
        in_share_preemption: spec.in_share_preemption,
        state: spec.state.as_str().to_string(),
        usage: by_name(account.map(|a| &a.usage)),
        borrowed: by_name(account.map(|a| &a.borrowed)),
        lent: by_name(account.map(|a| &a.lent)),
        runnable: account.map_or(0, |a| a.runnable),
        running: account.map_or(0, |a| a.running),
        members: spec.members.clone(),
        open: spec.members.is_empty(),
        max_jobs_per_user: spec.max_jobs_per_user,
    }
}

/// Every share, by name.
pub fn share_views(state: &State) -> Vec<ShareView> {
    let accounts = share_accounts(state);
    state
        .shares()
        .map(|share| share_view(share, accounts.get(&share.spec.name)))
        .collect()
}

/// One share, or `None` when there is none by that name.
pub fn share_view_named(state: &State, name: &str) -> Option<ShareView> {
    let share = state.share(name)?;
    let accounts = share_accounts(state);
    Some(share_view(share, accounts.get(name)))
}

/// A job as the CLI prints it.
pub fn job_view(state: &State, job: &JobRecord) -> JobView {
    job_view_with(state, job, &mut WaitReasons::default())
}

/// [`job_view`], with the queue heads that `reasons` has already looked up (a page of jobs).
fn job_view_with<'s>(
    state: &'s State,
    job: &'s JobRecord,
    reasons: &mut WaitReasons<'s>,
) -> JobView {
    let node = job
        .allocation()
        .and_then(|alloc| state.node(alloc.node))
        .map(|node| node.name.clone());
    let placement = job
        .placement
        .iter()
        .enumerate()
        .map(|(rank, alloc)| {
            let (stage, exit_code) = match alloc.stage {
                MemberStage::Placed => ("placed", None),
                MemberStage::Started => ("starting", None),
                MemberStage::Running => ("running", None),
                MemberStage::Exited { code } => ("exited", code),
            };
            PlacementView {
                rank: rank as u32,
                node: state
                    .node(alloc.node)
                    .map_or_else(String::new, |n| n.name.clone()),
                gpus: alloc.gpu_indices(),
                stage: stage.to_string(),
                exit_code,
            }
        })
        .collect();
    let (last_preemption, preempted_for) = match &job.last_preemption {
        Some(p) => (
            Some(p.kind.as_str().to_string()),
            match (p.for_job, &p.for_share) {
                (Some(for_job), Some(share)) => Some(format!("{for_job} of share {share}")),
                (Some(for_job), None) => Some(for_job.to_string()),
                _ => None,
            },
        ),
        None => (None, None),
    };
    JobView {
        id: job.id.to_string(),
        name: job.spec.name.clone(),
        share: job.spec.share.clone(),
        priority: job.spec.priority,
        state: job.state.as_str().to_string(),
        gpus: job.spec.gpus,
        gpu_class: job.class().to_string(),
        node,
        attempts: job.attempts,
        preemptions: job.preemptions,
        reason: reasons.of(state, job).map(|r| r.to_string()),
        last_preemption,
        preempted_for,
        gpu_indices: job
            .allocation()
            .map(|alloc| alloc.gpu_indices())
            .unwrap_or_default(),
        submitted_ms: job.submitted_ms,
        // The record clears its start when an attempt is stopped (time limit, preemption,
        // cancel); the view still says when the last attempt started, as it does for an
        // attempt that exited.
        started_ms: job
            .started_ms
            .or_else(|| job.history.last().and_then(|attempt| attempt.started_ms)),
        ended_ms: job.ended_ms,
        waited_ms: (job.first_started_ms.is_some() || job.ended_ms.is_some())
            .then(|| job.waited_ms(0)),
        last_node: job.last_node.clone(),
        exit_code: job.exit_code,
        counted_preemptions: job.counted_preemptions,
        max_preemptions: job.spec.max_preemptions,
        cpu_millis: job.spec.cpu_millis,
        memory_bytes: job.spec.memory_bytes,
        allocated_cpu_millis: job.allocation().map(|alloc| alloc.cpu_millis),
        allocated_memory_bytes: job.allocation().map(|alloc| alloc.memory_bytes),
        time_limit_ms: job.spec.time_limit_ms,
        retries: job.spec.retry.retries,
        retries_used: job.retries_used,
        retry_rules: job
            .spec
            .retry
            .rules
            .iter()
            .map(ToString::to_string)
            .collect(),
        image: job.spec.payload.image.clone(),
        attempt_history: job
            .history
            .iter()
            .map(|attempt| AttemptView {
                attempt: attempt.attempt,
                node: attempt.node().to_string(),
                nodes: attempt.nodes.clone(),
                placed_ms: attempt.placed_ms,
                started_ms: attempt.started_ms,
                ended_ms: attempt.ended_ms,
                exit_code: attempt.exit_code,
                outcome: attempt.outcome.clone(),
            })
            .collect(),
        node_count: job.node_count(),
        same: job.spec.same.clone(),
        placement,
        owner: job.spec.owner.clone(),
        last_checkpoint_ms: state.data().checkpoints.get(&job.id).copied(),
    }
}

/// One job, or `None` when there is no such job.
pub fn job_view_by_id(state: &State, id: JobId) -> Option<JobView> {
    state.job(id).map(|job| job_view(state, job))
}

/// The job history's record of a finished job (`crate::history`), from its final view.
pub fn history_record(state: &State, job: &JobRecord) -> HistoryRecord {
    let view = job_view(state, job);
    let gpus_held = u64::from(job.gpus()) * u64::from(job.node_count());
    let gpu_ms: u64 = job
        .history
        .iter()
        .map(|attempt| {
            let end = attempt
                .ended_ms
                .or(job.ended_ms)
                .unwrap_or(attempt.placed_ms);
            end.saturating_sub(attempt.placed_ms) * gpus_held
        })
        .sum();
    HistoryRecord {
        id: view.id,
        name: view.name,
        share: view.share,
        owner: view.owner,
        gpu_class: view.gpu_class,
        gpus: view.gpus,
        nodes: view.node_count,
        priority: view.priority,
        state: view.state,
        exit_code: view.exit_code,
        reason: view.reason,
        submitted_ms: view.submitted_ms,
        first_started_ms: job.first_started_ms,
        ended_ms: job.ended_ms.unwrap_or(job.submitted_ms),
        attempts: view.attempts,
        preemptions: view.preemptions,
        preemption_causes: view
            .attempt_history
            .iter()
            .filter_map(|attempt| attempt.outcome.clone())
            .filter(|outcome| outcome.starts_with("preempted"))
            .collect(),
        gpu_ms,
        gpu_seconds: (gpu_ms + 500) / 1_000,
        attempt_history: view.attempt_history,
    }
}

/// The records of the jobs that ended, as the state holds them now.
pub fn history_records(state: &State, jobs: &[JobId]) -> Vec<HistoryRecord> {
    jobs.iter()
        .filter_map(|id| state.job(*id))
        .filter(|job| job.state.is_terminal())
        .map(|job| history_record(state, job))
        .collect()
}

/// GPU time per share and class between `since_ms` and `until_ms` (whole hours that overlap
/// them), of `share` or all; one row per UTC day with `by_day`. The time since the last
/// command, up to `now_ms`, is counted at the rates the state has now.
pub fn usage_rows(
    state: &State,
    share: Option<&str>,
    since_ms: u64,
    until_ms: u64,
    by_day: bool,
    now_ms: u64,
) -> Vec<UsageRow> {
    const DAY_MS: u64 = 86_400_000;
    let mut rows: BTreeMap<(Option<u64>, String, String), quotient_core::usage::UsageCell> =
        BTreeMap::new();
    let pending = state.pending_usage(now_ms);
    let first_hour = since_ms - since_ms % quotient_core::usage::USAGE_BUCKET_MS;
    let pending = pending
        .iter()
        .filter(|((hour, _, _), _)| *hour >= first_hour && *hour < until_ms)
        .map(|((hour, share, class), cell)| ((*hour, share, class), cell));
    for ((hour, name, class), cell) in state.usage_between(since_ms, until_ms).chain(pending) {
        if share.is_some_and(|s| s != name) {
            continue;
        }
        let day = by_day.then(|| hour - hour % DAY_MS);
        rows.entry((day, name.clone(), class.clone()))
            .or_default()
            .add(cell);
    }
    rows.into_iter()
        .map(|((day_ms, share, gpu_class), cell)| UsageRow {
            share,
            gpu_class,
            day_ms,
            own_gpu_seconds: (cell.own_ms + 500) / 1_000,
            borrowed_gpu_seconds: (cell.borrowed_ms + 500) / 1_000,
            lent_gpu_seconds: (cell.lent_ms + 500) / 1_000,
        })
        .collect()
}

/// What `job list` asks for: each filter narrows it.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobFilter<'a> {
    pub share: Option<&'a str>,
    pub state: Option<JobState>,
    /// Only jobs whose name starts with this.
    pub name_prefix: Option<&'a str>,
    /// The jobs `user` may see (`None`: an admin, who sees all; a user sees the jobs of the
    /// shares they may submit to, and their own).
    pub user: Option<&'a str>,
    /// Only the jobs of `owner`.
    pub owner: Option<&'a str>,
}

/// One page of the jobs matching `filter`, newest first, from below `before` (the first page:
/// `None`), at most `limit` of them; `next_page_token` is set when more match. Only the page
/// is built: the scan stops at the first match after it.
pub fn job_page(
    state: &State,
    filter: JobFilter<'_>,
    before: Option<JobId>,
    limit: usize,
) -> JobPage {
    job_page_looking_at(state, filter, before, limit, JOB_SCAN_MAX)
}

/// [`job_page`], looking at no more than `scan_max` jobs.
fn job_page_looking_at(
    state: &State,
    filter: JobFilter<'_>,
    before: Option<JobId>,
    limit: usize,
    scan_max: usize,
) -> JobPage {
    let mut visible: BTreeMap<&str, bool> = BTreeMap::new();
    let mut page: Vec<&JobRecord> = Vec::new();
    // Where the next page starts (before this job), if there may be more.
    let mut next: Option<JobId> = None;
    let mut last_looked_at: Option<JobId> = None;
    for (looked_at, job) in state.jobs_newest_first(before).enumerate() {
        if looked_at == scan_max {
            // As many as one answer looks at: the next request goes on from here.
            next = last_looked_at;
            break;
        }
        last_looked_at = Some(job.id);
        if !job_matches(state, &filter, &mut visible, job) {
            continue;
        }
        if page.len() == limit {
            // One more matches: there is a next page.
            next = page.last().map(|job| job.id);
            break;
        }
        page.push(job);
    }
    JobPage {
        jobs: {
            let mut reasons = WaitReasons::default();
            page.into_iter()
                .map(|job| job_view_with(state, job, &mut reasons))
                .collect()
        },
        next_page_token: next.map(job_page_token),
    }
}

/// Whether `job` passes `filter`; `visible` remembers which shares the filter's user may use.
fn job_matches<'s>(
    state: &'s State,
    filter: &JobFilter<'_>,
    visible: &mut BTreeMap<&'s str, bool>,
    job: &'s JobRecord,
) -> bool {
    filter.share.is_none_or(|s| job.spec.share == s)
        && filter.state.is_none_or(|s| job.state == s)
        && filter.name_prefix.is_none_or(|prefix| {
            job.spec
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with(prefix))
        })
        && filter
            .owner
            .is_none_or(|o| job.spec.owner.as_deref() == Some(o))
        && filter.user.is_none_or(|user| {
            job.spec.owner.as_deref() == Some(user)
                || *visible
                    .entry(job.spec.share.as_str())
                    .or_insert_with(|| state.user_may_use(user, &job.spec.share))
        })
}

/// Every group, by name.
pub fn group_views(state: &State) -> Vec<GroupView> {
    state
        .data()
        .groups
        .iter()
        .map(|(name, users)| GroupView {
            name: name.clone(),
            users: users.iter().cloned().collect(),
        })
        .collect()
}

/// The audit log's entries at or after `since_ms` (all when `None`), of `user` alone (the
/// name in the caller's identity) when given, oldest first.
pub fn audit_views(state: &State, since_ms: Option<u64>, user: Option<&str>) -> Vec<AuditView> {
    state
        .data()
        .audit
        .iter()
        .filter(|entry| since_ms.is_none_or(|since| entry.at_ms >= since))
        .filter(|entry| user.is_none_or(|user| entry.who.rsplit('/').next() == Some(user)))
        .map(|entry| AuditView {
            index: entry.index,
            at_ms: entry.at_ms,
            who: entry.who.clone(),
            action: entry.action.clone(),
            outcome: entry.outcome.clone(),
        })
        .collect()
}

/// Every revoked certificate: one entry for a name revoked whole, one per serial otherwise.
pub fn revoked_views(state: &State) -> Vec<RevokedView> {
    let mut views = Vec::new();
    for (name, revocation) in &state.data().revoked {
        let view = |serial: Option<&String>| RevokedView {
            name: name.clone(),
            serial: serial.cloned(),
            at_ms: revocation.at_ms,
        };
        if revocation.serials.is_empty() {
            views.push(view(None));
        }
        views.extend(revocation.serials.iter().map(|serial| view(Some(serial))));
    }
    views
}

/// A node with its GPUs and which job holds each.
pub fn node_view(state: &State, node: &NodeRecord) -> NodeView {
    let holders = state.gpu_holders(node.id);
    NodeView {
        name: node.name.clone(),
        state: node.state.as_str().to_string(),
        gpus: node
            .gpus
            .iter()
            .map(|gpu| GpuView {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                class: gpu.class.to_string(),
                healthy: gpu.healthy,
                job: holders.get(&gpu.index).map(|job| job.to_string()),
                nvlink_peers: quotient_core::mask_indices(gpu.nvlink_peers),
            })
            .collect(),
        disk_used_bytes: None,
        disk_logs_bytes: None,
        disk_checkpoints_bytes: None,
        disk_free_bytes: None,
        runtimes: node
            .host
            .runtimes
            .iter()
            .map(|runtime| runtime.as_str().to_string())
            .collect(),
        images: node.host.images.clone(),
        cpu_millis: node.host.cpu_millis,
        memory_bytes: node.host.memory_bytes,
        cpu_millis_allocated: state.node_resources_used(node.id).0,
        memory_bytes_allocated: state.node_resources_used(node.id).1,
        unreachable: false,
        last_heartbeat_ms: None,
        labels: node.host.labels.clone(),
        address: node.host.address.clone(),
    }
}

/// Fills in what the leader knows of the node's heartbeats: when it last heard from it, and
/// whether it is unreachable (silent since a heartbeat was due; a lost node is not).
pub fn add_heartbeat(view: &mut NodeView, heard: Option<(Option<u64>, bool)>) {
    view.last_heartbeat_ms = heard.and_then(|(at, _)| at);
    view.unreachable =
        view.state != NodeState::Lost.as_str() && heard.is_some_and(|(_, silent)| silent);
}

/// Fills in the disk use the node's agent last reported (`None`: none known to this leader,
/// or the node is lost and its agent's word is stale).
pub fn add_disk_usage(view: &mut NodeView, usage: Option<DiskUsage>) {
    let usage = usage.filter(|_| view.state != NodeState::Lost.as_str());
    view.disk_used_bytes =
        usage.map(|usage| usage.logs_bytes.saturating_add(usage.checkpoints_bytes));
    view.disk_logs_bytes = usage.map(|usage| usage.logs_bytes);
    view.disk_checkpoints_bytes = usage.map(|usage| usage.checkpoints_bytes);
    view.disk_free_bytes = usage.map(|usage| usage.free_bytes);
}

/// Every node, by name.
pub fn node_views(state: &State) -> Vec<NodeView> {
    node_page(state, None, usize::MAX).nodes
}

/// One page of nodes by name, after `after` (the first page: `None`), at most `limit`;
/// `next_page_token` is set when more follow. Only the page is built.
pub fn node_page(state: &State, after: Option<&str>, limit: usize) -> NodePage {
    use std::ops::Bound;
    let start = after.map_or(Bound::Unbounded, |name| Bound::Excluded(name.to_string()));
    let mut names = state
        .data()
        .node_ids
        .range::<String, _>((start, Bound::Unbounded))
        .filter_map(|(_, id)| state.node(*id));
    let nodes: Vec<NodeView> = names
        .by_ref()
        .take(limit)
        .map(|node| node_view(state, node))
        .collect();
    let next_page_token = (nodes.len() == limit && names.next().is_some())
        .then(|| nodes.last().map(|node| node_page_token(&node.name)))
        .flatten();
    NodePage {
        nodes,
        next_page_token,
    }
}

/// The cluster as this coordinator's Raft sees it. `reachable` says, per member, whether
/// this coordinator heard from it recently (itself always).
pub fn cluster_view(
    cluster: Option<ClusterId>,
    metrics: &RaftMetrics<MemberId, openraft::BasicNode>,
    reachable: impl Fn(MemberId) -> bool,
    refusal: impl Fn(MemberId) -> Option<String>,
) -> ClusterView {
    let membership = metrics.membership_config.membership();
    let voters: Vec<MemberId> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, node)| {
            let role = if metrics.current_leader == Some(*id) {
                "leader"
            } else if voters.contains(id) {
                "follower"
            } else {
                "learner"
            };
            MemberView {
                id: *id,
                address: node.addr.clone(),
                role: role.to_string(),
                reachable: *id == metrics.id || reachable(*id),
                problem: refusal(*id),
            }
        })
        .collect();
    ClusterView {
        cluster_id: cluster.map(|cluster| cluster.to_string()),
        leader: metrics.current_leader,
        term: metrics.current_term,
        members,
        last_applied: metrics.last_applied.map_or(0, |log_id| log_id.index),
    }
}

/// Whether this coordinator's Raft considers itself the leader.
pub fn is_leader(metrics: &RaftMetrics<MemberId, openraft::BasicNode>) -> bool {
    metrics.state == ServerState::Leader
}

/// FNV-1a offset basis (64 bits).
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a prime (64 bits).
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A 64-bit FNV-1a hash of the state's canonical (snapshot) bytes. Equal states give equal
/// digests on every replica. Costs one encoding of the state, so it is for health checks
/// and tests, not hot paths.
pub fn state_digest(state: &State) -> u64 {
    digest_of_bytes(&state.to_snapshot_bytes())
}

/// The digest of a state's canonical bytes (its snapshot bytes), as [`state_digest`] gives.
pub fn digest_of_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

#[cfg(test)]
mod tests {
    use quotient_common::api::{parse_job_page_token, parse_node_page_token};
    use quotient_core::Command;

    use super::*;
    use crate::test_log::Log;

    #[test]
    fn node_pages_go_by_name_and_list_every_node_once() {
        let mut log = Log::new();
        let names = ["gpu-c", "gpu-a", "gpu-e", "gpu-b", "gpu-d"];
        for name in names {
            log.register_node(name, 1);
        }
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = node_page(&log.state, after.as_deref(), 2);
            assert!(page.nodes.len() <= 2);
            seen.extend(page.nodes.iter().map(|node| node.name.clone()));
            match page.next_page_token {
                Some(token) => after = parse_node_page_token(&token),
                None => break,
            }
        }
        assert_eq!(seen, ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"]);
        let whole = node_page(&log.state, None, 5);
        assert_eq!(whole.nodes.len(), 5);
        assert_eq!(whole.next_page_token, None, "no page after the last");
    }

    #[test]
    fn an_answer_looks_at_a_bounded_number_of_jobs_and_the_pages_still_list_each_once() {
        // Proves the scan bound: with 3 jobs looked at per answer, a filter that matches 2 of
        // 10 jobs is answered in pieces (some empty, each with a token), and walking the
        // tokens lists exactly the matching jobs, newest first, ending with no token.
        let mut log = Log::new();
        log.create_share("a", 1);
        log.create_share("b", 1);
        for i in 1..=10 {
            let share = if i == 2 || i == 7 { "b" } else { "a" };
            log.apply(Command::SubmitJob(quotient_common::JobSpec::new(
                share,
                1,
                1,
                vec!["true".into()],
            )));
        }
        let filter = JobFilter {
            share: Some("b"),
            ..JobFilter::default()
        };
        let mut seen = Vec::new();
        let mut answers = 0;
        let mut before = None;
        loop {
            let page = job_page_looking_at(&log.state, filter, before, 100, 3);
            answers += 1;
            seen.extend(page.jobs.iter().map(|job| job.id.clone()));
            match page.next_page_token {
                Some(token) => before = parse_job_page_token(&token),
                None => break,
            }
        }
        assert_eq!(seen, ["j-7", "j-2"]);
        assert_eq!(answers, 4, "10 jobs, 3 looked at per answer");
        // A full page with more matching beyond it still says so.
        let first = job_page_looking_at(&log.state, JobFilter::default(), None, 2, 100);
        assert_eq!(first.jobs.len(), 2);
        assert!(first.next_page_token.is_some());
    }
}
