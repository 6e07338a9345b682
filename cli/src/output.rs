//! How commands print: aligned tables for people, one JSON document for machines.
//!
//! `-o json` prints exactly one document on stdout (docs/cli.md); the views of
//! `quotient_common::api` already have the spec's shapes, so they go through `serde_json` as
//! they are. Tables are plain text with columns padded to their widest cell, a header in
//! capitals, and `-` for an empty cell, so a newcomer can read them and `awk` can split them.
//! The renderers return strings, so they are unit-tested without capturing stdout.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::Write;

use anyhow::Context;
use quotient_common::api::{ClusterView, JobView, NodeView, ShareView};
pub use quotient_common::duration::human_duration;
use serde::Serialize;

/// The output format, `-o table|json|csv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    #[default]
    Table,
    /// One JSON document on stdout, for scripts.
    Json,
    /// Comma-separated values with a header row, for spreadsheets: `job history` and `share
    /// usage` only.
    Csv,
}

/// Space between two table columns.
const COLUMN_GAP: &str = "  ";

/// A table: a header row and data rows, rendered with aligned columns.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|cell| cell.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; an empty cell is shown as `-`.
    pub fn row(&mut self, cells: Vec<String>) {
        let cells = cells
            .into_iter()
            .map(|cell| {
                if cell.is_empty() {
                    "-".to_string()
                } else {
                    cell
                }
            })
            .collect();
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in a newline, without trailing spaces.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self
            .header
            .iter()
            .map(|cell| cell.chars().count())
            .collect();
        for row in &self.rows {
            for (index, cell) in row.iter().enumerate().take(columns) {
                widths[index] = widths[index].max(cell.chars().count());
            }
        }
        let mut text = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (index, cell) in row.iter().enumerate().take(columns) {
                if index > 0 {
                    line.push_str(COLUMN_GAP);
                }
                line.push_str(cell);
                let pad = widths[index].saturating_sub(cell.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

/// `a10g=1,h100=2`, or empty (shown `-`) for no entries.
pub fn class_counts<V: Display>(counts: &BTreeMap<String, V>) -> String {
    counts
        .iter()
        .map(|(class, count)| format!("{class}={count}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn optional<T: Display>(value: &Option<T>) -> String {
    value.as_ref().map(ToString::to_string).unwrap_or_default()
}

/// The share table: NAME STRATEGY LIMIT USAGE BORROWED LENT RUNNABLE RUNNING STATE.
pub fn share_table(shares: &[ShareView]) -> String {
    let mut table = Table::new(&[
        "NAME", "STRATEGY", "LIMIT", "USAGE", "BORROWED", "LENT", "RUNNABLE", "RUNNING", "STATE",
    ]);
    for share in shares {
        table.row(vec![
            share.name.clone(),
            share.strategy.clone(),
            class_counts(&share.limits),
            class_counts(&share.usage),
            class_counts(&share.borrowed),
            class_counts(&share.lent),
            share.runnable.to_string(),
            share.running.to_string(),
            share.state.clone(),
        ]);
    }
    table.render()
}

/// One share in detail, `field: value` lines (for `share get` without `-o json`).
pub fn share_detail(share: &ShareView) -> String {
    let borrow = share
        .borrow_limit_percent
        .map(|percent| format!("{percent}%"))
        .unwrap_or_else(|| "-".to_string());
    let or_dash = |text: String| {
        if text.is_empty() {
            "-".to_string()
        } else {
            text
        }
    };
    let members = if share.members.is_empty() {
        "open to every user".to_string()
    } else {
        share.members.join(", ")
    };
    format!(
        "name:                {}\nstate:               {}\nstrategy:            {}\n\
         limits:              {}\nborrow limit:        {borrow}\nin-share preemption: {}\n\
         usage:               {}\nborrowed:            {}\nlent:                {}\n\
         runnable jobs:       {}\nrunning jobs:        {}\nmembers:             {members}\n\
         max jobs per user:   {}\n",
        share.name,
        share.state,
        share.strategy,
        or_dash(class_counts(&share.limits)),
        share.in_share_preemption,
        or_dash(class_counts(&share.usage)),
        or_dash(class_counts(&share.borrowed)),
        or_dash(class_counts(&share.lent)),
        share.runnable,
        share.running,
        share
            .max_jobs_per_user
            .map_or_else(|| "-".to_string(), |n| n.to_string()),
    )
}

/// The job table: ID NAME SHARE PRIO STATE GPUS NODE ATTEMPTS PREEMPTIONS REASON.
pub fn job_table(jobs: &[JobView]) -> String {
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "SHARE",
        "PRIO",
        "STATE",
        "GPUS",
        "NODE",
        "ATTEMPTS",
        "PREEMPTIONS",
        "REASON",
    ]);
    for job in jobs {
        table.row(vec![
            job.id.clone(),
            optional(&job.name),
            job.share.clone(),
            job.priority.to_string(),
            job.state.clone(),
            gpus_cell(job),
            optional(&job.node),
            job.attempts.to_string(),
            job.preemptions.to_string(),
            optional(&job.reason),
        ]);
    }
    table.render()
}

/// A job's GPUs as the table shows them: `2xa10g`, or for a job of several nodes
/// `4x(2xa10g)` (4 nodes of 2 each).
pub fn gpus_cell(job: &JobView) -> String {
    if job.node_count > 1 {
        format!("{}x({}x{})", job.node_count, job.gpus, job.gpu_class)
    } else {
        format!("{}x{}", job.gpus, job.gpu_class)
    }
}

/// A time in milliseconds since the Unix epoch as RFC 3339 in UTC, to the second
/// (`2026-12-04T18:20:11Z`).
pub fn rfc3339(ms: u64) -> String {
    quotient_common::certs::utc_text(i64::try_from(ms / 1000).unwrap_or(i64::MAX))
}

/// The attempts of a job, a line each: number, node, start and end, how it ended.
fn attempt_lines(job: &JobView) -> String {
    let mut out = String::new();
    for attempt in &job.attempt_history {
        let started = attempt
            .started_ms
            .map_or_else(|| "never ran".to_string(), rfc3339);
        let ended = attempt.ended_ms.map_or_else(|| "now".to_string(), rfc3339);
        let outcome = attempt.outcome.as_deref().unwrap_or("current");
        let nodes = if attempt.nodes.len() > 1 {
            attempt.nodes.join(", ")
        } else {
            attempt.node.clone()
        };
        out.push_str(&format!(
            "  #{} on {nodes}: {started} to {ended}: {outcome}\n",
            attempt.attempt
        ));
    }
    out
}

/// One job in detail, `field: value` lines (for `job get` without `-o json`).
pub fn job_detail(job: &JobView) -> String {
    let dash = |value: String| {
        if value.is_empty() {
            "-".to_string()
        } else {
            value
        }
    };
    let indices = job
        .gpu_indices
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let nodes = if job.node_count > 1 {
        format!("{} nodes x ", job.node_count)
    } else {
        String::new()
    };
    format!(
        "id:               {}\nname:             {}\nowner:            {}\nshare:            {}\npriority:         {}\n\
         state:            {}\ngpus:             {nodes}{} x {}\nnode:             {}\n\
         gpu indices:      {}\nattempts:         {}\npreemptions:      {}\n\
         reason:           {}\nlast preemption:  {}\npreempted for:    {}\n",
        job.id,
        dash(optional(&job.name)),
        dash(optional(&job.owner)),
        job.share,
        job.priority,
        job.state,
        job.gpus,
        job.gpu_class,
        dash(optional(&job.node)),
        dash(indices),
        job.attempts,
        job.preemptions,
        dash(optional(&job.reason)),
        dash(optional(&job.last_preemption)),
        dash(optional(&job.preempted_for)),
    ) + &placement_lines(job)
        + &job_times(job)
}

/// The `placement:` lines of `job get` for a job of several nodes holding GPUs: one per
/// member.
fn placement_lines(job: &JobView) -> String {
    if job.node_count <= 1 || job.placement.is_empty() {
        return String::new();
    }
    let mut out = String::from("placement:\n");
    for member in &job.placement {
        let gpus: Vec<String> = member.gpus.iter().map(ToString::to_string).collect();
        let exit = member
            .exit_code
            .map_or_else(String::new, |code| format!(" (exit {code})"));
        out.push_str(&format!(
            "  rank {} on {}: GPUs {}, {}{exit}\n",
            member.rank,
            member.node,
            gpus.join(","),
            member.stage
        ));
    }
    out
}

/// The lines of `job get` about times, limits and attempts.
fn job_times(job: &JobView) -> String {
    let opt_time = |ms: Option<u64>| ms.map_or_else(|| "-".to_string(), rfc3339);
    let waited = match job.waited_ms {
        Some(ms) => human_duration(ms),
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            format!(
                "{} so far",
                human_duration(now.saturating_sub(job.submitted_ms))
            )
        }
    };
    let resources = match (job.allocated_cpu_millis, job.allocated_memory_bytes) {
        (Some(cpus), Some(memory)) if cpus > 0 || memory > 0 => format!(
            "{} CPUs, {} memory",
            f64::from(cpus) / 1000.0,
            human_bytes(memory)
        ),
        _ => match (job.cpu_millis, job.memory_bytes) {
            (None, None) => "its share of the node's, by GPUs".to_string(),
            (cpus, memory) => format!(
                "{} CPUs, {} memory",
                cpus.map_or("share of".to_string(), |c| (f64::from(c) / 1000.0)
                    .to_string()),
                memory.map_or("share of".to_string(), human_bytes)
            ),
        },
    };
    let retries = if job.retry_rules.is_empty() {
        format!("{} of {}", job.retries_used, job.retries)
    } else {
        format!(
            "{} of {} ({})",
            job.retries_used,
            job.retries,
            job.retry_rules.join(" ")
        )
    };
    format!(
        "submitted:        {}\nstarted:          {}\nlast checkpoint:  {}\nended:            {}\n\
         waited:           {waited}\nlast node:        {}\nexit code:        {}\n\
         resources:        {resources}\ntime limit:       {}\nretries:          {retries}\n\
         attempt history:\n{}",
        rfc3339(job.submitted_ms),
        opt_time(job.started_ms),
        opt_time(job.last_checkpoint_ms),
        opt_time(job.ended_ms),
        job.last_node.as_deref().unwrap_or("-"),
        job.exit_code
            .map_or("-".to_string(), |code| code.to_string()),
        job.time_limit_ms.map_or("-".to_string(), human_duration),
        attempt_lines(job),
    )
}

/// The node table: NAME STATE GPUS CLASS FREE UNHEALTHY JOBS DISK-USED/FREE RUNTIMES
/// LAST-HEARTBEAT LABELS (the agent's logs and checkpoints, and what its state dir's filesystem has
/// left; `-` when unknown). A node the leader has not heard from since a heartbeat was due
/// shows the state `unreachable` (its JSON keeps its state and says `"unreachable": true`).
pub fn node_table(nodes: &[NodeView]) -> String {
    let mut table = Table::new(&[
        "NAME",
        "STATE",
        "GPUS",
        "CLASS",
        "FREE",
        "UNHEALTHY",
        "JOBS",
        "DISK-USED/FREE",
        "RUNTIMES",
        "LAST-HEARTBEAT",
        "LABELS",
    ]);
    for node in nodes {
        let mut classes: Vec<&str> = node.gpus.iter().map(|gpu| gpu.class.as_str()).collect();
        classes.dedup();
        let free = node
            .gpus
            .iter()
            .filter(|gpu| gpu.healthy && gpu.job.is_none())
            .count();
        let unhealthy = node.gpus.iter().filter(|gpu| !gpu.healthy).count();
        let mut jobs: Vec<&str> = node
            .gpus
            .iter()
            .filter_map(|gpu| gpu.job.as_deref())
            .collect();
        jobs.dedup();
        let state = if node.unreachable {
            "unreachable".to_string()
        } else {
            node.state.clone()
        };
        table.row(vec![
            node.name.clone(),
            state,
            node.gpus.len().to_string(),
            classes.join(","),
            free.to_string(),
            unhealthy.to_string(),
            jobs.join(","),
            match (node.disk_used_bytes, node.disk_free_bytes) {
                (Some(used), Some(free)) => format!("{}/{}", human_bytes(used), human_bytes(free)),
                _ => String::new(),
            },
            node.runtimes.join(","),
            node.last_heartbeat_ms.map_or_else(String::new, rfc3339),
            node.labels
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    table.render()
}

/// A byte count for people, in powers of 1024 with one decimal: `512B`, `1.5KiB`, `40.0GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// The cluster summary line and the member table: ID ADDRESS ROLE REACHABLE.
pub fn cluster_table(cluster: &ClusterView) -> String {
    let leader = cluster
        .leader
        .map(|id| id.to_string())
        .unwrap_or_else(|| "none (an election is under way)".to_string());
    let mut text = format!(
        "leader: {leader}  term: {}  last applied: {}\n",
        cluster.term, cluster.last_applied
    );
    if let Some(cluster_id) = &cluster.cluster_id {
        text.push_str(&format!("cluster: {cluster_id}\n"));
    }
    let mut table = Table::new(&["ID", "ADDRESS", "ROLE", "REACHABLE"]);
    for member in &cluster.members {
        table.row(vec![
            member.id.to_string(),
            member.address.clone(),
            member.role.clone(),
            if member.reachable { "yes" } else { "no" }.to_string(),
        ]);
    }
    text.push_str(&table.render());
    for member in &cluster.members {
        if let Some(problem) = &member.problem {
            text.push_str(&format!("coordinator {}: {problem}\n", member.id));
        }
    }
    text
}

/// Prints `value` as one pretty JSON document on stdout.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("cannot render JSON")?;
    print_text(&format!("{text}\n"))
}

/// Prints text on stdout; a closed pipe (`quotient job list | head`) is not an error worth a
/// panic, so write errors are returned.
pub fn print_text(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::api::MemberView;

    fn share() -> ShareView {
        ShareView {
            name: "qs1".into(),
            strategy: "lend-and-borrow".into(),
            limits: [("a10g".to_string(), 1)].into(),
            borrow_limit_percent: Some(200),
            in_share_preemption: true,
            state: "enabled".into(),
            usage: [("a10g".to_string(), 2)].into(),
            borrowed: [("a10g".to_string(), 1)].into(),
            lent: [("a10g".to_string(), 0)].into(),
            runnable: 1,
            running: 2,
            members: Vec::new(),
            open: true,
            max_jobs_per_user: None,
        }
    }

    fn job() -> JobView {
        JobView {
            id: "j-42".into(),
            name: Some("high".into()),
            share: "qs1".into(),
            priority: 3,
            state: "RUNNING".into(),
            gpus: 1,
            gpu_class: "a10g".into(),
            node: Some("node-2".into()),
            attempts: 1,
            preemptions: 0,
            reason: None,
            last_preemption: None,
            preempted_for: None,
            gpu_indices: vec![0],
            submitted_ms: 0,
            ..JobView::default()
        }
    }

    #[test]
    fn the_share_table_aligns_its_columns() {
        // Proves the spec's columns come out aligned under their headers.
        let mut other = share();
        other.name = "a-much-longer-name".into();
        other.state = "disabled".into();
        other.borrowed.clear();
        let text = share_table(&[share(), other]);
        let expected = "\
NAME                STRATEGY         LIMIT   USAGE   BORROWED  LENT    RUNNABLE  RUNNING  STATE
qs1                 lend-and-borrow  a10g=1  a10g=2  a10g=1    a10g=0  1         2        enabled
a-much-longer-name  lend-and-borrow  a10g=1  a10g=2  -         a10g=0  1         2        disabled
";
        assert_eq!(text, expected);
    }

    #[test]
    fn the_job_table_shows_empty_cells_as_dashes() {
        // Proves a job with no node and no reason still lines up.
        let mut waiting = job();
        waiting.id = "j-7".into();
        waiting.name = None;
        waiting.node = None;
        waiting.state = "RUNNABLE".into();
        waiting.reason = Some("share qs1 is at its limit".into());
        let text = job_table(&[job(), waiting]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "ID    NAME  SHARE  PRIO  STATE     GPUS    NODE    ATTEMPTS  PREEMPTIONS  REASON"
        );
        assert_eq!(
            lines[1],
            "j-42  high  qs1    3     RUNNING   1xa10g  node-2  1         0            -"
        );
        assert_eq!(
            lines[2],
            "j-7   -     qs1    3     RUNNABLE  1xa10g  -       1         0            share qs1 is at its limit"
        );
    }

    #[test]
    fn an_empty_table_is_its_header() {
        // Proves `share list` on a new cluster prints the header alone.
        assert_eq!(
            share_table(&[]),
            "NAME  STRATEGY  LIMIT  USAGE  BORROWED  LENT  RUNNABLE  RUNNING  STATE\n"
        );
    }

    #[test]
    fn the_node_table_shows_the_agents_disk() {
        // Proves the disk column: used and free when the agent reported them, `-` otherwise.
        let node = |name: &str, disk: Option<(u64, u64)>| NodeView {
            name: name.into(),
            state: "ready".into(),
            gpus: Vec::new(),
            disk_used_bytes: disk.map(|(used, _)| used),
            disk_logs_bytes: disk.map(|(used, _)| used),
            disk_checkpoints_bytes: disk.map(|_| 0),
            disk_free_bytes: disk.map(|(_, free)| free),
            ..NodeView::default()
        };
        let text = node_table(&[
            node("node-1", Some((3 << 19, 40 << 30))),
            node("node-2", None),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("JOBS  DISK-USED/FREE"), "{text}");
        assert!(lines[1].contains("1.5MiB/40.0GiB"), "{text}");
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cells[cells.len() - 5..],
            ["-", "-", "-", "-", "-"],
            "{text}"
        );
        assert_eq!(human_bytes(512), "512B");
        assert_eq!(human_bytes(1536), "1.5KiB");
        let json = serde_json::to_value(node("node-1", Some((7, 9)))).unwrap();
        assert_eq!(json["disk_used_bytes"], 7);
        assert_eq!(json["disk_free_bytes"], 9);
        let json = serde_json::to_value(node("node-2", None)).unwrap();
        assert_eq!(json["disk_used_bytes"], serde_json::Value::Null);
    }

    #[test]
    fn the_cluster_table_names_the_leader() {
        // Proves the summary line and a member row.
        let view = ClusterView {
            cluster_id: Some("ab".repeat(16)),
            leader: Some(1),
            term: 3,
            members: vec![
                MemberView {
                    id: 1,
                    address: "127.0.0.1:7401".into(),
                    role: "leader".into(),
                    reachable: true,
                    problem: None,
                },
                MemberView {
                    id: 2,
                    address: "127.0.0.1:7402".into(),
                    role: "follower".into(),
                    reachable: true,
                    problem: Some("its data directory is empty".into()),
                },
            ],
            last_applied: 9,
        };
        let text = cluster_table(&view);
        assert!(
            text.starts_with(&format!(
                "leader: 1  term: 3  last applied: 9\ncluster: {}\n",
                "ab".repeat(16)
            )),
            "{text}"
        );
        assert!(text.contains("1   127.0.0.1:7401  leader    yes"), "{text}");
        assert!(
            text.contains("coordinator 2: its data directory is empty"),
            "{text}"
        );
    }

    #[test]
    fn the_views_serialize_to_the_spec_shapes() {
        // Proves the JSON field names match docs/cli.md.
        let json = serde_json::to_value(share()).unwrap();
        for field in [
            "name",
            "strategy",
            "limits",
            "borrow_limit_percent",
            "in_share_preemption",
            "state",
            "usage",
            "borrowed",
            "lent",
            "runnable",
            "running",
        ] {
            assert!(json.get(field).is_some(), "share JSON lacks {field}");
        }
        assert_eq!(json["limits"]["a10g"], 1);
        let json = serde_json::to_value(job()).unwrap();
        assert_eq!(json["id"], "j-42");
        assert_eq!(json["reason"], serde_json::Value::Null);
        assert_eq!(json["node"], "node-2");
        for field in ["node_count", "same", "placement"] {
            assert!(json.get(field).is_some(), "job JSON lacks {field}");
        }
    }

    #[test]
    fn a_job_of_several_nodes_shows_its_nodes_and_members() {
        // Proves the table's `2x(1xa10g)` form and `job get`'s placement lines.
        let mut gang = job();
        gang.node_count = 2;
        gang.placement = vec![
            quotient_common::api::PlacementView {
                rank: 0,
                node: "node-2".into(),
                gpus: vec![0],
                stage: "running".into(),
                exit_code: None,
            },
            quotient_common::api::PlacementView {
                rank: 1,
                node: "node-4".into(),
                gpus: vec![0],
                stage: "exited".into(),
                exit_code: Some(0),
            },
        ];
        let table = job_table(std::slice::from_ref(&gang));
        assert!(table.contains("2x(1xa10g)"), "{table}");
        assert!(job_table(&[job()]).contains(" 1xa10g "));
        let detail = job_detail(&gang);
        assert!(
            detail.contains("gpus:             2 nodes x 1 x a10g\n"),
            "{detail}"
        );
        assert!(
            detail.contains("placement:\n  rank 0 on node-2: GPUs 0, running\n  rank 1 on node-4: GPUs 0, exited (exit 0)\n"),
            "{detail}"
        );
    }
}
