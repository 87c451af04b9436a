//! `RTLD_DEEPBIND` clearing (hazard 15).
//!
//! A library opened with `dlopen(..., RTLD_DEEPBIND)` resolves `malloc` and
//! `free` in its own dependency scope first, which reaches glibc's allocator
//! while the rest of the process uses ours; the first pointer that crosses
//! over crashes the process. glibc 2.34 removed the malloc hooks that other
//! allocators used to redirect such libraries, so the shim exports `dlopen`
//! and clears the flag (`MEMSHIM_CLEAR_DEEPBIND=0` turns that off).
//!
//! The wrapper is a few instructions of assembly that end in a tail jump to
//! glibc's `dlopen`. That matters: glibc uses its caller's return address
//! to pick the calling object, whose `RUNPATH`/`RPATH` and namespace govern
//! the search. A wrapper written in Rust would make *us* the caller and
//! silently change which library a relative name finds. With a `jmp`, glibc
//! sees the original caller.
//!
//! Only x86_64 has the wrapper; elsewhere `dlopen` is not interposed and the
//! hazard is documented (docs/design.md, "Portability").

use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering::*};

/// 1 while clearing is enabled (read by the assembly).
static CLEAR: AtomicU8 = AtomicU8::new(1);
/// Number of `dlopen` calls whose `RTLD_DEEPBIND` was cleared.
static CLEARED: AtomicU64 = AtomicU64::new(0);
/// glibc's `dlopen`, once resolved.
static REAL: AtomicUsize = AtomicUsize::new(0);

/// Resolves glibc's `dlopen` (called from the constructor, or from the
/// assembly if a library constructor calls `dlopen` before ours runs).
extern "C" fn resolve_real_dlopen() -> usize {
    let mut p = REAL.load(Acquire);
    if p == 0 {
        // SAFETY: dlsym with a static C string; RTLD_NEXT relative to us.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlopen".as_ptr()) } as usize;
        REAL.store(p, Release);
    }
    p
}

/// Constructor step: resolve glibc's dlopen and apply the setting.
pub(crate) fn init() {
    resolve_real_dlopen();
    CLEAR.store(u8::from(crate::options::clear_deepbind()), Release);
}

/// How many `dlopen` calls had `RTLD_DEEPBIND` cleared so far.
pub fn deepbind_cleared() -> u64 {
    CLEARED.load(Relaxed)
}

/// Exported `dlopen`: clears `RTLD_DEEPBIND` (if enabled) and tail-jumps to
/// glibc's, so glibc still sees the original caller.
///
/// # Safety
/// The C contract of `dlopen`.
#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(test), unsafe(no_mangle))]
#[unsafe(naked)]
pub unsafe extern "C" fn dlopen(
    file: *const core::ffi::c_char,
    mode: core::ffi::c_int,
) -> *mut core::ffi::c_void {
    core::arch::naked_asm!(
        // if (mode & RTLD_DEEPBIND) && CLEAR: clear the flag and count it
        "test esi, 8",
        "jz 2f",
        "cmp byte ptr [rip + {clear}], 0",
        "je 2f",
        "and esi, -9",
        "lock inc qword ptr [rip + {count}]",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        // Not resolved yet: resolve, keeping the argument registers.
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "xor eax, eax",
        "ret",
        clear = sym CLEAR,
        count = sym CLEARED,
        real = sym REAL,
        resolve = sym resolve_real_dlopen,
    )
}
