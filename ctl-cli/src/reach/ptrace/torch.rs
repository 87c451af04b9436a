//! PyTorch in a CPython started without the preload: `empty-cache`, and
//! `stats`' `torch` section, by Python code run in the process as the
//! shim's bridge makes its calls (`shim/src/python/cuda.rs`, `torch.rs`).

use super::*;

/// The code of `empty-cache` on a process without the preload, as the
/// shim's bridge does it (`shim/src/python/cuda.rs`): the devices with a
/// context, their reserved bytes before and after `empty_cache()` on each.
/// `answer` is `done|reason|devices|before|after` (reason empty when done).
pub(super) const EMPTY_CACHE: &str = "\
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
pub(super) const TORCH_SECTION: &str = "\
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
pub(super) fn torch_section(answer: &str) -> Result<Option<TorchSection>, String> {
    let mut t: Option<TorchSection> = serde_json::from_str(answer).map_err(|e| e.to_string())?;
    for d in t.iter_mut().flat_map(|t| t.devices.iter_mut()) {
        d.fragmentation = TorchDevice::fragmentation_of(d.inactive_split, d.reserved);
    }
    Ok(t)
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

#[cfg(test)]
mod tests {
    use super::*;

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
