//! The last committed log id in its own small file, `DATA_DIR/raft-committed.bin`, as
//! coordinators kept it before the log had its own files (`store::wal`, which now holds the
//! committed id as a record). Only `store::legacy` still reads it, to move the id into the
//! log when an older data directory is opened; the tests write one to stand for such a
//! directory.
//!
//! The file holds the id in two fixed slots, 4 KiB apart, written alternately: one `pwrite` of
//! one page and one `fdatasync` per save.
//!
//! A slot is `MAGIC | seq (u64 LE) | len (u32 LE) | payload | crc32 (u32 LE)`, the CRC
//! covering everything before it; the payload is the store codec's encoding (bincode 2, size
//! limited). Reading takes the valid slot with the highest sequence number. A crash during a
//! save can tear only the slot being written, so the other one still holds the previous id;
//! two damaged slots are corruption, reported as an error that says what to do.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file's name inside the data directory.
pub const COMMITTED_FILE_NAME: &str = "raft-committed.bin";
/// Where each slot starts: a page apart, so that a torn write of one leaves the other whole.
const SLOT_OFFSETS: [u64; 2] = [0, 4096];
/// The file's size; a file of any other size is refused before anything is read.
pub const COMMITTED_FILE_BYTES: u64 = 8192;
/// The bytes one slot may take.
const SLOT_BYTES: usize = 256;
const MAGIC: &[u8; 4] = b"QCMT";
/// Magic, sequence number and payload length.
const HEADER_BYTES: usize = 4 + 8 + 4;
const CRC_BYTES: usize = 4;
/// The largest payload a slot holds (an encoded `Option<LogId>` takes a few dozen bytes).
pub const COMMITTED_PAYLOAD_MAX: usize = SLOT_BYTES - HEADER_BYTES - CRC_BYTES;

/// Why the committed file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CommittedFileError {
    #[error("committed file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "committed file {path} is {size} bytes, not {COMMITTED_FILE_BYTES}: it is not a \
         Quotient committed file; move it away and restart (the node relearns the commit \
         index from the leader)"
    )]
    WrongSize { path: PathBuf, size: u64 },
    #[error(
        "committed file {path} is corrupt (both slots fail their checksum); move it away and \
         restart (the node relearns the commit index from the leader)"
    )]
    Corrupt { path: PathBuf },
    #[error("a committed id of {0} bytes does not fit a slot of {COMMITTED_PAYLOAD_MAX}")]
    TooLarge(usize),
}

/// The open committed file. Saves are serialised by an internal lock.
#[derive(Debug)]
pub struct CommittedFile {
    file: File,
    path: PathBuf,
    /// The sequence number of the newest valid slot (0 when none was ever written).
    last_seq: Mutex<u64>,
}

/// What one slot holds.
enum Slot {
    /// Never written: all zeros.
    Empty,
    /// Fails its checksum or its framing: torn or damaged.
    Damaged,
    Valid {
        seq: u64,
        payload: Vec<u8>,
    },
}

/// Turns an I/O error on the file at `path` into a [`CommittedFileError`] naming it.
fn io_error(path: &Path) -> impl Fn(std::io::Error) -> CommittedFileError + Copy + '_ {
    move |source| CommittedFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn parse_slot(bytes: &[u8]) -> Slot {
    if bytes.iter().all(|b| *b == 0) {
        return Slot::Empty;
    }
    if &bytes[..4] != MAGIC {
        return Slot::Damaged;
    }
    let seq = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    if len > COMMITTED_PAYLOAD_MAX {
        return Slot::Damaged;
    }
    let end = HEADER_BYTES + len;
    let stored = u32::from_le_bytes(bytes[end..end + CRC_BYTES].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..end]) != stored {
        return Slot::Damaged;
    }
    Slot::Valid {
        seq,
        payload: bytes[HEADER_BYTES..end].to_vec(),
    }
}

impl CommittedFile {
    /// Opens `data_dir/raft-committed.bin`, creating it (zeroed, synced, and its directory
    /// synced) when missing. Blocks on file I/O.
    pub fn open(data_dir: &Path) -> Result<Self, CommittedFileError> {
        let path = data_dir.join(COMMITTED_FILE_NAME);
        let io = io_error(&path);
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        if !existed {
            // Real zeros, not a sparse file: later saves overwrite allocated blocks only.
            file.write_all_at(&[0u8; COMMITTED_FILE_BYTES as usize], 0)
                .map_err(io)?;
            file.sync_all().map_err(io)?;
            File::open(data_dir)
                .and_then(|dir| dir.sync_all())
                .map_err(io)?;
        }
        let committed = CommittedFile {
            file,
            path: path.clone(),
            last_seq: Mutex::new(0),
        };
        let newest = committed.newest()?;
        *committed.lock() = newest.map_or(0, |(seq, _)| seq);
        Ok(committed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.last_seq
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The newest valid slot's sequence number and payload; `None` when none was written.
    fn newest(&self) -> Result<Option<(u64, Vec<u8>)>, CommittedFileError> {
        let io = io_error(&self.path);
        let size = self.file.metadata().map_err(io)?.len();
        if size != COMMITTED_FILE_BYTES {
            return Err(CommittedFileError::WrongSize {
                path: self.path.clone(),
                size,
            });
        }
        let mut newest: Option<(u64, Vec<u8>)> = None;
        let mut damaged = 0;
        for offset in SLOT_OFFSETS {
            let mut bytes = [0u8; SLOT_BYTES];
            self.file.read_exact_at(&mut bytes, offset).map_err(io)?;
            match parse_slot(&bytes) {
                Slot::Empty => {}
                Slot::Damaged => damaged += 1,
                Slot::Valid { seq, payload } => {
                    if newest.as_ref().is_none_or(|(best, _)| seq > *best) {
                        newest = Some((seq, payload));
                    }
                }
            }
        }
        if newest.is_none() && damaged == SLOT_OFFSETS.len() {
            return Err(CommittedFileError::Corrupt {
                path: self.path.clone(),
            });
        }
        // One damaged slot beside an empty one is a first save torn by a crash: nothing was
        // acknowledged, so there is nothing to read.
        Ok(newest)
    }

    /// The payload of the last acknowledged save; `None` when there was none.
    pub fn read(&self) -> Result<Option<Vec<u8>>, CommittedFileError> {
        let _serialised = self.lock();
        Ok(self.newest()?.map(|(_, payload)| payload))
    }

    /// Saves `payload` in the slot not holding the newest value and syncs it; returns only
    /// once the bytes are durable.
    pub fn save(&self, payload: &[u8]) -> Result<(), CommittedFileError> {
        if payload.len() > COMMITTED_PAYLOAD_MAX {
            return Err(CommittedFileError::TooLarge(payload.len()));
        }
        let mut last_seq = self.lock();
        let seq = *last_seq + 1;
        let mut slot = [0u8; SLOT_BYTES];
        slot[..4].copy_from_slice(MAGIC);
        slot[4..12].copy_from_slice(&seq.to_le_bytes());
        slot[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let end = HEADER_BYTES + payload.len();
        slot[HEADER_BYTES..end].copy_from_slice(payload);
        let crc = crc32fast::hash(&slot[..end]);
        slot[end..end + CRC_BYTES].copy_from_slice(&crc.to_le_bytes());
        let offset = SLOT_OFFSETS[(seq % 2) as usize];
        let io = io_error(&self.path);
        self.file.write_all_at(&slot, offset).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        *last_seq = seq;
        Ok(())
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_alternate_slots_and_the_newest_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = CommittedFile::open(dir.path()).expect("open");
        assert_eq!(file.read().expect("read"), None);
        for n in 1..=5u8 {
            file.save(&[n; 3]).expect("save");
        }
        drop(file);
        let file = CommittedFile::open(dir.path()).expect("reopen");
        assert_eq!(file.read().expect("read"), Some(vec![5; 3]));
        file.save(b"next").expect("save after reopen");
        assert_eq!(file.read().expect("read"), Some(b"next".to_vec()));
    }

    #[test]
    fn a_torn_slot_falls_back_to_the_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = CommittedFile::open(dir.path()).expect("open");
        file.save(b"first").expect("save");
        file.save(b"second").expect("save");
        // The second save went to slot 0 (seq 2); tear it.
        file.file.write_all_at(&[0xff; 20], 10).expect("tear");
        drop(file);
        let file = CommittedFile::open(dir.path()).expect("reopen");
        assert_eq!(file.read().expect("read"), Some(b"first".to_vec()));
    }

    #[test]
    fn a_torn_first_save_reads_as_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = CommittedFile::open(dir.path()).expect("open");
        file.save(b"first").expect("save");
        file.file.write_all_at(&[0xff; 8], 4096).expect("tear");
        drop(file);
        assert_eq!(
            CommittedFile::open(dir.path())
                .expect("reopen")
                .read()
                .expect("read"),
            None
        );
    }

    #[test]
    fn damage_and_wrong_sizes_are_errors_that_say_what_to_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = CommittedFile::open(dir.path()).expect("open");
        file.save(b"a").expect("save");
        file.save(b"b").expect("save");
        file.file.write_all_at(&[0xff; 8], 20).expect("damage");
        file.file
            .write_all_at(&[0xff; 8], 4096 + 20)
            .expect("damage");
        drop(file);
        let error = CommittedFile::open(dir.path()).expect_err("corrupt");
        assert!(error.to_string().contains("move it away"), "{error}");

        let path = dir.path().join(COMMITTED_FILE_NAME);
        std::fs::write(&path, vec![0u8; 100_000]).expect("write");
        let error = CommittedFile::open(dir.path()).expect_err("wrong size");
        assert!(error.to_string().contains("100000 bytes"), "{error}");
        assert!(matches!(
            CommittedFile::open(dir.path()).expect_err("still refused"),
            CommittedFileError::WrongSize { .. }
        ));
        std::fs::remove_file(&path).expect("remove");
        let file = CommittedFile::open(dir.path()).expect("recreated");
        let error = file
            .save(&[0u8; COMMITTED_PAYLOAD_MAX + 1])
            .expect_err("too large");
        assert!(matches!(error, CommittedFileError::TooLarge(_)));
    }
}
