//! The `torch` section of `stats`, and what the CUDA actions (`cuda.rs`)
//! read. Job thread, GIL held (called from `job.rs`).
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
use memshim_proto::{HostPinned, TorchDevice, TorchSection};

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
    s.alloc_conf = alloc_conf(py)?;
    let Some(cuda) = initialized_cuda(py)? else {
        return Ok(Some(s));
    };
    s.cuda_initialized = true;
    s.devices = devices(py, &cuda)?;
    for d in &mut s.devices {
        d.uuid = uuid(py, &cuda, i64::from(d.index));
    }
    s.allocator_backend = py
        .call_method(&cuda, c"get_allocator_backend", &[])
        .and_then(|b| py.to_string(&b))
        .ok();
    s.host_pinned = host_pinned(py, &cuda);
    Ok(Some(s))
}

/// The allocator settings in effect: torch's own account once CUDA is
/// initialised (`torch._C._accelerator_getAllocatorSettings()`, where it
/// exists and says something), else `PYTORCH_CUDA_ALLOC_CONF` or
/// `PYTORCH_ALLOC_CONF` from `os.environ`.
fn alloc_conf(py: &Py) -> PyResult<Option<String>> {
    if initialized_cuda(py)?.is_some()
        && let Some(c) = py.imported(c"torch._C")
        && let Ok(f) = py.attr(&c, c"_accelerator_getAllocatorSettings")
        && let Ok(v) = py.call(&f, &[]).and_then(|v| py.to_string(&v))
        && !v.is_empty()
    {
        return Ok(Some(v));
    }
    let Some(os) = py.imported(c"os") else {
        return Ok(None);
    };
    let environ = py.attr(&os, c"environ")?;
    for key in [c"PYTORCH_CUDA_ALLOC_CONF", c"PYTORCH_ALLOC_CONF"] {
        // A missing key raises KeyError, which `item` clears.
        if let Ok(v) = py.item(&environ, key) {
            return Ok(Some(py.to_string(&v)?));
        }
    }
    Ok(None)
}

/// `str(torch.cuda.get_device_properties(d).uuid)` as `GPU-<uuid>`, the
/// form NVML uses. `d` has a context, so this creates none.
fn uuid(py: &Py, cuda: &Obj<'_>, d: i64) -> Option<String> {
    let props = py
        .call_method(cuda, c"get_device_properties", &[py.int(d).ok()?.as_ptr()])
        .ok()?;
    let u = py.to_string(&py.attr(&props, c"uuid").ok()?).ok()?;
    Some(if u.starts_with("GPU-") {
        u
    } else {
        format!("GPU-{u}")
    })
}

/// The pinned host cache (`torch.cuda.host_memory_stats()`), where this
/// torch has it.
pub fn host_pinned(py: &Py, cuda: &Obj<'_>) -> Option<HostPinned> {
    let m = py.call_method(cuda, c"host_memory_stats", &[]).ok()?;
    let get =
        |k: &core::ffi::CStr| -> u64 { py.item(&m, k).and_then(|v| py.to_u64(&v)).unwrap_or(0) };
    let allocated = get(c"allocated_bytes.current");
    let active = get(c"active_bytes.current");
    Some(HostPinned {
        allocated,
        active,
        cached: allocated.saturating_sub(active),
    })
}

/// `torch.cuda` if it is imported and initialised.
pub fn initialized_cuda(py: &Py) -> PyResult<Option<Obj<'_>>> {
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
pub fn devices(py: &Py, cuda: &Obj<'_>) -> PyResult<Vec<TorchDevice>> {
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
    let reserved = get(c"reserved_bytes.all.current");
    let inactive_split = get(c"inactive_split_bytes.all.current");
    Ok(TorchDevice {
        index: d as u32,
        allocated: get(c"allocated_bytes.all.current"),
        reserved,
        active: get(c"active_bytes.all.current"),
        inactive_split,
        peak_allocated: get(c"allocated_bytes.all.peak"),
        num_alloc_retries: get(c"num_alloc_retries"),
        num_ooms: get(c"num_ooms"),
        fragmentation: TorchDevice::fragmentation_of(inactive_split, reserved),
        uuid: None,
        allocations: get(c"allocation.all.allocated"),
    })
}
