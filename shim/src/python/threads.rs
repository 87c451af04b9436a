//! The interpreter's threads as the bridge sees them, without the
//! `threading` module's locks (a job must never take them: on 3.8 and
//! 3.9.0-3.9.5 `threading.active_count()` can deadlock on
//! `_active_limbo_lock`). Job thread, GIL held.

use super::object::Py;

/// Thread states of the main interpreter, not counting the job thread's own
/// (the figure `stats` reports as `python.threads`).
pub fn count(py: &Py) -> u64 {
    let api = py.api();
    let mut n: u64 = 0;
    // SAFETY: GIL held, which keeps the thread-state list stable (in a
    // free-threaded build the list is guarded by the runtime's lock these
    // functions take); they only walk that list.
    unsafe {
        let mut t = (api.interp_thread_head)((api.interp_main)());
        while !t.is_null() && n < 1_000_000 {
            n += 1;
            t = (api.thread_next)(t);
        }
    }
    n.saturating_sub(1)
}

/// If code that a job ran (a finalizer during `gc`, say) called
/// `threading.current_thread()` on the job thread, `threading` registered a
/// `_DummyThread` for it in `threading._active`, where it would stay after
/// the thread has gone (3.8-3.12; 3.13 removes it itself when the thread
/// state is cleared) and show in `threading.enumerate()`. Remove it, with a
/// plain dict operation under the GIL (no lock of `threading`'s).
pub fn forget_dummy(py: &Py) {
    let Some(threading) = py.imported(c"threading") else {
        return;
    };
    let (Ok(active), Ok(dummy_class)) = (
        py.attr(&threading, c"_active"),
        py.attr(&threading, c"_DummyThread"),
    ) else {
        return;
    };
    let api = py.api();
    // SAFETY: GIL held; a plain call returning a new reference (or NULL
    // with an exception, which `adopt` clears).
    let Ok(ident) = (unsafe { py.adopt((api.long_from_ulong)((api.thread_ident)())) }) else {
        return;
    };
    let Ok(entry) = py.call_method(&active, c"get", &[ident.as_ptr()]) else {
        return;
    };
    // SAFETY: GIL held; both are live objects.
    let is_dummy = unsafe { (api.is_instance)(entry.as_ptr(), dummy_class.as_ptr()) };
    if is_dummy < 0 {
        let _ = py.take_error();
    } else if is_dummy == 1 && !api.none().is_null() {
        let _ = py.call_method(&active, c"pop", &[ident.as_ptr(), api.none()]);
    }
}
