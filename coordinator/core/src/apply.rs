//! `apply`: the state machine's transition function.
//!
//! It is synchronous, reads no clock (the leader stamps `ApplyCtx::time_ms`), and returns a
//! rejection as data, leaving the state untouched, whenever a command does not hold. Every job
//! change goes through [`State::update_job`], which keeps the derived index in step and notes
//! the change for [`apply_noting`] ([`Changes`]).

use quotient_common::event::EventKind;
use quotient_common::job::{bounded_launch_message, LaunchFault};
use quotient_common::{
    GpuClass, JobId, JobSpec, JobState, NodeInventory, NodeState, ShareSpec, ShareState,
    ShareUpdate,
};

use crate::changes::Changes;
use crate::command::{ApplyCtx, Command, JobEvent, JobReport, Outcome, PlanReport, Rejection};
use crate::limits::{ACTIVE_JOBS_MAX, JOBS_MAX, LAUNCH_REQUEUES_MAX, NODES_MAX, SHARES_MAX};
use crate::plan::{Plan, PlanAction};
use crate::reason::{LaunchFailure, WaitReason};
use crate::rules::{
    admit, available_for_job, limit_of, resources_for, runs_on, BorrowedFromLowest,
};
use crate::state::{
    Allocation, AttemptRecord, JobRecord, MemberStage, NodeId, NodeRecord, Preemption,
    PreemptionKind, ShareRecord, State, StopCause, ATTEMPT_HISTORY_MAX,
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
    state.applying_ms = ctx.time_ms;
    if let Command::CheckDigest { .. } = command {
        // Read by the coordinator around apply. It leaves the state exactly as it was, its
        // last applied index included, so that a check never makes two equal states differ.
        return Outcome::Done;
    }
    // GPU time is credited, at the rates from before this command, when it may change them
    // or when the hour turned: between such commands the rates hold, and the time waits to be
    // credited (a query adds it: `State::pending_usage`). A rejected command changes nothing
    // (the next one credits the time, at the same rates).
    let changes_rates = crate::usage::may_change_rates(&command);
    let credit = changes_rates || state.usage_hour_turned(ctx.time_ms);
    if credit {
        state.keep_rates_before(ctx.time_ms);
    }
    let outcome = apply_inner(state, command, ctx);
    if credit && !outcome.is_rejected() {
        state.advance_usage(ctx.time_ms);
        if changes_rates {
            state.rates_changed();
        }
    }
    state.data.last_applied_index = ctx.log_index;
    state.data.clock_ms = state.data.clock_ms.max(ctx.time_ms);
    outcome
}

/// Applies one command, the log index aside (a command made for a caller applies the one it
/// holds with this).
pub(crate) fn apply_inner(state: &mut State, command: Command, ctx: ApplyCtx) -> Outcome {
    match command {
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
        Command::CheckDigest { .. } => Outcome::Done,
        Command::RemoveNode { node } => state.remove_node(&node),
        Command::StopAtTimeLimit { job, attempt } => state.stop_at_time_limit(job, attempt),
        Command::StopUnstarted { job, attempt } => state.stop_unstarted(job, attempt, ctx),
        Command::As { caller, command } => state.apply_as(caller, *command, ctx),
        Command::RecordRefusal {
            caller,
            action,
            reason,
        } => state.record_refusal(&caller, action, reason, ctx),
        Command::CreateGroup { name, users } => state.create_group(name, users),
        Command::UpdateGroup { name, add, remove } => state.update_group(name, add, remove),
        Command::DeleteGroup { name } => state.delete_group(&name),
        Command::Revoke { name, serial } => state.revoke(name, serial, ctx),
        Command::Unrevoke { name } => state.unrevoke(&name),
        Command::ExpireFinished(rule) => state.expire_finished(rule, ctx),
        Command::CreateAccessKey {
            id,
            user,
            admin,
            secret,
        } => state.create_access_key(id, user, admin, secret, ctx),
        Command::DeleteAccessKey { id } => state.delete_access_key(&id),
        Command::PutAwsObject { key, value } => state.put_aws_object(key, value),
        Command::SubmitServiceJob { spec, request } => state.submit_service_job(spec, request, ctx),
        Command::InSession { tag, command } => state.apply_in_session(tag, *command, ctx),
    }
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
        if old != new {
            if let Some(changes) = self.changes.as_mut() {
                changes.job_changed(&old, &new);
            }
            self.job_changed_events(&old, &new);
        }
        if new.state.is_terminal() && !old.state.is_terminal() {
            if let Some(finished) = self.finished.as_mut() {
                finished.push(id);
            }
        }
        if !new.state.holds_gpus() {
            // Its next attempt starts from its checkpoint directory; until it runs, no
            // preemption can cost it work.
            self.data.checkpoints.remove(&id);
        }
    }

    fn create_share(&mut self, spec: ShareSpec, ctx: ApplyCtx) -> Outcome {
        if let Err(e) = spec.validate() {
            return rejected(Rejection::Invalid(e));
        }
        if self.data.shares.contains_key(&spec.name) {
            return rejected(Rejection::DuplicateShare(spec.name));
        }
        // Jobs of a deleted share of this name that still stop would count against it.
        let stopping: Vec<JobId> = self
            .index
            .shares
            .get(&spec.name)
            .into_iter()
            .flat_map(|classes| classes.values())
            .flat_map(|i| i.holding.iter().map(|(_, _, id)| *id))
            .collect();
        if let Some(first) = stopping.iter().min() {
            return rejected(Rejection::ShareStillStopping {
                share: spec.name,
                jobs: stopping.len() as u64,
                first: *first,
            });
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
        self.share_event(&spec_name, "created");
        Outcome::Done
    }

    fn share_event(&mut self, share: &str, change: &str) {
        self.record_event(EventKind::Share {
            share: share.to_string(),
            change: change.to_string(),
            by: self.acting(),
        });
    }

    fn node_event(&mut self, node: &str, state: &str) {
        self.record_event(EventKind::Node {
            node: node.to_string(),
            state: state.to_string(),
            by: self.acting(),
        });
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
        self.share_event(name, "updated");
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
        self.share_event(name, "deleted");
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
        if self.data.jobs.issued() >= crate::job_table::JOB_IDS_MAX {
            return rejected(Rejection::TooMany {
                what: "job ids ever issued".into(),
                max: crate::job_table::JOB_IDS_MAX as u64,
            });
        }
        let id = JobId(self.data.jobs.issued() as u64 + 1);
        if let Some(key) = &spec.idempotency_key {
            self.data.idempotency.insert(key.clone(), id);
        }
        let job = JobRecord::new(id, spec, ctx.time_ms);
        if let Some(changes) = self.changes.as_mut() {
            changes.job_added(&job);
        }
        self.record_event(EventKind::JobSubmitted {
            job: id,
            name: job.spec.name.clone().unwrap_or_default(),
            share: job.spec.share.clone(),
            by: self.acting().or_else(|| job.spec.owner.clone()),
        });
        self.data.jobs.push(job.clone());
        self.index.add_job(&job, &self.data);
        Outcome::JobSubmitted {
            job: id,
            duplicate: false,
        }
    }

    fn live_job(&self, id: JobId) -> Result<&JobRecord, Rejection> {
        let job = self.job(id).ok_or_else(|| self.missing_job(id))?;
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
                job.nominations.clear();
                job.reason = Some(Box::new(WaitReason::Ended("cancelled while queued".into())));
                job.ended_ms = Some(job.stamp(ctx.time_ms));
            });
        } else if job.state == JobState::Preempting
            && matches!(job.stop.as_deref(), Some(StopCause::Preempted(_)))
        {
            // Already being stopped, maybe for a job that waits for its GPUs: the preemption
            // stays (so the scheduler still counts its GPUs as being freed for that job, and
            // stops no other job for it), and the reason says it ends CANCELLED when it
            // exits, not counted as a preemption (found by probing: replacing the preemption
            // made the scheduler stop a second job for the same need).
            self.update_job(id, |job| {
                job.reason = Some(Box::new(WaitReason::Ended(
                    CANCELLED_WHILE_PREEMPTED.into(),
                )));
            });
        } else {
            // It holds GPUs: the agent stops it like a preemption, and the GPUs stay held
            // until it has exited, so they are never given to two jobs.
            self.update_job(id, |job| {
                job.state = JobState::Preempting;
                job.stop = Some(Box::new(StopCause::Cancelled));
            });
        }
        Outcome::Done
    }

    fn register_node(&mut self, inventory: NodeInventory, ctx: ApplyCtx) -> Outcome {
        if let Err(e) = inventory.validate() {
            return rejected(Rejection::Invalid(e));
        }
        let new_node = !self.data.node_ids.contains_key(&inventory.name);
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
        // Jobs on GPUs the node no longer reports cannot go on there: they are stopped as
        // their agent's stop, and hold their GPUs until the agent reports the exit (it may
        // still run the attempt; started elsewhere meanwhile, it would run twice at once).
        let present: u64 = inventory
            .gpus
            .iter()
            .fold(0, |mask, g| mask | (1u64 << g.index));
        for job in self.jobs_on_node(id) {
            let alloc = self
                .job(job)
                .and_then(|j| j.member_on(id))
                .map(|(_, a)| *a)
                .expect("on node");
            // A member that has exited (one that succeeded waits for the others) runs
            // nothing there any more.
            if alloc.stage.exited() {
                continue;
            }
            let class_ok = self.job(job).is_some_and(|j| {
                inventory
                    .gpus
                    .iter()
                    .filter(|g| alloc.gpu_mask & (1u64 << g.index) != 0)
                    .all(|g| &g.class == j.class())
            });
            if alloc.gpu_mask & !present != 0 || !class_ok {
                self.stop_for_missing_gpus(job, &inventory.name, ctx);
            }
        }
        let node = &mut self.data.nodes[id.0 as usize];
        node.gpus = inventory.gpus;
        node.gpus.sort_by_key(|g| g.index);
        node.host = inventory.host;
        let back = node.state == NodeState::Lost;
        if back {
            node.state = NodeState::Ready;
        }
        node.incarnation += 1;
        let incarnation = node.incarnation;
        let record = node.clone();
        self.index.refresh_node(&record);
        self.note_node(id);
        if new_node {
            self.node_event(&record.name, "registered");
        } else if back {
            self.node_event(&record.name, "ready");
        }
        Outcome::NodeRegistered {
            node: id,
            incarnation,
        }
    }

    pub(crate) fn set_node_state(&mut self, name: &str, to: NodeState, ctx: ApplyCtx) -> Outcome {
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
                self.member_lost(job, id, PreemptionKind::NodeLost, ctx);
            }
            self.data.nodes[id.0 as usize].incarnation += 1;
        }
        self.data.nodes[id.0 as usize].state = to;
        if !to.schedulable() {
            self.clear_nominations_on(id);
        }
        if from != to {
            self.node_event(name, to.as_str());
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
            .filter(|j| self.job(*j).is_some_and(|j| j.nominations.contains(&node)))
            .collect();
        for job in nominated {
            self.update_job(job, |j| j.nominations.clear());
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
        self.node_event(name, "removed");
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

    /// Job `id` has a member on GPUs that `node` no longer reports: unless it is stopping
    /// already, it is stopped as its agent's own stop (`agent-stopped`: the checkpoint signal,
    /// the grace period, a kill), and its GPUs stay held until the agent reports that the
    /// attempt exited (at once, when the agent does not have it), so that the job is not
    /// started elsewhere while the old attempt may still run (found by probing: the new
    /// attempt started 21 ms after the old one's kill, with nothing to order them).
    fn stop_for_missing_gpus(&mut self, id: JobId, node: &str, ctx: ApplyCtx) {
        if self.job(id).is_none_or(|job| job.stop.is_some()) {
            return;
        }
        self.update_job(id, |job| {
            job.stop = Some(stopped_without_a_job(
                PreemptionKind::AgentStopped,
                node.to_string(),
                ctx.time_ms,
            ));
            job.state = JobState::Preempting;
        });
    }

    /// The member of job `id` on `node` is gone without its agent reporting its exit (its
    /// node was lost, or no longer has its GPUs): it counts as exited. A job of one node ends
    /// its hold on its GPUs at once; the other members of a job of several are stopped (the
    /// checkpoint signal, unless they already are), and the job's GPUs are freed when they
    /// have all exited.
    fn member_lost(&mut self, id: JobId, node: NodeId, kind: PreemptionKind, ctx: ApplyCtx) {
        let node_name = self.node(node).map(|n| n.name.clone()).unwrap_or_default();
        let job = self.job(id).expect("known job");
        let Some((rank, member)) = job.member_on(node) else {
            return;
        };
        // A member that has exited already (one that succeeded waits for the others) loses
        // nothing with its node.
        if member.stage.exited() {
            return;
        }
        let stopping = job.stop.is_some();
        self.update_job(id, |job| {
            job.placement[rank as usize].stage = MemberStage::Exited { code: None };
            if !stopping {
                job.stop = Some(stopped_without_a_job(kind, node_name, ctx.time_ms));
                job.state = JobState::Preempting;
            }
        });
        self.finish_stop_if_all_exited(id, None, ctx);
    }

    /// Finishes the stop of a job asked to stop once every member has exited (`code`: the
    /// exit code to record for a job of one node).
    fn finish_stop_if_all_exited(&mut self, id: JobId, code: Option<i32>, ctx: ApplyCtx) {
        let job = self.job(id).expect("known job");
        if job.placement.iter().all(|m| m.stage.exited()) {
            self.finish_stop(id, code, ctx);
        }
    }

    /// A job asked to stop has exited: requeue it, fail it past max_preemptions, retry or
    /// fail it at its time limit, or end it cancelled. Frees its GPUs.
    fn finish_stop(&mut self, id: JobId, code: Option<i32>, ctx: ApplyCtx) {
        if let Some(StopCause::MemberEnded { node, event, .. }) =
            self.job(id).and_then(|j| j.stop.as_deref().cloned())
        {
            // A member of a job of several nodes ended the attempt, and now all have exited:
            // the job goes on as a job of one node would after that member's event. The stop
            // that names the member goes only after that change, whose event then names the
            // member's node.
            self.attempt_ended(id, node, event, ctx);
            self.update_job(id, |job| {
                if matches!(job.stop.as_deref(), Some(StopCause::MemberEnded { .. })) {
                    job.stop = None;
                }
            });
            return;
        }
        self.update_job(id, |job| {
            let now = job.stamp(ctx.time_ms);
            job.placement.clear();
            job.exit_code = code;
            job.started_ms = None;
            let cancelled_while_preempted = matches!(
                job.reason.as_deref(),
                Some(WaitReason::Ended(text)) if text == CANCELLED_WHILE_PREEMPTED
            );
            let stop = job.stop.take().map(|stop| *stop);
            // Cancelled while it was being preempted: it ends as a cancel.
            let stop = if cancelled_while_preempted {
                Some(StopCause::Cancelled)
            } else {
                stop
            };
            match stop {
                Some(StopCause::Cancelled) => {
                    end_attempt(job, now, code, "cancelled".into());
                    job.state = JobState::Cancelled;
                    job.reason = Some(Box::new(WaitReason::Ended("cancelled".into())));
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
                    job.last_preemption = Some(Box::new(p));
                    match job.spec.max_preemptions {
                        Some(max) if counted && job.counted_preemptions > max => {
                            job.state = JobState::Failed;
                            job.reason = Some(Box::new(WaitReason::Ended(format!(
                                "preempted by the scheduling rules {} times (this time: {}); max_preemptions is {max}",
                                job.counted_preemptions,
                                kind.as_str(),
                            ))));
                            job.ended_ms = Some(now);
                        }
                        _ => {
                            job.state = JobState::Runnable;
                            job.reason = None;
                        }
                    }
                }
                Some(StopCause::MemberEnded { .. }) => unreachable!("handled above"),
                None => unreachable!("finish_stop on a job that was not asked to stop"),
            }
        });
    }

    /// The leader saw a job of several nodes not running on every member within the start
    /// timeout: its attempt is stopped like a preemption that counts toward nothing, and the
    /// job goes back to the queue.
    fn stop_unstarted(&mut self, id: JobId, attempt: u32, ctx: ApplyCtx) -> Outcome {
        let Some(job) = self.job(id) else {
            return rejected(Rejection::UnknownJob(id));
        };
        let applies = job.attempts == attempt
            && job.is_gang()
            && matches!(job.state, JobState::Scheduled | JobState::Starting);
        if !applies {
            return rejected(Rejection::StalePlan(format!(
                "start timeout of {id} attempt {attempt}: the attempt is not starting"
            )));
        }
        let node = job.last_node.clone().unwrap_or_default();
        self.update_job(id, |job| {
            job.state = JobState::Preempting;
            job.stop = Some(Box::new(StopCause::Preempted(Preemption {
                kind: PreemptionKind::StartTimeout,
                for_job: None,
                for_share: None,
                at_ms: ctx.time_ms,
                node,
            })));
        });
        Outcome::Done
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
            job.stop = Some(Box::new(StopCause::TimeLimit));
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
        if job.placement.is_empty() {
            return stale("the job holds no GPUs");
        }
        let member = self
            .data
            .node_ids
            .get(&report.node)
            .and_then(|node| job.member_on(*node))
            .map(|(rank, member)| (rank, *member));
        let Some((rank, member)) = member else {
            return stale("the job is placed on another node");
        };
        if job.attempts != report.attempt {
            return stale("the job is on another attempt");
        }
        if member.stage.exited() {
            return stale("this member of the job has exited already");
        }
        let (state, gang) = (job.state, job.is_gang());
        let id = report.job;
        let rank_index = rank as usize;
        match report.event {
            JobEvent::Checkpointed => {
                // Any member's checkpoint counts: the job resumes from its directory.
                self.data.checkpoints.insert(id, ctx.time_ms);
            }
            JobEvent::Started => self.update_job(id, |job| {
                if job.placement[rank_index].stage == MemberStage::Placed {
                    job.placement[rank_index].stage = MemberStage::Started;
                }
                if job.state == JobState::Scheduled {
                    job.state = JobState::Starting;
                }
            }),
            JobEvent::Running => self.update_job(id, |job| {
                job.placement[rank_index].stage = MemberStage::Running;
                // A job of several nodes is RUNNING once every member runs (or ran: a member
                // may finish before the last one reports).
                let all_ran = job.placement.iter().all(|m| {
                    matches!(
                        m.stage,
                        MemberStage::Running | MemberStage::Exited { code: Some(0) }
                    )
                });
                if all_ran && matches!(job.state, JobState::Scheduled | JobState::Starting) {
                    let now = job.stamp(ctx.time_ms);
                    job.state = JobState::Running;
                    job.started_ms = Some(now);
                    job.first_started_ms.get_or_insert(now);
                    if let Some(attempt) = job.current_attempt_mut() {
                        attempt.started_ms = Some(now);
                    }
                }
            }),
            event if !gang => {
                let code = event.exit_code();
                if state == JobState::Preempting {
                    self.update_job(id, |job| {
                        job.placement[0].stage = MemberStage::Exited { code };
                    });
                    self.finish_stop(id, code, ctx);
                } else {
                    self.attempt_ended(id, report.node.clone(), event, ctx);
                }
            }
            event => {
                // A member of a job of several nodes has exited.
                let code = event.exit_code();
                let ok = matches!(event, JobEvent::Exited { code: 0 });
                let node = report.node.clone();
                self.update_job(id, |job| {
                    job.placement[rank_index].stage = MemberStage::Exited { code };
                    if job.state != JobState::Preempting && !ok {
                        // One fate: the attempt ends for every member.
                        job.state = JobState::Preempting;
                        job.stop = Some(Box::new(StopCause::MemberEnded {
                            rank,
                            node: node.clone(),
                            event: event.clone(),
                        }));
                    }
                });
                let job = self.job(id).expect("known job");
                let all_exited = job.placement.iter().all(|m| m.stage.exited());
                if job.state == JobState::Preempting {
                    self.finish_stop_if_all_exited(id, code, ctx);
                } else if all_exited {
                    // Every member exited 0.
                    self.attempt_ended(id, node, event, ctx);
                }
            }
        }
        Outcome::Done
    }

    /// The current attempt of a job that was not asked to stop has ended with `event` (an
    /// exit, a stop by its agent, a launch failure) of the member on `node`: the job
    /// succeeds, fails, is retried or requeued, and frees its GPUs.
    fn attempt_ended(&mut self, id: JobId, node: String, event: JobEvent, ctx: ApplyCtx) {
        match event {
            JobEvent::Started | JobEvent::Running | JobEvent::Checkpointed => {
                unreachable!("attempt_ended is given an end")
            }
            JobEvent::Exited { code } => self.exited(id, code, None, ctx),
            JobEvent::ExitedWithReason { code, reason } => {
                self.exited(id, code, Some(&reason), ctx)
            }
            JobEvent::ExitedAfterSignal { code } => {
                // The agent stopped it on its own (its lease ran out, a GPU failed).
                self.update_job(id, |job| {
                    job.stop = Some(stopped_without_a_job(
                        PreemptionKind::AgentStopped,
                        node,
                        ctx.time_ms,
                    ))
                });
                self.finish_stop(id, code, ctx);
            }
            JobEvent::LaunchFailed {
                fault,
                tries,
                message,
            } => self.launch_failed(id, node, fault, tries, message, ctx),
        }
    }

    /// The current attempt exited on its own with `code`, saying `reason` (a job's own
    /// failure reason) or not.
    fn exited(&mut self, id: JobId, code: i32, reason: Option<&str>, ctx: ApplyCtx) {
        self.update_job(id, |job| {
            let now = job.stamp(ctx.time_ms);
            let outcome = match reason {
                Some(reason) => format!(
                    "exited with code {code}: {}",
                    quotient_common::job::bounded_launch_message(reason)
                ),
                None => format!("exited with code {code}"),
            };
            job.placement.clear();
            job.exit_code = Some(code);
            end_attempt(job, now, Some(code), outcome.clone());
            if code == 0 {
                job.state = JobState::Succeeded;
                job.reason = Some(Box::new(WaitReason::Ended(outcome)));
                job.ended_ms = Some(now);
            } else {
                fail_or_retry(job, now, Some(code), &outcome, outcome.clone());
            }
        });
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
            job.placement.clear();
            job.started_ms = None;
            job.exit_code = None;
            let reason = WaitReason::LaunchFailed(Box::new(LaunchFailure {
                node,
                tries,
                fault,
                // The one text from outside that a reason keeps: bounded here too, whatever
                // the coordinator let through.
                message: bounded_launch_message(&message),
                requeues,
                requeues_max: LAUNCH_REQUEUES_MAX,
            }));
            let outcome = reason.to_string();
            end_attempt(job, now, None, outcome.clone());
            if requeue {
                job.state = JobState::Runnable;
                job.reason = Some(Box::new(reason));
            } else if fault == LaunchFault::Job
                && job
                    .spec
                    .retry
                    .retries_failure(job.retries_used, None, &outcome)
            {
                // A fault of the job is a failure of the job: its retry strategy decides.
                job.retries_used += 1;
                job.state = JobState::Runnable;
                job.reason = Some(Box::new(reason));
            } else {
                job.state = JobState::Failed;
                job.reason = Some(Box::new(reason));
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
                } => self.check_place(job, &[(node, gpu_mask)]).map(|()| {
                    self.place(job, &[(node, gpu_mask)], ctx);
                    report.placed += 1;
                }),
                PlanAction::PlaceMembers { job, members } => {
                    self.check_place(job, &members).map(|()| {
                        self.place(job, &members, ctx);
                        report.placed += 1;
                    })
                }
                PlanAction::NominateNodes { job, nodes } => {
                    self.check_nominate_nodes(job, &nodes).map(|()| {
                        self.update_job(job, |j| j.nominations = nodes.into());
                        report.nominated += 1;
                    })
                }
                PlanAction::Preempt { job, kind, for_job } => {
                    self.check_preempt(job, kind, for_job).map(|()| {
                        self.preempt(job, kind, for_job, ctx);
                        report.preempted += 1;
                    })
                }
                PlanAction::Nominate { job, node } => self.check_nominate(job, node).map(|()| {
                    self.update_job(job, |j| j.nominations = thin_vec::thin_vec![node]);
                    report.nominated += 1;
                }),
                PlanAction::ClearNomination { job } => match self.job(job) {
                    Some(j) if !j.nominations.is_empty() && j.state == JobState::Runnable => {
                        self.update_job(job, |j| j.nominations.clear());
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
            if job.state != JobState::Runnable || job.reason.as_deref() == Some(&reason) {
                continue;
            }
            // A reason is no part of the index: set in place, not through `update_job`.
            job.reason = Some(Box::new(reason));
            if noting {
                let share = job.spec.share.clone();
                self.note_queued_job(id, share);
            }
        }
        report
    }

    /// Whether job `id` may be placed with `members` (a node and a mask of GPUs there per
    /// member, in rank order): all of them together, or none.
    fn check_place(&self, id: JobId, members: &[(NodeId, u64)]) -> Result<(), Rejection> {
        let stale = |why: String| Err(Rejection::StalePlan(format!("place {id}: {why}")));
        let Some(job) = self.job(id) else {
            return stale("unknown job".into());
        };
        if job.state != JobState::Runnable {
            return stale(format!("it is {}", job.state));
        }
        if members.len() != job.node_count() as usize {
            return stale(format!(
                "{} members for a job of {} nodes",
                members.len(),
                job.node_count()
            ));
        }
        let class = job.class();
        let Some(capacity) = self.index.capacity.get(class) else {
            return stale(format!("no node has {class} GPUs"));
        };
        let mut in_class = capacity.available_total;
        let mut topology: Option<Option<&String>> = None;
        for (i, &(node, gpu_mask)) in members.iter().enumerate() {
            if members[..i].iter().any(|(other, _)| *other == node) {
                return stale("two members on one node".into());
            }
            let Some(record) = self.node(node) else {
                return stale("unknown node".into());
            };
            if !record.state.schedulable() {
                return stale(format!("node {} is {}", record.name, record.state));
            }
            let Some(slot) = capacity.slots.get(&node) else {
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
            if let Some(key) = &job.spec.same {
                let value = record.host.labels.get(key);
                if value.is_none() || topology.is_some_and(|first| first != value) {
                    return stale(format!("its nodes do not share one value of label {key}"));
                }
                topology = Some(value);
            }
            let own = self.index.kept_for(id, node);
            let available = available_for_job(*slot, capacity.available_total, own);
            if available.on_node < job.gpus() {
                return stale(format!("GPUs on {} are kept for another job", record.name));
            }
            in_class = in_class - u64::from(slot.available()) + u64::from(available.on_node);
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
            job.total_gpus(),
            in_class,
            self.index.reserved_idle(class),
        )
        .map(|_| ())
        .map_err(|refusal| {
            let reason = refusal.reason(&share.spec, class);
            Rejection::StalePlan(format!("place {id}: {reason}"))
        })
    }

    /// Places job `id` with `members`, checked by [`State::check_place`].
    fn place(&mut self, id: JobId, members: &[(NodeId, u64)], ctx: ApplyCtx) {
        let job = self.job(id).expect("checked by check_place");
        let mut names = Vec::with_capacity(members.len());
        let mut placement = Vec::with_capacity(members.len());
        for &(node, gpu_mask) in members {
            let record = self.node(node).expect("checked by check_place");
            let (cpu_millis, memory_bytes) = resources_for(job, record);
            names.push(record.name.clone());
            placement.push(Allocation {
                node,
                gpu_mask,
                cpu_millis,
                memory_bytes,
                stage: MemberStage::Placed,
            });
        }
        self.update_job(id, |job| {
            let now = job.stamp(ctx.time_ms);
            job.history.push(AttemptRecord {
                attempt: job.attempts + 1,
                nodes: names.clone(),
                placed_ms: now,
                started_ms: None,
                ended_ms: None,
                exit_code: None,
                outcome: None,
            });
            if job.history.len() > ATTEMPT_HISTORY_MAX {
                job.history.remove(0);
            }
            job.last_node = names.into_iter().next();
            job.state = JobState::Scheduled;
            job.placement = placement.into();
            job.placed_index = ctx.log_index;
            job.attempts += 1;
            job.nominations.clear();
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
        let beneficiary = for_job.and_then(|f| self.job(f));
        match kind {
            PreemptionKind::Drain => {
                let draining = job.placement.iter().any(|member| {
                    self.node(member.node).map(|n| n.state) == Some(NodeState::Draining)
                });
                if !draining {
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
            PreemptionKind::NodeLost
            | PreemptionKind::AgentStopped
            | PreemptionKind::StartTimeout => {
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
            let is_borrowed = borrowed.pass(other.total_gpus());
            if id == job.id {
                return is_borrowed;
            }
        }
        false
    }

    fn preempt(&mut self, id: JobId, kind: PreemptionKind, for_job: Option<JobId>, ctx: ApplyCtx) {
        let node = self
            .job(id)
            .and_then(|j| j.allocation())
            .and_then(|a| self.node(a.node))
            .map(|n| n.name.clone())
            .unwrap_or_default();
        let for_share = for_job
            .and_then(|f| self.job(f))
            .map(|f| f.spec.share.clone());
        self.update_job(id, |job| {
            job.state = JobState::Preempting;
            job.stop = Some(Box::new(StopCause::Preempted(Preemption {
                kind,
                for_job,
                for_share,
                at_ms: ctx.time_ms,
                node,
            })));
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

    /// Whether `nodes` may keep GPUs for job `id`, a job of several nodes: one distinct,
    /// schedulable node per member.
    fn check_nominate_nodes(&self, id: JobId, nodes: &[NodeId]) -> Result<(), Rejection> {
        let stale = |why: String| Err(Rejection::StalePlan(format!("nominate {id}: {why}")));
        let job = match self.job(id) {
            Some(job) if job.state == JobState::Runnable => job,
            _ => return stale("it is not queued".into()),
        };
        if nodes.len() != job.node_count() as usize {
            return stale(format!(
                "{} nodes for a job of {} nodes",
                nodes.len(),
                job.node_count()
            ));
        }
        for (i, node) in nodes.iter().enumerate() {
            if nodes[..i].contains(node) {
                return stale("a node named twice".into());
            }
            match self.node(*node) {
                Some(n) if n.state.schedulable() => {}
                _ => return stale("a node is not schedulable".into()),
            }
        }
        Ok(())
    }
}

/// A stop of `kind` on `node` at `at_ms` that frees GPUs for no job in particular (the node
/// or its agent stopped the job, not the scheduling rules).
fn stopped_without_a_job(kind: PreemptionKind, node: String, at_ms: u64) -> Box<StopCause> {
    Box::new(StopCause::Preempted(Preemption {
        kind,
        for_job: None,
        for_share: None,
        at_ms,
        node,
    }))
}

/// The reason of an attempt stopped at its time limit, as retry rules match it.
pub const TIME_LIMIT_REASON: &str = "time limit";

/// The reason of a job cancelled while it was being preempted, until it exits: its
/// preemption is kept (the GPUs it frees stay promised to the job it was stopped for), and it
/// ends CANCELLED, its preemption not counted.
pub const CANCELLED_WHILE_PREEMPTED: &str =
    "cancelled while being preempted: it ends when it exits";

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
    job.reason = Some(Box::new(WaitReason::Ended(format!("{outcome}{tail}"))));
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
                    nvlink_peers: 0,
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
            members: Vec::new(),
            max_jobs_per_user: None,
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
