//! Keeps `fork()` from copying a descriptor that the shim's thread has
//! created but not yet recorded.
//!
//! The fork child handler closes every descriptor the shim owns, but it can
//! only close what is recorded (`control::fds`, the supervisor's eventfd).
//! Between `socket()`/`accept4()`/`eventfd()` and the record there is a
//! window; a fork by another thread inside it left the child holding the
//! parent's listening socket (or a client connection) for its whole life.
//!
//! A two-flag handshake closes the window: the shim's thread announces
//! itself in `CREATING` and backs off if a fork is under way; the fork
//! prepare handler announces the fork in `FORKING` and waits (bounded) until
//! no creation is in progress. Both sides use sequentially consistent
//! atomics, so at least one of them sees the other. Atomics only; the
//! handlers are async-signal-safe.

use core::sync::atomic::{AtomicU32, Ordering::SeqCst};

static FORKING: AtomicU32 = AtomicU32::new(0);
static CREATING: AtomicU32 = AtomicU32::new(0);

/// Longest a fork waits for a creation in progress (a few syscalls).
const WAIT_NS: u64 = 100_000_000;

/// A creation section: while it lives, no fork copies the process.
pub struct Section(());

impl Drop for Section {
    fn drop(&mut self) {
        CREATING.fetch_sub(1, SeqCst);
    }
}

/// Enters a creation section, or `None` while a fork is under way (try
/// again later).
pub fn enter() -> Option<Section> {
    CREATING.fetch_add(1, SeqCst);
    if FORKING.load(SeqCst) != 0 {
        CREATING.fetch_sub(1, SeqCst);
        return None;
    }
    Some(Section(()))
}

/// Fork prepare handler: announce the fork, wait for creations to finish.
/// If one does not finish in time, fork anyway (a leaked descriptor is
/// better than a stuck fork).
pub fn before_fork() {
    FORKING.fetch_add(1, SeqCst);
    let mut waited = 0;
    while CREATING.load(SeqCst) != 0 && waited < WAIT_NS {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 50_000,
        };
        // SAFETY: sleeping on a local timespec.
        unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
        waited += 50_000;
    }
}

/// Fork parent handler.
pub fn after_fork_parent() {
    FORKING.fetch_sub(1, SeqCst);
}

/// Fork child handler: the only thread here is the one that forked.
pub fn after_fork_child() {
    FORKING.store(0, SeqCst);
    CREATING.store(0, SeqCst);
}
