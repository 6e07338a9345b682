//! A bound on how deep decoded messages nest.
//!
//! A few messages wrap another of their own type (`ApiRequest::ViaLeader`, `InCluster`,
//! `InSession`, `Forwarded`; the core's `Command::As` and `InSession`). Decoding one recurses
//! once per level, so a peer that sent a request wrapped a million times in a frame of a
//! megabyte would overflow the decoding thread's stack and abort the process, before anything
//! checked who sent it (found by probing the wire, RELIABILITY.md). Each such field decodes
//! through [`shallow_box`], which refuses more than [`NESTING_MAX`] levels. The bytes on the
//! wire and on disk are the same as without it.

use std::cell::Cell;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// The most wrapped levels a decoded message may have. Real ones have at most four (a
/// client's `InCluster(InSession(ViaLeader(...)))`, forwarded by a follower).
pub const NESTING_MAX: u32 = 8;

thread_local! {
    /// How many [`shallow_box`] fields this thread is decoding, one inside the other.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Leaves a level on drop, decoded or not.
struct Level;

impl Drop for Level {
    fn drop(&mut self) {
        DEPTH.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}

/// Decodes a boxed field of a message that may wrap another, refusing more than
/// [`NESTING_MAX`] levels (`#[serde(deserialize_with = "quotient_common::nesting::shallow_box")]`).
pub fn shallow_box<'de, D, T>(deserializer: D) -> Result<Box<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let depth = DEPTH.with(|depth| {
        depth.set(depth.get() + 1);
        depth.get()
    });
    let _level = Level;
    if depth > NESTING_MAX {
        return Err(D::Error::custom(format!(
            "a message wraps others more than {NESTING_MAX} levels deep"
        )));
    }
    T::deserialize(deserializer).map(Box::new)
}

#[cfg(all(test, feature = "net"))]
mod tests {
    use crate::api::ApiRequest;
    use crate::frame::{decode_body, encode_body};

    fn wrapped(levels: usize) -> ApiRequest {
        (0..levels).fold(ApiRequest::Health, |inner, _| {
            ApiRequest::ViaLeader(Box::new(inner))
        })
    }

    /// Real requests nest a few levels and decode as before; one past the bound is refused.
    #[test]
    fn requests_decode_up_to_the_bound() {
        for levels in [0, 4, super::NESTING_MAX as usize] {
            let body = encode_body(&wrapped(levels)).unwrap();
            assert!(decode_body::<ApiRequest>(&body).is_ok(), "{levels} levels");
        }
        let body = encode_body(&wrapped(super::NESTING_MAX as usize + 1)).unwrap();
        let error = decode_body::<ApiRequest>(&body).unwrap_err();
        assert!(error.to_string().contains("levels deep"), "{error}");
        // The counter is back at zero after a refusal: the next request decodes.
        assert!(decode_body::<ApiRequest>(&encode_body(&wrapped(4)).unwrap()).is_ok());
    }

    /// A megabyte of `ViaLeader` prefixes, decoded on a small stack, is refused instead of
    /// overflowing it (before the bound, this aborted the process).
    #[test]
    fn a_million_levels_are_refused_without_overflowing_the_stack() {
        let one = encode_body(&wrapped(1)).unwrap();
        let inner = encode_body(&ApiRequest::Health).unwrap();
        let prefix = &one[..one.len() - inner.len()];
        let mut body = prefix.repeat(1_000_000);
        body.extend_from_slice(&inner);
        let decoded = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || decode_body::<ApiRequest>(&body).is_err())
            .unwrap()
            .join()
            .expect("decoding did not overflow its stack");
        assert!(decoded, "refused");
    }
}
