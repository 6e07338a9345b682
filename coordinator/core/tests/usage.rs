//! GPU time per share (docs/accounting.md): counted between commands at the rates the state
//! had, split into own, borrowed and lent, by the hour; the same on every replica.

mod support;

use quotient_common::{JobState, Strategy};
use quotient_core::usage::{UsageCell, USAGE_BUCKET_MS};
use quotient_core::{apply, Command, State};
use support::*;

const HOUR: u64 = USAGE_BUCKET_MS;

/// Every share's total over all hours and classes.
fn totals(state: &State) -> std::collections::BTreeMap<String, UsageCell> {
    let mut totals = std::collections::BTreeMap::new();
    for ((_, share, _), cell) in state.usage_between(0, u64::MAX) {
        totals
            .entry(share.clone())
            .or_insert_with(UsageCell::default)
            .add(cell);
    }
    totals
}

/// A node of 4 GPUs at 10 h, a `lend` share `lender` and a `lend-and-borrow` share
/// `borrower` of 2 each, and 3 jobs of one GPU submitted to the borrower (not yet placed): 2 on
/// its own quota, 1 borrowed from the lender's idle quota (the fleet has no GPUs beyond the
/// limits).
fn lender_and_borrower() -> (Sim, Vec<quotient_common::JobId>) {
    let mut sim = Sim::new();
    sim.time_ms = 10 * HOUR; // on an hour
    sim.ok(Command::RegisterNode(node("n1", 4, "a10g")));
    sim.ok(Command::CreateShare(share("lender", Strategy::Lend, 2)));
    sim.ok(Command::CreateShare(share(
        "borrower",
        Strategy::LendAndBorrow,
        2,
    )));
    let jobs = (0..3)
        .map(|n| sim.submit(job("borrower", &format!("b{n}"), 1, 1)))
        .collect();
    (sim, jobs)
}

#[test]
fn a_lender_lends_what_a_borrower_borrows_and_each_share_is_charged_by_the_hour() {
    let (mut sim, jobs) = lender_and_borrower();
    // GPUs count from the plan that gives them, not from when the jobs run.
    sim.round();
    let started = sim.time_ms;
    sim.settle();
    for id in &jobs {
        assert_eq!(sim.state_of(*id), JobState::Running);
    }
    // Two hours pass; the next command credits them.
    sim.time_ms += 2 * HOUR;
    sim.ok(Command::CheckDigest { leader: None });
    sim.ok(Command::SetGpuHealth {
        node: "n1".into(),
        index: 3,
        healthy: true,
    });
    let elapsed = sim.time_ms - started;
    let totals = totals(&sim.state);
    let borrower = totals["borrower"];
    let lender = totals["lender"];
    assert_eq!(borrower.own_ms, 2 * elapsed, "{borrower:?}");
    assert_eq!(borrower.borrowed_ms, elapsed, "{borrower:?}");
    assert_eq!(borrower.lent_ms, 0);
    assert_eq!(lender.lent_ms, elapsed, "{lender:?}");
    assert_eq!(lender.own_ms + lender.borrowed_ms, 0);
    // Split at hour boundaries: no bucket holds more than an hour of 3 GPUs.
    for (_, cell) in sim.state.usage_between(0, u64::MAX) {
        assert!(cell.own_ms + cell.borrowed_ms <= 3 * HOUR, "{cell:?}");
    }
    let hours: std::collections::BTreeSet<u64> = sim
        .state
        .usage_between(0, u64::MAX)
        .map(|((hour, _, _), _)| hour)
        .collect();
    assert_eq!(hours.len(), 3, "{hours:?}");

    // A job ends: the rates drop from its end on.
    sim.finish(jobs[2], 0);
    let before = totals_of(&sim.state, "borrower");
    sim.time_ms += HOUR;
    sim.ok(Command::SetGpuHealth {
        node: "n1".into(),
        index: 3,
        healthy: true,
    });
    let after = totals_of(&sim.state, "borrower");
    assert_eq!(after.own_ms - before.own_ms, 2 * (HOUR + 10));
    assert_eq!(
        after.borrowed_ms, before.borrowed_ms,
        "nothing borrowed any more"
    );

    // A replica replaying the log counts exactly the same.
    let mut replica = State::new();
    for (command, ctx) in &sim.log {
        apply(&mut replica, command.clone(), *ctx);
    }
    assert_eq!(replica.to_snapshot_bytes(), sim.state.to_snapshot_bytes());
}

fn totals_of(state: &State, share: &str) -> UsageCell {
    totals(state).get(share).copied().unwrap_or_default()
}

#[test]
fn a_stamp_older_than_the_last_credits_nothing_and_old_hours_are_pruned() {
    let mut sim = Sim::new();
    sim.time_ms = 100 * HOUR;
    sim.ok(Command::RegisterNode(node("n1", 1, "a10g")));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 1)));
    let id = sim.submit(job("team", "run", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    sim.time_ms += HOUR;
    sim.ok(Command::CheckDigest { leader: None });
    let counted = totals_of(&sim.state, "team");
    // A new leader whose clock is an hour behind.
    sim.time_ms -= 2 * HOUR;
    sim.ok(Command::SetGpuHealth {
        node: "n1".into(),
        index: 0,
        healthy: true,
    });
    assert_eq!(
        totals_of(&sim.state, "team"),
        counted,
        "time did not run backwards"
    );
    // Retention of usage: hours that ended over a day ago go.
    sim.time_ms += 30 * HOUR;
    let rule = quotient_core::retention::RetentionRule {
        finished_ms: 365 * 24 * HOUR,
        finished_max: 1_000,
        key_window_ms: HOUR,
        usage_ms: 24 * HOUR,
    };
    assert!(sim.state.expiry_due(&rule, sim.time_ms + 10));
    sim.ok(Command::ExpireFinished(rule));
    let oldest = sim
        .state
        .usage_between(0, u64::MAX)
        .map(|((hour, _, _), _)| hour)
        .min()
        .expect("recent hours are kept");
    assert!(oldest + HOUR > sim.time_ms - 24 * HOUR, "{oldest}");
}

#[test]
fn a_share_switched_to_reserve_while_borrowed_from_counts_those_gpus_as_lent() {
    let (mut sim, jobs) = lender_and_borrower();
    sim.settle();
    for id in &jobs {
        assert_eq!(sim.state_of(*id), JobState::Running);
    }
    // The lender stops lending: the borrowed job runs on, on its idle quota.
    sim.ok(Command::UpdateShare {
        name: "lender".into(),
        update: quotient_common::ShareUpdate {
            strategy: Some(Strategy::Reserve),
            ..Default::default()
        },
    });
    sim.settle();
    assert_eq!(sim.state_of(jobs[2]), JobState::Running);
    let accounts = quotient_core::share_accounts(&sim.state);
    let a10g = class("a10g");
    assert_eq!(accounts["borrower"].borrowed[&a10g], 1);
    // Every borrowed GPU is lent by someone (it was lent by none).
    assert_eq!(accounts["lender"].lent[&a10g], 1, "{accounts:?}");
    let switched = sim.time_ms;
    sim.time_ms += HOUR;
    sim.ok(Command::CheckDigest { leader: None });
    sim.ok(Command::SetGpuHealth {
        node: "n1".into(),
        index: 3,
        healthy: true,
    });
    let totals = totals(&sim.state);
    assert_eq!(
        totals["lender"].lent_ms, totals["borrower"].borrowed_ms,
        "{totals:?}"
    );
    assert!(totals["lender"].lent_ms >= sim.time_ms - switched);
}
