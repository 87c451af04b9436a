//! The dynamic loader: symbol lookup, which object defines an address, and
//! glibc's version. None of this may run on the allocation path or in a
//! fork handler (`dlsym` takes the loader's lock and may allocate).

use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicUsize, Ordering::*};

/// The next definition of `name` after this library (`RTLD_NEXT`), as an
/// address; 0 if none.
pub fn next(name: &CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
}

/// [`next`], looked up once into `slot` (glibc's definition of a function
/// we export too: ours comes first in the search order); 0 if none.
pub fn next_once(slot: &AtomicUsize, name: &CStr) -> usize {
    let mut p = slot.load(Acquire);
    if p == 0 {
        p = next(name);
        slot.store(p, Release);
    }
    p
}

/// The global definition of `name` (`RTLD_DEFAULT`), null if none.
#[unsafe(link_section = ".text.startup")]
pub fn global(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// The definition of `name` in the process's global scope (the main
/// program, its dependencies, preloaded libraries and whatever was
/// `dlopen`ed `RTLD_GLOBAL`), null if none, looked up without keeping the
/// defining library loaded.
///
/// `dlsym(RTLD_DEFAULT, ...)` searches the same scope, but glibc then adds
/// a dependency from the caller's object to the one that defines the
/// symbol, and since this library can never be unloaded (it is preloaded,
/// and `-z nodelete`), that makes the definer unloadable too: an embedder
/// that `dlclose`d its libpython after the shim had looked at it kept it
/// mapped, and the next libpython it loaded bound to the old one's symbols
/// and aborted in `Py_Initialize`. A lookup through the main program's
/// handle searches the global scope (glibc extends the main program's
/// search list with every `RTLD_GLOBAL` object) and adds no dependency. A
/// library loaded `RTLD_LOCAL` is not found, as with `RTLD_DEFAULT`.
pub fn in_global_scope(name: &CStr) -> *mut c_void {
    static MAIN: AtomicUsize = AtomicUsize::new(0);
    let mut h = MAIN.load(Acquire);
    if h == 0 {
        // SAFETY: dlopen(NULL) returns the main program's handle (which can
        // never be unloaded); kept for the life of the process.
        h = unsafe { libc::dlopen(core::ptr::null(), libc::RTLD_LAZY) } as usize;
        if h == 0 {
            return core::ptr::null_mut();
        }
        MAIN.store(h, Release);
    }
    // SAFETY: dlsym with a valid handle and a NUL-terminated name.
    unsafe { libc::dlsym(h as *mut c_void, name.as_ptr()) }
}

/// The global definition of `name`, or `None` where the global scope
/// answers with a non-PIE executable's "canonical PLT" entry: an executable
/// built without PIE that takes a function's address (CPython takes
/// `malloc`'s) gets an undefined symbol with a value, its PLT slot, so that
/// function pointers compare equal everywhere. `dlsym` returns that slot,
/// which lies in the executable, though every call through it reaches the
/// definition the loader bound it to: not an answer to whose `malloc` is
/// in use.
pub fn global_definition(name: &CStr) -> Option<*mut c_void> {
    /// `dladdr1`'s request for the matching symbol table entry.
    const RTLD_DL_SYMENT: libc::c_int = 1;
    let p = global(name);
    if p.is_null() {
        return None;
    }
    // SAFETY: dladdr1 fills the Dl_info we pass and points `sym` at the
    // matching entry of a loaded object's symbol table (or leaves it null);
    // Dl_info is plain data, valid when zeroed.
    let undefined = unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let mut sym: *mut c_void = core::ptr::null_mut();
        libc::dladdr1(p, &mut info, &mut sym, RTLD_DL_SYMENT) != 0
            && !sym.is_null()
            && (*(sym as *const libc::Elf64_Sym)).st_shndx == 0 // SHN_UNDEF
    };
    (!undefined).then_some(p)
}

/// Whether a loaded object's file name (its last path component) starts
/// with one of `prefixes`. Walks the loader's list (`dl_iterate_phdr`),
/// which, unlike a `dlsym` that fails, builds no error message: no
/// allocation.
#[unsafe(link_section = ".text.startup")]
pub fn any_loaded(prefixes: &[&[u8]]) -> bool {
    #[unsafe(link_section = ".text.startup")]
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `&[&[u8]]` passed below, alive for the call;
        // `info` is valid for this callback, its name NULL or a C string.
        unsafe {
            let prefixes = &*(data as *const &[&[u8]]);
            let name = (*info).dlpi_name;
            if name.is_null() {
                return 0;
            }
            let path = CStr::from_ptr(name).to_bytes();
            let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
            prefixes.iter().any(|p| base.starts_with(p)) as libc::c_int
        }
    }
    let mut data = prefixes;
    // SAFETY: the callback only reads the loader's entries and `data`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut data).cast()) != 0 }
}

/// Whether the addresses `a` and `b` lie in the same loaded object
/// (compared by load base).
pub fn same_object(a: usize, b: usize) -> bool {
    let (a, b) = (a as *const c_void, b as *const c_void);
    // SAFETY: dladdr only reads the loader's tables into the Dl_info we pass;
    // Dl_info is plain data, valid when zeroed.
    unsafe {
        let mut x: libc::Dl_info = core::mem::zeroed();
        let mut y: libc::Dl_info = core::mem::zeroed();
        libc::dladdr(a, &mut x) != 0
            && libc::dladdr(b, &mut y) != 0
            && !x.dli_fbase.is_null()
            && x.dli_fbase == y.dli_fbase
    }
}

/// glibc's version as (major, minor), e.g. (2, 36).
#[unsafe(link_section = ".text.startup")]
pub fn glibc_version() -> (u64, u64) {
    // SAFETY: returns a static NUL-terminated string such as "2.36".
    let v = unsafe { CStr::from_ptr(libc::gnu_get_libc_version()) }.to_bytes();
    let mut it = v.split(|&b| b == b'.');
    let ma = it.next().and_then(super::parse_u64).unwrap_or(0);
    let mi = it.next().and_then(super::parse_u64).unwrap_or(0);
    (ma, mi)
}
