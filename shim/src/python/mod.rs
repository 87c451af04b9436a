//! The CPython / PyTorch bridge (issue "Python bridge"; design in
//! docs/python.md).
//!
//! The control endpoint calls [`stats`], [`gc`] and [`empty_cache`] on the
//! shim's thread. Each is one fixed job, run on a short-lived thread of the
//! shim's (`memshim-py`, started in the application's descriptor table, see
//! `os/spawner.rs`) that takes the GIL like any thread of the program
//! would, so it reaches the interpreter whatever the main thread is doing:
//! sleeping, blocked in I/O or a C call, running an event loop, or spinning
//! in pure Python. The shim's own thread never takes the GIL; it waits for
//! the job at most about `timeout` (plus the run time of a job that has
//! started) and answers `PythonUnavailable::Busy` if the GIL could not be
//! had (a C extension holding it); such a request is withdrawn atomically
//! and never runs later.
//!
//! * `version.rs`: what differs between the versions served, in one table.
//! * `ffi.rs`: the hand-declared C-API slice, resolved with `dlsym`.
//! * `job.rs`: the request slot and the job thread.
//! * `gate.rs`: the exit gate (no call into CPython begins once it shuts down).
//! * `object.rs`: owned references, exceptions fetched and cleared.
//! * `threads.rs`: the thread count, and no `threading` leftovers.
//! * `gc.rs`, `pymalloc.rs`: the `python` section and the `gc` action.
//! * `torch.rs`: the `torch` section.
//! * `cuda.rs`: the `empty_cache` action and the CUDA steps of `release`.
//! * `tracemalloc.rs`: `profile --python` (tracemalloc, bounded in time).

mod cuda;
pub use cuda::IdleCheck;
#[cfg(memshim_bridge)]
pub mod at_fork;
mod ffi;
mod gate;
mod gc;
mod guard;
mod job;
mod object;
mod pymalloc;
mod threads;
mod torch;
mod tracemalloc;
mod version;

pub use job::PyTraceJob;
use job::{Done, Job};
use memshim_proto::{
    EmptyCacheResult, GcResult, PythonSection, PythonUnavailable, ReleaseStep, TorchSection,
};
use std::time::{Duration, Instant};

fn unexpected() -> PythonUnavailable {
    PythonUnavailable::Error {
        message: "the bridge returned the wrong kind of result".into(),
    }
}

/// The `python` section of `stats`, and the `torch` section if `torch` is
/// already imported.
pub fn stats(
    timeout: Duration,
) -> Result<(PythonSection, Option<TorchSection>), PythonUnavailable> {
    match job::run(Job::Stats, timeout)? {
        Done::Stats(s) => Ok(*s),
        _ => Err(unexpected()),
    }
}

/// Runs `job` and measures it from the request on (`elapsed_ms` includes
/// the wait for the GIL).
fn timed<T>(
    job: Job,
    timeout: Duration,
    take: impl FnOnce(Done) -> Option<T>,
    elapsed: impl FnOnce(&mut T) -> &mut f64,
) -> Result<T, PythonUnavailable> {
    let start = Instant::now();
    let mut r = take(job::run(job, timeout)?).ok_or_else(unexpected)?;
    *elapsed(&mut r) = start.elapsed().as_secs_f64() * 1000.0;
    Ok(r)
}

/// A full `gc.collect()`.
pub fn gc(timeout: Duration) -> Result<GcResult, PythonUnavailable> {
    let take = |d| match d {
        Done::Gc(r) => Some(r),
        _ => None,
    };
    timed(Job::Gc, timeout, take, |r| &mut r.elapsed_ms)
}

/// `torch.cuda.empty_cache()` on every device that already has a context.
pub fn empty_cache(timeout: Duration) -> Result<EmptyCacheResult, PythonUnavailable> {
    let take = |d| match d {
        Done::EmptyCache(r) => Some(r),
        _ => None,
    };
    timed(Job::EmptyCache, timeout, take, |r| &mut r.elapsed_ms)
}

/// Runs a job that does nothing but register the bridge's exit hooks
/// (`gate.rs`) with the interpreter, waiting at most `timeout` for the
/// GIL; whether they are registered.
pub fn ensure_hooks(timeout: Duration) -> bool {
    matches!(job::run(Job::Hooks, timeout), Ok(Done::Hooks))
}

/// Registers `f`, called on the main thread when the interpreter starts
/// to shut down (`true`, before the runtime is marked finalizing, once
/// the hooks are registered: [`ensure_hooks`]) and once it has finalized
/// (`false`). One function; the profiler's.
pub fn on_shutdown(f: fn(bool)) {
    gate::on_shutdown(f);
}

/// The minor version of the CPython in the process's global scope, if the
/// bridge serves it (`version.rs`: 3.8 to 3.15, no free-threaded build),
/// read calling nothing of CPython's but `Py_GetVersion`: for the heap
/// profiler's walk of Python frames (profile/python_stack.rs).
pub fn served_minor() -> Option<u32> {
    let full = ffi::version_text()?;
    let v = full.split_whitespace().next()?;
    version::profile(v, ffi::free_threaded_text(&full)).ok()?;
    version::parse(v).map(|(_, minor, _)| minor)
}

/// Whether a CPython is in the process's global scope (a cheap look-up; the
/// full API is resolved at the first request).
pub fn present() -> bool {
    ffi::present()
}

/// The CUDA steps of `release` (`cuda.rs`): ipc_collect, cuBLAS
/// workspaces, empty_cache, the pinned host cache; or one `empty_cache`
/// step with nothing to do when torch or CUDA is not in use.
pub fn cuda_release(timeout: Duration) -> Result<Vec<ReleaseStep>, PythonUnavailable> {
    match job::run(Job::CudaRelease, timeout)? {
        Done::CudaRelease(steps) => Ok(steps),
        _ => Err(unexpected()),
    }
}

/// One look of the idle VRAM return (`cuda::idle_check`), waiting at most
/// `timeout` for the GIL.
pub fn cuda_idle_check(
    expect: Option<u64>,
    min_unused: u64,
    timeout: Duration,
) -> Result<IdleCheck, PythonUnavailable> {
    match job::run(Job::CudaIdle { expect, min_unused }, timeout)? {
        Done::CudaIdle(r) => Ok(r),
        _ => Err(unexpected()),
    }
}

/// A tracemalloc request (`tracemalloc.rs`).
pub fn py_trace(
    t: PyTraceJob,
    timeout: Duration,
) -> Result<memshim_proto::PyTraceReply, PythonUnavailable> {
    match job::run(Job::PyTrace(t), timeout)? {
        Done::PyTrace(r) => Ok(*r),
        _ => Err(unexpected()),
    }
}

/// Whether tracing the shim started has a deadline still to come.
pub fn py_trace_pending() -> bool {
    tracemalloc::pending()
}

/// Stops the tracing the shim started once its deadline has passed (the
/// shim's thread, every turn; a busy interpreter is tried again on the
/// next).
pub fn py_trace_tick(now_ms: u64) {
    if tracemalloc::due(now_ms) {
        let _ = py_trace(PyTraceJob::Stop { now_ms }, Duration::from_millis(200));
    }
}

/// Stops the tracing the shim started, now (the attached bridge's
/// `detach`: once its thread is gone, nothing would stop it at its
/// deadline). A busy interpreter leaves it on.
#[cfg(memshim_bridge)]
pub fn py_trace_stop_ours(now_ms: u64) {
    if tracemalloc::pending() {
        let _ = py_trace(PyTraceJob::Stop { now_ms }, Duration::from_millis(500));
    }
}

/// Whether a job thread exists (counted with the shim's threads).
pub fn worker_exists() -> bool {
    job::worker_exists()
}

/// Joins the job thread if it has finished; whether none is left.
pub fn reap_worker() -> bool {
    job::reap_worker();
    !job::worker_exists()
}

/// While `on`, a request waiting for a job gives up at once (the shim's
/// thread is asked to stop). Async-signal-safe.
pub fn interrupt(on: bool) {
    job::interrupt(on);
}

/// Fork prepare handler: gives up what a child must not inherit (the job
/// thread's PEP 788 guard, 3.15).
pub fn before_fork() {
    guard::before_fork();
}

/// Fork child handler: the job thread and any request in flight stay in
/// the parent. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    job::after_fork_child();
}
