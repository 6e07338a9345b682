//! The job: what a user submits to a share, its id, and the states it moves through.
//!
//! See docs/quota-shares.md ("Jobs"). [`JobSpec::validate`] checks every field that can be
//! checked without the cluster's state; the state machine checks the rest (the share exists,
//! the class is one of its limits).

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::name::validate_name;
use crate::node::GPUS_PER_NODE_MAX;
use crate::retry::RetryPolicy;
use crate::{GpuClass, SpecError};

/// The highest job priority.
pub const PRIORITY_MAX: u32 = 9_999;
/// The most nodes one job may run on.
pub const JOB_NODES_MAX: u32 = 256;
/// The default grace period between the checkpoint signal and the kill.
pub const GRACE_PERIOD_DEFAULT_MS: u64 = 30_000;
/// The longest grace period a job may ask for.
pub const GRACE_PERIOD_MAX_MS: u64 = 3_600_000;
/// At most this many environment variables per job.
pub const ENV_ENTRIES_MAX: usize = 256;
/// At most this many command arguments per job.
pub const COMMAND_ARGS_MAX: usize = 1_024;
/// The longest single argument, environment value or image reference.
pub const FIELD_BYTES_MAX: usize = 16_384;
/// The longest idempotency key.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;
/// How a caller-scoped idempotency key starts ([`JobSpec::caller_scoped_key`]).
pub const SCOPED_KEY_PREFIX: &str = "scoped:";
/// The length of a caller-scoped idempotency key: the prefix and a SHA-256 in hex.
pub const SCOPED_KEY_BYTES: usize = SCOPED_KEY_PREFIX.len() + 64;
const _: () = assert!(SCOPED_KEY_BYTES <= IDEMPOTENCY_KEY_BYTES_MAX);
/// The most bytes a job's command and environment may take at launch, counted as Linux's
/// execve counts them ([`JobSpec::launch_bytes`]). execve refuses a launch (E2BIG, "Argument
/// list too long") once arguments and environment together pass a quarter of the stack limit:
/// 2 MiB under the usual 8 MiB `ulimit -s`. The agent adds its own variables (`QUOTIENT_*`,
/// `CUDA_*`; on the process runtime also its own environment and the wrapper's script), so
/// a job may use half of that. No single string comes near execve's other limit
/// (`MAX_ARG_STRLEN`, 128 KiB): fields are at most [`FIELD_BYTES_MAX`].
///
/// It is 128 KiB, well under what execve takes, because a node's desired state carries the
/// spec of every job on the node in one frame: 64 jobs (one per GPU, `GPUS_PER_NODE_MAX`)
/// of 128 KiB each, with their other fields, fit the 16 MiB frame (checked by a test of the
/// worst case, `agent_api::tests`). At 1 MiB, 17 such jobs on one node made a desired state
/// no frame could carry, and the node took no order again (found by probing).
pub const LAUNCH_BYTES_MAX: usize = 128 << 10;
/// What execve counts for each argument or variable besides its own bytes: the NUL that ends
/// it and its 8-byte pointer in argv or envp.
pub const LAUNCH_STRING_OVERHEAD_BYTES: usize = 1 + 8;
/// The longest runtime message a launch failure carries (the agent cuts it, and so do the
/// coordinators before replicating it).
pub const LAUNCH_MESSAGE_BYTES_MAX: usize = 512;

/// The fewest CPUs a job may ask for, in thousandths of a CPU.
pub const CPU_MILLIS_MIN: u32 = 10;
/// The most CPUs a job may ask for, in thousandths of a CPU (1,024 CPUs).
pub const CPU_MILLIS_MAX: u32 = 1_024_000;
/// The least memory a job may ask for (Docker refuses less than 6 MiB).
pub const MEMORY_BYTES_MIN: u64 = 8 << 20;
/// The most memory a job may ask for (64 TiB).
pub const MEMORY_BYTES_MAX: u64 = 64 << 40;
/// The shortest time limit: one second.
pub const TIME_LIMIT_MS_MIN: u64 = 1_000;
/// The longest time limit: a year.
pub const TIME_LIMIT_MS_MAX: u64 = 365 * 24 * 3_600_000;

/// Environment variables Quotient sets itself; a job may not override them.
pub const RESERVED_ENV: [&str; 9] = [
    "QUOTIENT_JOB_ID",
    "QUOTIENT_ATTEMPT",
    "QUOTIENT_CHECKPOINT_DIR",
    "QUOTIENT_WORK_DIR",
    "QUOTIENT_NODE_RANK",
    "QUOTIENT_NUM_NODES",
    "QUOTIENT_HOSTS",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
];

/// A job's id: assigned by the state machine in submit order, stable, shown as `j-N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "j-{}", self.0)
    }
}

impl std::str::FromStr for JobId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.strip_prefix("j-").unwrap_or(s);
        digits
            .parse::<u64>()
            .map(JobId)
            .map_err(|_| format!("invalid job id {s:?}: job ids look like j-42"))
    }
}

/// The signal a job receives when it must checkpoint and stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Signal {
    Sighup,
    Sigint,
    Sigquit,
    Sigusr1,
    Sigusr2,
    Sigterm,
}

impl Signal {
    const ALL: [(Signal, &'static str, i32); 6] = [
        (Signal::Sighup, "SIGHUP", 1),
        (Signal::Sigint, "SIGINT", 2),
        (Signal::Sigquit, "SIGQUIT", 3),
        (Signal::Sigusr1, "SIGUSR1", 10),
        (Signal::Sigusr2, "SIGUSR2", 12),
        (Signal::Sigterm, "SIGTERM", 15),
    ];

    /// Parses `SIGTERM`, `TERM` or `term`.
    pub fn parse(text: &str) -> Result<Signal, SpecError> {
        let upper = text.to_ascii_uppercase();
        let name = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        Signal::ALL
            .iter()
            .find(|(_, n, _)| *n == name)
            .map(|(s, _, _)| *s)
            .ok_or_else(|| SpecError::Signal(text.to_string()))
    }

    pub fn name(self) -> &'static str {
        Signal::ALL.iter().find(|(s, _, _)| *s == self).unwrap().1
    }

    /// The Linux signal number.
    pub fn number(self) -> i32 {
        Signal::ALL.iter().find(|(s, _, _)| *s == self).unwrap().2
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a job runs: a command as a process on the host, or a container image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPayload {
    /// The container image; `None` runs `command` as a process on the agent's host.
    pub image: Option<String>,
    /// The command and its arguments (the image's own command when empty and `image` is set).
    pub command: crate::Args,
}

/// Everything a user states about a job at submit time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: Option<String>,
    pub share: String,
    /// 0-9999, higher runs first.
    pub priority: u32,
    /// GPUs on one node.
    pub gpus: u32,
    /// Optional when the share has one class.
    pub gpu_class: Option<GpuClass>,
    pub payload: JobPayload,
    pub env: crate::EnvVars,
    pub checkpoint_signal: Signal,
    pub grace_period_ms: u64,
    /// `None` = requeue without limit; `Some(0)` = FAILED on first preemption.
    pub max_preemptions: Option<u32>,
    /// Retries of a submit with the same key return the same job.
    pub idempotency_key: Option<String>,
    /// CPUs in thousandths (`--cpus 1.5` is 1500). `None`: the job's share of its node's
    /// CPUs, in proportion to the GPUs it takes there.
    pub cpu_millis: Option<u32>,
    /// Memory in bytes. `None`: the job's share of its node's memory, as for CPUs.
    pub memory_bytes: Option<u64>,
    /// How long an attempt may run: at the limit it gets its checkpoint signal and grace
    /// period, then fails with the reason `time limit`. `None`: no limit.
    pub time_limit_ms: Option<u64>,
    /// How failed attempts are retried.
    pub retry: RetryPolicy,
    /// How many distinct nodes the job runs on, `gpus` GPUs on each (1: a job of one node).
    /// A job of several nodes is placed, stopped and preempted as one unit.
    pub nodes: u32,
    /// A node label key (`rack`) that all of the job's nodes must share one value of; `None`:
    /// the job prefers few values of the topology key but takes any nodes.
    pub same: Option<String>,
    /// Who submitted it: the name in their certificate, set by the coordinators (whatever a
    /// client sent). `None` for jobs submitted before owners were recorded.
    pub owner: Option<String>,
}

impl JobSpec {
    /// A spec with the defaults of docs/quota-shares.md.
    pub fn new(share: &str, priority: u32, gpus: u32, command: Vec<String>) -> JobSpec {
        JobSpec {
            name: None,
            share: share.to_string(),
            priority,
            gpus,
            gpu_class: None,
            payload: JobPayload {
                image: None,
                command: command.into(),
            },
            env: crate::EnvVars::new(),
            checkpoint_signal: Signal::Sigterm,
            grace_period_ms: GRACE_PERIOD_DEFAULT_MS,
            max_preemptions: None,
            idempotency_key: None,
            cpu_millis: None,
            memory_bytes: None,
            time_limit_ms: None,
            retry: RetryPolicy::default(),
            nodes: 1,
            same: None,
            owner: None,
        }
    }

    /// The GPUs the job takes in all: `gpus` on each of its `nodes`. What counts against its
    /// share's quota.
    pub fn total_gpus(&self) -> u32 {
        self.gpus.saturating_mul(self.nodes.max(1))
    }

    /// [`JobSpec::validate`], and the rules for a spec a client submits now that the log's
    /// older entries were accepted without: the API and the command line check these; the
    /// state machine checks only `validate`, so that replaying its log gives what it gave.
    pub fn validate_new(&self) -> Result<(), SpecError> {
        self.validate()?;
        // An empty key is most often an unset variable in a script (`--idempotency-key
        // "$KEY"`): taken as a key, every such submit would return the first one's job.
        if self.idempotency_key.as_deref() == Some("") {
            return Err(SpecError::Field(
                "the idempotency key is empty: give a non-empty key, or leave it out for a fresh one"
                    .into(),
            ));
        }
        if let Some(image) = &self.payload.image {
            check_image_reference(image).map_err(SpecError::Field)?;
        }
        Ok(())
    }

    /// The idempotency key as the coordinators keep it for a submit of `caller`: a key is the
    /// caller's own, as AWS scopes a client token to its account, so two users who pick the
    /// same key each get their own job (and neither learns of the other's). A digest of the
    /// caller's name and the key, of a fixed [`SCOPED_KEY_BYTES`], so any key that passes
    /// [`JobSpec::validate_new`] still fits the key limit once scoped.
    pub fn caller_scoped_key(caller: &str, key: &str) -> String {
        use sha2::{Digest, Sha256};
        let mut digest = Sha256::new();
        digest.update((caller.len() as u64).to_le_bytes());
        digest.update(caller.as_bytes());
        digest.update(key.as_bytes());
        let mut scoped = String::with_capacity(SCOPED_KEY_BYTES);
        scoped.push_str(SCOPED_KEY_PREFIX);
        for byte in digest.finalize() {
            scoped.push_str(&format!("{byte:02x}"));
        }
        scoped
    }

    /// Checks every field rule that needs no cluster state.
    pub fn validate(&self) -> Result<(), SpecError> {
        if let Some(name) = &self.name {
            validate_name("job", name)?;
        }
        validate_name("share", &self.share)?;
        validate_priority(self.priority)?;
        if self.gpus == 0 {
            return Err(SpecError::GpusZero);
        }
        if self.gpus as usize > GPUS_PER_NODE_MAX {
            return Err(SpecError::GpusTooMany {
                got: self.gpus,
                max: GPUS_PER_NODE_MAX as u32,
            });
        }
        if !(1..=JOB_NODES_MAX).contains(&self.nodes) {
            return Err(SpecError::OutOfRange {
                field: "nodes".into(),
                value: self.nodes.to_string(),
                range: format!("1 to {JOB_NODES_MAX}"),
            });
        }
        if let Some(key) = &self.same {
            crate::node::check_label_key(key).map_err(SpecError::Same)?;
        }
        if let Some(class) = &self.gpu_class {
            GpuClass::parse(class.as_str())?;
        }
        if self.payload.image.is_none() && self.payload.command.is_empty() {
            return Err(SpecError::NoPayload);
        }
        if let Some(image) = &self.payload.image {
            check_len("image", image, FIELD_BYTES_MAX)?;
            if image.is_empty() {
                return Err(SpecError::NoPayload);
            }
        }
        if self.payload.command.len() > COMMAND_ARGS_MAX {
            return Err(SpecError::TooMany {
                field: "command".into(),
                max: COMMAND_ARGS_MAX as u32,
            });
        }
        for arg in &self.payload.command {
            check_len("a command argument", arg, FIELD_BYTES_MAX)?;
        }
        if self.env.len() > ENV_ENTRIES_MAX {
            return Err(SpecError::TooMany {
                field: "env".into(),
                max: ENV_ENTRIES_MAX as u32,
            });
        }
        for (key, value) in &self.env {
            let valid = !key.is_empty()
                && key.len() <= 256
                && !key.as_bytes()[0].is_ascii_digit()
                && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(SpecError::EnvName(key.chars().take(300).collect()));
            }
            if RESERVED_ENV.contains(&key) {
                return Err(SpecError::EnvReserved(key.to_string()));
            }
            check_len("an env value", value, FIELD_BYTES_MAX)?;
        }
        if self.grace_period_ms > GRACE_PERIOD_MAX_MS {
            return Err(SpecError::GracePeriod(self.grace_period_ms));
        }
        if let Some(key) = &self.idempotency_key {
            check_len("the idempotency key", key, IDEMPOTENCY_KEY_BYTES_MAX)?;
        }
        if let Some(cpus) = self.cpu_millis {
            if !(CPU_MILLIS_MIN..=CPU_MILLIS_MAX).contains(&cpus) {
                return Err(SpecError::OutOfRange {
                    field: "cpus".into(),
                    value: format!("{}", f64::from(cpus) / 1000.0),
                    range: "0.01 to 1024".into(),
                });
            }
        }
        if let Some(memory) = self.memory_bytes {
            if !(MEMORY_BYTES_MIN..=MEMORY_BYTES_MAX).contains(&memory) {
                return Err(SpecError::OutOfRange {
                    field: "memory".into(),
                    value: format!("{memory} bytes"),
                    range: "8Mi to 64Ti".into(),
                });
            }
        }
        if let Some(limit) = self.time_limit_ms {
            if !(TIME_LIMIT_MS_MIN..=TIME_LIMIT_MS_MAX).contains(&limit) {
                return Err(SpecError::OutOfRange {
                    field: "time limit".into(),
                    value: format!("{limit} ms"),
                    range: "1s to 365d".into(),
                });
            }
        }
        self.retry.validate()?;
        let launch_bytes = self.launch_bytes();
        if launch_bytes > LAUNCH_BYTES_MAX {
            return Err(SpecError::LaunchTooLarge {
                bytes: launch_bytes as u64,
                max: LAUNCH_BYTES_MAX as u64,
            });
        }
        Ok(())
    }

    /// The bytes the job's command and environment take at launch, as execve counts them:
    /// each argument and each `KEY=VALUE` variable, plus [`LAUNCH_STRING_OVERHEAD_BYTES`]
    /// each. Checked against [`LAUNCH_BYTES_MAX`]; the image reference is not passed to
    /// execve and does not count.
    pub fn launch_bytes(&self) -> usize {
        let arguments: usize = self
            .payload
            .command
            .iter()
            .map(|argument| argument.len() + LAUNCH_STRING_OVERHEAD_BYTES)
            .sum();
        let environment: usize = self
            .env
            .iter()
            .map(|(key, value)| key.len() + 1 + value.len() + LAUNCH_STRING_OVERHEAD_BYTES)
            .sum();
        arguments + environment
    }
}

/// Whose fault it is that an attempt could not be launched, which decides what becomes of it
/// (docs/operations.md, "Jobs that cannot launch").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LaunchFault {
    /// The job's own spec: a command that cannot be executed, arguments and environment too
    /// large to execute, a container spec the runtime refuses. No node would do better, so
    /// the attempt fails.
    Job,
    /// The node: its container runtime unreachable, the image missing on this host, an I/O
    /// error in the agent's state dir. The job goes back to the queue.
    Node,
}

impl LaunchFault {
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchFault::Job => "job",
            LaunchFault::Node => "node",
        }
    }
}

impl fmt::Display for LaunchFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `text` cut to at most [`LAUNCH_MESSAGE_BYTES_MAX`] bytes on a character boundary, ending in
/// `...` when cut: what a launch failure carries of the runtime's message.
pub fn bounded_launch_message(text: &str) -> String {
    if text.len() <= LAUNCH_MESSAGE_BYTES_MAX {
        return text.to_string();
    }
    const CUT_MARK: &str = "...";
    let mut end = LAUNCH_MESSAGE_BYTES_MAX - CUT_MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT_MARK}", &text[..end])
}

/// Checks a priority is within 0-9999.
pub fn validate_priority(priority: u32) -> Result<(), SpecError> {
    if priority > PRIORITY_MAX {
        Err(SpecError::Priority(priority))
    } else {
        Ok(())
    }
}

fn check_len(field: &str, value: &str, max: usize) -> Result<(), SpecError> {
    if value.len() > max {
        Err(SpecError::TooLong {
            field: field.to_string(),
            max: max as u32,
        })
    } else {
        Ok(())
    }
}

/// A job's place in its life; see docs/quota-shares.md for the transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Queued, waiting for GPUs.
    Runnable,
    /// Placed by the scheduler and sent to the agent.
    Scheduled,
    /// The agent is launching it.
    Starting,
    Running,
    /// The checkpoint signal was sent; the GPUs are held until it exits.
    Preempting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Runnable,
        JobState::Scheduled,
        JobState::Starting,
        JobState::Running,
        JobState::Preempting,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// SUCCEEDED, FAILED and CANCELLED never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// The states in which a job holds GPUs and counts toward its share's usage.
    pub fn holds_gpus(self) -> bool {
        matches!(
            self,
            JobState::Scheduled | JobState::Starting | JobState::Running | JobState::Preempting
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Runnable => "RUNNABLE",
            JobState::Scheduled => "SCHEDULED",
            JobState::Starting => "STARTING",
            JobState::Running => "RUNNING",
            JobState::Preempting => "PREEMPTING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.to_ascii_uppercase();
        JobState::ALL
            .iter()
            .find(|state| state.as_str() == upper)
            .copied()
            .ok_or_else(|| {
                format!("unknown job state {s:?}: use one of RUNNABLE, SCHEDULED, STARTING, RUNNING, PREEMPTING, SUCCEEDED, FAILED, CANCELLED")
            })
    }
}

/// The longest image name Docker takes (its repository, registry included).
pub const IMAGE_NAME_BYTES_MAX: usize = 255;

/// Whether `image` is a reference Docker can pull or run: `[HOST[:PORT]/]PATH[:TAG][@DIGEST]`,
/// its path in lowercase components of letters and digits joined by `.`, `_`, `__` or `-`
/// runs, a tag of at most 128 of letters, digits, `_`, `.` and `-`, not starting with `.` or
/// `-`. A job naming anything else would wait for an image no node can ever run.
pub fn check_image_reference(image: &str) -> Result<(), String> {
    let bad = |why: &str| {
        // A long name is shown by its start: the message must stay readable.
        let mut shown = image.len().min(80);
        while !image.is_char_boundary(shown) {
            shown -= 1;
        }
        let more = if shown < image.len() { "..." } else { "" };
        Err(format!(
            "image {:?}{more} is not an image reference ({why}): use \
             [HOST[:PORT]/]NAME[:TAG][@DIGEST], e.g. registry.local:5000/team/trainer:1.2",
            &image[..shown]
        ))
    };
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let Some((algorithm, hex)) = digest.split_once(':') else {
            return bad("a digest is ALGORITHM:HEX");
        };
        let algorithm_ok = !algorithm.is_empty()
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
        if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return bad("a digest is ALGORITHM:HEX, e.g. sha256: and 64 hex digits");
        }
    }
    // A tag follows the last ':' after the last '/' (a ':' before it is a registry's port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && !tag.starts_with(['.', '-'])
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return bad(
                "a tag is 1-128 of letters, digits, '_', '.' and '-', not starting with '.' or '-'",
            );
        }
    }
    if name.is_empty() || name.len() > IMAGE_NAME_BYTES_MAX {
        return bad("its name is 1-255 characters");
    }
    let mut components: Vec<&str> = name.split('/').collect();
    // The first component is a registry host when it has a '.' or a ':' or is localhost.
    let first = components[0];
    if components.len() > 1
        && (first.contains(['.', ':'])
            || first == "localhost"
            || first.bytes().any(|b| b.is_ascii_uppercase()))
    {
        let (host, port) = match first.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (first, None),
        };
        let host_ok = !host.is_empty()
            && host.split('.').all(|label| {
                !label.is_empty()
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        let port_ok = port
            .is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
        if !host_ok || !port_ok {
            return bad("a registry is HOST or HOST:PORT");
        }
        components.remove(0);
    }
    for component in components {
        // Lowercase letters and digits, separated by '.', '_', '__' or runs of '-'.
        let bytes = component.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let ok = !bytes.is_empty()
            && alnum(bytes[0])
            && alnum(bytes[bytes.len() - 1])
            && bytes.iter().all(|&b| alnum(b) || b"._-".contains(&b))
            && !component.contains("..")
            && !component.contains("___")
            && !component.contains("._")
            && !component.contains("_.")
            && !component.contains(".-")
            && !component.contains("-.")
            && !component.contains("_-")
            && !component.contains("-_");
        if !ok {
            return bad("each part of its name is lowercase letters and digits, joined by '.', '_', '__' or '-'");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobSpec {
        JobSpec::new("qs1", 3, 1, vec!["train.sh".into()])
    }

    #[test]
    fn a_default_job_is_valid() {
        assert_eq!(job().validate(), Ok(()));
        assert_eq!(job().checkpoint_signal, Signal::Sigterm);
        assert_eq!(job().grace_period_ms, 30_000);
    }

    #[test]
    fn a_scoped_key_is_the_callers_own_and_fits_the_limit() {
        let alice = JobSpec::caller_scoped_key("alice", "k1");
        assert_eq!(alice, JobSpec::caller_scoped_key("alice", "k1"));
        assert_ne!(alice, JobSpec::caller_scoped_key("bob", "k1"));
        assert_ne!(alice, JobSpec::caller_scoped_key("alice", "k2"));
        // The caller's name and the key do not run together.
        assert_ne!(
            JobSpec::caller_scoped_key("ab", "c"),
            JobSpec::caller_scoped_key("a", "bc")
        );
        let longest = JobSpec::caller_scoped_key(
            &"n".repeat(crate::name::NAME_BYTES_MAX),
            &"k".repeat(IDEMPOTENCY_KEY_BYTES_MAX),
        );
        assert_eq!(longest.len(), SCOPED_KEY_BYTES);
    }

    #[test]
    fn image_references_are_checked_as_docker_reads_them() {
        for good in [
            "busybox",
            "trainer:1",
            "quotient-test-busybox:latest",
            "team/trainer:1.2",
            "registry.local:5000/team/trainer:1.2",
            "localhost/x",
            "Registry.Local/team/x",
            "a__b/c-d--e/f.g:TAG_1-x",
            "repo/x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "repo/x:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(check_image_reference(good), Ok(()), "{good}");
        }
        let long = "a".repeat(300);
        for bad in [
            "../../x",
            "UPPER:tag",
            "x:",
            "x:-tag",
            "/x",
            "x/",
            "a..b",
            "a b",
            "x@sha256",
            "x@sha256:zz",
            "host:99999999/x",
            long.as_str(),
        ] {
            assert!(check_image_reference(bad).is_err(), "{bad}");
        }
        let mut spec = JobSpec::new("s", 1, 1, vec![]);
        spec.payload.image = Some("../../x".into());
        assert!(spec
            .validate_new()
            .unwrap_err()
            .to_string()
            .contains("not an image reference"));
        spec.payload.image = Some("trainer:1".into());
        assert!(spec.validate_new().is_ok());
    }

    #[test]
    fn a_new_submit_with_an_empty_idempotency_key_is_refused() {
        let mut spec = job();
        spec.idempotency_key = Some(String::new());
        // The state machine's check accepts it (older log entries may hold one) ...
        assert_eq!(spec.validate(), Ok(()));
        // ... the API's and the command line's refuse it.
        let said = spec.validate_new().unwrap_err().to_string();
        assert!(said.contains("idempotency key is empty"), "{said}");
        spec.idempotency_key = Some("k".into());
        assert_eq!(spec.validate_new(), Ok(()));
    }

    #[test]
    fn priority_is_0_to_9999() {
        let mut j = job();
        j.priority = 9_999;
        assert_eq!(j.validate(), Ok(()));
        j.priority = 10_000;
        assert_eq!(j.validate(), Err(SpecError::Priority(10_000)));
    }

    #[test]
    fn a_job_needs_gpus_and_something_to_run() {
        let mut j = job();
        j.gpus = 0;
        assert_eq!(j.validate(), Err(SpecError::GpusZero));
        let mut j = job();
        j.gpus = 65;
        assert!(matches!(j.validate(), Err(SpecError::GpusTooMany { .. })));
        let mut j = job();
        j.payload.command = crate::Args::new();
        assert_eq!(j.validate(), Err(SpecError::NoPayload));
        j.payload.image = Some("trainer:1".into());
        assert_eq!(j.validate(), Ok(()));
    }

    #[test]
    fn quotient_env_cannot_be_overridden() {
        let mut j = job();
        j.env.insert("CUDA_VISIBLE_DEVICES".into(), "0".into());
        assert!(matches!(j.validate(), Err(SpecError::EnvReserved(_))));
        let mut j = job();
        j.env.insert("1BAD".into(), "x".into());
        assert!(matches!(j.validate(), Err(SpecError::EnvName(_))));
    }

    /// The job: 256 variables of 16,000 bytes each pass every per-field limit, but
    /// take 4 MB at launch, which execve refuses: validation names the total and the limit.
    #[test]
    fn an_environment_too_large_to_launch_is_refused() {
        let mut j = job();
        for index in 0..ENV_ENTRIES_MAX {
            j.env.insert(format!("VALUE_{index}"), "x".repeat(16_000));
        }
        let error = j.validate().unwrap_err();
        let SpecError::LaunchTooLarge { bytes, max } = error else {
            panic!("refused for another reason: {error}");
        };
        assert!(bytes > 4_000_000, "{bytes}");
        assert_eq!(max, LAUNCH_BYTES_MAX as u64);
        let text = error.to_string();
        assert!(text.contains("131072"), "names the limit: {text}");
        assert!(text.contains("through a file"), "says what to do: {text}");

        // Arguments count too, and a spec just at the limit is accepted.
        let mut j = job();
        let overhead = "train.sh".len() + LAUNCH_STRING_OVERHEAD_BYTES;
        let per_argument = 1_000 + LAUNCH_STRING_OVERHEAD_BYTES;
        let arguments = (LAUNCH_BYTES_MAX - overhead) / per_argument;
        j.payload
            .command
            .extend((0..arguments).map(|_| "a".repeat(1_000)));
        let rest = LAUNCH_BYTES_MAX - j.launch_bytes() - LAUNCH_STRING_OVERHEAD_BYTES;
        j.payload.command.push("b".repeat(rest));
        assert_eq!(j.launch_bytes(), LAUNCH_BYTES_MAX);
        assert_eq!(j.validate(), Ok(()));
        let mut longer = j.payload.command.to_vec();
        longer.last_mut().unwrap().push('b');
        j.payload.command = longer.into();
        assert!(matches!(
            j.validate(),
            Err(SpecError::LaunchTooLarge { .. })
        ));
    }

    /// A runtime's message is cut to its limit on a character boundary.
    #[test]
    fn launch_messages_are_bounded() {
        assert_eq!(bounded_launch_message("short"), "short");
        let long = "é".repeat(LAUNCH_MESSAGE_BYTES_MAX);
        let cut = bounded_launch_message(&long);
        assert!(cut.len() <= LAUNCH_MESSAGE_BYTES_MAX, "{}", cut.len());
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn signals_and_ids_parse() {
        assert_eq!(Signal::parse("SIGUSR1").unwrap().number(), 10);
        assert_eq!(Signal::parse("term").unwrap(), Signal::Sigterm);
        assert!(Signal::parse("SIGFOO").is_err());
        assert_eq!("j-42".parse::<JobId>().unwrap(), JobId(42));
        assert_eq!(JobId(7).to_string(), "j-7");
        assert!("x-1".parse::<JobId>().is_err());
        assert_eq!("running".parse::<JobState>().unwrap(), JobState::Running);
    }
}
