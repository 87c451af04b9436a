//! Allocation-free OS primitives.
//!
//! Contract: **no function in this file allocates, locks, panics or touches
//! Rust thread-locals.** Everything here may be called from the constructor,
//! from jemalloc's own initialisation (via `options.rs`), or from a fork
//! handler. Errors are reported as `None`/`false`, never as `io::Error`
//! (which could allocate).

use core::ffi::{CStr, c_int};
use core::fmt;

/// Reads the calling thread's `errno`.
#[inline(always)]
pub fn errno() -> c_int {
    // SAFETY: `__errno_location` always returns a valid pointer to the
    // calling thread's errno (glibc, initial-exec TLS inside libc).
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
#[inline(always)]
pub fn set_errno(value: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = value }
}

/// The process id, straight from the kernel (never a cached value, so it is
/// right in fork and vfork children).
#[inline]
pub fn getpid() -> i32 {
    // SAFETY: SYS_getpid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

/// Writes all of `bytes` to fd 2, retrying on EINTR, ignoring other errors.
/// Keeps `errno` as it was.
pub fn write_stderr(mut bytes: &[u8]) {
    let saved = errno();
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live byte slice.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            break;
        }
        bytes = &bytes[n as usize..];
    }
    set_errno(saved);
}

/// Reads up to `buf.len()` bytes of a (small, procfs/sysfs) file.
/// Returns the number of bytes read, or `None` if it cannot be opened.
pub fn read_file(path: &CStr, buf: &mut [u8]) -> Option<usize> {
    let saved = errno();
    // SAFETY: `path` is NUL-terminated; flags are plain constants.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        set_errno(saved);
        return None;
    }
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: writes stay inside `buf[len..]`.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: `fd` was opened above and is closed exactly once.
    unsafe { libc::close(fd) };
    set_errno(saved);
    Some(len)
}

/// Number of threads in this process, field 20 of `/proc/self/stat` (the
/// same figure CPython reads before warning about fork with threads).
pub fn num_threads() -> Option<u64> {
    self_stat().map(|(_, n)| n)
}

/// The thread-group leader (the main thread) has exited with
/// `pthread_exit` while other threads run on: `/proc/self/stat` then shows
/// the process as a zombie, and the leader still counts in `num_threads`.
pub fn leader_exited() -> bool {
    self_stat().is_some_and(|(state, _)| state == b'Z')
}

/// (state, num_threads): fields 3 and 20 of `/proc/self/stat`.
fn self_stat() -> Option<(u8, u64)> {
    let mut buf = [0u8; 1024];
    let len = read_file(c"/proc/self/stat", &mut buf)?;
    let stat = &buf[..len];
    // The command name (field 2) may contain spaces and ')': skip to the
    // last ')', after which fields are space-separated starting at field 3.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let mut fields = stat[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty());
    // Field 3 is the first after ')', so field 20 is the 18th.
    let state = *fields.next()?.first()?;
    Some((state, parse_u64(fields.nth(16)?)?))
}

/// Parses an unsigned decimal number, without allocating.
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// Parses a signed decimal number, without allocating.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    match s.split_first() {
        Some((b'-', rest)) => parse_u64(rest).and_then(|v| 0i64.checked_sub_unsigned(v)),
        Some((b'+', rest)) => parse_u64(rest).and_then(|v| i64::try_from(v).ok()),
        _ => parse_u64(s).and_then(|v| i64::try_from(v).ok()),
    }
}

/// Monotonic clock in milliseconds.
pub fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// Monotonic clock in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A fixed-capacity byte buffer that implements `fmt::Write`; text that does
/// not fit is cut off. Lets the shim format messages without the heap.
pub struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    /// An empty buffer.
    pub const fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
        }
    }

    /// Appends raw bytes (cut off at capacity).
    pub fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// The bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl<const N: usize> Default for StackBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> fmt::Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn parses_numbers() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"1x"), None);
        assert_eq!(parse_i64(b"-1"), Some(-1));
        assert_eq!(parse_i64(b"+5"), Some(5));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"-"), None);
    }

    #[test]
    fn stackbuf_truncates() {
        let mut b = StackBuf::<4>::new();
        write!(b, "abcdef").unwrap();
        assert_eq!(b.as_bytes(), b"abcd");
    }

    #[test]
    fn reads_own_thread_count() {
        assert!(num_threads().unwrap() >= 1);
    }
}
