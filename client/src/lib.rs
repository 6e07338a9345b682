//! The one client of the Quotient API (ALPN `quotient-api/1`): connects to the coordinators,
//! follows redirects to the leader, has a follower forward what it cannot deliver, and retries
//! only what cannot be carried out twice, all within deadlines.
//!
//! The `quotient` command line (through a thin synchronous wrapper), a follower forwarding a
//! request to the leader, the tests and the benchmarks all use it, so there is one policy for
//! what a silent coordinator, a redirect or a lost answer means. Every failure has a stable
//! code ([`ClientError::code`], docs/errors.md).
//!
//! # Layout
//! - [`api_client`]: [`ApiClient`], the call loop: first contact, redirects, elections,
//!   `ViaLeader` forwarding, retries, and a call to one coordinator alone.
//! - [`policy`]: [`RetryPolicy`], its deadlines and limits, and which requests are safe to
//!   send twice.
//! - [`exchange`]: the [`Exchange`] trait (one request to one coordinator), what a failed
//!   exchange means ([`ExchangeError`]), and the scripted fake's seam.
//! - [`quic_exchange`]: [`QuicExchange`], the real exchange: QUIC with mutual TLS, handshakes
//!   in the background so that a dead coordinator costs a call almost nothing.
//! - [`client_error`]: [`ClientError`], why a call failed.

pub mod api_client;
pub mod client_error;
pub mod exchange;
pub mod policy;
pub mod quic_exchange;

pub use api_client::ApiClient;
pub use client_error::ClientError;
pub use exchange::{exchange_error, unreadable_answer, Exchange, ExchangeError, HandshakeWait};
pub use policy::{is_retry_safe, RetryPolicy};
pub use quic_exchange::QuicExchange;

#[cfg(test)]
mod tests;
