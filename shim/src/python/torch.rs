//! The `torch` section of `stats`, and the `empty_cache` action. Job
//! thread, GIL held (called from `job.rs`).
//!
//! Rules (each keeps the bridge from changing what the program's own CUDA
//! use would be):
//! * touch nothing unless `torch` and `torch.cuda` are already in
//!   `sys.modules` (read from there: attribute access on `torch` may load
//!   submodules lazily);
//! * nothing CUDA unless `torch.cuda.is_initialized()`: the calls below
//!   would otherwise initialise it;
//! * every call names its device explicitly, and only devices that already
//!   have a primary context are touched; `empty_cache` runs inside
//!   `with torch.cuda.device(d)` for such a `d`, so the caching allocator's
//!   frees never run with device 0 current in a process that does not use
//!   device 0 (pytorch#25752, #144025);
//! * `empty_cache` is refused while the calling thread's current stream is
//!   capturing a CUDA graph; a capture on another thread of the program
//!   makes PyTorch's caching allocator raise instead of freeing
//!   (`captures_underway`), which is reported as a failure, and any other
//!   exception is caught likewise.

use super::object::{Obj, Py, PyResult};
use memshim_proto::{EmptyCacheResult, TorchDevice, TorchSection};
use std::time::Instant;

/// The `torch` section, `None` if the program has not imported torch.
pub fn section(py: &Py) -> PyResult<Option<TorchSection>> {
    let Some(torch) = py.imported(c"torch") else {
        return Ok(None);
    };
    let version = py
        .attr(&torch, c"__version__")
        .and_then(|v| py.to_string(&v))?;
    let mut s = TorchSection {
        version,
        ..Default::default()
    };
    let Some(cuda) = initialized_cuda(py)? else {
        return Ok(Some(s));
    };
    s.cuda_initialized = true;
    s.devices = devices(py, &cuda)?;
    Ok(Some(s))
}

/// `torch.cuda` if it is imported and initialised.
fn initialized_cuda(py: &Py) -> PyResult<Option<Obj<'_>>> {
    let Some(cuda) = py.imported(c"torch.cuda") else {
        return Ok(None);
    };
    let init = py.to_bool(&py.call_method(&cuda, c"is_initialized", &[])?)?;
    Ok(init.then_some(cuda))
}

/// Whether device `d` has a primary context. Uses torch's own check
/// (`torch._C._cuda_hasPrimaryContext`, which asks the driver without
/// creating one); without it, a device counts if its cache ever held memory.
fn has_context(py: &Py, d: i64, stats: &TorchDevice) -> PyResult<bool> {
    if let Some(c) = py.imported(c"torch._C")
        && let Ok(f) = py.attr(&c, c"_cuda_hasPrimaryContext")
    {
        return py.to_bool(&py.call(&f, &[py.int(d)?.as_ptr()])?);
    }
    Ok(stats.reserved > 0 || stats.peak_allocated > 0)
}

/// Per-device caching-allocator figures for devices that have a context.
fn devices(py: &Py, cuda: &Obj<'_>) -> PyResult<Vec<TorchDevice>> {
    // device_count() is cached once CUDA is initialised.
    let n = py.to_u64(&py.call_method(cuda, c"device_count", &[])?)?;
    let mut out = vec![];
    for d in 0..n.min(1024) as i64 {
        let stats = device_stats(py, cuda, d)?;
        if has_context(py, d, &stats)? {
            out.push(stats);
        }
    }
    Ok(out)
}

/// `torch.cuda.memory_stats(d)`: host-side counters of the caching
/// allocator; no CUDA call.
fn device_stats(py: &Py, cuda: &Obj<'_>, d: i64) -> PyResult<TorchDevice> {
    let m = py.call_method(cuda, c"memory_stats", &[py.int(d)?.as_ptr()])?;
    let get = |k: &core::ffi::CStr| -> u64 {
        py.item(&m, k).and_then(|v| py.to_u64(&v)).unwrap_or(0) // absent key: 0, error cleared
    };
    Ok(TorchDevice {
        index: d as u32,
        allocated: get(c"allocated_bytes.all.current"),
        reserved: get(c"reserved_bytes.all.current"),
        active: get(c"active_bytes.all.current"),
        inactive_split: get(c"inactive_split_bytes.all.current"),
        peak_allocated: get(c"allocated_bytes.all.peak"),
        num_alloc_retries: get(c"num_alloc_retries"),
        num_ooms: get(c"num_ooms"),
    })
}

/// `torch.cuda.empty_cache()` under `with torch.cuda.device(d)` for each
/// device `d` that has a context and cached memory.
pub fn empty_cache(py: &Py) -> PyResult<EmptyCacheResult> {
    let t0 = Instant::now();
    let mut r = EmptyCacheResult::default();
    let skip = |mut r: EmptyCacheResult, why: &str| {
        r.skipped = Some(why.to_owned());
        r.elapsed_ms = t0.elapsed().as_secs_f64() * 1000.0;
        Ok(r)
    };
    if py.imported(c"torch").is_none() {
        return skip(r, "torch is not imported");
    }
    let Some(cuda) = initialized_cuda(py)? else {
        return skip(r, "CUDA is not initialized");
    };
    let before = devices(py, &cuda)?;
    r.devices = before.iter().map(|d| d.index).collect();
    r.reserved_before = before.iter().map(|d| d.reserved).sum();
    let mut refused = None;
    for dev in before.iter().filter(|d| d.reserved > 0) {
        if let Some(why) = empty_on(py, &cuda, i64::from(dev.index))? {
            refused = Some(why);
            break;
        }
    }
    let after = devices(py, &cuda)?;
    r.reserved_after = r
        .devices
        .iter()
        .map(|i| {
            after
                .iter()
                .find(|d| d.index == *i)
                .map_or(0, |d| d.reserved)
        })
        .sum();
    if let Some(why) = refused {
        return skip(r, why);
    }
    r.elapsed_ms = t0.elapsed().as_secs_f64() * 1000.0;
    Ok(r)
}

/// One device: returns `Some(reason)` if refused.
fn empty_on(py: &Py, cuda: &Obj<'_>, d: i64) -> PyResult<Option<&'static str>> {
    let none = py.api().none();
    if none.is_null() {
        return Err("CPython's None is not exported".to_owned());
    }
    let guard = py.call_method(cuda, c"device", &[py.int(d)?.as_ptr()])?;
    py.call_method(&guard, c"__enter__", &[])?;
    let body = (|| -> PyResult<Option<&'static str>> {
        let capturing =
            py.to_bool(&py.call_method(cuda, c"is_current_stream_capturing", &[])?)?;
        if capturing {
            return Ok(Some("a CUDA graph capture is in progress on this thread"));
        }
        py.call_method(cuda, c"empty_cache", &[])?;
        Ok(None)
    })();
    let exit = py.call_method(&guard, c"__exit__", &[none, none, none]);
    let out = body?;
    exit?;
    Ok(out)
}
