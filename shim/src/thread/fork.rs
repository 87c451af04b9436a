//! Fork handlers, and stopping the shim's thread when the application,
//! alone but for it, forks or enters a namespace.
//!
//! Before `fork`: if the process is alone but for the shim's threads, the
//! prepare handler asks the thread to stop, wakes it and waits (bounded,
//! 200 ms) until it has exited and been joined. A thread that is still
//! starting (a process that creates, joins and forks back to back, like
//! CPython's `t.start(); t.join(); os.fork()`) is first waited for,
//! bounded too, until it reaches its loop; so is (5 ms at most) an
//! application thread the kernel still lists after it was joined. The parent is then
//! single-threaded when `fork()` copies it and when CPython counts threads
//! after `fork()` returns. If the thread cannot stop in time (it waits for
//! a lock the forking thread holds, such as the GIL), the fork goes ahead
//! with the thread alive rather than risk a deadlock. jemalloc's fork
//! functions run inside these handlers (jemalloc.rs, "Lazy initialisation
//! and fork"): its prepare after ours, so jemalloc is unlocked while we
//! wait, and its parent and child handlers before ours; a fork by the
//! process's only thread (counted after the stop) runs none of them, and
//! skips the fork fence (os/fence.rs).
//!
//! `unshare(CLONE_NEWUSER)` and `setns` into a user or mount namespace need
//! a single-threaded caller; our exported `unshare`/`setns` stop the thread
//! the same way first, and then wait (bounded) for a job of the Python
//! bridge to finish, whose thread counts as the shim's. A fork does not
//! wait for that job: a Python program forks holding the GIL, which the job
//! needs, so the fork goes ahead with the job thread alive (it is not in
//! the child) and CPython's "multi-threaded" warning is then true.
//!
//! In the child only the forking thread exists. The child handler does
//! async-signal-safe work only (reset atomics, record the new pid, close
//! inherited descriptors that are still ours, application's table only);
//! the first arena's large-free threshold stays as the parent left it
//! (jemalloc.rs, "Large frees in the first arena"). It
//! never starts a thread; the child starts its own by the same rule, at its
//! own first `pthread_create`. `vfork`/`posix_spawn` children run no fork
//! handlers, and every start checks `getpid()` against the recorded pid, so
//! they never start anything.
//!
//! All of this runs on the application's thread, with its cancellation
//! disabled: `nanosleep`, `pthread_join` and `open` are cancellation points,
//! and a pending cancel acting in a fork handler would unwind the thread
//! out of `fork()`, which is not one.

use super::state::{Phase, STATE, Stop};
use super::{run, wake};
use crate::options::{self, Control};
use crate::os::thread::NoCancel;
use crate::os::{self, KeepErrno};
use std::time::Duration;

/// Longest wait for a starting thread to reach its loop.
const START_WAIT_MS: u64 = 200;
/// Longest wait for the thread to stop before a fork goes ahead.
const STOP_WAIT_MS: u64 = 200;
/// Longest wait, after the join, for the kernel to stop counting it.
const GONE_WAIT_MS: u64 = 50;
/// Longest wait, for a namespace change, for the Python bridge's job
/// thread to finish a job and exit: the caller of `unshare`/`setns` in a
/// Python program has released the GIL (`os.unshare`, `os.setns`), so the
/// job can finish. A fork does not wait for it: `os.fork()` holds the GIL,
/// which the job needs.
const JOB_WAIT_MS: u64 = 5000;
/// How many threads beyond the shim's and the forking one may be a thread
/// on its way out (joined a moment ago), waited for before a fork.
const JOINED_SLACK: u64 = 2;
/// Longest wait for them: what a fork by a process with one or two live
/// threads of its own costs in addition.
const JOINED_WAIT_MS: u64 = 5;

/// Fork prepare handler.
pub(super) extern "C" fn prepare() {
    let _e = KeepErrno::new();
    let _nc = NoCancel::new();
    // First, while nothing of jemalloc's is locked (it frees a little).
    crate::python::before_fork();
    let _stopped = stop_if_alone_but_for_us();
    #[cfg(memshim_bridge)]
    super::attached::prepared(_stopped);
    // The kernel's count, after the stop above: the only thread needs no
    // fence and none of jemalloc's locks. Unknown counts as not alone.
    let alone = os::proc::thread_count() == Some(1);
    // After the stop above: a thread that is stopping must still be able to
    // close its descriptors.
    os::fd::before_fork(alone);
    // No sampled backtrace may be under way at the fork (os/unwind.c).
    if crate::options::profile() {
        os::unwind::fork_prepare();
    }
    // Last, where glibc ran jemalloc's own prepare when it registered first.
    crate::jemalloc::prefork(alone);
}

/// Fork parent handler.
pub(super) extern "C" fn parent() {
    let _e = KeepErrno::new();
    crate::jemalloc::postfork_parent();
    os::fd::after_fork_parent();
    if crate::options::profile() {
        os::unwind::fork_done(false);
    }
    // The attached bridge cannot wait for the process's next thread.
    #[cfg(memshim_bridge)]
    if super::attached::restart_in_parent_handler() {
        super::restart_after_fork();
    }
}

/// Fork child handler: the shim's threads do not exist here.
/// Async-signal-safe (module docs).
#[unsafe(link_section = ".text.startup")]
pub(super) extern "C" fn child() {
    let _e = KeepErrno::in_fork_child();
    // The forking thread is the child's main thread.
    super::state::LEADER_GONE.store(false, core::sync::atomic::Ordering::Relaxed);
    crate::jemalloc::postfork_child();
    crate::jemalloc::big_blocks_after_fork_child();
    if crate::options::profile() {
        os::unwind::fork_done(true);
    }
    os::fd::after_fork_child();
    os::spawner::after_fork_child();
    STATE.after_fork_child(os::getpid());
    super::run::forget_pending_start();
    crate::control::after_fork_child();
    super::pressure::after_fork_child();
    crate::python::after_fork_child();
    super::cuda_idle::after_fork_child();
    crate::profile::after_fork_child();
    #[cfg(memshim_bridge)]
    super::attached::after_fork_child();
}

/// For a fork: if the process is alone but for the shim's threads
/// (`MEMSHIM_CONTROL=auto`), stops them and waits (bounded) until they are
/// gone. A job thread of the Python bridge counts as the shim's, but is not
/// waited for ([`JOB_WAIT_MS`]).
pub(super) fn stop_if_alone_but_for_us() -> bool {
    stop_if_alone(false)
}

/// For `unshare`/`setns`: as [`stop_if_alone_but_for_us`], and then waits
/// (bounded) for a job thread of the Python bridge to finish and exit.
pub(super) fn stop_if_alone_for_namespace() {
    stop_if_alone(true);
}

/// Returns whether the threads stopped.
fn stop_if_alone(wait_for_job: bool) -> bool {
    // The attached bridge (always `on`) stops too, and starts again after
    // the fork itself (attached.rs).
    if (options::control() != Control::Auto && !cfg!(memshim_bridge))
        || !matches!(STATE.phase(), Phase::Running | Phase::Starting)
    {
        return false;
    }
    let _e = KeepErrno::new();
    let _nc = NoCancel::new();
    // At most: the spawner counts from the moment the shim's thread starts
    // creating it (os/spawner.rs), a moment before the kernel lists it.
    let alone = 1 + run::our_threads();
    match os::proc::thread_count() {
        // No /proc (a chroot or a mount namespace without it): a fork goes
        // ahead beside the thread, but a namespace change, which fails in
        // any process of more than one thread, stops ours first: it then
        // works wherever the program's own threads allow it.
        None if wait_for_job => {}
        None => return false,
        Some(n) if n <= alone => {}
        // One or two more: a thread the application has just joined may
        // still be on its way out. CPython's `join()` returns when the
        // thread's Python state is gone, before its C exit path (thread-
        // local destructors, jemalloc's cache flush) has run, and the
        // kernel lists a thread until it is released. Give them
        // JOINED_WAIT_MS to go; a thread that stays is a live one.
        Some(n) if n <= alone + JOINED_SLACK => {
            if !os::time::wait_while(JOINED_WAIT_MS, Duration::from_micros(100), || {
                os::proc::thread_count().is_none_or(|n| n > alone)
            }) {
                return false;
            }
        }
        Some(_) => return false,
    }
    let limit = if wait_for_job {
        JOB_WAIT_MS
    } else {
        STOP_WAIT_MS
    };
    let stopped = stop_once_started(true, limit);
    if stopped && wait_for_job && crate::python::worker_exists() {
        os::time::wait_while(JOB_WAIT_MS, Duration::from_micros(200), || {
            !crate::python::reap_worker()
        });
        os::time::wait_while(GONE_WAIT_MS, Duration::from_micros(50), || {
            os::proc::thread_count().is_some_and(|n| n > 1)
        });
    }
    stopped
}

/// Stops the shim's threads (bounded, as for a fork) whatever the mode and
/// however many threads the application has: for a main thread ending with
/// `pthread_exit` (they stay stopped: [`super::state::LEADER_GONE`]), a set*id
/// call or a thread limit (they may start again). Returns whether they
/// stopped ([`stop_now`] gives up on a busy thread).
pub(super) fn stop_regardless() -> bool {
    matches!(STATE.phase(), Phase::Running | Phase::Starting)
        && stop_once_started(false, STOP_WAIT_MS)
}

/// Waits (bounded) for a starting thread to reach its loop, then
/// [`stop_now`]s it if it runs, waiting at most `limit_ms` for it.
fn stop_once_started(alone: bool, limit_ms: u64) -> bool {
    os::time::wait_while(START_WAIT_MS, Duration::from_micros(100), || {
        STATE.phase() == Phase::Starting
    });
    STATE.phase() == Phase::Running && stop_now(alone, limit_ms)
}

/// Asks the thread to stop (with `alone`, the caller being the
/// application's only thread: if that is still so; else whatever the
/// application's threads), wakes it, waits until it has exited and been
/// joined and (with `alone`) the kernel no longer counts it, or gives up
/// after `limit_ms` (the last step after [`GONE_WAIT_MS`]): [`STOP_WAIT_MS`],
/// or for a namespace change [`JOB_WAIT_MS`], long enough for a Python job
/// the thread waits for to finish. Returns whether it stopped.
fn stop_now(alone: bool, limit_ms: u64) -> bool {
    STATE.ask_stop(if alone { Stop::IfAlone } else { Stop::Always });
    // A request that waits for a Python job gives up at once.
    crate::python::interrupt(true);
    wake::wake();
    let stopped = os::time::wait_while(limit_ms, Duration::from_micros(200), || {
        STATE.phase() != Phase::Idle
    });
    crate::python::interrupt(false);
    if !stopped {
        // Busy (for example waiting for a lock the forking thread holds):
        // go ahead with the thread still there rather than risk a deadlock.
        STATE.ask_stop(Stop::No);
        return false;
    }
    // A thread that went Idle by itself (an idle spell) left the request
    // untaken: the next thread must not take it for its own.
    STATE.ask_stop(Stop::No);
    let t = STATE.take_handle();
    if t != 0 {
        os::thread::join(t);
    }
    // The join returns once the thread has cleared its id, a moment before
    // the kernel takes it off the process's thread list; until then
    // `unshare(CLONE_NEWUSER)` fails with EINVAL and CPython counts two
    // threads at fork.
    if alone {
        os::time::wait_while(GONE_WAIT_MS, Duration::from_micros(50), || {
            os::proc::thread_count().is_some_and(|n| n > 1)
        });
    }
    true
}
