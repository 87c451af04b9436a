//! The `python` section of `stats`, and the `gc` action. Job thread, GIL
//! held (called from `job.rs`). Never imports a module: `gc` is used only
//! if the program imported it, and `threading` never (see `threads.rs`).

use super::object::{Obj, Py, PyResult};
use super::pymalloc;
use memshim_proto::{GcResult, PythonSection};
use std::time::Instant;

/// Reads the `python` section.
pub fn section(py: &Py) -> PyResult<PythonSection> {
    let api = py.api();
    let mut s = PythonSection {
        version: api.version(),
        ..Default::default()
    };
    if let Some(flags) = py.sys_attr(c"abiflags") {
        s.free_threaded = py.to_string(&flags)?.contains('t');
    }
    match py.imported(c"gc") {
        Some(gc) => {
            s.gc_enabled = py.to_bool(&py.call_method(&gc, c"isenabled", &[])?)?;
            s.gc_counts = Some(py.triple(&py.call_method(&gc, c"get_count", &[])?)?);
            s.gc_thresholds = Some(py.triple(&py.call_method(&gc, c"get_threshold", &[])?)?);
            s.gc_collections = Some(collections(py, &gc)?);
        }
        // SAFETY: GIL held; PyGC_IsEnabled (3.10+) reads a flag. Before
        // 3.10 the collector can only be disabled through the gc module.
        None => s.gc_enabled = api.gc_is_enabled.is_none_or(|f| unsafe { f() } != 0),
    }
    if let Some(f) = py.sys_attr(c"getallocatedblocks") {
        s.allocated_blocks = py.to_u64(&py.call(&f, &[])?)?;
    }
    s.threads = super::threads::count(py);
    s.pymalloc_arena_bytes = pymalloc::arena_bytes(api);
    Ok(s)
}

/// `[gc.get_stats()[i]["collections"] for i in 0..3]`.
fn collections(py: &Py, gc: &Obj<'_>) -> PyResult<[u64; 3]> {
    let stats = py.call_method(gc, c"get_stats", &[])?;
    let mut out = [0u64; 3];
    let n = py.len(&stats)?.min(3);
    for (i, slot) in out.iter_mut().enumerate().take(n) {
        let gen_stats = py.index(&stats, i as isize)?;
        *slot = py.to_u64(&py.item(&gen_stats, c"collections")?)?;
    }
    Ok(out)
}

/// A full collection, like `gc.collect()`, even if the program disabled
/// the collector.
pub fn collect(py: &Py) -> PyResult<GcResult> {
    let api = py.api();
    let rss_before = crate::os::proc::rss_bytes();
    let t0 = Instant::now();
    let collected = match py.imported(c"gc") {
        Some(gc) => py.to_u64(&py.call_method(&gc, c"collect", &[])?)?,
        // SAFETY: GIL held. PyGC_Collect does nothing while the collector
        // is disabled, so enable it around the call and restore the state
        // (3.10+; before 3.10 it can only be disabled through `gc`).
        None => unsafe {
            let was_enabled = api.gc_is_enabled.is_none_or(|f| f() != 0);
            if !was_enabled && let Some(enable) = api.gc_enable {
                enable();
            }
            let n = (api.gc_collect)();
            if !was_enabled && let Some(disable) = api.gc_disable {
                disable();
            }
            if n < 0 {
                return Err(py.take_error());
            }
            n as u64
        },
    };
    // The job thread runs without a jemalloc thread cache, so what the
    // collection freed is in the arenas, where the purge of `release`
    // reaches it; flushing is a no-op then, and a safety net otherwise.
    let _ = crate::jemalloc::flush_own_tcache();
    let elapsed_ms = t0.elapsed().as_secs_f64() * 1000.0;
    Ok(GcResult {
        collected,
        rss_before,
        rss_after: crate::os::proc::rss_bytes(),
        elapsed_ms,
    })
}
