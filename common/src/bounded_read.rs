//! Reading a whole text file whose size is bounded: every file Quotient reads from outside
//! has a limit, checked while reading, so a file that is too large (or grows meanwhile) is
//! refused after at most one byte more than the limit.

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;

/// Opens `path` for reading only if it is a regular file (links followed): a FIFO put in a
/// file's place would block `open` until a writer came, hanging the process at start with no
/// word (found by probing), and a device or a directory is never one of Quotient's files. The
/// open does not wait for a FIFO's writer (`O_NONBLOCK`, which changes nothing for a regular
/// file). A path that is not a regular file is an [`io::ErrorKind::InvalidInput`] error
/// saying so.
pub fn open_regular(path: &std::path::Path) -> io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file (a directory, a device or a pipe): put the file itself there",
                path.display()
            ),
        ));
    }
    Ok(file)
}

/// Reads `source` to its end, or `Ok(None)` when it holds more than `max` bytes (having read
/// `max + 1` of them). A file's size on disk says nothing for `/dev/zero`, a pipe or a file
/// that grows: the limit holds while reading.
pub fn read_bytes_at_most(source: impl Read, max: u64) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    source.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= max).then_some(bytes))
}

/// Reads `source` to its end as UTF-8 text, or `Ok(None)` when it holds more than `max`
/// bytes (having read `max + 1` of them). Text that is not UTF-8 is an
/// [`io::ErrorKind::InvalidData`] error, as with [`Read::read_to_string`].
pub fn read_text_at_most(source: impl Read, max: u64) -> io::Result<Option<String>> {
    let Some(bytes) = read_bytes_at_most(source, max)? else {
        return Ok(None);
    };
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

/// Reads the file at `path`, or an [`io::ErrorKind::FileTooLarge`] error, naming `max`, when
/// it holds more than `max` bytes.
pub fn read_file_at_most(path: &std::path::Path, max: u64) -> io::Result<Vec<u8>> {
    read_bytes_at_most(open_regular(path)?, max)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("more than {max} bytes: is it the right file?"),
        )
    })
}

/// Reads the file at `path` as UTF-8 text, with [`read_file_at_most`]'s limit; text that is
/// not UTF-8 is an [`io::ErrorKind::InvalidData`] error.
pub fn read_text_file_at_most(path: &std::path::Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_file_at_most(path, max)?)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO, a device or a directory in a file's place is refused at once, without waiting
    /// for a writer or reading without end; a regular file (through a link too) opens.
    #[test]
    fn only_regular_files_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        for path in [
            fifo.as_path(),
            std::path::Path::new("/dev/zero"),
            dir.path(),
        ] {
            let error = open_regular(path).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
            assert!(error.to_string().contains("not a regular file"), "{error}");
        }
        let file = dir.path().join("file");
        std::fs::write(&file, "text").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_text_file_at_most(&link, 4).unwrap(), "text");
    }

    #[test]
    fn text_up_to_the_limit_is_read_and_one_byte_more_is_refused() {
        assert_eq!(
            read_text_at_most(&b"four"[..], 4).unwrap().as_deref(),
            Some("four")
        );
        assert_eq!(read_text_at_most(&b"five!"[..], 4).unwrap(), None);
        assert_eq!(read_text_at_most(&b""[..], 0).unwrap().as_deref(), Some(""));
    }

    #[test]
    fn a_file_over_its_limit_is_an_error_that_names_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 4097]).unwrap();
        let error = read_file_at_most(&big, 4096).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::FileTooLarge);
        assert!(
            error.to_string().contains("more than 4096 bytes"),
            "{error}"
        );
        assert_eq!(read_bytes_at_most(&b"abc"[..], 3).unwrap().unwrap(), b"abc");
    }

    #[test]
    fn a_text_file_is_checked_for_its_limit_and_for_utf8() {
        let dir = std::env::temp_dir().join(format!("bounded-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = dir.join("text");
        std::fs::write(&text, "héllo").unwrap();
        assert_eq!(read_text_file_at_most(&text, 6).unwrap(), "héllo");
        let error = read_text_file_at_most(&text, 5).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::FileTooLarge);
        std::fs::write(&text, [0xffu8, 0xfe]).unwrap();
        let error = read_text_file_at_most(&text, 16).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_source_longer_than_the_limit_is_not_read_past_it() {
        let mut endless = io::repeat(b'x');
        assert_eq!(read_text_at_most(&mut endless, 1024).unwrap(), None);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_an_invalid_data_error() {
        let error = read_text_at_most(&[0xff, 0xfe][..], 16).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_limit_cut_inside_a_character_is_too_large_not_invalid() {
        // "é" is two bytes: with a limit of 1 the read stops inside it.
        assert_eq!(read_text_at_most("é".as_bytes(), 1).unwrap(), None);
    }
}
