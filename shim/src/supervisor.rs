//! The shim's own thread, named `memshim`.
//!
//! It exists only while `lifecycle.rs` allows (see the rule there). Its loop:
//!
//! * every tick, `arena.4096.decay` (`jemalloc::decay_all`), so pages freed
//!   by a process that then goes idle are returned within the decay time;
//!   jemalloc alone only decays on allocator activity;
//! * serves the control socket (`control/`): its listener and client
//!   connections are polled here, `Endpoint::on_events` answers them;
//! * stops when the process has been alone (main thread + us) for the decay
//!   time plus a grace second, or at once when a fork handler asks;
//! * ends within a tick, in every mode, once every application thread has
//!   ended (main called `pthread_exit` and the others returned), so the
//!   process exits as it would without the shim.
//!
//! All signals are blocked on this thread (it is created with a full mask),
//! so the application's handlers never run here. It holds no lock of its own
//! that the allocation path takes; jemalloc's own locks are taken only
//! inside `mallctl`.

use crate::lifecycle::{self, HANDLE, STOP, ThreadState, WANTED};
use crate::options::{self, Control};
use crate::{control, jemalloc, sys};
use core::ffi::c_void;
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};

/// Stack of the shim's thread (the default 8 MiB is far more than needed).
const STACK_SIZE: usize = 256 * 1024;
/// Longest sleep between ticks.
const MAX_TICK_MS: i64 = 1000;
/// Shortest sleep between ticks.
const MIN_TICK_MS: i64 = 50;
/// How long a fork may wait for the thread to stop before going ahead.
const FORK_STOP_WAIT_MS: u64 = 200;

/// A pipe that fork handlers write to, to wake the thread. Its identity
/// (device, inode: every pipe has an inode of its own, unlike eventfds,
/// which all share one anonymous inode) is recorded, so a descriptor number
/// that the application closed (`close_range`) and reused is never read
/// from or written to.
static WAKE_R: AtomicI32 = AtomicI32::new(-1);
static WAKE_W: AtomicI32 = AtomicI32::new(-1);
static WAKE_ID: AtomicU64 = AtomicU64::new(0);

/// (st_dev, st_ino) of `fd` folded into one word, or 0 if not open.
/// `fstat` is async-signal-safe.
pub(crate) fn fd_identity(fd: i32) -> u64 {
    if fd < 0 {
        return 0;
    }
    // SAFETY: `st` is a valid out-pointer; fstat on any int is harmless.
    unsafe {
        let mut st: libc::stat = core::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return 0;
        }
        (st.st_dev as u64).rotate_left(32) ^ (st.st_ino as u64) | 1
    }
}

fn ours(slot: &AtomicI32) -> Option<i32> {
    let fd = slot.load(Acquire);
    (fd >= 0 && fd_identity(fd) == WAKE_ID.load(Acquire)).then_some(fd)
}

fn open_wake_pipe() {
    // No fork may copy the pipe before it is recorded; the loop retries.
    let Some(_fence) = crate::fork_fence::enter() else {
        return;
    };
    let mut fds = [-1i32; 2];
    // SAFETY: `fds` is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } == 0 {
        // Out of the low numbers (3 and 4 would otherwise be ours in most
        // processes, where programs expect their own first files), like the
        // control socket.
        let (r, w) = (
            crate::control::move_high(fds[0]),
            crate::control::move_high(fds[1]),
        );
        WAKE_ID.store(fd_identity(r), Release);
        WAKE_R.store(r, Release);
        WAKE_W.store(w, Release);
    }
}

fn close_wake_pipe() {
    for slot in [&WAKE_R, &WAKE_W] {
        if let Some(fd) = ours(slot) {
            // SAFETY: the descriptor is still the pipe end we opened.
            unsafe { libc::close(fd) };
        }
        // Closed under us by the application: forget the number, never close it.
        slot.store(-1, Release);
    }
}

fn wake() {
    if let Some(fd) = ours(&WAKE_W) {
        let one = 1u8;
        // SAFETY: writing one byte to our pipe.
        unsafe { libc::write(fd, (&raw const one).cast(), 1) };
    }
}

fn drain_wake_pipe() {
    if let Some(fd) = ours(&WAKE_R) {
        let mut buf = [0u8; 64];
        // SAFETY: reading into a local buffer from our nonblocking pipe.
        while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }
}

/// Creates the shim's thread with every signal blocked and a small stack.
/// Returns its handle.
pub(crate) fn spawn() -> Option<libc::pthread_t> {
    spawn_thread(thread_main, core::ptr::null_mut(), Some(STACK_SIZE))
}

/// Creates a thread of the shim's own (not the application's: it does not
/// go through our exported `pthread_create`) with every signal blocked, so
/// that the application's handlers never run on it and signals meant for
/// the program are never delivered to it. `stack`: its size, or the
/// system's default (what a thread of the program would get). The thread is
/// joinable; its handle is returned.
pub(crate) fn spawn_thread(
    entry: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
    stack: Option<usize>,
) -> Option<libc::pthread_t> {
    let create = lifecycle::real_pthread_create()?;
    // SAFETY: standard pthread attribute and signal-mask calls on locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return None;
        }
        if let Some(size) = stack {
            libc::pthread_attr_setstacksize(&mut attr, size);
        }
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut t: libc::pthread_t = 0;
        let rc = create(&mut t, &attr, entry, arg);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        (rc == 0).then_some(t)
    }
}

/// Tick length: a quarter of the dirty decay time, within [50 ms, 1 s].
fn tick_ms(dirty_decay_ms: i64) -> i64 {
    if dirty_decay_ms > 0 {
        (dirty_decay_ms / 4).clamp(MIN_TICK_MS, MAX_TICK_MS)
    } else {
        MAX_TICK_MS
    }
}

/// How long the process must be alone before the thread stops by itself:
/// long enough for pages freed just before to decay away.
fn alone_grace_ms(dirty_decay_ms: i64) -> u64 {
    (dirty_decay_ms.clamp(0, 30_000) as u64) + 1000
}

extern "C" fn thread_main(_: *mut c_void) -> *mut c_void {
    // SAFETY: naming the calling thread; the name is a static C string.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"memshim".as_ptr()) };
    let _ = jemalloc::disable_own_tcache();
    open_wake_pipe();
    lifecycle::set_thread_state(ThreadState::Running);
    let mut endpoint = control::Endpoint::open();
    let mut last_decay = sys::monotonic_ms();
    let mut alone_since: Option<u64> = None;
    loop {
        let dirty = jemalloc::decay_ms()
            .map(|d| d.0)
            .unwrap_or(options::dirty_decay_ms());
        let tick = tick_ms(dirty);
        // fds[0]: the wake pipe; then the endpoint's listener and connections.
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 1 + control::MAX_POLL_FDS];
        fds[0] = libc::pollfd {
            fd: ours(&WAKE_R).unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        };
        let n_ep = endpoint.as_ref().map_or(0, |e| e.poll_fds(&mut fds[1..]));
        // SAFETY: `fds` is a live array of at least 1 + n_ep pollfd;
        // negative fds are ignored.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), (1 + n_ep) as libc::nfds_t, tick as i32) };
        if n > 0 && fds[0].revents != 0 {
            drain_wake_pipe();
        }
        if ours(&WAKE_R).is_none() || ours(&WAKE_W).is_none() {
            // The application closed it (close_range): make a new one.
            close_wake_pipe();
            open_wake_pipe();
        }
        if STOP.swap(false, AcqRel) && try_stop(&mut endpoint) {
            return core::ptr::null_mut();
        }
        if let Some(e) = endpoint.as_mut() {
            if n > 0 {
                e.on_events(&fds[1..1 + n_ep]);
            }
            e.on_tick();
        }
        let now = sys::monotonic_ms();
        if dirty >= 0 && now.saturating_sub(last_decay) >= tick as u64 {
            let _ = jemalloc::decay_all();
            last_decay = now;
        }
        if only_we_remain() && try_stop(&mut endpoint) {
            // Every thread of the application has ended (its main thread
            // with pthread_exit). Without us the process would have exited;
            // returning lets glibc's last-thread exit(0) happen, in any
            // mode. Staying would keep it alive forever, and since we block
            // every signal, even SIGTERM would stay pending.
            return core::ptr::null_mut();
        }
        if options::control() == Control::Auto {
            if sys::num_threads().is_some_and(|n| n <= 2) {
                let since = *alone_since.get_or_insert(now);
                if now.saturating_sub(since) >= alone_grace_ms(dirty) && try_stop(&mut endpoint) {
                    return core::ptr::null_mut();
                }
            } else {
                alone_since = None;
            }
        }
    }
}

/// The only threads left are the exited main thread (a zombie until the
/// process ends) and us.
fn only_we_remain() -> bool {
    sys::num_threads().is_some_and(|n| n <= 2) && sys::leader_exited()
}

/// Leaves the loop unless the process created a thread meanwhile.
/// Returns true if the thread must exit now.
fn try_stop(endpoint: &mut Option<control::Endpoint>) -> bool {
    WANTED.store(false, Release);
    if !lifecycle::cas_thread_state(ThreadState::Running, ThreadState::Stopping) {
        return false;
    }
    if sys::num_threads().is_some_and(|n| n > 2) {
        lifecycle::set_thread_state(ThreadState::Running);
        return false;
    }
    if let Some(e) = endpoint.take() {
        e.close();
    }
    close_wake_pipe();
    lifecycle::set_thread_state(ThreadState::Idle);
    // A thread created while we were stopping wants us back.
    if WANTED.load(Acquire) && lifecycle::cas_thread_state(ThreadState::Idle, ThreadState::Running)
    {
        open_wake_pipe();
        *endpoint = control::Endpoint::open();
        return false;
    }
    true
}

/// Called from the fork prepare handler when the process is alone with the
/// shim's thread: ask it to stop and wait (bounded) until it has exited.
pub(crate) fn stop_for_fork() {
    STOP.store(true, Release);
    wake();
    let deadline = sys::monotonic_ms() + FORK_STOP_WAIT_MS;
    while lifecycle::thread_state() != ThreadState::Idle {
        if sys::monotonic_ms() >= deadline {
            // Busy (for example waiting for a lock the forking thread holds):
            // fork with the thread still there rather than risk a deadlock.
            STOP.store(false, Release);
            return;
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000,
        };
        // SAFETY: sleeping on a local timespec.
        unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
    }
    let t = HANDLE.swap(0, AcqRel);
    if t != 0 {
        // The thread has left its loop; wait for the kernel to reap it so
        // the parent is single-threaded when fork() copies it.
        // SAFETY: joinable thread we created; nobody else joins it.
        unsafe { libc::pthread_join(t as libc::pthread_t, core::ptr::null_mut()) };
    }
}

/// Fork child: the thread is not here; close the inherited wake pipe if it is
/// still ours. Async-signal-safe (fstat, close).
pub(crate) fn after_fork_child() {
    close_wake_pipe();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_follows_decay() {
        assert_eq!(tick_ms(1000), 250);
        assert_eq!(tick_ms(10), MIN_TICK_MS);
        assert_eq!(tick_ms(60_000), MAX_TICK_MS);
        assert_eq!(tick_ms(-1), MAX_TICK_MS);
        assert_eq!(tick_ms(0), MAX_TICK_MS);
        assert_eq!(alone_grace_ms(1000), 2000);
        assert_eq!(alone_grace_ms(-1), 1000);
    }
}
