//! The shim's thread sleeps in `poll` on its sockets and on this pipe; a
//! fork or namespace handler on the application's thread writes to the
//! pipe to wake it when it must stop at once.
//!
//! The handlers wake it only while the application is alone but for the
//! shim's threads, so no other thread of the application can change its
//! descriptor table meanwhile:
//! * in a private table, the handler opens the pipe's write end through
//!   `/proc/self/task/<tid>/fd/<n>` (a descriptor of its own for a moment,
//!   raw system calls), writes a byte and closes it. It opens it for reading
//!   and writing: the shim's thread may be closing the pipe meanwhile, and a
//!   write to a pipe without a reader raises SIGPIPE, which kills the
//!   application (seen: 1 in 15 runs of `core_threads` under load); with
//!   itself as a reader the write cannot fail that way;
//! * in the application's table, it writes to the recorded write end if it
//!   still has its identity (`fd::poke`).

use super::state::STATE;
use crate::os::fd::{self, Owned};
use crate::os::{self, StackBuf, raw};
use core::fmt::Write;

/// The wake pipe, owned by the shim's thread.
///
/// Fields drop in order: the write end closes before the read end, so a
/// handler that finds the write end still ours never writes to a pipe
/// without a reader (EPIPE would raise SIGPIPE on the application's
/// thread, and kill it).
pub struct Wake {
    w: Owned,
    r: Owned,
    _low: [Option<Owned>; 3],
}

impl Wake {
    /// Creates the pipe and publishes where its write end is. `None` if it
    /// cannot be created now (the thread tries again on its next turn).
    pub fn open() -> Option<Wake> {
        let (r, w) = fd::pipe()?;
        let low = w.fill_low_numbers();
        STATE.set_wake(Some((os::thread::gettid(), w.fd()?)));
        Some(Wake { w, r, _low: low })
    }

    /// What to poll: the read end (-1 if it is not ours any more).
    pub fn pollfd(&self) -> libc::pollfd {
        libc::pollfd {
            fd: self.r.fd().unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        }
    }

    /// Whether either end is not ours any more (the application closed or
    /// replaced it: application's table only).
    pub fn lost(&self) -> bool {
        self.r.fd().is_none() || self.w.fd().is_none()
    }

    /// Empties the pipe after a wake-up.
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        while let Some(fd) = self.r.fd() {
            match raw::read(fd, &mut buf) {
                Ok(n) if n > 0 => continue,
                Err(libc::EINTR) => continue,
                _ => break,
            }
        }
    }

    /// Withdraws the published address and closes both ends (if ours).
    pub fn close(self) {
        STATE.set_wake(None);
    }
}

/// Wakes the shim's thread (fork or namespace handler, while the
/// application is alone but for the shim's threads). Async-signal-safe.
pub fn wake() {
    let Some((tid, fd)) = STATE.wake() else {
        return;
    };
    if !fd::private() {
        fd::poke(fd);
        return;
    }
    let mut path = StackBuf::<64>::new();
    let _ = write!(path, "/proc/self/task/{tid}/fd/{fd}");
    let Some(path) = path.as_cstr() else {
        return;
    };
    // O_RDWR: this descriptor is a reader too (see the module's comment).
    if let Ok(w) = raw::open(path, libc::O_RDWR | libc::O_NONBLOCK) {
        let _ = raw::write(w, &[1]);
        raw::close(w);
    }
}
