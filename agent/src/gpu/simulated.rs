//! Simulated GPUs: a backend for machines without GPUs, for `quotient dev up` and the tests.
//!
//! A spec such as `8xa10g` or `2xa10g,1xh100-80gb` names how many GPUs of which class; indices
//! run from 0 in the order written. UUIDs are derived from the node name and the index, so they
//! are stable across agent restarts and distinct across nodes, and look like NVML's
//! (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
//!
//! A test marks a GPU unhealthy either in process ([`SimulatedBackend::mark_unhealthy`]) or,
//! for an agent running as its own process, by writing the GPU's index into the file
//! [`UNHEALTHY_GPUS_FILE`] in the agent's state dir (indices separated by commas, spaces or
//! newlines); the file is read again at every snapshot.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use quotient_common::{GpuClass, GPUS_PER_NODE_MAX};

use super::{health_problems, DeviceStatus, GpuBackend, GpuError};

/// The file in the state dir that lists the indices of simulated GPUs to report unhealthy.
pub const UNHEALTHY_GPUS_FILE: &str = "unhealthy-gpus";
/// The XID a simulated unhealthy GPU reports: 79, "GPU has fallen off the bus".
pub const SIMULATED_XID: u64 = 79;
/// The largest unhealthy-GPU file read.
pub const UNHEALTHY_FILE_BYTES_MAX: u64 = 64 * 1024;

/// One group of a spec: `count` GPUs of `class`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatedGroup {
    pub count: u32,
    pub class: GpuClass,
}

/// Parses `COUNTxCLASS[,COUNTxCLASS...]`, e.g. `8xa10g` or `2xa10g,1xh100-80gb`.
pub fn parse_spec(spec: &str) -> Result<Vec<SimulatedGroup>, GpuError> {
    let fail = |problem: String| GpuError::SimulatedSpec {
        spec: spec.chars().take(200).collect(),
        problem,
    };
    let mut groups = Vec::new();
    let mut total: usize = 0;
    for part in spec.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(fail("it has an empty group".to_string()));
        }
        let Some((count, class)) = part.split_once('x') else {
            return Err(fail(format!("{part:?} has no 'x' between count and class")));
        };
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| fail(format!("{count:?} in {part:?} is not a count")))?;
        if count == 0 {
            return Err(fail(format!("{part:?} asks for zero GPUs")));
        }
        let class = GpuClass::parse(class.trim()).map_err(|error| fail(error.to_string()))?;
        total += count as usize;
        if total > GPUS_PER_NODE_MAX {
            return Err(fail(format!("a node has at most {GPUS_PER_NODE_MAX} GPUs")));
        }
        groups.push(SimulatedGroup { count, class });
    }
    Ok(groups)
}

/// The stable UUID of simulated GPU `index` on `node`.
pub fn simulated_uuid(node: &str, index: u32) -> String {
    let key = format!("quotient-simulated-gpu/{node}/{index}");
    let high = fnv1a_64(key.as_bytes(), 0xcbf2_9ce4_8422_2325);
    let low = fnv1a_64(key.as_bytes(), 0x6c62_272e_07bb_0142);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0xffff,
        low >> 48,
        low & 0xffff_ffff_ffff
    )
}

/// FNV-1a, then SplitMix64's finalizer so that neighbouring indices give unlike UUIDs. Not
/// cryptographic: these only need to be stable and distinct.
fn fnv1a_64(bytes: &[u8], basis: u64) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = bytes.iter().fold(basis, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    });
    let mut z = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Memory of a simulated GPU, by class: a plausible figure, never used for decisions.
fn simulated_memory_bytes(class: &GpuClass) -> u64 {
    const GIB: u64 = 1024 * 1024 * 1024;
    let name = class.as_str();
    if let Some(gb) = name
        .split('-')
        .find_map(|word| word.strip_suffix("gb").and_then(|n| n.parse::<u64>().ok()))
    {
        return gb * GIB;
    }
    match name {
        "a10g" | "a10" | "l4" => 24 * GIB,
        "t4" => 16 * GIB,
        "h100" => 80 * GIB,
        "h200" => 141 * GIB,
        _ => 16 * GIB,
    }
}

/// GPUs that exist only in the agent.
pub struct SimulatedBackend {
    node: String,
    groups: Vec<SimulatedGroup>,
    /// Where [`UNHEALTHY_GPUS_FILE`] is looked for; `None` reads no file.
    state_dir: Option<PathBuf>,
    marked_unhealthy: Mutex<BTreeSet<u32>>,
}

impl SimulatedBackend {
    /// Simulated GPUs for `node` from a spec such as `8xa10g`.
    pub fn new(
        node: &str,
        spec: &str,
        state_dir: Option<&Path>,
    ) -> Result<SimulatedBackend, GpuError> {
        Ok(SimulatedBackend {
            node: node.to_string(),
            groups: parse_spec(spec)?,
            state_dir: state_dir.map(Path::to_path_buf),
            marked_unhealthy: Mutex::new(BTreeSet::new()),
        })
    }

    /// Reports GPU `index` unhealthy from now on (an XID 79), as a failing device would.
    pub fn mark_unhealthy(&self, index: u32) {
        self.marked().insert(index);
    }

    /// Reports GPU `index` healthy again (the file trigger, if it names it, still applies).
    pub fn mark_healthy(&self, index: u32) {
        self.marked().remove(&index);
    }

    /// The path of the unhealthy-GPU file, if this backend reads one.
    pub fn unhealthy_file(&self) -> Option<PathBuf> {
        self.state_dir
            .as_ref()
            .map(|dir| dir.join(UNHEALTHY_GPUS_FILE))
    }

    fn marked(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.marked_unhealthy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn unhealthy_from_file(&self) -> Result<BTreeSet<u32>, GpuError> {
        let Some(path) = self.unhealthy_file() else {
            return Ok(BTreeSet::new());
        };
        let read = || -> std::io::Result<String> {
            use std::io::Read;
            let file = std::fs::File::open(&path)?;
            let mut text = String::new();
            file.take(UNHEALTHY_FILE_BYTES_MAX)
                .read_to_string(&mut text)?;
            Ok(text)
        };
        match read() {
            Ok(text) => Ok(text
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter_map(|word| word.trim().parse::<u32>().ok())
                .collect()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
            Err(source) => Err(GpuError::UnhealthyFile {
                path: path.display().to_string(),
                source,
            }),
        }
    }
}

impl GpuBackend for SimulatedBackend {
    fn inventory(&self) -> Result<Vec<DeviceStatus>, GpuError> {
        let mut unhealthy = self.unhealthy_from_file()?;
        unhealthy.extend(self.marked().iter().copied());
        let mut statuses = Vec::new();
        let mut index: u32 = 0;
        for group in &self.groups {
            for _ in 0..group.count {
                let xid_events = if unhealthy.contains(&index) {
                    vec![SIMULATED_XID]
                } else {
                    Vec::new()
                };
                let problems = health_problems(false, Some(&xid_events), Some(0));
                statuses.push(DeviceStatus {
                    index,
                    uuid: simulated_uuid(&self.node, index),
                    model: format!("Simulated {}", group.class),
                    class: group.class.clone(),
                    memory_total_bytes: Some(simulated_memory_bytes(&group.class)),
                    memory_used_bytes: Some(0),
                    utilization_percent: Some(0),
                    temperature_celsius: Some(30),
                    power_milliwatts: Some(0),
                    ecc_corrected_errors: Some(0),
                    ecc_uncorrected_errors: Some(0),
                    xid_events: Some(xid_events),
                    nvlink_peers: Some(Vec::new()),
                    pci_bus_id: None,
                    topology_peers: None,
                    mig_enabled: Some(false),
                    healthy: problems.is_empty(),
                    problems,
                });
                index += 1;
            }
        }
        Ok(statuses)
    }

    fn is_simulated(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Specs parse into groups; bad ones are refused with a message that shows the form.
    #[test]
    fn specs_parse_and_bad_ones_are_explained() {
        let groups = parse_spec("8xa10g").unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].count, 8);
        assert_eq!(groups[0].class.as_str(), "a10g");
        let groups = parse_spec("2xa10g,1xh100-80gb").unwrap();
        assert_eq!(
            groups.iter().map(|g| g.count).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert_eq!(groups[1].class.as_str(), "h100-80gb");
        for bad in [
            "",
            "8",
            "xa10g",
            "0xa10g",
            "8xA10G",
            "8xa10g,",
            "65xa10g",
            "40xa10g,40xt4",
        ] {
            let error = parse_spec(bad).expect_err(bad).to_string();
            assert!(error.contains("8xa10g"), "{bad}: {error}");
        }
    }

    /// UUIDs are stable for a node and index, distinct across both, and shaped like NVML's.
    #[test]
    fn uuids_are_stable_and_distinct() {
        let a = simulated_uuid("node-1", 0);
        assert_eq!(a, simulated_uuid("node-1", 0));
        assert_ne!(a, simulated_uuid("node-1", 1));
        assert_ne!(a, simulated_uuid("node-2", 0));
        assert_eq!(a.len(), "GPU-".len() + 36);
        assert!(a.starts_with("GPU-"));
        let backend = SimulatedBackend::new("node-1", "2xa10g,1xh100-80gb", None).unwrap();
        let first = backend.inventory().unwrap();
        let again = SimulatedBackend::new("node-1", "2xa10g,1xh100-80gb", None)
            .unwrap()
            .inventory()
            .unwrap();
        assert_eq!(first, again);
        assert_eq!(
            first.iter().map(|d| d.index).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(first[2].class.as_str(), "h100-80gb");
        assert_eq!(first[2].memory_total_bytes, Some(80 * 1024 * 1024 * 1024));
        let devices = crate::gpu::to_gpu_devices(&first);
        assert!(devices.iter().all(|d| d.healthy));
        assert_eq!(devices[1].uuid, simulated_uuid("node-1", 1));
    }

    /// A GPU marked unhealthy by method or by the state-dir file is reported unhealthy.
    #[test]
    fn gpus_can_be_marked_unhealthy_in_process_and_by_file() {
        let dir = tempfile::tempdir().unwrap();
        let backend = SimulatedBackend::new("node-1", "4xa10g", Some(dir.path())).unwrap();
        let healthy = |b: &SimulatedBackend| -> Vec<bool> {
            b.inventory().unwrap().iter().map(|d| d.healthy).collect()
        };
        assert_eq!(healthy(&backend), vec![true; 4]);

        backend.mark_unhealthy(1);
        assert_eq!(healthy(&backend), vec![true, false, true, true]);
        let status = &backend.inventory().unwrap()[1];
        assert_eq!(status.xid_events, Some(vec![SIMULATED_XID]));
        backend.mark_healthy(1);
        assert_eq!(healthy(&backend), vec![true; 4]);

        std::fs::write(dir.path().join(UNHEALTHY_GPUS_FILE), "0, 3\n").unwrap();
        assert_eq!(healthy(&backend), vec![false, true, true, false]);
        std::fs::remove_file(dir.path().join(UNHEALTHY_GPUS_FILE)).unwrap();
        assert_eq!(healthy(&backend), vec![true; 4]);
    }
}
