//! The Raft-replicated Quotient coordinator: openraft glue around the pure `quotient-core`
//! state machine.
//!
//! # Layout
//! - [`store`]: Raft storage: the openraft type config, the redb log store, the state machine
//!   adapter with its snapshot file, and their codec.

pub mod store;
