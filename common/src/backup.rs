//! The backup file `quotient cluster backup` writes and `quotient-coordinator restore` reads:
//! `QBACKUP` | version (3 ASCII digits) | the cluster id (32 hexadecimal digits) | a
//! coordinator's snapshot file, whole (its own magic, version, lengths and checks).

use crate::cluster_id::ClusterId;

/// The first bytes of a backup file; its version follows, in three ASCII digits.
pub const BACKUP_MAGIC: &[u8; 7] = b"QBACKUP";
/// The layout this build writes and reads.
pub const BACKUP_VERSION: u16 = 1;
/// Magic, version and cluster id.
pub const BACKUP_HEADER_BYTES: usize = BACKUP_MAGIC.len() + 3 + 32;

/// The header of a backup of `cluster`'s state.
pub fn backup_header(cluster: ClusterId) -> Vec<u8> {
    let mut header = BACKUP_MAGIC.to_vec();
    header.extend_from_slice(format!("{BACKUP_VERSION:03}").as_bytes());
    header.extend_from_slice(cluster.to_string().as_bytes());
    header
}

/// The cluster and the snapshot file a backup's `bytes` hold, or why they are no backup.
pub fn parse_backup(bytes: &[u8]) -> Result<(ClusterId, &[u8]), String> {
    let not_one = || {
        "not a Quotient backup (it should start with QBACKUP; make one with `quotient cluster backup`)"
            .to_string()
    };
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
    if version != BACKUP_VERSION {
        return Err(format!(
            "a backup of layout version {version}; this build reads version {BACKUP_VERSION}: restore it with the release that made it"
        ));
    }
    let (cluster, snapshot) = rest.split_at_checked(32).ok_or_else(not_one)?;
    let cluster = std::str::from_utf8(cluster)
        .ok()
        .and_then(|text| text.parse::<ClusterId>().ok())
        .ok_or_else(|| "the backup's cluster id is damaged".to_string())?;
    Ok((cluster, snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_reads_back_and_other_files_are_refused() {
        let cluster = ClusterId::from_bytes([7; 16]);
        let mut file = backup_header(cluster);
        assert_eq!(file.len(), BACKUP_HEADER_BYTES);
        file.extend_from_slice(b"QSNAP002...");
        assert_eq!(parse_backup(&file), Ok((cluster, &b"QSNAP002..."[..])));
        assert!(parse_backup(b"QSNAP002")
            .unwrap_err()
            .contains("not a Quotient backup"));
        let mut newer = file.clone();
        newer[7..10].copy_from_slice(b"009");
        assert!(parse_backup(&newer).unwrap_err().contains("version 9"));
        let mut damaged = file;
        damaged[12] = b'x';
        assert!(parse_backup(&damaged).unwrap_err().contains("damaged"));
    }
}
