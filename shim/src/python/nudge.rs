//! Making a busy main thread notice our pending call (CPython 3.9-3.12).
//!
//! In 3.9-3.12, `Py_AddPendingCall` from a thread other than the main one
//! records the call but does not raise the main thread's "eval breaker"
//! flag: that flag is computed on the calling thread, which is not allowed
//! to run pending calls. The main thread recomputes it each time it takes
//! the GIL. A main thread that keeps the GIL (a pure-Python loop, no other
//! thread asking for the GIL) would therefore never run the call; 3.8 and
//! 3.13 raise the flag directly and need nothing.
//!
//! The nudge: a short-lived thread, `memshim-py`, asks for the GIL
//! (`PyGILState_Ensure`) and gives it straight back. Asking makes the
//! interpreter request a switch after its switch interval (5 ms), the main
//! thread hands the GIL over, takes it back, recomputes the flag and runs
//! the pending call. The helper runs no Python code and calls nothing
//! else: no object, no `threading` entry, no finalizer is touched. It is
//! its own thread, not the shim's, because `PyGILState_Ensure` has no time
//! limit: if a C call holds the GIL, the helper waits, the shim's thread
//! does not (the request is answered "busy" and withdrawn meanwhile).
//!
//! At most one helper exists at a time. It counts as a call in flight for
//! the exit gate (`gate.rs`), and it is only started once the gate's hook
//! is registered through the `atexit` module: that hook runs before the
//! runtime is marked finalizing and releases the GIL while it waits, so a
//! helper queued for the GIL always finishes before shutdown. A helper that
//! still waited once the runtime is finalizing would be ended by CPython
//! with `pthread_exit`, and that forced unwind aborts the process when it
//! crosses a frame of this `panic = "abort"` library (the exit test caught
//! exactly that on 3.12 with the C-level hook, which runs too late). So a
//! 3.9-3.12 program that never imports `atexit` gets no nudge: a request
//! to its spinning main thread answers "busy" (docs/python.md).

use super::ffi::{self, Api};
use super::gate;
use crate::sys;
use core::ffi::c_void;
use core::sync::atomic::{AtomicI32, Ordering::SeqCst};

/// pid of the process whose helper is running, 0 if none. (A fork child
/// inherits the word but not the thread: the pid tells them apart.)
static ACTIVE: AtomicI32 = AtomicI32::new(0);

const STACK: usize = 64 * 1024;

/// Whether this CPython needs the nudge.
pub fn needed(version: (u32, u32)) -> bool {
    ((3, 9)..=(3, 12)).contains(&version)
}

/// Starts a helper unless one is running. Shim's thread only.
pub fn poke(_api: &'static Api) {
    let pid = sys::getpid();
    let cur = ACTIVE.load(SeqCst);
    if cur == pid || ACTIVE.compare_exchange(cur, pid, SeqCst, SeqCst).is_err() {
        return;
    }
    if !gate::nudge_allowed() || !gate::enter() {
        ACTIVE.store(0, SeqCst);
        return;
    }
    if !spawn() {
        gate::leave();
        ACTIVE.store(0, SeqCst);
    }
}

fn spawn() -> bool {
    let Some(create) = crate::lifecycle::real_pthread_create() else {
        return false;
    };
    let entry: extern "C" fn(*mut c_void) -> *mut c_void = helper;
    // SAFETY: standard pthread attribute and signal-mask calls on locals;
    // the thread is detached (nobody joins it) and starts with every
    // signal blocked, so the host's handlers never run on it.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return false;
        }
        libc::pthread_attr_setstacksize(&mut attr, STACK);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut t: libc::pthread_t = 0;
        let rc = create(&mut t, &attr, entry, core::ptr::null_mut());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        rc == 0
    }
}

/// The helper thread.
extern "C" fn helper(_: *mut c_void) -> *mut c_void {
    // SAFETY: naming the calling thread with a static C string.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"memshim-py".as_ptr()) };
    if let Some(api) = ffi::resolved()
        && api.usable().is_ok()
    {
        // SAFETY: the interpreter is initialised and not finalising (checked
        // just above; the atexit hook holds shutdown back until we leave,
        // releasing the GIL for us); the state is released at once on this
        // thread.
        unsafe {
            let st = (api.gil_ensure)();
            (api.gil_release)(st);
        }
    }
    ACTIVE.store(0, SeqCst);
    gate::leave();
    core::ptr::null_mut()
}
