//! Version 5 of the snapshot state, kept so that this build reads what the previous one wrote
//! (`quotient_common::version` says why and how). Version 6 adds the AWS endpoint's access
//! keys, objects and service jobs at the end of `StateData` (`crate::aws`); every field before
//! them is as version 5 encoded it, so version 5 reads as today's types without them. Nothing
//! here is ever written.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use quotient_common::JobId;

use crate::job_table::JobTable;
use crate::state::{AuditEntry, NodeId, NodeRecord, Revocation, ShareRecord, StateData};

/// `StateData` as version 5 of the snapshot state encoded it.
#[derive(Deserialize)]
pub struct StateDataV5 {
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
}

impl From<StateDataV5> for StateData {
    fn from(v5: StateDataV5) -> StateData {
        StateData {
            shares: v5.shares,
            jobs: v5.jobs,
            node_ids: v5.node_ids,
            nodes: v5.nodes,
            idempotency: v5.idempotency.into_iter().collect(),
            last_applied_index: v5.last_applied_index,
            groups: v5.groups,
            revoked: v5.revoked,
            audit: v5.audit.into_iter().collect(),
            key_expiry: v5.key_expiry.into_iter().collect(),
            usage: v5.usage.into_iter().collect(),
            usage_clock_ms: v5.usage_clock_ms,
            events: v5.events.into_iter().collect(),
            events_issued: v5.events_issued,
            aws: Default::default(),
            sessions: Default::default(),
            checkpoints: Default::default(),
            clock_ms: 0,
        }
    }
}
