//! What each request does. Runs on the shim's thread, one request at a
//! time; nothing here blocks longer than the Python bridge's time limit.

use super::{Ctx, socket};
use crate::options::{self, Control};
use crate::os::ResetTo;
use crate::{jemalloc, os};
use memshim_proto::*;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// `purge` requests served in this process, and the RSS they released
/// (reported as `purges` in `stats`; reset in a fork child).
static PURGES: AtomicU64 = AtomicU64::new(0);
static PURGED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Fork child: the parent's purges are not the child's. Async-signal-safe.
pub fn reset_purge_counters() {
    PURGES.reset_to(0);
    PURGED_BYTES.reset_to(0);
}

/// How long `stats` waits for the GIL before reporting the `python` section
/// as "busy" (the rest of the report is complete either way).
const PY_STATS_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `gc` / `empty_cache` (and each of those steps of `release`)
/// wait for the GIL before answering "busy".
const PY_ACTION_TIMEOUT: Duration = Duration::from_secs(5);

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn internal(what: &str, e: jemalloc::Error) -> ErrorReply {
    ErrorReply::new(ErrorCode::Internal, format!("{what} failed: {e}"))
}

/// The answer to `hello`, or an error if the versions have nothing in common.
pub fn hello(client_version: u32, ctx: &Ctx<'_>) -> Result<HelloReply, ErrorReply> {
    let Some(version) = negotiate(client_version, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION) else {
        return Err(ErrorReply::new(
            ErrorCode::VersionMismatch,
            format!(
                "client speaks protocol {client_version}, this process speaks {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}; \
                 use a memshim-ctl of the same release as the library"
            ),
        ));
    };
    Ok(HelloReply {
        version,
        min_version: MIN_PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        pid: os::getpid(),
        starttime: ctx.starttime,
        pidns: (ctx.pidns != 0).then_some(ctx.pidns),
        shim_version: env!("CARGO_PKG_VERSION").to_owned(),
        max_request_bytes: MAX_REQUEST_BYTES as u64,
        ops: OPS.iter().map(|s| s.to_string()).collect(),
    })
}

fn config(ctx: &Ctx<'_>) -> ConfigState {
    let (dirty, muzzy) = jemalloc::decay_ms().unwrap_or((options::dirty_decay_ms(), -1));
    ConfigState {
        dirty_decay_ms: dirty,
        muzzy_decay_ms: muzzy,
        narenas: jemalloc::narenas_auto(),
        background_purge: dirty >= 0,
        jemalloc_background_thread: jemalloc::background_thread(),
        jemalloc_version: jemalloc::version().to_owned(),
        shim_version: env!("CARGO_PKG_VERSION").to_owned(),
        interposed: ctx.facts.interposed,
        control: match options::control() {
            Control::Auto => "auto",
            Control::On => "on",
            Control::Off => "off",
        }
        .to_owned(),
        uptime_ms: ctx.facts.uptime_ms,
        fork_child: ctx.facts.fork_child,
        deepbind_cleared: ctx.facts.deepbind_cleared,
        thread_starts: ctx.facts.thread_starts,
        private_fds: Some(ctx.facts.private_fds),
        thp_split_bytes: Some(os::thp::split_size() as u64),
    }
}

/// `stats`.
pub fn stats(arenas: bool, pss: bool, ctx: &Ctx<'_>) -> Result<StatsReport, ErrorReply> {
    let t0 = Instant::now();
    let s = jemalloc::stats().map_err(|e| internal("reading jemalloc statistics", e))?;
    let arenas = arenas.then(|| {
        (0..jemalloc::narenas())
            .filter_map(jemalloc::arena_stats)
            .collect()
    });
    let (python, torch, python_unavailable) = match crate::python::stats(PY_STATS_TIMEOUT) {
        Ok((p, t)) => (Some(p), t, None),
        Err(why) => (None, None, Some(why)),
    };
    Ok(StatsReport {
        pid: os::getpid(),
        allocator: s,
        arenas,
        process: process(s.resident.saturating_add(s.muzzy), pss),
        cgroup: os::cgroup::memory().map(|(path, files)| CgroupStats::from_files(path, &files)),
        config: config(ctx),
        python,
        torch,
        python_unavailable,
        purges: Some(PurgeCounters {
            count: PURGES.load(Relaxed),
            released_bytes: PURGED_BYTES.load(Relaxed),
        }),
        cuda_idle: ctx.facts.cuda_idle,
        pressure: Some(pressure(&ctx.facts.pressure)),
        elapsed_ms: ms(t0),
    })
}

/// The `pressure` section.
fn pressure(p: &super::PressureFacts) -> PressureStats {
    PressureStats {
        mode: p.mode.to_owned(),
        source: p.source.to_owned(),
        watching: p.watching.iter().flatten().map(|s| s.to_string()).collect(),
        limit: p.limit,
        threshold: p.threshold,
        active: p.active,
        events: p.events,
        purges: p.purges,
        bytes_returned: p.bytes_returned,
        gc_runs: p.gc_runs,
        ignored: p.ignored,
        last_purge_ms: p.last_purge_us.map(|us| us as f64 / 1000.0),
    }
}

/// The `process` section. `held` is the allocator's pages that may be
/// resident: jemalloc's `resident` (an upper bound: it counts pages never
/// touched) plus its muzzy pages (`MADV_FREE`d, left out of `resident`
/// but in RSS until the kernel takes them). They are all anonymous, so at
/// most `RssAnon` of them are: `unmanaged` never hides mapped files or
/// shared memory behind untouched allocator pages.
fn process(held: u64, pss: bool) -> ProcessStats {
    let m = os::proc::memory();
    let resident = m.anon.map_or(held, |a| held.min(a));
    ProcessStats {
        rss: m.rss,
        pss: if pss { os::proc::pss() } else { None },
        anon: m.anon,
        file: m.file,
        shmem: m.shmem,
        swap: m.swap,
        unmanaged: m.rss.saturating_sub(resident),
    }
}

/// `purge`: empties this thread's cache and purges every arena.
pub fn purge() -> Result<PurgeResult, ErrorReply> {
    let t0 = Instant::now();
    let rss_before = os::proc::rss_bytes();
    let before = jemalloc::stats().map_err(|e| internal("reading jemalloc statistics", e))?;
    let _ = jemalloc::flush_own_tcache();
    jemalloc::purge_all().map_err(|e| internal("arena.4096.purge", e))?;
    let after = jemalloc::stats().unwrap_or(before);
    let rss_after = os::proc::rss_bytes();
    PURGES.fetch_add(1, Relaxed);
    PURGED_BYTES.fetch_add(rss_before.saturating_sub(rss_after), Relaxed);
    Ok(PurgeResult {
        rss_before,
        rss_after,
        released: rss_before.saturating_sub(rss_after),
        resident_before: before.resident,
        resident_after: after.resident,
        purgeable_before: before.dirty + before.muzzy,
        elapsed_ms: ms(t0),
    })
}

/// `decay`.
pub fn decay(dirty: Option<i64>, muzzy: Option<i64>) -> Result<DecayResult, ErrorReply> {
    for (name, v) in [("dirty_ms", dirty), ("muzzy_ms", muzzy)] {
        if let Some(v) = v
            && !valid_decay_ms(v)
        {
            return Err(ErrorReply::new(
                ErrorCode::InvalidArgument,
                format!("{name} must be -1 (never) or between 0 and {MAX_DECAY_MS}, not {v}"),
            ));
        }
    }
    if dirty.is_some() || muzzy.is_some() {
        jemalloc::set_decay_ms(dirty, muzzy).map_err(|e| internal("setting decay", e))?;
    }
    let (d, m) = jemalloc::decay_ms().map_err(|e| internal("reading decay", e))?;
    Ok(DecayResult {
        dirty_decay_ms: d,
        muzzy_decay_ms: m,
    })
}

/// `gc`.
pub fn gc() -> Result<GcResult, ErrorReply> {
    crate::python::gc(PY_ACTION_TIMEOUT).map_err(ErrorReply::python)
}

/// `empty_cache`. A process without a usable interpreter has nothing to
/// empty: that is an answer, not an error.
pub fn empty_cache() -> Result<EmptyCacheResult, ErrorReply> {
    let t0 = Instant::now();
    match crate::python::empty_cache(PY_ACTION_TIMEOUT) {
        Ok(r) => Ok(r),
        Err(why) if nothing_to_do(&why) => Ok(EmptyCacheResult {
            skipped: Some(why.to_string()),
            elapsed_ms: ms(t0),
            ..Default::default()
        }),
        Err(why) => Err(ErrorReply::python(why)),
    }
}

/// Whether a Python step that could not use the interpreter simply had
/// nothing to do (there is no interpreter to act on), rather than failed.
fn nothing_to_do(why: &PythonUnavailable) -> bool {
    matches!(
        why,
        PythonUnavailable::NoPython | PythonUnavailable::NotInitialized
    )
}

/// A step of `release` that could not use the interpreter at all: nothing
/// to do where there is no interpreter, failed otherwise.
fn unavailable_step(
    step: ReleaseStepKind,
    measure: &str,
    t: Instant,
    why: PythonUnavailable,
) -> ReleaseStep {
    let mut s = ReleaseStep::new(step, measure);
    s = if nothing_to_do(&why) {
        s.nothing_to_do(why.to_string())
    } else {
        s.failed(why.to_string())
    };
    s.python = Some(why);
    s.elapsed_ms = ms(t);
    s
}

/// `release`: gc, then the CUDA steps (ipc_collect, cuBLAS workspaces,
/// empty_cache, the pinned host cache; one empty_cache step when CUDA is
/// not in use), then the purge, one figure per step. Each step says whether
/// it ran, had nothing to do, or could not run or failed (then
/// `memshim-ctl` exits non-zero); the purge always runs.
pub fn release() -> Result<ReleaseResult, ErrorReply> {
    let t0 = Instant::now();
    let rss_before = os::proc::rss_bytes();
    let mut steps = Vec::with_capacity(6);

    let t = Instant::now();
    steps.push(match crate::python::gc(PY_ACTION_TIMEOUT) {
        Ok(r) => {
            let mut s = ReleaseStep::new(ReleaseStepKind::Gc, "rss");
            (s.before, s.after, s.elapsed_ms) = (r.rss_before, r.rss_after, ms(t));
            s
        }
        Err(why) => unavailable_step(ReleaseStepKind::Gc, "rss", t, why),
    });

    let t = Instant::now();
    match crate::python::cuda_release(PY_ACTION_TIMEOUT) {
        Ok(cuda) => steps.extend(cuda),
        Err(why) => steps.push(unavailable_step(
            ReleaseStepKind::EmptyCache,
            "cuda_reserved",
            t,
            why,
        )),
    }

    let p = purge()?;
    let mut s = ReleaseStep::new(ReleaseStepKind::Purge, "rss");
    (s.before, s.after, s.elapsed_ms) = (p.rss_before, p.rss_after, p.elapsed_ms);
    steps.push(s);
    let rss_after = os::proc::rss_bytes();
    Ok(ReleaseResult {
        rss_before,
        rss_after,
        released: rss_before.saturating_sub(rss_after),
        elapsed_ms: ms(t0),
        steps,
    })
}

/// `python_trace`: tracemalloc through the bridge, its arguments checked
/// here (frames 1-64, default 1; seconds 1-3600, default 60; top 1-10000,
/// default 100).
pub fn python_trace(
    action: PyTraceAction,
    frames: Option<u32>,
    seconds: Option<u64>,
    top: Option<u32>,
) -> Result<PyTraceReply, ErrorReply> {
    use crate::python::PyTraceJob as J;
    let bad = |m: String| Err(ErrorReply::new(ErrorCode::InvalidArgument, m));
    let frames = frames.unwrap_or(1);
    if !(1..=MAX_PY_TRACE_FRAMES).contains(&frames) {
        return bad(format!(
            "frames {frames} is not from 1 to {MAX_PY_TRACE_FRAMES}"
        ));
    }
    let seconds = seconds.unwrap_or(60);
    if !(1..=MAX_PY_TRACE_SECONDS).contains(&seconds) {
        return bad(format!(
            "seconds {seconds} is not from 1 to {MAX_PY_TRACE_SECONDS}"
        ));
    }
    let top = top.unwrap_or(100);
    if !(1..=10_000).contains(&top) {
        return bad(format!("top {top} is not from 1 to 10000"));
    }
    let now_ms = super::now_ms();
    let job = match action {
        PyTraceAction::Status => J::Status { now_ms },
        PyTraceAction::Start => J::Start {
            frames,
            deadline_ms: now_ms + seconds * 1000,
            now_ms,
        },
        PyTraceAction::Snapshot => J::Snapshot {
            top: top as usize,
            now_ms,
        },
        PyTraceAction::Stop => J::Stop { now_ms },
    };
    crate::python::py_trace(job, PY_ACTION_TIMEOUT).map_err(ErrorReply::python)
}

/// Runs one decoded request (other than `hello`).
pub fn dispatch(req: &Request, ctx: &Ctx<'_>) -> Response {
    let r = match *req {
        Request::Hello { .. } => unreachable_hello(),
        Request::Stats { arenas, pss } => {
            stats(arenas, pss, ctx).map(|s| Reply::Stats(Box::new(s)))
        }
        Request::Purge => purge().map(Reply::Purge),
        Request::Decay { dirty_ms, muzzy_ms } => decay(dirty_ms, muzzy_ms).map(Reply::Decay),
        Request::Gc => gc().map(Reply::Gc),
        Request::EmptyCache => empty_cache().map(Reply::EmptyCache),
        Request::Release => release().map(Reply::Release),
        Request::Profile { action, seconds } => {
            let heap = socket::join(
                &socket::dir(),
                &format!("{}.heap", socket::name(ctx.starttime, ctx.pidns)),
            );
            crate::profile::request(action, seconds, super::now_ms(), &heap)
                .map(|r| Reply::Profile(Box::new(r)))
        }
        Request::PythonTrace {
            action,
            frames,
            seconds,
            top,
        } => python_trace(action, frames, seconds, top).map(|r| Reply::PythonTrace(Box::new(r))),
    };
    match r {
        Ok(reply) => Response::Ok(reply),
        Err(e) => Response::Error(e),
    }
}

fn unreachable_hello() -> Result<Reply, ErrorReply> {
    Err(ErrorReply::new(
        ErrorCode::Internal,
        "hello is handled by the connection",
    ))
}
