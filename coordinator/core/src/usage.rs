//! GPU time per share and class, counted as it passes: how many GPU-milliseconds each share
//! used of its own quota, borrowed from others, and lent to others, by the hour
//! (docs/accounting.md). It is part of the replicated state, so every replica counts the same
//! and a snapshot carries it.
//!
//! Between two commands the GPUs each share holds do not change. When a command at time `t`
//! (the leader's stamp on its entry) that may change them is applied, or the first of a new
//! hour, the time since the last credit is credited at the rates the state had before it;
//! between those, the time waits (a query adds it at the rates of the moment, which have not
//! changed since). A rejected command changes nothing, not even this. The rates are
//! recomputed only after a command that may change them. Time never runs backwards here: a stamp older than the last one (a new
//! leader whose clock is behind) credits nothing.
//!
//! The split follows `share list`: a share's GPUs up to its limit are its own, the rest are
//! borrowed; what the shares borrow beyond the GPUs no share is entitled to (the healthy GPUs of
//! the schedulable nodes beyond the sum of the limits) is counted as lent by the lending shares
//! with idle quota, in name order, and what is left after them by the other shares with idle
//! quota (a share switched to `reserve` while others borrowed its idle GPUs), in name order.

use std::collections::BTreeMap;

use quotient_common::GpuClass;
use serde::{Deserialize, Serialize};

use crate::command::Command;
use crate::rules::limit_of;
use crate::state::State;

/// The length of one bucket of usage: an hour.
pub const USAGE_BUCKET_MS: u64 = 3_600_000;

/// The longest gap between two commands that is credited: a leader whose clock jumped years
/// ahead must not make every replica fill years of buckets. Beyond it, only the last this
/// long is credited.
pub const USAGE_GAP_MAX_MS: u64 = 400 * 86_400_000;

/// One bucket's key: the hour's start (ms since the epoch), the share, the GPU class.
pub type UsageKey = (u64, String, String);

/// One hour's buckets: share, then GPU class, to its GPU time. Nested by name so that crediting
/// an hour looks each share and class up without making a key.
pub type UsageHour = BTreeMap<String, BTreeMap<String, UsageCell>>;

/// GPU-milliseconds of one share and class in one hour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageCell {
    /// Within the share's own limit.
    pub own_ms: u64,
    /// Beyond its limit: borrowed from others' idle quota or from GPUs no share is entitled to.
    pub borrowed_ms: u64,
    /// Its idle quota that others borrowed.
    pub lent_ms: u64,
}

impl UsageCell {
    pub fn add(&mut self, other: &UsageCell) {
        self.own_ms += other.own_ms;
        self.borrowed_ms += other.borrowed_ms;
        self.lent_ms += other.lent_ms;
    }

    pub fn is_empty(&self) -> bool {
        self.own_ms == 0 && self.borrowed_ms == 0 && self.lent_ms == 0
    }

    /// `rate` held for `span_ms`.
    fn of(rate: &Rates, span_ms: u64) -> UsageCell {
        UsageCell {
            own_ms: rate.own * span_ms,
            borrowed_ms: rate.borrowed * span_ms,
            lent_ms: rate.lent * span_ms,
        }
    }
}

/// GPUs of one share and class at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rates {
    pub own: u64,
    pub borrowed: u64,
    pub lent: u64,
}

/// What every share holds of every class now, split as the module docs say; shares and
/// classes with nothing left out.
pub fn usage_rates(state: &State) -> BTreeMap<(String, GpuClass), Rates> {
    let mut rates: BTreeMap<(String, GpuClass), Rates> = BTreeMap::new();
    let mut borrowed_total: BTreeMap<&GpuClass, u64> = BTreeMap::new();
    let mut limits_total: BTreeMap<&GpuClass, u64> = BTreeMap::new();
    for share in state.shares() {
        for (class, limit) in &share.spec.limits {
            *limits_total.entry(class).or_insert(0) += u64::from(*limit);
        }
    }
    for (name, classes) in &state.index.shares {
        let spec = state.share(name).map(|share| &share.spec);
        for (class, index) in classes {
            if index.usage == 0 {
                continue;
            }
            let limit = spec.map_or(0, |spec| limit_of(spec, class));
            let own = index.usage.min(limit);
            let borrowed = index.usage - own;
            rates.insert(
                (name.clone(), class.clone()),
                Rates {
                    own,
                    borrowed,
                    lent: 0,
                },
            );
            *borrowed_total.entry(class).or_insert(0) += borrowed;
        }
    }
    for (class, borrowed) in borrowed_total {
        let fleet = state
            .index
            .capacity
            .get(class)
            .map_or(0, |capacity| capacity.healthy_total);
        let free_pool = fleet.saturating_sub(limits_total.get(class).copied().unwrap_or(0));
        let mut from_lenders = borrowed.saturating_sub(free_pool);
        // The shares that lend first; then, for what is left, those that do not lend now
        // but whose idle quota is borrowed all the same: a share switched to `reserve`
        // while others ran on its idle quota lends those GPUs until their jobs end or are
        // reclaimed (found by probing: they were counted as borrowed and lent by none).
        for lending in [true, false] {
            for share in state.shares() {
                if from_lenders == 0 {
                    break;
                }
                if share.spec.strategy.lends() != lending || !share.spec.limits.contains_key(class)
                {
                    continue;
                }
                let usage = state.usage(&share.spec.name, class);
                let idle = limit_of(&share.spec, class).saturating_sub(usage);
                let lent = idle.min(from_lenders);
                if lent > 0 {
                    from_lenders -= lent;
                    rates
                        .entry((share.spec.name.clone(), class.clone()))
                        .or_default()
                        .lent = lent;
                }
            }
        }
    }
    rates
}

/// Whether applying `command` may change what the shares hold or the fleet they share; the
/// rates are recomputed after those only.
pub(crate) fn may_change_rates(command: &Command) -> bool {
    match command {
        Command::As { command, .. } | Command::InSession { command, .. } => {
            may_change_rates(command)
        }
        Command::SubmitJob(_)
        | Command::UpdateJobPriority { .. }
        | Command::CheckDigest { .. }
        | Command::RecordRefusal { .. }
        | Command::CreateGroup { .. }
        | Command::UpdateGroup { .. }
        | Command::DeleteGroup { .. }
        | Command::Unrevoke { .. } => false,
        _ => true,
    }
}

/// The hours from `from_ms` to `now_ms` (at most the last [`USAGE_GAP_MAX_MS`]): each hour's
/// start and the milliseconds of it in the span.
fn hour_spans(from_ms: u64, now_ms: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut at = from_ms.max(now_ms.saturating_sub(USAGE_GAP_MAX_MS));
    std::iter::from_fn(move || {
        if at >= now_ms {
            return None;
        }
        let hour = at - at % USAGE_BUCKET_MS;
        let end = now_ms.min(hour + USAGE_BUCKET_MS);
        let span = end - at;
        at = end;
        Some((hour, span))
    })
}

impl State {
    /// Whether `now_ms` is in another hour than the last credit (or nothing was credited yet).
    pub(crate) fn usage_hour_turned(&self, now_ms: u64) -> bool {
        let clock = self.data.usage_clock_ms;
        clock == 0 || now_ms / USAGE_BUCKET_MS != clock / USAGE_BUCKET_MS
    }

    /// Computes the rates before a command at `now_ms` changes the state, if they are needed
    /// to credit the time up to it and were forgotten.
    pub(crate) fn keep_rates_before(&mut self, now_ms: u64) {
        if self.rates.is_none() && now_ms > self.data.usage_clock_ms {
            self.rates = Some(usage_rates(self));
        }
    }

    /// Credits the time from the last command to `now_ms` at the rates the state had since
    /// (kept by [`State::keep_rates_before`] before the command that just applied).
    pub(crate) fn advance_usage(&mut self, now_ms: u64) {
        let from = self.data.usage_clock_ms;
        if now_ms <= from {
            return;
        }
        self.data.usage_clock_ms = now_ms;
        if from == 0 {
            return;
        }
        let rates = match self.rates.take() {
            Some(rates) => rates,
            None => usage_rates(self),
        };
        if !rates.is_empty() {
            for (hour, span) in hour_spans(from, now_ms) {
                let shares = self.data.usage.entry(hour).or_default();
                for ((share, class), rate) in &rates {
                    if !shares.contains_key(share.as_str()) {
                        shares.insert(share.clone(), BTreeMap::new());
                    }
                    let classes = shares.get_mut(share.as_str()).expect("just made");
                    if !classes.contains_key(class.as_str()) {
                        classes.insert(class.to_string(), UsageCell::default());
                    }
                    let cell = classes.get_mut(class.as_str()).expect("just made");
                    cell.add(&UsageCell::of(rate, span));
                }
            }
        }
        self.rates = Some(rates);
    }

    /// What the time from the last command to `now_ms` adds at the rates the state has now, by
    /// hour: the part of the usage no command has credited yet (on a quiet cluster, hours).
    /// Nothing is changed.
    pub fn pending_usage(&self, now_ms: u64) -> Vec<(UsageKey, UsageCell)> {
        let from = self.data.usage_clock_ms;
        if from == 0 || now_ms <= from {
            return Vec::new();
        }
        let computed;
        let rates = match &self.rates {
            Some(rates) => rates,
            None => {
                computed = usage_rates(self);
                &computed
            }
        };
        let mut cells = Vec::new();
        for (hour, span) in hour_spans(from, now_ms) {
            for ((share, class), rate) in rates {
                cells.push((
                    (hour, share.clone(), class.to_string()),
                    UsageCell::of(rate, span),
                ));
            }
        }
        cells
    }

    /// Forgets the rates after a command that may have changed them.
    pub(crate) fn rates_changed(&mut self) {
        self.rates = None;
    }

    /// Drops the buckets of hours that ended before `before_ms`.
    pub(crate) fn prune_usage(&mut self, before_ms: u64) {
        while let Some(hour) = self.data.usage.get_min().map(|(hour, _)| *hour) {
            if hour + USAGE_BUCKET_MS > before_ms {
                break;
            }
            self.data.usage.remove(&hour);
        }
    }

    /// The buckets of hours that overlap `[from_ms, to_ms)`, in key order.
    pub fn usage_between(
        &self,
        from_ms: u64,
        to_ms: u64,
    ) -> impl Iterator<Item = ((u64, &String, &String), &UsageCell)> + '_ {
        let start = from_ms - from_ms % USAGE_BUCKET_MS;
        self.data
            .usage
            .range(start..to_ms.max(start))
            .flat_map(|(hour, shares)| {
                shares.iter().flat_map(move |(share, classes)| {
                    classes
                        .iter()
                        .map(move |(class, cell)| ((*hour, share, class), cell))
                })
            })
    }
}
