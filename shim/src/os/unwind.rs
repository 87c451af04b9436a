//! std's unwinder without a `libgcc_s.so.1` dependency.
//!
//! std imports ten `_Unwind_*` functions. `unwind.c` defines them, hidden,
//! as jumps to the functions of the same name in the `libgcc_s.so.1` glibc
//! loads for `pthread_exit` and cancellation, loaded on first use; so no
//! exec pays for that library's constructor (its `cpuid`s trap to the
//! hypervisor in a VM), and a process never holds a second unwinder.
//!
//! With `panic = "abort"` the callers are std's backtraces, a forced
//! unwind that crosses std's frames, and jemalloc's heap profiler, which
//! takes a backtrace inside an allocation. `_Unwind_Backtrace` is the one
//! forwarder that never loads the library itself (an empty backtrace
//! until it is loaded): the profiler's switch (`profile.rs`) calls [`load`]
//! on the shim's thread before sampling starts. A forced unwind is driven by
//! glibc's `libgcc_s.so.1`, which glibc loads for it, on the exiting thread,
//! if nothing has yet. The shim's threads that run the application's code,
//! the Python bridge's job threads, may be ended that way (CPython's
//! `pthread_exit` during finalization): [`load`] is called before starting
//! one, so that library is loaded on the shim's thread, before the job, as
//! it was when the shim depended on it.

use core::ffi::c_int;

unsafe extern "C" {
    fn memshim_unwind_load() -> c_int;
    fn memshim_unwind_warm_up();
    fn memshim_unwind_fork_prepare(max_spins: core::ffi::c_uint);
    fn memshim_unwind_fork_done(child: c_int);
    fn memshim_unwind_frames(
        ip: *mut usize,
        cfa: *mut usize,
        max: core::ffi::c_uint,
    ) -> core::ffi::c_uint;
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

/// Takes one backtrace of this thread (after [`load`]), so that libgcc
/// sets up what it keeps for unwinding here, on the shim's thread, and not
/// inside the first sampled allocation.
/// (Not std's `Backtrace`: it imports `_Unwind_GetCFA` and
/// `_Unwind_FindEnclosingFunction`, which would bring `libgcc_s.so.1` back
/// as a dependency.)
pub fn warm_up() {
    // SAFETY: unwind.c's function walks this thread's stack through the
    // forwarder (an empty walk if libgcc_s is not loaded).
    unsafe { memshim_unwind_warm_up() }
}

/// This thread's return addresses, innermost first, into `ip`, and the
/// canonical frame address of each frame's context into `cfa` (libgcc's:
/// that of the frame it called, so frame i's own stack lies between
/// `cfa[i]` and `cfa[i + 1]`); how many. Empty until [`load`]. For
/// the sampled allocation's stack (no lock, no allocation: libgcc's walk,
/// as jemalloc's own backtrace).
pub fn frames(ip: &mut [usize], cfa: &mut [usize]) -> usize {
    let max = ip.len().min(cfa.len()) as core::ffi::c_uint;
    // SAFETY: both buffers hold at least `max` entries.
    unsafe { memshim_unwind_frames(ip.as_mut_ptr(), cfa.as_mut_ptr(), max) as usize }
}

/// Fork prepare handler, while jemalloc's profiler is ready: no backtrace
/// starts, and those under way (sampled allocations of other threads) end
/// first, at most about a thousand yields (unwind.c says why).
/// Async-signal-safe (atomics and `sched_yield`).
pub fn fork_prepare() {
    // SAFETY: atomics and sched_yield in unwind.c.
    unsafe { memshim_unwind_fork_prepare(1000) }
}

/// Fork parent and child handlers: backtraces again. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn fork_done(child: bool) {
    // SAFETY: atomic stores in unwind.c.
    unsafe { memshim_unwind_fork_done(c_int::from(child)) }
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
        // `_Unwind_Backtrace` never loads the library itself (jemalloc's
        // profiler calls it inside allocations): before `load`, an empty
        // backtrace, and still nothing loaded.
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        assert!(
            !bt.contains("backtraces_go_through_the_forwarders_to_libgcc_s"),
            "{bt}"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { super::memshim_unwind_ready() }, 0);
        assert!(super::load());
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        assert!(
            bt.contains("backtraces_go_through_the_forwarders_to_libgcc_s"),
            "{bt}"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { super::memshim_unwind_ready() }, 1);
    }
}
