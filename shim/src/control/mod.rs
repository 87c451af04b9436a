//! The per-process control endpoint (docs/protocol.md).
//!
//! A Unix stream socket at `<dir>/<pid>-<starttime>-<pidns>.sock` (see
//! [`socket`]), served by the shim's thread (`thread/run.rs`), which owns
//! the [`Endpoint`] and drives it:
//!
//! * [`Endpoint::open`] when the thread starts, [`Endpoint::close`] when it
//!   stops (the socket file is removed);
//! * [`Endpoint::poll_fds`] / [`Endpoint::on_events`]: the listener and the
//!   client connections, polled by the thread's loop;
//! * [`Endpoint::on_tick`]: lost descriptors, deadlines, retries;
//! * [`after_fork_child`] (fork child handler, async-signal-safe) and
//!   [`at_exit`] (library destructor).
//!
//! The thread passes what the endpoint reports about it as [`Facts`]; the
//! endpoint never reads the thread's state.
//!
//! Never blocking the thread: every descriptor is nonblocking, each wake-up
//! does bounded work (accepts, bytes read, requests answered), at most
//! [`MAX_CONNS`] connections are held (a new one evicts the oldest of an
//! earlier wake-up), a
//! connection that sends no complete request within `IDLE_TIMEOUT_MS` is
//! closed, and a request line is at most `MAX_REQUEST_BYTES`. Out of
//! descriptors, the listener is left alone for a while instead of being
//! polled (it would be readable, and `accept` would fail, at once, again).
//! No lock of ours is taken; jemalloc's own locks are taken only inside
//! `mallctl` and its allocation calls.
//!
//! Only the process's effective uid and root may talk (`SO_PEERCRED`);
//! others get a `permission_denied` line and the connection is closed.

mod conn;
mod facts;
mod requests;
mod socket;

use crate::os::{self, ResetTo, fd::Owned, sock};
use conn::{Conn, Next};
use core::sync::atomic::{AtomicBool, Ordering::*};
use facts::Ctx;
pub use facts::{Facts, PressureFacts};
use memshim_proto::ErrorCode;
/// Whether the attached bridge answered `detach` (its thread then stops).
pub use requests::detach::asked as detach_asked;
use std::ffi::CString;

/// Most client connections held at once; an extra one evicts the oldest.
pub const MAX_CONNS: usize = 16;
/// Descriptors [`Endpoint::poll_fds`] may return: the listener and every
/// connection.
pub const MAX_POLL_FDS: usize = 1 + MAX_CONNS;
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
/// How long the listener is left alone after `accept` found no descriptor
/// free (doubling up to a second while that lasts).
const PAUSE_MIN_MS: u64 = 50;
const PAUSE_MAX_MS: u64 = 1000;

touched_at_start! {
    /// The library destructor ran: never create the socket again.
    static EXITING: AtomicBool = AtomicBool::new(false);
    /// The shim's thread is creating the socket: from its last look at
    /// [`EXITING`] until the path is recorded for the destructor
    /// ([`Binding`]).
    static BINDING: AtomicBool = AtomicBool::new(false);
}
/// Longest the destructor waits for a socket being created to be recorded
/// (a few system calls; longer only for a thread kept off the CPU or
/// stopped by a tracer). See [`at_exit`].
const BIND_WAIT_MS: u64 = 500;
/// Whether the last failure was already reported (MEMSHIM_VERBOSE only).
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Where the socket is bound.
struct Bound {
    /// `<dir>/<name>`.
    path: CString,
    /// What `bind` was given (the path, or one through the directory's
    /// descriptor when the path is longer than `sun_path`).
    addr: Vec<u8>,
    /// (device, inode) of the socket file.
    file_id: Option<(u64, u64)>,
    /// The directory, held while the address goes through it.
    _dir: Option<Owned>,
}

/// The endpoint, owned by the shim's thread.
pub struct Endpoint {
    listener: Option<Owned>,
    conns: [Option<Conn>; MAX_CONNS],
    bound: Option<Bound>,
    starttime: u64,
    pidns: u64,
    /// The process's root directory when an endpoint was first opened
    /// ([`first_root`]).
    root: Option<(u64, u64)>,
    retry_at_ms: u64,
    /// Failed attempts since the last success.
    failures: u32,
    /// The listener is not polled before this (out of descriptors).
    paused_until_ms: u64,
    pause_ms: u64,
    /// Wake-ups served so far ([`Endpoint::on_events`]); a connection
    /// accepted in the current one is not evicted (see [`Endpoint::slot_for_new`]).
    wakeups: u64,
}

/// (st_dev, st_ino) of the root directory the first endpoint of this
/// process (or of the parent it was forked from) opened under, recorded
/// then. Every endpoint compares the current root with it: a program that
/// `chroot`s after that gets no socket, nor socket directory, inside its
/// new root, also from a thread started again later (after a set*id call,
/// or a new thread of its own). Set on the shim's thread only.
static ROOT: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();

fn first_root() -> Option<(u64, u64)> {
    if let Some(r) = ROOT.get() {
        return Some(*r);
    }
    let r = sock::root_id()?;
    Some(*ROOT.get_or_init(|| r))
}

fn now_ms() -> u64 {
    os::time::monotonic_ms()
}

impl Endpoint {
    /// Creates the endpoint. It exists while the thread runs; if the socket
    /// cannot be created (unsafe directory, ...) it retries on ticks.
    pub fn open() -> Option<Endpoint> {
        if EXITING.load(Acquire) {
            return None;
        }
        let mut e = Endpoint {
            listener: None,
            conns: [const { None }; MAX_CONNS],
            bound: None,
            starttime: os::proc::starttime(),
            pidns: os::proc::pid_namespace(),
            root: first_root(),
            retry_at_ms: 0,
            failures: 0,
            paused_until_ms: 0,
            pause_ms: PAUSE_MIN_MS,
            wakeups: 0,
        };
        e.bind();
        Some(e)
    }

    fn bind(&mut self) {
        let Some(binding) = Binding::start() else {
            return;
        };
        // The program has `chroot`ed since: our paths would name files
        // inside its new root (on_tick).
        if sock::root_id() != self.root {
            return self.fail(
                binding,
                format_args!(
                    "control socket not created: the program changed its root directory (chroot)"
                ),
            );
        }
        let dir = socket::dir();
        let dirfd = match sock::ensure_dir(&dir) {
            Ok(d) => d,
            Err(why) => {
                return self.fail(
                    binding,
                    format_args!(
                        "control socket not created: {}: {why}",
                        dir.to_string_lossy()
                    ),
                );
            }
        };
        let name = socket::name(self.starttime, self.pidns);
        let path = socket::join(&dir, &name);
        let addr = socket::address(&path, dirfd.fd().unwrap_or(-1), &name);
        let Some(listener) = sock::listen(&addr, &path) else {
            return self.fail(
                binding,
                format_args!("control socket not created: {}", path.to_string_lossy()),
            );
        };
        // In the application's table the number could have been replaced
        // since the checks in `listen`: what is there now is not ours.
        if !listener.fd().is_some_and(|fd| sock::bound_to(fd, &addr)) {
            listener.forget();
            return self.fail(
                binding,
                format_args!("control socket replaced while it was being created"),
            );
        }
        socket::record_bound(&path);
        drop(binding);
        socket::remove_stale(&dir, dirfd.fd().unwrap_or(-1), self.pidns);
        let long = addr != path.as_bytes();
        self.bound = Some(Bound {
            file_id: sock::socket_file_id(&path),
            path,
            addr,
            _dir: long.then_some(dirfd),
        });
        self.listener = Some(listener);
        REPORTED.store(false, Relaxed);
        self.failures = 0;
    }

    /// A failed [`bind`](Self::bind): the flag goes down before anything
    /// else (a log line can wait on a full stderr pipe; an exit must not
    /// wait on it).
    fn fail(&mut self, binding: Binding, msg: core::fmt::Arguments<'_>) {
        drop(binding);
        let wait = (RETRY_MIN_MS << self.failures.min(6)).min(RETRY_MAX_MS);
        self.failures = self.failures.saturating_add(1);
        self.retry_at_ms = now_ms() + wait;
        if crate::options::verbose() && !REPORTED.swap(true, Relaxed) {
            crate::log::info(msg);
        }
    }

    /// Closes the listener (if still ours) and removes our socket file (if
    /// it is still the one we bound).
    fn unbind(&mut self) {
        self.listener = None;
        if let Some(b) = self.bound.take()
            && sock::socket_file_id(&b.path) == b.file_id
        {
            sock::unlink(&b.path);
        }
        socket::record_unbound();
    }

    /// Fills `out` with what to poll (listener first, then connections).
    /// Returns how many entries were written.
    pub fn poll_fds(&mut self, out: &mut [libc::pollfd], now: u64) -> usize {
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
        if now >= self.paused_until_ms
            && let Some(fd) = self.listener.as_ref().and_then(Owned::fd)
        {
            push(fd, libc::POLLIN);
        }
        for c in self.conns.iter().flatten() {
            if let Some(fd) = c.fd() {
                push(fd, c.wants());
            }
        }
        n
    }

    fn ctx<'a>(&self, facts: &'a Facts) -> Ctx<'a> {
        Ctx {
            facts,
            starttime: self.starttime,
            pidns: self.pidns,
        }
    }

    /// Serves what `poll` reported on the entries of [`Endpoint::poll_fds`]:
    /// the connections first, then new ones. In a burst of more clients
    /// than [`MAX_CONNS`], those accepted at the last wake-up are read (their
    /// `hello` is waiting) before new ones may take their slots.
    pub fn on_events(&mut self, polled: &[libc::pollfd], facts: &Facts) {
        let ctx = self.ctx(facts);
        self.wakeups += 1;
        let listener = self.listener.as_ref().and_then(Owned::fd);
        let mut accept = false;
        for p in polled.iter().filter(|p| p.revents != 0) {
            if Some(p.fd) == listener {
                accept = true;
                continue;
            }
            let Some(i) = self
                .conns
                .iter()
                .position(|c| c.as_ref().and_then(Conn::fd) == Some(p.fd))
            else {
                continue;
            };
            let next = self.conns[i].as_mut().map_or(Next::Close, |c| c.turn(&ctx));
            if next == Next::Close {
                self.conns[i] = None;
            }
        }
        if accept {
            self.accept_some(&ctx);
        }
    }

    fn accept_some(&mut self, ctx: &Ctx<'_>) {
        let now = now_ms();
        for _ in 0..MAX_ACCEPTS_PER_TURN {
            // Every slot holds a connection accepted at this wake-up: the
            // rest wait in the listener's backlog for the next one.
            let Some(slot) = self.slot_for_new() else {
                return;
            };
            let (Some(listener), Some(b)) = (self.listener.as_ref(), self.bound.as_ref()) else {
                return;
            };
            let sock = match os::fd::accept(listener) {
                Ok(s) => s,
                Err(libc::EINTR) | Err(libc::ECONNABORTED) => continue,
                Err(libc::EMFILE) | Err(libc::ENFILE) | Err(libc::ENOBUFS) | Err(libc::ENOMEM) => {
                    // Out of descriptors (the application uses every one
                    // its limit allows): the client waits in the backlog.
                    self.paused_until_ms = now + self.pause_ms;
                    self.pause_ms = (self.pause_ms * 2).min(PAUSE_MAX_MS);
                    return;
                }
                Err(_) => return, // EAGAIN, or the listener is not ours any more
            };
            self.pause_ms = PAUSE_MIN_MS;
            // Application's table only: if the application put its own
            // listener on our number between the check and accept4, this
            // connection is one of its clients'; it is closed (the client
            // sees the connection end), never served.
            if !sock.fd().is_some_and(|fd| sock::bound_to(fd, &b.addr)) {
                continue;
            }
            if let Some(old) = self.conns[slot].take() {
                old.send_final(ErrorCode::Busy, "too many connections; this one was closed");
            }
            let me = os::euid();
            match sock.fd().and_then(sock::peer_uid) {
                Some(uid) if uid == me || uid == 0 => {
                    self.conns[slot] = Some(Conn::new(sock, now, self.wakeups));
                }
                peer => {
                    let who = peer.map_or("an unknown uid".to_owned(), |u| format!("uid {u}"));
                    let msg = format!(
                        "permission denied: this process runs as uid {me}; only uid {me} or root may use its \
                         control socket, and the request came from {who}"
                    );
                    let mut c =
                        Conn::refused(sock, now, self.wakeups, ErrorCode::PermissionDenied, &msg);
                    let _ = c.turn(ctx);
                    self.conns[slot] = Some(c);
                }
            }
        }
    }

    /// The slot for a new connection: a free one, or else the oldest
    /// connection's if it was accepted at an earlier wake-up (the caller
    /// evicts it with `busy`). `None` when every connection is new: a
    /// connection is read at least once before a newer one may evict it.
    fn slot_for_new(&self) -> Option<usize> {
        if let Some(i) = self.conns.iter().position(Option::is_none) {
            return Some(i);
        }
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((c.as_ref()?, i)))
            .filter(|(c, _)| c.accepted_wakeup < self.wakeups)
            .min_by_key(|(c, _)| c.accepted_ms)
            .map(|(_, i)| i)
    }

    /// Housekeeping on every loop turn: descriptors the application took
    /// (its own table only), deadlines, queued requests, and re-creating a
    /// lost socket.
    pub fn on_tick(&mut self, facts: &Facts) {
        if EXITING.load(Acquire) {
            return;
        }
        let now = now_ms();
        let ctx = self.ctx(facts);
        for slot in self.conns.iter_mut() {
            let Some(c) = slot.as_mut() else {
                continue;
            };
            if c.fd().is_none() {
                // Closed, and maybe reused, by the application: forget the
                // number, never close it.
                if let Some(c) = slot.take() {
                    c.forget();
                }
            } else if now >= c.deadline_ms && c.is_draining() {
                *slot = None;
            } else if now >= c.deadline_ms {
                // Past its deadline; but the loop may have spent that time
                // on another client's long request (a `gc` waits up to 5 s
                // for the GIL) without reading this one. What it sent is
                // served now, which moves the deadline, before it is given
                // up on.
                match c.turn(&ctx) {
                    Next::Close => *slot = None,
                    Next::Keep if now >= c.deadline_ms => {
                        let msg = format!(
                            "no complete request within {} ms; closing",
                            memshim_proto::IDLE_TIMEOUT_MS
                        );
                        c.send_final(ErrorCode::Timeout, &msg);
                        *slot = None;
                    }
                    Next::Keep => {}
                }
            } else if c.has_backlog() && c.turn(&ctx) == Next::Close {
                *slot = None;
            }
        }
        let listener_lost = self.listener.as_ref().is_some_and(|l| l.fd().is_none());
        if listener_lost && let Some(l) = self.listener.take() {
            l.forget();
        }
        // The program has `chroot`ed: our paths now name files inside its
        // new root. The listener still serves through the socket file
        // outside, where memshim-ctl finds it; re-creating the socket (or
        // its directory) inside the program's new root is not ours to do.
        if sock::root_id() != self.root {
            return;
        }
        let file_lost = self
            .bound
            .as_ref()
            .is_some_and(|b| sock::socket_file_id(&b.path) != b.file_id);
        if listener_lost || file_lost {
            // Our file name in our own directory: safe to remove and re-create.
            self.unbind();
            self.bind();
        } else if self.bound.is_none() && now >= self.retry_at_ms {
            self.bind();
        }
    }

    /// Closes every connection and the listener, and removes the socket file.
    pub fn close(mut self) {
        for c in self.conns.iter_mut() {
            *c = None;
        }
        self.unbind();
    }
}

/// Fork child: the parent's connections and listener are not the child's
/// (os/fd.rs closed what it inherited, in the application's table); its
/// socket file is the parent's and is never removed here. The child creates
/// its own socket when its thread starts. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    // A fork that caught the thread creating the socket: not the child's.
    BINDING.reset_to(false);
    socket::after_fork_child();
    requests::purge::reset_purge_counters();
}

/// Library destructor: remove this process's socket file, and make sure the
/// thread (which may still run while `exit` proceeds) does not re-create it.
/// A socket the thread is creating at this moment exists before its path is
/// recorded: the destructor waits for the record (at most [`BIND_WAIT_MS`]),
/// else the file would outlive the process. Allocation-free.
#[unsafe(link_section = ".text.startup")]
pub fn at_exit() {
    EXITING.store(true, SeqCst);
    // Looked at first: no clock is read at an ordinary exit.
    if BINDING.load(SeqCst) {
        os::time::wait_while(BIND_WAIT_MS, core::time::Duration::from_micros(50), || {
            BINDING.load(SeqCst)
        });
    }
    socket::unlink_at_exit();
}

/// The shim's thread between its last look at [`EXITING`] and the record of
/// the path it bound. Its flag is set before that look, and the destructor
/// sets [`EXITING`] before it reads the flag (both sequentially
/// consistent): either the thread sees the exit and creates nothing, or the
/// destructor sees the flag and waits for the record.
struct Binding;

impl Binding {
    fn start() -> Option<Binding> {
        BINDING.store(true, SeqCst);
        if EXITING.load(SeqCst) {
            BINDING.store(false, SeqCst);
            return None;
        }
        Some(Binding)
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        BINDING.store(false, SeqCst);
    }
}
