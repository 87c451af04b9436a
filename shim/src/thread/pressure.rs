//! The pressure watcher: memory comes back before the OOM killer comes.
//!
//! Run by the shim's thread (`run.rs` polls its descriptors and calls it on
//! every turn); it adds no thread. It watches the nearest memory cgroup
//! with a limit (`os::cgroup::limited`):
//!
//! * **v1**: an eventfd on crossings of `memory.usage_in_bytes` over the
//!   threshold, and one on `memory.pressure_level` at `medium`, both
//!   through `cgroup.event_control` (eventfds only in the thread's own
//!   descriptor table, see `os::fd::eventfd`);
//! * **v2**: a PSI trigger on the process's `memory.pressure` (100 ms of
//!   stall within 1 s; 200 ms within 2 s where the kernel refuses the
//!   1 s window to unprivileged processes), and `memory.events`, whose
//!   `high`, `max` and `oom` counters rising wake it. Where cgroup2 is
//!   mounted read-only (a container's view) no trigger can be written:
//!   then `memory.pressure` is read at each check instead, and a stall
//!   total that rose by 100 ms within a second counts as the trigger would
//!   (`psi_poll`);
//! * **both**: a check of usage against the threshold
//!   (`MEMSHIM_PRESSURE_THRESHOLD` percent of the limit; v2: of
//!   `memory.high` where it is set), every second where a threshold
//!   notification exists, every 100 ms where none does (20 ms within a
//!   tenth of the limit below the threshold) or usage is already above it.
//!
//! **Pressure is the working set over the threshold**: usage minus the
//! inactive page cache, which reclaim takes without our help. Every
//! notification (a v1 event, a PSI trigger, `memory.events` rising) wakes a
//! check at once, and the check decides: a cgroup filled by page cache
//! (reading a large file) raises `memory.events` `max` and stalls on
//! reclaim, and giving up our free pages then costs us refaults and saves
//! nothing (the kernel drops that cache instead). Such notifications are
//! counted as `ignored`. Stalls (PSI) make the checks come every 20 ms for a
//! second.
//!
//! On pressure it purges every arena at once, whatever the decay, and sets
//! decay short ([`SHORT_DIRTY_MS`]) while pressure lasts; [`HOLD_MS`] after
//! the last signal, with the working set back under the threshold, it puts
//! back the decay it found (unless someone changed decay meanwhile, with
//! `memshim-ctl decay`: then that stays). With `MEMSHIM_PRESSURE=gc` it
//! also runs Python's collector (at most every [`GC_EVERY_MS`]) and purges
//! again. Counters are reported in `stats` (docs/stats.md, "pressure").

use crate::control::PressureFacts;
use crate::jemalloc;
use crate::options::{self, Pressure};
use crate::os::ResetTo;
use crate::os::{self, cgroup, fd::Owned};
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering::*};
use std::time::Duration;

/// Descriptors [`Watcher::poll_fds`] may return.
pub const MAX_POLL_FDS: usize = 2;

/// Dirty decay while pressure lasts (muzzy: 0). Short, not 0: freeing a
/// large block then costs no `madvise` on the spot, and the thread's tick
/// (a quarter of it, 50 ms at least) returns it within this time.
pub const SHORT_DIRTY_MS: i64 = 100;
/// How long pressure must have been gone before decay is put back.
pub const HOLD_MS: u64 = 10_000;
/// Repeated signals purge again at most this often.
const REPURGE_MS: u64 = 250;
/// While the working set stays above the threshold, purge again this often.
const SUSTAINED_REPURGE_MS: u64 = 5_000;
/// Check interval where a threshold notification exists.
const CHECK_WITH_EVENTS_MS: u64 = 1_000;
/// Check interval without one, or with usage already above the threshold.
const CHECK_POLLING_MS: u64 = 100;
/// Check interval without one while usage is within a tenth of the limit
/// below the threshold (a loader adding 8 MiB every 20 ms crosses that
/// distance of a 320 MiB limit in about 80 ms), and for [`STALL_MS`] after
/// a stall was seen.
const CHECK_NEAR_MS: u64 = 20;
/// How long checks stay at [`CHECK_NEAR_MS`] after a stall (PSI).
const STALL_MS: u64 = 1_000;
/// How often the cgroup and its limit are looked up again (a container
/// resized in place, a process moved to another cgroup); in the
/// application's descriptor table only at the thread's start.
const RESCAN_MS: u64 = 30_000;
/// `gc` mode: the collector runs at most this often.
const GC_EVERY_MS: u64 = 10_000;
/// `gc` mode: longest wait for the GIL.
const GC_TIMEOUT: Duration = Duration::from_secs(1);
/// PSI trigger: stall within window, in microseconds.
const PSI_STALL_US: u64 = 100_000;
const PSI_WINDOW_US: u64 = 1_000_000;

// What `stats` reports. Statics, so the fork child handler can reset them.
touched_at_start! {
    static ACTIVE: AtomicBool = AtomicBool::new(false);
    static EVENTS: AtomicU64 = AtomicU64::new(0);
    static PURGES: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);
    static GC_RUNS: AtomicU64 = AtomicU64::new(0);
    /// Notifications after which the working set was below the threshold.
    static IGNORED: AtomicU64 = AtomicU64::new(0);
    /// Microseconds from the last onset's signal to the end of its purge;
    /// `u64::MAX` for none yet.
    static LAST_PURGE_US: AtomicU64 = AtomicU64::new(u64::MAX);
}
/// 0: none, 1 or 2: the cgroup version watched.
static SOURCE: AtomicU8 = AtomicU8::new(0);
/// Bits of [`Watch`]: what is in use.
static WATCHING: AtomicU8 = AtomicU8::new(0);
static LIMIT: AtomicU64 = AtomicU64::new(0);
static THRESHOLD: AtomicU64 = AtomicU64::new(0);
// The decay found at an onset, and the one set instead, while shortened.
static SHORTENED: AtomicBool = AtomicBool::new(false);
static SAVED_DIRTY: AtomicI64 = AtomicI64::new(0);
static SAVED_MUZZY: AtomicI64 = AtomicI64::new(0);
static SET_DIRTY: AtomicI64 = AtomicI64::new(0);
static SET_MUZZY: AtomicI64 = AtomicI64::new(0);

/// What is watched, as bits of [`WATCHING`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Watch {
    UsageThreshold = 1,
    PressureLevel = 2,
    Psi = 4,
    Events = 8,
    Check = 16,
    PsiPoll = 32,
}

const WATCH_NAMES: [(Watch, &str); 6] = [
    (Watch::UsageThreshold, "usage_threshold"),
    (Watch::PressureLevel, "pressure_level"),
    (Watch::Psi, "psi"),
    (Watch::Events, "memory_events"),
    (Watch::Check, "check"),
    (Watch::PsiPoll, "psi_poll"),
];

/// The descriptors of one watched cgroup.
struct Cg {
    lim: cgroup::Limited,
    threshold: u64,
    /// `memory.usage_in_bytes` (v1) or `memory.current` (v2), held open.
    usage: Option<Owned>,
    /// `memory.stat`, held open.
    stat: Option<Owned>,
    /// v1: eventfd of the usage threshold; v2: the PSI trigger.
    first: Option<Owned>,
    /// v1: eventfd of the pressure level; v2: `memory.events`.
    second: Option<Owned>,
    last_events: memshim_proto::cgroup::MemoryEvents,
    /// v2 where no trigger could be written (a read-only mount): the
    /// process's `memory.pressure`, read at each check, with the stall
    /// total (µs) and the time (ms) of the last sample.
    psi_poll: Option<(Owned, u64, u64)>,
}

impl Cg {
    fn open(lim: cgroup::Limited, pct: u64) -> Cg {
        let threshold = lim.limit / 100 * pct + lim.limit % 100 * pct / 100;
        let (usage_file, v1) = match lim.version {
            1 => ("memory.usage_in_bytes", true),
            _ => ("memory.current", false),
        };
        let mut cg = Cg {
            usage: cgroup::open_in(&lim.dir, usage_file, libc::O_RDONLY),
            stat: cgroup::open_in(&lim.dir, "memory.stat", libc::O_RDONLY),
            first: None,
            second: None,
            last_events: memshim_proto::cgroup::MemoryEvents::default(),
            psi_poll: None,
            threshold,
            lim,
        };
        if v1 {
            let threshold = threshold.to_string();
            cg.first = os::fd::eventfd()
                .filter(|e| cgroup::v1_event(&cg.lim.dir, e, usage_file, &threshold));
            cg.second = os::fd::eventfd()
                .filter(|e| cgroup::v1_event(&cg.lim.dir, e, "memory.pressure_level", "medium"));
        } else {
            cg.first = cgroup::psi_trigger(&cg.lim.own, PSI_STALL_US, PSI_WINDOW_US);
            if cg.first.is_none() {
                cg.psi_poll = cgroup::open_in(&cg.lim.own, "memory.pressure", libc::O_RDONLY)
                    .map(|f| (f, 0, 0));
                let now = os::time::monotonic_ms();
                let _ = cg.polled_stall(now);
            }
            cg.second = cgroup::open_in(&cg.lim.dir, "memory.events", libc::O_RDONLY);
            cg.last_events = cg.read_events().unwrap_or_default();
        }
        cg
    }

    fn watching(&self) -> u8 {
        let v1 = self.lim.version == 1;
        let mut w = 0;
        if self.first.is_some() {
            w |= if v1 {
                Watch::UsageThreshold
            } else {
                Watch::Psi
            } as u8;
        }
        if self.second.is_some() {
            w |= if v1 {
                Watch::PressureLevel
            } else {
                Watch::Events
            } as u8;
        }
        if self.usage.is_some() {
            w |= Watch::Check as u8;
        }
        if self.psi_poll.is_some() {
            w |= Watch::PsiPoll as u8;
        }
        w
    }

    /// `psi_poll`: whether the stall total rose by [`PSI_STALL_US`] or more
    /// per [`PSI_WINDOW_US`] since the sample a window ago (takes a new
    /// sample once a window has passed). `None` without `psi_poll`.
    fn polled_stall(&mut self, now_ms: u64) -> Option<bool> {
        let (f, last_total, last_ms) = self.psi_poll.as_mut()?;
        let window_ms = PSI_WINDOW_US / 1000;
        if *last_ms != 0 && now_ms.saturating_sub(*last_ms) < window_ms {
            return Some(false);
        }
        let mut buf = [0u8; 256];
        let n = cgroup::read_at_start(f, &mut buf)?;
        let total = memshim_proto::cgroup::psi_some_total(&buf[..n])?;
        let stalled = *last_ms != 0 && {
            let per_window = (total.saturating_sub(*last_total)) * window_ms
                / now_ms.saturating_sub(*last_ms).max(1);
            per_window >= PSI_STALL_US
        };
        (*last_total, *last_ms) = (total, now_ms);
        Some(stalled)
    }

    fn read_events(&self) -> Option<memshim_proto::cgroup::MemoryEvents> {
        let mut buf = [0u8; 512];
        let n = cgroup::read_at_start(self.second.as_ref()?, &mut buf)?;
        Some(memshim_proto::cgroup::MemoryEvents::parse(&buf[..n]))
    }

    /// Usage now, and whether the working set is over the threshold.
    fn over(&self) -> Option<(u64, bool)> {
        let mut buf = [0u8; 32];
        let n = cgroup::read_at_start(self.usage.as_ref()?, &mut buf)?;
        let usage = os::parse_u64(buf[..n].trim_ascii())?;
        if usage < self.threshold {
            return Some((usage, false));
        }
        let mut stat = [0u8; 8192];
        let inactive = self
            .stat
            .as_ref()
            .and_then(|f| cgroup::read_at_start(f, &mut stat))
            .map_or(0, |n| cgroup::inactive_file(self.lim.version, &stat[..n]));
        Some((usage, usage.saturating_sub(inactive) >= self.threshold))
    }
}

/// The watcher, owned by the shim's thread.
pub struct Watcher {
    mode: Pressure,
    cg: Option<Cg>,
    next_rescan: u64,
    next_check: u64,
    /// The working set was over the threshold at the last check.
    over: bool,
    last_signal: u64,
    last_purge: u64,
    last_gc: Option<u64>,
    /// Checks come every [`CHECK_NEAR_MS`] until then (a stall was seen).
    stall_until: u64,
}

impl Watcher {
    /// A watcher that looks for its cgroup on its first tick.
    pub fn new() -> Watcher {
        // A fork child inherits decay shortened by its parent's pressure.
        restore_decay();
        let mode = options::pressure();
        publish(None, 0);
        Watcher {
            mode,
            cg: None,
            next_rescan: 0,
            next_check: 0,
            over: false,
            last_signal: 0,
            last_purge: 0,
            last_gc: None,
            stall_until: 0,
        }
    }

    /// The descriptors to poll, written to `out`; returns how many.
    pub fn poll_fds(&self, out: &mut [libc::pollfd]) -> usize {
        let Some(cg) = &self.cg else { return 0 };
        let events = if cg.lim.version == 1 {
            libc::POLLIN
        } else {
            libc::POLLPRI
        };
        let mut n = 0;
        for f in [&cg.first, &cg.second] {
            if n < out.len()
                && let Some(fd) = f.as_ref().and_then(Owned::fd)
            {
                out[n] = libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                };
                n += 1;
            }
        }
        n
    }

    /// Handles what `poll` reported on the descriptors of [`Self::poll_fds`]:
    /// each notification wakes a check at once, which decides.
    pub fn on_events(&mut self, fds: &[libc::pollfd]) {
        let t0 = os::time::monotonic_ns();
        let Some(cg) = &mut self.cg else { return };
        let mut woken = false;
        let mut stalled = false;
        for p in fds.iter().filter(|p| p.revents != 0) {
            let is = |f: &Option<Owned>| f.as_ref().and_then(Owned::fd) == Some(p.fd);
            let (first, second) = (is(&cg.first), is(&cg.second));
            if cg.lim.version == 1 {
                let f = if first { &cg.first } else { &cg.second };
                // A threshold crossing goes either way; the check says which.
                woken |=
                    (first || second) && f.as_ref().is_some_and(|e| cgroup::drain_eventfd(e) > 0);
            } else if first {
                if p.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                    cg.first = None; // the trigger is gone (cgroup removed)
                } else if p.revents & libc::POLLPRI != 0 {
                    woken = true;
                    stalled = true;
                }
            } else if second {
                // kernfs reports a modification as POLLERR | POLLPRI, and a
                // removed cgroup's file as always ready: one that cannot be
                // read any more is dropped (it would wake us forever).
                match cg.read_events() {
                    Some(now) => {
                        let old = cg.last_events;
                        cg.last_events = now;
                        woken |= now.high > old.high || now.max > old.max || now.oom > old.oom;
                    }
                    None => cg.second = None,
                }
            }
        }
        WATCHING.store(cg.watching(), Relaxed);
        let now = os::time::monotonic_ms();
        if stalled {
            self.stall_until = now + STALL_MS;
        }
        if woken {
            self.check(now, t0, true);
        }
    }

    /// Once per turn of the thread's loop: finds the cgroup, checks usage,
    /// ends pressure that has been gone for [`HOLD_MS`].
    pub fn on_tick(&mut self) {
        if self.mode == Pressure::Off {
            return;
        }
        let now = os::time::monotonic_ms();
        if now >= self.next_rescan {
            self.rescan();
            // Looking up the cgroup opens files for a moment outside the
            // records of os/fd.rs: in the application's table (the
            // fallback) that is done once, at the thread's start.
            self.next_rescan = if os::fd::private() {
                now + RESCAN_MS
            } else {
                u64::MAX
            };
        }
        if self.cg.is_some() && now >= self.next_check {
            self.check(now, os::time::monotonic_ns(), false);
        }
        if ACTIVE.load(Relaxed) && !self.over && now.saturating_sub(self.last_signal) >= HOLD_MS {
            restore_decay();
            ACTIVE.store(false, Relaxed);
        }
    }

    /// Longest the thread may sleep before the next check (or the next
    /// look for the cgroup, the first at once) is due.
    pub fn timeout_ms(&self) -> i64 {
        if self.mode == Pressure::Off {
            return i64::MAX;
        }
        let due = match self.cg {
            Some(_) => self.next_check.min(self.next_rescan),
            None => self.next_rescan,
        };
        due.saturating_sub(os::time::monotonic_ms())
            .min(i64::MAX as u64) as i64
    }

    /// (Re)finds the cgroup with a limit; reopens only if it changed.
    fn rescan(&mut self) {
        let found = cgroup::limited();
        if found.as_ref() == self.cg.as_ref().map(|c| &c.lim) {
            return;
        }
        self.cg = found.map(|l| Cg::open(l, options::pressure_threshold_pct()));
        self.next_check = 0;
        let cg = self.cg.as_ref();
        publish(cg, cg.map_or(0, Cg::watching));
    }

    /// Checks the working set against the threshold: its crossing is the
    /// onset of pressure (purge at once), staying over it purges again
    /// every [`SUSTAINED_REPURGE_MS`]. `notified`: a notification woke it
    /// (counted as ignored if the working set is below the threshold).
    fn check(&mut self, now: u64, t0: u64, notified: bool) {
        let Some(cg) = &mut self.cg else { return };
        if cg.polled_stall(now) == Some(true) {
            self.stall_until = now + STALL_MS;
        }
        let Some((usage, over)) = cg.over() else {
            self.next_check = now + CHECK_WITH_EVENTS_MS;
            return;
        };
        let has_notice = cg.lim.version == 1 && cg.first.is_some();
        let mut interval = check_interval(has_notice, usage, cg.threshold, cg.lim.limit);
        if now < self.stall_until {
            interval = interval.min(CHECK_NEAR_MS);
        }
        self.next_check = now + interval;
        let was = self.over;
        self.over = over;
        if over && !was {
            self.signal(now, t0);
        } else if over {
            self.last_signal = now;
            if notified && now.saturating_sub(self.last_purge) >= REPURGE_MS
                || now.saturating_sub(self.last_purge) >= SUSTAINED_REPURGE_MS
            {
                EVENTS.fetch_add(u64::from(notified), Relaxed);
                self.purge(now, None);
            }
        } else if notified {
            IGNORED.fetch_add(1, Relaxed);
        }
    }

    /// The onset of pressure: purge at once (again at most every
    /// [`REPURGE_MS`] if pressure was still on).
    fn signal(&mut self, now: u64, t0: u64) {
        EVENTS.fetch_add(1, Relaxed);
        self.last_signal = now;
        if !ACTIVE.swap(true, Relaxed) {
            shorten_decay();
            self.purge(now, Some(t0));
        } else if now.saturating_sub(self.last_purge) >= REPURGE_MS {
            self.purge(now, None);
        }
    }

    /// Purges every arena (and in `gc` mode runs the collector, then purges
    /// again); counts the RSS returned. `onset`: when the signal came.
    fn purge(&mut self, now: u64, onset: Option<u64>) {
        let before = os::proc::rss_bytes();
        let _ = jemalloc::purge_all();
        if let Some(t0) = onset {
            let us = os::time::monotonic_ns().saturating_sub(t0) / 1000;
            LAST_PURGE_US.store(us, Relaxed);
        }
        if self.mode == Pressure::Gc
            && self
                .last_gc
                .is_none_or(|t| now.saturating_sub(t) >= GC_EVERY_MS)
        {
            self.last_gc = Some(now);
            if crate::python::gc(GC_TIMEOUT).is_ok() {
                GC_RUNS.fetch_add(1, Relaxed);
                let _ = jemalloc::purge_all();
            }
        }
        let after = os::proc::rss_bytes();
        PURGES.fetch_add(1, Relaxed);
        BYTES.fetch_add(before.saturating_sub(after), Relaxed);
        self.last_purge = os::time::monotonic_ms();
    }
}

/// Milliseconds until the next check: long where a threshold notification
/// will come, short without one as usage nears the threshold.
fn check_interval(notified: bool, usage: u64, threshold: u64, limit: u64) -> u64 {
    if usage >= threshold {
        CHECK_POLLING_MS
    } else if notified {
        CHECK_WITH_EVENTS_MS
    } else if threshold - usage <= limit / 10 {
        CHECK_NEAR_MS
    } else {
        CHECK_POLLING_MS
    }
}

impl Drop for Watcher {
    /// The thread stops: decay goes back to what it was.
    fn drop(&mut self) {
        restore_decay();
        ACTIVE.store(false, Relaxed);
        publish(None, 0);
    }
}

fn publish(cg: Option<&Cg>, watching: u8) {
    SOURCE.store(cg.map_or(0, |c| c.lim.version), Relaxed);
    LIMIT.store(cg.map_or(0, |c| c.lim.limit), Relaxed);
    THRESHOLD.store(cg.map_or(0, |c| c.threshold), Relaxed);
    WATCHING.store(watching, Relaxed);
}

/// Sets decay short, remembering what it was.
fn shorten_decay() {
    let Ok((dirty, muzzy)) = jemalloc::decay_ms() else {
        return;
    };
    let short = |now: i64, to: i64| if now < 0 || now > to { to } else { now };
    let (d, m) = (short(dirty, SHORT_DIRTY_MS), short(muzzy, 0));
    if (d, m) == (dirty, muzzy) {
        return;
    }
    if jemalloc::set_decay_ms(Some(d), Some(m)).is_ok() {
        SAVED_DIRTY.store(dirty, Relaxed);
        SAVED_MUZZY.store(muzzy, Relaxed);
        SET_DIRTY.store(d, Relaxed);
        SET_MUZZY.store(m, Relaxed);
        SHORTENED.store(true, Relaxed);
    }
}

/// Puts back the decay [`shorten_decay`] found, unless it was changed
/// since (then the newer setting stays).
fn restore_decay() {
    if !SHORTENED.swap(false, Relaxed) {
        return;
    }
    let set = (SET_DIRTY.load(Relaxed), SET_MUZZY.load(Relaxed));
    if jemalloc::decay_ms().is_ok_and(|now| now == set) {
        let _ = jemalloc::set_decay_ms(
            Some(SAVED_DIRTY.load(Relaxed)),
            Some(SAVED_MUZZY.load(Relaxed)),
        );
    }
}

/// Fork child handler: the parent's counters are not the child's (the
/// shortened decay, if any, is put back by the child's own watcher).
/// Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    ACTIVE.reset_to(false);
    for c in [&EVENTS, &PURGES, &BYTES, &GC_RUNS, &IGNORED] {
        c.reset_to(0);
    }
    LAST_PURGE_US.reset_to(u64::MAX);
}

/// What `stats` reports.
pub fn facts() -> PressureFacts {
    let nonzero = |a: &AtomicU64| Some(a.load(Relaxed)).filter(|&v| v != 0);
    let mode = options::pressure();
    PressureFacts {
        mode: match mode {
            Pressure::On => "on",
            Pressure::Off => "off",
            Pressure::Gc => "gc",
        },
        source: match SOURCE.load(Relaxed) {
            1 => "v1",
            2 => "v2",
            _ => "none",
        },
        watching: {
            let bits = WATCHING.load(Relaxed);
            WATCH_NAMES.map(|(w, name)| (bits & w as u8 != 0).then_some(name))
        },
        limit: nonzero(&LIMIT),
        threshold: nonzero(&THRESHOLD),
        active: ACTIVE.load(Relaxed),
        events: EVENTS.load(Relaxed),
        purges: PURGES.load(Relaxed),
        bytes_returned: BYTES.load(Relaxed),
        gc_runs: GC_RUNS.load(Relaxed),
        ignored: IGNORED.load(Relaxed),
        last_purge_us: Some(LAST_PURGE_US.load(Relaxed)).filter(|&v| v != u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_come_sooner_near_the_threshold_without_notifications() {
        let (limit, threshold) = (1000, 900);
        assert_eq!(
            check_interval(true, 100, threshold, limit),
            CHECK_WITH_EVENTS_MS
        );
        assert_eq!(
            check_interval(true, 850, threshold, limit),
            CHECK_WITH_EVENTS_MS
        );
        assert_eq!(
            check_interval(true, 950, threshold, limit),
            CHECK_POLLING_MS
        );
        assert_eq!(
            check_interval(false, 100, threshold, limit),
            CHECK_POLLING_MS
        );
        assert_eq!(check_interval(false, 850, threshold, limit), CHECK_NEAR_MS);
        assert_eq!(
            check_interval(false, 900, threshold, limit),
            CHECK_POLLING_MS
        );
    }

    #[test]
    fn watch_bits_are_distinct_and_named_in_order() {
        for (i, (w, _)) in WATCH_NAMES.iter().enumerate() {
            assert_eq!(*w as u8, 1 << i);
        }
    }
}
