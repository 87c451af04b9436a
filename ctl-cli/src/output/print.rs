//! What the CLI writes: a command's result on stdout, messages and failures
//! on stderr, and text other processes chose made safe to show.
//!
//! `print!` panics when the write fails: `memshim-ctl list | true` (a
//! closed pipe) or `> /dev/full` would abort the CLI, and succeeds where
//! stdout was closed (`>&-`: closed.rs). Every result goes
//! through [`out!`]/[`outln!`] instead, which turn a failed write into a
//! `Failure` (exit 1, "writing to stdout: …") for the command to return
//! with `?`. Messages go to stderr through [`errln!`], which never
//! panics. `watch` ends quietly on a closed pipe instead (it is a
//! stream).

use crate::exit::{self, Failure};
use std::io::Write;
use std::process::ExitCode;

/// Writes `args` to stdout and flushes it, with no control character but
/// newline and tab ([`shown`]).
pub fn write(args: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    let text = std::fmt::format(args);
    super::closed::stdout()
        .and_then(|mut o| {
            o.write_all(shown(&text).as_bytes())
                .and_then(|()| o.flush())
        })
        .map_err(|e| Failure::new(exit::FAILED, None, format!("writing to stdout: {e}")))
}

/// Writes raw bytes to stdout and flushes it (a binary format).
pub fn write_bytes(b: &[u8]) -> Result<(), Failure> {
    super::closed::stdout()
        .and_then(|mut o| o.write_all(b).and_then(|()| o.flush()))
        .map_err(|e| Failure::new(exit::FAILED, None, format!("writing to stdout: {e}")))
}

/// `print!` that returns `Result<(), Failure>` instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::print::write(format_args!($($arg)*)) };
}

/// `println!` that returns `Result<(), Failure>` instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::output::print::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that ignores a failed write instead of panicking
/// (`2>/dev/full`): a message that cannot be shown must not crash the CLI.
/// No control character but newline and tab ([`shown`]).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!("{}\n", format_args!($($arg)*));
        let _ = std::io::stderr().lock().write_all($crate::output::print::shown(&text).as_bytes());
    }};
}

pub(crate) use {errln, out, outln};

/// A process's name or command line as it may be shown: control
/// characters (newlines, terminal escapes), which any process can put in
/// its own, become spaces.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Text as it reaches a terminal: every control character but newline and
/// tab (terminal escapes, carriage returns, C1 codes) becomes a space. The
/// last line of defence for text that other users' processes choose (file
/// and cgroup names, answers over a socket) and that a report shows in a
/// field [`printable`] did not clean. JSON escapes such characters itself,
/// so a JSON document passes unchanged; binary formats go through
/// [`write_bytes`].
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if text.contains(unsafe_char) {
        text.chars()
            .map(|c| if unsafe_char(c) { ' ' } else { c })
            .collect::<String>()
            .into()
    } else {
        text.into()
    }
}

/// Prints the failure a command ended with (stderr; also stdout as JSON
/// with `--json`) and returns its exit code.
pub fn report(f: &Failure, json: bool) -> ExitCode {
    if json {
        let doc = serde_json::json!({ "error": f });
        // Not `println!`: it panics when stdout is closed or full.
        // The message below still says what failed.
        let _ = outln!("{doc}");
    }
    // Messages name paths and names that other users' processes chose
    // (their MEMSHIM_SOCKET_DIR, their comm): no control characters
    // reach the terminal.
    errln!("memshim-ctl: error: {}", printable(&f.line()));
    if let Some(h) = &f.hint {
        errln!("  hint: {}", printable(h));
    }
    errln!("{}", f.exit.line());
    ExitCode::from(f.exit.code)
}
