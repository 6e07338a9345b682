//! The quota share: a named virtual queue with GPU limits per class and a sharing strategy.
//!
//! See docs/quota-shares.md ("Shares"). [`ShareSpec::validate`] enforces every field rule
//! there; the state machine calls it before a share is created or changed.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

use crate::name::validate_name;
use crate::{GpuClass, SpecError};

/// A share has at least one and at most this many GPU class limits.
pub const SHARE_CLASSES_MAX: usize = 5;
/// The largest borrow limit, in percent of the share's own limit (100x).
pub const BORROW_LIMIT_PERCENT_MAX: u32 = 10_000;
/// The largest limit for one class, in GPUs.
pub const SHARE_LIMIT_GPUS_MAX: u32 = 1_000_000;

/// How a share treats its idle quota and other shares' idle capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Never lends its idle quota, never borrows.
    Reserve,
    /// Lends its idle quota, never borrows.
    Lend,
    /// Lends its idle quota, and borrows others' idle capacity when its own is full.
    LendAndBorrow,
}

impl Strategy {
    pub fn lends(self) -> bool {
        !matches!(self, Strategy::Reserve)
    }
    pub fn borrows(self) -> bool {
        matches!(self, Strategy::LendAndBorrow)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Reserve => "reserve",
            Strategy::Lend => "lend",
            Strategy::LendAndBorrow => "lend-and-borrow",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reserve" => Ok(Strategy::Reserve),
            "lend" => Ok(Strategy::Lend),
            "lend-and-borrow" => Ok(Strategy::LendAndBorrow),
            other => Err(format!(
                "unknown strategy {other:?}: use reserve, lend or lend-and-borrow"
            )),
        }
    }
}

/// Whether a share accepts new submissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShareState {
    Enabled,
    /// New submissions are refused; jobs already in run on.
    Disabled,
}

impl ShareState {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareState::Enabled => "enabled",
            ShareState::Disabled => "disabled",
        }
    }
}

impl std::str::FromStr for ShareState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "enabled" => Ok(ShareState::Enabled),
            "disabled" => Ok(ShareState::Disabled),
            other => Err(format!(
                "unknown share state {other:?}: use enabled or disabled"
            )),
        }
    }
}

/// Everything an admin states about a share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareSpec {
    pub name: String,
    /// GPUs of each class the share is entitled to.
    pub limits: BTreeMap<GpuClass, u32>,
    pub strategy: Strategy,
    /// Only with `lend-and-borrow`: how much it may borrow, in percent of its own limit per
    /// class. `None` = unlimited.
    pub borrow_limit_percent: Option<u32>,
    pub in_share_preemption: bool,
    pub state: ShareState,
    /// Who may submit to it: user names (the name in their certificate) and groups
    /// (`group:NAME`), sorted, each once. Empty: every user may (an open share).
    pub members: Vec<String>,
    /// The most jobs one user may have queued or running in it at once; `None`: no cap.
    pub max_jobs_per_user: Option<u32>,
}

/// The most members one share lists.
pub const SHARE_MEMBERS_MAX: usize = 1_000;

/// Checks a share member: a user name, or `group:NAME`.
pub fn validate_member(member: &str) -> Result<(), SpecError> {
    match member.strip_prefix("group:") {
        Some(group) => validate_name("group", group),
        None => validate_name("user", member),
    }
}

impl ShareSpec {
    /// Checks every field rule of docs/quota-shares.md.
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_name("share", &self.name)?;
        if self.limits.is_empty() || self.limits.len() > SHARE_CLASSES_MAX {
            return Err(SpecError::LimitCount(self.limits.len() as u32));
        }
        for (class, gpus) in &self.limits {
            GpuClass::parse(class.as_str())?;
            if *gpus == 0 {
                return Err(SpecError::LimitZero(class.to_string()));
            }
            if *gpus > SHARE_LIMIT_GPUS_MAX {
                return Err(SpecError::TooLong {
                    field: format!("limit for {class}"),
                    max: SHARE_LIMIT_GPUS_MAX,
                });
            }
        }
        if self.members.len() > SHARE_MEMBERS_MAX {
            return Err(SpecError::TooMany {
                field: "members".into(),
                max: SHARE_MEMBERS_MAX as u32,
            });
        }
        for member in &self.members {
            validate_member(member)?;
        }
        if self.max_jobs_per_user == Some(0) {
            return Err(SpecError::OutOfRange {
                field: "max jobs per user".into(),
                value: "0".into(),
                range: "1 or more (leave it out for no cap)".into(),
            });
        }
        if let Some(percent) = self.borrow_limit_percent {
            if !self.strategy.borrows() {
                return Err(SpecError::BorrowLimitWithoutBorrowing(
                    self.strategy.to_string(),
                ));
            }
            if percent > BORROW_LIMIT_PERCENT_MAX {
                return Err(SpecError::TooLong {
                    field: "borrow limit percent".to_string(),
                    max: BORROW_LIMIT_PERCENT_MAX,
                });
            }
        }
        Ok(())
    }

    /// The most GPUs of `class` the share may hold: its limit plus its borrow limit.
    /// `None` = no cap beyond the capacity that can be borrowed.
    pub fn usage_cap(&self, class: &GpuClass) -> Option<u64> {
        let limit = u64::from(self.limits.get(class).copied().unwrap_or(0));
        if !self.strategy.borrows() {
            return Some(limit);
        }
        self.borrow_limit_percent
            .map(|percent| limit + limit * u64::from(percent) / 100)
    }

    /// This spec with an update applied (not yet validated).
    pub fn updated(&self, update: &ShareUpdate) -> ShareSpec {
        let mut next = self.clone();
        if let Some(limits) = &update.limits {
            // Limits given in an update replace those classes and keep the others.
            for (class, gpus) in limits {
                next.limits.insert(class.clone(), *gpus);
            }
        }
        if let Some(strategy) = update.strategy {
            next.strategy = strategy;
            if !strategy.borrows() && update.borrow_limit_percent.is_none() {
                next.borrow_limit_percent = None;
            }
        }
        if let Some(percent) = update.borrow_limit_percent {
            next.borrow_limit_percent = percent;
        }
        if let Some(on) = update.in_share_preemption {
            next.in_share_preemption = on;
        }
        if let Some(state) = update.state {
            next.state = state;
        }
        if let Some(members) = &update.members {
            next.members = members.clone();
        }
        next.members.extend(update.add_members.iter().cloned());
        next.members.retain(|m| !update.remove_members.contains(m));
        next.members.sort();
        next.members.dedup();
        if let Some(cap) = update.max_jobs_per_user {
            next.max_jobs_per_user = cap;
        }
        next
    }

    /// Whether `user`, in `groups` (the groups naming them), may submit to the share.
    pub fn admits_user(&self, user: &str, groups: &[&str]) -> bool {
        self.members.is_empty()
            || self
                .members
                .iter()
                .any(|member| match member.strip_prefix("group:") {
                    Some(group) => groups.contains(&group),
                    None => member == user,
                })
    }
}

/// A change to a share; `None` fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareUpdate {
    pub limits: Option<BTreeMap<GpuClass, u32>>,
    pub strategy: Option<Strategy>,
    /// `Some(None)` removes the borrow limit.
    pub borrow_limit_percent: Option<Option<u32>>,
    pub in_share_preemption: Option<bool>,
    pub state: Option<ShareState>,
    /// Replaces the members (an empty list opens the share to every user).
    pub members: Option<Vec<String>>,
    pub add_members: Vec<String>,
    pub remove_members: Vec<String>,
    /// `Some(None)` removes the cap.
    pub max_jobs_per_user: Option<Option<u32>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(strategy: Strategy) -> ShareSpec {
        ShareSpec {
            name: "qs1".into(),
            limits: [(GpuClass::parse("a10g").unwrap(), 1)].into(),
            strategy,
            borrow_limit_percent: None,
            in_share_preemption: false,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        }
    }

    #[test]
    fn a_valid_share_passes() {
        assert_eq!(spec(Strategy::Reserve).validate(), Ok(()));
        let mut s = spec(Strategy::LendAndBorrow);
        s.borrow_limit_percent = Some(200);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.usage_cap(&GpuClass::parse("a10g").unwrap()), Some(3));
    }

    #[test]
    fn a_borrow_limit_needs_lend_and_borrow() {
        let mut s = spec(Strategy::Lend);
        s.borrow_limit_percent = Some(100);
        assert!(matches!(
            s.validate(),
            Err(SpecError::BorrowLimitWithoutBorrowing(_))
        ));
    }

    #[test]
    fn limits_need_one_to_five_classes_of_at_least_one_gpu() {
        let mut s = spec(Strategy::Lend);
        s.limits.clear();
        assert_eq!(s.validate(), Err(SpecError::LimitCount(0)));
        for i in 0..6 {
            s.limits
                .insert(GpuClass::parse(&format!("c{i}")).unwrap(), 1);
        }
        assert_eq!(s.validate(), Err(SpecError::LimitCount(6)));
        let mut s = spec(Strategy::Lend);
        s.limits.insert(GpuClass::parse("h100").unwrap(), 0);
        assert!(matches!(s.validate(), Err(SpecError::LimitZero(_))));
    }

    #[test]
    fn an_update_keeps_unnamed_fields() {
        let s = spec(Strategy::LendAndBorrow);
        let next = s.updated(&ShareUpdate {
            borrow_limit_percent: Some(Some(50)),
            ..ShareUpdate::default()
        });
        assert_eq!(next.borrow_limit_percent, Some(50));
        assert_eq!(next.limits, s.limits);
        let next = next.updated(&ShareUpdate {
            strategy: Some(Strategy::Lend),
            ..ShareUpdate::default()
        });
        assert_eq!(next.borrow_limit_percent, None);
        assert_eq!(next.validate(), Ok(()));
    }
}
