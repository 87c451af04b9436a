//! `release` and `gc` on a CPython started without the preload: the
//! collector, PyTorch's caches (as the shim's bridge empties them), then
//! glibc's `malloc_trim(0)`.

use super::*;

/// The CUDA steps of `release` on a process without the preload, as the
/// shim's bridge makes them (`shim/src/python/cuda.rs`): ipc_collect, the
/// cuBLAS workspaces, empty_cache on each device with a context, the pinned
/// host cache; or one `empty_cache` step with nothing to do without torch or
/// CUDA. `answer` holds one `;`-separated line per step,
/// `kind|measure|done/skip/fail|reason|ms|before|after|i:before:after,...`.
pub(super) const CUDA_RELEASE: &str = "\
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
            None => s.nothing_to_do(
                "the process's malloc is not glibc's (another allocator is preloaded, or none \
                 exports malloc_trim): its free memory goes back by its own rules; `memshim-ctl \
                 attach` reaches jemalloc's and tcmalloc's own return",
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_release_answers_are_parsed() {
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
    }
}
