//! A simulated GPU host: the processes its agent started, which outlive the agent (as real
//! ones do), its lease file, and the orphan watchdog each job carries; and [`SimRuntime`], the
//! agent's [`Runtime`] over it.
//!
//! A process never reads a clock: its exit is computed from what happened to it (its natural
//! end, its checkpoint signal, a kill), so the host is exact at any virtual instant. A job's
//! behaviour comes from its command, written by the workload: `quotient-sim-job run_ms=N
//! checkpoint_ms=N|never code=N`: it ends on its own `run_ms` after its start with exit code
//! `code`, and exits `checkpoint_ms` after its checkpoint signal (or never, so that it is
//! killed at the end of its grace period).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use quotient_agent::executor::ManualClock;
use quotient_agent::runtime::{FoundJob, JobHandle, JobStatus, LaunchSpec, Runtime, RuntimeError};
use quotient_common::{JobId, Signal};

/// The first word of a simulated job's command.
pub const SIM_JOB: &str = "quotient-sim-job";
/// How often the orphan watchdog reads the lease file (as the process runtime's).
pub const WATCHDOG_POLL_MS: u64 = quotient_agent::runtime::process::WATCHDOG_POLL_S * 1_000;
/// The exit code of a killed job.
pub const KILLED: i32 = 137;

/// What a simulated job does, from its command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behaviour {
    pub run_ms: u64,
    pub checkpoint_ms: Option<u64>,
    pub code: i32,
}

impl Behaviour {
    pub fn command(&self) -> Vec<String> {
        vec![
            SIM_JOB.to_string(),
            format!("run_ms={}", self.run_ms),
            match self.checkpoint_ms {
                Some(ms) => format!("checkpoint_ms={ms}"),
                None => "checkpoint_ms=never".to_string(),
            },
            format!("code={}", self.code),
        ]
    }

    pub fn parse<S: AsRef<str>>(command: impl IntoIterator<Item = S>) -> Option<Behaviour> {
        let mut words = command.into_iter();
        if words.next()?.as_ref() != SIM_JOB {
            return None;
        }
        let mut behaviour = Behaviour {
            run_ms: 0,
            checkpoint_ms: None,
            code: 0,
        };
        for word in words {
            let (key, value) = word.as_ref().split_once('=')?;
            match key {
                "run_ms" => behaviour.run_ms = value.parse().ok()?,
                "checkpoint_ms" if value == "never" => behaviour.checkpoint_ms = None,
                "checkpoint_ms" => behaviour.checkpoint_ms = Some(value.parse().ok()?),
                "code" => behaviour.code = value.parse().ok()?,
                _ => return None,
            }
        }
        Some(behaviour)
    }
}

/// One attempt's process on a host. Times are virtual (true) milliseconds.
#[derive(Debug, Clone)]
pub struct Proc {
    pub handle: JobHandle,
    pub gpus: Vec<u32>,
    pub started_ms: u64,
    pub behaviour: Behaviour,
    pub checkpoint_signal: Signal,
    pub grace_period_ms: u64,
    /// When it got its first checkpoint signal (from the agent or its watchdog).
    pub signalled_ms: Option<u64>,
    /// When it was killed.
    pub killed_ms: Option<u64>,
    /// When its watchdog began stopping it (the lease ran out).
    pub watchdog_ms: Option<u64>,
    /// Its record (pid file) was removed by the agent.
    pub removed: bool,
}

impl Proc {
    /// When it exits (or exited), and with which code.
    pub fn exit(&self) -> (u64, i32) {
        let mut exit = (
            self.started_ms.saturating_add(self.behaviour.run_ms),
            self.behaviour.code,
        );
        if let (Some(signalled), Some(after)) = (self.signalled_ms, self.behaviour.checkpoint_ms) {
            let at = signalled.saturating_add(after);
            if at < exit.0 {
                exit = (at, 0);
            }
        }
        if let Some(killed) = self.killed_ms {
            if killed < exit.0 {
                exit = (killed, KILLED);
            }
        }
        exit
    }

    pub fn alive(&self, now_ms: u64) -> bool {
        now_ms < self.exit().0
    }
}

/// A host's processes and lease file.
#[derive(Debug, Default)]
pub struct Host {
    pub node: String,
    pub procs: Vec<Proc>,
    /// The lease file: the expiry on the host's boot clock (ms), and whether the agent has
    /// begun fencing. `None` until the agent first wrote it.
    pub lease_file: Option<(u64, bool)>,
    /// What the host saw that must never happen (a GPU given to two live jobs).
    pub violations: Vec<String>,
    /// Processes stopped by their watchdog, not by the agent.
    pub watchdog_stops: u64,
    next_pid: u64,
}

impl Host {
    pub fn new(node: &str) -> Host {
        Host {
            node: node.to_string(),
            ..Host::default()
        }
    }

    pub fn alive(&self, now_ms: u64) -> impl Iterator<Item = &Proc> {
        self.procs.iter().filter(move |proc| proc.alive(now_ms))
    }

    /// The earliest future instant at which a live process exits on its own, after a
    /// checkpoint signal, or as its watchdog's kill.
    pub fn next_exit(&self, now_ms: u64) -> Option<u64> {
        self.alive(now_ms).map(|proc| proc.exit().0).min()
    }

    /// One poll of every live job's orphan watchdog at `now_ms`, the host's boot clock
    /// reading `boot_ms`: once the lease file's expiry is the slack behind, the job gets its
    /// checkpoint signal (unless the agent is fencing), and it is killed when its grace
    /// period has passed since. Whether anything changed.
    pub fn watchdog_poll(&mut self, now_ms: u64, boot_ms: u64) -> bool {
        let expired = match self.lease_file {
            Some((expiry, _)) => {
                boot_ms > expiry + quotient_agent::runtime::process::WATCHDOG_SLACK_MS
            }
            None => true,
        };
        let fencing = self.lease_file.is_some_and(|(_, fencing)| fencing);
        let mut changed = false;
        for proc in self.procs.iter_mut().filter(|proc| proc.alive(now_ms)) {
            match proc.watchdog_ms {
                None if expired => {
                    proc.watchdog_ms = Some(now_ms);
                    if !fencing {
                        proc.signalled_ms.get_or_insert(now_ms);
                    }
                    self.watchdog_stops += 1;
                    changed = true;
                }
                Some(since) if now_ms >= since.saturating_add(proc.grace_period_ms) => {
                    proc.killed_ms = Some(now_ms);
                    changed = true;
                }
                _ => {}
            }
        }
        changed
    }

    fn find(&mut self, handle: &JobHandle) -> Option<&mut Proc> {
        self.procs
            .iter_mut()
            .find(|proc| proc.handle == *handle && !proc.removed)
    }
}

/// The agent's runtime over a simulated [`Host`]; every call is answered at once.
#[derive(Debug, Clone)]
pub struct SimRuntime {
    pub host: Arc<Mutex<Host>>,
    /// Virtual (true) time.
    pub clock: ManualClock,
}

impl SimRuntime {
    pub fn host(&self) -> MutexGuard<'_, Host> {
        self.host.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn start_now(&self, spec: &LaunchSpec) -> Result<JobHandle, RuntimeError> {
        let now = self.now();
        let behaviour =
            Behaviour::parse(&spec.payload.command).ok_or_else(|| RuntimeError::InvalidLaunch {
                job: spec.job,
                attempt: spec.attempt,
                problem: "not a simulated job's command".to_string(),
            })?;
        let mut host = self.host();
        let handle_taken = host.procs.iter().any(|proc| {
            !proc.removed && proc.handle.job == spec.job && proc.handle.attempt == spec.attempt
        });
        if handle_taken {
            return Err(RuntimeError::AlreadyRunning {
                job: spec.job,
                attempt: spec.attempt,
            });
        }
        let overlapping: Vec<(JobId, u32)> = host
            .alive(now)
            .filter(|proc| proc.gpus.iter().any(|gpu| spec.gpu_indices.contains(gpu)))
            .map(|proc| (proc.handle.job, proc.handle.attempt))
            .collect();
        for (job, attempt) in overlapping {
            let text = format!(
                "GPU given twice on {}: {} attempt {} started on GPUs {:?} while {job} attempt {attempt} still holds one",
                host.node, spec.job, spec.attempt, spec.gpu_indices
            );
            host.violations.push(text);
        }
        host.next_pid += 1;
        let handle = JobHandle {
            job: spec.job,
            attempt: spec.attempt,
            id: host.next_pid.to_string(),
        };
        host.procs.push(Proc {
            handle: handle.clone(),
            gpus: spec.gpu_indices.clone(),
            started_ms: now,
            behaviour,
            checkpoint_signal: spec.checkpoint_signal,
            grace_period_ms: spec.grace_period_ms,
            signalled_ms: None,
            killed_ms: None,
            watchdog_ms: None,
            removed: false,
        });
        Ok(handle)
    }
}

impl Runtime for SimRuntime {
    fn start(
        &self,
        spec: &LaunchSpec,
    ) -> impl Future<Output = Result<JobHandle, RuntimeError>> + Send {
        std::future::ready(self.start_now(spec))
    }

    fn signal(
        &self,
        handle: &JobHandle,
        _signal: Signal,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let now = self.now();
        if let Some(proc) = self.host().find(handle) {
            if proc.alive(now) {
                proc.signalled_ms.get_or_insert(now);
            }
        }
        std::future::ready(Ok(()))
    }

    fn kill(&self, handle: &JobHandle) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let now = self.now();
        if let Some(proc) = self.host().find(handle) {
            if proc.alive(now) {
                proc.killed_ms = Some(now);
            }
        }
        std::future::ready(Ok(()))
    }

    fn status(
        &self,
        handle: &JobHandle,
    ) -> impl Future<Output = Result<JobStatus, RuntimeError>> + Send {
        let now = self.now();
        let status = match self.host().find(handle) {
            Some(proc) if proc.alive(now) => JobStatus::Running,
            Some(proc) => JobStatus::Exited {
                code: Some(proc.exit().1),
            },
            None => JobStatus::Exited { code: None },
        };
        std::future::ready(Ok(status))
    }

    fn list_own(&self) -> impl Future<Output = Result<Vec<FoundJob>, RuntimeError>> + Send {
        let now = self.now();
        let found = self
            .host()
            .procs
            .iter()
            .filter(|proc| !proc.removed)
            .map(|proc| FoundJob {
                handle: proc.handle.clone(),
                status: if proc.alive(now) {
                    JobStatus::Running
                } else {
                    JobStatus::Exited {
                        code: Some(proc.exit().1),
                    }
                },
                checkpoint_signal: proc.checkpoint_signal,
                grace_period_ms: proc.grace_period_ms,
            })
            .collect();
        std::future::ready(Ok(found))
    }

    fn remove(&self, handle: &JobHandle) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let now = self.now();
        let result = match self.host().find(handle) {
            Some(proc) if proc.alive(now) => Err(RuntimeError::StillRunning {
                job: handle.job,
                attempt: handle.attempt,
            }),
            Some(proc) => {
                proc.removed = true;
                Ok(())
            }
            None => Ok(()),
        };
        std::future::ready(result)
    }

    fn logs(
        &self,
        _handle: &JobHandle,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send {
        std::future::ready(Ok(String::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(behaviour: Behaviour) -> Proc {
        Proc {
            handle: JobHandle {
                job: JobId(1),
                attempt: 1,
                id: "1".to_string(),
            },
            gpus: vec![0],
            started_ms: 1_000,
            behaviour,
            checkpoint_signal: Signal::Sigterm,
            grace_period_ms: 5_000,
            signalled_ms: None,
            killed_ms: None,
            watchdog_ms: None,
            removed: false,
        }
    }

    #[test]
    fn a_command_round_trips_its_behaviour() {
        let behaviour = Behaviour {
            run_ms: 60_000,
            checkpoint_ms: Some(300),
            code: 3,
        };
        assert_eq!(Behaviour::parse(behaviour.command()), Some(behaviour));
        let never = Behaviour {
            checkpoint_ms: None,
            ..behaviour
        };
        assert_eq!(Behaviour::parse(never.command()), Some(never));
        assert_eq!(Behaviour::parse(&["sleep".to_string()]), None);
    }

    #[test]
    fn a_process_ends_at_its_first_cause() {
        let mut p = proc(Behaviour {
            run_ms: 10_000,
            checkpoint_ms: Some(2_000),
            code: 1,
        });
        assert_eq!(p.exit(), (11_000, 1));
        p.signalled_ms = Some(5_000);
        assert_eq!(p.exit(), (7_000, 0));
        p.killed_ms = Some(6_000);
        assert_eq!(p.exit(), (6_000, KILLED));
        assert!(p.alive(5_999) && !p.alive(6_000));
    }

    #[test]
    fn the_watchdog_stops_a_job_once_the_lease_file_is_past_its_slack() {
        let mut host = Host::new("n");
        host.procs.push(proc(Behaviour {
            run_ms: 1_000_000,
            checkpoint_ms: None,
            code: 0,
        }));
        host.lease_file = Some((10_000, false));
        assert!(!host.watchdog_poll(2_000, 10_400));
        assert!(host.watchdog_poll(2_100, 10_600));
        assert_eq!(host.procs[0].signalled_ms, Some(2_100));
        assert!(!host.watchdog_poll(3_000, 11_500));
        assert!(host.watchdog_poll(7_100, 15_600));
        assert_eq!(host.procs[0].exit(), (7_100, KILLED));
    }
}
