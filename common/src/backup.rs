//! The backup file `quotient cluster backup` writes and `quotient-coordinator restore` reads:
//! `QBACKUP` | version (3 ASCII digits) | the cluster id (32 hexadecimal digits) | a
//! coordinator's snapshot file, whole (its own magic, version and lengths) | from version 2,
//! the SHA-256 of everything before it, so that a backup damaged in storage or in transit is
//! refused rather than restored. Version 1 (no checksum) is still read.

use sha2::{Digest, Sha256};

use crate::cluster_id::ClusterId;

/// The first bytes of a backup file; its version follows, in three ASCII digits.
pub const BACKUP_MAGIC: &[u8; 7] = b"QBACKUP";
/// The layout this build writes.
pub const BACKUP_VERSION: u16 = 2;
/// The layouts this build reads: 1 (no checksum) and 2.
pub const BACKUP_VERSION_OLDEST: u16 = 1;
/// Magic, version and cluster id.
pub const BACKUP_HEADER_BYTES: usize = BACKUP_MAGIC.len() + 3 + 32;
/// The checksum that ends a backup of version 2.
pub const BACKUP_TRAILER_BYTES: usize = 32;

/// The header of a backup of `cluster`'s state.
pub fn backup_header(cluster: ClusterId) -> Vec<u8> {
    let mut header = BACKUP_MAGIC.to_vec();
    header.extend_from_slice(format!("{BACKUP_VERSION:03}").as_bytes());
    header.extend_from_slice(cluster.to_string().as_bytes());
    header
}

/// The checksum of a backup as it is written: fed the header and every piece, in order; its
/// [`BackupChecksum::finish`] is the file's last bytes.
#[derive(Default)]
pub struct BackupChecksum(Sha256);

impl BackupChecksum {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> [u8; BACKUP_TRAILER_BYTES] {
        let mut out = [0; BACKUP_TRAILER_BYTES];
        out.copy_from_slice(self.0.finalize().as_slice());
        out
    }
}

fn not_one() -> String {
    "not a Quotient backup (it should start with QBACKUP; make one with `quotient cluster backup`)"
        .to_string()
}

/// The cluster and layout version a backup's first [`BACKUP_HEADER_BYTES`] name, or why they
/// are no backup's: checked before the rest of a file is read.
pub fn parse_backup_header(bytes: &[u8]) -> Result<(ClusterId, u16), String> {
    let (magic, rest) = bytes
        .split_at_checked(BACKUP_MAGIC.len())
        .ok_or_else(not_one)?;
    if magic != BACKUP_MAGIC {
        return Err(not_one());
    }
    let (digits, rest) = rest.split_at_checked(3).ok_or_else(not_one)?;
    let version = std::str::from_utf8(digits)
        .ok()
        .and_then(|digits| digits.parse::<u16>().ok())
        .ok_or_else(not_one)?;
    if !(BACKUP_VERSION_OLDEST..=BACKUP_VERSION).contains(&version) {
        return Err(format!(
            "a backup of layout version {version}; this build reads versions {BACKUP_VERSION_OLDEST} to {BACKUP_VERSION}: restore it with the release that made it"
        ));
    }
    let cluster = rest.get(..32).ok_or_else(not_one)?;
    let cluster = std::str::from_utf8(cluster)
        .ok()
        .and_then(|text| text.parse::<ClusterId>().ok())
        .ok_or_else(|| "the backup's cluster id is damaged".to_string())?;
    Ok((cluster, version))
}

/// The cluster and the snapshot file a backup's `bytes` hold, or why they are no backup (or a
/// damaged one).
pub fn parse_backup(bytes: &[u8]) -> Result<(ClusterId, &[u8]), String> {
    let (cluster, version) = parse_backup_header(bytes)?;
    let body = &bytes[BACKUP_HEADER_BYTES..];
    if version < 2 {
        return Ok((cluster, body));
    }
    let damaged = || {
        "the backup is damaged (its checksum does not match its contents): restore from another copy"
            .to_string()
    };
    let split = body
        .len()
        .checked_sub(BACKUP_TRAILER_BYTES)
        .ok_or_else(damaged)?;
    let (snapshot, trailer) = body.split_at(split);
    let mut checksum = BackupChecksum::default();
    checksum.update(&bytes[..BACKUP_HEADER_BYTES + split]);
    if checksum.finish() != trailer {
        return Err(damaged());
    }
    Ok((cluster, snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup_of(cluster: ClusterId, snapshot: &[u8]) -> Vec<u8> {
        let mut file = backup_header(cluster);
        file.extend_from_slice(snapshot);
        let mut checksum = BackupChecksum::default();
        checksum.update(&file);
        file.extend_from_slice(&checksum.finish());
        file
    }

    #[test]
    fn a_backup_reads_back_and_other_files_are_refused() {
        let cluster = ClusterId::from_bytes([7; 16]);
        let file = backup_of(cluster, b"QSNAP002...");
        assert_eq!(file.len(), BACKUP_HEADER_BYTES + 11 + BACKUP_TRAILER_BYTES);
        assert_eq!(parse_backup(&file), Ok((cluster, &b"QSNAP002..."[..])));
        assert!(parse_backup(b"QSNAP002")
            .unwrap_err()
            .contains("not a Quotient backup"));
        assert!(parse_backup(&[0; 4096])
            .unwrap_err()
            .contains("not a Quotient backup"));
        let mut newer = file.clone();
        newer[7..10].copy_from_slice(b"009");
        assert!(parse_backup(&newer).unwrap_err().contains("version 9"));
        let mut damaged = file;
        damaged[12] = b'x';
        assert!(parse_backup(&damaged).unwrap_err().contains("damaged"));
    }

    #[test]
    fn a_changed_byte_or_a_cut_backup_is_refused_as_damaged() {
        let cluster = ClusterId::from_bytes([3; 16]);
        let file = backup_of(cluster, b"QSNAP002 priority 9999");
        for at in [BACKUP_HEADER_BYTES, file.len() - 5, file.len() - 1] {
            let mut changed = file.clone();
            changed[at] ^= 1;
            assert!(
                parse_backup(&changed).unwrap_err().contains("damaged"),
                "byte {at}"
            );
        }
        assert!(parse_backup(&file[..file.len() - 1])
            .unwrap_err()
            .contains("damaged"));
        assert!(parse_backup(&file[..BACKUP_HEADER_BYTES + 3])
            .unwrap_err()
            .contains("damaged"));
    }

    #[test]
    fn a_version_1_backup_without_a_checksum_is_still_read() {
        let cluster = ClusterId::from_bytes([9; 16]);
        let mut file = backup_header(cluster);
        file[7..10].copy_from_slice(b"001");
        file.extend_from_slice(b"QSNAP002...");
        assert_eq!(parse_backup(&file), Ok((cluster, &b"QSNAP002..."[..])));
    }
}
