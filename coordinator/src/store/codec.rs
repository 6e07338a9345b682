//! The byte encoding of the values the Raft store writes to disk: log entries, the vote, log
//! ids and snapshot metadata. Values go through serde into bincode 2 (standard configuration, varint
//! integers) with a size limit, so that a corrupted length prefix read back from disk is refused
//! with an error instead of allocating without bound. Keeping the encoding behind these few
//! functions lets it be swapped in one place.
//!
//! Every value is written in the current version of the Raft log encoding
//! (`quotient_common::version::RAFT_LOG`), and the version is stored beside it (a log record's
//! header, a version key next to a redb value). A value is read back with the decoder of its
//! own version ([`decode_stored`], and [`VersionedEntries`] for log entries, whose type is the
//! type config's): a value of a version this build does not read is refused, naming both.

use std::path::Path;

use openraft::RaftTypeConfig;
use quotient_common::version::{VersionError, Writer, RAFT_LOG};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The largest encoded log entry, vote or log id that is written or read back (16 MiB).
///
/// A log entry that the store cannot write stops Raft, so the leader never proposes one this
/// large: `proposer::PROPOSAL_BYTES_MAX` bounds an entry's commands with room to spare for
/// the entry around them, and for the AppendEntries around one entry on the wire, whose frame
/// limit is no smaller than this.
pub const MAX_ENTRY_BYTES: usize = 16 * 1024 * 1024;

const _: () = assert!(MAX_ENTRY_BYTES <= quotient_common::frame::MAX_FRAME_BYTES);

/// Why a value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value (encoded, or as stored) is larger than the limit.
    #[error("value of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The size of the value in bytes.
        len: usize,
        /// The limit it exceeded.
        limit: usize,
    },
    /// bincode refused to encode the value.
    #[error("encoding failed: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// The stored bytes are not a valid encoding of the expected type.
    #[error("decoding failed (corrupted or incompatible data): {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// The stored bytes decoded, but bytes were left over after the value.
    #[error("decoding left {trailing} trailing bytes (corrupted data)")]
    Trailing {
        /// How many bytes were not consumed.
        trailing: usize,
    },
    /// The value is in a version of the Raft log encoding this build does not read.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// A version this build reads has no decoder for this type (a programming error: the
    /// version was bumped without [`VersionedEntries::decode_entry`] learning it).
    #[error("this build has no decoder for version {version} of the Raft log encoding")]
    NoCodec {
        /// The version found.
        version: u16,
    },
}

/// The version of a value stored before versions were recorded (a log record with zeros in its
/// version field, a redb value without a version key): version 1, whose encoding it is.
pub const VERSION_OF_UNRECORDED: u16 = 1;

/// How the log entries of a type config are read in each version of the Raft log encoding.
/// The provided method reads the current version only; when the entry's types change and
/// `RAFT_LOG` is bumped, the type config decodes the previous version's types and converts
/// them here (`quotient_common::version` says how).
pub trait VersionedEntries: RaftTypeConfig {
    /// An entry stored in `version`, which [`check_version`] found readable.
    fn decode_entry(version: u16, bytes: &[u8]) -> Result<Self::Entry, CodecError> {
        decode_current(version, bytes)
    }
}

/// `version`, if this build reads values stored in it; else the error naming both versions and
/// `place` (the file it was found in).
pub fn check_version(version: u16, place: &Path) -> Result<u16, CodecError> {
    Ok(RAFT_LOG.check(version, Writer::File(place.display().to_string()))?)
}

/// Decodes a value stored in `version` at `place`: one of this build's versions, read by the
/// decoder of the current one. Only for the store's own values, the vote and log ids: they are
/// openraft's and encode the same in every version of the Raft log so far (version 2 changed
/// the entries' commands only); entries go through [`VersionedEntries::decode_entry`].
pub fn decode_stored<T: DeserializeOwned>(
    version: u16,
    bytes: &[u8],
    place: &Path,
) -> Result<T, CodecError> {
    check_version(version, place)?;
    decode_value(bytes)
}

/// [`decode_value`] when `version` is the current one; [`CodecError::NoCodec`] otherwise.
pub fn decode_current<T: DeserializeOwned>(version: u16, bytes: &[u8]) -> Result<T, CodecError> {
    if version != RAFT_LOG.current {
        return Err(CodecError::NoCodec { version });
    }
    decode_value(bytes)
}

macro_rules! limited_config {
    ($limit:expr) => {
        bincode::config::standard().with_limit::<{ $limit }>()
    };
}

/// Encodes a log entry, vote or log id, refusing values over [`MAX_ENTRY_BYTES`].
pub fn encode_value<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let bytes = bincode::serde::encode_to_vec(value, limited_config!(MAX_ENTRY_BYTES))?;
    check_len(bytes.len(), MAX_ENTRY_BYTES)?;
    Ok(bytes)
}

/// How many bytes [`encode_value`] writes for `value` (without its limit), counted without
/// writing them: what a caller compares with a limit before the value is encoded for good.
pub fn encoded_len<T: Serialize>(value: &T) -> Result<usize, CodecError> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, bincode::config::standard())?;
    Ok(size.bytes_written)
}

/// Decodes a value written by [`encode_value`], refusing more than [`MAX_ENTRY_BYTES`].
pub fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    check_len(bytes.len(), MAX_ENTRY_BYTES)?;
    let (value, used) = bincode::serde::decode_from_slice(bytes, limited_config!(MAX_ENTRY_BYTES))?;
    check_consumed(bytes.len(), used)?;
    Ok(value)
}

fn check_len(len: usize, limit: usize) -> Result<(), CodecError> {
    if len > limit {
        return Err(CodecError::TooLarge { len, limit });
    }
    Ok(())
}

fn check_consumed(len: usize, used: usize) -> Result<(), CodecError> {
    if used != len {
        return Err(CodecError::Trailing {
            trailing: len.saturating_sub(used),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let value = (7u64, String::from("seven"), vec![1u8, 2, 3]);
        let bytes = encode_value(&value).expect("encode");
        let back: (u64, String, Vec<u8>) = decode_value(&bytes).expect("decode");
        assert_eq!(back, value);
    }

    #[test]
    fn encoded_len_is_the_length_encode_value_writes() {
        for value in [
            vec![],
            vec![String::from("x"); 3],
            vec!["é".repeat(300); 200],
        ] {
            let written = encode_value(&value).expect("encode").len();
            assert_eq!(encoded_len(&value).expect("count"), written);
        }
    }

    #[test]
    fn huge_length_prefix_is_refused() {
        // A varint length prefix of u64::MAX followed by nothing: must error, not allocate.
        let mut bytes = vec![253u8];
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_value::<Vec<u8>>(&bytes).is_err());
        assert!(decode_value::<String>(&bytes).is_err());
    }

    #[test]
    fn oversized_value_is_refused_on_encode() {
        let value = vec![0u8; MAX_ENTRY_BYTES + 1];
        assert!(encode_value(&value).is_err());
    }

    #[test]
    fn a_value_of_a_version_this_build_does_not_read_is_refused_naming_both() {
        // Proves a stored value of a newer version is refused with both versions and the
        // file, not decoded as the current one.
        let bytes = encode_value(&5u64).expect("encode");
        let place = Path::new("/data/raft-wal/seg-0000000000000001.wal");
        assert_eq!(
            decode_stored::<u64>(RAFT_LOG.current, &bytes, place).expect("reads"),
            5
        );
        let error = decode_stored::<u64>(RAFT_LOG.current + 1, &bytes, place).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, CodecError::Version(_)), "{error:?}");
        assert!(
            text.contains(&format!("version {}", RAFT_LOG.current + 1))
                && text.contains("seg-0000000000000001.wal")
                && text.contains("newer build"),
            "{text}"
        );
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = encode_value(&5u64).expect("encode");
        bytes.push(0);
        assert!(matches!(
            decode_value::<u64>(&bytes),
            Err(CodecError::Trailing { trailing: 1 })
        ));
    }
}
