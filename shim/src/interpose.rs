//! The exported malloc family: the only `#[no_mangle]` allocation symbols.
//!
//! Each function is a forward to jemalloc (linked statically with the
//! `_rjem_` prefix, so none of jemalloc's own symbols are exported). The
//! rules for everything in this file:
//!
//! * no locks, no allocation, no formatting, no Rust thread-locals, no
//!   panicking paths; the only libc call is `__errno_location`;
//! * where glibc's documented behaviour differs from jemalloc's, glibc wins,
//!   because the process was written against glibc. Each such case has a
//!   comment.
//!
//! Symbols stay unversioned: ld.so binds versioned references such as
//! `malloc@GLIBC_2.2.5` to an unversioned definition found earlier in the
//! search order (the preload).

use crate::sys::{errno, set_errno};
use core::ffi::{c_int, c_void};
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use tikv_jemalloc_sys as je;

/// The smallest alignment jemalloc guarantees for every `malloc` result
/// (its smallest size class is 8 bytes).
const JE_MIN_ALIGN: usize = 8;

/// Page size, cached on first use (`sysconf` reads the aux vector and does
/// not allocate).
static PAGE: AtomicUsize = AtomicUsize::new(0);

/// glibc 2.38 made `aligned_alloc` reject alignments that are not powers of
/// two (C17); older glibc treats them like `memalign`. The constructor sets
/// this from `gnu_get_libc_version()` so the shim answers as the host's
/// glibc would.
pub static ALIGNED_ALLOC_STRICT: AtomicBool = AtomicBool::new(false);

#[inline]
fn page() -> usize {
    let p = PAGE.load(Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: sysconf is async-signal-safe and never allocates.
    let p = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    };
    PAGE.store(p, Relaxed);
    p
}

/// `free` that keeps `errno` (glibc's manual requires it of replacements;
/// jemalloc may `madvise`/`munmap` inside `free`).
#[inline(always)]
unsafe fn free_keep_errno(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let e = errno();
    // SAFETY: caller passes a pointer from this allocator (or NULL, above).
    unsafe { je::free(p) };
    set_errno(e);
}

/// glibc's `_mid_memalign`: alignments up to the minimum are plain malloc,
/// absurd ones are EINVAL, and the rest are rounded up to a power of two
/// (jemalloc would return NULL without setting errno).
#[inline]
unsafe fn memalign_like_glibc(align: usize, size: usize) -> *mut c_void {
    if align <= JE_MIN_ALIGN {
        // SAFETY: plain forward.
        return unsafe { je::malloc(size) };
    }
    if align > usize::MAX / 2 + 1 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: `align` is now a power of two; jemalloc sets ENOMEM on failure.
    unsafe { je::aligned_alloc(align.next_power_of_two(), size) }
}

#[inline]
unsafe fn realloc_like_glibc(p: *mut c_void, size: usize) -> *mut c_void {
    if size == 0 && !p.is_null() {
        // glibc frees and returns NULL (REALLOC_ZERO_BYTES_FREES), keeping errno.
        // SAFETY: `p` came from this allocator.
        unsafe { free_keep_errno(p) };
        return ptr::null_mut();
    }
    // SAFETY: plain forward.
    unsafe { je::realloc(p, size) }
}

macro_rules! export {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        ///
        /// # Safety
        /// The C contract of the function of the same name in glibc.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        #[inline(never)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the caller upholds the C contract; each body is a
            // forward to jemalloc with the same contract.
            unsafe { $body }
        }
    };
}

// --- The functions glibc's manual says a replacement must provide ----------
export!(
    /// `malloc`
    fn malloc(size: usize) -> *mut c_void {
        je::malloc(size)
    }
);
export!(
    /// `free`, keeping errno.
    fn free(p: *mut c_void) {
        free_keep_errno(p)
    }
);
export!(
    /// `calloc`; jemalloc checks `n * size` for overflow and sets ENOMEM.
    fn calloc(n: usize, size: usize) -> *mut c_void {
        je::calloc(n, size)
    }
);
export!(
    /// `realloc`; `realloc(p, 0)` frees like glibc.
    fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        realloc_like_glibc(p, size)
    }
);

// --- The functions it says a general-purpose replacement should provide ----
export!(
    /// `reallocarray` (glibc 2.26): overflow is ENOMEM, as in glibc.
    fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
        match n.checked_mul(size) {
            Some(total) => realloc_like_glibc(p, total),
            None => {
                set_errno(libc::ENOMEM);
                ptr::null_mut()
            }
        }
    }
);
export!(
    /// `aligned_alloc`: strict (C17) where the host glibc is >= 2.38, like `memalign` before.
    fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
        if ALIGNED_ALLOC_STRICT.load(Relaxed) && !align.is_power_of_two() {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        memalign_like_glibc(align, size)
    }
);
export!(
    /// `posix_memalign`: jemalloc applies POSIX's checks (EINVAL, ENOMEM).
    fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
        je::posix_memalign(out, align, size)
    }
);
export!(
    /// `memalign`: any alignment, rounded up to a power of two like glibc.
    fn memalign(align: usize, size: usize) -> *mut c_void {
        memalign_like_glibc(align, size)
    }
);
export!(
    /// `valloc`: page-aligned.
    fn valloc(size: usize) -> *mut c_void {
        memalign_like_glibc(page(), size)
    }
);
export!(
    /// `pvalloc`: page-aligned, size rounded up to whole pages (overflow is ENOMEM).
    fn pvalloc(size: usize) -> *mut c_void {
        let pg = page();
        match size.checked_add(pg - 1) {
            Some(s) => memalign_like_glibc(pg, s & !(pg - 1)),
            None => {
                set_errno(libc::ENOMEM);
                ptr::null_mut()
            }
        }
    }
);
export!(
    /// `malloc_usable_size`: 0 for NULL, like glibc.
    fn malloc_usable_size(p: *mut c_void) -> usize {
        if p.is_null() {
            0
        } else {
            je::malloc_usable_size(p)
        }
    }
);
export!(
    /// `free_sized` (C23, glibc 2.43). The size is ignored, as glibc does:
    /// jemalloc's sized free trusts it, and a wrong size from a buggy caller
    /// would corrupt the heap instead of being harmless.
    fn free_sized(p: *mut c_void, _size: usize) {
        free_keep_errno(p)
    }
);
export!(
    /// `free_aligned_sized` (C23): see `free_sized`.
    fn free_aligned_sized(p: *mut c_void, _align: usize, _size: usize) {
        free_keep_errno(p)
    }
);
export!(
    /// `cfree`: obsolete alias of `free`, still called by very old programs.
    fn cfree(p: *mut c_void) {
        free_keep_errno(p)
    }
);

// --- glibc's internal names, which other interposers and debug tools call
//     as "the real malloc" ---------------------------------------------------
export!(
    /// `__libc_malloc`
    fn __libc_malloc(size: usize) -> *mut c_void {
        je::malloc(size)
    }
);
export!(
    /// `__libc_free`
    fn __libc_free(p: *mut c_void) {
        free_keep_errno(p)
    }
);
export!(
    /// `__libc_calloc`
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void {
        je::calloc(n, size)
    }
);
export!(
    /// `__libc_realloc`
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void {
        realloc_like_glibc(p, size)
    }
);
export!(
    /// `__libc_memalign` (ld.so used it before glibc 2.25)
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void {
        memalign_like_glibc(align, size)
    }
);
export!(
    /// `__libc_valloc`
    fn __libc_valloc(size: usize) -> *mut c_void {
        memalign_like_glibc(page(), size)
    }
);
export!(
    /// `__libc_pvalloc`
    fn __libc_pvalloc(size: usize) -> *mut c_void {
        pvalloc(size)
    }
);
export!(
    /// `__posix_memalign`
    fn __posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
        je::posix_memalign(out, align, size)
    }
);
