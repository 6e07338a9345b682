//! Names of shares, jobs and nodes: 1-128 characters of `[A-Za-z0-9_-]`.

use crate::SpecError;

/// The longest name a share, job or node may have, in bytes.
pub const NAME_BYTES_MAX: usize = 128;

/// The most characters of a certificate serial as revocations take it.
pub const SERIAL_TEXT_MAX: usize = 64;

/// Whether `text` is a certificate serial as revocations take it: 1 to [`SERIAL_TEXT_MAX`]
/// hexadecimal digits, colons allowed (as `openssl x509 -serial` prints them). The one check
/// the CLI and the state machine both make.
pub fn is_serial_text(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= SERIAL_TEXT_MAX
        && text.bytes().all(|b| b.is_ascii_hexdigit() || b == b':')
}

/// Checks a name against the charset and length rule; `kind` names the thing in the error.
pub fn validate_name(kind: &str, name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SpecError::Name {
            kind: kind.to_string(),
            name: name.chars().take(NAME_BYTES_MAX + 8).collect(),
            max: NAME_BYTES_MAX as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_charset_and_length_rule() {
        assert!(validate_name("share", "qs1").is_ok());
        assert!(validate_name("share", "team_A-1").is_ok());
        assert!(validate_name("share", &"a".repeat(128)).is_ok());
        assert!(validate_name("share", &"a".repeat(129)).is_err());
        assert!(validate_name("share", "").is_err());
        assert!(validate_name("share", "has space").is_err());
        assert!(validate_name("share", "dot.ted").is_err());
        assert!(validate_name("share", "ünï").is_err());
    }
}
