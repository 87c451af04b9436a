//! The exit gate (hazard 34): once the interpreter starts shutting down,
//! the shim's thread never calls into CPython again.
//!
//! The only CPython function the shim's thread calls that touches the
//! interpreter's state is `Py_AddPendingCall` (`mainthread.rs`). Called
//! while the interpreter is being freed, it would read freed memory. So the
//! shim's thread brackets that call with [`enter`]/[`leave`], and a hook
//! that CPython runs on the main thread during shutdown calls [`close`]:
//! it shuts the gate and waits until no call is in flight. After that
//! nothing on the shim's thread reaches CPython (requests answer
//! "finalizing").
//!
//! The hook is registered (from the main thread, in the first pending call
//! that runs) with whichever of these the process offers without importing
//! anything:
//!
//! 1. `atexit.register(hook)` if the program has imported `atexit`
//!    (anything that imports `logging`, `torch`, `multiprocessing`, ...):
//!    runs before the runtime is marked finalizing;
//! 2. otherwise the C-level `PyUnstable_AtExit` (3.13) / `_Py_AtExit`
//!    (3.12): runs while the interpreter is cleared, before it is freed.
//!
//! A 3.8-3.11 program that never imports `atexit` offers neither; there the
//! shim's thread relies on checking `Py_IsFinalizing()` just before each
//! call (docs/python.md, "Exit", names the narrow window that leaves), and
//! registration is retried on every request, so it takes effect as soon as
//! the program imports `atexit`.

use super::ffi::{self, METH_NOARGS, PyMethodDef, PyObject};
use super::object::Py;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering::SeqCst};

static CLOSED: AtomicBool = AtomicBool::new(false);
static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);
/// 0: no hook yet; 1: atexit module; 2: C-level interpreter hook.
static HOOK: AtomicU8 = AtomicU8::new(0);

/// How long the hook waits for calls in flight: `Py_AddPendingCall` takes
/// microseconds; a nudge helper needs the GIL, which the hook releases.
const CLOSE_WAIT_MS: u64 = 5000;

/// Shim's thread: may it call into CPython now? Pair with [`leave`].
pub fn enter() -> bool {
    IN_FLIGHT.fetch_add(1, SeqCst);
    if CLOSED.load(SeqCst) {
        IN_FLIGHT.fetch_sub(1, SeqCst);
        return false;
    }
    true
}

/// A fork child starts with nothing in flight (the threads that were are
/// not in it). Called on the shim's thread when it adopts the state.
pub fn after_fork() {
    IN_FLIGHT.store(0, SeqCst);
}

/// Whether a nudge helper (`nudge.rs`) may be started: only once the hook
/// is the `atexit` one, which runs before the runtime is marked finalizing
/// and lets a helper that waits for the GIL through. (A helper still
/// waiting once the runtime is finalizing would be ended by CPython with
/// `pthread_exit`, a forced unwind that aborts in a `panic = "abort"`
/// library.)
pub fn nudge_allowed() -> bool {
    HOOK.load(SeqCst) == 1 && !CLOSED.load(SeqCst)
}

/// Shim's thread: done with the call [`enter`] allowed.
pub fn leave() {
    IN_FLIGHT.fetch_sub(1, SeqCst);
}

/// Whether shutdown has begun (the gate is shut).
pub fn closed() -> bool {
    CLOSED.load(SeqCst)
}

/// Shuts the gate and waits (bounded) for the call in flight.
fn close() {
    CLOSED.store(true, SeqCst);
    let deadline = crate::sys::monotonic_ms() + CLOSE_WAIT_MS;
    while IN_FLIGHT.load(SeqCst) != 0 && crate::sys::monotonic_ms() < deadline {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000,
        };
        // SAFETY: sleeping on a local timespec.
        unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
    }
}

unsafe extern "C" fn atexit_hook(_self: *mut PyObject, _unused: *mut PyObject) -> *mut PyObject {
    let Some(api) = ffi::resolved() else {
        close();
        return core::ptr::null_mut();
    };
    if IN_FLIGHT.load(SeqCst) == 0 {
        close();
    } else {
        // A nudge helper may be queued for the GIL (nudge.rs): let it
        // through while we wait, as any blocking call in atexit would.
        // SAFETY: called by CPython on this thread with the GIL held; the
        // GIL is released and taken back on this thread around a wait
        // that runs no Python code.
        unsafe {
            let ts = (api.save_thread)();
            close();
            (api.restore_thread)(ts);
        }
    }
    // SAFETY: GIL held; a new reference (the result is ignored by atexit).
    unsafe { (api.long_from_i64)(0) }
}

extern "C" fn ll_hook(_: *mut c_void) {
    close();
}

static HOOK_DEF: PyMethodDef = PyMethodDef {
    ml_name: c"memshim_exit_gate".as_ptr(),
    ml_meth: Some(atexit_hook),
    ml_flags: METH_NOARGS,
    ml_doc: core::ptr::null(),
};

/// Main thread, GIL held: registers the hook if not done yet. Never
/// imports; failures are cleared and retried next time.
pub fn ensure_hook(py: &Py) {
    // The atexit hook is the better one (earlier, and it lets a nudge
    // helper through); a process that imports atexit after we settled for
    // the C-level hook gets it too (closing twice is harmless).
    if HOOK.load(SeqCst) == 1 {
        return;
    }
    let api = py.api();
    if let Some(atexit) = py.imported(c"atexit") {
        // SAFETY: GIL held; HOOK_DEF is static, so the function object may
        // outlive any stack frame; NULL self/module are allowed.
        let f = unsafe {
            (api.cfunction_new_ex)(&HOOK_DEF, core::ptr::null_mut(), core::ptr::null_mut())
        };
        // SAFETY: a new reference (or NULL with an exception), ours to give.
        let Ok(f) = (unsafe { py.adopt(f) }) else {
            return;
        };
        if py.call_method(&atexit, c"register", &[f.as_ptr()]).is_ok() {
            HOOK.store(1, SeqCst);
        }
        return;
    }
    if HOOK.load(SeqCst) == 0
        && let Some(at_exit) = api.at_exit
    {
        // SAFETY: GIL held as the function requires; the callback is a
        // plain function with no data.
        let rc = unsafe { at_exit((api.interp_main)(), ll_hook, core::ptr::null_mut()) };
        if rc == 0 {
            HOOK.store(2, SeqCst);
        } else {
            let _ = py.take_error();
        }
    }
}
