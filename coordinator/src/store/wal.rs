//! The Raft log's entries and committed id on disk: an append-only write-ahead log in segment
//! files, `DATA_DIR/raft-wal/seg-NNNNNNNNNNNNNNNN.wal`.
//!
//! Why not the redb database that holds the vote: a redb commit copies the B-tree's path and
//! its free-page bookkeeping on every write, five scattered pages and the header before its
//! fsync, while a log only ever appends. With several writers on one disk (three coordinators
//! on one host), a one-entry redb commit takes more than twice as long as a one-page append to
//! a zero-filled file (BENCHMARKS.md), and each entry pays that on a follower before it can
//! count towards a commit.
//!
//! # Format
//!
//! A segment is a sequence of records, each 8-byte aligned:
//! `magic u32 | kind u8 | version u16 | zero byte | payload length u32 | index u64 | batch u64 |
//! crc u32 | 8 zero bytes | payload`, little-endian, the CRC32 covering everything before it
//! except the magic, and the payload. Kinds: an entry (index = its log index, payload = the
//! encoded entry), the committed id (payload = its encoding) and a truncation (index = the
//! first index removed). `version` is the version of the Raft log encoding
//! (`quotient_common::version::RAFT_LOG`) the payload is in, so that a log written partly by an
//! older build reads back with each record's own decoder; records written before versions were
//! recorded hold zeros there and are version 1. `batch` numbers the writes of the log: every
//! record of one [`Wal::write`] carries the same number, one more than the write before.
//!
//! # Writing
//!
//! A write appends its records with one `pwrite` and one `fdatasync`. Segments are filled with
//! zeros ahead of the writes ([`ZERO_AHEAD_BYTES`] at a time, synced before the write that
//! needed them), so a sync writes data pages only and never has to journal a new file size,
//! and no record ever runs past the end of its file; a segment is made under a temporary name
//! (`.partial`), zero-filled and synced, then renamed, so a segment is never shorter than its
//! first zeros, and its size is always a multiple of 4 KiB. A segment is closed after
//! [`SEGMENT_BYTES_MAX`] and the next one opens with the committed id as its first record, so
//! the newest committed id survives the removal of older segments.
//!
//! # Recovery
//!
//! Opening reads every segment in order and replays it: an entry replaces the entries from its
//! index on (an append after a truncation), a truncation removes them, the last committed
//! record wins. Zeros end a segment. A record that fails its checks in the last segment is a
//! write torn by a crash, and it and everything after it is discarded (and zeroed), unless a
//! whole later write follows it: a later write is started only after the one before is synced,
//! so that can only be damage, and opening refuses it with what to do. A bad record in an
//! earlier segment is damage too, and so is a segment cut short: one shorter than its first
//! zeros, of a size no write leaves, or with a record that runs past its end (a crash cannot
//! do that, see Writing: a member that read such a log as a torn write would drop entries it
//! had acknowledged, and the cluster could lose committed writes; found by probing).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use quotient_common::version::RAFT_LOG;

use super::codec::{MAX_ENTRY_BYTES, VERSION_OF_UNRECORDED};

/// The log's directory inside the data directory.
pub const WAL_DIR_NAME: &str = "raft-wal";
/// A segment is closed once it holds this many bytes (one record may take it past).
pub const SEGMENT_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// How far ahead of the writes a segment is filled with zeros.
pub const ZERO_AHEAD_BYTES: u64 = 1024 * 1024;
/// A segment's size is always a multiple of this.
const ZERO_FILL_ALIGN: u64 = 4096;
/// What a segment is called while it is being made.
const PARTIAL_SUFFIX: &str = ".partial";
/// The largest payload a record holds: an encoded entry's limit.
pub const RECORD_PAYLOAD_MAX: usize = MAX_ENTRY_BYTES;
/// A segment file larger than this is not one of ours and is refused before it is read.
pub const SEGMENT_FILE_BYTES_MAX: u64 =
    SEGMENT_BYTES_MAX + RECORD_PAYLOAD_MAX as u64 + 2 * ZERO_AHEAD_BYTES;

const MAGIC: u32 = 0x5157_4c52; // "QWLR"
const HEADER_BYTES: usize = 40;
const ALIGN: usize = 8;
const KIND_ENTRY: u8 = 1;
const KIND_COMMITTED: u8 = 2;
const KIND_TRUNCATE: u8 = 3;
/// The version field of records written before versions were recorded; read as
/// [`VERSION_OF_UNRECORDED`].
const VERSION_UNRECORDED: u16 = 0;

/// A payload as read back, with the version of the Raft log encoding it was written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub version: u16,
    pub bytes: Vec<u8>,
}

/// One record to write.
#[derive(Debug, Clone, Copy)]
pub enum Record<'a> {
    /// A log entry at `index`, encoded.
    Entry { index: u64, bytes: &'a [u8] },
    /// The committed log id, encoded.
    Committed { bytes: &'a [u8] },
    /// Removes the entries from `since` on.
    Truncate { since: u64 },
}

impl<'a> Record<'a> {
    /// One entry record for each `(index, encoded entry)`.
    pub fn entries(entries: &'a [(u64, Vec<u8>)]) -> Vec<Record<'a>> {
        entries
            .iter()
            .map(|(index, bytes)| Record::Entry {
                index: *index,
                bytes,
            })
            .collect()
    }
}

/// Why the log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("raft log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "raft log segment {path} is damaged at byte {offset} ({what}); it is not a torn last \
         write, so this node's log cannot be trusted: move the data directory away, start the \
         coordinator on an empty one, then remove it from the cluster and add it back as a new \
         member (`quotient cluster remove-member --id ID`, then `quotient cluster add-member \
         --id ID --address ADDR`): it copies the log from the leader before it votes"
    )]
    Damaged {
        path: PathBuf,
        offset: u64,
        what: &'static str,
    },
    #[error(
        "raft log segment {path} is {size} bytes, more than a segment can be ({max}): it is \
         not a Quotient log segment; move it out of {dir}",
        max = SEGMENT_FILE_BYTES_MAX,
        dir = WAL_DIR_NAME
    )]
    TooLarge { path: PathBuf, size: u64 },
    #[error("a log record of {0} bytes exceeds the limit of {RECORD_PAYLOAD_MAX} bytes")]
    RecordTooLarge(usize),
    #[error("raft log entry {index} is not in the log")]
    Missing { index: u64 },
}

/// Where an entry's record is.
#[derive(Debug, Clone, Copy)]
struct Location {
    segment: u64,
    offset: u64,
    len: u32,
}

/// A segment's file and what the purge needs to know of it.
#[derive(Debug)]
struct Segment {
    file: Arc<File>,
    path: PathBuf,
    /// The highest entry index written to it, live or not.
    max_index: Option<u64>,
}

/// The segments and where each live entry is: shared by readers and the writer.
#[derive(Debug, Default)]
struct Index {
    segments: BTreeMap<u64, Segment>,
    entries: BTreeMap<u64, Location>,
}

/// The segment being written; only the writer touches it.
#[derive(Debug)]
struct Active {
    number: u64,
    file: Arc<File>,
    path: PathBuf,
    /// Where the next record goes.
    position: u64,
    /// Everything below this is zeros or records.
    zeroed_end: u64,
    batch: u64,
    /// The last committed record written, copied into each new segment.
    committed: Option<Stored>,
}

/// The write-ahead log: one writer (the store's writer thread), any number of readers.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    index: Mutex<Index>,
    active: Mutex<Active>,
    /// Writes synced so far (each one `fdatasync`).
    syncs: AtomicU64,
}

/// Holds the log's writes back while it lives, as a disk that does not answer would; the
/// tests use it to look at what waits for the disk.
pub struct WriteStall<'a>(#[allow(dead_code)] MutexGuard<'a, Active>);

/// What opening found.
#[derive(Debug)]
pub struct Recovered {
    /// The last committed record's payload.
    pub committed: Option<Stored>,
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn segment_name(number: u64) -> String {
    format!("seg-{number:016}.wal")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    name.strip_prefix("seg-")?
        .strip_suffix(".wal")?
        .parse()
        .ok()
}

fn padded(len: usize) -> usize {
    len.div_ceil(ALIGN) * ALIGN
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is completed before they are released.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Appends one record's bytes to `out`; `version` is its payload's.
fn encode_record(
    out: &mut Vec<u8>,
    kind: u8,
    version: u16,
    index: u64,
    batch: u64,
    payload: &[u8],
) {
    let start = out.len();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&version.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&batch.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[start + 4..start + 28]);
    crc.update(payload);
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(payload);
    out.resize(start + padded(HEADER_BYTES + payload.len()), 0);
}

/// A record as read back.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub kind: u8,
    /// The payload's version ([`VERSION_UNRECORDED`] read as what it means).
    pub version: u16,
    pub index: u64,
    pub batch: u64,
    pub payload: &'a [u8],
    /// Bytes the record takes, padding included.
    pub size: usize,
}

/// What is at some offset of a segment.
enum Slot<'a> {
    /// Zeros: the segment's written part ends here.
    End,
    Valid(Parsed<'a>),
    Invalid(&'static str),
    /// A record that runs past the end of the file: the file was cut, never a torn write.
    Cut(&'static str),
}

fn parse_record(bytes: &[u8]) -> Slot<'_> {
    if bytes.len() < HEADER_BYTES {
        return if bytes.iter().all(|b| *b == 0) {
            Slot::End
        } else {
            Slot::Cut("a record header runs past the end of the file: it was cut short")
        };
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let magic = u32_at(0);
    if magic == 0 && bytes[..HEADER_BYTES].iter().all(|b| *b == 0) {
        return Slot::End;
    }
    if magic != MAGIC {
        return Slot::Invalid("no record starts there");
    }
    let kind = bytes[4];
    if !matches!(kind, KIND_ENTRY | KIND_COMMITTED | KIND_TRUNCATE) {
        return Slot::Invalid("unknown record kind");
    }
    let len = u32_at(8) as usize;
    if len > RECORD_PAYLOAD_MAX {
        return Slot::Invalid("record length over the limit");
    }
    let size = padded(HEADER_BYTES + len);
    if bytes.len() < HEADER_BYTES + len {
        return Slot::Cut("a record runs past the end of the file: it was cut short");
    }
    let payload = &bytes[HEADER_BYTES..HEADER_BYTES + len];
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[4..28]);
    crc.update(payload);
    if crc.finalize() != u32_at(28) {
        return Slot::Invalid("checksum mismatch");
    }
    let version = match u16::from_le_bytes([bytes[5], bytes[6]]) {
        VERSION_UNRECORDED => VERSION_OF_UNRECORDED,
        version => version,
    };
    Slot::Valid(Parsed {
        kind,
        version,
        index: u64_at(12),
        batch: u64_at(20),
        payload,
        size: size.min(bytes.len()),
    })
}

/// Whether a whole write later than `batch` starts anywhere in `bytes` (8-byte aligned).
fn later_write_follows(bytes: &[u8], batch: u64) -> bool {
    (0..bytes.len())
        .step_by(ALIGN)
        .any(|at| matches!(parse_record(&bytes[at..]), Slot::Valid(r) if r.batch > batch + 1))
}

/// Where reading a segment stopped, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// The offset after the last valid record: the next write goes here.
    pub end: usize,
    /// The highest write batch seen so far, this segment included.
    pub batch: u64,
    /// Set when the last segment ended in a write torn by a crash, cut at `end`.
    pub torn: Option<&'static str>,
}

/// A record that cannot be read where it is not a torn last write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    pub offset: usize,
    pub what: &'static str,
}

/// Reads the records of one segment's `bytes` in order, calling `each` with the offset and
/// record of every valid one, as the log does when it opens. `batch` is the highest write batch
/// of the segments before; `last` says whether this is the newest segment, the only one whose
/// tail may be a torn write. Pure: nothing here touches a file, so the fuzz target drives it
/// directly.
pub fn scan_segment<'a>(
    bytes: &'a [u8],
    mut batch: u64,
    last: bool,
    mut each: impl FnMut(usize, &Parsed<'a>),
) -> Result<Scanned, Damage> {
    let mut offset = 0usize;
    loop {
        match parse_record(&bytes[offset..]) {
            Slot::End => {
                return Ok(Scanned {
                    end: offset,
                    batch,
                    torn: None,
                })
            }
            Slot::Cut(what) => return Err(Damage { offset, what }),
            Slot::Invalid(what) => {
                if !last || later_write_follows(&bytes[offset..], batch) {
                    return Err(Damage { offset, what });
                }
                return Ok(Scanned {
                    end: offset,
                    batch,
                    torn: Some(what),
                });
            }
            Slot::Valid(record) => {
                each(offset, &record);
                batch = batch.max(record.batch);
                offset += record.size;
            }
        }
    }
}

/// Writes zeros over `[from, to)` of `file`.
fn zero_fill(file: &File, from: u64, to: u64) -> io::Result<()> {
    const CHUNK: usize = 256 * 1024;
    let zeros = vec![0u8; CHUNK];
    let mut at = from;
    while at < to {
        let n = usize::try_from(to - at).map_or(CHUNK, |left| left.min(CHUNK));
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Wal {
    /// Opens the log in `data_dir/raft-wal`, creating it when missing, and replays it; entries
    /// up to `purged` are dropped. Blocks on file I/O.
    pub fn open(data_dir: &Path, purged: Option<u64>) -> Result<(Wal, Recovered), WalError> {
        let dir = data_dir.join(WAL_DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        let mut numbers = Vec::new();
        for item in std::fs::read_dir(&dir).map_err(io_error(&dir))? {
            let item = item.map_err(io_error(&dir))?;
            let name = item.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if let Some(number) = parse_segment_name(name) {
                numbers.push(number);
            } else if name.ends_with(PARTIAL_SUFFIX) {
                // A segment whose making a crash cut short: it was never written to.
                let path = item.path();
                std::fs::remove_file(&path).map_err(io_error(&path))?;
            }
        }
        numbers.sort_unstable();
        let mut index = Index::default();
        let mut committed = None;
        let mut batch = 0;
        let mut active = None;
        for (position, number) in numbers.iter().enumerate() {
            let last = position + 1 == numbers.len();
            let path = dir.join(segment_name(*number));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_error(&path))?;
            let metadata = file.metadata().map_err(io_error(&path))?;
            let size = metadata.len();
            if size > SEGMENT_FILE_BYTES_MAX {
                return Err(WalError::TooLarge { path, size });
            }
            if !metadata.is_file() || size < ZERO_AHEAD_BYTES || size % ZERO_FILL_ALIGN != 0 {
                // Made whole before its name was given, and only ever grown by synced
                // multiples of 4 KiB: anything else was cut, or is not a segment at all.
                return Err(WalError::Damaged {
                    path,
                    offset: size,
                    what: "the segment is shorter than a segment is ever made, or of a size no \
                           write leaves: it was cut short or replaced",
                });
            }
            let mut bytes = vec![0u8; usize::try_from(size).unwrap_or(usize::MAX)];
            file.read_exact_at(&mut bytes, 0).map_err(io_error(&path))?;
            let mut max_index = None;
            let scanned = scan_segment(&bytes, batch, last, |offset, record| match record.kind {
                KIND_ENTRY => {
                    index.entries.split_off(&record.index);
                    index.entries.insert(
                        record.index,
                        Location {
                            segment: *number,
                            offset: offset as u64,
                            len: record.payload.len() as u32,
                        },
                    );
                    max_index = max_index.max(Some(record.index));
                }
                KIND_TRUNCATE => {
                    index.entries.split_off(&record.index);
                }
                _ => {
                    committed = Some(Stored {
                        version: record.version,
                        bytes: record.payload.to_vec(),
                    })
                }
            })
            .map_err(|damage| WalError::Damaged {
                path: path.clone(),
                offset: damage.offset as u64,
                what: damage.what,
            })?;
            if let Some(what) = scanned.torn {
                tracing::warn!(path = %path.display(), offset = scanned.end, what, "discarding a raft log write torn by a crash");
            }
            batch = scanned.batch;
            let offset = scanned.end;
            let file = Arc::new(file);
            if last {
                // Whatever a torn write left after the end goes, so that no stale record can
                // ever be read as following the next one.
                if bytes[offset..].iter().any(|b| *b != 0) {
                    zero_fill(&file, offset as u64, size).map_err(io_error(&path))?;
                    file.sync_data().map_err(io_error(&path))?;
                }
                active = Some(Active {
                    number: *number,
                    file: file.clone(),
                    path: path.clone(),
                    position: offset as u64,
                    zeroed_end: size,
                    batch,
                    committed: committed.clone(),
                });
            }
            index.segments.insert(
                *number,
                Segment {
                    file,
                    path,
                    max_index,
                },
            );
        }
        if let Some(purged) = purged {
            index.entries = index.entries.split_off(&(purged + 1));
        }
        let active = match active {
            Some(active) => active,
            None => {
                let active = Self::create_segment(&dir, 1, 0, None)?;
                index.segments.insert(
                    1,
                    Segment {
                        file: active.file.clone(),
                        path: active.path.clone(),
                        max_index: None,
                    },
                );
                active
            }
        };
        let wal = Wal {
            dir,
            index: Mutex::new(index),
            active: Mutex::new(active),
            syncs: AtomicU64::new(0),
        };
        Ok((wal, Recovered { committed }))
    }

    /// Creates segment `number`, zero-filled ahead and synced under a temporary name, then
    /// renamed, its directory entry synced too.
    fn create_segment(
        dir: &Path,
        number: u64,
        batch: u64,
        committed: Option<Stored>,
    ) -> Result<Active, WalError> {
        let path = dir.join(segment_name(number));
        let partial = dir.join(format!("{}{PARTIAL_SUFFIX}", segment_name(number)));
        match std::fs::remove_file(&partial) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => {
                return Err(io_error(&partial)(error))
            }
            _ => {}
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(io_error(&partial))?;
        zero_fill(&file, 0, ZERO_AHEAD_BYTES).map_err(io_error(&partial))?;
        file.sync_all().map_err(io_error(&partial))?;
        if path.exists() {
            return Err(io_error(&path)(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a segment of that number is already there",
            )));
        }
        std::fs::rename(&partial, &path).map_err(io_error(&path))?;
        sync_dir(dir).map_err(io_error(dir))?;
        Ok(Active {
            number,
            file: Arc::new(file),
            path,
            position: 0,
            zeroed_end: ZERO_AHEAD_BYTES,
            batch,
            committed,
        })
    }

    /// The directory of the segments.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends `records` as one write and syncs it; returns once they are durable.
    pub fn write(&self, records: &[Record<'_>]) -> Result<(), WalError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut active = lock(&self.active);
        if active.position >= SEGMENT_BYTES_MAX {
            self.roll(&mut active)?;
        }
        let batch = active.batch + 1;
        let mut bytes = Vec::new();
        if active.position == 0 {
            // A new segment first says what is committed, so that removing older segments
            // never loses the newest committed id.
            if let Some(committed) = &active.committed {
                let Stored {
                    version,
                    bytes: payload,
                } = committed;
                encode_record(&mut bytes, KIND_COMMITTED, *version, 0, batch, payload);
            }
        }
        let mut placed = Vec::new();
        let mut committed = None;
        for record in records {
            let at = bytes.len() as u64;
            match *record {
                Record::Entry {
                    index,
                    bytes: payload,
                } => {
                    if payload.len() > RECORD_PAYLOAD_MAX {
                        return Err(WalError::RecordTooLarge(payload.len()));
                    }
                    encode_record(
                        &mut bytes,
                        KIND_ENTRY,
                        RAFT_LOG.current,
                        index,
                        batch,
                        payload,
                    );
                    placed.push((index, at, payload.len() as u32));
                }
                Record::Committed { bytes: payload } => {
                    if payload.len() > RECORD_PAYLOAD_MAX {
                        return Err(WalError::RecordTooLarge(payload.len()));
                    }
                    encode_record(
                        &mut bytes,
                        KIND_COMMITTED,
                        RAFT_LOG.current,
                        0,
                        batch,
                        payload,
                    );
                    committed = Some(payload);
                }
                Record::Truncate { since } => {
                    encode_record(
                        &mut bytes,
                        KIND_TRUNCATE,
                        RAFT_LOG.current,
                        since,
                        batch,
                        &[],
                    );
                }
            }
        }
        let start = active.position;
        let end = start + bytes.len() as u64;
        let path = active.path.clone();
        if end > active.zeroed_end {
            let to = (end + ZERO_AHEAD_BYTES).div_ceil(ZERO_FILL_ALIGN) * ZERO_FILL_ALIGN;
            zero_fill(&active.file, active.zeroed_end, to).map_err(io_error(&path))?;
            // The new size is durable before any record lands in it: a crash can then tear a
            // record, but never leave one running past the end of the file.
            active.file.sync_data().map_err(io_error(&path))?;
            active.zeroed_end = to;
        }
        active
            .file
            .write_all_at(&bytes, start)
            .map_err(io_error(&path))?;
        active.file.sync_data().map_err(io_error(&path))?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        active.position = end;
        active.batch = batch;
        if let Some(payload) = committed {
            active.committed = Some(Stored {
                version: RAFT_LOG.current,
                bytes: payload.to_vec(),
            });
        }
        let segment = active.number;
        drop(active);

        let mut index = lock(&self.index);
        let mut placed = placed.into_iter().peekable();
        for record in records {
            match *record {
                Record::Entry { .. } => {
                    let (entry, offset, len) = placed.next().expect("one placement per entry");
                    index.entries.split_off(&entry);
                    index.entries.insert(
                        entry,
                        Location {
                            segment,
                            offset: start + offset,
                            len,
                        },
                    );
                    if let Some(info) = index.segments.get_mut(&segment) {
                        info.max_index = info.max_index.max(Some(entry));
                    }
                }
                Record::Truncate { since } => {
                    index.entries.split_off(&since);
                }
                Record::Committed { .. } => {}
            }
        }
        Ok(())
    }

    /// Closes the active segment and opens the next.
    fn roll(&self, active: &mut Active) -> Result<(), WalError> {
        let next = Self::create_segment(
            &self.dir,
            active.number + 1,
            active.batch,
            active.committed.clone(),
        )?;
        lock(&self.index).segments.insert(
            next.number,
            Segment {
                file: next.file.clone(),
                path: next.path.clone(),
                max_index: None,
            },
        );
        tracing::debug!(segment = %next.path.display(), "raft log: next segment");
        *active = next;
        Ok(())
    }

    /// Forgets the entries up to `upto` and removes the segments that hold nothing after it.
    /// Call it only once the purge is recorded durably elsewhere: a removed segment is gone.
    pub fn purge(&self, upto: u64) -> Result<(), WalError> {
        let active = lock(&self.active).number;
        let mut index = lock(&self.index);
        index.entries = index.entries.split_off(&(upto + 1));
        let removable: Vec<u64> = index
            .segments
            .iter()
            .take_while(|(number, segment)| {
                **number != active && segment.max_index.is_none_or(|max| max <= upto)
            })
            .map(|(number, _)| *number)
            .collect();
        for number in removable {
            if let Some(segment) = index.segments.remove(&number) {
                std::fs::remove_file(&segment.path).map_err(io_error(&segment.path))?;
            }
        }
        Ok(())
    }

    /// The first and last live entry indexes.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let index = lock(&self.index);
        let first = index.entries.keys().next()?;
        let last = index.entries.keys().next_back()?;
        Some((*first, *last))
    }

    /// The encoded entries with indexes in `start..=end`, in order, each with its version.
    pub fn read(&self, start: u64, end: u64) -> Result<Vec<(u64, Stored)>, WalError> {
        if end < start {
            return Ok(Vec::new());
        }
        let wanted: Vec<(u64, Location, Arc<File>, PathBuf)> = {
            let index = lock(&self.index);
            index
                .entries
                .range(start..=end)
                .map(|(entry, location)| {
                    let segment = index
                        .segments
                        .get(&location.segment)
                        .expect("an entry's segment is open");
                    (
                        *entry,
                        *location,
                        segment.file.clone(),
                        segment.path.clone(),
                    )
                })
                .collect()
        };
        let mut out = Vec::with_capacity(wanted.len());
        for (entry, location, file, path) in wanted {
            let mut bytes = vec![0u8; HEADER_BYTES + location.len as usize];
            file.read_exact_at(&mut bytes, location.offset)
                .map_err(io_error(&path))?;
            match parse_record(&bytes) {
                Slot::Valid(record) if record.kind == KIND_ENTRY && record.index == entry => {
                    out.push((
                        entry,
                        Stored {
                            version: record.version,
                            bytes: record.payload.to_vec(),
                        },
                    ));
                }
                Slot::Valid(_) => {
                    return Err(WalError::Damaged {
                        path,
                        offset: location.offset,
                        what: "another record where an entry was written",
                    })
                }
                Slot::End | Slot::Invalid(_) | Slot::Cut(_) => {
                    return Err(WalError::Damaged {
                        path,
                        offset: location.offset,
                        what: "an entry no longer reads back",
                    })
                }
            }
        }
        Ok(out)
    }

    /// The number of segment files.
    pub fn segment_count(&self) -> usize {
        lock(&self.index).segments.len()
    }

    /// How many writes were synced since the log was opened.
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Stalls every write until the returned guard is dropped.
    pub fn stall(&self) -> WriteStall<'_> {
        WriteStall(lock(&self.active))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, text: &str) -> (u64, Vec<u8>) {
        (index, text.as_bytes().to_vec())
    }

    fn write_entries(wal: &Wal, entries: &[(u64, Vec<u8>)]) {
        wal.write(&Record::entries(entries)).expect("write");
    }

    /// The payloads of the entries in `start..=end`, each checked to be of this build's
    /// version.
    fn read(wal: &Wal, start: u64, end: u64) -> Vec<(u64, Vec<u8>)> {
        wal.read(start, end)
            .expect("read")
            .into_iter()
            .map(|(index, stored)| {
                assert_eq!(stored.version, RAFT_LOG.current, "entry {index}");
                (index, stored.bytes)
            })
            .collect()
    }

    /// The payload of a recovered committed id.
    fn committed_bytes(recovered: &Recovered) -> Option<&[u8]> {
        recovered
            .committed
            .as_ref()
            .map(|stored| stored.bytes.as_slice())
    }

    #[test]
    fn entries_truncations_and_the_committed_id_replay_after_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (wal, recovered) = Wal::open(dir.path(), None).expect("open");
            assert!(recovered.committed.is_none());
            write_entries(&wal, &[entry(1, "a"), entry(2, "b"), entry(3, "c")]);
            wal.write(&[Record::Committed { bytes: b"c1" }])
                .expect("commit");
            wal.write(&[
                Record::Truncate { since: 3 },
                Record::Entry {
                    index: 3,
                    bytes: b"C",
                },
                Record::Committed { bytes: b"c2" },
            ])
            .expect("write");
            assert_eq!(
                read(&wal, 1, 3),
                vec![entry(1, "a"), entry(2, "b"), entry(3, "C")]
            );
            wal.write(&[Record::Truncate { since: 2 }])
                .expect("truncate");
            assert_eq!(wal.bounds(), Some((1, 1)));
        }
        let (wal, recovered) = Wal::open(dir.path(), None).expect("reopen");
        assert_eq!(committed_bytes(&recovered), Some(&b"c2"[..]));
        assert_eq!(read(&wal, 0, 10), vec![entry(1, "a")]);
    }

    #[test]
    fn each_record_reads_back_with_its_version_and_unrecorded_ones_as_version_1() {
        // Proves the version in a record's header comes back with its payload, so that a log
        // written partly by another build decodes each record by its own version; and that a
        // record written before versions were recorded (zeros there) is version 1.
        let dir = tempfile::tempdir().expect("tempdir");
        let log_dir = dir.path().join(WAL_DIR_NAME);
        std::fs::create_dir_all(&log_dir).expect("mkdir");
        let mut bytes = Vec::new();
        encode_record(&mut bytes, KIND_ENTRY, VERSION_UNRECORDED, 1, 1, b"old");
        encode_record(&mut bytes, KIND_COMMITTED, 7, 0, 1, b"c-newer");
        encode_record(&mut bytes, KIND_ENTRY, 7, 2, 2, b"newer");
        bytes.resize(ZERO_AHEAD_BYTES as usize, 0);
        std::fs::write(log_dir.join(segment_name(1)), &bytes).expect("write a segment");
        let (wal, recovered) = Wal::open(dir.path(), None).expect("open");
        let versions: Vec<(u64, u16)> = wal
            .read(1, 2)
            .expect("read")
            .into_iter()
            .map(|(index, stored)| (index, stored.version))
            .collect();
        assert_eq!(versions, vec![(1, VERSION_OF_UNRECORDED), (2, 7)]);
        assert_eq!(
            recovered.committed,
            Some(Stored {
                version: 7,
                bytes: b"c-newer".to_vec()
            })
        );
        // This build writes its own version, and a new segment copies the committed id with
        // the version it was written in.
        write_entries(&wal, &[entry(3, "current")]);
        assert_eq!(wal.read(3, 3).expect("read")[0].1.version, RAFT_LOG.current);
        let mut active = lock(&wal.active);
        wal.roll(&mut active).expect("roll");
        drop(active);
        write_entries(&wal, &[entry(4, "next")]);
        drop(wal);
        // Only the new segment's copy of the committed id remains to be read.
        std::fs::remove_file(log_dir.join(segment_name(1))).expect("remove the first");
        let (_, recovered) = Wal::open(dir.path(), None).expect("reopen");
        assert_eq!(std::fs::read_dir(&log_dir).expect("list").count(), 1);
        assert_eq!(recovered.committed.map(|stored| stored.version), Some(7));
    }

    #[test]
    fn a_torn_last_write_is_discarded_and_damage_before_a_later_write_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let segment = dir.path().join(WAL_DIR_NAME).join(segment_name(1));
        {
            let (wal, _) = Wal::open(dir.path(), None).expect("open");
            write_entries(&wal, &[entry(1, "first")]);
            write_entries(&wal, &[entry(2, "second"), entry(3, "third")]);
        }
        // Tear the last write's first record: the write is dropped whole, the one before stays.
        let second = padded(HEADER_BYTES + 5) as u64;
        let file = OpenOptions::new().write(true).open(&segment).expect("open");
        file.write_all_at(b"torn", second + HEADER_BYTES as u64)
            .expect("tear");
        drop(file);
        {
            let (wal, _) = Wal::open(dir.path(), None).expect("a torn tail opens");
            assert_eq!(read(&wal, 0, 10), vec![entry(1, "first")]);
            write_entries(&wal, &[entry(2, "again")]);
            write_entries(&wal, &[entry(3, "more")]);
        }
        // Damage the first write now that later writes follow it: refused, with what to do.
        let file = OpenOptions::new().write(true).open(&segment).expect("open");
        file.write_all_at(b"rot", HEADER_BYTES as u64)
            .expect("damage");
        drop(file);
        let error = Wal::open(dir.path(), None).expect_err("damage is refused");
        assert!(
            error.to_string().contains("move the data directory away"),
            "{error}"
        );
    }

    /// A segment cut short is damage, never a torn write: cut inside its records (a member
    /// that read it as torn would drop entries it had acknowledged), or to nothing; a segment
    /// whose making a crash interrupted (still `.partial`) is removed and the log opens.
    #[test]
    fn a_segment_cut_short_is_refused_and_a_partial_one_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log_dir = dir.path().join(WAL_DIR_NAME);
        let segment = log_dir.join(segment_name(1));
        {
            let (wal, _) = Wal::open(dir.path(), None).expect("open");
            write_entries(&wal, &[entry(1, "first")]);
            write_entries(&wal, &[entry(2, "second"), entry(3, "third")]);
        }
        let whole = std::fs::read(&segment).expect("read");
        let records = padded(HEADER_BYTES + 5) as u64;
        for cut in [records + 20, 2 * records + 7, 0, 4096] {
            let file = OpenOptions::new().write(true).open(&segment).expect("open");
            file.set_len(cut).expect("cut");
            drop(file);
            let error = Wal::open(dir.path(), None).expect_err("a cut segment is refused");
            assert!(
                error.to_string().contains("cut short")
                    && error.to_string().contains("remove-member"),
                "cut at {cut}: {error}"
            );
            std::fs::write(&segment, &whole).expect("restore");
        }
        std::fs::write(
            log_dir.join("seg-0000000000000002.wal.partial"),
            b"half made",
        )
        .expect("a partial segment");
        let (wal, _) = Wal::open(dir.path(), None).expect("opens");
        assert_eq!(
            read(&wal, 0, 10),
            vec![entry(1, "first"), entry(2, "second"), entry(3, "third")]
        );
        assert!(!log_dir.join("seg-0000000000000002.wal.partial").exists());
    }

    #[test]
    fn what_a_torn_write_left_after_its_hole_never_comes_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let segment = dir.path().join(WAL_DIR_NAME).join(segment_name(1));
        let slot = padded(HEADER_BYTES + 5) as u64;
        {
            let (wal, _) = Wal::open(dir.path(), None).expect("open");
            write_entries(&wal, &[entry(1, "aaaaa")]);
            write_entries(&wal, &[entry(2, "bbbbb"), entry(3, "ccccc")]);
        }
        // Entry 2's sectors never landed, entry 3's did: the write is torn.
        let file = OpenOptions::new().write(true).open(&segment).expect("open");
        zero_fill(&file, slot, 2 * slot).expect("tear");
        drop(file);
        {
            let (wal, _) = Wal::open(dir.path(), None).expect("reopen");
            assert_eq!(read(&wal, 0, 10), vec![entry(1, "aaaaa")]);
            // The same size as entry 2, so it ends where the stale entry 3 begins.
            write_entries(&wal, &[entry(2, "after")]);
        }
        let (wal, _) = Wal::open(dir.path(), None).expect("reopen again");
        assert_eq!(
            read(&wal, 0, 10),
            vec![entry(1, "aaaaa"), entry(2, "after")],
            "the stale entry 3 was zeroed when the torn write was dropped"
        );
    }

    #[test]
    fn full_segments_roll_over_keep_the_committed_id_and_are_removed_by_a_purge() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = vec![7u8; 1024 * 1024];
        {
            let (wal, _) = Wal::open(dir.path(), None).expect("open");
            wal.write(&[Record::Committed { bytes: b"old" }])
                .expect("commit");
            let mut index = 1;
            while wal.segment_count() < 3 {
                write_entries(&wal, &[(index, big.clone())]);
                index += 1;
            }
            let (first, last) = wal.bounds().expect("entries");
            assert_eq!(first, 1);
            wal.purge(last - 1).expect("purge");
            assert!(
                wal.segment_count() < 3,
                "segments before the purge point are gone"
            );
            assert_eq!(wal.bounds(), Some((last, last)));
        }
        let (wal, recovered) = Wal::open(dir.path(), None).expect("reopen");
        assert_eq!(
            committed_bytes(&recovered),
            Some(&b"old"[..]),
            "the committed id outlives the segment it was first written in"
        );
        assert!(wal.bounds().is_some());
    }

    /// One write of the property test below.
    #[derive(Debug, Clone)]
    enum Step {
        /// Entries from the log's end on, of these sizes.
        Append(Vec<usize>),
        /// Truncate at this fraction (per mille) of the way through the log.
        Truncate(u16),
        Committed(Vec<u8>),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => proptest::collection::vec(0usize..3_000, 1..5).prop_map(Step::Append),
            1 => (0u16..1_000).prop_map(Step::Truncate),
            1 => proptest::collection::vec(any::<u8>(), 1..40).prop_map(Step::Committed),
        ]
    }

    /// What the log should hold: its entries and its committed id.
    #[derive(Debug, Clone, Default, PartialEq)]
    struct Model {
        entries: BTreeMap<u64, Vec<u8>>,
        committed: Option<Vec<u8>>,
    }

    impl Model {
        fn apply(&mut self, record: &Record<'_>) {
            match *record {
                Record::Entry { index, bytes } => {
                    self.entries.split_off(&index);
                    self.entries.insert(index, bytes.to_vec());
                }
                Record::Truncate { since } => {
                    self.entries.split_off(&since);
                }
                Record::Committed { bytes } => self.committed = Some(bytes.to_vec()),
            }
        }
    }

    fn records_of(step: &Step, model: &Model, payloads: &mut Vec<(u64, Vec<u8>)>) -> Option<u64> {
        let next = model.entries.keys().next_back().map_or(1, |last| last + 1);
        match step {
            Step::Append(sizes) => {
                for (offset, size) in sizes.iter().enumerate() {
                    let index = next + offset as u64;
                    payloads.push((index, vec![(index % 251) as u8; *size]));
                }
                None
            }
            Step::Truncate(per_mille) => Some(1 + (next - 1) * u64::from(*per_mille) / 1_000),
            Step::Committed(_) => None,
        }
    }

    proptest::proptest! {
        // 48 cases unless `PROPTEST_CASES` asks for a deeper search.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|cases| cases.parse().ok())
                .unwrap_or(48)
        ))]

        /// However a crash tears the last write (a run of its bytes lost, what follows it
        /// possibly kept, as when sectors land out of order), reopening gives exactly the
        /// writes before it plus the records of the last one before the hole; nothing synced
        /// is lost, nothing torn is read, no stale record comes back, and the log goes on.
        #[test]
        fn a_crash_loses_at_most_the_torn_part_of_the_last_write(
            steps in proptest::collection::vec(step(), 1..12),
            cut_per_mille in 0u16..=1_000,
            hole_per_mille in 1u16..=1_000,
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let segment = dir.path().join(WAL_DIR_NAME).join(segment_name(1));
            let mut model = Model::default();
            let mut before_last = Model::default();
            let mut last_records: Vec<(Vec<u64>, Model)> = Vec::new();
            let mut last_write = (0u64, 0u64);
            {
                let (wal, _) = Wal::open(dir.path(), None).expect("open");
                for step in &steps {
                    let mut payloads = Vec::new();
                    let since = records_of(step, &model, &mut payloads);
                    let mut records = Record::entries(&payloads);
                    if let Some(since) = since {
                        records.push(Record::Truncate { since });
                    }
                    if let Step::Committed(bytes) = step {
                        records.push(Record::Committed { bytes });
                    }
                    let start = lock(&wal.active).position;
                    wal.write(&records).expect("write");
                    let end = lock(&wal.active).position;
                    before_last = model.clone();
                    last_records.clear();
                    let written = std::fs::read(&segment).expect("read the segment");
                    let mut at = start as usize;
                    for record in &records {
                        model.apply(record);
                        let len = match record {
                            Record::Entry { bytes, .. } | Record::Committed { bytes } => bytes.len(),
                            Record::Truncate { .. } => 0,
                        };
                        // Where the record's nonzero bytes are: losing zeros that were zeros
                        // before (padding, zero bytes in it) changes nothing.
                        let bytes = &written[at..at + HEADER_BYTES + len];
                        let nonzero: Vec<u64> = bytes
                            .iter()
                            .enumerate()
                            .filter(|(_, b)| **b != 0)
                            .map(|(i, _)| (at + i) as u64)
                            .collect();
                        last_records.push((nonzero, model.clone()));
                        at += padded(HEADER_BYTES + len);
                    }
                    last_write = (start, end);
                }
            }
            // The crash: a run of the last write's bytes from the cut on never reached the disk.
            let (start, end) = last_write;
            let cut = start + (end - start) * u64::from(cut_per_mille) / 1_000;
            let hole_end = cut + (end - cut) * u64::from(hole_per_mille) / 1_000;
            let file = OpenOptions::new().write(true).open(&segment).expect("open");
            zero_fill(&file, cut, hole_end).expect("tear");
            drop(file);
            // Recovery keeps the last write's records up to the first the hole touched.
            let expected = last_records
                .iter()
                .take_while(|(nonzero, _)| !nonzero.iter().any(|at| (cut..hole_end).contains(at)))
                .last()
                .map_or(before_last, |(_, state)| state.clone());

            let check = |wal: &Wal, recovered: &Recovered, expected: &Model| {
                let read: BTreeMap<u64, Vec<u8>> = read(wal, 0, u64::MAX - 1).into_iter().collect();
                let summary = |entries: &BTreeMap<u64, Vec<u8>>| -> Vec<(u64, usize)> {
                    entries.iter().map(|(index, bytes)| (*index, bytes.len())).collect()
                };
                assert_eq!(summary(&read), summary(&expected.entries));
                assert_eq!(&read, &expected.entries);
                assert_eq!(committed_bytes(recovered), expected.committed.as_deref());
            };
            let (wal, recovered) = Wal::open(dir.path(), None).expect("reopen after the crash");
            check(&wal, &recovered, &expected);
            // The log goes on from there, and a second reopen agrees.
            let mut expected = expected;
            let next = expected.entries.keys().next_back().map_or(1, |last| last + 1);
            let more = [(next, b"after".to_vec())];
            wal.write(&Record::entries(&more)).expect("write after");
            expected.apply(&Record::entries(&more)[0]);
            drop(wal);
            let (wal, recovered) = Wal::open(dir.path(), None).expect("reopen again");
            check(&wal, &recovered, &expected);
        }
    }
}
