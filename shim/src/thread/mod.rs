//! The shim's thread: when it may exist, what it does, and fork.
//!
//! The rule (docs/design.md, "Threads"): **a single-threaded process stays
//! single-threaded.** The shim's thread (idle purging and the control
//! socket) starts only when the process creates its own second thread,
//! which we notice in our exported `pthread_create`. It stops again once
//! the process has been alone for a while, and at once if the process forks
//! or enters a namespace while alone (so CPython's "multi-threaded fork"
//! warning and `unshare(CLONE_NEWUSER)` behave as without the shim).
//! `MEMSHIM_CONTROL=on` starts it in the constructor and keeps it;
//! `MEMSHIM_CONTROL=off` never starts it.
//!
//! * `state.rs`: the one owner of the thread's state;
//! * `run.rs`: the thread itself (its descriptor table, its loop, stopping);
//! * `fork.rs`: the fork handlers, and stopping for a fork or a namespace;
//! * `wake.rs`: how a handler wakes the thread;
//! * `cuda_idle.rs`: the idle VRAM return, one look per tick.
//! * `attached.rs`: the attached bridge's restart after a fork.
//! * `pressure.rs`: the memory cgroup's pressure, watched by the thread.
//!
//! Code here that runs on the application's threads (our `pthread_create`,
//! `unshare`, `setns`, the fork handlers) keeps `errno` and never acts on a
//! pending cancellation of that thread.

#[cfg(memshim_bridge)]
mod attached;
mod cuda_idle;
mod fork;
mod pressure;
mod run;
mod state;
mod wake;

use crate::options::{self, Control};
use crate::os::thread::NoCancel;
use crate::os::{self, KeepErrno};
use core::sync::atomic::Ordering::Relaxed;
use state::{LEADER_GONE, Phase, STATE};

/// May this process start the shim's thread at all?
#[unsafe(link_section = ".text.startup")]
fn eligible() -> bool {
    (STATE.interposed() || cfg!(memshim_bridge))
        && options::control() != Control::Off
        && STATE.pid() == os::getpid()
        && !LEADER_GONE.load(Relaxed)
}

/// Our `pthread_exit`, before glibc's.
pub fn before_pthread_exit() {
    if os::thread::gettid() != os::getpid() || STATE.pid() != os::getpid() {
        return; // not the main thread
    }
    let _e = KeepErrno::new();
    let _nc = NoCancel::new();
    LEADER_GONE.store(true, Relaxed);
    fork::stop_regardless();
}

/// Starts the shim's thread if it is not running. Called from our
/// `pthread_create` after the application's thread exists, and from the
/// constructor.
fn arm() {
    STATE.want();
    if !STATE.move_phase(Phase::Idle, Phase::Starting) {
        return; // running, or being started/stopped by someone who will look at `wanted`
    }
    // Reap the previous thread, which has left its loop (the phase was Idle).
    let old = STATE.take_handle();
    if old != 0 {
        os::thread::join(old);
    }
    // Before a second thread exists (jemalloc.rs, "Lazy initialisation").
    crate::jemalloc::ensure_init();
    match run::spawn() {
        Some(t) => STATE.set_handle(t),
        None => STATE.set_phase(Phase::Idle),
    }
}

/// Constructor; `interposed`: our `malloc` is the process's
/// (`os::interpose::detect`). (The attached bridge's is [`on_attach`].)
#[cfg(not(memshim_bridge))]
#[unsafe(link_section = ".text.startup")]
pub fn on_load(interposed: bool) {
    // jemalloc stays uninitialised until the first allocation or thread
    // (jemalloc.rs, "Lazy initialisation and fork"); if that comes after
    // the handlers below are registered, they run its fork functions.
    options::load();
    options::warn_unknown();
    os::find_errno();
    STATE.on_load(os::getpid(), interposed);
    let _ = os::thread::real_pthread_create();
    // The spawner lives as long as the shim's thread: out of the automatic
    // arenas too (jemalloc::use_own_arena).
    os::spawner::on_start(|| {
        let _ = crate::jemalloc::use_own_arena();
    });
    if os::thread::atfork(fork::prepare, fork::parent, fork::child) {
        crate::jemalloc::shim_fork_handlers_registered();
    }
    // Except with options in jemalloc's own syntax: only jemalloc checks
    // them, when it initialises, and a bad one gets its warning line in
    // every process, as before, even one that never allocates. After the
    // handlers, so that jemalloc's fork functions run inside them, as they
    // do when it initialises later.
    if options::raw_jemalloc_conf() {
        crate::jemalloc::ensure_init();
    }
    // A library constructor that created a thread before ours ran went
    // through our pthread_create and was recorded as pending.
    let already_threaded = STATE.ctor_finished();
    if options::verbose() {
        crate::report::print_verbose(interposed);
    }
    let start = match options::control() {
        Control::On => true,
        Control::Auto => already_threaded,
        Control::Off => false,
    };
    if start && eligible() {
        arm();
    }
}

/// Constructor of the attached bridge (bridge/mod.rs), run by the `dlopen`
/// `memshim-ctl attach` made on a thread of the running process: the
/// thread starts at once (`options::control` is `on` in the bridge). No
/// line is written to the process's stderr, the verbose report included.
#[cfg(memshim_bridge)]
pub fn on_attach() {
    options::load();
    os::find_errno();
    STATE.on_load(os::getpid(), false);
    let _ = os::thread::real_pthread_create();
    let _ = os::thread::atfork(fork::prepare, fork::parent, fork::child);
    crate::python::at_fork::on_after_in_parent(
        attached::after_os_fork_in_parent,
        attached::restart_owed,
    );
    let _ = STATE.ctor_finished();
    if eligible() {
        arm();
    }
}

/// The attached bridge, after a fork that stopped its threads: start them
/// again (attached.rs says when). On the forking thread.
#[cfg(memshim_bridge)]
pub fn restart_after_fork() {
    let _e = KeepErrno::new();
    let _nc = NoCancel::new();
    if eligible() {
        arm();
    }
}

/// Destructor (the process is exiting).
#[unsafe(link_section = ".text.startup")]
pub fn on_unload() {
    crate::control::at_exit();
}

/// Our `pthread_create`, before glibc's creates the application's thread:
/// a shim thread that has just started must first leave the arenas the new
/// thread chooses from (`run::wait_until_settled`).
pub fn before_app_thread_create() {
    let _e = KeepErrno::new();
    run::wait_until_settled();
}

/// Our `pthread_create`, after glibc's has created the application's thread.
pub fn after_app_thread_created() {
    let _e = KeepErrno::new();
    let _nc = NoCancel::new();
    if !STATE.ctor_done_or_pend() {
        return;
    }
    if eligible() {
        arm();
    }
    // CPython appeared after the shim's thread left the application's
    // descriptor table: this thread of the application's can start the
    // spawner the Python bridge needs (os/spawner.rs).
    if os::spawner::wanted() && STATE.phase() == Phase::Running {
        os::spawner::start();
    }
}

/// Our `dlopen`, before glibc's, while a spawner is allowed and none runs
/// (os/spawner.rs): a library that looks like CPython (libpython, or an
/// extension module) may bring an interpreter the Python bridge must
/// reach through a spawner, which only a thread of the application's can
/// start.
pub fn before_dlopen(file: &[u8]) {
    if STATE.phase() != Phase::Running || !file.windows(6).any(|w| w == b"python") {
        return;
    }
    let _e = KeepErrno::new();
    let _nc = NoCancel::new();
    os::spawner::start();
}

/// Our `unshare`, before the system call.
pub fn before_unshare(flags: i32) {
    let single = libc::CLONE_NEWUSER | libc::CLONE_VM | libc::CLONE_SIGHAND | libc::CLONE_THREAD;
    if flags & single != 0 {
        fork::stop_if_alone_for_namespace();
    }
}

/// Our `setns`, before the system call: entering a user, mount or time
/// namespace (or an unknown kind, 0) needs a single-threaded caller (a
/// mount namespace: a filesystem context no other thread shares).
pub fn before_setns(nstype: i32) {
    let single = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWTIME;
    if nstype == 0 || nstype & single != 0 {
        fork::stop_if_alone_for_namespace();
    }
}

/// Longest time our `pthread_create` retries, after stopping the shim's
/// threads, a creation that failed for want of a slot: the kernel frees
/// the slot of a joined thread a moment after the join returns (later on a
/// loaded machine).
const ROOM_WAIT_MS: u64 = 200;

/// Our `pthread_create`, when glibc's failed with EAGAIN. The process may
/// be at its limit of threads (`RLIMIT_NPROC`, a pids cgroup's
/// `pids.max`), where the shim's threads hold slots the program counted
/// on: they stop, and `create` is tried again until it gets a slot or
/// [`ROOM_WAIT_MS`] have passed. They start again with the program's next
/// thread, where there is room (a start that finds none gives up
/// silently). Returns `create`'s last result.
pub fn retry_with_room(mut create: impl FnMut() -> i32) -> i32 {
    if !ours_run_here() {
        return libc::EAGAIN;
    }
    // The waits sleep (`nanosleep` is a cancellation point), and
    // `pthread_create` is not one.
    let _e = KeepErrno::new();
    let _nc = NoCancel::new();
    if !fork::stop_regardless() {
        return libc::EAGAIN;
    }
    let mut rc = create();
    os::time::wait_while(ROOM_WAIT_MS, core::time::Duration::from_millis(1), || {
        rc == libc::EAGAIN && {
            rc = create();
            rc == libc::EAGAIN
        }
    });
    rc
}

/// Our set*id functions (`setuid`, `setresgid`, `setgroups`, …), around
/// glibc's. glibc gives every thread of the process the new ids (its
/// "setxid" signal) and aborts the process when a thread's change fails
/// where the caller's succeeded. Capabilities belong to a thread: a program
/// that keeps them across `setresuid` and raises them again with `capset`
/// (`setpriv --reuid --regid` does) has them on the calling thread only,
/// so a shim's thread created before would fail the `setresgid` that
/// follows, and the process would abort. The shim's threads stop for the
/// call and start again after it, created by the caller, with its
/// credentials. Only then: where the caller's capabilities are the shim
/// thread's (a plain `setuid` by root, `seteuid` toggles), every thread
/// takes the change, and the thread stays.
pub fn around_setxid(call: impl FnOnce() -> libc::c_int) -> libc::c_int {
    if !ours_run_here() {
        return call();
    }
    let stopped = {
        let _e = KeepErrno::new();
        let _nc = NoCancel::new();
        let same = STATE
            .wake()
            .is_some_and(|(tid, _)| os::thread::same_capabilities(tid));
        !same && fork::stop_regardless()
    };
    let rc = call();
    if stopped && eligible() {
        let _e = KeepErrno::new();
        let _nc = NoCancel::new();
        arm();
    }
    rc
}

/// Whether the shim's threads run (or start) in this process: not in a
/// `vfork` child, which shares the parent's memory and must leave it alone.
fn ours_run_here() -> bool {
    matches!(STATE.phase(), Phase::Running | Phase::Starting) && STATE.pid() == os::getpid()
}
