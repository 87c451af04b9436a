//! Threads of the shim's own, and what the shim's code may do on the
//! application's threads.
//!
//! * [`spawn`] creates a thread with glibc's `pthread_create` (not our
//!   exported one, so the thread rule never sees it) and every signal
//!   blocked: the application's handlers never run on it, and a signal
//!   meant for the program is never delivered to it.
//! * [`NoCancel`] keeps a pending deferred cancellation of the application's
//!   thread from acting inside code of ours (a fork handler, our
//!   `pthread_create`): glibc would unwind the thread through our frames,
//!   out of a call that is not a cancellation point.

use core::ffi::{CStr, c_int, c_void};
use core::sync::atomic::AtomicUsize;

/// The signature of `pthread_create`.
pub type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;

touched_at_start! {
    static REAL_PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);
}

/// glibc's `pthread_create`. Resolved by the constructor, or on first use if
/// a library constructor creates a thread before ours runs.
#[unsafe(link_section = ".text.startup")]
pub fn real_pthread_create() -> Option<PthreadCreate> {
    let p = super::dl::next_once(&REAL_PTHREAD_CREATE, c"pthread_create");
    // SAFETY: a non-null result of dlsym("pthread_create") has this type.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, PthreadCreate>(p) })
}

/// glibc's `pthread_exit`.
pub type PthreadExit = unsafe extern "C" fn(*mut c_void) -> !;

static REAL_PTHREAD_EXIT: AtomicUsize = AtomicUsize::new(0);

/// glibc's `pthread_exit`.
pub fn real_pthread_exit() -> Option<PthreadExit> {
    let p = super::dl::next_once(&REAL_PTHREAD_EXIT, c"pthread_exit");
    // SAFETY: a non-null result of dlsym("pthread_exit") has this type.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, PthreadExit>(p) })
}

/// Whether thread `tid` of this process has the calling thread's
/// capabilities (effective, permitted and inheritable sets; `capget`).
/// False if either cannot be read.
pub fn same_capabilities(tid: i32) -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, PartialEq, Eq, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two `Data`, for capabilities 0-31 and 32-63.
    const VERSION_3: u32 = 0x2008_0522;
    let get = |pid: i32| -> Option<[Data; 2]> {
        let mut h = Header {
            version: VERSION_3,
            pid,
        };
        let mut d = [Data::default(); 2];
        // SAFETY: capget with a valid header and room for version 3's two
        // data structs.
        let rc = unsafe { libc::syscall(libc::SYS_capget, &raw mut h, d.as_mut_ptr()) };
        (rc == 0).then_some(d)
    };
    let _e = super::KeepErrno::new();
    matches!((get(0), get(tid)), (Some(a), Some(b)) if a == b)
}

/// Where a new thread's stack comes from.
#[derive(Clone, Copy, Debug)]
pub enum Stack {
    /// The system's default (what a thread of the program would get).
    Default,
    /// This many bytes.
    Bytes(usize),
}

/// Creates a thread of the shim's with every signal blocked; `entry` gets
/// `arg` as its `void*`. Returns its handle (0 for a detached thread), or
/// `None`.
pub fn spawn(
    entry: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: usize,
    stack: Stack,
    detached: bool,
) -> Option<libc::pthread_t> {
    let create = real_pthread_create()?;
    let _e = super::KeepErrno::new();
    // SAFETY: standard pthread attribute and signal-mask calls on locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return None;
        }
        if let Stack::Bytes(size) = stack {
            libc::pthread_attr_setstacksize(&mut attr, size);
        }
        if detached {
            libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        }
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut t: libc::pthread_t = 0;
        let rc = create(&mut t, &attr, entry, arg as *mut c_void);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        (rc == 0).then_some(if detached { 0 } else { t })
    }
}

/// Waits for a joinable thread of ours to end. Never acts on a pending
/// cancellation of the caller.
pub fn join(t: libc::pthread_t) {
    let _nc = NoCancel::new();
    let _e = super::KeepErrno::new();
    // SAFETY: `t` is a joinable thread we created and nobody else joins.
    unsafe { libc::pthread_join(t, core::ptr::null_mut()) };
}

/// Gives up a joinable thread of ours that will never be joined (it ends
/// by itself, or never).
pub fn detach(t: libc::pthread_t) {
    // SAFETY: `t` is a joinable thread we created, neither joined nor
    // detached before (its handle was taken once by the caller).
    unsafe { libc::pthread_detach(t) };
}

// Not in the libc crate. glibc: PTHREAD_CANCEL_ENABLE 0, _DISABLE 1.
unsafe extern "C" {
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}
const PTHREAD_CANCEL_DISABLE: c_int = 1;

/// Disables cancellation of the calling thread while it lives, and
/// restores the previous state (a pending request then acts at the
/// thread's next cancellation point, as without the shim).
pub struct NoCancel(c_int);

impl NoCancel {
    /// Disables cancellation.
    pub fn new() -> NoCancel {
        let mut old = 0;
        // SAFETY: pthread_setcancelstate is not a cancellation point and
        // only writes `old`.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        NoCancel(old)
    }
}

impl Default for NoCancel {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        let mut ignored = 0;
        // SAFETY: as in `new`.
        unsafe { pthread_setcancelstate(self.0, &mut ignored) };
    }
}

/// Names the calling thread (as `ps -L` and `/proc/<pid>/task/*/comm` show it).
pub fn set_name(name: &CStr) {
    // SAFETY: naming the calling thread with a NUL-terminated name.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), name.as_ptr()) };
}

/// The calling thread's kernel id.
pub fn gettid() -> i32 {
    super::raw::gettid()
}

/// A fork handler, as `pthread_atfork` takes it.
pub type AtforkFn = Option<unsafe extern "C" fn()>;

unsafe extern "C" {
    /// What `pthread_atfork` calls: glibc's `pthread_atfork` is a stub in
    /// libc_nonshared.a (before 2.28, libpthread's) that adds the caller's
    /// `__dso_handle`. Called directly, the stub's code and its PLT entry,
    /// on pages of their own at the end of the library's code, are not
    /// faulted in by every exec (bench/FINDINGS-startup.md).
    fn __register_atfork(
        prepare: AtforkFn,
        parent: AtforkFn,
        child: AtforkFn,
        dso_handle: *mut c_void,
    ) -> c_int;
}

/// `pthread_atfork`: registers fork handlers; glibc's error number if it
/// refused. No DSO handle: with one, `__cxa_finalize` unregisters them when
/// the library is unloaded, and at exit after its destructors. Neither
/// library memshim builds is ever unloaded (`-z nodelete`, build.rs), and
/// a fork late in exit (an `atexit` handler's, another thread's) still
/// runs the shim's handlers, and through them jemalloc's fork functions,
/// so that its child finds jemalloc unlocked.
#[unsafe(link_section = ".text.startup")]
pub fn register_atfork(prepare: AtforkFn, parent: AtforkFn, child: AtforkFn) -> c_int {
    // SAFETY: the handlers are the caller's functions (or none).
    unsafe { __register_atfork(prepare, parent, child, core::ptr::null_mut()) }
}

/// Registers the shim's fork handlers; false if glibc refused.
#[unsafe(link_section = ".text.startup")]
pub fn atfork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) -> bool {
    register_atfork(Some(prepare), Some(parent), Some(child)) == 0
}

/// A thread-specific-data key whose destructor runs when a thread that set
/// a value ends, however it ends (a return, or `pthread_exit`).
#[derive(Clone, Copy)]
pub struct Key(libc::pthread_key_t);

impl Key {
    /// Creates a key with `dtor`.
    pub fn create(dtor: unsafe extern "C" fn(*mut c_void)) -> Option<Key> {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: creates a key with a plain extern "C" destructor.
        (unsafe { libc::pthread_key_create(&mut key, Some(dtor)) } == 0).then_some(Key(key))
    }

    /// The key as a number (to pass through a `void*`).
    pub fn as_raw(self) -> u32 {
        self.0
    }

    /// The key from [`Key::as_raw`].
    pub fn from_raw(raw: u32) -> Key {
        Key(raw)
    }

    /// Arms (a non-null value) or disarms (null) the destructor for the
    /// calling thread. Returns false if that failed.
    pub fn set(self, armed: bool) -> bool {
        let v = if armed {
            core::ptr::dangling::<c_void>()
        } else {
            core::ptr::null()
        };
        // SAFETY: setting this thread's value of a live key.
        unsafe { libc::pthread_setspecific(self.0, v) == 0 }
    }
}
