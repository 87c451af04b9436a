//! Exit codes and the one error type every subcommand returns.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | some of several targets failed (all of them for the same kind of reason: that reason's code), or an unexpected error |
//! | 2 | usage error (bad arguments; clap's own code) |
//! | 3 | no such process (also: a thread's id, a process that exited mid-request, `--all` that found none), or the shim is not loaded in it |
//! | 4 | the shim is loaded but its control endpoint is not running |
//! | 5 | permission denied |
//! | 6 | the process answered with an error (protocol, invalid argument, ...) |
//! | 7 | a Python step could not run or failed: `gc`, `empty-cache`, or a step of `release` (the GIL could not be had, the interpreter is shutting down, Python raised; `gc` in a process without CPython) |
//! | 8 | no memory cgroup: the process is in none that can be read here (`cgroup`, `reclaim`) |
//! | 9 | the cgroup filesystem is read-only here (`reclaim` inside a container) |
//!
//! docs/troubleshooting.md lists the messages and what to do about each.

use crate::out::{errln, outln};
use serde::Serialize;
use std::process::ExitCode;

/// How memshim-ctl exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exit {
    /// 0
    Ok,
    /// 1
    Failed,
    /// 3
    NotFound,
    /// 4
    NoEndpoint,
    /// 5
    Permission,
    /// 6
    Remote,
    /// 7
    PythonStep,
    /// 8
    NoCgroup,
    /// 9
    ReadOnly,
}

impl Exit {
    /// The numeric exit status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::NotFound => 3,
            Exit::NoEndpoint => 4,
            Exit::Permission => 5,
            Exit::Remote => 6,
            Exit::PythonStep => 7,
            Exit::NoCgroup => 8,
            Exit::ReadOnly => 9,
        }
    }

    /// The last line of every failing command's stderr.
    pub fn line(self) -> String {
        format!("  (exit {}; see docs/troubleshooting.md)", self.code())
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// A failure for one target: what went wrong, for which pid, and what to do.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Exit category.
    #[serde(rename = "code")]
    pub exit: Exit,
    /// The pid concerned, if any.
    pub pid: Option<i32>,
    /// What is wrong (names the path where one is involved).
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
}

impl Failure {
    /// A failure of kind `exit`.
    pub fn new(exit: Exit, pid: Option<i32>, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            pid,
            message: message.into(),
            hint: None,
        }
    }

    /// Adds what to do.
    pub fn hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    /// One line for a person: `pid 123: message`.
    pub fn line(&self) -> String {
        match self.pid {
            Some(p) => format!("pid {p}: {}", self.message),
            None => self.message.clone(),
        }
    }

    /// Prints the failure (stderr; also stdout as JSON with `--json`) and
    /// returns the exit code.
    pub fn report(&self, json: bool) -> ExitCode {
        if json {
            let doc = serde_json::json!({ "error": self });
            // Not `println!`: it panics when stdout is closed or full.
            // The message below still says what failed.
            let _ = outln!("{doc}");
        }
        // Messages name paths and names that other users' processes chose
        // (their MEMSHIM_SOCKET_DIR, their comm): no control characters
        // reach the terminal.
        errln!(
            "memshim-ctl: error: {}",
            crate::discover::printable(&self.line())
        );
        if let Some(h) = &self.hint {
            errln!("  hint: {}", crate::discover::printable(h));
        }
        errln!("{}", self.exit.line());
        self.exit.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_ones() {
        let all = [
            Exit::Ok,
            Exit::Failed,
            Exit::NotFound,
            Exit::NoEndpoint,
            Exit::Permission,
            Exit::Remote,
            Exit::PythonStep,
            Exit::NoCgroup,
            Exit::ReadOnly,
        ];
        assert_eq!(all.map(Exit::code), [0, 1, 3, 4, 5, 6, 7, 8, 9]);
        let f = Failure::new(Exit::NotFound, Some(7), "no such process");
        assert_eq!(f.line(), "pid 7: no such process");
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"code":"not_found","pid":7,"message":"no such process","hint":null}"#
        );
    }
}
