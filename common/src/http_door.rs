//! What every HTTP door (the metrics door, the AWS Batch–compatible endpoint) does with its
//! TCP connections, so that no client, signed or not, can hold a process's file descriptors,
//! memory or tasks:
//!
//! - at most [`DoorLimits::connections_max`] connections at once, and at most
//!   [`DoorLimits::connections_per_address_max`] from one IP address (an IPv6 address counts
//!   by its /64, which one host holds whole); a connection past either is closed as soon as it
//!   is accepted, before anything of it is read;
//! - a connection waiting for a request's headers (a new one, or one idle after an answer)
//!   gets [`DoorLimits::header_read_timeout`] for them, then is closed (hyper's header
//!   timeout, which runs whenever the connection waits for a request);
//! - a busy connection lives at most [`DoorLimits::connection_age_max`], then ends after the
//!   request in flight (clients reconnect, as they do after any keep-alive close).
//!
//! A door that reads request bodies bounds their time and size itself (the AWS endpoint does).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::net::{TcpListener, TcpStream};

/// The limits of a door's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorLimits {
    pub connections_max: usize,
    pub connections_per_address_max: usize,
    pub header_read_timeout: Duration,
    pub connection_age_max: Duration,
}

/// The limits every door uses. A thousand connections hold some 25 MB and a thousand file
/// descriptors, far under a coordinator's; a client pool (botocore keeps 10 connections,
/// Prometheus one per target) needs a few. Ten seconds for headers is ten times what a
/// client across a slow WAN link needs.
pub const DOOR_LIMITS: DoorLimits = DoorLimits {
    connections_max: 1024,
    connections_per_address_max: 128,
    header_read_timeout: Duration::from_secs(10),
    connection_age_max: Duration::from_secs(600),
};

/// How long a connection past its age gets to finish the request in flight.
const AGE_GRACE: Duration = Duration::from_secs(30);

/// Why a connection was closed unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the door holds its most connections ({0}) already")]
    Full(usize),
    #[error("the door holds its most connections from one address ({0}) already")]
    AddressFull(usize),
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// Counts a door's open connections, in all and by address.
#[derive(Debug, Clone)]
pub struct Admission {
    limits: DoorLimits,
    counts: Arc<Mutex<Counts>>,
}

/// One admitted connection: counted until dropped.
#[derive(Debug)]
pub struct Admitted {
    counts: Arc<Mutex<Counts>>,
    address: IpAddr,
}

impl Admission {
    pub fn new(limits: DoorLimits) -> Admission {
        Admission {
            limits,
            counts: Arc::default(),
        }
    }

    /// Counts a connection from `address`, or says why it must be closed.
    pub fn admit(&self, address: IpAddr) -> Result<Admitted, Refused> {
        let address = crate::transport::counted_as(address);
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.total >= self.limits.connections_max {
            return Err(Refused::Full(self.limits.connections_max));
        }
        let from_address = counts.by_address.get(&address).copied().unwrap_or(0);
        if from_address >= self.limits.connections_per_address_max {
            return Err(Refused::AddressFull(
                self.limits.connections_per_address_max,
            ));
        }
        counts.by_address.insert(address, from_address + 1);
        counts.total += 1;
        Ok(Admitted {
            counts: Arc::clone(&self.counts),
            address,
        })
    }

    /// How many connections are open now.
    pub fn open(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.total = counts.total.saturating_sub(1);
        if let Some(from_address) = counts.by_address.get_mut(&self.address) {
            *from_address = from_address.saturating_sub(1);
            if *from_address == 0 {
                counts.by_address.remove(&self.address);
            }
        }
    }
}

/// Accepts connections on `listener` for ever, each admitted one served by `serve` on a task
/// of its own (holding its admission until it ends); `door` names the door in logs.
pub async fn accept_each<F, Fut>(
    listener: TcpListener,
    limits: DoorLimits,
    door: &'static str,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let admission = Admission::new(limits);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, most likely: wait rather than spin.
                tracing::warn!(door, %error, "could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admitted = match admission.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                tracing::debug!(door, %peer, %refused, "closed a connection unread");
                continue;
            }
        };
        let served = serve(stream, peer);
        tokio::spawn(async move {
            served.await;
            drop(admitted);
        });
    }
}

/// Serves HTTP/1.1 on `io` with `app`, within `limits`' header timeout and connection age.
pub async fn serve_http1<I>(io: I, app: Router, limits: DoorLimits) -> Result<(), hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => served,
        () = tokio::time::sleep(limits.connection_age_max) => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(AGE_GRACE, connection).await.unwrap_or(Ok(()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_address: usize) -> DoorLimits {
        DoorLimits {
            connections_max: total,
            connections_per_address_max: per_address,
            ..DOOR_LIMITS
        }
    }

    #[test]
    fn connections_are_counted_in_all_and_by_address_until_dropped() {
        // One host's IPv6 /64 counts as one address, an IPv4-mapped one as the IPv4 one.
        let v6 = Admission::new(limits(8, 1));
        let _first = v6.admit("2001:db8::1".parse().unwrap()).unwrap();
        assert!(v6.admit("2001:db8::ffff:2".parse().unwrap()).is_err());
        let _other = v6.admit("2001:db8:0:1::1".parse().unwrap()).unwrap();
        let _v4 = v6.admit("10.0.0.9".parse().unwrap()).unwrap();
        assert!(v6.admit("::ffff:10.0.0.9".parse().unwrap()).is_err());
        // A limit of none admits nothing and keeps no count.
        let none = Admission::new(limits(8, 0));
        assert!(none.admit("10.0.0.1".parse().unwrap()).is_err());
        assert!(none.counts.lock().unwrap().by_address.is_empty());

        let admission = Admission::new(limits(3, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let a1 = admission.admit(a).unwrap();
        let a2 = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Refused::AddressFull(2));
        let b1 = admission.admit(b).unwrap();
        assert_eq!(admission.admit(c).unwrap_err(), Refused::Full(3));
        assert_eq!(admission.open(), 3);
        drop(a1);
        let a3 = admission.admit(a).unwrap();
        drop((a2, a3, b1));
        assert_eq!(admission.open(), 0);
        assert!(admission.counts.lock().unwrap().by_address.is_empty());
    }
}
