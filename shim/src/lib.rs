//! libmemshim.so: an `LD_PRELOAD` shim that sends every allocation of the
//! process to a statically linked jemalloc and gives idle memory back to the
//! OS by itself.
//!
//! How it fits together (docs/design.md has the long version):
//!
//! * [`interpose`]: the exported malloc family, one forward per symbol.
//! * [`glibc_api`]: `malloc_trim`, `mallinfo2`, `malloc_stats`, ... on jemalloc.
//! * [`options`]: the `MEMSHIM_*` table, handed to jemalloc during its own
//!   initialisation (before `main`), without touching the allocation path.
//! * [`lifecycle`]: constructor, fork handlers, and the rule for when the
//!   shim may have a thread (never in a single-threaded process).
//! * [`supervisor`]: that thread: idle purging and the control socket.
//! * [`control`]: the per-process control endpoint.
//! * [`python`]: the CPython / PyTorch bridge used by control requests.
//! * [`dlopen`]: `RTLD_DEEPBIND` clearing.
//! * [`jemalloc`]: the only file that calls `mallctl`.
//! * [`sys`], [`log`]: allocation-free primitives and the warning line.
//!
//! Rules for the allocation path: no locks, no allocation, no formatting,
//! no Rust thread-locals, no panics (`panic = "abort"` in every profile).

#![warn(missing_docs)]
// Unit tests build without the constructor and the exports (they would
// replace the test binary's own malloc), so what only they reach is unused there.
#![cfg_attr(test, allow(dead_code))]

pub mod control;
pub mod dlopen;
pub mod fork_fence;
pub mod glibc_api;
pub mod interpose;
pub mod jemalloc;
pub mod lifecycle;
pub mod log;
pub mod options;
pub mod python;
pub mod report;
pub mod supervisor;
pub mod sys;

/// The shim's own Rust allocations (control plane, formatting) go straight
/// to jemalloc instead of through the exported `malloc`.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
