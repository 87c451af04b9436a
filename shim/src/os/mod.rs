//! The OS layer: the only code, besides `exports.rs` (the C entry points)
//! and `python/ffi.rs` (the CPython C API), that calls libc or the kernel.
//!
//! | file | what |
//! |---|---|
//! | [`raw`] | system calls without libc, for the configuration read inside jemalloc's initialisation |
//! | [`fd`] | the shim's descriptors: the table they live in, their identity, fork |
//! | [`fence`] | the fork fence: short sections a fork must not split |
//! | [`sock`] | the control socket, its directory, connections |
//! | [`proc`] | reading `/proc/self` |
//! | [`cgroup`] | the process's memory cgroup |
//! | [`thread`] | threads of the shim's: spawning with signals blocked, joining, names, cancellation |
//! | [`spawner`] | a thread that starts threads in the application's descriptor table |
//! | [`time`] | the monotonic clock, sleeping, futexes |
//! | [`dl`] | `dlsym`, `dladdr`, the loaded objects' names, glibc's version |
//! | [`env`] | the environment, read without libc |
//! | [`memstream`] | an in-memory `FILE*` |
//! | [`overcommit`] | the kernel's overcommit heuristic, for jemalloc's `MAP_NORESERVE` mappings |
//! | [`thp`] | transparent huge pages: splitting the ones a purge covers in part |
//! | [`libm`] | the `log`, `exp` and `round` jemalloc's profiler calls (with `libm.c`) |
//! | [`unwind`] | std's unwinder, forwarded to the `libgcc_s.so.1` glibc loads (with `unwind.c`) |
//!
//! Contract: nothing here panics on bad input; errors come back as
//! `None`/`Err(errno)`. Functions marked *async-signal-safe* may be called
//! from fork handlers; functions marked *allocation-free* from jemalloc's
//! initialisation and the constructor. Code that runs on the application's
//! threads keeps `errno` as it found it.

pub mod cgroup;
pub mod dl;
pub mod env;
pub mod fd;
pub mod fence;
pub mod interpose;
pub mod libm;
pub mod mallinfo;
pub mod memstream;
pub mod overcommit;
pub mod proc;
pub mod raw;
pub mod sock;
pub mod spawner;
pub mod thp;
pub mod thread;
pub mod time;
pub mod unwind;

use core::ffi::c_int;
use core::mem::MaybeUninit;

/// A store for fork child handlers that leaves memory alone when it already
/// holds the value. After `fork` the child shares every page of the
/// parent's copy-on-write, so each page a handler writes costs the child a
/// page fault and a page copy even when the value does not change: in a
/// shell, whose children never used the shim's thread, most of the state
/// reset here is already zero (bench/FINDINGS-issue15.md, "Fork child
/// handler"). Async-signal-safe. Not for state other threads may change:
/// the load and the store are two steps.
pub trait ResetTo<T> {
    /// Stores `v` unless the value is `v` already.
    fn reset_to(&self, v: T);
}

macro_rules! reset_to {
    ($($atomic:ty => $t:ty),* $(,)?) => {$(
        impl ResetTo<$t> for $atomic {
            #[inline]
            fn reset_to(&self, v: $t) {
                use core::sync::atomic::Ordering::SeqCst;
                if self.load(SeqCst) != v {
                    self.store(v, SeqCst);
                }
            }
        }
    )*};
}

reset_to!(
    core::sync::atomic::AtomicBool => bool,
    core::sync::atomic::AtomicU8 => u8,
    core::sync::atomic::AtomicU32 => u32,
    core::sync::atomic::AtomicI32 => i32,
    core::sync::atomic::AtomicU64 => u64,
    core::sync::atomic::AtomicUsize => usize,
);

/// Where the calling thread's `errno` lies.
#[inline(always)]
pub fn errno_location() -> *mut c_int {
    // SAFETY: `__errno_location` has no preconditions and returns the
    // calling thread's errno (glibc, initial-exec TLS inside libc).
    unsafe { libc::__errno_location() }
}

/// Reads the calling thread's `errno`.
#[inline(always)]
pub fn errno() -> c_int {
    // SAFETY: a valid pointer to the calling thread's errno.
    unsafe { *errno_location() }
}

/// Sets the calling thread's `errno`.
#[inline(always)]
pub fn set_errno(value: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *errno_location() = value }
}

/// Keeps `errno` across a scope: code of ours that runs on the
/// application's threads must not change it. Writes it back only if it
/// changed: `errno` lies in the thread's TLS block, and after a `fork` that
/// page is shared copy-on-write, so a write of the same value would cost
/// the fork handlers a page fault in the parent and in the child.
pub struct KeepErrno {
    at: *mut c_int,
    saved: c_int,
}

impl KeepErrno {
    /// Remembers the current `errno`.
    #[inline]
    pub fn new() -> KeepErrno {
        // SAFETY: `__errno_location` gives the calling thread's errno.
        unsafe { Self::at(errno_location()) }
    }

    /// As [`KeepErrno::new`], for a fork child's handler: finds `errno`
    /// from the thread pointer, not through libc's `__errno_location`,
    /// whose code page would be a fault of the child's own.
    #[unsafe(link_section = ".text.startup")]
    pub fn in_fork_child() -> KeepErrno {
        let off = ERRNO_FROM_TP.load(core::sync::atomic::Ordering::Relaxed);
        match thread_pointer() {
            // SAFETY: the calling thread's errno ([`ERRNO_FROM_TP`]).
            Some(tp) if off != isize::MIN => unsafe {
                Self::at(tp.wrapping_add_signed(off) as *mut c_int)
            },
            _ => Self::new(),
        }
    }

    /// # Safety
    /// `at` is the calling thread's `errno`.
    unsafe fn at(at: *mut c_int) -> KeepErrno {
        // SAFETY: the caller's: the calling thread's errno, valid while the
        // thread lives.
        let saved = unsafe { *at };
        KeepErrno { at, saved }
    }
}

touched_at_start! {
    /// Where `errno` lies from the thread pointer, `isize::MIN` until
    /// [`find_errno`] ran: glibc's `errno` is static TLS, at the same offset
    /// from every thread's pointer.
    static ERRNO_FROM_TP: core::sync::atomic::AtomicIsize =
        core::sync::atomic::AtomicIsize::new(isize::MIN);
}

/// Constructor: finds where `errno` lies from the thread pointer, for
/// [`KeepErrno::in_fork_child`].
#[unsafe(link_section = ".text.startup")]
pub fn find_errno() {
    if let Some(tp) = thread_pointer() {
        let off = (errno_location() as isize).wrapping_sub(tp as isize);
        ERRNO_FROM_TP.store(off, core::sync::atomic::Ordering::Relaxed);
    }
}

/// The calling thread's thread pointer, as glibc sets it: on x86_64 the
/// `%fs` base, whose first word (`tcbhead_t.tcb`) holds it; on aarch64
/// `tpidr_el0`. `None` elsewhere.
#[inline(always)]
fn thread_pointer() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: reads the first word of the calling thread's TCB.
        unsafe {
            core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp,
                options(nostack, readonly, preserves_flags));
        }
        Some(tp)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        // SAFETY: reads a register.
        unsafe {
            core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp,
                options(nostack, nomem, preserves_flags));
        }
        Some(tp)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    None
}

impl Default for KeepErrno {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        // SAFETY: the thread that made it drops it (it is neither Send nor
        // Sync: it holds a raw pointer), so `at` is still its errno.
        unsafe {
            if *self.at != self.saved {
                *self.at = self.saved;
            }
        }
    }
}

/// The process id, straight from the kernel (never a cached value, so it is
/// right in fork and vfork children). Allocation-free, async-signal-safe.
#[inline]
pub fn getpid() -> i32 {
    raw::getpid()
}

/// The effective uid.
pub fn euid() -> u32 {
    raw::geteuid()
}

/// Writes all of `bytes` to fd 2 with raw system calls (a preloaded
/// `write` of another library is not called), retrying on EINTR, ignoring
/// other errors. Allocation-free; keeps `errno`.
///
/// fd 2 may be a pipe whose reader is gone (`prog 2>&1 | head -1`): the
/// write then raises SIGPIPE, whose default action would kill the
/// application for a line it never wrote. SIGPIPE is blocked on this thread
/// for the write, and one the write raised is taken back (one pending
/// before stays pending).
pub fn write_stderr(mut bytes: &[u8]) {
    let old = raw::block_sigpipe();
    let was_pending = raw::sigpipe_pending();
    let mut broken = false;
    while !bytes.is_empty() {
        match raw::write(2, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(libc::EINTR) => continue,
            Err(e) => {
                broken = e == libc::EPIPE;
                break;
            }
        }
    }
    if broken && !was_pending {
        raw::take_pending_sigpipe();
    }
    if let Some(old) = old {
        raw::set_sigmask(old);
    }
}

/// The system's page size (from the aux vector; allocation-free).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions and does not allocate.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// Waits (at most `timeout_ms`) until one of `fds` is ready; returns how
/// many are (0 on a timeout or a signal). Negative descriptors are ignored.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i64) -> usize {
    raw::poll(fds, timeout_ms).unwrap_or(0)
}

/// Decimal numbers without allocating (memshim-proto's, shared with
/// memshim-ctl).
pub use memshim_proto::settings::{parse_i64, parse_u64};

/// A fixed-capacity byte buffer that implements `fmt::Write`; text that does
/// not fit is cut off. Lets the shim format without the heap.
///
/// `repr(C)`, the length first: writing a short text into a big buffer
/// touches the pages at its start only.
#[repr(C)]
pub struct StackBuf<const N: usize> {
    len: usize,
    /// Only the first `len` bytes are initialised. The buffer is not zeroed
    /// first, so it touches only the memory it uses: the 8 KiB one that
    /// composes jemalloc's configuration in every exec would otherwise
    /// fault in fresh stack pages.
    buf: [MaybeUninit<u8>; N],
}

impl<const N: usize> StackBuf<N> {
    /// An empty buffer.
    pub const fn new() -> Self {
        StackBuf {
            buf: [const { MaybeUninit::uninit() }; N],
            len: 0,
        }
    }

    /// Appends raw bytes (cut off at capacity).
    #[unsafe(link_section = ".text.startup")]
    pub fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(N - self.len);
        for (dst, &b) in self.buf[self.len..self.len + n].iter_mut().zip(bytes) {
            dst.write(b);
        }
        self.len += n;
    }

    /// Appends `v` in decimal, without `core::fmt` (whose code the start-up
    /// path would otherwise fault in: issue 48, item 1).
    #[unsafe(link_section = ".text.startup")]
    pub fn push_i64(&mut self, v: i64) {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut n = v.unsigned_abs();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if v < 0 {
            self.push(b"-");
        }
        self.push(&digits[at..]);
    }

    /// Puts raw bytes before what was written; what no longer fits is cut
    /// off at the end.
    #[unsafe(link_section = ".text.startup")]
    pub fn prepend(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(N);
        let kept = self.len.min(N - n);
        self.buf.copy_within(..kept, n);
        for (dst, &b) in self.buf[..n].iter_mut().zip(bytes) {
            dst.write(b);
        }
        self.len = kept + n;
    }

    /// Forgets what was written.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Keeps the first `n` bytes at most.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Where the bytes start.
    pub fn as_ptr(&self) -> *const u8 {
        self.buf.as_ptr().cast()
    }

    /// The bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written by `push`.
        unsafe { core::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes with a NUL appended, as a C string (`None` if they hold a
    /// NUL or there is no room for one).
    #[unsafe(link_section = ".text.startup")]
    pub fn as_cstr(&mut self) -> Option<&core::ffi::CStr> {
        if self.len >= N || self.as_bytes().contains(&0) {
            return None;
        }
        self.buf[self.len].write(0);
        // SAFETY: the first `len` bytes were written by `push`, the next one
        // just above.
        let with_nul =
            unsafe { core::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.len + 1) };
        core::ffi::CStr::from_bytes_with_nul(with_nul).ok()
    }
}

impl<const N: usize> Default for StackBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> core::fmt::Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
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
    fn stackbuf_prepends_and_cuts_off_at_the_end() {
        let mut b = StackBuf::<12>::new();
        b.push(b"tail");
        b.prepend(b"head,");
        assert_eq!(b.as_bytes(), b"head,tail");
        b.prepend(b"more,");
        assert_eq!(b.as_bytes(), b"more,head,ta");
        let mut e = StackBuf::<4>::new();
        e.prepend(b"toolong");
        assert_eq!(e.as_bytes(), b"tool");
    }

    #[test]
    fn stackbuf_writes_numbers_as_fmt_does() {
        for v in [0, 7, -7, 10, 1000, -1, i64::MAX, i64::MIN, 1_048_576] {
            let mut b = StackBuf::<24>::new();
            b.push_i64(v);
            assert_eq!(b.as_bytes(), v.to_string().as_bytes());
        }
    }

    #[test]
    fn stackbuf_truncates_and_makes_c_strings() {
        let mut b = StackBuf::<4>::new();
        write!(b, "abcdef").unwrap();
        assert_eq!(b.as_bytes(), b"abcd");
        assert!(b.as_cstr().is_none(), "no room for the NUL");
        let mut b = StackBuf::<8>::new();
        write!(b, "/a/b").unwrap();
        assert_eq!(b.as_cstr().unwrap().to_bytes(), b"/a/b");
    }
}
