//! Node inventory: the GPUs an agent reports for its host, and the node's scheduling state.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
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
    /// The indices of the GPUs on the same host this one reaches over NVLink, as a bit mask
    /// (bit `i` for index `i`); 0 when it has no NVLink peers or the backend cannot tell.
    pub nvlink_peers: u64,
}

/// The most images a node reports (the rest are left out of its inventory).
pub const NODE_IMAGES_MAX: usize = 512;
/// The longest image reference a node reports.
pub const IMAGE_REF_BYTES_MAX: usize = 512;
/// The most labels a node may carry.
pub const NODE_LABELS_MAX: usize = 16;
/// The longest label key or value.
pub const LABEL_BYTES_MAX: usize = 63;
/// The longest address a node advertises (a DNS name's limit).
pub const ADDRESS_BYTES_MAX: usize = 253;

/// A way an agent runs jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// A command run as a process on the host: every agent has it.
    Process,
    /// A container image run by the host's Docker engine: only where Docker is reachable.
    Docker,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Process => "process",
            Runtime::Docker => "docker",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a node can run besides its GPUs: its runtimes, the images it holds, its CPUs and
/// memory; and what the operator says of it: its labels and the address its jobs are reached
/// at. A job is placed only where its runtime (and image) is, and where the CPUs and memory it
/// takes are free.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// In order, each once.
    pub runtimes: Vec<Runtime>,
    /// The images present in the node's Docker engine (repository:tag), sorted, each once.
    /// Images are never pulled, so a container job goes only where its image is.
    pub images: Vec<String>,
    /// CPUs in thousandths; 0 when not reported (then CPUs are not accounted on the node).
    pub cpu_millis: u32,
    /// Memory in bytes; 0 when not reported (then memory is not accounted on the node).
    pub memory_bytes: u64,
    /// What the operator says of the node (`--label rack=r3`): its place in the topology.
    pub labels: BTreeMap<String, String>,
    /// The address its jobs are reached at by other nodes' jobs (`--advertise-address`);
    /// `None` when the agent could not tell.
    pub address: Option<String>,
}

/// Parses a node label `KEY=VALUE` (`rack=r3`): a key of 1-63 characters of `A-Z a-z 0-9 . _
/// - /`, a value of 0-63 characters of `A-Z a-z 0-9 . _ -`.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("invalid label {text:?}: write KEY=VALUE, e.g. rack=r3"))?;
    check_label(key, value)?;
    Ok((key.to_string(), value.to_string()))
}

/// Checks a label key alone (`job submit --same rack`).
pub fn check_label_key(key: &str) -> Result<(), String> {
    if label_key_ok(key) {
        Ok(())
    } else {
        Err(format!(
            "invalid label key {key:?}: use 1-{LABEL_BYTES_MAX} characters of A-Z a-z 0-9 . _ - /, e.g. rack"
        ))
    }
}

fn label_key_ok(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= LABEL_BYTES_MAX
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
}

fn check_label(key: &str, value: &str) -> Result<(), String> {
    let key_ok = label_key_ok(key);
    let value_ok = value.len() <= LABEL_BYTES_MAX
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if key_ok && value_ok {
        Ok(())
    } else {
        Err(format!(
            "invalid label {key}={value}: a key is 1-{LABEL_BYTES_MAX} characters of A-Z a-z 0-9 . _ - /, a value 0-{LABEL_BYTES_MAX} of A-Z a-z 0-9 . _ -"
        ))
    }
}

impl HostInfo {
    /// What a node of a build from before nodes reported more than their GPUs could run:
    /// processes, without CPU or memory accounting.
    pub fn process_only() -> HostInfo {
        HostInfo {
            runtimes: vec![Runtime::Process],
            ..HostInfo::default()
        }
    }

    pub fn has_runtime(&self, runtime: Runtime) -> bool {
        self.runtimes.contains(&runtime)
    }

    /// Whether the node holds `image`. A reference without a tag means `:latest`, as Docker
    /// reads it.
    pub fn has_image(&self, image: &str) -> bool {
        let tagged;
        let wanted = if image_has_tag_or_digest(image) {
            image
        } else {
            tagged = format!("{image}:latest");
            &tagged
        };
        self.images
            .binary_search_by(|held| held.as_str().cmp(wanted))
            .is_ok()
    }

    fn validate(&self) -> Result<(), String> {
        if self.labels.len() > NODE_LABELS_MAX {
            return Err(format!(
                "has {} labels, at most {NODE_LABELS_MAX} are allowed",
                self.labels.len()
            ));
        }
        for (key, value) in &self.labels {
            check_label(key, value)?;
        }
        if let Some(address) = &self.address {
            if address.is_empty()
                || address.len() > ADDRESS_BYTES_MAX
                || address
                    .bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                return Err(format!(
                    "advertises an invalid address ({} bytes): 1-{ADDRESS_BYTES_MAX} bytes, no spaces",
                    address.len()
                ));
            }
        }
        if self.runtimes.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err("reports its runtimes out of order or twice".into());
        }
        if self.images.len() > NODE_IMAGES_MAX {
            return Err(format!(
                "reports {} images, at most {NODE_IMAGES_MAX} are kept",
                self.images.len()
            ));
        }
        if self.images.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err("reports its images out of order or twice".into());
        }
        if let Some(image) = self
            .images
            .iter()
            .find(|image| image.is_empty() || image.len() > IMAGE_REF_BYTES_MAX)
        {
            return Err(format!(
                "reports an image reference of {} bytes (1 to {IMAGE_REF_BYTES_MAX})",
                image.len()
            ));
        }
        Ok(())
    }
}

/// Whether an image reference names its tag or digest (`repo:tag`, `repo@sha256:...`); a
/// `:` in a registry's host:port does not count.
pub fn image_has_tag_or_digest(image: &str) -> bool {
    let last = image.rsplit('/').next().unwrap_or(image);
    last.contains(':') || last.contains('@')
}

/// What an agent reports about its host when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub name: String,
    pub gpus: Vec<GpuDevice>,
    pub host: HostInfo,
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
        self.host.validate().map_err(problem)?;
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
            nvlink_peers: 0,
        }
    }

    #[test]
    fn inventory_needs_unique_indices_and_uuids() {
        let mut node = NodeInventory {
            name: "node-1".into(),
            gpus: vec![gpu(0, "GPU-a"), gpu(1, "GPU-b")],
            host: HostInfo::process_only(),
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
        node.gpus.pop();
        node.host.images = vec!["b:1".into(), "a:1".into()];
        assert!(node.validate().is_err(), "images out of order");
        node.host.images = vec!["a:1".into(), "b:1".into()];
        assert_eq!(node.validate(), Ok(()));
        node.host.runtimes = vec![Runtime::Docker, Runtime::Process];
        assert!(node.validate().is_err(), "runtimes out of order");
        node.host.runtimes = vec![Runtime::Process];
        node.host.labels = [("rack".to_string(), "r3".to_string())].into();
        node.host.address = Some("10.0.0.7".into());
        assert_eq!(node.validate(), Ok(()));
        node.host.labels.insert("bad key".into(), "x".into());
        assert!(node.validate().is_err(), "a label key with a space");
        node.host.labels.remove("bad key");
        node.host.address = Some("10.0.0.7 x".into());
        assert!(node.validate().is_err(), "an address with a space");
    }

    #[test]
    fn labels_parse_as_key_equals_value() {
        // Proves the form and the charset rules, with a message showing the form.
        assert_eq!(
            parse_label("rack=r3"),
            Ok(("rack".to_string(), "r3".to_string()))
        );
        assert_eq!(
            parse_label("topology.io/block=b-1"),
            Ok(("topology.io/block".to_string(), "b-1".to_string()))
        );
        assert_eq!(
            parse_label("empty="),
            Ok(("empty".to_string(), String::new()))
        );
        assert!(parse_label("rack").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_label("=r3").is_err());
        assert!(parse_label("rack=r 3").is_err());
    }

    #[test]
    fn an_image_without_a_tag_is_its_latest() {
        // Proves has_image reads references as Docker does.
        let host = HostInfo {
            runtimes: vec![Runtime::Process, Runtime::Docker],
            images: vec![
                "localhost:5000/x:latest".into(),
                "trainer:1".into(),
                "trainer:latest".into(),
            ],
            ..HostInfo::default()
        };
        assert!(host.has_image("trainer"));
        assert!(host.has_image("trainer:1"));
        assert!(!host.has_image("trainer:2"));
        assert!(host.has_image("localhost:5000/x"));
        assert!(!host.has_image("localhost:5000/y"));
    }
}
