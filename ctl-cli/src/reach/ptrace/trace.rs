//! `profile --python` on a CPython started without the preload:
//! tracemalloc, switched and read by Python code run in the process.

use super::*;

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
///
/// The program's tracemalloc must not count memshim-ctl's own code: the
/// function `f` is compiled before tracing starts and kept on the module
/// (`_memshim_f`, with globals of its own: [`answer_of`] clears its
/// namespace) while the tracing is memshim-ctl's, so later calls
/// ([`CALL_KEPT`]) compile almost nothing, and a snapshot leaves out what
/// `f` itself allocated (file `<memshim-ctl>`).
pub(super) const PY_TRACE: &str = "\
import time
m = __import__('_tracemalloc')
def f(act, frames, seconds, top):
    ours, changed = bool(getattr(m, '_memshim_until', 0)), False
    if ours and not m.is_tracing():
        del m._memshim_until
        ours = False
    if act == 'start' and not m.is_tracing():
        m._memshim_f = type(f)(f.__code__, dict(globals()))
        m.start(frames)
        m._memshim_until, ours, changed = time.time() + seconds, True, True
    elif act == 'start' and ours:
        m._memshim_until = time.time() + seconds
    elif act == 'stop' and ours:
        m.stop()
        del m._memshim_until
        ours, changed = False, True
    if not ours and hasattr(m, '_memshim_f'):
        del m._memshim_f
    t = m.is_tracing()
    cur, peak = m.get_traced_memory()
    left = int(max(m._memshim_until - time.time(), 0) * 1000) if ours else -1
    head = [int(t), int(ours), int(changed), m.get_traceback_limit(), cur, peak, m.get_tracemalloc_memory(), left]
    rows = []
    if act == 'snapshot' and t:
        t0, agg, total = time.monotonic(), {}, [0, 0]
        for tr in m._get_traces():
            k = tr[2][0] if tr[2] else None
            if k and k[0] == '@FILE@':
                continue
            total[0] += tr[1]
            total[1] += 1
            if k:
                e = agg.setdefault(k, [0, 0])
                e[0] += tr[1]
                e[1] += 1
        top = sorted(agg.items(), key=lambda kv: (-kv[1][0], kv[0][1]))[:top]
        head += total + [len(agg), int((time.monotonic() - t0) * 1e6)]
        rows = ['%d\\t%d\\t%d\\t%s' % (b, n, k[1], k[0].replace('\\n', '?')) for k, (b, n) in top]
    return '\\n'.join([' '.join(map(str, head))] + rows)
answer = f('@ACTION@', @FRAMES@, @SECONDS@, @TOP@)
";

/// The call of the kept `f` ([`PY_TRACE`]), an expression: its answer, or
/// `''` where none is kept.
const CALL_KEPT: &str = "__import__('_tracemalloc')._memshim_f('@ACTION@', @FRAMES@, @SECONDS@, @TOP@) \
if hasattr(__import__('_tracemalloc'), '_memshim_f') else ''";

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
    let fill = |code: &str| {
        code.replace("@ACTION@", name)
            .replace("@FRAMES@", "1")
            .replace(
                "@SECONDS@",
                &seconds.unwrap_or(60).min(MAX_PY_TRACE_SECONDS).to_string(),
            )
            .replace("@TOP@", &PY_TRACE_TOP.to_string())
            .replace("@FILE@", CODE_FILE)
    };
    let mut calls = memshim_reach::python(pid, SAFE_POINT_LIMIT).map_err(|e| failure(pid, e))?;
    let how = reached(&calls);
    let answer = match calls.eval(&fill(CALL_KEPT)) {
        Ok(Some(a)) if !a.is_empty() => Ok(Some(a)),
        _ => calls.eval(&answer_of(&fill(PY_TRACE))),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
