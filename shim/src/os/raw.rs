//! System calls made with the `syscall` instruction, not through libc.
//!
//! The shim reads its configuration inside jemalloc's initialisation, which
//! holds jemalloc's init lock, and often before libc's own initialisation
//! has finished. A libc call there can reach another preloaded library
//! instead of glibc (`open`, `read`, `write` and `sched_getaffinity` are
//! commonly interposed by tracing and sandboxing preloads); if that library
//! allocates, the allocation re-enters jemalloc, which deadlocks on its own
//! init lock. These calls cannot be interposed, touch no `errno` (errors
//! come back as `Err(errno)`), allocate nothing and are async-signal-safe.

use core::ffi::CStr;

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn syscall4(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the caller passes a valid system call number and arguments
    // that are valid for it; the kernel clobbers only rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn syscall4(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: as for x86_64; on aarch64 the kernel clobbers nothing else.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a as isize => ret,
            in("x1") b,
            in("x2") c,
            in("x3") d,
            options(nostack),
        );
    }
    ret
}

fn result(r: isize) -> Result<usize, i32> {
    if (-4095..0).contains(&r) {
        Err(-r as i32)
    } else {
        Ok(r as usize)
    }
}

/// `openat(AT_FDCWD, path, flags | O_CLOEXEC)`.
#[unsafe(link_section = ".text.startup")]
pub fn open(path: &CStr, flags: i32) -> Result<i32, i32> {
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let r = unsafe {
        syscall4(
            libc::SYS_openat as usize,
            libc::AT_FDCWD as usize,
            path.as_ptr() as usize,
            (flags | libc::O_CLOEXEC) as usize,
            0,
        )
    };
    result(r).map(|fd| fd as i32)
}

/// Whether `path` exists (`faccessat(AT_FDCWD, path, F_OK)`).
#[unsafe(link_section = ".text.startup")]
pub fn exists(path: &CStr) -> bool {
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let r = unsafe {
        syscall4(
            libc::SYS_faccessat as usize,
            libc::AT_FDCWD as usize,
            path.as_ptr() as usize,
            libc::F_OK as usize,
            0,
        )
    };
    result(r).is_ok()
}

/// `read(fd, buf)`.
#[unsafe(link_section = ".text.startup")]
pub fn read(fd: i32, buf: &mut [u8]) -> Result<usize, i32> {
    // SAFETY: the pointer and length describe `buf`, which the kernel writes.
    result(unsafe {
        syscall4(
            libc::SYS_read as usize,
            fd as usize,
            buf.as_mut_ptr() as usize,
            buf.len(),
            0,
        )
    })
}

/// `write(fd, bytes)`.
pub fn write(fd: i32, bytes: &[u8]) -> Result<usize, i32> {
    // SAFETY: the pointer and length describe `bytes`, which the kernel reads.
    result(unsafe {
        syscall4(
            libc::SYS_write as usize,
            fd as usize,
            bytes.as_ptr() as usize,
            bytes.len(),
            0,
        )
    })
}

/// The kernel's signal set for `rt_sig*` calls (64 signals on Linux).
type KernelSigset = u64;
const SIGSET_BYTES: usize = core::mem::size_of::<KernelSigset>();
const SIGPIPE_BIT: KernelSigset = 1 << (libc::SIGPIPE - 1);

/// Blocks SIGPIPE on the calling thread; returns the previous mask for
/// [`set_sigmask`].
pub fn block_sigpipe() -> Option<u64> {
    let set = SIGPIPE_BIT;
    let mut old: KernelSigset = 0;
    // SAFETY: both pointers are valid 8-byte signal sets.
    result(unsafe {
        syscall4(
            libc::SYS_rt_sigprocmask as usize,
            libc::SIG_BLOCK as usize,
            (&raw const set) as usize,
            (&raw mut old) as usize,
            SIGSET_BYTES,
        )
    })
    .ok()
    .map(|_| old)
}

/// Restores a mask [`block_sigpipe`] returned.
pub fn set_sigmask(mask: u64) {
    // SAFETY: a valid 8-byte signal set; no old set is asked for.
    let _ = unsafe {
        syscall4(
            libc::SYS_rt_sigprocmask as usize,
            libc::SIG_SETMASK as usize,
            (&raw const mask) as usize,
            0,
            SIGSET_BYTES,
        )
    };
}

/// Whether a SIGPIPE is pending for the calling thread or the process.
pub fn sigpipe_pending() -> bool {
    let mut set: KernelSigset = 0;
    // SAFETY: a valid 8-byte signal set to fill.
    let r = unsafe {
        syscall4(
            libc::SYS_rt_sigpending as usize,
            (&raw mut set) as usize,
            SIGSET_BYTES,
            0,
            0,
        )
    };
    result(r).is_ok() && set & SIGPIPE_BIT != 0
}

/// Takes a pending SIGPIPE (blocked on this thread) without waiting.
pub fn take_pending_sigpipe() {
    let set = SIGPIPE_BIT;
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid signal set and timeout; no siginfo is asked for.
    let _ = unsafe {
        syscall4(
            libc::SYS_rt_sigtimedwait as usize,
            (&raw const set) as usize,
            0,
            (&raw const zero) as usize,
            SIGSET_BYTES,
        )
    };
}

/// `close(fd)`.
#[unsafe(link_section = ".text.startup")]
pub fn close(fd: i32) {
    // SAFETY: closing a descriptor number has no memory-safety preconditions.
    let _ = unsafe { syscall4(libc::SYS_close as usize, fd as usize, 0, 0, 0) };
}

/// `getpid()`.
pub fn getpid() -> i32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { syscall4(libc::SYS_getpid as usize, 0, 0, 0, 0) as i32 }
}

/// `clock_gettime(clock)` by the system call, `None` if it failed.
#[inline]
pub fn clock_gettime(clock: libc::clockid_t) -> Option<libc::timespec> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the call.
    let r = unsafe {
        syscall4(
            libc::SYS_clock_gettime as usize,
            clock as usize,
            &mut ts as *mut libc::timespec as usize,
            0,
            0,
        )
    };
    result(r).ok().map(|_| ts)
}

/// `gettid()`.
pub fn gettid() -> i32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { syscall4(libc::SYS_gettid as usize, 0, 0, 0, 0) as i32 }
}

/// Whether `resource` (`RLIMIT_AS`, `RLIMIT_DATA`) has a soft limit
/// (`prlimit64` on this process; false if it cannot be read).
#[unsafe(link_section = ".text.startup")]
pub fn limited(resource: u32) -> bool {
    let mut old = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: pid 0 is this process; no new limit; `old` is writable.
    let r = unsafe {
        syscall4(
            libc::SYS_prlimit64 as usize,
            0,
            resource as usize,
            0,
            &mut old as *mut libc::rlimit64 as usize,
        )
    };
    result(r).is_ok() && old.rlim_cur != libc::RLIM64_INFINITY
}

/// The number of CPUs in this thread's affinity mask (`sched_getaffinity`),
/// at least 1.
#[unsafe(link_section = ".text.startup")]
pub fn affinity_cpus() -> u32 {
    let mut mask = [0u64; 64]; // 4096 CPUs
    // SAFETY: the kernel writes at most `size_of_val(&mask)` bytes into it.
    let r = unsafe {
        syscall4(
            libc::SYS_sched_getaffinity as usize,
            0,
            core::mem::size_of_val(&mask),
            mask.as_mut_ptr() as usize,
            0,
        )
    };
    match result(r) {
        Ok(bytes) => {
            let words = (bytes / 8).min(mask.len());
            mask[..words]
                .iter()
                .map(|w| w.count_ones())
                .sum::<u32>()
                .max(1)
        }
        Err(_) => 1,
    }
}

/// `sysinfo`: memory and swap totals, among others.
pub fn sysinfo() -> Option<libc::sysinfo> {
    // SAFETY: all-zero bytes are a valid `struct sysinfo` (plain data).
    let mut si: libc::sysinfo = unsafe { core::mem::zeroed() };
    // SAFETY: `si` is a valid, writable `struct sysinfo`.
    let r = unsafe {
        syscall4(
            libc::SYS_sysinfo as usize,
            &mut si as *mut libc::sysinfo as usize,
            0,
            0,
            0,
        )
    };
    result(r).ok().map(|_| si)
}

/// Reads up to `buf.len()` bytes of a small file (procfs, sysfs, cgroupfs).
/// Returns the number of bytes read, or `None` if it cannot be opened.
///
/// One `read` (retried on `EINTR`): these files are generated whole when
/// read, and the kernel hands over as much as fits in a single call, so a
/// short read is their end. A second call only to see 0 would cost a system
/// call per file on every exec (`options::cgroup_quota_cpus`).
#[unsafe(link_section = ".text.startup")]
pub fn read_file(path: &CStr, buf: &mut [u8]) -> Option<usize> {
    match read_file_errno(path, buf) {
        Err(ReadError::Open(_)) => None,
        Err(ReadError::Read(_)) => Some(0),
        Ok(len) => Some(len),
    }
}

/// Why [`read_file_errno`] read nothing: the errno of the `open` or of the
/// `read`.
pub enum ReadError {
    /// `open` failed.
    Open(i32),
    /// `read` failed.
    Read(i32),
}

/// [`read_file`] that says why the file could not be read.
pub fn read_file_errno(path: &CStr, buf: &mut [u8]) -> Result<usize, ReadError> {
    let fd = open(path, libc::O_RDONLY).map_err(ReadError::Open)?;
    let len = loop {
        match read(fd, buf) {
            Err(libc::EINTR) => continue,
            r => break r.map_err(ReadError::Read),
        }
    };
    close(fd);
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_calls_agree_with_libc() {
        // SAFETY: plain getters.
        unsafe {
            assert_eq!(getpid(), libc::getpid());
            assert_eq!(gettid(), libc::gettid());
        }
        let mut buf = [0u8; 64];
        let n = read_file(c"/proc/self/stat", &mut buf).unwrap();
        assert!(n > 0 && buf[..n].starts_with(getpid().to_string().as_bytes()));
        assert!(read_file(c"/nonexistent", &mut buf).is_none());
        assert!(affinity_cpus() >= 1);
        assert_eq!(result(-2), Err(2));
        assert_eq!(result(5), Ok(5));
    }
}
