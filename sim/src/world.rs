//! One simulated history: coordinators, agents, hosts, clients and a nemesis in virtual
//! time, driven by one seeded event queue.
//!
//! What is real and what is modelled:
//! - **Real code**: the replicated state machine and the scheduler (`quotient_core::apply`,
//!   `plan_with`, `State::validate`); the leader's node leases (`NodeLeases`: who is
//!   unreachable, who is lost), its desired allocations per node (`desired_allocations`) and
//!   time limits (`past_time_limit`); the agent's executor and reconcile (`Executor` over
//!   [`crate::host::SimRuntime`]), its lease clock (`LeaseClock`, resumed from the journal's
//!   last acknowledgement on a restart) and its lease file line (`lease_file_line`), which the
//!   jobs' orphan watchdogs read.
//! - **Modelled** (each as the module docs of its real counterpart describe it): Raft (one
//!   committed log; a leader's pending entries are committed or lost when it goes; a new
//!   leader is elected among a majority of live coordinators and applies the whole log), the
//!   QUIC sessions (messages with delays and losses; a connection is dropped after a request's
//!   deadline and found again after a backoff and a random spread), the executor loop's
//!   lease check and self-fencing (`quotient_agent::run`), the agent's journal (reports kept
//!   until acknowledged, finished attempts, the last acknowledgement's wall-clock time), and
//!   the orphan watchdog of each job ([`crate::host::Host::watchdog_poll`]).
//!
//! Every host and coordinator has clocks of its own: a monotonic clock whose rate differs
//! from true time by a few hundred parts per million, and a wall clock with an offset that
//! the nemesis may make jump.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use quotient_agent::executor::{Executor, ManualClock, SignalRecords};
use quotient_agent::lease::{lease_file_line, LeaseClock};
use quotient_agent::reconcile::Desired;
use quotient_agent::session::desired_allocation;
use quotient_common::agent_api::{Fence, WireAllocation, WireIntent};
use quotient_common::{
    GpuClass, GpuDevice, HostInfo, JobId, JobReport, JobSpec, JobState, NodeInventory, NodeState,
    ShareSpec, ShareState, ShareUpdate, Strategy,
};
use quotient_coordinator::config::{AgentTuning, NODE_LEASE_MARGIN_MIN_MS};
use quotient_coordinator::desired::desired_allocations;
use quotient_coordinator::node_leases::{gangs_not_started, past_time_limit, NodeLeases};
use quotient_coordinator::views::state_digest;
use quotient_core::{apply, ApplyCtx, Command, Outcome, State, DEFAULT_TOPOLOGY_KEY};
use serde::Serialize;

use crate::host::{Behaviour, Host, SimRuntime, WATCHDOG_POLL_MS};
use crate::rng::Rng;

/// The wall clock's reading at virtual time 0 (2026-01-01).
const EPOCH_MS: u64 = 1_767_225_600_000;
/// The GPU class of every simulated GPU.
const CLASS: &str = "a10g";
/// The executor loop's tick ([`quotient_agent::run::CORE_TICK_MS`]): the most an agent
/// waits to see an exit or a due kill.
const TICK_MS: u64 = quotient_agent::run::CORE_TICK_MS;
/// How often the leader checks node leases ([`quotient_coordinator::node_leases`]).
const LEASE_CHECK_MS: u64 = quotient_coordinator::node_leases::NODE_LEASE_CHECK_MS;
/// How often the leader looks for attempts past their time limit.
const TIME_LIMIT_CHECK_MS: u64 = quotient_coordinator::node_leases::TIME_LIMIT_CHECK_MS;
/// The scheduler loop's debounce and its safety tick.
const ROUND_DEBOUNCE_MS: u64 = quotient_coordinator::scheduler_loop::SCHEDULER_DEBOUNCE_MS;
const ROUND_TICK_MS: u64 = quotient_coordinator::scheduler_loop::SCHEDULER_TICK_MS;
/// The agent's request deadlines and backoffs ([`quotient_agent::session`]).
const REGISTER_DEADLINE_MS: u64 = quotient_agent::session::REGISTER_DEADLINE_MS;
const REPORT_DEADLINE_MS: u64 = quotient_agent::session::REPORT_DEADLINE_MS;
const BACKOFF_MIN_MS: u64 = quotient_agent::session::BACKOFF_MIN_MS;
const BACKOFF_MAX_MS: u64 = quotient_agent::session::BACKOFF_MAX_MS;
const RECONNECT_SPREAD_MS: u64 = quotient_agent::session::RECONNECT_SPREAD_MS;
const REPORTS_PER_REQUEST: usize = quotient_common::agent_api::REPORTS_PER_REQUEST_MAX;
/// The lease an agent counts before its first registration (`--lease-ms`'s default).
const AGENT_LEASE_FLAG_MS: u64 = quotient_agent::config::LEASE_DEFAULT_MS;
/// How long the members of a job of several nodes have to all run before the attempt is
/// stopped and requeued (`--gang-start-timeout-ms`; shorter than its 5 min default, so that
/// histories of minutes see it).
const GANG_START_TIMEOUT_MS: u64 = 60_000;
/// Violations kept per history; the first one usually tells the story.
const VIOLATIONS_MAX: usize = 8;

/// What one history is made of.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub seed: u64,
    /// How long clients work and the nemesis acts (virtual ms).
    pub history_ms: u64,
    /// How long the healed cluster runs before the final checks (virtual ms).
    pub settle_ms: u64,
    /// Whether the nemesis acts at all.
    pub faults: bool,
    /// A deliberately broken coordinator, to show that the checks catch what they are for:
    /// the leader declares a node lost after this long without a heartbeat, ignoring the
    /// agent lease, the jobs' grace periods and the margin (so it may requeue jobs that
    /// still run). `None` for the real rule.
    pub broken_node_lease_ms: Option<u64>,
    /// Draw the agent timing (heartbeat, lease, margin) from the seed, over the range the
    /// coordinator's configuration accepts, instead of the defaults.
    pub random_timing: bool,
    /// With `random_timing`: the smallest node-lease margin drawn; below the coordinators'
    /// own minimum only to show why that minimum is there.
    pub margin_min_ms: u64,
}

impl Config {
    pub fn new(seed: u64, history_ms: u64) -> Config {
        Config {
            seed,
            history_ms,
            settle_ms: (history_ms / 2).clamp(60_000, 300_000),
            faults: true,
            broken_node_lease_ms: None,
            random_timing: false,
            margin_min_ms: NODE_LEASE_MARGIN_MIN_MS,
        }
    }
}

/// What happened in one history.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub coordinators: usize,
    pub nodes: usize,
    /// The agent timing of the history: lease, heartbeat interval, node-lease margin (ms).
    pub agent_lease_ms: u64,
    pub heartbeat_ms: u64,
    pub margin_ms: u64,
    pub events: u64,
    pub commits: u64,
    pub operations: u64,
    pub acknowledged: u64,
    pub unknown: u64,
    pub jobs: u64,
    pub jobs_finished: u64,
    /// Jobs of several nodes that ran at least once.
    pub gangs_run: u64,
    pub preemptions: u64,
    pub nodes_lost: u64,
    pub leader_changes: u64,
    pub self_fences: u64,
    pub watchdog_stops: u64,
    pub faults: BTreeMap<String, u64>,
}

/// One history's result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub seed: u64,
    pub virtual_ms: u64,
    pub stats: Stats,
    /// Each with the virtual time it was seen at; empty when every invariant held.
    pub violations: Vec<String>,
}

/// Runs one history.
pub fn run(config: &Config) -> Report {
    let mut world = World::new(config);
    world.run();
    world.report()
}

/// A request from an agent to a coordinator.
#[derive(Debug, Clone)]
enum Up {
    Register {
        sent_local: u64,
        request: u64,
    },
    Heartbeat {
        sent_local: u64,
        request: u64,
    },
    Report {
        reports: Vec<(u64, JobReport)>,
        request: u64,
    },
    /// The agent wants the current desired state (after its lease came back).
    Watch,
}

/// An answer (or a push) from a coordinator to an agent.
#[derive(Debug, Clone)]
enum Down {
    Registered {
        sent_local: u64,
        request: u64,
        lease_ms: u64,
        heartbeat_ms: u64,
    },
    Ack {
        sent_local: u64,
        request: u64,
    },
    Reported {
        seqs: Vec<u64>,
        request: u64,
    },
    Desired {
        fence: Fence,
        allocations: Vec<WireAllocation>,
    },
    NotLeader,
    NotRegistered,
}

#[derive(Debug, Clone)]
enum Event {
    Client,
    ClientRetry(usize),
    Commit(u64),
    Round {
        term: u64,
    },
    LeaderLoop {
        term: u64,
    },
    Election,
    Fault,
    CoordRestart(usize),
    AgentRestart(usize),
    Heal {
        node: usize,
        token: u64,
    },
    ToLeader {
        coord: usize,
        node: usize,
        conn: u64,
        msg: Up,
    },
    ToAgent {
        node: usize,
        conn: u64,
        msg: Down,
    },
    AgentTick {
        node: usize,
        token: u64,
    },
    Heartbeat {
        node: usize,
        conn: u64,
    },
    Deadline {
        node: usize,
        conn: u64,
        request: u64,
    },
    Connect {
        node: usize,
        token: u64,
    },
    Watchdog(usize),
}

/// A clock of one machine: `local = base + t + t * ppm / 1e6` for true time `t`.
#[derive(Debug, Clone, Copy)]
struct Clock {
    base_ms: u64,
    ppm: i64,
    /// The wall clock's offset from true time (ms), which the nemesis may move.
    wall_offset_ms: i64,
}

impl Clock {
    fn local(&self, now: u64) -> u64 {
        let drift = (now as i128 * self.ppm as i128 / 1_000_000) as i64;
        (self.base_ms as i64 + now as i64 + drift).max(0) as u64
    }

    /// The true duration that `local_ms` of this clock take (rounded up).
    fn true_span(&self, local_ms: u64) -> u64 {
        let span = local_ms as i128 * 1_000_000 / (1_000_000 + self.ppm as i128);
        span as u64 + 1
    }

    fn wall(&self, now: u64) -> u64 {
        (EPOCH_MS as i64 + now as i64 + self.wall_offset_ms).max(0) as u64
    }
}

struct Coordinator {
    alive: bool,
    state: State,
    applied: usize,
    clock: Clock,
    /// The connections each node registered on with this coordinator, each with its long
    /// poll, which outlives a change of leader when this coordinator leads again (the new
    /// term's desired state answers it). Gone when the coordinator dies.
    sessions: BTreeMap<usize, BTreeSet<u64>>,
    /// The connections open to this coordinator's process (opened by a `Register`): a
    /// request on any other (one opened before the process died) gets no answer.
    conns: BTreeSet<u64>,
}

/// What identifies a node's desired allocations for its agent (as the coordinator's
/// `desired::signature`): per job, its attempt, whether it is to stop, and its GPUs.
type Signature = Vec<(JobId, u32, bool, Vec<u32>)>;

/// What the leader keeps in memory, lost with its leadership.
struct Leadership {
    coord: usize,
    term: u64,
    leases: NodeLeases,
    /// Per node: the desired state last computed (its signature and fence).
    sent: BTreeMap<usize, (Signature, Fence)>,
    plan_in_flight: bool,
    round_scheduled: bool,
    lost_in_flight: BTreeSet<String>,
    last_time_limit_check: u64,
    last_round: u64,
}

#[derive(Debug, Clone)]
enum Origin {
    Client(usize),
    Register {
        node: usize,
        conn: u64,
        request: u64,
        sent_local: u64,
    },
    Report {
        node: usize,
        conn: u64,
        request: u64,
        seqs: Vec<u64>,
    },
    Plan,
    MarkLost(String),
    Internal,
}

struct Proposal {
    term: u64,
    commands: Vec<Command>,
    origin: Origin,
    time_ms: u64,
}

/// An agent's journal: survives the agent's crashes.
#[derive(Default)]
struct Journal {
    pending: BTreeMap<u64, JobReport>,
    next_seq: u64,
    finished: BTreeSet<(JobId, u32)>,
    last_ack_wall: Option<u64>,
}

struct Session {
    conn: u64,
    coord: usize,
    registered: bool,
    heartbeat_ms: u64,
    register_request: u64,
    heartbeat_pending: Option<u64>,
    /// A heartbeat tick came while one was unanswered: the next goes with the answer.
    tick_missed: bool,
    report_pending: Option<u64>,
}

impl Agent {
    /// The GPUs this life of the agent sees.
    fn present_gpus(&self) -> &[GpuDevice] {
        let seen = self.gpus.len() - usize::from(self.without_last_gpu);
        &self.gpus[..seen]
    }
}

/// A running agent process.
struct AgentProc {
    executor: Executor<SimRuntime>,
    lease: LeaseClock,
    latest: Option<Desired>,
    desired: Option<Desired>,
    fenced: bool,
    fencing_published: bool,
    session: Option<Session>,
    backoff_ms: u64,
}

struct Agent {
    name: String,
    host: Arc<Mutex<Host>>,
    clock: Clock,
    mono: ManualClock,
    /// When attempts were first signalled: the agent's state dir, which outlives its process.
    signals: SignalRecords,
    /// Which attempts this agent started, unreported: the state dir too.
    started: SignalRecords,
    gpus: Vec<GpuDevice>,
    /// This life of the agent does not see its last GPU (it came back without it; jobs
    /// placed there may still run).
    without_last_gpu: bool,
    journal: Journal,
    proc: Option<AgentProc>,
    /// Messages from the agent to the coordinators are lost.
    up_loss: bool,
    /// Messages from the coordinators to the agent are lost.
    down_loss: bool,
    link_token: u64,
    wake_at: Option<u64>,
    wake_token: u64,
    connect_token: u64,
}

#[derive(Debug, Clone)]
enum OpKind {
    Submit { spec: Box<JobSpec> },
    Cancel(JobId),
    Priority(JobId, u32),
    ShareLimit(String, u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum OpOutcome {
    Pending,
    Acknowledged(Outcome),
    Refused,
    Unknown,
}

#[derive(Debug, Clone)]
struct Op {
    kind: OpKind,
    outcome: OpOutcome,
    tries: u32,
}

/// Submits are retried with their key this many times when their outcome is unknown.
const SUBMIT_TRIES: u32 = 6;

struct World {
    config: Config,
    now: u64,
    clock: ManualClock,
    origin: Instant,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    rng: Rng,
    net: Rng,
    nemesis: Rng,
    workload: Rng,
    coords: Vec<Coordinator>,
    log: Vec<(Command, ApplyCtx)>,
    committed: State,
    term: u64,
    leader: Option<Leadership>,
    election_pending: bool,
    proposals: BTreeMap<u64, Proposal>,
    next_proposal: u64,
    /// When the last proposal is due to commit: later ones commit after it.
    last_commit_at: u64,
    agents: Vec<Agent>,
    next_conn: u64,
    next_request: u64,
    ops: Vec<Op>,
    shares: Vec<(String, u32)>,
    tuning: AgentTuning,
    stats: Stats,
    violations: Vec<String>,
    healed: bool,
    /// The queued jobs a round would place, sampled shortly before the end: one still queued
    /// at the end is stuck, not merely between a report and the next round.
    placeable_before: Option<BTreeSet<(JobId, u32)>>,
    /// The jobs between two states (placed but not running, or stopping), sampled a minute
    /// before the end: one still there, at the same attempt, at the end is stuck.
    transient_before: Option<BTreeSet<(JobId, u32, JobState)>>,
}

/// Polls a future of the simulated runtime once: it never waits.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut context) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a call into the simulated runtime waited; it must answer at once"),
    }
}

impl World {
    fn new(config: &Config) -> World {
        let mut rng = Rng::new(config.seed);
        let net = rng.fork();
        let nemesis = rng.fork();
        let workload = rng.fork();
        let coordinators = if rng.chance(1, 4) { 5 } else { 3 };
        let nodes = rng.range(3, 6) as usize;
        let gpus_per_node = *rng.pick(&[2u32, 4, 8]);
        let clock = ManualClock::new(0);
        let coords = (0..coordinators)
            .map(|_| Coordinator {
                alive: true,
                state: State::new(),
                applied: 0,
                sessions: BTreeMap::new(),
                conns: BTreeSet::new(),
                clock: Clock {
                    base_ms: rng.range(0, 1_000_000),
                    ppm: rng.range(0, 400) as i64 - 200,
                    wall_offset_ms: rng.range(0, 1_000) as i64 - 500,
                },
            })
            .collect();
        let agents = (0..nodes)
            .map(|index| {
                let name = format!("node-{}", index + 1);
                let agent_clock = Clock {
                    base_ms: rng.range(0, 1_000_000),
                    ppm: rng.range(0, 400) as i64 - 200,
                    wall_offset_ms: rng.range(0, 4_000) as i64 - 2_000,
                };
                let gpus = (0..gpus_per_node)
                    .map(|gpu| GpuDevice {
                        index: gpu,
                        uuid: format!("GPU-{name}-{gpu}"),
                        class: GpuClass::parse(CLASS).expect("a valid class"),
                        healthy: true,
                        nvlink_peers: 0,
                    })
                    .collect();
                Agent {
                    host: Arc::new(Mutex::new(Host::new(&name))),
                    name,
                    mono: ManualClock::new(agent_clock.local(0)),
                    signals: SignalRecords::Shared(Arc::default()),
                    started: SignalRecords::Shared(Arc::default()),
                    clock: agent_clock,
                    gpus,
                    without_last_gpu: false,
                    journal: Journal::default(),
                    proc: None,
                    up_loss: false,
                    down_loss: false,
                    link_token: 0,
                    wake_at: None,
                    wake_token: 0,
                    connect_token: 0,
                }
            })
            .collect();
        let tuning = if config.random_timing {
            let heartbeat = *rng.pick(&[200u64, 500, 1_000, 2_000]);
            let lease = rng.range((2 * heartbeat).max(1_000), 20_000);
            AgentTuning {
                agent_lease_ms: lease,
                agent_heartbeat_ms: heartbeat,
                node_lease_margin_ms: rng.range(config.margin_min_ms, 6_000),
            }
        } else {
            AgentTuning::default()
        };
        let refused = quotient_coordinator::config::check_agent_tuning(&tuning);
        if let (Err(error), true) = (refused, config.margin_min_ms >= NODE_LEASE_MARGIN_MIN_MS) {
            panic!("the simulation drew agent timing the coordinators refuse: {error}");
        }
        let capacity = nodes as u32 * gpus_per_node;
        let quarter = (capacity / 4).max(1);
        let shares = vec![
            ("reserve".to_string(), quarter),
            ("lend".to_string(), quarter),
            ("borrow".to_string(), quarter),
        ];
        let stats = Stats {
            coordinators,
            nodes,
            agent_lease_ms: tuning.agent_lease_ms,
            heartbeat_ms: tuning.agent_heartbeat_ms,
            margin_ms: tuning.node_lease_margin_ms,
            ..Stats::default()
        };
        World {
            config: config.clone(),
            now: 0,
            clock,
            origin: Instant::now(),
            seq: 0,
            queue: BTreeMap::new(),
            rng,
            net,
            nemesis,
            workload,
            coords,
            log: Vec::new(),
            committed: State::new(),
            term: 0,
            leader: None,
            election_pending: false,
            proposals: BTreeMap::new(),
            next_proposal: 0,
            last_commit_at: 0,
            agents,
            next_conn: 0,
            next_request: 0,
            ops: Vec::new(),
            shares,
            tuning,
            stats,
            violations: Vec::new(),
            healed: false,
            placeable_before: None,
            transient_before: None,
        }
    }

    fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((time.max(self.now), self.seq), event);
    }

    fn after(&mut self, delay: u64, event: Event) {
        self.at(self.now.saturating_add(delay), event);
    }

    fn violation(&mut self, text: String) {
        if self.violations.len() < VIOLATIONS_MAX {
            self.violations
                .push(format!("at {:.3} s: {text}", self.now as f64 / 1_000.0));
        }
    }

    fn instant(&self, local_ms: u64) -> Instant {
        self.origin + Duration::from_millis(local_ms)
    }

    fn run(&mut self) {
        self.bootstrap();
        let end = self.config.history_ms;
        let last = end + self.config.settle_ms;
        while let Some(((time, _), event)) = self.queue.pop_first() {
            if time > last || !self.violations.is_empty() {
                break;
            }
            if self.transient_before.is_none() && time + TRANSIENT_WINDOW_MS >= last {
                self.transient_before = Some(transient(&self.committed));
            }
            if self.placeable_before.is_none() && time + PLACEABLE_WINDOW_MS >= last {
                self.placeable_before = Some(placeable(&self.committed));
            }
            if !self.healed && time >= end {
                self.now = end;
                self.clock.advance_to(end);
                self.heal();
                self.at(time, event);
                continue;
            }
            self.now = time;
            self.clock.advance_to(time);
            self.stats.events += 1;
            self.handle(event);
        }
        if self.violations.is_empty() {
            self.now = last;
            self.clock.advance_to(last);
            self.final_checks();
        }
    }

    /// The cluster as `quotient cluster init` and the admin leave it: shares created, a
    /// leader elected, agents starting.
    fn bootstrap(&mut self) {
        let class = GpuClass::parse(CLASS).expect("a valid class");
        let shares = self.shares.clone();
        for (index, (name, limit)) in shares.iter().enumerate() {
            let spec = ShareSpec {
                name: name.clone(),
                limits: BTreeMap::from([(class.clone(), *limit)]),
                strategy: [Strategy::Reserve, Strategy::Lend, Strategy::LendAndBorrow][index],
                borrow_limit_percent: None,
                in_share_preemption: index == 2,
                state: ShareState::Enabled,
                members: Vec::new(),
                max_jobs_per_user: None,
            };
            self.append(Command::CreateShare(spec), EPOCH_MS);
        }
        self.at(0, Event::Election);
        for node in 0..self.agents.len() {
            let delay = self.rng.range(0, 2_000);
            self.after(delay, Event::AgentRestart(node));
            self.after(delay + 1 + node as u64, Event::Watchdog(node));
        }
        self.after(1_000, Event::Client);
        if self.config.faults {
            let first = self.nemesis.exponential_ms(30_000) + 5_000;
            self.after(first, Event::Fault);
        }
    }

    /// Appends a committed entry and applies it to the committed state.
    fn append(&mut self, command: Command, time_ms: u64) -> Outcome {
        let ctx = ApplyCtx {
            log_index: self.log.len() as u64 + 1,
            time_ms,
        };
        self.log.push((command.clone(), ctx));
        self.stats.commits += 1;
        apply(&mut self.committed, command, ctx)
    }

    fn catch_up(&mut self, coord: usize) {
        let c = &mut self.coords[coord];
        while c.applied < self.log.len() {
            let (command, ctx) = self.log[c.applied].clone();
            apply(&mut c.state, command, ctx);
            c.applied += 1;
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Client => self.client(),
            Event::ClientRetry(op) => self.submit(op),
            Event::Commit(id) => self.commit(id),
            Event::Round { term } => self.round(term),
            Event::LeaderLoop { term } => self.leader_loop(term),
            Event::Election => self.election(),
            Event::Fault => self.fault(),
            Event::CoordRestart(coord) => {
                self.coords[coord].alive = true;
                if self.leader.is_none() && !self.election_pending {
                    self.election_pending = true;
                    self.after(1_000, Event::Election);
                }
            }
            Event::AgentRestart(node) => self.agent_start(node),
            Event::Heal { node, token } => {
                let agent = &mut self.agents[node];
                if agent.link_token == token {
                    agent.up_loss = false;
                    agent.down_loss = false;
                }
            }
            Event::ToLeader {
                coord,
                node,
                conn,
                msg,
            } => self.at_coordinator(coord, node, conn, msg),
            Event::ToAgent { node, conn, msg } => self.at_agent(node, conn, msg),
            Event::AgentTick { node, token } => {
                if self.agents[node].wake_token == token {
                    self.agents[node].wake_at = None;
                    self.agent_tick(node);
                }
            }
            Event::Heartbeat { node, conn } => self.heartbeat(node, conn),
            Event::Deadline {
                node,
                conn,
                request,
            } => self.deadline(node, conn, request),
            Event::Connect { node, token } => {
                if self.agents[node].connect_token == token {
                    self.connect(node);
                }
            }
            Event::Watchdog(node) => {
                let boot = self.agents[node].clock.local(self.now);
                let changed = self.agents[node]
                    .host
                    .lock()
                    .unwrap()
                    .watchdog_poll(self.now, boot);
                if changed {
                    self.wake(node, self.now + 1);
                }
                self.after(WATCHDOG_POLL_MS, Event::Watchdog(node));
            }
        }
    }

    // ---- Raft, modelled ----

    fn quorum(&self) -> bool {
        let alive = self.coords.iter().filter(|c| c.alive).count();
        alive * 2 > self.coords.len()
    }

    fn election(&mut self) {
        self.election_pending = false;
        if self.leader.is_some() {
            return;
        }
        let alive: Vec<usize> = (0..self.coords.len())
            .filter(|c| self.coords[*c].alive)
            .collect();
        if !self.quorum() {
            self.election_pending = true;
            self.after(1_000, Event::Election);
            return;
        }
        let coord = *self.rng.pick(&alive);
        self.term += 1;
        self.catch_up(coord);
        self.stats.leader_changes += 1;
        self.leader = Some(Leadership {
            coord,
            term: self.term,
            leases: NodeLeases::new(match self.config.broken_node_lease_ms {
                Some(lease_ms) => AgentTuning {
                    agent_lease_ms: lease_ms,
                    node_lease_margin_ms: 0,
                    ..self.tuning.clone()
                },
                None => self.tuning.clone(),
            }),
            sent: BTreeMap::new(),
            plan_in_flight: false,
            round_scheduled: false,
            lost_in_flight: BTreeSet::new(),
            last_time_limit_check: self.now,
            last_round: self.now,
        });
        let term = self.term;
        self.after(1, Event::LeaderLoop { term });
        self.schedule_round();
    }

    /// The leader goes (crashed or deposed): each of its pending entries either reached a
    /// majority (and the next leader commits it) or is lost; nobody hears back either way.
    fn depose(&mut self) {
        let Some(leadership) = self.leader.take() else {
            return;
        };
        let pending: Vec<u64> = self
            .proposals
            .iter()
            .filter(|(_, p)| p.term == leadership.term)
            .map(|(id, _)| *id)
            .collect();
        for id in pending {
            let proposal = self.proposals.remove(&id).expect("pending");
            let survives = self.rng.chance(1, 2);
            if survives {
                for command in proposal.commands {
                    self.append(command, proposal.time_ms);
                }
                self.after_commit();
            }
            if let Origin::Client(op) = proposal.origin {
                self.op_unknown(op);
            }
        }
        if !self.election_pending {
            self.election_pending = true;
            let delay = self.rng.range(1_000, 3_000);
            self.after(delay, Event::Election);
        }
    }

    fn propose(&mut self, commands: Vec<Command>, origin: Origin) -> bool {
        let Some(leadership) = &self.leader else {
            return false;
        };
        let coord = leadership.coord;
        let term = leadership.term;
        let time_ms = self.coords[coord].clock.wall(self.now);
        self.next_proposal += 1;
        let id = self.next_proposal;
        self.proposals.insert(
            id,
            Proposal {
                term,
                commands,
                origin,
                time_ms,
            },
        );
        // Raft commits one leader's entries in the order it proposed them.
        let delay = self.net.range(1, 6);
        let at = (self.now + delay).max(self.last_commit_at);
        self.last_commit_at = at;
        self.at(at, Event::Commit(id));
        true
    }

    /// Proposal `id` reaches a majority: it commits, after every earlier proposal of its
    /// leader that has not yet (one held back while the majority was down).
    fn commit(&mut self, id: u64) {
        let Some(proposal) = self.proposals.get(&id) else {
            return;
        };
        let current = self.leader.as_ref().map(|l| l.term);
        if current != Some(proposal.term) {
            return;
        }
        if !self.quorum() {
            self.after(100, Event::Commit(id));
            return;
        }
        let term = proposal.term;
        let due: Vec<u64> = self
            .proposals
            .range(..=id)
            .filter(|(_, p)| p.term == term)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if self.leader.as_ref().map(|l| l.term) == Some(term) {
                self.commit_one(id);
            }
        }
    }

    fn commit_one(&mut self, id: u64) {
        let proposal = self.proposals.remove(&id).expect("present");
        let outcomes: Vec<Outcome> = proposal
            .commands
            .into_iter()
            .map(|command| self.append(command, proposal.time_ms))
            .collect();
        let coord = self.leader.as_ref().expect("leading").coord;
        self.catch_up(coord);
        match proposal.origin {
            Origin::Client(op) => self.op_done(op, outcomes.into_iter().next()),
            Origin::Register {
                node,
                conn,
                request,
                sent_local,
            } => {
                let name = self.agents[node].name.clone();
                let clock = self.coords[coord].clock;
                let at = self.instant(clock.local(self.now));
                let leadership = self.leader.as_mut().expect("leading");
                leadership
                    .leases
                    .heard_from_at(&name, at, clock.wall(self.now));
                self.coords[coord]
                    .sessions
                    .entry(node)
                    .or_default()
                    .insert(conn);
                leadership.sent.remove(&node);
                let down = Down::Registered {
                    sent_local,
                    request,
                    lease_ms: self.tuning.agent_lease_ms,
                    heartbeat_ms: self.tuning.agent_heartbeat_ms,
                };
                self.send_down(node, conn, down);
            }
            Origin::Report {
                node,
                conn,
                request,
                seqs,
            } => self.send_down(node, conn, Down::Reported { seqs, request }),
            Origin::Plan => {
                let leadership = self.leader.as_mut().expect("leading");
                leadership.plan_in_flight = false;
            }
            Origin::MarkLost(node) => {
                if outcomes.iter().any(|o| matches!(o, Outcome::Done)) {
                    self.stats.nodes_lost += 1;
                }
                let leadership = self.leader.as_mut().expect("leading");
                leadership.lost_in_flight.remove(&node);
            }
            Origin::Internal => {}
        }
        self.after_commit();
    }

    /// After entries were committed: the invariants, the desired states, the next round.
    fn after_commit(&mut self) {
        if let Err(error) = self.committed.validate() {
            self.violation(format!("the committed state breaks an invariant: {error}"));
        }
        self.check_fencing();
        self.refresh_desired();
        self.schedule_round();
    }

    fn schedule_round(&mut self) {
        let Some(leadership) = self.leader.as_mut() else {
            return;
        };
        if leadership.round_scheduled {
            return;
        }
        leadership.round_scheduled = true;
        let term = leadership.term;
        self.after(ROUND_DEBOUNCE_MS, Event::Round { term });
    }

    fn round(&mut self, term: u64) {
        let origin = self.origin;
        let Some(leadership) = self.leader.as_mut().filter(|l| l.term == term) else {
            return;
        };
        leadership.round_scheduled = false;
        if leadership.plan_in_flight {
            return;
        }
        leadership.last_round = self.now;
        let coord = leadership.coord;
        let at = origin + Duration::from_millis(self.coords[coord].clock.local(self.now));
        let state = &self.coords[coord].state;
        let unreachable = leadership.leases.unreachable(state, at);
        let plan = quotient_core::plan_with(state, &unreachable, DEFAULT_TOPOLOGY_KEY);
        if plan.is_empty() {
            return;
        }
        leadership.plan_in_flight = true;
        self.propose(vec![Command::ApplyPlan(plan)], Origin::Plan);
    }

    fn leader_loop(&mut self, term: u64) {
        let Some(leadership) = self.leader.as_ref().filter(|l| l.term == term) else {
            return;
        };
        let coord = leadership.coord;
        let clock = self.coords[coord].clock;
        let at = self.instant(clock.local(self.now));
        let state = &self.coords[coord].state;
        let expired = leadership.leases.expired(state, at);
        let time_limits = self.now >= leadership.last_time_limit_check + TIME_LIMIT_CHECK_MS;
        let over = if time_limits {
            let now_ms = clock.wall(self.now);
            let over = past_time_limit(state, now_ms)
                .into_iter()
                .map(|(job, attempt)| Command::StopAtTimeLimit { job, attempt });
            let unstarted = gangs_not_started(state, now_ms, GANG_START_TIMEOUT_MS)
                .into_iter()
                .map(|(job, attempt)| Command::StopUnstarted { job, attempt });
            over.chain(unstarted).collect()
        } else {
            Vec::new()
        };
        let safety_round = self.now >= leadership.last_round + ROUND_TICK_MS;
        for node in expired {
            let leadership = self.leader.as_mut().expect("leading");
            if leadership.lost_in_flight.insert(node.clone()) {
                let command = Command::MarkNodeLost { node: node.clone() };
                self.propose(vec![command], Origin::MarkLost(node));
            }
        }
        if time_limits {
            self.leader.as_mut().expect("leading").last_time_limit_check = self.now;
            for command in over {
                self.propose(vec![command], Origin::Internal);
            }
        }
        if safety_round {
            self.schedule_round();
        }
        self.after(LEASE_CHECK_MS, Event::LeaderLoop { term });
    }

    /// Recomputes each node's desired allocations on the leader and pushes the changed ones
    /// to the agents registered with it (their long polls).
    fn refresh_desired(&mut self) {
        let Some(leadership) = self.leader.as_ref() else {
            return;
        };
        let coord = leadership.coord;
        let term = leadership.term;
        let index = self.log.len() as u64;
        let mut pushes = Vec::new();
        for node in 0..self.agents.len() {
            let state = &self.coords[coord].state;
            let Some(record) = state.node_by_name(&self.agents[node].name) else {
                continue;
            };
            let allocations = desired_allocations(state, record);
            let signature: Signature = allocations
                .iter()
                .map(|a| {
                    (
                        a.job,
                        a.attempt,
                        a.intent == WireIntent::Stop,
                        a.gpu_indices.clone(),
                    )
                })
                .collect();
            let leadership = self.leader.as_mut().expect("leading");
            let changed = leadership
                .sent
                .get(&node)
                .is_none_or(|(sent, _)| *sent != signature);
            if changed {
                let fence = Fence { term, index };
                leadership.sent.insert(node, (signature, fence));
                // Every long poll of the node's on this coordinator is answered; those of
                // connections the agent has dropped go nowhere.
                for conn in self.coords[coord].sessions.get(&node).into_iter().flatten() {
                    pushes.push((node, *conn, fence, allocations.clone()));
                }
            }
        }
        for (node, conn, fence, allocations) in pushes {
            self.send_down(node, conn, Down::Desired { fence, allocations });
        }
    }

    /// The leader's current desired state for `node`, as a long poll answers it.
    fn desired_now(&mut self, node: usize) -> Option<(Fence, Vec<WireAllocation>)> {
        self.refresh_desired();
        let leadership = self.leader.as_ref()?;
        let state = &self.coords[leadership.coord].state;
        let record = state.node_by_name(&self.agents[node].name)?;
        let fence = leadership.sent.get(&node)?.1;
        Some((fence, desired_allocations(state, record)))
    }

    // ---- the coordinators' side of the agent protocol ----

    fn at_coordinator(&mut self, coord: usize, node: usize, conn: u64, msg: Up) {
        if !self.coords[coord].alive {
            return;
        }
        if matches!(msg, Up::Register { .. }) {
            self.coords[coord].conns.insert(conn);
        } else if !self.coords[coord].conns.contains(&conn) {
            // A connection to the process before this one: closed, nothing answers on it.
            return;
        }
        let leading = self.leader.as_ref().is_some_and(|l| l.coord == coord);
        if !leading {
            if !matches!(msg, Up::Watch) {
                self.send_down(node, conn, Down::NotLeader);
            }
            return;
        }
        let name = self.agents[node].name.clone();
        match msg {
            Up::Register {
                sent_local,
                request,
            } => {
                let inventory = NodeInventory {
                    name: name.clone(),
                    gpus: self.agents[node].present_gpus().to_vec(),
                    host: HostInfo {
                        runtimes: vec![quotient_common::Runtime::Process],
                        cpu_millis: 64_000,
                        memory_bytes: 256 << 30,
                        ..HostInfo::default()
                    },
                };
                let origin = Origin::Register {
                    node,
                    conn,
                    request,
                    sent_local,
                };
                // As the agent service: a registration is news from the node.
                let clock = self.coords[coord].clock;
                let at = self.instant(clock.local(self.now));
                let leadership = self.leader.as_mut().expect("leading");
                leadership
                    .leases
                    .heard_from_at(&name, at, clock.wall(self.now));
                self.propose(vec![Command::RegisterNode(inventory)], origin);
            }
            Up::Heartbeat {
                sent_local,
                request,
            } => {
                let registered = self.coords[coord]
                    .state
                    .node_by_name(&name)
                    .is_some_and(|record| record.state != NodeState::Lost);
                if !registered {
                    self.send_down(node, conn, Down::NotRegistered);
                    return;
                }
                let clock = self.coords[coord].clock;
                let at = self.instant(clock.local(self.now));
                let leadership = self.leader.as_mut().expect("leading");
                leadership
                    .leases
                    .heard_from_at(&name, at, clock.wall(self.now));
                self.send_down(
                    node,
                    conn,
                    Down::Ack {
                        sent_local,
                        request,
                    },
                );
            }
            Up::Report { reports, request } => {
                let seqs = reports.iter().map(|(seq, _)| *seq).collect();
                let commands = reports
                    .into_iter()
                    .map(|(_, report)| Command::ReportJob(report))
                    .collect();
                let origin = Origin::Report {
                    node,
                    conn,
                    request,
                    seqs,
                };
                self.propose(commands, origin);
            }
            Up::Watch => {
                if let Some((fence, allocations)) = self.desired_now(node) {
                    self.send_down(node, conn, Down::Desired { fence, allocations });
                }
            }
        }
    }

    // ---- the network ----

    fn delay(&mut self) -> u64 {
        if self.net.chance(1, 20) {
            self.net.range(20, 300)
        } else {
            self.net.range(1, 5)
        }
    }

    fn send_up(&mut self, node: usize, coord: usize, conn: u64, msg: Up) {
        if self.agents[node].up_loss {
            return;
        }
        let delay = self.delay();
        self.after(
            delay,
            Event::ToLeader {
                coord,
                node,
                conn,
                msg,
            },
        );
    }

    fn send_down(&mut self, node: usize, conn: u64, msg: Down) {
        if self.agents[node].down_loss {
            return;
        }
        let delay = self.delay();
        self.after(delay, Event::ToAgent { node, conn, msg });
    }

    // ---- agents ----

    fn agent_local(&self, node: usize) -> u64 {
        self.agents[node].clock.local(self.now)
    }

    fn agent_start(&mut self, node: usize) {
        if self.agents[node].proc.is_some() {
            return;
        }
        let local = self.agent_local(node);
        let agent = &mut self.agents[node];
        agent.mono.advance_to(local);
        let runtime = SimRuntime {
            host: agent.host.clone(),
            clock: self.clock.clone(),
        };
        let uuids = agent
            .present_gpus()
            .iter()
            .map(|gpu| (gpu.index, gpu.uuid.clone()))
            .collect();
        let state_dir = Path::new("/quotient-sim").join(&agent.name);
        let mut executor = Executor::new(runtime, &agent.name, &state_dir, uuids)
            .with_manual_clock(agent.mono.clone())
            .with_signal_records(agent.signals.clone())
            .with_started_records(agent.started.clone())
            .defer_removals();
        for (job, attempt) in &agent.journal.finished {
            executor.remember_finished(*job, *attempt);
        }
        if let Err(error) = ready(executor.recover()) {
            panic!("the simulated runtime cannot fail to list its jobs: {error}");
        }
        let wall = agent.clock.wall(self.now);
        let lease = LeaseClock::resumed(
            agent.journal.last_ack_wall,
            AGENT_LEASE_FLAG_MS,
            self.origin + Duration::from_millis(local),
            wall,
        );
        agent.proc = Some(AgentProc {
            executor,
            lease,
            latest: None,
            desired: None,
            fenced: false,
            fencing_published: false,
            session: None,
            backoff_ms: BACKOFF_MIN_MS,
        });
        let spread = self.rng.range(0, RECONNECT_SPREAD_MS);
        self.schedule_connect(node, spread);
        self.wake(node, self.now + 1);
    }

    fn schedule_connect(&mut self, node: usize, delay: u64) {
        let agent = &mut self.agents[node];
        agent.connect_token += 1;
        let token = agent.connect_token;
        self.after(delay, Event::Connect { node, token });
    }

    /// The agent looks for the leader: the real one asks every coordinator at once and the
    /// leader wins; here the request goes to the leader when there is one, else to some
    /// live coordinator, which answers that it does not lead.
    fn connect(&mut self, node: usize) {
        let Some(proc) = self.agents[node].proc.as_ref() else {
            return;
        };
        if proc.session.is_some() {
            return;
        }
        let target = match &self.leader {
            Some(leadership) => Some(leadership.coord),
            None => {
                let alive: Vec<usize> = (0..self.coords.len())
                    .filter(|c| self.coords[*c].alive)
                    .collect();
                (!alive.is_empty()).then(|| *self.rng.pick(&alive))
            }
        };
        let Some(coord) = target else {
            self.lose_session(node, false);
            return;
        };
        self.next_conn += 1;
        self.next_request += 1;
        let conn = self.next_conn;
        let request = self.next_request;
        let sent_local = self.agent_local(node);
        let proc = self.agents[node].proc.as_mut().expect("running");
        proc.session = Some(Session {
            conn,
            coord,
            registered: false,
            heartbeat_ms: self.tuning.agent_heartbeat_ms,
            register_request: request,
            heartbeat_pending: None,
            tick_missed: false,
            report_pending: None,
        });
        self.send_up(
            node,
            coord,
            conn,
            Up::Register {
                sent_local,
                request,
            },
        );
        self.after(
            REGISTER_DEADLINE_MS,
            Event::Deadline {
                node,
                conn,
                request,
            },
        );
    }

    /// The connection ends; the agent looks for the leader again after its backoff (and a
    /// random spread when the leader was lost), or at once after a `NotLeader`.
    fn lose_session(&mut self, node: usize, at_once: bool) {
        let Some(proc) = self.agents[node].proc.as_mut() else {
            return;
        };
        proc.session = None;
        let delay = if at_once {
            0
        } else {
            let backoff = proc.backoff_ms;
            proc.backoff_ms = (proc.backoff_ms * 2).min(BACKOFF_MAX_MS);
            backoff
        };
        let spread = if at_once {
            self.rng.range(0, 50)
        } else {
            self.rng.range(0, RECONNECT_SPREAD_MS)
        };
        self.schedule_connect(node, delay + spread);
    }

    fn session_conn(&self, node: usize) -> Option<u64> {
        self.agents[node]
            .proc
            .as_ref()?
            .session
            .as_ref()
            .map(|s| s.conn)
    }

    /// A tick of the agent's heartbeat loop (`tokio::time::interval`, delayed when missed):
    /// one heartbeat at a time, each awaited up to its deadline; a tick that comes while one
    /// is unanswered sends the next as soon as the answer comes.
    fn heartbeat(&mut self, node: usize, conn: u64) {
        if self.session_conn(node) != Some(conn) {
            return;
        }
        let proc = self.agents[node].proc.as_mut().expect("running");
        let deadline = quotient_agent::session::heartbeat_deadline(proc.lease.lease_ms());
        let deadline = deadline.as_millis() as u64;
        let session = proc.session.as_mut().expect("connected");
        let interval = session.heartbeat_ms;
        let clock = self.agents[node].clock;
        self.after(clock.true_span(interval), Event::Heartbeat { node, conn });
        let proc = self.agents[node].proc.as_mut().expect("running");
        let session = proc.session.as_mut().expect("connected");
        if session.heartbeat_pending.is_some() {
            if deadline == interval {
                // Its deadline, one interval, has passed unanswered (checked at the tick
                // rather than by an event of its own: there are many heartbeats).
                self.lose_session(node, false);
            } else {
                session.tick_missed = true;
            }
            return;
        }
        self.send_heartbeat(node, deadline, interval);
    }

    fn send_heartbeat(&mut self, node: usize, deadline: u64, interval: u64) {
        self.next_request += 1;
        let request = self.next_request;
        let sent_local = self.agent_local(node);
        let proc = self.agents[node].proc.as_mut().expect("running");
        let session = proc.session.as_mut().expect("connected");
        session.heartbeat_pending = Some(request);
        session.tick_missed = false;
        let (coord, conn) = (session.coord, session.conn);
        self.send_up(
            node,
            coord,
            conn,
            Up::Heartbeat {
                sent_local,
                request,
            },
        );
        if deadline != interval {
            let clock = self.agents[node].clock;
            self.after(
                clock.true_span(deadline),
                Event::Deadline {
                    node,
                    conn,
                    request,
                },
            );
        }
    }

    fn deadline(&mut self, node: usize, conn: u64, request: u64) {
        if self.session_conn(node) != Some(conn) {
            return;
        }
        let proc = self.agents[node].proc.as_mut().expect("running");
        let session = proc.session.as_mut().expect("connected");
        if session.report_pending == Some(request) {
            session.report_pending = None;
            self.send_reports(node);
            return;
        }
        let unanswered = session.heartbeat_pending == Some(request)
            || (!session.registered && session.register_request == request);
        if unanswered {
            self.lose_session(node, false);
        }
    }

    /// The leader acknowledged something the agent sent at `sent_local`: the lease is
    /// renewed from that send time, the lease file rewritten and the acknowledgement journaled.
    fn renew(&mut self, node: usize, sent_local: u64, lease_ms: Option<u64>) {
        let local = self.agent_local(node);
        let sent = self.instant(sent_local);
        let now_instant = self.instant(local);
        let agent = &mut self.agents[node];
        let wall = agent.clock.wall(self.now);
        let proc = agent.proc.as_mut().expect("running");
        if let Some(lease_ms) = lease_ms {
            proc.lease.set_lease_ms(lease_ms);
        }
        proc.lease.renew(sent);
        let line = lease_file_line(&proc.lease, now_instant, local, false);
        agent.host.lock().unwrap().lease_file = Some((parse_expiry(&line), false));
        agent.journal.last_ack_wall = Some(wall);
        self.wake(node, self.now + 1);
    }

    fn at_agent(&mut self, node: usize, conn: u64, msg: Down) {
        if self.session_conn(node) != Some(conn) {
            return;
        }
        match msg {
            Down::Registered {
                sent_local,
                request,
                lease_ms,
                heartbeat_ms,
            } => {
                let proc = self.agents[node].proc.as_mut().expect("running");
                let session = proc.session.as_mut().expect("connected");
                if session.register_request != request || session.registered {
                    return;
                }
                let (lease_ms, heartbeat_ms) = quotient_agent::session::agreed_timing(
                    lease_ms,
                    heartbeat_ms,
                    quotient_agent::config::LEASE_MIN_MS,
                );
                session.registered = true;
                session.heartbeat_ms = heartbeat_ms;
                proc.backoff_ms = BACKOFF_MIN_MS;
                self.renew(node, sent_local, Some(lease_ms));
                let clock = self.agents[node].clock;
                self.after(
                    clock.true_span(heartbeat_ms),
                    Event::Heartbeat { node, conn },
                );
                self.send_reports(node);
            }
            Down::Ack {
                sent_local,
                request,
            } => {
                let proc = self.agents[node].proc.as_mut().expect("running");
                let deadline = quotient_agent::session::heartbeat_deadline(proc.lease.lease_ms());
                let session = proc.session.as_mut().expect("connected");
                let mut send_next = None;
                if session.heartbeat_pending == Some(request) {
                    session.heartbeat_pending = None;
                    if session.tick_missed {
                        send_next = Some((deadline.as_millis() as u64, session.heartbeat_ms));
                    }
                }
                self.renew(node, sent_local, None);
                if let Some((deadline, interval)) = send_next {
                    self.send_heartbeat(node, deadline, interval);
                }
            }
            Down::Reported { seqs, request } => {
                let agent = &mut self.agents[node];
                for seq in seqs {
                    agent.journal.pending.remove(&seq);
                }
                let proc = agent.proc.as_mut().expect("running");
                let session = proc.session.as_mut().expect("connected");
                if session.report_pending == Some(request) {
                    session.report_pending = None;
                }
                self.send_reports(node);
            }
            Down::Desired { fence, allocations } => {
                if fence.term == 0 {
                    return;
                }
                let desired = Desired {
                    fence: fence.as_u64(),
                    allocations: allocations.into_iter().map(desired_allocation).collect(),
                };
                let proc = self.agents[node].proc.as_mut().expect("running");
                proc.latest = Some(desired);
                self.wake(node, self.now);
            }
            Down::NotLeader => self.lose_session(node, true),
            Down::NotRegistered => self.lose_session(node, true),
        }
    }

    fn send_reports(&mut self, node: usize) {
        let agent = &mut self.agents[node];
        let Some(proc) = agent.proc.as_mut() else {
            return;
        };
        let Some(session) = proc.session.as_mut() else {
            return;
        };
        if !session.registered
            || session.report_pending.is_some()
            || agent.journal.pending.is_empty()
        {
            return;
        }
        let reports: Vec<(u64, JobReport)> = agent
            .journal
            .pending
            .iter()
            .take(REPORTS_PER_REQUEST)
            .map(|(seq, report)| (*seq, report.clone()))
            .collect();
        self.next_request += 1;
        let request = self.next_request;
        session.report_pending = Some(request);
        let (coord, conn) = (session.coord, session.conn);
        self.send_up(node, coord, conn, Up::Report { reports, request });
        self.after(
            REPORT_DEADLINE_MS,
            Event::Deadline {
                node,
                conn,
                request,
            },
        );
    }

    /// Wakes the agent's executor loop at `time` unless it wakes earlier already.
    fn wake(&mut self, node: usize, time: u64) {
        let agent = &mut self.agents[node];
        if agent.proc.is_none() || agent.wake_at.is_some_and(|at| at <= time) {
            return;
        }
        agent.wake_at = Some(time);
        agent.wake_token += 1;
        let token = agent.wake_token;
        self.at(time, Event::AgentTick { node, token });
    }

    /// One pass of the agent's executor loop (`quotient_agent::run`): the lease check and
    /// self-fencing, the newest desired state, one executor step, the reports journaled.
    fn agent_tick(&mut self, node: usize) {
        let local = self.agent_local(node);
        let now_instant = self.instant(local);
        let agent = &mut self.agents[node];
        agent.mono.advance_to(local);
        let Some(proc) = agent.proc.as_mut() else {
            return;
        };
        let expired = proc.lease.expired(now_instant);
        let mut want_desired = false;
        if expired && !proc.fenced {
            proc.fenced = true;
            proc.desired = None;
            self.stats.self_fences += 1;
        } else if !expired && proc.fenced {
            proc.fenced = false;
            proc.fencing_published = false;
            want_desired = true;
        }
        if let Some(latest) = proc.latest.take() {
            if !proc.fenced {
                proc.desired = Some(latest);
            }
        }
        let reports = if proc.fenced {
            let reports = ready(proc.executor.stop_all());
            if !proc.fencing_published {
                let line = lease_file_line(&proc.lease, now_instant, local, true);
                agent.host.lock().unwrap().lease_file = Some((parse_expiry(&line), true));
                proc.fencing_published = true;
            }
            reports
        } else if let Some(desired) = &proc.desired {
            ready(proc.executor.step(desired))
        } else {
            ready(proc.executor.step_idle())
        };
        for report in reports {
            if report.event.ends_attempt() {
                agent.journal.finished.insert((report.job, report.attempt));
            }
            agent.journal.next_seq += 1;
            agent.journal.pending.insert(agent.journal.next_seq, report);
        }
        ready(proc.executor.remove_forgotten());
        // When the loop must look again: the lease's end, a grace period's end or a launch
        // retry, a process's exit (each seen up to one executor tick late), or a second.
        let clock = agent.clock;
        let mut next = self.now + 1_000;
        if !proc.fenced {
            let remaining = proc.lease.remaining(now_instant).as_millis() as u64;
            next = next.min(self.now + clock.true_span(remaining + 1));
        }
        if let Some(deadline) = proc.executor.next_deadline() {
            next = next.min(self.now + clock.true_span(deadline.as_millis() as u64));
        }
        let exit = agent.host.lock().unwrap().next_exit(self.now);
        let jitter = self.rng.range(1, TICK_MS);
        if let Some(exit) = exit {
            next = next.min(exit + jitter);
        }
        let violations = std::mem::take(&mut agent.host.lock().unwrap().violations);
        for violation in violations {
            self.violation(violation);
        }
        if want_desired {
            if let Some(session) = self.agents[node]
                .proc
                .as_ref()
                .and_then(|p| p.session.as_ref())
                .filter(|s| s.registered)
            {
                let (coord, conn) = (session.coord, session.conn);
                self.send_up(node, coord, conn, Up::Watch);
            }
        }
        self.check_runs();
        self.send_reports(node);
        self.wake(node, next.max(self.now + 1));
    }

    // ---- clients ----

    fn client(&mut self) {
        if self.healed {
            return;
        }
        let jobs: Vec<JobId> = self
            .ops
            .iter()
            .filter_map(|op| match &op.outcome {
                OpOutcome::Acknowledged(Outcome::JobSubmitted { job, .. }) => Some(*job),
                _ => None,
            })
            .collect();
        let roll = self.workload.range(0, 99);
        let kind = if roll < 75 || jobs.is_empty() {
            OpKind::Submit {
                spec: Box::new(self.job_spec()),
            }
        } else if roll < 85 {
            OpKind::Cancel(*self.workload.pick(&jobs))
        } else if roll < 97 {
            let priority = self.workload.range(0, 99) as u32;
            OpKind::Priority(*self.workload.pick(&jobs), priority)
        } else {
            let (name, base) = self.workload.pick(&self.shares).clone();
            let limit = self.workload.range(1, u64::from(base) * 2) as u32;
            OpKind::ShareLimit(name, limit)
        };
        self.ops.push(Op {
            kind,
            outcome: OpOutcome::Pending,
            tries: 0,
        });
        self.stats.operations += 1;
        let op = self.ops.len() - 1;
        self.submit(op);
        let next = self.workload.exponential_ms(12_000) + 10;
        self.after(next, Event::Client);
    }

    fn job_spec(&mut self) -> JobSpec {
        let w = &mut self.workload;
        let share = w.pick(&["reserve", "lend", "borrow"]).to_string();
        let gpus_max = self.agents[0].gpus.len() as u64;
        let gpus = (1u32 << w.range(0, 2)).min(gpus_max as u32);
        let behaviour = Behaviour {
            run_ms: w.exponential_ms(240_000) + 5_000,
            checkpoint_ms: if w.chance(4, 5) {
                Some(w.range(50, 5_000))
            } else {
                None
            },
            code: if w.chance(1, 10) { 1 } else { 0 },
        };
        let mut spec = JobSpec::new(&share, w.range(0, 99) as u32, gpus, behaviour.command());
        if w.chance(1, 8) {
            // A job of several nodes: one member per node, all placed or none.
            spec.nodes = w.range(2, 3) as u32;
        }
        spec.grace_period_ms = *w.pick(&[0, 1_000, 5_000, 10_000, 30_000]);
        spec.idempotency_key = Some(format!("key-{}", self.ops.len()));
        if w.chance(1, 10) {
            spec.time_limit_ms = Some(w.range(30_000, 600_000));
        }
        spec
    }

    fn submit(&mut self, op: usize) {
        self.ops[op].tries += 1;
        let command = match &self.ops[op].kind {
            OpKind::Submit { spec } => Command::SubmitJob(spec.as_ref().clone()),
            OpKind::Cancel(job) => Command::CancelJob { job: *job },
            OpKind::Priority(job, priority) => Command::UpdateJobPriority {
                job: *job,
                priority: *priority,
            },
            OpKind::ShareLimit(name, limit) => Command::UpdateShare {
                name: name.clone(),
                update: ShareUpdate {
                    limits: Some(BTreeMap::from([(
                        GpuClass::parse(CLASS).expect("a valid class"),
                        *limit,
                    )])),
                    ..ShareUpdate::default()
                },
            },
        };
        if !self.propose(vec![command], Origin::Client(op)) {
            self.op_unknown(op);
        }
    }

    fn op_done(&mut self, op: usize, outcome: Option<Outcome>) {
        let outcome = match outcome {
            Some(Outcome::Rejected(_)) | None => OpOutcome::Refused,
            Some(outcome) => {
                self.stats.acknowledged += 1;
                OpOutcome::Acknowledged(outcome)
            }
        };
        self.ops[op].outcome = outcome;
    }

    /// No answer: a submit is tried again with its key, as a client does; anything else stays
    /// unknown.
    fn op_unknown(&mut self, op: usize) {
        let retry =
            matches!(self.ops[op].kind, OpKind::Submit { .. }) && self.ops[op].tries < SUBMIT_TRIES;
        if retry && !self.healed {
            let wait = self.workload.range(500, 3_000);
            self.after(wait, Event::ClientRetry(op));
        } else {
            self.ops[op].outcome = OpOutcome::Unknown;
            self.stats.unknown += 1;
        }
    }

    // ---- the nemesis ----

    fn fault(&mut self) {
        if self.healed {
            return;
        }
        let roll = self.nemesis.range(0, 99);
        let kind = match roll {
            0..=14 => self.crash_coordinator(true),
            15..=24 => self.crash_coordinator(false),
            25..=29 => {
                self.depose();
                "leader-deposed"
            }
            30..=44 => {
                let node = self.nemesis.range(0, self.agents.len() as u64 - 1) as usize;
                if self.agents[node].proc.take().is_none() {
                    "agent-crash"
                } else {
                    self.agents[node].wake_at = None;
                    let down = self.nemesis.range(1_000, 60_000);
                    self.after(down, Event::AgentRestart(node));
                    // One crash in four, the agent comes back without its last GPU (or with
                    // it again): jobs placed there run on until the coordinators stop them.
                    if self.nemesis.chance(1, 4) {
                        let agent = &mut self.agents[node];
                        agent.without_last_gpu = !agent.without_last_gpu && agent.gpus.len() > 1;
                        "agent-crash-gpu-change"
                    } else {
                        "agent-crash"
                    }
                }
            }
            45..=64 => self.cut_link(true, true),
            65..=72 => self.cut_link(true, false),
            73..=80 => self.cut_link(false, true),
            81..=89 => {
                let node = self.nemesis.range(0, self.agents.len() as u64 - 1) as usize;
                let jump = self.nemesis.range(1_000, 120_000) as i64;
                let sign = if self.nemesis.chance(1, 2) { -1 } else { 1 };
                self.agents[node].clock.wall_offset_ms += sign * jump;
                "agent-clock-jump"
            }
            _ => {
                let coord = self.nemesis.range(0, self.coords.len() as u64 - 1) as usize;
                let jump = self.nemesis.range(1_000, 60_000) as i64;
                let sign = if self.nemesis.chance(1, 2) { -1 } else { 1 };
                self.coords[coord].clock.wall_offset_ms += sign * jump;
                "coordinator-clock-jump"
            }
        };
        *self.stats.faults.entry(kind.to_string()).or_insert(0) += 1;
        let next = self.nemesis.exponential_ms(40_000) + 1_000;
        self.after(next, Event::Fault);
    }

    fn crash_coordinator(&mut self, leader: bool) -> &'static str {
        let coord = match (&self.leader, leader) {
            (Some(leadership), true) => leadership.coord,
            _ => self.nemesis.range(0, self.coords.len() as u64 - 1) as usize,
        };
        if !self.coords[coord].alive {
            return "coordinator-crash";
        }
        self.coords[coord].alive = false;
        self.coords[coord].sessions.clear();
        self.coords[coord].conns.clear();
        if self.leader.as_ref().is_some_and(|l| l.coord == coord) {
            self.depose();
        }
        let down = self.nemesis.range(1_000, 30_000);
        self.after(down, Event::CoordRestart(coord));
        if leader {
            "leader-crash"
        } else {
            "coordinator-crash"
        }
    }

    fn cut_link(&mut self, up: bool, down: bool) -> &'static str {
        let node = self.nemesis.range(0, self.agents.len() as u64 - 1) as usize;
        let length = if self.nemesis.chance(1, 2) {
            self.nemesis.range(500, 12_000)
        } else {
            self.nemesis.range(12_000, 90_000)
        };
        let agent = &mut self.agents[node];
        agent.up_loss |= up;
        agent.down_loss |= down;
        agent.link_token += 1;
        let token = agent.link_token;
        self.after(length, Event::Heal { node, token });
        match (up, down) {
            (true, true) => "agent-partition",
            (true, false) => "agent-loses-upstream",
            _ => "agent-loses-downstream",
        }
    }

    /// The end of the history: every link healed, every process back.
    fn heal(&mut self) {
        self.healed = true;
        for agent in &mut self.agents {
            agent.up_loss = false;
            agent.down_loss = false;
            agent.link_token += 1;
        }
        for node in 0..self.agents.len() {
            self.agent_start(node);
        }
        for coord in 0..self.coords.len() {
            if !self.coords[coord].alive {
                self.coords[coord].alive = true;
            }
        }
        if self.leader.is_none() && !self.election_pending {
            self.election_pending = true;
            self.after(1_000, Event::Election);
        }
        for op in 0..self.ops.len() {
            if self.ops[op].outcome == OpOutcome::Pending {
                // Its retry will not run: the clients stopped.
                let pending_retry = matches!(self.ops[op].kind, OpKind::Submit { .. });
                if pending_retry {
                    self.ops[op].outcome = OpOutcome::Unknown;
                    self.stats.unknown += 1;
                }
            }
        }
    }

    // ---- invariants ----

    /// Fencing: a live process must be an attempt the committed state still places on its
    /// node. Anything else means a job may be running twice (it was requeued, or its node
    /// was declared lost, while it still ran).
    fn check_fencing(&mut self) {
        let mut found = Vec::new();
        for agent in &self.agents {
            let host = agent.host.lock().unwrap();
            for proc in host.alive(self.now) {
                let job = self.committed.job(proc.handle.job);
                let node = self.committed.node_by_name(&agent.name);
                let placed = match (job, node) {
                    (Some(job), Some(node)) => {
                        job.attempts == proc.handle.attempt && job.member_on(node.id).is_some()
                    }
                    _ => false,
                };
                if !placed {
                    let seen = job.map_or("removed".to_string(), |job| {
                        format!(
                            "{:?}, attempt {}, on {:?}",
                            job.state, job.attempts, job.last_node
                        )
                    });
                    found.push(format!(
                        "{} attempt {} still runs on {} (started at {:.3} s), but the committed state no longer places it there ({seen})",
                        proc.handle.job,
                        proc.handle.attempt,
                        agent.name,
                        proc.started_ms as f64 / 1_000.0
                    ));
                }
            }
        }
        for text in found {
            self.violation(text);
        }
    }

    /// No job runs twice at once, on one node or two.
    fn check_runs(&mut self) {
        let mut running: BTreeMap<JobId, Vec<(String, u32)>> = BTreeMap::new();
        for agent in &self.agents {
            let host = agent.host.lock().unwrap();
            for proc in host.alive(self.now) {
                running
                    .entry(proc.handle.job)
                    .or_default()
                    .push((agent.name.clone(), proc.handle.attempt));
            }
        }
        // A job of several nodes runs one process per member, each on its own node, all of
        // one attempt; anything else is a job running twice.
        for (job, runs) in running {
            let members = self
                .committed
                .job(job)
                .map_or(1, |record| record.spec.nodes) as usize;
            let attempts: BTreeSet<u32> = runs.iter().map(|(_, attempt)| *attempt).collect();
            let nodes: BTreeSet<&String> = runs.iter().map(|(node, _)| node).collect();
            if attempts.len() > 1 || nodes.len() < runs.len() || runs.len() > members {
                self.violation(format!("{job} runs more than once at a time: {runs:?}"));
            }
        }
    }

    fn final_checks(&mut self) {
        for coord in 0..self.coords.len() {
            self.catch_up(coord);
        }
        let digest = state_digest(&self.committed);
        let replicas: Vec<u64> = self.coords.iter().map(|c| state_digest(&c.state)).collect();
        for (index, replica) in replicas.into_iter().enumerate() {
            if replica != digest {
                let text = format!(
                    "coordinator {} holds a state of digest {replica:016x}, the log's is {digest:016x}",
                    index + 1
                );
                self.violation(text);
            }
        }
        if let Err(error) = self.committed.validate() {
            self.violation(format!("the final state breaks an invariant: {error}"));
        }
        // Every acknowledged submit exists once, under its key; no key made two jobs.
        let mut by_key: BTreeMap<String, Vec<JobId>> = BTreeMap::new();
        for job in self.committed.jobs() {
            if let Some(key) = &job.spec.idempotency_key {
                by_key.entry(key.clone()).or_default().push(job.id);
            }
        }
        let mut findings = Vec::new();
        for (key, jobs) in &by_key {
            if jobs.len() > 1 {
                findings.push(format!(
                    "idempotency key {key} made {} jobs: {jobs:?}",
                    jobs.len()
                ));
            }
        }
        let mut last_priority: BTreeMap<JobId, Option<u32>> = BTreeMap::new();
        for op in &self.ops {
            match (&op.kind, &op.outcome) {
                (
                    OpKind::Submit { spec },
                    OpOutcome::Acknowledged(Outcome::JobSubmitted { job, .. }),
                ) => {
                    let key = spec.idempotency_key.clone().unwrap_or_default();
                    if by_key.get(&key).map(Vec::as_slice) != Some(&[*job]) {
                        findings.push(format!(
                            "the acknowledged submit of key {key} ({job}) is not in the state once: {:?}",
                            by_key.get(&key)
                        ));
                    }
                }
                (OpKind::Cancel(job), OpOutcome::Acknowledged(_)) => {
                    let state = self.committed.job(*job).map(|j| j.state);
                    if state != Some(JobState::Cancelled) {
                        findings.push(format!(
                            "{job} was cancelled (acknowledged) but ended {state:?}"
                        ));
                    }
                }
                (OpKind::Priority(job, priority), OpOutcome::Acknowledged(_)) => {
                    last_priority.insert(*job, Some(*priority));
                }
                (OpKind::Priority(job, _), OpOutcome::Unknown | OpOutcome::Pending) => {
                    last_priority.insert(*job, None);
                }
                _ => {}
            }
        }
        for (job, priority) in last_priority {
            let Some(priority) = priority else { continue };
            let now = self.committed.job(job).map(|j| j.spec.priority);
            if now != Some(priority) {
                findings.push(format!(
                    "{job}'s priority was set to {priority} (acknowledged, the last update) but is {now:?}"
                ));
            }
        }
        // After healing, nothing is left half-way, and every node is back.
        let transient_before = self.transient_before.take().unwrap_or_default();
        for job in self.committed.jobs() {
            if transient_before.contains(&(job.id, job.attempts, job.state)) {
                findings.push(format!(
                    "{} is stuck {:?} after the cluster settled ({})",
                    job.id,
                    job.state,
                    self.describe(job)
                ));
            }
        }
        for node in self.committed.nodes() {
            if node.state != NodeState::Ready {
                let agent = self.agents.iter().find(|a| a.name == node.name);
                let status = agent.and_then(|a| a.proc.as_ref()).map(|p| {
                    (
                        p.session
                            .as_ref()
                            .map(|s| (s.coord, s.conn, s.registered, s.heartbeat_pending)),
                        p.fenced,
                        p.backoff_ms,
                    )
                });
                let leader = self.leader.as_ref().map(|l| l.coord);
                findings.push(format!(
                    "{} is {:?} after the cluster settled (its agent's (session (coord, conn, registered, heartbeat pending), fenced, backoff): {status:?}; leader {leader:?})",
                    node.name, node.state
                ));
            }
        }
        let before = self.placeable_before.take().unwrap_or_default();
        let placeable: Vec<(JobId, u32)> = placeable(&self.committed)
            .intersection(&before)
            .copied()
            .collect();
        if !placeable.is_empty() {
            findings.push(format!(
                "jobs that fit are still queued after the cluster settled: {placeable:?}"
            ));
        }
        for finding in findings {
            self.violation(finding);
        }
    }

    /// What the hosts and agents know of `job`, for a violation's message.
    fn describe(&self, job: &quotient_core::JobRecord) -> String {
        let mut parts = vec![format!(
            "attempt {}, on {:?}, stop {:?}",
            job.attempts, job.last_node, job.stop
        )];
        for agent in &self.agents {
            let host = agent.host.lock().unwrap();
            for proc in host.procs.iter().filter(|p| p.handle.job == job.id) {
                parts.push(format!(
                    "{}: attempt {} started {:.3} s, exit {:?}, signalled {:?}, killed {:?}, watchdog {:?}, removed {}",
                    agent.name,
                    proc.handle.attempt,
                    proc.started_ms as f64 / 1_000.0,
                    proc.exit(),
                    proc.signalled_ms,
                    proc.killed_ms,
                    proc.watchdog_ms,
                    proc.removed
                ));
            }
            if let Some(proc) = &agent.proc {
                let tracked: Vec<String> = proc
                    .executor
                    .jobs()
                    .filter(|t| t.local.job == job.id)
                    .map(|t| format!("{:?}", t.local))
                    .collect();
                let pending: Vec<String> = agent
                    .journal
                    .pending
                    .values()
                    .filter(|r| r.job == job.id)
                    .map(|r| format!("{:?}", r.event))
                    .collect();
                let finished = agent.journal.finished.iter().any(|(j, _)| *j == job.id);
                if !tracked.is_empty() || !pending.is_empty() || finished {
                    parts.push(format!(
                        "agent {}: tracks {tracked:?}, pending reports {pending:?}, finished here {finished}, fenced {}, desired {:?}",
                        agent.name,
                        proc.fenced,
                        proc.desired.as_ref().map(|d| d
                            .allocations
                            .iter()
                            .filter(|a| a.job == job.id)
                            .map(|a| (a.attempt, a.intent))
                            .collect::<Vec<_>>())
                    ));
                }
            }
        }
        if let Some(agent) = job
            .last_node
            .as_ref()
            .and_then(|name| self.agents.iter().position(|a| a.name == *name))
        {
            let a = &self.agents[agent];
            let leader = self.leader.as_ref().map(|l| {
                (
                    l.coord,
                    l.term,
                    self.coords[l.coord].sessions.get(&agent).cloned(),
                    l.sent.get(&agent).map(|(_, fence)| *fence),
                )
            });
            let proc = a.proc.as_ref().map(|p| {
                (
                    p.session
                        .as_ref()
                        .map(|s| (s.coord, s.conn, s.registered, s.heartbeat_pending)),
                    p.fenced,
                    p.desired.as_ref().map(|d| d.fence),
                    p.executor.fence(),
                    p.latest.is_some(),
                )
            });
            parts.push(format!(
                "its node {}: agent (session (coord, conn, registered, heartbeat pending), fenced, desired fence, executor fence, newer waiting) {proc:?}; leader (coord, term, session, sent fence) {leader:?}; links up_loss {} down_loss {}",
                a.name, a.up_loss, a.down_loss
            ));
        }
        parts.join("; ")
    }

    fn report(&mut self) -> Report {
        let mut stats = self.stats.clone();
        stats.jobs = self.committed.jobs().count() as u64;
        stats.jobs_finished = self
            .committed
            .jobs()
            .filter(|job| job.state.is_terminal())
            .count() as u64;
        stats.gangs_run = self
            .committed
            .jobs()
            .filter(|job| job.spec.nodes > 1 && job.first_started_ms.is_some())
            .count() as u64;
        stats.preemptions = self
            .committed
            .jobs()
            .map(|job| u64::from(job.preemptions))
            .sum();
        stats.watchdog_stops = self
            .agents
            .iter()
            .map(|agent| agent.host.lock().unwrap().watchdog_stops)
            .sum();
        Report {
            seed: self.config.seed,
            virtual_ms: self.now,
            stats,
            violations: self.violations.clone(),
        }
    }
}

/// How long before the end the stuck check samples what a round would place.
const PLACEABLE_WINDOW_MS: u64 = 10_000;

/// How long before the end the stuck check samples the jobs between two states: longer
/// than the longest grace period the workload gives, plus a report's way to the leader.
const TRANSIENT_WINDOW_MS: u64 = 60_000;

/// The jobs placed but not yet running, or stopping, with their attempt.
fn transient(state: &State) -> BTreeSet<(JobId, u32, JobState)> {
    state
        .jobs()
        .filter(|job| {
            matches!(
                job.state,
                JobState::Scheduled | JobState::Starting | JobState::Preempting
            )
        })
        .map(|job| (job.id, job.attempts, job.state))
        .collect()
}

/// The queued jobs (and attempt counts) a scheduling round would place now, no node avoided.
fn placeable(state: &State) -> BTreeSet<(JobId, u32)> {
    quotient_core::plan(state)
        .placements()
        .filter_map(|(job, _, _)| state.job(job).map(|record| (job, record.attempts)))
        .collect()
}

/// The expiry a lease file line names.
fn parse_expiry(line: &str) -> u64 {
    line.split_whitespace()
        .next()
        .and_then(|word| word.parse().ok())
        .expect("lease_file_line writes a number first")
}
