//! The raw system calls of the injector: ptrace, waitpid and the signal
//! mask. The only `unsafe` of this crate; everything above it is safe code.
//! Memory of the target is read and written through `/proc/PID/mem`
//! (std's files), which a tracer may do.

// Without the injector (inject_other.rs) only the checks' calls are used.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

#[cfg(target_arch = "x86_64")]
/// A thread's general registers (x86_64 `user_regs_struct`).
pub type Regs = libc::user_regs_struct;

#[cfg(target_arch = "x86_64")]
/// `NT_X86_XSTATE`: the FPU, SSE and AVX state, as `XSAVE` lays it out.
const NT_X86_XSTATE: libc::c_int = 0x202;

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `PTRACE_SEIZE`: traces `tid` without stopping it.
pub fn seize(tid: i32) -> io::Result<()> {
    // SAFETY: PTRACE_SEIZE takes no pointer; addr and data are integers.
    check(unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) }).map(drop)
}

/// `PTRACE_INTERRUPT`: stops a seized thread (a `PTRACE_EVENT_STOP`).
pub fn interrupt(tid: i32) -> io::Result<()> {
    // SAFETY: no pointer argument.
    check(unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) }).map(drop)
}

/// `PTRACE_CONT` with `sig` (0: none) delivered.
pub fn cont(tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: the signal number is passed as an integer, no pointer.
    check(unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0usize, sig as usize) }).map(drop)
}

/// `PTRACE_DETACH` with `sig` (0: none) delivered.
pub fn detach(tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: the signal number is passed as an integer, no pointer.
    check(unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize) }).map(drop)
}

#[cfg(target_arch = "x86_64")]
/// `PTRACE_GETREGS`.
pub fn get_regs(tid: i32) -> io::Result<Regs> {
    // SAFETY: an all-zero user_regs_struct is valid (integers only).
    let mut regs: Regs = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one user_regs_struct to the pointer, which
    // points at ours.
    check(unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &raw mut regs) })?;
    Ok(regs)
}

#[cfg(target_arch = "x86_64")]
/// `PTRACE_SETREGS`.
pub fn set_regs(tid: i32, regs: &Regs) -> io::Result<()> {
    // SAFETY: the kernel reads one user_regs_struct from the pointer.
    check(unsafe { libc::ptrace(libc::PTRACE_SETREGS, tid, 0usize, regs as *const Regs) }).map(drop)
}

#[cfg(target_arch = "x86_64")]
/// The extended state (`PTRACE_GETREGSET`, `NT_X86_XSTATE`), as many bytes
/// as the kernel gives.
pub fn get_xstate(tid: i32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the kernel writes at most iov_len bytes to iov_base, our
    // buffer, and sets iov_len to the number written.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            NT_X86_XSTATE as usize,
            &raw mut iov,
        )
    })?;
    buf.truncate(iov.iov_len);
    Ok(buf)
}

#[cfg(target_arch = "x86_64")]
/// Puts back what [`get_xstate`] read.
pub fn set_xstate(tid: i32, state: &[u8]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: state.as_ptr().cast_mut().cast(),
        iov_len: state.len(),
    };
    // SAFETY: PTRACE_SETREGSET only reads iov_len bytes from iov_base.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_SETREGSET,
            tid,
            NT_X86_XSTATE as usize,
            &raw mut iov,
        )
    })
    .map(drop)
}

/// The address of the fault a thread stopped by `SIGSEGV` took, where it
/// is a missing mapping (`SEGV_MAPERR`; `PTRACE_GETSIGINFO`).
pub fn fault_address(tid: i32) -> io::Result<u64> {
    // SAFETY: siginfo_t is plain data; the kernel fills it.
    let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one siginfo_t to the pointer, ours.
    check(unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0usize, &raw mut si) })?;
    // SEGV_MAPERR (1): no mapping at the address.
    if si.si_code != 1 {
        return Err(io::Error::other("not a missing mapping"));
    }
    // SAFETY: si_addr is valid for a SIGSEGV's siginfo.
    Ok(unsafe { si.si_addr() } as u64)
}

/// `waitpid(tid, __WALL | flags)`: `Some(status)`, or `None` with
/// `WNOHANG` when nothing changed.
pub fn wait(tid: i32, nohang: bool) -> io::Result<Option<i32>> {
    let mut status = 0;
    let flags = libc::__WALL | if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: waitpid writes one int to the pointer, ours.
        let r = unsafe { libc::waitpid(tid, &raw mut status, flags) };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(if r == 0 { None } else { Some(status) });
    }
}

/// A set of signals blocked on this thread while alive; the mask from
/// before is restored when dropped.
struct Blocked {
    set: libc::sigset_t,
    old: libc::sigset_t,
}

impl Blocked {
    fn new(signals: impl IntoIterator<Item = i32>) -> Blocked {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it, and
        // the calls only fill our sets and change this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            for s in signals {
                libc::sigaddset(&raw mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, &raw mut old);
            Blocked { set, old }
        }
    }

    fn restore(&self) {
        // SAFETY: the mask saved by `new`, a valid sigset.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &raw const self.old, std::ptr::null_mut());
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Blocks the signals that would end memshim-ctl (SIGINT, SIGTERM,
/// SIGHUP, SIGQUIT, SIGPIPE) while the target is changed, and unblocks them
/// when dropped: a tracer that dies mid-call leaves the target with our
/// registers, and it crashes.
pub struct HoldSignals {
    _blocked: Blocked,
}

impl HoldSignals {
    /// Blocks them.
    pub fn new() -> HoldSignals {
        HoldSignals {
            _blocked: Blocked::new(ENDING.into_iter().chain([libc::SIGPIPE])),
        }
    }
}

/// Whether the filesystem `f` lies on is mounted `noexec` (`fstatvfs`):
/// a library there cannot be loaded (its code is not mapped executable).
pub fn mounted_noexec(f: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: statvfs is plain data; the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to our statvfs.
    let r = unsafe { libc::fstatvfs(f.as_raw_fd(), &raw mut st) };
    r == 0 && st.f_flag & libc::ST_NOEXEC != 0
}

/// Whether this process has `cap` in its effective set (`capget`-free:
/// read from /proc/self/status).
pub fn has_cap(cap: u32) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|m| m & (1u64 << cap) != 0)
}

/// Our effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// `tgkill(pid, tid, sig)`: gives a signal back to the thread it was
/// meant for.
pub fn tgkill(pid: i32, tid: i32, sig: i32) {
    // SAFETY: tgkill takes integers only.
    unsafe {
        libc::syscall(libc::SYS_tgkill, pid, tid, sig);
    }
}

/// The signals that end memshim-ctl by default: Ctrl-C, `timeout`, a
/// closed terminal, Ctrl-\.
const ENDING: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The first of [`ENDING`] that is pending: blocked ([`HoldSignals`],
/// [`Interruptible`]) and sent.
pub fn ending_signal_pending() -> Option<i32> {
    // SAFETY: sigset_t is plain data; sigpending fills it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to our sigset.
    if unsafe { libc::sigpending(&raw mut set) } != 0 {
        return None;
    }
    ENDING
        .into_iter()
        // SAFETY: a valid, filled sigset.
        .find(|&s| unsafe { libc::sigismember(&raw const set, s) } == 1)
}

/// [`ENDING`], those whose disposition is still the default:
/// an ignored one (`nohup`, a background job) is left ignored.
fn ending_signals() -> impl Iterator<Item = i32> {
    ENDING.into_iter().filter(|&s| {
        // SAFETY: sigaction is plain data; the call only fills it.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(s, std::ptr::null(), &raw mut old) == 0
                && old.sa_sigaction == libc::SIG_DFL
        }
    })
}

/// While alive, the signals that would end memshim-ctl wait for
/// [`Interruptible::sleep`] instead, so that it can undo what it started
/// in a process before it ends.
pub struct Interruptible {
    blocked: Blocked,
    /// [`SEARCH_GOES_ON`] before.
    was: bool,
}

/// Whether a search for a safe point goes on while one of the ending
/// signals is pending: while an [`Interruptible::hold`] lives, whose owner
/// takes the signal itself once the calls it makes are done (`profile
/// --python` first stops the tracing it started). Otherwise (the verbs'
/// [`HoldSignals`], [`Interruptible::hold_ending_searches`]) the search
/// ends at once: nothing is held or changed yet.
static SEARCH_GOES_ON: AtomicBool = AtomicBool::new(false);

/// Whether a search for a safe point ends when an ending signal is pending
/// ([`SEARCH_GOES_ON`]).
pub fn search_ends_on_signal() -> bool {
    !SEARCH_GOES_ON.load(Ordering::Relaxed)
}

impl Interruptible {
    /// Blocks them; a search for a safe point goes on when one comes.
    pub fn hold() -> Interruptible {
        Interruptible::with_search(true)
    }

    /// Blocks them; a search for a safe point ends when one comes, with
    /// nothing held (`attach`, before its library has loaded).
    pub fn hold_ending_searches() -> Interruptible {
        Interruptible::with_search(false)
    }

    fn with_search(goes_on: bool) -> Interruptible {
        Interruptible {
            blocked: Blocked::new(ending_signals()),
            was: SEARCH_GOES_ON.swap(goes_on, Ordering::Relaxed),
        }
    }

    /// Sleeps `d`, or less if one of the signals comes: then that signal.
    pub fn sleep(&self, d: std::time::Duration) -> Option<i32> {
        let end = std::time::Instant::now() + d;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            let ts = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            // SAFETY: a valid set and timespec; no siginfo asked for.
            let s = unsafe {
                libc::sigtimedwait(
                    &raw const self.blocked.set,
                    std::ptr::null_mut(),
                    &raw const ts,
                )
            };
            if s > 0 {
                return Some(s);
            }
        }
    }

    /// One of the signals, if it has come (taken).
    pub fn pending(&self) -> Option<i32> {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid set and timespec; no siginfo asked for.
        let s = unsafe {
            libc::sigtimedwait(
                &raw const self.blocked.set,
                std::ptr::null_mut(),
                &raw const zero,
            )
        };
        (s > 0).then_some(s)
    }

    /// Unblocks the signals and ends memshim-ctl with `sig`, as it would
    /// have ended had it not waited for it (a shell then sees 128 + sig).
    pub fn end_with(self, sig: i32) -> ! {
        self.blocked.restore();
        // SAFETY: `raise` with the default disposition ends the process.
        unsafe { libc::raise(sig) };
        std::process::exit(128 + sig)
    }
}

impl Drop for Interruptible {
    fn drop(&mut self) {
        SEARCH_GOES_ON.store(self.was, Ordering::Relaxed);
    }
}
