//! `apply`: the state machine's transition function.
//!
//! It is synchronous, reads no clock (the leader stamps `ApplyCtx::time_ms`), and returns a
//! rejection as data, leaving the state untouched, whenever a command does not hold. Every job
//! change goes through [`State::update_job`], which keeps the derived index in step and notes
//! the change for [`apply_noting`] ([`Changes`]).

use quotient_common::job::{bounded_launch_message, LaunchFault};
use quotient_common::{
    GpuClass, JobId, JobSpec, JobState, NodeInventory, NodeState, ShareSpec, ShareState,
    ShareUpdate,
};

use crate::changes::Changes;
use crate::command::{ApplyCtx, Command, JobEvent, JobReport, Outcome, PlanReport, Rejection};
use crate::limits::{ACTIVE_JOBS_MAX, JOBS_MAX, LAUNCH_REQUEUES_MAX, NODES_MAX, SHARES_MAX};
use crate::plan::{Plan, PlanAction};
use crate::reason::WaitReason;
use crate::rules::{
    admit, available_for_job, limit_of, resources_for, runs_on, BorrowedFromLowest,
};
use crate::state::{
    Allocation, AttemptRecord, JobRecord, NodeId, NodeRecord, Preemption, PreemptionKind,
    ShareRecord, State, StopCause, ATTEMPT_HISTORY_MAX,
};

/// Applies one command. See the module docs.
pub fn apply(state: &mut State, command: Command, ctx: ApplyCtx) -> Outcome {
    apply_command(state, command, ctx)
}

/// Applies one command, as [`apply`], and adds to `changes` what it changed: the jobs, nodes
/// and shares that views of each must look at again (see [`Changes`]). A caller applying a
/// batch passes the same `changes` for every command and reads the union once.
pub fn apply_noting(
    state: &mut State,
    command: Command,
    ctx: ApplyCtx,
    changes: &mut Changes,
) -> Outcome {
    // The state holds the caller's set while it applies, so that every change is noted where
    // it is made without passing the set through every function.
    state.changes = Some(std::mem::take(changes));
    let outcome = apply_command(state, command, ctx);
    *changes = state.changes.take().expect("put there above");
    outcome
}

fn apply_command(state: &mut State, command: Command, ctx: ApplyCtx) -> Outcome {
    if let Command::CheckDigest { .. } = command {
        // Read by the coordinator around apply. It leaves the state exactly as it was, its
        // last applied index included, so that a check never makes two equal states differ.
        return Outcome::Done;
    }
    let outcome = match command {
        Command::CreateShare(spec) => state.create_share(spec, ctx),
        Command::UpdateShare { name, update } => state.update_share(&name, &update),
        Command::DisableShare { name } => state.update_share(
            &name,
            &ShareUpdate {
                state: Some(ShareState::Disabled),
                ..ShareUpdate::default()
            },
        ),
        Command::DeleteShare { name } => state.delete_share(&name, ctx),
        Command::SubmitJob(spec) => state.submit(spec, ctx),
        Command::UpdateJobPriority { job, priority } => state.update_priority(job, priority),
        Command::CancelJob { job } => state.cancel(job, ctx),
        Command::RegisterNode(inventory) => state.register_node(inventory, ctx),
        Command::SetNodeState { node, state: to } => state.set_node_state(&node, to, ctx),
        Command::CordonNode { node } => state.set_node_state(&node, NodeState::Cordoned, ctx),
        Command::DrainNode { node } => state.set_node_state(&node, NodeState::Draining, ctx),
        Command::SetGpuHealth {
            node,
            index,
            healthy,
        } => state.set_gpu_health(&node, index, healthy),
        Command::MarkNodeLost { node } => state.set_node_state(&node, NodeState::Lost, ctx),
        Command::ApplyPlan(plan) => Outcome::PlanApplied(state.apply_plan(plan, ctx)),
        Command::ReportJob(report) => state.report(report, ctx),
        Command::CheckDigest { .. } => unreachable!("answered above"),
        Command::RemoveNode { node } => state.remove_node(&node),
        Command::StopAtTimeLimit { job, attempt } => state.stop_at_time_limit(job, attempt),
    };
    state.data.last_applied_index = ctx.log_index;
    outcome
}

fn rejected(rejection: Rejection) -> Outcome {
    Outcome::Rejected(rejection)
}

impl State {
    /// Changes one job, keeping the index in step: the only way jobs are changed.
    pub(crate) fn update_job(&mut self, id: JobId, change: impl FnOnce(&mut JobRecord)) {
        let old = self.job(id).expect("update_job on a known job").clone();
        self.index.remove_job(&old, &self.data);
        let job = self.job_mut(id).expect("known job");
        change(job);
        let new = job.clone();
        self.index.add_job(&new, &self.data);
        if let Some(changes) = self.changes.as_mut() {
            if old != new {
                changes.job_changed(&old, &new);
            }
        }
    }

    fn create_share(&mut self, spec: ShareSpec, ctx: ApplyCtx) -> Outcome {
        if let Err(e) = spec.validate() {
            return rejected(Rejection::Invalid(e));
        }
        if self.data.shares.contains_key(&spec.name) {
            return rejected(Rejection::DuplicateShare(spec.name));
        }
        if self.data.shares.len() >= SHARES_MAX {
            return rejected(Rejection::TooMany {
                what: "shares".into(),
                max: SHARES_MAX as u64,
            });
        }
        let spec_name = spec.name.clone();
        self.data.shares.insert(
            spec.name.clone(),
            ShareRecord {
                spec,
                created_ms: ctx.time_ms,
            },
        );
        self.index.recompute_reserved(&self.data);
        self.note_share(&spec_name);
        Outcome::Done
    }

    fn update_share(&mut self, name: &str, update: &ShareUpdate) -> Outcome {
        let Some(record) = self.data.shares.get(name) else {
            return rejected(Rejection::UnknownShare(name.to_string()));
        };
        let next = record.spec.updated(update);
        if let Err(e) = next.validate() {
            return rejected(Rejection::Invalid(e));
        }
        if next == record.spec {
            return Outcome::Done;
        }
        self.data.shares.get_mut(name).expect("checked").spec = next;
        self.index.recompute_reserved(&self.data);
        self.note_share(name);
        Outcome::Done
    }

    fn delete_share(&mut self, name: &str, ctx: ApplyCtx) -> Outcome {
        let Some(record) = self.data.shares.get(name) else {
            return rejected(Rejection::UnknownShare(name.to_string()));
        };
        if record.spec.state == ShareState::Enabled {
            return rejected(Rejection::ShareEnabled(name.to_string()));
        }
        let jobs: Vec<JobId> = self
            .index
            .shares
            .get(name)
            .into_iter()
            .flat_map(|classes| classes.values())
            .flat_map(|i| {
                i.runnable
                    .iter()
                    .map(|(_, id)| *id)
                    .chain(i.holding.iter().map(|(_, _, id)| *id))
            })
            .collect();
        for job in jobs {
            self.cancel(job, ctx);
        }
        self.data.shares.remove(name);
        self.index.recompute_reserved(&self.data);
        self.note_share(name);
        Outcome::Done
    }

    fn submit(&mut self, mut spec: JobSpec, ctx: ApplyCtx) -> Outcome {
        if let Some(key) = &spec.idempotency_key {
            if let Some(job) = self.data.idempotency.get(key) {
                return Outcome::JobSubmitted {
                    job: *job,
                    duplicate: true,
                };
            }
        }
        if let Err(e) = spec.validate() {
            return rejected(Rejection::Invalid(e));
        }
        let Some(share) = self.data.shares.get(&spec.share) else {
            return rejected(Rejection::UnknownShare(spec.share));
        };
        if share.spec.state == ShareState::Disabled {
            return rejected(Rejection::ShareDisabled(spec.share));
        }
        let classes = || {
            share
                .spec
                .limits
                .keys()
                .map(GpuClass::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let class = match &spec.gpu_class {
            Some(class) if share.spec.limits.contains_key(class) => class.clone(),
            Some(class) => {
                return rejected(Rejection::UnknownClass {
                    share: spec.share.clone(),
                    class: class.to_string(),
                    classes: classes(),
                })
            }
            None if share.spec.limits.len() == 1 => {
                share.spec.limits.keys().next().expect("one").clone()
            }
            None => {
                return rejected(Rejection::ClassRequired {
                    share: spec.share.clone(),
                    classes: classes(),
                })
            }
        };
        if self.data.jobs.len() >= JOBS_MAX {
            return rejected(Rejection::TooMany {
                what: "jobs".into(),
                max: JOBS_MAX as u64,
            });
        }
        if self.index.active_jobs >= ACTIVE_JOBS_MAX as u64 {
            return rejected(Rejection::TooMany {
                what: "jobs that have not ended".into(),
                max: ACTIVE_JOBS_MAX as u64,
            });
        }
        spec.gpu_class = Some(class);
        let id = JobId(self.data.jobs.len() as u64 + 1);
        if let Some(key) = &spec.idempotency_key {
            self.data.idempotency.insert(key.clone(), id);
        }
        let job = JobRecord::new(id, spec, ctx.time_ms);
        if let Some(changes) = self.changes.as_mut() {
            changes.job_added(&job);
        }
        self.data.jobs.push(job.clone());
        self.index.add_job(&job, &self.data);
        Outcome::JobSubmitted {
            job: id,
            duplicate: false,
        }
    }

    fn live_job(&self, id: JobId) -> Result<&JobRecord, Rejection> {
        let job = self.job(id).ok_or(Rejection::UnknownJob(id))?;
        if job.state.is_terminal() {
            return Err(Rejection::JobTerminal {
                job: id,
                state: job.state,
            });
        }
        Ok(job)
    }

    fn update_priority(&mut self, id: JobId, priority: u32) -> Outcome {
        if let Err(e) = quotient_common::job::validate_priority(priority) {
            return rejected(Rejection::Invalid(e));
        }
        if let Err(r) = self.live_job(id) {
            return rejected(r);
        }
        self.update_job(id, |job| job.spec.priority = priority);
        Outcome::Done
    }

    fn cancel(&mut self, id: JobId, ctx: ApplyCtx) -> Outcome {
        let job = match self.live_job(id) {
            Ok(job) => job,
            Err(r) => return rejected(r),
        };
        if job.state == JobState::Runnable {
            self.update_job(id, |job| {
                job.state = JobState::Cancelled;
                job.nomination = None;
                job.reason = Some(WaitReason::Ended("cancelled while queued".into()));
                job.ended_ms = Some(job.stamp(ctx.time_ms));
            });
        } else {
            // It holds GPUs: the agent stops it like a preemption, and the GPUs stay held
            // until it has exited, so they are never given to two jobs.
            self.update_job(id, |job| {
                job.state = JobState::Preempting;
                job.stop = Some(StopCause::Cancelled);
            });
        }
        Outcome::Done
    }

    fn register_node(&mut self, inventory: NodeInventory, ctx: ApplyCtx) -> Outcome {
        if let Err(e) = inventory.validate() {
            return rejected(Rejection::Invalid(e));
        }
        let id = match self.data.node_ids.get(&inventory.name) {
            Some(id) => *id,
            None => {
                if self.data.node_ids.len() >= NODES_MAX {
                    return rejected(Rejection::TooMany {
                        what: "nodes".into(),
                        max: NODES_MAX as u64,
                    });
                }
                // The first slot a removed node left, else a new one at the end.
                let vacant = self.data.nodes.iter().position(NodeRecord::is_vacant);
                let (id, incarnation) = match vacant {
                    Some(slot) => (NodeId(slot as u32), self.data.nodes[slot].incarnation),
                    None => {
                        let id = NodeId(self.data.nodes.len() as u32);
                        self.data.nodes.push(NodeRecord::vacant(id, 0));
                        (id, 0)
                    }
                };
                self.data.node_ids.insert(inventory.name.clone(), id);
                self.data.nodes[id.0 as usize] = NodeRecord {
                    id,
                    name: inventory.name.clone(),
                    state: NodeState::Ready,
                    gpus: Vec::new(),
                    incarnation,
                    host: inventory.host.clone(),
                };
                id
            }
        };
        // Jobs on GPUs the node no longer reports cannot be running there.
        let present: u64 = inventory
            .gpus
            .iter()
            .fold(0, |mask, g| mask | (1u64 << g.index));
        for job in self.jobs_on_node(id) {
            let alloc = self.job(job).and_then(|j| j.allocation).expect("on node");
            let class_ok = self.job(job).is_some_and(|j| {
                inventory
                    .gpus
                    .iter()
                    .filter(|g| alloc.gpu_mask & (1u64 << g.index) != 0)
                    .all(|g| &g.class == j.class())
            });
            if alloc.gpu_mask & !present != 0 || !class_ok {
                self.stop_without_signal(job, PreemptionKind::AgentStopped, ctx);
            }
        }
        let node = &mut self.data.nodes[id.0 as usize];
        node.gpus = inventory.gpus;
        node.gpus.sort_by_key(|g| g.index);
        node.host = inventory.host;
        if node.state == NodeState::Lost {
            node.state = NodeState::Ready;
        }
        node.incarnation += 1;
        let incarnation = node.incarnation;
        let record = node.clone();
        self.index.refresh_node(&record);
        self.note_node(id);
        Outcome::NodeRegistered {
            node: id,
            incarnation,
        }
    }

    fn set_node_state(&mut self, name: &str, to: NodeState, ctx: ApplyCtx) -> Outcome {
        let Some(&id) = self.data.node_ids.get(name) else {
            return rejected(Rejection::UnknownNode(name.to_string()));
        };
        let from = self.data.nodes[id.0 as usize].state;
        if from == NodeState::Lost && to != NodeState::Lost {
            return rejected(Rejection::NodeLost(name.to_string()));
        }
        if from != to || to == NodeState::Lost {
            self.note_node(id);
        }
        if to == NodeState::Lost {
            for job in self.jobs_on_node(id) {
                self.stop_without_signal(job, PreemptionKind::NodeLost, ctx);
            }
            self.data.nodes[id.0 as usize].incarnation += 1;
        }
        self.data.nodes[id.0 as usize].state = to;
        if !to.schedulable() {
            self.clear_nominations_on(id);
        }
        let record = self.data.nodes[id.0 as usize].clone();
        self.index.refresh_node(&record);
        Outcome::Done
    }

    /// Whether node `name` may be removed now (see `Command::RemoveNode`): its id, or why
    /// not. The leader's API asks it too, before anything of its own, so that a refusal
    /// says first what the replicated state says.
    pub fn check_remove_node(&self, name: &str) -> Result<NodeId, Rejection> {
        let Some(&id) = self.data.node_ids.get(name) else {
            return Err(Rejection::UnknownNode(name.to_string()));
        };
        if self.data.nodes[id.0 as usize].state == NodeState::Ready {
            return Err(Rejection::NodeReady(name.to_string()));
        }
        let jobs = self.jobs_on_node(id);
        if let Some(first) = jobs.iter().min() {
            return Err(Rejection::NodeHasJobs {
                node: name.to_string(),
                jobs: jobs.len() as u64,
                first: *first,
            });
        }
        Ok(id)
    }

    /// Drops every nomination of `node`: it keeps GPUs free for no one.
    fn clear_nominations_on(&mut self, node: NodeId) {
        let nominated: Vec<JobId> = self
            .index
            .nominated
            .keys()
            .copied()
            .filter(|j| self.job(*j).and_then(|j| j.nomination) == Some(node))
            .collect();
        for job in nominated {
            self.update_job(job, |j| j.nomination = None);
        }
    }

    /// Forgets a node that is out of service and holds no job. Refused while it is ready
    /// (the operator says it is out of service by cordoning or draining it; a lost node
    /// already is) and while any job holds GPUs on it, PREEMPTING ones included: those GPUs
    /// are freed only when its agent reports the exit. Its slot becomes vacant, for the next
    /// new node to take; vacant slots at the end are dropped.
    fn remove_node(&mut self, name: &str) -> Outcome {
        let id = match self.check_remove_node(name) {
            Ok(id) => id,
            Err(rejection) => return rejected(rejection),
        };
        // A node that is not ready keeps no nominations (they are dropped when it leaves
        // the ready state); dropped again in case, as a vacant slot must have none.
        self.clear_nominations_on(id);
        self.data.node_ids.remove(name);
        let incarnation = self.data.nodes[id.0 as usize].incarnation + 1;
        let vacant = NodeRecord::vacant(id, incarnation);
        self.index.refresh_node(&vacant);
        self.data.nodes[id.0 as usize] = vacant;
        while self.data.nodes.last().is_some_and(NodeRecord::is_vacant) {
            self.data.nodes.pop();
        }
        self.note_node(id);
        Outcome::Done
    }

    fn set_gpu_health(&mut self, name: &str, index: u32, healthy: bool) -> Outcome {
        let Some(&id) = self.data.node_ids.get(name) else {
            return rejected(Rejection::UnknownNode(name.to_string()));
        };
        let node = &mut self.data.nodes[id.0 as usize];
        let Some(gpu) = node.gpus.iter_mut().find(|g| g.index == index) else {
            return rejected(Rejection::UnknownGpu {
                node: name.to_string(),
                index,
            });
        };
        if gpu.healthy == healthy {
            return Outcome::Done;
        }
        gpu.healthy = healthy;
        let record = node.clone();
        self.index.refresh_node(&record);
        self.note_node(id);
        Outcome::Done
    }

    /// Ends a job's hold on its GPUs without waiting for an agent (its node is gone).
    fn stop_without_signal(&mut self, id: JobId, kind: PreemptionKind, ctx: ApplyCtx) {
        let job = self.job(id).expect("known job");
        let node = job
            .allocation
            .and_then(|a| self.node(a.node))
            .map(|n| n.name.clone())
            .unwrap_or_default();
        if job.stop.is_none() {
            let preemption = Preemption {
                kind,
                for_job: None,
                for_share: None,
                at_ms: ctx.time_ms,
                node,
            };
            self.update_job(id, |job| job.stop = Some(StopCause::Preempted(preemption)));
        }
        self.finish_stop(id, None, ctx);
    }

    /// A job asked to stop has exited: requeue it, fail it past max_preemptions, retry or
    /// fail it at its time limit, or end it cancelled. Frees its GPUs.
    fn finish_stop(&mut self, id: JobId, code: Option<i32>, ctx: ApplyCtx) {
        self.update_job(id, |job| {
            let now = job.stamp(ctx.time_ms);
            job.allocation = None;
            job.exit_code = code;
            job.started_ms = None;
            match job.stop.take() {
                Some(StopCause::Cancelled) => {
                    end_attempt(job, now, code, "cancelled".into());
                    job.state = JobState::Cancelled;
                    job.reason = Some(WaitReason::Ended("cancelled".into()));
                    job.ended_ms = Some(now);
                }
                Some(StopCause::TimeLimit) => {
                    let limit = job.spec.time_limit_ms.unwrap_or(0);
                    let outcome = format!("time limit ({}) reached", duration_words(limit));
                    end_attempt(job, now, code, outcome.clone());
                    fail_or_retry(job, now, code, TIME_LIMIT_REASON, outcome);
                }
                Some(StopCause::Preempted(p)) => {
                    job.preemptions += 1;
                    let kind = p.kind;
                    let counted = kind.counts_toward_max();
                    if counted {
                        job.counted_preemptions += 1;
                    }
                    let outcome = match p.for_job {
                        Some(for_job) => format!("preempted ({}) for {for_job}", kind.as_str()),
                        None => format!("preempted ({})", kind.as_str()),
                    };
                    end_attempt(job, now, code, outcome);
                    job.last_preemption = Some(p);
                    match job.spec.max_preemptions {
                        Some(max) if counted && job.counted_preemptions > max => {
                            job.state = JobState::Failed;
                            job.reason = Some(WaitReason::Ended(format!(
                                "preempted by the scheduling rules {} times (this time: {}); max_preemptions is {max}",
                                job.counted_preemptions,
                                kind.as_str(),
                            )));
                            job.ended_ms = Some(now);
                        }
                        _ => {
                            job.state = JobState::Runnable;
                            job.reason = None;
                        }
                    }
                }
                None => unreachable!("finish_stop on a job that was not asked to stop"),
            }
        });
    }

    /// The leader saw a job's attempt reach its time limit: it is stopped with its checkpoint
    /// signal and grace period, and its end is a failure with the reason `time limit`.
    fn stop_at_time_limit(&mut self, id: JobId, attempt: u32) -> Outcome {
        let Some(job) = self.job(id) else {
            return rejected(Rejection::UnknownJob(id));
        };
        let applies = job.attempts == attempt
            && matches!(
                job.state,
                JobState::Scheduled | JobState::Starting | JobState::Running
            )
            && job.spec.time_limit_ms.is_some();
        if !applies {
            return rejected(Rejection::StalePlan(format!(
                "time limit of {id} attempt {attempt}: the attempt is not running"
            )));
        }
        self.update_job(id, |job| {
            job.state = JobState::Preempting;
            job.stop = Some(StopCause::TimeLimit);
        });
        Outcome::Done
    }

    fn report(&mut self, report: JobReport, ctx: ApplyCtx) -> Outcome {
        let stale = |why: &str| {
            rejected(Rejection::StaleReport {
                job: report.job,
                attempt: report.attempt,
                node: report.node.clone(),
                why: why.to_string(),
            })
        };
        let Some(job) = self.job(report.job) else {
            return rejected(Rejection::UnknownJob(report.job));
        };
        let Some(alloc) = job.allocation else {
            return stale("the job holds no GPUs");
        };
        if self.node(alloc.node).map(|n| n.name.as_str()) != Some(report.node.as_str()) {
            return stale("the job is placed on another node");
        }
        if job.attempts != report.attempt {
            return stale("the job is on another attempt");
        }
        let state = job.state;
        let id = report.job;
        match report.event {
            JobEvent::Started => {
                if state == JobState::Scheduled {
                    self.update_job(id, |job| job.state = JobState::Starting);
                }
            }
            JobEvent::Running => {
                if matches!(state, JobState::Scheduled | JobState::Starting) {
                    self.update_job(id, |job| {
                        let now = job.stamp(ctx.time_ms);
                        job.state = JobState::Running;
                        job.started_ms = Some(now);
                        job.first_started_ms.get_or_insert(now);
                        if let Some(attempt) = job.current_attempt_mut() {
                            attempt.started_ms = Some(now);
                        }
                    });
                }
            }
            JobEvent::Exited { code } if state == JobState::Preempting => {
                self.finish_stop(id, Some(code), ctx)
            }
            JobEvent::ExitedAfterSignal { code } if state == JobState::Preempting => {
                self.finish_stop(id, code, ctx)
            }
            JobEvent::Exited { code } => self.update_job(id, |job| {
                let now = job.stamp(ctx.time_ms);
                let outcome = format!("exited with code {code}");
                job.allocation = None;
                job.exit_code = Some(code);
                end_attempt(job, now, Some(code), outcome.clone());
                if code == 0 {
                    job.state = JobState::Succeeded;
                    job.reason = Some(WaitReason::Ended(outcome));
                    job.ended_ms = Some(now);
                } else {
                    fail_or_retry(job, now, Some(code), &outcome, outcome.clone());
                }
            }),
            JobEvent::ExitedAfterSignal { code } => {
                // The agent stopped it on its own (its lease ran out, a GPU failed).
                let node = report.node.clone();
                self.update_job(id, |job| {
                    job.stop = Some(StopCause::Preempted(Preemption {
                        kind: PreemptionKind::AgentStopped,
                        for_job: None,
                        for_share: None,
                        at_ms: ctx.time_ms,
                        node,
                    }))
                });
                self.finish_stop(id, code, ctx);
            }
            // Asked to stop while the agent was still trying to launch it: it never ran, and
            // the stop decides what becomes of it, as for an attempt stopped before it ran.
            JobEvent::LaunchFailed { .. } if state == JobState::Preempting => {
                self.finish_stop(id, None, ctx)
            }
            JobEvent::LaunchFailed {
                fault,
                tries,
                message,
            } => {
                let node = report.node.clone();
                self.launch_failed(id, node, fault, tries, message, ctx);
            }
        }
        Outcome::Done
    }

    /// An attempt that the agent could not launch. A fault of the job fails it; a fault of
    /// the node sends it back to the queue, unless that already happened
    /// [`LAUNCH_REQUEUES_MAX`] times, and then fails it. Frees its GPUs either way.
    fn launch_failed(
        &mut self,
        id: JobId,
        node: String,
        fault: LaunchFault,
        tries: u32,
        message: String,
        ctx: ApplyCtx,
    ) {
        self.update_job(id, |job| {
            let now = job.stamp(ctx.time_ms);
            if fault == LaunchFault::Node {
                job.launch_requeues += 1;
            }
            let requeues = job.launch_requeues;
            let requeue = fault == LaunchFault::Node && requeues <= LAUNCH_REQUEUES_MAX;
            job.allocation = None;
            job.started_ms = None;
            job.exit_code = None;
            let reason = WaitReason::LaunchFailed {
                node,
                tries,
                fault,
                // The one text from outside that a reason keeps: bounded here too, whatever
                // the coordinator let through.
                message: bounded_launch_message(&message),
                requeues,
                requeues_max: LAUNCH_REQUEUES_MAX,
            };
            let outcome = reason.to_string();
            end_attempt(job, now, None, outcome.clone());
            if requeue {
                job.state = JobState::Runnable;
                job.reason = Some(reason);
            } else if fault == LaunchFault::Job
                && job
                    .spec
                    .retry
                    .retries_failure(job.retries_used, None, &outcome)
            {
                // A fault of the job is a failure of the job: its retry strategy decides.
                job.retries_used += 1;
                job.state = JobState::Runnable;
                job.reason = Some(reason);
            } else {
                job.state = JobState::Failed;
                job.reason = Some(reason);
                job.ended_ms = Some(now);
            }
        });
    }

    fn apply_plan(&mut self, plan: Plan, ctx: ApplyCtx) -> PlanReport {
        let mut report = PlanReport::default();
        for (position, action) in plan.actions.into_iter().enumerate() {
            let result = match action {
                PlanAction::Place {
                    job,
                    node,
                    gpu_mask,
                } => self.check_place(job, node, gpu_mask).map(|()| {
                    self.place(job, node, gpu_mask, ctx);
                    report.placed += 1;
                }),
                PlanAction::Preempt { job, kind, for_job } => {
                    self.check_preempt(job, kind, for_job).map(|()| {
                        self.preempt(job, kind, for_job, ctx);
                        report.preempted += 1;
                    })
                }
                PlanAction::Nominate { job, node } => self.check_nominate(job, node).map(|()| {
                    self.update_job(job, |j| j.nomination = Some(node));
                    report.nominated += 1;
                }),
                PlanAction::ClearNomination { job } => match self.job(job) {
                    Some(j) if j.nomination.is_some() && j.state == JobState::Runnable => {
                        self.update_job(job, |j| j.nomination = None);
                        Ok(())
                    }
                    _ => Err(Rejection::StalePlan(format!("{job} has no nomination"))),
                },
            };
            if let Err(rejection) = result {
                report.rejected.push((position as u32, rejection));
            }
        }
        let noting = self.changes.is_some();
        for (id, reason) in plan.waiting {
            let Some(job) = self.job_mut(id) else {
                continue;
            };
            if job.state != JobState::Runnable || job.reason.as_ref() == Some(&reason) {
                continue;
            }
            // A reason is no part of the index: set in place, not through `update_job`.
            job.reason = Some(reason);
            if noting {
                let share = job.spec.share.clone();
                self.note_queued_job(id, share);
            }
        }
        report
    }

    fn check_place(&self, id: JobId, node: NodeId, gpu_mask: u64) -> Result<(), Rejection> {
        let stale = |why: String| Err(Rejection::StalePlan(format!("place {id}: {why}")));
        let Some(job) = self.job(id) else {
            return stale("unknown job".into());
        };
        if job.state != JobState::Runnable {
            return stale(format!("it is {}", job.state));
        }
        let Some(record) = self.node(node) else {
            return stale("unknown node".into());
        };
        if !record.state.schedulable() {
            return stale(format!("node {} is {}", record.name, record.state));
        }
        let class = job.class();
        let Some(slot) = self
            .index
            .capacity
            .get(class)
            .and_then(|c| c.slots.get(&node))
        else {
            return stale(format!("node {} has no {class} GPUs", record.name));
        };
        if gpu_mask.count_ones() != job.gpus() || gpu_mask & !slot.free_mask != 0 {
            return stale(format!(
                "GPUs {gpu_mask:#x} are not free on {}",
                record.name
            ));
        }
        if let Err(why) = runs_on(job, record, self.index.node_resources_used(node)) {
            return stale(why.to_string());
        }
        let own = if job.nomination == Some(node) {
            self.index.kept_for(id)
        } else {
            0
        };
        let capacity = &self.index.capacity[class];
        let available = available_for_job(*slot, capacity.available_total, own);
        if available.on_node < job.gpus() {
            return stale(format!("GPUs on {} are kept for another job", record.name));
        }
        let Some(share) = self.data.shares.get(&job.spec.share) else {
            return stale(format!("share {} is gone", job.spec.share));
        };
        let (usage, kept) = self
            .index
            .share_class(&share.spec.name, class)
            .map_or((0, 0), |i| (i.usage, i.kept));
        admit(
            &share.spec,
            class,
            usage,
            kept,
            job.gpus(),
            available.in_class,
            self.index.reserved_idle(class),
        )
        .map(|_| ())
        .map_err(|refusal| {
            let reason = refusal.reason(&share.spec, class);
            Rejection::StalePlan(format!("place {id}: {reason}"))
        })
    }

    fn place(&mut self, id: JobId, node: NodeId, gpu_mask: u64, ctx: ApplyCtx) {
        let record = self.node(node).expect("checked by check_place");
        let node_name = record.name.clone();
        let (cpu_millis, memory_bytes) = {
            let job = self.job(id).expect("checked by check_place");
            resources_for(job, record)
        };
        self.update_job(id, |job| {
            let now = job.stamp(ctx.time_ms);
            job.history.push(AttemptRecord {
                attempt: job.attempts + 1,
                node: node_name.clone(),
                placed_ms: now,
                started_ms: None,
                ended_ms: None,
                exit_code: None,
                outcome: None,
            });
            if job.history.len() > ATTEMPT_HISTORY_MAX {
                job.history.remove(0);
            }
            job.last_node = Some(node_name);
            job.state = JobState::Scheduled;
            job.allocation = Some(Allocation {
                node,
                gpu_mask,
                cpu_millis,
                memory_bytes,
            });
            job.placed_index = ctx.log_index;
            job.attempts += 1;
            job.nomination = None;
            job.reason = None;
            job.stop = None;
            job.started_ms = None;
            job.exit_code = None;
        });
    }

    fn check_preempt(
        &self,
        id: JobId,
        kind: PreemptionKind,
        for_job: Option<JobId>,
    ) -> Result<(), Rejection> {
        let stale = |why: String| Err(Rejection::StalePlan(format!("preempt {id}: {why}")));
        let Some(job) = self.job(id) else {
            return stale("unknown job".into());
        };
        if !job.state.holds_gpus() || job.state == JobState::Preempting {
            return stale(format!("it is {}", job.state));
        }
        let alloc = job.allocation.expect("holding jobs have an allocation");
        let beneficiary = for_job.and_then(|f| self.job(f));
        match kind {
            PreemptionKind::Drain => {
                if self.node(alloc.node).map(|n| n.state) != Some(NodeState::Draining) {
                    return stale("its node is not draining".into());
                }
            }
            PreemptionKind::Reclaim => {
                let Some(for_job) = beneficiary.filter(|f| f.state == JobState::Runnable) else {
                    return stale("the job it is for is not queued".into());
                };
                if for_job.spec.share == job.spec.share || !self.is_borrowed(job) {
                    return stale("it is not borrowing".into());
                }
            }
            PreemptionKind::InShare => {
                let Some(for_job) = beneficiary.filter(|f| f.state == JobState::Runnable) else {
                    return stale("the job it is for is not queued".into());
                };
                let enabled = self
                    .data
                    .shares
                    .get(&job.spec.share)
                    .is_some_and(|s| s.spec.in_share_preemption);
                if for_job.spec.share != job.spec.share
                    || for_job.priority() <= job.priority()
                    || !enabled
                {
                    return stale("in-share preemption does not apply".into());
                }
            }
            PreemptionKind::NodeLost | PreemptionKind::AgentStopped => {
                return stale("not a scheduler decision".into());
            }
        }
        Ok(())
    }

    /// Is the job borrowed: beyond its share's limit, ranking the share's jobs that are not
    /// stopping by (priority desc, start asc) ([`BorrowedFromLowest`], as the scheduler
    /// finds reclaim victims)?
    pub fn is_borrowed(&self, job: &JobRecord) -> bool {
        let class = job.class();
        let limit = self
            .data
            .shares
            .get(&job.spec.share)
            .map_or(0, |s| limit_of(&s.spec, class));
        let Some(index) = self.index.share_class(&job.spec.share, class) else {
            return false;
        };
        let mut borrowed = BorrowedFromLowest::new(index.usage - index.preempting, limit);
        for &(_, _, id) in index.holding.iter().rev() {
            if !borrowed.any_left() {
                return false;
            }
            let other = self.job(id).expect("indexed");
            if other.state == JobState::Preempting {
                continue;
            }
            let is_borrowed = borrowed.pass(other.gpus());
            if id == job.id {
                return is_borrowed;
            }
        }
        false
    }

    fn preempt(&mut self, id: JobId, kind: PreemptionKind, for_job: Option<JobId>, ctx: ApplyCtx) {
        let node = self
            .job(id)
            .and_then(|j| j.allocation)
            .and_then(|a| self.node(a.node))
            .map(|n| n.name.clone())
            .unwrap_or_default();
        let for_share = for_job
            .and_then(|f| self.job(f))
            .map(|f| f.spec.share.clone());
        self.update_job(id, |job| {
            job.state = JobState::Preempting;
            job.stop = Some(StopCause::Preempted(Preemption {
                kind,
                for_job,
                for_share,
                at_ms: ctx.time_ms,
                node,
            }));
        });
    }

    fn check_nominate(&self, id: JobId, node: NodeId) -> Result<(), Rejection> {
        let stale = |why: String| Err(Rejection::StalePlan(format!("nominate {id}: {why}")));
        match self.job(id) {
            Some(job) if job.state == JobState::Runnable => {}
            _ => return stale("it is not queued".into()),
        }
        match self.node(node) {
            Some(n) if n.state.schedulable() => Ok(()),
            _ => stale("the node is not schedulable".into()),
        }
    }
}

/// The reason of an attempt stopped at its time limit, as retry rules match it.
pub const TIME_LIMIT_REASON: &str = "time limit";

/// Records the end of a job's current attempt in its history.
fn end_attempt(job: &mut JobRecord, now: u64, code: Option<i32>, outcome: String) {
    if let Some(attempt) = job.current_attempt_mut() {
        attempt.ended_ms = Some(now);
        attempt.exit_code = code;
        attempt.outcome = Some(outcome);
    }
}

/// A failed attempt (`reason` is what retry rules match): back to the queue if the job's
/// retry strategy retries it, else the job ends FAILED saying `outcome`.
fn fail_or_retry(job: &mut JobRecord, now: u64, code: Option<i32>, reason: &str, outcome: String) {
    if job
        .spec
        .retry
        .retries_failure(job.retries_used, code, reason)
    {
        job.retries_used += 1;
        job.state = JobState::Runnable;
        job.reason = None;
        return;
    }
    let retried = job.retries_used;
    let tail = match (retried, job.spec.retry.retries) {
        (0, 0) => String::new(),
        (used, max) if used >= max => format!(" (after {used} of {max} retries)"),
        (used, max) => format!(" (after {used} of {max} retries; a retry rule said exit)"),
    };
    job.state = JobState::Failed;
    job.reason = Some(WaitReason::Ended(format!("{outcome}{tail}")));
    job.ended_ms = Some(now);
}

/// A duration in the largest whole unit that states it: `12h`, `90m`, `1500ms`.
pub fn duration_words(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (size, unit) in UNITS {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use quotient_common::{GpuDevice, NodeInventory, Strategy};

    use super::*;

    /// Applies `command` as the next log entry.
    fn apply_next(state: &mut State, command: Command) -> Outcome {
        let ctx = ApplyCtx {
            log_index: state.data.last_applied_index + 1,
            time_ms: 1_000,
        };
        apply(state, command, ctx)
    }

    fn submit(state: &mut State) -> Outcome {
        apply_next(
            state,
            Command::SubmitJob(JobSpec::new("team", 1, 1, vec!["x".into()])),
        )
    }

    #[test]
    fn a_submit_past_the_active_jobs_limit_is_rejected_until_one_ends() {
        // Proves ACTIVE_JOBS_MAX holds: the count of jobs that have not ended is kept in step
        // by every change, and a submit at the limit is rejected naming it; a job that ends
        // makes room. (The count is set near the limit rather than filled with 5,000,000
        // jobs.)
        let mut state = State::new();
        let class = GpuClass::parse("a10g").unwrap();
        apply_next(
            &mut state,
            Command::RegisterNode(NodeInventory {
                name: "n".into(),
                host: quotient_common::HostInfo::process_only(),
                gpus: vec![GpuDevice {
                    index: 0,
                    uuid: "GPU-0".into(),
                    class: class.clone(),
                    healthy: true,
                }],
            }),
        );
        let share = ShareSpec {
            name: "team".into(),
            limits: [(class, 1)].into(),
            strategy: Strategy::Lend,
            borrow_limit_percent: None,
            in_share_preemption: false,
            state: ShareState::Enabled,
        };
        assert_eq!(
            apply_next(&mut state, Command::CreateShare(share)),
            Outcome::Done
        );
        assert!(!submit(&mut state).is_rejected());
        assert_eq!(state.index.active_jobs, 1);
        state.validate().expect("the count is the index's");

        state.index.active_jobs = ACTIVE_JOBS_MAX as u64 - 1;
        assert!(
            !submit(&mut state).is_rejected(),
            "the last one under the limit"
        );
        assert_eq!(
            submit(&mut state),
            Outcome::Rejected(Rejection::TooMany {
                what: "jobs that have not ended".into(),
                max: ACTIVE_JOBS_MAX as u64,
            })
        );
        let cancel = Command::CancelJob { job: JobId(2) };
        assert_eq!(apply_next(&mut state, cancel), Outcome::Done);
        assert_eq!(state.index.active_jobs, ACTIVE_JOBS_MAX as u64 - 1);
        assert!(
            !submit(&mut state).is_rejected(),
            "a cancelled job made room"
        );
    }
}
