//! The shim's only way to speak: single lines on stderr with a fixed prefix.
//!
//! A shimmed process must keep an empty stderr, so the shim prints only
//! (a) one `memshim: warning: ...` line per bad setting and (b) what the user
//! asked for with `MEMSHIM_VERBOSE=1`. Messages are formatted into a stack
//! buffer and written with one `write(2)`, so they never allocate and lines
//! from different processes do not interleave mid-line.

use crate::sys::{StackBuf, write_stderr};
use core::fmt::{self, Write};

/// Longest line we print; longer text is cut off.
const LINE_MAX: usize = 1024;

fn line(prefix: &str, args: fmt::Arguments<'_>) {
    let mut buf = StackBuf::<LINE_MAX>::new();
    let _ = buf.write_str(prefix);
    let _ = buf.write_fmt(args);
    let mut bytes = buf.as_bytes();
    // Always end with exactly one newline, even when cut off.
    while let Some((b'\n', rest)) = bytes.split_last() {
        bytes = rest;
    }
    let mut out = StackBuf::<{ LINE_MAX + 1 }>::new();
    out.push(bytes);
    out.push(b"\n");
    write_stderr(out.as_bytes());
}

/// `memshim: warning: <message>`
pub fn warning(args: fmt::Arguments<'_>) {
    line("memshim: warning: ", args);
}

/// `memshim: <message>` (only used for `MEMSHIM_VERBOSE=1`).
pub fn info(args: fmt::Arguments<'_>) {
    line("memshim: ", args);
}

/// Receives jemalloc's own messages (`malloc_message`). Its complaints about
/// bad `MALLOC_CONF` pairs become our single-line warnings; anything else
/// (for example `stats_print:true` output the user asked for) passes through.
///
/// # Safety
/// `msg` must be NULL or a NUL-terminated string (jemalloc's contract).
pub unsafe extern "C" fn jemalloc_message(
    _opaque: *mut core::ffi::c_void,
    msg: *const core::ffi::c_char,
) {
    if msg.is_null() {
        return;
    }
    // SAFETY: jemalloc passes a NUL-terminated string.
    let bytes = unsafe { core::ffi::CStr::from_ptr(msg) }.to_bytes();
    match bytes.strip_prefix(b"<jemalloc>: ") {
        Some(rest) => {
            let text = core::str::from_utf8(rest)
                .unwrap_or("(non-UTF-8 message)")
                .trim_end();
            if text.starts_with("Invalid conf") {
                // A well-formed pair with a bad key or value: name where it
                // came from and what happens instead, like our own warnings.
                warning(format_args!(
                    "jemalloc: {text} (from MALLOC_CONF or MEMSHIM_MALLOC_CONF); ignored, jemalloc's default applies"
                ));
            } else {
                warning(format_args!("jemalloc: {text}"));
            }
        }
        None => write_stderr(bytes),
    }
}
