//! For unit tests: a replicated log in miniature. Commands are applied to a `State` in order,
//! each with the next log index, as the state machine would apply committed entries, noting
//! what they changed as it does.

use std::collections::BTreeMap;

use quotient_common::{GpuClass, GpuDevice, NodeInventory, ShareSpec, ShareState, Strategy};
use quotient_core::{apply_noting, ApplyCtx, Command, State};

use crate::applied::AppliedChanges;

/// The one GPU class these tests use.
pub fn class() -> GpuClass {
    GpuClass::parse("a10g").expect("a class")
}

/// A state, the index of the last command applied to it, and what was changed since the
/// last [`Log::take_changes`].
pub struct Log {
    pub state: State,
    index: u64,
    changes: AppliedChanges,
}

impl Log {
    pub fn new() -> Self {
        Log {
            state: State::new(),
            index: 0,
            changes: AppliedChanges::default(),
        }
    }

    /// Applies `command` as the next entry; it must not be rejected.
    pub fn apply(&mut self, command: Command) {
        self.index += 1;
        let ctx = ApplyCtx {
            log_index: self.index,
            time_ms: 1_000 * self.index,
        };
        let changes = self.changes.noting().expect("a test log names its changes");
        let outcome = apply_noting(&mut self.state, command, ctx, changes);
        assert!(!outcome.is_rejected(), "{outcome:?}");
    }

    /// What the commands applied since the last call changed.
    pub fn take_changes(&mut self) -> AppliedChanges {
        self.changes.take()
    }

    /// Plans one scheduling round and applies it.
    pub fn schedule(&mut self) {
        let plan = quotient_core::plan(&self.state);
        self.apply(Command::ApplyPlan(plan));
    }

    /// Registers `name` with `gpus` healthy GPUs of [`class`], uuids `GPU-0`, `GPU-1`, ...
    pub fn register_node(&mut self, name: &str, gpus: u32) {
        self.apply(Command::RegisterNode(NodeInventory {
            name: name.into(),
            host: quotient_common::HostInfo::process_only(),
            gpus: (0..gpus)
                .map(|index| GpuDevice {
                    index,
                    uuid: format!("GPU-{index}"),
                    class: class(),
                    healthy: true,
                    nvlink_peers: 0,
                })
                .collect(),
        }));
    }

    /// Creates an enabled `lend` share `name` limited to `limit` GPUs of [`class`].
    pub fn create_share(&mut self, name: &str, limit: u32) {
        self.apply(Command::CreateShare(ShareSpec {
            name: name.into(),
            limits: BTreeMap::from([(class(), limit)]),
            strategy: Strategy::Lend,
            borrow_limit_percent: None,
            in_share_preemption: false,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        }));
    }
}
