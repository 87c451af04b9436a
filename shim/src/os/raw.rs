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
//!
//! The control endpoint's calls (sockets, its directory, its descriptors)
//! are made here too, for start-up's sake: the library is bound eagerly
//! (`-z now`), so every libc function it names is one more symbol the
//! loader looks up in every exec of every preloaded process, about 700
//! instructions each (bench/FINDINGS-startup.md). A function that jemalloc
//! or Rust's standard library imports anyway gains nothing from being
//! here, but costs nothing either.
//!
//! The kernel's `struct stat` is glibc's on x86_64 and aarch64, so
//! [`libc::stat`] is filled directly.

use core::ffi::CStr;

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn syscall6(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller passes a valid system call number and arguments
    // that are valid for it; the kernel clobbers only rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn syscall6(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: as for x86_64; on aarch64 the kernel clobbers nothing else.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a[0] as isize => ret,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            in("x4") a[4],
            in("x5") a[5],
            options(nostack),
        );
    }
    ret
}

#[inline(always)]
unsafe fn syscall4(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
    // SAFETY: the caller's contract, passed on.
    unsafe { syscall6(n, [a, b, c, d, 0, 0]) }
}

/// A system call whose result is a number or `Err(errno)`.
#[inline(always)]
unsafe fn call(n: libc::c_long, a: [usize; 6]) -> Result<usize, i32> {
    // SAFETY: the caller's contract, passed on.
    result(unsafe { syscall6(n as usize, a) })
}

/// A system call whose arguments are all numbers (or null pointers):
/// nothing the kernel reads or writes through a pointer of ours.
#[inline(always)]
fn numbers(n: libc::c_long, a: [usize; 6]) -> Result<usize, i32> {
    // SAFETY: no argument points at memory (the callers pass numbers,
    // descriptors and null).
    unsafe { call(n, a) }
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
/// (false if it cannot be read).
#[unsafe(link_section = ".text.startup")]
pub fn limited(resource: u32) -> bool {
    soft_limit(resource).is_some_and(|cur| cur != libc::RLIM64_INFINITY)
}

/// The soft limit of `resource` (`prlimit64` on this process).
#[inline]
pub fn soft_limit(resource: u32) -> Option<u64> {
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
    result(r).ok().map(|_| old.rlim_cur)
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

// --- files and directories ---------------------------------------------------

/// `fstat(fd)`. Async-signal-safe.
#[inline]
pub fn fstat(fd: i32) -> Result<libc::stat, i32> {
    // SAFETY: all-zero bytes are a valid `struct stat` (plain data).
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a writable `struct stat`; any number may be passed.
    unsafe {
        call(
            libc::SYS_fstat,
            [fd as usize, (&raw mut st) as usize, 0, 0, 0, 0],
        )
    }?;
    Ok(st)
}

/// `stat(path)`, or `lstat(path)` where `follow` is false
/// (`newfstatat(AT_FDCWD, ...)`).
#[inline]
pub fn stat(path: &CStr, follow: bool) -> Result<libc::stat, i32> {
    // SAFETY: all-zero bytes are a valid `struct stat` (plain data).
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: `path` is NUL-terminated; `st` is a writable `struct stat`.
    unsafe {
        call(
            libc::SYS_newfstatat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                (&raw mut st) as usize,
                flags as usize,
                0,
                0,
            ],
        )
    }?;
    Ok(st)
}

/// `mkdir(path, mode)` (`mkdirat`).
pub fn mkdir(path: &CStr, mode: u32) -> Result<(), i32> {
    // SAFETY: `path` is NUL-terminated.
    let r = unsafe {
        call(
            libc::SYS_mkdirat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                mode as usize,
                0,
                0,
                0,
            ],
        )
    };
    r.map(drop)
}

/// `chmod(path, mode)` (`fchmodat`).
pub fn chmod(path: &CStr, mode: u32) -> Result<(), i32> {
    // SAFETY: `path` is NUL-terminated.
    let r = unsafe {
        call(
            libc::SYS_fchmodat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                mode as usize,
                0,
                0,
                0,
            ],
        )
    };
    r.map(drop)
}

/// `fchmod(fd, mode)`.
pub fn fchmod(fd: i32, mode: u32) -> Result<(), i32> {
    numbers(libc::SYS_fchmod, [fd as usize, mode as usize, 0, 0, 0, 0]).map(drop)
}

/// `unlink(path)` (`unlinkat`).
pub fn unlink(path: &CStr) -> Result<(), i32> {
    // SAFETY: `path` is NUL-terminated.
    let r = unsafe {
        call(
            libc::SYS_unlinkat,
            [libc::AT_FDCWD as usize, path.as_ptr() as usize, 0, 0, 0, 0],
        )
    };
    r.map(drop)
}

/// `pread(fd, buf, offset)`.
pub fn pread(fd: i32, buf: &mut [u8], offset: usize) -> Result<usize, i32> {
    // SAFETY: the pointer and length describe `buf`, which the kernel writes.
    unsafe {
        call(
            libc::SYS_pread64,
            [
                fd as usize,
                buf.as_mut_ptr() as usize,
                buf.len(),
                offset,
                0,
                0,
            ],
        )
    }
}

// --- descriptors ---------------------------------------------------------------

/// The descriptor flags of `fd` (`fcntl(fd, F_GETFD)`): `Err(EBADF)` for a
/// number that is not open.
pub fn fd_flags(fd: i32) -> Result<i32, i32> {
    numbers(
        libc::SYS_fcntl,
        [fd as usize, libc::F_GETFD as usize, 0, 0, 0, 0],
    )
    .map(|n| n as i32)
}

/// A close-on-exec copy of `fd` on the lowest free number from `min` on
/// (`fcntl(fd, F_DUPFD_CLOEXEC, min)`).
pub fn dup_from(fd: i32, min: i32) -> Result<i32, i32> {
    let cmd = libc::F_DUPFD_CLOEXEC as usize;
    numbers(libc::SYS_fcntl, [fd as usize, cmd, min as usize, 0, 0, 0]).map(|n| n as i32)
}

/// `dup3(old, new, flags)`.
pub fn dup3(old: i32, new: i32, flags: i32) -> Result<i32, i32> {
    let a = [old as usize, new as usize, flags as usize, 0, 0, 0];
    numbers(libc::SYS_dup3, a).map(|n| n as i32)
}

/// `pipe2(flags)`: (read end, write end).
pub fn pipe2(flags: i32) -> Result<[i32; 2], i32> {
    let mut fds = [-1i32; 2];
    // SAFETY: `fds` is two writable ints.
    unsafe {
        call(
            libc::SYS_pipe2,
            [fds.as_mut_ptr() as usize, flags as usize, 0, 0, 0, 0],
        )
    }?;
    Ok(fds)
}

/// `eventfd(0, flags)` (`eventfd2`).
pub fn eventfd(flags: i32) -> Result<i32, i32> {
    numbers(libc::SYS_eventfd2, [0, flags as usize, 0, 0, 0, 0]).map(|n| n as i32)
}

/// `close_range(first, last, flags)`.
pub fn close_range(first: u32, last: u32, flags: u32) -> Result<(), i32> {
    let a = [first as usize, last as usize, flags as usize, 0, 0, 0];
    numbers(libc::SYS_close_range, a).map(drop)
}

/// `unshare(flags)`.
pub fn unshare(flags: i32) -> Result<(), i32> {
    numbers(libc::SYS_unshare, [flags as usize, 0, 0, 0, 0, 0]).map(drop)
}

/// Waits (at most `timeout_ms`, forever if negative) until one of `fds` is
/// ready (`ppoll`, which every architecture has); returns how many are.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i64) -> Result<usize, i32> {
    // The kernel writes the time left back into it.
    let mut ts = libc::timespec {
        tv_sec: (timeout_ms.max(0) / 1000) as libc::time_t,
        tv_nsec: ((timeout_ms.max(0) % 1000) * 1_000_000) as libc::c_long,
    };
    let tsp = if timeout_ms < 0 {
        0
    } else {
        (&raw mut ts) as usize
    };
    // SAFETY: the pointer and length describe `fds`; `tsp` is null or
    // points at the writable `ts`; no signal mask is passed.
    unsafe {
        call(
            libc::SYS_ppoll,
            [
                fds.as_mut_ptr() as usize,
                fds.len(),
                tsp,
                0,
                SIGSET_BYTES,
                0,
            ],
        )
    }
}

// --- sockets -------------------------------------------------------------------

/// `socket(domain, ty, protocol)`.
pub fn socket(domain: i32, ty: i32, protocol: i32) -> Result<i32, i32> {
    let a = [domain as usize, ty as usize, protocol as usize, 0, 0, 0];
    numbers(libc::SYS_socket, a).map(|n| n as i32)
}

/// `bind(fd, addr, len)` for a Unix address (`len` at most its size).
pub fn bind(fd: i32, addr: &libc::sockaddr_un, len: libc::socklen_t) -> Result<(), i32> {
    addr_call(libc::SYS_bind, fd, addr, len)
}

/// `bind` or `connect`.
fn addr_call(
    n: libc::c_long,
    fd: i32,
    addr: &libc::sockaddr_un,
    len: libc::socklen_t,
) -> Result<(), i32> {
    let len = (len as usize).min(core::mem::size_of::<libc::sockaddr_un>());
    // SAFETY: `addr` is readable for `len` bytes, at most its size.
    unsafe { call(n, [fd as usize, addr as *const _ as usize, len, 0, 0, 0]) }.map(drop)
}

/// `connect(fd, addr, len)` for a Unix address (`len` at most its size).
pub fn connect(fd: i32, addr: &libc::sockaddr_un, len: libc::socklen_t) -> Result<(), i32> {
    addr_call(libc::SYS_connect, fd, addr, len)
}

/// `listen(fd, backlog)`.
pub fn listen(fd: i32, backlog: i32) -> Result<(), i32> {
    numbers(
        libc::SYS_listen,
        [fd as usize, backlog as usize, 0, 0, 0, 0],
    )
    .map(drop)
}

/// `accept4(fd, NULL, NULL, flags)`.
pub fn accept4(fd: i32, flags: i32) -> Result<i32, i32> {
    numbers(libc::SYS_accept4, [fd as usize, 0, 0, flags as usize, 0, 0]).map(|n| n as i32)
}

/// `getsockname(fd)` of a socket whose address fits a `sockaddr_un`.
pub fn getsockname(fd: i32) -> Result<libc::sockaddr_un, i32> {
    // SAFETY: all-zero bytes are a valid `sockaddr_un` (plain data).
    let mut a: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `a`/`len` describe a writable sockaddr_un; the kernel writes
    // at most `len` bytes.
    unsafe {
        call(
            libc::SYS_getsockname,
            [
                fd as usize,
                (&raw mut a) as usize,
                (&raw mut len) as usize,
                0,
                0,
                0,
            ],
        )
    }?;
    Ok(a)
}

/// The peer's credentials at connect time (`SO_PEERCRED`).
pub fn peer_cred(fd: i32) -> Result<libc::ucred, i32> {
    // SAFETY: all-zero bytes are a valid `ucred` (plain data).
    let mut cred: libc::ucred = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred`/`len` describe a buffer of the size SO_PEERCRED fills.
    unsafe {
        call(
            libc::SYS_getsockopt,
            [
                fd as usize,
                libc::SOL_SOCKET as usize,
                libc::SO_PEERCRED as usize,
                (&raw mut cred) as usize,
                (&raw mut len) as usize,
                0,
            ],
        )
    }?;
    Ok(cred)
}

/// `recv(fd, buf, flags)` (`recvfrom` with no address).
pub fn recv(fd: i32, buf: &mut [u8], flags: i32) -> Result<usize, i32> {
    // SAFETY: the pointer and length describe `buf`; no address is asked for.
    unsafe {
        call(
            libc::SYS_recvfrom,
            [
                fd as usize,
                buf.as_mut_ptr() as usize,
                buf.len(),
                flags as usize,
                0,
                0,
            ],
        )
    }
}

/// `send(fd, buf, flags)` (`sendto` with no address).
pub fn send(fd: i32, buf: &[u8], flags: i32) -> Result<usize, i32> {
    // SAFETY: the pointer and length describe `buf`; no address is given.
    unsafe {
        call(
            libc::SYS_sendto,
            [
                fd as usize,
                buf.as_ptr() as usize,
                buf.len(),
                flags as usize,
                0,
                0,
            ],
        )
    }
}

// --- the process -----------------------------------------------------------------

/// The effective uid (`geteuid`).
pub fn geteuid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { syscall4(libc::SYS_geteuid as usize, 0, 0, 0, 0) as u32 }
}

/// Whether transparent huge pages are disabled for this process
/// (`prctl(PR_GET_THP_DISABLE)`).
pub fn thp_disabled() -> bool {
    numbers(
        libc::SYS_prctl,
        [libc::PR_GET_THP_DISABLE as usize, 0, 0, 0, 0, 0],
    ) == Ok(1)
}

/// Sleeps for `ts` (or less, if a signal interrupts). Not a cancellation
/// point, unlike libc's `nanosleep`.
pub fn nanosleep(ts: &libc::timespec) {
    // SAFETY: `ts` is a valid timespec; no remainder is asked for.
    let _ = unsafe {
        syscall4(
            libc::SYS_nanosleep as usize,
            ts as *const _ as usize,
            0,
            0,
            0,
        )
    };
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

    /// The calls that stand in for libc's give what libc's give: the
    /// kernel's `struct stat` read as `libc::stat`, a Unix socket's whole
    /// life, descriptors, and errors as `Err(errno)`.
    #[test]
    fn endpoint_calls_agree_with_libc() {
        let dir = std::env::temp_dir().join(format!("memshim-raw-{}", getpid()));
        let dir_c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        assert_eq!(mkdir(&dir_c, 0o700), Ok(()));
        assert_eq!(mkdir(&dir_c, 0o700), Err(libc::EEXIST));
        let link = std::ffi::CString::new(format!("{}/link", dir.display())).unwrap();
        std::os::unix::fs::symlink(&dir, link.to_str().unwrap()).unwrap();
        // SAFETY: all-zero is a valid `struct stat`.
        let mut want: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: a C string path and a writable `struct stat`.
        assert_eq!(unsafe { libc::lstat(link.as_ptr(), &mut want) }, 0);
        let got = stat(&link, false).unwrap();
        assert_eq!(
            (
                got.st_dev,
                got.st_ino,
                got.st_mode,
                got.st_uid,
                got.st_nlink
            ),
            (
                want.st_dev,
                want.st_ino,
                want.st_mode,
                want.st_uid,
                want.st_nlink
            )
        );
        assert_eq!(got.st_mode & libc::S_IFMT, libc::S_IFLNK);
        let followed = stat(&link, true).unwrap();
        assert_eq!(followed.st_mode & libc::S_IFMT, libc::S_IFDIR);
        let no_follow = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        // SAFETY: a C string path; the call fails (a symbolic link).
        assert_eq!(unsafe { libc::open(link.as_ptr(), no_follow) }, -1);
        let libc_errno = std::io::Error::last_os_error().raw_os_error().unwrap();
        assert_eq!(open(&link, no_follow), Err(libc_errno));
        let d = open(&dir_c, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
        assert_eq!(fstat(d).map(|s| s.st_ino), Ok(followed.st_ino));
        assert_eq!(fchmod(d, 0o750), Ok(()));
        assert_eq!(stat(&dir_c, true).unwrap().st_mode & 0o7777, 0o750);
        assert_eq!(chmod(&dir_c, 0o700), Ok(()));
        assert_eq!(stat(&dir_c, true).unwrap().st_mode & 0o7777, 0o700);
        // SAFETY: a plain getter.
        assert_eq!(geteuid(), unsafe { libc::geteuid() });
        assert_eq!(fstat(-1).map(drop), Err(libc::EBADF));

        // A listener, a client, and one message each way.
        let path = format!("{}/sock", dir.display());
        let path_c = std::ffi::CString::new(path.clone()).unwrap();
        // SAFETY: all-zero is a valid `sockaddr_un`.
        let mut a: libc::sockaddr_un = unsafe { core::mem::zeroed() };
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in a.sun_path.iter_mut().zip(path.bytes()) {
            *d = s as libc::c_char;
        }
        let len = (2 + path.len() + 1) as libc::socklen_t;
        let ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
        let l = socket(libc::AF_UNIX, ty, 0).unwrap();
        assert_eq!(fd_flags(l), Ok(libc::FD_CLOEXEC));
        let client = socket(libc::AF_UNIX, libc::SOCK_STREAM, 0).unwrap();
        assert_eq!(connect(client, &a, len), Err(libc::ENOENT));
        assert_eq!(bind(l, &a, len), Ok(()));
        assert_eq!(connect(client, &a, len), Err(libc::ECONNREFUSED));
        let client = socket(libc::AF_UNIX, libc::SOCK_STREAM, 0).unwrap();
        assert_eq!(listen(l, 4), Ok(()));
        assert_eq!(accept4(l, libc::SOCK_CLOEXEC), Err(libc::EAGAIN));
        assert_eq!(connect(client, &a, len), Ok(()));
        let mut fds = [libc::pollfd {
            fd: l,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(poll(&mut fds, 1000), Ok(1));
        let c = accept4(l, libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK).unwrap();
        let name = getsockname(c).unwrap();
        assert_eq!(name.sun_family, libc::AF_UNIX as libc::sa_family_t);
        assert_eq!(name.sun_path[..path.len()], a.sun_path[..path.len()]);
        assert_eq!(peer_cred(c).map(|p| p.uid), Ok(geteuid()));
        assert_eq!(peer_cred(c).map(|p| p.pid), Ok(getpid()));
        let mut buf = [0u8; 8];
        assert_eq!(recv(c, &mut buf, libc::MSG_DONTWAIT), Err(libc::EAGAIN));
        assert_eq!(send(client, b"ping", 0), Ok(4));
        assert_eq!(recv(c, &mut buf, libc::MSG_DONTWAIT), Ok(4));
        assert_eq!(&buf[..4], b"ping");
        close(client);
        assert_eq!(send(c, b"x", libc::MSG_NOSIGNAL), Err(libc::EPIPE));
        let mut idle = [libc::pollfd {
            fd: l,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(poll(&mut idle, 10), Ok(0));

        // Pipes, duplicates, eventfd, limits.
        let [r, w] = pipe2(libc::O_CLOEXEC | libc::O_NONBLOCK).unwrap();
        assert_eq!(write(w, b"z"), Ok(1));
        assert_eq!(pread(r, &mut buf, 0), Err(libc::ESPIPE));
        let high = dup_from(r, 600).unwrap();
        assert!(high >= 600);
        assert_eq!(dup3(r, high, libc::O_CLOEXEC), Ok(high));
        assert_eq!(read(high, &mut buf), Ok(1));
        let e = eventfd(libc::EFD_CLOEXEC | libc::EFD_NONBLOCK).unwrap();
        let mut r0 = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes `r0`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r0) }, 0);
        assert_eq!(soft_limit(libc::RLIMIT_NOFILE), Some(r0.rlim_cur));
        // SAFETY: a getter without pointers.
        let thp = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(thp_disabled(), thp == 1);
        for fd in [l, c, r, w, high, e, d] {
            close(fd);
        }
        assert_eq!(unlink(&path_c), Ok(()));
        assert_eq!(unlink(&path_c), Err(libc::ENOENT));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
