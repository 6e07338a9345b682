//! [`JobTable`]: every job record, by slot (`JobId.0 - 1`), in fixed-size chunks.
//!
//! Ids are issued in order and never reused; a finished job is removed once its retention
//! ends (`Command::ExpireFinished`), which leaves its slot vacant. A chunk whose slots are all
//! issued and all vacant gives its memory back, so a table that keeps the last week of jobs
//! costs what that week holds, plus a record's size for each vacant slot of the chunks still partly in use.
//!
//! A plain `Vec` grows by doubling, and unless the allocator can remap the pages (glibc's
//! can, mimalloc's, which the coordinator uses, cannot) each doubling copies every record it
//! holds, under the state machine's write lock, stalling every apply and answer on the leader
//! for a time that grows with the table (BENCHMARKS.md has the measurement). In chunks, a push
//! at most allocates one new chunk and no record ever moves.
//!
//! Chunks are shared copy-on-write: cloning a table clones one pointer per chunk, and a chunk
//! is copied only when a record in it changes while another table still shares it. A snapshot
//! takes such a clone under the state machine's lock and encodes it after letting go
//! ([`crate::snapshot`]), so applies no longer wait for the whole table to be encoded. Records
//! sit in their chunk (a vacant slot is a `None` of a record's size): a record behind its own
//! pointer cost a cache miss on every access and doubled the scheduler's incremental round
//! (BENCHMARKS.md).
//!
//! It serializes as the number of ids issued, then the records held, in id order.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeTuple};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::state::JobRecord;

/// Slots per chunk: a few milliseconds' worth of submits at the busiest, and small enough
/// that a chunk kept for a few long-lived jobs costs little (32 KiB of slots).
pub const JOB_CHUNK_LEN: usize = 4_096;

/// One chunk of slots and how many of them hold a record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Chunk {
    /// Allocated with room for [`JOB_CHUNK_LEN`] slots, never grown past it; `None` (no
    /// memory) once every slot is issued and vacant.
    slots: Option<Arc<Vec<Option<JobRecord>>>>,
    live: usize,
}

impl Chunk {
    fn with_room() -> Chunk {
        Chunk {
            slots: Some(Arc::new(Vec::with_capacity(JOB_CHUNK_LEN))),
            live: 0,
        }
    }
}

/// The most slots between the oldest chunk still held and the newest id: what a snapshot may
/// claim (a few bytes claiming two records 2^60 ids apart must not make a coordinator
/// allocate the chunks between them). Four billion ids between the oldest job kept and the
/// newest is millennia of submits.
pub const JOB_SLOT_SPAN_MAX: usize = 1 << 32;

/// The most job ids ever issued: 2^53, what a JSON number holds exactly.
pub const JOB_IDS_MAX: usize = 1 << 53;

/// Job records by slot. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobTable {
    /// The chunks from `base` on; those before were all vacant and are dropped.
    chunks: VecDeque<Chunk>,
    /// The chunk number of `chunks[0]`.
    base: usize,
    /// Slots issued: the id of the newest job ever added.
    issued: usize,
    /// Records held.
    live: usize,
}

impl JobTable {
    pub fn new() -> JobTable {
        JobTable::default()
    }

    /// Records held (removed jobs not counted).
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Slots issued, held or vacant: the next job's slot.
    pub fn issued(&self) -> usize {
        self.issued
    }

    fn chunk(&self, slot: usize) -> Option<&Chunk> {
        self.chunks
            .get((slot / JOB_CHUNK_LEN).checked_sub(self.base)?)
    }

    pub fn get(&self, slot: usize) -> Option<&JobRecord> {
        self.chunk(slot)?
            .slots
            .as_ref()?
            .get(slot % JOB_CHUNK_LEN)?
            .as_ref()
    }

    /// The record at `slot`, to change; copies its chunk first if a clone still shares it.
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut JobRecord> {
        self.get(slot)?;
        let index = slot / JOB_CHUNK_LEN - self.base;
        let slots = self.chunks.get_mut(index)?.slots.as_mut()?;
        Arc::make_mut(slots).get_mut(slot % JOB_CHUNK_LEN)?.as_mut()
    }

    /// Appends `job` at slot `issued()`.
    pub fn push(&mut self, job: JobRecord) {
        self.push_slot(Some(job));
    }

    fn push_slot(&mut self, slot: Option<JobRecord>) {
        if self.issued.is_multiple_of(JOB_CHUNK_LEN) {
            if self.chunks.is_empty() {
                self.base = self.issued / JOB_CHUNK_LEN;
            }
            self.chunks.push_back(Chunk::with_room());
        }
        let chunk = self.chunks.back_mut().expect("a chunk with room");
        let held = slot.is_some();
        let slots = chunk.slots.get_or_insert_with(Default::default);
        // A shared last chunk is copied with its full capacity, so it still never grows.
        let slots = Arc::make_mut(slots);
        if slots.capacity() < JOB_CHUNK_LEN {
            slots.reserve_exact(JOB_CHUNK_LEN - slots.len());
        }
        slots.push(slot);
        if held {
            chunk.live += 1;
            self.live += 1;
        }
        self.issued += 1;
        self.free_vacant(self.chunks.len() - 1);
    }

    /// Takes the record out of `slot`, leaving it vacant for good.
    pub fn remove(&mut self, slot: usize) -> Option<JobRecord> {
        self.get(slot)?;
        let index = slot / JOB_CHUNK_LEN - self.base;
        let chunk = self.chunks.get_mut(index)?;
        let slots = Arc::make_mut(chunk.slots.as_mut()?);
        let record = slots.get_mut(slot % JOB_CHUNK_LEN)?.take()?;
        chunk.live -= 1;
        self.live -= 1;
        self.free_vacant(index);
        Some(record)
    }

    /// Gives back the memory of `chunks[index]` once every slot of it is issued and vacant,
    /// and drops the vacant chunks at the front.
    fn free_vacant(&mut self, index: usize) {
        let chunk = &mut self.chunks[index];
        let full = chunk
            .slots
            .as_ref()
            .is_none_or(|slots| slots.len() == JOB_CHUNK_LEN);
        if chunk.live == 0 && full {
            chunk.slots = None;
        }
        while self
            .chunks
            .front()
            .is_some_and(|chunk| chunk.slots.is_none())
        {
            self.chunks.pop_front();
            self.base += 1;
        }
    }

    /// The records held, in slot order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &JobRecord> + '_ {
        self.chunks.iter().flat_map(|chunk| {
            chunk
                .slots
                .iter()
                .flat_map(|slots| slots.iter().filter_map(Option::as_ref))
        })
    }

    /// The records held, newest first, from the slot before `before` (all: `issued()`) down.
    pub fn iter_before(&self, before: usize) -> impl Iterator<Item = &JobRecord> + '_ {
        let before = before.min(self.issued);
        let end = before.div_ceil(JOB_CHUNK_LEN).max(self.base);
        (self.base..end).rev().flat_map(move |number| {
            let limit = if number == before / JOB_CHUNK_LEN {
                before % JOB_CHUNK_LEN
            } else {
                JOB_CHUNK_LEN
            };
            self.chunks[number - self.base]
                .slots
                .iter()
                .flat_map(move |slots| {
                    slots[..limit.min(slots.len())]
                        .iter()
                        .rev()
                        .filter_map(Option::as_ref)
                })
        })
    }

    /// Places a record read back by its id: the slots before it that are not yet issued
    /// are issued vacant. Ids must come in increasing order.
    fn place(&mut self, job: JobRecord) -> Result<(), String> {
        let slot = usize::try_from(job.id.0)
            .ok()
            .and_then(|id| id.checked_sub(1))
            .ok_or_else(|| format!("a job record with id {}", job.id))?;
        if slot < self.issued {
            return Err(format!(
                "{} comes after job {}: records must be in id order",
                job.id, self.issued
            ));
        }
        self.issue_vacant_up_to(slot)?;
        self.push(job);
        Ok(())
    }

    /// Issues vacant slots until `issued()` is `slot`.
    fn issue_vacant_up_to(&mut self, slot: usize) -> Result<(), String> {
        if slot > JOB_IDS_MAX {
            return Err(format!(
                "{slot} job ids issued: over the most ids there are ({JOB_IDS_MAX})"
            ));
        }
        if self.chunks.is_empty() {
            // Nothing held: whole chunks are skipped without a trace.
            let skip = (slot / JOB_CHUNK_LEN) * JOB_CHUNK_LEN;
            if skip > self.issued {
                self.issued = skip;
                self.base = skip / JOB_CHUNK_LEN;
            }
        } else if slot - self.base * JOB_CHUNK_LEN > JOB_SLOT_SPAN_MAX {
            return Err(format!(
                "job {} and job {} are over {JOB_SLOT_SPAN_MAX} ids apart",
                self.base * JOB_CHUNK_LEN + 1,
                slot + 1
            ));
        }
        while self.issued < slot {
            if self.issued.is_multiple_of(JOB_CHUNK_LEN) && slot - self.issued >= JOB_CHUNK_LEN {
                // A whole chunk vacant: no memory for it.
                self.chunks.push_back(Chunk::default());
                self.issued += JOB_CHUNK_LEN;
            } else {
                self.push_slot(None);
            }
        }
        Ok(())
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

/// The records held, as a sequence.
struct Records<'a>(&'a JobTable);

impl Serialize for Records<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.live))?;
        for record in self.0.iter() {
            seq.serialize_element(record)?;
        }
        seq.end()
    }
}

impl Serialize for JobTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tuple = serializer.serialize_tuple(2)?;
        tuple.serialize_element(&(self.issued as u64))?;
        tuple.serialize_element(&Records(self))?;
        tuple.end()
    }
}

/// Reads a sequence of records into a table, each placed by its id.
pub(crate) struct RecordsInto<'a>(pub(crate) &'a mut JobTable);

impl<'de> DeserializeSeed<'de> for RecordsInto<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RecordsInto<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of job records in id order")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        // No capacity from the length prefix: it is outside input until every record it
        // promises has been read.
        while let Some(record) = seq.next_element::<JobRecord>()? {
            self.0.place(record).map_err(serde::de::Error::custom)?;
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for JobTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JobTable, D::Error> {
        struct Table;

        impl<'de> Visitor<'de> for Table {
            type Value = JobTable;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the ids issued and the job records")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JobTable, A::Error> {
                let issued: u64 = seq
                    .next_element()?
                    .ok_or_else(|| serde::de::Error::invalid_length(0, &self))?;
                let mut table = JobTable::new();
                seq.next_element_seed(RecordsInto(&mut table))?
                    .ok_or_else(|| serde::de::Error::invalid_length(1, &self))?;
                let issued = usize::try_from(issued).map_err(serde::de::Error::custom)?;
                if issued < table.issued {
                    return Err(serde::de::Error::custom(format!(
                        "{issued} job ids issued, but a record has id {}",
                        table.issued
                    )));
                }
                table
                    .issue_vacant_up_to(issued)
                    .map_err(serde::de::Error::custom)?;
                Ok(table)
            }
        }

        deserializer.deserialize_tuple(2, Table)
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
        assert_eq!(table.issued(), count);
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
        let last = copy.chunks.back().expect("a chunk");
        assert!(last.slots.as_ref().expect("slots").capacity() >= JOB_CHUNK_LEN);

        original.get_mut(1).expect("slot 1").attempts = 7;
        assert_eq!(copy.get(1).map(|job| job.attempts), Some(0));
        assert_eq!(original.get_mut(JOB_CHUNK_LEN + 3), None);
    }

    #[test]
    fn removed_slots_stay_vacant_and_a_vacant_chunk_gives_its_memory_back() {
        let count = JOB_CHUNK_LEN * 2 + 10;
        let mut table: JobTable = (0..count).map(record).collect();
        let clone = table.clone();
        assert_eq!(table.remove(5), Some(record(5)));
        assert_eq!(table.remove(5), None, "removed once");
        assert_eq!(table.get(5), None);
        assert_eq!(table.get_mut(5), None);
        assert_eq!(table.len(), count - 1);
        assert_eq!(table.issued(), count);
        assert_eq!(clone.get(5), Some(&record(5)), "the clone keeps it");
        for slot in 0..JOB_CHUNK_LEN {
            table.remove(slot);
        }
        assert_eq!(table.base, 1, "the vacant chunk is dropped");
        assert_eq!(table.get(0), None);
        assert_eq!(table.iter().next().map(|job| job.id.0), Some(4097));
        // The partly filled last chunk is never freed: pushes go on into it.
        for slot in JOB_CHUNK_LEN * 2..count {
            table.remove(slot);
        }
        table.push(record(count));
        assert_eq!(table.get(count), Some(&record(count)));
        assert_eq!(table.issued(), count + 1);
        let ids: Vec<u64> = table.iter().map(|job| job.id.0).collect();
        let mut expected: Vec<u64> =
            (JOB_CHUNK_LEN as u64 + 1..=JOB_CHUNK_LEN as u64 * 2).collect();
        expected.push(count as u64 + 1);
        assert_eq!(ids, expected);
    }

    #[test]
    fn newest_first_from_any_slot_passes_over_the_vacant_ones() {
        let count = JOB_CHUNK_LEN * 3 + 5;
        let mut table: JobTable = (0..count).map(record).collect();
        let removed: Vec<usize> = (0..JOB_CHUNK_LEN + 2)
            .chain([JOB_CHUNK_LEN * 2, JOB_CHUNK_LEN * 3 + 4])
            .collect();
        for slot in &removed {
            table.remove(*slot);
        }
        for before in [
            0,
            1,
            JOB_CHUNK_LEN,
            JOB_CHUNK_LEN + 3,
            JOB_CHUNK_LEN * 2 + 1,
            count,
            count + 9,
        ] {
            let got: Vec<u64> = table.iter_before(before).map(|job| job.id.0).collect();
            let expected: Vec<u64> = (0..before.min(count))
                .rev()
                .filter(|slot| !removed.contains(slot))
                .map(|slot| slot as u64 + 1)
                .collect();
            assert_eq!(got, expected, "before slot {before}");
        }
    }

    #[test]
    fn it_round_trips_with_its_vacancies_and_the_ids_issued() {
        let mut table: JobTable = (0..JOB_CHUNK_LEN * 3 + 5).map(record).collect();
        for slot in (0..JOB_CHUNK_LEN + 7).chain([JOB_CHUNK_LEN * 2 + 1]) {
            table.remove(slot);
        }
        // The newest jobs removed too: the ids issued still say where the next one goes.
        for slot in JOB_CHUNK_LEN * 3..JOB_CHUNK_LEN * 3 + 5 {
            table.remove(slot);
        }
        let bytes = bincode::serde::encode_to_vec(&table, bincode_config()).expect("encodes");
        let (back, read): (JobTable, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode_config()).expect("decodes");
        assert_eq!(read, bytes.len());
        assert_eq!(back.issued(), table.issued());
        assert_eq!(back.len(), table.len());
        assert!(back.iter().eq(table.iter()));
        assert_eq!(back.get(JOB_CHUNK_LEN * 2 + 1), None);
        assert_eq!(back.base, 1, "read back without the vacant chunk");

        let empty =
            bincode::serde::encode_to_vec(JobTable::new(), bincode_config()).expect("encodes");
        let (back, _): (JobTable, usize) =
            bincode::serde::decode_from_slice(&empty, bincode_config()).expect("decodes");
        assert!(back.is_empty());
    }

    #[test]
    fn records_out_of_order_or_beyond_the_ids_issued_are_refused() {
        let encode = |issued: u64, records: &[JobRecord]| {
            bincode::serde::encode_to_vec((issued, records), bincode_config()).expect("encodes")
        };
        let decode = |bytes: &[u8]| {
            bincode::serde::decode_from_slice::<JobTable, _>(bytes, bincode_config()).map(|t| t.0)
        };
        assert!(decode(&encode(3, &[record(1), record(0)])).is_err());
        assert!(decode(&encode(3, &[record(1), record(1)])).is_err());
        assert!(decode(&encode(1, &[record(4)])).is_err());
        assert!(
            decode(&encode(u64::MAX, &[])).is_err(),
            "a claim of 2^64 ids"
        );
        let table = decode(&encode(9, &[record(2)])).expect("a gap is fine");
        assert_eq!((table.issued(), table.len()), (9, 1));
    }

    #[test]
    fn a_length_prefix_larger_than_the_input_is_an_error_not_an_allocation() {
        // Two ids issued, then a sequence claiming u32::MAX records with none behind it.
        let bytes = bincode::serde::encode_to_vec((2u64, u64::from(u32::MAX)), bincode_config())
            .expect("encodes");
        let decoded: Result<(JobTable, usize), _> =
            bincode::serde::decode_from_slice(&bytes, bincode_config());
        assert!(decoded.is_err());
    }
}
