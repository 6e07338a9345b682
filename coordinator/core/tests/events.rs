//! The recent events (`quotient events`): made while commands apply, so replicas that apply
//! the same log hold the same events, numbered alike; each kind of change makes its event;
//! the state keeps the newest `EVENTS_MAX`; readers filter and page by number.

mod support;

use quotient_common::event::EventKind;
use quotient_common::{JobState, NodeState, Strategy};
use quotient_core::command::Caller;
use quotient_core::events::{EventFilter, EVENTS_MAX};
use quotient_core::{apply, ApplyCtx, Command, State};
use support::*;

fn kinds(state: &State, filter: &EventFilter) -> Vec<String> {
    state
        .events(filter, usize::MAX)
        .0
        .iter()
        .map(|event| event.what.to_string())
        .collect()
}

#[test]
fn each_change_makes_its_event_and_replicas_make_the_same() {
    // Proves the events of a walkthrough-like run (shares, submits, placements, a reclaim, a
    // priority change with its caller, a cordon, a lost node) and that replaying the log on
    // another state gives the same events.
    let mut sim = Sim::new();
    sim.ok(Command::RegisterNode(node("n1", 1, "a10g")));
    sim.ok(Command::RegisterNode(node("n2", 1, "a10g")));
    sim.ok(Command::CreateShare(share(
        "borrower",
        Strategy::LendAndBorrow,
        1,
    )));
    sim.ok(Command::CreateShare(share("lender", Strategy::Lend, 1)));
    let own = sim.submit(job("borrower", "b", 1, 1));
    let borrowed = sim.submit(job("borrower", "b2", 1, 1));
    sim.settle();
    assert_eq!(sim.state_of(own), JobState::Running);
    assert_eq!(sim.state_of(borrowed), JobState::Running);
    let lender = sim.submit(job("lender", "l", 1, 1));
    let other = sim.submit(job("lender", "l2", 1, 1));
    sim.settle();
    sim.ok(Command::As {
        caller: Caller {
            name: "alice".into(),
            admin: true,
        },
        command: Box::new(Command::UpdateJobPriority {
            job: other,
            priority: 5,
        }),
    });
    sim.ok(Command::CordonNode { node: "n1".into() });
    sim.ok(Command::MarkNodeLost { node: "n2".into() });

    let all = kinds(&sim.state, &EventFilter::default());
    let expect = [
        "node n1 registered".to_string(),
        "node n2 registered".to_string(),
        "share borrower created".to_string(),
        "share lender created".to_string(),
        format!("{own} (b) submitted to borrower"),
    ];
    assert_eq!(all[..5], expect, "{all:#?}");
    let has = |text: &str| all.iter().any(|event| event.contains(text));
    assert!(
        has(&format!("{borrowed} of borrower RUNNING -> PREEMPTING")),
        "{all:#?}"
    );
    assert!(
        has(&format!("{borrowed} of borrower preempted on n")),
        "{all:#?}"
    );
    assert!(has("(reclaim) for"), "{all:#?}");
    assert!(
        has(&format!("{other} of lender priority 1 -> 5 by alice")),
        "{all:#?}"
    );
    assert!(has("node n1 cordoned"), "{all:#?}");
    assert!(has("node n2 lost"), "{all:#?}");
    assert!(has("(node-lost)"), "{all:#?}");
    let events = sim.state.events(&EventFilter::default(), usize::MAX).0;
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.seq, i as u64 + 1);
    }
    assert!(events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));

    let mut replica = State::new();
    for (command, ctx) in &sim.log {
        apply(&mut replica, command.clone(), *ctx);
    }
    assert_eq!(
        replica.events(&EventFilter::default(), usize::MAX),
        sim.state.events(&EventFilter::default(), usize::MAX)
    );

    // Filters: a job's, a share's (a preemption for it counts), a node's, after a number.
    let of_lender = EventFilter {
        job: Some(lender),
        ..EventFilter::default()
    };
    assert!(kinds(&sim.state, &of_lender)
        .iter()
        .all(|event| event.starts_with(&lender.to_string())));
    let lender_share = EventFilter {
        share: Some("lender".into()),
        ..EventFilter::default()
    };
    let shared = kinds(&sim.state, &lender_share);
    assert!(
        shared.iter().any(|event| event.contains("preempted")),
        "{shared:#?}"
    );
    let on_n1 = EventFilter {
        node: Some("n1".into()),
        ..EventFilter::default()
    };
    assert!(kinds(&sim.state, &on_n1).contains(&"node n1 cordoned".to_string()));
    let later = EventFilter {
        after: 4,
        ..EventFilter::default()
    };
    let (page, newest) = sim.state.events(&later, 2);
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![5, 6]);
    assert_eq!(newest, events.len() as u64);
    let _ = NodeState::Ready;
}

#[test]
fn the_state_keeps_the_newest_events_numbered_on() {
    // Proves the bound: past EVENTS_MAX the oldest go, numbers go on, and a reader after an
    // event that is gone gets the oldest kept.
    let mut state = State::new();
    let mut index = 0;
    let mut ctx = || {
        index += 1;
        ApplyCtx {
            log_index: index,
            time_ms: 1_000 + index,
        }
    };
    apply(
        &mut state,
        Command::CreateShare(share("team", Strategy::Lend, 1)),
        ctx(),
    );
    let submits = EVENTS_MAX / 2 + 10;
    for i in 0..submits {
        let outcome = apply(
            &mut state,
            Command::SubmitJob(job("team", "j", 1, 1)),
            ctx(),
        );
        assert!(!outcome.is_rejected(), "{outcome:?}");
        let id = quotient_common::JobId(i as u64 + 1);
        apply(&mut state, Command::CancelJob { job: id }, ctx());
    }
    let issued = 1 + 2 * submits as u64;
    let (events, newest) = state.events(&EventFilter::default(), usize::MAX);
    assert_eq!(newest, issued);
    assert_eq!(events.len(), EVENTS_MAX);
    assert_eq!(events[0].seq, issued - EVENTS_MAX as u64 + 1);
    assert_eq!(state.oldest_event(), events[0].seq);
    let (from_gone, _) = state.events(
        &EventFilter {
            after: 3,
            ..EventFilter::default()
        },
        1,
    );
    assert_eq!(from_gone[0].seq, events[0].seq);
    assert!(matches!(
        events.last().map(|e| &e.what),
        Some(EventKind::JobState {
            to: JobState::Cancelled,
            ..
        })
    ));
}

#[test]
fn a_users_page_holds_only_what_they_may_read_and_is_full_when_more_is_there() {
    // Proves the visibility filter counts toward the limit: with a private share's events
    // between the open one's, a user who may not use it gets full pages of the open share's
    // job events (so a short page still means "nothing more"), and never a private one.
    let mut sim = Sim::new();
    sim.ok(Command::CreateShare(share("open", Strategy::Lend, 1)));
    let mut private = share("private", Strategy::Lend, 1);
    private.members = vec!["carol".into()];
    sim.ok(Command::CreateShare(private));
    for _ in 0..5 {
        sim.submit(job("private", "p", 1, 1));
        sim.submit(job("open", "o", 1, 1));
    }
    let filter = EventFilter {
        user: Some("dave".into()),
        ..EventFilter::default()
    };
    let (page, _) = sim.state.events(&filter, 4);
    assert_eq!(page.len(), 4);
    assert!(
        page.iter()
            .all(|event| event.what.job_share() != Some("private")),
        "{page:#?}"
    );
    let (all, _) = sim.state.events(&filter, usize::MAX);
    let open_submits = all
        .iter()
        .filter(
            |event| matches!(&event.what, EventKind::JobSubmitted { share, .. } if share == "open"),
        )
        .count();
    assert_eq!(open_submits, 5);
    assert!(all
        .iter()
        .all(|event| event.what.job_share() != Some("private")));
    let carol = EventFilter {
        user: Some("carol".into()),
        ..EventFilter::default()
    };
    let (hers, _) = sim.state.events(&carol, usize::MAX);
    assert!(hers
        .iter()
        .any(|event| event.what.job_share() == Some("private")));
}
