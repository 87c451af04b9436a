//! The CPython and PyTorch parts of the protocol (issue "Python bridge").
//! The shim fills them through `crate::python` (shim/src/python/).

use serde::{Deserialize, Serialize};

/// The interpreter, as `stats` reports it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PythonSection {
    /// `sys.version` up to the first space, e.g. `"3.11.9"`.
    pub version: String,
    /// A free-threaded (`Py_GIL_DISABLED`, "3.13t") build.
    pub free_threaded: bool,
    /// `gc.isenabled()`.
    pub gc_enabled: bool,
    /// `gc.get_count()`: allocations minus deallocations per generation
    /// since its last collection. `None` (and the next two) if the program
    /// has not imported `gc`: the bridge never imports a module, and
    /// CPython has no C API for these figures.
    pub gc_counts: Option<[u64; 3]>,
    /// `gc.get_threshold()`.
    pub gc_thresholds: Option<[u64; 3]>,
    /// `gc.get_stats()[i]["collections"]`: collections run per generation.
    pub gc_collections: Option<[u64; 3]>,
    /// `sys.getallocatedblocks()`: blocks pymalloc has handed out.
    pub allocated_blocks: u64,
    /// Threads of the interpreter: the main interpreter's thread states
    /// (every thread that runs Python code or holds a thread state, whether
    /// `threading` started it or not), not counting memshim's own, and not
    /// OS threads.
    pub threads: u64,
    /// Bytes in pymalloc arenas, which are `mmap`ed directly and bypass
    /// malloc (and so the shim), where it can be read.
    pub pymalloc_arena_bytes: Option<u64>,
}

/// The bytes in pymalloc's arenas from what CPython's
/// `_PyObject_DebugMallocStats` writes (`sys._debugmallocstats()`'s text):
/// its line `N arenas * S bytes/arena = B`. Read in the process by the
/// shim's bridge and, without the shim, by memshim-ctl's ptrace road.
pub fn pymalloc_arena_bytes(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.contains("bytes/arena"))?;
    let value = line.rsplit('=').next()?;
    let digits: String = value.chars().filter(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// PyTorch, as `stats` reports it (only if `torch` is already imported).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct TorchSection {
    /// `torch.__version__`.
    pub version: String,
    /// `torch.cuda.is_initialized()`.
    pub cuda_initialized: bool,
    /// One entry per device that has a context (empty unless CUDA is
    /// initialized).
    pub devices: Vec<TorchDevice>,
    /// The caching allocator's backend, `native` or `cudaMallocAsync`
    /// (`torch.cuda.get_allocator_backend()`); only once CUDA is initialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_backend: Option<String>,
    /// The allocator settings in effect: what torch reports it parsed
    /// (`torch._C._accelerator_getAllocatorSettings()`, once CUDA is
    /// initialised), else the `PYTORCH_CUDA_ALLOC_CONF` /
    /// `PYTORCH_ALLOC_CONF` of the process's `os.environ`. `None`: neither
    /// is set (the defaults apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    /// The pinned (page-locked) host memory cache
    /// (`torch.cuda.host_memory_stats()`); only once CUDA is initialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_pinned: Option<HostPinned>,
}

/// PyTorch's pinned host-memory caching allocator, bytes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostPinned {
    /// `allocated_bytes.current`: pinned blocks the allocator owns, in use
    /// or cached.
    pub allocated: u64,
    /// `active_bytes.current`: blocks handed out and not yet reusable.
    pub active: u64,
    /// `allocated - active`: cached blocks that `release` gives back.
    pub cached: u64,
}

/// The CUDA caching allocator of one device
/// (`torch.cuda.memory_stats(index)`, bytes and counts).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct TorchDevice {
    /// Device index.
    pub index: u32,
    /// `allocated_bytes.all.current`: bytes in live tensors.
    pub allocated: u64,
    /// `reserved_bytes.all.current`: bytes the cache holds from the driver.
    pub reserved: u64,
    /// `active_bytes.all.current`.
    pub active: u64,
    /// `inactive_split_bytes.all.current`: free fragments of split blocks.
    pub inactive_split: u64,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated: u64,
    /// `num_alloc_retries`: cache flushes forced by a failed cudaMalloc.
    pub num_alloc_retries: u64,
    /// `num_ooms`: out-of-memory errors raised.
    pub num_ooms: u64,
    /// `inactive_split / reserved` (0 with nothing reserved): the share of
    /// the reserved memory that sits in free fragments of split blocks,
    /// which only `empty_cache` (or a different allocation pattern) gives
    /// back. High values with retries mean fragmentation (docs/stats.md).
    #[serde(default)]
    pub fragmentation: f64,
    /// The device's UUID as CUDA reports it (`GPU-...`), to match NVML's
    /// per-process figures; `None` if torch does not offer it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// `allocation.all.allocated`: allocations made since the process
    /// started (a cumulative count; the idle return compares it between
    /// two looks to see that nothing was allocated).
    #[serde(default)]
    pub allocations: u64,
}

impl TorchDevice {
    /// `inactive_split / reserved`, 0 when nothing is reserved.
    pub fn fragmentation_of(inactive_split: u64, reserved: u64) -> f64 {
        if reserved == 0 {
            0.0
        } else {
            inactive_split as f64 / reserved as f64
        }
    }
}

/// The CPython minor versions the bridge serves, first and last (the
/// shim's table, `shim/src/python/version.rs`, says how it serves each).
pub const PYTHON_SERVED: ((u32, u32), (u32, u32)) = ((3, 8), (3, 15));

/// [`PythonUnavailable::Unsupported`]'s `build` for a free-threaded
/// (no-GIL) CPython, which the bridge refuses whatever its version.
pub const FREE_THREADED_BUILD: &str = "free-threading";

/// "CPython 3.8 to 3.15 (builds with a GIL)": what the bridge serves, in
/// words, for hints and docs.
pub fn python_served_text() -> String {
    let ((a, b), (c, d)) = PYTHON_SERVED;
    format!("CPython {a}.{b} to {c}.{d} (builds with a GIL)")
}

/// Why CPython could not be used for a request.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum PythonUnavailable {
    /// No CPython C-API in the process's global scope (not a Python
    /// process, or one that embeds Python `RTLD_LOCAL`).
    NoPython,
    /// The interpreter is not initialised yet.
    NotInitialized,
    /// The interpreter is finalising (or has finalised).
    Finalizing,
    /// A CPython version or build the bridge does not support.
    Unsupported {
        /// The version found (`Py_GetVersion()` up to its first space).
        version: String,
        /// The build, when it is the reason: [`FREE_THREADED_BUILD`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        build: Option<String>,
    },
    /// The GIL could not be had within the time limit (a C extension held
    /// it), or an earlier job is still running.
    Busy {
        /// How long the bridge waited.
        waited_ms: u64,
    },
    /// Python raised, or the bridge failed; nothing was left half-done.
    Error {
        /// What failed.
        message: String,
    },
}

impl std::fmt::Display for PythonUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PythonUnavailable::NoPython => {
                f.write_str("no CPython in this process (or it is loaded RTLD_LOCAL)")
            }
            PythonUnavailable::NotInitialized => {
                f.write_str("the CPython interpreter is not initialised yet")
            }
            PythonUnavailable::Finalizing => {
                f.write_str("the CPython interpreter is shutting down")
            }
            PythonUnavailable::Unsupported {
                version,
                build: None,
            } => write!(f, "CPython {version} is not supported"),
            PythonUnavailable::Unsupported {
                version,
                build: Some(build),
            } => write!(f, "CPython {version} ({build} build) is not supported"),
            PythonUnavailable::Busy { waited_ms } => {
                write!(
                    f,
                    "CPython was busy: the GIL could not be had within {waited_ms} ms; try again"
                )
            }
            PythonUnavailable::Error { message } => write!(f, "Python failed: {message}"),
        }
    }
}
