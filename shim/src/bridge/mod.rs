//! libmemshim_bridge.so's own part: what `memshim-ctl attach` loads into a
//! running process started without the preload (docs/attach.md, "attach").
//!
//! The bridge is the shim's sources built with `cfg(memshim_bridge)`: the
//! shim's thread, control socket and Python bridge, without jemalloc and
//! without a single exported function, so a library loaded late replaces
//! nothing of the process's (its `malloc` above all: [`heap`] answers the
//! allocator requests with the process's own allocator). Its constructor,
//! run by the `dlopen` that `attach` makes on a thread of the process held
//! at a safe point, starts the thread; `detach` stops it and closes the
//! socket, and the library stays mapped (`-z nodelete`: code that may still
//! be referenced, a fork handler's, must not go away).

pub mod fork;
pub mod heap;

use crate::{os, thread};
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// A `detach` request was answered: the thread leaves its loop.
static DETACH: AtomicBool = AtomicBool::new(false);

/// `detach` (control/requests/detach.rs): the thread stops once the answer
/// is sent (thread/run.rs).
pub fn ask_detach() {
    DETACH.store(true, Relaxed);
}

/// Whether `detach` was asked for.
pub fn detach_asked() -> bool {
    DETACH.load(Relaxed)
}

extern "C" fn constructor() {
    let _e = os::KeepErrno::new();
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
