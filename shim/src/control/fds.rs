//! Descriptors the endpoint owns, kept in statics with their identity.
//!
//! An application may close every descriptor it did not open
//! (`close_range(3, ~0)`, `closefrom`, python-daemon) and then get the same
//! numbers back for its own files (hazard 26). So every descriptor we own is
//! recorded with its (device, inode) identity, and is used, closed, or
//! handed to `epoll` only while `fstat` still shows that identity. On a
//! mismatch we forget the number and never close it.
//!
//! (Sockets have unique inode numbers in sockfs, so the identity is sharp.
//! That is also why the endpoint uses plain `poll` and no epoll or eventfd
//! instance: those share one anonymous inode, and a reused number would
//! pass the check.)
//!
//! The records are statics (atomics only) so the fork child handler and the
//! library destructor can reach them without the endpoint object, which
//! lives on the shim thread's stack.

use crate::supervisor::fd_identity;
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};

/// Most client connections held at once; an extra one evicts the oldest.
pub const MAX_CONNS: usize = 16;

/// One owned descriptor and its identity.
pub struct Slot {
    fd: AtomicI32,
    id: AtomicU64,
}

impl Slot {
    /// An empty slot.
    pub const fn new() -> Slot {
        Slot {
            fd: AtomicI32::new(-1),
            id: AtomicU64::new(0),
        }
    }

    /// Records `fd` (just created by us) and its identity.
    pub fn set(&self, fd: i32) {
        self.id.store(fd_identity(fd), Release);
        self.fd.store(fd, Release);
    }

    /// The descriptor, if it is still the one we recorded.
    pub fn get(&self) -> Option<i32> {
        let fd = self.fd.load(Acquire);
        (fd >= 0 && fd_identity(fd) == self.id.load(Acquire)).then_some(fd)
    }

    /// Whether a number is recorded at all (ours or not any more).
    pub fn is_set(&self) -> bool {
        self.fd.load(Acquire) >= 0
    }

    /// Forgets the number without closing it.
    pub fn forget(&self) {
        self.fd.store(-1, Release);
    }

    /// Closes the descriptor if it is still ours, else forgets it.
    /// Async-signal-safe (fstat, close).
    pub fn close(&self) {
        let ours = self.get();
        self.fd.store(-1, Release);
        if let Some(fd) = ours {
            // SAFETY: the descriptor is still the one we created.
            unsafe { libc::close(fd) };
        }
    }
}

/// The listening socket.
pub static LISTENER: Slot = Slot::new();
/// Client connections, indexed like `Endpoint::conns`.
pub static CONNS: [Slot; MAX_CONNS] = [const { Slot::new() }; MAX_CONNS];

/// Closes every descriptor of ours that is still ours. Async-signal-safe.
pub fn close_all() {
    for c in &CONNS {
        c.close();
    }
    LISTENER.close();
}

/// Moves a fresh descriptor to a high number (>= 512) with close-on-exec,
/// away from the low numbers applications hand-pick and reuse. Keeps the
/// original number if that fails (low `RLIMIT_NOFILE`).
pub fn move_high(fd: i32) -> i32 {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we just created.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 512) };
    if high < 0 {
        return fd;
    }
    // The application may have closed the original number (close_range
    // from another thread) and got it back for a file of its own: close it
    // only if it is still the same socket as the copy.
    if fd_identity(fd) == fd_identity(high) {
        // SAFETY: closing the original number of our own new descriptor.
        unsafe { libc::close(fd) };
    }
    high
}
