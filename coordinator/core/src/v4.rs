//! Version 4 of the snapshot state, kept so that this build reads what the previous one wrote
//! (`quotient_common::version` says why and how). Version 5 adds the recent events at the end
//! of `StateData` (`crate::events`); every field before them is as version 4 encoded it, so
//! version 4 reads as today's types without them. Nothing here is ever written. The Raft
//! log's commands did not change: its version stays 4.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use quotient_common::JobId;

use crate::job_table::JobTable;
use crate::state::{AuditEntry, NodeId, NodeRecord, Revocation, ShareRecord, StateData};

/// `StateData` as version 4 of the snapshot state encoded it.
#[derive(Deserialize)]
pub struct StateDataV4 {
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
}

impl From<StateDataV4> for StateData {
    fn from(v4: StateDataV4) -> StateData {
        StateData {
            shares: v4.shares,
            jobs: v4.jobs,
            node_ids: v4.node_ids,
            nodes: v4.nodes,
            idempotency: v4.idempotency.into_iter().collect(),
            last_applied_index: v4.last_applied_index,
            groups: v4.groups,
            revoked: v4.revoked,
            audit: v4.audit.into_iter().collect(),
            key_expiry: v4.key_expiry.into_iter().collect(),
            usage: v4.usage.into_iter().collect(),
            usage_clock_ms: v4.usage_clock_ms,
            events: imbl::Vector::new(),
            events_issued: 0,
            aws: Default::default(),
            sessions: Default::default(),
            checkpoints: Default::default(),
            clock_ms: 0,
        }
    }
}
