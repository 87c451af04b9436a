//! libmemshim_bridge.so's own part: what `memshim-ctl attach` loads into a
//! running process started without the preload (docs/attach.md, "attach").
//!
//! The bridge is the shim's sources built with `cfg(memshim_bridge)`: the
//! shim's thread, control socket and Python bridge, without jemalloc and
//! with one exported function of its own name, so a library loaded late
//! replaces nothing of the process's (its `malloc` above all: [`heap`]
//! answers the allocator requests with the process's own allocator);
//! that export, `memshim_bridge_serving`, lets a second copy see that one
//! serves. Its constructor,
//! run by the `dlopen` that `attach` makes on a thread of the process held
//! at a safe point, starts the thread; `detach` stops it and closes the
//! socket, and the library stays mapped (`-z nodelete`: code that may still
//! be referenced, a fork handler's, must not go away).

pub mod heap;

use crate::{os, thread};
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// The process in which this copy's constructor started the thread (which
/// serves until `detach`); 0 before. A fork child inherits the value but not
/// the thread, so the pid tells: there, this copy does not serve, and a
/// copy that `attach` loads into the child starts its own.
static STARTED_IN: AtomicI32 = AtomicI32::new(0);

/// Fork child handler: the child has no bridge thread (a pid the child's
/// grandchild may one day be given must not make a copy claim it serves).
/// Async-signal-safe.
pub fn forked() {
    STARTED_IN.store(0, Relaxed);
}

/// Whether this copy of the bridge serves the process: the one symbol the
/// library exports, a name no program uses, so that a second copy loaded
/// into the same process (two `attach` at once, each from a copy of its
/// own) finds the first and stays idle ([`another_copy_serves`]).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn memshim_bridge_serving() -> bool {
    let started = STARTED_IN.load(Relaxed);
    started != 0 && started == os::getpid() && !crate::control::detach_asked()
}

/// Constructor: whether another copy of libmemshim_bridge.so in this
/// process serves it. Walks the loader's list for objects of that name
/// other than this one (names copied into room reserved before the walk),
/// then asks each (`dlopen` with `RTLD_NOLOAD`, which opens no file, and
/// `dlsym`). The loader's lock is ours already (a constructor runs under
/// it), and is recursive.
fn another_copy_serves() -> bool {
    const MAX: usize = 16;
    const NAME: usize = 512;
    struct Found {
        here: *const c_char,
        n: usize,
        names: [[u8; NAME]; MAX],
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Found` below, alive for the walk; `info` and
        // its name are valid for this callback.
        unsafe {
            let f = &mut *(data as *mut Found);
            let info = &*info;
            if info.dlpi_name.is_null() || f.here.is_null() || f.n == MAX {
                return 0;
            }
            let name = core::ffi::CStr::from_ptr(info.dlpi_name).to_bytes();
            if name == core::ffi::CStr::from_ptr(f.here).to_bytes() {
                return 0; // this copy
            }
            if name.ends_with(b"/libmemshim_bridge.so") && name.len() < NAME {
                f.names[f.n][..name.len()].copy_from_slice(name);
                f.names[f.n][name.len()] = 0;
                f.n += 1;
            }
            0
        }
    }
    // SAFETY: dladdr only fills the Dl_info (plain data, valid zeroed); its
    // name points into the loader's entry for this library, which stays.
    let here = unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        libc::dladdr(memshim_bridge_serving as *const c_void, &mut info);
        info.dli_fname
    };
    let mut f = Found {
        here,
        n: 0,
        names: [[0; NAME]; MAX],
    };
    // SAFETY: the callback only reads the loader's entries and fills `f`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut f).cast()) };
    f.names[..f.n].iter().any(|name| {
        // SAFETY: a NUL-terminated name (copied above); RTLD_NOLOAD only
        // finds an object already loaded; the handle is released after.
        unsafe {
            let h = libc::dlopen(
                name.as_ptr().cast::<c_char>(),
                libc::RTLD_NOLOAD | libc::RTLD_LAZY,
            );
            if h.is_null() {
                return false;
            }
            let p = libc::dlsym(h, c"memshim_bridge_serving".as_ptr());
            // SAFETY: that copy's `memshim_bridge_serving`, this very
            // function's signature.
            let serving =
                !p.is_null() && core::mem::transmute::<*mut c_void, extern "C" fn() -> bool>(p)();
            libc::dlclose(h);
            serving
        }
    })
}

extern "C" fn constructor() {
    let _e = os::KeepErrno::new();
    if another_copy_serves() {
        return;
    }
    STARTED_IN.store(os::getpid(), Relaxed);
    thread::on_attach();
}

extern "C" fn destructor() {
    thread::on_unload();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".fini_array")]
static DESTRUCTOR: extern "C" fn() = destructor;
