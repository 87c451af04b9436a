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
    let p = global(name);
    if p.is_null() {
        return None;
    }
    let undefined = symbol_of(p as usize).is_some_and(|(_, s)| s.st_shndx == 0); // SHN_UNDEF
    (!undefined).then_some(p)
}

/// The dynamic symbol table entry that covers `addr` in a loaded object,
/// with the address that symbol starts at (`dladdr1`'s `RTLD_DL_SYMENT`);
/// `None` where no symbol does.
pub fn symbol_of(addr: usize) -> Option<(usize, libc::Elf64_Sym)> {
    /// `dladdr1`'s request for the matching symbol table entry.
    const RTLD_DL_SYMENT: libc::c_int = 1;
    // SAFETY: dladdr1 only looks `addr` up (it is never dereferenced),
    // fills the Dl_info we pass and points `sym` at the matching entry of a
    // loaded object's symbol table (or leaves it null); Dl_info is plain
    // data, valid when zeroed. The entry is copied.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let mut sym: *mut c_void = core::ptr::null_mut();
        if libc::dladdr1(addr as *const c_void, &mut info, &mut sym, RTLD_DL_SYMENT) == 0
            || sym.is_null()
        {
            return None;
        }
        Some((info.dli_saddr as usize, *(sym as *const libc::Elf64_Sym)))
    }
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

/// The most loaded objects [`build_ids`] reads (a PyTorch process has
/// about 150).
const MAX_OBJECTS: usize = 4096;

/// The longest build id kept (GNU ld writes 20 bytes, a SHA-1; `--build-id=`
/// with a hex string may write more: such an object is left out).
const MAX_BUILD_ID: usize = 64;

/// One object's span and build id, as the loader walk records it.
struct RawBuildId {
    start: u64,
    end: u64,
    len: usize,
    id: [u8; MAX_BUILD_ID],
}

/// The build id of every loaded object that has one (its `NT_GNU_BUILD_ID`
/// note, read from the object's own loaded segment), with the span of its
/// loaded segments, for the `profile` request's answer, on the shim's
/// thread. The loader holds its lock during the walk, so the callback
/// neither allocates nor formats (an allocation could be sampled, and the
/// sample's unwinder walks the loader's list too): it fills room reserved
/// before the walk, and the hex is written after it.
pub fn build_ids() -> Vec<memshim_proto::ObjectBuildId> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the Vec passed below, alive for the call; `info`
        // and its program headers are valid for this callback, and each
        // PT_NOTE segment lies in a loaded (readable) segment of the object.
        unsafe {
            let out = &mut *(data as *mut Vec<RawBuildId>);
            let info = &*info;
            if info.dlpi_phdr.is_null() || out.len() == out.capacity() {
                return 0;
            }
            let phdrs = core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
            let base = info.dlpi_addr;
            let mut raw = RawBuildId {
                start: u64::MAX,
                end: 0,
                len: 0,
                id: [0; MAX_BUILD_ID],
            };
            for ph in phdrs {
                match ph.p_type {
                    libc::PT_LOAD => {
                        raw.start = raw.start.min(base.wrapping_add(ph.p_vaddr));
                        raw.end = raw.end.max(base.wrapping_add(ph.p_vaddr + ph.p_memsz));
                    }
                    libc::PT_NOTE if raw.len == 0 => {
                        let p = base.wrapping_add(ph.p_vaddr) as *const u8;
                        let notes = core::slice::from_raw_parts(p, ph.p_filesz as usize);
                        if let Some(id) = gnu_build_id(notes, ph.p_align)
                            && id.len() <= MAX_BUILD_ID
                        {
                            raw.id[..id.len()].copy_from_slice(id);
                            raw.len = id.len();
                        }
                    }
                    _ => {}
                }
            }
            if raw.len > 0 && raw.start < raw.end {
                // Within the capacity reserved: no allocation.
                out.push(raw);
            }
            0
        }
    }
    let mut raw: Vec<RawBuildId> = Vec::with_capacity(MAX_OBJECTS);
    // SAFETY: the callback only reads the loader's entries and fills `raw`
    // within its capacity.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut raw).cast()) };
    raw.iter()
        .map(|r| memshim_proto::ObjectBuildId {
            start: r.start,
            end: r.end,
            id: r.id[..r.len].iter().map(|b| format!("{b:02x}")).collect(),
        })
        .collect()
}

/// The description of the `NT_GNU_BUILD_ID` note in a note segment whose
/// entries are aligned to `align` (4, or 8 for some), if it has one.
fn gnu_build_id(mut notes: &[u8], align: u64) -> Option<&[u8]> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let align = if align == 8 { 8 } else { 4 };
    let pad = |n: usize| n.div_ceil(align) * align;
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    while notes.len() >= 12 {
        let namesz = word(notes, 0)? as usize;
        let descsz = word(notes, 4)? as usize;
        let kind = word(notes, 8)?;
        let desc_at = 12 + pad(namesz);
        let name = notes.get(12..12 + namesz)?;
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc);
        }
        notes = notes.get(desc_at + pad(descsz)..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary's own build id, as `readelf -n` reads it from the
    /// file, is among the loaded objects' (rustc links with `--build-id`).
    #[test]
    fn the_loaded_objects_build_ids_are_the_files() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let out = std::process::Command::new("readelf")
            .arg("-n")
            .arg(&exe)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let want = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .expect("the test binary has a build id")
            .to_string();
        let ids = build_ids();
        let here = the_loaded_objects_build_ids_are_the_files as *const () as u64;
        let mine = ids.iter().find(|o| o.start <= here && here < o.end);
        assert_eq!(mine.map(|o| o.id.as_str()), Some(want.as_str()), "{ids:?}");
        // libc has one too, in its own span.
        assert!(ids.len() >= 2, "{ids:?}");
    }

    #[test]
    fn a_note_segment_with_other_notes_first_is_read() {
        let mut notes = Vec::new();
        // An ABI tag note (type 1, "GNU", 16 bytes), then the build id.
        for (kind, desc) in [(1u32, vec![0u8; 16]), (3, vec![0xab, 0x01, 0xff])] {
            notes.extend(4u32.to_ne_bytes());
            notes.extend((desc.len() as u32).to_ne_bytes());
            notes.extend(kind.to_ne_bytes());
            notes.extend(b"GNU\0");
            let n = desc.len();
            notes.extend(desc);
            notes.resize(notes.len() + (4 - n % 4) % 4, 0);
        }
        assert_eq!(gnu_build_id(&notes, 4), Some(&[0xab, 0x01, 0xff][..]));
        assert_eq!(gnu_build_id(&notes[..20], 4), None);
    }
}
