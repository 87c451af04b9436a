//! An in-memory `FILE*`, for C functions that only write to a stream
//! (CPython's `_PyObject_DebugMallocStats`).

/// Runs `f` with a `FILE*` that writes into `buf` (up to its length less
/// one), and returns `f`'s result and the number of bytes written; `None`
/// if no stream could be made.
pub fn with_stream<R>(buf: &mut [u8], f: impl FnOnce(*mut libc::FILE) -> R) -> Option<(R, usize)> {
    if buf.len() < 2 {
        return None;
    }
    // SAFETY: fmemopen over our live buffer; the stream is closed before the
    // buffer is read or dropped.
    unsafe {
        let fp = libc::fmemopen(buf.as_mut_ptr().cast(), buf.len() - 1, c"w".as_ptr());
        if fp.is_null() {
            return None;
        }
        let r = f(fp);
        libc::fflush(fp);
        let len = libc::ftell(fp);
        libc::fclose(fp);
        Some((r, len.clamp(0, (buf.len() - 1) as libc::c_long) as usize))
    }
}
