//! The shim's only way to speak: single lines on stderr with a fixed prefix.
//!
//! A shimmed process must keep an empty stderr, so the shim prints only
//! (a) one `memshim: warning: ...` line per bad setting and (b) what the user
//! asked for with `MEMSHIM_VERBOSE=1`. Messages are formatted into a stack
//! buffer and written with one `write(2)`, so they never allocate and lines
//! from different processes do not interleave mid-line. The attached
//! bridge prints nothing at all.

use crate::os::{StackBuf, write_stderr};
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Longest line we print; longer text is cut off.
const LINE_MAX: usize = 1024;

fn line(prefix: &str, args: fmt::Arguments<'_>) {
    // The attached bridge never writes to the process's stderr: the process
    // was started without memshim, and its stderr is its own.
    if cfg!(memshim_bridge) {
        return;
    }
    let mut buf = StackBuf::<LINE_MAX>::new();
    let _ = buf.write_str(prefix);
    let _ = buf.write_fmt(args);
    write_stderr(one_line(buf.as_bytes()).as_bytes());
}

/// `msg` as one line: trailing newlines dropped, control characters escaped,
/// cut off at `LINE_MAX` bytes (at a character's end), then one newline.
///
/// A value quoted in a message may hold any character the environment can:
/// control characters (a newline, a carriage return, an escape sequence,
/// C1 controls such as U+0085) and the Unicode line and paragraph
/// separators are written as escapes (`\n`, `\r`, `\x1b`, `\u{85}`), and a
/// backslash as `\\`, so that a value can neither add a line of its own nor
/// rewrite the one on a terminal, and an escape always means one.
fn one_line(mut msg: &[u8]) -> StackBuf<{ LINE_MAX + 1 }> {
    while let Some((b'\n', rest)) = msg.split_last() {
        msg = rest;
    }
    // The text was formatted from `str`s; only a cut at the end of the
    // buffer may have split a character.
    let text = match core::str::from_utf8(msg) {
        Ok(t) => t,
        Err(e) => core::str::from_utf8(&msg[..e.valid_up_to()]).unwrap_or(""),
    };
    let mut out = StackBuf::new();
    let mut room = LINE_MAX;
    for c in text.chars() {
        let mut buf = [0u8; 10];
        let shown: &[u8] = match c {
            '\n' => b"\\n",
            '\r' => b"\\r",
            '\\' => b"\\\\",
            c if (c as u32) < 0x80 && c.is_control() => {
                buf[..2].copy_from_slice(b"\\x");
                buf[2] = HEX[(c as usize) >> 4];
                buf[3] = HEX[(c as usize) & 0xf];
                &buf[..4]
            }
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                // `\u{85}` .. `\u{2029}`: at most four hex digits.
                let v = c as u32;
                let digits = if v > 0xff { 4 } else { 2 };
                buf[..3].copy_from_slice(b"\\u{");
                for i in 0..digits {
                    buf[3 + i] = HEX[((v >> (4 * (digits - 1 - i))) & 0xf) as usize];
                }
                buf[3 + digits] = b'}';
                &buf[..4 + digits]
            }
            c => c.encode_utf8(&mut buf).as_bytes(),
        };
        if shown.len() > room {
            break;
        }
        room -= shown.len();
        out.push(shown);
    }
    out.push(b"\n");
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

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
        // jemalloc reads its conf strings twice at start-up (an early pass
        // for a few options, then the full pass) and reports a malformed
        // string in both: print each distinct complaint once.
        Some(_) if already_said(bytes) => {}
        Some(rest) => {
            let text = core::str::from_utf8(rest)
                .unwrap_or("(non-UTF-8 message)")
                .trim_end();
            if text.starts_with("Invalid conf") {
                // A well-formed pair with a bad key or value: name where it
                // came from and what happens instead, like our own warnings.
                warning(format_args!(
                    "jemalloc: {text} (from MALLOC_CONF, _RJEM_MALLOC_CONF or MEMSHIM_MALLOC_CONF); ignored, jemalloc's default applies"
                ));
            } else {
                warning(format_args!("jemalloc: {text}"));
            }
        }
        None => write_stderr(bytes),
    }
}

/// FNV-1a hashes of the jemalloc complaints printed so far.
static SAID: [AtomicU64; 32] = [const { AtomicU64::new(0) }; 32];

/// True if this message was printed before; otherwise records it (while
/// there is room) and returns false. Lock-free and allocation-free.
fn already_said(msg: &[u8]) -> bool {
    let h = msg.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    for slot in &SAID {
        match slot.compare_exchange(0, h, Relaxed, Relaxed) {
            Ok(_) => return false,
            Err(v) if v == h => return true,
            Err(_) => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::{LINE_MAX, already_said, one_line};

    #[test]
    fn a_message_is_one_line_whatever_bytes_it_quotes() {
        let l = one_line(b"MEMSHIM_X=\"5\nmemshim: fake\r\x1b[31m\x7f\\n\" is not valid\n\n");
        assert_eq!(
            l.as_bytes(),
            b"MEMSHIM_X=\"5\\nmemshim: fake\\r\\x1b[31m\\x7f\\\\n\" is not valid\n"
        );
        // C1 controls and the Unicode line separators; other text as it is.
        let l = one_line("a\u{85}b\u{9b}c\u{2028}d\u{2029}é".as_bytes());
        assert_eq!(
            l.as_bytes(),
            "a\\u{85}b\\u{9b}c\\u{2028}d\\u{2029}é\n".as_bytes()
        );
        let long = one_line(&[b'\n'; 2 * LINE_MAX]);
        assert_eq!(long.as_bytes(), b"\n");
        let cut = one_line(&[b'\x01'; LINE_MAX]);
        assert_eq!(cut.as_bytes().len(), LINE_MAX / 4 * 4 + 1);
        assert!(cut.as_bytes()[..LINE_MAX].starts_with(b"\\x01\\x01"));
        assert_eq!(cut.as_bytes().last(), Some(&b'\n'));
        // Cut at a character's end, never inside one.
        let wide = "é".repeat(LINE_MAX);
        let cut = one_line(&wide.as_bytes()[..LINE_MAX - 1]);
        assert!(core::str::from_utf8(cut.as_bytes()).is_ok());
        assert_eq!(cut.as_bytes().len(), LINE_MAX - 2 + 1);
    }

    #[test]
    fn a_repeated_jemalloc_complaint_is_said_once() {
        assert!(!already_said(b"<jemalloc>: Malformed conf string -- x\n"));
        assert!(already_said(b"<jemalloc>: Malformed conf string -- x\n"));
        assert!(!already_said(
            b"<jemalloc>: Conf string ends with key -- y\n"
        ));
    }
}
