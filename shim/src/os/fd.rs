//! The shim's own descriptors, and the table they live in.
//!
//! **A table of its own.** Where the kernel allows it, the shim's thread
//! leaves the application's descriptor table at its start ([`make_private`]:
//! `close_range(0, ~0, CLOSE_RANGE_UNSHARE)`, or `unshare(CLONE_FILES)` and
//! closing the copies on kernels before 5.9). Its listener, connections and
//! wake pipe then live in a table nobody else uses: the application's
//! `close_range`, `dup2`, `closefrom` and descriptor listings can neither
//! touch nor see them, `fork` never copies them (a child copies the forking
//! thread's table), and `exec` ends them with the thread. Numbers there mean
//! nothing to the application, so nothing needs checking.
//!
//! **The fallback: the application's table.** Where both calls are refused
//! (seccomp profiles that deny `unshare` and predate `close_range`, kernels
//! before 5.9 under such profiles; `MEMSHIM_FD_TABLE=shared` forces it for
//! tests), every descriptor is recorded here with its identity (device and
//! inode), captured right after it was created and checked right before
//! every use: a number the application closed and reused is forgotten,
//! never read, written, accepted on or closed. A check cannot be atomic
//! with the call after it, so a window of a few hundred nanoseconds
//! remains in which another application thread would have to close the
//! shim's descriptor and put its own on the same number;
//! docs/reliability.md ("Descriptors") says what each use does about it.
//! Creations there also take the fork fence (`fence.rs`), and are moved to
//! numbers >= 512, away from the low numbers programs pick by hand (under
//! a soft `RLIMIT_NOFILE` of 512 or less, to the top of what it allows).
//!
//! The records are statics (atomics only) so the fork child handler can
//! reach them. Every system call here is made without libc (`raw.rs`), so
//! none touches `errno`.

use super::{KeepErrno, ResetTo, raw};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};

touched_at_start! {
    /// The shim's thread uses a descriptor table of its own.
    static PRIVATE: AtomicBool = AtomicBool::new(false);
}

/// Whether the shim's descriptors live in a table of their own.
pub fn private() -> bool {
    PRIVATE.load(Acquire)
}

const CLOSE_RANGE_UNSHARE: u32 = 1 << 1;

/// `close_range`: closes only descriptors of the calling thread's table
/// (after unsharing it, with the flag).
fn close_range(first: u32, last: u32, flags: u32) -> bool {
    raw::close_range(first, last, flags).is_ok()
}

/// Whether [`make_private`] can work here: `close_range` or `unshare`
/// exists and is allowed (seccomp). Changes nothing.
pub fn can_be_private() -> bool {
    // close_range(~0, ~0): a number no table holds. unshare(0): no flags.
    close_range(u32::MAX, u32::MAX, 0) || raw::unshare(0).is_ok()
}

/// Moves the calling thread (the shim's, at its start, before it has opened
/// anything) to a descriptor table of its own that holds nothing of the
/// application's: with `keep_stderr`, only a copy of fd 2 (for
/// `MEMSHIM_VERBOSE`); otherwise nothing. Returns false (and changes
/// nothing) where the kernel refuses.
pub fn make_private(keep_stderr: bool) -> bool {
    let _e = KeepErrno::new();
    let first = if keep_stderr { 3 } else { 0 };
    // One call: the new table copies only the descriptors below `first`, so
    // the application's files are never referenced twice.
    let done = close_range(first, u32::MAX, CLOSE_RANGE_UNSHARE) || {
        // Before Linux 5.9: a copy of the whole table, whose copies are
        // closed at once (closing a copy never affects the application:
        // its record locks belong to its own table).
        raw::unshare(libc::CLONE_FILES).is_ok() && {
            close_copies(first);
            true
        }
    };
    if !done {
        return false;
    }
    if keep_stderr {
        close_range(0, 1, 0);
    }
    PRIVATE.store(true, Release);
    true
}

/// Closes every descriptor from `first` on in the (just unshared) table.
fn close_copies(first: u32) {
    if close_range(first, u32::MAX, 0) {
        return;
    }
    let listed: Option<Vec<i32>> = std::fs::read_dir("/proc/thread-self/fd").ok().map(|rd| {
        rd.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    });
    match listed {
        Some(fds) => fds
            .into_iter()
            .filter(|&fd| fd >= first as i32)
            // Copies in our private table.
            .for_each(raw::close),
        None => {
            let top = raw::soft_limit(libc::RLIMIT_NOFILE).unwrap_or(0);
            for fd in first as i32..top.min(1 << 20) as i32 {
                raw::close(fd); // a copy in our private table
            }
        }
    }
}

// --- owned descriptors ------------------------------------------------------

/// Slots for the shim's descriptors: the listener, its connections, the
/// wake pipe, the pressure watcher's (thread/pressure.rs), and room to spare.
const SLOTS: usize = 32;

struct Slot {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

touched_at_start! {
    static TABLE: [Slot; SLOTS] = [const {
        Slot {
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }; SLOTS];
}

/// (device, inode, file type) of `fd`, if it is open. Async-signal-safe.
fn identity(fd: i32) -> Option<(u64, u64, u32)> {
    if fd < 0 {
        return None;
    }
    let st = raw::fstat(fd).ok()?;
    Some((st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT))
}

/// A descriptor the shim created and owns. Its number is used only through
/// [`Owned::fd`]; dropping it closes the descriptor if it is still ours.
#[derive(Debug)]
pub struct Owned(u8);

impl Owned {
    /// The descriptor's number, if it is still the one we created. In a
    /// private table it always is; in the application's, the identity is
    /// checked (async-signal-safe).
    pub fn fd(&self) -> Option<i32> {
        let s = &TABLE[self.0 as usize];
        let fd = s.fd.load(Acquire);
        if fd < 0 {
            return None;
        }
        if private() {
            return Some(fd);
        }
        let (dev, ino, _) = identity(fd)?;
        (dev == s.dev.load(Acquire) && ino == s.ino.load(Acquire)).then_some(fd)
    }

    /// Gives the number up without closing it (it is not ours any more).
    pub fn forget(self) {
        TABLE[self.0 as usize].fd.store(-1, Release);
        core::mem::forget(self);
    }

    /// In a private table: puts a copy of this descriptor on each free
    /// number below 3, so that a stray write to 0, 1 or 2 from the shim's
    /// thread (a message of jemalloc's) lands here and not on a socket of
    /// ours. Nothing in the application's table.
    pub fn fill_low_numbers(&self) -> [Option<Owned>; 3] {
        let mut out = [None, None, None];
        let Some(fd) = self.fd().filter(|_| private()) else {
            return out;
        };
        for (n, slot) in out.iter_mut().enumerate() {
            let n = n as i32;
            // F_GETFD only reads the flags of a number of our table.
            if raw::fd_flags(n).is_ok() {
                continue;
            }
            // Our own descriptor, onto a free number of our own table.
            if raw::dup3(fd, n, libc::O_CLOEXEC) == Ok(n) {
                *slot = record(n, None);
            }
        }
        out
    }
}

/// Writes one byte to `fd` if it is a descriptor of ours that still has its
/// identity (the wake pipe's write end, from a fork handler).
/// Async-signal-safe.
pub fn poke(fd: i32) {
    let ours = TABLE.iter().any(|s| {
        s.fd.load(Acquire) == fd
            && (private()
                || identity(fd)
                    .is_some_and(|(d, i, _)| d == s.dev.load(Acquire) && i == s.ino.load(Acquire)))
    });
    if ours {
        let _ = super::raw::write(fd, &[1]);
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let ours = self.fd();
        TABLE[self.0 as usize].fd.store(-1, Release);
        if let Some(fd) = ours {
            raw::close(fd); // still the one we created
        }
    }
}

/// Records `fd` (created by us) in a free slot, with `id` as its identity
/// (or its current one). `None` if every slot is taken (then it is closed).
fn record(fd: i32, id: Option<(u64, u64)>) -> Option<Owned> {
    let (dev, ino) = match id {
        Some(i) => i,
        None if private() => (0, 0),
        None => identity(fd).map(|(d, i, _)| (d, i))?,
    };
    for (i, s) in TABLE.iter().enumerate() {
        if s.fd.compare_exchange(-1, -2, AcqRel, Acquire).is_ok() {
            s.dev.store(dev, Release);
            s.ino.store(ino, Release);
            s.fd.store(fd, Release);
            return Some(Owned(i as u8));
        }
    }
    raw::close(fd); // our own new descriptor, never recorded
    None
}

/// What a new descriptor must look like for it to be the one just created
/// (checked in the application's table, where another thread could have
/// put one of its own on the number at once).
#[derive(Clone, Copy)]
enum Expect {
    /// A socket that is not bound yet (the listener, fresh).
    FreshSocket,
    /// A socket (an accepted connection; the caller checks its address).
    Socket,
    /// One end of the pipe whose other end has this inode.
    Pipe,
}

/// Takes a descriptor the caller has just created into the records. In the
/// application's table: checks it is what was created, and moves it to a
/// number >= 512 (keeping the low number if that fails). Returns `None`
/// (and uses nothing that is not ours) if the application replaced it.
fn adopt(fd: i32, expect: Expect, pipe_ino: Option<u64>) -> Option<Owned> {
    if private() {
        return record(fd, None);
    }
    let (dev, ino, kind) = identity(fd)?;
    let looks_right = match expect {
        Expect::FreshSocket => kind == libc::S_IFSOCK && unbound(fd),
        Expect::Socket => kind == libc::S_IFSOCK,
        Expect::Pipe => kind == libc::S_IFIFO && pipe_ino.is_none_or(|i| i == ino),
    };
    if !looks_right {
        return None; // not ours: never closed
    }
    let high = move_high(fd, (dev, ino))?;
    record(high, Some((dev, ino)))
}

/// Whether `fd` is a Unix socket with no address yet.
fn unbound(fd: i32) -> bool {
    raw::getsockname(fd)
        .is_ok_and(|a| a.sun_family == libc::AF_UNIX as libc::sa_family_t && a.sun_path[0] == 0)
}

/// Moves our new descriptor `fd` (identity `id`) to a number >= 512 with
/// close-on-exec. The copy is kept only if it is our file; the original
/// number is closed only if it still is. Returns the number to use.
fn move_high(fd: i32, id: (u64, u64)) -> Option<i32> {
    let Ok(high) = raw::dup_from(fd, 512).or_else(|e| {
        // A soft RLIMIT_NOFILE of 512 or less: the top of what it allows,
        // which a program that counts up from 3 reaches last (SLOTS below
        // it: room for all of ours).
        let top = raw::soft_limit(libc::RLIMIT_NOFILE).unwrap_or(0);
        match top.checked_sub(SLOTS as u64) {
            Some(from) if from > fd as u64 => raw::dup_from(fd, from as i32),
            _ => Err(e),
        }
    }) else {
        return Some(fd); // a very low RLIMIT_NOFILE: keep the number we have
    };
    match identity(high) {
        Some((d, i, _)) if (d, i) == id => {
            if identity(fd).is_some_and(|(d, i, _)| (d, i) == id) {
                raw::close(fd); // the original number still holds our new file
            }
            Some(high)
        }
        Some((_, _, kind)) => {
            // The application put its own file on `fd` before the copy was
            // made: the copy is of its file. Dropping a reference to a pipe
            // or socket is harmless; closing any descriptor of a regular
            // file would release the application's record locks on it, so
            // such a copy is kept open instead.
            if kind != libc::S_IFREG {
                raw::close(high); // the number F_DUPFD just gave us
            }
            None
        }
        None => None,
    }
}

/// A new pipe (nonblocking, close-on-exec): (read end, write end).
pub fn pipe() -> Option<(Owned, Owned)> {
    let _fence = creation_section()?;
    let fds = raw::pipe2(libc::O_CLOEXEC | libc::O_NONBLOCK).ok()?;
    if private() {
        return Some((record(fds[0], None)?, record(fds[1], None)?));
    }
    // Both ends are of one pipe, one inode: an end the application swapped
    // in would be of another pipe (then the write end, checked first, is
    // dropped and closed, and the read end's number is left alone).
    let w_ino = identity(fds[1]).map(|(_, i, _)| i)?;
    let w = adopt(fds[1], Expect::Pipe, Some(w_ino))?;
    let r = adopt(fds[0], Expect::Pipe, Some(w_ino))?;
    Some((r, w))
}

/// A new nonblocking, close-on-exec Unix stream socket, not bound yet.
pub fn unix_socket() -> Option<Owned> {
    let _fence = creation_section()?;
    let fd = raw::socket(
        libc::AF_UNIX,
        libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        0,
    )
    .ok()?;
    adopt(fd, Expect::FreshSocket, None)
}

/// Accepts one connection on `listener` (nonblocking, close-on-exec).
/// `Err(errno)`: nothing waiting (`EAGAIN`), out of descriptors (`EMFILE`,
/// `ENFILE`), or `EBADF` if the listener is not ours any more.
pub fn accept(listener: &Owned) -> Result<Owned, i32> {
    let Some(_fence) = creation_section() else {
        return Err(libc::EAGAIN);
    };
    let lfd = listener.fd().ok_or(libc::EBADF)?;
    let fd = raw::accept4(lfd, libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK)?;
    adopt(fd, Expect::Socket, None).ok_or(libc::EBADF)
}

/// Opens the directory `path` without following a symbolic link in its
/// last component. `Err(errno)`: `ELOOP` for a link, `ENOTDIR`, ...
pub fn open_dir(path: &core::ffi::CStr) -> Result<Owned, i32> {
    let _fence = creation_section().ok_or(libc::EAGAIN)?;
    let fd = raw::open(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW)?;
    open_dir_adopt(fd).ok_or(libc::EBADF)
}

fn open_dir_adopt(fd: i32) -> Option<Owned> {
    if private() {
        return record(fd, None);
    }
    let (dev, ino, kind) = identity(fd)?;
    if kind != libc::S_IFDIR {
        return None;
    }
    record(move_high(fd, (dev, ino))?, Some((dev, ino)))
}

/// A new eventfd (nonblocking, close-on-exec), for the memory cgroup's
/// notifications (`cgroup.event_control`). Only in a table of the shim's
/// own: every eventfd shares one anonymous inode, so in the application's
/// table its identity could not tell ours from one of the application's
/// put on the same number. `None` there (the pressure watcher then checks
/// the cgroup by reading it instead).
pub fn eventfd() -> Option<Owned> {
    if !private() {
        return None;
    }
    let fd = raw::eventfd(libc::EFD_CLOEXEC | libc::EFD_NONBLOCK).ok()?;
    record(fd, None)
}

/// Opens the regular file `path` (close-on-exec, no controlling tty) with
/// `flags` (`O_RDONLY`, `O_WRONLY` or `O_RDWR`, plus status flags), not
/// following a symbolic link in its last component. In the application's
/// table the new descriptor must still be that file (device and inode of
/// `path`) before it is taken. `Err(errno)`: as `open`, `EBADF` if another
/// file took the number at once.
pub fn open_file(path: &core::ffi::CStr, flags: i32) -> Result<Owned, i32> {
    let _fence = creation_section().ok_or(libc::EAGAIN)?;
    let flags = flags | libc::O_NOCTTY | libc::O_NOFOLLOW;
    // No mode is passed: no O_CREAT.
    let fd = raw::open(path, flags & !libc::O_CREAT)?;
    if private() {
        return record(fd, None).ok_or(libc::EMFILE);
    }
    let (dev, ino, kind) = identity(fd).ok_or(libc::EBADF)?;
    let same = raw::stat(path, true).is_ok_and(|st| (st.st_dev, st.st_ino) == (dev, ino));
    if kind != libc::S_IFREG || !same {
        return Err(libc::EBADF); // not ours: never closed
    }
    let high = move_high(fd, (dev, ino)).ok_or(libc::EBADF)?;
    record(high, Some((dev, ino))).ok_or(libc::EMFILE)
}

// --- fork -------------------------------------------------------------------

/// Fork prepare handler (after the shim's thread was asked to stop);
/// `alone`: the forking thread is the process's only one (fence.rs).
/// Async-signal-safe.
pub fn before_fork(alone: bool) {
    super::fence::before_fork(alone);
}

/// Fork parent handler. Async-signal-safe.
pub fn after_fork_parent() {
    super::fence::after_fork_parent();
}

/// Fork child handler: the shim's thread is not in the child. In the
/// application's table, the child inherited our descriptors: close those
/// that are still ours. A private table was not copied: there is nothing
/// to close, and the recorded numbers mean the application's descriptors
/// here. Async-signal-safe (fstat, close).
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    super::fence::after_fork_child();
    let was_private = PRIVATE.load(Acquire);
    PRIVATE.reset_to(false);
    for s in &TABLE {
        let fd = s.fd.load(Acquire);
        if fd < 0 {
            continue;
        }
        s.fd.store(-1, Release);
        if was_private {
            continue;
        }
        if identity(fd)
            .is_some_and(|(d, i, _)| d == s.dev.load(Acquire) && i == s.ino.load(Acquire))
        {
            raw::close(fd); // the inherited copy of our own descriptor
        }
    }
}

/// A creation section of the fork fence (`fence.rs`) for a new descriptor
/// in the application's table; a private table is never copied by a fork,
/// so there it is granted without one. `None` while a fork is under way.
fn creation_section() -> Option<Option<super::fence::Section>> {
    if private() {
        return Some(None);
    }
    super::fence::enter().map(Some)
}
