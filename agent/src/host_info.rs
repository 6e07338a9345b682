//! What an agent reports about its host besides its GPUs ([`HostInfo`]): the runtimes it can
//! run jobs with, the images its Docker engine holds, and the CPUs and memory it offers jobs.
//! The coordinators place a container job only where its image is, and account CPUs and
//! memory per node.
//!
//! - CPUs: the CPUs the agent may use (`available_parallelism`: online CPUs and affinity),
//!   or its cgroup's CPU quota if lower; `--cpus` instead when given.
//! - Memory: `MemTotal` of `/proc/meminfo`, or its cgroup's memory limit if lower; `--memory`
//!   instead when given.
//! - Images: sorted, each once, at most [`NODE_IMAGES_MAX`] of at most
//!   [`IMAGE_REF_BYTES_MAX`] bytes (the rest are left out, with a warning), as the
//!   coordinators require.
//!
//! [`keep_current`] looks again every [`HOST_RECHECK_MS`] (an image loaded, Docker started
//! or stopped) and publishes what changed; the session then registers again on its
//! connection, which updates the node's record and leaves its jobs alone.

use std::sync::Arc;
use std::time::Duration;

use quotient_common::node::{IMAGE_REF_BYTES_MAX, NODE_IMAGES_MAX};
use quotient_common::{HostInfo, Runtime};
use tokio::sync::watch;

use crate::runtime::cgroup;
use crate::runtime::host::{HostRuntime, NodeCapabilities, RUNTIME_DOCKER, RUNTIME_PROCESS};

/// How often the agent looks at its host again (images, Docker), in milliseconds.
pub const HOST_RECHECK_MS: u64 = 30_000;

/// The CPUs (thousandths) and memory (bytes) the node offers jobs, and what the operator
/// says of it: its labels and the address its jobs are reached at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostResources {
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub labels: std::collections::BTreeMap<String, String>,
    pub address: Option<String>,
}

/// This host's address on the route to `coordinator` (`host:port`): the source address the
/// kernel picks for a datagram there (nothing is sent). `None` when it cannot tell.
pub fn route_address(coordinator: &str) -> Option<String> {
    use std::net::{ToSocketAddrs, UdpSocket};
    let target = coordinator.to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    let local = socket.local_addr().ok()?.ip();
    (!local.is_unspecified()).then(|| local.to_string())
}

impl HostResources {
    /// What this host has, or what `--cpus` and `--memory` say.
    pub fn detect(cpu_millis: Option<u32>, memory_bytes: Option<u64>) -> HostResources {
        let (cgroup_cpus, cgroup_memory) = cgroup::own_limits();
        let cpu_millis = cpu_millis.unwrap_or_else(|| {
            let online = std::thread::available_parallelism()
                .map(|count| count.get() as u64 * 1_000)
                .unwrap_or(1_000);
            let millis = cgroup_cpus.map_or(online, |quota| online.min(u64::from(quota)));
            u32::try_from(millis).unwrap_or(u32::MAX)
        });
        let memory_bytes = memory_bytes.unwrap_or_else(|| {
            let total = std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|text| mem_total(&text))
                .unwrap_or(0);
            match cgroup_memory {
                Some(limit) if total == 0 || limit < total => limit,
                _ => total,
            }
        });
        HostResources {
            labels: Default::default(),
            address: None,
            cpu_millis,
            memory_bytes,
        }
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?;
    let mut fields = line.split_whitespace();
    let number: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => number.checked_mul(1024),
        None => Some(number),
        Some(_) => None,
    }
}

/// The node's host info from what it can run and what it has; also how many images were
/// left out (too many, or a reference too long).
pub fn host_info(capabilities: &NodeCapabilities, resources: &HostResources) -> (HostInfo, usize) {
    let mut runtimes: Vec<Runtime> = capabilities
        .runtimes
        .iter()
        .filter_map(|name| match name.as_str() {
            RUNTIME_PROCESS => Some(Runtime::Process),
            RUNTIME_DOCKER => Some(Runtime::Docker),
            _ => None,
        })
        .chain([Runtime::Process])
        .collect();
    runtimes.sort();
    runtimes.dedup();
    let mut images: Vec<String> = capabilities.images.clone();
    images.sort();
    images.dedup();
    let offered = images.len();
    images.retain(|image| !image.is_empty() && image.len() <= IMAGE_REF_BYTES_MAX);
    images.truncate(NODE_IMAGES_MAX);
    let left_out = offered - images.len();
    let info = HostInfo {
        runtimes,
        images,
        cpu_millis: resources.cpu_millis,
        memory_bytes: resources.memory_bytes,
        labels: resources.labels.clone(),
        address: resources.address.clone(),
    };
    (info, left_out)
}

/// The host info now.
pub async fn current(runtime: &HostRuntime, resources: &HostResources) -> (HostInfo, usize) {
    host_info(&runtime.capabilities().await, resources)
}

/// Looks at the host every `every` and publishes its host info when it changed, until every
/// receiver is gone. `left_out` is what the first look left out (warned about then).
pub async fn keep_current(
    runtime: Arc<HostRuntime>,
    resources: HostResources,
    published: watch::Sender<HostInfo>,
    every: Duration,
    mut left_out: usize,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = runtime.recheck_wanted() => {}
            _ = published.closed() => return,
        }
        let (info, now_left_out) = current(&runtime, &resources).await;
        if now_left_out != left_out && now_left_out > 0 {
            warn_left_out(now_left_out);
        }
        left_out = now_left_out;
        published.send_if_modified(|old| {
            if *old == info {
                return false;
            }
            tracing::info!(runtimes = ?info.runtimes, images = info.images.len(),
                "the host's runtimes or images changed; the coordinators will learn it");
            *old = info;
            true
        });
    }
}

/// Warns that images were left out of the report.
pub fn warn_left_out(left_out: usize) {
    tracing::warn!(
        left_out,
        "{left_out} of the host's images are not reported (at most {NODE_IMAGES_MAX} images of at most {IMAGE_REF_BYTES_MAX} bytes are): jobs needing them are not placed here"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MemTotal reads in bytes.
    #[test]
    fn mem_total_parses() {
        let meminfo = "MemTotal:       24683792 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_683_792 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    /// Runtimes come in order with process always there; images sorted, each once, without
    /// over-long ones and at most the maximum; the result passes the coordinators' checks.
    #[test]
    fn host_info_is_what_the_coordinators_accept() {
        let mut images: Vec<String> = (0..NODE_IMAGES_MAX + 10)
            .rev()
            .map(|n| format!("img-{n:04}:1"))
            .collect();
        images.push("img-0000:1".into());
        images.push(format!("{}:1", "x".repeat(IMAGE_REF_BYTES_MAX)));
        let capabilities = NodeCapabilities {
            runtimes: vec!["docker".into(), "process".into()],
            images,
        };
        let resources = HostResources {
            cpu_millis: 8_000,
            memory_bytes: 1 << 30,
            labels: [("rack".to_string(), "r3".to_string())].into(),
            address: Some("10.0.0.7".into()),
        };
        let (info, left_out) = host_info(&capabilities, &resources);
        assert_eq!(info.runtimes, vec![Runtime::Process, Runtime::Docker]);
        assert_eq!(info.images.len(), NODE_IMAGES_MAX);
        assert_eq!(info.images[0], "img-0000:1");
        assert_eq!(left_out, 11);
        assert!(info.images.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!((info.cpu_millis, info.memory_bytes), (8_000, 1 << 30));
        assert_eq!(info.labels["rack"], "r3");
        assert_eq!(info.address.as_deref(), Some("10.0.0.7"));
        let inventory = quotient_common::NodeInventory {
            name: "gpu-1".into(),
            gpus: Vec::new(),
            host: info,
        };
        inventory.validate().unwrap();

        let (info, left_out) = host_info(&NodeCapabilities::default(), &resources);
        assert_eq!(info.runtimes, vec![Runtime::Process]);
        assert!(info.images.is_empty());
        assert_eq!(left_out, 0);
    }

    /// Detection finds some CPUs and memory; the flags replace it.
    #[test]
    fn resources_are_detected_or_given() {
        let detected = HostResources::detect(None, None);
        assert!(detected.cpu_millis >= 1 && detected.memory_bytes > 0);
        assert_eq!(
            HostResources::detect(Some(2_500), Some(1 << 30)),
            HostResources {
                cpu_millis: 2_500,
                memory_bytes: 1 << 30,
                ..HostResources::default()
            }
        );
    }

    /// The address on the route to a coordinator is a local address of this host: loopback
    /// for a coordinator on this host.
    #[test]
    fn the_advertised_address_is_on_the_route_to_the_coordinators() {
        assert_eq!(
            route_address("127.0.0.1:7401").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(route_address("not an address"), None);
    }
}
