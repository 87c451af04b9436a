//! `profile --python`: CPython's tracemalloc, switched on, read and
//! switched off from outside (docs/profile.md, "Python lines"). Job
//! thread, GIL held (called from `job.rs`).
//!
//! It uses `_tracemalloc`, the C module behind the `tracemalloc` module and
//! built into every CPython: importing it runs no Python code of its own
//! (the `tracemalloc` module would import `pickle`, `fnmatch`, `linecache`
//! into the program). A snapshot reads `_tracemalloc._get_traces()`, the
//! list `tracemalloc.take_snapshot()` reads, and sums it by the line that
//! allocated (the innermost frame), here, without building Python objects
//! beyond that list.
//!
//! Tracing the shim starts is bounded: it stops it at the deadline the
//! start asked for (`DEADLINE_MS`, checked on the shim's thread: [`due`])
//! if no `stop` came first, so a client that goes away does not leave the
//! program traced. Tracing the program started itself is reported, never
//! stopped.

use super::object::{Obj, Py, PyResult};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use memshim_proto::{PyLine, PySnapshot, PyTraceReply};
use std::collections::HashMap;
use std::time::Instant;

/// This shim started the tracing that runs now.
static OURS: AtomicBool = AtomicBool::new(false);
/// Monotonic ms at which the shim stops the tracing it started; 0: none.
static DEADLINE_MS: AtomicU64 = AtomicU64::new(0);

/// Whether the shim's own tracing has a deadline to come.
pub fn pending() -> bool {
    DEADLINE_MS.load(SeqCst) != 0
}

/// Whether the shim's own tracing is past its deadline (shim's thread).
pub fn due(now_ms: u64) -> bool {
    let d = DEADLINE_MS.load(SeqCst);
    d != 0 && now_ms >= d
}

// A fork child of a traced parent is traced too (CPython keeps
// tracemalloc's state across `fork`); its own shim thread, if it runs,
// stops it at the same deadline: nothing is reset in the child.

fn module<'p>(py: &'p Py) -> PyResult<Obj<'p>> {
    py.import(c"_tracemalloc")
}

/// The state, after `changed` (for every reply).
fn state(py: &Py, m: &Obj<'_>, changed: bool, now_ms: u64) -> PyResult<PyTraceReply> {
    let tracing = py.to_bool(&py.call_method(m, c"is_tracing", &[])?)?;
    let mem = py.call_method(m, c"get_traced_memory", &[])?;
    let frames = py.to_u64(&py.call_method(m, c"get_traceback_limit", &[])?)? as u32;
    let ours = tracing && OURS.load(SeqCst);
    let deadline = DEADLINE_MS.load(SeqCst);
    Ok(PyTraceReply {
        tracing,
        ours,
        changed,
        frames,
        traced_bytes: py.to_u64(&py.index(&mem, 0)?)?,
        peak_bytes: py.to_u64(&py.index(&mem, 1)?)?,
        overhead_bytes: py.to_u64(&py.call_method(m, c"get_tracemalloc_memory", &[])?)?,
        stops_in_ms: (ours && deadline != 0).then(|| deadline.saturating_sub(now_ms)),
        snapshot: None,
    })
}

/// The state only.
pub fn status(py: &Py, now_ms: u64) -> PyResult<PyTraceReply> {
    let m = module(py)?;
    state(py, &m, false, now_ms)
}

/// Starts tracing `frames` deep until `deadline_ms`, unless the program
/// traces already (then nothing changes, and it stays the program's).
pub fn start(py: &Py, frames: u32, deadline_ms: u64, now_ms: u64) -> PyResult<PyTraceReply> {
    let m = module(py)?;
    if py.to_bool(&py.call_method(&m, c"is_tracing", &[])?)? {
        if OURS.load(SeqCst) {
            DEADLINE_MS.store(deadline_ms, SeqCst);
        }
        return state(py, &m, false, now_ms);
    }
    let n = py.int(i64::from(frames))?;
    py.call_method(&m, c"start", &[n.as_ptr()])?;
    OURS.store(true, SeqCst);
    DEADLINE_MS.store(deadline_ms, SeqCst);
    state(py, &m, true, now_ms)
}

/// Stops the tracing this shim started; the program's own is left alone.
pub fn stop(py: &Py, now_ms: u64) -> PyResult<PyTraceReply> {
    let m = module(py)?;
    let mut changed = false;
    if OURS.swap(false, SeqCst) {
        DEADLINE_MS.store(0, SeqCst);
        if py.to_bool(&py.call_method(&m, c"is_tracing", &[])?)? {
            py.call_method(&m, c"stop", &[])?;
            changed = true;
        }
    }
    state(py, &m, changed, now_ms)
}

/// The live traced memory by line, the `top` lines holding most.
pub fn snapshot(py: &Py, top: usize, now_ms: u64) -> PyResult<PyTraceReply> {
    let m = module(py)?;
    let mut reply = state(py, &m, false, now_ms)?;
    if !reply.tracing {
        return Ok(reply);
    }
    let t0 = Instant::now();
    let traces = py.call_method(&m, c"_get_traces", &[])?;
    let n = py.len(&traces)?;
    // Keyed by the file name object (interned: one per code object's
    // file, kept alive by `traces` while this runs) and the line.
    let mut by_line: HashMap<(usize, u64), (u64, u64)> = HashMap::new();
    let mut names: HashMap<usize, Obj<'_>> = HashMap::new();
    let (mut bytes, mut count) = (0u64, 0u64);
    for i in 0..n {
        // (domain, size, traceback, total_nframe); traceback: the most
        // recent frame first, each (filename, lineno).
        let t = py.index(&traces, i as isize)?;
        let size = py.to_u64(&py.index(&t, 1)?)?;
        bytes += size;
        count += 1;
        let tb = py.index(&t, 2)?;
        if py.len(&tb)? == 0 {
            continue;
        }
        let frame = py.index(&tb, 0)?;
        let file = py.index(&frame, 0)?;
        let line = py.to_u64(&py.index(&frame, 1)?)?;
        let key = (file.as_ptr() as usize, line);
        names.entry(key.0).or_insert(file);
        let e = by_line.entry(key).or_default();
        e.0 += size;
        e.1 += 1;
    }
    let distinct = by_line.len() as u64;
    let mut rows: Vec<((usize, u64), (u64, u64))> = by_line.into_iter().collect();
    rows.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.1.cmp(&b.0.1)));
    rows.truncate(top);
    let mut lines = Vec::with_capacity(rows.len());
    for ((file, line), (b, c)) in rows {
        let name = match names.get(&file) {
            Some(o) => py.to_string_max(o, 4096)?,
            None => String::new(),
        };
        lines.push(PyLine {
            file: name,
            line: line.min(u64::from(u32::MAX)) as u32,
            bytes: b,
            count: c,
        });
    }
    reply.snapshot = Some(PySnapshot {
        lines,
        bytes,
        count,
        distinct_lines: distinct,
        elapsed_ms: t0.elapsed().as_secs_f64() * 1000.0,
    });
    Ok(reply)
}
