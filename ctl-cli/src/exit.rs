//! How memshim-ctl exits, and the one error type every subcommand returns.
//!
//! The statuses themselves (number, `--json` name, `--help` words) are
//! `memshim_proto::exit`'s: [`Exit`] only picks one of them.
//! docs/troubleshooting.md has the table of codes (a test below checks it
//! against proto's), the messages and what to do about each. Printing a
//! failure is output's business (`out::report`).

use memshim_proto::exit::{self as status, ExitStatus};
use serde::Serialize;
use std::process::ExitCode;

/// How memshim-ctl exits. Usage errors (2) are clap's own and have no
/// variant. In JSON, the status's `name` (`"not_found"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// [`status::OK`]
    Ok,
    /// [`status::FAILED`]
    Failed,
    /// [`status::NOT_FOUND`]
    NotFound,
    /// [`status::NO_ENDPOINT`]
    NoEndpoint,
    /// [`status::PERMISSION`]
    Permission,
    /// [`status::REMOTE`]
    Remote,
    /// [`status::PYTHON_STEP`]
    PythonStep,
    /// [`status::NO_CGROUP`]
    NoCgroup,
    /// [`status::READ_ONLY`]
    ReadOnly,
    /// [`status::NOT_REACHED`]
    NotReached,
    /// [`status::NO_PROFILER`]
    NoProfiler,
    /// One of the statuses of reaching a process without the preload
    /// (`cmd/attach.rs`, [`status::YAMA`] to [`status::NO_SAFE_POINT`]).
    Reach(ExitStatus),
}

impl Exit {
    /// The shared status this is.
    pub fn status(self) -> ExitStatus {
        match self {
            Exit::Ok => status::OK,
            Exit::Failed => status::FAILED,
            Exit::NotFound => status::NOT_FOUND,
            Exit::NoEndpoint => status::NO_ENDPOINT,
            Exit::Permission => status::PERMISSION,
            Exit::Remote => status::REMOTE,
            Exit::PythonStep => status::PYTHON_STEP,
            Exit::NoCgroup => status::NO_CGROUP,
            Exit::ReadOnly => status::READ_ONLY,
            Exit::NotReached => status::NOT_REACHED,
            Exit::NoProfiler => status::NO_PROFILER,
            Exit::Reach(s) => s,
        }
    }

    /// The numeric exit status.
    pub fn code(self) -> u8 {
        self.status().code
    }

    /// The last line of every failing command's stderr.
    pub fn line(self) -> String {
        format!("  (exit {}; see docs/troubleshooting.md)", self.code())
    }
}

impl Serialize for Exit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.status().name)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Exit; 21] = [
        Exit::Ok,
        Exit::Failed,
        Exit::NotFound,
        Exit::NoEndpoint,
        Exit::Permission,
        Exit::Remote,
        Exit::PythonStep,
        Exit::NoCgroup,
        Exit::ReadOnly,
        Exit::NotReached,
        Exit::NoProfiler,
        Exit::Reach(status::YAMA),
        Exit::Reach(status::NO_PTRACE),
        Exit::Reach(status::USER_NAMESPACE),
        Exit::Reach(status::SECCOMP),
        Exit::Reach(status::TRACED),
        Exit::Reach(status::REMOTE_DEBUG_DISABLED),
        Exit::Reach(status::FREE_THREADED),
        Exit::Reach(status::UNSUPPORTED_VERSION),
        Exit::Reach(status::NOT_CPYTHON),
        Exit::Reach(status::NO_SAFE_POINT),
    ];

    #[test]
    fn every_exit_is_a_shared_status_and_every_shared_status_but_usage_is_an_exit() {
        assert_eq!(
            ALL.map(Exit::code),
            [
                0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21
            ]
        );
        let mut ours: Vec<ExitStatus> = ALL.iter().map(|e| e.status()).collect();
        ours.push(status::USAGE);
        ours.sort_by_key(|s| s.code);
        assert_eq!(ours, status::ALL);
        // JSON names are the shared ones, as serde used to spell the
        // variants (snake_case).
        let names: Vec<String> = ALL
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "\"ok\"",
                "\"failed\"",
                "\"not_found\"",
                "\"no_endpoint\"",
                "\"permission\"",
                "\"remote\"",
                "\"python_step\"",
                "\"no_cgroup\"",
                "\"read_only\"",
                "\"not_reached\"",
                "\"no_profiler\"",
                "\"yama\"",
                "\"no_ptrace\"",
                "\"user_namespace\"",
                "\"seccomp\"",
                "\"traced\"",
                "\"remote_debug_disabled\"",
                "\"free_threaded\"",
                "\"unsupported_version\"",
                "\"not_cpython\"",
                "\"no_safe_point\""
            ]
        );
        let f = Failure::new(Exit::NotFound, Some(7), "no such process");
        assert_eq!(f.line(), "pid 7: no such process");
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"code":"not_found","pid":7,"message":"no such process","hint":null}"#
        );
    }

    /// docs/troubleshooting.md opens with a `| code | meaning |` table: its
    /// codes are exactly proto's statuses, and the `--json` names it lists
    /// are exactly those a failure can carry.
    #[test]
    fn troubleshooting_table_lists_exactly_the_shared_codes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/troubleshooting.md");
        let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let codes: Vec<u8> = doc
            .lines()
            .skip_while(|l| l.trim() != "| code | meaning |")
            .skip(2) // the header and its |---| line
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cell = l.split('|').nth(1).unwrap_or_default().trim();
                cell.parse()
                    .unwrap_or_else(|_| panic!("{path}: {cell:?} is not a code in {l:?}"))
            })
            .collect();
        let shared: Vec<u8> = status::ALL.iter().map(|s| s.code).collect();
        assert_eq!(codes, shared, "{path}'s exit-code table");
        let listed = doc
            .split("(`code` is one of ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap_or_else(|| panic!("{path}: no \"(`code` is one of ...)\" list"));
        let names: Vec<&str> = listed
            .split(',')
            .map(|n| n.trim().trim_matches('`'))
            .collect();
        let failures: Vec<&str> = ALL[1..].iter().map(|e| e.status().name).collect();
        assert_eq!(names, failures, "{path}'s list of --json codes");
    }
}
