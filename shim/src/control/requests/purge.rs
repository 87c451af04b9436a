//! `purge`: empties this thread's cache and purges every arena, and the
//! counters `stats` reports.

use super::{internal, ms};
use crate::os::ResetTo;
use crate::{jemalloc, os};
use memshim_proto::*;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

touched_at_start! {
    /// `purge` requests served in this process, and the RSS they released
    /// (reported as `purges` in `stats`; reset in a fork child).
    static PURGES: AtomicU64 = AtomicU64::new(0);
    static PURGED_BYTES: AtomicU64 = AtomicU64::new(0);
}

/// Fork child: the parent's purges are not the child's. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn reset_purge_counters() {
    PURGES.reset_to(0);
    PURGED_BYTES.reset_to(0);
}

/// The `purges` section of `stats`.
pub fn counters() -> PurgeCounters {
    PurgeCounters {
        count: PURGES.load(Relaxed),
        released_bytes: PURGED_BYTES.load(Relaxed),
    }
}

/// `purge`: empties this thread's cache and purges every arena.
pub fn handle() -> Result<PurgeResult, ErrorReply> {
    let t0 = Instant::now();
    let rss_before = os::proc::rss_bytes();
    let before = jemalloc::stats().map_err(|e| internal("reading jemalloc statistics", e))?;
    let _ = jemalloc::flush_own_tcache();
    jemalloc::purge_all().map_err(|e| internal("arena.4096.purge", e))?;
    let after = jemalloc::stats().unwrap_or(before);
    let rss_after = os::proc::rss_bytes();
    PURGES.fetch_add(1, Relaxed);
    PURGED_BYTES.fetch_add(rss_before.saturating_sub(rss_after), Relaxed);
    Ok(PurgeResult {
        rss_before,
        rss_after,
        released: rss_before.saturating_sub(rss_after),
        resident_before: before.resident,
        resident_after: after.resident,
        purgeable_before: before.dirty + before.muzzy,
        elapsed_ms: ms(t0),
    })
}
