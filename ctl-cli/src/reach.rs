//! Verbs on a CPython process started without the preload (docs/attach.md):
//! `release` and `gc` reach it by ptrace (the `memshim-reach` crate, where
//! this CLI's system calls live), call its C API on a thread held at a safe
//! point, restore that thread exactly and let it go. Their output is the
//! shimmed process's, plus one line saying how the process was reached.

use crate::cmd::OneArgs;
use crate::exit::{self as status, Exit, Failure};
use crate::out::outln;
use crate::procfs;
use memshim_proto::{GcResult, ReleaseResult, ReleaseStep, ReleaseStepKind};
use memshim_reach::{Error, Failure as Fail, PythonCalls, Refusal};
use std::time::{Duration, Instant};

/// How long a thread may take to reach a safe point.
pub const SAFE_POINT_LIMIT: Duration = Duration::from_secs(2);

/// Whether `pid` is a process without libmemshim.so, which the verbs then
/// reach by ptrace (a shimmed one goes the usual way, over its socket). One
/// whose maps we may not read is another user's: the ptrace road's refusal
/// says so, and what to do.
pub fn applies(pid: i32) -> bool {
    match procfs::shim_loaded(pid) {
        Ok(false) => !procfs::all_threads_exited(pid),
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
        Ok(true) => false,
    }
}

/// The one line every answer reached this way carries.
pub fn reached_line(pid: i32, how: &Reached) -> String {
    format!(
        "pid {pid}: reached by ptrace, without the preload (CPython {}.{}; thread {} was in {}, \
         and goes on as before)",
        how.version.0, how.version.1, how.tid, how.syscall
    )
}

/// Prints the answer of a one-process verb reached this way, as
/// `cmd::ask_one` prints a shimmed process's (`line` makes the human line),
/// with how it was reached: the line of [`reached_line`], or in JSON a
/// `"reached"` field beside the answer's.
pub fn print_one<R: serde::Serialize>(
    a: &OneArgs,
    r: &R,
    how: &Reached,
    line: impl FnOnce(&R) -> String,
) -> Result<Exit, Failure> {
    if a.json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        v["reached"] = serde_json::json!(how);
        outln!("{v}")?;
    } else {
        outln!("pid {}: {}", a.pid, line(r))?;
        outln!("{}", reached_line(a.pid, how))?;
    }
    Ok(status::OK)
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
            let s = match r.kind {
                Refusal::Yama => status::YAMA,
                Refusal::NoPtrace => status::NO_PTRACE,
                Refusal::UserNamespace => status::USER_NAMESPACE,
                Refusal::Seccomp => status::SECCOMP,
                Refusal::Traced => status::TRACED,
                Refusal::RemoteDebugDisabled => status::REMOTE_DEBUG_DISABLED,
                Refusal::FreeThreaded => status::FREE_THREADED,
                Refusal::UnsupportedVersion => status::UNSUPPORTED_VERSION,
                Refusal::NotCpython => status::NOT_CPYTHON,
            };
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
        .hint("try again when the process idles, or start it with LD_PRELOAD"),
        Error::Failed(Fail::Gone) => Failure::new(
            status::NOT_FOUND,
            Some(pid),
            "the process exited while memshim-ctl reached it",
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
        Error::Failed(Fail::Io(e)) => Failure::new(
            status::FAILED,
            Some(pid),
            format!("reaching the process by ptrace failed: {e}"),
        ),
    }
}

/// The pid tracing `pid`, if any (`TracerPid` in its status).
fn tracer(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:")?.trim().parse().ok())
        .filter(|&t| t != 0)
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

/// The code of the CUDA step: torch's own calls, where CUDA is in use;
/// any exception is caught, none reaches the process's stderr.
const TORCH_CACHES: &str = "\
try:
    import sys as _m_sys
    _m_t = _m_sys.modules.get('torch')
    if _m_t is not None and _m_t.cuda.is_initialized():
        _m_t.cuda.empty_cache()
        _m_h = getattr(_m_t._C, '_host_emptyCache', None)
        if _m_h is not None:
            _m_h()
    del _m_sys, _m_t
except BaseException:
    pass
";

/// `release` on a process without the preload: gc.collect(), torch's CUDA
/// and pinned host caches when torch is imported, then the process's own
/// allocator's return (glibc's `malloc_trim(0)`), each with its RSS.
pub fn release(pid: i32) -> Result<(ReleaseResult, Reached), Failure> {
    let start = Instant::now();
    let rss_before = rss(pid);
    let mut calls = memshim_reach::python(pid, SAFE_POINT_LIMIT).map_err(|e| failure(pid, e))?;
    let how = reached(&calls);
    let result = steps(pid, &mut calls);
    let finished = calls.finish();
    let steps = result.map_err(|e| failure(pid, e))?;
    finished.map_err(|e| failure(pid, e))?;
    let rss_after = rss(pid);
    Ok((
        ReleaseResult {
            rss_before,
            rss_after,
            released: rss_before.saturating_sub(rss_after),
            elapsed_ms: ms(start),
            steps,
        },
        how,
    ))
}

fn steps(pid: i32, calls: &mut PythonCalls) -> Result<Vec<ReleaseStep>, Error> {
    let mut out = Vec::new();
    let (t, before) = (Instant::now(), rss(pid));
    let mut gc = ReleaseStep::new(ReleaseStepKind::Gc, "rss");
    if calls.gc_collect()?.is_none() {
        gc = gc.failed("gc.collect() raised");
    }
    (gc.before, gc.after, gc.elapsed_ms) = (before, rss(pid), ms(t));
    out.push(gc);
    let (t, before) = (Instant::now(), rss(pid));
    let mut cache = ReleaseStep::new(ReleaseStepKind::EmptyCache, "rss");
    if calls.imported("torch")? {
        if !calls.run(TORCH_CACHES)? {
            cache = cache.failed("torch's cache calls raised");
        }
    } else {
        cache = cache.nothing_to_do("torch is not imported");
    }
    (cache.before, cache.after, cache.elapsed_ms) = (before, rss(pid), ms(t));
    out.push(cache);
    let (t, before) = (Instant::now(), rss(pid));
    let mut trim = ReleaseStep::new(ReleaseStepKind::Purge, "rss");
    if calls.malloc_trim()?.is_none() {
        trim = trim.nothing_to_do("no malloc_trim in the process (not glibc's allocator)");
    }
    (trim.before, trim.after, trim.elapsed_ms) = (before, rss(pid), ms(t));
    out.push(trim);
    Ok(out)
}

/// `gc` on a process without the preload: `gc.collect()` as Python calls it.
pub fn gc(pid: i32) -> Result<(GcResult, Reached), Failure> {
    let rss_before = rss(pid);
    let mut calls = memshim_reach::python(pid, SAFE_POINT_LIMIT).map_err(|e| failure(pid, e))?;
    let how = reached(&calls);
    let t = Instant::now();
    let collected = calls.gc_collect();
    let elapsed_ms = ms(t);
    let finished = calls.finish();
    let collected = collected.map_err(|e| failure(pid, e))?;
    finished.map_err(|e| failure(pid, e))?;
    let Some(collected) = collected else {
        return Err(Failure::new(
            status::PYTHON_STEP,
            Some(pid),
            "gc.collect() raised in the process",
        ));
    };
    Ok((
        GcResult {
            collected: collected as u64,
            rss_before,
            rss_after: rss(pid),
            elapsed_ms,
        },
        how,
    ))
}
