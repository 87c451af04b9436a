//! A fork of a process the bridge is attached to (`cfg(memshim_bridge)`).
//!
//! The bridge is not the process's `pthread_create`, so it cannot wait, as
//! the preload does, for the process's next thread to start again after a
//! fork. Yet a process alone but for the bridge must fork alone: CPython
//! 3.12+ counts the threads after `os.fork()` returns in the parent and
//! warns on stderr ("This process is multi-threaded, use of fork() may
//! lead to deadlocks in the child") where there are two. So:
//!
//! * the fork prepare handler stops the bridge's threads when the process
//!   is alone but for them, as the preload does (fork.rs);
//! * the parent handler starts them again at once, unless the fork is
//!   CPython's `os.fork()` (or a `subprocess` with `preexec_fn`, which runs
//!   the same hooks): its `before` hook (python/at_fork.rs, registered with
//!   `os.register_at_fork`) says so, and its `after_in_parent` hook has
//!   [`after_os_fork_in_parent`] called after CPython has counted the
//!   threads (on 3.13 and 3.14 once `os.fork()` has returned: at_fork.rs);
//!   a restart owed stays owed until it is made;
//! * the child has no bridge (its thread is not copied; it was never
//!   attached): the copy it inherited says it does not serve there
//!   (bridge/mod.rs), so `attach` can load one that does.
//!
//! The hooks are registered by the first Python job of each interpreter
//! (`attach` asks for `stats` at once, which runs one); a fork before that
//! gets the thread back from the parent handler, and the warning.

use core::sync::atomic::{AtomicBool, Ordering::SeqCst};

/// The prepare handler stopped the bridge's threads for this fork.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Prepare handler, after the stop: whether it stopped them. A restart
/// still owed from an earlier fork (its pending call has not run yet)
/// stays owed: only the restart clears it.
pub(super) fn prepared(stopped: bool) {
    if stopped {
        STOPPED.store(true, SeqCst);
    }
}

/// Whether a fork stopped the threads and they have not started again.
pub(super) fn restart_owed() -> bool {
    STOPPED.load(SeqCst)
}

/// Parent handler: whether to start the threads again now (else the
/// `after_in_parent` hook will, or nothing was stopped).
pub(super) fn restart_in_parent_handler() -> bool {
    !crate::python::at_fork::in_os_fork() && STOPPED.swap(false, SeqCst)
}

/// Child handler: nothing of the parent's fork is the child's, nor its
/// bridge (bridge/mod.rs). Async-signal-safe.
pub(super) fn after_fork_child() {
    STOPPED.store(false, SeqCst);
    crate::bridge::forked();
    crate::python::at_fork::after_fork_child();
}

/// CPython's `after_in_parent` hook (registered with python/at_fork.rs by
/// `on_attach`): starts the threads if the fork stopped them.
pub(super) fn after_os_fork_in_parent() {
    if STOPPED.swap(false, SeqCst) {
        super::restart_after_fork();
    }
}
