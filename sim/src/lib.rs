//! A seeded simulator of Quotient's control loop: coordinators, agents, hosts, clients and a
//! nemesis in one process, in virtual time, from one seed (the way FoundationDB's simulator
//! and TigerBeetle's VOPR test their systems). A seed is one history of hours of virtual
//! time, run in well under a second; the invariants are checked after every step, and a
//! failing seed replays exactly (`quotient-sim --seed S --seeds 1`).
//!
//! docs/simulation.md says what is simulated, what is real code, and what each check means.
//!
//! # Layout
//! - [`rng`]: the seeded random source.
//! - [`host`]: a simulated host's processes, lease file and orphan watchdogs, and the agent's
//!   runtime over them.
//! - [`world`]: one history: the event queue, the modelled Raft and network, the agents'
//!   sessions and executor loops, the clients, the nemesis, and the checks.

pub mod host;
pub mod rng;
pub mod world;

pub use world::{run, Config, Report, Stats};
