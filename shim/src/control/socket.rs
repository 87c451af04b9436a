//! Where this process's socket is: `<dir>/<pid>-<starttime>-<pidns>.sock`
//! (`memshim_proto::endpoint` has the facts; docs/protocol.md, "Where the
//! socket is"), and the path allocation-free code (the destructor) reaches
//! it by. The system calls are in `os::sock`.

use crate::os;
use crate::os::ResetTo;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicUsize, Ordering::*, fence,
};
use memshim_proto::endpoint::{self, SUN_PATH_MAX, Seen, SocketName};
use std::ffi::CString;

/// The socket directory in force: `MEMSHIM_SOCKET_DIR`, or the default.
pub fn dir() -> CString {
    let d = match crate::options::socket_dir() {
        Some(d) => d.to_vec(),
        None => endpoint::default_socket_dir(os::euid()).into_bytes(),
    };
    CString::new(d).unwrap_or_default()
}

/// This process's socket file name.
pub fn name(starttime: u64, pidns: u64) -> String {
    SocketName {
        pid: os::getpid(),
        starttime,
        pidns,
    }
    .to_string()
}

/// `dir/name`.
pub fn join(dir: &CString, name: &str) -> CString {
    let mut p = dir.as_bytes().to_vec();
    while p.len() > 1 && p.ends_with(b"/") {
        p.pop();
    }
    p.push(b'/');
    p.extend_from_slice(name.as_bytes());
    CString::new(p).unwrap_or_default()
}

/// The address to bind: the full path if it fits in `sun_path`, else the
/// name relative to the directory's descriptor, through
/// `/proc/thread-self/fd/<dirfd>/` (this thread's table: the shim's
/// descriptors may be in a table of their own).
pub fn address(path: &CString, dirfd: i32, name: &str) -> Vec<u8> {
    if path.as_bytes().len() <= SUN_PATH_MAX {
        path.as_bytes().to_vec()
    } else {
        format!("/proc/thread-self/fd/{dirfd}/{name}").into_bytes()
    }
}

/// Most directory entries one bind looks at: the scan runs on the shim's
/// thread before it serves, and a fork waits for that thread to stop.
const STALE_SCAN_MAX: usize = 64;

/// Removes socket files in `dir` that processes of this pid namespace
/// (`pidns`) left behind. A process that ends with `_exit` (dash ends every
/// `sh -c` that way, and Python's `os._exit`) or by a signal leaves its
/// file; with `MEMSHIM_CONTROL=on` in a container, every such process would
/// add one. A file goes only when all of these hold:
///
/// * it is a socket whose name is exactly what a shim writes
///   (`<pid>-<starttime>-<pidns>.sock`, nothing else), with this pid
///   namespace and a start time;
/// * `/proc` shows no such process (`ENOENT`), or a process of that pid
///   with another start time (a reused pid): a live process's name is made
///   of exactly its pid and start time. Any other failure to read keeps it;
/// * connecting to it is refused: nobody listens (the rule `memshim-ctl
///   list` applies too).
///
/// Nothing happens when this `/proc` is not this pid namespace's (`/proc/self`
/// does not name this pid), nor where the shim's descriptors share the
/// application's table (a directory scan holds a descriptor there). Files
/// of other pid namespaces are left to `memshim-ctl list`. Shim's thread,
/// after binding its own (`dirfd` is the directory's descriptor it bound
/// through); at most [`STALE_SCAN_MAX`] entries.
pub fn remove_stale(dir: &CString, dirfd: i32, pidns: u64) {
    use std::os::unix::ffi::OsStrExt;
    let me = os::getpid();
    let proc_is_ours = std::fs::read_link("/proc/self")
        .is_ok_and(|l| l.as_os_str().as_bytes() == me.to_string().as_bytes());
    if pidns == 0 || !proc_is_ours || !os::fd::private() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::ffi::OsStr::from_bytes(dir.as_bytes())) else {
        return;
    };
    for e in entries.flatten().take(STALE_SCAN_MAX) {
        let file = e.file_name();
        let Some(name) = file.to_str() else {
            continue;
        };
        let seen = |pid| match os::proc::starttime_of(pid) {
            Ok(None) => Seen::Gone,
            Ok(Some(t)) => Seen::Started(t),
            Err(_) => Seen::Unknown,
        };
        if !SocketName::stale(name, Some(pidns), seen) {
            continue;
        }
        let path = join(dir, name);
        // Not the entry's type from std: that may call `fstatat`, a symbol
        // the library does not import otherwise (each import is a look-up
        // in every process's start-up).
        if os::sock::socket_file_id(&path).is_none() {
            continue;
        }
        // Long paths are reached through the directory, as when binding.
        if os::sock::refuses_connection(&address(&path, dirfd, name)) {
            os::sock::unlink(&path);
        }
    }
}

/// The path of the socket file this process has bound, for the destructor
/// (which must not allocate). It changes within a process when a set*id
/// call moves the socket to the new uid's directory, so it is a seqlock:
/// the shim's thread (the only writer) makes `BOUND_SEQ` odd while it
/// writes; the destructor copies the bytes and keeps the copy only if the
/// sequence was even and unchanged around it. Bytes are atomics, so a
/// read that races a write is a wrong copy, thrown away, never a data race.
const BOUND_CAP: usize = 192;
static BOUND_PATH: [AtomicU8; BOUND_CAP] = [const { AtomicU8::new(0) }; BOUND_CAP];
touched_at_start! {
    static BOUND_LEN: AtomicUsize = AtomicUsize::new(0);
    static BOUND_SEQ: AtomicU32 = AtomicU32::new(0);
}
/// getpid() of the process whose path `BOUND_PATH` holds.
static BOUND_PID: AtomicI32 = AtomicI32::new(0);
touched_at_start! {
    /// The file exists now (bound and not yet removed).
    static BOUND_NOW: AtomicBool = AtomicBool::new(false);
}

/// Records that `path` is bound now (shim's thread).
pub fn record_bound(path: &CString) {
    let pid = os::getpid();
    let bytes = path.as_bytes();
    let same = BOUND_PID.load(Acquire) == pid
        && BOUND_LEN.load(Relaxed) == bytes.len()
        && bytes
            .iter()
            .zip(&BOUND_PATH)
            .all(|(b, a)| a.load(Relaxed) == *b);
    if !same {
        let seq = BOUND_SEQ.load(Relaxed);
        BOUND_SEQ.store(seq.wrapping_add(1), Relaxed);
        fence(Release);
        // A path that does not fit is not recorded: the destructor leaves
        // it (the next bind in that directory removes it as stale).
        let n = if bytes.len() < BOUND_CAP {
            bytes.len()
        } else {
            0
        };
        for (a, b) in BOUND_PATH.iter().zip(&bytes[..n]) {
            a.store(*b, Relaxed);
        }
        BOUND_LEN.store(n, Relaxed);
        BOUND_SEQ.store(seq.wrapping_add(2), Release);
        BOUND_PID.store(pid, Release);
    }
    BOUND_NOW.store(true, Release);
}

/// Records that the file was removed.
pub fn record_unbound() {
    BOUND_NOW.store(false, Release);
}

/// Removes this process's socket file if it has one (library destructor;
/// allocation-free). A fork child that never bound one leaves its
/// parent's alone.
#[unsafe(link_section = ".text.startup")]
pub fn unlink_at_exit() {
    if !BOUND_NOW.load(Acquire) || BOUND_PID.load(Acquire) != os::getpid() {
        return;
    }
    let mut copy = [0u8; BOUND_CAP];
    for _ in 0..4 {
        let seq = BOUND_SEQ.load(Acquire);
        let n = BOUND_LEN.load(Relaxed).min(BOUND_CAP - 1);
        for (c, a) in copy.iter_mut().zip(&BOUND_PATH[..n]) {
            *c = a.load(Relaxed);
        }
        copy[n] = 0;
        fence(Acquire);
        if seq & 1 == 0 && BOUND_SEQ.load(Relaxed) == seq {
            if n > 0
                && let Ok(p) = core::ffi::CStr::from_bytes_until_nul(&copy)
            {
                os::sock::unlink(p);
            }
            return;
        }
        // The writer is mid-write (or was preempted there): let it finish.
        std::thread::yield_now();
    }
}

/// Fork child: no socket file of its own yet. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    BOUND_NOW.reset_to(false);
    // A fork that caught the writer mid-write leaves an odd sequence and a
    // path half written: even again and empty (the child writes its own).
    let seq = BOUND_SEQ.load(Relaxed);
    if seq & 1 == 1 {
        BOUND_LEN.store(0, Relaxed);
        BOUND_SEQ.store(seq.wrapping_add(1), Release);
    }
}
