//! Verbs on a CPython process started without the preload (docs/attach.md):
//! `release` and `gc` reach it by ptrace (the `memshim-reach` crate, where
//! this CLI's system calls live), call its C API on a thread held at a safe
//! point, restore that thread exactly and let it go. Their output is the
//! shimmed process's, plus one line saying how the process was reached.

use crate::exit::{self as status, Exit, Failure};
use crate::reach::procfs;
use memshim_proto::{
    CgroupStats, GcResult, ProcessStats, PythonSection, PythonUnavailable, ReleaseResult,
    ReleaseStep, ReleaseStepKind,
};
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
        Ok(false) => looks_like_python(pid) && !procfs::all_threads_exited(pid),
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied && looks_like_python(pid),
        Ok(true) => false,
    }
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
    let gc = step(pid, ReleaseStepKind::Gc, |s| {
        Ok(match calls.gc_collect()? {
            None => s.failed("gc.collect() raised"),
            Some(_) => s,
        })
    })?;
    let cache = step(pid, ReleaseStepKind::EmptyCache, |s| {
        Ok(if !calls.imported("torch")? {
            s.nothing_to_do("torch is not imported")
        } else if !calls.run(TORCH_CACHES)? {
            s.failed("torch's cache calls raised")
        } else {
            s
        })
    })?;
    let trim = step(pid, ReleaseStepKind::Purge, |s| {
        Ok(match calls.malloc_trim()? {
            None => s.nothing_to_do("no malloc_trim in the process (not glibc's allocator)"),
            Some(_) => s,
        })
    })?;
    Ok(vec![gc, cache, trim])
}

/// One step of `release`: what `run` makes of it, with the RSS before and
/// after and the time it took.
fn step(
    pid: i32,
    kind: ReleaseStepKind,
    run: impl FnOnce(ReleaseStep) -> Result<ReleaseStep, Error>,
) -> Result<ReleaseStep, Error> {
    let (t, before) = (Instant::now(), rss(pid));
    let mut s = run(ReleaseStep::new(kind, "rss"))?;
    (s.before, s.after, s.elapsed_ms) = (before, rss(pid), ms(t));
    Ok(s)
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

/// `stats` of a process without the preload: the sections whose figures
/// exist without the shim (the kernel's, the cgroup's, CPython's through
/// the injector), in the shape of the shimmed report; `allocator` and
/// `config` are `null`, and `allocator_unavailable` says why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    /// The process id.
    pub pid: i32,
    /// How it was reached.
    pub reached: Reached,
    /// Always `null`: jemalloc's figures need the shim.
    pub allocator: Option<()>,
    /// Why there is no `allocator` section.
    pub allocator_unavailable: String,
    /// The process as the kernel sees it (`unmanaged` is all of its RSS:
    /// none of it is the shim's).
    pub process: ProcessStats,
    /// Its memory cgroup, if one can be read here.
    pub cgroup: Option<CgroupStats>,
    /// Always `null`: the shim's settings and state.
    pub config: Option<()>,
    /// CPython's figures, read by the injector.
    pub python: Option<PythonSection>,
    /// Why `python` is absent.
    pub python_unavailable: Option<PythonUnavailable>,
    /// Time taken, ms.
    pub elapsed_ms: f64,
}

/// The sentence for `allocator_unavailable`.
pub const NO_ALLOCATOR: &str = "libmemshim.so is not loaded: the process's malloc is its own \
                                (glibc's), whose figures memshim does not read";

/// The Python expression that reads the `python` section (the figures of
/// the shim's bridge, `shim/src/python/gc.rs`), as one line of text:
/// `version|abiflags has t|allocated blocks|gc figures` where the gc
/// figures are empty unless the program imported `gc` (nothing is
/// imported: `sys` always is).
const PYTHON_FIGURES: &str = "(lambda s, g, t: '|'.join((s.version.split()[0], \
str(int('t' in getattr(s, 'abiflags', ''))), str(s.getallocatedblocks()), \
'' if g is None else ' '.join((str(int(g.isenabled())), t(g.get_count()), \
t(g.get_threshold()), t([x['collections'] for x in g.get_stats()]))))))\
(__import__('sys'), __import__('sys').modules.get('gc'), \
lambda v: ' '.join(map(str, (list(v) + [0, 0, 0])[:3])))";

/// The `python` section from [`PYTHON_FIGURES`]'s line.
fn python_section(line: &str) -> Option<PythonSection> {
    let mut parts = line.split('|');
    let version = parts.next()?.to_owned();
    let free_threaded = parts.next()? == "1";
    let allocated_blocks = parts.next()?.parse().ok()?;
    let gc: Vec<u64> = parts
        .next()?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let mut s = PythonSection {
        version,
        free_threaded,
        allocated_blocks,
        ..Default::default()
    };
    if let [enabled, rest @ ..] = &gc[..] {
        let three = |i: usize| rest.get(i..i + 3).map(|v| [v[0], v[1], v[2]]);
        s.gc_enabled = *enabled != 0;
        s.gc_counts = three(0);
        s.gc_thresholds = three(3);
        s.gc_collections = three(6);
        three(6)?;
    }
    Some(s)
}

/// A field of `/proc/PID/status` in kB, as bytes.
fn status_bytes(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        v.split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    })
}

/// The `process` section from `/proc/PID/status` (and `smaps_rollup`
/// with `pss`, which costs the process the kernel's walk of its pages).
fn process_stats(pid: i32, pss: bool) -> ProcessStats {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status_bytes(&status, "VmRSS").unwrap_or_else(|| rss(pid));
    let pss = pss
        .then(|| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .flatten()
        .and_then(|s| status_bytes(&s, "Pss"));
    ProcessStats {
        rss,
        pss,
        anon: status_bytes(&status, "RssAnon"),
        file: status_bytes(&status, "RssFile"),
        shmem: status_bytes(&status, "RssShmem"),
        swap: status_bytes(&status, "VmSwap"),
        unmanaged: rss,
    }
}

/// `stats` on a process without the preload, with its `cgroup` section as
/// the caller read it.
pub fn stats(pid: i32, pss: bool, cgroup: Option<CgroupStats>) -> Result<Stats, Failure> {
    let start = Instant::now();
    let mut calls = memshim_reach::python(pid, SAFE_POINT_LIMIT).map_err(|e| failure(pid, e))?;
    let how = reached(&calls);
    let read = (|| {
        let line = calls.eval(PYTHON_FIGURES)?;
        let enabled = calls.gc_is_enabled()?;
        let threads = calls.threads()?;
        Ok::<_, Error>((line, enabled, threads))
    })();
    let finished = calls.finish();
    let (line, enabled, threads) = read.map_err(|e| failure(pid, e))?;
    finished.map_err(|e| failure(pid, e))?;
    let (python, python_unavailable) = match line.as_deref().and_then(python_section) {
        Some(mut s) => {
            if s.gc_counts.is_none() {
                // `gc` not imported: the C API's flag (3.10+); before 3.10
                // only the gc module can disable the collector.
                s.gc_enabled = enabled.unwrap_or(true);
            }
            s.threads = threads.unwrap_or(0);
            (Some(s), None)
        }
        None => (
            None,
            Some(PythonUnavailable::Error {
                message: format!(
                    "the figures could not be read in the process ({})",
                    line.as_deref().unwrap_or("Python raised")
                ),
            }),
        ),
    };
    Ok(Stats {
        pid,
        reached: how,
        allocator: None,
        allocator_unavailable: NO_ALLOCATOR.into(),
        process: process_stats(pid, pss),
        cgroup,
        config: None,
        python,
        python_unavailable,
        elapsed_ms: ms(start),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_figures_are_parsed_with_and_without_gc() {
        let s = python_section("3.11.9|0|12345|1 5 0 0 700 10 10 3 2 1").unwrap();
        assert_eq!(s.version, "3.11.9");
        assert!(s.gc_enabled && !s.free_threaded);
        assert_eq!(s.allocated_blocks, 12345);
        assert_eq!(s.gc_counts, Some([5, 0, 0]));
        assert_eq!(s.gc_thresholds, Some([700, 10, 10]));
        assert_eq!(s.gc_collections, Some([3, 2, 1]));
        let s = python_section("3.8.20|0|7|").unwrap();
        assert_eq!((s.gc_counts, s.allocated_blocks), (None, 7));
        // A short gc list is no section, not zeros.
        assert!(python_section("3.8.20|0|7|1 5 0").is_none());
        assert!(python_section("garbage").is_none());
    }
}
