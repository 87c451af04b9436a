//! The PEP 788 interpreter guard the job thread (`job.rs`) holds while it
//! runs a job on 3.15, and its release before a fork.

use super::ffi;
use super::version::LateAttach;
use core::ffi::c_void;
use core::sync::atomic::Ordering::SeqCst;

/// A PEP 788 interpreter guard on the main interpreter (3.15), or nothing
/// on versions without guards. Held for one job at most: a guard never
/// closed would keep the interpreter from finalizing for ever.
///
/// The guard itself is in [`GUARD`], so that a fork can give it up
/// ([`before_fork`]): a fork child inherits the interpreter's count of
/// guards but not our thread, and its `Py_FinalizeEx` would wait for ever
/// for the guard to be closed (seen: a `multiprocessing`-style child under
/// request fire on 3.15.2, parked in `_PyParkingLot_Park` at its exit).
pub struct Guard(bool);

touched_at_start! {
    /// The guard the job thread holds, null when none: closed by whoever takes
    /// it out first, the job thread when its job is done or [`before_fork`].
    static GUARD: core::sync::atomic::AtomicPtr<c_void> =
        core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());
}

impl Guard {
    /// The guard (`Some(Guard(false))` where the version has none: `late`,
    /// how the served interpreter treats a late attach, is not `Guarded`),
    /// or `None` if finalization has begun or the interpreter is gone.
    pub fn take(api: &ffi::Api, late: LateAttach) -> Option<Guard> {
        if late != LateAttach::Guarded {
            return Some(Guard(false));
        }
        let (Some(from_main), Some(close_view), Some(from_view)) =
            (api.view_from_main, api.view_close, api.guard_from_view)
        else {
            return None;
        };
        // SAFETY: PEP 788's functions need no thread state; a view is
        // closed once the guard is taken (or not), a guard by `close`.
        let g = unsafe {
            let view = from_main();
            if view.is_null() {
                return None;
            }
            let g = from_view(view);
            close_view(view);
            g
        };
        if g.is_null() {
            return None;
        }
        GUARD.store(g, SeqCst);
        Some(Guard(true))
    }

    /// Closes the guard (unless a fork closed it first): finalization may
    /// begin.
    pub fn close(self) {
        if self.0 {
            close_guard();
        }
    }
}

/// Closes the guard in [`GUARD`], if one is there. Reads before it swaps:
/// a swap writes even when it finds null, and every fork comes here, so a
/// process that never held a guard would otherwise write this page of
/// statics in every fork, a copy-on-write fault each (os/fence.rs). A guard
/// stored after the read is one stored after the swap would have been.
fn close_guard() {
    if GUARD.load(SeqCst).is_null() {
        return;
    }
    let g = GUARD.swap(core::ptr::null_mut(), SeqCst);
    if g.is_null() {
        return;
    }
    if let Some(close) = ffi::resolved().and_then(|a| a.guard_close) {
        // SAFETY: a guard from `Guard::take`, taken out of GUARD once, so
        // closed exactly once.
        unsafe { close(g) };
    }
}

/// Fork prepare handler (the forking thread, before the copy): the job
/// thread's guard is closed here, so that the child's count of guards
/// holds none of ours. The job thread then goes on without it: it is
/// waiting for the GIL the forking thread holds (`os.fork()`), or running
/// its job; the exit gate, which waits for it before finalization, still
/// keeps it from attaching to a finalizing interpreter.
pub fn before_fork() {
    close_guard();
}
