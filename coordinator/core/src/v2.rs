//! Version 2 of the persisted encodings (the Raft log's commands and the snapshot state), kept
//! so that this build reads what the previous one wrote (`quotient_common::version` says why
//! and how). Each type here is frozen as version 2 encoded it, field for field, and converts
//! into today's type; version 1 ([`crate::v1`]) converts into these. Nothing here is ever
//! written.
//!
//! Version 3 added jobs of several nodes: a job's `nodes` and `same` (`JobSpec`), one
//! allocation per member with its stage (`JobRecord::placement`), nominations of several nodes,
//! each attempt's nodes; and each GPU's NVLink peers (`GpuDevice`). And tenancy: a share's
//! members and per-user cap (`ShareSpec`, `ShareUpdate`), a job's owner, groups, revoked
//! certificates and the audit log (`StateData`), commands made for a caller (`Command::As`).

use std::collections::BTreeMap;

use serde::Deserialize;

use quotient_common::{
    GpuClass, GpuDevice, HostInfo, JobId, JobPayload, JobSpec, JobState, NodeInventory, NodeState,
    RetryPolicy, ShareSpec, ShareState, ShareUpdate, Signal, Strategy,
};

use crate::command::{Command, DigestAt, JobReport};
use crate::job_table::JobTable;
use crate::plan::Plan;
use crate::reason::WaitReason;
use crate::state::{
    Allocation, AttemptRecord, JobRecord, MemberStage, NodeId, NodeRecord, Preemption, ShareRecord,
    StateData, StopCause,
};

#[derive(Deserialize)]
pub struct ShareSpecV2 {
    pub(crate) name: String,
    pub(crate) limits: BTreeMap<GpuClass, u32>,
    pub(crate) strategy: Strategy,
    pub(crate) borrow_limit_percent: Option<u32>,
    pub(crate) in_share_preemption: bool,
    pub(crate) state: ShareState,
}

impl From<ShareSpecV2> for ShareSpec {
    fn from(v2: ShareSpecV2) -> ShareSpec {
        ShareSpec {
            name: v2.name,
            limits: v2.limits,
            strategy: v2.strategy,
            borrow_limit_percent: v2.borrow_limit_percent,
            in_share_preemption: v2.in_share_preemption,
            state: v2.state,
            members: Vec::new(),
            max_jobs_per_user: None,
        }
    }
}

#[derive(Deserialize)]
pub struct ShareUpdateV2 {
    pub(crate) limits: Option<BTreeMap<GpuClass, u32>>,
    pub(crate) strategy: Option<Strategy>,
    pub(crate) borrow_limit_percent: Option<Option<u32>>,
    pub(crate) in_share_preemption: Option<bool>,
    pub(crate) state: Option<ShareState>,
}

impl From<ShareUpdateV2> for ShareUpdate {
    fn from(v2: ShareUpdateV2) -> ShareUpdate {
        ShareUpdate {
            limits: v2.limits,
            strategy: v2.strategy,
            borrow_limit_percent: v2.borrow_limit_percent,
            in_share_preemption: v2.in_share_preemption,
            state: v2.state,
            ..ShareUpdate::default()
        }
    }
}

#[derive(Deserialize)]
pub struct ShareRecordV2 {
    pub(crate) spec: ShareSpecV2,
    pub(crate) created_ms: u64,
}

impl From<ShareRecordV2> for ShareRecord {
    fn from(v2: ShareRecordV2) -> ShareRecord {
        ShareRecord {
            spec: v2.spec.into(),
            created_ms: v2.created_ms,
        }
    }
}

#[derive(Deserialize)]
pub struct JobSpecV2 {
    pub(crate) name: Option<String>,
    pub(crate) share: String,
    pub(crate) priority: u32,
    pub(crate) gpus: u32,
    pub(crate) gpu_class: Option<GpuClass>,
    pub(crate) payload: JobPayload,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) checkpoint_signal: Signal,
    pub(crate) grace_period_ms: u64,
    pub(crate) max_preemptions: Option<u32>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) cpu_millis: Option<u32>,
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) time_limit_ms: Option<u64>,
    pub(crate) retry: RetryPolicy,
}

impl From<JobSpecV2> for JobSpec {
    fn from(v2: JobSpecV2) -> JobSpec {
        JobSpec {
            name: v2.name,
            share: v2.share,
            priority: v2.priority,
            gpus: v2.gpus,
            gpu_class: v2.gpu_class,
            payload: v2.payload,
            env: v2.env.into(),
            checkpoint_signal: v2.checkpoint_signal,
            grace_period_ms: v2.grace_period_ms,
            max_preemptions: v2.max_preemptions,
            idempotency_key: v2.idempotency_key,
            cpu_millis: v2.cpu_millis,
            memory_bytes: v2.memory_bytes,
            time_limit_ms: v2.time_limit_ms,
            retry: v2.retry,
            nodes: 1,
            same: None,
            owner: None,
        }
    }
}

#[derive(Deserialize)]
pub struct GpuDeviceV2 {
    pub(crate) index: u32,
    pub(crate) uuid: String,
    pub(crate) class: GpuClass,
    pub(crate) healthy: bool,
}

impl From<GpuDeviceV2> for GpuDevice {
    fn from(v2: GpuDeviceV2) -> GpuDevice {
        GpuDevice {
            index: v2.index,
            uuid: v2.uuid,
            class: v2.class,
            healthy: v2.healthy,
            nvlink_peers: 0,
        }
    }
}

#[derive(Deserialize)]
pub struct NodeInventoryV2 {
    pub(crate) name: String,
    pub(crate) gpus: Vec<GpuDeviceV2>,
    pub(crate) host: HostInfo,
}

impl From<NodeInventoryV2> for NodeInventory {
    fn from(v2: NodeInventoryV2) -> NodeInventory {
        NodeInventory {
            name: v2.name,
            gpus: v2.gpus.into_iter().map(GpuDevice::from).collect(),
            host: v2.host,
        }
    }
}

/// `Command` as version 2 encoded it: the same variants in the same order.
#[derive(Deserialize)]
pub enum CommandV2 {
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
    SubmitJob(JobSpecV2),
    UpdateJobPriority {
        job: JobId,
        priority: u32,
    },
    CancelJob {
        job: JobId,
    },
    RegisterNode(NodeInventoryV2),
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
    StopAtTimeLimit {
        job: JobId,
        attempt: u32,
    },
}

impl From<CommandV2> for Command {
    fn from(v2: CommandV2) -> Command {
        match v2 {
            CommandV2::CreateShare(spec) => Command::CreateShare(spec.into()),
            CommandV2::UpdateShare { name, update } => Command::UpdateShare {
                name,
                update: update.into(),
            },
            CommandV2::DisableShare { name } => Command::DisableShare { name },
            CommandV2::DeleteShare { name } => Command::DeleteShare { name },
            CommandV2::SubmitJob(spec) => Command::SubmitJob(spec.into()),
            CommandV2::UpdateJobPriority { job, priority } => {
                Command::UpdateJobPriority { job, priority }
            }
            CommandV2::CancelJob { job } => Command::CancelJob { job },
            CommandV2::RegisterNode(inventory) => Command::RegisterNode(inventory.into()),
            CommandV2::SetNodeState { node, state } => Command::SetNodeState { node, state },
            CommandV2::CordonNode { node } => Command::CordonNode { node },
            CommandV2::DrainNode { node } => Command::DrainNode { node },
            CommandV2::SetGpuHealth {
                node,
                index,
                healthy,
            } => Command::SetGpuHealth {
                node,
                index,
                healthy,
            },
            CommandV2::MarkNodeLost { node } => Command::MarkNodeLost { node },
            CommandV2::ApplyPlan(plan) => Command::ApplyPlan(plan),
            CommandV2::ReportJob(report) => Command::ReportJob(report),
            CommandV2::RemoveNode { node } => Command::RemoveNode { node },
            CommandV2::CheckDigest { leader } => Command::CheckDigest { leader },
            CommandV2::StopAtTimeLimit { job, attempt } => {
                Command::StopAtTimeLimit { job, attempt }
            }
        }
    }
}

#[derive(Deserialize)]
pub struct AllocationV2 {
    pub(crate) node: NodeId,
    pub(crate) gpu_mask: u64,
    pub(crate) cpu_millis: u32,
    pub(crate) memory_bytes: u64,
}

impl AllocationV2 {
    /// The allocation of a job of one node that is in `state`.
    fn into_member(self, state: JobState) -> Allocation {
        let stage = match state {
            JobState::Starting => MemberStage::Started,
            JobState::Running | JobState::Preempting => MemberStage::Running,
            _ => MemberStage::Placed,
        };
        Allocation {
            node: self.node,
            gpu_mask: self.gpu_mask,
            cpu_millis: self.cpu_millis,
            memory_bytes: self.memory_bytes,
            stage,
        }
    }
}

#[derive(Deserialize)]
pub struct AttemptRecordV2 {
    pub(crate) attempt: u32,
    pub(crate) node: String,
    pub(crate) placed_ms: u64,
    pub(crate) started_ms: Option<u64>,
    pub(crate) ended_ms: Option<u64>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) outcome: Option<String>,
}

impl From<AttemptRecordV2> for AttemptRecord {
    fn from(v2: AttemptRecordV2) -> AttemptRecord {
        AttemptRecord {
            attempt: v2.attempt,
            nodes: vec![v2.node],
            placed_ms: v2.placed_ms,
            started_ms: v2.started_ms,
            ended_ms: v2.ended_ms,
            exit_code: v2.exit_code,
            outcome: v2.outcome,
        }
    }
}

#[derive(Deserialize)]
pub struct JobRecordV2 {
    pub(crate) id: JobId,
    pub(crate) spec: JobSpecV2,
    pub(crate) state: JobState,
    pub(crate) submitted_ms: u64,
    pub(crate) attempts: u32,
    pub(crate) preemptions: u32,
    pub(crate) allocation: Option<AllocationV2>,
    pub(crate) placed_index: u64,
    pub(crate) started_ms: Option<u64>,
    pub(crate) stop: Option<StopCause>,
    pub(crate) last_preemption: Option<Preemption>,
    pub(crate) nomination: Option<NodeId>,
    pub(crate) reason: Option<WaitReason>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) ended_ms: Option<u64>,
    pub(crate) last_node: Option<String>,
    pub(crate) counted_preemptions: u32,
    pub(crate) launch_requeues: u32,
    pub(crate) retries_used: u32,
    pub(crate) first_started_ms: Option<u64>,
    pub(crate) history: Vec<AttemptRecordV2>,
}

impl From<JobRecordV2> for JobRecord {
    fn from(v2: JobRecordV2) -> JobRecord {
        let state = v2.state;
        JobRecord {
            id: v2.id,
            spec: v2.spec.into(),
            state,
            submitted_ms: v2.submitted_ms,
            attempts: v2.attempts,
            preemptions: v2.preemptions,
            placement: v2
                .allocation
                .into_iter()
                .map(|a| a.into_member(state))
                .collect(),
            placed_index: v2.placed_index,
            started_ms: v2.started_ms,
            stop: v2.stop.map(Box::new),
            last_preemption: v2.last_preemption.map(Box::new),
            nominations: v2.nomination.into_iter().collect(),
            reason: v2.reason.map(Box::new),
            exit_code: v2.exit_code,
            ended_ms: v2.ended_ms,
            last_node: v2.last_node,
            counted_preemptions: v2.counted_preemptions,
            launch_requeues: v2.launch_requeues,
            retries_used: v2.retries_used,
            first_started_ms: v2.first_started_ms,
            history: v2.history.into_iter().map(AttemptRecord::from).collect(),
        }
    }
}

#[derive(Deserialize)]
pub struct NodeRecordV2 {
    pub(crate) id: NodeId,
    pub(crate) name: String,
    pub(crate) state: NodeState,
    pub(crate) gpus: Vec<GpuDeviceV2>,
    pub(crate) incarnation: u64,
    pub(crate) host: HostInfo,
}

impl From<NodeRecordV2> for NodeRecord {
    fn from(v2: NodeRecordV2) -> NodeRecord {
        NodeRecord {
            id: v2.id,
            name: v2.name,
            state: v2.state,
            gpus: v2.gpus.into_iter().map(GpuDevice::from).collect(),
            incarnation: v2.incarnation,
            host: v2.host,
        }
    }
}

/// `StateData` as version 2 of the snapshot state encoded it.
#[derive(Deserialize)]
pub struct StateDataV2 {
    pub(crate) shares: BTreeMap<String, ShareRecordV2>,
    pub(crate) jobs: Vec<JobRecordV2>,
    pub(crate) node_ids: BTreeMap<String, NodeId>,
    pub(crate) nodes: Vec<NodeRecordV2>,
    pub(crate) idempotency: BTreeMap<String, JobId>,
    pub(crate) last_applied_index: u64,
}

impl From<StateDataV2> for StateData {
    fn from(v2: StateDataV2) -> StateData {
        let mut jobs = JobTable::new();
        for job in v2.jobs {
            jobs.push(job.into());
        }
        StateData {
            shares: v2
                .shares
                .into_iter()
                .map(|(name, share)| (name, share.into()))
                .collect(),
            jobs,
            node_ids: v2.node_ids,
            nodes: v2.nodes.into_iter().map(NodeRecord::from).collect(),
            idempotency: v2.idempotency.into_iter().collect(),
            last_applied_index: v2.last_applied_index,
            ..StateData::default()
        }
    }
}
