//! What is checked before a process is touched: the refusals, each with
//! its own kind (the CLI gives each its exit status), and what CPython
//! the process runs.

use crate::symbols::Resolver;
use std::fs;

/// Why a process is not reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Yama's `ptrace_scope` forbids it.
    Yama,
    /// No `CAP_SYS_PTRACE` and the process is another user's.
    NoPtrace,
    /// The process lives in a user namespace we may not trace into.
    UserNamespace,
    /// The process runs under a seccomp filter.
    Seccomp,
    /// Another tracer (strace, a debugger) is attached.
    Traced,
    /// `PYTHON_DISABLE_REMOTE_DEBUG` or `-X disable_remote_debug`.
    RemoteDebugDisabled,
    /// A free-threaded CPython build.
    FreeThreaded,
    /// A CPython older than 3.8 or newer than 3.15.
    UnsupportedVersion,
    /// Not a CPython process.
    NotCpython,
}

/// A refusal and the sentence that says it.
#[derive(Debug, Clone)]
pub struct Refused {
    /// Which.
    pub kind: Refusal,
    /// What, for whom, and what to do.
    pub message: String,
}

fn refuse(kind: Refusal, message: String) -> Refused {
    Refused { kind, message }
}

/// The CPython a process runs.
#[derive(Debug, Clone)]
pub struct Python {
    /// (major, minor).
    pub version: (u32, u32),
    /// The file that defines the C API (libpython or the executable).
    pub library: String,
}

fn status_field(pid: i32, name: &str) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(':')
            .map(|v| v.trim().to_string())
    })
}

/// `(major, minor)` from a path such as `/usr/lib/libpython3.11.so.1.0` or
/// `/usr/bin/python3.13t` (with the free-threaded `t` flag).
fn version_in(path: &str) -> Option<((u32, u32), bool)> {
    let name = path.rsplit('/').next()?;
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    let mut it = rest.splitn(2, '.');
    let major: u32 = it.next()?.parse().ok()?;
    let tail = it.next()?;
    let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
    let minor: u32 = digits.parse().ok()?;
    let t = tail[digits.len()..].starts_with('t');
    Some(((major, minor), t))
}

/// The checks that need no tracing, in the order a user fixes them.
pub fn may_trace(pid: i32) -> Result<(), Refused> {
    let uid: u32 = status_field(pid, "Uid")
        .and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| refuse(Refusal::NotCpython, format!("process {pid} not found")))?;
    let cap = crate::ptrace::has_cap(19); // CAP_SYS_PTRACE
    let scope: u32 = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if scope >= 3 || (scope >= 1 && !cap) {
        return Err(refuse(
            Refusal::Yama,
            format!(
                "Yama's ptrace_scope is {scope}: memshim-ctl may not trace process {pid}; \
                 run it with CAP_SYS_PTRACE (scope 1 or 2), or set kernel.yama.ptrace_scope=0 \
                 (scope 3 forbids it until reboot), or start the process with LD_PRELOAD"
            ),
        ));
    }
    if !cap && uid != crate::ptrace::euid() {
        return Err(refuse(
            Refusal::NoPtrace,
            format!(
                "process {pid} belongs to uid {uid}: run memshim-ctl as that user, \
                 or with CAP_SYS_PTRACE (root)"
            ),
        ));
    }
    let ns = |p: &str| fs::read_link(format!("/proc/{p}/ns/user")).ok();
    let (theirs, ours) = (ns(&pid.to_string()), ns("self"));
    if theirs.is_none() || (theirs != ours && !cap) {
        return Err(refuse(
            Refusal::UserNamespace,
            format!(
                "process {pid} lives in another user namespace that memshim-ctl may not \
                 trace into; run memshim-ctl in that namespace (e.g. inside the container)"
            ),
        ));
    }
    if let Some(t) = status_field(pid, "TracerPid").filter(|t| t != "0") {
        return Err(refuse(
            Refusal::Traced,
            format!(
                "process {pid} is already traced by process {t} (strace or a debugger); \
                 detach it first"
            ),
        ));
    }
    if status_field(pid, "Seccomp").is_some_and(|s| s != "0") {
        return Err(refuse(
            Refusal::Seccomp,
            format!(
                "process {pid} runs under a seccomp filter: code run in it may be killed by \
                 the filter, so memshim-ctl does not try; start it with LD_PRELOAD"
            ),
        ));
    }
    Ok(())
}

/// Which CPython `pid` runs, or why it is not one memshim-ctl reaches.
pub fn python(pid: i32, symbols: &mut Resolver) -> Result<Python, Refused> {
    let Some((_, library)) = symbols.find("PyGILState_Ensure") else {
        return Err(refuse(
            Refusal::NotCpython,
            format!("process {pid} is not a CPython process (no PyGILState_Ensure in its files)"),
        ));
    };
    let named = symbols
        .paths()
        .filter_map(version_in)
        .find(|&((major, _), _)| major == 3)
        .or_else(|| {
            let exe = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            version_in(exe.to_str()?)
        });
    let Some(((major, minor), t)) = named else {
        return Err(refuse(
            Refusal::UnsupportedVersion,
            format!("process {pid}: its CPython's version could not be told from its file names"),
        ));
    };
    if t || symbols.find("_Py_IsFreeThreaded").is_some() {
        return Err(refuse(
            Refusal::FreeThreaded,
            format!(
                "process {pid} runs a free-threaded CPython {major}.{minor}t, which memshim does not support"
            ),
        ));
    }
    if major != 3 || !(8..=15).contains(&minor) {
        return Err(refuse(
            Refusal::UnsupportedVersion,
            format!("process {pid} runs CPython {major}.{minor}; memshim supports 3.8 to 3.15"),
        ));
    }
    let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let env_off = env.split(|&c| c == 0).any(|v| {
        v.strip_prefix(b"PYTHON_DISABLE_REMOTE_DEBUG=")
            .is_some_and(|x| !x.is_empty())
    });
    let x_off = cmd
        .split(|&c| c == 0)
        .any(|a| a.ends_with(b"disable_remote_debug") || a.ends_with(b"disable-remote-debug"));
    if env_off || x_off {
        let how = if env_off {
            "PYTHON_DISABLE_REMOTE_DEBUG"
        } else {
            "-X disable_remote_debug"
        };
        return Err(refuse(
            Refusal::RemoteDebugDisabled,
            format!(
                "process {pid} was started with {how}: memshim-ctl respects that and does not reach it"
            ),
        ));
    }
    Ok(Python {
        version: (major, minor),
        library,
    })
}
