//! Node inventory: the GPUs an agent reports for its host, and the node's scheduling state.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

use crate::name::validate_name;
use crate::{GpuClass, SpecError};

/// The most GPUs one node may report; GPU sets are `u64` bit masks.
pub const GPUS_PER_NODE_MAX: usize = 64;
/// The longest GPU UUID.
pub const GPU_UUID_BYTES_MAX: usize = 128;

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// The device index on its host (what CUDA_VISIBLE_DEVICES names).
    pub index: u32,
    pub uuid: String,
    pub class: GpuClass,
    /// An unhealthy GPU (XID error, double-bit ECC, lost) is never given new work.
    pub healthy: bool,
}

/// What an agent reports about its host when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub name: String,
    pub gpus: Vec<GpuDevice>,
}

impl NodeInventory {
    /// Checks the node name, the GPU count, and that indices and UUIDs are unique.
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_name("node", &self.name)?;
        let problem = |problem: String| SpecError::Inventory {
            node: self.name.clone(),
            problem,
        };
        if self.gpus.len() > GPUS_PER_NODE_MAX {
            return Err(problem(format!(
                "reports {} GPUs, at most {GPUS_PER_NODE_MAX} are supported",
                self.gpus.len()
            )));
        }
        let mut indices = BTreeSet::new();
        let mut uuids = BTreeSet::new();
        for gpu in &self.gpus {
            if gpu.index as usize >= GPUS_PER_NODE_MAX {
                return Err(problem(format!("GPU index {} is out of range", gpu.index)));
            }
            if !indices.insert(gpu.index) {
                return Err(problem(format!(
                    "GPU index {} is reported twice",
                    gpu.index
                )));
            }
            if gpu.uuid.is_empty() || gpu.uuid.len() > GPU_UUID_BYTES_MAX {
                return Err(problem(format!("GPU {} has an invalid UUID", gpu.index)));
            }
            if !uuids.insert(gpu.uuid.as_str()) {
                return Err(problem(format!("GPU UUID {} is reported twice", gpu.uuid)));
            }
            GpuClass::parse(gpu.class.as_str())?;
        }
        Ok(())
    }
}

/// Whether a node takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    Ready,
    /// No new placements; running jobs stay.
    Cordoned,
    /// No new placements, and running jobs are preempted off the node.
    Draining,
    /// Missed heartbeats for the node lease; its jobs were requeued.
    Lost,
}

impl NodeState {
    pub fn schedulable(self) -> bool {
        matches!(self, NodeState::Ready)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Ready => "ready",
            NodeState::Cordoned => "cordoned",
            NodeState::Draining => "draining",
            NodeState::Lost => "lost",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str) -> GpuDevice {
        GpuDevice {
            index,
            uuid: uuid.into(),
            class: GpuClass::parse("a10g").unwrap(),
            healthy: true,
        }
    }

    #[test]
    fn inventory_needs_unique_indices_and_uuids() {
        let mut node = NodeInventory {
            name: "node-1".into(),
            gpus: vec![gpu(0, "GPU-a"), gpu(1, "GPU-b")],
        };
        assert_eq!(node.validate(), Ok(()));
        node.gpus.push(gpu(1, "GPU-c"));
        assert!(node.validate().is_err());
        node.gpus.pop();
        node.gpus.push(gpu(2, "GPU-a"));
        assert!(node.validate().is_err());
        node.gpus.pop();
        node.gpus.push(gpu(64, "GPU-z"));
        assert!(node.validate().is_err());
    }
}
