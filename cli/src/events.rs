//! `quotient events [--follow] [--job ID] [--share S] [--node N] [--since 10m]`: what happened,
//! oldest first, from the replicated state's recent events (docs/cli.md, *Events*); and the
//! last events of one job, for `job get`.
//!
//! Events come in pages after the last one read; `--follow` keeps asking every
//! [`FOLLOW_INTERVAL_MS`] for those after the newest, until interrupted. A reader that falls
//! behind the state's ring (it keeps the newest 50,000) is told how many it missed.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use quotient_common::api::{ApiRequest, ApiResponse, EventPage, EVENT_PAGE_MAX};
use quotient_common::event::Event;
use quotient_common::JobId;
use serde_json::Value;

use crate::accounting::parse_time_ms;
use crate::client::{unexpected, Session};
use crate::output::{rfc3339, OutputFormat};
use crate::parse::parse_share_name;
use crate::GlobalArgs;

/// How often `--follow` asks for new events (milliseconds).
pub const FOLLOW_INTERVAL_MS: u64 = 500;
/// How many of a job's events `job get` shows.
pub const JOB_EVENTS_SHOWN: usize = 10;

/// Arguments of `quotient events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Keep printing events as they happen, until interrupted.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only the events of this job.
    #[arg(long, value_name = "ID")]
    pub job: Option<JobId>,
    /// Only the events of this share: its jobs, preemptions for it, changes of it.
    #[arg(long, value_parser = parse_share_name)]
    pub share: Option<String>,
    /// Only the events of this node: its state, the jobs placed on it.
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Only the events since then: how long ago (10m) or an RFC 3339 time.
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub since: Option<u64>,
}

/// The query of `args` after event `after`.
fn request(args: &EventsArgs, after: u64) -> ApiRequest {
    ApiRequest::Events {
        after,
        since_ms: args.since,
        job: args.job,
        share: args.share.clone(),
        node: args.node.clone(),
        limit: EVENT_PAGE_MAX,
    }
}

fn page(session: &mut Session, request: ApiRequest) -> anyhow::Result<EventPage> {
    match session.call(request.clone())? {
        ApiResponse::Events(page) => Ok(page),
        other => Err(unexpected(&request, &other)),
    }
}

/// Where the next page starts: after the last event of a full page, else after the newest
/// (every event up to it was looked at).
fn next_after(after: u64, page: &EventPage) -> u64 {
    let last = page.events.last().map_or(after, |event| event.seq);
    if page.events.len() >= EVENT_PAGE_MAX as usize {
        last
    } else {
        last.max(page.newest).max(after)
    }
}

pub fn run(global: &GlobalArgs, args: &EventsArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let json = matches!(global.output, OutputFormat::Json);
    let mut out = std::io::stdout().lock();
    let mut after = 0u64;
    let mut all: Vec<Value> = Vec::new();
    let mut first = true;
    loop {
        let page = page(&mut session, request(args, after))?;
        if !first && page.oldest > after + 1 {
            eprintln!(
                "quotient: {} events happened and left the coordinators' record before they were read",
                page.oldest - after - 1
            );
        }
        first = false;
        let full = page.events.len() >= EVENT_PAGE_MAX as usize;
        for event in &page.events {
            if json && !args.follow {
                all.push(event_json(event));
            } else if json {
                writeln!(out, "{}", event_json(event))?;
            } else {
                writeln!(out, "{}", event_line(event))?;
            }
        }
        out.flush().context("cannot write to stdout")?;
        after = next_after(after, &page);
        if full {
            continue;
        }
        if !args.follow {
            break;
        }
        std::thread::sleep(Duration::from_millis(FOLLOW_INTERVAL_MS));
    }
    if json && !args.follow {
        writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
    }
    Ok(())
}

fn is_not_found(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<crate::failure::RequestFailed>()
        .is_some_and(|failed| failed.code == quotient_common::error_code::ErrorCode::NotFound)
}

/// The newest [`JOB_EVENTS_SHOWN`] events of `job`, oldest first.
pub fn job_events(session: &mut Session, job: JobId) -> anyhow::Result<Vec<Event>> {
    let args = EventsArgs {
        follow: false,
        job: Some(job),
        share: None,
        node: None,
        since: None,
    };
    let mut after = 0;
    let mut kept: Vec<Event> = Vec::new();
    loop {
        let page = match page(session, request(&args, after)) {
            Ok(page) => page,
            // Removed by retention since `job get` read it, with no event this reader sees:
            // the job's view stands, with no events.
            Err(error) if after == 0 && is_not_found(&error) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let full = page.events.len() >= EVENT_PAGE_MAX as usize;
        after = next_after(after, &page);
        kept.extend(page.events);
        let excess = kept.len().saturating_sub(JOB_EVENTS_SHOWN);
        kept.drain(..excess);
        if !full {
            return Ok(kept);
        }
    }
}

/// One event as a line: `TIME  #SEQ  KIND  WHAT`.
pub fn event_line(event: &Event) -> String {
    format!(
        "{}  #{:<6} {:<13} {}",
        rfc3339(event.at_ms),
        event.seq,
        event.what.kind(),
        event.what
    )
}

/// One event as JSON: `{"seq", "at", "at_ms", "kind", "text", ...}` with the fields of its
/// kind (`job`, `share`, `from`, `to`, `node`, `reason`, `cause`, `for_job`, `for_share`,
/// `by`, ...); job ids as `j-N`.
pub fn event_json(event: &Event) -> Value {
    let mut object = serde_json::Map::new();
    object.insert("seq".into(), event.seq.into());
    object.insert("at".into(), rfc3339(event.at_ms).into());
    object.insert("at_ms".into(), event.at_ms.into());
    object.insert("kind".into(), event.what.kind().into());
    object.insert("text".into(), event.what.to_string().into());
    // Serde writes an enum as {"Variant": {fields}}: the fields, with ids as people write them.
    if let Ok(Value::Object(outer)) = serde_json::to_value(&event.what) {
        for (_, inner) in outer {
            if let Value::Object(fields) = inner {
                for (key, value) in fields {
                    let value = match (key.as_str(), value) {
                        ("job" | "for_job", Value::Number(n)) => Value::String(format!("j-{n}")),
                        (_, value) => value,
                    };
                    object.insert(key, value);
                }
            }
        }
    }
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use quotient_common::event::EventKind;
    use quotient_common::JobState;

    use super::*;

    #[test]
    fn an_event_reads_as_a_line_and_as_flat_json() {
        let event = Event {
            seq: 7,
            at_ms: 0,
            what: EventKind::Preempted {
                job: JobId(2),
                share: "qs1".into(),
                node: "node-2".into(),
                cause: "reclaim".into(),
                for_job: Some(JobId(4)),
                for_share: Some("qs2".into()),
            },
        };
        let line = event_line(&event);
        assert!(line.contains("#7"), "{line}");
        assert!(
            line.contains("j-2 of qs1 preempted on node-2 (reclaim) for j-4 of qs2"),
            "{line}"
        );
        let json = event_json(&event);
        assert_eq!(json["kind"], "preempted");
        assert_eq!(json["job"], "j-2");
        assert_eq!(json["for_job"], "j-4");
        assert_eq!(json["cause"], "reclaim");
        assert!(json["at"]
            .as_str()
            .is_some_and(|at| at.starts_with("1970-01-01T00:00:00")));
        let state = Event {
            seq: 8,
            at_ms: 0,
            what: EventKind::JobState {
                job: JobId(2),
                share: "qs1".into(),
                from: JobState::Running,
                to: JobState::Preempting,
                node: Some("node-2".into()),
                reason: None,
                by: None,
            },
        };
        assert_eq!(event_json(&state)["to"], "PREEMPTING");
    }

    #[test]
    fn a_page_moves_the_cursor_past_what_it_looked_at() {
        let page = EventPage {
            events: Vec::new(),
            newest: 40,
            oldest: 1,
        };
        assert_eq!(next_after(3, &page), 40);
    }
}
