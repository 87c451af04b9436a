//! glibc's malloc control API, made to work on jemalloc (the exported
//! functions are in `exports.rs`).
//!
//! Programs and ML libraries call these directly (`malloc_trim(0)` after
//! unloading a model is folklore), so they must do something real, not just
//! link. Note: `ctypes.CDLL("libc.so.6").malloc_trim` looks the name up in
//! libc's own scope and still reaches glibc's copy, which has nothing to
//! trim; `ctypes.CDLL(None).malloc_trim` reaches this one.

use crate::jemalloc;
use core::ffi::c_int;
use core::sync::atomic::AtomicUsize;
use std::io::Write;

pub use crate::os::mallinfo::{Mallinfo, Mallinfo2};

/// Maps jemalloc's figures onto glibc's fields (docs/configuration.md,
/// "Programs that call glibc's API", says so to users):
/// `arena` = mapped, `uordblks` = allocated, `fordblks` = mapped − allocated,
/// `keepcost` = dirty (what `malloc_trim` would release), `hblkhd` =
/// metadata; the block counts have no jemalloc equivalent and are 0.
pub fn mallinfo2() -> Mallinfo2 {
    let s = jemalloc::stats().unwrap_or_default();
    Mallinfo2 {
        arena: s.mapped as usize,
        hblkhd: s.metadata as usize,
        uordblks: s.allocated as usize,
        fordblks: s.mapped.saturating_sub(s.allocated) as usize,
        keepcost: s.dirty as usize,
        ..Mallinfo2::default()
    }
}

/// `mallopt(param, value)`: glibc's answer, from glibc's `mallopt` (which
/// sets its own heap, empty under the shim): 0 where glibc refuses the
/// value (`M_MXFAST` above 160 or negative; on older glibc a
/// `M_MMAP_THRESHOLD` above 32 MiB), else 1. A program that checks the
/// answer sees what it would without the shim; jemalloc takes nothing
/// from it. 1 if glibc's cannot be found (not reached).
pub fn mallopt(param: c_int, value: c_int) -> c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    // Looked up at the first call: `dlsym` takes the loader's lock.
    let p = {
        let _e = crate::os::KeepErrno::new();
        crate::os::dl::next_once(&REAL, c"mallopt")
    };
    if p == 0 {
        return 1;
    }
    // SAFETY: glibc's `mallopt` has this type.
    let real =
        unsafe { core::mem::transmute::<usize, unsafe extern "C" fn(c_int, c_int) -> c_int>(p) };
    // SAFETY: any values: glibc checks them.
    unsafe { real(param, value) }
}

/// `malloc_trim(pad)`: purges every arena. Returns 1 if memory was released
/// to the OS, 0 otherwise, like glibc. `pad` has no meaning for jemalloc.
pub fn malloc_trim() -> c_int {
    let before = jemalloc::stats().map(|s| s.resident).unwrap_or(0);
    let _ = jemalloc::flush_own_tcache();
    if jemalloc::purge_all().is_err() {
        return 0;
    }
    let after = jemalloc::stats().map(|s| s.resident).unwrap_or(before);
    c_int::from(after < before)
}

/// `mallinfo()`: as `mallinfo2`, saturated to `int` like glibc's.
pub fn mallinfo() -> Mallinfo {
    let m = mallinfo2();
    let c = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
    Mallinfo {
        arena: c(m.arena),
        hblkhd: c(m.hblkhd),
        uordblks: c(m.uordblks),
        fordblks: c(m.fordblks),
        keepcost: c(m.keepcost),
        ..Mallinfo::default()
    }
}

unsafe extern "C" {
    /// The C library's `stderr` stream.
    static stderr: *mut libc::FILE;
}

/// `malloc_stats()`: a summary on the `stderr` stream in glibc's layout.
/// Through the stream, as glibc writes it: a program that pointed `stderr`
/// at a file or buffers it gets the summary there and in its order.
pub fn malloc_stats() {
    let s = jemalloc::stats().unwrap_or_default();
    let text = format!(
        "memshim (jemalloc {}):\nsystem bytes     = {:>10}\nin use bytes     = {:>10}\nresident bytes   = {:>10}\ndirty bytes      = {:>10}\nTotal (incl. mmap):\nsystem bytes     = {:>10}\nin use bytes     = {:>10}\n",
        jemalloc::version(),
        s.mapped,
        s.allocated,
        s.resident,
        s.dirty,
        s.mapped + s.metadata,
        s.allocated,
    );
    // SAFETY: `stderr` is the C library's stream, valid for the process's
    // life; fwrite takes its lock.
    unsafe {
        libc::fwrite(text.as_ptr().cast(), 1, text.len(), stderr);
    }
}

/// The XML document of `malloc_info`, in the shape of glibc's
/// (`<malloc version=...>` with `<total>` and `<system>` elements), with
/// `interposed="yes"` when this `malloc` is the process's (the constructor
/// asked the loader: `os::interpose`); the Python package's
/// `memshim.is_preloaded()` reads it rather than asking again.
pub fn malloc_info_xml() -> Vec<u8> {
    let s = jemalloc::stats().unwrap_or_default();
    let mut xml = Vec::with_capacity(512);
    let _ = write!(
        xml,
        "<malloc version=\"1\" allocator=\"memshim\" jemalloc=\"{}\" interposed=\"{}\">\n\
         <total type=\"allocated\" size=\"{}\"/>\n\
         <total type=\"active\" size=\"{}\"/>\n\
         <total type=\"resident\" size=\"{}\"/>\n\
         <total type=\"dirty\" size=\"{}\"/>\n\
         <total type=\"muzzy\" size=\"{}\"/>\n\
         <total type=\"retained\" size=\"{}\"/>\n\
         <system type=\"current\" size=\"{}\"/>\n\
         <system type=\"metadata\" size=\"{}\"/>\n\
         </malloc>\n",
        jemalloc::version(),
        if crate::os::interpose::ours() {
            "yes"
        } else {
            "no"
        },
        s.allocated,
        s.active,
        s.resident,
        s.dirty,
        s.muzzy,
        s.retained,
        s.mapped,
        s.metadata,
    );
    xml
}
