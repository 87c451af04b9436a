//! Verbs on a CPython process started without the preload (docs/attach.md):
//! `release`, `gc`, `empty-cache`, `stats` and `profile --python` reach it by ptrace (the `memshim-reach` crate, where
//! this CLI's system calls live), call its C API on a thread held at a safe
//! point, restore that thread exactly and let it go. Their output is the
//! shimmed process's, plus one line saying how the process was reached.

use crate::exit::{self as status, Exit, Failure};
use crate::reach::procfs;
use memshim_proto::{
    CgroupStats, DeviceChange, EmptyCacheResult, GcResult, MAX_PY_TRACE_SECONDS, ProcessStats,
    PyLine, PySnapshot, PyTraceAction, PyTraceReply, PythonSection, PythonUnavailable,
    ReleaseResult, ReleaseStep, ReleaseStepKind, TorchDevice, TorchSection,
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

/// The CUDA steps of `release` on a process without the preload, as the
/// shim's bridge makes them (`shim/src/python/cuda.rs`): ipc_collect, the
/// cuBLAS workspaces, empty_cache on each device with a context, the pinned
/// host cache; or one `empty_cache` step with nothing to do without torch or
/// CUDA. `answer` holds one `;`-separated line per step,
/// `kind|measure|done/skip/fail|reason|ms|before|after|i:before:after,...`.
const CUDA_RELEASE: &str = "\
import sys, time
t = sys.modules.get('torch')
out = []
def add(kind, measure, ok, why, t0, devs, before=0, after=0):
    before, after = (sum(d[1] for d in devs), sum(d[2] for d in devs)) if devs else (before, after)
    out.append('|'.join((kind, measure, ok, why.replace('|', '/').replace(';', ','), '%.3f' % ((time.monotonic() - t0) * 1e3), str(before), str(after), ','.join('%d:%d:%d' % d for d in devs))))
if t is None or not t.cuda.is_initialized():
    add('empty_cache', 'cuda_reserved', 'skip', 'CUDA is not initialized' if t else 'torch is not imported', time.monotonic(), [])
else:
    c, C, has = t.cuda, t._C, getattr(t._C, '_cuda_hasPrimaryContext', None)
    def devs():
        m = {i: c.memory_stats(i) for i in range(min(c.device_count(), 1024))}
        return {i: s for i, s in m.items() if (has(i) if has else s.get('reserved_bytes.all.current', 0) > 0)}
    def step(kind, measure, key, run):
        t0, b = time.monotonic(), devs()
        try:
            ok, why = ('done', '') if run(b) else ('skip', 'this torch has no call for it')
        except Exception as e:
            ok, why = 'fail', str(e) or type(e).__name__
        a = devs()
        add(kind, measure, ok, why, t0, [(i, s.get(key, 0), a.get(i, {}).get(key, 0)) for i, s in b.items()])
    def call(f):
        return f is not None and (f() or True)
    def empty(b):
        for i, s in b.items():
            if s.get('reserved_bytes.all.current', 0) > 0:
                with c.device(i):
                    if c.is_current_stream_capturing():
                        raise RuntimeError('a CUDA graph capture is in progress on this thread')
                    c.empty_cache()
        return True
    A = 'allocated_bytes.all.current'
    step('ipc_collect', 'cuda_allocated', A, lambda b: call(getattr(C, '_cuda_ipc_collect', None)))
    step('cublas_workspaces', 'cuda_allocated', A, lambda b: call(getattr(C, '_cuda_clearCublasWorkspaces', None)))
    step('empty_cache', 'cuda_reserved', 'reserved_bytes.all.current', empty)
    t0 = time.monotonic()
    def cached():
        h = c.host_memory_stats()
        return max(h.get('allocated_bytes.current', 0) - h.get('active_bytes.current', 0), 0)
    try:
        before = cached()
    except Exception:
        before = None
    if before is None:
        add('host_cache', 'pinned_host_cached', 'skip', 'this torch does not report its pinned host cache', t0, [])
    else:
        f = getattr(sys.modules.get('torch.accelerator'), 'empty_host_cache', None) or getattr(C, '_host_emptyCache', None)
        try:
            ok, why = ('done', '') if call(f) else ('skip', 'this torch has no call for it')
        except Exception as e:
            ok, why = 'fail', str(e) or type(e).__name__
        try:
            after = cached()
        except Exception:
            after = 0
        add('host_cache', 'pinned_host_cached', ok, why, t0, [], before, after)
answer = ';'.join(out)
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
    let t = Instant::now();
    let quiet = |s: ReleaseStep| {
        let mut s = s;
        s.elapsed_ms = ms(t);
        vec![s]
    };
    let cache = ReleaseStep::new(ReleaseStepKind::EmptyCache, "cuda_reserved");
    // Without torch, no Python code is compiled in the process (its
    // allocations would stay in pymalloc's arenas).
    let cuda = if !calls.imported("torch")? {
        quiet(cache.nothing_to_do("torch is not imported"))
    } else {
        match calls
            .eval(&answer_of(CUDA_RELEASE))?
            .as_deref()
            .and_then(cuda_steps)
        {
            Some(steps) => steps,
            None => quiet(cache.failed("torch's cache calls raised in the process")),
        }
    };
    let trim = step(pid, ReleaseStepKind::Purge, |s| {
        Ok(match calls.malloc_trim()? {
            None => s.nothing_to_do("no malloc_trim in the process (not glibc's allocator)"),
            Some(_) => s,
        })
    })?;
    Ok([vec![gc], cuda, vec![trim]].concat())
}

/// The steps from [`CUDA_RELEASE`]'s answer.
fn cuda_steps(answer: &str) -> Option<Vec<ReleaseStep>> {
    answer
        .split(';')
        .map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            let [kind, measure, outcome, why, elapsed, before, after, devices] = f[..] else {
                return None;
            };
            let kind = serde_json::from_value(serde_json::json!(kind))
                .ok()
                .filter(|k| *k != ReleaseStepKind::Unknown)?;
            let mut s = ReleaseStep::new(kind, measure);
            s = match outcome {
                "done" => s,
                "skip" => s.nothing_to_do(why),
                _ => s.failed(why),
            };
            (s.elapsed_ms, s.before, s.after) = (
                elapsed.parse().ok()?,
                before.parse().ok()?,
                after.parse().ok()?,
            );
            s.devices = devices
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| {
                    let mut n = d.split(':').map(|x| x.parse::<u64>().ok());
                    Some(DeviceChange {
                        index: u32::try_from(n.next()??).ok()?,
                        before: n.next()??,
                        after: n.next()??,
                    })
                })
                .collect::<Option<_>>()?;
            Some(s)
        })
        .collect()
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

/// The code of `empty-cache` on a process without the preload, as the
/// shim's bridge does it (`shim/src/python/cuda.rs`): the devices with a
/// context, their reserved bytes before and after `empty_cache()` on each.
/// `answer` is `done|reason|devices|before|after` (reason empty when done).
const EMPTY_CACHE: &str = "\
import sys
t = sys.modules.get('torch')
devices, before, after, why = [], 0, 0, ''
if t is None:
    why = 'torch is not imported'
elif not t.cuda.is_initialized():
    why = 'CUDA is not initialized'
else:
    c = t.cuda
    has = getattr(t._C, '_cuda_hasPrimaryContext', None)
    def reserved(i):
        return c.memory_stats(i).get('reserved_bytes.all.current', 0)
    devices = [i for i in range(min(c.device_count(), 1024))
               if (has(i) if has is not None else reserved(i) > 0)]
    each = [reserved(i) for i in devices]
    before = sum(each)
    for i, r in zip(devices, each):
        if r > 0:
            with c.device(i):
                if c.is_current_stream_capturing():
                    why = 'a CUDA graph capture is in progress on this thread'
                    break
                c.empty_cache()
    after = sum(reserved(i) for i in devices)
answer = '|'.join((('skip' if why else 'done'), why, ' '.join(map(str, devices)), str(before), str(after)))
";

/// The `torch` section of `stats` on a process without the preload, read
/// as the shim's bridge reads it (`shim/src/python/torch.rs`): `answer` is
/// the section as JSON (`fragmentation` is computed here), or `null` when
/// torch is not imported. Nothing is imported, CUDA is never initialised,
/// and only devices with a context are named.
const TORCH_SECTION: &str = "\
import sys
t = sys.modules.get('torch')
def j(v):
    if v is None or isinstance(v, bool):
        return {None: 'null', True: 'true', False: 'false'}[v]
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '\"' + ''.join(c if c.isprintable() and c not in '\"\\\\' else '\\\\u%04x' % ord(c) for c in v) + '\"'
    if isinstance(v, dict):
        return '{' + ','.join(j(k) + ':' + j(x) for k, x in v.items()) + '}'
    return '[' + ','.join(map(j, v)) + ']'
def s(f, *a):
    try:
        return f(*a)
    except Exception:
        return None
if t is None:
    answer = 'null'
else:
    c, C = t.cuda, sys.modules.get('torch._C')
    on = bool(c.is_initialized())
    r = {'version': str(t.__version__), 'cuda_initialized': on, 'devices': []}
    conf = s(getattr(C, '_accelerator_getAllocatorSettings', None)) if on else None
    if not conf:
        e = getattr(sys.modules.get('os'), 'environ', {})
        conf = e.get('PYTORCH_CUDA_ALLOC_CONF', e.get('PYTORCH_ALLOC_CONF'))
    if conf is not None:
        r['alloc_conf'] = str(conf)
    if on:
        has = getattr(C, '_cuda_hasPrimaryContext', None)
        for i in range(min(c.device_count(), 1024)):
            m = c.memory_stats(i)
            g = lambda k: int(m.get(k, 0))
            if not (has(i) if has else g('reserved_bytes.all.current') > 0):
                continue
            u = s(lambda: str(c.get_device_properties(i).uuid))
            r['devices'].append({'index': i, 'allocated': g('allocated_bytes.all.current'), 'reserved': g('reserved_bytes.all.current'), 'active': g('active_bytes.all.current'), 'inactive_split': g('inactive_split_bytes.all.current'), 'peak_allocated': g('allocated_bytes.all.peak'), 'num_alloc_retries': g('num_alloc_retries'), 'num_ooms': g('num_ooms'), 'allocations': g('allocation.all.allocated'), 'uuid': u if u is None or u.startswith('GPU-') else 'GPU-' + u})
        b = s(c.get_allocator_backend)
        if b is not None:
            r['allocator_backend'] = str(b)
        h = s(c.host_memory_stats)
        if h is not None:
            a, act = int(h.get('allocated_bytes.current', 0)), int(h.get('active_bytes.current', 0))
            r['host_pinned'] = {'allocated': a, 'active': act, 'cached': max(a - act, 0)}
    answer = j(r)
";

/// The section from [`TORCH_SECTION`]'s answer: `Ok(None)` without torch.
fn torch_section(answer: &str) -> Result<Option<TorchSection>, String> {
    let mut t: Option<TorchSection> = serde_json::from_str(answer).map_err(|e| e.to_string())?;
    for d in t.iter_mut().flat_map(|t| t.devices.iter_mut()) {
        d.fragmentation = TorchDevice::fragmentation_of(d.inactive_split, d.reserved);
    }
    Ok(t)
}

/// `profile --python`'s tracemalloc on a process without the preload, as
/// the shim's bridge does it (`shim/src/python/tracemalloc.rs`, through
/// `_tracemalloc`, which imports nothing else). Tracing memshim-ctl started
/// is marked on that module (`_memshim_until`, when it should stop), so
/// that a later `--stop` stops it and never the program's own. No thread
/// in the process stops it at that time: memshim-ctl does, at the end of
/// its run (docs/attach.md). `answer`: a line of figures
/// (`tracing ours changed frames traced peak overhead ms-left`, then for a
/// snapshot `bytes count distinct-lines µs`), then one line per source
/// line, `bytes\tcount\tline\tfile`.
const PY_TRACE: &str = "\
import time
m = __import__('_tracemalloc')
act, changed = '@ACTION@', False
ours = bool(getattr(m, '_memshim_until', 0))
if ours and not m.is_tracing():
    del m._memshim_until
    ours = False
if act == 'start' and not m.is_tracing():
    m.start(@FRAMES@)
    m._memshim_until, ours, changed = time.time() + @SECONDS@, True, True
elif act == 'start' and ours:
    m._memshim_until = time.time() + @SECONDS@
elif act == 'stop' and ours:
    m.stop()
    del m._memshim_until
    ours, changed = False, True
t = m.is_tracing()
cur, peak = m.get_traced_memory()
left = int(max(m._memshim_until - time.time(), 0) * 1000) if ours else -1
head = [int(t), int(ours), int(changed), m.get_traceback_limit(), cur, peak, m.get_tracemalloc_memory(), left]
rows = []
if act == 'snapshot' and t:
    t0, agg, total = time.monotonic(), {}, [0, 0]
    for tr in m._get_traces():
        total[0] += tr[1]
        total[1] += 1
        if tr[2]:
            e = agg.setdefault(tr[2][0], [0, 0])
            e[0] += tr[1]
            e[1] += 1
    top = sorted(agg.items(), key=lambda kv: (-kv[1][0], kv[0][1]))[:@TOP@]
    head += total + [len(agg), int((time.monotonic() - t0) * 1e6)]
    rows = ['%d\\t%d\\t%d\\t%s' % (b, n, k[1], k[0].replace('\\n', '?')) for k, (b, n) in top]
answer = '\\n'.join([' '.join(map(str, head))] + rows)
";

/// Lines of a snapshot read by ptrace (its answer comes back through the
/// injector's 64 KiB).
pub const PY_TRACE_TOP: usize = 400;

/// A `python_trace` action on a process without the preload.
pub fn py_trace(
    pid: i32,
    action: PyTraceAction,
    seconds: Option<u64>,
) -> Result<(PyTraceReply, Reached), Failure> {
    let name = match action {
        PyTraceAction::Status => "status",
        PyTraceAction::Start => "start",
        PyTraceAction::Snapshot => "snapshot",
        PyTraceAction::Stop => "stop",
    };
    let code = PY_TRACE
        .replace("@ACTION@", name)
        .replace("@FRAMES@", "1")
        .replace(
            "@SECONDS@",
            &seconds.unwrap_or(60).min(MAX_PY_TRACE_SECONDS).to_string(),
        )
        .replace("@TOP@", &PY_TRACE_TOP.to_string());
    let mut calls = memshim_reach::python(pid, SAFE_POINT_LIMIT).map_err(|e| failure(pid, e))?;
    let how = reached(&calls);
    let answer = calls.eval(&answer_of(&code));
    let finished = calls.finish();
    let answer = answer.map_err(|e| failure(pid, e))?;
    finished.map_err(|e| failure(pid, e))?;
    let reply = answer.as_deref().and_then(py_trace_reply).ok_or_else(|| {
        Failure::new(
            status::PYTHON_STEP,
            Some(pid),
            "tracemalloc's calls raised in the process",
        )
    })?;
    Ok((reply, how))
}

/// The reply from [`PY_TRACE`]'s answer.
fn py_trace_reply(answer: &str) -> Option<PyTraceReply> {
    let mut lines = answer.lines();
    let head: Vec<i64> = lines
        .next()?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let u = |i: usize| head.get(i).map(|&n| n.max(0) as u64);
    let mut r = PyTraceReply {
        tracing: u(0)? != 0,
        ours: u(1)? != 0,
        changed: u(2)? != 0,
        frames: u32::try_from(u(3)?).ok()?,
        traced_bytes: u(4)?,
        peak_bytes: u(5)?,
        overhead_bytes: u(6)?,
        stops_in_ms: (*head.get(7)? >= 0).then(|| u(7).unwrap_or(0)),
        snapshot: None,
    };
    if head.len() > 8 {
        let rows = lines
            .map(|l| {
                let mut f = l.splitn(4, '\t');
                let (bytes, count, line) = (
                    f.next()?.parse().ok()?,
                    f.next()?.parse().ok()?,
                    f.next()?.parse().ok()?,
                );
                Some(PyLine {
                    file: f.next()?.to_owned(),
                    line,
                    bytes,
                    count,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        r.snapshot = Some(PySnapshot {
            lines: rows,
            bytes: u(8)?,
            count: u(9)?,
            distinct_lines: u(10)?,
            elapsed_ms: u(11)? as f64 / 1000.0,
        });
    }
    Some(r)
}

/// The expression that runs `code` (statements) in a namespace of its own,
/// not the program's, and makes the `str` it leaves in `answer` (`"None"`
/// if it raised: the exception is caught inside). The namespace is emptied
/// after, so that the functions the code defines (which refer to it) leave
/// no reference cycle behind in a process whose collector may be off.
/// Each level of indentation is one space, to fit the injector's 3 KiB.
fn answer_of(code: &str) -> String {
    let mut compact = String::from("try:\n");
    for l in code.lines() {
        let body = l.trim_start_matches(' ');
        let indent = (l.len() - body.len()) / 4 + 1;
        compact += &format!("{}{body}\n", " ".repeat(indent));
    }
    compact += "except BaseException:\n answer = None\n";
    format!("(lambda n: (exec({compact:?}, n), str(n.get('answer')), n.clear())[1])({{}})")
}

/// `empty-cache` on a process without the preload: torch's own calls, the
/// answer the shim's bridge gives.
pub fn empty_cache(pid: i32) -> Result<(EmptyCacheResult, Reached), Failure> {
    let mut calls = memshim_reach::python(pid, SAFE_POINT_LIMIT).map_err(|e| failure(pid, e))?;
    let how = reached(&calls);
    let t = Instant::now();
    let line = match calls.imported("torch") {
        Ok(false) => Ok(Some("skip|torch is not imported||0|0".to_owned())),
        Ok(true) => calls.eval(&answer_of(EMPTY_CACHE)),
        Err(e) => Err(e),
    };
    let elapsed_ms = ms(t);
    let finished = calls.finish();
    let line = line.map_err(|e| failure(pid, e))?;
    finished.map_err(|e| failure(pid, e))?;
    let raised = || {
        Failure::new(
            status::PYTHON_STEP,
            Some(pid),
            "torch's cache calls raised in the process",
        )
    };
    let mut r = line
        .as_deref()
        .and_then(empty_cache_result)
        .ok_or_else(raised)?;
    r.elapsed_ms = elapsed_ms;
    Ok((r, how))
}

/// The result from [`EMPTY_CACHE`]'s answer.
fn empty_cache_result(line: &str) -> Option<EmptyCacheResult> {
    let mut parts = line.split('|');
    let (kind, why) = (parts.next()?, parts.next()?);
    let devices = parts
        .next()?
        .split_whitespace()
        .map(|d| d.parse().ok())
        .collect::<Option<Vec<u32>>>()?;
    Some(EmptyCacheResult {
        devices,
        reserved_before: parts.next()?.parse().ok()?,
        reserved_after: parts.next()?.parse().ok()?,
        elapsed_ms: 0.0,
        skipped: (kind == "skip").then(|| why.to_owned()),
    })
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
    /// PyTorch, as a shimmed process reports it; `null` unless torch is
    /// imported.
    pub torch: Option<TorchSection>,
    /// Why `torch` could not be read, where torch is imported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_unavailable: Option<String>,
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
        let arenas = calls
            .malloc_stats()?
            .and_then(|t| memshim_proto::pymalloc_arena_bytes(&t));
        let torch = match calls.imported("torch")? {
            true => calls.eval(&answer_of(TORCH_SECTION))?,
            false => Some("null".to_owned()),
        };
        Ok::<_, Error>((line, enabled, threads, arenas, torch))
    })();
    let finished = calls.finish();
    let (line, enabled, threads, arenas, torch) = read.map_err(|e| failure(pid, e))?;
    let (torch, torch_unavailable) = match torch.as_deref().filter(|a| *a != "None") {
        Some(answer) => match torch_section(answer) {
            Ok(t) => (t, None),
            Err(e) => (
                None,
                Some(format!("torch's figures could not be read: {e}")),
            ),
        },
        None => (
            None,
            Some("torch's figures could not be read: Python raised".into()),
        ),
    };
    finished.map_err(|e| failure(pid, e))?;
    let (python, python_unavailable) = match line.as_deref().and_then(python_section) {
        Some(mut s) => {
            if s.gc_counts.is_none() {
                // `gc` not imported: the C API's flag (3.10+); before 3.10
                // only the gc module can disable the collector.
                s.gc_enabled = enabled.unwrap_or(true);
            }
            s.threads = threads.unwrap_or(0);
            s.pymalloc_arena_bytes = arenas;
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
        torch,
        torch_unavailable,
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

    #[test]
    fn cuda_release_answers_are_parsed_and_the_code_fits_the_injector() {
        let steps =
            cuda_steps("empty_cache|cuda_reserved|skip|torch is not imported|0.010|0|0|").unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].skipped.as_deref(), Some("torch is not imported"));
        let steps = cuda_steps(
            "ipc_collect|cuda_allocated|done||1.5|300|200|1:300:200;\
             host_cache|pinned_host_cached|fail|boom|0.1|64|64|",
        )
        .unwrap();
        assert_eq!(steps[0].step, ReleaseStepKind::IpcCollect);
        assert_eq!(steps[0].devices[0].index, 1);
        assert_eq!((steps[0].before, steps[0].after), (300, 200));
        assert_eq!(steps[1].outcome, memshim_proto::StepOutcome::Failed);
        assert!(cuda_steps("nope|x|done||0|0|0|").is_none());
        assert!(cuda_steps("None").is_none());
        for code in [CUDA_RELEASE, EMPTY_CACHE, TORCH_SECTION, PY_TRACE] {
            assert!(answer_of(code).len() < 3072, "{}", answer_of(code).len());
        }
    }

    #[test]
    fn torch_sections_are_parsed_with_fragmentation() {
        assert_eq!(torch_section("null"), Ok(None));
        let t = torch_section(
            r#"{"version":"2.5.1","cuda_initialized":true,"devices":[{"index":1,"allocated":1,"reserved":4,"active":1,"inactive_split":2,"peak_allocated":3,"num_alloc_retries":0,"num_ooms":0,"allocations":7,"uuid":null}],"host_pinned":{"allocated":2,"active":1,"cached":1}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.devices[0].fragmentation, 0.5);
        assert_eq!(t.host_pinned.map(|h| h.cached), Some(1));
        assert!(torch_section("None").is_err());
    }

    #[test]
    fn py_trace_answers_are_parsed() {
        let r = py_trace_reply("0 0 0 1 0 0 624 -1").unwrap();
        assert!(!r.tracing && r.stops_in_ms.is_none() && r.snapshot.is_none());
        let r = py_trace_reply("1 1 0 1 134863 169791 15472 99996 135259 200 6 2451\n133307\t191\t6\t/a\tb.py\n64\t2\t18\t<string>").unwrap();
        assert_eq!(r.stops_in_ms, Some(99996));
        let s = r.snapshot.unwrap();
        assert_eq!((s.bytes, s.count, s.distinct_lines), (135259, 200, 6));
        assert_eq!(
            s.lines[0],
            PyLine {
                file: "/a\tb.py".into(),
                line: 6,
                bytes: 133307,
                count: 191
            }
        );
        assert!(py_trace_reply("None").is_none());
        assert!(py_trace_reply("1 1 0 1 1 1 1 1 1 1 1 1\nbad row").is_none());
    }

    #[test]
    fn empty_cache_answers_are_parsed() {
        let r = empty_cache_result("skip|torch is not imported||0|0").unwrap();
        assert_eq!(r.skipped.as_deref(), Some("torch is not imported"));
        let r = empty_cache_result("done||0 1|300|100").unwrap();
        assert_eq!(
            (r.devices, r.reserved_before, r.reserved_after),
            (vec![0, 1], 300, 100)
        );
        assert!(r.skipped.is_none());
        assert!(empty_cache_result("done||x|1|1").is_none());
        assert!(empty_cache_result("None").is_none());
    }
}
