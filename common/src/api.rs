//! The client API's messages (ALPN `quotient-api/1`): what the `quotient` CLI asks a
//! coordinator, and the views it gets back.
//!
//! The views are shaped like the JSON of docs/cli.md, so the CLI prints them with `serde_json`
//! as they are. They are plain data with no serde attributes, so bincode encodes them safely.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::{ClusterId, ErrorCode, JobId, JobSpec, JobState, Rejection, ShareSpec, ShareUpdate};

/// The largest API request or response frame: the transport's frame limit
/// (`frame::MAX_FRAME_BYTES`, which holds every frame of every protocol to it, and asserts
/// that the two are equal), named here for the messages without the `net` feature.
pub const API_FRAME_BYTES_MAX: usize = 16 << 20;
/// The most log bytes one `JobLogs` answer carries; larger `max_bytes` are capped to it.
pub const LOG_READ_BYTES_MAX: u32 = 1 << 20;

/// One request from a client. Each travels on its own QUIC stream.
// A request is built once per call and sent at once: the size of its largest variant (a job
// spec) costs nothing worth a box at every match.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApiRequest {
    CreateShare(ShareSpec),
    UpdateShare {
        name: String,
        update: ShareUpdate,
    },
    DeleteShare {
        name: String,
    },
    ListShares,
    GetShare {
        name: String,
    },
    SubmitJob(JobSpec),
    GetJob {
        job: JobId,
    },
    /// One page of jobs, newest first ([`JobPage`]).
    ListJobs {
        share: Option<String>,
        state: Option<JobState>,
        /// Only the caller's own jobs.
        mine: bool,
        /// Only the jobs whose name starts with this.
        name_prefix: Option<String>,
        /// The most jobs on the page, 1 to [`JOB_PAGE_MAX`]; 0 for [`JOB_PAGE_DEFAULT`].
        limit: u32,
        /// The `next_page_token` of the page before; `None` for the first page.
        page_token: Option<String>,
    },
    UpdateJobPriority {
        job: JobId,
        priority: u32,
    },
    CancelJob {
        job: JobId,
    },
    ExplainJob {
        job: JobId,
    },
    /// One page of nodes by name ([`NodePage`]).
    ListNodes {
        /// 1 to [`NODE_PAGE_MAX`]; 0 for [`NODE_PAGE_MAX`].
        limit: u32,
        /// The `next_page_token` of the page before; `None` for the first page.
        page_token: Option<String>,
    },
    CordonNode {
        node: String,
    },
    UncordonNode {
        node: String,
    },
    DrainNode {
        node: String,
    },
    ClusterStatus,
    /// Adds a coordinator: it joins as a learner, catches up, then becomes a voter.
    AddMember {
        id: u64,
        address: String,
    },
    RemoveMember {
        id: u64,
    },
    /// Liveness of the coordinator answering; never forwarded.
    Health,
    /// Up to `max_bytes` (at most [`LOG_READ_BYTES_MAX`]) of an attempt's stdout and stderr
    /// from `offset` on, read from the agent of the node that ran it. `attempt: None` means
    /// the current attempt, or the last one.
    JobLogs {
        job: JobId,
        attempt: Option<u32>,
        offset: u64,
        max_bytes: u32,
        /// Which member of a job of several nodes (0 for a job of one node).
        rank: u32,
    },
    /// `request`, served through the leader when the coordinator it is sent to is not the
    /// leader. A client sends it once a follower's redirect led to an address it cannot
    /// reach (coordinators that know each other by names or addresses of a network the
    /// client is not on), so that the follower forwards it instead.
    ViaLeader(#[serde(deserialize_with = "crate::nesting::shallow_box")] Box<ApiRequest>),
    /// `request` of `caller` (the identity URI of its certificate, `quotient://ROLE/NAME`),
    /// forwarded by a follower to the leader. Only a coordinator's certificate may send it;
    /// the leader authorises `request` as `caller`'s.
    Forwarded {
        caller: String,
        #[serde(deserialize_with = "crate::nesting::shallow_box")]
        request: Box<ApiRequest>,
    },
    /// `request`, for the coordinators of cluster `cluster` only: one of another cluster
    /// refuses it ([`ApiError::OtherCluster`]). Clients whose config names a cluster id wrap
    /// every request in it.
    InCluster {
        cluster: ClusterId,
        #[serde(deserialize_with = "crate::nesting::shallow_box")]
        request: Box<ApiRequest>,
    },
    /// Bootstraps a new cluster on the coordinator it is sent to, once: that coordinator makes
    /// the cluster id, becomes its first voter, and adds its other initial peers (its
    /// `--peers`) as learners, then voters, as they catch up. Never forwarded; refused by a
    /// coordinator that already belongs to a cluster.
    InitCluster,
    /// Forgets a node that is out of service (cordoned, draining or lost) and holds no job.
    /// Refused while its agent is connected to the leader: the agent would register the host
    /// again at once, as a new node.
    RemoveNode {
        node: String,
    },
    /// Declares a group of users (admin).
    CreateGroup {
        name: String,
        users: Vec<String>,
    },
    UpdateGroup {
        name: String,
        add: Vec<String>,
        remove: Vec<String>,
    },
    DeleteGroup {
        name: String,
    },
    ListGroups,
    /// The audit log (admin): entries since `since_ms` (wall clock), of `user` alone.
    Audit {
        since_ms: Option<u64>,
        user: Option<String>,
    },
    /// Revokes the certificates of `name` (admin).
    Revoke {
        name: String,
        serial: Option<String>,
    },
    Unrevoke {
        name: String,
    },
    ListRevoked,
    /// One page of the job history of the coordinator asked, newest end first
    /// ([`HistoryPage`]). Not linearizable: each coordinator keeps its own copy.
    JobHistory {
        share: Option<String>,
        /// Only the jobs that ended at or after this (ms since the epoch).
        since_ms: Option<u64>,
        /// Only the jobs that ended before this.
        until_ms: Option<u64>,
        /// SUCCEEDED, FAILED or CANCELLED.
        state: Option<JobState>,
        job: Option<JobId>,
        /// 1 to [`JOB_PAGE_MAX`]; 0 for [`JOB_PAGE_DEFAULT`].
        limit: u32,
        page_token: Option<String>,
    },
    /// GPU time per share and class between two times ([`UsageRow`]).
    ShareUsage {
        share: Option<String>,
        since_ms: u64,
        /// `None`: now.
        until_ms: Option<u64>,
        /// One row per day (UTC) instead of one for the whole time.
        by_day: bool,
    },
    /// A piece of a backup of the replicated state (admin): the coordinator it is sent to
    /// takes a fresh snapshot when `snapshot` is `None` (and `offset` 0), and answers
    /// [`ApiResponse::BackupChunk`]s of that snapshot's file from `offset`; a later request
    /// names the snapshot the first answer gave, and is refused once the coordinator holds a
    /// newer one (start again). Never forwarded: the pieces come from one coordinator.
    Backup {
        snapshot: Option<String>,
        offset: u64,
    },
    /// What happened ([`crate::event::Event`]), oldest first: those after event `after` (0:
    /// from the oldest kept), at or after `since_ms`, of `job`, `share` or `node`, at most
    /// `limit` (1 to [`EVENT_PAGE_MAX`]; 0 for [`EVENT_PAGE_MAX`]).
    Events {
        after: u64,
        since_ms: Option<u64>,
        job: Option<JobId>,
        share: Option<String>,
        node: Option<String>,
        limit: u32,
    },
    /// Issues an access key for the AWS endpoint to `user` (admin): the answer carries its
    /// secret, the only time it is ever shown.
    CreateAccessKey {
        user: String,
        /// Whether the key signs as an admin (else as a user).
        admin: bool,
    },
    /// Every access key, without secrets (admin).
    ListAccessKeys,
    DeleteAccessKey {
        id: String,
    },
    /// Sets (`Some`) or deletes (`None`) an object of the AWS endpoint, `KIND/NAME` (admin):
    /// a job queue, a service environment, a scheduling policy, as JSON.
    PutAwsObject {
        key: String,
        value: Option<String>,
    },
    /// The AWS endpoint's objects whose key starts with `prefix`, in key order.
    ListAwsObjects {
        prefix: String,
    },
    /// A job submitted through the AWS endpoint, with the request it came in (JSON).
    SubmitServiceJob {
        spec: JobSpec,
        request: String,
    },
    /// A job with the AWS endpoint's request for it, if it came through it.
    GetServiceJob {
        job: JobId,
    },
    /// `request`, one write of a client's session ([`WriteTag`]): the coordinators apply it
    /// at most once, however many copies of it reach them. Only the writes that
    /// [`ApiRequest::is_session_write`] names may be wrapped; a client wraps them outside
    /// [`ApiRequest::ViaLeader`] and inside [`ApiRequest::InCluster`].
    InSession {
        tag: WriteTag,
        #[serde(deserialize_with = "crate::nesting::shallow_box")]
        request: Box<ApiRequest>,
    },
}

/// Which write of which client session a request is (the Raft dissertation's §6.3).
///
/// A write whose answer was lost may be sent again, and a copy of it may sit in a stalled
/// coordinator's socket and reach the leader seconds later, after the client's newer writes:
/// without the tag, that late copy would undo them. Each client process picks a random
/// `session`, numbers its writes `seq` from 1 (every copy of one write, retries included,
/// carries the same number), and tells the coordinators `low`: the lowest number of its
/// writes still waiting for an answer. The state machine applies each `(session, seq)` at
/// most once and drops any copy whose number is below the session's highest `low` seen, so a
/// late copy of a write the client is done with changes nothing
/// (`quotient_core::sessions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WriteTag {
    pub session: u64,
    pub seq: u64,
    pub low: u64,
}

impl WriteTag {
    /// Whether the tag holds together: numbers start at 1, and the lowest write in flight
    /// is at most this one.
    pub fn check(&self) -> Result<(), String> {
        if self.seq == 0 || self.low == 0 {
            return Err("a write's sequence numbers start at 1".to_string());
        }
        if self.low > self.seq {
            return Err(format!(
                "write {} of a session cannot have {} as its lowest write in flight: it is in \
                 flight itself",
                self.seq, self.low
            ));
        }
        Ok(())
    }
}

impl ApiRequest {
    /// The first page of every job, `limit` of them (0: [`JOB_PAGE_DEFAULT`]), newest first.
    pub fn list_jobs(limit: u32) -> ApiRequest {
        ApiRequest::ListJobs {
            share: None,
            state: None,
            mine: false,
            name_prefix: None,
            limit,
            page_token: None,
        }
    }

    /// The first page of nodes, [`NODE_PAGE_MAX`] of them, by name.
    pub fn list_nodes() -> ApiRequest {
        ApiRequest::ListNodes {
            limit: 0,
            page_token: None,
        }
    }

    /// The request itself, out of a [`ApiRequest::ViaLeader`] or [`ApiRequest::Forwarded`].
    pub fn unwrapped(&self) -> &ApiRequest {
        match self {
            ApiRequest::ViaLeader(request)
            | ApiRequest::Forwarded { request, .. }
            | ApiRequest::InCluster { request, .. }
            | ApiRequest::InSession { request, .. } => request.unwrapped(),
            request => request,
        }
    }

    /// The session tag of the write inside the request's wrappers, if it travels in one.
    pub fn write_tag(&self) -> Option<&WriteTag> {
        match self {
            ApiRequest::InSession { tag, .. } => Some(tag),
            ApiRequest::ViaLeader(request)
            | ApiRequest::Forwarded { request, .. }
            | ApiRequest::InCluster { request, .. } => request.write_tag(),
            _ => None,
        }
    }

    /// Whether the request changes state (and so needs the admin role for shares and
    /// membership, and a Raft commit).
    pub fn is_write(&self) -> bool {
        !matches!(
            self.unwrapped(),
            ApiRequest::ListShares
                | ApiRequest::GetShare { .. }
                | ApiRequest::GetJob { .. }
                | ApiRequest::ListJobs { .. }
                | ApiRequest::ExplainJob { .. }
                | ApiRequest::JobLogs { .. }
                | ApiRequest::ListNodes { .. }
                | ApiRequest::ClusterStatus
                | ApiRequest::Health
                | ApiRequest::ListGroups
                | ApiRequest::Audit { .. }
                | ApiRequest::ListRevoked
                | ApiRequest::JobHistory { .. }
                | ApiRequest::ShareUsage { .. }
                | ApiRequest::Backup { .. }
                | ApiRequest::Events { .. }
                | ApiRequest::ListAccessKeys
                | ApiRequest::ListAwsObjects { .. }
                | ApiRequest::GetServiceJob { .. }
        )
    }

    /// The request's name alone (its variant's), for logs and messages: a job's environment
    /// may hold secrets, so a request is never logged whole.
    pub fn name(&self) -> &'static str {
        match self {
            ApiRequest::CreateShare(_) => "CreateShare",
            ApiRequest::UpdateShare { .. } => "UpdateShare",
            ApiRequest::DeleteShare { .. } => "DeleteShare",
            ApiRequest::ListShares => "ListShares",
            ApiRequest::GetShare { .. } => "GetShare",
            ApiRequest::SubmitJob(_) => "SubmitJob",
            ApiRequest::GetJob { .. } => "GetJob",
            ApiRequest::ListJobs { .. } => "ListJobs",
            ApiRequest::UpdateJobPriority { .. } => "UpdateJobPriority",
            ApiRequest::CancelJob { .. } => "CancelJob",
            ApiRequest::ExplainJob { .. } => "ExplainJob",
            ApiRequest::ListNodes { .. } => "ListNodes",
            ApiRequest::CordonNode { .. } => "CordonNode",
            ApiRequest::UncordonNode { .. } => "UncordonNode",
            ApiRequest::DrainNode { .. } => "DrainNode",
            ApiRequest::ClusterStatus => "ClusterStatus",
            ApiRequest::AddMember { .. } => "AddMember",
            ApiRequest::RemoveMember { .. } => "RemoveMember",
            ApiRequest::Health => "Health",
            ApiRequest::JobLogs { .. } => "JobLogs",
            ApiRequest::ViaLeader(_) => "ViaLeader",
            ApiRequest::Forwarded { .. } => "Forwarded",
            ApiRequest::InCluster { .. } => "InCluster",
            ApiRequest::InitCluster => "InitCluster",
            ApiRequest::RemoveNode { .. } => "RemoveNode",
            ApiRequest::CreateGroup { .. } => "CreateGroup",
            ApiRequest::UpdateGroup { .. } => "UpdateGroup",
            ApiRequest::DeleteGroup { .. } => "DeleteGroup",
            ApiRequest::ListGroups => "ListGroups",
            ApiRequest::Audit { .. } => "Audit",
            ApiRequest::Revoke { .. } => "Revoke",
            ApiRequest::Unrevoke { .. } => "Unrevoke",
            ApiRequest::ListRevoked => "ListRevoked",
            ApiRequest::JobHistory { .. } => "JobHistory",
            ApiRequest::ShareUsage { .. } => "ShareUsage",
            ApiRequest::Backup { .. } => "Backup",
            ApiRequest::Events { .. } => "Events",
            ApiRequest::CreateAccessKey { .. } => "CreateAccessKey",
            ApiRequest::ListAccessKeys => "ListAccessKeys",
            ApiRequest::DeleteAccessKey { .. } => "DeleteAccessKey",
            ApiRequest::PutAwsObject { .. } => "PutAwsObject",
            ApiRequest::ListAwsObjects { .. } => "ListAwsObjects",
            ApiRequest::SubmitServiceJob { .. } => "SubmitServiceJob",
            ApiRequest::GetServiceJob { .. } => "GetServiceJob",
            ApiRequest::InSession { .. } => "InSession",
        }
    }

    /// Whether the request is a write that answers `Done` and may travel in a client's session
    /// ([`ApiRequest::InSession`]), so that sending it twice applies it once. Submits are not:
    /// their idempotency key does that, and their answer is the job.
    pub fn is_session_write(&self) -> bool {
        matches!(
            self,
            ApiRequest::CreateShare(_)
                | ApiRequest::UpdateShare { .. }
                | ApiRequest::DeleteShare { .. }
                | ApiRequest::UpdateJobPriority { .. }
                | ApiRequest::CancelJob { .. }
                | ApiRequest::CordonNode { .. }
                | ApiRequest::UncordonNode { .. }
                | ApiRequest::DrainNode { .. }
                | ApiRequest::RemoveNode { .. }
                | ApiRequest::CreateGroup { .. }
                | ApiRequest::UpdateGroup { .. }
                | ApiRequest::DeleteGroup { .. }
                | ApiRequest::Revoke { .. }
                | ApiRequest::Unrevoke { .. }
                | ApiRequest::DeleteAccessKey { .. }
                | ApiRequest::PutAwsObject { .. }
        )
    }

    /// Whether only an admin may send it: share, node and membership management.
    pub fn needs_admin(&self) -> bool {
        matches!(
            self.unwrapped(),
            ApiRequest::CreateShare(_)
                | ApiRequest::UpdateShare { .. }
                | ApiRequest::DeleteShare { .. }
                | ApiRequest::CordonNode { .. }
                | ApiRequest::UncordonNode { .. }
                | ApiRequest::DrainNode { .. }
                | ApiRequest::AddMember { .. }
                | ApiRequest::RemoveMember { .. }
                | ApiRequest::InitCluster
                | ApiRequest::RemoveNode { .. }
                | ApiRequest::CreateGroup { .. }
                | ApiRequest::UpdateGroup { .. }
                | ApiRequest::DeleteGroup { .. }
                | ApiRequest::Audit { .. }
                | ApiRequest::Revoke { .. }
                | ApiRequest::Unrevoke { .. }
                | ApiRequest::ListRevoked
                | ApiRequest::Backup { .. }
                | ApiRequest::CreateAccessKey { .. }
                | ApiRequest::ListAccessKeys
                | ApiRequest::DeleteAccessKey { .. }
                | ApiRequest::PutAwsObject { .. }
        )
    }
}

/// A coordinator's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApiResponse {
    Done,
    JobSubmitted {
        job: JobId,
        duplicate: bool,
    },
    Share(ShareView),
    Shares(Vec<ShareView>),
    Job(Box<JobView>),
    Jobs(JobPage),
    Explanation {
        summary: String,
        details: Vec<String>,
    },
    Nodes(NodePage),
    Cluster(ClusterView),
    Health(HealthView),
    Error(ApiError),
    /// A piece of an attempt's log (`JobLogs`). `data` starts at the requested offset;
    /// `next_offset` is where the next read starts. `complete` once the attempt has ended and
    /// `data` reaches the end of its log: nothing more will come. `attempt` 0 means the job
    /// has not been placed yet (no log).
    Logs {
        attempt: u32,
        data: Vec<u8>,
        next_offset: u64,
        complete: bool,
    },
    /// The answer to `InitCluster`.
    ClusterInitialised(ClusterInitView),
    Groups(Vec<GroupView>),
    Audit(Vec<AuditView>),
    Revoked(Vec<RevokedView>),
    History(HistoryPage),
    Usage(Vec<UsageRow>),
    /// A piece of a backup (`Backup`): `data` is the snapshot file's bytes from the requested
    /// offset, at most [`BACKUP_CHUNK_BYTES`]; the backup is complete once the offset plus the
    /// data reach `total_bytes`.
    Events(EventPage),
    BackupChunk {
        /// The cluster the state belongs to.
        cluster: ClusterId,
        /// Which snapshot: name it in the next request.
        snapshot: String,
        /// The log index the snapshot's state includes.
        last_log_index: u64,
        total_bytes: u64,
        data: Vec<u8>,
    },
    AccessKey(AccessKeyView),
    AccessKeys(Vec<AccessKeyView>),
    /// `(key, JSON)` pairs, in key order.
    AwsObjects(Vec<(String, String)>),
    ServiceJob {
        job: Box<JobView>,
        /// The SubmitServiceJob request, when it came through the AWS endpoint.
        request: Option<String>,
    },
}

/// An access key of the AWS endpoint, as `quotient access-key list -o json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessKeyView {
    pub access_key_id: String,
    pub user: String,
    /// `admin` or `user`.
    pub role: String,
    pub created_ms: u64,
    /// Only in the answer to `CreateAccessKey`.
    pub secret_access_key: Option<String>,
}

/// The most bytes of a backup in one answer: well under the frame limit.
pub const BACKUP_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// The most events in one answer; a reader asks again after the last it got.
pub const EVENT_PAGE_MAX: u32 = 1_000;

/// An answer to `Events`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventPage {
    pub events: Vec<crate::event::Event>,
    /// The number of the newest event there is: a reader that follows asks for those after
    /// it (or after the last event it got, if it got a full page).
    pub newest: u64,
    /// The number of the oldest event kept; a reader that asked for events after an older
    /// one missed those in between.
    pub oldest: u64,
}

/// A group of users, as `quotient group list -o json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupView {
    pub name: String,
    pub users: Vec<String>,
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditView {
    pub index: u64,
    pub at_ms: u64,
    pub who: String,
    pub action: String,
    pub outcome: String,
}

/// One revoked certificate name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedView {
    pub name: String,
    pub serial: Option<String>,
    pub at_ms: u64,
}

/// Why a request failed. `NotLeader` is for the client to follow, never for the user to see.
///
/// Every error has a stable code ([`ApiError::code`]), a message for people (its `Display`)
/// and whether sending the same request again can help ([`ApiError::retryable`]); docs/errors.md
/// lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApiError {
    /// The state machine refused the command (or the leader refused first what it would).
    #[error("{0}")]
    Rejected(Rejection),
    #[error("not the leader; try coordinator {leader_id:?} at {leader_address:?}")]
    NotLeader {
        leader_id: Option<u64>,
        leader_address: Option<String>,
    },
    #[error("permission denied: {0}")]
    Unauthorized(String),
    /// No leader, no quorum, or a read that could not finish in time: nothing was done.
    #[error("the cluster cannot serve this now: {0}")]
    Unavailable(String),
    /// The text is a whole sentence: the error's code (`InvalidArgument`) says the kind.
    #[error("{0}")]
    BadRequest(String),
    /// The text is a whole sentence: the error's code (`NotFound`) says the kind.
    #[error("{0}")]
    NotFound(String),
    /// The agent that holds what was asked (an attempt's log) is not connected to the leader
    /// or did not answer. Not retried by the client: the text names the node and what to check.
    #[error("{0}")]
    AgentUnavailable(String),
    /// The coordinator belongs to another cluster than the one the client's config names.
    /// Not retried: the config or the address list is wrong.
    #[error("coordinator {coordinator_id} belongs to cluster {coordinator_cluster}, but this client's config names cluster {client_cluster}: check the coordinators' addresses and `cluster_id` in the client config")]
    OtherCluster {
        coordinator_id: u64,
        coordinator_cluster: String,
        client_cluster: String,
    },
    /// The answer would be over [`API_FRAME_BYTES_MAX`]; the coordinator sent this instead
    /// (and logged a warning). Not retried: the same request gets the same answer.
    /// `narrow` says how to ask for less.
    #[error("the answer is too large ({size_bytes} bytes, limit {limit_bytes}); {narrow}")]
    AnswerTooLarge {
        size_bytes: u64,
        limit_bytes: u64,
        narrow: String,
    },
    /// The leader's answer to a request a follower forwarded could not be read whole (cut
    /// short or undecodable). Not retried; the text says what happened.
    #[error("{0}")]
    AnswerUnreadable(String),
    /// A bug, or a coordinator that cannot go on (its Raft stopped): a retry does not help.
    #[error("internal error: {0}")]
    Internal(String),
    /// The deadline passed after the write was proposed: it may or may not be applied.
    #[error("{0}; the change may or may not have been made: check before retrying")]
    Uncertain(String),
    /// A check of the coordinator's own (not the state machine's) refused it; the text says
    /// what must change first (an agent still connected, a cluster already initialised, a
    /// membership change Raft refused).
    #[error("{0}")]
    Precondition(String),
    /// This coordinator's Raft stopped for good (a storage write failed, say): it serves
    /// nothing until it is restarted, but the other coordinators may. The client does not ask
    /// it again within the call; it asks another. A write it refused this way may still be
    /// applied by the others, so one that is not idempotent is reported as uncertain.
    #[error("this coordinator stopped serving: {0}; it serves again once restarted")]
    Stopped(String),
}

impl ApiError {
    /// The stable code of this error (docs/errors.md).
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::Rejected(rejection) => rejection.code(),
            ApiError::NotLeader { .. } => ErrorCode::NotLeader,
            ApiError::Unauthorized(_) => ErrorCode::Forbidden,
            ApiError::Unavailable(_) | ApiError::AgentUnavailable(_) | ApiError::Stopped(_) => {
                ErrorCode::Unavailable
            }
            ApiError::BadRequest(_) => ErrorCode::InvalidArgument,
            ApiError::NotFound(_) => ErrorCode::NotFound,
            ApiError::OtherCluster { .. } | ApiError::Precondition(_) => {
                ErrorCode::FailedPrecondition
            }
            ApiError::AnswerTooLarge { .. } => ErrorCode::LimitExceeded,
            ApiError::AnswerUnreadable(_) | ApiError::Internal(_) => ErrorCode::Internal,
            ApiError::Uncertain(_) => ErrorCode::Uncertain,
        }
    }

    /// Whether sending the same request again, unchanged and with nothing else changed first,
    /// can succeed: at the leader (`NotLeader`), once an election or a lost quorum is over
    /// (`Unavailable`), or at another coordinator (`Stopped`). The client retries these within
    /// its deadline. An agent that is not connected is `Unavailable` but not retried: it takes
    /// a person to bring it back. An `Uncertain` write is retried only when it is idempotent,
    /// which the client knows from the request, not from the error.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            ApiError::NotLeader { .. } | ApiError::Unavailable(_) | ApiError::Stopped(_)
        )
    }
}

/// How to ask `request` for less when its answer is over [`API_FRAME_BYTES_MAX`]: the text
/// of [`ApiError::AnswerTooLarge`].
pub fn how_to_narrow(request: &ApiRequest) -> &'static str {
    match request.unwrapped() {
        ApiRequest::ListJobs { .. } => {
            "ask for a smaller page: `quotient job list --limit N`, or narrow it with `--share \
             NAME` or `--state STATE`"
        }
        _ => "this request has no filter or page to narrow it yet",
    }
}

/// A share as `quotient share get -o json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareView {
    pub name: String,
    pub strategy: String,
    pub limits: BTreeMap<String, u32>,
    pub borrow_limit_percent: Option<u32>,
    pub in_share_preemption: bool,
    pub state: String,
    pub usage: BTreeMap<String, u64>,
    pub borrowed: BTreeMap<String, u64>,
    pub lent: BTreeMap<String, u64>,
    pub runnable: u64,
    pub running: u64,
    /// Who may submit to it (users and `group:NAME`); empty when it is open to every user.
    pub members: Vec<String>,
    /// Whether every user may submit to it (it lists no members).
    pub open: bool,
    pub max_jobs_per_user: Option<u32>,
}

/// Jobs on a page when the request names no limit.
pub const JOB_PAGE_DEFAULT: u32 = 100;
/// The most jobs on one page: a page of the largest jobs stays far under the frame limit.
pub const JOB_PAGE_MAX: u32 = 1_000;
/// The most jobs one answer to `ListJobs` looks at: a filter that matches few jobs of a large
/// state gets a page with fewer jobs than asked for (even none) and a token to go on from
/// where it stopped, so that no answer holds the state for longer than this many jobs take
/// (a few milliseconds). Clients ask again until the page is full or the list ends.
pub const JOB_SCAN_MAX: usize = 250_000;

/// One page of `job list`, as `quotient job list -o json` prints it: the jobs, newest first,
/// and the token that asks for the next page (`None` on the last one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    pub next_page_token: Option<String>,
}

/// The page token that continues a list of jobs, newest first, below job `id`. Opaque to
/// clients: they pass back what they were given.
pub fn job_page_token(id: JobId) -> String {
    format!("jobs.{:x}", id.0)
}

/// The job a page token continues below; `None` for a token this cluster never gave.
pub fn parse_job_page_token(token: &str) -> Option<JobId> {
    let hex = token.strip_prefix("jobs.")?;
    if hex.is_empty() || hex.len() > 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().map(JobId)
}

/// One finished job as the job history keeps it, on every coordinator, written when the job
/// ends and kept after it leaves the live state (`quotient job history -o json`). Its file encoding is versioned as
/// `version::JOB_HISTORY`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    pub id: String,
    pub name: Option<String>,
    pub share: String,
    /// Who submitted it; `None` for jobs from before owners were recorded.
    pub owner: Option<String>,
    pub gpu_class: String,
    /// GPUs on each of its nodes.
    pub gpus: u32,
    pub nodes: u32,
    pub priority: u32,
    /// SUCCEEDED, FAILED or CANCELLED.
    pub state: String,
    pub exit_code: Option<i32>,
    /// Why it ended, in words.
    pub reason: Option<String>,
    pub submitted_ms: u64,
    /// When it first ran; `None` if it never did.
    pub first_started_ms: Option<u64>,
    pub ended_ms: u64,
    pub attempts: u32,
    pub preemptions: u32,
    /// How each preempted attempt ended (`preempted (reclaim) for j-4`), oldest first.
    pub preemption_causes: Vec<String>,
    /// GPU time it held, placement to end of each attempt, GPUs times nodes (its latest
    /// attempts: at most 32 are kept).
    pub gpu_ms: u64,
    /// `gpu_ms` in whole seconds, rounded.
    pub gpu_seconds: u64,
    pub attempt_history: Vec<AttemptView>,
}

/// One page of `job history`: newest end first, and the token of the next page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub records: Vec<HistoryRecord>,
    pub next_page_token: Option<String>,
}

/// The page token that continues a history below the record that ended at `ended_ms` as
/// job `id`. Opaque to clients.
pub fn history_page_token(ended_ms: u64, id: JobId) -> String {
    format!("history.{ended_ms:x}.{:x}", id.0)
}

/// The end and job a history page token continues below; `None` for a token never given.
pub fn parse_history_page_token(token: &str) -> Option<(u64, JobId)> {
    let rest = token.strip_prefix("history.")?;
    let (ended, id) = rest.split_once('.')?;
    let hex = |text: &str| {
        (!text.is_empty() && text.len() <= 16)
            .then(|| u64::from_str_radix(text, 16).ok())
            .flatten()
    };
    Some((hex(ended)?, JobId(hex(id)?)))
}

/// GPU time of one share and class (`quotient share usage -o json`), in GPU-seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub share: String,
    pub gpu_class: String,
    /// The day (UTC, ms since the epoch of its midnight) with `--by day`; `None` for the
    /// whole time asked.
    pub day_ms: Option<u64>,
    /// Within the share's own limit.
    pub own_gpu_seconds: u64,
    /// Beyond its limit: others' idle quota and GPUs no share is entitled to.
    pub borrowed_gpu_seconds: u64,
    /// Its idle quota that other shares used.
    pub lent_gpu_seconds: u64,
}

/// The most nodes on one page of `ListNodes`: a page of the largest nodes (64 GPUs each)
/// stays far under the frame limit.
pub const NODE_PAGE_MAX: u32 = 1_000;

/// One page of nodes, by name, and the token that asks for the next (`None` on the last).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePage {
    pub nodes: Vec<NodeView>,
    pub next_page_token: Option<String>,
}

/// The page token that continues a list of nodes after the node named `name`. Opaque to
/// clients.
pub fn node_page_token(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("nodes.{hex}")
}

/// The node name a page token continues after; `None` for a token never given.
pub fn parse_node_page_token(token: &str) -> Option<String> {
    let hex = token.strip_prefix("nodes.")?;
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 2 * crate::name::NAME_BYTES_MAX {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// A job as `quotient job get -o json` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    pub id: String,
    pub name: Option<String>,
    pub share: String,
    pub priority: u32,
    pub state: String,
    pub gpus: u32,
    pub gpu_class: String,
    pub node: Option<String>,
    pub attempts: u32,
    pub preemptions: u32,
    pub reason: Option<String>,
    /// How the last preemption happened: kind, and the job and share it was for.
    pub last_preemption: Option<String>,
    pub preempted_for: Option<String>,
    pub gpu_indices: Vec<u32>,
    pub submitted_ms: u64,
    /// When its current or last attempt started running.
    pub started_ms: Option<u64>,
    /// When it ended (SUCCEEDED, FAILED, CANCELLED).
    pub ended_ms: Option<u64>,
    /// How long it waited in the queue before it first ran; `None` while it still waits
    /// (the time since `submitted_ms`, then).
    pub waited_ms: Option<u64>,
    /// The node of its current or last attempt (kept after it ends).
    pub last_node: Option<String>,
    /// The exit code of its last attempt, when it exited.
    pub exit_code: Option<i32>,
    /// Preemptions that count toward `max_preemptions` (reclaim and in-share only).
    pub counted_preemptions: u32,
    pub max_preemptions: Option<u32>,
    /// What it asked for (`None`: its share of the node's, by GPUs).
    pub cpu_millis: Option<u32>,
    pub memory_bytes: Option<u64>,
    /// What its current attempt holds on its node (0 where the node does not report them).
    pub allocated_cpu_millis: Option<u32>,
    pub allocated_memory_bytes: Option<u64>,
    pub time_limit_ms: Option<u64>,
    pub retries: u32,
    pub retries_used: u32,
    /// Its retry rules, as `--retry-on` takes them.
    pub retry_rules: Vec<String>,
    pub image: Option<String>,
    /// Its latest attempts, oldest first (at most 32).
    pub attempt_history: Vec<AttemptView>,
    /// How many nodes it runs on (`gpus` on each).
    pub node_count: u32,
    /// The node label all its nodes must share a value of (`--same`).
    pub same: Option<String>,
    /// Its members while it holds GPUs, in rank order (`node` is rank 0's).
    pub placement: Vec<PlacementView>,
    /// Who submitted it (the name in their certificate); `null` for jobs from before owners
    /// were recorded.
    pub owner: Option<String>,
    /// When the coordinators last learnt that the job checkpointed (ms since the epoch): its
    /// agent saw its checkpoint marker, or a newer file, in `$QUOTIENT_CHECKPOINT_DIR`
    /// (docs/quota-shares.md, "Checkpoints"). `null` before the first one.
    pub last_checkpoint_ms: Option<u64>,
}

/// One member of a job's placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementView {
    pub rank: u32,
    pub node: String,
    /// Its GPU indices on the node.
    pub gpus: Vec<u32>,
    /// `placed`, `starting`, `running` or `exited`.
    pub stage: String,
    /// Its exit code, once it exited with one.
    pub exit_code: Option<i32>,
}

/// One attempt of a job, in a job view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptView {
    pub attempt: u32,
    /// Rank 0's node.
    pub node: String,
    /// Every member's node, in rank order.
    pub nodes: Vec<String>,
    pub placed_ms: u64,
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// How it ended, in words; `None` while it is the current attempt.
    pub outcome: Option<String>,
}

/// One GPU in a node view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub class: String,
    pub healthy: bool,
    pub job: Option<String>,
    /// The indices of the GPUs of the node it reaches over NVLink.
    pub nvlink_peers: Vec<u32>,
}

/// A node as `quotient node list -o json` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    pub state: String,
    pub gpus: Vec<GpuView>,
    /// What the node's agent last reported of its disk (`None`: no report known to the
    /// leader, e.g. just after a failover or from a lost node). Used: its logs and checkpoint
    /// dirs together, then each; free: what its state dir's filesystem has left.
    pub disk_used_bytes: Option<u64>,
    pub disk_logs_bytes: Option<u64>,
    pub disk_checkpoints_bytes: Option<u64>,
    pub disk_free_bytes: Option<u64>,
    /// How it runs jobs: `process`, and `docker` where its agent reaches Docker.
    pub runtimes: Vec<String>,
    /// The images it holds, as its agent last registered them.
    pub images: Vec<String>,
    /// CPUs (thousandths) and memory (bytes) it reports (0: not reported) and what its jobs
    /// hold of them.
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub cpu_millis_allocated: u64,
    pub memory_bytes_allocated: u64,
    /// The leader has not heard from its agent since a heartbeat was due; nothing new is
    /// placed on it until it is heard from again, or it is lost when its lease runs out.
    pub unreachable: bool,
    /// When the leader last heard from its agent (ms since the Unix epoch); `None` when this
    /// leader has not heard from it since it was elected.
    pub last_heartbeat_ms: Option<u64>,
    /// Its labels (`--label` of its agent), e.g. `{"rack": "r3"}`.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The address its jobs are reached at (`--advertise-address`), when known.
    pub address: Option<String>,
}

/// One coordinator in the cluster view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub id: u64,
    pub address: String,
    /// leader, follower or learner.
    pub role: String,
    pub reachable: bool,
    /// Why the leader cannot replicate to it, when the member refused it: it belongs to
    /// another cluster, or it lost its data directory while a voter.
    pub problem: Option<String>,
}

/// `quotient cluster status -o json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The cluster's id (32 hexadecimal digits), as the leader holds it.
    pub cluster_id: Option<String>,
    pub leader: Option<u64>,
    pub term: u64,
    pub members: Vec<MemberView>,
    pub last_applied: u64,
}

/// What the health request reports about the coordinator that answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthView {
    pub id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub last_applied: u64,
    pub healthy: bool,
    /// A hash (FNV-1a, 64 bits) of this coordinator's applied state in its canonical bytes:
    /// replicas that applied the same log give the same digest, so comparing them checks
    /// replication without a read through the leader.
    pub state_digest: u64,
    /// The cluster this coordinator belongs to; `None` until it is initialised or added.
    pub cluster_id: Option<String>,
    /// Why it is not healthy, each with what to do; empty when healthy.
    pub problems: Vec<String>,
}

/// What `quotient cluster init` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInitView {
    /// The new cluster's id: put it in client configs as `cluster_id`.
    pub cluster_id: String,
    /// The coordinator that bootstrapped it (its first voter).
    pub bootstrapped_by: u64,
    /// The voters once the initial peers that caught up were added.
    pub voters: Vec<u64>,
    /// Initial peers that did not catch up in time, with why; add each later with
    /// `quotient cluster add-member`.
    pub pending: Vec<PendingMember>,
}

/// An initial peer that `cluster init` could not make a voter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMember {
    pub id: u64,
    pub address: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request of every kind.
    fn every_request() -> Vec<ApiRequest> {
        let job = JobId(1);
        let node = || "node-1".to_string();
        let share = || "qs1".to_string();
        vec![
            ApiRequest::CreateShare(ShareSpec {
                name: share(),
                limits: BTreeMap::new(),
                strategy: crate::Strategy::Reserve,
                borrow_limit_percent: None,
                in_share_preemption: false,
                state: crate::ShareState::Enabled,
                members: Vec::new(),
                max_jobs_per_user: None,
            }),
            ApiRequest::UpdateShare {
                name: share(),
                update: ShareUpdate::default(),
            },
            ApiRequest::DeleteShare { name: share() },
            ApiRequest::ListShares,
            ApiRequest::GetShare { name: share() },
            ApiRequest::SubmitJob(JobSpec::new("qs1", 0, 1, vec!["true".into()])),
            ApiRequest::GetJob { job },
            ApiRequest::ListJobs {
                share: None,
                state: None,
                mine: false,
                name_prefix: None,
                limit: 0,
                page_token: None,
            },
            ApiRequest::UpdateJobPriority { job, priority: 1 },
            ApiRequest::CancelJob { job },
            ApiRequest::ExplainJob { job },
            ApiRequest::ListNodes {
                limit: 0,
                page_token: Some(node_page_token("node-1")),
            },
            ApiRequest::CordonNode { node: node() },
            ApiRequest::UncordonNode { node: node() },
            ApiRequest::DrainNode { node: node() },
            ApiRequest::ClusterStatus,
            ApiRequest::AddMember {
                id: 4,
                address: "a:1".into(),
            },
            ApiRequest::RemoveMember { id: 4 },
            ApiRequest::Health,
            ApiRequest::JobLogs {
                job,
                attempt: None,
                offset: 0,
                max_bytes: 1,
                rank: 0,
            },
            ApiRequest::ViaLeader(Box::new(ApiRequest::Health)),
            ApiRequest::Forwarded {
                caller: "quotient://user/bob".into(),
                request: Box::new(ApiRequest::Health),
            },
            ApiRequest::InCluster {
                cluster: ClusterId::from_bytes([1; 16]),
                request: Box::new(ApiRequest::Health),
            },
            ApiRequest::InitCluster,
            ApiRequest::RemoveNode { node: node() },
            ApiRequest::JobHistory {
                share: Some(share()),
                since_ms: Some(1),
                until_ms: None,
                state: Some(JobState::Failed),
                job: None,
                limit: 10,
                page_token: Some(history_page_token(5, job)),
            },
            ApiRequest::ShareUsage {
                share: None,
                since_ms: 0,
                until_ms: Some(10),
                by_day: true,
            },
            ApiRequest::Backup {
                snapshot: None,
                offset: 0,
            },
            ApiRequest::Events {
                after: 0,
                since_ms: None,
                job: Some(job),
                share: None,
                node: None,
                limit: 0,
            },
        ]
    }

    #[test]
    fn page_tokens_read_back_and_others_are_refused() {
        assert_eq!(
            parse_job_page_token(&job_page_token(JobId(42))),
            Some(JobId(42))
        );
        assert_eq!(
            parse_history_page_token(&history_page_token(1_700_000_000_000, JobId(7))),
            Some((1_700_000_000_000, JobId(7)))
        );
        for bad in [
            "",
            "jobs.",
            "jobs.xyz",
            "history.1",
            "history..1",
            "jobs.11111111111111111",
        ] {
            assert_eq!(parse_job_page_token(bad), None, "{bad}");
            assert_eq!(parse_history_page_token(bad), None, "{bad}");
        }
        assert_eq!(
            parse_node_page_token(&node_page_token("gpu-07")).as_deref(),
            Some("gpu-07")
        );
        for bad in ["nodes.", "nodes.6", "nodes.zz", "nodes.ff"] {
            assert_eq!(parse_node_page_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_request_is_named_by_its_variant() {
        // Proves the name logs and messages use is the variant's, for every request.
        for request in every_request() {
            let debug = format!("{request:?}");
            let variant: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
            assert_eq!(request.name(), variant, "{debug}");
        }
    }

    #[test]
    fn only_a_redirect_an_unavailable_cluster_and_a_stopped_member_are_retryable() {
        // Proves what the client retries by itself: a redirect, a cluster without a leader or
        // quorum, and a coordinator whose Raft stopped (at another); never a bug, an agent
        // that is gone or a write whose fate is unknown; and each error's code.
        let cases = [
            (
                ApiError::NotLeader {
                    leader_id: None,
                    leader_address: None,
                },
                ErrorCode::NotLeader,
                true,
            ),
            (
                ApiError::Unavailable("electing".into()),
                ErrorCode::Unavailable,
                true,
            ),
            (
                ApiError::AgentUnavailable("node-1".into()),
                ErrorCode::Unavailable,
                false,
            ),
            (
                ApiError::Internal("a bug".into()),
                ErrorCode::Internal,
                false,
            ),
            (
                ApiError::Stopped("raft stopped".into()),
                ErrorCode::Unavailable,
                true,
            ),
            (
                ApiError::Uncertain("no answer".into()),
                ErrorCode::Uncertain,
                false,
            ),
            (
                ApiError::Rejected(Rejection::UnknownShare("qs1".into())),
                ErrorCode::NotFound,
                false,
            ),
            (
                ApiError::Rejected(Rejection::ShareDisabled("qs1".into())),
                ErrorCode::FailedPrecondition,
                false,
            ),
            (
                ApiError::Unauthorized("bob".into()),
                ErrorCode::Forbidden,
                false,
            ),
            (
                ApiError::BadRequest("x".into()),
                ErrorCode::InvalidArgument,
                false,
            ),
            (ApiError::NotFound("x".into()), ErrorCode::NotFound, false),
            (
                ApiError::Precondition("agent connected".into()),
                ErrorCode::FailedPrecondition,
                false,
            ),
            (
                ApiError::AnswerTooLarge {
                    size_bytes: 2,
                    limit_bytes: 1,
                    narrow: String::new(),
                },
                ErrorCode::LimitExceeded,
                false,
            ),
            (
                ApiError::AnswerUnreadable("x".into()),
                ErrorCode::Internal,
                false,
            ),
            (
                ApiError::OtherCluster {
                    coordinator_id: 1,
                    coordinator_cluster: "a".into(),
                    client_cluster: "b".into(),
                },
                ErrorCode::FailedPrecondition,
                false,
            ),
        ];
        for (error, code, retryable) in cases {
            assert_eq!(error.code(), code, "{error:?}");
            assert_eq!(error.retryable(), retryable, "{error:?}");
        }
    }
}
