//! The fork fence: keeps `fork()` from copying the process while the
//! shim's code is inside a short section that a fork must not split.
//!
//! Two users: a descriptor the shim's thread has created in the
//! application's table but not yet recorded (`fd.rs`: the fork child handler
//! closes only what is recorded), and a CPython thread state being created
//! by the bridge's job thread (`python/job.rs`: `PyThreadState_New` holds
//! the runtime's thread-list lock without the GIL, and a fork inside it
//! leaves the lock held in the child).
//!
//! A two-flag handshake: a section announces itself in `CREATING` and backs
//! off if a fork is under way; the fork prepare handler announces the fork
//! in `FORKING` and waits (bounded) until no section is in progress.
//! Sequentially consistent atomics: at least one side sees the other.
//! Atomics only; the handlers are async-signal-safe.
//!
//! Only the shim's own threads enter sections. A fork by the process's only
//! thread (the kernel's count, taken by the prepare handler after it has
//! stopped the shim's thread) skips the handshake: no section is in
//! progress, and none can start before `fork()` copies the process. It then
//! writes nothing here, where the announcement and its withdrawal would
//! cost the parent a copy-on-write fault on this page in every fork
//! (bench/FINDINGS-startup.md, "The shell's share, by section").

use super::ResetTo;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

touched_at_start! {
    static FORKING: AtomicU32 = AtomicU32::new(0);
    static CREATING: AtomicU32 = AtomicU32::new(0);
    /// The fork under way was announced in `FORKING`, and the parent handler
    /// takes it back. Written only when it changes (as `LOCKED_FOR_FORK` in
    /// jemalloc.rs): only a thread that is truly alone writes `false`.
    static ANNOUNCED: AtomicBool = AtomicBool::new(false);
}

/// Longest a fork waits for a section in progress (a few syscalls). If one
/// does not finish in time the fork goes ahead: a stuck fork is worse.
const WAIT: Duration = Duration::from_millis(100);

/// A section: while it lives, no fork copies the process.
pub struct Section(());

impl Drop for Section {
    fn drop(&mut self) {
        CREATING.fetch_sub(1, SeqCst);
    }
}

/// Enters a section, or `None` while a fork is under way (the caller tries
/// again later).
pub fn enter() -> Option<Section> {
    CREATING.fetch_add(1, SeqCst);
    if FORKING.load(SeqCst) != 0 {
        CREATING.fetch_sub(1, SeqCst);
        return None;
    }
    Some(Section(()))
}

/// Fork prepare handler: announce the fork, wait for sections to end;
/// nothing if the forking thread is the process's only one (`alone`).
pub fn before_fork(alone: bool) {
    ANNOUNCED.reset_to(!alone);
    if alone {
        return;
    }
    FORKING.fetch_add(1, SeqCst);
    let step = Duration::from_micros(50);
    let mut waited = Duration::ZERO;
    while CREATING.load(SeqCst) != 0 && waited < WAIT {
        super::time::sleep(step);
        waited += step;
    }
}

/// Fork parent handler.
pub fn after_fork_parent() {
    if ANNOUNCED.load(Relaxed) {
        FORKING.fetch_sub(1, SeqCst);
    }
}

/// Fork child handler: the only thread here is the one that forked.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    FORKING.reset_to(0);
    CREATING.reset_to(0);
    ANNOUNCED.reset_to(false);
}
