//! A cluster's identity: 128 random bits made once, when `quotient cluster init` bootstraps
//! the cluster, and kept in every coordinator's data directory.
//!
//! Every exchange that could cross from one cluster into another carries it: each Raft request
//! between coordinators, an agent's registration (and so every request of that connection), and
//! the client API's requests when the client's config names the cluster. A coordinator, agent
//! or client that holds another cluster's id is refused with an error naming both ids. Two
//! clusters made from the same CA, or a data directory copied from one cluster to another, are
//! thereby kept apart; without it their logs, which start with the same log ids, would look
//! alike to Raft.
//!
//! Written as 32 lowercase hexadecimal digits, the form every config file and message uses.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The number of hexadecimal digits of a written cluster id.
pub const CLUSTER_ID_HEX_DIGITS: usize = 32;

/// A cluster's identity (see the module docs). Serialised in its written form, so that config
/// files and JSON show it as people type it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct ClusterId(u128);

impl From<ClusterId> for String {
    fn from(id: ClusterId) -> String {
        id.to_string()
    }
}

impl TryFrom<String> for ClusterId {
    type Error = ClusterIdError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl ClusterId {
    /// The id made of these 16 random bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> ClusterId {
        ClusterId(u128::from_be_bytes(bytes))
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Why a written cluster id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a cluster id: write the {CLUSTER_ID_HEX_DIGITS} hexadecimal digits that `quotient cluster init` or `quotient cluster status` printed")]
pub struct ClusterIdError {
    text: String,
}

impl FromStr for ClusterId {
    type Err = ClusterIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ClusterIdError {
            text: text.chars().take(64).collect(),
        };
        let trimmed = text.trim();
        if trimmed.len() != CLUSTER_ID_HEX_DIGITS
            || !trimmed.bytes().all(|byte| byte.is_ascii_hexdigit())
        {
            return Err(error());
        }
        u128::from_str_radix(trimmed, 16)
            .map(ClusterId)
            .map_err(|_| error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_id_is_written_and_read_as_32_hex_digits() {
        // Proves the written form round-trips and that anything else is refused with advice.
        let id = ClusterId::from_bytes([0xab; 16]);
        let text = id.to_string();
        assert_eq!(text, "ab".repeat(16));
        assert_eq!(text.parse::<ClusterId>(), Ok(id));
        assert_eq!(
            format!(" {} \n", text.to_uppercase()).parse::<ClusterId>(),
            Ok(id)
        );
        for bad in [
            "",
            "abc",
            &"g".repeat(32),
            &"a".repeat(33),
            "+1234567890abcdef1234567890abcde",
        ] {
            let error = bad.parse::<ClusterId>().expect_err(bad);
            assert!(
                error.to_string().contains("quotient cluster init"),
                "{error}"
            );
        }
        let json = serde_json::to_string(&id).expect("serialises");
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(
            serde_json::from_str::<ClusterId>(&json).expect("parses"),
            id
        );
        assert!(serde_json::from_str::<ClusterId>("\"12\"").is_err());
    }
}
