//! The idle VRAM return (`MEMSHIM_CUDA_IDLE_MS`, off by default): when a
//! process with CUDA initialised has been idle for that long, PyTorch's
//! caching allocator gives its unused VRAM back to the driver
//! (`empty_cache` on each device with a context) and the pinned host cache
//! is emptied. PyTorch's own `garbage_collection_threshold` acts only when
//! the process allocates; this acts when it does not.
//!
//! The shim's thread decides when to look, from two facts it can read
//! without the GIL, and the interpreter (through the Python bridge,
//! `python::cuda_idle_check`) decides whether to act:
//!
//! 1. **little CPU**: the process's threads other than the shim's own used
//!    less than [`BUSY_SHARE_PERCENT`] of one CPU, measured over windows of
//!    at least [`WINDOW_MS`] (so a monitoring scrape, a few milliseconds,
//!    does not count as work). A busy window starts the idle time over;
//! 2. **nothing allocated**: halfway through the idle time a first look
//!    reads the caching allocator's cumulative allocation count
//!    (`allocation.all.allocated`, summed over the devices with a context);
//!    at the end of it a second look empties the caches only if the count
//!    is the same and at least `MEMSHIM_CUDA_IDLE_MIN_MB` sit unused.
//!
//! After acting (or finding too little to return) it waits for the process
//! to be busy again before it looks again, so an idle process is looked at
//! twice per idle period, not every tick. A look that finds no CUDA (torch
//! not imported, CUDA not initialised) is repeated only every
//! [`NO_CUDA_RETRY_MS`]. A look never creates a CUDA context and never
//! names a device without one (`python/cuda.rs`).

use crate::options;
use crate::os;
use crate::os::ResetTo;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use memshim_proto::CudaIdleCounters;
use std::time::Duration;

/// Above this share of one CPU (in percent) between two ticks, the process
/// is busy.
const BUSY_SHARE_PERCENT: u64 = 5;
/// The shortest window CPU use is measured over.
const WINDOW_MS: u64 = 1000;
/// How long a look waits for the GIL: an idle interpreter gives it at once;
/// one that holds it is not idle.
const GIL_WAIT: Duration = Duration::from_millis(200);
/// With no CUDA in use, look again this much later (CUDA may be initialised
/// later).
const NO_CUDA_RETRY_MS: u64 = 30_000;
/// After a look that could not run (the GIL was busy), wait this long.
const BUSY_RETRY_MS: u64 = 1_000;

touched_at_start! {
    static CHECKS: AtomicU64 = AtomicU64::new(0);
    static RETURNS: AtomicU64 = AtomicU64::new(0);
    static VRAM_RETURNED: AtomicU64 = AtomicU64::new(0);
    static PINNED_RETURNED: AtomicU64 = AtomicU64::new(0);
}

/// The counters for `stats`; `None` while the idle return is off.
pub fn counters() -> Option<CudaIdleCounters> {
    let idle_ms = options::cuda_idle_ms();
    (idle_ms != 0).then(|| CudaIdleCounters {
        idle_ms,
        min_bytes: options::cuda_idle_min_bytes(),
        checks: CHECKS.load(Relaxed),
        returns: RETURNS.load(Relaxed),
        vram_returned: VRAM_RETURNED.load(Relaxed),
        pinned_returned: PINNED_RETURNED.load(Relaxed),
    })
}

/// Fork child: its counters start at zero. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    for c in [&CHECKS, &RETURNS, &VRAM_RETURNED, &PINNED_RETURNED] {
        c.reset_to(0);
    }
}

/// The watcher's state, owned by the shim's thread.
pub struct Watcher {
    last_ms: u64,
    last_cpu_ns: u64,
    last_own_ns: u64,
    /// When the current quiet stretch began.
    quiet_since: Option<u64>,
    /// The allocation count of the first look in this quiet stretch.
    baseline: Option<u64>,
    /// Done for this quiet stretch (acted, or too little to return).
    done: bool,
    /// No look before this time.
    not_before_ms: u64,
}

impl Watcher {
    /// A watcher that starts measuring now.
    pub fn new(now_ms: u64) -> Watcher {
        Watcher {
            last_ms: now_ms,
            last_cpu_ns: os::time::process_cpu_ns(),
            last_own_ns: os::time::thread_cpu_ns(),
            quiet_since: None,
            baseline: None,
            done: false,
            not_before_ms: 0,
        }
    }

    /// One tick of the shim's thread.
    pub fn tick(&mut self, now_ms: u64) {
        let idle_ms = options::cuda_idle_ms();
        if idle_ms == 0 {
            return;
        }
        let wall_ms = now_ms.saturating_sub(self.last_ms);
        if wall_ms < WINDOW_MS {
            return;
        }
        let (cpu, own) = (os::time::process_cpu_ns(), os::time::thread_cpu_ns());
        let used_ns = cpu
            .saturating_sub(self.last_cpu_ns)
            .saturating_sub(own.saturating_sub(self.last_own_ns));
        (self.last_ms, self.last_cpu_ns, self.last_own_ns) = (now_ms, cpu, own);
        // used / wall > BUSY_SHARE_PERCENT %, in integers.
        if used_ns.saturating_mul(100) > wall_ms.saturating_mul(1_000_000 * BUSY_SHARE_PERCENT) {
            self.quiet_since = None;
            self.baseline = None;
            self.done = false;
            return;
        }
        let since = *self.quiet_since.get_or_insert(now_ms);
        if self.done || now_ms < self.not_before_ms || !crate::python::present() {
            return;
        }
        let quiet_ms = now_ms.saturating_sub(since);
        let expect = match self.baseline {
            None if quiet_ms >= idle_ms / 2 => None,
            Some(b) if quiet_ms >= idle_ms => Some(b),
            _ => return,
        };
        CHECKS.fetch_add(1, Relaxed);
        let min = options::cuda_idle_min_bytes();
        let look = match crate::python::cuda_idle_check(expect, min, GIL_WAIT) {
            Ok(look) => look,
            Err(_) => {
                // The GIL was busy (or Python is going away): not idle.
                self.not_before_ms = now_ms + BUSY_RETRY_MS;
                return;
            }
        };
        if !look.cuda {
            self.not_before_ms = now_ms + NO_CUDA_RETRY_MS;
            return;
        }
        if look.acted {
            RETURNS.fetch_add(1, Relaxed);
            VRAM_RETURNED.fetch_add(look.vram_returned, Relaxed);
            PINNED_RETURNED.fetch_add(look.pinned_returned, Relaxed);
            self.done = true;
        } else if expect.is_some() && expect == Some(look.allocations) {
            // Nothing allocated, but too little unused to be worth it.
            self.done = true;
        } else {
            // First look, or the GPU allocated meanwhile (work without
            // much CPU): this look is the new baseline, half an idle time
            // before the next.
            self.baseline = Some(look.allocations);
            self.quiet_since = Some(now_ms.saturating_sub(idle_ms / 2));
        }
    }
}
