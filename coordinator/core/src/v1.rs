//! Version 1 of the persisted encodings (the Raft log's commands and the snapshot state), kept
//! so that this build reads what the previous ones wrote (`quotient_common::version` says why
//! and how). Each type here is frozen as version 1 encoded it, field for field, and converts
//! into version 2's ([`crate::v2`]), which converts into today's. Nothing here is ever
//! written.
//!
//! Version 2 added: a job's CPUs, memory, time limit and retry strategy (`JobSpec`); what a
//! node can run (`NodeInventory::host`, `NodeRecord::host`); the CPUs and memory an
//! allocation sets aside; and a job's attempt history and counters (`JobRecord`).

use std::collections::BTreeMap;

use serde::Deserialize;

use quotient_common::{
    GpuClass, HostInfo, JobId, JobPayload, JobSpec, JobState, NodeInventory, NodeState,
    RetryPolicy, Signal,
};

use crate::command::{Command, DigestAt, JobReport};
use crate::job_table::JobTable;
use crate::plan::Plan;
use crate::reason::WaitReason;
use crate::state::{NodeId, Preemption, StateData, StopCause};
use crate::v2::{
    AllocationV2, AttemptRecordV2, GpuDeviceV2, JobRecordV2, JobSpecV2, NodeInventoryV2,
    NodeRecordV2, ShareRecordV2, ShareSpecV2, ShareUpdateV2,
};

#[derive(Deserialize)]
pub struct JobSpecV1 {
    name: Option<String>,
    share: String,
    priority: u32,
    gpus: u32,
    gpu_class: Option<GpuClass>,
    payload: JobPayload,
    env: BTreeMap<String, String>,
    checkpoint_signal: Signal,
    grace_period_ms: u64,
    max_preemptions: Option<u32>,
    idempotency_key: Option<String>,
}

impl From<JobSpecV1> for JobSpec {
    fn from(v1: JobSpecV1) -> JobSpec {
        JobSpecV2::from(v1).into()
    }
}

impl From<JobSpecV1> for JobSpecV2 {
    fn from(v1: JobSpecV1) -> JobSpecV2 {
        JobSpecV2 {
            name: v1.name,
            share: v1.share,
            priority: v1.priority,
            gpus: v1.gpus,
            gpu_class: v1.gpu_class,
            payload: v1.payload,
            env: v1.env,
            checkpoint_signal: v1.checkpoint_signal,
            grace_period_ms: v1.grace_period_ms,
            max_preemptions: v1.max_preemptions,
            idempotency_key: v1.idempotency_key,
            cpu_millis: None,
            memory_bytes: None,
            time_limit_ms: None,
            retry: RetryPolicy::default(),
        }
    }
}

#[derive(Deserialize)]
pub struct NodeInventoryV1 {
    name: String,
    gpus: Vec<GpuDeviceV2>,
}

impl From<NodeInventoryV1> for NodeInventory {
    fn from(v1: NodeInventoryV1) -> NodeInventory {
        NodeInventoryV2 {
            name: v1.name,
            gpus: v1.gpus,
            host: HostInfo::process_only(),
        }
        .into()
    }
}

/// `Command` as version 1 encoded it: the same variants in the same order.
#[derive(Deserialize)]
pub enum CommandV1 {
    CreateShare(ShareSpecV2),
    UpdateShare {
        name: String,
        update: ShareUpdateV2,
    },
    DisableShare {
        name: String,
    },
    DeleteShare {
        name: String,
    },
    SubmitJob(JobSpecV1),
    UpdateJobPriority {
        job: JobId,
        priority: u32,
    },
    CancelJob {
        job: JobId,
    },
    RegisterNode(NodeInventoryV1),
    SetNodeState {
        node: String,
        state: NodeState,
    },
    CordonNode {
        node: String,
    },
    DrainNode {
        node: String,
    },
    SetGpuHealth {
        node: String,
        index: u32,
        healthy: bool,
    },
    MarkNodeLost {
        node: String,
    },
    ApplyPlan(Plan),
    ReportJob(JobReport),
    RemoveNode {
        node: String,
    },
    CheckDigest {
        leader: Option<DigestAt>,
    },
}

impl From<CommandV1> for Command {
    fn from(v1: CommandV1) -> Command {
        match v1 {
            CommandV1::CreateShare(spec) => Command::CreateShare(spec.into()),
            CommandV1::UpdateShare { name, update } => Command::UpdateShare {
                name,
                update: update.into(),
            },
            CommandV1::DisableShare { name } => Command::DisableShare { name },
            CommandV1::DeleteShare { name } => Command::DeleteShare { name },
            CommandV1::SubmitJob(spec) => Command::SubmitJob(spec.into()),
            CommandV1::UpdateJobPriority { job, priority } => {
                Command::UpdateJobPriority { job, priority }
            }
            CommandV1::CancelJob { job } => Command::CancelJob { job },
            CommandV1::RegisterNode(inventory) => Command::RegisterNode(inventory.into()),
            CommandV1::SetNodeState { node, state } => Command::SetNodeState { node, state },
            CommandV1::CordonNode { node } => Command::CordonNode { node },
            CommandV1::DrainNode { node } => Command::DrainNode { node },
            CommandV1::SetGpuHealth {
                node,
                index,
                healthy,
            } => Command::SetGpuHealth {
                node,
                index,
                healthy,
            },
            CommandV1::MarkNodeLost { node } => Command::MarkNodeLost { node },
            CommandV1::ApplyPlan(plan) => Command::ApplyPlan(plan),
            CommandV1::ReportJob(report) => Command::ReportJob(report),
            CommandV1::RemoveNode { node } => Command::RemoveNode { node },
            CommandV1::CheckDigest { leader } => Command::CheckDigest { leader },
        }
    }
}

#[derive(Deserialize)]
struct AllocationV1 {
    node: NodeId,
    gpu_mask: u64,
}

impl From<AllocationV1> for AllocationV2 {
    fn from(v1: AllocationV1) -> AllocationV2 {
        AllocationV2 {
            node: v1.node,
            gpu_mask: v1.gpu_mask,
            cpu_millis: 0,
            memory_bytes: 0,
        }
    }
}

#[derive(Deserialize)]
struct JobRecordV1 {
    id: JobId,
    spec: JobSpecV1,
    state: JobState,
    submitted_ms: u64,
    attempts: u32,
    preemptions: u32,
    allocation: Option<AllocationV1>,
    placed_index: u64,
    started_ms: Option<u64>,
    stop: Option<StopCause>,
    last_preemption: Option<Preemption>,
    nomination: Option<NodeId>,
    reason: Option<WaitReason>,
    exit_code: Option<i32>,
    ended_ms: Option<u64>,
    last_node: Option<String>,
}

impl From<JobRecordV1> for JobRecordV2 {
    fn from(v1: JobRecordV1) -> JobRecordV2 {
        // Version 1 counted every preemption toward max_preemptions and derived the launch
        // requeues: every ended attempt of a live job that was not a preemption.
        let current = u32::from(v1.state.holds_gpus());
        let launch_requeues = if v1.state.is_terminal() {
            0
        } else {
            v1.attempts
                .saturating_sub(v1.preemptions)
                .saturating_sub(current)
        };
        // Only the current attempt of a job holding GPUs is known well enough to record.
        let history = match (&v1.allocation, &v1.last_node) {
            (Some(_), Some(node)) => vec![AttemptRecordV2 {
                attempt: v1.attempts,
                node: node.clone(),
                placed_ms: v1.started_ms.unwrap_or(v1.submitted_ms),
                started_ms: v1.started_ms,
                ended_ms: None,
                exit_code: None,
                outcome: None,
            }],
            _ => Vec::new(),
        };
        JobRecordV2 {
            id: v1.id,
            spec: v1.spec.into(),
            state: v1.state,
            submitted_ms: v1.submitted_ms,
            attempts: v1.attempts,
            preemptions: v1.preemptions,
            allocation: v1.allocation.map(AllocationV2::from),
            placed_index: v1.placed_index,
            started_ms: v1.started_ms,
            stop: v1.stop,
            last_preemption: v1.last_preemption,
            nomination: v1.nomination,
            reason: v1.reason,
            exit_code: v1.exit_code,
            ended_ms: v1.ended_ms,
            last_node: v1.last_node,
            counted_preemptions: v1.preemptions,
            launch_requeues,
            retries_used: 0,
            first_started_ms: v1.started_ms,
            history,
        }
    }
}

#[derive(Deserialize)]
struct NodeRecordV1 {
    id: NodeId,
    name: String,
    state: NodeState,
    gpus: Vec<GpuDeviceV2>,
    incarnation: u64,
}

impl From<NodeRecordV1> for NodeRecordV2 {
    fn from(v1: NodeRecordV1) -> NodeRecordV2 {
        let host = if v1.name.is_empty() {
            HostInfo::default()
        } else {
            HostInfo::process_only()
        };
        NodeRecordV2 {
            id: v1.id,
            name: v1.name,
            state: v1.state,
            gpus: v1.gpus,
            incarnation: v1.incarnation,
            host,
        }
    }
}

/// `StateData` as version 1 of the snapshot state encoded it.
#[derive(Deserialize)]
pub struct StateDataV1 {
    shares: BTreeMap<String, ShareRecordV2>,
    jobs: Vec<JobRecordV1>,
    node_ids: BTreeMap<String, NodeId>,
    nodes: Vec<NodeRecordV1>,
    idempotency: BTreeMap<String, JobId>,
    last_applied_index: u64,
}

impl From<StateDataV1> for StateData {
    fn from(v1: StateDataV1) -> StateData {
        let mut jobs = JobTable::new();
        for job in v1.jobs {
            jobs.push(JobRecordV2::from(job).into());
        }
        StateData {
            shares: v1
                .shares
                .into_iter()
                .map(|(name, share)| (name, share.into()))
                .collect(),
            jobs,
            node_ids: v1.node_ids,
            nodes: v1
                .nodes
                .into_iter()
                .map(|node| NodeRecordV2::from(node).into())
                .collect(),
            idempotency: v1.idempotency.into_iter().collect(),
            last_applied_index: v1.last_applied_index,
            ..StateData::default()
        }
    }
}
