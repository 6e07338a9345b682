//! The replicated state as a snapshot holds it (header, version, body), decoded, its index
//! rebuilt and validated.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = quotient_core::State::from_snapshot_bytes(data);
});
