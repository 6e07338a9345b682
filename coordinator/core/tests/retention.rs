//! Retention (docs/retention.md): finished jobs leave the live state after the retention
//! period or beyond the retention count, at the time of the entry that removes them, the same
//! on every replica; ids are never issued again; an idempotency key outlives its job by the
//! key window, so a retried submit never makes a second job.

mod support;

use quotient_common::{JobId, JobState, Strategy};
use quotient_core::retention::RetentionRule;
use quotient_core::{apply, ApplyCtx, Command, Outcome, State};
use support::*;

const HOUR: u64 = 3_600_000;

fn rule(finished_ms: u64, finished_max: u64, key_window_ms: u64) -> RetentionRule {
    RetentionRule {
        finished_ms,
        finished_max,
        key_window_ms,
        usage_ms: 365 * 24 * HOUR,
    }
}

fn cluster() -> Sim {
    let mut sim = Sim::new();
    sim.ok(Command::RegisterNode(node("n1", 4, "a10g")));
    sim.ok(Command::CreateShare(share("team", Strategy::Lend, 4)));
    sim
}

/// Submits a job with `key` and runs it to its end with `code`.
fn finished(sim: &mut Sim, key: &str, code: i32) -> JobId {
    let mut spec = job("team", key, 1, 1);
    spec.idempotency_key = Some(key.to_string());
    let id = sim.submit(spec);
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    sim.finish(id, code);
    id
}

#[test]
fn finished_jobs_go_after_the_retention_period_and_nothing_else_does() {
    let mut sim = cluster();
    let old = finished(&mut sim, "old", 0);
    let failed = finished(&mut sim, "failed", 3);
    let running = sim.submit(job("team", "running", 1, 1));
    let queued = sim.submit(job("team", "queued", 1, 8));
    sim.settle();
    sim.time_ms += HOUR;
    let recent = finished(&mut sim, "recent", 0);
    let retention = rule(HOUR, 1_000, HOUR);
    // `old` and `failed` ended over an hour ago; `recent` did not.
    assert!(sim.state.expiry_due(&retention, sim.time_ms + 10));
    sim.ok(Command::ExpireFinished(retention));
    for id in [old, failed] {
        assert!(sim.state.job(id).is_none(), "{id} removed");
        assert!(sim.state.was_removed(id));
    }
    for id in [running, queued, recent] {
        assert!(sim.state.job(id).is_some(), "{id} kept");
        assert!(!sim.state.was_removed(id));
    }
    assert_eq!(sim.state_of(running), JobState::Running);
    assert!(!sim.state.was_removed(JobId(99)), "never issued");
    assert!(!sim.state.expiry_due(&retention, sim.time_ms));
    // Ids are never reused: the next job gets a new one.
    let next = sim.submit(job("team", "next", 1, 1));
    assert_eq!(next.0, recent.0 + 1);
}

#[test]
fn beyond_the_retention_count_the_jobs_that_ended_first_go_first() {
    let mut sim = cluster();
    let ids: Vec<JobId> = (0..5)
        .map(|n| finished(&mut sim, &format!("run-{n}"), 0))
        .collect();
    let retention = rule(30 * 24 * HOUR, 2, HOUR);
    assert!(sim.state.expiry_due(&retention, sim.time_ms));
    sim.ok(Command::ExpireFinished(retention));
    let kept: Vec<JobId> = sim.state.jobs().map(|job| job.id).collect();
    assert_eq!(kept, ids[3..].to_vec());
}

#[test]
fn a_retried_submit_after_the_removal_gets_the_removed_job_not_a_second_one() {
    let mut sim = cluster();
    let id = finished(&mut sim, "run-1", 0);
    sim.time_ms += 2 * HOUR;
    let retention = rule(HOUR, 1_000, 24 * HOUR);
    sim.ok(Command::ExpireFinished(retention));
    assert!(sim.state.was_removed(id));
    let mut retry = job("team", "run-1", 1, 1);
    retry.idempotency_key = Some("run-1".into());
    assert_eq!(
        sim.apply(Command::SubmitJob(retry.clone())),
        Outcome::JobSubmitted {
            job: id,
            duplicate: true
        },
        "the removed job's id, as a duplicate"
    );
    // Once the key window is over, the key is free again.
    sim.time_ms += 24 * HOUR;
    assert!(sim.state.expiry_due(&retention, sim.time_ms + 10));
    sim.ok(Command::ExpireFinished(retention));
    assert!(sim.state.data().key_expiry.is_empty());
    match sim.apply(Command::SubmitJob(retry)) {
        Outcome::JobSubmitted {
            job,
            duplicate: false,
        } => assert_ne!(job, id),
        other => panic!("a new job: {other:?}"),
    }
}

#[test]
fn every_replica_removes_the_same_jobs_and_a_snapshot_keeps_the_gaps() {
    let mut sim = cluster();
    for n in 0..6 {
        finished(&mut sim, &format!("run-{n}"), 0);
        sim.time_ms += HOUR / 2;
    }
    let live = sim.submit(job("team", "live", 1, 1));
    sim.settle();
    sim.ok(Command::ExpireFinished(rule(2 * HOUR, 1_000, HOUR)));
    assert!(sim.state.job(live).is_some());
    // A replica replaying the same log reaches the same state, byte for byte.
    let mut replica = State::new();
    for (command, ctx) in &sim.log {
        apply(&mut replica, command.clone(), *ctx);
    }
    assert_eq!(replica.to_snapshot_bytes(), sim.state.to_snapshot_bytes());
    // A snapshot keeps the removed ids removed and the next id where it was.
    let back = State::from_snapshot_bytes(&sim.state.to_snapshot_bytes()).expect("reads back");
    assert_eq!(back.data(), sim.state.data());
    assert!(back.was_removed(JobId(1)));
    let mut sim2 = Sim {
        state: back,
        ..Sim::new()
    };
    sim2.log_index = sim.log_index;
    sim2.time_ms = sim.time_ms;
    let next = sim2.submit(job("team", "next", 1, 1));
    assert_eq!(next.0, live.0 + 1);
}

#[test]
fn one_entry_removes_at_most_a_batch() {
    let mut state = State::new();
    let ctx = |index: u64, time_ms: u64| ApplyCtx {
        log_index: index,
        time_ms,
    };
    apply(
        &mut state,
        Command::CreateShare(share("team", Strategy::Lend, 4)),
        ctx(1, 1),
    );
    let count = quotient_core::retention::EXPIRE_BATCH_MAX + 5;
    for n in 0..count as u64 {
        apply(
            &mut state,
            Command::SubmitJob(job("team", "x", 1, 1)),
            ctx(2 + 2 * n, 10),
        );
        apply(
            &mut state,
            Command::As {
                caller: quotient_core::Caller {
                    name: "root".into(),
                    admin: true,
                },
                command: Box::new(Command::CancelJob { job: JobId(n + 1) }),
            },
            ctx(3 + 2 * n, 10),
        );
    }
    let retention = rule(1, 0, 1);
    let index = 10 * count as u64;
    apply(
        &mut state,
        Command::ExpireFinished(retention),
        ctx(index, 100),
    );
    assert_eq!(state.jobs().count(), 5);
    assert!(state.expiry_due(&retention, 100));
    apply(
        &mut state,
        Command::ExpireFinished(retention),
        ctx(index + 1, 100),
    );
    assert_eq!(state.jobs().count(), 0);
    state.validate().expect("the invariants hold");
}
