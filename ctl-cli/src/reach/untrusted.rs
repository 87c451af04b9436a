//! Files the process's user controls: its socket directory (the heap
//! profile a shimmed process dumps there) and the files of its root (a
//! container's `/tmp`, its perf map, its Python sources, its separate
//! debug files). memshim-ctl, often root, opens them only as regular files,
//! without waiting (a FIFO there would hold an open for ever) and reads at
//! most a bound (`/dev/zero`, or a sparse file of a terabyte, would fill
//! its memory).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Whether the last component may be a symbolic link.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Links {
    Follow,
    Refuse,
}

/// Opens `path` for reading if it is a regular file; a FIFO, a device, a
/// socket or a directory is an error, found without blocking.
pub fn open_regular(path: &Path, links: Links) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if links == Links::Refuse => {
                io::Error::other("a symbolic link, not the file written there")
            }
            _ => e,
        })?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// The bytes of the regular file `path`, at most `limit` of them; a larger
/// file is an error.
pub fn read_regular(path: &Path, links: Links, limit: u64) -> io::Result<Vec<u8>> {
    let f = open_regular(path, links)?;
    let mut bytes = Vec::new();
    f.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(bytes)
}

/// [`read_regular`] as text; bytes that are not UTF-8 read as U+FFFD.
pub fn read_regular_text(path: &Path, links: Links, limit: u64) -> io::Result<String> {
    Ok(super::procfs::lossy_text(read_regular(path, links, limit)?))
}

/// Opens the directory `path` (its last component not a link), without
/// blocking on whatever else is there.
pub fn open_dir(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ms-untrusted-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_at_once() {
        let d = scratch("fifo");
        let fifo = d.join("f");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let e = read_regular(&fifo, Links::Follow, 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file");
        std::os::unix::fs::symlink("/dev/zero", d.join("z")).unwrap();
        let e = read_regular(&d.join("z"), Links::Follow, 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file");
        assert!(open_regular(&d, Links::Follow).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_is_refused_where_asked_and_a_big_file_is_cut_off() {
        let d = scratch("link");
        std::fs::write(d.join("a"), b"0123456789").unwrap();
        std::os::unix::fs::symlink(d.join("a"), d.join("l")).unwrap();
        assert_eq!(
            read_regular(&d.join("l"), Links::Follow, 10).unwrap(),
            b"0123456789"
        );
        let e = read_regular(&d.join("l"), Links::Refuse, 10).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = read_regular(&d.join("a"), Links::Follow, 9).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        assert!(open_dir(&d).is_ok());
        assert!(open_dir(&d.join("a")).is_err());
        std::os::unix::fs::symlink(&d, d.join("dl")).unwrap();
        assert!(open_dir(&d.join("dl")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
