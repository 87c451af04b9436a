//! `stats`: the memory report.

use super::super::facts::{Ctx, PressureFacts};
use super::{PY_STATS_TIMEOUT, internal, ms, purge};
use crate::options::{self, Control};
use crate::{jemalloc, os};
use memshim_proto::*;
use std::time::Instant;

fn config(ctx: &Ctx<'_>) -> ConfigState {
    let (dirty, muzzy) = jemalloc::decay_ms().unwrap_or((options::dirty_decay_ms(), -1));
    ConfigState {
        dirty_decay_ms: dirty,
        muzzy_decay_ms: muzzy,
        narenas: jemalloc::narenas_auto(),
        background_purge: dirty >= 0,
        jemalloc_background_thread: jemalloc::background_thread(),
        jemalloc_version: jemalloc::version().to_owned(),
        shim_version: env!("CARGO_PKG_VERSION").to_owned(),
        interposed: ctx.facts.interposed,
        control: match options::control() {
            Control::Auto => "auto",
            Control::On => "on",
            Control::Off => "off",
        }
        .to_owned(),
        uptime_ms: ctx.facts.uptime_ms,
        fork_child: ctx.facts.fork_child,
        deepbind_cleared: ctx.facts.deepbind_cleared,
        thread_starts: ctx.facts.thread_starts,
        private_fds: Some(ctx.facts.private_fds),
        thp_split_bytes: Some(os::thp::split_size() as u64),
    }
}

/// `stats`.
pub fn handle(arenas: bool, pss: bool, ctx: &Ctx<'_>) -> Result<Box<StatsReport>, ErrorReply> {
    let t0 = Instant::now();
    let s = jemalloc::stats().map_err(|e| internal("reading jemalloc statistics", e))?;
    let arenas = arenas.then(|| {
        (0..jemalloc::narenas())
            .filter_map(jemalloc::arena_stats)
            .collect()
    });
    let (python, torch, python_unavailable) = match crate::python::stats(PY_STATS_TIMEOUT) {
        Ok((p, t)) => (Some(p), t, None),
        Err(why) => (None, None, Some(why)),
    };
    Ok(Box::new(StatsReport {
        pid: os::getpid(),
        allocator: s,
        arenas,
        process: process(s.resident.saturating_add(s.muzzy), pss),
        cgroup: os::cgroup::memory().map(|(path, files)| CgroupStats::from_files(path, &files)),
        config: config(ctx),
        python,
        torch,
        python_unavailable,
        purges: Some(purge::counters()),
        cuda_idle: ctx.facts.cuda_idle,
        pressure: Some(pressure(&ctx.facts.pressure)),
        elapsed_ms: ms(t0),
    }))
}

/// The `pressure` section.
fn pressure(p: &PressureFacts) -> PressureStats {
    PressureStats {
        mode: p.mode.to_owned(),
        source: p.source.to_owned(),
        watching: p.watching.iter().flatten().map(|s| s.to_string()).collect(),
        limit: p.limit,
        threshold: p.threshold,
        active: p.active,
        events: p.events,
        purges: p.purges,
        bytes_returned: p.bytes_returned,
        gc_runs: p.gc_runs,
        ignored: p.ignored,
        last_purge_ms: p.last_purge_us.map(|us| us as f64 / 1000.0),
    }
}

/// The `process` section. `held` is the allocator's pages that may be
/// resident: jemalloc's `resident` (an upper bound: it counts pages never
/// touched) plus its muzzy pages (`MADV_FREE`d, left out of `resident`
/// but in RSS until the kernel takes them). They are all anonymous, so at
/// most `RssAnon` of them are: `unmanaged` never hides mapped files or
/// shared memory behind untouched allocator pages.
fn process(held: u64, pss: bool) -> ProcessStats {
    let m = os::proc::memory();
    let resident = m.anon.map_or(held, |a| held.min(a));
    ProcessStats {
        rss: m.rss,
        pss: if pss { os::proc::pss() } else { None },
        anon: m.anon,
        file: m.file,
        shmem: m.shmem,
        swap: m.swap,
        unmanaged: m.rss.saturating_sub(resident),
    }
}
