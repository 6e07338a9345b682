//! The replicated state: shares, jobs and nodes, plus the indexes derived from them.
//!
//! [`State`] is two halves. The canonical half (`StateData`) is what a snapshot holds and what
//! every replica agrees on byte for byte. The derived half ([`crate::index::Index`]) holds the
//! queues, usage counters and free-capacity buckets that make a scheduling round cheap; it is
//! rebuilt from the canonical half after a snapshot is loaded and kept in step by `apply`.
//! Every map is a `BTreeMap` or a `Vec`, so iteration order never depends on a hash seed.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thin_vec::ThinVec;

use quotient_common::{
    GpuClass, GpuDevice, HostInfo, JobId, JobSpec, JobState, NodeState, ShareSpec,
};

use crate::changes::Changes;
use crate::command::JobEvent;
use crate::index::Index;
use crate::job_table::JobTable;
use crate::limits::QUEUE_HEAD_SCAN_MAX;
use crate::reason::WaitReason;

/// A node's id: its slot in `StateData::nodes`, stable across re-registrations. A removed
/// node's slot stays vacant until a new node takes it, so ids stay dense and the slots do not
/// grow with nodes that come and go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

/// What one member of a job holds: one node, a bit mask of GPU indices on it, and the CPUs and
/// memory set aside for it there (0 where the node does not report them); and how far that
/// member has come in the current attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub node: NodeId,
    pub gpu_mask: u64,
    /// CPUs in thousandths: the job's `cpu_millis`, or its share of the node's by GPUs.
    pub cpu_millis: u32,
    /// Memory in bytes: the job's `memory_bytes`, or its share of the node's by GPUs.
    pub memory_bytes: u64,
    pub stage: MemberStage,
}

/// How far one member of a job's current attempt has come, as its agent reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberStage {
    /// Placed; its agent has not reported it yet.
    Placed,
    /// Its agent is launching it.
    Started,
    Running,
    /// It has exited (`None`: it never ran, or its node was lost). Its GPUs stay held until
    /// every member of the job has exited.
    Exited {
        code: Option<i32>,
    },
}

impl MemberStage {
    pub fn exited(self) -> bool {
        matches!(self, MemberStage::Exited { .. })
    }
}

impl Allocation {
    pub fn gpu_indices(&self) -> Vec<u32> {
        mask_indices(self.gpu_mask)
    }
}

/// The indices of the set bits of a mask, lowest first.
pub fn mask_indices(mask: u64) -> Vec<u32> {
    (0..64).filter(|i| mask & (1u64 << i) != 0).collect()
}

/// Why a job was asked to stop, recorded while it is PREEMPTING.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopCause {
    /// Preempted; it goes back to the queue when it exits (or FAILED past max_preemptions).
    Preempted(Preemption),
    /// Cancelled by a user or by its share's deletion; it ends CANCELLED when it exits.
    Cancelled,
    /// Its attempt reached the job's time limit; a failure (retried by its retry strategy).
    TimeLimit,
    /// One member of a job of several nodes ended the attempt (it exited non-zero, could not
    /// launch, or its agent stopped it): the others are stopped, and when all have exited the
    /// job goes on as a job of one node would after `event`.
    MemberEnded {
        rank: u32,
        node: String,
        event: JobEvent,
    },
}

/// Why a job was preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PreemptionKind {
    /// Cross-share: its share was borrowing and a lender took its quota back.
    Reclaim,
    /// In-share: a higher-priority job of the same share needed the GPUs.
    InShare,
    /// Its node is being drained.
    Drain,
    /// Its node was lost; it was requeued without a signal.
    NodeLost,
    /// Its agent stopped it on its own (lease expired, GPU failed).
    AgentStopped,
    /// A job of several nodes whose members did not all report running within the start
    /// timeout: the attempt is stopped so that no gang is left half-running.
    StartTimeout,
}

impl PreemptionKind {
    /// Whether a preemption of this kind counts toward the job's `max_preemptions`: only the
    /// scheduling rules' own (reclaim, in-share), as AWS Batch's
    /// `preemptionRetriesBeforeTermination`. A drain, a lost node or an agent that stopped
    /// its jobs is the fleet's doing, not the rules', and requeues the job without counting.
    pub fn counts_toward_max(self) -> bool {
        matches!(self, PreemptionKind::Reclaim | PreemptionKind::InShare)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PreemptionKind::Reclaim => "reclaim",
            PreemptionKind::InShare => "in-share",
            PreemptionKind::Drain => "node-drain",
            PreemptionKind::NodeLost => "node-lost",
            PreemptionKind::AgentStopped => "agent-stopped",
            PreemptionKind::StartTimeout => "start-timeout",
        }
    }
}

/// One preemption of a job: who, when, why, for which job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    pub kind: PreemptionKind,
    /// The job the GPUs were freed for, if any.
    pub for_job: Option<JobId>,
    /// The share of that job.
    pub for_share: Option<String>,
    pub at_ms: u64,
    pub node: String,
}

/// A share as the state machine keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareRecord {
    pub spec: ShareSpec,
    pub created_ms: u64,
}

/// The most attempts a job record keeps (the latest; `attempts` still counts them all).
pub const ATTEMPT_HISTORY_MAX: usize = 32;

/// One attempt of a job: where and when it ran and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// QUOTIENT_ATTEMPT of the attempt, from 1.
    pub attempt: u32,
    /// Its nodes, in rank order (one for a job of one node).
    pub nodes: Vec<String>,
    pub placed_ms: u64,
    /// When it was seen running; `None` if it never ran.
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// How it ended, in words (`exited with code 1`, `preempted (reclaim) for j-4`,
    /// `time limit`, `launch failed ...`); `None` while it is the current attempt.
    pub outcome: Option<String>,
}

impl AttemptRecord {
    /// Rank 0's node.
    pub fn node(&self) -> &str {
        self.nodes.first().map_or("", String::as_str)
    }
}

/// A job as the state machine keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    /// The spec, with `gpu_class` always filled in.
    pub spec: JobSpec,
    pub state: JobState,
    pub submitted_ms: u64,
    /// How many times it was placed (QUOTIENT_ATTEMPT of the current or last attempt).
    pub attempts: u32,
    /// Attempts that ended in a preemption, of any kind.
    pub preemptions: u32,
    /// What it holds, one allocation per member in rank order, each on its own node; empty
    /// while it holds nothing. All or none: a job is placed, and frees its GPUs, as a unit.
    pub placement: ThinVec<Allocation>,
    /// The log index of its current placement: the "start order" of spec rule 2.
    pub placed_index: u64,
    pub started_ms: Option<u64>,
    /// Why it is stopping, while PREEMPTING. Boxed, as the next field: most jobs never have
    /// one, and a job record is kept per job for as long as retention says.
    pub stop: Option<Box<StopCause>>,
    pub last_preemption: Option<Box<Preemption>>,
    /// The nodes that keep GPUs free for this job (one per member, or none).
    pub nominations: ThinVec<NodeId>,
    /// Why it waits (RUNNABLE) or why it ended (terminal).
    pub reason: Option<Box<WaitReason>>,
    pub exit_code: Option<i32>,
    pub ended_ms: Option<u64>,
    /// The name of the node of its current or last placement (kept after the attempt ends,
    /// so that its logs can be found on that node's agent).
    pub last_node: Option<String>,
    /// Preemptions that count toward `max_preemptions`
    /// ([`PreemptionKind::counts_toward_max`]).
    pub counted_preemptions: u32,
    /// Times it went back to the queue because a node could not launch it.
    pub launch_requeues: u32,
    /// Failed attempts retried by its retry strategy.
    pub retries_used: u32,
    /// When it first ran: the end of its wait in the queue.
    pub first_started_ms: Option<u64>,
    /// Its latest attempts, oldest first, at most [`ATTEMPT_HISTORY_MAX`].
    pub history: ThinVec<AttemptRecord>,
}

impl JobRecord {
    /// A job just submitted: RUNNABLE, never placed. `spec` has its class filled in.
    pub fn new(id: JobId, spec: JobSpec, submitted_ms: u64) -> JobRecord {
        JobRecord {
            id,
            spec,
            state: JobState::Runnable,
            submitted_ms,
            attempts: 0,
            preemptions: 0,
            placement: ThinVec::new(),
            placed_index: 0,
            started_ms: None,
            stop: None,
            last_preemption: None,
            nominations: ThinVec::new(),
            reason: None,
            exit_code: None,
            ended_ms: None,
            last_node: None,
            counted_preemptions: 0,
            launch_requeues: 0,
            retries_used: 0,
            first_started_ms: None,
            history: ThinVec::new(),
        }
    }

    /// The time to record for something that happens to this job now: the leader's clock
    /// (`ApplyCtx::time_ms`), but never before what the job already records. After a failover
    /// the new leader's clock may be behind the old one's, and a job must not end before it
    /// started. Derived from the replicated state alone, so every replica records the same.
    pub fn stamp(&self, time_ms: u64) -> u64 {
        time_ms
            .max(self.submitted_ms)
            .max(self.started_ms.unwrap_or(0))
    }

    /// How long it waited in the queue before it first ran, or has waited so far (`now_ms`)
    /// if it never ran and has not ended.
    pub fn waited_ms(&self, now_ms: u64) -> u64 {
        let until = self
            .first_started_ms
            .or(self.ended_ms)
            .unwrap_or(now_ms.max(self.submitted_ms));
        until.saturating_sub(self.submitted_ms)
    }

    /// The record of its current or last attempt.
    pub fn current_attempt_mut(&mut self) -> Option<&mut AttemptRecord> {
        let attempt = self.attempts;
        self.history
            .last_mut()
            .filter(|record| record.attempt == attempt)
    }

    pub fn class(&self) -> &GpuClass {
        self.spec
            .gpu_class
            .as_ref()
            .expect("a stored job always has its class filled in")
    }
    /// GPUs on each of its nodes.
    pub fn gpus(&self) -> u32 {
        self.spec.gpus
    }
    /// How many nodes it runs on.
    pub fn node_count(&self) -> u32 {
        self.spec.nodes.max(1)
    }
    /// GPUs on all of its nodes: what it counts against its share.
    pub fn total_gpus(&self) -> u32 {
        self.spec.total_gpus()
    }
    /// Whether it runs on several nodes.
    pub fn is_gang(&self) -> bool {
        self.spec.nodes > 1
    }
    /// Rank 0's allocation, while it holds GPUs.
    pub fn allocation(&self) -> Option<&Allocation> {
        self.placement.first()
    }
    /// The member on `node`, with its rank.
    pub fn member_on(&self, node: NodeId) -> Option<(u32, &Allocation)> {
        self.placement
            .iter()
            .enumerate()
            .find(|(_, a)| a.node == node)
            .map(|(rank, a)| (rank as u32, a))
    }
    pub fn priority(&self) -> u32 {
        self.spec.priority
    }
}

/// A node as the state machine keeps it. A vacant slot (a removed node's, see
/// [`NodeRecord::is_vacant`]) has an empty name, no GPUs and the state `Lost`, so it is never
/// schedulable; `State::node` and `State::nodes` pass over it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: NodeId,
    pub name: String,
    pub state: NodeState,
    pub gpus: Vec<GpuDevice>,
    /// Bumped whenever the node (re-)registers or is lost: which life of the node this is.
    pub incarnation: u64,
    /// Its runtimes, images, CPUs and memory, as it last registered them.
    pub host: HostInfo,
}

impl NodeRecord {
    /// The slot of a removed node that no node has taken since. A node name is never empty
    /// (`validate_name`), so the empty name marks it without a field of its own, and snapshots
    /// written before nodes could be removed still decode.
    pub fn is_vacant(&self) -> bool {
        self.name.is_empty()
    }

    /// A vacant slot with `id`, keeping `incarnation` so that the node taking it next continues it.
    pub(crate) fn vacant(id: NodeId, incarnation: u64) -> NodeRecord {
        NodeRecord {
            id,
            name: String::new(),
            state: NodeState::Lost,
            gpus: Vec::new(),
            incarnation,
            host: HostInfo::default(),
        }
    }

    /// The mask of healthy GPUs of `class`.
    pub fn healthy_mask(&self, class: &GpuClass) -> u64 {
        self.gpus
            .iter()
            .filter(|g| g.healthy && &g.class == class)
            .fold(0u64, |mask, g| mask | (1u64 << g.index))
    }
}

/// Idempotency keys and the jobs they made, in key order.
pub type IdempotencyKeys = imbl::OrdMap<String, JobId>;

/// The canonical, replicated half of the state: what a snapshot holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateData {
    pub shares: BTreeMap<String, ShareRecord>,
    /// Indexed by `JobId.0 - 1`; a finished job removed by retention leaves its slot vacant
    /// for good, so ids are never reused.
    pub jobs: JobTable,
    pub node_ids: BTreeMap<String, NodeId>,
    /// Indexed by `NodeId.0`; a removed node leaves a vacant slot ([`NodeRecord::is_vacant`])
    /// that the next new node takes, and vacant slots at the end are dropped.
    pub nodes: Vec<NodeRecord>,
    /// The job each idempotency key made. A persistent map, so that a snapshot takes it
    /// without copying it under the state's lock; it encodes exactly as a `BTreeMap`.
    #[serde(deserialize_with = "deserialize_idempotency")]
    pub idempotency: IdempotencyKeys,
    /// The index of the last applied command.
    pub last_applied_index: u64,
    /// Groups of users an admin declared (`quotient group create`), by name: what a share's
    /// `group:NAME` member stands for.
    pub groups: BTreeMap<String, BTreeSet<String>>,
    /// Revoked certificates, by identity (`quotient://ROLE/NAME`): refused by every
    /// coordinator from the entry that revoked them on.
    pub revoked: BTreeMap<String, Revocation>,
    /// Who did what: every admin action and every refusal for lack of rights, oldest first,
    /// at most [`AUDIT_ENTRIES_MAX`]. A persistent vector, so that a snapshot takes it without
    /// copying it under the state's lock; it encodes exactly as a `Vec`.
    #[serde(deserialize_with = "deserialize_audit")]
    pub audit: imbl::Vector<AuditEntry>,
    /// The idempotency keys of jobs removed by retention, by when they were removed: each
    /// still names its removed job (in `idempotency`) until the key window is over
    /// (`crate::retention`). A persistent set, like the keys.
    #[serde(deserialize_with = "deserialize_key_expiry")]
    pub key_expiry: imbl::OrdSet<(u64, String)>,
    /// GPU time per hour, share and class (`crate::usage`). A persistent map, like the keys.
    #[serde(deserialize_with = "deserialize_usage")]
    pub usage: imbl::OrdMap<u64, crate::usage::UsageHour>,
    /// The time of the last command that advanced `usage`.
    pub usage_clock_ms: u64,
    /// What happened lately, oldest first, at most [`crate::events::EVENTS_MAX`]
    /// (`crate::events`). A persistent vector, like the audit log.
    #[serde(deserialize_with = "deserialize_events")]
    pub events: imbl::Vector<quotient_common::event::Event>,
    /// How many events were ever made: the number of the newest.
    pub events_issued: u64,
    /// The AWS endpoint's access keys, objects and service jobs (`crate::aws`).
    pub aws: crate::aws::AwsState,
    /// The clients' write sessions (`crate::sessions`).
    pub sessions: crate::sessions::Sessions,
    /// When each job that holds GPUs last checkpointed, as far as the coordinators know: the
    /// leader's time of the entry that brought its agent's `Checkpointed` report. Dropped when
    /// the job ends. Kept beside the jobs rather than in their records so that a job's record
    /// does not change, nor its views wake up, at every checkpoint.
    pub checkpoints: BTreeMap<JobId, u64>,
    /// The leader's time of the last applied entry (never going back): what the scheduler
    /// counts a running job's work at risk up to (`crate::scheduler`), so that a round stays
    /// a function of the state alone.
    pub clock_ms: u64,
}

/// The events read as a `Vec` (the same encoding), then made persistent: see
/// [`deserialize_idempotency`].
fn deserialize_events<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<imbl::Vector<quotient_common::event::Event>, D::Error> {
    let events = Vec::<quotient_common::event::Event>::deserialize(deserializer)?;
    Ok(events.into_iter().collect())
}

/// The usage buckets read as a `BTreeMap` (the same encoding), then made persistent: see
/// [`deserialize_idempotency`].
fn deserialize_usage<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<imbl::OrdMap<u64, crate::usage::UsageHour>, D::Error> {
    let hours = BTreeMap::<u64, crate::usage::UsageHour>::deserialize(deserializer)?;
    Ok(hours.into_iter().collect())
}

/// The keys waiting to expire read as a `BTreeSet` (the same encoding), then made
/// persistent: see [`deserialize_idempotency`].
fn deserialize_key_expiry<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<imbl::OrdSet<(u64, String)>, D::Error> {
    let keys = BTreeSet::<(u64, String)>::deserialize(deserializer)?;
    Ok(keys.into_iter().collect())
}

/// The idempotency keys read as a `BTreeMap` (the same encoding), then made persistent:
/// imbl's own decoding reserves room for as many entries as the input claims, before reading
/// them, so a few bytes claiming 2^53 keys aborted the process (found by the snapshot_state
/// fuzz target). serde's maps and lists reserve no more than a small bound.
fn deserialize_idempotency<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<IdempotencyKeys, D::Error> {
    let keys = BTreeMap::<String, JobId>::deserialize(deserializer)?;
    Ok(keys.into_iter().collect())
}

/// The audit log read as a `Vec` (the same encoding), then made persistent: see
/// [`deserialize_idempotency`].
fn deserialize_audit<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<imbl::Vector<AuditEntry>, D::Error> {
    let entries = Vec::<AuditEntry>::deserialize(deserializer)?;
    Ok(entries.into_iter().collect())
}

/// The most entries the audit log keeps; the oldest go first.
pub const AUDIT_ENTRIES_MAX: usize = 20_000;

/// The revoked certificates of one name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// The revoked serial numbers (lowercase hex, without colons or leading zeros); empty:
    /// every certificate of the name.
    pub serials: BTreeSet<String>,
    /// When the last of them was revoked.
    pub at_ms: u64,
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The log index of the command that recorded it.
    pub index: u64,
    pub at_ms: u64,
    /// Who: the caller's identity (`quotient://admin/alice`).
    pub who: String,
    /// What, in words (`share update qs1`, `job cancel j-4`).
    pub action: String,
    /// `ok`, or why it was refused.
    pub outcome: String,
}

/// The replicated state machine's state. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub(crate) data: StateData,
    pub(crate) index: Index,
    /// While `apply_noting` runs: what it has changed so far (`None` otherwise, and then
    /// nothing is noted).
    pub(crate) changes: Option<Changes>,
    /// The usage rates since the last command that may have changed them (`crate::usage`);
    /// `None` until computed again. Derived: never encoded.
    pub(crate) rates: Option<BTreeMap<(String, GpuClass), crate::usage::Rates>>,
    /// The jobs that ended since the last [`State::take_finished`], while someone collects
    /// them ([`State::collect_finished`]): the coordinator writes their history records.
    pub(crate) finished: Option<Vec<JobId>>,
    /// While a command of a caller (`Command::As`) applies: the caller's name, which the
    /// events it makes record as `by`.
    pub(crate) acting: Option<String>,
    /// The leader's time of the command being applied, which the events it makes carry.
    pub(crate) applying_ms: u64,
}

impl State {
    pub fn new() -> State {
        State::default()
    }

    /// From now on, notes every job that ends, for [`State::take_finished`].
    pub fn collect_finished(&mut self) {
        self.finished.get_or_insert_with(Vec::new);
    }

    /// The jobs that ended since the last call, in the order they ended.
    pub fn take_finished(&mut self) -> Vec<JobId> {
        self.finished
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn data(&self) -> &StateData {
        &self.data
    }

    pub fn share(&self, name: &str) -> Option<&ShareRecord> {
        self.data.shares.get(name)
    }

    pub fn shares(&self) -> impl Iterator<Item = &ShareRecord> {
        self.data.shares.values()
    }

    /// The job a submit with idempotency key `key` made, while the key is kept (the job may
    /// since have left the live state).
    pub fn idempotent_job(&self, key: &str) -> Option<JobId> {
        self.data.idempotency.get(key).copied()
    }

    pub fn job(&self, id: JobId) -> Option<&JobRecord> {
        let slot = id.0.checked_sub(1)?;
        self.data.jobs.get(usize::try_from(slot).ok()?)
    }

    /// Why a job is where it is. For a RUNNABLE job that can never fit (it asks for more GPUs
    /// than the largest node of its class has, or than its share could ever hold), the limit it
    /// exceeds, derived from the state now: the scheduler passes over such jobs without
    /// recording anything. Otherwise the reason the scheduler or the job's end recorded.
    pub fn reason(&self, job: &JobRecord) -> Option<WaitReason> {
        self.never_fits(job)
            .or_else(|| job.reason.as_deref().cloned())
    }

    /// For a RUNNABLE job that can never fit as things stand, the limit it exceeds.
    pub fn never_fits(&self, job: &JobRecord) -> Option<WaitReason> {
        if job.state != JobState::Runnable {
            return None;
        }
        let share = self.share(&job.spec.share)?;
        let empty = BTreeMap::new();
        let node_sizes = self
            .index
            .capacity
            .get(job.class())
            .map_or(&empty, |c| &c.node_sizes);
        let size = crate::index::JobSize {
            gpus: job.gpus(),
            nodes: job.node_count(),
        };
        crate::rules::never_fits(&share.spec, job.class(), size, node_sizes)
    }

    pub(crate) fn job_mut(&mut self, id: JobId) -> Option<&mut JobRecord> {
        let slot = id.0.checked_sub(1)?;
        self.data.jobs.get_mut(usize::try_from(slot).ok()?)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &JobRecord> {
        self.data.jobs.iter()
    }

    /// The jobs with ids below `before` (all: `None`), newest first.
    pub fn jobs_newest_first(&self, before: Option<JobId>) -> impl Iterator<Item = &JobRecord> {
        let slot = before.map_or(usize::MAX, |id| {
            usize::try_from(id.0.saturating_sub(1)).unwrap_or(usize::MAX)
        });
        self.data.jobs.iter_before(slot)
    }

    /// The node with `id`; `None` for an unknown id or a vacant slot.
    pub fn node(&self, id: NodeId) -> Option<&NodeRecord> {
        self.data
            .nodes
            .get(id.0 as usize)
            .filter(|node| !node.is_vacant())
    }

    pub fn node_by_name(&self, name: &str) -> Option<&NodeRecord> {
        self.data.node_ids.get(name).and_then(|id| self.node(*id))
    }

    /// Every node, in id order; vacant slots are passed over.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.data.nodes.iter().filter(|node| !node.is_vacant())
    }

    /// How many nodes there are (vacant slots not counted).
    pub fn node_count(&self) -> usize {
        self.data.node_ids.len()
    }

    /// GPUs of `class` that `share` holds (SCHEDULED, STARTING, RUNNING, PREEMPTING).
    pub fn usage(&self, share: &str, class: &GpuClass) -> u64 {
        self.index.usage(share, class)
    }

    /// The CPUs (thousandths) and memory (bytes) the jobs on `node` hold.
    pub fn node_resources_used(&self, node: NodeId) -> (u64, u64) {
        self.index.node_resources_used(node)
    }

    /// The job holding each GPU of a node, by GPU index.
    pub fn gpu_holders(&self, node: NodeId) -> BTreeMap<u32, JobId> {
        let mut holders = BTreeMap::new();
        for job in self.index.jobs_on_node(node) {
            if let Some((_, alloc)) = self.job(job).and_then(|j| j.member_on(node)) {
                for gpu in alloc.gpu_indices() {
                    holders.insert(gpu, job);
                }
            }
        }
        holders
    }

    /// Every job holding GPUs (SCHEDULED, STARTING, RUNNING, PREEMPTING), by the node of its
    /// rank 0, each once.
    pub fn jobs_holding_gpus(&self) -> impl Iterator<Item = &JobRecord> {
        self.index.node_jobs.iter().flat_map(move |(node, jobs)| {
            jobs.iter()
                .filter_map(|id| self.job(*id))
                .filter(move |job| job.allocation().is_some_and(|a| a.node == *node))
        })
    }

    /// The jobs whose GPUs are on `node`.
    pub fn jobs_on_node(&self, node: NodeId) -> Vec<JobId> {
        self.index.jobs_on_node(node).collect()
    }

    /// The last checkpoint the coordinators know of in `job`'s current attempt: its
    /// checkpoint time when it is not before the attempt started running. The work a
    /// preemption would cost the job runs from there, or from its start when there is none.
    pub fn checkpoint_in_attempt(&self, job: &JobRecord) -> Option<u64> {
        let started = job.started_ms?;
        self.data
            .checkpoints
            .get(&job.id)
            .copied()
            .filter(|at| *at >= started)
    }

    /// The first job of `share`'s queue of `class`, without collecting the queue.
    pub fn queue_head(&self, share: &str, class: &GpuClass) -> Option<JobId> {
        self.index.queue(share, class).next()
    }

    /// The RUNNABLE jobs of a share and class, in queue order (priority desc, submit asc).
    pub fn queue(&self, share: &str, class: &GpuClass) -> Vec<JobId> {
        self.index.queue(share, class).collect()
    }

    /// The head of a share's queue of a class: its first job that can fit, among its first
    /// [`QUEUE_HEAD_SCAN_MAX`]. The scheduler passes over jobs that can never fit, so nothing
    /// waits behind them. `None` when none of those can fit.
    pub fn queue_head_that_fits(&self, share: &str, class: &GpuClass) -> Option<JobId> {
        self.index
            .queue(share, class)
            .take(QUEUE_HEAD_SCAN_MAX)
            .find(|id| {
                self.job(*id)
                    .is_some_and(|queued| self.never_fits(queued).is_none())
            })
    }

    /// The jobs of a share and class holding GPUs, in rank order (priority desc, start asc).
    pub fn holding(&self, share: &str, class: &GpuClass) -> Vec<JobId> {
        self.index.holding(share, class).collect()
    }
}

impl State {
    /// GPUs of a class free for new placements (not held, not nominated), on schedulable nodes.
    pub fn index_available(&self, class: &GpuClass) -> u64 {
        self.index
            .capacity
            .get(class)
            .map_or(0, |c| c.available_total)
    }

    /// The idle quota of `reserve` shares for a class.
    pub fn index_reserved(&self, class: &GpuClass) -> u64 {
        self.index.reserved_idle(class)
    }
}

/// Why jobs wait, as `job list`, `job get` and `explain` say it: a job's own reason
/// ([`State::reason`]), or, for a RUNNABLE job that waits behind its queue's head and has no
/// reason of its own or one about the queue (given when it was the head),
/// [`WaitReason::QueuedBehind`] that head (the scheduler records a reason only for the heads
/// it looked at). Remembers each queue's head, so a page of jobs looks up each queue once.
#[derive(Debug, Default)]
pub struct WaitReasons<'s> {
    heads: BTreeMap<(&'s str, &'s GpuClass), Option<JobId>>,
}

impl<'s> WaitReasons<'s> {
    /// Why `job` waits or how it ended; `None` when there is nothing to say.
    pub fn of(&mut self, state: &'s State, job: &'s JobRecord) -> Option<WaitReason> {
        let reason = state.reason(job);
        // A reason about the queue's place (its limit, free capacity) was given to the job as
        // its queue's head; once another job heads the queue, the job waits behind that one.
        // Reasons about the job itself (GPUs freed or nodes held for it, a failed launch, one
        // it can never fit) stay.
        let about_the_queue = matches!(
            reason,
            None | Some(
                WaitReason::ShareLimit { .. }
                    | WaitReason::BorrowLimit { .. }
                    | WaitReason::NoBorrowableCapacity { .. }
                    | WaitReason::NoFreeCapacity { .. }
                    | WaitReason::Fragmented { .. }
                    | WaitReason::NodeUnfit { .. }
                    | WaitReason::QueuedBehind { .. }
            )
        );
        if job.state != JobState::Runnable || !about_the_queue || state.never_fits(job).is_some() {
            return reason;
        }
        match self.head(state, &job.spec.share, job.class()) {
            Some(head) if head != job.id => Some(WaitReason::QueuedBehind { job: head }),
            _ => reason,
        }
    }

    /// [`State::queue_head_that_fits`], looked up once per queue.
    pub fn head(&mut self, state: &'s State, share: &'s str, class: &'s GpuClass) -> Option<JobId> {
        *self
            .heads
            .entry((share, class))
            .or_insert_with(|| state.queue_head_that_fits(share, class))
    }
}
