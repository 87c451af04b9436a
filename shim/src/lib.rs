//! libmemshim.so: an `LD_PRELOAD` shim that sends every allocation of the
//! process to a statically linked jemalloc and gives idle memory back to the
//! OS by itself.
//!
//! Layers, each depending only on those below it (docs/design.md draws
//! them):
//!
//! * [`exports`]: every entry point from C, one line each: the malloc
//!   family (glibc's answers in [`alloc`]), glibc's control API
//!   ([`glibc_api`]), `pthread_create`, `unshare`, `setns`, `dlopen`
//!   ([`deepbind`]), jemalloc's configuration hook, the constructor.
//! * [`thread`]: when the shim may have a thread, the thread itself, fork.
//! * [`control`]: the per-process control endpoint the thread serves.
//! * [`python`]: the CPython / PyTorch bridge used by control requests;
//!   [`profile`]: jemalloc's heap profiler, switched by a control request.
//! * [`os`] (the only libc caller besides `exports` and `python::ffi`),
//!   [`jemalloc`] (the only `mallctl` caller), [`options`] (the `MEMSHIM_*`
//!   table), [`log`] (the warning line) and [`report`] (`MEMSHIM_VERBOSE`).
//!
//! Rules for the allocation path: no locks, no allocation, no formatting,
//! no Rust thread-locals, no panics (`panic = "abort"` in every profile).
//!
//! The same sources build libmemshim_bridge.so (`cfg(memshim_bridge)`, the
//! `bridge/` package), which `memshim-ctl attach` loads into a process
//! started without the preload: no allocator, no exports but a
//! constructor; [`bridge`] and its stand-in for [`jemalloc`] answer with
//! the process's own allocator (docs/design.md, "The attached bridge").

#![warn(missing_docs)]
// Unit tests build without the constructor and the exports (they would
// replace the test binary's own malloc), so what only they reach is unused there.
#![cfg_attr(test, allow(dead_code))]

/// Statics that every exec's constructor or every fork's handlers read or
/// write: all in one output section right after `.data` (shim/link.ld,
/// part 3), on the one page outside RELRO that the loader writes (the
/// section gathers the writable data it relocates). Anywhere else each
/// would be a page fault of its own in every exec (a `.bss` page read,
/// then written) and in every fork child (a copy-on-write page, or a
/// `.bss` page the parent never touched). Issue 48, item 1;
/// bench/FINDINGS-startup.md. A static that the constructor or a fork
/// handler comes to touch goes in here; one left out still works, and
/// costs a fault (`bench/startfaults.py` shows where).
macro_rules! touched_at_start {
    ($($(#[$m:meta])* $v:vis static $name:ident: $t:ty = $e:expr;)*) => {$(
        $(#[$m])*
        #[unsafe(link_section = ".data.memshim_touched")]
        $v static $name: $t = $e;
    )*};
}

#[cfg(not(memshim_bridge))]
pub mod alloc;
#[cfg(memshim_bridge)]
pub mod bridge;
pub mod control;
#[cfg(not(memshim_bridge))]
pub mod deepbind;
#[cfg(not(memshim_bridge))]
pub mod exports;
#[cfg(not(memshim_bridge))]
pub mod glibc_api;
#[cfg(not(memshim_bridge))]
pub mod jemalloc;
/// The bridge's stand-in for `jemalloc`: the same functions, answered by
/// the allocator the process already has.
#[cfg(memshim_bridge)]
pub use bridge::heap as jemalloc;
pub mod log;
pub mod options;
pub mod os;
pub mod profile;
pub mod python;
#[cfg(not(memshim_bridge))]
pub mod report;
pub mod thread;

/// The shim's own Rust allocations (control plane, formatting) go straight
/// to jemalloc instead of through the exported `malloc`.
#[cfg(not(memshim_bridge))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
// The bridge's go to the process's own `malloc` (std's default, `System`):
// it never replaces the allocator of a process whose heap already exists.
