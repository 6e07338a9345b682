//! A workload trace: one job per line of JSON (`jobs.jsonl`), in the format docs/what-if.md
//! documents, and its reading with every size checked before anything is decoded.

use std::path::Path;

use quotient_common::GpuClass;
use serde::{Deserialize, Serialize};

use crate::EvalError;

/// The largest trace file read.
pub const TRACE_BYTES_MAX: u64 = 512 * 1024 * 1024;
/// The longest line of a trace.
pub const TRACE_LINE_BYTES_MAX: usize = 4 * 1024;
/// The most jobs a trace holds.
pub const TRACE_JOBS_MAX: usize = 2_000_000;
/// The longest a trace job may run, or wait before it is submitted: a year.
pub const TRACE_SECONDS_MAX: f64 = 365.0 * 86_400.0;
/// The most GPUs one job asks for, on all of its nodes together.
pub const TRACE_JOB_GPUS_MAX: u32 = 4_096;

/// One job of a trace: one line of `jobs.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceJob {
    /// When it is submitted, in seconds from the start of the trace.
    pub submit_s: f64,
    /// The share it is submitted to.
    pub share: String,
    /// A name, for the reader; not used by the evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// 0-9999, higher runs first (the job's `--priority`).
    #[serde(default)]
    pub priority: u32,
    /// GPUs on each of its nodes.
    pub gpus: u32,
    /// How many nodes it runs on (1: a job of one node).
    #[serde(default = "one")]
    pub nodes: u32,
    /// Its GPU class; optional when its share has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// How long it runs when nothing interrupts it, in seconds.
    pub run_s: f64,
    /// How often it checkpoints, in seconds of its own run time; absent: never, so a
    /// preemption loses all it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_s: Option<f64>,
}

fn one() -> u32 {
    1
}

/// A trace job as the evaluation replays it: times in milliseconds, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its line in the trace file, from 1 (0 for a job made in memory).
    pub line: usize,
    pub submit_ms: u64,
    pub share: String,
    pub priority: u32,
    pub gpus: u32,
    pub nodes: u32,
    pub class: Option<GpuClass>,
    pub run_ms: u64,
    /// 0: it never checkpoints.
    pub checkpoint_ms: u64,
}

impl Job {
    /// GPUs on all of its nodes.
    pub fn total_gpus(&self) -> u32 {
        self.gpus * self.nodes
    }
}

fn seconds(what: &str, value: f64, positive: bool) -> Result<u64, String> {
    if !value.is_finite() || value < 0.0 || (positive && value <= 0.0) {
        let wanted = if positive {
            "a number of seconds above 0"
        } else {
            "a number of seconds, 0 or more"
        };
        return Err(format!("{what} is {value}; give {wanted}"));
    }
    if value > TRACE_SECONDS_MAX {
        return Err(format!(
            "{what} is {value} s, more than a year ({TRACE_SECONDS_MAX} s); split the trace"
        ));
    }
    Ok((value * 1_000.0)
        .round()
        .max(if positive { 1.0 } else { 0.0 }) as u64)
}

impl TraceJob {
    /// Checks the line's values and converts them (the share is checked against the
    /// design when the evaluation starts).
    pub fn to_job(&self) -> Result<Job, String> {
        let submit_ms = seconds("submit_s", self.submit_s, false)?;
        let run_ms = seconds("run_s", self.run_s, true)?;
        let checkpoint_ms = match self.checkpoint_s {
            Some(every) => seconds("checkpoint_s", every, true)?,
            None => 0,
        };
        quotient_common::job::validate_priority(self.priority).map_err(|e| e.to_string())?;
        if self.gpus == 0 || self.nodes == 0 {
            return Err("gpus and nodes must be 1 or more".into());
        }
        if self.gpus.saturating_mul(self.nodes) > TRACE_JOB_GPUS_MAX {
            return Err(format!(
                "the job asks for {} GPUs on {} nodes, more than {TRACE_JOB_GPUS_MAX} in all",
                self.gpus, self.nodes
            ));
        }
        let class = match &self.class {
            Some(class) => Some(GpuClass::parse(class).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Job {
            line: 0,
            submit_ms,
            share: self.share.clone(),
            priority: self.priority,
            gpus: self.gpus,
            nodes: self.nodes,
            class,
            run_ms,
            checkpoint_ms,
        })
    }
}

/// Reads a trace file: at most [`TRACE_BYTES_MAX`] bytes, lines of at most
/// [`TRACE_LINE_BYTES_MAX`], at most [`TRACE_JOBS_MAX`] jobs. Blank lines and lines starting
/// with `#` are skipped. The jobs come back in submit order (stable for equal times).
pub fn read_trace(path: &Path) -> Result<Vec<Job>, EvalError> {
    let text = crate::read_limited(path, TRACE_BYTES_MAX)?;
    parse_trace(&text).map_err(|(line, message)| EvalError::Trace {
        path: path.display().to_string(),
        line,
        message,
    })
}

/// Parses a trace's text; on error, the line number (from 1) and what is wrong with it.
pub fn parse_trace(text: &str) -> Result<Vec<Job>, (usize, String)> {
    let mut jobs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        if line.len() > TRACE_LINE_BYTES_MAX {
            return Err((
                number,
                format!(
                    "the line is {} bytes, more than {TRACE_LINE_BYTES_MAX}",
                    line.len()
                ),
            ));
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if jobs.len() == TRACE_JOBS_MAX {
            return Err((
                number,
                format!("the trace has more than {TRACE_JOBS_MAX} jobs; split it"),
            ));
        }
        let job: TraceJob = serde_json::from_str(line).map_err(|e| (number, e.to_string()))?;
        let mut job = job.to_job().map_err(|message| (number, message))?;
        job.line = number;
        jobs.push(job);
    }
    jobs.sort_by_key(|job| job.submit_ms);
    Ok(jobs)
}

/// Writes jobs as a trace's lines.
pub fn write_trace(jobs: &[TraceJob]) -> String {
    let mut text = String::new();
    for job in jobs {
        text.push_str(&serde_json::to_string(job).expect("a trace job encodes"));
        text.push('\n');
    }
    text
}

/// A trace made from a job history, and the records left out of it.
#[derive(Debug, Default)]
pub struct FromHistory {
    /// Oldest submit first.
    pub jobs: Vec<TraceJob>,
    /// Records of jobs that never ran.
    pub never_ran: usize,
    /// Records a trace line cannot hold (no GPUs, a submit more than a year after the
    /// earliest, say), and why the first of them could not.
    pub unusable: usize,
    pub first_unusable: Option<String>,
}

/// A trace from the records of `quotient job history --all -o json`: each job that held GPUs,
/// submitted at its submit time (from the earliest's), with its share, priority, GPUs, nodes
/// and class, running for as long as it held its GPUs, all attempts together (its GPU time
/// over its GPUs: work that preemptions lost in the real fleet counts as work to do). The
/// records do not say how often a job checkpointed, so no `checkpoint_s` is given. Records of
/// jobs that never ran, and records whose line `what-if` would refuse, are left out and
/// counted, so that the trace written always reads back.
pub fn trace_from_history(page: &quotient_common::api::HistoryPage) -> FromHistory {
    let start = page
        .records
        .iter()
        .map(|record| record.submitted_ms)
        .min()
        .unwrap_or(0);
    let mut made = FromHistory::default();
    for record in &page.records {
        let gpus = u64::from(record.gpus.max(1)) * u64::from(record.nodes.max(1));
        if record.first_started_ms.is_none() || record.gpu_ms < gpus {
            made.never_ran += 1;
            continue;
        }
        let job = TraceJob {
            submit_s: (record.submitted_ms - start) as f64 / 1_000.0,
            share: record.share.clone(),
            name: Some(record.name.clone().unwrap_or_else(|| record.id.clone())),
            priority: record.priority,
            gpus: record.gpus,
            nodes: record.nodes.max(1),
            class: Some(record.gpu_class.clone()),
            run_s: (record.gpu_ms / gpus) as f64 / 1_000.0,
            checkpoint_s: None,
        };
        if let Err(why) = job.to_job() {
            made.unusable += 1;
            made.first_unusable
                .get_or_insert_with(|| format!("{}: {why}", record.id));
            continue;
        }
        made.jobs.push(job);
    }
    made.jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    made
}

/// Reads a file `quotient job history --all -o json` wrote (at most [`TRACE_BYTES_MAX`]).
pub fn read_history(path: &Path) -> Result<quotient_common::api::HistoryPage, EvalError> {
    let text = crate::read_limited(path, TRACE_BYTES_MAX)?;
    serde_json::from_str(&text).map_err(|e| EvalError::Design {
        path: path.display().to_string(),
        message: format!("not the output of `quotient job history --all -o json`: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_with_its_defaults() {
        let jobs = parse_trace(
            "# a comment\n\n{\"submit_s\": 1.5, \"share\": \"a\", \"gpus\": 2, \"run_s\": 60}\n",
        )
        .unwrap();
        assert_eq!(jobs.len(), 1);
        let job = &jobs[0];
        assert_eq!(job.submit_ms, 1_500);
        assert_eq!((job.gpus, job.nodes, job.priority), (2, 1, 0));
        assert_eq!((job.run_ms, job.checkpoint_ms), (60_000, 0));
    }

    #[test]
    fn a_file_that_starts_with_a_byte_order_mark_reads() {
        let path = std::env::temp_dir().join(format!("trace-bom-{}.jsonl", std::process::id()));
        std::fs::write(
            &path,
            "\u{feff}{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 1, \"run_s\": 5}\n",
        )
        .unwrap();
        let jobs = read_trace(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(jobs.unwrap().len(), 1);
    }

    #[test]
    fn bad_lines_say_which_and_why() {
        let cases = [
            ("{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 1, \"run_s\": 0}", "run_s"),
            ("{\"submit_s\": -1, \"share\": \"a\", \"gpus\": 1, \"run_s\": 5}", "submit_s"),
            ("{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 0, \"run_s\": 5}", "gpus"),
            ("{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 1, \"run_s\": 5, \"x\": 1}", "unknown field"),
            ("{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 1, \"run_s\": 5, \"priority\": 10000}", "priority"),
            ("not json", "expected"),
        ];
        for (line, needle) in cases {
            let text = format!(
                "{{\"submit_s\": 0, \"share\": \"a\", \"gpus\": 1, \"run_s\": 5}}\n{line}\n"
            );
            let (number, message) = parse_trace(&text).unwrap_err();
            assert_eq!(number, 2, "{line}");
            assert!(message.contains(needle), "{line}: {message}");
        }
        let long = format!("{{\"share\": \"{}\"}}", "a".repeat(TRACE_LINE_BYTES_MAX));
        assert!(parse_trace(&long).unwrap_err().1.contains("bytes"));
    }

    #[test]
    fn jobs_come_back_in_submit_order_and_round_trip() {
        let jobs = vec![
            TraceJob {
                submit_s: 10.0,
                share: "b".into(),
                name: None,
                priority: 5,
                gpus: 8,
                nodes: 2,
                class: Some("h100".into()),
                run_s: 3_600.0,
                checkpoint_s: Some(600.0),
            },
            TraceJob {
                submit_s: 2.0,
                share: "a".into(),
                name: Some("first".into()),
                priority: 0,
                gpus: 1,
                nodes: 1,
                class: None,
                run_s: 1.0,
                checkpoint_s: None,
            },
        ];
        let read = parse_trace(&write_trace(&jobs)).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].share, "a");
        assert_eq!(read[1].total_gpus(), 16);
        assert_eq!(read[1].checkpoint_ms, 600_000);
    }

    #[test]
    fn a_history_becomes_a_trace() {
        use quotient_common::api::{HistoryPage, HistoryRecord};
        let record = |id: &str, submitted_ms: u64, ran: bool, gpu_ms: u64| HistoryRecord {
            id: id.into(),
            share: "vision".into(),
            gpu_class: "h100".into(),
            gpus: 4,
            nodes: 2,
            priority: 7,
            state: "SUCCEEDED".into(),
            submitted_ms,
            first_started_ms: ran.then_some(submitted_ms + 5),
            ended_ms: submitted_ms + 10,
            gpu_ms,
            ..HistoryRecord::default()
        };
        let page = HistoryPage {
            records: vec![
                record("j-9", 50_000, true, 8 * 3_600_000),
                record("j-3", 20_000, true, 8 * 60_000),
                record("j-4", 30_000, false, 0),
            ],
            next_page_token: None,
        };
        let made = trace_from_history(&page);
        assert_eq!((made.never_ran, made.unusable), (1, 0));
        let jobs = made.jobs;
        assert_eq!(jobs.len(), 2);
        assert_eq!((jobs[0].submit_s, jobs[0].run_s), (0.0, 60.0));
        assert_eq!((jobs[1].submit_s, jobs[1].run_s), (30.0, 3_600.0));
        assert_eq!((jobs[1].gpus, jobs[1].nodes, jobs[1].priority), (4, 2, 7));
        let read = parse_trace(&write_trace(&jobs)).unwrap();
        assert_eq!(read[1].class.as_ref().unwrap().as_str(), "h100");

        // A record of no GPUs, and one submitted two years after the earliest, would be
        // lines `what-if` refuses: they are left out and counted, the rest reads back.
        let mut no_gpus = record("j-5", 40_000, true, 60_000);
        no_gpus.gpus = 0;
        let late = record("j-6", 2 * 366 * 86_400_000, true, 8 * 60_000);
        let page = HistoryPage {
            records: vec![record("j-3", 20_000, true, 8 * 60_000), no_gpus, late],
            next_page_token: None,
        };
        let made = trace_from_history(&page);
        assert_eq!((made.jobs.len(), made.never_ran, made.unusable), (1, 0, 2));
        let first = made.first_unusable.unwrap();
        assert!(
            first.starts_with("j-5: ") && first.contains("gpus"),
            "{first}"
        );
        assert_eq!(parse_trace(&write_trace(&made.jobs)).unwrap().len(), 1);
    }
}
