//! The replay: a trace's jobs submitted to the real state machine (`quotient_core::apply`) at
//! their virtual times, scheduling rounds of the real scheduler (`quotient_core::plan`), and
//! agents that run each job for its run time, checkpoint it every `checkpoint_s` of its own
//! run time, and stop it some seconds after its checkpoint signal.
//!
//! Virtual time is a queue of events (submits, ends of work, exits after a signal), taken in
//! time order; at each instant, after its events, rounds run until a round changes nothing,
//! as a leader schedules again after every change. Nothing here sleeps or reads a clock, so a
//! trace replays to the same figures every time.
//!
//! A preempted job keeps what it saved at its last checkpoint and loses the rest of the
//! attempt; it resumes from that checkpoint when it is placed again. Work lost is the time its
//! GPUs ran past that checkpoint, signal-to-exit time included.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use quotient_common::{JobEvent, JobId, JobReport, JobSpec, JobState};
use quotient_core::{
    apply, plan_choosing, ApplyCtx, BorrowOrder, Command, Outcome, PlanAction, PreemptionKind,
    State, VictimOrder, DEFAULT_TOPOLOGY_KEY,
};

use crate::design::Design;
use crate::report::{percentile, ReclaimStats, RunReport, ShareReport};
use crate::trace::Job;
use crate::EvalError;

/// The trace's second 0 in virtual time: 2025-01-06 00:00 UTC, a Monday at midnight, so that
/// the trace's days and hours are the week's (ms since the Unix epoch).
pub const EPOCH_MS: u64 = 1_736_121_600_000;

/// The most rounds at one instant before the replay calls it a loop.
const ROUNDS_PER_INSTANT_MAX: usize = 1_000;
/// The shortest time between two checkpoint reports of one job: a job that checkpoints more
/// often is reported at a multiple of its interval (docs/what-if.md). Without it, a trace
/// whose jobs checkpoint every millisecond would take a report per millisecond to replay.
pub const CHECKPOINT_REPORT_MIN_MS: u64 = 60_000;

/// The choices a run is made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Policy {
    /// Quotient as it ships: the design's strategies and the scheduler's own victim order.
    Quotient,
    /// The design's strategies, with victims taken in the naive order: lowest priority first,
    /// then the most recently started, checkpoints unseen ([`VictimOrder::Newest`]).
    /// Quotient's own order takes, among equal priorities, the least work at risk.
    NaiveVictims,
    /// Static partitioning: every share `reserve`, so none lends or borrows.
    Static,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Quotient, Policy::NaiveVictims, Policy::Static];

    /// Its name in reports: `quotient`, `naive-victims`, `static`.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Quotient => "quotient",
            Policy::NaiveVictims => "naive-victims",
            Policy::Static => "static",
        }
    }

    pub fn parse(text: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.as_str() == text)
    }
}

/// How the simulated agents and jobs behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// How long a job takes to exit after its checkpoint signal (at most its grace period).
    pub stop_ms: u64,
    /// Check every invariant of the state after each command (slow; for tests).
    pub check: bool,
    /// Who borrows first when idle GPUs are too few for every share that wants them.
    pub borrow_order: BorrowOrder,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            stop_ms: 20_000,
            check: false,
            borrow_order: BorrowOrder::Fifo,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An attempt's work is done (the trace job's index, the attempt).
    Finish(usize, u32),
    /// A signalled attempt exits.
    Exit(usize, u32),
    /// A running attempt writes a checkpoint, which its agent reports.
    Checkpoint(usize, u32),
    /// The trace job is submitted.
    Submit(usize),
}

/// What the replay knows of one trace job.
#[derive(Debug, Clone, Default)]
struct Track {
    id: Option<JobId>,
    /// Run time saved by its last checkpoint.
    saved_ms: u64,
    /// The attempt holding GPUs now, and when it started.
    running: Option<(u32, u64)>,
    first_start_ms: Option<u64>,
    end_ms: Option<u64>,
    preemptions: u32,
    used_gpu_ms: u128,
    lost_gpu_ms: u128,
}

struct Engine<'t> {
    jobs: &'t [Job],
    options: Options,
    state: State,
    log_index: u64,
    now_ms: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    tracks: Vec<Track>,
    by_id: HashMap<JobId, usize>,
    rounds: u64,
    /// GPUs held by attempts now, and jobs waiting in the queues.
    held_gpus: u64,
    waiting: u64,
    /// The utilisation window, and what was integrated over it.
    window: (u64, u64),
    busy_gpu_ms: u128,
    backlog_ms: u64,
    backlog_busy_gpu_ms: u128,
    /// Jobs preempting others to reclaim lent GPUs: when and at which round it began.
    reclaiming: HashMap<JobId, (u64, u64)>,
    reclaims: Vec<(u64, u64)>,
    preemptions: BTreeMap<String, u64>,
    victims: VictimOrder,
    /// Whether an event of this instant may change what a round decides (a checkpoint alone
    /// does not call for one).
    dirty: bool,
    /// Per share: since when its head waits for capacity to borrow, and whether another
    /// share was given borrowed GPUs since; and the starved spans so far (longest, total ms).
    starving: BTreeMap<String, (Option<u64>, bool)>,
    starved: BTreeMap<String, (u64, u64)>,
    /// Shares given borrowed GPUs at this instant.
    borrowed_now: BTreeSet<String>,
}

/// Replays `jobs` (in submit order, as `read_trace` gives them) on `design` with `policy`.
pub fn evaluate(
    design: &Design,
    jobs: &[Job],
    policy: Policy,
    options: Options,
) -> Result<RunReport, EvalError> {
    let design = match policy {
        Policy::Static => design.partitioned(),
        Policy::Quotient | Policy::NaiveVictims => design.clone(),
    };
    let first = jobs.first().map_or(0, |job| job.submit_ms);
    let last = jobs.last().map_or(0, |job| job.submit_ms);
    let mut engine = Engine {
        jobs,
        options,
        state: State::new(),
        log_index: 0,
        now_ms: EPOCH_MS,
        events: BinaryHeap::new(),
        seq: 0,
        tracks: vec![Track::default(); jobs.len()],
        by_id: HashMap::with_capacity(jobs.len()),
        rounds: 0,
        held_gpus: 0,
        waiting: 0,
        window: (EPOCH_MS + first, EPOCH_MS + last.max(first + 1)),
        busy_gpu_ms: 0,
        backlog_ms: 0,
        backlog_busy_gpu_ms: 0,
        reclaiming: HashMap::new(),
        reclaims: Vec::new(),
        preemptions: BTreeMap::new(),
        victims: match policy {
            Policy::NaiveVictims => VictimOrder::Newest,
            Policy::Quotient | Policy::Static => VictimOrder::LeastWorkAtRisk,
        },
        dirty: false,
        starving: BTreeMap::new(),
        starved: BTreeMap::new(),
        borrowed_now: BTreeSet::new(),
    };
    for spec in &design.shares {
        engine.must(Command::CreateShare(spec.clone()))?;
    }
    for node in &design.nodes {
        engine.must(Command::RegisterNode(node.clone()))?;
    }
    for (i, job) in jobs.iter().enumerate() {
        engine.at(EPOCH_MS + job.submit_ms, Event::Submit(i));
    }
    while let Some(Reverse((time, _, _))) = engine.events.peek().copied() {
        engine.advance(time);
        while let Some(Reverse((t, _, event))) = engine.events.peek().copied() {
            if t != time {
                break;
            }
            engine.events.pop();
            engine.handle(event)?;
        }
        if std::mem::take(&mut engine.dirty) {
            engine.schedule()?;
            engine.watch_starving(&design);
        }
    }
    engine.end_starving();
    Ok(engine.figures(&design, policy))
}

impl Engine<'_> {
    fn at(&mut self, time_ms: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time_ms, self.seq, event)));
    }

    fn apply(&mut self, command: Command) -> Result<Outcome, EvalError> {
        self.log_index += 1;
        let ctx = ApplyCtx {
            log_index: self.log_index,
            time_ms: self.now_ms,
        };
        let outcome = apply(&mut self.state, command, ctx);
        if self.options.check {
            self.state
                .validate()
                .map_err(|e| EvalError::Invariant(e.to_string()))?;
        }
        Ok(outcome)
    }

    /// Applies a command the replay itself makes, which the state machine must take. Named
    /// by its kind only, so that the hot path formats nothing.
    fn must(&mut self, command: Command) -> Result<Outcome, EvalError> {
        let what = match &command {
            Command::CreateShare(_) => "a share",
            Command::RegisterNode(_) => "a node",
            Command::ReportJob(_) => "a job report",
            Command::ApplyPlan(_) => "a plan",
            _ => "a command",
        };
        match self.apply(command)? {
            Outcome::Rejected(rejection) => Err(EvalError::Refused {
                what: what.to_string(),
                why: rejection.to_string(),
            }),
            outcome => Ok(outcome),
        }
    }

    /// Moves virtual time to `time_ms`, counting the GPUs held since the last event.
    fn advance(&mut self, time_ms: u64) {
        let (from, to) = (self.now_ms.max(self.window.0), time_ms.min(self.window.1));
        if to > from {
            let span = u128::from(to - from);
            let busy = u128::from(self.held_gpus) * span;
            self.busy_gpu_ms += busy;
            if self.waiting > 0 {
                self.backlog_ms += to - from;
                self.backlog_busy_gpu_ms += busy;
            }
        }
        self.now_ms = self.now_ms.max(time_ms);
    }

    fn handle(&mut self, event: Event) -> Result<(), EvalError> {
        if !matches!(event, Event::Checkpoint(..)) {
            self.dirty = true;
        }
        match event {
            Event::Submit(i) => self.submit(i),
            Event::Finish(i, attempt) => self.finish(i, attempt),
            Event::Exit(i, attempt) => self.exit(i, attempt),
            Event::Checkpoint(i, attempt) => self.checkpoint(i, attempt),
        }
    }

    fn submit(&mut self, i: usize) -> Result<(), EvalError> {
        let job = &self.jobs[i];
        let mut spec = JobSpec::new(&job.share, job.priority, job.gpus, vec!["train".into()]);
        spec.nodes = job.nodes;
        spec.gpu_class = job.class.clone();
        let line = job.line;
        match self.apply(Command::SubmitJob(spec))? {
            Outcome::JobSubmitted { job: id, .. } => {
                self.tracks[i].id = Some(id);
                self.by_id.insert(id, i);
                self.waiting += 1;
                Ok(())
            }
            Outcome::Rejected(rejection) => Err(EvalError::Job {
                line,
                message: rejection.to_string(),
            }),
            other => Err(EvalError::Refused {
                what: format!("the submit of line {line}"),
                why: format!("unexpected outcome {other:?}"),
            }),
        }
    }

    fn record(&self, i: usize) -> &quotient_core::JobRecord {
        let id = self.tracks[i].id.expect("a job with events was submitted");
        self.state.job(id).expect("the replay removes no job")
    }

    /// Every member of job `i`'s current attempt reports `event`, rank by rank.
    fn report(&mut self, i: usize, event: JobEvent) -> Result<(), EvalError> {
        let record = self.record(i);
        let (id, attempt) = (record.id, record.attempts);
        let nodes: Vec<String> = record
            .placement
            .iter()
            .map(|member| {
                self.state
                    .node(member.node)
                    .map(|node| node.name.clone())
                    .unwrap_or_default()
            })
            .collect();
        for node in nodes {
            self.must(Command::ReportJob(JobReport {
                job: id,
                attempt,
                node,
                event: event.clone(),
            }))?;
        }
        Ok(())
    }

    /// The attempt ends: its GPUs are counted as used until now, and free.
    fn release(&mut self, i: usize) -> u64 {
        let gpus = u64::from(self.jobs[i].total_gpus());
        let track = &mut self.tracks[i];
        let (_, started) = track.running.take().expect("the attempt runs");
        let ran = self.now_ms - started;
        track.used_gpu_ms += u128::from(ran) * u128::from(gpus);
        self.held_gpus -= gpus;
        ran
    }

    fn is_current(&self, i: usize, attempt: u32) -> bool {
        self.tracks[i].running.is_some_and(|(a, _)| a == attempt)
    }

    /// A running attempt checkpoints: its agent reports it, and the next one is due
    /// `checkpoint_ms` later, if the work is not done by then.
    fn checkpoint(&mut self, i: usize, attempt: u32) -> Result<(), EvalError> {
        if !self.is_current(i, attempt) || self.record(i).state != JobState::Running {
            return Ok(());
        }
        self.report(i, JobEvent::Checkpointed)?;
        self.next_checkpoint(i, attempt);
        Ok(())
    }

    /// Schedules attempt `attempt`'s next checkpoint report, if one falls before its work is
    /// done: at the job's next checkpoint, or for a job that checkpoints more often than
    /// [`CHECKPOINT_REPORT_MIN_MS`], at the first of its checkpoints that far on (an agent
    /// sees the marker, not every write of it; the work kept at a stop is counted from every
    /// checkpoint all the same, in [`Engine::exit`]).
    fn next_checkpoint(&mut self, i: usize, attempt: u32) {
        let job = &self.jobs[i];
        let Some((_, started)) = self.tracks[i].running else {
            return;
        };
        let every = match job.checkpoint_ms {
            0 => 0,
            each => each * CHECKPOINT_REPORT_MIN_MS.div_ceil(each),
        };
        let done = started + job.run_ms.saturating_sub(self.tracks[i].saved_ms).max(1);
        let next = self.now_ms + every;
        if every > 0 && next < done {
            self.at(next, Event::Checkpoint(i, attempt));
        }
    }

    fn finish(&mut self, i: usize, attempt: u32) -> Result<(), EvalError> {
        if !self.is_current(i, attempt) {
            return Ok(());
        }
        if self.record(i).state == JobState::Preempting {
            // Its work ended within its grace period: it exits, having done all of it, and
            // the stop goes on as a preemption (the state machine requeues it; it ends at
            // once when placed again).
            self.report(i, JobEvent::ExitedAfterSignal { code: Some(0) })?;
            self.release(i);
            self.tracks[i].saved_ms = self.jobs[i].run_ms;
            self.tracks[i].preemptions += 1;
            return self.requeued(i);
        }
        self.report(i, JobEvent::Exited { code: 0 })?;
        self.release(i);
        self.tracks[i].saved_ms = self.jobs[i].run_ms;
        self.tracks[i].end_ms = Some(self.now_ms);
        Ok(())
    }

    fn exit(&mut self, i: usize, attempt: u32) -> Result<(), EvalError> {
        if !self.is_current(i, attempt) || self.record(i).state != JobState::Preempting {
            return Ok(());
        }
        self.report(i, JobEvent::ExitedAfterSignal { code: Some(0) })?;
        let ran = self.release(i);
        let job = &self.jobs[i];
        let kept = match job.checkpoint_ms {
            0 => 0,
            every => ran / every * every,
        };
        let track = &mut self.tracks[i];
        track.saved_ms = (track.saved_ms + kept).min(job.run_ms);
        track.lost_gpu_ms += u128::from(ran - kept) * u128::from(job.total_gpus());
        track.preemptions += 1;
        self.requeued(i)
    }

    /// After a stop: back in the queue, or ended (the state machine decides).
    fn requeued(&mut self, i: usize) -> Result<(), EvalError> {
        match self.record(i).state {
            JobState::Runnable => self.waiting += 1,
            state if state.is_terminal() => self.tracks[i].end_ms = Some(self.now_ms),
            _ => {}
        }
        Ok(())
    }

    /// Rounds until one changes nothing.
    fn schedule(&mut self) -> Result<(), EvalError> {
        for _ in 0..ROUNDS_PER_INSTANT_MAX {
            let plan = plan_choosing(
                &self.state,
                &BTreeSet::new(),
                DEFAULT_TOPOLOGY_KEY,
                self.options.borrow_order,
                self.victims,
            );
            if plan.is_empty() {
                return Ok(());
            }
            let actions = plan.actions.clone();
            match self.must(Command::ApplyPlan(plan))? {
                Outcome::PlanApplied(report) if report.rejected.is_empty() => {}
                other => {
                    return Err(EvalError::Refused {
                        what: "a fresh plan".into(),
                        why: format!("it did not apply whole: {other:?}"),
                    })
                }
            }
            self.rounds += 1;
            for action in &actions {
                match action {
                    PlanAction::Place { job, .. } | PlanAction::PlaceMembers { job, .. } => {
                        if let Some(record) = self.state.job(*job) {
                            if self.state.is_borrowed(record) {
                                self.borrowed_now.insert(record.spec.share.clone());
                            }
                        }
                        self.start(*job)?
                    }
                    PlanAction::Preempt { job, kind, for_job } => {
                        self.signalled(*job, *kind, *for_job)
                    }
                    _ => {}
                }
            }
            if actions.is_empty() {
                return Ok(());
            }
        }
        Err(EvalError::Refused {
            what: "scheduling".into(),
            why: format!(
                "{ROUNDS_PER_INSTANT_MAX} rounds at one instant still changed the state: a loop"
            ),
        })
    }

    /// A placed job's agents start it at once.
    fn start(&mut self, id: JobId) -> Result<(), EvalError> {
        let i = self.by_id[&id];
        self.report(i, JobEvent::Started)?;
        self.report(i, JobEvent::Running)?;
        let attempt = self.record(i).attempts;
        let now = self.now_ms;
        let job = &self.jobs[i];
        let track = &mut self.tracks[i];
        track.running = Some((attempt, now));
        track.first_start_ms.get_or_insert(now);
        let remaining = job.run_ms.saturating_sub(track.saved_ms).max(1);
        self.held_gpus += u64::from(job.total_gpus());
        self.waiting -= 1;
        self.at(now + remaining, Event::Finish(i, attempt));
        self.next_checkpoint(i, attempt);
        if let Some((since, round)) = self.reclaiming.remove(&id) {
            self.reclaims.push((now - since, self.rounds - round));
        }
        Ok(())
    }

    /// A job got its checkpoint signal: it exits `stop_ms` later (at most its grace period).
    fn signalled(&mut self, id: JobId, kind: PreemptionKind, for_job: Option<JobId>) {
        let i = self.by_id[&id];
        let record = self.record(i);
        let stop = self.options.stop_ms.min(record.spec.grace_period_ms);
        let attempt = record.attempts;
        *self
            .preemptions
            .entry(kind.as_str().to_string())
            .or_insert(0) += 1;
        if kind == PreemptionKind::Reclaim {
            if let Some(for_job) = for_job {
                self.reclaiming
                    .entry(for_job)
                    .or_insert((self.now_ms, self.rounds));
            }
        }
        self.at(self.now_ms + stop, Event::Exit(i, attempt));
    }

    /// After an instant's rounds: which shares' heads wait for capacity to borrow, and whether
    /// others were given borrowed GPUs meanwhile (`ShareReport::borrow_starved_s_max`).
    fn watch_starving(&mut self, design: &Design) {
        let borrowed_now = std::mem::take(&mut self.borrowed_now);
        for share in &design.shares {
            let waits = share.limits.keys().any(|class| {
                self.state
                    .queue_head(&share.name, class)
                    .and_then(|id| self.state.job(id))
                    .and_then(|job| self.state.reason(job))
                    .is_some_and(|reason| {
                        matches!(
                            reason,
                            quotient_core::WaitReason::NoBorrowableCapacity { .. }
                        )
                    })
            });
            let others = borrowed_now.iter().any(|name| *name != share.name);
            let entry = self.starving.entry(share.name.clone()).or_default();
            match (waits, entry.0) {
                (true, None) => *entry = (Some(self.now_ms), others),
                (true, Some(_)) => entry.1 |= others,
                (false, Some(since)) => {
                    let starved = entry.1;
                    *entry = (None, false);
                    if starved {
                        self.note_starved(&share.name, self.now_ms - since);
                    }
                }
                (false, None) => {}
            }
        }
    }

    /// Closes the spans still open when the replay ends.
    fn end_starving(&mut self) {
        let open: Vec<(String, u64)> = self
            .starving
            .iter()
            .filter_map(|(name, (since, others))| {
                since.filter(|_| *others).map(|since| (name.clone(), since))
            })
            .collect();
        for (name, since) in open {
            self.note_starved(&name, self.now_ms - since);
        }
    }

    fn note_starved(&mut self, share: &str, ms: u64) {
        let entry = self.starved.entry(share.to_string()).or_default();
        entry.0 = entry.0.max(ms);
        entry.1 += ms;
    }

    fn figures(&self, design: &Design, policy: Policy) -> RunReport {
        let hours = |ms: u128| ms as f64 / 3_600_000.0;
        let gpus = design.gpus();
        let window_ms = self.window.1 - self.window.0;
        let mut shares: BTreeMap<String, ShareReport> = design
            .shares
            .iter()
            .map(|s| (s.name.clone(), ShareReport::default()))
            .collect();
        let mut delays: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        let mut never_started = 0;
        let mut completed = 0;
        let mut loops = 0;
        for (job, track) in self.jobs.iter().zip(&self.tracks) {
            let share = shares.entry(job.share.clone()).or_default();
            share.jobs += 1;
            share.preemptions += u64::from(track.preemptions);
            share.lost_gpu_hours += hours(track.lost_gpu_ms);
            if track.end_ms.is_some() {
                share.completed += 1;
                completed += 1;
            }
            if track.preemptions > 3 {
                loops += 1;
            }
            let submitted = EPOCH_MS + job.submit_ms;
            let delay = match track.first_start_ms {
                Some(start) => start - submitted,
                None => {
                    never_started += 1;
                    self.now_ms.saturating_sub(submitted)
                }
            };
            delays.entry(&job.share).or_default().push(delay);
        }
        for (name, (longest, total)) in &self.starved {
            if let Some(share) = shares.get_mut(name.as_str()) {
                share.borrow_starved_s_max = *longest as f64 / 1_000.0;
                share.borrow_starved_hours = hours(u128::from(*total));
            }
        }
        for (name, mut waits) in delays {
            waits.sort_unstable();
            let share = shares.get_mut(name).expect("made above");
            share.queue_delay_s_p50 = percentile(&waits, 50.0) as f64 / 1_000.0;
            share.queue_delay_s_p95 = percentile(&waits, 95.0) as f64 / 1_000.0;
            share.queue_delay_s_max = waits.last().copied().unwrap_or(0) as f64 / 1_000.0;
        }
        for ((_, share, _), cell) in self.state.usage_between(EPOCH_MS, self.now_ms + 1) {
            if let Some(report) = shares.get_mut(share.as_str()) {
                report.own_gpu_hours += hours(u128::from(cell.own_ms));
                report.borrowed_gpu_hours += hours(u128::from(cell.borrowed_ms));
                report.lent_gpu_hours += hours(u128::from(cell.lent_ms));
            }
        }
        let mut latency: Vec<u64> = self.reclaims.iter().map(|(ms, _)| *ms).collect();
        let mut rounds: Vec<u64> = self.reclaims.iter().map(|(_, r)| *r).collect();
        latency.sort_unstable();
        rounds.sort_unstable();
        let available = u128::from(gpus) * u128::from(window_ms);
        let used: u128 = self.tracks.iter().map(|t| t.used_gpu_ms).sum();
        let lost: u128 = self.tracks.iter().map(|t| t.lost_gpu_ms).sum();
        let lost_uncheckpointed: u128 = self
            .jobs
            .iter()
            .zip(&self.tracks)
            .filter(|(job, _)| job.checkpoint_ms == 0)
            .map(|(_, track)| track.lost_gpu_ms)
            .sum();
        let utilisation = ratio(self.busy_gpu_ms, available);
        RunReport {
            policy: policy.as_str().to_string(),
            design: String::new(),
            borrow_order: self.options.borrow_order.as_str().to_string(),
            gpus,
            jobs: self.jobs.len() as u64,
            completed,
            never_started,
            window_hours: hours(u128::from(window_ms)),
            makespan_hours: hours(u128::from(
                self.now_ms - EPOCH_MS - self.jobs.first().map_or(0, |j| j.submit_ms),
            )),
            utilisation,
            backlog_hours: hours(u128::from(self.backlog_ms)),
            utilisation_under_backlog: ratio(
                self.backlog_busy_gpu_ms,
                u128::from(gpus) * u128::from(self.backlog_ms),
            ),
            used_gpu_hours: hours(used),
            lost_gpu_hours: hours(lost),
            lost_gpu_hours_uncheckpointed: hours(lost_uncheckpointed),
            useful_utilisation: utilisation * (1.0 - ratio(lost, used.max(1))),
            preemptions: self.preemptions.values().sum(),
            preemptions_by_kind: self.preemptions.clone(),
            jobs_preempted_over_3: loops,
            reclaims: ReclaimStats {
                count: latency.len() as u64,
                latency_s_p50: percentile(&latency, 50.0) as f64 / 1_000.0,
                latency_s_p95: percentile(&latency, 95.0) as f64 / 1_000.0,
                latency_s_max: latency.last().copied().unwrap_or(0) as f64 / 1_000.0,
                rounds_p50: percentile(&rounds, 50.0),
                rounds_p95: percentile(&rounds, 95.0),
                rounds_max: rounds.last().copied().unwrap_or(0),
            },
            rounds: self.rounds,
            shares,
        }
    }
}

fn ratio(part: u128, whole: u128) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}
