//! Where this process's socket is: `<dir>/<pid>-<starttime>-<pidns>.sock`
//! (`memshim_proto::endpoint` has the facts; docs/protocol.md, "Where the
//! socket is"), and the path allocation-free code (the destructor) reaches
//! it by. The system calls are in `os::sock`.

use crate::os::ResetTo;
use crate::os::{self, StackBuf};
use core::sync::atomic::{AtomicBool, AtomicI32, Ordering::*};
use memshim_proto::endpoint::{self, SUN_PATH_MAX, SocketName};
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

/// Removes the socket files in `dir` that processes of this pid namespace
/// (`pidns`, this process's start time `starttime`) left behind. A process
/// that ends with `_exit` (dash ends every `sh -c` that way, and Python's
/// `os._exit`) or by a signal leaves its file; with `MEMSHIM_CONTROL=on`
/// in a container, every such process would add one. A file is stale when
/// `/proc` shows no process of its pid and start time: a live process's
/// name is made of exactly those. Nothing is connected to (a listener that
/// is not a shim's is none of our business). Files of other pid namespaces
/// are left alone, and so is everything when this `/proc` is not this pid
/// namespace's (it does not show this process under its own pid);
/// `memshim-ctl list` removes those. Shim's thread, after binding its own.
pub fn remove_stale(dir: &CString, pidns: u64, starttime: u64) {
    use std::os::unix::ffi::OsStrExt;
    let me = os::getpid();
    if pidns == 0 || os::proc::starttime_of(me) != Some(starttime) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::ffi::OsStr::from_bytes(dir.as_bytes())) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(name) = file.to_str() else {
            continue;
        };
        let Some(s) = SocketName::parse(name) else {
            continue;
        };
        if s.pidns == pidns && s.pid != me && os::proc::starttime_of(s.pid) != Some(s.starttime) {
            os::sock::unlink(&join(dir, name));
        }
    }
}

/// The path of the socket file this process has bound, for the destructor
/// (which must not allocate). Written once per process, before
/// `BOUND_PID` names it; the path never changes within a process.
struct BoundPath(core::cell::UnsafeCell<StackBuf<192>>);

// SAFETY: written only while BOUND_PID is not this process's pid (nobody
// reads it then), read only after an Acquire load shows it is.
unsafe impl Sync for BoundPath {}

static BOUND_PATH: BoundPath = BoundPath(core::cell::UnsafeCell::new(StackBuf::new()));
/// getpid() of the process whose path `BOUND_PATH` holds.
static BOUND_PID: AtomicI32 = AtomicI32::new(0);
/// The file exists now (bound and not yet removed).
static BOUND_NOW: AtomicBool = AtomicBool::new(false);

/// Records that `path` is bound now (shim's thread).
pub fn record_bound(path: &CString) {
    let pid = os::getpid();
    if BOUND_PID.load(Acquire) != pid {
        // SAFETY: BOUND_PID is not ours: no reader looks at the buffer.
        let b = unsafe { &mut *BOUND_PATH.0.get() };
        *b = StackBuf::new();
        b.push(path.as_bytes());
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
pub fn unlink_at_exit() {
    if !BOUND_NOW.load(Acquire) || BOUND_PID.load(Acquire) != os::getpid() {
        return;
    }
    // SAFETY: BOUND_PID is ours: the buffer is complete and not written again.
    let b = unsafe { &mut *BOUND_PATH.0.get() };
    if let Some(p) = b.as_cstr() {
        os::sock::unlink(p);
    }
}

/// Fork child: no socket file of its own yet. Async-signal-safe.
pub fn after_fork_child() {
    BOUND_NOW.reset_to(false);
}
