//! Version 6 of the snapshot state, kept so that this build reads what the previous one wrote
//! (`quotient_common::version` says why and how). Version 7 adds the clients' write sessions
//! (`crate::sessions`), jobs' last checkpoints and the entries' clock at the end of `StateData`; every field before
//! them is as version 6 encoded it, so version 6 reads as today's types without them. Nothing
//! here is ever written.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use quotient_common::JobId;

use crate::job_table::JobTable;
use crate::state::{AuditEntry, NodeId, NodeRecord, Revocation, ShareRecord, StateData};

/// `StateData` as version 6 of the snapshot state encoded it.
#[derive(Deserialize)]
pub struct StateDataV6 {
    pub(crate) shares: BTreeMap<String, ShareRecord>,
    pub(crate) jobs: JobTable,
    pub(crate) node_ids: BTreeMap<String, NodeId>,
    pub(crate) nodes: Vec<NodeRecord>,
    pub(crate) idempotency: BTreeMap<String, JobId>,
    pub(crate) last_applied_index: u64,
    pub(crate) groups: BTreeMap<String, BTreeSet<String>>,
    pub(crate) revoked: BTreeMap<String, Revocation>,
    pub(crate) audit: Vec<AuditEntry>,
    pub(crate) key_expiry: BTreeSet<(u64, String)>,
    pub(crate) usage: BTreeMap<u64, crate::usage::UsageHour>,
    pub(crate) usage_clock_ms: u64,
    pub(crate) events: Vec<quotient_common::event::Event>,
    pub(crate) events_issued: u64,
    pub(crate) aws: crate::aws::AwsState,
}

impl From<StateDataV6> for StateData {
    fn from(v6: StateDataV6) -> StateData {
        StateData {
            shares: v6.shares,
            jobs: v6.jobs,
            node_ids: v6.node_ids,
            nodes: v6.nodes,
            idempotency: v6.idempotency.into_iter().collect(),
            last_applied_index: v6.last_applied_index,
            groups: v6.groups,
            revoked: v6.revoked,
            audit: v6.audit.into_iter().collect(),
            key_expiry: v6.key_expiry.into_iter().collect(),
            usage: v6.usage.into_iter().collect(),
            usage_clock_ms: v6.usage_clock_ms,
            events: v6.events.into_iter().collect(),
            events_issued: v6.events_issued,
            aws: v6.aws,
            sessions: Default::default(),
            checkpoints: Default::default(),
            clock_ms: 0,
        }
    }
}
