//! GPU device backends: what the agent knows about its host's GPUs.
//!
//! A [`GpuBackend`] takes a snapshot of every GPU as a [`DeviceStatus`]: identity (index,
//! UUID, model, class), load (memory, utilization, temperature, power) and health (ECC
//! counts, XID events, lost devices). Two backends exist: [`nvml::NvmlBackend`] reads the
//! NVIDIA driver through NVML, and [`simulated::SimulatedBackend`] serves machines without
//! GPUs and the tests. The scheduler only needs [`GpuDevice`]s, which
//! [`DeviceStatus::to_gpu_device`] derives; everything else travels in heartbeats for people.
//!
//! Health is decided in one place, [`health_problems`], so that both backends agree on what
//! makes a GPU unfit for new work.

pub mod nvml;
pub mod simulated;

use quotient_common::{GpuClass, GpuDevice};
use serde::{Deserialize, Serialize};

/// Why a GPU backend could not produce an inventory.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The NVML library is not on this host: there is no NVIDIA driver. Use simulated GPUs.
    #[error(
        "NVML library {library} not found: this host has no NVIDIA driver ({detail}). \
         Install the NVIDIA driver, or run with --simulated-gpus 8xa10g to use simulated GPUs"
    )]
    LibraryNotFound { library: String, detail: String },
    /// NVML is there but refused a call that the inventory cannot do without.
    #[error("NVML {operation} failed: {detail}")]
    Nvml { operation: String, detail: String },
    /// A `--simulated-gpus` spec that does not parse.
    #[error("invalid simulated GPU spec {spec:?}: {problem}. Write it as COUNTxCLASS[,COUNTxCLASS...], e.g. 8xa10g or 2xa10g,1xh100-80gb")]
    SimulatedSpec { spec: String, problem: String },
    /// The file that marks simulated GPUs unhealthy could not be read.
    #[error("cannot read the unhealthy-GPU file {path}: {source}")]
    UnhealthyFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A source of GPU snapshots.
pub trait GpuBackend: Send + Sync {
    /// Every GPU of the host, ordered by index.
    fn inventory(&self) -> Result<Vec<DeviceStatus>, GpuError>;

    /// True for simulated GPUs: they exist only in the agent, so a container runtime must not
    /// ask the driver for them.
    fn is_simulated(&self) -> bool;
}

/// An NVLink connection from this GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLinkPeer {
    /// The link number on this GPU.
    pub link: u32,
    /// The PCI bus id of the device on the other end (a GPU or an NVSwitch).
    pub remote_pci_bus_id: String,
}

/// How close another GPU of the host is, as NVML's topology level names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyPeer {
    pub index: u32,
    /// `internal`, `single`, `multiple`, `host-bridge`, `node` or `system`: nearest first.
    pub level: String,
}

/// One GPU at one moment. `None` means the device or driver does not report that reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub index: u32,
    pub uuid: String,
    /// The model name as the driver reports it, e.g. "NVIDIA A10G".
    pub model: String,
    pub class: GpuClass,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub utilization_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub power_milliwatts: Option<u32>,
    /// Single-bit ECC errors since the driver loaded.
    pub ecc_corrected_errors: Option<u64>,
    /// Double-bit ECC errors since the driver loaded; any makes the GPU unhealthy.
    pub ecc_uncorrected_errors: Option<u64>,
    /// Critical XID errors seen since the agent started watching, oldest first; `None` when the
    /// device cannot deliver XID events.
    pub xid_events: Option<Vec<u64>>,
    pub nvlink_peers: Option<Vec<NvLinkPeer>>,
    /// Its own PCI bus id (`00000000:07:00.0`), when the backend reads it.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    pub topology_peers: Option<Vec<TopologyPeer>>,
    /// Whether Multi-Instance GPU mode is on.
    pub mig_enabled: Option<bool>,
    pub healthy: bool,
    /// Why the GPU is unhealthy, in words; empty when healthy.
    pub problems: Vec<String>,
}

impl DeviceStatus {
    /// The scheduler's view of this GPU alone (no NVLink peers: see [`to_gpu_devices`]).
    pub fn to_gpu_device(&self) -> GpuDevice {
        GpuDevice {
            index: self.index,
            uuid: self.uuid.clone(),
            class: self.class.clone(),
            healthy: self.healthy,
            nvlink_peers: 0,
        }
    }
}

/// The scheduler's view of a whole inventory, each GPU with its NVLink peers: the GPUs an
/// active link of it reaches (its remote PCI bus id is another GPU's here), and, on hosts
/// whose links go to NVSwitches (a remote that is no GPU here), every other GPU linked to a
/// switch too, since the switches connect them all.
pub fn to_gpu_devices(statuses: &[DeviceStatus]) -> Vec<GpuDevice> {
    let by_bus: std::collections::BTreeMap<String, u32> = statuses
        .iter()
        .filter_map(|s| Some((normalize_bus_id(s.pci_bus_id.as_deref()?), s.index)))
        .collect();
    let bit = |index: u32| if index < 64 { 1u64 << index } else { 0 };
    let mut direct = vec![0u64; statuses.len()];
    let mut switched = 0u64;
    for (i, status) in statuses.iter().enumerate() {
        for link in status.nvlink_peers.iter().flatten() {
            match by_bus.get(&normalize_bus_id(&link.remote_pci_bus_id)) {
                Some(&peer) if peer != status.index => direct[i] |= bit(peer),
                Some(_) => {}
                None => switched |= bit(status.index),
            }
        }
    }
    statuses
        .iter()
        .zip(direct)
        .map(|(status, direct)| {
            let mut device = status.to_gpu_device();
            let via_switch = if switched & bit(status.index) != 0 {
                switched
            } else {
                0
            };
            device.nvlink_peers = (direct | via_switch) & !bit(status.index);
            device
        })
        .collect()
}

/// A PCI bus id in one form whatever NVML wrote (`00000000:07:00.0`, `0000:07:00.0`): the
/// domain as a number, the rest in lowercase.
fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => {
            let domain = u64::from_str_radix(domain, 16).unwrap_or(0);
            format!("{domain:x}:{rest}")
        }
        _ => id,
    }
}

/// What makes a GPU unfit for new work: the device is lost or unreadable, it raised a
/// critical XID error, or it has double-bit (uncorrectable) ECC errors. Corrected ECC errors
/// alone do not: they are routine on large memories.
pub fn health_problems(
    lost: bool,
    xid_events: Option<&[u64]>,
    ecc_uncorrected_errors: Option<u64>,
) -> Vec<String> {
    let mut problems = Vec::new();
    if lost {
        problems.push("the GPU is lost or unreadable".to_string());
    }
    if let Some(xids) = xid_events {
        if !xids.is_empty() {
            let list: Vec<String> = xids.iter().map(u64::to_string).collect();
            problems.push(format!("critical XID errors: {}", list.join(", ")));
        }
    }
    if let Some(count) = ecc_uncorrected_errors {
        if count > 0 {
            problems.push(format!("{count} double-bit ECC errors"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_needs_no_xid_no_double_bit_ecc_and_a_present_device() {
        assert!(health_problems(false, Some(&[]), Some(0)).is_empty());
        assert!(health_problems(false, None, None).is_empty());
        assert_eq!(health_problems(true, None, None).len(), 1);
        assert_eq!(health_problems(false, Some(&[79]), Some(0)).len(), 1);
        assert_eq!(health_problems(false, Some(&[]), Some(2)).len(), 1);
        assert_eq!(health_problems(true, Some(&[48]), Some(1)).len(), 3);
    }
}
