//! A log segment file as the log opens it at start: scanned record by record, checksums and
//! lengths checked, a torn tail cut.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quotient_coordinator::store::wal::{Wal, WAL_DIR_NAME};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let wal_dir = dir.path().join(WAL_DIR_NAME);
    std::fs::create_dir_all(&wal_dir).expect("the log folder");
    std::fs::write(wal_dir.join("seg-0000000000000001.wal"), data).expect("the segment");
    if let Ok((wal, _)) = Wal::open(dir.path(), None) {
        if let Some((first, last)) = wal.bounds() {
            let _ = wal.read(first, last.saturating_add(1).min(first.saturating_add(64)));
        }
    }
});
