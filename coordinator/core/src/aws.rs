//! What the AWS Batch–compatible endpoint keeps in the replicated state (docs/aws-batch.md):
//! access keys, the AWS-only objects of the API (job queues, service environments,
//! scheduling policies) and what a service job was submitted with.
//!
//! The core knows nothing of the AWS shapes: objects and submit requests are JSON text the
//! coordinator's AWS door wrote and reads back, bounded here in size and count so that no
//! client can grow the state without limit.
//!
//! An access key's secret is kept as it was issued, because SigV4 verification recomputes the
//! signature with it (a hash of the secret would not do). It is replicated like every other
//! field, so it lies in every coordinator's Raft log, snapshots and backups: those files are
//! as sensitive as the cluster's private keys (SECURITY.md).

use std::collections::BTreeMap;

use quotient_common::name::validate_name;
use quotient_common::{JobId, JobSpec, SpecError};
use serde::{Deserialize, Serialize};

use crate::command::{ApplyCtx, Outcome, Rejection};
use crate::state::State;

/// The most access keys the cluster holds.
pub const ACCESS_KEYS_MAX: usize = 10_000;
/// The most AWS objects (queues, service environments, scheduling policies).
pub const AWS_OBJECTS_MAX: usize = 10_000;
/// The longest object key or access key id.
pub const AWS_KEY_BYTES_MAX: usize = 256;
/// The largest object or service job request kept, in bytes of JSON.
pub const AWS_JSON_BYTES_MAX: usize = 64 * 1024;
/// The length of an access key's secret, in characters (AWS's own length).
pub const SECRET_CHARS: usize = 40;

/// One access key: who it signs for, and its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessKey {
    /// The user name it stands for, as a certificate's name would.
    pub user: String,
    /// Whether it carries the admin role (else the user role).
    pub admin: bool,
    pub secret: String,
    pub created_ms: u64,
}

/// The AWS endpoint's part of the replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwsState {
    /// By access key id.
    pub access_keys: BTreeMap<String, AccessKey>,
    /// By `KIND/NAME` (`queue/q1`): the object's JSON.
    pub objects: BTreeMap<String, String>,
    /// The SubmitServiceJob request of each service job still in the live state.
    pub jobs: BTreeMap<JobId, String>,
}

fn too_large(what: &str, bytes: usize, max: usize) -> Rejection {
    Rejection::Invalid(SpecError::Field(format!(
        "{what} is {bytes} bytes, over the limit of {max}: make it smaller"
    )))
}

impl State {
    /// The access key `id`, if there is one.
    pub fn access_key(&self, id: &str) -> Option<&AccessKey> {
        self.data.aws.access_keys.get(id)
    }

    /// Every access key, by id.
    pub fn access_keys(&self) -> impl Iterator<Item = (&String, &AccessKey)> {
        self.data.aws.access_keys.iter()
    }

    /// The AWS object `key` (`KIND/NAME`).
    pub fn aws_object(&self, key: &str) -> Option<&str> {
        self.data.aws.objects.get(key).map(String::as_str)
    }

    /// The AWS objects whose key starts with `prefix`, in key order.
    pub fn aws_objects<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.data
            .aws
            .objects
            .range(prefix.to_string()..)
            .take_while(move |(key, _)| key.starts_with(prefix))
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }

    /// The SubmitServiceJob request of service job `job`.
    pub fn service_job(&self, job: JobId) -> Option<&str> {
        self.data.aws.jobs.get(&job).map(String::as_str)
    }

    pub(crate) fn create_access_key(
        &mut self,
        id: String,
        user: String,
        admin: bool,
        secret: String,
        ctx: ApplyCtx,
    ) -> Outcome {
        if id.is_empty()
            || id.len() > AWS_KEY_BYTES_MAX
            || !id.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Outcome::Rejected(Rejection::Invalid(SpecError::Field(format!(
                "access key id {id:?} must be 1 to {AWS_KEY_BYTES_MAX} letters and digits"
            ))));
        }
        if secret.len() != SECRET_CHARS {
            return Outcome::Rejected(Rejection::Invalid(SpecError::Field(format!(
                "an access key's secret must be {SECRET_CHARS} characters"
            ))));
        }
        if let Err(e) = validate_name("user", &user) {
            return Outcome::Rejected(Rejection::Invalid(e));
        }
        let keys = &mut self.data.aws.access_keys;
        if keys.contains_key(&id) {
            return Outcome::Rejected(Rejection::Invalid(SpecError::Field(format!(
                "access key {id} exists already"
            ))));
        }
        if keys.len() >= ACCESS_KEYS_MAX {
            return Outcome::Rejected(Rejection::TooMany {
                what: "access keys".into(),
                max: ACCESS_KEYS_MAX as u64,
            });
        }
        keys.insert(
            id,
            AccessKey {
                user,
                admin,
                secret,
                created_ms: ctx.time_ms,
            },
        );
        Outcome::Done
    }

    pub(crate) fn delete_access_key(&mut self, id: &str) -> Outcome {
        match self.data.aws.access_keys.remove(id) {
            Some(_) => Outcome::Done,
            None => Outcome::Rejected(Rejection::UnknownAccessKey(id.to_string())),
        }
    }

    /// Sets (`Some`) or deletes (`None`) the object `key`.
    pub(crate) fn put_aws_object(&mut self, key: String, value: Option<String>) -> Outcome {
        if key.is_empty() || key.len() > AWS_KEY_BYTES_MAX {
            return Outcome::Rejected(Rejection::Invalid(SpecError::Field(format!(
                "an object's key must be 1 to {AWS_KEY_BYTES_MAX} bytes"
            ))));
        }
        let objects = &mut self.data.aws.objects;
        match value {
            Some(value) => {
                if value.len() > AWS_JSON_BYTES_MAX {
                    return Outcome::Rejected(too_large(&key, value.len(), AWS_JSON_BYTES_MAX));
                }
                if !objects.contains_key(&key) && objects.len() >= AWS_OBJECTS_MAX {
                    return Outcome::Rejected(Rejection::TooMany {
                        what: "job queues, service environments and scheduling policies".into(),
                        max: AWS_OBJECTS_MAX as u64,
                    });
                }
                objects.insert(key, value);
                Outcome::Done
            }
            None => match objects.remove(&key) {
                Some(_) => Outcome::Done,
                None => Outcome::Rejected(Rejection::UnknownAwsObject(key)),
            },
        }
    }

    /// Submits `spec` as a service job and keeps `request` with it (a resent submit, same
    /// idempotency key, keeps the first request).
    pub(crate) fn submit_service_job(
        &mut self,
        spec: JobSpec,
        request: String,
        ctx: ApplyCtx,
    ) -> Outcome {
        if request.len() > AWS_JSON_BYTES_MAX {
            return Outcome::Rejected(too_large(
                "the service job request",
                request.len(),
                AWS_JSON_BYTES_MAX,
            ));
        }
        let outcome = crate::apply::apply_inner(self, crate::Command::SubmitJob(spec), ctx);
        if let Outcome::JobSubmitted {
            job,
            duplicate: false,
        } = outcome
        {
            self.data.aws.jobs.insert(job, request);
        }
        outcome
    }

    /// Forgets what service job `job` was submitted with (it left the live state).
    pub(crate) fn forget_service_job(&mut self, job: JobId) {
        self.data.aws.jobs.remove(&job);
    }
}
