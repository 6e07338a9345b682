//! Integration tests that start the real Quotient binaries (coordinators, agents, CLI) as
//! processes on loopback and drive them end to end.
//!
//! Today the cluster tests live beside the binaries they start (`coordinator/tests/`,
//! `cli/tests/`), where cargo hands them the binaries' paths. This crate will hold the tests
//! that need all three binaries at once (the walkthrough through real jobs, fault injection).
