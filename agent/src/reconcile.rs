//! Reconcile: the pure diff of what the coordinators want on this node against what runs here.
//!
//! Agents are told desired state, not commands (docs/architecture.md). The coordinators send
//! the node's [`Desired`] allocations stamped with a fence; [`reconcile`] compares them
//! with the [`LocalJob`]s the executor tracks and returns the [`Action`]s that close the gap.
//! It reads no clock and does no I/O (the caller passes `now_ms`), so each rule below has a
//! unit test.
//!
//! Rules, per attempt (a job id and an attempt number):
//! - desired to run, not here, never run here before, no other attempt of the job still here,
//!   and the newest attempt of the job desired to run: **Start**. An attempt is never started
//!   twice by one agent ([`Input::finished`]), and a job never runs twice at once.
//! - found after a restart and desired: **Adopt** (and signal it at once if it is to stop).
//! - found after a restart and not desired: **KillUnknown**: the coordinators no longer count
//!   it, and it may already be requeued elsewhere.
//! - running and desired to stop, or running and no longer desired: **SignalCheckpoint**; once
//!   its grace period has passed since the signal: **Kill**.
//! - exited: **Report** the exit (after a signal or a kill it is `ExitedAfterSignal`, a
//!   preemption, not a failure), then **Forget** it.
//! - desired to stop but never run here: **Report** it `ExitedAfterSignal` with no code, so
//!   the coordinators can finish the stop.
//!
//! A desired state older than the newest one acted on (a lower fence: a deposed leader's) is
//! ignored: only actions that need no desired state are taken (reporting exits, finishing
//! kills whose grace period ran out).

use std::collections::{BTreeMap, BTreeSet};

use quotient_common::agent_api::WireGang;
use quotient_common::job::LaunchFault;
use quotient_common::{JobEvent, JobId, JobSpec, Signal};

pub use crate::runtime::JobLimits;

/// What the coordinators want of one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Run it (start it, or keep it running).
    Run,
    /// Stop it: checkpoint signal, grace period, kill (a preemption or a cancel).
    Stop,
}

/// One allocation the coordinators placed on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredAllocation {
    pub job: JobId,
    pub attempt: u32,
    pub gpu_indices: Vec<u32>,
    pub spec: JobSpec,
    pub intent: Intent,
    /// The CPUs and memory the coordinators set aside for the attempt here.
    pub limits: JobLimits,
    /// For a member of a job of several nodes: its rank and peers.
    pub gang: Option<WireGang>,
}

/// The node's whole desired state as the leader last sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Fence: grows with every leader (and every push); older ones are stale.
    pub fence: u64,
    pub allocations: Vec<DesiredAllocation>,
}

/// Where a local attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalPhase {
    /// Found on the host after an agent restart, still running, not yet adopted.
    Found,
    Running,
    /// Exited, not yet reported. `code` is `None` when the runtime could not learn it.
    Exited {
        code: Option<i32>,
    },
}

/// One attempt the executor knows on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalJob {
    pub job: JobId,
    pub attempt: u32,
    pub phase: LocalPhase,
    /// When the checkpoint signal was sent (the executor's clock, ms).
    pub signalled_at_ms: Option<u64>,
    /// Whether it was killed (after its grace period, or as unknown).
    pub killed: bool,
    pub checkpoint_signal: Signal,
    pub grace_period_ms: u64,
}

/// Everything reconcile looks at.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub desired: &'a Desired,
    /// The highest fence acted on so far; `None` before the first desired state.
    pub fence: Option<u64>,
    pub local: &'a [LocalJob],
    /// Attempts that ran here and were reported as exited: never started again.
    pub finished: &'a BTreeSet<(JobId, u32)>,
    /// Finished attempts that a desired state named and that were answered once
    /// ([`ALREADY_RAN`]).
    pub answered: &'a BTreeSet<(JobId, u32)>,
    pub now_ms: u64,
}

/// What a desired attempt that already ran here is answered with, once: it is never started
/// again, and the coordinators, who want it to run, are told so as a launch that failed for
/// the node's sake, so that they place the job again as a new attempt. They ask for such an
/// attempt when they reuse a job's id (restored from a backup, they issue again the ids given
/// after it); otherwise it is a desired state made before the attempt's exit was applied, and
/// the answer is stale and refused.
pub const ALREADY_RAN: &str = "this attempt already ran on this node, which never starts an attempt twice (its process or container was removed while the agent was down, or the coordinators were restored from a backup and issued its id again): the job goes back to the queue for a new attempt";

/// One step for the executor to take, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Start {
        job: JobId,
        attempt: u32,
        gpu_indices: Vec<u32>,
        /// Boxed: a spec is much larger than every other action.
        spec: Box<JobSpec>,
        limits: JobLimits,
        gang: Option<Box<WireGang>>,
    },
    /// Take a found attempt back under management and report it running.
    Adopt { job: JobId, attempt: u32 },
    SignalCheckpoint {
        job: JobId,
        attempt: u32,
        signal: Signal,
    },
    /// Its grace period ran out after the checkpoint signal.
    Kill { job: JobId, attempt: u32 },
    /// An attempt of this agent's that the coordinators do not want: kill at once.
    KillUnknown { job: JobId, attempt: u32 },
    Report {
        job: JobId,
        attempt: u32,
        event: JobEvent,
    },
    /// Drop the runtime's record of an exited, reported attempt.
    Forget { job: JobId, attempt: u32 },
}

/// What reconcile decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// False when the desired state was stale and ignored.
    pub accepted: bool,
    /// The fence to remember from now on.
    pub fence: Option<u64>,
    pub actions: Vec<Action>,
}

/// The event to report for an attempt that exited.
pub fn exit_event(code: Option<i32>, stopped_by_agent: bool) -> JobEvent {
    match (code, stopped_by_agent) {
        (code, true) => JobEvent::ExitedAfterSignal { code },
        (Some(code), false) => JobEvent::Exited { code },
        // An exit the agent could not observe (it ended while the agent was down and left no
        // code) is requeued like a preemption rather than failed or succeeded on a guess.
        (None, false) => JobEvent::ExitedAfterSignal { code: None },
    }
}

/// The diff. See the module docs for the rules.
pub fn reconcile(input: Input<'_>) -> Decision {
    let accepted = input.fence.is_none_or(|fence| input.desired.fence >= fence);
    let fence = if accepted {
        Some(input.desired.fence)
    } else {
        input.fence
    };
    let desired: BTreeMap<(JobId, u32), &DesiredAllocation> = if accepted {
        input
            .desired
            .allocations
            .iter()
            .map(|allocation| ((allocation.job, allocation.attempt), allocation))
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut local: Vec<&LocalJob> = input.local.iter().collect();
    local.sort_by_key(|job| (job.job, job.attempt));

    let mut actions = Vec::new();
    for job in &local {
        let (id, attempt) = (job.job, job.attempt);
        let wanted = desired
            .get(&(id, attempt))
            .map(|allocation| allocation.intent);
        let grace_over = job
            .signalled_at_ms
            .is_some_and(|at| input.now_ms >= at.saturating_add(job.grace_period_ms));
        match job.phase {
            LocalPhase::Exited { code } => {
                let stopped = job.signalled_at_ms.is_some() || job.killed;
                actions.push(Action::Report {
                    job: id,
                    attempt,
                    event: exit_event(code, stopped),
                });
                actions.push(Action::Forget { job: id, attempt });
            }
            LocalPhase::Found if !accepted => {}
            LocalPhase::Found => match wanted {
                Some(Intent::Run) => actions.push(Action::Adopt { job: id, attempt }),
                Some(Intent::Stop) => {
                    actions.push(Action::Adopt { job: id, attempt });
                    // Signalled by an earlier life of the agent: its grace period goes on.
                    if job.signalled_at_ms.is_none() {
                        actions.push(signal_action(job));
                    }
                }
                None => actions.push(Action::KillUnknown { job: id, attempt }),
            },
            LocalPhase::Running => {
                if job.signalled_at_ms.is_some() {
                    if grace_over && !job.killed {
                        actions.push(Action::Kill { job: id, attempt });
                    }
                } else if accepted && wanted != Some(Intent::Run) {
                    // Asked to stop, or no longer desired: stop it gracefully.
                    actions.push(signal_action(job));
                }
            }
        }
    }

    let jobs_here: BTreeSet<JobId> = local.iter().map(|job| job.job).collect();
    let attempts_here: BTreeSet<(JobId, u32)> =
        local.iter().map(|job| (job.job, job.attempt)).collect();
    // The newest attempt of each job that the coordinators want running: a job runs once.
    let mut newest_run: BTreeMap<JobId, u32> = BTreeMap::new();
    for allocation in desired.values().filter(|a| a.intent == Intent::Run) {
        let newest = newest_run
            .entry(allocation.job)
            .or_insert(allocation.attempt);
        *newest = (*newest).max(allocation.attempt);
    }
    for (key, allocation) in &desired {
        if attempts_here.contains(key) {
            continue;
        }
        if input.finished.contains(key) {
            if !input.answered.contains(key) {
                actions.push(Action::Report {
                    job: allocation.job,
                    attempt: allocation.attempt,
                    event: match allocation.intent {
                        Intent::Run => JobEvent::LaunchFailed {
                            fault: LaunchFault::Node,
                            tries: 0,
                            message: ALREADY_RAN.to_string(),
                        },
                        Intent::Stop => JobEvent::ExitedAfterSignal { code: None },
                    },
                });
            }
            continue;
        }
        match allocation.intent {
            // Another attempt of the job is still here: wait until it is gone.
            Intent::Run if jobs_here.contains(&allocation.job) => {}
            Intent::Run if newest_run.get(&allocation.job) != Some(&allocation.attempt) => {}
            Intent::Run => actions.push(Action::Start {
                job: allocation.job,
                attempt: allocation.attempt,
                gpu_indices: allocation.gpu_indices.clone(),
                spec: Box::new(allocation.spec.clone()),
                limits: allocation.limits,
                gang: allocation.gang.clone().map(Box::new),
            }),
            Intent::Stop => actions.push(Action::Report {
                job: allocation.job,
                attempt: allocation.attempt,
                event: JobEvent::ExitedAfterSignal { code: None },
            }),
        }
    }
    Decision {
        accepted,
        fence,
        actions,
    }
}

/// The checkpoint-signal action of one local attempt.
fn signal_action(job: &LocalJob) -> Action {
    Action::SignalCheckpoint {
        job: job.job,
        attempt: job.attempt,
        signal: job.checkpoint_signal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE_MS: u64 = 300;

    fn spec() -> JobSpec {
        let mut spec = JobSpec::new("qs1", 1, 1, vec!["train.sh".into()]);
        spec.grace_period_ms = GRACE_MS;
        spec
    }

    fn want(job: u64, attempt: u32, intent: Intent) -> DesiredAllocation {
        DesiredAllocation {
            job: JobId(job),
            attempt,
            gpu_indices: vec![0],
            spec: spec(),
            intent,
            limits: JobLimits::NONE,
            gang: None,
        }
    }

    fn desired(fence: u64, allocations: Vec<DesiredAllocation>) -> Desired {
        Desired { fence, allocations }
    }

    fn local(job: u64, attempt: u32, phase: LocalPhase) -> LocalJob {
        LocalJob {
            job: JobId(job),
            attempt,
            phase,
            signalled_at_ms: None,
            killed: false,
            checkpoint_signal: Signal::Sigusr1,
            grace_period_ms: GRACE_MS,
        }
    }

    fn run(desired: &Desired, fence: Option<u64>, local: &[LocalJob], now_ms: u64) -> Decision {
        run_finished(desired, fence, local, &BTreeSet::new(), now_ms)
    }

    fn run_finished(
        desired: &Desired,
        fence: Option<u64>,
        local: &[LocalJob],
        finished: &BTreeSet<(JobId, u32)>,
        now_ms: u64,
    ) -> Decision {
        reconcile(Input {
            desired,
            fence,
            local,
            finished,
            answered: &BTreeSet::new(),
            now_ms,
        })
    }

    /// A desired job that is not here is started on its GPUs.
    #[test]
    fn a_desired_job_that_is_absent_is_started() {
        let decision = run(&desired(1, vec![want(1, 1, Intent::Run)]), None, &[], 0);
        assert!(decision.accepted);
        assert_eq!(decision.fence, Some(1));
        assert_eq!(
            decision.actions,
            vec![Action::Start {
                job: JobId(1),
                attempt: 1,
                gpu_indices: vec![0],
                spec: Box::new(spec()),
                limits: JobLimits::NONE,
                gang: None,
            }]
        );
    }

    /// A running desired job is left alone.
    #[test]
    fn a_running_desired_job_is_left_alone() {
        let here = [local(1, 1, LocalPhase::Running)];
        let decision = run(
            &desired(1, vec![want(1, 1, Intent::Run)]),
            Some(1),
            &here,
            5,
        );
        assert_eq!(decision.actions, vec![]);
    }

    /// After a restart, a found job that is still desired is adopted, not started again.
    #[test]
    fn a_found_desired_job_is_adopted_not_restarted() {
        let here = [local(1, 1, LocalPhase::Found)];
        let decision = run(&desired(2, vec![want(1, 1, Intent::Run)]), None, &here, 0);
        assert_eq!(
            decision.actions,
            vec![Action::Adopt {
                job: JobId(1),
                attempt: 1
            }]
        );
    }

    /// A found job that is desired stopped is adopted and signalled at once.
    #[test]
    fn a_found_job_desired_stopped_is_adopted_and_signalled() {
        let here = [local(1, 1, LocalPhase::Found)];
        let decision = run(&desired(2, vec![want(1, 1, Intent::Stop)]), None, &here, 0);
        assert_eq!(
            decision.actions,
            vec![
                Action::Adopt {
                    job: JobId(1),
                    attempt: 1
                },
                Action::SignalCheckpoint {
                    job: JobId(1),
                    attempt: 1,
                    signal: Signal::Sigusr1
                }
            ]
        );
    }

    /// A found job of this agent that the coordinators do not want is killed.
    #[test]
    fn a_found_job_that_is_not_desired_is_killed_as_unknown() {
        let here = [local(9, 3, LocalPhase::Found)];
        let decision = run(&desired(2, vec![]), None, &here, 0);
        assert_eq!(
            decision.actions,
            vec![Action::KillUnknown {
                job: JobId(9),
                attempt: 3
            }]
        );
    }

    /// An attempt found after a restart that an earlier life of the agent signalled is adopted
    /// without a second signal, and killed when the grace period it began then runs out.
    #[test]
    fn a_found_attempt_signalled_before_the_restart_is_not_signalled_again() {
        let stop = desired(3, vec![want(1, 1, Intent::Stop)]);
        let mut job = local(1, 1, LocalPhase::Found);
        job.signalled_at_ms = Some(0);
        job.grace_period_ms = 100;
        let decision = run(&stop, Some(3), std::slice::from_ref(&job), 0);
        assert_eq!(
            decision.actions,
            vec![Action::Adopt {
                job: JobId(1),
                attempt: 1
            }]
        );
        job.phase = LocalPhase::Running;
        let after = run(&stop, Some(3), std::slice::from_ref(&job), 100);
        assert_eq!(
            after.actions,
            vec![Action::Kill {
                job: JobId(1),
                attempt: 1
            }]
        );
    }

    /// Preemption: the checkpoint signal once, nothing during the grace period, a kill after it.
    #[test]
    fn a_job_to_stop_is_signalled_then_killed_after_its_grace_period() {
        let stop = desired(3, vec![want(1, 1, Intent::Stop)]);
        let mut job = local(1, 1, LocalPhase::Running);
        let decision = run(&stop, Some(3), std::slice::from_ref(&job), 1_000);
        assert_eq!(
            decision.actions,
            vec![Action::SignalCheckpoint {
                job: JobId(1),
                attempt: 1,
                signal: Signal::Sigusr1
            }]
        );
        job.signalled_at_ms = Some(1_000);
        let during = run(
            &stop,
            Some(3),
            std::slice::from_ref(&job),
            1_000 + GRACE_MS - 1,
        );
        assert_eq!(during.actions, vec![], "no second signal, no early kill");
        let after = run(&stop, Some(3), std::slice::from_ref(&job), 1_000 + GRACE_MS);
        assert_eq!(
            after.actions,
            vec![Action::Kill {
                job: JobId(1),
                attempt: 1
            }]
        );
        job.killed = true;
        let killed = run(
            &stop,
            Some(3),
            std::slice::from_ref(&job),
            1_000 + GRACE_MS + 50,
        );
        assert_eq!(killed.actions, vec![], "a kill is sent once");
    }

    /// A running job the coordinators dropped is stopped gracefully, not killed outright.
    #[test]
    fn a_running_job_no_longer_desired_is_signalled() {
        let here = [local(1, 1, LocalPhase::Running)];
        let decision = run(&desired(4, vec![]), Some(3), &here, 0);
        assert_eq!(
            decision.actions,
            vec![Action::SignalCheckpoint {
                job: JobId(1),
                attempt: 1,
                signal: Signal::Sigusr1
            }]
        );
    }

    /// An exit after the checkpoint signal is reported as a preemption, then forgotten.
    #[test]
    fn an_exit_after_the_signal_is_reported_as_a_preemption() {
        let mut job = local(1, 1, LocalPhase::Exited { code: Some(0) });
        job.signalled_at_ms = Some(10);
        let decision = run(
            &desired(3, vec![want(1, 1, Intent::Stop)]),
            Some(3),
            &[job],
            20,
        );
        assert_eq!(
            decision.actions,
            vec![
                Action::Report {
                    job: JobId(1),
                    attempt: 1,
                    event: JobEvent::ExitedAfterSignal { code: Some(0) }
                },
                Action::Forget {
                    job: JobId(1),
                    attempt: 1
                }
            ]
        );
    }

    /// An exit on its own is reported with its code, zero or not.
    #[test]
    fn an_exit_on_its_own_is_reported_with_its_code() {
        let run_desired = desired(3, vec![want(1, 1, Intent::Run), want(2, 1, Intent::Run)]);
        let here = [
            local(1, 1, LocalPhase::Exited { code: Some(0) }),
            local(2, 1, LocalPhase::Exited { code: Some(3) }),
        ];
        let decision = run(&run_desired, Some(3), &here, 0);
        let reports: Vec<&Action> = decision
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Report { .. }))
            .collect();
        assert_eq!(
            reports,
            vec![
                &Action::Report {
                    job: JobId(1),
                    attempt: 1,
                    event: JobEvent::Exited { code: 0 }
                },
                &Action::Report {
                    job: JobId(2),
                    attempt: 1,
                    event: JobEvent::Exited { code: 3 }
                }
            ]
        );
        assert!(
            !decision
                .actions
                .iter()
                .any(|a| matches!(a, Action::Start { .. })),
            "an exited attempt is not started again in the same round"
        );
    }

    /// An exit whose code could not be learned is requeued like a preemption, not judged.
    #[test]
    fn an_exit_without_a_code_is_reported_as_after_signal() {
        assert_eq!(
            exit_event(None, false),
            JobEvent::ExitedAfterSignal { code: None }
        );
        assert_eq!(
            exit_event(Some(137), true),
            JobEvent::ExitedAfterSignal { code: Some(137) }
        );
        assert_eq!(exit_event(Some(1), false), JobEvent::Exited { code: 1 });
    }

    /// An attempt that already ran here is never started again, even if still desired. It is
    /// answered once, so that coordinators that issued its id again (restored from a backup)
    /// place the job anew rather than wait for ever: a wanted run as a launch that failed for
    /// the node's sake, a wanted stop as done; then nothing while the answer stands.
    #[test]
    fn a_finished_attempt_is_not_started_again_and_is_answered_once() {
        let finished = BTreeSet::from([(JobId(1), 1), (JobId(2), 1)]);
        let want_them = desired(5, vec![want(1, 1, Intent::Run), want(2, 1, Intent::Stop)]);
        let decision = run_finished(&want_them, Some(5), &[], &finished, 0);
        assert_eq!(
            decision.actions,
            vec![
                Action::Report {
                    job: JobId(1),
                    attempt: 1,
                    event: JobEvent::LaunchFailed {
                        fault: LaunchFault::Node,
                        tries: 0,
                        message: ALREADY_RAN.to_string(),
                    },
                },
                Action::Report {
                    job: JobId(2),
                    attempt: 1,
                    event: JobEvent::ExitedAfterSignal { code: None },
                },
            ]
        );
        let answered = finished.clone();
        let again = reconcile(Input {
            desired: &want_them,
            fence: Some(5),
            local: &[],
            finished: &finished,
            answered: &answered,
            now_ms: 0,
        });
        assert_eq!(again.actions, vec![]);
    }

    /// A new attempt waits while an older attempt of the same job is still here.
    #[test]
    fn a_new_attempt_waits_for_the_old_one_to_go() {
        let here = [local(1, 1, LocalPhase::Running)];
        let decision = run(
            &desired(6, vec![want(1, 2, Intent::Run)]),
            Some(5),
            &here,
            0,
        );
        assert_eq!(
            decision.actions,
            vec![Action::SignalCheckpoint {
                job: JobId(1),
                attempt: 1,
                signal: Signal::Sigusr1
            }],
            "the old attempt is stopped, the new one not yet started"
        );
    }

    /// Two attempts of one job desired to run: only the newest starts.
    #[test]
    fn only_the_newest_desired_attempt_of_a_job_starts() {
        let decision = run(
            &desired(2, vec![want(1, 1, Intent::Run), want(1, 2, Intent::Run)]),
            None,
            &[],
            0,
        );
        let starts: Vec<(JobId, u32)> = decision
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { job, attempt, .. } => Some((*job, *attempt)),
                _ => None,
            })
            .collect();
        assert_eq!(starts, vec![(JobId(1), 2)]);
    }

    /// Asked to stop an attempt that never ran here: report it stopped so the stop completes.
    #[test]
    fn a_stop_of_an_attempt_never_run_here_is_reported() {
        let decision = run(&desired(2, vec![want(4, 1, Intent::Stop)]), Some(1), &[], 0);
        assert_eq!(
            decision.actions,
            vec![Action::Report {
                job: JobId(4),
                attempt: 1,
                event: JobEvent::ExitedAfterSignal { code: None }
            }]
        );
    }

    /// A desired state from an older fence (a deposed leader) is ignored: nothing is started,
    /// stopped or killed as unknown, but exits are still reported and due kills still happen.
    #[test]
    fn a_stale_fence_is_ignored() {
        let stale = desired(4, vec![want(1, 1, Intent::Run), want(2, 1, Intent::Stop)]);
        let mut signalled = local(3, 1, LocalPhase::Running);
        signalled.signalled_at_ms = Some(0);
        let here = [
            local(2, 1, LocalPhase::Running),
            signalled,
            local(5, 1, LocalPhase::Found),
            local(6, 1, LocalPhase::Exited { code: Some(0) }),
        ];
        let decision = run(&stale, Some(7), &here, GRACE_MS);
        assert!(!decision.accepted);
        assert_eq!(decision.fence, Some(7), "the fence never goes back");
        assert_eq!(
            decision.actions,
            vec![
                Action::Kill {
                    job: JobId(3),
                    attempt: 1
                },
                Action::Report {
                    job: JobId(6),
                    attempt: 1,
                    event: JobEvent::Exited { code: 0 }
                },
                Action::Forget {
                    job: JobId(6),
                    attempt: 1
                },
            ]
        );
        let same_fence = run(&desired(7, vec![]), Some(7), &[], 0);
        assert!(same_fence.accepted, "the same fence again is not stale");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn intent() -> impl Strategy<Value = Intent> {
            prop_oneof![Just(Intent::Run), Just(Intent::Stop)]
        }

        fn phase() -> impl Strategy<Value = LocalPhase> {
            prop_oneof![
                Just(LocalPhase::Found),
                Just(LocalPhase::Running),
                proptest::option::of(0i32..3).prop_map(|code| LocalPhase::Exited { code }),
            ]
        }

        prop_compose! {
            fn allocation()(job in 1u64..6, attempt in 1u32..4, intent in intent()) -> DesiredAllocation {
                want(job, attempt, intent)
            }
        }

        prop_compose! {
            fn local_job()(job in 1u64..6, attempt in 1u32..4, phase in phase(),
                           signalled_at_ms in proptest::option::of(0u64..1_000), killed in any::<bool>())
                -> LocalJob {
                LocalJob { signalled_at_ms, killed, ..local(job, attempt, phase) }
            }
        }

        proptest! {
            /// Safety: reconcile never starts an attempt that is here or already ran here, never
            /// starts a job that has any attempt here, never starts two attempts of one job, and
            /// acts on nothing but exits and due kills when the fence is stale.
            #[test]
            fn a_job_never_runs_twice(
                allocations in proptest::collection::vec(allocation(), 0..8),
                local_jobs in proptest::collection::vec(local_job(), 0..6),
                finished in proptest::collection::btree_set((1u64..6, 1u32..4), 0..4),
                desired_fence in 0u64..4,
                fence in proptest::option::of(0u64..4),
                now_ms in 0u64..2_000,
            ) {
                // The executor tracks one record per attempt.
                let mut seen = BTreeSet::new();
                let local_jobs: Vec<LocalJob> = local_jobs
                    .into_iter()
                    .filter(|job| seen.insert((job.job, job.attempt)))
                    .collect();
                let finished: BTreeSet<(JobId, u32)> =
                    finished.into_iter().map(|(job, attempt)| (JobId(job), attempt)).collect();
                let desired = desired(desired_fence, allocations);
                let decision = run_finished(&desired, fence, &local_jobs, &finished, now_ms);
                let mut started_jobs = BTreeSet::new();
                for action in &decision.actions {
                    if let Action::Start { job, attempt, .. } = action {
                        prop_assert!(decision.accepted);
                        prop_assert!(!finished.contains(&(*job, *attempt)));
                        prop_assert!(local_jobs.iter().all(|l| l.job != *job));
                        prop_assert!(started_jobs.insert(*job), "{job} started twice");
                    }
                    if !decision.accepted {
                        let allowed = matches!(
                            action,
                            Action::Kill { .. } | Action::Report { .. } | Action::Forget { .. }
                        );
                        prop_assert!(allowed, "stale fence acted: {action:?}");
                    }
                }
                prop_assert!(decision.fence >= fence);
            }
        }
    }
}
