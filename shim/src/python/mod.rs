//! The CPython / PyTorch bridge (issue "Python bridge"; design in
//! docs/python.md).
//!
//! The control endpoint calls [`stats`], [`gc`] and [`empty_cache`] on the
//! shim's thread. Each is one fixed job run on the interpreter's **main
//! thread** as a pending call (`mainthread.rs`): the shim's thread never
//! takes the GIL, so it can neither block on a GIL held by a long C call
//! nor be killed or hung by interpreter shutdown (hazards 33, 34, 36).
//! Each answers within about `timeout` (plus the run time of a job that has
//! started), with `PythonUnavailable::Busy` if the main thread did not reach
//! a point where it runs pending calls; such a request is withdrawn
//! atomically and never runs later.
//!
//! * `ffi.rs`: the hand-declared C-API slice, resolved with `dlsym`.
//! * `mainthread.rs`: the pending-call state machine.
//! * `nudge.rs`: making a busy 3.9-3.12 main thread notice the call.
//! * `gate.rs`: the exit gate (no call into CPython once it shuts down).
//! * `object.rs`: owned references, exceptions fetched and cleared.
//! * `gc.rs`, `pymalloc.rs`: the `python` section and the `gc` action.
//! * `torch.rs`: the `torch` section and the `empty_cache` action.

mod ffi;
mod gate;
mod gc;
mod mainthread;
mod nudge;
mod object;
mod pymalloc;
mod torch;

use mainthread::{Done, Job};
use memshim_proto::{EmptyCacheResult, GcResult, PythonSection, PythonUnavailable, TorchSection};
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
    match mainthread::run(Job::Stats, timeout)? {
        Done::Stats(p, t) => Ok((p, t)),
        _ => Err(unexpected()),
    }
}

/// A full `gc.collect()` on the main thread. `elapsed_ms` includes the wait
/// for the main thread.
pub fn gc(timeout: Duration) -> Result<GcResult, PythonUnavailable> {
    let start = Instant::now();
    match mainthread::run(Job::Gc, timeout)? {
        Done::Gc(mut r) => {
            r.elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
            Ok(r)
        }
        _ => Err(unexpected()),
    }
}

/// `torch.cuda.empty_cache()` on every device that already has a context.
/// `elapsed_ms` includes the wait for the main thread.
pub fn empty_cache(timeout: Duration) -> Result<EmptyCacheResult, PythonUnavailable> {
    let start = Instant::now();
    match mainthread::run(Job::EmptyCache, timeout)? {
        Done::EmptyCache(mut r) => {
            r.elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
            Ok(r)
        }
        _ => Err(unexpected()),
    }
}
