//! When the shim may have a thread of its own, and what happens at fork.
//!
//! The rule (docs/design.md, "Threads"): **a single-threaded process stays
//! single-threaded.** The shim's thread (idle purging and the control
//! socket, see `supervisor.rs`) starts only when the process creates its own
//! second thread, which we notice in our exported `pthread_create`. It stops
//! again once the process has been alone for a while, and at once if the
//! process forks while alone (so CPython's "multi-threaded fork" warning and
//! `unshare(CLONE_NEWUSER)` behave as without the shim).
//! `MEMSHIM_CONTROL=on` starts it in the constructor and keeps it;
//! `MEMSHIM_CONTROL=off` never starts it.
//!
//! After `fork`, the child handler only resets atomics and closes inherited
//! descriptors (all async-signal-safe); the child starts its own thread by
//! the same rule, at its own first `pthread_create`. `vfork`/`posix_spawn`
//! children run no fork handlers and fail the `getpid()` check, so they never
//! start anything.

use crate::options::{self, Control};
use crate::{control, supervisor, sys};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering::*};

/// State of the shim's thread.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum ThreadState {
    /// No thread.
    Idle = 0,
    /// Being created by `arm`.
    Starting = 1,
    /// Running its loop.
    Running = 2,
    /// Cleaning up before it exits.
    Stopping = 3,
}

static THREAD: AtomicU8 = AtomicU8::new(ThreadState::Idle as u8);
/// The process created a thread since the shim's thread last looked.
pub(crate) static WANTED: AtomicBool = AtomicBool::new(false);
/// A fork handler asks the thread to stop now.
pub(crate) static STOP: AtomicBool = AtomicBool::new(false);
/// pthread_t of the last thread we started (joinable), 0 if none.
pub(crate) static HANDLE: AtomicUsize = AtomicUsize::new(0);
/// getpid() of the process this state belongs to.
static PID: AtomicI32 = AtomicI32::new(0);
static CTOR_DONE: AtomicBool = AtomicBool::new(false);
/// `pthread_create` was called before our constructor ran.
static PENDING: AtomicBool = AtomicBool::new(false);
/// Our `malloc` is the one the process uses (not dlopen'ed, not shadowed
/// by an executable with its own malloc, not under a sanitizer).
static INTERPOSED: AtomicBool = AtomicBool::new(false);
/// This process is a fork child of a shimmed process.
static FORK_CHILD: AtomicBool = AtomicBool::new(false);
/// Monotonic ms at constructor (or fork) time, for the uptime figure.
static START_MS: AtomicU64 = AtomicU64::new(0);
/// How many times the thread was started in this process.
static STARTS: AtomicU64 = AtomicU64::new(0);

/// Current state of the shim's thread.
pub fn thread_state() -> ThreadState {
    match THREAD.load(Acquire) {
        1 => ThreadState::Starting,
        2 => ThreadState::Running,
        3 => ThreadState::Stopping,
        _ => ThreadState::Idle,
    }
}

pub(crate) fn set_thread_state(s: ThreadState) {
    THREAD.store(s as u8, Release);
}

pub(crate) fn cas_thread_state(from: ThreadState, to: ThreadState) -> bool {
    THREAD
        .compare_exchange(from as u8, to as u8, AcqRel, Acquire)
        .is_ok()
}

/// Whether this process really routes `malloc` to the shim.
pub fn interposed() -> bool {
    INTERPOSED.load(Relaxed)
}

/// Whether this process is a fork child of a shimmed process.
pub fn is_fork_child() -> bool {
    FORK_CHILD.load(Relaxed)
}

/// Milliseconds since the constructor (or, in a fork child, the fork).
pub fn uptime_ms() -> u64 {
    sys::monotonic_ms().saturating_sub(START_MS.load(Relaxed))
}

/// How many times this process started the shim's thread.
pub fn thread_starts() -> u64 {
    STARTS.load(Relaxed)
}

/// May this process start the shim's thread at all?
fn eligible() -> bool {
    CTOR_DONE.load(Acquire)
        && INTERPOSED.load(Relaxed)
        && options::control() != Control::Off
        && PID.load(Relaxed) == sys::getpid()
}

/// Starts the shim's thread if it is not running. Called from our
/// `pthread_create` after the application's thread exists, and from the
/// constructor for `MEMSHIM_CONTROL=on`.
fn arm() {
    WANTED.store(true, Release);
    if !cas_thread_state(ThreadState::Idle, ThreadState::Starting) {
        return; // running, or being started/stopped by someone who will look at WANTED
    }
    // Reap the previous thread, which has left its loop (state was Idle).
    let old = HANDLE.swap(0, AcqRel);
    if old != 0 {
        // SAFETY: `old` is a joinable thread we created and nobody else joins.
        unsafe { libc::pthread_join(old as libc::pthread_t, core::ptr::null_mut()) };
    }
    match supervisor::spawn() {
        Some(t) => {
            HANDLE.store(t as usize, Release);
            STARTS.fetch_add(1, Relaxed);
        }
        None => set_thread_state(ThreadState::Idle),
    }
}

/// Called by our `pthread_create` after the application created a thread.
fn app_thread_created() {
    if !CTOR_DONE.load(Acquire) {
        PENDING.store(true, Relaxed);
        return;
    }
    if eligible() {
        arm();
    }
}

type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;

static REAL_PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);

/// glibc's `pthread_create`, found with `dlsym(RTLD_NEXT)` (ours is first in
/// the search order). Resolved in the constructor, or on first use if a
/// library constructor creates a thread before ours runs.
pub(crate) fn real_pthread_create() -> Option<PthreadCreate> {
    let mut p = REAL_PTHREAD_CREATE.load(Acquire);
    if p == 0 {
        // SAFETY: dlsym with a static C string; RTLD_NEXT relative to us.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) } as usize;
        REAL_PTHREAD_CREATE.store(p, Release);
    }
    // SAFETY: a non-null result of dlsym("pthread_create") has this type.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, PthreadCreate>(p) })
}

/// Exported `pthread_create`: creates the application's thread exactly as
/// glibc does, then (if this is the process's first) starts the shim's.
///
/// # Safety
/// The C contract of `pthread_create`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    let Some(real) = real_pthread_create() else {
        return libc::EAGAIN;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { real(thread, attr, start, arg) };
    if rc == 0 {
        let e = sys::errno();
        app_thread_created();
        sys::set_errno(e);
    }
    rc
}

// --- fork ------------------------------------------------------------------

/// Before fork: if the process is alone but for the shim's thread, stop it
/// so the child is copied from a single-threaded parent and callers that
/// count threads (CPython's fork warning) see what they would without us.
extern "C" fn prepare_fork() {
    stop_if_alone_but_for_us();
    // Raised after the stop above: a thread that is starting or stopping
    // must still be able to create and close its descriptors; once the
    // fence is up it cannot, and it could miss the wake-up.
    crate::fork_fence::before_fork();
}

fn stop_if_alone_but_for_us() {
    if options::control() != Control::Auto
        || !matches!(thread_state(), ThreadState::Running | ThreadState::Starting)
    {
        return;
    }
    if sys::num_threads() != Some(2) {
        return;
    }
    let e = sys::errno();
    // A process that creates, joins and forks at once (CPython:
    // `t.start(); t.join(); os.fork()`) can fork while our thread is still
    // on its way into its loop. It gets there within microseconds; wait for
    // it (bounded) so it is stopped like a running one.
    wait_while_starting();
    if thread_state() == ThreadState::Running {
        supervisor::stop_for_fork();
    }
    sys::set_errno(e);
}

/// In the parent after fork.
extern "C" fn parent_after_fork() {
    crate::fork_fence::after_fork_parent();
}

/// Longest wait in the fork prepare handler for a starting thread.
const FORK_START_WAIT_MS: u64 = 200;

fn wait_while_starting() {
    let deadline = sys::monotonic_ms() + FORK_START_WAIT_MS;
    while thread_state() == ThreadState::Starting && sys::monotonic_ms() < deadline {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000,
        };
        // SAFETY: sleeping on a local timespec.
        unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
    }
}

/// In the child: the shim's thread does not exist here. Reset state and
/// close inherited descriptors. Only async-signal-safe work.
extern "C" fn child_after_fork() {
    crate::fork_fence::after_fork_child();
    PID.store(sys::getpid(), Relaxed);
    FORK_CHILD.store(true, Relaxed);
    START_MS.store(sys::monotonic_ms(), Relaxed);
    STARTS.store(0, Relaxed);
    HANDLE.store(0, Relaxed);
    STOP.store(false, Relaxed);
    WANTED.store(false, Relaxed);
    PENDING.store(false, Relaxed);
    set_thread_state(ThreadState::Idle);
    supervisor::after_fork_child();
    control::after_fork_child();
    crate::python::after_fork_child();
}

// --- constructor and destructor ---------------------------------------------

/// Detects whether our `malloc` is the process's `malloc`, and whether a
/// sanitizer (which must own malloc) is present.
fn detect_interposition() -> bool {
    // SAFETY: dlsym with static C strings; RTLD_DEFAULT is the global scope.
    unsafe {
        // Compare the *object* that defines the global `malloc` with ours.
        // Comparing with `interpose::malloc as *const _` does not work: that
        // address is taken through our GOT, which the loader binds to the
        // global definition too, so the test always passed (an executable
        // with its own malloc, or a dlopen'ed shim, read as interposed).
        let global = libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
        if global.is_null() || !defined_in_this_library(global) {
            return false;
        }
        for sym in [
            c"__asan_init",
            c"__tsan_init",
            c"__msan_init",
            c"__hwasan_init",
        ] {
            if !libc::dlsym(libc::RTLD_DEFAULT, sym.as_ptr()).is_null() {
                return false;
            }
        }
    }
    true
}

/// Whether `addr` lies in this shared object (compared by load base;
/// `INTERPOSED` is a local static, so its address is never interposed).
fn defined_in_this_library(addr: *const c_void) -> bool {
    // SAFETY: dladdr only reads the loader's tables into the Dl_info we pass;
    // Dl_info is plain data, valid when zeroed.
    unsafe {
        let mut theirs: libc::Dl_info = core::mem::zeroed();
        let mut ours: libc::Dl_info = core::mem::zeroed();
        let here = (&raw const INTERPOSED).cast::<c_void>();
        libc::dladdr(addr, &mut theirs) != 0
            && libc::dladdr(here, &mut ours) != 0
            && !ours.dli_fbase.is_null()
            && theirs.dli_fbase == ours.dli_fbase
    }
}

fn glibc_is_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: returns a static NUL-terminated string such as "2.36".
    let v = unsafe { core::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) }.to_bytes();
    let mut it = v.split(|&b| b == b'.');
    let ma = it.next().and_then(sys::parse_u64).unwrap_or(0);
    let mi = it.next().and_then(sys::parse_u64).unwrap_or(0);
    (ma, mi) >= (u64::from(major), u64::from(minor))
}

extern "C" fn constructor() {
    let e = sys::errno();
    // jemalloc is normally initialised already (the loader's first malloc);
    // this forces it otherwise, so its fork handlers are registered before
    // ours: glibc runs prepare handlers in reverse order, so ours runs first
    // (while jemalloc is unlocked) and our child handler runs last.
    let _ = crate::jemalloc::version();
    options::load();
    options::warn_unknown();
    PID.store(sys::getpid(), Relaxed);
    START_MS.store(sys::monotonic_ms(), Relaxed);
    crate::interpose::ALIGNED_ALLOC_STRICT.store(glibc_is_at_least(2, 38), Relaxed);
    INTERPOSED.store(detect_interposition(), Relaxed);
    let _ = real_pthread_create();
    crate::dlopen::init();
    // SAFETY: registering plain extern "C" functions.
    unsafe {
        libc::pthread_atfork(
            Some(prepare_fork),
            Some(parent_after_fork),
            Some(child_after_fork),
        )
    };
    CTOR_DONE.store(true, Release);
    if options::verbose() {
        crate::report::print_verbose();
    }
    // A library constructor that created a thread before ours ran went
    // through our pthread_create and left PENDING set.
    let already_threaded = PENDING.load(Relaxed);
    match options::control() {
        Control::On => arm(),
        Control::Auto if already_threaded => arm(),
        _ => {}
    }
    sys::set_errno(e);
}

extern "C" fn destructor() {
    control::at_exit();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".fini_array")]
static DESTRUCTOR: extern "C" fn() = destructor;
