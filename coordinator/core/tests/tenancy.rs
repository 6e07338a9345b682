//! Who may do what (docs/tenancy.md), as `apply` decides it for commands made for a caller.

mod support;

use quotient_common::{JobId, JobState, ShareUpdate, Strategy};
use quotient_core::{Caller, Command, Outcome, Rejection};
use support::*;

fn user(name: &str) -> Caller {
    Caller {
        name: name.into(),
        admin: false,
    }
}

fn admin(name: &str) -> Caller {
    Caller {
        name: name.into(),
        admin: true,
    }
}

fn by(caller: &Caller, command: Command) -> Command {
    Command::As {
        caller: caller.clone(),
        command: Box::new(command),
    }
}

/// A node of 4 GPUs, a share `vision` for alice and group `vision-team`, and an open share.
fn cluster() -> Sim {
    let mut sim = Sim::new();
    sim.ok(Command::RegisterNode(node("n1", 4, "a10g")));
    let mut vision = share("vision", Strategy::Lend, 4);
    vision.members = vec!["alice".into(), "group:vision-team".into()];
    sim.ok(by(&admin("root"), Command::CreateShare(vision)));
    sim.ok(by(
        &admin("root"),
        Command::CreateShare(share("open", Strategy::Lend, 4)),
    ));
    sim.ok(by(
        &admin("root"),
        Command::CreateGroup {
            name: "vision-team".into(),
            users: vec!["bob".into()],
        },
    ));
    sim
}

fn submit_as(sim: &mut Sim, caller: &Caller, share: &str) -> Outcome {
    sim.apply(by(caller, Command::SubmitJob(job(share, "train", 1, 1))))
}

fn submitted(outcome: Outcome) -> JobId {
    match outcome {
        Outcome::JobSubmitted { job, .. } => job,
        other => panic!("not submitted: {other:?}"),
    }
}

#[test]
fn members_and_group_members_submit_and_others_are_refused_with_nothing_written() {
    let mut sim = cluster();
    let alice = submitted(submit_as(&mut sim, &user("alice"), "vision"));
    assert_eq!(
        sim.state.job(alice).unwrap().spec.owner.as_deref(),
        Some("alice"),
        "the job's owner is its submitter"
    );
    submitted(submit_as(&mut sim, &user("bob"), "vision"));
    let jobs = sim.state.jobs().count();
    let refused = submit_as(&mut sim, &user("mallory"), "vision");
    let Outcome::Rejected(Rejection::Forbidden(why)) = refused else {
        panic!("a non-member is refused: {refused:?}");
    };
    assert!(why.contains("not a member of share vision"), "{why}");
    assert_eq!(sim.state.jobs().count(), jobs, "no job was written");
    // An open share takes every user; an admin may submit anywhere.
    submitted(submit_as(&mut sim, &user("mallory"), "open"));
    submitted(submit_as(&mut sim, &admin("root"), "vision"));
}

#[test]
fn an_owner_set_by_a_client_is_overwritten_by_the_caller() {
    let mut sim = cluster();
    let mut spec = job("open", "forged", 1, 1);
    spec.owner = Some("alice".into());
    let id = submitted(sim.apply(by(&user("mallory"), Command::SubmitJob(spec))));
    assert_eq!(
        sim.state.job(id).unwrap().spec.owner.as_deref(),
        Some("mallory")
    );
}

#[test]
fn only_the_owner_or_an_admin_changes_a_job() {
    let mut sim = cluster();
    let id = submitted(submit_as(&mut sim, &user("alice"), "vision"));
    for command in [
        Command::CancelJob { job: id },
        Command::UpdateJobPriority {
            job: id,
            priority: 9,
        },
    ] {
        let outcome = sim.apply(by(&user("bob"), command));
        assert!(
            matches!(outcome, Outcome::Rejected(Rejection::Forbidden(_))),
            "{outcome:?}"
        );
    }
    assert_eq!(sim.state.job(id).unwrap().spec.priority, 1);
    sim.ok(by(
        &user("alice"),
        Command::UpdateJobPriority {
            job: id,
            priority: 5,
        },
    ));
    sim.ok(by(&admin("root"), Command::CancelJob { job: id }));
    assert_eq!(sim.state_of(id), JobState::Cancelled);
}

#[test]
fn a_user_may_not_send_an_admin_command() {
    let mut sim = cluster();
    let outcome = sim.apply(by(
        &user("alice"),
        Command::DeleteShare {
            name: "open".into(),
        },
    ));
    assert!(matches!(
        outcome,
        Outcome::Rejected(Rejection::Forbidden(_))
    ));
    assert!(sim.state.share("open").is_some());
}

#[test]
fn the_per_user_cap_refuses_the_extra_submit_until_a_job_ends() {
    let mut sim = cluster();
    sim.ok(by(
        &admin("root"),
        Command::UpdateShare {
            name: "open".into(),
            update: ShareUpdate {
                max_jobs_per_user: Some(Some(2)),
                ..ShareUpdate::default()
            },
        },
    ));
    let first = submitted(submit_as(&mut sim, &user("carol"), "open"));
    submitted(submit_as(&mut sim, &user("carol"), "open"));
    let third = submit_as(&mut sim, &user("carol"), "open");
    assert!(
        matches!(
            third,
            Outcome::Rejected(Rejection::UserJobLimit { jobs: 2, .. })
        ),
        "{third:?}"
    );
    // Another user has a cap of their own.
    submitted(submit_as(&mut sim, &user("dave"), "open"));
    // A resent submit (its idempotency key known) is answered, not refused.
    let mut again = job("open", "train", 1, 1);
    again.idempotency_key = Some("carol-1".into());
    let mut spec = again.clone();
    sim.ok(by(&user("carol"), Command::CancelJob { job: first }));
    submitted(sim.apply(by(&user("carol"), Command::SubmitJob(spec.clone()))));
    spec.name = Some("same-key".into());
    let Outcome::JobSubmitted { duplicate, .. } =
        sim.apply(by(&user("carol"), Command::SubmitJob(spec)))
    else {
        panic!("a resent submit is answered");
    };
    assert!(duplicate);
}

#[test]
fn groups_change_who_may_submit() {
    let mut sim = cluster();
    assert!(submit_as(&mut sim, &user("erin"), "vision").is_rejected());
    sim.ok(by(
        &admin("root"),
        Command::UpdateGroup {
            name: "vision-team".into(),
            add: vec!["erin".into()],
            remove: vec!["bob".into()],
        },
    ));
    submitted(submit_as(&mut sim, &user("erin"), "vision"));
    assert!(submit_as(&mut sim, &user("bob"), "vision").is_rejected());
    assert!(matches!(
        sim.apply(by(
            &admin("root"),
            Command::DeleteGroup {
                name: "nope".into()
            }
        )),
        Outcome::Rejected(Rejection::UnknownGroup(_))
    ));
}

#[test]
fn the_audit_log_records_admin_actions_and_refusals_and_keeps_its_bound() {
    let mut sim = cluster();
    submitted(submit_as(&mut sim, &user("alice"), "vision"));
    submit_as(&mut sim, &user("mallory"), "vision");
    sim.ok(Command::RecordRefusal {
        caller: user("mallory"),
        action: "job logs j-1".into(),
        reason: "j-1 belongs to alice".into(),
    });
    let audit: Vec<(String, String, String)> = sim
        .state
        .data()
        .audit
        .iter()
        .map(|e| (e.who.clone(), e.action.clone(), e.outcome.clone()))
        .collect();
    let expected_start = [
        ("quotient://admin/root", "share create vision", "ok"),
        ("quotient://admin/root", "share create open", "ok"),
        ("quotient://admin/root", "group create vision-team", "ok"),
    ];
    for (entry, (who, action, outcome)) in audit.iter().zip(expected_start) {
        assert_eq!(
            (entry.0.as_str(), entry.1.as_str(), entry.2.as_str()),
            (who, action, outcome)
        );
    }
    assert_eq!(
        audit.len(),
        5,
        "a member's submit is not audited: {audit:?}"
    );
    assert_eq!(audit[3].0, "quotient://user/mallory");
    assert!(
        audit[3]
            .2
            .starts_with("refused: user mallory is not a member"),
        "{audit:?}"
    );
    assert_eq!(audit[4].1, "job logs j-1");
    // The log keeps its newest entries only.
    for _ in 0..quotient_core::state::AUDIT_ENTRIES_MAX {
        sim.ok(Command::RecordRefusal {
            caller: user("mallory"),
            action: "x".into(),
            reason: "y".into(),
        });
    }
    assert_eq!(
        sim.state.data().audit.len(),
        quotient_core::state::AUDIT_ENTRIES_MAX
    );
    assert_eq!(sim.state.data().audit.front().unwrap().action, "x");
}

#[test]
fn a_revoked_agents_node_is_cordoned_and_unrevoke_takes_the_name_back() {
    let mut sim = cluster();
    let id = submitted(submit_as(&mut sim, &user("alice"), "vision"));
    sim.settle();
    assert_eq!(sim.state_of(id), JobState::Running);
    sim.ok(by(
        &admin("root"),
        Command::Revoke {
            name: "n1".into(),
            serial: Some("0A:1B".into()),
        },
    ));
    assert!(sim.state.is_revoked("n1", Some("a1b")));
    assert!(sim.state.is_revoked("n1", Some("00:0A:1B")));
    assert!(
        !sim.state.is_revoked("n1", Some("ff")),
        "another serial of the name"
    );
    assert!(
        !sim.state.is_revoked("n1", None),
        "a serial unknown here (a forwarded request, checked where it came in)"
    );
    // A second serial of the name joins the first.
    sim.ok(by(
        &admin("root"),
        Command::Revoke {
            name: "n1".into(),
            serial: Some("ff".into()),
        },
    ));
    assert!(sim.state.is_revoked("n1", Some("a1b")));
    assert!(sim.state.is_revoked("n1", Some("FF")));
    assert!(!sim.state.is_revoked("n1", Some("fe")));
    // Cordoned at once; lost only when its lease runs out (the leader's doing), so that its
    // agent has stopped the job before it is requeued.
    assert_eq!(
        sim.state.node_by_name("n1").unwrap().state,
        quotient_common::NodeState::Cordoned
    );
    assert_eq!(sim.state_of(id), JobState::Running);
    sim.ok(Command::MarkNodeLost { node: "n1".into() });
    assert_eq!(
        sim.state_of(id),
        JobState::Runnable,
        "requeued with its node"
    );
    // The whole name, then: every serial, known or not; a serial after that adds nothing.
    for serial in [None, Some("ee".to_string())] {
        sim.ok(by(
            &admin("root"),
            Command::Revoke {
                name: "n1".into(),
                serial,
            },
        ));
        assert!(sim.state.is_revoked("n1", None));
        assert!(sim.state.is_revoked("n1", Some("fe")));
    }
    sim.ok(by(&admin("root"), Command::Unrevoke { name: "n1".into() }));
    assert!(!sim.state.is_revoked("n1", None));
    assert!(!sim.state.is_revoked("n1", Some("a1b")));
    assert!(sim
        .apply(by(&admin("root"), Command::Unrevoke { name: "n1".into() }))
        .is_rejected());
}
