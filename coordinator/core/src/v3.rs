//! Version 3 of the snapshot state, kept so that this build reads what the previous one wrote
//! (`quotient_common::version` says why and how). Each type here is frozen as version 3 encoded
//! it, field for field, and converts into today's type; versions 1 and 2 ([`crate::v1`],
//! [`crate::v2`]) convert into today's types directly. Nothing here is ever written. The Raft
//! log's commands did not change in version 4 of the snapshot state: its version stays 3.
//!
//! Version 4 of the snapshot state keeps every revoked serial of a name (`Revocation`), where
//! version 3 kept one; the job table holds the number of ids issued, since finished jobs are
//! removed once their retention ends (`crate::retention`); and the idempotency keys of removed
//! jobs wait to expire (`StateData::key_expiry`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use quotient_common::JobId;

use crate::job_table::{JobTable, RecordsInto};
use crate::state::{AuditEntry, NodeId, NodeRecord, Revocation, ShareRecord, StateData};

/// A revocation as version 3 kept it: at most one serial; `None` for every certificate of the
/// name.
#[derive(Deserialize)]
pub struct RevocationV3 {
    pub(crate) serial: Option<String>,
    pub(crate) at_ms: u64,
}

impl From<RevocationV3> for Revocation {
    fn from(v3: RevocationV3) -> Revocation {
        Revocation {
            serials: v3.serial.into_iter().collect(),
            at_ms: v3.at_ms,
        }
    }
}

/// The job table as version 3 encoded it: every record, ids dense from 1 (no job was ever
/// removed), without the count of ids issued.
pub struct JobTableV3(JobTable);

impl<'de> Deserialize<'de> for JobTableV3 {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<JobTableV3, D::Error> {
        let mut table = JobTable::new();
        serde::de::DeserializeSeed::deserialize(RecordsInto(&mut table), deserializer)?;
        Ok(JobTableV3(table))
    }
}

/// `StateData` as version 3 of the snapshot state encoded it.
#[derive(Deserialize)]
pub struct StateDataV3 {
    pub(crate) shares: BTreeMap<String, ShareRecord>,
    pub(crate) jobs: JobTableV3,
    pub(crate) node_ids: BTreeMap<String, NodeId>,
    pub(crate) nodes: Vec<NodeRecord>,
    pub(crate) idempotency: BTreeMap<String, JobId>,
    pub(crate) last_applied_index: u64,
    pub(crate) groups: BTreeMap<String, BTreeSet<String>>,
    pub(crate) revoked: BTreeMap<String, RevocationV3>,
    pub(crate) audit: Vec<AuditEntry>,
}

impl From<StateDataV3> for StateData {
    fn from(v3: StateDataV3) -> StateData {
        StateData {
            shares: v3.shares,
            jobs: v3.jobs.0,
            node_ids: v3.node_ids,
            nodes: v3.nodes,
            idempotency: v3.idempotency.into_iter().collect(),
            last_applied_index: v3.last_applied_index,
            groups: v3.groups,
            revoked: v3
                .revoked
                .into_iter()
                .map(|(name, revocation)| (name, revocation.into()))
                .collect(),
            audit: v3.audit.into_iter().collect(),
            ..StateData::default()
        }
    }
}
