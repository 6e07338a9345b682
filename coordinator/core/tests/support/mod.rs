//! A test harness around the pure core: applies commands, runs rounds, and plays the agents.
//! Validates the state after every apply, and checks that the changes `apply_noting` names
//! are exactly the records that differ.
#![allow(dead_code)]

use std::collections::BTreeSet;

use quotient_common::job::LaunchFault;
use quotient_common::{
    GpuClass, GpuDevice, JobId, JobSpec, JobState, NodeInventory, ShareSpec, ShareState, Strategy,
};
use quotient_core::{
    apply_noting, plan, share_accounts, ApplyCtx, Changes, Command, JobEvent, JobReport, NodeId,
    Outcome, Plan, State,
};

pub fn class(name: &str) -> GpuClass {
    GpuClass::parse(name).unwrap()
}

pub fn share(name: &str, strategy: Strategy, limit: u32) -> ShareSpec {
    ShareSpec {
        name: name.into(),
        limits: [(class("a10g"), limit)].into(),
        strategy,
        borrow_limit_percent: None,
        in_share_preemption: false,
        state: ShareState::Enabled,
        members: Vec::new(),
        max_jobs_per_user: None,
    }
}

pub fn job(share: &str, name: &str, priority: u32, gpus: u32) -> JobSpec {
    let mut spec = JobSpec::new(share, priority, gpus, vec!["train".into()]);
    spec.name = Some(name.into());
    spec
}

/// A job of `nodes` nodes with `gpus` GPUs on each.
pub fn gang(share: &str, name: &str, priority: u32, nodes: u32, gpus: u32) -> JobSpec {
    let mut spec = job(share, name, priority, gpus);
    spec.nodes = nodes;
    spec
}

/// A node of `gpus` a10g GPUs with the label `rack=RACK`.
pub fn racked(name: &str, gpus: u32, rack: &str) -> NodeInventory {
    let mut inventory = node(name, gpus, "a10g");
    inventory.host.labels.insert("rack".into(), rack.into());
    inventory
}

pub fn node(name: &str, gpus: u32, gpu_class: &str) -> NodeInventory {
    NodeInventory {
        name: name.into(),
        host: quotient_common::HostInfo::process_only(),
        gpus: (0..gpus)
            .map(|i| GpuDevice {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                class: class(gpu_class),
                healthy: true,
                nvlink_peers: 0,
            })
            .collect(),
    }
}

pub struct Sim {
    pub state: State,
    pub log_index: u64,
    pub time_ms: u64,
    /// Every command applied, for replay.
    pub log: Vec<(Command, ApplyCtx)>,
    /// What the last command applied changed.
    pub last_changes: Changes,
}

impl Default for Sim {
    fn default() -> Self {
        Self::new()
    }
}

impl Sim {
    pub fn new() -> Sim {
        Sim {
            state: State::new(),
            log_index: 0,
            time_ms: 1_000,
            log: Vec::new(),
            last_changes: Changes::new(),
        }
    }

    pub fn apply(&mut self, command: Command) -> Outcome {
        self.log_index += 1;
        self.time_ms += 10;
        let ctx = ApplyCtx {
            log_index: self.log_index,
            time_ms: self.time_ms,
        };
        self.log.push((command.clone(), ctx));
        let before = self.state.clone();
        let mut changes = Changes::new();
        let outcome = apply_noting(&mut self.state, command, ctx, &mut changes);
        if let Err(e) = self.state.validate() {
            panic!(
                "invariant broken after {:?}: {e}",
                self.log.last().unwrap().0
            );
        }
        assert_eq!(
            changes,
            changed_between(&before, &self.state),
            "the changes noted for {:?}",
            self.log.last().unwrap().0
        );
        self.last_changes = changes;
        outcome
    }

    pub fn ok(&mut self, command: Command) {
        let outcome = self.apply(command);
        assert!(!outcome.is_rejected(), "rejected: {outcome:?}");
    }

    pub fn submit(&mut self, spec: JobSpec) -> JobId {
        match self.apply(Command::SubmitJob(spec)) {
            Outcome::JobSubmitted { job, .. } => job,
            other => panic!("submit failed: {other:?}"),
        }
    }

    /// One scheduling round, committed. Returns the plan.
    pub fn round(&mut self) -> Plan {
        let plan = plan(&self.state);
        if !plan.is_empty() {
            match self.apply(Command::ApplyPlan(plan.clone())) {
                Outcome::PlanApplied(report) => assert!(
                    report.rejected.is_empty(),
                    "a fresh plan must apply whole: {report:?}"
                ),
                other => panic!("plan not applied: {other:?}"),
            }
        }
        plan
    }

    /// The agent of each of the job's nodes whose member has not exited reports `event` about
    /// its current attempt, rank by rank (until the job no longer holds GPUs).
    pub fn report(&mut self, id: JobId, event: JobEvent) {
        let ranks = self.state.job(id).unwrap().placement.len() as u32;
        for rank in 0..ranks {
            let job = self.state.job(id).unwrap();
            if job
                .placement
                .get(rank as usize)
                .is_some_and(|m| !m.stage.exited())
            {
                self.report_member(id, rank, event.clone());
            }
        }
    }

    /// The agent of member `rank`'s node reports `event` about the job's current attempt.
    pub fn report_member(&mut self, id: JobId, rank: u32, event: JobEvent) {
        let job = self.state.job(id).unwrap();
        let node = self
            .state
            .node(job.placement[rank as usize].node)
            .unwrap()
            .name
            .clone();
        let attempt = job.attempts;
        self.ok(Command::ReportJob(JobReport {
            job: id,
            attempt,
            node,
            event,
        }));
    }

    /// The nodes of a job's members, by name, in rank order.
    pub fn nodes_of(&self, id: JobId) -> Vec<String> {
        self.state
            .job(id)
            .unwrap()
            .placement
            .iter()
            .map(|m| self.state.node(m.node).unwrap().name.clone())
            .collect()
    }

    /// The agents start every SCHEDULED job: STARTING, then RUNNING.
    pub fn agents_start(&mut self) -> usize {
        let scheduled: Vec<JobId> = self
            .state
            .jobs()
            .filter(|j| j.state == JobState::Scheduled)
            .map(|j| j.id)
            .collect();
        for id in &scheduled {
            self.report(*id, JobEvent::Started);
            self.report(*id, JobEvent::Running);
        }
        scheduled.len()
    }

    /// The agents stop every PREEMPTING job: it exits after its checkpoint signal.
    pub fn agents_stop(&mut self) -> usize {
        let stopping: Vec<JobId> = self
            .state
            .jobs()
            .filter(|j| j.state == JobState::Preempting)
            .map(|j| j.id)
            .collect();
        for id in &stopping {
            self.report(*id, JobEvent::ExitedAfterSignal { code: Some(0) });
        }
        stopping.len()
    }

    /// A job ends on its own.
    pub fn finish(&mut self, id: JobId, code: i32) {
        self.report(id, JobEvent::Exited { code });
    }

    /// The agent gave up launching a job's current attempt after 3 tries.
    pub fn launch_fails(&mut self, id: JobId, fault: LaunchFault) {
        let message = format!("the {fault}'s fault");
        self.report(
            id,
            JobEvent::LaunchFailed {
                fault,
                tries: 3,
                message,
            },
        );
    }

    /// Rounds and agent actions until nothing changes; panics after `max` rounds.
    pub fn settle(&mut self) {
        for _ in 0..50 {
            let plan = self.round();
            let started = self.agents_start();
            let stopped = self.agents_stop();
            if plan.actions.is_empty() && started == 0 && stopped == 0 {
                return;
            }
        }
        panic!("the cluster did not settle in 50 rounds: a preemption loop?");
    }

    pub fn state_of(&self, id: JobId) -> JobState {
        self.state.job(id).unwrap().state
    }

    /// (usage, borrowed, lent) of a share for class a10g.
    pub fn account(&self, share: &str) -> (u64, u64, u64) {
        let accounts = share_accounts(&self.state);
        let a = &accounts[share];
        let c = class("a10g");
        (a.usage[&c], a.borrowed[&c], a.lent[&c])
    }
}

/// The changes from `before` to `after`, found by comparing every record (see
/// `quotient_core::changes`): what `apply_noting` must have named, no more and no less.
pub fn changed_between(before: &State, after: &State) -> Changes {
    let mut changes = Changes::new();
    let jobs = before.data().jobs.issued().max(after.data().jobs.issued());
    for slot in 0..jobs {
        let (old, new) = (before.data().jobs.get(slot), after.data().jobs.get(slot));
        if old == new {
            continue;
        }
        for job in [old, new].into_iter().flatten() {
            changes.jobs.insert(job.id);
            changes.shares.insert(job.spec.share.clone());
            changes.nodes.extend(job.placement.iter().map(|a| a.node));
        }
    }
    let nodes = before.data().nodes.len().max(after.data().nodes.len());
    for slot in 0..nodes {
        // A vacant slot that goes (the end of the slots is trimmed) is no node's change.
        let slots = (before.data().nodes.get(slot), after.data().nodes.get(slot));
        let node = |slot: Option<&quotient_core::NodeRecord>| slot.is_some_and(|n| !n.is_vacant());
        if slots.0 != slots.1 && (node(slots.0) || node(slots.1)) {
            changes.nodes.insert(NodeId(slot as u32));
        }
    }
    let shares: BTreeSet<&String> = before
        .data()
        .shares
        .keys()
        .chain(after.data().shares.keys())
        .collect();
    for share in shares {
        if before.data().shares.get(share) != after.data().shares.get(share) {
            changes.shares.insert(share.clone());
        }
    }
    changes
}
