//! What the `state_size` and `restart` benches share: the shares and jobs of a busy fleet's
//! state, and the resident memory of a process.

use std::collections::BTreeMap;

use quotient_common::{GpuClass, JobSpec, ShareSpec, ShareState, Strategy};
use quotient_core::{Caller, Command};

/// Shares the jobs are spread over.
pub const SHARES: usize = 100;

/// The class of every job and share.
pub fn class() -> GpuClass {
    GpuClass::parse("a10g").expect("a class name")
}

/// The [`SHARES`] shares, `team-000` on, 8 GPUs each.
pub fn create_shares() -> Vec<Command> {
    (0..SHARES)
        .map(|share| {
            Command::CreateShare(ShareSpec {
                name: format!("team-{share:03}"),
                limits: BTreeMap::from([(class(), 8)]),
                strategy: Strategy::LendAndBorrow,
                borrow_limit_percent: None,
                in_share_preemption: false,
                state: ShareState::Enabled,
                members: Vec::new(),
                max_jobs_per_user: None,
            })
        })
        .collect()
}

/// Job `n` as a busy fleet submits it: a name, a command with arguments, two variables, an
/// idempotency key and an owner, in one of the shares.
pub fn submit(n: usize) -> Command {
    let mut spec = JobSpec::new(
        &format!("team-{:03}", n % SHARES),
        (n % 100) as u32,
        1,
        vec![
            "python".into(),
            "train.py".into(),
            "--config".into(),
            format!("configs/run-{n}.yaml"),
        ],
    );
    spec.name = Some(format!("train-{n}"));
    spec.gpu_class = Some(class());
    spec.env = quotient_common::EnvVars::from([
        ("WANDB_PROJECT".to_string(), "vision".to_string()),
        ("SEED".to_string(), n.to_string()),
    ]);
    spec.idempotency_key = Some(format!("quotient-cli-{n:012}-{:08x}", n * 7919));
    Command::As {
        caller: Caller {
            name: format!("user-{}", n % 500),
            admin: false,
        },
        command: Box::new(Command::SubmitJob(spec)),
    }
}

/// The resident memory in bytes of process `pid` (`self` for this one), from its statm.
pub fn rss_bytes(pid: &str) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("the resident pages");
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page_size).unwrap_or(4096)
}
