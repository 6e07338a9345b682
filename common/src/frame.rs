//! The wire codec: every message between Quotient processes is one length-prefixed frame.
//!
//! A frame is a 4-byte big-endian body length followed by the body, a bincode 2 encoding
//! (through serde) of one message. The length is checked against a limit before any of the
//! body is read or allocated, so a peer cannot make a reader buffer more than
//! [`MAX_FRAME_BYTES`] by announcing a large frame; bincode's own limit bounds what decoding
//! may allocate, and a body with bytes left over after the message is refused rather than
//! silently accepted. This is the only module that names bincode, so the encoding could be
//! swapped behind it.
//!
//! bincode's limit counts what decoding claims, not bytes read: every length and integer at
//! its in-memory size (8 bytes for a length encoded in one), every string at its length. So a
//! body within [`MAX_FRAME_BYTES`] may claim up to [`CLAIMED_PER_ENCODED_BYTE_MAX`] times
//! more: a list of many short records claims about twice its size. A server decodes requests
//! under [`MAX_FRAME_BYTES`] of claims (a request that claims more is refused, and a small
//! hostile frame cannot make it allocate more); a client decodes the answers of the server it
//! chose and authenticated under [`ANSWER_CLAIM_BYTES_MAX`] ([`read_answer_frame`]), so that
//! every answer the server could send within the frame limit is read.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest frame body anyone sends or accepts, in bytes (16 MiB). Large enough for a
/// Raft snapshot of a big cluster's state, small enough to buffer per request.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

const _: () = assert!(crate::api::API_FRAME_BYTES_MAX == MAX_FRAME_BYTES);

/// Size of the big-endian length prefix in bytes.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// How much of a frame body is allocated up front; the rest grows as bytes actually arrive,
/// so a peer that announces a large frame and then stalls costs little memory.
pub const INITIAL_BODY_CAPACITY_BYTES: usize = 64 * 1024;

/// The most bytes bincode claims for one encoded byte: a length or a `u64` encoded in one
/// byte claims 8. (A `u128` would claim 16; no wire type has one.)
pub const CLAIMED_PER_ENCODED_BYTE_MAX: usize = 8;

/// What decoding an answer ([`read_answer_frame`]) may claim: as much as any frame within
/// [`MAX_FRAME_BYTES`] can (128 MiB).
pub const ANSWER_CLAIM_BYTES_MAX: usize = CLAIMED_PER_ENCODED_BYTE_MAX * MAX_FRAME_BYTES;

/// The bincode configuration of every frame body: variable-length integers, and decoding
/// may claim at most [`MAX_FRAME_BYTES`] of memory.
fn config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_FRAME_BYTES>,
> {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// [`config`] for decoding answers: it may claim up to [`ANSWER_CLAIM_BYTES_MAX`].
fn answer_config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<ANSWER_CLAIM_BYTES_MAX>,
> {
    bincode::config::standard().with_limit::<ANSWER_CLAIM_BYTES_MAX>()
}

/// Why a frame could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The announced (or encoded) body is larger than the limit; nothing more was read.
    #[error("frame of {size} bytes is over the limit of {limit} bytes")]
    TooLarge { size: u64, limit: usize },
    /// The stream ended before the whole frame arrived.
    #[error("frame truncated: expected {expected} bytes, the stream ended after {received}")]
    Truncated { expected: u64, received: u64 },
    /// The body is not a valid encoding of the expected message.
    #[error("undecodable frame: {0}")]
    Undecodable(#[source] bincode::error::DecodeError),
    /// The body holds a valid message followed by extra bytes.
    #[error("undecodable frame: {trailing} trailing bytes after the message")]
    TrailingBytes { trailing: usize },
    /// The message could not be encoded (a programming error in a wire type, such as a
    /// serde attribute bincode does not support).
    #[error("unencodable message: {0}")]
    Unencodable(#[source] bincode::error::EncodeError),
    /// The underlying stream failed.
    #[error("frame i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `value` as a frame body (without the length prefix).
pub fn encode_body<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let body = bincode::serde::encode_to_vec(value, config()).map_err(FrameError::Unencodable)?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            size: body.len() as u64,
            limit: MAX_FRAME_BYTES,
        });
    }
    Ok(body)
}

/// Decodes a whole frame body; refuses bytes left over after the message.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let decoded = bincode::serde::decode_from_slice(body, config());
    whole(body, decoded.map_err(FrameError::Undecodable)?)
}

/// [`decode_body`] for an answer: it may claim up to [`ANSWER_CLAIM_BYTES_MAX`] (module docs).
pub fn decode_answer_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let decoded = bincode::serde::decode_from_slice(body, answer_config());
    whole(body, decoded.map_err(FrameError::Undecodable)?)
}

/// The decoded value, if it took the whole body.
fn whole<T>(body: &[u8], (value, consumed): (T, usize)) -> Result<T, FrameError> {
    if consumed != body.len() {
        return Err(FrameError::TrailingBytes {
            trailing: body.len() - consumed,
        });
    }
    Ok(value)
}

/// Encodes `value` as a complete frame: length prefix and body.
pub fn encode_frame<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let body = encode_body(value)?;
    // encode_body bounds the length by MAX_FRAME_BYTES, which fits in the u32 prefix.
    let length = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge {
        size: body.len() as u64,
        limit: MAX_FRAME_BYTES,
    })?;
    let mut frame = Vec::with_capacity(LENGTH_PREFIX_BYTES + body.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes `value` as one frame. It is encoded first, so an unencodable or oversized message
/// writes nothing. Does not flush or finish the stream.
pub async fn write_frame<T: Serialize>(
    writer: &mut (impl AsyncWrite + Unpin + ?Sized),
    value: &T,
) -> Result<(), FrameError> {
    let frame = encode_frame(value)?;
    writer.write_all(&frame).await?;
    Ok(())
}

/// Reads one frame and decodes it. `max_bytes` bounds the body (it is itself capped at
/// [`MAX_FRAME_BYTES`]); a larger announced length is refused before the body is read.
pub async fn read_frame<T: DeserializeOwned>(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
) -> Result<T, FrameError> {
    decode_body(&read_body(reader, max_bytes).await?)
}

/// [`read_frame`] for the answer to a request this side sent: decoding may claim up to
/// [`ANSWER_CLAIM_BYTES_MAX`], so that any answer within the frame limit is read (module docs).
pub async fn read_answer_frame<T: DeserializeOwned>(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
) -> Result<T, FrameError> {
    decode_answer_body(&read_body(reader, max_bytes).await?)
}

/// Reads one frame's body; see [`read_frame`].
async fn read_body(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
) -> Result<Vec<u8>, FrameError> {
    let limit = max_bytes.min(MAX_FRAME_BYTES);
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    let received = read_until_full(reader, &mut prefix).await?;
    if received < LENGTH_PREFIX_BYTES {
        return Err(FrameError::Truncated {
            expected: LENGTH_PREFIX_BYTES as u64,
            received: received as u64,
        });
    }
    let length = u64::from(u32::from_be_bytes(prefix));
    if length > limit as u64 {
        return Err(FrameError::TooLarge {
            size: length,
            limit,
        });
    }
    let mut body = Vec::with_capacity((length as usize).min(INITIAL_BODY_CAPACITY_BYTES));
    reader.take(length).read_to_end(&mut body).await?;
    if (body.len() as u64) < length {
        return Err(FrameError::Truncated {
            expected: length,
            received: body.len() as u64,
        });
    }
    Ok(body)
}

/// Reads until `buffer` is full or the stream ends; returns how many bytes arrived.
async fn read_until_full<R>(reader: &mut R, buffer: &mut [u8]) -> std::io::Result<usize>
where
    R: AsyncRead + Unpin + ?Sized,
{
    let mut filled = 0;
    while filled < buffer.len() {
        let count = reader.read(&mut buffer[filled..]).await?;
        if count == 0 {
            break;
        }
        filled += count;
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::ReadBuf;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Message {
        id: u64,
        name: String,
        gpus: BTreeMap<String, u32>,
        payload: Vec<u8>,
        note: Option<String>,
    }

    fn sample() -> Message {
        Message {
            id: 42,
            name: "qs1".to_string(),
            gpus: BTreeMap::from([("a10g".to_string(), 2), ("h100".to_string(), 8)]),
            payload: vec![1, 2, 3, 255],
            note: None,
        }
    }

    /// Serves the given bytes, then fails the test if anyone reads past them.
    struct ReadOnlyThis {
        bytes: Vec<u8>,
        position: usize,
    }

    impl AsyncRead for ReadOnlyThis {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _context: &mut Context<'_>,
            buffer: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            assert!(
                self.position < self.bytes.len(),
                "the reader read past the length prefix"
            );
            let count = buffer.remaining().min(self.bytes.len() - self.position);
            let start = self.position;
            buffer.put_slice(&self.bytes[start..start + count]);
            self.position += count;
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_frame_round_trips() {
        // Proves that what write_frame writes, read_frame reads back unchanged.
        let mut wire = Vec::new();
        write_frame(&mut wire, &sample()).await.unwrap();
        write_frame(&mut wire, &7u32).await.unwrap();
        let mut reader = wire.as_slice();
        let first: Message = read_frame(&mut reader, MAX_FRAME_BYTES).await.unwrap();
        let second: u32 = read_frame(&mut reader, MAX_FRAME_BYTES).await.unwrap();
        assert_eq!(first, sample());
        assert_eq!(second, 7);
        assert!(reader.is_empty());
    }

    #[tokio::test]
    async fn a_length_over_the_limit_is_refused_before_the_body_is_read() {
        // Proves the limit is checked on the prefix alone: the reader panics if read further.
        let announced = (MAX_FRAME_BYTES as u32) + 1;
        let mut reader = ReadOnlyThis {
            bytes: announced.to_be_bytes().to_vec(),
            position: 0,
        };
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(
            matches!(error, FrameError::TooLarge { size, limit }
                if size == u64::from(announced) && limit == MAX_FRAME_BYTES),
            "{error:?}"
        );

        // A caller's smaller limit is honoured the same way.
        let mut reader = ReadOnlyThis {
            bytes: 1025u32.to_be_bytes().to_vec(),
            position: 0,
        };
        let error = read_frame::<Message>(&mut reader, 1024).await.unwrap_err();
        assert!(
            matches!(
                error,
                FrameError::TooLarge {
                    size: 1025,
                    limit: 1024
                }
            ),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn a_truncated_frame_is_reported_as_truncated() {
        // Proves a stream that ends inside the prefix or the body is not mistaken for data.
        let frame = encode_frame(&sample()).unwrap();

        let mut reader = &frame[..2];
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                FrameError::Truncated {
                    expected: 4,
                    received: 2
                }
            ),
            "{error:?}"
        );

        let cut = frame.len() - 3;
        let mut reader = &frame[..cut];
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        let body_length = (frame.len() - LENGTH_PREFIX_BYTES) as u64;
        assert!(
            matches!(error, FrameError::Truncated { expected, received }
                if expected == body_length && received == body_length - 3),
            "{error:?}"
        );

        let mut reader: &[u8] = &[];
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(
            matches!(error, FrameError::Truncated { received: 0, .. }),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn garbage_bytes_are_undecodable() {
        // Proves a body that is not the expected message is refused, not misread.
        let garbage = [0xffu8; 16];
        let mut wire = (garbage.len() as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&garbage);
        let mut reader = wire.as_slice();
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(matches!(error, FrameError::Undecodable(_)), "{error:?}");
    }

    #[tokio::test]
    async fn a_huge_collection_length_inside_a_small_frame_is_undecodable() {
        // Proves bincode's limit stops a small body from claiming a huge allocation.
        let mut body = Vec::new();
        // A varint u64 length of 2^40 elements (tag 253 then 8 little-endian bytes).
        body.push(253);
        body.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let error = decode_body::<Vec<u64>>(&body).unwrap_err();
        assert!(matches!(error, FrameError::Undecodable(_)), "{error:?}");
    }

    #[tokio::test]
    async fn trailing_bytes_after_the_message_are_refused() {
        // Proves a body must be exactly one message: extra bytes mean a mismatched type.
        let mut body = encode_body(&sample()).unwrap();
        body.extend_from_slice(&[0, 0]);
        let mut wire = (body.len() as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&body);
        let mut reader = wire.as_slice();
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(
            matches!(error, FrameError::TrailingBytes { trailing: 2 }),
            "{error:?}"
        );
    }

    #[test]
    fn an_answer_within_the_frame_limit_decodes_though_it_claims_more() {
        // Proves that a body well within the frame limit whose lengths and integers claim
        // more than the limit in memory (many short records, as a long job list is) is
        // refused as a request but read as an answer.
        // Each record is 3 bytes encoded and claims 17 (8 for the integer, 8 for the
        // string's length, 1 for its byte).
        let records: Vec<(u64, String)> = (0..1_200_000).map(|n| (n % 100, "x".into())).collect();
        let body = encode_body(&records).unwrap();
        assert!(body.len() < MAX_FRAME_BYTES / 4, "{} bytes", body.len());
        match decode_body::<Vec<(u64, String)>>(&body) {
            Err(FrameError::Undecodable(_)) => {}
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("decoded as a request"),
        }
        let as_answer = decode_answer_body::<Vec<(u64, String)>>(&body);
        assert!(as_answer.as_ref().is_ok_and(|decoded| *decoded == records));
    }

    #[test]
    fn an_oversized_message_is_refused_before_it_is_sent() {
        // Proves the sender checks the limit too, so it never writes a frame peers refuse.
        let huge = vec![0u8; MAX_FRAME_BYTES + 1];
        let error = encode_frame(&huge).unwrap_err();
        assert!(
            matches!(
                error,
                FrameError::TooLarge {
                    limit: MAX_FRAME_BYTES,
                    ..
                }
            ),
            "{error:?}"
        );
    }
}
