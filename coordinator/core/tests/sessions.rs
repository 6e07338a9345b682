//! Client write sessions (`quotient_core::sessions`): a write applies once, and a late copy
//! of it, logged after the client's newer writes, changes nothing.

mod support;

use quotient_common::api::WriteTag;
use quotient_common::{ShareUpdate, Strategy};
use quotient_core::{Caller, Command, Outcome, Rejection, State};
use support::*;

fn alice() -> Caller {
    Caller {
        name: "alice".into(),
        admin: true,
    }
}

/// Share `name`'s borrow limit set to `percent`, as the API logs it: for a caller, in a session.
fn update(name: &str, percent: u32, seq: u64, low: u64) -> Command {
    Command::InSession {
        tag: WriteTag {
            session: 0xfeed,
            seq,
            low,
        },
        command: Box::new(Command::As {
            caller: alice(),
            command: Box::new(Command::UpdateShare {
                name: name.into(),
                update: ShareUpdate {
                    borrow_limit_percent: Some(Some(percent)),
                    ..ShareUpdate::default()
                },
            }),
        }),
    }
}

fn borrow_limit(sim: &Sim) -> Option<u32> {
    sim.state.share("lab").unwrap().spec.borrow_limit_percent
}

#[test]
fn a_late_copy_of_a_write_logged_after_a_newer_one_changes_nothing() {
    // Proves the bug chaos episode 816 found is closed: an update sent, its answer lost, sent
    // again and applied; a newer update applied; then the first copy, held in a stalled
    // coordinator, logged last. The share keeps the newer value.
    let mut sim = Sim::new();
    sim.ok(Command::CreateShare(share(
        "lab",
        Strategy::LendAndBorrow,
        2,
    )));
    // Write 1's retry commits first.
    assert_eq!(sim.apply(update("lab", 10, 1, 1)), Outcome::Done);
    // The client had its answer; its next write says so.
    assert_eq!(sim.apply(update("lab", 20, 2, 2)), Outcome::Done);
    assert_eq!(borrow_limit(&sim), Some(20));
    let audit_before = sim.state.data().audit.len();
    // The first copy of write 1 finally arrives.
    let late = sim.apply(update("lab", 10, 1, 1));
    assert!(
        matches!(&late, Outcome::Rejected(Rejection::Invalid(why)) if why.to_string().contains("late copy")),
        "{late:?}"
    );
    assert_eq!(borrow_limit(&sim), Some(20), "the newer write stands");
    assert_eq!(
        sim.state.data().audit.len(),
        audit_before,
        "nothing was applied for the caller"
    );
}

#[test]
fn a_second_copy_of_a_write_in_flight_answers_done_and_applies_nothing() {
    // Proves a retry of a write whose first copy committed answers as the first did and is not
    // applied again, while a concurrent write of the same client that commits out of order
    // is not taken for a copy.
    let mut sim = Sim::new();
    sim.ok(Command::CreateShare(share(
        "lab",
        Strategy::LendAndBorrow,
        2,
    )));
    let create = |seq, low| Command::InSession {
        tag: WriteTag {
            session: 9,
            seq,
            low,
        },
        command: Box::new(Command::CreateShare(share("team", Strategy::Lend, 1))),
    };
    assert_eq!(sim.apply(create(2, 1)), Outcome::Done);
    // The copy would be refused as a duplicate share if applied again.
    assert_eq!(sim.apply(create(2, 1)), Outcome::Done);
    // Write 1, sent before write 2, commits after it: not a copy.
    let one = Command::InSession {
        tag: WriteTag {
            session: 9,
            seq: 1,
            low: 1,
        },
        command: Box::new(Command::UpdateShare {
            name: "lab".into(),
            update: ShareUpdate {
                borrow_limit_percent: Some(Some(30)),
                ..ShareUpdate::default()
            },
        }),
    };
    assert_eq!(sim.apply(one), Outcome::Done);
    assert_eq!(borrow_limit(&sim), Some(30));
    let session = sim.state.sessions().get(9).expect("the session");
    assert_eq!(session.applied.iter().copied().collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn a_refused_write_is_refused_again_when_resent() {
    // Proves a refusal is not recorded as applied: a copy of it is judged again rather than
    // answered `Done`.
    let mut sim = Sim::new();
    let tagged = |seq| Command::InSession {
        tag: WriteTag {
            session: 3,
            seq,
            low: seq,
        },
        command: Box::new(Command::DeleteShare {
            name: "nowhere".into(),
        }),
    };
    assert!(sim.apply(tagged(1)).is_rejected());
    assert!(sim.apply(tagged(1)).is_rejected());
    // A tag that does not hold together, and a session inside a session, are refused.
    let bad = Command::InSession {
        tag: WriteTag {
            session: 3,
            seq: 2,
            low: 5,
        },
        command: Box::new(Command::DeleteShare { name: "x".into() }),
    };
    assert!(sim.apply(bad).is_rejected());
    let nested = Command::InSession {
        tag: WriteTag {
            session: 3,
            seq: 6,
            low: 6,
        },
        command: Box::new(tagged(7)),
    };
    assert!(sim.apply(nested).is_rejected());
}

#[test]
fn sessions_survive_a_snapshot() {
    // Proves the sessions are part of the replicated state: a replica that installs a
    // snapshot drops the same late copies.
    let mut sim = Sim::new();
    sim.ok(Command::CreateShare(share(
        "lab",
        Strategy::LendAndBorrow,
        2,
    )));
    sim.ok(update("lab", 10, 1, 1));
    sim.ok(update("lab", 20, 2, 2));
    let restored = State::from_snapshot_bytes(&sim.state.to_snapshot_bytes()).expect("loads");
    assert_eq!(restored.sessions(), sim.state.sessions());
    assert_eq!(restored.to_snapshot_bytes(), sim.state.to_snapshot_bytes());
    sim.state = restored;
    assert!(sim.apply(update("lab", 10, 1, 1)).is_rejected());
    assert_eq!(borrow_limit(&sim), Some(20));
}
