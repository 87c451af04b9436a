//! `release`: gc, the CUDA steps, then the purge, one figure per step.

use super::{PY_ACTION_TIMEOUT, ms, nothing_to_do, purge};
use crate::os;
use memshim_proto::*;
use std::time::Instant;

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
pub fn handle() -> Result<ReleaseResult, ErrorReply> {
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

    let p = purge::handle()?;
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
