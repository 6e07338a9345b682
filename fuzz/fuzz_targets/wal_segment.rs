//! A log segment's bytes as the log reads them when it opens: record by record, checksums and
//! lengths checked, a torn tail of the newest segment cut, anything else refused as damage. The
//! scan is the one `Wal::open` runs on each segment file, driven in memory (no file is written
//! per run). Each valid entry's payload then goes through the entry decoder of its version.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quotient_coordinator::store::codec::VersionedEntries;
use quotient_coordinator::store::wal::scan_segment;
use quotient_coordinator::store::TypeConfig;

fuzz_target!(|data: &[u8]| {
    for last in [true, false] {
        let scanned = scan_segment(data, 0, last, |offset, record| {
            assert!(offset + record.size <= data.len(), "a record past the end");
            let _ = <TypeConfig as VersionedEntries>::decode_entry(record.version, record.payload);
        });
        if let Ok(scanned) = scanned {
            assert!(scanned.end <= data.len(), "the end past the bytes");
        }
    }
});
