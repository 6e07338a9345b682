//! The real [`Exchange`]: QUIC with mutual TLS (ALPN `quotient-api/1`), one cached connection
//! per coordinator address, and handshakes that go on in the background.
//!
//! Every handshake runs in a task of its own and records its result here, so a call never
//! waits for one longer than it must: [`Exchange::connect_first`] starts them all at once and
//! returns with the first to complete (a stopped coordinator early in the list costs
//! nothing), and a call that follows a redirect to a leader whose handshake has not completed
//! within the connect patience, while another coordinator is connected, gives up on it at once
//! and asks another ([`HandshakeWait::patience`]). That is what makes a failover fast: the leader
//! just killed never answers a handshake, and waiting out the whole connect deadline on it
//! would add that deadline to every command issued during the election.
//!
//! When the client's config names a cluster, every request is sent wrapped in
//! [`ApiRequest::InCluster`], so that a coordinator of another cluster refuses it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::tls::TlsIdentity;
use quotient_common::transport::{self, PeerConnection};
use quotient_common::ClusterId;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::exchange::{exchange_error, Exchange, ExchangeError, HandshakeWait};

/// QUIC with mutual TLS to the coordinators; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct QuicExchange {
    client: Arc<transport::Client>,
    /// The cluster every request is sent for, when the config names one.
    cluster: Option<ClusterId>,
    links: Arc<Mutex<Links>>,
    /// Bumped whenever a handshake ends, so that waiters look again.
    changed: watch::Sender<u64>,
}

/// The connections by address, and whether the exchange was closed.
#[derive(Debug, Default)]
struct Links {
    by_address: BTreeMap<String, Link>,
    closed: bool,
}

/// What is known of the connection to one address.
#[derive(Debug)]
enum Link {
    Open(PeerConnection),
    Connecting {
        since: Instant,
        task: tokio::task::AbortHandle,
    },
    Failed(String),
}

impl QuicExchange {
    /// An exchange presenting `identity`, sending requests for `cluster` when it is known.
    pub fn new(identity: TlsIdentity, cluster: Option<ClusterId>) -> Self {
        Self::over(Arc::new(transport::Client::new(identity)), cluster)
    }

    /// An exchange that connects with `client`, already set up (a coordinator's own, to
    /// forward requests to the leader; or another exchange's, to share its UDP socket).
    pub fn over(client: Arc<transport::Client>, cluster: Option<ClusterId>) -> Self {
        QuicExchange {
            client,
            cluster,
            links: Arc::new(Mutex::new(Links::default())),
            changed: watch::Sender::new(0),
        }
    }

    /// Another exchange with its own connections over the same QUIC client (one UDP socket
    /// and endpoint task for many clients in one process).
    pub fn sibling(&self, cluster: Option<ClusterId>) -> QuicExchange {
        QuicExchange {
            client: Arc::clone(&self.client),
            cluster,
            links: Arc::new(Mutex::new(Links::default())),
            changed: watch::Sender::new(0),
        }
    }

    /// The cluster requests are sent for.
    pub fn cluster(&self) -> Option<ClusterId> {
        self.cluster
    }

    fn lock(&self) -> MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a handshake with `address` in the background, within `deadline`, unless one is
    /// open or under way.
    fn start_connecting(&self, links: &mut Links, address: &str, deadline: Duration) {
        match links.by_address.get(address) {
            Some(Link::Open(connection)) if connection.is_open() => return,
            Some(Link::Connecting { .. }) => return,
            _ => {}
        }
        if links.closed {
            links.by_address.insert(
                address.to_string(),
                Link::Failed("the client is closed".into()),
            );
            return;
        }
        let client = Arc::clone(&self.client);
        let shared = Arc::clone(&self.links);
        let changed = self.changed.clone();
        let target = address.to_string();
        let task = tokio::spawn(async move {
            let connecting = client.connect_to(&target, transport::ALPN_API);
            let link = match tokio::time::timeout(deadline, connecting).await {
                Ok(Ok(connection)) => Link::Open(connection),
                Ok(Err(error)) => Link::Failed(error.to_string()),
                Err(_) => Link::Failed(format!("no handshake within {} ms", deadline.as_millis())),
            };
            {
                let mut links = shared.lock().unwrap_or_else(PoisonError::into_inner);
                if links.closed {
                    if let Link::Open(connection) = &link {
                        connection.close();
                    }
                    return;
                }
                links.by_address.insert(target, link);
            }
            changed.send_modify(|generation| *generation += 1);
        });
        links.by_address.insert(
            address.to_string(),
            Link::Connecting {
                since: Instant::now(),
                task: task.abort_handle(),
            },
        );
    }

    /// The open connection to `address`, made or awaited within `until` and `wait`. A
    /// handshake that failed in the background is reported once, then forgotten, so that the
    /// next try makes a new one.
    async fn connection(
        &self,
        address: &str,
        until: Instant,
        wait: HandshakeWait,
    ) -> Result<PeerConnection, ExchangeError> {
        let mut changes = self.changed.subscribe();
        loop {
            let (since, give_up_at) = {
                let mut links = self.lock();
                let others_open = links.by_address.iter().any(|(other, link)| {
                    other != address && matches!(link, Link::Open(c) if c.is_open())
                });
                match links.by_address.get(address) {
                    Some(Link::Open(connection)) if connection.is_open() => {
                        return Ok(connection.clone())
                    }
                    Some(Link::Failed(why)) => {
                        let why = why.clone();
                        links.by_address.remove(address);
                        return Err(ExchangeError::Unreachable(why));
                    }
                    Some(Link::Connecting { since, .. }) => {
                        let patience = match wait.patience {
                            Some(patience) if others_open => patience.min(wait.deadline),
                            _ => wait.deadline,
                        };
                        (*since, until.min(*since + patience))
                    }
                    Some(Link::Open(_)) | None => {
                        self.start_connecting(&mut links, address, wait.deadline);
                        continue;
                    }
                }
            };
            if tokio::time::timeout_at(give_up_at, changes.changed())
                .await
                .is_err()
            {
                return Err(ExchangeError::Unreachable(format!(
                    "no handshake within {} ms",
                    give_up_at.saturating_duration_since(since).as_millis()
                )));
            }
        }
    }

    /// Forgets the connection to `address` if it is `connection` (another may have replaced
    /// it since).
    fn forget(&self, address: &str, connection: &PeerConnection) {
        let mut links = self.lock();
        if let Some(Link::Open(known)) = links.by_address.get(address) {
            if known.is_same(connection) {
                links.by_address.remove(address);
            }
        }
    }
}

impl Exchange for QuicExchange {
    async fn connect_first(
        &self,
        addresses: &[String],
        deadline: Duration,
    ) -> Result<String, BTreeMap<String, String>> {
        let until = Instant::now() + deadline;
        let mut changes = self.changed.subscribe();
        {
            let mut links = self.lock();
            for address in addresses {
                if matches!(links.by_address.get(address), Some(Link::Failed(_))) {
                    links.by_address.remove(address);
                }
                self.start_connecting(&mut links, address, deadline);
            }
        }
        loop {
            let mut errors = BTreeMap::new();
            {
                let links = self.lock();
                for address in addresses {
                    match links.by_address.get(address) {
                        Some(Link::Open(connection)) if connection.is_open() => {
                            return Ok(address.clone())
                        }
                        Some(Link::Failed(why)) => {
                            errors.insert(address.clone(), why.clone());
                        }
                        _ => {}
                    }
                }
            }
            if errors.len() == addresses.len() {
                return Err(errors);
            }
            if tokio::time::timeout_at(until, changes.changed())
                .await
                .is_err()
            {
                for address in addresses {
                    errors.entry(address.clone()).or_insert_with(|| {
                        format!("no handshake within {} ms", deadline.as_millis())
                    });
                }
                return Err(errors);
            }
        }
    }

    fn has_open_connection(&self) -> bool {
        self.lock()
            .by_address
            .values()
            .any(|link| matches!(link, Link::Open(connection) if connection.is_open()))
    }

    async fn exchange(
        &self,
        address: &str,
        request: &ApiRequest,
        deadline: Duration,
        wait: HandshakeWait,
    ) -> Result<ApiResponse, ExchangeError> {
        let until = Instant::now() + deadline;
        let connection = self.connection(address, until, wait).await?;
        let in_cluster = self.cluster.map(|cluster| ApiRequest::InCluster {
            cluster,
            request: Box::new(request.clone()),
        });
        let sent = in_cluster.as_ref().unwrap_or(request);
        let within = until.saturating_duration_since(Instant::now());
        match connection.request::<_, ApiResponse>(sent, within).await {
            Ok(response) => Ok(response),
            Err(error) => {
                let error = exchange_error(address, request, error);
                if matches!(error, ExchangeError::Lost(_)) {
                    self.forget(address, &connection);
                }
                Err(error)
            }
        }
    }

    fn close(&self) {
        let mut links = self.lock();
        links.closed = true;
        for link in std::mem::take(&mut links.by_address).into_values() {
            match link {
                Link::Open(connection) => connection.close(),
                Link::Connecting { task, .. } => task.abort(),
                Link::Failed(_) => {}
            }
        }
    }
}

impl Drop for QuicExchange {
    /// Stops the handshakes still under way: nothing will use them.
    fn drop(&mut self) {
        for link in self.lock().by_address.values() {
            if let Link::Connecting { task, .. } = link {
                task.abort();
            }
        }
    }
}
