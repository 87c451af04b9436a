//! Standard output for a command's result.
//!
//! `print!` panics when the write fails: `memshim-ctl list | true` (a
//! closed pipe) or `> /dev/full` would abort the CLI. Every result goes
//! through [`out!`]/[`outln!`] instead, which turn a failed write into a
//! `Failure` (exit 1, "writing to stdout: …") for the command to return
//! with `?`. Messages go to stderr through [`errln!`], which never
//! panics. `watch` ends quietly on a closed pipe instead (it is a
//! stream).

use crate::exit::{Exit, Failure};
use std::io::Write;

/// Writes `args` to stdout and flushes it.
pub fn write(args: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    let mut o = std::io::stdout().lock();
    o.write_fmt(args)
        .and_then(|()| o.flush())
        .map_err(|e| Failure::new(Exit::Failed, None, format!("writing to stdout: {e}")))
}

/// `print!` that returns `Result<(), Failure>` instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write(format_args!($($arg)*)) };
}

/// `println!` that returns `Result<(), Failure>` instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that ignores a failed write instead of panicking
/// (`2>/dev/full`): a message that cannot be shown must not crash the CLI.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

pub(crate) use {errln, out, outln};
