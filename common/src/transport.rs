//! QUIC endpoints with mutual TLS, and the one-stream-per-request pattern on top of them.
//!
//! Every Quotient connection is QUIC (quinn) over TLS 1.3 with certificates on both sides, both
//! signed by the cluster CA ([`crate::tls`]). The ALPN protocol says what a connection is for
//! ([`ALPN_API`], [`ALPN_RAFT`], [`ALPN_AGENT`]); one [`Server`] may accept several. After the
//! handshake each side reads the other's [`PeerIdentity`] from its certificate, and the
//! [`PeerConnection`] carries it with the negotiated ALPN, so authorisation is a plain check on
//! data ([`PeerConnection::require_role`]).
//!
//! A request is one bidirectional stream: the client writes one frame ([`crate::frame`]) and
//! finishes its side, the server answers with one frame and finishes its side. One stream per
//! request rather than a long-lived multiplexed stream means no request waits behind another
//! and a bad frame costs only its stream: the server resets that stream with a
//! `STREAM_CODE_*` and keeps serving. Every step has a deadline.
//!
//! Each frame carries the version of its protocol's encoding. The server answers in the
//! version the request came in; a request in a version it does not read is answered with a
//! refusal frame naming the versions it does, and the client reports
//! [`RequestError::Version`], which says which side to upgrade. A build from before frames
//! carried a version is told apart both ways: its requests are refused with
//! [`STREAM_CODE_UNSUPPORTED_VERSION`], and its refusal of ours as too large (it takes our
//! header for a length) is reported as its version.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use quinn;
use quinn::crypto::rustls::{HandshakeData, QuicClientConfig, QuicServerConfig};
use quinn::{ConnectionError, IdleTimeout, RecvStream, SendStream, TransportConfig, VarInt};
pub use rustls;
use rustls::pki_types::CertificateDer;

use crate::certs::{IdentityError, PeerIdentity, Role};
use crate::frame::{self, FrameError, WireMessage, MAX_FRAME_BYTES};
use crate::tls::{TlsError, TlsIdentity};
use crate::version::{VersionError, Writer};

/// ALPN of the client API (the `quotient` CLI and forwarding to the leader).
pub const ALPN_API: &[u8] = b"quotient-api/1";
/// ALPN of Raft traffic between coordinators.
pub const ALPN_RAFT: &[u8] = b"quotient-raft/1";
/// ALPN of the leader's connection to an agent.
pub const ALPN_AGENT: &[u8] = b"quotient-agent/1";

/// A connection with no traffic for this long is dropped (milliseconds).
pub const IDLE_TIMEOUT_MS: u32 = 30_000;
/// Keep-alive interval, well under [`IDLE_TIMEOUT_MS`] so that quiet but healthy
/// connections (an agent waiting for desired state) survive.
pub const KEEP_ALIVE_INTERVAL_MS: u64 = 10_000;
/// Most requests one peer may have in flight on one connection; further `open_bi` calls
/// wait (within their deadline) until one ends.
pub const MAX_CONCURRENT_BIDI_STREAMS: u32 = 256;
/// Unidirectional streams are not used; the peer may open none.
pub const MAX_CONCURRENT_UNI_STREAMS: u32 = 0;
/// Most connection attempts a server holds before its accept loop takes them; beyond this
/// quinn refuses new ones, bounding the memory a connection flood costs.
pub const MAX_INCOMING_CONNECTIONS: usize = 1024;
/// The UDP receive and send buffers each endpoint asks for (bytes). A leader answering
/// hundreds of clients gets their requests in bursts: with Linux's default 208 KiB the
/// bench's 256 clients lost about 400 datagrams a second to full buffers, each one a QUIC
/// retransmission after a probe timeout, that is a request tens of milliseconds late. The
/// kernel caps what it grants at `net.core.rmem_max` and `net.core.wmem_max`
/// (deploy/README.md says how to raise them); a server logs when it got less.
pub const UDP_BUFFER_BYTES: usize = 4 * 1024 * 1024;
/// Most handshakes a server works on at once. Beyond it a new connection attempt is refused
/// at once (QUIC's CONNECTION_REFUSED, which costs the server no cryptography), and the
/// client tries again after its backoff. A fleet that reconnects all at once (after an
/// outage, or on a host too slow for it) otherwise starts more handshakes than the server
/// can finish before the clients' deadlines: each one abandoned half done was CPU spent for
/// nothing, and the clients come back for more, so none finishes (BENCHMARKS.md, the fleet).
/// A handshake takes the server about a millisecond of CPU, so this many are a fraction of
/// a second of work, far inside any client's deadline.
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = 128;
/// Most handshakes a server works on at once for one address ([`counted_as`]), so that one
/// host that starts handshakes and never finishes them cannot hold all
/// [`HANDSHAKES_IN_FLIGHT_MAX`] (found by probing the wire). Loopback is not counted: a
/// process on the server's own host, such as a whole test fleet, is trusted with more.
pub const HANDSHAKES_PER_ADDRESS_MAX: usize = 16;
/// Once `1 / RETRY_IN_HAND_DIVISOR` of the handshakes a server takes are under way, a
/// connection attempt from an address QUIC has not validated is first sent a Retry, which it
/// answers only from the address it claims: a sender of spoofed packets then holds no
/// handshake at all. Below it, connections take no extra round trip.
pub const RETRY_IN_HAND_DIVISOR: usize = 4;
/// Deadline of a client's connect, handshake included (milliseconds).
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Deadline of the server side of a handshake (milliseconds).
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Default deadline for a server to read a request once its stream is open (milliseconds).
pub const REQUEST_READ_TIMEOUT_MS: u64 = 10_000;
/// Default deadline for a server to hand a response to QUIC (milliseconds).
pub const RESPONSE_WRITE_TIMEOUT_MS: u64 = 10_000;

/// Stream reset code: the request frame was larger than [`MAX_FRAME_BYTES`].
pub const STREAM_CODE_FRAME_TOO_LARGE: u32 = 1;
/// Stream reset code: the request frame was truncated or undecodable.
pub const STREAM_CODE_BAD_FRAME: u32 = 2;
/// Stream reset code: the request did not arrive within the server's deadline.
pub const STREAM_CODE_TIMEOUT: u32 = 3;
/// Stream reset code: the server refused the request (used by callers, e.g. not authorised).
pub const STREAM_CODE_REFUSED: u32 = 4;
/// Stream reset code: the request frame carried no version (a build from before frames did),
/// so no refusal frame it could read can say which versions the server reads.
pub const STREAM_CODE_UNSUPPORTED_VERSION: u32 = 5;

/// Connection close code: an orderly shutdown.
pub const CLOSE_CODE_SHUTDOWN: u32 = 0;
/// Connection close code: the peer's certificate names no valid Quotient identity.
pub const CLOSE_CODE_BAD_IDENTITY: u32 = 1;
/// Connection close code: the peer's role may not use this ALPN.
pub const CLOSE_CODE_UNAUTHORISED: u32 = 2;
/// Connection close code: the peer's certificate has expired, or is not valid yet.
pub const CLOSE_CODE_CERTIFICATE_NOT_VALID: u32 = 3;
/// The most bytes of a reason sent with a connection's close (it must fit one packet).
pub const CLOSE_REASON_BYTES_MAX: usize = 512;

/// Why a connection could not be made, accepted or kept.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("QUIC configuration failed: {0}")]
    Config(String),
    #[error("cannot bind {address}: {source}; is another process using the port?")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot resolve {target:?}: {reason}; use HOST:PORT, e.g. 127.0.0.1:7401")]
    Resolve { target: String, reason: String },
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: SocketAddr,
        #[source]
        source: quinn::ConnectError,
    },
    #[error("handshake with {address} failed: {source}{hint}", hint = handshake_hint(source))]
    Handshake {
        address: SocketAddr,
        #[source]
        source: ConnectionError,
    },
    #[error("handshake with {address} timed out after {after_ms} ms; is the peer running and reachable?")]
    HandshakeTimeout { address: SocketAddr, after_ms: u64 },
    #[error("peer {address} presented no usable certificate: {reason}")]
    NoPeerCertificate { address: SocketAddr, reason: String },
    #[error("peer {address}: {source}")]
    PeerIdentity {
        address: SocketAddr,
        #[source]
        source: IdentityError,
    },
    /// The peer's certificate is outside its validity now: on a connection resumed from an
    /// earlier session (which TLS does not check again), or one that outlived it.
    #[error("peer {address} ({peer}): its certificate {problem}")]
    CertificateNotValid {
        address: SocketAddr,
        peer: PeerIdentity,
        problem: String,
    },
    #[error("peer {peer} may not use {alpn}: only {allowed} may")]
    Unauthorised {
        peer: PeerIdentity,
        alpn: String,
        allowed: String,
    },
    #[error("connection lost: {0}")]
    ConnectionLost(#[source] ConnectionError),
    #[error("cannot read the local address: {0}")]
    LocalAddress(#[source] std::io::Error),
}

/// What a handshake refused for the server's load says (the server is up, and busy).
pub const HANDSHAKE_BUSY_HINT: &str =
    "; the server is busy with other handshakes and refused this one: try again in a moment";

/// What to check after a failed handshake. A peer that closed the connection itself gave up
/// on it (its own deadline, or it is shutting down): no certificate problem, whatever else
/// went wrong.
fn handshake_hint(error: &ConnectionError) -> &'static str {
    const GAVE_UP: &str =
        "; the peer gave up on the connection (its own deadline ran out, or it is shutting down)";
    match error {
        // An application that closes during the handshake must say so with the transport
        // code APPLICATION_ERROR (RFC 9000, 10.2.3), as it has no 1-RTT keys yet.
        ConnectionError::ApplicationClosed(_) => GAVE_UP,
        ConnectionError::ConnectionClosed(close)
            if close.error_code == quinn::TransportErrorCode::APPLICATION_ERROR =>
        {
            GAVE_UP
        }
        ConnectionError::ConnectionClosed(close)
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
        {
            HANDSHAKE_BUSY_HINT
        }
        ConnectionError::TimedOut => "; is the peer running and reachable?",
        ConnectionError::LocallyClosed => "",
        other => {
            // rustls names the reason in its alert's text (found by probing: an expired
            // certificate was blamed on the CA).
            let text = other.to_string().to_ascii_lowercase();
            if text.contains("expired") {
                "; a certificate has expired: renew it (see \"Certificate expiry\" in the operations guide)"
            } else if text.contains("not valid yet") || text.contains("notvalidyet") {
                "; a certificate is not valid yet: check both hosts' clocks"
            } else {
                "; check that both sides have certificates from the same cluster CA"
            }
        }
    }
}

/// Why one request failed. The connection may still be good for others.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The deadline passed; the request may or may not have been carried out.
    #[error("no answer within {} ms", after.as_millis())]
    Timeout { after: Duration },
    /// A frame could not be written or read (too large, truncated, undecodable): on the
    /// server, the request's; on the client, the request's before it was sent ([`request`]
    /// reports the answer's as [`RequestError::Answer`]).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The peer reset the stream with a `STREAM_CODE_*`.
    #[error("the peer refused the request: {}", describe_stream_code(*code))]
    Refused { code: u64 },
    /// The connection is gone; retry on a new one.
    #[error("connection lost: {0}")]
    ConnectionLost(#[source] ConnectionError),
    /// The stream was already closed locally (a programming error of the caller).
    #[error("the stream is already closed")]
    StreamClosed,
    /// The request was sent, but the answer's frame could not be read: over the limit, cut
    /// short (the peer finished the stream without a whole frame: it could not send one), or
    /// undecodable. Apart from [`RequestError::Frame`], which is about the request, so that a
    /// caller can say which side was at fault.
    #[error("the answer could not be read: {0}")]
    Answer(#[source] FrameError),
    /// The two sides speak no common version of the protocol: the server refused the
    /// request's version (it was not carried out), or answered in one this side does not
    /// read. The error names both and which side to upgrade; another peer may speak it.
    #[error(transparent)]
    Version(VersionError),
}

fn describe_stream_code(code: u64) -> String {
    let what = match u32::try_from(code) {
        Ok(STREAM_CODE_FRAME_TOO_LARGE) => "the request frame is over the size limit",
        Ok(STREAM_CODE_BAD_FRAME) => "the request frame is truncated or undecodable",
        Ok(STREAM_CODE_TIMEOUT) => "the request did not arrive in time",
        Ok(STREAM_CODE_REFUSED) => "refused",
        Ok(STREAM_CODE_UNSUPPORTED_VERSION) => {
            "the request frame carries no version this peer reads"
        }
        _ => "unknown reason",
    };
    format!("{what} (code {code})")
}

/// Sorts an I/O error from a quinn stream into what the caller should do about it.
fn classify(error: FrameError) -> RequestError {
    let FrameError::Io(io_error) = &error else {
        return RequestError::Frame(error);
    };
    let inner = io_error.get_ref();
    if let Some(read_error) = inner.and_then(|e| e.downcast_ref::<quinn::ReadError>()) {
        return match read_error {
            quinn::ReadError::Reset(code) => RequestError::Refused {
                code: code.into_inner(),
            },
            quinn::ReadError::ConnectionLost(lost) => RequestError::ConnectionLost(lost.clone()),
            _ => RequestError::Frame(error),
        };
    }
    if let Some(write_error) = inner.and_then(|e| e.downcast_ref::<quinn::WriteError>()) {
        return match write_error {
            quinn::WriteError::Stopped(code) => RequestError::Refused {
                code: code.into_inner(),
            },
            quinn::WriteError::ConnectionLost(lost) => RequestError::ConnectionLost(lost.clone()),
            _ => RequestError::Frame(error),
        };
    }
    RequestError::Frame(error)
}

/// The QUIC transport limits every Quotient endpoint uses.
pub fn transport_config() -> TransportConfig {
    let mut config = TransportConfig::default();
    config.max_idle_timeout(Some(IdleTimeout::from(VarInt::from_u32(IDLE_TIMEOUT_MS))));
    config.keep_alive_interval(Some(Duration::from_millis(KEEP_ALIVE_INTERVAL_MS)));
    config.max_concurrent_bidi_streams(VarInt::from_u32(MAX_CONCURRENT_BIDI_STREAMS));
    config.max_concurrent_uni_streams(VarInt::from_u32(MAX_CONCURRENT_UNI_STREAMS));
    config
}

/// A listening QUIC endpoint that requires client certificates, working on at most
/// [`HANDSHAKES_IN_FLIGHT_MAX`] handshakes at once (see [`Server::accept`]).
#[derive(Debug)]
pub struct Server {
    endpoint: quinn::Endpoint,
    handshakes: Arc<tokio::sync::Semaphore>,
    /// The most handshakes at once ([`HANDSHAKES_IN_FLIGHT_MAX`], or as set).
    handshakes_max: usize,
    /// Handshakes under way by address ([`HANDSHAKES_PER_ADDRESS_MAX`]).
    by_address: Arc<Mutex<std::collections::HashMap<IpAddr, usize>>>,
    refused: Arc<AtomicU64>,
}

/// The address a connection from `address` counts under: an IPv4 address (mapped into IPv6
/// or not) as itself, an IPv6 address by its /64, since one host is given a whole /64.
pub fn counted_as(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !((1u128 << 64) - 1))),
        },
    }
}

/// One handshake of an address under way; leaves its count when dropped.
#[derive(Debug)]
struct AddressSlot {
    counts: Arc<Mutex<std::collections::HashMap<IpAddr, usize>>>,
    address: IpAddr,
}

impl AddressSlot {
    /// A slot for `address`, unless it has [`HANDSHAKES_PER_ADDRESS_MAX`] already; loopback
    /// always gets one, uncounted.
    fn take(
        counts: &Arc<Mutex<std::collections::HashMap<IpAddr, usize>>>,
        address: IpAddr,
    ) -> Option<Option<AddressSlot>> {
        let address = counted_as(address);
        if address.is_loopback() {
            return Some(None);
        }
        let mut map = counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = map.entry(address).or_insert(0);
        if *count >= HANDSHAKES_PER_ADDRESS_MAX {
            return None;
        }
        *count += 1;
        Some(Some(AddressSlot {
            counts: counts.clone(),
            address,
        }))
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut map = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = map.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.address);
            }
        }
    }
}

/// A server's endpoint config: its stateless reset key and the key that its connection ids
/// are made and checked with both derived from its TLS identity
/// ([`TlsIdentity::derived_secret`]), so that they are the same after a restart. A
/// coordinator restarted on its address then answers a packet of a connection its previous
/// run held with a reset the peer can check, and the peer drops that connection at once
/// instead of waiting out the idle timeout with requests in flight (found timing a write
/// through a restart of every coordinator: 25-30 s). With quinn's defaults, both keys were
/// new in each run: the new run dropped such packets as not its connection ids, and a reset
/// from it would not have matched the token the peer held.
fn server_endpoint_config(tls: &TlsIdentity) -> quinn::EndpointConfig {
    let reset = tls.derived_secret(b"QUIC stateless reset");
    let mut config = quinn::EndpointConfig::new(Arc::new(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        &reset,
    )));
    let cid = tls.derived_secret(b"QUIC connection ids");
    let cid_key = u64::from_le_bytes(cid[..8].try_into().expect("8 of 32 bytes"));
    config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    config
}

/// A quinn endpoint on a UDP socket bound to `address`, with buffers of [`UDP_BUFFER_BYTES`]
/// or as much of that as the kernel grants; a server when `server` is given. A client's IPv6
/// socket is made dual-stack, as quinn's own client endpoint does; a server's is left as bound.
/// A server's `config` holds its stateless reset and connection-id keys ([`server_endpoint_config`]).
fn bind_endpoint(
    address: SocketAddr,
    server: Option<quinn::ServerConfig>,
    config: quinn::EndpointConfig,
) -> std::io::Result<quinn::Endpoint> {
    let socket = udp_socket(address, server.is_none())?;
    quinn::Endpoint::new(config, server, socket, Arc::new(quinn::TokioRuntime))
}

/// A client endpoint on a UDP socket of its own bound to `address` (port 0 picks one), for
/// [`Client::on_endpoint`]. Must run inside a tokio runtime.
pub fn client_endpoint(address: SocketAddr) -> Result<quinn::Endpoint, TransportError> {
    bind_endpoint(address, None, quinn::EndpointConfig::default())
        .map_err(|source| TransportError::Bind { address, source })
}

/// The socket of [`bind_endpoint`].
fn udp_socket(address: SocketAddr, client: bool) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    if client && address.is_ipv6() {
        if let Err(error) = socket.set_only_v6(false) {
            tracing::debug!(%error, "cannot make the socket dual-stack");
        }
    }
    // Asking for more than the kernel allows is not an error: it grants its maximum.
    let _ = socket.set_recv_buffer_size(UDP_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(UDP_BUFFER_BYTES);
    let granted = socket.recv_buffer_size().unwrap_or(0);
    // Linux reports twice what it granted (room for its bookkeeping), so a full grant reads
    // as at least the size asked for.
    if granted < UDP_BUFFER_BYTES {
        let message = "the UDP receive buffer is smaller than asked; under load datagrams may be dropped: raise net.core.rmem_max and net.core.wmem_max (deploy/README.md)";
        if client {
            tracing::debug!(granted, asked = UDP_BUFFER_BYTES, "{message}");
        } else {
            tracing::info!(granted, asked = UDP_BUFFER_BYTES, "{message}");
        }
    }
    socket.bind(&address.into())?;
    Ok(socket.into())
}

impl Server {
    /// Binds `address` (port 0 picks one) and accepts the given ALPN protocols. Must run
    /// inside a tokio runtime.
    pub fn bind(
        address: SocketAddr,
        tls: &TlsIdentity,
        alpn_protocols: &[&[u8]],
    ) -> Result<Self, TransportError> {
        let tls_config = tls.server_config(alpn_protocols)?;
        let crypto = QuicServerConfig::try_from(tls_config)
            .map_err(|error| TransportError::Config(error.to_string()))?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(Arc::new(transport_config()));
        config.max_incoming(MAX_INCOMING_CONNECTIONS);
        let endpoint = bind_endpoint(address, Some(config), server_endpoint_config(tls))
            .map_err(|source| TransportError::Bind { address, source })?;
        Ok(Server {
            endpoint,
            handshakes: Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_IN_FLIGHT_MAX)),
            handshakes_max: HANDSHAKES_IN_FLIGHT_MAX,
            by_address: Arc::default(),
            refused: Arc::default(),
        })
    }

    /// Works on at most `max` handshakes at once instead of [`HANDSHAKES_IN_FLIGHT_MAX`].
    pub fn with_handshakes_in_flight_max(mut self, max: usize) -> Self {
        self.handshakes = Arc::new(tokio::sync::Semaphore::new(max));
        self.handshakes_max = max;
        self
    }

    /// Counts its refusals (see [`Server::handshakes_refused`]) in `refused`, which a
    /// metrics registry can read.
    pub fn counting_refusals_in(mut self, refused: Arc<AtomicU64>) -> Self {
        self.refused = refused;
        self
    }

    /// Connection attempts refused so far because [`HANDSHAKES_IN_FLIGHT_MAX`] handshakes
    /// were under way.
    pub fn handshakes_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The address actually bound (useful after binding port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        self.endpoint
            .local_addr()
            .map_err(TransportError::LocalAddress)
    }

    /// Waits for the next connection attempt; `None` once the server is closed. Complete the
    /// handshake with [`Incoming::handshake`] in a task of its own, so that one slow client
    /// does not hold up the others. An attempt that arrives while [`HANDSHAKES_IN_FLIGHT_MAX`]
    /// others are in hand (returned and not yet through their handshake) is refused here,
    /// before any cryptography, and counted in [`Server::handshakes_refused`]; so is one from
    /// an address with [`HANDSHAKES_PER_ADDRESS_MAX`] in hand. Once a quarter of the
    /// handshakes are in hand, an attempt from an address QUIC has not validated is sent a
    /// Retry first.
    pub async fn accept(&self) -> Option<Incoming> {
        loop {
            let incoming = self.endpoint.accept().await?;
            let in_hand = self.handshakes_max - self.handshakes.available_permits();
            if in_hand >= self.handshakes_max / RETRY_IN_HAND_DIVISOR
                && !incoming.remote_address_validated()
                && incoming.may_retry()
            {
                // Costs one stateless packet; the client comes back with a token that proves
                // its address.
                let _ = incoming.retry();
                continue;
            }
            let Some(slot) = AddressSlot::take(&self.by_address, incoming.remote_address().ip())
            else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                incoming.refuse();
                continue;
            };
            match self.handshakes.clone().try_acquire_owned() {
                Ok(permit) => {
                    return Some(Incoming {
                        incoming,
                        _permit: permit,
                        _slot: slot,
                    })
                }
                Err(_) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    incoming.refuse();
                }
            }
        }
    }

    /// Closes every connection and stops accepting.
    pub fn close(&self) {
        self.endpoint
            .close(VarInt::from_u32(CLOSE_CODE_SHUTDOWN), b"shutdown");
    }

    /// Waits until every connection has been closed cleanly (after [`Server::close`]).
    pub async fn wait_idle(&self) {
        self.endpoint.wait_idle().await;
    }
}

/// A connection attempt that has reached a [`Server`] but not yet done its handshake. It
/// holds one of the server's handshakes in flight until it is dropped or its handshake ends.
#[derive(Debug)]
pub struct Incoming {
    incoming: quinn::Incoming,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _slot: Option<AddressSlot>,
}

impl Incoming {
    /// Where the attempt comes from.
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming.remote_address()
    }

    /// Completes the handshake (the client's certificate is verified against the CA) and reads
    /// the client's identity, within [`HANDSHAKE_TIMEOUT_MS`].
    pub async fn handshake(self) -> Result<PeerConnection, TransportError> {
        let address = self.incoming.remote_address();
        let handshake = |source| TransportError::Handshake { address, source };
        let connecting = self.incoming.accept().map_err(handshake)?;
        let connection =
            tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), connecting)
                .await
                .map_err(|_| TransportError::HandshakeTimeout {
                    address,
                    after_ms: HANDSHAKE_TIMEOUT_MS,
                })?
                .map_err(handshake)?;
        PeerConnection::from_established(connection)
    }
}

/// The client side: opens connections to servers, presenting this process's certificate.
///
/// Binds one UDP socket per address family, on first use: `0.0.0.0:0` for IPv4 servers and
/// `[::]:0` for IPv6 ones (a dual-stack socket is not portable).
#[derive(Debug)]
pub struct Client {
    tls: TlsIdentity,
    transport: Arc<TransportConfig>,
    endpoints: Mutex<ClientEndpoints>,
}

#[derive(Debug, Default)]
struct ClientEndpoints {
    ipv4: Option<quinn::Endpoint>,
    ipv6: Option<quinn::Endpoint>,
    /// One quinn client config per ALPN, so TLS session tickets are reused.
    configs: BTreeMap<Vec<u8>, quinn::ClientConfig>,
}

impl Client {
    /// A client that presents `tls`. Binds nothing until the first connect.
    pub fn new(tls: TlsIdentity) -> Self {
        Client {
            tls,
            transport: Arc::new(transport_config()),
            endpoints: Mutex::new(ClientEndpoints::default()),
        }
    }

    /// A client that presents `tls` and connects through `endpoint`, a client endpoint
    /// shared with other clients ([`client_endpoint`]): many identities on one UDP socket, as
    /// a load generator simulating thousands of agents needs. [`Client::close`] closes the
    /// shared endpoint too; close the connections instead.
    pub fn on_endpoint(tls: TlsIdentity, endpoint: quinn::Endpoint) -> Self {
        let ipv6 = endpoint.local_addr().is_ok_and(|address| address.is_ipv6());
        let endpoints = if ipv6 {
            ClientEndpoints {
                ipv6: Some(endpoint),
                ..ClientEndpoints::default()
            }
        } else {
            ClientEndpoints {
                ipv4: Some(endpoint),
                ..ClientEndpoints::default()
            }
        };
        Client {
            tls,
            transport: Arc::new(transport_config()),
            endpoints: Mutex::new(endpoints),
        }
    }

    /// Who this client is.
    pub fn identity(&self) -> &PeerIdentity {
        self.tls.identity()
    }

    /// Connects to `address` speaking `alpn`, and verifies the server's certificate against
    /// the CA and `server_name` (a DNS name or IP address in its SANs), within
    /// [`CONNECT_TIMEOUT_MS`].
    pub async fn connect(
        &self,
        address: SocketAddr,
        server_name: &str,
        alpn: &[u8],
    ) -> Result<PeerConnection, TransportError> {
        let (endpoint, config) = self.endpoint_and_config(address, alpn)?;
        let connecting = endpoint
            .connect_with(config, address, server_name)
            .map_err(|source| TransportError::Connect { address, source })?;
        let connection =
            tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), connecting)
                .await
                .map_err(|_| TransportError::HandshakeTimeout {
                    address,
                    after_ms: CONNECT_TIMEOUT_MS,
                })?
                .map_err(|source| TransportError::Handshake { address, source })?;
        PeerConnection::from_established(connection)
    }

    /// Connects to `target`, written `HOST:PORT` (`[IPV6]:PORT` for IPv6 literals); HOST is
    /// also the name the server's certificate must carry.
    pub async fn connect_to(
        &self,
        target: &str,
        alpn: &[u8],
    ) -> Result<PeerConnection, TransportError> {
        let resolve_error = |reason: &str| TransportError::Resolve {
            target: target.to_string(),
            reason: reason.to_string(),
        };
        let (host, _port) = target
            .rsplit_once(':')
            .ok_or_else(|| resolve_error("no port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let address = tokio::time::timeout(
            Duration::from_millis(CONNECT_TIMEOUT_MS),
            tokio::net::lookup_host(target),
        )
        .await
        .map_err(|_| resolve_error("name lookup timed out"))?
        .map_err(|error| resolve_error(&error.to_string()))?
        .next()
        .ok_or_else(|| resolve_error("no address found"))?;
        self.connect(address, host, alpn).await
    }

    /// Closes every connection this client opened.
    pub fn close(&self) {
        if let Ok(endpoints) = self.endpoints.lock() {
            for endpoint in endpoints.ipv4.iter().chain(endpoints.ipv6.iter()) {
                endpoint.close(VarInt::from_u32(CLOSE_CODE_SHUTDOWN), b"shutdown");
            }
        }
    }

    fn endpoint_and_config(
        &self,
        address: SocketAddr,
        alpn: &[u8],
    ) -> Result<(quinn::Endpoint, quinn::ClientConfig), TransportError> {
        let mut endpoints = self
            .endpoints
            .lock()
            .map_err(|_| TransportError::Config("client state poisoned".to_string()))?;
        let config = match endpoints.configs.get(alpn) {
            Some(config) => config.clone(),
            None => {
                let tls_config = self.tls.client_config(alpn)?;
                let crypto = QuicClientConfig::try_from(tls_config)
                    .map_err(|error| TransportError::Config(error.to_string()))?;
                let mut config = quinn::ClientConfig::new(Arc::new(crypto));
                config.transport_config(self.transport.clone());
                endpoints.configs.insert(alpn.to_vec(), config.clone());
                config
            }
        };
        let (slot, bind_address) = match address {
            SocketAddr::V4(_) => (
                &mut endpoints.ipv4,
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            ),
            SocketAddr::V6(_) => (
                &mut endpoints.ipv6,
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
            ),
        };
        let endpoint = match slot {
            Some(endpoint) => endpoint.clone(),
            None => {
                let endpoint = bind_endpoint(bind_address, None, quinn::EndpointConfig::default())
                    .map_err(|source| TransportError::Bind {
                        address: bind_address,
                        source,
                    })?;
                *slot = Some(endpoint.clone());
                endpoint
            }
        };
        Ok((endpoint, config))
    }
}

/// An established, mutually authenticated connection and who is at the other end.
/// Cheap to clone; the connection closes when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct PeerConnection {
    connection: quinn::Connection,
    peer: PeerIdentity,
    /// The serial number of the peer's certificate (lowercase hex), checked against the
    /// revoked serials of its name.
    serial: Option<String>,
    /// When the peer's certificate starts and stops being valid (seconds since the epoch).
    validity: Option<(i64, i64)>,
    alpn: Vec<u8>,
    /// What request bodies its streams may be reading at once ([`frame::BodyBudget`]).
    budget: frame::BodyBudget,
}

impl PeerConnection {
    /// Reads the peer's identity and the negotiated ALPN; closes the connection if the
    /// peer's certificate names no Quotient identity.
    fn from_established(connection: quinn::Connection) -> Result<Self, TransportError> {
        let address = connection.remote_address();
        let refuse = |connection: &quinn::Connection, error: TransportError| {
            connection.close(VarInt::from_u32(CLOSE_CODE_BAD_IDENTITY), b"bad identity");
            error
        };
        let certificates = connection
            .peer_identity()
            .and_then(|identity| identity.downcast::<Vec<CertificateDer<'static>>>().ok())
            .ok_or_else(|| TransportError::NoPeerCertificate {
                address,
                reason: "no certificate chain".to_string(),
            });
        let certificates = certificates.map_err(|error| refuse(&connection, error))?;
        let Some(leaf) = certificates.first() else {
            return Err(refuse(
                &connection,
                TransportError::NoPeerCertificate {
                    address,
                    reason: "empty certificate chain".to_string(),
                },
            ));
        };
        let peer = PeerIdentity::from_certificate_der(leaf).map_err(|source| {
            refuse(
                &connection,
                TransportError::PeerIdentity { address, source },
            )
        })?;
        let alpn = connection
            .handshake_data()
            .and_then(|data| data.downcast::<HandshakeData>().ok())
            .and_then(|data| data.protocol)
            .unwrap_or_default();
        let (serial, validity) = match PeerIdentity::serial_and_validity_of_certificate_der(leaf) {
            Ok((serial, validity)) => (Some(serial), Some(validity)),
            Err(_) => (None, None),
        };
        let established = PeerConnection {
            connection,
            peer,
            serial,
            validity,
            alpn,
            budget: frame::BodyBudget::for_connection(),
        };
        // The handshake checked the dates, unless it resumed an earlier session: TLS takes
        // a resumed peer's certificate as it was then (found by probing: an agent whose
        // certificate had expired registered again with a coordinator that had run since
        // before, and was given a job).
        established.check_validity()?;
        Ok(established)
    }

    /// Closes the connection when the peer's certificate is not valid now (expired, or not
    /// yet valid), saying so to both sides.
    fn check_validity(&self) -> Result<(), TransportError> {
        let Some((not_before, not_after)) = self.validity else {
            return Ok(());
        };
        let now = crate::certs::unix_now_s();
        let problem = if now > not_after {
            format!(
                "expired at {}: renew it (see \"Certificate expiry\" in the operations guide)",
                crate::certs::utc_text(not_after)
            )
        } else if now < not_before {
            format!(
                "is not valid before {}: check both hosts' clocks",
                crate::certs::utc_text(not_before)
            )
        } else {
            return Ok(());
        };
        let reason = format!("the certificate of {} {problem}", self.peer);
        tracing::warn!(peer = %self.peer, address = %self.connection.remote_address(), "{reason}; closing the connection");
        let reason = &reason.as_bytes()[..reason.len().min(CLOSE_REASON_BYTES_MAX)];
        self.connection
            .close(VarInt::from_u32(CLOSE_CODE_CERTIFICATE_NOT_VALID), reason);
        Err(TransportError::CertificateNotValid {
            address: self.connection.remote_address(),
            peer: self.peer.clone(),
            problem,
        })
    }

    /// Who the peer is, from its certificate.
    pub fn peer(&self) -> &PeerIdentity {
        &self.peer
    }

    /// The serial number of the peer's certificate (lowercase hex).
    pub fn serial(&self) -> Option<&str> {
        self.serial.as_deref()
    }

    /// The negotiated ALPN protocol (one of the `ALPN_*` constants).
    pub fn alpn(&self) -> &[u8] {
        &self.alpn
    }

    /// The peer's address.
    pub fn remote_address(&self) -> SocketAddr {
        self.connection.remote_address()
    }

    /// The underlying quinn connection, for what this module does not wrap.
    pub fn connection(&self) -> &quinn::Connection {
        &self.connection
    }

    /// Whether the connection is still open (neither side closed it, no idle timeout).
    pub fn is_open(&self) -> bool {
        self.connection.close_reason().is_none()
    }

    /// UDP datagrams received on this connection so far. A count that grew while a request
    /// went unanswered says the peer is there (its QUIC side at least acknowledged the
    /// request's packets), only slow to answer.
    pub fn datagrams_received(&self) -> u64 {
        self.connection.stats().udp_rx.datagrams
    }

    /// Whether `other` is a clone of this very connection, not only one to the same peer.
    pub fn is_same(&self, other: &PeerConnection) -> bool {
        self.connection.stable_id() == other.connection.stable_id()
    }

    /// Checks the peer's role against `allowed`; if it is not there, closes the connection
    /// with [`CLOSE_CODE_UNAUTHORISED`] and says why.
    pub fn require_role(&self, allowed: &[Role]) -> Result<(), TransportError> {
        if allowed.contains(&self.peer.role) {
            return Ok(());
        }
        self.connection.close(
            VarInt::from_u32(CLOSE_CODE_UNAUTHORISED),
            b"role not allowed",
        );
        Err(TransportError::Unauthorised {
            peer: self.peer.clone(),
            alpn: String::from_utf8_lossy(&self.alpn).into_owned(),
            allowed: allowed
                .iter()
                .map(|role| role.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// Closes the connection with [`CLOSE_CODE_UNAUTHORISED`], telling the peer `reason` (at
    /// most [`CLOSE_REASON_BYTES_MAX`] bytes of it).
    pub fn close_unauthorised(&self, reason: &str) {
        let reason = &reason.as_bytes()[..reason.len().min(CLOSE_REASON_BYTES_MAX)];
        self.connection
            .close(VarInt::from_u32(CLOSE_CODE_UNAUTHORISED), reason);
    }

    /// Waits for the peer's next request stream; `None` once the peer or this side closed
    /// the connection deliberately.
    pub async fn accept_request(&self) -> Result<Option<RequestStream>, TransportError> {
        match self.connection.accept_bi().await {
            Ok((send, recv)) => {
                // A connection outlives nothing: one whose peer's certificate expired while
                // it was open serves no more requests.
                self.check_validity()?;
                Ok(Some(RequestStream {
                    budget: Some(self.budget.clone()),
                    ..RequestStream::new(send, recv)
                }))
            }
            Err(ConnectionError::ApplicationClosed(_) | ConnectionError::LocallyClosed) => Ok(None),
            Err(error) => Err(TransportError::ConnectionLost(error)),
        }
    }

    /// Sends one request and waits for its response; see [`request`].
    pub async fn request<Req, Resp>(
        &self,
        request_message: &Req,
        deadline: Duration,
    ) -> Result<Resp, RequestError>
    where
        Req: WireMessage,
        Resp: WireMessage,
    {
        // The server's certificate expired while this connection was open: closed, as the
        // server closes a connection whose client's certificate expired.
        if self.check_validity().is_err() {
            return Err(RequestError::ConnectionLost(ConnectionError::LocallyClosed));
        }
        request(&self.connection, request_message, deadline).await
    }

    /// Closes the connection in an orderly way.
    pub fn close(&self) {
        self.connection
            .close(VarInt::from_u32(CLOSE_CODE_SHUTDOWN), b"shutdown");
    }
}

/// Sends `request_message` on a new stream of `connection`, finishes the send side and reads
/// one response frame, all within `deadline`. The message is encoded before the stream is
/// opened, so an oversized request fails here without reaching the peer.
pub async fn request<Req, Resp>(
    connection: &quinn::Connection,
    request_message: &Req,
    deadline: Duration,
) -> Result<Resp, RequestError>
where
    Req: WireMessage,
    Resp: WireMessage,
{
    let encoded = frame::encode_frame(request_message)?;
    let peer = || Writer::Peer(format!("the peer at {}", connection.remote_address()));
    let exchange = async {
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(RequestError::ConnectionLost)?;
        tokio::io::AsyncWriteExt::write_all(&mut send, &encoded)
            .await
            .map_err(|error| classify(FrameError::Io(error)))?;
        send.finish().map_err(|_| RequestError::StreamClosed)?;
        let response = frame::read_answer_frame::<Resp>(&mut recv, MAX_FRAME_BYTES)
            .await
            .map_err(|error| match classify(error) {
                RequestError::Frame(FrameError::Version(mismatch)) => {
                    RequestError::Version(VersionError {
                        writer: peer(),
                        ..mismatch
                    })
                }
                RequestError::Frame(error) => RequestError::Answer(error),
                other => other,
            })?;
        observe_end(&mut recv);
        Ok(response)
    };
    let result = tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| RequestError::Timeout { after: deadline })?;
    result.map_err(|error| match error {
        // Our frame is within the limit every build has: a peer that finds it too large took
        // its header for a length, as the builds before frames carried a version did.
        RequestError::Refused { code } if code == u64::from(STREAM_CODE_FRAME_TOO_LARGE) => {
            RequestError::Version(Req::ENCODING.mismatch(peer(), (0, 0)))
        }
        other => other,
    })
}

/// Notes the end of `recv` when the peer's FIN has already arrived (it usually comes with the
/// frame), without waiting for it. A receive stream dropped before its end was seen sends
/// STOP_SENDING to the peer: one more frame to send, acknowledge and process per request.
fn observe_end(recv: &mut RecvStream) {
    let mut byte = [0u8; 1];
    let read = std::pin::pin!(recv.read(&mut byte));
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    // Ready(Ok(None)) is the end; anything else (not yet, stray bytes, an error) is left to
    // the drop, as before.
    let _ = std::future::Future::poll(read, &mut context);
}

/// The server side of one request: read the request frame, then answer it.
#[derive(Debug)]
pub struct RequestStream {
    send: SendStream,
    recv: RecvStream,
    /// The version the request came in, once read: the answer is written in it.
    version: Option<u16>,
    /// Its connection's room for request bodies, if it counts any.
    budget: Option<frame::BodyBudget>,
}

impl RequestStream {
    /// Wraps the two halves of a bidirectional stream accepted from a quinn connection.
    pub fn new(send: SendStream, recv: RecvStream) -> Self {
        RequestStream {
            send,
            recv,
            version: None,
            budget: None,
        }
    }

    /// Reads the request frame within `deadline`. On a bad or late frame, resets the stream
    /// with the matching `STREAM_CODE_*` (so the client learns why) and returns the error;
    /// the connection stays usable. A frame of a version this server does not read is
    /// answered with a refusal frame naming the versions it reads
    /// ([`RequestError::Version`]).
    pub async fn read_request<Req: WireMessage>(
        &mut self,
        deadline: Duration,
    ) -> Result<Req, RequestError> {
        let read = frame::read_request_frame_within::<Req>(
            &mut self.recv,
            MAX_FRAME_BYTES,
            self.budget.as_ref(),
        );
        let result = tokio::time::timeout(deadline, read).await;
        let error = match result {
            Ok(Ok((request_message, version))) => {
                observe_end(&mut self.recv);
                self.version = Some(version);
                return Ok(request_message);
            }
            Ok(Err(FrameError::Version(mismatch))) => {
                self.refuse_version::<Req>(&mismatch, deadline).await;
                return Err(RequestError::Version(mismatch));
            }
            Ok(Err(error)) => classify(error),
            Err(_) => RequestError::Timeout { after: deadline },
        };
        let code = match &error {
            RequestError::Frame(FrameError::TooLarge { .. }) => Some(STREAM_CODE_FRAME_TOO_LARGE),
            RequestError::Frame(_) => Some(STREAM_CODE_BAD_FRAME),
            RequestError::Timeout { .. } => Some(STREAM_CODE_TIMEOUT),
            _ => None,
        };
        if let Some(code) = code {
            self.reset(code);
        }
        Err(error)
    }

    /// Tells the client that its request's version is not one this server reads: a refusal
    /// frame with the versions it reads, or, to a build from before frames carried a version
    /// (which would take the frame's header for a length), a reset.
    async fn refuse_version<Req: WireMessage>(
        &mut self,
        mismatch: &VersionError,
        deadline: Duration,
    ) {
        if mismatch.theirs == (0, 0) {
            self.reset(STREAM_CODE_UNSUPPORTED_VERSION);
            return;
        }
        let _ = self
            .recv
            .stop(VarInt::from_u32(STREAM_CODE_UNSUPPORTED_VERSION));
        let refusal = frame::refusal_frame(&Req::ENCODING);
        let write = async {
            tokio::io::AsyncWriteExt::write_all(&mut self.send, &refusal).await?;
            self.send.finish().map_err(std::io::Error::other)
        };
        // Best effort: the error is the caller's to log either way.
        let _ = tokio::time::timeout(deadline, write).await;
    }

    /// The version the request came in (after [`RequestStream::read_request`]): the version
    /// to answer in.
    pub fn version(&self) -> Option<u16> {
        self.version
    }

    /// Writes `response` as one frame, in the version the request came in, and finishes the
    /// stream, within `deadline`. Returns once the data is handed to QUIC; keep the
    /// connection open until the client has read it.
    pub async fn respond<Resp: WireMessage>(
        self,
        response: &Resp,
        deadline: Duration,
    ) -> Result<(), RequestError> {
        let version = self.version.unwrap_or(Resp::ENCODING.current);
        let encoded = frame::encode_frame_version(response, version)?;
        self.respond_frame(&encoded, deadline).await
    }

    /// As [`RequestStream::respond`], with the response already encoded as a whole frame
    /// ([`frame::encode_frame_version`], in [`RequestStream::version`]): for a server that
    /// looks at the frame before it sends it (one over its limit is answered with an error
    /// instead).
    pub async fn respond_frame(
        mut self,
        encoded: &[u8],
        deadline: Duration,
    ) -> Result<(), RequestError> {
        let write = async {
            tokio::io::AsyncWriteExt::write_all(&mut self.send, encoded)
                .await
                .map_err(|error| classify(FrameError::Io(error)))?;
            self.send.finish().map_err(|_| RequestError::StreamClosed)
        };
        tokio::time::timeout(deadline, write)
            .await
            .map_err(|_| RequestError::Timeout { after: deadline })?
    }

    /// Abandons the request, telling the client why with a `STREAM_CODE_*`.
    pub fn refuse(mut self, code: u32) {
        self.reset(code);
    }

    fn reset(&mut self, code: u32) {
        // Either half may already be closed by the peer; that is harmless here.
        let _ = self.recv.stop(VarInt::from_u32(code));
        let _ = self.send.reset(VarInt::from_u32(code));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_counted_by_address_and_loopback_is_not() {
        let counts = Arc::default();
        let host: IpAddr = "10.0.0.7".parse().unwrap();
        let slots: Vec<_> = (0..HANDSHAKES_PER_ADDRESS_MAX)
            .map(|_| AddressSlot::take(&counts, host).expect("a slot"))
            .collect();
        assert!(AddressSlot::take(&counts, host).is_none(), "one over");
        assert!(AddressSlot::take(&counts, "::ffff:10.0.0.7".parse().unwrap()).is_none());
        assert!(AddressSlot::take(&counts, "10.0.0.8".parse().unwrap()).is_some());
        // A host's IPv6 /64 is one address.
        let v6: Vec<_> = (0..HANDSHAKES_PER_ADDRESS_MAX)
            .map(|n| {
                AddressSlot::take(&counts, format!("2001:db8::{n:x}").parse().unwrap())
                    .expect("a slot")
            })
            .collect();
        assert!(AddressSlot::take(&counts, "2001:db8::ffff:1".parse().unwrap()).is_none());
        for _ in 0..100 {
            assert!(matches!(
                AddressSlot::take(&counts, "127.0.0.1".parse().unwrap()),
                Some(None)
            ));
        }
        drop(slots);
        drop(v6);
        assert!(AddressSlot::take(&counts, host).is_some(), "freed");
        assert!(counts.lock().unwrap().is_empty(), "no count is left behind");
    }

    #[test]
    fn a_failed_handshake_says_what_to_check() {
        let address: SocketAddr = "127.0.0.1:7401".parse().expect("an address");
        let said =
            |source: ConnectionError| TransportError::Handshake { address, source }.to_string();
        let gave_up = said(ConnectionError::ApplicationClosed(
            quinn::ApplicationClose {
                error_code: VarInt::from_u32(0),
                reason: Default::default(),
            },
        ));
        assert!(
            gave_up.contains("gave up") && !gave_up.contains("CA"),
            "{gave_up}"
        );
        let gave_up_in_handshake =
            said(ConnectionError::ConnectionClosed(quinn::ConnectionClose {
                error_code: quinn::TransportErrorCode::APPLICATION_ERROR,
                frame_type: None,
                reason: Default::default(),
            }));
        assert!(
            gave_up_in_handshake.contains("gave up"),
            "{gave_up_in_handshake}"
        );
        let timed_out = said(ConnectionError::TimedOut);
        assert!(
            timed_out.contains("reachable") && !timed_out.contains("CA"),
            "{timed_out}"
        );
        let busy = said(ConnectionError::ConnectionClosed(quinn::ConnectionClose {
            error_code: quinn::TransportErrorCode::CONNECTION_REFUSED,
            frame_type: None,
            reason: Default::default(),
        }));
        assert!(
            busy.contains("busy") && busy.contains("try again") && !busy.contains("CA"),
            "{busy}"
        );
        let reset = said(ConnectionError::Reset);
        assert!(reset.contains("same cluster CA"), "{reset}");
    }

    /// The most receive buffer the kernel grants one socket without privileges.
    #[cfg(target_os = "linux")]
    fn rmem_max() -> usize {
        std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn an_endpoint_socket_gets_the_buffers_it_asks_for_up_to_the_kernel_cap() {
        for client in [false, true] {
            let socket = udp_socket(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), client)
                .expect("binds a loopback socket");
            let granted = socket2::SockRef::from(&socket)
                .recv_buffer_size()
                .expect("reads the buffer size");
            // Linux reports twice what it granted.
            let expected = UDP_BUFFER_BYTES.min(rmem_max()) * 2;
            assert!(
                granted >= expected,
                "client={client}: granted {granted} bytes, expected at least {expected}"
            );
        }
    }
}
