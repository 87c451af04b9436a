//! A fork of the process the bridge is attached to.
//!
//! The bridge is not the process's `pthread_create`, so it cannot wait, as
//! the preload does, for the process's next thread to start again after a
//! fork. Yet a process alone but for the bridge must fork alone: CPython
//! 3.12+ counts the threads after `os.fork()` returns in the parent and
//! warns on stderr ("This process is multi-threaded, use of fork() may
//! lead to deadlocks in the child") where there are two. So:
//!
//! * the fork prepare handler stops the bridge's threads when the process
//!   is alone but for them, as the preload does (thread/fork.rs);
//! * the parent handler starts them again at once, unless the fork is
//!   CPython's `os.fork()` (or a `subprocess` with `preexec_fn`, which runs
//!   the same hooks): its `before` hook, registered here with
//!   `os.register_at_fork`, says so, and its `after_in_parent` hook starts
//!   them, after CPython has counted the threads;
//! * the child has no bridge (its thread is not copied; it was never
//!   attached).
//!
//! The hooks (python/at_fork.rs) are registered by the first Python job of
//! each interpreter (`attach` asks for `stats` at once, which runs one); a
//! fork before that gets the thread back from the parent handler, and the
//! warning.

use core::sync::atomic::{AtomicBool, Ordering::SeqCst};

/// The prepare handler stopped the bridge's threads for this fork.
static STOPPED: AtomicBool = AtomicBool::new(false);
/// CPython's `before` hook ran: the fork under way is `os.fork()`'s.
static IN_OS_FORK: AtomicBool = AtomicBool::new(false);

/// Prepare handler, after the stop: whether it stopped them.
pub fn prepared(stopped: bool) {
    STOPPED.store(stopped, SeqCst);
}

/// Parent handler: whether to start the threads again now (else the
/// `after_in_parent` hook will, or nothing was stopped).
pub fn restart_in_parent_handler() -> bool {
    !IN_OS_FORK.load(SeqCst) && STOPPED.swap(false, SeqCst)
}

/// Child handler: nothing of the parent's fork is the child's.
/// Async-signal-safe.
pub fn after_fork_child() {
    STOPPED.store(false, SeqCst);
    IN_OS_FORK.store(false, SeqCst);
}

/// CPython's `before` hook (python/at_fork.rs).
pub fn os_fork_begins() {
    IN_OS_FORK.store(true, SeqCst);
}

/// CPython's `after_in_parent` hook: starts the threads if the fork
/// stopped them.
pub fn os_fork_done_in_parent() {
    IN_OS_FORK.store(false, SeqCst);
    if STOPPED.swap(false, SeqCst) {
        crate::thread::restart_after_fork();
    }
}
