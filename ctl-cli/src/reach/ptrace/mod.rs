//! Verbs on a CPython process started without the preload (docs/attach.md):
//! `release`, `gc`, `empty-cache`, `stats` and `profile --python` reach it by ptrace (the `memshim-reach` crate, where
//! this CLI's system calls live), call its C API on a thread held at a safe
//! point, restore that thread exactly and let it go. Their output is the
//! shimmed process's, plus one line saying how the process was reached.

use crate::exit::{self as status, Exit, Failure};
use crate::reach::procfs::{self, Loaded};
use memshim_proto::{
    CgroupStats, DeviceChange, EmptyCacheResult, GcResult, MAX_PY_TRACE_SECONDS, ProcessStats,
    PyLine, PySnapshot, PyTraceAction, PyTraceReply, PythonSection, PythonUnavailable,
    ReleaseResult, ReleaseStep, ReleaseStepKind, TorchDevice, TorchSection,
};
use memshim_reach::{Error, Failure as Fail, PythonCalls, Refusal};
use std::time::{Duration, Instant};

mod release;
mod stats;
mod torch;
mod trace;

pub use release::{gc, release};
pub use stats::{Stats, stats};
pub use torch::empty_cache;
pub use trace::py_trace;

/// How long a thread may take to reach a safe point.
pub const SAFE_POINT_LIMIT: Duration = Duration::from_secs(2);

/// Whether `pid` is a process without libmemshim.so, which the verbs then
/// reach by ptrace (a shimmed one goes the usual way, over its socket). One
/// whose maps we may not read is another user's: the ptrace road's refusal
/// says so, and what to do.
pub fn applies(pid: i32) -> bool {
    // A thread id goes the usual way, which refuses it ("a thread of process
    // N"): /proc/<tid> reads as its process's maps.
    if procfs::is_thread_id(pid) {
        return false;
    }
    match procfs::memshim_in(pid) {
        Ok(Loaded::No) => looks_like_python(pid) && !procfs::all_threads_exited(pid),
        // A bridge `detach`ed: mapped, idle, its socket gone.
        Ok(Loaded::Attached) => {
            !bridge_serves(pid) && looks_like_python(pid) && !procfs::all_threads_exited(pid)
        }
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied && looks_like_python(pid),
        Ok(Loaded::Preloaded) => false,
    }
}

/// Whether an attached bridge serves `pid`: its socket file is there (the
/// bridge removes it at `detach` and at exit).
pub fn bridge_serves(pid: i32) -> bool {
    procfs::read_proc(pid).is_ok_and(|p| crate::reach::socket::locate(&p).path().exists())
}

/// The one line every answer reached this way carries.
pub fn reached_line(pid: i32, how: &Reached) -> String {
    format!(
        "pid {pid}: reached by ptrace, not preloaded (CPython {}.{}; thread {} was in {}, \
         and goes on as before)",
        how.version.0, how.version.1, how.tid, how.syscall
    )
}

/// How a process was reached.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reached {
    /// Always "ptrace".
    pub by: &'static str,
    /// The CPython version.
    pub version: (u32, u32),
    /// The thread the calls ran on.
    pub tid: i32,
    /// The system call it was waiting in.
    pub syscall: &'static str,
}

/// The failure for an error of the ptrace road.
pub fn failure(pid: i32, e: Error) -> Failure {
    match e {
        Error::Refused(r) => {
            let s = refusal_status(r.kind);
            let f = Failure::new(s, Some(pid), r.message);
            if r.kind == Refusal::NotCpython {
                f.hint("libmemshim.so is not loaded in it either: start it with LD_PRELOAD=/path/to/libmemshim.so")
            } else {
                f
            }
        }
        Error::Failed(Fail::NoSafePoint(seen)) => Failure::new(
            status::NO_SAFE_POINT,
            Some(pid),
            format!(
                "no thread reached a safe point (an idle system call) within {} s; nothing was \
                 changed ({seen})",
                SAFE_POINT_LIMIT.as_secs()
            ),
        )
        .hint(
            "try again when the process idles; on CPython 3.14+ `memshim-ctl attach PID` reaches a \
             busy one through its remote debugging (PEP 768); or start it with LD_PRELOAD",
        ),
        Error::Failed(Fail::Gone) => Failure::new(
            status::NOT_FOUND,
            Some(pid),
            "the process exited while memshim-ctl reached it",
        ),
        Error::Failed(Fail::Exec) => Failure::new(
            status::NOT_FOUND,
            Some(pid),
            "the process started another program (execve in another thread) while memshim-ctl \
             reached it; the new program runs untouched",
        ),
        // Another tracer came first (a second memshim-ctl at the same
        // moment, a debugger): the same refusal as one found before.
        Error::Failed(Fail::Seize(e)) if tracer(pid).is_some() => Failure::new(
            status::TRACED,
            Some(pid),
            format!(
                "process {pid} is already traced by process {} (another memshim-ctl, strace or \
                 a debugger; ptrace: {e}); try again when it is done",
                tracer(pid).unwrap_or_default()
            ),
        ),
        Error::Failed(Fail::Seize(e)) => Failure::new(
            status::PERMISSION,
            Some(pid),
            format!("ptrace refused to trace the process: {e}"),
        )
        .hint("see docs/attach.md, \"Refusals\""),
        // A Python step that cannot run, as where the interpreter shuts
        // down under the preload.
        Error::Failed(Fail::NotInitialised) => Failure::new(
            status::PYTHON_STEP,
            Some(pid),
            "its interpreter is not running (not initialised yet, or finalized): \
             nothing was changed",
        ),
        Error::Failed(Fail::Interrupted(sig)) => Failure::new(
            status::FAILED,
            Some(pid),
            format!(
                "interrupted by signal {sig} while looking for a safe point; nothing was changed"
            ),
        ),
        Error::Failed(Fail::Io(e)) => Failure::new(
            status::FAILED,
            Some(pid),
            format!("reaching the process by ptrace failed: {e}"),
        ),
    }
}

/// The exit status of a refusal.
pub fn refusal_status(kind: Refusal) -> Exit {
    match kind {
        Refusal::Yama => status::YAMA,
        Refusal::NoPtrace => status::NO_PTRACE,
        Refusal::UserNamespace => status::USER_NAMESPACE,
        Refusal::Seccomp => status::SECCOMP,
        Refusal::Traced => status::TRACED,
        Refusal::RemoteDebugDisabled => status::REMOTE_DEBUG_DISABLED,
        Refusal::FreeThreaded => status::FREE_THREADED,
        Refusal::UnsupportedVersion => status::UNSUPPORTED_VERSION,
        Refusal::NotCpython => status::NOT_CPYTHON,
    }
}

/// A process without the preload as `list` shows it: a CPython, and
/// whether the verbs may reach it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Candidate {
    /// Pid as we see it.
    pub pid: i32,
    /// Effective uid.
    pub uid: u32,
    /// Command line.
    pub command: String,
    /// RSS in bytes.
    pub rss: u64,
    /// Always "not preloaded".
    pub preload: &'static str,
    /// `"3.11"`, where the version could be told.
    pub python: Option<String>,
    /// No refusal applies: a verb may reach it (whether a thread reaches a
    /// safe point in time is found only when one runs).
    pub reachable: bool,
    /// The refusal's `--json` name (`"traced"`), if not reachable.
    pub code: Option<Exit>,
    /// Why not, and what to do.
    pub reason: Option<String>,
}

/// Whether `pid` (without libmemshim.so) looks like a CPython by its files,
/// before any symbol is read: its executable's or a mapped library's name,
/// or, where those are another user's to read, its `comm`. Any other
/// process without the shim is answered as before the ptrace road: the
/// shim is not loaded (or, unreadable, permission denied).
fn looks_like_python(pid: i32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    name.starts_with("python")
        || comm.starts_with("python")
        || std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .is_ok_and(|m| m.contains("/libpython3"))
}

/// `pid` as `list` shows a process without the preload, if it is a CPython
/// (the checks of `memshim_reach::examine`, which touch nothing).
pub fn candidate(p: &procfs::Proc) -> Option<Candidate> {
    if !looks_like_python(p.pid) {
        return None;
    }
    let mut c = Candidate {
        pid: p.pid,
        uid: p.uid,
        command: p.command.clone(),
        rss: p.rss,
        preload: "not preloaded",
        python: None,
        reachable: false,
        code: None,
        reason: None,
    };
    match memshim_reach::examine(p.pid) {
        Ok((py, _)) => {
            c.python = Some(format!("{}.{}", py.version.0, py.version.1));
            c.reachable = true;
        }
        Err(Error::Refused(r)) if r.kind == Refusal::NotCpython => return None,
        Err(Error::Refused(r)) => {
            c.code = Some(refusal_status(r.kind));
            c.reason = Some(r.message);
        }
        Err(Error::Failed(_)) => return None, // exited meanwhile
    }
    Some(c)
}

/// The pid tracing a thread of `pid`, if any (`TracerPid` in a thread's status).
fn tracer(pid: i32) -> Option<i32> {
    // A tracer holds threads, not the process: another memshim-ctl holds
    // one thread of it (any one), strace every one.
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.filter_map(|t| t.ok()).find_map(|t| {
        std::fs::read_to_string(t.path().join("status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:")?.trim().parse().ok())
            .filter(|&t| t != 0)
    })
}

/// RSS of `pid`, bytes (`/proc/PID/statm`).
fn rss(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn reached(calls: &PythonCalls) -> Reached {
    Reached {
        by: "ptrace",
        version: calls.python.version,
        tid: calls.tid(),
        syscall: calls.syscall(),
    }
}

/// The file name the code the verbs run is compiled as ([`answer_of`]):
/// what tracebacks and tracemalloc name (trace.rs leaves it out).
const CODE_FILE: &str = "<memshim-ctl>";

/// The expression that runs `code` (statements, compiled as the file
/// [`CODE_FILE`]) in a namespace of its own,
/// not the program's, and makes the `str` it leaves in `answer` (`"None"`
/// if it raised: the exception is caught inside). The namespace is emptied
/// after, so that the functions the code defines (which refer to it) leave
/// no reference cycle behind in a process whose collector may be off.
/// Each level of indentation is one space, to fit the injector's 3 KiB.
fn answer_of(code: &str) -> String {
    let file = CODE_FILE;
    let mut compact = String::from("try:\n");
    for l in code.lines() {
        let body = l.trim_start_matches(' ');
        let indent = (l.len() - body.len()) / 4 + 1;
        compact += &format!("{}{body}\n", " ".repeat(indent));
    }
    compact += "except BaseException:\n answer = None\n";
    format!(
        "(lambda n: (exec(compile({compact:?}, '{file}', 'exec'), n), str(n.get('answer')), n.clear())[1])({{}})"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each piece of Python code the verbs run, wrapped, fits the
    /// injector's 3 KiB.
    #[test]
    fn the_code_the_verbs_run_fits_the_injector() {
        for code in [
            release::CUDA_RELEASE,
            torch::EMPTY_CACHE,
            torch::TORCH_SECTION,
            trace::PY_TRACE,
        ] {
            assert!(answer_of(code).len() < 3072, "{}", answer_of(code).len());
        }
    }
}
