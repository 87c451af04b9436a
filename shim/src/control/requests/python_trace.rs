//! `python_trace`: CPython's tracemalloc through the bridge.

use super::PY_ACTION_TIMEOUT;
use memshim_proto::*;

/// `python_trace`: tracemalloc through the bridge, its arguments checked
/// here (frames 1-64, default 1; seconds 1-3600, default 60; top 1-10000,
/// default 100).
pub fn handle(
    action: PyTraceAction,
    frames: Option<u32>,
    seconds: Option<u64>,
    top: Option<u32>,
) -> Result<Box<PyTraceReply>, ErrorReply> {
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
    let now_ms = crate::os::time::monotonic_ms();
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
    crate::python::py_trace(job, PY_ACTION_TIMEOUT)
        .map(Box::new)
        .map_err(ErrorReply::python)
}
