//! Whether our `malloc` is the process's: the loader's answer, asked once
//! by the constructor (the allocation layer then knows whose `realloc`
//! `reallocarray` must call, and the thread layer whether it may act at all).

/// A static of this library's own, whose address the loader never
/// interposes.
static HERE: u8 = 0;

touched_at_start! {
    /// The constructor's answer ([`detect`]).
    static OURS: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
}

/// Whether the constructor found our `malloc` to be the process's.
pub fn ours() -> bool {
    OURS.load(core::sync::atomic::Ordering::Relaxed)
}

/// Detects whether our `malloc` is the process's `malloc` (and no
/// sanitizer, which must own malloc, is present); [`ours`] keeps the
/// answer. Constructor.
#[unsafe(link_section = ".text.startup")]
pub fn detect() -> bool {
    let yes = detect_now();
    OURS.store(yes, core::sync::atomic::Ordering::Relaxed);
    yes
}

fn detect_now() -> bool {
    // Compare the *object* that defines the global `malloc` with ours.
    // Comparing with the address of our `malloc` does not work: that
    // address is taken through our GOT, which the loader binds to the global
    // definition too, so the test always passed (an executable with its own
    // malloc, or a dlopen'ed shim, read as interposed). `HERE` is a local
    // static, so its address is never interposed.
    //
    // A non-PIE executable that takes the address of `malloc` (CPython
    // does; Debian's and Ubuntu's python3 are not PIE) answers the lookup
    // with its own PLT slot ([`super::dl::global_definition`]); the first
    // member of the family it does not take the address of then tells whose
    // allocator its calls reach. A process has one allocator for all of
    // them: the shim defines every one, and so does any allocator that
    // replaces malloc.
    let here = &raw const HERE as usize;
    let Some(global) = process_malloc() else {
        return false;
    };
    if !super::dl::same_object(global as usize, here) {
        return false;
    }
    // A sanitizer runtime linked into the executable defines the global
    // `malloc` itself (the executable comes first in the search order), so
    // the check above already says no. A shared runtime loaded after us
    // (ASan with `verify_asan_link_order=0`, TSan) does not: find it by
    // its file name. Not by `dlsym` of `__asan_init` and the like: each
    // lookup that fails builds an error message with `malloc`, which cost
    // every exec of a program that never allocates about 25 us
    // (bench/FINDINGS-issue15.md).
    // Valgrind's tools replace the malloc family by rewriting calls to
    // our entry points; its preloads name it.
    !super::dl::any_loaded(&MALLOC_OWNERS)
}

/// The definition the process's malloc family calls reach: that of the
/// first member of [`FAMILY`] whose global definition is not the
/// executable's PLT slot (see [`detect`]); `None` if none is found.
pub fn process_malloc() -> Option<*mut core::ffi::c_void> {
    FAMILY
        .iter()
        .find_map(|name| super::dl::global_definition(name))
}

/// Members of the malloc family, asked in this order for whose definition
/// is global (see [`detect`]).
const FAMILY: [&core::ffi::CStr; 6] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"malloc_usable_size",
    c"posix_memalign",
];

/// File-name prefixes of the shared libraries of runtimes that own malloc:
/// the sanitizers' (GCC's, then LLVM's) and valgrind's preloads.
const MALLOC_OWNERS: [&[u8]; 9] = [
    b"libasan.",
    b"libtsan.",
    b"libmsan.",
    b"libhwasan.",
    b"libclang_rt.asan",
    b"libclang_rt.tsan",
    b"libclang_rt.msan",
    b"libclang_rt.hwasan",
    b"vgpreload_",
];
