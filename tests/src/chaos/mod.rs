//! `quotient-chaos`: randomized fault injection against a cluster of containers, with a
//! checker of the history and the final state (docs/chaos.md).
//!
//! Each episode, from a seed derived from the run's seed and the episode's number:
//! 1. starts the coordinators and the agents, each in a Docker container of its own
//!    ([`cluster`]);
//! 2. runs concurrent clients that create and update shares and submit, reprioritise and
//!    cancel jobs, recording every operation ([`client`], [`history`]);
//! 3. meanwhile carries out the nemesis' schedule of faults ([`nemesis`]);
//! 4. heals everything, waits for the cluster to settle, and checks the history, the job
//!    scripts' records and the coordinators' state ([`checker`] and [`settle_and_check`]);
//! 5. removes the containers and the network, whatever happened.

/// A progress line on stderr, `chaos: ...`, or `chaos: [episode E] ...` on a thread that runs
/// an episode (so that episodes run side by side, `--parallel`, can be told apart).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::chaos::say(format_args!($($arg)*))
    };
}

pub mod checker;
pub mod client;
pub mod cluster;
pub mod history;
pub mod nemesis;
pub mod rng;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse, JobView, NodeView, ShareView};
use serde::Serialize;
use serde_json::{json, Value};

use checker::Violations;
use cluster::{ClusterShape, DockerCluster};
use history::{now_us, History, OpKind};
use rng::{episode_seed, Rng};

/// The image the episodes run, built from the workspace's binaries unless `--image` names one.
pub const IMAGE_DEFAULT: &str = "quotient:chaos";
/// How long the cluster may take to have every coordinator healthy and every node ready
/// again once healed.
pub const RECOVERY_S: u64 = 60;
/// How long a job may wait with a free GPU in reach (or stay SCHEDULED, STARTING or
/// PREEMPTING) after the cluster recovered before it counts as stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(10);
/// How long the stuck check samples.
pub const STUCK_WINDOW: Duration = Duration::from_secs(12);
/// How long the replicas may take to be seen at one applied index.
pub const CONVERGE_S: u64 = 30;

thread_local! {
    /// The episode this thread works for (0: none).
    static EPISODE: Cell<u32> = const { Cell::new(0) };
}

/// Tags this thread's progress lines with `episode` (0: untagged).
pub fn tag_thread(episode: u32) {
    EPISODE.set(episode);
}

/// The episode this thread's progress lines are tagged with (0: none).
pub fn thread_episode() -> u32 {
    EPISODE.get()
}

/// Prints one progress line to stderr (the `say!` macro).
pub fn say(line: std::fmt::Arguments) {
    match EPISODE.get() {
        0 => eprintln!("chaos: {line}"),
        episode => eprintln!("chaos: [episode {episode}] {line}"),
    }
}

fn parse_episodes(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(0) => Err("run at least 1 episode".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a number of episodes")),
    }
}

fn parse_episode(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(0) => Err("episodes are numbered from 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not an episode number")),
    }
}

fn parse_coordinators(text: &str) -> Result<u32, String> {
    match text {
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err(format!("{text:?}: a cluster here has 3 or 5 coordinators")),
    }
}

fn parse_agents(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if (3..=16).contains(&n) => Ok(n),
        _ => Err(format!("{text:?}: give 3 to 16 agents")),
    }
}

fn parse_length(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if (5..=3_600).contains(&n) => Ok(n),
        _ => Err(format!(
            "{text:?}: an episode's workload lasts 5 to 3600 seconds"
        )),
    }
}

fn parse_parallel(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if (1..=16).contains(&n) => Ok(n),
        _ => Err(format!("run 1 to 16 episodes at once, not {text:?}")),
    }
}

fn parse_clients(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if (1..=16).contains(&n) => Ok(n),
        _ => Err(format!("{text:?}: give 1 to 16 clients")),
    }
}

/// The command line of `quotient-chaos`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "quotient-chaos",
    about = "Randomized fault injection against a Quotient cluster of Docker containers, with a history checker",
    after_help = "The last line on stdout is one JSON object with the counts (docs/chaos.md). The exit \
    status is 0 when no check found a violation, 1 when one did, 2 for bad flags and 3 when an \
    episode could not be run (Docker missing, the image not built)."
)]
pub struct Options {
    /// Episodes to run, numbered 1..N, each with a cluster of its own.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_episodes)]
    pub episodes: u32,
    /// The run's seed; episode E's schedule is a function of (seed, E) [default: from the clock].
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Run episode E alone (with --seed: replays that episode's schedule).
    #[arg(long, value_name = "E", value_parser = parse_episode)]
    pub episode: Option<u32>,
    /// Start at episode E of the run's episodes (with --episodes N: E..=N), to continue a run
    /// of the same seed that stopped at E-1.
    #[arg(long = "from-episode", value_name = "E", default_value = "1", value_parser = parse_episode)]
    pub from_episode: u32,
    /// How long each episode's clients and faults run, in seconds (5-3600).
    #[arg(long = "length-s", value_name = "SECS", default_value = "30", value_parser = parse_length)]
    pub length_s: u64,
    /// Coordinators per episode, 3 or 5 [default: drawn from the seed].
    #[arg(long, value_name = "N", value_parser = parse_coordinators)]
    pub coordinators: Option<u32>,
    /// Agents (GPU hosts) per episode, 3-16 [default: 3 or 4, drawn from the seed].
    #[arg(long, value_name = "N", value_parser = parse_agents)]
    pub agents: Option<u32>,
    /// Concurrent clients (1-16).
    #[arg(long, value_name = "N", default_value = "3", value_parser = parse_clients)]
    pub clients: u32,
    /// Run up to N episodes at once, each with a cluster and a network of its own (1-16).
    /// What an episode draws does not depend on it; the host's load does (docs/chaos.md).
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_parallel)]
    pub parallel: u32,
    /// Start no episode after this many seconds from the run's start (those begun finish);
    /// the last line counts the episodes that ran [no limit].
    #[arg(long = "budget-s", value_name = "SECS")]
    pub budget_s: Option<u64>,
    /// Where each episode's folder goes (history.jsonl, faults.json, the shared folder,
    /// logs) [default: a new folder under the system's temporary folder].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Run this image instead of building quotient:chaos from the binaries.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Where quotient, quotient-coordinator and quotient-agent are [default: next to this
    /// program].
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
}

impl Options {
    /// Checks what the flags mean together; a message for a usage error.
    pub fn check(&self) -> Result<(), String> {
        if self.episode.is_none() && self.from_episode > self.episodes {
            return Err(format!(
                "--from-episode {} is past --episodes {}: nothing to run",
                self.from_episode, self.episodes
            ));
        }
        Ok(())
    }
}

/// What one episode did and found.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeReport {
    pub episode: u32,
    pub seed: u64,
    pub coordinators: u32,
    pub agents: Vec<u32>,
    pub mix: nemesis::Mix,
    pub operations: u64,
    pub acknowledged: u64,
    pub faults: BTreeMap<String, u64>,
    pub violations: Violations,
    pub dir: PathBuf,
}

/// The replay command of an episode.
pub fn replay_command(options: &Options, seed: u64, report: &EpisodeReport) -> String {
    format!(
        "quotient-chaos --seed {seed} --episode {} --length-s {} --coordinators {} --agents {} --clients {}",
        report.episode,
        options.length_s,
        report.coordinators,
        report.agents.len(),
        options.clients
    )
}

/// What a run did: a report per episode that ran, and the episodes that could not be run.
#[derive(Debug, Default)]
pub struct RunOutcome {
    /// In the order of the episodes' numbers.
    pub reports: Vec<EpisodeReport>,
    /// Episodes that could not be run (their cluster did not start, Docker failed), with why.
    pub not_run: Vec<(u32, String)>,
}

/// The last line: counts over every episode.
pub fn summary(seed: u64, outcome: &RunOutcome) -> Value {
    let reports = &outcome.reports;
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for report in reports {
        for (kind, count) in &report.faults {
            *faults.entry(kind.clone()).or_insert(0) += count;
        }
    }
    let count = |pick: fn(&Violations) -> usize| -> usize {
        reports.iter().map(|r| pick(&r.violations)).sum()
    };
    json!({
        "episodes": reports.len(),
        "seed": seed,
        "operations": reports.iter().map(|r| r.operations).sum::<u64>(),
        "acknowledged": reports.iter().map(|r| r.acknowledged).sum::<u64>(),
        "lost_acks": count(|v| v.lost_acks.len()),
        "duplicate_jobs": count(|v| v.duplicate_jobs.len()),
        "double_runs": count(|v| v.double_runs.len()),
        "gpu_overcommits": count(|v| v.gpu_overcommits.len()),
        "divergent_replicas": count(|v| v.divergent_replicas.len()),
        "stuck_jobs": count(|v| v.stuck_jobs.len()),
        "phantom_writes": count(|v| v.phantom_writes.len()),
        "invariant_violations": count(|v| v.invariant_violations.len()),
        "faults": faults,
        "episodes_not_run": outcome.not_run.iter().map(|(episode, _)| *episode).collect::<Vec<u32>>(),
    })
}

/// The workspace's root: where deploy/image/build-offline.sh is.
fn workspace_root(bin_dir: &Path) -> PathBuf {
    let built_here = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built_here.join("deploy/image/build-offline.sh").is_file() {
        return built_here;
    }
    // target/PROFILE/ -> the workspace.
    bin_dir
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or(built_here)
}

/// Runs every episode the options ask for; one report per episode that ran. An episode that
/// cannot be run (its cluster does not start) is noted in `not_run` and the others run on;
/// an error means nothing could be run (no Docker, a missing binary, no image).
pub fn run(options: &Options, seed: u64) -> anyhow::Result<RunOutcome> {
    options.check().map_err(anyhow::Error::msg)?;
    if !cluster::docker_reachable() {
        bail!("Docker is not reachable (`docker info` fails): quotient-chaos runs every coordinator and agent in a container");
    }
    let bin_dir = match &options.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()
            .context("this program's path")?
            .parent()
            .ok_or_else(|| anyhow!("this program is in no folder"))?
            .to_path_buf(),
    };
    for name in crate::BINARY_NAMES {
        if !bin_dir.join(name).is_file() {
            bail!(
                "{} is missing: build the workspace's binaries first (cargo build --workspace --bins), or pass --bin-dir",
                bin_dir.join(name).display()
            );
        }
    }
    let image = match &options.image {
        Some(image) => image.clone(),
        None => {
            say!("building {IMAGE_DEFAULT} from {}", bin_dir.display());
            cluster::build_image(&workspace_root(&bin_dir), &bin_dir, IMAGE_DEFAULT)?;
            IMAGE_DEFAULT.to_string()
        }
    };
    let out = match &options.out {
        Some(out) => out.clone(),
        None => std::env::temp_dir().join(format!("quotient-chaos-{seed}-{}", std::process::id())),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    say!("seed {seed}; episodes' folders in {}", out.display());
    let episodes: Vec<u32> = match options.episode {
        Some(episode) => vec![episode],
        None => (options.from_episode..=options.episodes).collect(),
    };
    let next = AtomicU32::new(0);
    let run_started = Instant::now();
    let budget = options.budget_s.map(Duration::from_secs);
    let outcome = Mutex::new(RunOutcome::default());
    let workers = (options.parallel as usize).min(episodes.len()).max(1);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(&episode) =
                    episodes.get(next.fetch_add(1, Ordering::SeqCst) as usize)
                {
                    if budget.is_some_and(|budget| run_started.elapsed() >= budget) {
                        return;
                    }
                    tag_thread(if workers > 1 { episode } else { 0 });
                    let result = run_episode(options, seed, episode, &image, &bin_dir, &out);
                    let mut outcome = outcome.lock().unwrap_or_else(|p| p.into_inner());
                    match result {
                        Ok(report) => {
                            for (kind, found) in report.violations.kinds() {
                                for description in found {
                                    eprintln!(
                                        "chaos: VIOLATION {kind} in episode {episode} of seed {seed} (replay: {}): {description}",
                                        replay_command(options, seed, &report)
                                    );
                                }
                            }
                            outcome.reports.push(report);
                        }
                        Err(error) => {
                            eprintln!(
                                "chaos: episode {episode} of seed {seed} could not be run (replay: quotient-chaos --seed {seed} --episode {episode}): {error:#}"
                            );
                            outcome.not_run.push((episode, format!("{error:#}")));
                        }
                    }
                }
            });
        }
    });
    let mut outcome = outcome.into_inner().unwrap_or_else(|p| p.into_inner());
    outcome.reports.sort_by_key(|report| report.episode);
    outcome.not_run.sort_by_key(|(episode, _)| *episode);
    Ok(outcome)
}

/// One episode, start to teardown.
pub fn run_episode(
    options: &Options,
    seed: u64,
    episode: u32,
    image: &str,
    bin_dir: &Path,
    out: &Path,
) -> anyhow::Result<EpisodeReport> {
    let episode_seed = episode_seed(seed, episode);
    let mut rng = Rng::new(episode_seed);
    // Every draw happens whatever the flags say, so the rest of the schedule is the same.
    let drawn_coordinators = if rng.chance(0.3) { 5 } else { 3 };
    let drawn_agents = 3 + rng.below(2) as u32;
    let coordinators = options.coordinators.unwrap_or(drawn_coordinators);
    let agents = options.agents.unwrap_or(drawn_agents);
    let drawn_gpus: Vec<u32> = (0..16).map(|_| 1 + rng.below(2) as u32).collect();
    let agent_gpus: Vec<u32> = drawn_gpus[..agents as usize].to_vec();
    let length = Duration::from_secs(options.length_s);
    let mut nemesis_rng = rng.fork(1);
    let (mix, schedule) = nemesis::plan(
        &mut nemesis_rng,
        length.as_millis() as u64,
        coordinators as usize,
        agents as usize,
    );
    let share_count = 2 + rng.below(2) as u32;
    let client_rngs: Vec<Rng> = (0..options.clients)
        .map(|i| rng.fork(10 + u64::from(i)))
        .collect();

    let dir = out.join(format!("episode-{episode}"));
    if dir.exists() {
        // A run killed from outside may have left its coordinators' data disks mounted there.
        for error in cluster::unmount_under(&dir) {
            say!("{error}");
        }
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("schedule.json"),
        serde_json::to_string_pretty(&json!({
            "seed": seed, "episode": episode, "episode_seed": episode_seed,
            "coordinators": coordinators, "agent_gpus": agent_gpus, "mix": mix,
            "faults": schedule,
        }))?,
    )?;
    say!("episode {episode}: {coordinators} coordinators, agents with {agent_gpus:?} GPUs, nemesis {mix:?} ({} faults planned) in {}",
        schedule.len(),
        dir.display()
    );

    let network = format!("quotient-chaos-{}-{episode}", std::process::id());
    cluster::remove_leftovers(&network);
    let started = Instant::now();
    let shape = ClusterShape {
        coordinators,
        agent_gpus: agent_gpus.clone(),
    };
    let mut cluster = DockerCluster::start(&network, image, bin_dir, &dir, &shape, episode_seed)
        .context("the episode's cluster did not start")?;
    say!(
        "cluster up in {:.1?} (partitions by {}; one-way loss {}; coordinators' data on {})",
        started.elapsed(),
        if cluster.iptables {
            "iptables"
        } else {
            "network disconnect"
        },
        if cluster.iptables {
            "by iptables"
        } else {
            "skipped"
        },
        if cluster.data_disks {
            "disks of their own"
        } else {
            "their containers' file systems (disk-full skipped)"
        }
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let history = History::create(&dir.join("history.jsonl"))?;
    let shared = Arc::new(client::Shared::default());
    let tag = format!("e{episode}");

    // The shares every client starts from.
    runtime.block_on(async {
        let admin = ApiClient::connect(cluster.addresses(), &cluster.admin_tls())?;
        for index in 1..=share_count {
            let name = format!("{tag}-base-{index}");
            let spec = client::share_spec(&name, 1 + (index % 2), index == 1)?;
            admin.call(ApiRequest::CreateShare(spec)).await?;
            shared
                .shares
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(name);
        }
        admin.close();
        anyhow::Ok(())
    })?;

    // The workload and the nemesis, together.
    let stop = AtomicBool::new(false);
    let nemesis_log = std::thread::scope(|scope| -> anyhow::Result<nemesis::NemesisLog> {
        let episode_tag = thread_episode();
        let (cluster, schedule, stop) = (&cluster, &schedule, &stop);
        let nemesis = scope.spawn(move || {
            tag_thread(episode_tag);
            nemesis::run(cluster, schedule, stop)
        });
        let workload = runtime.block_on(async {
            let until = tokio::time::Instant::now() + length;
            let mut tasks = Vec::new();
            for (index, client_rng) in client_rngs.into_iter().enumerate() {
                let api = ApiClient::connect(cluster.addresses(), &cluster.admin_tls())?
                    .with_policy(client::policy());
                tasks.push(tokio::spawn(client::run_client(
                    index as u32 + 1,
                    tag.clone(),
                    api,
                    history.clone(),
                    shared.clone(),
                    client_rng,
                    until,
                )));
            }
            for task in tasks {
                task.await?;
            }
            anyhow::Ok(())
        });
        stop.store(true, Ordering::SeqCst);
        let log = nemesis
            .join()
            .map_err(|_| anyhow!("the nemesis panicked"))?;
        workload?;
        Ok(log)
    })?;
    std::fs::write(
        dir.join("faults.json"),
        serde_json::to_string_pretty(&nemesis_log)?,
    )?;

    say!("healing everything");
    for error in cluster.heal() {
        say!("while healing: {error}");
    }
    let ops = history.ops();
    let mut violations = Violations::default();
    settle_and_check(
        &cluster,
        &runtime,
        &ops,
        &nemesis_log,
        &dir,
        &mut violations,
    );
    if violations.total() > 0 {
        cluster.save_data();
        cluster.save_logs();
        say!(
            "containers' logs saved in {}, coordinators' data directories in {}",
            dir.join("logs").display(),
            dir.join("data").display()
        );
    }
    std::fs::write(
        dir.join("violations.json"),
        serde_json::to_string_pretty(&violations)?,
    )?;
    cluster.teardown();
    drop(cluster);
    say!(
        "episode {episode} done in {:.1?}: {} operations, {} violations",
        started.elapsed(),
        ops.len(),
        violations.total()
    );
    Ok(EpisodeReport {
        episode,
        seed: episode_seed,
        coordinators,
        agents: agent_gpus,
        mix,
        operations: ops.len() as u64,
        acknowledged: ops.iter().filter(|op| op.acked()).count() as u64,
        faults: nemesis_log.counts(),
        violations,
        dir,
    })
}

/// The final jobs, shares and nodes, read through the leader.
async fn final_state(
    api: &ApiClient,
) -> anyhow::Result<(Vec<JobView>, Vec<ShareView>, Vec<NodeView>)> {
    let jobs = api
        .every_job(ApiRequest::ListJobs {
            share: None,
            state: None,
            mine: false,
            name_prefix: None,
            limit: quotient_common::api::JOB_PAGE_MAX,
            page_token: None,
        })
        .await?;
    let shares = match api.call(ApiRequest::ListShares).await? {
        ApiResponse::Shares(shares) => shares,
        other => bail!("a share list answered with {other:?}"),
    };
    let mut nodes = Vec::new();
    let mut token = None;
    loop {
        match api
            .call(ApiRequest::ListNodes {
                limit: 0,
                page_token: token.clone(),
            })
            .await?
        {
            ApiResponse::Nodes(page) => {
                nodes.extend(page.nodes);
                match page.next_page_token {
                    Some(next) => token = Some(next),
                    None => break,
                }
            }
            other => bail!("a node list answered with {other:?}"),
        }
    }
    Ok((jobs, shares, nodes))
}

/// Waits for the cluster to recover, then runs every check, adding what it finds.
pub fn settle_and_check(
    cluster: &DockerCluster,
    runtime: &tokio::runtime::Runtime,
    ops: &[history::Op],
    nemesis_log: &nemesis::NemesisLog,
    dir: &Path,
    found: &mut Violations,
) {
    // Recovery: every coordinator healthy, every node ready.
    let recovered = cluster
        .wait_for("every coordinator healthy", RECOVERY_S, || {
            let output = cluster.cli(&["cluster", "health"], Duration::from_secs(20))?;
            if output.status.success() {
                Ok(())
            } else {
                Err(anyhow!(
                    "{}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ))
            }
        })
        .and_then(|()| cluster.wait_nodes_ready(Duration::from_secs(RECOVERY_S)));
    if let Err(error) = recovered {
        found.stuck_jobs.push(format!(
            "the cluster did not recover after healing: {error:#}"
        ));
    }
    let api = match runtime
        .block_on(async { ApiClient::connect(cluster.addresses(), &cluster.admin_tls()) })
    {
        Ok(api) => api,
        Err(error) => {
            found
                .stuck_jobs
                .push(format!("no client of the healed cluster: {error}"));
            return;
        }
    };

    // Check 5: nothing waits while a GPU it fits is free, nothing stays in between states.
    check_stuck(runtime, &api, found);

    // Checks 1-3 on the final state.
    match runtime.block_on(final_state(&api)) {
        Ok((jobs, shares, _nodes)) => {
            let _ = std::fs::write(
                dir.join("final-jobs.json"),
                serde_json::to_string_pretty(&jobs).unwrap_or_default(),
            );
            checker::check_operations(ops, &jobs, &shares, found);
            resubmit_acknowledged(runtime, &api, ops, found);
            let now = now_us();
            let mut runs = checker::read_runs(&cluster.shared);
            checker::close(&mut runs, &nemesis_log.host_kills, &jobs, now);
            checker::check_runs(&runs, found);
            let mut holds = checker::read_holds(&cluster.shared);
            checker::close(&mut holds, &nemesis_log.host_kills, &jobs, now);
            checker::check_holds(&holds, found);
            let started: usize = runs.len();
            say!(
                "{} jobs, {started} attempts recorded by the job scripts, {} GPU holds",
                jobs.len(),
                holds.len()
            );
            let _ = std::fs::write(
                dir.join("runs.json"),
                serde_json::to_string_pretty(&json!({"runs": runs, "holds": holds}))
                    .unwrap_or_default(),
            );
        }
        Err(error) => found
            .lost_acks
            .push(format!("the final state could not be read: {error:#}")),
    }

    // Check 4: one state on every replica, and a state that passes the core's checks.
    check_replicas(cluster, found);
    check_invariants(cluster, dir, found);
    api.close();
}

/// Sends every acknowledged submit again with its key: the cluster must answer with the same
/// job, as a duplicate (the key was kept, in the state and across snapshots and elections).
fn resubmit_acknowledged(
    runtime: &tokio::runtime::Runtime,
    api: &ApiClient,
    ops: &[history::Op],
    found: &mut Violations,
) {
    for op in ops
        .iter()
        .filter(|op| op.kind == OpKind::Submit && op.acked())
    {
        let (Some(key), Some(share), Some(priority), Some(run_s), Some(job)) = (
            op.key.as_deref(),
            op.share.as_deref(),
            op.priority,
            op.run_s,
            op.job.as_deref(),
        ) else {
            continue;
        };
        let spec = client::job_spec(key, share, priority, run_s);
        match runtime.block_on(api.call(ApiRequest::SubmitJob(spec))) {
            Ok(ApiResponse::JobSubmitted {
                job: again,
                duplicate: true,
            }) if again.to_string() == job => {}
            Ok(ApiResponse::JobSubmitted { job: again, duplicate }) => {
                found.lost_acks.push(format!(
                    "the key {key} of the acknowledged submit of {job} (op {}) now gives {again} (duplicate: {duplicate})",
                    op.id
                ))
            }
            Ok(other) => found
                .lost_acks
                .push(format!("a resubmit of key {key} answered {other:?}")),
            Err(error) => found
                .lost_acks
                .push(format!("a resubmit of key {key} failed: {error}")),
        }
    }
}

/// Samples the jobs and nodes for [`STUCK_WINDOW`]: a job RUNNABLE all along while a ready
/// node had a free healthy GPU, or SCHEDULED, STARTING or PREEMPTING all along, for at least
/// [`STUCK_AFTER`], is stuck. Every share lends and borrows without a limit and every job
/// takes one GPU, so quota and head-of-line blocking never keep a job from a free GPU.
fn check_stuck(runtime: &tokio::runtime::Runtime, api: &ApiClient, found: &mut Violations) {
    let started = Instant::now();
    let mut since: HashMap<String, (Instant, String)> = HashMap::new();
    let mut last_error = None;
    while started.elapsed() < STUCK_WINDOW {
        match runtime.block_on(final_state(api)) {
            Ok((jobs, _, nodes)) => {
                last_error = None;
                let free = nodes
                    .iter()
                    .filter(|node| node.state == "ready" && !node.unreachable)
                    .map(|node| {
                        node.gpus
                            .iter()
                            .filter(|gpu| gpu.healthy && gpu.job.is_none())
                            .count() as u32
                    })
                    .max()
                    .unwrap_or(0);
                let now = Instant::now();
                let mut bad = std::collections::HashSet::new();
                for job in &jobs {
                    let why = match job.state.as_str() {
                        "RUNNABLE" if job.gpus <= free => format!(
                            "RUNNABLE while a ready node has {free} free GPUs (reason: {:?})",
                            job.reason
                        ),
                        "SCHEDULED" | "STARTING" | "PREEMPTING" => {
                            format!("{} on {:?}", job.state, job.node)
                        }
                        _ => continue,
                    };
                    bad.insert(job.id.clone());
                    since.entry(job.id.clone()).or_insert((now, why));
                }
                since.retain(|id, _| bad.contains(id));
            }
            Err(error) => last_error = Some(error),
        }
        std::thread::sleep(Duration::from_millis(1_000));
    }
    if let Some(error) = last_error {
        found.stuck_jobs.push(format!(
            "the jobs could not be listed after healing: {error:#}"
        ));
    }
    let mut stuck: Vec<(&String, &(Instant, String))> = since
        .iter()
        .filter(|(_, (first, _))| first.elapsed() >= STUCK_AFTER)
        .collect();
    stuck.sort();
    for (id, (first, why)) in stuck {
        found.stuck_jobs.push(format!(
            "{id} for {:.0?} after the cluster recovered: {why}",
            first.elapsed()
        ));
    }
}

/// Polls `cluster health` until every coordinator answers at one applied index; their state
/// digests must then be equal, and none may report its own digest check failed.
fn check_replicas(cluster: &DockerCluster, found: &mut Violations) {
    let deadline = Instant::now() + Duration::from_secs(CONVERGE_S);
    let mut last = String::new();
    loop {
        let entries = cluster
            .cli(
                &["cluster", "health", "-o", "json"],
                Duration::from_secs(20),
            )
            .ok()
            .and_then(|output| serde_json::from_slice::<Value>(&output.stdout).ok());
        if let Some(entries) = entries.as_ref().and_then(Value::as_array) {
            let diverged: Vec<String> = entries
                .iter()
                .flat_map(|entry| {
                    entry["health"]["problems"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .filter(|p| p.contains("diverged"))
                        .map(|p| format!("{}: {p}", entry["address"]))
                        .collect::<Vec<_>>()
                })
                .collect();
            if !diverged.is_empty() {
                found.divergent_replicas.extend(diverged);
                return;
            }
            let seen: Vec<(u64, u64, u64)> = entries
                .iter()
                .filter_map(|entry| {
                    let health = &entry["health"];
                    Some((
                        health["id"].as_u64()?,
                        health["last_applied"].as_u64()?,
                        health["state_digest"].as_u64()?,
                    ))
                })
                .collect();
            if seen.len() == cluster.coordinators.len() && seen.iter().all(|s| s.1 == seen[0].1) {
                for other in &seen[1..] {
                    if other.2 != seen[0].2 {
                        found.divergent_replicas.push(format!(
                            "coordinator {} has state digest {:016x} at index {}, coordinator {} has {:016x}",
                            other.0, other.2, other.1, seen[0].0, seen[0].2
                        ));
                    }
                }
                return;
            }
            last = format!("{seen:?}");
        }
        if Instant::now() > deadline {
            found.divergent_replicas.push(format!(
                "the coordinators were never seen at one applied index within {CONVERGE_S} s (id, index, digest): {last}"
            ));
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Takes a backup of the final state and decodes it with `quotient-coordinator restore`,
/// which rebuilds the state from the records and runs the core's record checks
/// (`State::validate_records`) before it accepts it.
fn check_invariants(cluster: &DockerCluster, dir: &Path, found: &mut Violations) {
    let backup = dir.join("final.qbackup");
    let path = backup.display().to_string();
    if let Err(error) = cluster.cli_ok(&["cluster", "backup", "--out", &path]) {
        found.invariant_violations.push(format!(
            "no backup of the final state could be taken: {error:#}"
        ));
        return;
    }
    let restored = dir.join("restored");
    let _ = std::fs::remove_dir_all(&restored);
    let output = cluster::run_with_deadline(
        std::process::Command::new(&cluster.coordinator_binary)
            .args(["restore", "--from", &path, "--data-dir"])
            .arg(&restored)
            .args(["--id", "1", "--peers", "1=127.0.0.1:7401"]),
        Duration::from_secs(60),
    );
    match output {
        Ok(output) if output.status.success() => {}
        Ok(output) => found.invariant_violations.push(format!(
            "the final state does not pass the core's checks: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(error) => found.invariant_violations.push(format!(
            "quotient-coordinator restore did not run: {error:#}"
        )),
    }
    let _ = std::fs::remove_dir_all(&restored);
}
