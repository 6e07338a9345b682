//! The NVML backend: real NVIDIA GPUs, read through the driver's libnvidia-ml (nvml-wrapper).
//!
//! Reading and mapping are split. [`NvmlBackend`] only collects [`RawReadings`], one per
//! device, turning every call that a device does not support into `None`; the pure
//! [`device_status_from_readings`] then names the class and decides health. The tests cover
//! the mapping without a GPU; the reading itself runs on GPU hosts (`quotient-agent inventory`).
//!
//! XID errors arrive as NVML events, not as a reading, so the backend registers one event set
//! per device when it starts and drains it on every snapshot, keeping the last
//! [`XID_EVENTS_KEPT_MAX`] per device.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Mutex;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};
use quotient_common::GpuClass;

use super::{health_problems, DeviceStatus, GpuBackend, GpuError, NvLinkPeer, TopologyPeer};

/// The NVML library as the driver installs it (the unversioned name needs the dev package).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";
/// NVLink links per GPU that NVML can describe (NVML_NVLINK_MAX_LINKS).
pub const NVLINK_LINKS_MAX: u32 = 18;
/// XID errors kept per device; older ones are dropped, the GPU stays unhealthy.
pub const XID_EVENTS_KEPT_MAX: usize = 16;
/// Events drained per device per snapshot, so that an event storm cannot stall a heartbeat.
pub const XID_EVENTS_DRAINED_MAX: usize = 256;

/// Everything read from one device, before interpretation. `None`: not supported or not
/// readable on this device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawReadings {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub utilization_gpu_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub power_milliwatts: Option<u32>,
    pub ecc_corrected_volatile: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    pub xid_events: Option<Vec<u64>>,
    /// (link, remote PCI bus id) for each active link.
    pub nvlinks: Option<Vec<(u32, String)>>,
    /// The device's own PCI bus id, to match its peers' links.
    pub pci_bus_id: Option<String>,
    /// (other index, NVML topology level) for each other device.
    pub topology: Option<Vec<(u32, TopologyLevel)>>,
    /// NVML's current MIG mode (1 = enabled).
    pub mig_mode_current: Option<u32>,
    /// The device answered "GPU is lost", or could not be opened at all.
    pub lost: bool,
}

/// Maps one device's raw readings to its status: the class from the model name, health from
/// loss, XID errors and double-bit ECC counts.
pub fn device_status_from_readings(raw: RawReadings) -> DeviceStatus {
    let unreadable = raw.uuid.is_none();
    let model = raw.name.clone().unwrap_or_else(|| "unknown".to_string());
    let problems = health_problems(
        raw.lost || unreadable,
        raw.xid_events.as_deref(),
        raw.ecc_uncorrected_volatile,
    );
    DeviceStatus {
        index: raw.index,
        uuid: raw
            .uuid
            .unwrap_or_else(|| format!("GPU-unreadable-{}", raw.index)),
        class: GpuClass::from_nvml_name(&model),
        model,
        memory_total_bytes: raw.memory_total_bytes,
        memory_used_bytes: raw.memory_used_bytes,
        utilization_percent: raw.utilization_gpu_percent,
        temperature_celsius: raw.temperature_celsius,
        power_milliwatts: raw.power_milliwatts,
        ecc_corrected_errors: raw.ecc_corrected_volatile,
        ecc_uncorrected_errors: raw.ecc_uncorrected_volatile,
        xid_events: raw.xid_events,
        pci_bus_id: raw.pci_bus_id,
        nvlink_peers: raw.nvlinks.map(|links| {
            links
                .into_iter()
                .map(|(link, remote_pci_bus_id)| NvLinkPeer {
                    link,
                    remote_pci_bus_id,
                })
                .collect()
        }),
        topology_peers: raw.topology.map(|peers| {
            peers
                .into_iter()
                .map(|(index, level)| TopologyPeer {
                    index,
                    level: topology_level_name(&level).to_string(),
                })
                .collect()
        }),
        mig_enabled: raw.mig_mode_current.map(|mode| mode == 1),
        healthy: problems.is_empty(),
        problems,
    }
}

/// NVML's topology levels in words, nearest first.
pub fn topology_level_name(level: &TopologyLevel) -> &'static str {
    match level {
        TopologyLevel::Internal => "internal",
        TopologyLevel::Single => "single",
        TopologyLevel::Multiple => "multiple",
        TopologyLevel::HostBridge => "host-bridge",
        TopologyLevel::Node => "node",
        TopologyLevel::System => "system",
    }
}

/// Real GPUs through NVML.
pub struct NvmlBackend {
    /// Leaked on purpose: the event sets borrow it for as long as the agent runs, and the
    /// agent makes one backend per process. (An owned handle would make the backend
    /// self-referential.)
    nvml: &'static Nvml,
    /// Per device index: its XID event set, `None` when the device cannot deliver them.
    xid_watch: BTreeMap<u32, Option<Mutex<EventSet<'static>>>>,
    xid_seen: Mutex<BTreeMap<u32, Vec<u64>>>,
}

impl NvmlBackend {
    /// Loads [`NVML_LIBRARY`] and starts watching every device for XID errors.
    pub fn new() -> Result<NvmlBackend, GpuError> {
        NvmlBackend::with_library(NVML_LIBRARY)
    }

    /// Loads NVML from a given library name or path (tests use one that does not exist).
    pub fn with_library(library: &str) -> Result<NvmlBackend, GpuError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
            .map_err(|error| match error {
                NvmlError::LibloadingError(detail) => GpuError::LibraryNotFound {
                    library: library.to_string(),
                    detail: detail.to_string(),
                },
                NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound => {
                    GpuError::LibraryNotFound {
                        library: library.to_string(),
                        detail: error.to_string(),
                    }
                }
                other => GpuError::Nvml {
                    operation: "init".to_string(),
                    detail: other.to_string(),
                },
            })?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml.device_count().map_err(|error| GpuError::Nvml {
            operation: "device count".to_string(),
            detail: error.to_string(),
        })?;
        let mut xid_watch = BTreeMap::new();
        for index in 0..count {
            xid_watch.insert(index, watch_xid(nvml, index).map(Mutex::new));
        }
        Ok(NvmlBackend {
            nvml,
            xid_watch,
            xid_seen: Mutex::new(BTreeMap::new()),
        })
    }

    /// New XID errors of one device, drained from its event set; `None` without XID support.
    fn drain_xid(&self, index: u32) -> Option<Vec<u64>> {
        let set = self.xid_watch.get(&index)?.as_ref()?;
        let set = set.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut seen = self
            .xid_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let kept = seen.entry(index).or_default();
        for _ in 0..XID_EVENTS_DRAINED_MAX {
            match set.wait(0) {
                Ok(event) => {
                    let xid = match event.event_data {
                        Some(XidError::Value(xid)) => xid,
                        // An XID NVML cannot name is still an XID.
                        Some(XidError::Unknown) | None => 0,
                    };
                    kept.push(xid);
                    if kept.len() > XID_EVENTS_KEPT_MAX {
                        kept.remove(0);
                    }
                }
                Err(_) => break,
            }
        }
        Some(kept.clone())
    }

    fn read(&self, index: u32, count: u32) -> RawReadings {
        let mut raw = RawReadings {
            index,
            ..RawReadings::default()
        };
        let device = match self.nvml.device_by_index(index) {
            Ok(device) => device,
            Err(_) => {
                raw.lost = true;
                return raw;
            }
        };
        let mut lost = false;
        raw.uuid = reading(device.uuid(), &mut lost);
        raw.name = reading(device.name(), &mut lost);
        if let Some(memory) = reading(device.memory_info(), &mut lost) {
            raw.memory_total_bytes = Some(memory.total);
            raw.memory_used_bytes = Some(memory.used);
        }
        raw.utilization_gpu_percent =
            reading(device.utilization_rates(), &mut lost).map(|rates| rates.gpu);
        raw.temperature_celsius = reading(device.temperature(TemperatureSensor::Gpu), &mut lost);
        raw.power_milliwatts = reading(device.power_usage(), &mut lost);
        raw.ecc_corrected_volatile = reading(
            device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
            &mut lost,
        );
        raw.ecc_uncorrected_volatile = reading(
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
            &mut lost,
        );
        raw.mig_mode_current = reading(device.mig_mode(), &mut lost).map(|mode| mode.current);
        raw.nvlinks = read_nvlinks(&device, &mut lost);
        raw.pci_bus_id = reading(device.pci_info(), &mut lost).map(|info| info.bus_id);
        raw.topology = self.read_topology(&device, index, count, &mut lost);
        raw.xid_events = self.drain_xid(index);
        raw.lost = lost;
        raw
    }

    fn read_topology(
        &self,
        device: &Device<'static>,
        index: u32,
        count: u32,
        lost: &mut bool,
    ) -> Option<Vec<(u32, TopologyLevel)>> {
        let mut peers = Vec::new();
        for other in (0..count).filter(|other| *other != index) {
            let Ok(other_device) = self.nvml.device_by_index(other) else {
                continue;
            };
            // Not supported on one pair means not supported on the device.
            peers.push((
                other,
                reading(device.topology_common_ancestor(other_device), lost)?,
            ));
        }
        Some(peers)
    }
}

impl GpuBackend for NvmlBackend {
    fn inventory(&self) -> Result<Vec<DeviceStatus>, GpuError> {
        let count = self.nvml.device_count().map_err(|error| GpuError::Nvml {
            operation: "device count".to_string(),
            detail: error.to_string(),
        })?;
        Ok((0..count)
            .map(|index| device_status_from_readings(self.read(index, count)))
            .collect())
    }

    fn is_simulated(&self) -> bool {
        false
    }
}

/// One NVML reading: `None` when unsupported or failing; a lost GPU is also recorded.
fn reading<T>(result: Result<T, NvmlError>, lost: &mut bool) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(NvmlError::GpuLost) => {
            *lost = true;
            None
        }
        Err(_) => None,
    }
}

fn read_nvlinks(device: &Device<'static>, lost: &mut bool) -> Option<Vec<(u32, String)>> {
    let mut links = Vec::new();
    let mut any_supported = false;
    for link in 0..NVLINK_LINKS_MAX {
        let wrapper = device.link_wrapper_for(link);
        match reading(wrapper.is_active(), lost) {
            Some(true) => {
                any_supported = true;
                if let Some(remote) = reading(wrapper.remote_pci_info(), lost) {
                    links.push((link, remote.bus_id));
                }
            }
            Some(false) => any_supported = true,
            None => {}
        }
    }
    any_supported.then_some(links)
}

/// Registers a device for critical XID events; `None` when it cannot deliver them.
fn watch_xid(nvml: &'static Nvml, index: u32) -> Option<EventSet<'static>> {
    let device = nvml.device_by_index(index).ok()?;
    let set = nvml.create_event_set().ok()?;
    device
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a10g() -> RawReadings {
        RawReadings {
            index: 0,
            uuid: Some("GPU-3e2a1b9c-0000-1111-2222-333344445555".into()),
            name: Some("NVIDIA A10G".into()),
            memory_total_bytes: Some(24_146_608_128),
            memory_used_bytes: Some(1_048_576),
            utilization_gpu_percent: Some(37),
            temperature_celsius: Some(41),
            power_milliwatts: Some(61_234),
            ecc_corrected_volatile: Some(3),
            ecc_uncorrected_volatile: Some(0),
            xid_events: Some(vec![]),
            nvlinks: None,
            pci_bus_id: Some("00000000:05:00.0".into()),
            topology: Some(vec![(1, TopologyLevel::HostBridge)]),
            mig_mode_current: None,
            lost: false,
        }
    }

    /// A healthy device's readings land in the matching fields, with its class named.
    #[test]
    fn readings_map_to_a_healthy_status() {
        let status = device_status_from_readings(a10g());
        assert_eq!(status.index, 0);
        assert_eq!(status.uuid, "GPU-3e2a1b9c-0000-1111-2222-333344445555");
        assert_eq!(status.model, "NVIDIA A10G");
        assert_eq!(status.class.as_str(), "a10g");
        assert_eq!(status.memory_total_bytes, Some(24_146_608_128));
        assert_eq!(status.memory_used_bytes, Some(1_048_576));
        assert_eq!(status.utilization_percent, Some(37));
        assert_eq!(status.temperature_celsius, Some(41));
        assert_eq!(status.power_milliwatts, Some(61_234));
        assert_eq!(status.ecc_corrected_errors, Some(3));
        assert_eq!(status.ecc_uncorrected_errors, Some(0));
        assert_eq!(status.nvlink_peers, None);
        assert_eq!(
            status.topology_peers,
            Some(vec![TopologyPeer {
                index: 1,
                level: "host-bridge".into()
            }])
        );
        assert_eq!(status.mig_enabled, None);
        assert!(status.healthy, "{:?}", status.problems);
        let device = status.to_gpu_device();
        assert_eq!((device.index, device.healthy), (0, true));
        assert_eq!(device.class.as_str(), "a10g");
    }

    /// Readings a device does not support stay `None` and do not make it unhealthy.
    #[test]
    fn unsupported_readings_are_none_not_errors() {
        let raw = RawReadings {
            index: 3,
            uuid: Some("GPU-x".into()),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            ..RawReadings::default()
        };
        let status = device_status_from_readings(raw);
        assert_eq!(status.class.as_str(), "h100-80gb");
        assert_eq!(status.memory_total_bytes, None);
        assert_eq!(status.xid_events, None);
        assert_eq!(status.ecc_uncorrected_errors, None);
        assert!(status.healthy);
    }

    /// NVLink peers and MIG mode are carried through.
    #[test]
    fn nvlink_and_mig_are_reported() {
        let mut raw = a10g();
        raw.nvlinks = Some(vec![(0, "00000000:07:00.0".into())]);
        raw.mig_mode_current = Some(1);
        let status = device_status_from_readings(raw);
        assert_eq!(
            status.nvlink_peers,
            Some(vec![NvLinkPeer {
                link: 0,
                remote_pci_bus_id: "00000000:07:00.0".into()
            }])
        );
        assert_eq!(status.mig_enabled, Some(true));
    }

    /// The inventory names each GPU's NVLink peers: the GPUs here its links reach (bus ids
    /// matched whatever their domain's width), and every GPU linked to an NVSwitch is a peer
    /// of every other such GPU.
    #[test]
    fn nvlink_peers_are_the_gpus_the_links_reach() {
        let gpu = |index: u32, bus: &str, links: &[&str]| {
            let mut raw = a10g();
            raw.index = index;
            raw.uuid = Some(format!("GPU-{index}"));
            raw.pci_bus_id = Some(bus.into());
            raw.nvlinks = Some(
                links
                    .iter()
                    .enumerate()
                    .map(|(link, remote)| (link as u32, remote.to_string()))
                    .collect(),
            );
            device_status_from_readings(raw)
        };
        // Pairs 0-1 and 2-3 bridged; GPU 4 without links.
        let pairs = [
            gpu(0, "00000000:07:00.0", &["0000:08:00.0"]),
            gpu(1, "00000000:08:00.0", &["00000000:07:00.0"]),
            gpu(2, "00000000:0A:00.0", &["00000000:0b:00.0"]),
            gpu(3, "00000000:0B:00.0", &["00000000:0A:00.0"]),
            gpu(4, "00000000:0C:00.0", &[]),
        ];
        let peers: Vec<u64> = crate::gpu::to_gpu_devices(&pairs)
            .iter()
            .map(|d| d.nvlink_peers)
            .collect();
        assert_eq!(peers, vec![0b00010, 0b00001, 0b01000, 0b00100, 0]);
        // Three GPUs linked to NVSwitches (remotes that are no GPU here).
        let switched = [
            gpu(0, "00000000:07:00.0", &["00000000:c1:00.0"]),
            gpu(1, "00000000:08:00.0", &["00000000:c2:00.0"]),
            gpu(2, "00000000:09:00.0", &["00000000:c1:00.0"]),
        ];
        let peers: Vec<u64> = crate::gpu::to_gpu_devices(&switched)
            .iter()
            .map(|d| d.nvlink_peers)
            .collect();
        assert_eq!(peers, vec![0b110, 0b101, 0b011]);
    }

    /// An XID error, a double-bit ECC error, or a lost or unreadable device each make it unhealthy.
    #[test]
    fn xid_double_bit_ecc_and_lost_devices_are_unhealthy() {
        let mut xid = a10g();
        xid.xid_events = Some(vec![79]);
        let status = device_status_from_readings(xid);
        assert!(!status.healthy);
        assert!(status.problems[0].contains("79"), "{:?}", status.problems);
        assert!(!status.to_gpu_device().healthy);

        let mut ecc = a10g();
        ecc.ecc_uncorrected_volatile = Some(1);
        assert!(!device_status_from_readings(ecc).healthy);

        let mut lost = a10g();
        lost.lost = true;
        assert!(!device_status_from_readings(lost).healthy);

        let unreadable = RawReadings {
            index: 5,
            lost: true,
            ..RawReadings::default()
        };
        let status = device_status_from_readings(unreadable);
        assert!(!status.healthy);
        assert_eq!(status.uuid, "GPU-unreadable-5");
        assert_eq!(status.class.as_str(), "unknown");
    }

    /// On a host without the NVIDIA driver, the error names the library and `--simulated-gpus`.
    #[test]
    fn a_missing_library_names_the_simulated_alternative() {
        let error = match NvmlBackend::with_library("libnvidia-ml-absent-for-test.so.1") {
            Ok(_) => panic!("a library that does not exist must not load"),
            Err(error) => error,
        };
        assert!(matches!(error, GpuError::LibraryNotFound { .. }), "{error}");
        let text = error.to_string();
        assert!(text.contains("--simulated-gpus"), "{text}");
        assert!(text.contains("libnvidia-ml-absent-for-test.so.1"), "{text}");
    }

    /// This development machine has no NVIDIA driver: the default backend says so clearly.
    #[test]
    fn the_default_library_is_missing_here_with_a_clear_error() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            eprintln!("this host has an NVIDIA driver: the no-driver error is not checked here");
            return;
        }
        match NvmlBackend::new() {
            Ok(_) => panic!("NVML loaded on a host without /dev/nvidiactl"),
            Err(error) => {
                let text = error.to_string();
                assert!(text.contains("libnvidia-ml.so.1"), "{text}");
                assert!(text.contains("--simulated-gpus"), "{text}");
            }
        }
    }
}
