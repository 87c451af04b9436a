//! The exit gate: once the interpreter starts shutting down, no thread of
//! the shim starts a call into CPython, and the host's exit never waits
//! for one beyond a job that is already running.
//!
//! The job thread (`job.rs`) is the only thread of ours that enters
//! CPython, taking the GIL with a thread state of its own. That is safe while the runtime
//! is initialised, and it ends the thread with `pthread_exit` once the
//! runtime is finalizing (3.8-3.13); what it must never do is *begin* after
//! the interpreter's thread-state machinery has been torn down (late in
//! `Py_FinalizeEx`), where it would read freed memory. So a job thread
//! counts as "in flight" from just before it is spawned until it has
//! exited ([`enter`]; the exit is noticed by a thread-specific-data
//! destructor, which also runs when CPython ends the thread with
//! `pthread_exit`), and a hook that runs on the main thread during shutdown
//! calls [`close`]: it shuts the gate and waits until nothing is in flight.
//!
//! The hook is registered from the first job that runs, with the earliest
//! of these that the process offers:
//!
//! 1. `atexit.register(hook)` if the program imported `atexit` (anything
//!    that imports `logging`, `torch`, `multiprocessing`, ... does). Its
//!    functions run after the non-daemon threads have been joined and
//!    before the runtime is marked finalizing, with the GIL held; the hook
//!    releases the GIL while it waits, so a job thread queued for the GIL
//!    gets it, sees the gate shut and leaves (a job that already started
//!    finishes first, bounded by [`CLOSE_WAIT_MS`]).
//! 2. Otherwise the C-level `PyUnstable_AtExit` (3.13) / `_Py_AtExit`
//!    (3.12): runs while the interpreter is cleared, after the runtime is
//!    marked finalizing; a job thread still waiting for the GIL is ended by
//!    CPython within one switch interval, which the wait sees.
//! 3. A 3.8-3.11 program that did not import `atexit` offers neither:
//!    there the first job imports `atexit` (a builtin) and registers with
//!    it.
//!
//! Not `threading._register_atexit`: its functions run when the main
//! script has returned but *before* the non-daemon threads are joined, so
//! a server whose worker threads outlive the main script would have the
//! gate shut for the rest of its life. Until the first job has registered
//! a hook, a job thread relies on its `Py_IsFinalizing()` check just before
//! it creates its thread state (docs/python.md, "Shutdown", names the
//! window that leaves).

use super::ffi::{self, METH_NOARGS, PyMethodDef, PyObject};
use super::object::Py;
use crate::os;
use crate::os::ResetTo;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering::SeqCst};

static CLOSED: AtomicBool = AtomicBool::new(false);
static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);

const NO_HOOK: u8 = 0;
/// `atexit`: runs before the runtime is marked finalizing.
const EARLY_HOOK: u8 = 1;
/// `PyUnstable_AtExit` / `_Py_AtExit`: runs while the interpreter is cleared.
const LATE_HOOK: u8 = 2;
static HOOK: AtomicU8 = AtomicU8::new(NO_HOOK);

/// Longest the hook waits for a job thread in flight: one that waits for
/// the GIL leaves at once; one that is running a job finishes it.
pub const CLOSE_WAIT_MS: u64 = 5000;

/// Before a job thread is spawned: may one enter CPython now? Pair with
/// [`leave`] (called when the thread has exited).
pub fn enter() -> bool {
    IN_FLIGHT.fetch_add(1, SeqCst);
    if CLOSED.load(SeqCst) {
        IN_FLIGHT.fetch_sub(1, SeqCst);
        return false;
    }
    true
}

/// A job thread has exited (or was never started).
pub fn leave() {
    IN_FLIGHT.fetch_sub(1, SeqCst);
}

/// Whether shutdown has begun (the gate is shut).
pub fn closed() -> bool {
    CLOSED.load(SeqCst)
}

/// Fork child: the job thread is not in it, so nothing is in flight.
/// (The gate and the hook are the parent's and stay: the registration is
/// inherited by the child's interpreter.) Async-signal-safe.
pub fn after_fork_child() {
    IN_FLIGHT.reset_to(0);
}

/// Shuts the gate and waits (bounded) until nothing is in flight.
fn close() {
    CLOSED.store(true, SeqCst);
    os::time::wait_while(CLOSE_WAIT_MS, std::time::Duration::from_micros(100), || {
        IN_FLIGHT.load(SeqCst) != 0
    });
}

/// The early hook (`atexit`): main thread, GIL held, after the non-daemon
/// threads are joined and before finalization.
unsafe extern "C" fn early_hook(_self: *mut PyObject, _unused: *mut PyObject) -> *mut PyObject {
    let Some(api) = ffi::resolved() else {
        close();
        return core::ptr::null_mut();
    };
    if IN_FLIGHT.load(SeqCst) == 0 {
        close();
    } else {
        // A job thread may be queued for the GIL: let it through while we
        // wait, as any blocking call in an atexit function would.
        // SAFETY: called by CPython on this thread with the GIL held; the
        // GIL is released and taken back on this thread around a wait
        // that runs no Python code.
        unsafe {
            let ts = (api.save_thread)();
            close();
            (api.restore_thread)(ts);
        }
    }
    // SAFETY: GIL held; a new reference (the result is ignored).
    unsafe { (api.long_from_i64)(0) }
}

/// The late hook: main thread, while the interpreter is cleared.
extern "C" fn late_hook(_: *mut c_void) {
    close();
}

static HOOK_DEF: PyMethodDef = PyMethodDef {
    ml_name: c"memshim_exit_gate".as_ptr(),
    ml_meth: Some(early_hook),
    ml_flags: METH_NOARGS,
    ml_doc: core::ptr::null(),
};

/// Job thread, GIL held: registers the best hook the process offers, if
/// not done yet. Failures are cleared and retried next job.
///
/// The only module it may import is `atexit`, a builtin: a 3.8-3.11
/// program that did not import it offers no hook that runs before its
/// interpreter is torn down, and without one a job thread that asks for
/// the interpreter as it exits could find it freed (docs/python.md,
/// "Shutdown"). After the import, `'atexit'` is in `sys.modules`; nothing
/// else of the program changes.
pub fn ensure_hook(py: &Py) {
    if HOOK.load(SeqCst) == EARLY_HOOK {
        return;
    }
    // The early hook is the better one; a 3.12+ process that imports
    // `atexit` after we settled for the late hook gets it too (closing
    // twice is harmless).
    let api = py.api();
    let registrar = py
        .imported(c"atexit")
        .and_then(|m| py.attr(&m, c"register").ok())
        .or_else(|| {
            if api.at_exit.is_some() {
                return None; // 3.12+: the late hook below protects as well
            }
            // SAFETY: GIL held; a plain import of a builtin module, which
            // returns a new reference or NULL with an exception (cleared
            // by `adopt`).
            let m = unsafe {
                py.adopt((api.import_module_level)(
                    c"atexit".as_ptr(),
                    core::ptr::null_mut(),
                    core::ptr::null_mut(),
                    core::ptr::null_mut(),
                    0,
                ))
            }
            .ok()?;
            py.attr(&m, c"register").ok()
        });
    if let Some(register) = registrar {
        // SAFETY: GIL held; HOOK_DEF is static, so the function object may
        // outlive any stack frame; NULL self/module are allowed.
        let f = unsafe {
            (api.cfunction_new_ex)(&HOOK_DEF, core::ptr::null_mut(), core::ptr::null_mut())
        };
        // SAFETY: a new reference (or NULL with an exception), ours to give.
        if let Ok(f) = unsafe { py.adopt(f) }
            && py.call(&register, &[f.as_ptr()]).is_ok()
        {
            HOOK.store(EARLY_HOOK, SeqCst);
            return;
        }
    }
    if HOOK.load(SeqCst) == NO_HOOK
        && let Some(at_exit) = api.at_exit
    {
        // SAFETY: GIL held as the function requires; the callback is a
        // plain function with no data.
        let rc = unsafe { at_exit((api.interp_main)(), late_hook, core::ptr::null_mut()) };
        if rc == 0 {
            HOOK.store(LATE_HOOK, SeqCst);
        } else {
            let _ = py.take_error();
        }
    }
}
