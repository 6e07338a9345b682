//! The nemesis: a schedule of faults drawn from the episode's seed, then carried out against
//! the episode's containers while the clients run.
//!
//! The schedule (when each fault starts, how long it lasts, its kind and its target) is a pure
//! function of the seed, so `--seed S --episode E` replays the same one. A target named
//! "the leader" is resolved when the fault starts (whoever leads then), so the container hit
//! may differ between replays when elections went differently.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::cluster::{DockerCluster, Member, Role};
use super::history::now_us;
use super::rng::Rng;

/// The kinds of faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of a coordinator's container, started again (on its data) when the fault ends.
    KillCoordinator,
    /// SIGKILL of an agent's container: the host crashes, its jobs die with it.
    KillAgentHost,
    /// SIGKILL of the agent process alone; its supervisor starts it again, its jobs go on.
    KillAgentProcess,
    /// `docker pause` of a coordinator's container (every process frozen), then unpause.
    PauseCoordinator,
    /// SIGSTOP of the agent process alone (its jobs and their watchdogs go on), then SIGCONT.
    StopAgentProcess,
    /// `docker network disconnect` of one container, then connect.
    Disconnect,
    /// The members split into two groups that cannot reach each other (iptables in every
    /// container's network namespace, or a disconnect of the minority without iptables).
    Partition,
    /// One container (a coordinator or an agent) loses the packets of one direction only
    /// between itself and the (other) coordinators: iptables in its network namespace drops
    /// what comes from them (it sends but does not hear) or what goes to them (it hears but
    /// cannot answer). Not carried out without iptables.
    OneWayLoss,
    /// A coordinator's data disk is filled from the host until no block is left, so that its
    /// next log write that needs one fails (it exits with status 1 and the reason); freed, and
    /// the coordinator started again if it exited, when the fault ends.
    DiskFull,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillCoordinator => "kill-coordinator",
            FaultKind::KillAgentHost => "kill-agent-host",
            FaultKind::KillAgentProcess => "kill-agent-process",
            FaultKind::PauseCoordinator => "pause-coordinator",
            FaultKind::StopAgentProcess => "stop-agent-process",
            FaultKind::Disconnect => "disconnect",
            FaultKind::Partition => "partition",
            FaultKind::OneWayLoss => "one-way-loss",
            FaultKind::DiskFull => "disk-full",
        }
    }
}

/// Whom a fault hits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// Whoever leads when the fault starts (a coordinator by index when none does).
    Leader {
        fallback: usize,
    },
    Coordinator(usize),
    Agent(usize),
    /// A partition: `true` members (coordinators then agents, in order) on one side.
    Split(Vec<bool>),
}

/// Which packets a one-way loss drops, seen from its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// What comes from the coordinators: the target sends but does not hear.
    Inbound,
    /// What goes to the coordinators: the target hears but cannot answer.
    Outbound,
}

/// One fault of the schedule.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedFault {
    /// When it starts, from the start of the workload (milliseconds).
    pub at_ms: u64,
    /// How long it lasts (0: an instant fault, such as killing the agent process).
    pub duration_ms: u64,
    pub kind: FaultKind,
    pub target: Target,
    /// A one-way loss's direction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// A disk-full's: whether the zeros the log keeps ahead of its writes also lose their
    /// blocks (so its next write needs one), or stay (so it needs one only a MiB later).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_log_tail: Option<bool>,
}

/// The nemesis' mixes: which fault kinds an episode draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    /// Kills of coordinators and agents (containers and processes), and full disks.
    Crashes,
    /// Pauses and stops.
    Freezes,
    /// Disconnects, partitions and one-way losses.
    Network,
    /// Everything, often several at once.
    Everything,
}

impl Mix {
    fn kinds(self) -> &'static [FaultKind] {
        use FaultKind::*;
        match self {
            Mix::Crashes => &[KillCoordinator, KillAgentHost, KillAgentProcess, DiskFull],
            Mix::Freezes => &[PauseCoordinator, StopAgentProcess, KillAgentProcess],
            Mix::Network => &[Disconnect, Partition, OneWayLoss, KillCoordinator],
            Mix::Everything => &[
                KillCoordinator,
                KillAgentHost,
                KillAgentProcess,
                PauseCoordinator,
                StopAgentProcess,
                Disconnect,
                Partition,
                OneWayLoss,
                DiskFull,
            ],
        }
    }
}

/// Draws an episode's schedule: faults over the first `length_ms` less a few seconds, each
/// lasting 1-7 s, 1-4 s apart, and sometimes two at once.
pub fn plan(
    rng: &mut Rng,
    length_ms: u64,
    coordinators: usize,
    agents: usize,
) -> (Mix, Vec<PlannedFault>) {
    let mix = *rng.pick(&[
        Mix::Crashes,
        Mix::Freezes,
        Mix::Network,
        Mix::Everything,
        Mix::Everything,
    ]);
    let kinds = mix.kinds();
    let mut faults = Vec::new();
    let mut at = 1_000 + rng.below(2_000);
    let end = length_ms.saturating_sub(3_000).max(2_000);
    while at < end {
        let together = if mix == Mix::Everything && rng.chance(0.35) {
            2
        } else {
            1
        };
        for _ in 0..together {
            let kind = *rng.pick(kinds);
            let duration_ms = match kind {
                FaultKind::KillAgentProcess => 0,
                _ => 1_000 + rng.below(6_000),
            }
            .min(end.saturating_sub(at) + 2_000);
            let mut direction = None;
            let mut release_log_tail = None;
            if kind == FaultKind::DiskFull {
                release_log_tail = Some(rng.chance(0.75));
            }
            let target = match kind {
                FaultKind::KillCoordinator | FaultKind::PauseCoordinator | FaultKind::DiskFull => {
                    let fallback = rng.below(coordinators as u64) as usize;
                    if rng.chance(0.6) {
                        Target::Leader { fallback }
                    } else {
                        Target::Coordinator(fallback)
                    }
                }
                FaultKind::KillAgentHost
                | FaultKind::KillAgentProcess
                | FaultKind::StopAgentProcess => Target::Agent(rng.below(agents as u64) as usize),
                FaultKind::Disconnect | FaultKind::OneWayLoss => {
                    if kind == FaultKind::OneWayLoss {
                        direction = Some(if rng.chance(0.5) {
                            Direction::Inbound
                        } else {
                            Direction::Outbound
                        });
                    }
                    if rng.chance(0.5) {
                        let fallback = rng.below(coordinators as u64) as usize;
                        if rng.chance(0.5) {
                            Target::Leader { fallback }
                        } else {
                            Target::Coordinator(fallback)
                        }
                    } else {
                        Target::Agent(rng.below(agents as u64) as usize)
                    }
                }
                FaultKind::Partition => {
                    // A minority of the coordinators on one side (the leader's side or not is
                    // chance), and each agent on either.
                    let minority = 1 + rng.below(((coordinators - 1) / 2) as u64) as usize;
                    let mut side = vec![false; coordinators + agents];
                    let mut chosen = 0;
                    while chosen < minority {
                        let index = rng.below(coordinators as u64) as usize;
                        if !side[index] {
                            side[index] = true;
                            chosen += 1;
                        }
                    }
                    for flag in side.iter_mut().skip(coordinators) {
                        *flag = rng.chance(0.5);
                    }
                    Target::Split(side)
                }
            };
            faults.push(PlannedFault {
                at_ms: at,
                duration_ms,
                kind,
                target,
                direction,
                release_log_tail,
            });
        }
        at += 1_000 + rng.below(3_000) + faults.last().map_or(0, |f| f.duration_ms / 2);
    }
    (mix, faults)
}

/// One fault as carried out.
#[derive(Debug, Clone, Serialize)]
pub struct AppliedFault {
    pub kind: FaultKind,
    /// The containers it hit.
    pub members: Vec<String>,
    pub start_us: u64,
    pub end_us: u64,
    /// Why it could not be carried out (it is then not counted).
    pub error: Option<String>,
    /// What it did beyond its kind: a one-way loss's direction, how much a disk-full wrote
    /// and whether its coordinator exited (with the status and the reason it logged).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// What the nemesis did: every fault, and when each agent's container was killed (the end of
/// every job attempt that was running there, for the checker).
#[derive(Debug, Default, Clone, Serialize)]
pub struct NemesisLog {
    pub applied: Vec<AppliedFault>,
    /// Agent node name -> the times its container was killed (µs since the epoch).
    pub host_kills: BTreeMap<String, Vec<u64>>,
}

impl NemesisLog {
    /// Faults carried out, by kind (those that failed are not counted).
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for fault in self.applied.iter().filter(|f| f.error.is_none()) {
            *counts.entry(fault.kind.name().to_string()).or_insert(0) += 1;
        }
        let concurrent = self.concurrent();
        if concurrent > 0 {
            counts.insert("concurrent".to_string(), concurrent);
        }
        counts
    }

    /// Faults that began while another one was still in effect.
    pub fn concurrent(&self) -> u64 {
        let ok: Vec<&AppliedFault> = self.applied.iter().filter(|f| f.error.is_none()).collect();
        ok.iter()
            .enumerate()
            .filter(|(i, fault)| {
                ok[..*i].iter().any(|earlier| {
                    earlier.end_us > fault.start_us && earlier.start_us <= fault.start_us
                })
            })
            .count() as u64
    }
}

/// A fault in effect: how to undo it.
struct Active {
    ends: Instant,
    /// When it started (µs since the epoch).
    start_us: u64,
    index: usize,
    kind: FaultKind,
    members: Vec<Member>,
}

/// Carries out `schedule` from now on; returns when every fault has ended, or when `stop`
/// says so (the faults in effect are then undone at once).
pub fn run(
    cluster: &DockerCluster,
    schedule: &[PlannedFault],
    stop: &std::sync::atomic::AtomicBool,
) -> NemesisLog {
    let started = Instant::now();
    let mut log = NemesisLog::default();
    let mut active: Vec<Active> = Vec::new();
    let mut awaiting: Vec<AwaitingExit> = Vec::new();
    let mut next = 0usize;
    loop {
        let stopping = stop.load(std::sync::atomic::Ordering::SeqCst);
        let now = Instant::now();
        // End what is due (everything when stopping).
        let mut index = 0;
        while index < active.len() {
            if stopping || active[index].ends <= now {
                let fault = active.remove(index);
                awaiting.extend(undo(cluster, &fault, &mut log));
            } else {
                index += 1;
            }
        }
        // Coordinators whose disk was full: started again once they exited. When stopping,
        // waits for each (everything else is undone by then).
        awaiting.retain_mut(|waiting| {
            if stopping {
                while !waiting.check(cluster, &mut log) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                return false;
            }
            if waiting.next_check > now {
                return true;
            }
            waiting.next_check = now + Duration::from_millis(250);
            !waiting.check(cluster, &mut log)
        });
        if stopping || (next >= schedule.len() && active.is_empty() && awaiting.is_empty()) {
            return log;
        }
        if next < schedule.len() && started + Duration::from_millis(schedule[next].at_ms) <= now {
            let fault = &schedule[next];
            next += 1;
            let busy: Vec<String> = active
                .iter()
                .flat_map(|a| a.members.iter().map(|m| m.container.clone()))
                .chain(awaiting.iter().map(|w| w.member.container.clone()))
                .collect();
            if let Some(applied) = apply(cluster, fault, &busy, &mut log) {
                active.push(applied);
            }
            continue;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn resolve(cluster: &DockerCluster, target: &Target) -> Vec<Member> {
    match target {
        Target::Leader { fallback } => vec![cluster.leader().unwrap_or_else(|| {
            cluster.coordinators[*fallback % cluster.coordinators.len()].clone()
        })],
        Target::Coordinator(index) => {
            vec![cluster.coordinators[*index % cluster.coordinators.len()].clone()]
        }
        Target::Agent(index) => vec![cluster.agents[*index % cluster.agents.len()].clone()],
        Target::Split(side) => cluster
            .members()
            .into_iter()
            .zip(side.iter())
            .map(|(member, _)| member)
            .collect(),
    }
}

/// Starts `fault`; what to undo when it ends (`None` for an instant fault, or one that
/// failed or whose target is busy with another fault).
fn apply(
    cluster: &DockerCluster,
    fault: &PlannedFault,
    busy: &[String],
    log: &mut NemesisLog,
) -> Option<Active> {
    let members = resolve(cluster, &fault.target);
    if fault.kind != FaultKind::Partition && members.iter().any(|m| busy.contains(&m.container)) {
        // One fault per container at a time: its undo must not undo another's.
        return None;
    }
    if fault.kind == FaultKind::Partition && !busy.is_empty() {
        // A partition touches every container: only alone.
        return None;
    }
    let start_us = now_us();
    let mut hit = members.clone();
    let mut notes = Vec::new();
    let result: anyhow::Result<()> = match fault.kind {
        FaultKind::KillCoordinator | FaultKind::KillAgentHost => {
            let result = cluster.kill(&members[0]);
            if result.is_ok() && members[0].role == Role::Agent {
                log.host_kills
                    .entry(members[0].name.clone())
                    .or_default()
                    .push(now_us());
            }
            result
        }
        FaultKind::KillAgentProcess => cluster.signal_agent(&members[0], "KILL"),
        FaultKind::PauseCoordinator => cluster.pause(&members[0]),
        FaultKind::StopAgentProcess => cluster.signal_agent(&members[0], "STOP"),
        FaultKind::Disconnect => cluster.disconnect(&members[0]),
        FaultKind::Partition => {
            let Target::Split(side) = &fault.target else {
                return None;
            };
            partition(cluster, side, &mut hit)
        }
        FaultKind::OneWayLoss => {
            let direction = fault.direction.unwrap_or(Direction::Inbound);
            notes.push(match direction {
                Direction::Inbound => "inbound: drops what the coordinators send it".to_string(),
                Direction::Outbound => "outbound: drops what it sends the coordinators".to_string(),
            });
            one_way_loss(cluster, &members[0], direction)
        }
        FaultKind::DiskFull => {
            match disk_full(cluster, &members[0], fault.release_log_tail.unwrap_or(true)) {
                Ok(note) => {
                    notes.push(note);
                    Ok(())
                }
                Err(error) => {
                    let _ = cluster.free_disk(&members[0]);
                    Err(error)
                }
            }
        }
    };
    let names: Vec<String> = hit.iter().map(|m| m.name.clone()).collect();
    let index = log.applied.len();
    let error = result.err().map(|error| format!("{error:#}"));
    if let Some(error) = &error {
        say!("{} of {names:?} failed: {error}", fault.kind.name());
    } else {
        say!(
            "{} {names:?} for {} ms{}",
            fault.kind.name(),
            fault.duration_ms,
            notes
                .iter()
                .map(|note| format!(" ({note})"))
                .collect::<String>()
        );
    }
    log.applied.push(AppliedFault {
        kind: fault.kind,
        members: names,
        start_us,
        end_us: start_us,
        error: error.clone(),
        notes,
    });
    if fault.duration_ms == 0 || (error.is_some() && fault.kind != FaultKind::Partition) {
        return None;
    }
    Some(Active {
        ends: Instant::now() + Duration::from_millis(fault.duration_ms),
        start_us,
        index,
        kind: fault.kind,
        members: hit,
    })
}

/// Splits the members by `side`: with iptables, each drops the other side's addresses; else
/// the smaller side's containers are disconnected from the network. `hit` becomes the
/// members whose rules (or connection) must be undone.
fn partition(cluster: &DockerCluster, side: &[bool], hit: &mut Vec<Member>) -> anyhow::Result<()> {
    let members = cluster.members();
    let mut a: Vec<&Member> = Vec::new();
    let mut b: Vec<&Member> = Vec::new();
    for (member, flag) in members.iter().zip(side.iter()) {
        if *flag {
            a.push(member);
        } else {
            b.push(member);
        }
    }
    let names = |side: &[&Member]| side.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
    say!("partition sides {:?} | {:?}", names(&a), names(&b));
    if cluster.iptables {
        hit.clear();
        let mut result = Ok(());
        for (mine, theirs) in [(&a, &b), (&b, &a)] {
            let addresses: Vec<String> = theirs.iter().map(|m| m.ip.clone()).collect();
            for member in mine.iter() {
                hit.push((*member).clone());
                // A container that is down gets no rules (it has no network namespace).
                if let Err(error) = cluster.block(member, &addresses) {
                    if result.is_ok() {
                        result = Err(error);
                    }
                }
            }
        }
        // Partial rules are still undone; a down container does not make it a failure.
        let _ = result;
        Ok(())
    } else {
        let minority = if a.len() <= b.len() { a } else { b };
        hit.clear();
        for member in minority {
            cluster.disconnect(member)?;
            hit.push(member.clone());
        }
        Ok(())
    }
}

/// Drops the packets of one `direction` between `member` and the coordinators (the others,
/// when it is one), with iptables in its network namespace.
fn one_way_loss(
    cluster: &DockerCluster,
    member: &Member,
    direction: Direction,
) -> anyhow::Result<()> {
    if !cluster.iptables {
        anyhow::bail!(
            "one-way loss needs iptables in the containers' network namespaces (nsenter and iptables, as root, on this host); not carried out"
        );
    }
    let coordinators: Vec<String> = cluster
        .coordinators
        .iter()
        .filter(|other| other.container != member.container)
        .map(|other| other.ip.clone())
        .collect();
    cluster.block_one_way(member, &coordinators, direction == Direction::Inbound)
}

/// Fills `member`'s data disk; first, with `release_log_tail`, while its container is paused,
/// takes the blocks of the zeros its log keeps ahead of its writes. What it did.
fn disk_full(
    cluster: &DockerCluster,
    member: &Member,
    release_log_tail: bool,
) -> anyhow::Result<String> {
    if !release_log_tail {
        let filled = cluster.fill_disk(member)?;
        return Ok(format!(
            "filled its data disk with {} MiB; the log's preallocated zeros kept",
            filled / (1024 * 1024)
        ));
    }
    cluster.pause(member)?;
    let done = cluster
        .release_log_tail(member)
        .and_then(|released| Ok((released, cluster.fill_disk(member)?)));
    let unpaused = cluster.unpause(member);
    let (released, filled) = done?;
    unpaused?;
    Ok(format!(
        "filled its data disk with {} MiB, with the {} KiB of the log's preallocated zeros",
        filled / (1024 * 1024),
        released / 1024
    ))
}

/// How long a coordinator whose log write failed may take to exit (as
/// coordinator/tests/cluster_storage_faults.rs allows).
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// How long a coordinator whose disk was freed may take to show that no write of it failed
/// (a failed write is logged at once).
const SETTLE: Duration = Duration::from_secs(1);

/// A coordinator whose disk-full ended (its disk freed) while it still ran: watched until it
/// exits, to start it again, or until it is clear that no write of it failed.
struct AwaitingExit {
    member: Member,
    /// The disk-full's entry in the log.
    index: usize,
    /// When the disk-full began (µs since the epoch): its log is read from then on.
    since_us: u64,
    freed: Instant,
    next_check: Instant,
}

impl AwaitingExit {
    /// Whether it is settled: exited and started again, ran on, or failed to exit in time.
    fn check(&self, cluster: &DockerCluster, log: &mut NemesisLog) -> bool {
        let name = &self.member.name;
        let outcome = match cluster.exit_status(&self.member) {
            Err(error) => format!("{error:#}"),
            Ok(Some(code)) => {
                let reasons =
                    cluster.log_lines(&self.member, self.since_us, &["error: ", "raft stopped"]);
                let reason = reasons
                    .iter()
                    .rev()
                    .find(|line| line.starts_with("error: "))
                    .or(reasons.last())
                    .map_or("(nothing in its log)", String::as_str)
                    .trim()
                    .to_string();
                match cluster.start_again(&self.member) {
                    Ok(()) => format!(
                        "{name} exited with status {code} and was started again; it said: {reason}"
                    ),
                    Err(error) => format!(
                        "{name} exited with status {code} ({reason}) and could not be started again: {error:#}"
                    ),
                }
            }
            Ok(None) => {
                let failed = cluster.log_lines(
                    &self.member,
                    self.since_us,
                    &["raft log write failed", "raft stopped"],
                );
                if failed.is_empty() {
                    if self.freed.elapsed() < SETTLE {
                        return false;
                    }
                    // Writes other than the log's (the job history's) may have failed.
                    let other = cluster.log_lines(&self.member, self.since_us, &["No space left"]);
                    match other.last() {
                        None => format!(
                            "{name} ran on: no write of it needed a new block while its disk was full"
                        ),
                        Some(line) => format!(
                            "{name} ran on: no log write of it failed; it logged: {}",
                            line.trim()
                        ),
                    }
                } else if self.freed.elapsed() < EXIT_WITHIN {
                    return false;
                } else {
                    // Documented: it exits. Started again so that the checks see a whole cluster.
                    let restarted = cluster
                        .kill(&self.member)
                        .and_then(|()| cluster.start_again(&self.member));
                    format!(
                        "{name} logged a failed write but had not exited {:.0?} after its disk was freed (killed and started again: {restarted:?}): {}",
                        self.freed.elapsed(),
                        failed[0].trim()
                    )
                }
            }
        };
        say!("disk-full of {name} ends: {outcome}");
        if let Some(applied) = log.applied.get_mut(self.index) {
            applied.notes.push(outcome);
        }
        true
    }
}

/// Undoes `fault`; a coordinator whose full disk it freed is to be watched until it exits.
fn undo(cluster: &DockerCluster, fault: &Active, log: &mut NemesisLog) -> Option<AwaitingExit> {
    let mut errors = Vec::new();
    let mut awaiting = None;
    for member in &fault.members {
        let result = match fault.kind {
            FaultKind::KillCoordinator | FaultKind::KillAgentHost => cluster.start_again(member),
            FaultKind::KillAgentProcess => Ok(()),
            FaultKind::PauseCoordinator => cluster.unpause(member),
            FaultKind::StopAgentProcess => cluster.signal_agent(member, "CONT"),
            FaultKind::Disconnect => cluster.connect(member),
            FaultKind::Partition if cluster.iptables => cluster.unblock(member),
            FaultKind::Partition => cluster.connect(member),
            FaultKind::OneWayLoss => cluster.unblock(member),
            FaultKind::DiskFull => cluster.free_disk(member).map(|()| {
                awaiting = Some(AwaitingExit {
                    member: member.clone(),
                    index: fault.index,
                    since_us: fault.start_us,
                    freed: Instant::now(),
                    next_check: Instant::now(),
                });
            }),
        };
        if let Err(error) = result {
            errors.push(format!("{error:#}"));
        }
    }
    if !errors.is_empty() {
        say!("undoing {}: {}", fault.kind.name(), errors.join("; "));
    }
    if let Some(applied) = log.applied.get_mut(fault.index) {
        applied.end_us = now_us();
    }
    awaiting
}

#[cfg(test)]
mod tests {
    use super::super::rng::{episode_seed, Rng};
    use super::*;

    fn schedule(seed: u64, episode: u32) -> (Mix, Vec<PlannedFault>) {
        let mut rng = Rng::new(episode_seed(seed, episode));
        plan(&mut rng.fork(1), 20_000, 3, 3)
    }

    #[test]
    fn a_schedule_is_a_function_of_the_seed_and_episode() {
        // Proves `--seed S --episode E` replays the same faults, and that episodes differ.
        let first = format!("{:?}", schedule(42, 1));
        assert_eq!(first, format!("{:?}", schedule(42, 1)));
        assert_ne!(first, format!("{:?}", schedule(42, 2)));
        let (_, faults) = schedule(42, 1);
        assert!(!faults.is_empty());
        assert!(faults.iter().all(|f| f.at_ms < 20_000));
    }

    #[test]
    fn every_kind_is_drawn_with_what_it_needs() {
        // Proves that the new kinds are drawn at all, a one-way loss always with a direction
        // (both occur) and a disk-full always with a coordinator target and its log-tail
        // choice (both occur), and no other kind with either.
        let mut kinds = std::collections::BTreeSet::new();
        let mut directions = std::collections::BTreeSet::new();
        let mut tails = std::collections::BTreeSet::new();
        for episode in 1..=200 {
            for fault in schedule(7, episode).1 {
                kinds.insert(fault.kind);
                match fault.kind {
                    FaultKind::OneWayLoss => {
                        directions.insert(format!("{:?}", fault.direction.expect("a direction")));
                        assert!(matches!(
                            fault.target,
                            Target::Leader { .. } | Target::Coordinator(_) | Target::Agent(_)
                        ));
                    }
                    FaultKind::DiskFull => {
                        tails.insert(fault.release_log_tail.expect("a log-tail choice"));
                        assert!(matches!(
                            fault.target,
                            Target::Leader { .. } | Target::Coordinator(_)
                        ));
                    }
                    _ => {
                        assert!(fault.direction.is_none() && fault.release_log_tail.is_none());
                    }
                }
            }
        }
        assert_eq!(kinds.len(), 9, "{kinds:?}");
        assert_eq!(directions.len(), 2, "{directions:?}");
        assert_eq!(tails.len(), 2, "{tails:?}");
    }
}
