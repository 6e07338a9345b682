//! The wire codec: every message between Quotient processes is one frame, with a header that
//! says which version of its protocol's encoding the body is in.
//!
//! A frame is an 8-byte header, [`FRAME_MAGIC`] (`QV`), the version (u16, big-endian) and the
//! body length (u32, big-endian), then the body, a bincode 2 encoding (through serde) of one
//! [`WireMessage`]. Each protocol (the client API, Raft, the agent protocol) has its own
//! [`Encoding`] (`crate::version`): a reader decodes every version from the encoding's oldest
//! to its current with that version's decoder, and answers a request in the version it came
//! in, so builds of neighbouring releases talk while a cluster is upgraded one process at a
//! time. A request in a version the server does not read is answered with a *refusal frame*
//! (version [`REFUSAL_VERSION`], body: the oldest and current versions the server reads), a
//! layout that never changes, so the client can say which side to upgrade. A frame that
//! starts like those of the builds before frames carried a version (a bare length prefix,
//! whose first byte is 0 or 1) is refused by name too.
//!
//! Versions travel in each frame rather than being agreed once per connection: a request is
//! one stream (`crate::transport`), so a frame is the unit anyway, and no exchange is added
//! before the first request. The ALPN names the protocol and this framing; it changes only if
//! the header itself does.
//!
//! The length is checked against a limit before any of the body is read or allocated, so a
//! peer cannot make a reader buffer more than [`MAX_FRAME_BYTES`] by announcing a large frame;
//! bincode's own limit bounds what decoding may allocate, and a body with bytes left over
//! after the message is refused rather than silently accepted. This is the only module that
//! names bincode, so the encoding could be swapped behind it.
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

use crate::agent_api::{AgentRequest, AgentResponse, LeaderRequest, LeaderResponse};
use crate::api::{ApiRequest, ApiResponse};
use crate::version::{self, Encoding, VersionError, Writer};

/// The largest frame body anyone sends or accepts, in bytes (16 MiB). Large enough for a
/// Raft snapshot of a big cluster's state, small enough to buffer per request.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// Most bytes of request bodies one connection's streams may be reading at once: a peer may
/// open hundreds of streams, each announcing a frame of [`MAX_FRAME_BYTES`], and without a
/// bound one connection could make a server hold gigabytes for a read deadline (found by
/// probing the wire). A stream past it waits, within its read deadline, for the others.
pub const CONNECTION_BODY_BYTES_MAX: u32 = 2 * MAX_FRAME_BYTES as u32;
/// Most bytes of request bodies all of a process's connections may be reading at once.
pub const PROCESS_BODY_BYTES_MAX: u32 = 1 << 30;

/// What request bodies a connection may be reading at once: its own
/// [`CONNECTION_BODY_BYTES_MAX`] and its share of the process's [`PROCESS_BODY_BYTES_MAX`].
#[derive(Debug, Clone)]
pub struct BodyBudget {
    connection: std::sync::Arc<tokio::sync::Semaphore>,
}

/// The process's budget, shared by every connection.
static PROCESS_BUDGET: std::sync::LazyLock<std::sync::Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| {
        std::sync::Arc::new(tokio::sync::Semaphore::new(PROCESS_BODY_BYTES_MAX as usize))
    });

impl BodyBudget {
    /// A new connection's budget.
    pub fn for_connection() -> BodyBudget {
        BodyBudget {
            connection: std::sync::Arc::new(tokio::sync::Semaphore::new(
                CONNECTION_BODY_BYTES_MAX as usize,
            )),
        }
    }

    /// Waits until `bytes` more may be read; they are given back when the guard drops.
    async fn take(&self, bytes: u32) -> Option<BodyGuard> {
        let connection = self
            .connection
            .clone()
            .acquire_many_owned(bytes)
            .await
            .ok()?;
        let process = PROCESS_BUDGET
            .clone()
            .acquire_many_owned(bytes)
            .await
            .ok()?;
        Some(BodyGuard {
            _connection: connection,
            _process: process,
        })
    }
}

/// Bytes of a [`BodyBudget`] held while a body is read and decoded.
struct BodyGuard {
    _connection: tokio::sync::OwnedSemaphorePermit,
    _process: tokio::sync::OwnedSemaphorePermit,
}

const _: () = assert!(crate::api::API_FRAME_BYTES_MAX == MAX_FRAME_BYTES);

/// The first bytes of every frame. A frame of a build from before frames carried a version
/// starts with its length, big-endian and at most [`MAX_FRAME_BYTES`], so with 0 or 1: never
/// with these.
pub const FRAME_MAGIC: [u8; 2] = *b"QV";

/// Size of a frame's header in bytes: magic, version (u16 BE), body length (u32 BE).
pub const HEADER_BYTES: usize = 8;

/// The version of a refusal frame: its body is the oldest and the current version the sender
/// reads (u16 BE each). Its layout never changes, so every build reads every other's.
pub const REFUSAL_VERSION: u16 = 0;

/// Size of a refusal frame's body in bytes.
const REFUSAL_BODY_BYTES: usize = 4;

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
    /// The bytes do not start with [`FRAME_MAGIC`], nor like a frame of an older build.
    #[error("not a Quotient frame: it starts with {first:02x?}")]
    NotAFrame { first: [u8; 2] },
    /// The frame is in a version this side does not read, or the peer answered that it does
    /// not read this side's: the error names both and which side to upgrade.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// A version in the encoding's range has no encoder or decoder (a programming error: a
    /// version was bumped without [`WireMessage::encode_version`] or
    /// [`WireMessage::decode_version`] learning it).
    #[error("{encoding}: this build has no codec for version {version}")]
    NoCodec {
        encoding: &'static str,
        version: u16,
    },
    /// The underlying stream failed.
    #[error("frame i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Which side of an exchange a frame is read on: what its decoding may claim (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// A request a server reads: up to [`MAX_FRAME_BYTES`] of claims.
    Request,
    /// The answer to a request this side sent: up to [`ANSWER_CLAIM_BYTES_MAX`].
    Answer,
}

impl Reading {
    /// Decodes a whole body of the current bincode layout under this side's claim limit.
    pub fn decode<T: DeserializeOwned>(self, body: &[u8]) -> Result<T, FrameError> {
        match self {
            Reading::Request => decode_body(body),
            Reading::Answer => decode_answer_body(body),
        }
    }
}

/// A message of one of the protocols: the versioned encoding it belongs to, and how each
/// version this build knows is written and read.
///
/// The provided methods handle the current version only. When a protocol's version is bumped
/// and its `oldest` left below (so that peers of the previous release still talk to this one),
/// its messages override both: `decode_version` decodes the previous version's types and
/// converts them, `encode_version` writes an answer in the previous version for a peer that
/// asked in it (`crate::version` says how).
pub trait WireMessage: Serialize + DeserializeOwned {
    /// The protocol's encoding.
    const ENCODING: Encoding;

    /// The body of `self` in `version`.
    fn encode_version(&self, version: u16) -> Result<Vec<u8>, FrameError> {
        if version != Self::ENCODING.current {
            return Err(FrameError::NoCodec {
                encoding: Self::ENCODING.name,
                version,
            });
        }
        encode_body(self)
    }

    /// The message in a body of `version`, which the header check found in
    /// [`Encoding::oldest`] to [`Encoding::current`].
    fn decode_version(version: u16, body: &[u8], reading: Reading) -> Result<Self, FrameError> {
        if version != Self::ENCODING.current {
            return Err(FrameError::NoCodec {
                encoding: Self::ENCODING.name,
                version,
            });
        }
        reading.decode(body)
    }
}

impl WireMessage for ApiRequest {
    const ENCODING: Encoding = version::API_WIRE;
}

impl WireMessage for ApiResponse {
    const ENCODING: Encoding = version::API_WIRE;
}

impl WireMessage for AgentRequest {
    const ENCODING: Encoding = version::AGENT_WIRE;
}

impl WireMessage for AgentResponse {
    const ENCODING: Encoding = version::AGENT_WIRE;
}

impl WireMessage for LeaderRequest {
    const ENCODING: Encoding = version::AGENT_WIRE;
}

impl WireMessage for LeaderResponse {
    const ENCODING: Encoding = version::AGENT_WIRE;
}

/// Encodes `value` as a frame body (without the header), in the current bincode layout.
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

/// A header and `body` as one frame.
fn frame_of(version: u16, body: &[u8]) -> Result<Vec<u8>, FrameError> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            size: body.len() as u64,
            limit: MAX_FRAME_BYTES,
        });
    }
    // Within MAX_FRAME_BYTES, the length fits in the u32 of the header.
    let length = body.len() as u32;
    let mut frame = Vec::with_capacity(HEADER_BYTES + body.len());
    frame.extend_from_slice(&FRAME_MAGIC);
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(body);
    Ok(frame)
}

/// Encodes `value` as a complete frame of the current version: header and body.
pub fn encode_frame<T: WireMessage>(value: &T) -> Result<Vec<u8>, FrameError> {
    encode_frame_version(value, T::ENCODING.current)
}

/// Encodes `value` as a complete frame of `version` (the version a request came in).
pub fn encode_frame_version<T: WireMessage>(
    value: &T,
    version: u16,
) -> Result<Vec<u8>, FrameError> {
    frame_of(version, &value.encode_version(version)?)
}

/// The refusal frame of a reader of `encoding`: the versions it reads, for a peer that sent
/// another one.
pub fn refusal_frame(encoding: &Encoding) -> Vec<u8> {
    let mut body = Vec::with_capacity(REFUSAL_BODY_BYTES);
    body.extend_from_slice(&encoding.oldest.to_be_bytes());
    body.extend_from_slice(&encoding.current.to_be_bytes());
    frame_of(REFUSAL_VERSION, &body).expect("a refusal frame is a few bytes")
}

/// Writes `value` as one frame of the current version. It is encoded first, so an
/// unencodable or oversized message writes nothing. Does not flush or finish the stream.
pub async fn write_frame<T: WireMessage>(
    writer: &mut (impl AsyncWrite + Unpin + ?Sized),
    value: &T,
) -> Result<(), FrameError> {
    let frame = encode_frame(value)?;
    writer.write_all(&frame).await?;
    Ok(())
}

/// Reads one request frame and decodes it; see [`read_request_frame`].
pub async fn read_frame<T: WireMessage>(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
) -> Result<T, FrameError> {
    Ok(read_request_frame(reader, max_bytes).await?.0)
}

/// Reads one request frame and decodes it, with the version it came in (the version to answer
/// in). `max_bytes` bounds the body (it is itself capped at [`MAX_FRAME_BYTES`]); a larger
/// announced length is refused before the body is read. A frame in a version this side does
/// not read is [`FrameError::Version`], its body unread.
pub async fn read_request_frame<T: WireMessage>(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
) -> Result<(T, u16), FrameError> {
    read_request_frame_within(reader, max_bytes, None).await
}

/// [`read_request_frame`], reading the body only once `budget` has room for it, and holding
/// that room until the body is decoded.
pub async fn read_request_frame_within<T: WireMessage>(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
    budget: Option<&BodyBudget>,
) -> Result<(T, u16), FrameError> {
    let (version, body, _room) =
        read_body_within(reader, max_bytes, &T::ENCODING, Reading::Request, budget).await?;
    Ok((
        T::decode_version(version, &body, Reading::Request)?,
        version,
    ))
}

/// Reads the answer to a request this side sent: decoding may claim up to
/// [`ANSWER_CLAIM_BYTES_MAX`], so that any answer within the frame limit is read (module docs).
/// A refusal frame is [`FrameError::Version`] with the versions the peer reads.
pub async fn read_answer_frame<T: WireMessage>(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
) -> Result<T, FrameError> {
    let (version, body) = read_body(reader, max_bytes, &T::ENCODING, Reading::Answer).await?;
    T::decode_version(version, &body, Reading::Answer)
}

/// The version of a frame this side reads and its body; see [`read_request_frame`].
async fn read_body(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
    encoding: &Encoding,
    reading: Reading,
) -> Result<(u16, Vec<u8>), FrameError> {
    let (version, body, _) = read_body_within(reader, max_bytes, encoding, reading, None).await?;
    Ok((version, body))
}

/// [`read_body`], taking room in `budget` for the body before reading it.
async fn read_body_within(
    reader: &mut (impl AsyncRead + Unpin + ?Sized),
    max_bytes: usize,
    encoding: &Encoding,
    reading: Reading,
    budget: Option<&BodyBudget>,
) -> Result<(u16, Vec<u8>, Option<BodyGuard>), FrameError> {
    let limit = max_bytes.min(MAX_FRAME_BYTES);
    let mut header = [0u8; HEADER_BYTES];
    let received = read_until_full(reader, &mut header).await?;
    let peer = || Writer::Peer("the peer".to_string());
    // Two bytes tell a frame of this framing from one of an older build.
    if received >= FRAME_MAGIC.len() && header[..2] != FRAME_MAGIC {
        if header[0] <= 1 {
            return Err(encoding.mismatch(peer(), (0, 0)).into());
        }
        return Err(FrameError::NotAFrame {
            first: [header[0], header[1]],
        });
    }
    if received < HEADER_BYTES {
        return Err(FrameError::Truncated {
            expected: HEADER_BYTES as u64,
            received: received as u64,
        });
    }
    let version = u16::from_be_bytes([header[2], header[3]]);
    let length = u64::from(u32::from_be_bytes([
        header[4], header[5], header[6], header[7],
    ]));
    if version == REFUSAL_VERSION
        && reading == Reading::Answer
        && length == REFUSAL_BODY_BYTES as u64
    {
        let mut body = [0u8; REFUSAL_BODY_BYTES];
        let received = read_until_full(reader, &mut body).await?;
        if received < REFUSAL_BODY_BYTES {
            return Err(FrameError::Truncated {
                expected: REFUSAL_BODY_BYTES as u64,
                received: received as u64,
            });
        }
        let oldest = u16::from_be_bytes([body[0], body[1]]);
        let current = u16::from_be_bytes([body[2], body[3]]);
        return Err(encoding.mismatch(peer(), (oldest, current)).into());
    }
    encoding.check(version, peer())?;
    if length > limit as u64 {
        return Err(FrameError::TooLarge {
            size: length,
            limit,
        });
    }
    let room = match budget {
        // `length` is at most MAX_FRAME_BYTES here, so it fits a u32.
        Some(budget) => budget.take(length as u32).await,
        None => None,
    };
    let mut body = Vec::with_capacity((length as usize).min(INITIAL_BODY_CAPACITY_BYTES));
    reader.take(length).read_to_end(&mut body).await?;
    if (body.len() as u64) < length {
        return Err(FrameError::Truncated {
            expected: length,
            received: body.len() as u64,
        });
    }
    Ok((version, body, room))
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

    /// A connection reads at most two frames' worth of bodies at once: the third waits until
    /// one of the others is decoded.
    #[tokio::test]
    async fn a_connection_reads_at_most_its_budget_of_bodies_at_once() {
        let budget = BodyBudget::for_connection();
        let frame = MAX_FRAME_BYTES as u32;
        let first = budget.take(frame).await.expect("room");
        let _second = budget.take(frame).await.expect("room");
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), budget.take(1));
        assert!(waiting.await.is_err(), "a third body waits");
        // Another connection is not held up by this one.
        let other = BodyBudget::for_connection();
        assert!(other.take(frame).await.is_some());
        drop(first);
        let third = tokio::time::timeout(std::time::Duration::from_secs(5), budget.take(frame));
        assert!(third.await.expect("room once the first is done").is_some());
    }
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

    /// The encoding of the test messages: this build writes version 3 and reads 2 and 3.
    const TEST_WIRE: Encoding = Encoding {
        name: "the test protocol",
        current: 3,
        oldest: 2,
    };

    impl WireMessage for Message {
        const ENCODING: Encoding = TEST_WIRE;
    }

    /// Version 2 of `Message`: it had no `note`. Reading it gives `note: None`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct MessageV2 {
        id: u64,
        name: String,
        gpus: BTreeMap<String, u32>,
        payload: Vec<u8>,
    }

    /// A message whose encoding knows several versions, as a protocol's after a bump.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Upgraded(Message);

    impl WireMessage for Upgraded {
        const ENCODING: Encoding = TEST_WIRE;

        fn encode_version(&self, version: u16) -> Result<Vec<u8>, FrameError> {
            match version {
                2 => encode_body(&MessageV2 {
                    id: self.0.id,
                    name: self.0.name.clone(),
                    gpus: self.0.gpus.clone(),
                    payload: self.0.payload.clone(),
                }),
                _ => encode_body(&self.0),
            }
        }

        fn decode_version(version: u16, body: &[u8], reading: Reading) -> Result<Self, FrameError> {
            match version {
                2 => {
                    let old: MessageV2 = reading.decode(body)?;
                    Ok(Upgraded(Message {
                        id: old.id,
                        name: old.name,
                        gpus: old.gpus,
                        payload: old.payload,
                        note: None,
                    }))
                }
                _ => Ok(Upgraded(reading.decode(body)?)),
            }
        }
    }

    impl WireMessage for u32 {
        const ENCODING: Encoding = TEST_WIRE;
    }

    impl WireMessage for Vec<u8> {
        const ENCODING: Encoding = TEST_WIRE;
    }

    /// A frame of `version` around `body`, written by hand.
    fn raw_frame(version: u16, body: &[u8]) -> Vec<u8> {
        let mut frame = FRAME_MAGIC.to_vec();
        frame.extend_from_slice(&version.to_be_bytes());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(body);
        frame
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
                "the reader read past the header"
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
        // Proves the limit is checked on the header alone: the reader panics if read further.
        let announced = (MAX_FRAME_BYTES as u32) + 1;
        let header = |length: u32| {
            let mut header = raw_frame(TEST_WIRE.current, &[]);
            header[4..].copy_from_slice(&length.to_be_bytes());
            header
        };
        let mut reader = ReadOnlyThis {
            bytes: header(announced),
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
            bytes: header(1025),
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
                    expected: 8,
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
        let body_length = (frame.len() - HEADER_BYTES) as u64;
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
        let wire = raw_frame(TEST_WIRE.current, &garbage);
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
        let wire = raw_frame(TEST_WIRE.current, &body);
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

    #[tokio::test]
    async fn a_frame_carries_its_version_and_an_older_one_is_read_and_answered_in_it() {
        // Proves the header holds the version, a reader decodes each version it reads with
        // that version's decoder, and an answer can be written in the version asked in.
        let frame = encode_frame(&Upgraded(sample())).unwrap();
        assert_eq!(&frame[..2], b"QV");
        assert_eq!(u16::from_be_bytes([frame[2], frame[3]]), TEST_WIRE.current);

        let mut old = sample();
        old.note = Some("dropped in version 2".into());
        let frame = encode_frame_version(&Upgraded(old), 2).unwrap();
        let mut reader = frame.as_slice();
        let (read, version) = read_request_frame::<Upgraded>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap();
        assert_eq!(version, 2);
        assert_eq!(read, Upgraded(sample()), "version 2 has no note");

        // A type that never learnt version 2 says so rather than misreading it.
        let mut reader = frame.as_slice();
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(
            matches!(error, FrameError::NoCodec { version: 2, .. }),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn a_frame_of_a_version_this_side_does_not_read_is_refused_naming_both() {
        // Proves a newer or older version is refused before its body is read, with both
        // sides' versions and whose upgrade helps.
        for (version, upgrade) in [(4, "upgrade this program"), (1, "upgrade the peer")] {
            let wire = raw_frame(version, &encode_body(&sample()).unwrap());
            let mut reader = ReadOnlyThis {
                bytes: wire[..HEADER_BYTES].to_vec(),
                position: 0,
            };
            let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
                .await
                .unwrap_err();
            let FrameError::Version(mismatch) = &error else {
                panic!("{error:?}");
            };
            assert_eq!(mismatch.theirs, (version, version));
            assert_eq!(mismatch.ours, (2, 3));
            let text = error.to_string();
            assert!(text.contains(upgrade), "{text}");
            assert!(
                text.contains(&format!("version {version} of the test protocol")),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn a_refusal_frame_tells_the_requester_the_versions_its_peer_reads() {
        // Proves a refusal frame is read as the peer's versions, and only as an answer.
        let refusal = refusal_frame(&Encoding {
            name: "the test protocol",
            current: 7,
            oldest: 5,
        });
        let mut reader = refusal.as_slice();
        let error = read_answer_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        let FrameError::Version(mismatch) = &error else {
            panic!("{error:?}");
        };
        assert_eq!(mismatch.theirs, (5, 7));
        assert!(mismatch.theirs_is_newer());
        assert!(error.to_string().contains("versions 5 to 7"), "{error}");
        assert!(reader.is_empty(), "the whole refusal was read");
    }

    #[tokio::test]
    async fn a_frame_of_a_build_before_versions_is_refused_by_name() {
        // Proves the bare length prefix of an older build's frame is told apart from garbage
        // and refused as a peer to upgrade, before its body is read.
        let body = encode_body(&sample()).unwrap();
        let mut wire = (body.len() as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&body);
        let mut reader = ReadOnlyThis {
            bytes: wire[..HEADER_BYTES].to_vec(),
            position: 0,
        };
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, FrameError::Version(mismatch) if mismatch.theirs == (0, 0)),
            "{error:?}"
        );
        assert!(error.to_string().contains("upgrade the peer"), "{error}");

        let mut reader: &[u8] = b"GET / HTTP/1.1\r\n";
        let error = read_frame::<Message>(&mut reader, MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(
            matches!(error, FrameError::NotAFrame { first } if &first == b"GE"),
            "{error:?}"
        );
    }
}
