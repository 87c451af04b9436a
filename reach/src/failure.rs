//! Why the injector called nothing (on every architecture).

use std::io;

/// Why nothing was called.
#[derive(Debug)]
pub enum Failure {
    /// No thread was in an idle system call within the time limit; what
    /// each thread was doing at the last look.
    NoSafePoint(String),
    /// The process (or the thread) ended.
    Gone,
    /// Another thread of the process ran `execve` while one was held: the
    /// process runs its new program, and the held thread is gone with the
    /// old one.
    Exec,
    /// `PTRACE_SEIZE` failed with this error (EPERM: no right to trace).
    Seize(io::Error),
    /// The process's interpreter is not running: before `Py_Initialize`
    /// (an embedder that has not started it) or after `Py_Finalize`.
    NotInitialised,
    /// A signal that ends memshim-ctl (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT)
    /// came while it looked for a safe point, before anything changed.
    Interrupted(i32),
    /// Any other failure of a system call.
    Io(String),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        if matches!(e.raw_os_error(), Some(libc::ESRCH | libc::ECHILD)) {
            Failure::Gone
        } else {
            Failure::Io(e.to_string())
        }
    }
}
