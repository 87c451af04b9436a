//! The attached bridge's fork hooks in CPython: `os.register_at_fork`'s
//! `before` and `after_in_parent`, which tell the thread layer
//! (thread/attached.rs) that a fork is `os.fork()`'s, and when CPython has
//! counted its threads after it.
//!
//! When it counts them moved: 3.12 counts before the `after_in_parent`
//! hooks; 3.13.0 and later 3.13 and 3.14.0 releases count after them (the
//! count moved behind `PyOS_AfterFork_Parent` for the free-threaded build's
//! stop-the-world, and back before it in later patch releases: CPython
//! gh-137109). A thread started in the hook was counted there, and the
//! process printed "This process is multi-threaded" on stderr. So the hook
//! does not run the thread layer's work itself: it schedules it with
//! `Py_AddPendingCall`, which runs it on the main thread at its next check
//! between bytecodes, once `os.fork()` has returned (a call of a C function
//! ends with that check). Where the call cannot be scheduled (a full queue),
//! the hook runs the work at once, as before.

use super::ffi::{METH_NOARGS, PyMethodDef, PyObject};
use super::object::Py;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// The hooks are registered with the interpreter.
static HOOKED: AtomicBool = AtomicBool::new(false);
touched_at_start! {
    /// CPython's `before` hook ran: the fork under way is `os.fork()`'s.
    static IN_OS_FORK: AtomicBool = AtomicBool::new(false);
}
/// What `after_in_parent` calls (a `fn()`; 0 for nothing): set once by the
/// thread layer.
static PARENT_WORK: AtomicUsize = AtomicUsize::new(0);

/// The thread layer's work after `os.fork()` in the parent.
pub fn on_after_in_parent(f: fn()) {
    PARENT_WORK.store(f as usize, SeqCst);
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
    none()
}

unsafe extern "C" fn after_in_parent(_self: *mut PyObject, _args: *mut PyObject) -> *mut PyObject {
    IN_OS_FORK.store(false, SeqCst);
    let scheduled = super::ffi::resolved()
        .and_then(|api| api.add_pending_call)
        // SAFETY: a hook runs with the GIL held; the callback is static and
        // takes no argument.
        .is_some_and(|add| unsafe { add(parent_work_pending, core::ptr::null_mut()) } == 0);
    if !scheduled {
        parent_work();
    }
    none()
}

/// The thread layer's work, from `Py_AddPendingCall`: after `os.fork()` has
/// returned and CPython has counted its threads, whatever its version.
unsafe extern "C" fn parent_work_pending(_: *mut c_void) -> c_int {
    parent_work();
    0
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
