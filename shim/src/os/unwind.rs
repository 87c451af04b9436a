//! std's unwinder without a `libgcc_s.so.1` dependency.
//!
//! std imports ten `_Unwind_*` functions. `unwind.c` defines them, hidden,
//! as jumps to the functions of the same name in the `libgcc_s.so.1` glibc
//! loads for `pthread_exit` and cancellation, loaded on first use; so no
//! exec pays for that library's constructor (its `cpuid`s trap to the
//! hypervisor in a VM), and a process never holds a second unwinder.
//!
//! With `panic = "abort"` the only callers are std's backtraces and a
//! forced unwind that crosses std's frames. A forced unwind is driven by
//! glibc's `libgcc_s.so.1`, which glibc loads for it, on the exiting thread,
//! if nothing has yet. The shim's threads that run the application's code,
//! the Python bridge's job threads, may be ended that way (CPython's
//! `pthread_exit` during finalization): [`load`] is called before starting
//! one, so that library is loaded on the shim's thread, before the job, as
//! it was when the shim depended on it.

use core::ffi::c_int;

unsafe extern "C" {
    fn memshim_unwind_load() -> c_int;
    #[cfg(test)]
    fn memshim_unwind_ready() -> c_int;
}

/// Loads `libgcc_s.so.1` (or finds it loaded) and resolves the forwarded
/// functions; false if it is missing. Takes the loader's lock and
/// allocates: not for the allocation path, fork handlers or the
/// constructor.
pub fn load() -> bool {
    // SAFETY: unwind.c's loader: dlmopen and dlsym, then atomic stores of
    // the addresses found; callable from any thread.
    unsafe { memshim_unwind_load() != 0 }
}

#[cfg(test)]
mod tests {
    /// The unit-test binary links unwind.c like the library, so std's
    /// backtrace runs through the forwarders: the first one loads
    /// libgcc_s.so.1, and `_Unwind_Backtrace` and `_Unwind_GetIPInfo` walk
    /// this very stack with its functions. (The only test in this binary
    /// that captures a backtrace or loads.)
    #[test]
    fn backtraces_go_through_the_forwarders_to_libgcc_s() {
        // SAFETY: reads an atomic.
        let before = unsafe { super::memshim_unwind_ready() };
        assert_eq!(
            before, 0,
            "the forwarders ran already: did another test panic?"
        );
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        assert!(
            bt.contains("backtraces_go_through_the_forwarders_to_libgcc_s"),
            "{bt}"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { super::memshim_unwind_ready() }, 1);
        assert!(super::load());
    }
}
