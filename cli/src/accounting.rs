//! `quotient job history` (the finished jobs the coordinator asked keeps on disk, newest end
//! first, in pages) and `quotient share usage` (GPU time per share and class: own, borrowed,
//! lent), each as a table, JSON or CSV (docs/accounting.md).

use quotient_common::api::{
    ApiRequest, ApiResponse, HistoryPage, HistoryRecord, UsageRow, JOB_PAGE_DEFAULT, JOB_PAGE_MAX,
};
use quotient_common::{JobId, JobState};

use crate::client::{unexpected, Session};
use crate::output::{self, human_duration, rfc3339, OutputFormat, Table};
use crate::parse::{parse_share_name, UsageError};
use crate::GlobalArgs;

/// Parses a point in time: a duration ago (`24h`, `30m`, `7d`) or an RFC 3339 time
/// (`2026-12-01T00:00:00Z`); milliseconds since the epoch.
pub fn parse_time_ms(text: &str) -> Result<u64, String> {
    if let Ok(ago) = quotient_common::duration::parse_duration_ms(text) {
        return Ok(now_ms().saturating_sub(ago));
    }
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|_| {
            format!(
                "invalid time {text:?}: write how long ago (24h, 7d) or an RFC 3339 time \
                 (2026-12-01T00:00:00Z)"
            )
        })?;
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| format!("invalid time {text:?}: before 1970"))
}

/// Refuses `--since` after `--until` (or `--since` in the future): such a window holds
/// nothing, and an empty answer would look like no usage rather than a mistake. A common
/// slip: `--since 1h --until 2h` means from an hour ago until two hours ago.
fn check_window(since: Option<u64>, until: Option<u64>) -> Result<(), UsageError> {
    let Some(since) = since else {
        return Ok(());
    };
    let (end, what) = match until {
        Some(until) => (until, "--until"),
        None => (now_ms(), "now"),
    };
    if since > end {
        return Err(UsageError(format!(
            "--since is after {what}: the window holds nothing (durations count back from now, so `--since 2h --until 1h` is from two hours ago until one hour ago)"
        )));
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Arguments of `quotient job history`.
#[derive(Debug, clap::Args)]
pub struct JobHistoryArgs {
    /// Only the jobs of this share.
    #[arg(long, value_parser = parse_share_name)]
    pub share: Option<String>,
    /// Only the jobs that ended since then: how long ago (24h) or an RFC 3339 time.
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub since: Option<u64>,
    /// Only the jobs that ended before then: how long ago (2h) or an RFC 3339 time.
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub until: Option<u64>,
    /// Only the jobs that ended so: SUCCEEDED, FAILED or CANCELLED.
    #[arg(long)]
    pub state: Option<JobState>,
    /// Only this job's record.
    #[arg(long)]
    pub job: Option<JobId>,
    /// Records on the page, newest end first, 1-1000.
    #[arg(long, default_value_t = JOB_PAGE_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=JOB_PAGE_MAX as i64))]
    pub limit: u32,
    /// The page after the one that gave this token (its `next_page_token`).
    #[arg(long, value_name = "TOKEN", conflicts_with = "all")]
    pub page_token: Option<String>,
    /// Every page, one after the other.
    #[arg(long)]
    pub all: bool,
}

impl JobHistoryArgs {
    fn request(&self, page_token: Option<String>) -> ApiRequest {
        ApiRequest::JobHistory {
            share: self.share.clone(),
            since_ms: self.since,
            until_ms: self.until,
            state: self.state,
            job: self.job,
            limit: self.limit,
            page_token,
        }
    }
}

fn history_page(session: &mut Session, request: ApiRequest) -> anyhow::Result<HistoryPage> {
    match session.call(request.clone())? {
        ApiResponse::History(page) => Ok(page),
        other => Err(unexpected(&request, &other)),
    }
}

pub fn job_history(global: &GlobalArgs, args: &JobHistoryArgs) -> anyhow::Result<()> {
    if let Some(state) = args.state.filter(|state| !state.is_terminal()) {
        return Err(UsageError(format!(
            "--state {state}: the history holds finished jobs only (SUCCEEDED, FAILED or \
             CANCELLED); `quotient job list --state {state}` shows the others"
        ))
        .into());
    }
    if args.job.is_none() {
        check_window(args.since, args.until)?;
    }
    let mut session = Session::open(global.config.as_deref())?;
    let page = if args.all {
        let mut all = HistoryPage::default();
        let mut token = None;
        loop {
            let page = history_page(&mut session, args.request(token))?;
            all.records.extend(page.records);
            match page.next_page_token {
                Some(next) => token = Some(next),
                None => break all,
            }
        }
    } else {
        history_page(&mut session, args.request(args.page_token.clone()))?
    };
    if global.output != OutputFormat::Json {
        if let Some(token) = &page.next_page_token {
            eprintln!(
                "more records: `quotient job history --page-token {token} --limit {limit}` (the \
                 same filters) shows the next {limit}, `--all` every one",
                limit = args.limit
            );
        }
    }
    match global.output {
        OutputFormat::Json => output::print_json(&page),
        OutputFormat::Csv => print_csv(page.records.iter().map(HistoryCsv::from)),
        OutputFormat::Table => output::print_text(&history_table(&page.records)),
    }
}

fn history_table(records: &[HistoryRecord]) -> String {
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "SHARE",
        "OWNER",
        "STATE",
        "GPUS",
        "ENDED",
        "RAN",
        "GPU-HOURS",
        "PREEMPTED",
    ]);
    for record in records {
        let ran = record.first_started_ms.map_or_else(
            || "-".into(),
            |at| human_duration(record.ended_ms.saturating_sub(at)),
        );
        table.row(vec![
            record.id.clone(),
            record.name.clone().unwrap_or_else(|| "-".into()),
            record.share.clone(),
            record.owner.clone().unwrap_or_else(|| "-".into()),
            record.state.clone(),
            if record.nodes > 1 {
                format!("{}x({}x{})", record.nodes, record.gpus, record.gpu_class)
            } else {
                format!("{}x{}", record.gpus, record.gpu_class)
            },
            rfc3339(record.ended_ms),
            ran,
            format!("{:.2}", record.gpu_ms as f64 / 3_600_000.0),
            record.preemptions.to_string(),
        ]);
    }
    table.render()
}

/// A history record as one CSV row: its scalar fields.
#[derive(serde::Serialize)]
struct HistoryCsv<'a> {
    id: &'a str,
    name: &'a str,
    share: &'a str,
    owner: &'a str,
    gpu_class: &'a str,
    gpus: u32,
    nodes: u32,
    priority: u32,
    state: &'a str,
    exit_code: Option<i32>,
    reason: &'a str,
    submitted: String,
    first_started: String,
    ended: String,
    attempts: u32,
    preemptions: u32,
    preemption_causes: String,
    gpu_seconds: u64,
}

impl<'a> From<&'a HistoryRecord> for HistoryCsv<'a> {
    fn from(record: &'a HistoryRecord) -> Self {
        HistoryCsv {
            id: &record.id,
            name: record.name.as_deref().unwrap_or(""),
            share: &record.share,
            owner: record.owner.as_deref().unwrap_or(""),
            gpu_class: &record.gpu_class,
            gpus: record.gpus,
            nodes: record.nodes,
            priority: record.priority,
            state: &record.state,
            exit_code: record.exit_code,
            reason: record.reason.as_deref().unwrap_or(""),
            submitted: rfc3339(record.submitted_ms),
            first_started: record.first_started_ms.map(rfc3339).unwrap_or_default(),
            ended: rfc3339(record.ended_ms),
            attempts: record.attempts,
            preemptions: record.preemptions,
            preemption_causes: record.preemption_causes.join("; "),
            gpu_seconds: record.gpu_seconds,
        }
    }
}

fn print_csv<T: serde::Serialize>(rows: impl Iterator<Item = T>) -> anyhow::Result<()> {
    let mut writer = csv::Writer::from_writer(std::io::stdout().lock());
    for row in rows {
        writer.serialize(row)?;
    }
    writer.flush()?;
    Ok(())
}

/// Arguments of `quotient share usage`.
#[derive(Debug, clap::Args)]
pub struct ShareUsageArgs {
    /// Only this share.
    #[arg(long, value_parser = parse_share_name)]
    pub share: Option<String>,
    /// From then: how long ago (24h, 30d) or an RFC 3339 time [default: 24h]. Counted by the
    /// hour: the hour it falls in is counted whole.
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub since: Option<u64>,
    /// Until then [default: now].
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub until: Option<u64>,
    /// One row per day (UTC) and share and class, instead of one per share and class.
    #[arg(long, value_name = "PERIOD", value_parser = ["day"])]
    pub by: Option<String>,
}

/// Default `--since` of `share usage`: a day.
const USAGE_SINCE_DEFAULT_MS: u64 = 86_400_000;

pub fn share_usage(global: &GlobalArgs, args: &ShareUsageArgs) -> anyhow::Result<()> {
    let since_ms = args
        .since
        .unwrap_or_else(|| now_ms().saturating_sub(USAGE_SINCE_DEFAULT_MS));
    check_window(Some(since_ms), args.until)?;
    let mut session = Session::open(global.config.as_deref())?;
    let request = ApiRequest::ShareUsage {
        share: args.share.clone(),
        since_ms,
        until_ms: args.until,
        by_day: args.by.is_some(),
    };
    let rows = match session.call(request.clone())? {
        ApiResponse::Usage(rows) => rows,
        other => return Err(unexpected(&request, &other)),
    };
    match global.output {
        OutputFormat::Json => output::print_json(&rows),
        OutputFormat::Csv => print_csv(rows.iter().map(UsageCsv::from)),
        OutputFormat::Table => output::print_text(&usage_table(&rows)),
    }
}

fn hours(seconds: u64) -> String {
    format!("{:.2}", seconds as f64 / 3_600.0)
}

fn usage_table(rows: &[UsageRow]) -> String {
    let by_day = rows.iter().any(|row| row.day_ms.is_some());
    let mut header = vec!["SHARE", "CLASS"];
    if by_day {
        header.insert(0, "DAY");
    }
    header.extend(["OWN GPU-H", "BORROWED GPU-H", "LENT GPU-H"]);
    let mut table = Table::new(&header);
    for row in rows {
        let mut cells = vec![row.share.clone(), row.gpu_class.clone()];
        if let Some(day) = row.day_ms {
            cells.insert(0, rfc3339(day)[..10].to_string());
        }
        cells.extend([
            hours(row.own_gpu_seconds),
            hours(row.borrowed_gpu_seconds),
            hours(row.lent_gpu_seconds),
        ]);
        table.row(cells);
    }
    table.render()
}

/// A usage row as one CSV row.
#[derive(serde::Serialize)]
struct UsageCsv<'a> {
    day: String,
    share: &'a str,
    gpu_class: &'a str,
    own_gpu_seconds: u64,
    borrowed_gpu_seconds: u64,
    lent_gpu_seconds: u64,
}

impl<'a> From<&'a UsageRow> for UsageCsv<'a> {
    fn from(row: &'a UsageRow) -> Self {
        UsageCsv {
            day: row
                .day_ms
                .map(|day| rfc3339(day)[..10].to_string())
                .unwrap_or_default(),
            share: &row.share,
            gpu_class: &row.gpu_class,
            own_gpu_seconds: row.own_gpu_seconds,
            borrowed_gpu_seconds: row.borrowed_gpu_seconds,
            lent_gpu_seconds: row.lent_gpu_seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_a_duration_ago_or_an_rfc3339_time() {
        // The clock read after the parse, which reads it too: a millisecond may pass between.
        let day_ago = parse_time_ms("24h").expect("a duration");
        let now = now_ms();
        assert!(now - day_ago >= 86_400_000 && now - day_ago < 86_400_000 + 60_000);
        assert_eq!(
            parse_time_ms("2026-12-01T00:00:00Z").expect("a time"),
            1_796_083_200_000
        );
        let error = parse_time_ms("yesterday").expect_err("neither");
        assert!(error.contains("RFC 3339"), "{error}");
    }
}
