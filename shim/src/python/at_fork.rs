//! The attached bridge's fork hooks in CPython: `os.register_at_fork`'s
//! `before` and `after_in_parent`, which tell the thread layer
//! (thread/attached.rs) that a fork is `os.fork()`'s, and when CPython has
//! counted its threads after it.
//!
//! When it counts them moved: 3.12 counts before the `after_in_parent`
//! hooks; 3.13.0 and 3.14.0 count after them (the count moved behind
//! `PyOS_AfterFork_Parent` for the free-threaded build's stop-the-world, and
//! back before it in later patch releases: CPython gh-137109). A thread
//! started in the hook was counted there, and the process printed "This
//! process is multi-threaded" on stderr. So on 3.13 and 3.14 (every patch
//! release: the waiting costs nothing where the count comes first) the hook
//! does not run the thread layer's work itself: it schedules it with
//! `Py_AddPendingCall`, which the main thread runs at its next check between
//! bytecodes. That check may come inside a Python `after_in_parent` hook
//! registered after ours (`logging` registers one), still before the count;
//! so the call waits, scheduling itself again, until it runs in the frame
//! that called `os.fork()` (the `before` hook notes it), which it can only
//! do once `os.fork()` has returned, or until it has waited
//! [`WAIT_CHECKS`] times. Elsewhere (3.8 to 3.12, 3.15) the hook does the
//! work at once: 3.8 refuses pending calls once it is shutting down, with a
//! line on stderr, and a fork in an `atexit` handler would print it. Where
//! the call cannot be scheduled (a full queue), the work is done at once.

use super::ffi::{METH_NOARGS, PyMethodDef, PyObject};
use super::object::Py;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};

/// The hooks are registered with the interpreter.
static HOOKED: AtomicBool = AtomicBool::new(false);
touched_at_start! {
    /// CPython's `before` hook ran: the fork under way is `os.fork()`'s.
    static IN_OS_FORK: AtomicBool = AtomicBool::new(false);
}
/// What `after_in_parent` calls (a `fn()`; 0 for nothing), and whether
/// there is anything for it to do (a `fn() -> bool`): set once by the
/// thread layer.
static PARENT_WORK: AtomicUsize = AtomicUsize::new(0);
static WORK_OWED: AtomicUsize = AtomicUsize::new(0);
/// This interpreter counts its threads after the `after_in_parent` hooks
/// (3.13, 3.14): the work waits for `os.fork()` to return.
static DEFER: AtomicBool = AtomicBool::new(false);
/// The frame that called `os.fork()` (`PyEval_GetFrame` in the `before`
/// hook; compared, never dereferenced).
static FORK_FRAME: AtomicUsize = AtomicUsize::new(0);
/// How many times the pending call has scheduled itself again.
static WAITED: AtomicU32 = AtomicU32::new(0);
/// How many times the pending call waits at most for the forking frame
/// before it does the work anyway (a program whose `os.fork()` caller
/// returned before the main thread checked: the count is long done).
const WAIT_CHECKS: u32 = 10_000;

/// The thread layer's work after `os.fork()` in the parent (`work`), and
/// whether a fork left any (`owed`).
pub fn on_after_in_parent(work: fn(), owed: fn() -> bool) {
    PARENT_WORK.store(work as usize, SeqCst);
    WORK_OWED.store(owed as usize, SeqCst);
}

/// Whether the fork under way is `os.fork()`'s (its `before` hook ran).
pub fn in_os_fork() -> bool {
    IN_OS_FORK.load(SeqCst)
}

/// Fork child: no fork is under way there. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    IN_OS_FORK.store(false, SeqCst);
}

unsafe extern "C" fn before(_self: *mut PyObject, _args: *mut PyObject) -> *mut PyObject {
    IN_OS_FORK.store(true, SeqCst);
    if DEFER.load(SeqCst) {
        FORK_FRAME.store(current_frame(), SeqCst);
    }
    none()
}

unsafe extern "C" fn after_in_parent(_self: *mut PyObject, _args: *mut PyObject) -> *mut PyObject {
    IN_OS_FORK.store(false, SeqCst);
    if !DEFER.load(SeqCst) || !owed() {
        parent_work();
    } else {
        WAITED.store(0, SeqCst);
        if !schedule() {
            parent_work();
        }
    }
    none()
}

/// `Py_AddPendingCall(pending)`; false if it could not be scheduled.
fn schedule() -> bool {
    super::ffi::resolved()
        .and_then(|api| api.add_pending_call)
        // SAFETY: called with the GIL held (a hook, or a pending call); the
        // callback is static and takes no argument.
        .is_some_and(|add| unsafe { add(pending, core::ptr::null_mut()) } == 0)
}

/// The pending call: the work, once the main thread is back in the frame
/// that called `os.fork()` (so CPython has counted), else later.
unsafe extern "C" fn pending(_: *mut c_void) -> c_int {
    let back = current_frame() == FORK_FRAME.load(SeqCst);
    if back || WAITED.fetch_add(1, SeqCst) >= WAIT_CHECKS || !schedule() {
        parent_work();
    }
    0
}

/// The current thread's innermost Python frame, as an address (0: none,
/// or `PyEval_GetFrame` missing). GIL held.
fn current_frame() -> usize {
    super::ffi::resolved()
        .and_then(|api| api.eval_get_frame)
        // SAFETY: a borrowed reference (or NULL), read as an address only.
        .map_or(0, |get| unsafe { get() } as usize)
}

fn owed() -> bool {
    let f = WORK_OWED.load(SeqCst);
    // SAFETY: only `fn() -> bool` values are stored (`on_after_in_parent`).
    f != 0 && unsafe { core::mem::transmute::<usize, fn() -> bool>(f)() }
}

fn parent_work() {
    let f = PARENT_WORK.load(SeqCst);
    if f != 0 {
        // SAFETY: only `fn()` values are stored (`on_after_in_parent`).
        unsafe { core::mem::transmute::<usize, fn()>(f)() };
    }
}

/// A new reference to `None` (the hooks' result), or NULL with no
/// exception set if the interpreter has gone (which CPython reports as an
/// error of the hook, harmlessly ignored).
fn none() -> *mut PyObject {
    match super::ffi::resolved() {
        Some(api) => {
            let n = api.none();
            // SAFETY: a hook runs with the GIL held; `None` is immortal or
            // counted, and the caller takes the reference we add.
            unsafe { (api.inc_ref)(n) };
            n
        }
        None => core::ptr::null_mut(),
    }
}

static BEFORE: PyMethodDef = PyMethodDef {
    ml_name: c"memshim_bridge_before_fork".as_ptr(),
    ml_meth: Some(before),
    ml_flags: METH_NOARGS,
    ml_doc: core::ptr::null(),
};

static AFTER_IN_PARENT: PyMethodDef = PyMethodDef {
    ml_name: c"memshim_bridge_after_fork".as_ptr(),
    ml_meth: Some(after_in_parent),
    ml_flags: METH_NOARGS,
    ml_doc: core::ptr::null(),
};

/// Job thread, GIL held: `os.register_at_fork(before=..., after_in_parent=...)`
/// once (`os` only if the program imported it, as every CPython does at
/// start-up). Failures are cleared and retried at the next job.
pub fn ensure_hooks(py: &Py) {
    if HOOKED.load(SeqCst) {
        return;
    }
    let api = py.api();
    DEFER.store(
        matches!(super::version::parse(&api.version()), Some((3, 13 | 14, _))),
        SeqCst,
    );
    let Some(os) = py.imported(c"os") else {
        return;
    };
    let Ok(register) = py.attr(&os, c"register_at_fork") else {
        return;
    };
    // SAFETY: GIL held; the definitions are static, so the function objects
    // may live as long as the interpreter keeps them.
    let (b, a) = unsafe {
        (
            (api.cfunction_new_ex)(&BEFORE, core::ptr::null_mut(), core::ptr::null_mut()),
            (api.cfunction_new_ex)(
                &AFTER_IN_PARENT,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            ),
        )
    };
    // SAFETY: new references (or NULL with an exception), ours to give.
    let (Ok(b), Ok(a)) = (unsafe { py.adopt(b) }, unsafe { py.adopt(a) }) else {
        return;
    };
    if py
        .call_kw(
            &register,
            &[(c"before", b.as_ptr()), (c"after_in_parent", a.as_ptr())],
        )
        .is_ok()
    {
        HOOKED.store(true, SeqCst);
    }
}
