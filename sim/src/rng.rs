//! The simulation's only source of randomness: [`quotient_common::rng::Rng`] (SplitMix64 from
//! one seed), shared with the trace-driven evaluation (`quotient-eval`).

pub use quotient_common::rng::Rng;
