//! Reading `/proc/self`.
//!
//! The thread count, which the fork handler needs on the application's
//! thread, is read without opening anything: the link count of
//! `/proc/self/task` is 2 plus the number of threads. Everything else opens
//! files and is read on the shim's thread.

use core::ffi::CStr;
use memshim_proto::procfs::{stat_starttime, stat_state};

/// Number of threads in this process, the kernel's figure (field 20 of
/// `/proc/self/stat`, which CPython reads before warning about fork with
/// threads; a main thread that called `pthread_exit` still counts). Opens
/// no descriptor.
pub fn thread_count() -> Option<u64> {
    let st = super::raw::stat(c"/proc/self/task", true).ok()?;
    #[allow(clippy::unnecessary_cast)] // u32 on aarch64
    (st.st_nlink as u64).checked_sub(2).filter(|&n| n > 0)
}

/// Reads up to `buf.len()` bytes of a small procfs or sysfs file. `None` if
/// it cannot be opened. Shim's thread (it opens a descriptor).
pub fn read_file(path: &CStr, buf: &mut [u8]) -> Option<usize> {
    let _e = super::KeepErrno::new();
    super::raw::read_file(path, buf)
}

/// The start time of process `pid` as this `/proc` shows it: `Ok(None)`
/// if there is no such process here (`ENOENT`, `ESRCH`), `Err(errno)` if
/// its file could not be read for another reason. Read as
/// `/proc/./<pid>/stat`, like [`starttime`], so that qemu-user's rewriting
/// of this process's own files does not apply. Shim's thread.
pub fn starttime_of(pid: i32) -> Result<Option<u64>, i32> {
    let mut path = super::StackBuf::<48>::new();
    let _ = core::fmt::Write::write_fmt(&mut path, format_args!("/proc/./{pid}/stat\0"));
    let path = CStr::from_bytes_with_nul(path.as_bytes()).map_err(|_| libc::EINVAL)?;
    let mut buf = [0u8; 1024];
    use super::raw::ReadError::{Open, Read};
    match super::raw::read_file_errno(path, &mut buf) {
        // No such process; or it went between the open and the read.
        Err(Open(libc::ENOENT | libc::ESRCH) | Read(libc::ESRCH)) => Ok(None),
        Err(Open(e) | Read(e)) => Err(e),
        Ok(n) => stat_starttime(&buf[..n]).map(Some).ok_or(libc::EINVAL),
    }
}

/// This process's start time (field 22 of its stat file), 0 if unreadable.
///
/// Read as `/proc/./self/stat`, which the kernel resolves to the same file.
/// User-mode emulators (qemu-user, which runs arm64 containers on x86_64
/// hosts through binfmt_misc) rewrite only the literal `/proc/self/stat`
/// and report their own start-up time there, a few ticks later than the
/// kernel's; the socket name would then never match what memshim-ctl reads
/// from `/proc/<pid>/stat`.
pub fn starttime() -> u64 {
    let mut buf = [0u8; 1024];
    read_file(c"/proc/./self/stat", &mut buf)
        .and_then(|n| stat_starttime(&buf[..n]))
        .unwrap_or(0)
}

/// The inode number of this process's pid namespace (`/proc/self/ns/pid`),
/// 0 if unknown. Opens no descriptor.
pub fn pid_namespace() -> u64 {
    super::raw::stat(c"/proc/self/ns/pid", true).map_or(0, |st| st.st_ino)
}

/// The main thread (the thread-group leader) has ended with `pthread_exit`
/// while other threads run on: `/proc/self/stat` shows the process as a
/// zombie then.
pub fn leader_exited() -> bool {
    let mut buf = [0u8; 1024];
    read_file(c"/proc/self/stat", &mut buf)
        .and_then(|n| stat_state(&buf[..n]).map(|s| s == b'Z'))
        .unwrap_or(false)
}

/// `/proc/self/task/<tid>/<name>` of the calling thread, NUL-terminated.
/// `/proc/self/<name>` is the main thread's, whose address-space files
/// read empty (`statm` all zeros, `status` without `VmRSS`) and
/// `smaps_rollup` fails once it has ended with `pthread_exit` while other
/// threads run on; the calling thread shares the same address space.
/// (`/proc/thread-self` is the same, from Linux 3.17 only.)
fn own_task_file(name: &str) -> super::StackBuf<64> {
    let mut path = super::StackBuf::<64>::new();
    let _ = core::fmt::Write::write_fmt(
        &mut path,
        format_args!("/proc/self/task/{}/{name}\0", super::thread::gettid()),
    );
    path
}

/// Resident set size in bytes (the second field of [`own_task_file`]
/// `statm`).
pub fn rss_bytes() -> u64 {
    let path = own_task_file("statm");
    let mut buf = [0u8; 128];
    let Some(len) = CStr::from_bytes_with_nul(path.as_bytes())
        .ok()
        .and_then(|p| read_file(p, &mut buf))
    else {
        return 0;
    };
    let pages = buf[..len]
        .split(|&b| b == b' ')
        .nth(1)
        .and_then(super::parse_u64)
        .unwrap_or(0);
    pages * super::page_size() as u64
}

/// [`own_task_file`] `name` as text (bytes that are not UTF-8, as in a
/// thread name that `prctl` set, read as U+FFFD).
fn own_task_text(name: &str) -> Option<String> {
    let path = own_task_file(name);
    let path = core::str::from_utf8(path.as_bytes().strip_suffix(b"\0")?).ok()?;
    std::fs::read(path)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A `Key:   123 kB` line of a status-like file, in bytes.
fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let n: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(n * 1024)
    })
}

/// The memory lines of [`own_task_file`] `status`, in bytes (about 20 µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`.
    pub rss: u64,
    /// `RssAnon`.
    pub anon: Option<u64>,
    /// `RssFile`.
    pub file: Option<u64>,
    /// `RssShmem`.
    pub shmem: Option<u64>,
    /// `VmSwap`.
    pub swap: Option<u64>,
}

/// Reads [`Memory`].
pub fn memory() -> Memory {
    let status = own_task_text("status").unwrap_or_default();
    Memory {
        rss: kb_field(&status, "VmRSS").unwrap_or(0),
        anon: kb_field(&status, "RssAnon"),
        file: kb_field(&status, "RssFile"),
        shmem: kb_field(&status, "RssShmem"),
        swap: kb_field(&status, "VmSwap"),
    }
}

/// PSS in bytes from [`own_task_file`] `smaps_rollup`, which walks every page table
/// (about 16 ms of this process's CPU per resident GiB).
pub fn pss() -> Option<u64> {
    own_task_text("smaps_rollup").and_then(|s| kb_field(&s, "Pss"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(thread_count().unwrap() >= 1);
        assert!(starttime() > 0);
        assert!(pid_namespace() > 0);
        assert!(!leader_exited());
        assert!(rss_bytes() > 0);
        assert!(memory().rss > 0 && pss().is_some());
        let s = "Name:\tx\nVmRSS:\t    2048 kB\nRssAnon:\t  1024 kB\n";
        assert_eq!(kb_field(s, "VmRSS"), Some(2 << 20));
        assert_eq!(kb_field(s, "VmSwap"), None);
    }
}
