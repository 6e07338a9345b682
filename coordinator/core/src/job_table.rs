//! [`JobTable`]: every job record, by slot (`JobId.0 - 1`), in fixed-size chunks.
//!
//! Jobs are never removed, so the table only grows. A plain `Vec` grows by doubling, and
//! unless the allocator can remap the pages (glibc's can, mimalloc's, which the coordinator
//! uses, cannot) each doubling copies every record it holds, under the state machine's
//! write lock, stalling every apply and answer on the leader for a time that grows with the
//! table (BENCHMARKS.md has the measurement). In chunks, a push at most allocates one new
//! chunk and no record ever moves.
//!
//! Chunks are shared copy-on-write: cloning a table clones one pointer per chunk, and a chunk
//! is copied only when a record in it changes while another table still shares it. A snapshot
//! takes such a clone under the state machine's lock and encodes it after letting go
//! ([`crate::snapshot`]), so applies no longer wait for the whole table to be encoded.
//!
//! It serializes as a sequence of records, exactly as the `Vec` it replaces did, so
//! snapshots read and write the same bytes.

use std::fmt;
use std::sync::Arc;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::state::JobRecord;

/// Records per chunk: about 2 MiB of records, a few milliseconds' worth of submits at the
/// busiest, and small enough that a half-empty last chunk costs little.
pub const JOB_CHUNK_LEN: usize = 4_096;

/// Job records by slot. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobTable {
    /// Full chunks, then the last one, which may be partly filled. Every chunk is allocated
    /// with room for [`JOB_CHUNK_LEN`] records and never grows past it.
    chunks: Vec<Arc<Vec<JobRecord>>>,
    len: usize,
}

impl JobTable {
    pub fn new() -> JobTable {
        JobTable::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, slot: usize) -> Option<&JobRecord> {
        self.chunks
            .get(slot / JOB_CHUNK_LEN)?
            .get(slot % JOB_CHUNK_LEN)
    }

    /// The record at `slot`, to change; copies its chunk first if a clone still shares it.
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut JobRecord> {
        let chunk = self.chunks.get_mut(slot / JOB_CHUNK_LEN)?;
        if slot % JOB_CHUNK_LEN >= chunk.len() {
            return None;
        }
        Arc::make_mut(chunk).get_mut(slot % JOB_CHUNK_LEN)
    }

    /// Appends `job` at slot `len()`.
    pub fn push(&mut self, job: JobRecord) {
        let room = self
            .chunks
            .last()
            .is_some_and(|chunk| chunk.len() < JOB_CHUNK_LEN);
        if !room {
            self.chunks
                .push(Arc::new(Vec::with_capacity(JOB_CHUNK_LEN)));
        }
        if let Some(chunk) = self.chunks.last_mut() {
            // A shared last chunk is copied with its full capacity, so it still never grows.
            let chunk = Arc::make_mut(chunk);
            if chunk.capacity() < JOB_CHUNK_LEN {
                chunk.reserve_exact(JOB_CHUNK_LEN - chunk.len());
            }
            chunk.push(job);
            self.len += 1;
        }
    }

    /// The records in slot order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &JobRecord> + '_ {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }
}

impl FromIterator<JobRecord> for JobTable {
    fn from_iter<I: IntoIterator<Item = JobRecord>>(records: I) -> JobTable {
        let mut table = JobTable::new();
        for record in records {
            table.push(record);
        }
        table
    }
}

impl Serialize for JobTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len))?;
        for record in self.iter() {
            seq.serialize_element(record)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for JobTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JobTable, D::Error> {
        struct Records;

        impl<'de> Visitor<'de> for Records {
            type Value = JobTable;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of job records")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JobTable, A::Error> {
                // No capacity from the length prefix: it is outside input until every record
                // it promises has been read.
                let mut table = JobTable::new();
                while let Some(record) = seq.next_element()? {
                    table.push(record);
                }
                Ok(table)
            }
        }

        deserializer.deserialize_seq(Records)
    }
}

#[cfg(test)]
mod tests {
    use quotient_common::{JobId, JobSpec, JobState};

    use super::*;

    fn record(slot: usize) -> JobRecord {
        let spec = JobSpec::new("team-a", 1, 1, vec![format!("run-{slot}")]);
        JobRecord::new(JobId(slot as u64 + 1), spec, slot as u64)
    }

    fn bincode_config() -> impl bincode::config::Config {
        bincode::config::standard()
    }

    #[test]
    fn slots_hold_their_records_across_chunks() {
        let count = JOB_CHUNK_LEN * 2 + 3;
        let mut table = JobTable::new();
        assert!(table.is_empty());
        for slot in 0..count {
            table.push(record(slot));
        }
        assert_eq!(table.len(), count);
        for slot in [0, JOB_CHUNK_LEN - 1, JOB_CHUNK_LEN, count - 1] {
            assert_eq!(table.get(slot), Some(&record(slot)), "slot {slot}");
        }
        assert_eq!(table.get(count), None);
        let ids: Vec<u64> = table.iter().map(|job| job.id.0).collect();
        assert_eq!(ids, (1..=count as u64).collect::<Vec<_>>());
        assert_eq!(
            table.iter().next_back().map(|job| job.id.0),
            Some(count as u64)
        );

        let job = table
            .get_mut(JOB_CHUNK_LEN)
            .expect("the first slot of the second chunk");
        job.state = JobState::Cancelled;
        assert_eq!(
            table.get(JOB_CHUNK_LEN).map(|job| job.state),
            Some(JobState::Cancelled)
        );
        assert_eq!(table.get_mut(count), None);
    }

    #[test]
    fn growing_never_moves_a_record() {
        let mut table = JobTable::new();
        table.push(record(0));
        let first: *const JobRecord = table.get(0).expect("pushed");
        for slot in 1..JOB_CHUNK_LEN * 3 {
            table.push(record(slot));
        }
        let still: *const JobRecord = table.get(0).expect("pushed");
        assert_eq!(first, still, "the first record moved when the table grew");
    }

    #[test]
    fn a_clone_shares_chunks_until_one_side_changes_a_record() {
        let mut original: JobTable = (0..JOB_CHUNK_LEN + 3).map(record).collect();
        let mut copy = original.clone();
        let first: *const JobRecord = original.get(0).expect("pushed");
        assert_eq!(
            first,
            copy.get(0).expect("cloned") as *const JobRecord,
            "shared"
        );

        copy.get_mut(0).expect("slot 0").state = JobState::Cancelled;
        copy.push(record(JOB_CHUNK_LEN + 3));
        assert_eq!(
            original.get(0),
            Some(&record(0)),
            "the original kept its record"
        );
        assert_eq!(original.len(), JOB_CHUNK_LEN + 3);
        assert_eq!(copy.get(0).map(|job| job.state), Some(JobState::Cancelled));
        assert_eq!(copy.len(), JOB_CHUNK_LEN + 4);
        // The copied last chunk keeps its full room, so it never reallocates.
        let last = copy.chunks.last().expect("a chunk");
        assert!(last.capacity() >= JOB_CHUNK_LEN);

        original.get_mut(1).expect("slot 1").attempts = 7;
        assert_eq!(copy.get(1).map(|job| job.attempts), Some(0));
        assert_eq!(original.get_mut(JOB_CHUNK_LEN + 3), None);
    }

    #[test]
    fn it_serializes_exactly_as_the_vec_it_replaced() {
        let records: Vec<JobRecord> = (0..JOB_CHUNK_LEN + 5).map(record).collect();
        let table: JobTable = records.iter().cloned().collect();
        let from_table = bincode::serde::encode_to_vec(&table, bincode_config()).expect("encodes");
        let from_vec = bincode::serde::encode_to_vec(&records, bincode_config()).expect("encodes");
        assert_eq!(from_table, from_vec);

        let (back, read): (JobTable, usize) =
            bincode::serde::decode_from_slice(&from_vec, bincode_config()).expect("decodes");
        assert_eq!(read, from_vec.len());
        assert_eq!(back, table);

        let empty =
            bincode::serde::encode_to_vec(JobTable::new(), bincode_config()).expect("encodes");
        let (back, _): (JobTable, usize) =
            bincode::serde::decode_from_slice(&empty, bincode_config()).expect("decodes");
        assert!(back.is_empty());
    }

    #[test]
    fn a_length_prefix_larger_than_the_input_is_an_error_not_an_allocation() {
        // A sequence claiming u32::MAX records with none behind it.
        let bytes =
            bincode::serde::encode_to_vec(u64::from(u32::MAX), bincode_config()).expect("encodes");
        let decoded: Result<(JobTable, usize), _> =
            bincode::serde::decode_from_slice(&bytes, bincode_config());
        assert!(decoded.is_err());
    }
}
