//! Who may do what (docs/tenancy.md): commands made for a caller ([`Command::As`]) are checked
//! against the caller's rights here, inside `apply`, so that every replica decides alike and a
//! membership changed by an earlier entry is never missed; groups and revoked certificates;
//! and the audit log of admin actions and refusals.

use quotient_common::name::validate_name;
use quotient_common::{JobSpec, NodeState, ShareState};

use crate::command::{ApplyCtx, Caller, Command, Outcome, Rejection};
use crate::state::{AuditEntry, Revocation, State, AUDIT_ENTRIES_MAX};

/// The most users one group lists.
pub const GROUP_USERS_MAX: usize = 1_000;
/// The most groups.
pub const GROUPS_MAX: usize = 1_000;
/// The longest action or reason text an audit entry keeps.
pub const AUDIT_TEXT_BYTES_MAX: usize = 512;

impl State {
    /// Applies `command` for `caller`: checks their rights, applies it, and records it in the
    /// audit log when the caller is an admin or was refused for lack of rights.
    pub(crate) fn apply_as(&mut self, caller: Caller, command: Command, ctx: ApplyCtx) -> Outcome {
        let action = self.describe(&command);
        let outcome = match self.check_rights(&caller, command) {
            Ok(command) => {
                self.acting = Some(caller.name.clone());
                let outcome = crate::apply::apply_inner(self, command, ctx);
                self.acting = None;
                outcome
            }
            Err(rejection) => Outcome::Rejected(rejection),
        };
        let refused = matches!(&outcome, Outcome::Rejected(Rejection::Forbidden(_)));
        if caller.admin || refused {
            let text = match &outcome {
                Outcome::Rejected(rejection) => format!("refused: {rejection}"),
                _ => "ok".to_string(),
            };
            self.audit(ctx, caller.identity(), action, text);
        }
        outcome
    }

    /// Records a refusal decided outside `apply`.
    pub(crate) fn record_refusal(
        &mut self,
        caller: &Caller,
        action: String,
        reason: String,
        ctx: ApplyCtx,
    ) -> Outcome {
        self.audit(ctx, caller.identity(), action, format!("refused: {reason}"));
        Outcome::Done
    }

    fn audit(&mut self, ctx: ApplyCtx, who: String, action: String, outcome: String) {
        if self.data.audit.len() >= AUDIT_ENTRIES_MAX {
            self.data.audit.pop_front();
        }
        self.data.audit.push_back(AuditEntry {
            index: ctx.log_index,
            at_ms: ctx.time_ms,
            who,
            action: bounded(action),
            outcome: bounded(outcome),
        });
    }

    /// `command` as `caller` may have it applied (a submit gets its owner), or why not.
    fn check_rights(&self, caller: &Caller, command: Command) -> Result<Command, Rejection> {
        match command {
            Command::SubmitJob(spec) => Ok(Command::SubmitJob(self.check_submit(caller, spec)?)),
            Command::SubmitServiceJob { spec, request } => Ok(Command::SubmitServiceJob {
                spec: self.check_submit(caller, spec)?,
                request,
            }),
            Command::UpdateJobPriority { job, .. } | Command::CancelJob { job } => {
                if !caller.admin {
                    if let Some(owner) = self.job(job).and_then(|j| j.spec.owner.as_deref()) {
                        if owner != caller.name {
                            return Err(Rejection::Forbidden(format!(
                                "{job} belongs to {owner}: only its owner or an admin may change it"
                            )));
                        }
                    }
                }
                Ok(command)
            }
            Command::As { .. } | Command::RecordRefusal { .. } | Command::InSession { .. } => Err(
                Rejection::Forbidden("a command for a caller cannot hold another one".into()),
            ),
            command if caller.admin => Ok(command),
            _ => Err(Rejection::Forbidden(format!(
                "user {} may not do this; it needs an admin certificate",
                caller.name
            ))),
        }
    }

    /// A submit's spec as `caller` may submit it (with its owner), or why not.
    fn check_submit(&self, caller: &Caller, mut spec: JobSpec) -> Result<JobSpec, Rejection> {
        spec.owner = Some(caller.name.clone());
        if let Some(share) = self.share(&spec.share) {
            let groups = self.groups_of(&caller.name);
            if !caller.admin && !share.spec.admits_user(&caller.name, &groups) {
                return Err(Rejection::Forbidden(format!(
                    "user {} is not a member of share {}: ask an admin to add them \
                     (quotient share update {} --add-member {})",
                    caller.name, share.spec.name, share.spec.name, caller.name
                )));
            }
            if let Some(max) = share.spec.max_jobs_per_user {
                let jobs = self.active_jobs_of(&spec.share, &caller.name);
                // A resent submit (same idempotency key) is answered, not counted.
                let resent = spec
                    .idempotency_key
                    .as_ref()
                    .is_some_and(|key| self.data.idempotency.contains_key(key));
                if jobs >= max && !resent {
                    return Err(Rejection::UserJobLimit {
                        user: caller.name.clone(),
                        share: spec.share.clone(),
                        jobs,
                    });
                }
            }
        }
        Ok(spec)
    }

    /// The groups naming `user`.
    pub fn groups_of(&self, user: &str) -> Vec<&str> {
        self.data
            .groups
            .iter()
            .filter(|(_, users)| users.contains(user))
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Whether `user` (not an admin) may see and use share `share`.
    pub fn user_may_use(&self, user: &str, share: &str) -> bool {
        self.share(share)
            .is_some_and(|s| s.spec.admits_user(user, &self.groups_of(user)))
    }

    /// Jobs of `owner` in `share` that are queued or hold GPUs.
    fn active_jobs_of(&self, share: &str, owner: &str) -> u32 {
        let Some(classes) = self.index.shares.get(share) else {
            return 0;
        };
        classes
            .values()
            .flat_map(|index| {
                index
                    .runnable
                    .iter()
                    .map(|(_, id)| *id)
                    .chain(index.holding.iter().map(|(_, _, id)| *id))
            })
            .filter_map(|id| self.job(id))
            .filter(|job| job.spec.owner.as_deref() == Some(owner) && !job.state.is_terminal())
            .count() as u32
    }

    pub(crate) fn create_group(&mut self, name: String, users: Vec<String>) -> Outcome {
        if let Err(e) = validate_name("group", &name) {
            return Outcome::Rejected(Rejection::Invalid(e));
        }
        if self.data.groups.contains_key(&name) {
            return Outcome::Rejected(Rejection::DuplicateGroup(name));
        }
        if self.data.groups.len() >= GROUPS_MAX {
            return Outcome::Rejected(Rejection::TooMany {
                what: "groups".into(),
                max: GROUPS_MAX as u64,
            });
        }
        self.data.groups.insert(name.clone(), Default::default());
        self.update_group(name, users, Vec::new())
    }

    pub(crate) fn update_group(
        &mut self,
        name: String,
        add: Vec<String>,
        remove: Vec<String>,
    ) -> Outcome {
        let Some(users) = self.data.groups.get(&name) else {
            return Outcome::Rejected(Rejection::UnknownGroup(name));
        };
        for user in &add {
            if let Err(e) = validate_name("user", user) {
                return Outcome::Rejected(Rejection::Invalid(e));
            }
        }
        let mut next = users.clone();
        next.extend(add);
        for user in &remove {
            next.remove(user);
        }
        if next.len() > GROUP_USERS_MAX {
            return Outcome::Rejected(Rejection::TooMany {
                what: format!("users in group {name}"),
                max: GROUP_USERS_MAX as u64,
            });
        }
        self.data.groups.insert(name, next);
        Outcome::Done
    }

    pub(crate) fn delete_group(&mut self, name: &str) -> Outcome {
        match self.data.groups.remove(name) {
            Some(_) => Outcome::Done,
            None => Outcome::Rejected(Rejection::UnknownGroup(name.to_string())),
        }
    }

    /// Revokes `name`'s certificates. A ready node of that name (its agent's) is cordoned:
    /// nothing new goes there, and as its agent is refused from now on, its lease runs out
    /// and it is lost as any silent node is, once the agent has had the time to stop its jobs
    /// (so a requeued job never runs twice at once).
    pub(crate) fn revoke(
        &mut self,
        name: String,
        serial: Option<String>,
        ctx: ApplyCtx,
    ) -> Outcome {
        if let Err(e) = validate_name("certificate", &name) {
            return Outcome::Rejected(Rejection::Invalid(e));
        }
        if let Some(serial) = &serial {
            if !quotient_common::name::is_serial_text(serial) {
                return Outcome::Rejected(Rejection::Invalid(
                    quotient_common::SpecError::OutOfRange {
                        field: "serial".into(),
                        value: serial.chars().take(80).collect(),
                        range: "hexadecimal digits, as `openssl x509 -serial` prints them".into(),
                    },
                ));
            }
        }
        let node = self
            .node_by_name(&name)
            .filter(|node| node.state == NodeState::Ready)
            .map(|node| node.name.clone());
        if let Some(node) = node {
            self.set_node_state(&node, NodeState::Cordoned, ctx);
        }
        // Every certificate of the name, or one more serial of it; a name revoked whole stays
        // so (a serial adds nothing to it).
        let serial = serial.as_deref().map(normalize_serial);
        match self.data.revoked.get_mut(&name) {
            Some(revocation) => {
                match serial {
                    None => revocation.serials.clear(),
                    Some(serial) if !revocation.serials.is_empty() => {
                        revocation.serials.insert(serial);
                    }
                    Some(_) => {}
                }
                revocation.at_ms = ctx.time_ms;
            }
            None => {
                self.data.revoked.insert(
                    name,
                    Revocation {
                        serials: serial.into_iter().collect(),
                        at_ms: ctx.time_ms,
                    },
                );
            }
        }
        Outcome::Done
    }

    pub(crate) fn unrevoke(&mut self, name: &str) -> Outcome {
        match self.data.revoked.remove(name) {
            Some(_) => Outcome::Done,
            None => Outcome::Rejected(Rejection::NotRevoked(name.to_string())),
        }
    }

    /// Whether a certificate of `name` with `serial` (hex, as any case, with or without
    /// colons) is revoked. `None`: the serial is not known here (a request another coordinator
    /// forwarded, which checked the certificate's serial itself), so only a revocation of
    /// every certificate of the name counts.
    pub fn is_revoked(&self, name: &str, serial: Option<&str>) -> bool {
        match self.data.revoked.get(name) {
            None => false,
            Some(revocation) if revocation.serials.is_empty() => true,
            Some(revocation) => {
                serial.is_some_and(|serial| revocation.serials.contains(&normalize_serial(serial)))
            }
        }
    }

    /// What `command` does, in words, for the audit log.
    fn describe(&self, command: &Command) -> String {
        match command {
            Command::CreateShare(spec) => format!("share create {}", spec.name),
            Command::UpdateShare { name, update } => match update.state {
                Some(ShareState::Disabled) => format!("share disable {name}"),
                _ => format!("share update {name}"),
            },
            Command::DisableShare { name } => format!("share disable {name}"),
            Command::DeleteShare { name } => format!("share delete {name}"),
            Command::SubmitJob(spec) => format!("job submit to share {}", spec.share),
            Command::UpdateJobPriority { job, priority } => {
                format!("job update {job} --priority {priority}")
            }
            Command::CancelJob { job } => format!("job cancel {job}"),
            Command::SetNodeState { node, state } => format!("node set {node} {state}"),
            Command::CordonNode { node } => format!("node cordon {node}"),
            Command::DrainNode { node } => format!("node drain {node}"),
            Command::RemoveNode { node } => format!("node remove {node}"),
            Command::CreateGroup { name, .. } => format!("group create {name}"),
            Command::UpdateGroup { name, .. } => format!("group update {name}"),
            Command::DeleteGroup { name } => format!("group delete {name}"),
            Command::Revoke { name, serial: None } => format!("certs revoke {name}"),
            Command::Revoke {
                name,
                serial: Some(serial),
            } => format!("certs revoke {name} --serial {serial}"),
            Command::Unrevoke { name } => format!("certs unrevoke {name}"),
            // Never formatted whole: it holds the secret.
            Command::CreateAccessKey { id, user, .. } => {
                format!("access-key create {id} --user {user}")
            }
            Command::DeleteAccessKey { id } => format!("access-key delete {id}"),
            Command::PutAwsObject {
                key,
                value: Some(_),
            } => format!("aws put {key}"),
            Command::PutAwsObject { key, value: None } => format!("aws delete {key}"),
            Command::SubmitServiceJob { spec, .. } => {
                format!("service job submit to share {}", spec.share)
            }
            other => {
                let text = format!("{other:?}");
                text.split([' ', '(', '{'])
                    .next()
                    .unwrap_or("command")
                    .to_string()
            }
        }
    }
}

/// A serial number in one form: lowercase hex digits, without colons or leading zeros.
fn normalize_serial(serial: &str) -> String {
    let digits: String = serial
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_string()
    } else {
        trimmed.to_string()
    }
}

fn bounded(mut text: String) -> String {
    if text.len() > AUDIT_TEXT_BYTES_MAX {
        let mut end = AUDIT_TEXT_BYTES_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
