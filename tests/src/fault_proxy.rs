//! Network faults between Quotient's processes on loopback, without root: every coordinator
//! is advertised to the others (or an agent's leader to the agent) at a UDP relay ("its
//! proxy") that forwards datagrams to the port it really listens on, and a test can make the
//! relays drop, or hold back, traffic.
//!
//! A coordinator dials its peers from its own client socket, whose port the kernel picks, so
//! cutting coordinator N off takes two things: N's proxy drops everything (nobody reaches N),
//! and every other proxy drops the datagrams that come from N's sockets (N reaches nobody).
//! N's sockets are read from `/proc` ([`udp_ports_of`]), so this works on Linux only, as the
//! rest of these tests do.
//!
//! [`FaultProxy::deafen_ports`] makes a one-way fault instead: what N sends still arrives, but
//! nothing reaches N.
//!
//! Test clients talk to the coordinators' real addresses and so are never cut off: a test can
//! still ask the coordinator on the wrong side of a partition what it does.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// Larger than any datagram quinn sends.
const DATAGRAM_BYTES_MAX: usize = 65_536;

/// What a proxy lets through.
#[derive(Debug, Default)]
struct Rules {
    /// Drop every datagram, both ways.
    drop_all: bool,
    /// Drop every datagram of a flow whose sender (on loopback) has one of these ports.
    blocked_ports: BTreeSet<u16>,
    /// Pass on what a sender with one of these ports sends, but drop the answers to it.
    deaf_ports: BTreeSet<u16>,
    /// Drop this share of the datagrams it would pass, either way, chosen at random.
    loss_percent: u32,
    /// The state of the generator that picks the datagrams lost (xorshift64).
    random: u64,
    /// How long each datagram it passes is held first, either way.
    delay: std::time::Duration,
}

impl Rules {
    /// Whether a datagram from `sender` is dropped.
    fn drops_from(&mut self, sender: SocketAddr) -> bool {
        self.drop_all || self.blocked_ports.contains(&sender.port()) || self.loses_one()
    }

    /// Whether an answer to `sender` is dropped.
    fn drops_to(&mut self, sender: SocketAddr) -> bool {
        self.drops_from(sender) || self.deaf_ports.contains(&sender.port())
    }

    fn loses_one(&mut self) -> bool {
        if self.loss_percent == 0 {
            return false;
        }
        self.random ^= self.random << 13;
        self.random ^= self.random >> 7;
        self.random ^= self.random << 17;
        self.random % 100 < u64::from(self.loss_percent)
    }
}

/// One UDP relay in front of one coordinator; stops relaying when dropped.
pub struct FaultProxy {
    address: SocketAddr,
    rules: Arc<Mutex<Rules>>,
    relay: JoinHandle<()>,
}

impl FaultProxy {
    /// A relay on a free loopback port that forwards every datagram to `target` and the
    /// answers back. Call it inside a tokio runtime.
    pub async fn start(target: SocketAddr) -> FaultProxy {
        let front = Arc::new(
            UdpSocket::bind("127.0.0.1:0")
                .await
                .expect("a loopback UDP port for the proxy"),
        );
        let address = front.local_addr().expect("the proxy's address");
        let rules = Arc::new(Mutex::new(Rules::default()));
        let relay = tokio::spawn(relay(front, target, Arc::clone(&rules)));
        FaultProxy {
            address,
            rules,
            relay,
        }
    }

    /// Where the coordinator behind it is advertised.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Drops everything from now on.
    pub fn drop_all(&self) {
        self.rules().drop_all = true;
    }

    /// Drops every flow whose sender has one of `ports`.
    pub fn block_ports(&self, ports: &BTreeSet<u16>) {
        self.rules().blocked_ports.extend(ports);
    }

    /// Passes on what senders with one of `ports` send, but drops the answers to them.
    pub fn deafen_ports(&self, ports: &BTreeSet<u16>) {
        self.rules().deaf_ports.extend(ports);
    }

    /// Loses `percent` of the datagrams, chosen at random (the same choices for the same
    /// `seed` and traffic).
    pub fn lose(&self, percent: u32, seed: u64) {
        let mut rules = self.rules();
        rules.loss_percent = percent.min(100);
        rules.random = seed | 1;
    }

    /// Holds every datagram `delay` before passing it on, either way: a round trip through
    /// it takes twice that longer.
    pub fn delay(&self, delay: std::time::Duration) {
        self.rules().delay = delay;
    }

    /// Lets everything through again.
    pub fn heal(&self) {
        *self.rules() = Rules::default();
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        lock(&self.rules)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.relay.abort();
    }
}

fn lock(rules: &Mutex<Rules>) -> std::sync::MutexGuard<'_, Rules> {
    rules.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Relays datagrams from senders to `target` through one upstream socket per sender, so that
/// `target`'s answers on that socket go back to that sender.
async fn relay(front: Arc<UdpSocket>, target: SocketAddr, rules: Arc<Mutex<Rules>>) {
    let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut answer_tasks = Vec::new();
    let mut buffer = vec![0u8; DATAGRAM_BYTES_MAX];
    while let Ok((length, sender)) = front.recv_from(&mut buffer).await {
        if lock(&rules).drops_from(sender) {
            continue;
        }
        let upstream = match upstreams.get(&sender) {
            Some(upstream) => Arc::clone(upstream),
            None => {
                let Ok(socket) = UdpSocket::bind("127.0.0.1:0").await else {
                    continue;
                };
                if socket.connect(target).await.is_err() {
                    continue;
                }
                let socket = Arc::new(socket);
                answer_tasks.push(AbortOnDrop(tokio::spawn(answers(
                    Arc::clone(&socket),
                    Arc::clone(&front),
                    sender,
                    Arc::clone(&rules),
                ))));
                upstreams.insert(sender, Arc::clone(&socket));
                socket
            }
        };
        // A full socket buffer loses the datagram, as a network would.
        let delay = lock(&rules).delay;
        if delay.is_zero() {
            let _ = upstream.send(&buffer[..length]).await;
        } else {
            let datagram = buffer[..length].to_vec();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = upstream.send(&datagram).await;
            });
        }
    }
}

/// Carries `target`'s answers on `upstream` back to `sender`.
async fn answers(
    upstream: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    sender: SocketAddr,
    rules: Arc<Mutex<Rules>>,
) {
    let mut buffer = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        // An ICMP "port unreachable" from a stopped coordinator is an error to skip, not an end.
        let Ok(length) = upstream.recv(&mut buffer).await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        if lock(&rules).drops_to(sender) {
            continue;
        }
        let delay = lock(&rules).delay;
        if delay.is_zero() {
            let _ = front.send_to(&buffer[..length], sender).await;
        } else {
            let (front, datagram) = (Arc::clone(&front), buffer[..length].to_vec());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = front.send_to(&datagram, sender).await;
            });
        }
    }
}

/// Aborts its task when dropped, so a relay takes its answer tasks with it.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The local ports of the UDP sockets that process `pid` holds, from `/proc/PID/fd` and
/// `/proc/net/udp{,6}`.
pub fn udp_ports_of(pid: u32) -> BTreeSet<u16> {
    let inodes: BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the coordinator's /proc/PID/fd (Linux only)")
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter_map(|link| {
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...`
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(inode)) = (fields.get(1), fields.get(9)) else {
                continue;
            };
            let Ok(inode) = inode.parse::<u64>() else {
                continue;
            };
            if !inodes.contains(&inode) {
                continue;
            }
            if let Some(port) = local
                .rsplit_once(':')
                .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
            {
                ports.insert(port);
            }
        }
    }
    ports
}
