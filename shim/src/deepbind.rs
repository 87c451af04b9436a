//! `RTLD_DEEPBIND` clearing: the state behind the exported `dlopen`
//! (`exports.rs`).
//!
//! A library opened with `dlopen(..., RTLD_DEEPBIND)` resolves `malloc` and
//! `free` in its own dependency scope first, which reaches glibc's allocator
//! while the rest of the process uses ours; the first pointer that crosses
//! over crashes the process. glibc 2.34 removed the malloc hooks that other
//! allocators used to redirect such libraries, so the shim exports `dlopen`
//! and clears the flag (`MEMSHIM_CLEAR_DEEPBIND=0` turns that off).
//!
//! The exported `dlopen` is a few instructions of assembly that end in a
//! tail jump to glibc's: glibc uses its caller's return address to pick the
//! calling object, whose `RUNPATH`/`RPATH` and namespace govern the search.
//! A wrapper written in Rust would make *us* the caller and silently change
//! which library a relative name finds. With a `jmp`, glibc sees the
//! original caller. Only x86_64 has the wrapper; elsewhere `dlopen` is not
//! interposed (docs/design.md, "Portability").

use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering::*};

touched_at_start! {
    /// 1 while clearing is enabled (read by the assembly; written by the
    /// constructor).
    pub(crate) static CLEAR: AtomicU8 = AtomicU8::new(1);
}
/// Number of `dlopen` calls whose `RTLD_DEEPBIND` was cleared (incremented
/// by the assembly).
pub(crate) static CLEARED: AtomicU64 = AtomicU64::new(0);
touched_at_start! {
    /// glibc's `dlopen`, once resolved (read by the assembly).
    pub(crate) static REAL: AtomicUsize = AtomicUsize::new(0);
}

/// Resolves glibc's `dlopen` (from the constructor, or from the assembly if
/// a library constructor calls `dlopen` before ours runs).
pub(crate) extern "C" fn resolve_real() -> usize {
    let mut p = REAL.load(Acquire);
    if p == 0 {
        p = crate::os::dl::next(c"dlopen");
        REAL.store(p, Release);
    }
    p
}

/// Constructor step: resolve glibc's dlopen and apply the setting.
#[unsafe(link_section = ".text.startup")]
pub fn init() {
    resolve_real();
    CLEAR.store(u8::from(crate::options::clear_deepbind()), Release);
}

/// How many `dlopen` calls had `RTLD_DEEPBIND` cleared so far.
pub fn cleared() -> u64 {
    CLEARED.load(Relaxed)
}
