//! The checks of an episode's history and final state (docs/chaos.md says what each means).
//!
//! The checks of operations and of the job scripts' records are pure functions of what was
//! collected, so that they can be tested against made-up histories that must fail.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use quotient_common::api::{JobView, ShareView};
use serde::Serialize;

use super::client::{GPU_CLASS, UNIQUE_BASE};
use super::history::{Op, OpKind};

/// How far two records may overlap before it counts: the records are written by separate
/// subprocesses (`adjtimex`) a few milliseconds after what they record, so a handover
/// (one attempt's stop, the next one's start) may look a few milliseconds out of order.
/// Nothing in the self-fencing contract allows an overlap: the coordinators requeue a silent
/// node's jobs only after `agent lease + grace period + margin`, and the agent (or the job's
/// watchdog) has stopped them by `agent lease + watchdog slack + poll + grace period`.
pub const OVERLAP_SLACK_US: u64 = 250_000;

/// Every violation found, with a description of each.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Violations {
    pub lost_acks: Vec<String>,
    pub duplicate_jobs: Vec<String>,
    pub double_runs: Vec<String>,
    pub gpu_overcommits: Vec<String>,
    pub divergent_replicas: Vec<String>,
    pub stuck_jobs: Vec<String>,
    /// Writes the cluster refused (or said it could not serve), found applied.
    pub phantom_writes: Vec<String>,
    /// The final state failed the core's own checks when decoded (`quotient-coordinator
    /// restore` of a backup).
    pub invariant_violations: Vec<String>,
}

impl Violations {
    /// (name, descriptions) of every kind, in output order.
    pub fn kinds(&self) -> [(&'static str, &Vec<String>); 8] {
        [
            ("lost_acks", &self.lost_acks),
            ("duplicate_jobs", &self.duplicate_jobs),
            ("double_runs", &self.double_runs),
            ("gpu_overcommits", &self.gpu_overcommits),
            ("divergent_replicas", &self.divergent_replicas),
            ("stuck_jobs", &self.stuck_jobs),
            ("phantom_writes", &self.phantom_writes),
            ("invariant_violations", &self.invariant_violations),
        ]
    }

    pub fn total(&self) -> usize {
        self.kinds().iter().map(|(_, found)| found.len()).sum()
    }
}

/// Check 1: every acknowledged submit exists exactly once, under its key (the job's name) and
/// with the id it was acknowledged with; no key made two jobs; every acknowledged update
/// (priority, cancel, share update, share create) is in the final state unless an operation
/// that was not refused and was not over before it began wrote after it; and nothing refused
/// is in the final state.
///
/// Priority updates and share updates write values unique in the episode, so the final value
/// names the operation that wrote it (`w`). An acknowledged write `a` of another value whose
/// invocation came after `w` completed was lost: `w` cannot have been ordered after it.
pub fn check_operations(
    ops: &[Op],
    jobs: &[JobView],
    shares: &[ShareView],
    found: &mut Violations,
) {
    let mut by_name: HashMap<&str, Vec<&JobView>> = HashMap::new();
    for job in jobs {
        if let Some(name) = job.name.as_deref() {
            by_name.entry(name).or_default().push(job);
        }
    }
    let by_id: HashMap<&str, &JobView> = jobs.iter().map(|job| (job.id.as_str(), job)).collect();

    // Submits.
    for op in ops.iter().filter(|op| op.kind == OpKind::Submit) {
        let Some(key) = op.key.as_deref() else {
            continue;
        };
        let named = by_name.get(key).cloned().unwrap_or_default();
        if named.len() > 1 {
            let ids: Vec<&str> = named.iter().map(|job| job.id.as_str()).collect();
            found.duplicate_jobs.push(format!(
                "the submit with key {key} (op {}) made {} jobs: {ids:?}",
                op.id,
                named.len()
            ));
        }
        if op.acked() {
            match (named.first(), op.job.as_deref()) {
                (None, job) => found.lost_acks.push(format!(
                    "the submit with key {key} (op {}) was acknowledged as {job:?}, but no job has that name",
                    op.id
                )),
                (Some(job), Some(acked)) if job.id != acked && named.len() == 1 => {
                    found.lost_acks.push(format!(
                        "the submit with key {key} (op {}) was acknowledged as {acked}, but the job of that name is {}",
                        op.id, job.id
                    ))
                }
                _ => {}
            }
        } else if op.not_applied() && !named.is_empty() {
            found.phantom_writes.push(format!(
                "the submit with key {key} (op {}) was refused ({:?}: {:?}), but job {} exists",
                op.id, op.code, op.detail, named[0].id
            ));
        }
    }

    // Priorities: which operation wrote each job's final priority.
    let mut priority_ops: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops.iter().filter(|op| op.kind == OpKind::Priority) {
        if let Some(job) = op.job.as_deref() {
            priority_ops.entry(job).or_default().push(op);
        }
    }
    for (job_id, updates) in &priority_ops {
        let Some(job) = by_id.get(job_id) else {
            continue;
        };
        let writer = if job.priority >= UNIQUE_BASE {
            let Some(writer) = updates.iter().find(|op| op.priority == Some(job.priority)) else {
                found.phantom_writes.push(format!(
                    "{job_id} has priority {}, which no update of it wrote",
                    job.priority
                ));
                continue;
            };
            if writer.not_applied() {
                found.phantom_writes.push(format!(
                    "{job_id} has priority {} from op {}, which was refused ({:?})",
                    job.priority, writer.id, writer.code
                ));
            }
            Some(*writer)
        } else {
            None
        };
        for acked in updates.iter().filter(|op| op.acked()) {
            if acked.priority == Some(job.priority) {
                continue;
            }
            let lost = match writer {
                Some(writer) => acked.invoke_us > writer.complete_us,
                None => true,
            };
            if lost {
                found.lost_acks.push(format!(
                    "the update of {job_id} to priority {:?} (op {}) was acknowledged, but its priority is {} ({})",
                    acked.priority,
                    acked.id,
                    job.priority,
                    writer.map_or("as submitted".to_string(), |w| format!("written by op {}, which completed before op {} began", w.id, acked.id)),
                ));
            }
        }
    }

    // Cancels.
    let mut cancel_ops: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops.iter().filter(|op| op.kind == OpKind::Cancel) {
        if let Some(job) = op.job.as_deref() {
            cancel_ops.entry(job).or_default().push(op);
        }
    }
    for (job_id, cancels) in &cancel_ops {
        let Some(job) = by_id.get(job_id) else {
            continue;
        };
        if let Some(acked) = cancels.iter().find(|op| op.acked()) {
            if job.state != "CANCELLED" && job.state != "PREEMPTING" {
                found.lost_acks.push(format!(
                    "the cancel of {job_id} (op {}) was acknowledged, but it is {}",
                    acked.id, job.state
                ));
            }
        } else if job.state == "CANCELLED" && cancels.iter().all(|op| op.not_applied()) {
            found.phantom_writes.push(format!(
                "{job_id} is CANCELLED, but every cancel of it was refused ({:?})",
                cancels.iter().map(|op| op.code.clone()).collect::<Vec<_>>()
            ));
        }
    }

    // Shares.
    let by_share: HashMap<&str, &ShareView> = shares
        .iter()
        .map(|share| (share.name.as_str(), share))
        .collect();
    for op in ops.iter().filter(|op| op.kind == OpKind::ShareCreate) {
        let Some(name) = op.share.as_deref() else {
            continue;
        };
        let exists = by_share.contains_key(name);
        if op.acked() && !exists {
            found.lost_acks.push(format!(
                "the creation of share {name} (op {}) was acknowledged, but it does not exist",
                op.id
            ));
        } else if op.not_applied() && exists {
            found.phantom_writes.push(format!(
                "the creation of share {name} (op {}) was refused ({:?}: {:?}), but it exists",
                op.id, op.code, op.detail
            ));
        }
    }
    let mut update_ops: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops.iter().filter(|op| op.kind == OpKind::ShareUpdate) {
        if let Some(share) = op.share.as_deref() {
            update_ops.entry(share).or_default().push(op);
        }
    }
    for (name, updates) in &update_ops {
        let Some(share) = by_share.get(name) else {
            continue;
        };
        let limit = share.limits.get(GPU_CLASS).copied();
        let writer = match share.max_jobs_per_user {
            Some(cap) => {
                let Some(writer) = updates.iter().find(|op| op.cap == Some(cap)) else {
                    found.phantom_writes.push(format!(
                        "share {name} has max_jobs_per_user {cap}, which no update of it wrote"
                    ));
                    continue;
                };
                if writer.not_applied() {
                    found.phantom_writes.push(format!(
                        "share {name} has max_jobs_per_user {cap} from op {}, which was refused ({:?})",
                        writer.id, writer.code
                    ));
                }
                if writer.limit != limit {
                    found.lost_acks.push(format!(
                        "share {name} has max_jobs_per_user {cap} from op {} but limit {limit:?}, not the {:?} that op wrote with it",
                        writer.id, writer.limit
                    ));
                }
                Some(*writer)
            }
            None => None,
        };
        for acked in updates.iter().filter(|op| op.acked()) {
            if acked.cap.is_some() && acked.cap == share.max_jobs_per_user {
                continue;
            }
            let lost = match writer {
                Some(writer) => acked.invoke_us > writer.complete_us,
                None => true,
            };
            if lost {
                found.lost_acks.push(format!(
                    "the update of share {name} to limit {:?} and max_jobs_per_user {:?} (op {}) was acknowledged, but it has limit {limit:?} and max_jobs_per_user {:?}",
                    acked.limit, acked.cap, acked.id, share.max_jobs_per_user
                ));
            }
        }
    }
}

/// One interval recorded by a job script: an attempt's run (`runs/`), or a GPU's hold
/// (`gpus/`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interval {
    pub job: String,
    pub attempt: u32,
    pub node: String,
    pub gpu: String,
    pub start_us: u64,
    /// `None` when no end was recorded (the container was killed, or it still runs).
    pub end_us: Option<u64>,
    /// How the end was found: `recorded`, `host killed`, `attempt ended`, `still running`,
    /// `not recorded`.
    pub end_from: String,
}

fn read_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return lines;
    };
    let mut paths: Vec<_> = entries.flatten().map(|entry| entry.path()).collect();
    paths.sort();
    for path in paths {
        if let Ok(text) = std::fs::read_to_string(&path) {
            lines.extend(text.lines().map(str::to_string));
        }
    }
    lines
}

/// Pairs `begin` and `end` lines into intervals, by (job, attempt, node), in file order.
/// `fields` maps a line's words to (job, attempt, node, gpu, time).
fn pair(lines: &[String], begin: &str, end: &str) -> Vec<Interval> {
    let mut open: BTreeMap<(String, u32, String), usize> = BTreeMap::new();
    let mut intervals: Vec<Interval> = Vec::new();
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() < 6 {
            continue;
        }
        // start/stop: WORD JOB ATTEMPT NODE GPU T; hold/release: WORD GPU JOB ATTEMPT NODE T.
        let (job, attempt, node, gpu) = if words[0] == "start" || words[0] == "stop" {
            (words[1], words[2], words[3], words[4])
        } else {
            (words[2], words[3], words[4], words[1])
        };
        let (Ok(attempt), Ok(time)) = (attempt.parse::<u32>(), words[5].parse::<u64>()) else {
            continue;
        };
        let key = (job.to_string(), attempt, node.to_string());
        if words[0] == begin {
            open.insert(key, intervals.len());
            intervals.push(Interval {
                job: job.to_string(),
                attempt,
                node: node.to_string(),
                gpu: gpu.to_string(),
                start_us: time,
                end_us: None,
                end_from: "not recorded".to_string(),
            });
        } else if words[0] == end {
            if let Some(index) = open.remove(&key) {
                intervals[index].end_us = Some(time);
                intervals[index].end_from = "recorded".to_string();
            }
        }
    }
    intervals
}

/// The attempts' runs recorded in `shared/runs`.
pub fn read_runs(shared: &Path) -> Vec<Interval> {
    pair(&read_lines(&shared.join("runs")), "start", "stop")
}

/// The GPUs' holds recorded in `shared/gpus`.
pub fn read_holds(shared: &Path) -> Vec<Interval> {
    pair(&read_lines(&shared.join("gpus")), "hold", "release")
}

/// Gives every interval without a recorded end the earliest end known otherwise: the first
/// kill of its node's container after it started (its processes died then), the end of its
/// attempt as the coordinators recorded it, or `now` while the attempt still runs (or when
/// nothing says when it ended: the check stays conservative).
pub fn close(
    intervals: &mut [Interval],
    host_kills: &BTreeMap<String, Vec<u64>>,
    jobs: &[JobView],
    now_us: u64,
) {
    let by_id: HashMap<&str, &JobView> = jobs.iter().map(|job| (job.id.as_str(), job)).collect();
    for interval in intervals.iter_mut().filter(|i| i.end_us.is_none()) {
        let killed = host_kills.get(&interval.node).and_then(|kills| {
            kills
                .iter()
                .copied()
                .filter(|t| *t > interval.start_us)
                .min()
        });
        let ended = by_id.get(interval.job.as_str()).and_then(|job| {
            job.attempt_history
                .iter()
                .find(|a| a.attempt == interval.attempt && a.nodes.contains(&interval.node))
                .and_then(|a| a.ended_ms)
                .map(|ms| ms.saturating_mul(1_000))
        });
        let (end, from) = match (killed, ended) {
            (Some(k), Some(e)) if k <= e => (k, "host killed"),
            (Some(_), Some(e)) => (e, "attempt ended"),
            (Some(k), None) => (k, "host killed"),
            (None, Some(e)) => (e, "attempt ended"),
            (None, None) => {
                let running = by_id.get(interval.job.as_str()).is_some_and(|job| {
                    job.attempts == interval.attempt
                        && job.placement.iter().any(|p| p.node == interval.node)
                });
                (
                    now_us,
                    if running {
                        "still running"
                    } else {
                        "not recorded"
                    },
                )
            }
        };
        interval.end_us = Some(end.max(interval.start_us));
        interval.end_from = from.to_string();
    }
}

fn overlap(a: &Interval, b: &Interval) -> u64 {
    let end = a
        .end_us
        .unwrap_or(u64::MAX)
        .min(b.end_us.unwrap_or(u64::MAX));
    end.saturating_sub(a.start_us.max(b.start_us))
}

fn describe(interval: &Interval) -> String {
    format!(
        "attempt {} on {} (GPU {}) from {} to {:?} ({})",
        interval.attempt,
        interval.node,
        interval.gpu,
        interval.start_us,
        interval.end_us,
        interval.end_from
    )
}

/// Every pair of `intervals` with the same `key` that overlap by more than
/// [`OVERLAP_SLACK_US`]: (key, one, the other, overlap in µs).
fn overlapping<'a>(
    intervals: &'a [Interval],
    key: impl Fn(&'a Interval) -> &'a str,
) -> Vec<(&'a str, &'a Interval, &'a Interval, u64)> {
    let mut by_key: BTreeMap<&str, Vec<&Interval>> = BTreeMap::new();
    for interval in intervals {
        by_key.entry(key(interval)).or_default().push(interval);
    }
    let mut found = Vec::new();
    for (key, group) in by_key {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                let overlap = overlap(a, b);
                if overlap > OVERLAP_SLACK_US {
                    found.push((key, *a, *b, overlap));
                }
            }
        }
    }
    found
}

/// Check 2: no two runs of one job (two attempts, or one attempt twice) overlapped by more
/// than [`OVERLAP_SLACK_US`].
pub fn check_runs(runs: &[Interval], found: &mut Violations) {
    for (job, a, b, overlap) in overlapping(runs, |run| run.job.as_str()) {
        found.double_runs.push(format!(
            "{job} ran twice at once for {} ms: {} and {}",
            overlap / 1_000,
            describe(a),
            describe(b)
        ));
    }
}

/// Check 3: no GPU was held by two attempts (of one job or of two) at once for more than
/// [`OVERLAP_SLACK_US`].
pub fn check_holds(holds: &[Interval], found: &mut Violations) {
    for (gpu, a, b, overlap) in overlapping(holds, |hold| hold.gpu.as_str()) {
        found.gpu_overcommits.push(format!(
            "GPU {gpu} was held twice at once for {} ms: {} {} and {} {}",
            overlap / 1_000,
            a.job,
            describe(a),
            b.job,
            describe(b)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::history::Outcome;
    use super::*;

    fn job(id: &str, name: &str, priority: u32, state: &str) -> JobView {
        let mut job: JobView = serde_json::from_value(serde_json::json!({
            "id": id, "name": name, "share": "s", "priority": priority, "state": state,
            "gpus": 1, "gpu_class": "a10g", "node": null, "attempts": 1, "preemptions": 0,
            "reason": null, "last_preemption": null, "preempted_for": null, "gpu_indices": [],
            "submitted_ms": 0, "started_ms": null, "ended_ms": null, "waited_ms": null,
            "last_node": null, "exit_code": null, "counted_preemptions": 0,
            "max_preemptions": null, "cpu_millis": null, "memory_bytes": null,
            "allocated_cpu_millis": null, "allocated_memory_bytes": null,
            "time_limit_ms": null, "retries": 0, "retries_used": 0, "retry_rules": [],
            "image": null, "attempt_history": [], "node_count": 1, "same": null,
            "placement": [], "owner": null
        }))
        .expect("a job view");
        job.name = Some(name.to_string());
        job
    }

    fn op(id: u64, kind: OpKind, outcome: Outcome, invoke: u64, complete: u64) -> Op {
        let mut op = Op::new(0, kind);
        op.id = id;
        op.outcome = Some(outcome);
        op.invoke_us = invoke;
        op.complete_us = complete;
        op
    }

    #[test]
    fn a_lost_submit_a_duplicate_and_a_lost_priority_update_are_found() {
        // Proves the operation check can fail: each broken history gives its violation, and
        // the consistent one gives none.
        let mut submit = op(1, OpKind::Submit, Outcome::Ack, 0, 10);
        submit.key = Some("k1".into());
        submit.job = Some("j-1".into());
        let mut update = op(2, OpKind::Priority, Outcome::Ack, 20, 30);
        update.job = Some("j-1".into());
        update.priority = Some(100);
        let mut later = op(3, OpKind::Priority, Outcome::Ack, 40, 50);
        later.job = Some("j-1".into());
        later.priority = Some(101);
        let ops = vec![submit, update, later];

        let mut ok = Violations::default();
        check_operations(&ops, &[job("j-1", "k1", 101, "RUNNING")], &[], &mut ok);
        assert_eq!(ok.total(), 0, "{ok:?}");

        let mut stale = Violations::default();
        check_operations(&ops, &[job("j-1", "k1", 100, "RUNNING")], &[], &mut stale);
        assert_eq!(stale.lost_acks.len(), 1, "{stale:?}");

        let mut missing = Violations::default();
        check_operations(&ops, &[], &[], &mut missing);
        assert_eq!(missing.lost_acks.len(), 1, "{missing:?}");

        let mut twice = Violations::default();
        let jobs = [
            job("j-1", "k1", 101, "RUNNING"),
            job("j-2", "k1", 3, "RUNNABLE"),
        ];
        check_operations(&ops, &jobs, &[], &mut twice);
        assert_eq!(twice.duplicate_jobs.len(), 1, "{twice:?}");
    }

    #[test]
    fn overlapping_runs_and_holds_are_found_and_a_handover_is_not() {
        let run = |attempt: u32, node: &str, start: u64, end: u64| Interval {
            job: "j-1".into(),
            attempt,
            node: node.into(),
            gpu: format!("GPU-{node}"),
            start_us: start,
            end_us: Some(end),
            end_from: "recorded".into(),
        };
        let mut found = Violations::default();
        check_runs(
            &[
                run(1, "node-1", 0, 5_000_000),
                run(2, "node-2", 5_000_100, 9_000_000),
            ],
            &mut found,
        );
        assert_eq!(found.total(), 0, "{found:?}");
        check_runs(
            &[
                run(1, "node-1", 0, 5_000_000),
                run(2, "node-2", 4_000_000, 9_000_000),
            ],
            &mut found,
        );
        assert_eq!(found.double_runs.len(), 1, "{found:?}");
        let mut other = run(1, "node-1", 1_000_000, 2_000_000);
        other.job = "j-2".into();
        check_holds(&[run(1, "node-1", 0, 5_000_000), other], &mut found);
        assert_eq!(found.gpu_overcommits.len(), 1, "{found:?}");
    }

    #[test]
    fn records_pair_into_intervals_and_a_killed_host_closes_them() {
        let lines: Vec<String> = [
            "start j-1 1 node-1 GPU-a 100",
            "hold GPU-a j-1 1 node-1 90",
            "stop j-1 1 node-1 GPU-a 500 term",
            "start j-2 1 node-2 GPU-b 700",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut runs = pair(&lines, "start", "stop");
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].end_us, Some(500));
        let kills = BTreeMap::from([("node-2".to_string(), vec![50, 900])]);
        close(&mut runs, &kills, &[], 10_000);
        assert_eq!(runs[1].end_us, Some(900));
        assert_eq!(runs[1].end_from, "host killed");
        let holds = pair(&lines, "hold", "release");
        assert_eq!(holds.len(), 1);
        assert_eq!(holds[0].gpu, "GPU-a");
        assert_eq!(holds[0].end_us, None);
    }
}
