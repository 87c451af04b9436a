//! The per-process control endpoint (docs/protocol.md).
//!
//! A Unix stream socket at `<dir>/<pid>-<starttime>.sock` (see
//! [`socket`]), served by the shim's own thread (`supervisor.rs`) through
//! this interface:
//!
//! * [`Endpoint::open`] when the thread starts, [`Endpoint::close`] when it
//!   stops (the socket file is removed);
//! * [`Endpoint::poll_fds`] / [`Endpoint::on_events`]: the listener and the
//!   client connections, polled by the thread's loop;
//! * [`Endpoint::on_tick`]: identity checks, deadlines, retries;
//! * [`after_fork_child`] (fork child handler, async-signal-safe) and
//!   [`at_exit`] (library destructor).
//!
//! Never blocking the thread: every descriptor is nonblocking, each wake-up
//! does bounded work (accepts, bytes read, requests answered), at most
//! [`fds::MAX_CONNS`] connections are held (a new one evicts the oldest),
//! a connection that sends no complete request within
//! `IDLE_TIMEOUT_MS` is closed, and a request line is at most
//! `MAX_REQUEST_BYTES`. No lock of ours is taken; jemalloc's own locks are
//! taken only inside `mallctl` and its allocation calls.
//!
//! Only the process's effective uid and root may talk (`SO_PEERCRED`);
//! others get a `permission_denied` line and the connection is closed.

mod conn;
mod fds;
pub(crate) use fds::move_high;
mod handlers;
mod procfs;
mod socket;

use conn::{Conn, Next};
use core::sync::atomic::{AtomicBool, AtomicI32, Ordering::*};
use memshim_proto::ErrorCode;
use std::ffi::CString;

/// Accepts per wake-up.
const MAX_ACCEPTS_PER_TURN: usize = 32;
/// Wait after the first failure to (re)create the socket; doubles with each
/// further failure up to [`RETRY_MAX_MS`]. Short at first because the usual
/// cause is transient (the application's `close_range` racing with our
/// re-creation), long later because a persistent one (an unsafe directory)
/// must not cost work on every tick.
const RETRY_MIN_MS: u64 = 100;
/// Longest wait between attempts.
const RETRY_MAX_MS: u64 = 5000;
/// Descriptors [`Endpoint::poll_fds`] may return: the listener and every
/// connection.
pub const MAX_POLL_FDS: usize = 1 + fds::MAX_CONNS;

/// getpid() of the process that has a socket file bound now, 0 if none.
/// A fork child inherits the parent's value, so its destructor leaves the
/// parent's socket alone.
static BOUND_PID: AtomicI32 = AtomicI32::new(0);
/// The library destructor ran: never create the socket again.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Whether the last failure was already reported (MEMSHIM_VERBOSE only).
static REPORTED: AtomicBool = AtomicBool::new(false);

/// The endpoint, owned by the shim's thread.
pub struct Endpoint {
    conns: [Option<Conn>; fds::MAX_CONNS],
    path: Option<CString>,
    file_id: Option<(u64, u64)>,
    starttime: u64,
    retry_at_ms: u64,
    /// Failed attempts since the last success.
    failures: u32,
}

fn now_ms() -> u64 {
    crate::sys::monotonic_ms()
}

impl Endpoint {
    /// Creates the endpoint. It always exists while the thread runs; if the
    /// socket cannot be created (unsafe directory, ...) it retries on ticks.
    pub fn open() -> Option<Endpoint> {
        if EXITING.load(Acquire) {
            return None;
        }
        let mut e = Endpoint {
            conns: [const { None }; fds::MAX_CONNS],
            path: None,
            file_id: None,
            starttime: socket::starttime(),
            retry_at_ms: 0,
            failures: 0,
        };
        e.bind();
        Some(e)
    }

    fn bind(&mut self) {
        if EXITING.load(Acquire) {
            return;
        }
        let dir = socket::dir_path();
        if let Err(why) = socket::ensure_dir(&dir) {
            self.fail(format_args!(
                "control socket not created: {}: {why}",
                String::from_utf8_lossy(&dir)
            ));
            return;
        }
        let pid = crate::sys::getpid();
        let path = socket::socket_path(&dir, pid, self.starttime);
        // No fork may copy the listener before it is recorded.
        let Some(_fence) = crate::fork_fence::enter() else {
            self.retry_at_ms = now_ms() + 10;
            return;
        };
        let Some(fd) = socket::listen(&path) else {
            self.fail(format_args!(
                "control socket not created: {}",
                socket::show(&path)
            ));
            return;
        };
        fds::LISTENER.set(fd);
        if !socket::bound_to(fd, &path) {
            // The application replaced the number between listen() and the
            // record (close_range + dup2 from another thread): what we
            // recorded is not ours. Forget it, never close it, try again.
            fds::LISTENER.forget();
            self.fail(format_args!(
                "control socket replaced while it was being created"
            ));
            return;
        }
        self.file_id = socket::socket_file_id(&path);
        self.path = Some(path);
        BOUND_PID.store(pid, Release);
        REPORTED.store(false, Relaxed);
        self.failures = 0;
    }

    fn fail(&mut self, msg: core::fmt::Arguments<'_>) {
        let wait = (RETRY_MIN_MS << self.failures.min(6)).min(RETRY_MAX_MS);
        self.failures = self.failures.saturating_add(1);
        self.retry_at_ms = now_ms() + wait;
        if crate::options::verbose() && !REPORTED.swap(true, Relaxed) {
            crate::log::info(msg);
        }
    }

    /// Closes the listener (if still ours) and removes our socket file.
    fn unbind(&mut self) {
        fds::LISTENER.close();
        if let Some(p) = self.path.take() {
            socket::unlink(&p);
        }
        self.file_id = None;
        BOUND_PID.store(0, Release);
    }

    /// The listening descriptor, if it is still ours.
    pub fn poll_fd(&self) -> Option<i32> {
        fds::LISTENER.get()
    }

    /// Fills `out` with what to poll (listener first, then connections).
    /// Returns how many entries were written.
    pub fn poll_fds(&self, out: &mut [libc::pollfd]) -> usize {
        let mut n = 0;
        let mut push = |fd: i32, events: i16| {
            if n < out.len() {
                out[n] = libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                };
                n += 1;
            }
        };
        if let Some(fd) = fds::LISTENER.get() {
            push(fd, libc::POLLIN);
        }
        for c in self.conns.iter().flatten() {
            if let Some(fd) = c.fd() {
                push(fd, c.wants());
            }
        }
        n
    }

    /// Serves what `poll` reported on the entries of [`Endpoint::poll_fds`].
    pub fn on_events(&mut self, polled: &[libc::pollfd]) {
        let now = now_ms();
        for p in polled.iter().filter(|p| p.revents != 0) {
            if Some(p.fd) == fds::LISTENER.get() {
                self.accept_some(now);
                continue;
            }
            let Some(i) = self
                .conns
                .iter()
                .position(|c| c.as_ref().and_then(|c| c.fd()) == Some(p.fd))
            else {
                continue;
            };
            let next = self.conns[i]
                .as_mut()
                .map_or(Next::Close, |c| c.turn(now, self.starttime));
            if next == Next::Close {
                self.drop_conn(i);
            }
        }
    }

    /// Accepts waiting connections (the supervisor's single-fd interface).
    pub fn on_ready(&mut self) {
        self.accept_some(now_ms());
    }

    fn accept_some(&mut self, now: u64) {
        for _ in 0..MAX_ACCEPTS_PER_TURN {
            // No fork may copy a connection before it is recorded; during
            // a fork, accept on a later turn.
            let Some(_fence) = crate::fork_fence::enter() else {
                return;
            };
            // Identity checked before every accept (hazard 26).
            let Some(listener) = fds::LISTENER.get() else {
                return;
            };
            let fd = match socket::accept(listener) {
                Ok(fd) => fd,
                Err(libc::EINTR) | Err(libc::ECONNABORTED) => continue,
                Err(_) => return, // EAGAIN, or out of descriptors: try later
            };
            let slot = self.free_slot();
            fds::CONNS[slot].set(fd);
            // Recorded first, then checked: if the application replaced the
            // number in between, the record is not ours; forget it.
            if !self.path.as_ref().is_some_and(|p| socket::bound_to(fd, p)) {
                fds::CONNS[slot].forget();
                continue;
            }
            let me = socket::euid();
            match socket::peer_uid(fd) {
                Some(uid) if uid == me || uid == 0 => {}
                peer => {
                    let who = peer.map_or("an unknown uid".to_owned(), |u| format!("uid {u}"));
                    let msg = format!(
                        "permission denied: this process runs as uid {me}; only uid {me} or root may use its \
                         control socket, and the request came from {who}"
                    );
                    self.conns[slot] =
                        Some(Conn::refused(slot, now, ErrorCode::PermissionDenied, &msg));
                    if let Some(c) = self.conns[slot].as_mut() {
                        let _ = c.turn(now, self.starttime);
                    }
                    continue;
                }
            }
            self.conns[slot] = Some(Conn::new(slot, now));
        }
    }

    /// A free connection slot, evicting the oldest connection if need be.
    fn free_slot(&mut self) -> usize {
        match self.conns.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let oldest = (0..fds::MAX_CONNS)
                    .min_by_key(|&i| self.conns[i].as_ref().map_or(0, |c| c.accepted_ms))
                    .unwrap_or(0);
                if let Some(old) = self.conns[oldest].as_ref().and_then(|c| c.fd()) {
                    Conn::send_final(
                        old,
                        ErrorCode::Busy,
                        "too many connections; this one was closed",
                    );
                }
                self.drop_conn(oldest);
                oldest
            }
        }
    }

    fn drop_conn(&mut self, i: usize) {
        self.conns[i] = None;
        fds::CONNS[i].close();
    }

    /// Housekeeping on every loop turn: identity checks (hazard 26),
    /// deadlines, queued requests, and re-creating a lost socket.
    pub fn on_tick(&mut self) {
        if EXITING.load(Acquire) {
            return;
        }
        let now = now_ms();
        for i in 0..fds::MAX_CONNS {
            let Some(c) = self.conns[i].as_mut() else {
                continue;
            };
            let Some(fd) = c.fd() else {
                // Closed (and maybe reused) by the application: forget it.
                fds::CONNS[i].forget();
                self.conns[i] = None;
                continue;
            };
            if now >= c.deadline_ms && c.is_draining() {
                self.drop_conn(i);
            } else if now >= c.deadline_ms {
                let msg = format!(
                    "no complete request within {} ms; closing",
                    memshim_proto::IDLE_TIMEOUT_MS
                );
                Conn::send_final(fd, ErrorCode::Timeout, &msg);
                self.drop_conn(i);
            } else if c.has_backlog() && c.turn(now, self.starttime) == Next::Close {
                self.drop_conn(i);
            }
        }
        let listener_lost = fds::LISTENER.is_set() && fds::LISTENER.get().is_none();
        if listener_lost {
            fds::LISTENER.forget();
        }
        let file_lost = self
            .path
            .as_ref()
            .is_some_and(|p| socket::socket_file_id(p) != self.file_id);
        if listener_lost || file_lost {
            // Our file name in our own directory: safe to remove and re-create.
            self.unbind();
            self.bind();
        } else if self.path.is_none() && now >= self.retry_at_ms {
            self.bind();
        }
    }

    /// Closes every connection and the listener, and removes the socket file.
    pub fn close(mut self) {
        for i in 0..fds::MAX_CONNS {
            if self.conns[i].is_some() {
                self.drop_conn(i);
            }
        }
        self.unbind();
    }
}

/// Fork child: close the inherited listener and connections if they are
/// still ours; never unlink the parent's socket file (`BOUND_PID` keeps the
/// parent's pid, so the child's destructor leaves it alone too). The child
/// creates its own socket when its thread starts. Async-signal-safe (fstat,
/// close).
pub fn after_fork_child() {
    fds::close_all();
    handlers::reset_purge_counters();
}

/// Library destructor: remove this process's socket file, and make sure the
/// thread (which may still run while `exit` proceeds) does not re-create it.
/// Allocation-free.
pub fn at_exit() {
    EXITING.store(true, Release);
    let pid = crate::sys::getpid();
    if BOUND_PID.load(Acquire) != pid {
        return;
    }
    let dir = socket::dir_path_static();
    let mut buf = crate::sys::StackBuf::<160>::new();
    buf.push(dir.as_bytes());
    if buf.as_bytes().last() != Some(&b'/') {
        buf.push(b"/");
    }
    use core::fmt::Write;
    let _ = write!(buf, "{pid}-{}.sock\0", socket::starttime());
    if let Ok(c) = core::ffi::CStr::from_bytes_with_nul(buf.as_bytes()) {
        socket::unlink(c);
    }
}
