//! Whether stdout was closed when memshim-ctl started (`memshim-ctl … >&-`).
//!
//! Rust's runtime opens /dev/null on a closed stdin, stdout or stderr
//! before `main`, so every later write to a closed stdout succeeds and a
//! command whose output went nowhere would exit 0. The loader runs this
//! constructor before that; [`stdout`] then fails the first write instead
//! (`EBADF`, exit 1), as coreutils do. A command that writes only to its
//! `-o` file is not affected. The CLI's only `unsafe` (main.rs).

#![allow(unsafe_code)]

use std::io::{Error, StdoutLock};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

static CLOSED: AtomicBool = AtomicBool::new(false);

extern "C" fn look() {
    // SAFETY: F_GETFD only reads descriptor 1's flags; -1 (EBADF) where it
    // is not open.
    if unsafe { libc::fcntl(1, libc::F_GETFD) } == -1 {
        CLOSED.store(true, Relaxed);
    }
}

#[used]
// SAFETY: a plain `extern "C" fn()` with no argument the loader must pass:
// what `.init_array` holds.
#[unsafe(link_section = ".init_array")]
static LOOK: extern "C" fn() = look;

/// stdout, locked: `EBADF` where it was closed when the CLI started.
pub fn stdout() -> Result<StdoutLock<'static>, Error> {
    if CLOSED.load(Relaxed) {
        return Err(Error::from_raw_os_error(libc::EBADF));
    }
    Ok(std::io::stdout().lock())
}
