//! Bytes in pymalloc's arenas: CPython `mmap`s them directly, so they
//! bypass malloc (and the shim) and are part of RSS that jemalloc's figures
//! do not explain.
//!
//! CPython has no API for the figure, but `_PyObject_DebugMallocStats(FILE*)`
//! (what `sys._debugmallocstats()` prints to stderr) writes it to any
//! stream. We give it an in-memory stream and read the line
//! `N arenas * S bytes/arena = B`. It only reads allocator state, walks
//! the arenas (about a millisecond per GiB of arenas), and is exported by
//! every CPython 3.8-3.13. It returns 0 when pymalloc is not the object
//! allocator (`PYTHONMALLOC=malloc`, free-threaded builds): then `None`.

use super::ffi::Api;

/// Output buffer; the arena lines come within the first few KiB.
const BUF: usize = 64 * 1024;

/// Job thread, GIL held.
pub fn arena_bytes(api: &Api) -> Option<u64> {
    let f = api.debug_malloc_stats?;
    let mut buf = vec![0u8; BUF];
    // SAFETY: the stream is a valid FILE* for the duration of the call; the
    // GIL is held for the CPython call.
    let (rc, len) = crate::os::memstream::with_stream(&mut buf, |fp| unsafe { f(fp) })?;
    if rc == 0 {
        return None;
    }
    parse(&buf[..len])
}

/// Finds `... bytes/arena = 1,572,864` and returns the number.
fn parse(text: &[u8]) -> Option<u64> {
    memshim_proto::pymalloc_arena_bytes(core::str::from_utf8(text).ok()?)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_the_arena_line() {
        let t = b"# arenas allocated current         =                    6\n\
                  6 arenas * 262144 bytes/arena      =            1,572,864\n";
        assert_eq!(parse(t), Some(1_572_864));
        assert_eq!(parse(b"nothing"), None);
    }
}
