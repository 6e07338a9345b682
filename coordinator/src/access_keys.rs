//! Access keys for the AWS endpoint (docs/aws-batch.md): made here, on the coordinator that
//! takes `quotient access-key create`, from the system's random source, and replicated as a
//! command (`quotient_core::aws` says how they are kept).

use quotient_common::api::AccessKeyView;
use quotient_core::aws::{AccessKey, SECRET_CHARS};
use ring::rand::{SecureRandom, SystemRandom};

/// Characters of an access key id after its `AKQT` prefix, as AWS's 20-character ids.
const ID_CHARS: usize = 16;
const ID_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn random_text(chars: usize, alphabet: &[u8]) -> Result<String, ring::error::Unspecified> {
    let mut bytes = vec![0u8; chars];
    SystemRandom::new().fill(&mut bytes)?;
    // Both alphabets have a power-of-two length, so the masked byte is uniform over them.
    debug_assert!(alphabet.len().is_power_of_two());
    Ok(bytes
        .iter()
        .map(|byte| alphabet[usize::from(*byte) & (alphabet.len() - 1)] as char)
        .collect())
}

/// A new access key id and secret.
pub fn new_key() -> Result<(String, String), ring::error::Unspecified> {
    let id = format!("AKQT{}", random_text(ID_CHARS, ID_ALPHABET)?);
    let secret = random_text(SECRET_CHARS, SECRET_ALPHABET)?;
    Ok((id, secret))
}

/// The view of key `id`, with its secret only when `show_secret`.
pub fn view(id: &str, key: &AccessKey, show_secret: bool) -> AccessKeyView {
    AccessKeyView {
        access_key_id: id.to_string(),
        user: key.user.clone(),
        role: if key.admin { "admin" } else { "user" }.to_string(),
        created_ms: key.created_ms,
        secret_access_key: show_secret.then(|| key.secret.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_shaped_like_aws_keys() {
        let (id, secret) = new_key().unwrap();
        let (other, _) = new_key().unwrap();
        assert_ne!(id, other);
        assert_eq!(id.len(), 20);
        assert!(id.starts_with("AKQT"));
        assert_eq!(secret.len(), SECRET_CHARS);
    }
}
