//! The VRAM a process uses on each GPU, as NVIDIA's driver sees it, read
//! through NVML (`libnvidia-ml.so.1`), for `memshim-ctl`. Never loaded by
//! the shim: the library is opened here, in the CLI, on first use, and a
//! machine without it (no NVIDIA driver) simply has no figures.
//!
//! Only the handful of NVML calls below are used, each resolved with
//! `dlsym` and called with the layout of NVML's public header (the
//! versioned names are stable ABI). This crate is the CLI's only `unsafe`.
//!
//! The driver reports pids of the root pid namespace: run from inside a
//! container with a pid namespace of its own, the pids do not match and
//! the process is not found (see docs/stats.md).

use core::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

type Ret = c_int;
type Device = *mut c_void;

/// What the driver says about one GPU and one process on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessGpu {
    /// NVML's index of the device (PCI order, all devices; not torch's).
    pub nvml_index: u32,
    /// `GPU-...`, as CUDA and torch report it too.
    pub uuid: String,
    /// Bytes of the device's memory in use by the process (its CUDA
    /// context, the caching allocator's reservations, libraries' own
    /// allocations); `None` when the driver does not say (some vGPU/MIG
    /// set-ups).
    pub used: Option<u64>,
    /// Device memory in total.
    pub total: u64,
}

/// Why no figures could be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// `libnvidia-ml.so.1` is not there (no NVIDIA driver).
    NoLibrary,
    /// A call failed: its name and NVML's return code.
    Call(&'static str, i32),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoLibrary => f.write_str("NVML (libnvidia-ml.so.1) is not available"),
            Error::Call(what, rc) => write!(f, "NVML: {what} returned {rc}"),
        }
    }
}

/// `nvmlProcessInfo_v2_t` / `_v3_t` (the same four fields).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

const SUCCESS: Ret = 0;
const INSUFFICIENT_SIZE: Ret = 7;
/// `NVML_VALUE_NOT_AVAILABLE`.
const NOT_AVAILABLE: u64 = u64::MAX;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_LEN: usize = 96;

type InitFn = unsafe extern "C" fn() -> Ret;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> Ret;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> Ret;
type UuidFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret;
type MemoryFn = unsafe extern "C" fn(Device, *mut Memory) -> Ret;
type ProcessesFn = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> Ret;

struct Nvml {
    device_count: CountFn,
    handle_by_index: HandleFn,
    uuid: UuidFn,
    memory: MemoryFn,
    processes: ProcessesFn,
}

// SAFETY: plain function pointers into a library that stays loaded for the
// life of the process (never dlclose'd); NVML is thread-safe.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

fn sym(lib: *mut c_void, name: &core::ffi::CStr) -> Option<*mut c_void> {
    // SAFETY: `lib` is a handle from dlopen, `name` a C string.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn load() -> Result<Nvml, Error> {
    // SAFETY: dlopen with a constant name; the handle is never closed.
    let lib = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if lib.is_null() {
        return Err(Error::NoLibrary);
    }
    let need = |name: &core::ffi::CStr| sym(lib, name).ok_or(Error::NoLibrary);
    let init = need(c"nvmlInit_v2")?;
    // SAFETY: each symbol has the signature of NVML's header for that
    // versioned name (nvmlInit_v2: void -> nvmlReturn_t, and so on).
    unsafe {
        let init = core::mem::transmute::<*mut c_void, InitFn>(init);
        let rc = init();
        if rc != SUCCESS {
            return Err(Error::Call("nvmlInit_v2", rc));
        }
        let processes = sym(lib, c"nvmlDeviceGetComputeRunningProcesses_v3")
            .or_else(|| sym(lib, c"nvmlDeviceGetComputeRunningProcesses_v2"))
            .ok_or(Error::NoLibrary)?;
        Ok(Nvml {
            device_count: core::mem::transmute::<*mut c_void, CountFn>(need(
                c"nvmlDeviceGetCount_v2",
            )?),
            handle_by_index: core::mem::transmute::<*mut c_void, HandleFn>(need(
                c"nvmlDeviceGetHandleByIndex_v2",
            )?),
            uuid: core::mem::transmute::<*mut c_void, UuidFn>(need(c"nvmlDeviceGetUUID")?),
            memory: core::mem::transmute::<*mut c_void, MemoryFn>(need(
                c"nvmlDeviceGetMemoryInfo",
            )?),
            processes: core::mem::transmute::<*mut c_void, ProcessesFn>(processes),
        })
    }
}

fn nvml() -> Result<&'static Nvml, Error> {
    static NVML: OnceLock<Result<Nvml, Error>> = OnceLock::new();
    NVML.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Every GPU on which process `pid` (root pid namespace) has memory.
pub fn process_vram(pid: u32) -> Result<Vec<ProcessGpu>, Error> {
    let n = nvml()?;
    let mut count: c_uint = 0;
    // SAFETY: out-pointer to a local.
    let rc = unsafe { (n.device_count)(&mut count) };
    if rc != SUCCESS {
        return Err(Error::Call("nvmlDeviceGetCount_v2", rc));
    }
    let mut out = Vec::new();
    for i in 0..count {
        let mut dev: Device = core::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        if unsafe { (n.handle_by_index)(i, &mut dev) } != SUCCESS {
            continue;
        }
        let Some(procs) = processes(n, dev) else {
            continue;
        };
        let Some(p) = procs.iter().find(|p| p.pid == pid) else {
            continue;
        };
        let mut mem = Memory::default();
        // SAFETY: `dev` is a valid handle, out-pointer to a local.
        unsafe { (n.memory)(dev, &mut mem) };
        let mut buf = [0 as c_char; UUID_LEN];
        // SAFETY: the buffer holds UUID_LEN bytes, as passed.
        let uuid = if unsafe { (n.uuid)(dev, buf.as_mut_ptr(), UUID_LEN as c_uint) } == SUCCESS {
            // SAFETY: NVML NUL-terminates within the buffer on success.
            unsafe { core::ffi::CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            String::new()
        };
        out.push(ProcessGpu {
            nvml_index: i,
            uuid,
            used: (p.used_gpu_memory != NOT_AVAILABLE).then_some(p.used_gpu_memory),
            total: mem.total,
        });
    }
    Ok(out)
}

/// The compute processes on a device (grows the buffer as NVML asks).
fn processes(n: &Nvml, dev: Device) -> Option<Vec<ProcessInfo>> {
    let mut cap: c_uint = 64;
    for _ in 0..4 {
        let mut buf = vec![ProcessInfo::default(); cap as usize];
        let mut len = cap;
        // SAFETY: `buf` holds `len` entries, as passed.
        match unsafe { (n.processes)(dev, &mut len, buf.as_mut_ptr()) } {
            SUCCESS => {
                buf.truncate(len as usize);
                return Some(buf);
            }
            INSUFFICIENT_SIZE => cap = len.max(cap) * 2,
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_struct_has_nvmls_layout() {
        assert_eq!(core::mem::size_of::<ProcessInfo>(), 24);
        assert_eq!(core::mem::offset_of!(ProcessInfo, used_gpu_memory), 8);
        assert_eq!(core::mem::size_of::<Memory>(), 24);
    }

    #[test]
    fn without_a_driver_there_are_no_figures_and_no_crash() {
        // CI has no NVIDIA driver; on a GPU machine this lists nothing for
        // a pid that uses no GPU.
        match process_vram(std::process::id()) {
            Err(Error::NoLibrary) => {}
            Ok(v) => assert!(v.is_empty(), "{v:?}"),
            Err(e) => panic!("{e}"),
        }
    }
}
