//! The `stats` report. Every field is defined in docs/stats.md; the JSON
//! names are a stable contract.

use crate::python::{PythonSection, PythonUnavailable, TorchSection};
use serde::{Deserialize, Serialize};

/// Answer to `stats`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct StatsReport {
    /// The process id in its own pid namespace.
    pub pid: i32,
    /// jemalloc's figures, in bytes.
    pub allocator: AllocatorStats,
    /// Per-arena summaries (only when asked for with `"arenas":true`).
    #[serde(default)]
    pub arenas: Option<Vec<ArenaStats>>,
    /// The process as the kernel sees it, in bytes.
    pub process: ProcessStats,
    /// The memory cgroup the process is in, if one can be read.
    #[serde(default)]
    pub cgroup: Option<CgroupStats>,
    /// Effective configuration and the shim's state.
    pub config: ConfigState,
    /// The hosted CPython, if any (see `python_unavailable` otherwise).
    #[serde(default)]
    pub python: Option<PythonSection>,
    /// PyTorch, only if `torch` is already imported.
    #[serde(default)]
    pub torch: Option<TorchSection>,
    /// Why `python` is absent.
    #[serde(default)]
    pub python_unavailable: Option<PythonUnavailable>,
    /// Purge requests served since the process started (or forked);
    /// absent from shims that predate the field.
    #[serde(default)]
    pub purges: Option<PurgeCounters>,
    /// The idle VRAM return (`MEMSHIM_CUDA_IDLE_MS`): its settings and what
    /// it has done; absent when it is off and from older shims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_idle: Option<CudaIdleCounters>,
    /// The pressure watcher (`MEMSHIM_PRESSURE`); absent from shims that
    /// predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<PressureStats>,
    /// Time the server spent building this report, in ms.
    pub elapsed_ms: f64,
}

/// Cumulative purge figures of one process (Prometheus counters).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeCounters {
    /// `purge` requests served (each `release` includes one).
    pub count: u64,
    /// Sum of `released` (RSS before minus after) over those requests, in bytes.
    pub released_bytes: u64,
}

/// The idle VRAM return of one process (docs/python.md, "Idle VRAM
/// return"); counters since the process started (or forked).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CudaIdleCounters {
    /// `MEMSHIM_CUDA_IDLE_MS`: how long the process must be idle.
    pub idle_ms: u64,
    /// `MEMSHIM_CUDA_IDLE_MIN_MB` in bytes: the least unused cache worth
    /// returning.
    pub min_bytes: u64,
    /// Looks into the interpreter (each takes the GIL once).
    pub checks: u64,
    /// Times the caches were emptied.
    pub returns: u64,
    /// VRAM the caching allocator gave back to the driver, in bytes (sum
    /// of reserved before minus after).
    pub vram_returned: u64,
    /// Pinned host memory the host cache gave back, in bytes.
    pub pinned_returned: u64,
}

/// The pressure watcher: what it watches and what it did since the
/// process started (or forked). docs/stats.md, "pressure".
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct PressureStats {
    /// `MEMSHIM_PRESSURE`: `"on"`, `"off"` or `"gc"`.
    pub mode: String,
    /// What is watched: `"v1"` or `"v2"` (a memory cgroup with a limit),
    /// `"none"` (no limit visible, or `off`).
    pub source: String,
    /// The notifications in use, e.g. `["usage_threshold","pressure_level","check"]`.
    #[serde(default)]
    pub watching: Vec<String>,
    /// The limit that applies, in bytes.
    #[serde(default)]
    pub limit: Option<u64>,
    /// The working set at which pressure starts, in bytes.
    #[serde(default)]
    pub threshold: Option<u64>,
    /// Pressure now (decay is short until it has been gone for a while).
    pub active: bool,
    /// Pressure signals seen (kernel notifications, threshold crossings).
    pub events: u64,
    /// Purges run because of pressure.
    pub purges: u64,
    /// RSS returned by those purges (before minus after), summed, in bytes.
    pub bytes_returned: u64,
    /// Python `gc` runs because of pressure (`gc` mode only).
    #[serde(default)]
    pub gc_runs: u64,
    /// Notifications (a PSI trigger, `memory.events`, a v1 event) after
    /// which the working set was below the threshold: page cache the kernel
    /// reclaims by itself, not pressure. Absent from older shims.
    #[serde(default)]
    pub ignored: u64,
    /// Milliseconds from the last onset's signal to the end of its purge.
    #[serde(default)]
    pub last_purge_ms: Option<f64>,
}

/// Process-wide jemalloc figures from one `epoch` snapshot, in bytes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocatorStats {
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes in active pages (allocated plus rounding and fragmentation).
    pub active: u64,
    /// Bytes in resident pages jemalloc maps (data, dirty pages, metadata).
    pub resident: u64,
    /// Bytes in extents jemalloc has mapped and uses.
    pub mapped: u64,
    /// Virtual memory kept for reuse, not resident.
    pub retained: u64,
    /// jemalloc's own bookkeeping.
    pub metadata: u64,
    /// Unused dirty pages: what a purge gives back now.
    pub dirty: u64,
    /// Pages released with MADV_FREE and not yet reclaimed (still in RSS).
    pub muzzy: u64,
    /// Bytes cached by threads; a purge cannot reach them.
    pub tcache: u64,
    /// `dirty + muzzy`: what `purge` can return.
    pub purgeable: u64,
}

/// One arena.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Arena index.
    pub index: u32,
    /// Threads bound to it.
    pub threads: u32,
    /// Bytes in active pages.
    pub active: u64,
    /// Unused dirty bytes.
    pub dirty: u64,
    /// Muzzy bytes.
    pub muzzy: u64,
    /// Resident bytes.
    pub resident: u64,
    /// Bytes in thread caches of threads bound to it.
    pub tcache: u64,
}

/// The process, from `/proc/self`, in bytes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessStats {
    /// Resident set size (`VmRSS`).
    pub rss: u64,
    /// Proportional set size from `smaps_rollup` (only with `"pss":true`).
    #[serde(default)]
    pub pss: Option<u64>,
    /// Anonymous resident memory (`RssAnon`).
    #[serde(default)]
    pub anon: Option<u64>,
    /// File-backed resident memory (`RssFile`).
    #[serde(default)]
    pub file: Option<u64>,
    /// Shared memory, tmpfs (`RssShmem`).
    #[serde(default)]
    pub shmem: Option<u64>,
    /// Swapped-out anonymous memory (`VmSwap`).
    #[serde(default)]
    pub swap: Option<u64>,
    /// `rss - min(allocator.resident + allocator.muzzy, anon)`: memory the
    /// shim does not manage (pymalloc arenas, direct mmap, stacks, code,
    /// ...); docs/stats.md.
    pub unmanaged: u64,
}

/// The memory cgroup, in bytes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupStats {
    /// 2 (unified) or 1 (legacy `memory` controller).
    pub version: u8,
    /// Path of the cgroup inside the cgroup filesystem.
    pub path: String,
    /// `memory.current` (v1: `memory.usage_in_bytes`).
    pub current: u64,
    /// `memory.max` (v1: `memory.limit_in_bytes`); `null` = no limit.
    #[serde(default)]
    pub max: Option<u64>,
    /// `anon` of `memory.stat` (v1: `total_rss`).
    #[serde(default)]
    pub anon: Option<u64>,
    /// `file` of `memory.stat` (v1: `total_cache`).
    #[serde(default)]
    pub file: Option<u64>,
    /// `kernel` of `memory.stat` (v1: `memory.kmem.usage_in_bytes`).
    #[serde(default)]
    pub kernel: Option<u64>,
}

impl CgroupStats {
    /// The `cgroup` section from a cgroup's files (`path`: inside the
    /// hierarchy), with the same figures `memshim-ctl cgroup` derives.
    pub fn from_files(path: String, f: &crate::cgroup::MemoryFiles) -> CgroupStats {
        let m = crate::cgroup::CgroupMemory::from_files(f);
        // `file` of memory.stat (v1 `total_cache`): page cache with tmpfs.
        let file_key = if f.version == 1 {
            "total_cache"
        } else {
            "file"
        };
        CgroupStats {
            version: m.version,
            path,
            current: m.usage,
            max: m.limit,
            anon: f
                .stat
                .contains_key(if f.version == 1 { "total_rss" } else { "anon" })
                .then_some(m.anon),
            file: f.stat.get(file_key).copied(),
            kernel: m.kernel,
        }
    }
}

/// Effective configuration and the shim's state.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigState {
    /// Current dirty decay (ms, -1 = never).
    pub dirty_decay_ms: i64,
    /// Current muzzy decay (ms, -1 = never).
    pub muzzy_decay_ms: i64,
    /// Arena slots.
    pub narenas: u32,
    /// The shim's thread runs its decay tick (always true while it answers).
    pub background_purge: bool,
    /// jemalloc's own background threads are enabled.
    pub jemalloc_background_thread: bool,
    /// jemalloc's version string.
    pub jemalloc_version: String,
    /// libmemshim version.
    pub shim_version: String,
    /// The shim's `malloc` is the process's `malloc`.
    pub interposed: bool,
    /// `MEMSHIM_CONTROL`: `"auto"`, `"on"` or `"off"`.
    pub control: String,
    /// Milliseconds since the shim started in this process (or since fork).
    pub uptime_ms: u64,
    /// This process is a fork child of a shimmed process.
    pub fork_child: bool,
    /// `dlopen` calls whose `RTLD_DEEPBIND` the shim removed.
    pub deepbind_cleared: u64,
    /// How often the shim's thread was started in this process.
    pub thread_starts: u64,
    /// Whether the shim's thread keeps its descriptors in a table of its
    /// own (`false`: in the application's, the fallback where the kernel
    /// or a seccomp profile refuses). `null` from releases before it was
    /// reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_fds: Option<bool>,
    /// The huge page size at which purges split the huge pages they cover
    /// in part, so that the memory cgroup gets their pages back at once
    /// (0: huge pages do not back the heap). `null` from releases before
    /// it was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thp_split_bytes: Option<u64>,
}
