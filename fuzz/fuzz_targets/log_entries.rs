//! Raft log records as the log on disk holds them, in every version this build reads: the
//! first two bytes are the record's version.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quotient_coordinator::store::codec::VersionedEntries;
use quotient_coordinator::store::TypeConfig;

fuzz_target!(|data: &[u8]| {
    let Some((version, bytes)) = data.split_at_checked(2) else {
        return;
    };
    let version = u16::from_le_bytes([version[0], version[1]]) % 5;
    let _ = <TypeConfig as VersionedEntries>::decode_entry(version, bytes);
});
