//! Allocation with glibc's answers, on jemalloc. The exported functions in
//! `exports.rs` forward here where glibc's documented behaviour differs
//! from jemalloc's; glibc wins, because the process was written against it.
//!
//! Rules: no locks, no allocation, no formatting, no Rust thread-locals, no
//! panicking paths; the only libc call is `__errno_location`.

use crate::os::set_errno;
use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use tikv_jemalloc_sys as je;

/// The smallest alignment jemalloc guarantees for every `malloc` result
/// (its smallest size class is 8 bytes).
const JE_MIN_ALIGN: usize = 8;

touched_at_start! {
    /// Page size, cached on first use (`sysconf` reads the aux vector and does
    /// not allocate).
    static PAGE: AtomicUsize = AtomicUsize::new(0);
}

touched_at_start! {
    /// glibc 2.38 made `aligned_alloc` reject alignments that are not powers of
    /// two (C17); older glibc treats them like `memalign`. Set at start-up from
    /// glibc's version, so the shim answers as the host's glibc would.
    static ALIGNED_ALLOC_STRICT: AtomicBool = AtomicBool::new(false);
}

type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;

/// The process's `realloc` where another allocator owns the process (0
/// while ours does). glibc's `reallocarray` calls the process's `realloc`,
/// so a replacement malloc needs no `reallocarray` of its own; ours would
/// hand the program jemalloc's memory where everything else is the other
/// allocator's: an executable with its own malloc, or valgrind, which
/// rewrites calls to our `realloc` but (3.19, Debian 12's) not to our
/// `reallocarray`, and the program crashed at the next `free`.
static FOREIGN_REALLOC: AtomicUsize = AtomicUsize::new(0);

/// Start-up, where our malloc is not the process's: `reallocarray` then
/// calls `realloc`, the process's (constructor).
pub fn not_ours(realloc: *mut c_void) {
    FOREIGN_REALLOC.store(realloc as usize, Relaxed);
}

/// Start-up: reads glibc's version (constructor).
#[unsafe(link_section = ".text.startup")]
pub fn init() {
    ALIGNED_ALLOC_STRICT.store(crate::os::dl::glibc_version() >= (2, 38), Relaxed);
}

/// The page size.
#[inline]
pub fn page() -> usize {
    let p = PAGE.load(Relaxed);
    if p != 0 {
        return p;
    }
    let p = crate::os::page_size();
    PAGE.store(p, Relaxed);
    p
}

/// `malloc`. Every allocation function but `realloc` compares its size
/// with [`BIG_AT`] first (one comparison), and a big block takes a path out
/// of line, which tells [`crate::jemalloc::note_allocation`] its size (the
/// first block of 8 MiB lifts the first arena's large-free threshold) and
/// sends it to the arena the threads share while the shim's thread runs
/// (jemalloc.rs, "Large frees in the first arena" and "Big blocks in one
/// shared arena", say why, and why not `realloc`).
///
/// # Safety
/// Always safe; `unsafe` as the C allocation functions are.
#[inline(always)]
pub unsafe fn malloc(size: usize) -> *mut c_void {
    if size >= BIG_AT {
        // SAFETY: as below.
        return unsafe { big_malloc(size) };
    }
    // SAFETY: plain forward.
    unsafe { je::malloc(size) }
}

/// The size from which an allocation takes the big blocks' path.
const BIG_AT: usize = crate::jemalloc::BIG_AT;

/// `malloc` of a big block, out of line: the common path stays a
/// comparison and a jump, with nothing saved on the stack.
#[cold]
#[inline(never)]
unsafe fn big_malloc(size: usize) -> *mut c_void {
    crate::jemalloc::note_allocation(size);
    match crate::jemalloc::big_block_flags(size) {
        Some(flags) => {
            // SAFETY: `size` is not 0; `flags` names an existing arena.
            enomem_if_null(unsafe { je::mallocx(size, flags) })
        }
        // SAFETY: plain forward.
        None => unsafe { je::malloc(size) },
    }
}

/// `mallocx` reports no error; the C functions set ENOMEM.
#[inline]
fn enomem_if_null(p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

/// `calloc`; jemalloc checks `n * size` for overflow and sets ENOMEM.
///
/// # Safety
/// Always safe; `unsafe` as the C allocation functions are.
#[inline(always)]
pub unsafe fn calloc(n: usize, size: usize) -> *mut c_void {
    if n.saturating_mul(size) >= BIG_AT {
        // SAFETY: as below.
        return unsafe { big_calloc(n, size) };
    }
    // SAFETY: plain forward.
    unsafe { je::calloc(n, size) }
}

/// `calloc` of a big block, out of line (see `big_malloc`).
#[cold]
#[inline(never)]
unsafe fn big_calloc(n: usize, size: usize) -> *mut c_void {
    crate::jemalloc::note_allocation(n.saturating_mul(size));
    let total = n.checked_mul(size);
    match (total, total.and_then(crate::jemalloc::big_block_flags)) {
        (Some(total), Some(flags)) => {
            // SAFETY: as `big_malloc`; jemalloc zeroes what it did not just map.
            enomem_if_null(unsafe { je::mallocx(total, flags | je::MALLOCX_ZERO) })
        }
        // SAFETY: plain forward; jemalloc answers an overflow with ENOMEM.
        _ => unsafe { je::calloc(n, size) },
    }
}

/// `posix_memalign`: jemalloc applies POSIX's checks (EINVAL, ENOMEM).
///
/// # Safety
/// `out` is writable, as POSIX requires of the caller.
#[inline(always)]
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> libc::c_int {
    let rc = if size >= BIG_AT {
        // SAFETY: as below.
        unsafe { big_posix_memalign(out, align, size) }
    } else {
        // SAFETY: plain forward; the caller passes a writable `out`.
        unsafe { je::posix_memalign(out, align, size) }
    };
    // glibc's sets errno to ENOMEM beside returning it (its allocation
    // failed); jemalloc's does only where its own allocation failed, not
    // for a size past what it can serve.
    if rc == libc::ENOMEM {
        set_errno(libc::ENOMEM);
    }
    rc
}

/// `posix_memalign` of a big block, out of line (see `big_malloc`). An
/// alignment POSIX refuses goes to jemalloc, which says EINVAL.
#[cold]
#[inline(never)]
unsafe fn big_posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> libc::c_int {
    crate::jemalloc::note_allocation(size);
    if let Some(flags) = crate::jemalloc::big_block_flags(size) {
        if align.is_power_of_two() && align >= core::mem::size_of::<*mut c_void>() {
            // SAFETY: as `big_malloc`; `align` is a power of two.
            let p = unsafe { je::mallocx(size, flags | je::MALLOCX_ALIGN(align)) };
            if p.is_null() {
                return libc::ENOMEM;
            }
            // SAFETY: the caller passes a writable `out`.
            unsafe { *out = p };
            return 0;
        }
    }
    // SAFETY: plain forward; the caller passes a writable `out`.
    unsafe { je::posix_memalign(out, align, size) }
}

/// `free`. It keeps `errno` as glibc's does (glibc's manual requires it of
/// replacements; jemalloc may `madvise` inside `free`): not here, where it
/// would cost every call, but in the wrappers of jemalloc's system calls
/// (exports.rs, "jemalloc's system calls keep errno").
///
/// # Safety
/// `p` is NULL or a pointer from this allocator, not freed yet.
#[inline(always)]
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: the caller passes NULL or a pointer from this allocator.
    unsafe { je::free(p) }
}

/// glibc's `_mid_memalign`: alignments up to the minimum are plain malloc,
/// absurd ones are EINVAL, and the rest are rounded up to a power of two
/// (jemalloc would return NULL without setting errno).
///
/// # Safety
/// Always safe; `unsafe` as the C allocation functions are.
#[inline]
pub unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
    if align <= JE_MIN_ALIGN {
        // SAFETY: as `malloc`.
        return unsafe { malloc(size) };
    }
    if align > usize::MAX / 2 + 1 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let align = align.next_power_of_two();
    if size >= BIG_AT {
        // SAFETY: as below.
        return unsafe { big_aligned(align, size) };
    }
    // SAFETY: `align` is now a power of two; jemalloc sets ENOMEM on failure.
    unsafe { je::aligned_alloc(align, size) }
}

/// `memalign` of a big block with a power-of-two `align`, out of line (see
/// `big_malloc`).
#[cold]
#[inline(never)]
unsafe fn big_aligned(align: usize, size: usize) -> *mut c_void {
    crate::jemalloc::note_allocation(size);
    match crate::jemalloc::big_block_flags(size) {
        Some(flags) => {
            // SAFETY: as `big_malloc`; `align` is a power of two.
            enomem_if_null(unsafe { je::mallocx(size, flags | je::MALLOCX_ALIGN(align)) })
        }
        // SAFETY: as `memalign`.
        None => unsafe { je::aligned_alloc(align, size) },
    }
}

/// `aligned_alloc`: strict (C17) where the host glibc is >= 2.38, like
/// `memalign` before.
///
/// # Safety
/// Always safe; `unsafe` as the C allocation functions are.
#[inline]
pub unsafe fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if ALIGNED_ALLOC_STRICT.load(Relaxed) && !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: as `memalign`.
    unsafe { memalign(align, size) }
}

/// `realloc(p, 0)` frees and returns NULL (glibc's REALLOC_ZERO_BYTES_FREES),
/// keeping errno.
///
/// # Safety
/// `p` is NULL or a live pointer from this allocator.
#[inline]
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if size == 0 && !p.is_null() {
        // SAFETY: `p` came from this allocator.
        unsafe { free(p) };
        return ptr::null_mut();
    }
    // SAFETY: plain forward.
    unsafe { je::realloc(p, size) }
}

/// `reallocarray`: overflow of `n * size` is ENOMEM, as in glibc.
///
/// # Safety
/// As [`realloc`].
#[inline]
pub unsafe fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) => match FOREIGN_REALLOC.load(Relaxed) {
            0 => {
                // SAFETY: as `realloc`.
                unsafe { realloc(p, total) }
            }
            f => {
                // SAFETY: `f` is the process's `realloc` (`not_ours`).
                let f = unsafe { core::mem::transmute::<usize, ReallocFn>(f) };
                // SAFETY: as `realloc`.
                unsafe { f(p, total) }
            }
        },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `pvalloc`: page-aligned, size rounded up to whole pages (overflow is
/// ENOMEM).
///
/// # Safety
/// Always safe; `unsafe` as the C allocation functions are.
#[inline]
pub unsafe fn pvalloc(size: usize) -> *mut c_void {
    let pg = page();
    match size.checked_add(pg - 1) {
        // SAFETY: as `memalign`.
        Some(s) => unsafe { memalign(pg, s & !(pg - 1)) },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `malloc_usable_size`: 0 for NULL, like glibc.
///
/// # Safety
/// `p` is NULL or a live pointer from this allocator.
#[inline]
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        0
    } else {
        // SAFETY: a live pointer from this allocator.
        unsafe { je::malloc_usable_size(p) }
    }
}
