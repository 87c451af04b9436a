//! The CUDA actions: `empty_cache`, and the CUDA steps of `release`. Job
//! thread, GIL held (called from `job.rs`), under the rules of `torch.rs`:
//! nothing CUDA unless `torch.cuda.is_initialized()`, and only devices that
//! already have a context are named.
//!
//! `release` runs, in this order (each a step of its own, with per-device
//! figures before and after):
//!
//! 1. `ipc_collect`: memory of tensors shared with other processes through
//!    CUDA IPC that they have let go, back to the caching allocator
//!    (`torch._C._cuda_ipc_collect`, not `torch.cuda.ipc_collect`, whose
//!    `_lazy_init` we must never reach);
//! 2. `cublas_workspaces`: cuBLAS keeps a workspace per (handle, stream)
//!    in the caching allocator; `torch._C._cuda_clearCublasWorkspaces`
//!    hands them back to it, so that 3. can free them (only where the
//!    installed torch has the call; torch re-creates a workspace on the next
//!    matmul);
//! 3. `empty_cache` on each device with a context;
//! 4. `host_cache`: the pinned host-memory cache
//!    (`torch.accelerator.empty_host_cache`, or `torch._C._host_emptyCache`).
//!
//! A step whose call this torch lacks has nothing to do; a step that raises
//! failed; the others still run.
//!
//! [`idle_check`] is the interpreter's half of the idle VRAM return
//! (`thread/cuda_idle.rs` decides when to ask): it reads the allocation
//! counters and, when nothing was allocated since the last look and enough
//! sits unused, empties the caches (3. and 4. above).

use super::object::{Obj, Py, PyResult};
use super::torch::{devices, host_pinned, initialized_cuda};
use memshim_proto::{DeviceChange, EmptyCacheResult, ReleaseStep, ReleaseStepKind, TorchDevice};
use std::time::Instant;

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
pub fn empty_on(py: &Py, cuda: &Obj<'_>, d: i64) -> PyResult<Option<&'static str>> {
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

/// Reserved (or allocated) bytes per device with a context.
fn per_device(py: &Py, cuda: &Obj<'_>, pick: fn(&TorchDevice) -> u64) -> PyResult<Vec<(u32, u64)>> {
    Ok(devices(py, cuda)?
        .iter()
        .map(|d| (d.index, pick(d)))
        .collect())
}

/// Fills a step's per-device and total figures.
fn figures(step: &mut ReleaseStep, before: &[(u32, u64)], after: &[(u32, u64)]) {
    step.devices = before
        .iter()
        .map(|&(index, b)| DeviceChange {
            index,
            before: b,
            after: after.iter().find(|(i, _)| *i == index).map_or(0, |a| a.1),
        })
        .collect();
    step.before = step.devices.iter().map(|d| d.before).sum();
    step.after = step.devices.iter().map(|d| d.after).sum();
}

/// Calls `torch._C.<name>()` if this torch has it. `Ok(false)`: it does not.
fn call_c(py: &Py, name: &core::ffi::CStr) -> PyResult<bool> {
    let Some(c) = py.imported(c"torch._C") else {
        return Ok(false);
    };
    let Ok(f) = py.attr(&c, name) else {
        return Ok(false);
    };
    py.call(&f, &[])?;
    Ok(true)
}

/// One CUDA step measured per device: `run` returns `Ok(false)` if this
/// torch has no call for it.
fn device_step(
    py: &Py,
    cuda: &Obj<'_>,
    kind: ReleaseStepKind,
    measure: &str,
    pick: fn(&TorchDevice) -> u64,
    run: impl FnOnce() -> PyResult<bool>,
) -> PyResult<ReleaseStep> {
    let t = Instant::now();
    let mut step = ReleaseStep::new(kind, measure);
    let before = per_device(py, cuda, pick)?;
    let ran = run();
    let after = per_device(py, cuda, pick)?;
    figures(&mut step, &before, &after);
    step = match ran {
        Ok(true) => step,
        Ok(false) => step.nothing_to_do("this torch has no call for it"),
        Err(e) => step.failed(e),
    };
    step.elapsed_ms = t.elapsed().as_secs_f64() * 1000.0;
    Ok(step)
}

/// The CUDA steps of `release`. Without torch or an initialised CUDA, one
/// `empty_cache` step that says so stands for all of them.
pub fn release_steps(py: &Py) -> PyResult<Vec<ReleaseStep>> {
    let t0 = Instant::now();
    let quiet = |why: &str| {
        let mut s =
            ReleaseStep::new(ReleaseStepKind::EmptyCache, "cuda_reserved").nothing_to_do(why);
        s.elapsed_ms = t0.elapsed().as_secs_f64() * 1000.0;
        Ok(vec![s])
    };
    if py.imported(c"torch").is_none() {
        return quiet("torch is not imported");
    }
    let Some(cuda) = initialized_cuda(py)? else {
        return quiet("CUDA is not initialized");
    };
    let reserved: fn(&TorchDevice) -> u64 = |d| d.reserved;
    let allocated: fn(&TorchDevice) -> u64 = |d| d.allocated;
    let mut steps = Vec::with_capacity(4);
    steps.push(device_step(
        py,
        &cuda,
        ReleaseStepKind::IpcCollect,
        "cuda_allocated",
        allocated,
        || call_c(py, c"_cuda_ipc_collect"),
    )?);
    steps.push(device_step(
        py,
        &cuda,
        ReleaseStepKind::CublasWorkspaces,
        "cuda_allocated",
        allocated,
        || call_c(py, c"_cuda_clearCublasWorkspaces"),
    )?);
    steps.push(device_step(
        py,
        &cuda,
        ReleaseStepKind::EmptyCache,
        "cuda_reserved",
        reserved,
        || {
            for d in devices(py, &cuda)?.iter().filter(|d| d.reserved > 0) {
                if let Some(why) = empty_on(py, &cuda, i64::from(d.index))? {
                    return Err(why.to_owned());
                }
            }
            Ok(true)
        },
    )?);
    steps.push(host_cache_step(py, &cuda));
    Ok(steps)
}

/// The pinned host cache: `torch.accelerator.empty_host_cache()` where it
/// exists, else `torch._C._host_emptyCache()`; cached pinned bytes.
fn host_cache_step(py: &Py, cuda: &Obj<'_>) -> ReleaseStep {
    let t = Instant::now();
    let mut step = ReleaseStep::new(ReleaseStepKind::HostCache, "pinned_host_cached");
    let Some(before) = host_pinned(py, cuda) else {
        return step.nothing_to_do("this torch does not report its pinned host cache");
    };
    let accel = py
        .imported(c"torch.accelerator")
        .and_then(|a| py.attr(&a, c"empty_host_cache").ok());
    let ran = match accel {
        Some(f) => py.call(&f, &[]).map(|_| true),
        None => call_c(py, c"_host_emptyCache"),
    };
    let after = host_pinned(py, cuda).unwrap_or_default();
    step.before = before.cached;
    step.after = after.cached;
    step = match ran {
        Ok(true) => step,
        Ok(false) => step.nothing_to_do("this torch has no call for it"),
        Err(e) => step.failed(e),
    };
    step.elapsed_ms = t.elapsed().as_secs_f64() * 1000.0;
    step
}

/// What one look of the idle return found (and did).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdleCheck {
    /// torch is imported and CUDA initialised: there is something to watch.
    pub cuda: bool,
    /// `allocation.all.allocated` summed over the devices with a context.
    pub allocations: u64,
    /// Reserved minus allocated VRAM, plus the cached pinned host memory.
    pub unused: u64,
    /// The caches were emptied.
    pub acted: bool,
    /// VRAM given back (reserved before minus after).
    pub vram_returned: u64,
    /// Pinned host memory given back.
    pub pinned_returned: u64,
}

/// Looks at the caching allocators; empties them only if `expect` is the
/// allocation count seen now (nothing was allocated since the last look)
/// and at least `min_unused` bytes sit unused. Never initialises CUDA and
/// names only devices with a context (`devices`).
pub fn idle_check(py: &Py, expect: Option<u64>, min_unused: u64) -> PyResult<IdleCheck> {
    let mut r = IdleCheck::default();
    if py.imported(c"torch").is_none() {
        return Ok(r);
    }
    let Some(cuda) = initialized_cuda(py)? else {
        return Ok(r);
    };
    r.cuda = true;
    let before = devices(py, &cuda)?;
    let pinned_before = host_pinned(py, &cuda).map_or(0, |h| h.cached);
    r.allocations = before
        .iter()
        .map(|d| d.allocations)
        .fold(0, u64::wrapping_add);
    r.unused = before
        .iter()
        .map(|d| d.reserved.saturating_sub(d.allocated))
        .fold(pinned_before, u64::saturating_add);
    if expect != Some(r.allocations) || r.unused < min_unused {
        return Ok(r);
    }
    for d in before.iter().filter(|d| d.reserved > d.allocated) {
        if empty_on(py, &cuda, i64::from(d.index))?.is_some() {
            // A graph capture is under way: the process is not idle.
            return Ok(r);
        }
    }
    if pinned_before > 0 {
        let _ = host_cache_step(py, &cuda);
    }
    r.acted = true;
    let after = devices(py, &cuda)?;
    r.vram_returned = before
        .iter()
        .map(|b| {
            let a = after
                .iter()
                .find(|a| a.index == b.index)
                .map_or(0, |a| a.reserved);
            b.reserved.saturating_sub(a)
        })
        .fold(0, u64::saturating_add);
    let pinned_after = host_pinned(py, &cuda).map_or(0, |h| h.cached);
    r.pinned_returned = pinned_before.saturating_sub(pinned_after);
    Ok(r)
}
