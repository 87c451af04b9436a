//! The exit gate: once the interpreter starts shutting down, no thread of
//! the shim starts a call into CPython, and the host's exit never waits
//! for one beyond a job that is already running.
//!
//! The job thread (`job.rs`) is the only thread of ours that enters
//! CPython, taking the GIL with a thread state of its own. A thread that
//! asks for the GIL once the runtime is finalizing is ended (3.8 to
//! 3.13.7), blocked for ever (3.13.8 and later, 3.14) or, under a PEP 788
//! guard (3.15), never gets that far (`version.rs`). None of that may
//! happen to a job thread the exit then waits for, and no job may *begin*
//! once the interpreter's thread-state machinery is being torn down. So a
//! job thread counts as "in flight" from just before it is spawned until
//! it has exited ([`enter`]; the exit is noticed by a thread-specific-data
//! destructor, which also runs when CPython ends the thread with
//! `pthread_exit`), and a hook on the main thread, before
//! the runtime is marked finalizing, shuts the gate and waits until
//! nothing is in flight.
//!
//! The hook is a function registered with `atexit.register` by the first
//! job of each interpreter, on every version. `atexit`'s functions run
//! after the non-daemon threads have been joined and before the runtime is
//! marked finalizing, with the GIL held; the hook releases the GIL while it
//! waits, so a job thread queued for the GIL gets it, sees the gate shut
//! and leaves without running its job, and a job already running finishes
//! (bounded by [`CLOSE_WAIT_MS`]). Nothing it waits for can be parked or
//! ended: the runtime is not finalizing yet. A program that has not
//! imported `atexit` (a builtin module) gets it imported by that first
//! job; `'atexit'` in `sys.modules` is then the only trace the bridge
//! leaves. (The C-level `PyUnstable_AtExit`, used before for 3.12 and 3.13
//! programs without `atexit`, runs after the runtime is marked finalizing:
//! on 3.13.8+ the thread it waited for could be parked for ever, and the
//! exit waited the whole [`CLOSE_WAIT_MS`].)
//!
//! Not `threading._register_atexit`: its functions run when the main
//! script has returned but *before* the non-daemon threads are joined, so
//! a server whose worker threads outlive the main script would have the
//! gate shut for the rest of its life.
//!
//! With the hook, the first job also registers [`finalized`] with
//! `Py_AtExit`, which `Py_FinalizeEx` calls last, once the interpreter is
//! gone: it opens the gate again for the next `Py_Initialize` of an
//! embedder (whose first job registers a hook again) and forgets a job
//! thread CPython parked. Until the first job of an interpreter has
//! registered the hook, a job thread relies on its `Py_IsFinalizing()`
//! check just before it creates its thread state, and on 3.15 on the
//! guard (docs/python.md, "Shutdown", names the window that leaves).

use super::ffi::{self, METH_NOARGS, PyMethodDef, PyObject};
use super::object::Py;
use crate::os;
use crate::os::ResetTo;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

static CLOSED: AtomicBool = AtomicBool::new(false);
touched_at_start! {
    static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);
}
/// The `atexit` hook is registered with the current interpreter.
static HOOKED: AtomicBool = AtomicBool::new(false);
/// [`finalized`] is registered with the current runtime.
static FINALIZED_HOOKED: AtomicBool = AtomicBool::new(false);

/// How many interpreters have finalized in this process ([`finalized`]):
/// a job thread started under an earlier count, and still alive, was ended
/// or parked by CPython (`job.rs` writes it off).
static FINALIZED: AtomicU32 = AtomicU32::new(0);

/// The count of finalized interpreters (see [`FINALIZED`]).
pub fn generation() -> u32 {
    FINALIZED.load(SeqCst)
}

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
    // Saturating: `finalized` may have written off a parked thread that
    // then never leaves, or (3.8-3.13.7) one whose exit is still to come.
    let _ = IN_FLIGHT.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
}

/// Whether shutdown has begun (the gate is shut).
pub fn closed() -> bool {
    CLOSED.load(SeqCst)
}

/// Fork child: the job thread is not in it, so nothing is in flight.
/// (The gate and the hooks are the parent's and stay: the registrations
/// are inherited by the child's interpreter.) Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    IN_FLIGHT.reset_to(0);
}

/// A function of another layer told of shutdown ([`on_shutdown`]); 0: none.
static ON_SHUTDOWN: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Registers `f`: called with `true` by the hook when it shuts the gate,
/// and with `false` once the interpreter has finalized.
pub fn on_shutdown(f: fn(bool)) {
    ON_SHUTDOWN.store(f as usize, SeqCst);
}

fn tell_shutdown(closing: bool) {
    let f = ON_SHUTDOWN.load(SeqCst);
    if f != 0 {
        // SAFETY: only `on_shutdown` stores here, a `fn(bool)`.
        unsafe { core::mem::transmute::<usize, fn(bool)>(f)(closing) };
    }
}

/// The libpython the hooks were registered with (`ffi::library`).
static LIBRARY: AtomicU32 = AtomicU32::new(0);

/// Before a request: `library` is `ffi::library()`. If the process loaded
/// another libpython in place of the one the hooks were registered with,
/// nothing of ours is registered with its runtime: start afresh. Shim's
/// thread.
pub fn on_library(library: u32) {
    if LIBRARY.swap(library, SeqCst) != library {
        HOOKED.store(false, SeqCst);
        FINALIZED_HOOKED.store(false, SeqCst);
        CLOSED.store(false, SeqCst);
    }
}

/// Waits (bounded) until nothing is in flight.
fn wait_for_flights() {
    os::time::wait_while(CLOSE_WAIT_MS, std::time::Duration::from_micros(100), || {
        IN_FLIGHT.load(SeqCst) != 0
    });
}

/// The hook (`atexit`): main thread, GIL held, after the non-daemon
/// threads are joined and before finalization.
unsafe extern "C" fn hook(_self: *mut PyObject, _unused: *mut PyObject) -> *mut PyObject {
    // Shut before the GIL is let go below: a job thread queued for it
    // then finds the gate shut and leaves without running its job.
    CLOSED.store(true, SeqCst);
    tell_shutdown(true);
    let Some(api) = ffi::resolved() else {
        wait_for_flights();
        return core::ptr::null_mut();
    };
    if IN_FLIGHT.load(SeqCst) != 0 {
        // A job thread may be queued for the GIL: let it through while we
        // wait, as any blocking call in an atexit function would.
        // SAFETY: called by CPython on this thread with the GIL held; the
        // GIL is released and taken back on this thread around a wait
        // that runs no Python code.
        unsafe {
            let ts = (api.save_thread)();
            wait_for_flights();
            (api.restore_thread)(ts);
        }
    }
    // SAFETY: GIL held; a new reference (the result is ignored).
    unsafe { (api.long_from_i64)(0) }
}

/// `Py_AtExit`: the last step of `Py_FinalizeEx`, on the thread that
/// finalizes; the interpreter is gone, and "initialized" stays false until
/// a new `Py_Initialize`, so a job is refused by `Api::usable` until then.
/// A job thread still counted is one CPython ended (its destructor is on
/// its way) or parked for ever (3.13.8+, 3.14): it is written off, never
/// waited for (the count is cleared) or joined (the next request sees the
/// generation moved on: `job.rs`).
extern "C" fn finalized() {
    FINALIZED.fetch_add(1, SeqCst);
    IN_FLIGHT.store(0, SeqCst);
    HOOKED.store(false, SeqCst);
    FINALIZED_HOOKED.store(false, SeqCst);
    CLOSED.store(false, SeqCst);
    tell_shutdown(false);
}

static HOOK_DEF: PyMethodDef = PyMethodDef {
    ml_name: c"memshim_exit_gate".as_ptr(),
    ml_meth: Some(hook),
    ml_flags: METH_NOARGS,
    ml_doc: core::ptr::null(),
};

/// Job thread, GIL held: registers the hooks with this interpreter, if not
/// done yet. Failures are cleared and retried next job.
///
/// The only module it may import is `atexit`, a builtin, and only if the
/// program has not (module comment).
pub fn ensure_hook(py: &Py) {
    if HOOKED.load(SeqCst) {
        return;
    }
    let api = py.api();
    // A plain import of a builtin module (an exception is cleared by
    // `import`).
    let registrar = py
        .import(c"atexit")
        .ok()
        .and_then(|m| py.attr(&m, c"register").ok());
    let Some(register) = registrar else {
        return;
    };
    // SAFETY: GIL held; HOOK_DEF is static, so the function object may
    // outlive any stack frame; NULL self/module are allowed.
    let f =
        unsafe { (api.cfunction_new_ex)(&HOOK_DEF, core::ptr::null_mut(), core::ptr::null_mut()) };
    // SAFETY: a new reference (or NULL with an exception), ours to give.
    let Ok(f) = (unsafe { py.adopt(f) }) else {
        return;
    };
    if py.call(&register, &[f.as_ptr()]).is_err() {
        return;
    }
    HOOKED.store(true, SeqCst);
    // Py_AtExit fails only when 32 are registered already: then an
    // embedder's next `Py_Initialize` finds the gate shut (requests answer
    // "shutting down"), as before this hook existed.
    if !FINALIZED_HOOKED.load(SeqCst) {
        // SAFETY: GIL held (Py_AtExit itself needs none); `finalized` is a
        // plain function.
        if unsafe { (api.py_at_exit)(finalized) } == 0 {
            FINALIZED_HOOKED.store(true, SeqCst);
        }
    }
}
