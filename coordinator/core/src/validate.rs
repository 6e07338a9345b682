//! `State::validate`: the invariants of the replicated state.
//!
//! Tests run it after every `apply`; it is thorough rather than fast: it rebuilds the derived
//! index from scratch and compares it with the maintained one. Snapshot loading runs
//! [`State::validate_records`] once instead: its index was just built from the records, so
//! building it again could find no difference (and costs about a second a million jobs).

use std::collections::BTreeMap;

use quotient_common::{JobId, JobState};

use crate::index::Index;
use crate::state::{MemberStage, NodeId, State, StopCause};

/// A broken invariant, described for a developer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvariantError(pub String);

impl State {
    /// Checks every invariant; see the module docs.
    pub fn validate(&self) -> Result<(), InvariantError> {
        self.validate_records()?;
        let rebuilt = Index::rebuild(&self.data);
        if rebuilt != self.index {
            return Err(InvariantError(index_difference(&rebuilt, &self.index)));
        }
        Ok(())
    }

    /// Checks every invariant of the records themselves, but not that the maintained index
    /// matches them: for a state whose index was just built from its records.
    pub fn validate_records(&self) -> Result<(), InvariantError> {
        let fail = |text: String| Err(InvariantError(text));
        if let Err(why) = self.data.sessions.check() {
            return fail(why);
        }
        if let Some(id) = self
            .data
            .checkpoints
            .keys()
            .find(|id| !self.job(**id).is_some_and(|job| job.state.holds_gpus()))
        {
            return fail(format!("{id} has a checkpoint time but holds no GPUs"));
        }
        let mut owners: BTreeMap<(NodeId, u32), JobId> = BTreeMap::new();
        for job in self.data.jobs.iter() {
            let slot = job
                .id
                .0
                .checked_sub(1)
                .and_then(|s| usize::try_from(s).ok());
            if slot.and_then(|slot| self.data.jobs.get(slot)).map(|j| j.id) != Some(job.id) {
                return fail(format!("{} is not in its slot", job.id));
            }
            if job.spec.gpu_class.is_none() {
                return fail(format!("{} has no GPU class", job.id));
            }
            if job.state.holds_gpus() == job.placement.is_empty() {
                return fail(format!(
                    "{} is {} but its placement is {:?}",
                    job.id, job.state, job.placement
                ));
            }
            if !job.placement.is_empty() && job.placement.len() != job.node_count() as usize {
                return fail(format!(
                    "{} has {} members for {} nodes: a job is placed whole or not at all",
                    job.id,
                    job.placement.len(),
                    job.node_count()
                ));
            }
            let ended_badly = |stage: MemberStage| {
                stage.exited() && stage != MemberStage::Exited { code: Some(0) }
            };
            if job.state != JobState::Preempting
                && job.placement.iter().any(|m| ended_badly(m.stage))
            {
                return fail(format!(
                    "{} is {} with a member that ended the attempt",
                    job.id, job.state
                ));
            }
            if (job.state == JobState::Preempting) != job.stop.is_some() {
                return fail(format!(
                    "{} is {} with stop {:?}",
                    job.id, job.state, job.stop
                ));
            }
            // Every attempt that ended is counted once, as a preemption or a launch requeue
            // (`JobRecord::launch_requeues`), so there are never more preemptions than ended
            // attempts.
            if job.preemptions + u32::from(job.state.holds_gpus()) > job.attempts {
                return fail(format!(
                    "{} has {} preemptions in {} attempts while {}",
                    job.id, job.preemptions, job.attempts, job.state
                ));
            }
            if !job.nominations.is_empty() && job.state != JobState::Runnable {
                return fail(format!("{} is {} but nominated", job.id, job.state));
            }
            for &node in &job.nominations {
                if self.node(node).is_none() {
                    return fail(format!("{} is nominated on unknown node {node:?}", job.id));
                }
            }
            for (rank, alloc) in job.placement.iter().enumerate() {
                if job.placement[..rank].iter().any(|m| m.node == alloc.node) {
                    return fail(format!("{} has two members on one node", job.id));
                }
                let Some(node) = self.node(alloc.node) else {
                    return fail(format!("{} is on unknown node {:?}", job.id, alloc.node));
                };
                if alloc.gpu_mask.count_ones() != job.gpus() {
                    return fail(format!(
                        "{} holds {:#x} for {} GPUs",
                        job.id,
                        alloc.gpu_mask,
                        job.gpus()
                    ));
                }
                // A job being stopped may hold GPUs its node no longer reports (its agent came
                // back without them): they stay held until the agent reports the exit. So may a
                // member that has exited: its GPUs stay held until every member has.
                let stopping = job.stop.is_some() || alloc.stage.exited();
                for index in alloc.gpu_indices() {
                    let gpu = node.gpus.iter().find(|g| g.index == index);
                    if gpu.is_none() && !stopping {
                        return fail(format!(
                            "{} holds missing GPU {index} of {}",
                            job.id, node.name
                        ));
                    }
                    if let Some(gpu) = gpu.filter(|gpu| &gpu.class != job.class() && !stopping) {
                        return fail(format!(
                            "{} holds a {} GPU for a {} job",
                            job.id,
                            gpu.class,
                            job.class()
                        ));
                    }
                    if let Some(other) = owners.insert((alloc.node, index), job.id) {
                        return fail(format!(
                            "GPU {index} of {} is given to both {other} and {}",
                            node.name, job.id
                        ));
                    }
                }
                if node.state == quotient_common::NodeState::Lost && !alloc.stage.exited() {
                    return fail(format!("{} holds GPUs on lost node {}", job.id, node.name));
                }
            }
            if let Some(StopCause::Preempted(p)) = job.stop.as_deref() {
                if let Some(for_job) = p.for_job {
                    if self.job(for_job).is_none() {
                        return fail(format!("{} is preempted for unknown {for_job}", job.id));
                    }
                }
            }
        }
        for (name, id) in &self.data.node_ids {
            match self.node(*id) {
                Some(node) if &node.name == name && node.id == *id => {}
                _ => return fail(format!("node name {name} maps to a wrong record")),
            }
        }
        for (slot, node) in self.data.nodes.iter().enumerate() {
            if node.id.0 as usize != slot {
                return fail(format!("node at slot {slot} has id {:?}", node.id));
            }
            if node.is_vacant()
                && (node.state != quotient_common::NodeState::Lost || !node.gpus.is_empty())
            {
                return fail(format!(
                    "vacant node slot {slot} is not an empty lost record"
                ));
            }
        }
        if self.data.nodes.last().is_some_and(|node| node.is_vacant()) {
            return fail("the last node slot is vacant; it should have been dropped".into());
        }
        if self.data.node_ids.len() != self.nodes().count() {
            return fail("node names and records differ in number".into());
        }
        for (key, job) in &self.data.idempotency {
            if self.job(*job).is_none() && !self.was_removed(*job) {
                return fail(format!("idempotency key {key:?} names unknown {job}"));
            }
        }
        for (_, key) in &self.data.key_expiry {
            let removed = self
                .data
                .idempotency
                .get(key)
                .is_some_and(|job| self.was_removed(*job));
            if !removed {
                return fail(format!(
                    "idempotency key {key:?} waits to expire but names no removed job"
                ));
            }
        }
        for (name, share) in &self.data.shares {
            if &share.spec.name != name {
                return fail(format!("share {name} is stored under another name"));
            }
        }
        Ok(())
    }
}

fn index_difference(rebuilt: &Index, kept: &Index) -> String {
    let part = if rebuilt.shares != kept.shares {
        "share queues or usage"
    } else if rebuilt.capacity != kept.capacity {
        "free capacity"
    } else if rebuilt.node_alloc != kept.node_alloc || rebuilt.node_jobs != kept.node_jobs {
        "node allocations"
    } else if rebuilt.nominated != kept.nominated || rebuilt.node_nominated != kept.node_nominated {
        "nominations"
    } else if rebuilt.preempting_for != kept.preempting_for
        || rebuilt.victims_hold != kept.victims_hold
    {
        "preemptions in flight"
    } else if rebuilt.reserved_idle != kept.reserved_idle {
        "reserved idle quota"
    } else {
        "draining nodes"
    };
    format!("the maintained index differs from a rebuilt one in its {part}")
}
