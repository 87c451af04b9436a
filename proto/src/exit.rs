//! memshim-ctl's exit statuses: the one table the CLI exits by, its `--help`
//! text is made from, docs/troubleshooting.md's table is checked against
//! (a test in the CLI) and the tests assert with.

/// One exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// The number the process exits with.
    pub code: u8,
    /// Its name in `--json` errors (`"code": "not_found"`).
    pub name: &'static str,
    /// A few words for `--help`.
    pub brief: &'static str,
}

/// Success.
pub const OK: ExitStatus = ExitStatus {
    code: 0,
    name: "ok",
    brief: "ok",
};
/// Some of several targets failed (all of them for the same kind of
/// reason: that reason's code), the result could not be written, `doctor`
/// found a problem, or an unexpected error.
pub const FAILED: ExitStatus = ExitStatus {
    code: 1,
    name: "failed",
    brief: "some targets failed",
};
/// Bad arguments (clap's own code).
pub const USAGE: ExitStatus = ExitStatus {
    code: 2,
    name: "usage",
    brief: "usage",
};
/// No such process (a thread's id, a process that exited mid-request,
/// `--all` that found none), or the shim is not loaded in it.
pub const NOT_FOUND: ExitStatus = ExitStatus {
    code: 3,
    name: "not_found",
    brief: "no such process or no shim",
};
/// The shim is loaded but its control endpoint is not running.
pub const NO_ENDPOINT: ExitStatus = ExitStatus {
    code: 4,
    name: "no_endpoint",
    brief: "endpoint not running",
};
/// Permission denied.
pub const PERMISSION: ExitStatus = ExitStatus {
    code: 5,
    name: "permission",
    brief: "permission denied",
};
/// The process answered with an error (protocol, invalid argument, ...).
pub const REMOTE: ExitStatus = ExitStatus {
    code: 6,
    name: "remote",
    brief: "the process answered with an error",
};
/// A Python step could not run or failed.
pub const PYTHON_STEP: ExitStatus = ExitStatus {
    code: 7,
    name: "python_step",
    brief: "a Python step could not run or failed",
};
/// No memory cgroup that can be read here.
pub const NO_CGROUP: ExitStatus = ExitStatus {
    code: 8,
    name: "no_cgroup",
    brief: "no memory cgroup",
};
/// The cgroup filesystem is read-only here.
pub const READ_ONLY: ExitStatus = ExitStatus {
    code: 9,
    name: "read_only",
    brief: "read-only cgroup filesystem",
};

/// `reclaim --to SIZE`: the cgroup's usage could not be brought under SIZE
/// (what is left is in use).
pub const NOT_REACHED: ExitStatus = ExitStatus {
    code: 10,
    name: "not_reached",
    brief: "reclaim could not reach the size asked",
};

/// `profile`: the process cannot be profiled (it started without
/// `MEMSHIM_PROFILE=on`, or has no unwinder).
pub const NO_PROFILER: ExitStatus = ExitStatus {
    code: 11,
    name: "no_profiler",
    brief: "the process cannot be profiled",
};

// --- Reaching a process started without the preload (docs/attach.md) -----

/// Yama's `ptrace_scope` forbids memshim-ctl to trace the process.
pub const YAMA: ExitStatus = ExitStatus {
    code: 12,
    name: "yama",
    brief: "Yama's ptrace_scope forbids tracing",
};
/// No `CAP_SYS_PTRACE`, and the process is another user's.
pub const NO_PTRACE: ExitStatus = ExitStatus {
    code: 13,
    name: "no_ptrace",
    brief: "no right to trace (another uid, no CAP_SYS_PTRACE)",
};
/// The process lives in a user namespace memshim-ctl may not trace into.
pub const USER_NAMESPACE: ExitStatus = ExitStatus {
    code: 14,
    name: "user_namespace",
    brief: "another user namespace",
};
/// The process runs under a seccomp filter.
pub const SECCOMP: ExitStatus = ExitStatus {
    code: 15,
    name: "seccomp",
    brief: "a seccomp filter",
};
/// Another tracer (strace, a debugger) is attached to the process.
pub const TRACED: ExitStatus = ExitStatus {
    code: 16,
    name: "traced",
    brief: "already traced by another tracer",
};
/// The process disabled remote debugging (`PYTHON_DISABLE_REMOTE_DEBUG`,
/// `-X disable_remote_debug`).
pub const REMOTE_DEBUG_DISABLED: ExitStatus = ExitStatus {
    code: 17,
    name: "remote_debug_disabled",
    brief: "remote debugging disabled",
};
/// A free-threaded CPython build.
pub const FREE_THREADED: ExitStatus = ExitStatus {
    code: 18,
    name: "free_threaded",
    brief: "a free-threaded CPython",
};
/// A CPython older than 3.8 or newer than 3.15.
pub const UNSUPPORTED_VERSION: ExitStatus = ExitStatus {
    code: 19,
    name: "unsupported_version",
    brief: "an unsupported CPython version",
};
/// Not a CPython process (and no shim in it).
pub const NOT_CPYTHON: ExitStatus = ExitStatus {
    code: 20,
    name: "not_cpython",
    brief: "not a CPython process",
};
/// No thread of the process reached a safe point within the time limit:
/// nothing was changed.
pub const NO_SAFE_POINT: ExitStatus = ExitStatus {
    code: 21,
    name: "no_safe_point",
    brief: "no safe point in time (nothing changed)",
};

/// `attach`: the process's `dlopen` of the bridge failed (its message is
/// in the error); nothing was changed.
pub const NOT_ATTACHED: ExitStatus = ExitStatus {
    code: 22,
    name: "not_attached",
    brief: "the bridge could not be loaded (nothing changed)",
};
/// `attach`/`detach` on a process started with libmemshim.so preloaded:
/// it is reachable already and has no bridge.
pub const PRELOADED: ExitStatus = ExitStatus {
    code: 23,
    name: "preloaded",
    brief: "the shim is preloaded: no bridge to attach or detach",
};

/// Every status, by code.
pub const ALL: [ExitStatus; 24] = [
    OK,
    FAILED,
    USAGE,
    NOT_FOUND,
    NO_ENDPOINT,
    PERMISSION,
    REMOTE,
    PYTHON_STEP,
    NO_CGROUP,
    READ_ONLY,
    NOT_REACHED,
    NO_PROFILER,
    YAMA,
    NO_PTRACE,
    USER_NAMESPACE,
    SECCOMP,
    TRACED,
    REMOTE_DEBUG_DISABLED,
    FREE_THREADED,
    UNSUPPORTED_VERSION,
    NOT_CPYTHON,
    NO_SAFE_POINT,
    NOT_ATTACHED,
    PRELOADED,
];

impl ExitStatus {
    /// The last line of every failing command's stderr:
    /// `  (exit 3; see docs/troubleshooting.md)`.
    pub fn line(self) -> String {
        format!("  (exit {}; see docs/troubleshooting.md)", self.code)
    }
}

/// In JSON a status is its name (`"not_found"`).
impl serde::Serialize for ExitStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name)
    }
}

/// "Exit codes: 0 ok, 1 some targets failed, ...": the `--help` footer.
pub fn help_line() -> String {
    let parts: Vec<String> = ALL
        .iter()
        .map(|s| format!("{} {}", s.code, s.brief))
        .collect();
    format!("Exit codes: {}.", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_in_order() {
        for (i, s) in ALL.iter().enumerate() {
            assert_eq!(usize::from(s.code), i, "{s:?}");
        }
        assert!(help_line().starts_with("Exit codes: 0 ok, 1 some targets failed, 2 usage,"));
    }
}
