//! The shim's own thread, named `memshim`.
//!
//! At its start it leaves the application's descriptor table where the
//! kernel allows it (os/fd.rs); in a process that hosts CPython it first
//! starts the spawner, which keeps starting the Python bridge's job
//! threads in the application's table (os/spawner.rs). Its loop:
//!
//! * every tick, `arena.4096.decay` (`jemalloc::decay_all`), so pages freed
//!   by a process that then goes idle are returned within the decay time;
//!   jemalloc alone only decays on allocator activity. Frees of 8 to
//!   32 MiB in the first arena wait for that decay too: the thread lifts
//!   that arena's threshold if the first big allocation has not
//!   (`jemalloc::lift_first_arena_threshold`); while it runs, blocks of
//!   1 MiB and more go to one arena all threads share
//!   (`jemalloc::share_big_blocks`), whose pages its decay returns;
//! * serves the control socket (`control/`): its listener and client
//!   connections are polled here;
//! * with `MEMSHIM_CUDA_IDLE_MS`, watches for an idle process whose CUDA
//!   caches can go back (`cuda_idle.rs`);
//! * watches the memory cgroup's pressure (`pressure.rs`): its
//!   notifications are polled here, and it checks usage on every turn;
//! * stops when the process has been alone (main thread + the shim's) for
//!   the decay time plus a grace second, or at once when a fork or
//!   namespace handler asks;
//! * ends within a tick, in every mode, once every application thread has
//!   ended (main called `pthread_exit` and the others returned), so the
//!   process exits as it would without the shim.
//!
//! All signals are blocked on this thread (it is created with a full mask),
//! so the application's handlers never run here. It holds no lock of its own
//! that the allocation path takes; jemalloc's own locks are taken only
//! inside `mallctl`.

use super::pressure::{self, Watcher};
use super::state::{Phase, STATE, Stop};
use super::wake::Wake;
use crate::options::{self, Control, FdTable};
use crate::os::{self, ResetTo, spawner, thread::Stack};
use crate::{control, jemalloc};
use core::ffi::c_void;
use core::sync::atomic::{AtomicU32, Ordering::SeqCst};
use core::time::Duration;

/// Stack of the shim's thread (the default 8 MiB is far more than needed;
/// the protocol decoder's deepest input still fits).
const STACK_SIZE: usize = 256 * 1024;
/// Longest sleep between ticks.
const MAX_TICK_MS: i64 = 1000;
/// Shortest sleep between ticks.
const MIN_TICK_MS: i64 = 50;

/// The longest an application thread waits for a starting shim thread to
/// leave the automatic arenas. It takes tens of microseconds; the bound
/// only matters on a machine so loaded that the thread is not scheduled.
const SETTLE_WAIT: Duration = Duration::from_millis(100);

touched_at_start! {
    /// Where the last shim thread started stands (a futex): no thread pending,
    /// or started but still in the automatic arenas, or out of them.
    static ARENA_MOVE: AtomicU32 = AtomicU32::new(MOVE_NONE);
}
const MOVE_NONE: u32 = 0;
const MOVE_PENDING: u32 = 1;
const MOVE_DONE: u32 = 2;

/// Creates the shim's thread. Returns its handle.
pub(super) fn spawn() -> Option<libc::pthread_t> {
    ARENA_MOVE.store(MOVE_PENDING, SeqCst);
    let t = os::thread::spawn(main, 0, Stack::Bytes(STACK_SIZE), false);
    if t.is_none() {
        ARENA_MOVE.store(MOVE_NONE, SeqCst);
        os::time::futex_wake(&ARENA_MOVE);
    }
    t
}

/// Waits, at most [`SETTLE_WAIT`] and then never again for that start,
/// while a shim thread that has just started is still in jemalloc's
/// automatic arenas. Its first call to jemalloc binds it to the least used
/// one until `jemalloc::use_own_arena`
/// moves it out; an application thread that chose meanwhile would share
/// an arena it need not. The thread that started the shim's (the first
/// after each start under `MEMSHIM_CONTROL=auto`) can still meet that
/// moment, since the shim's thread starts right after it; the ones created
/// after it cannot, unless this wait runs out. The spawner, which moves
/// too, is not waited for.
pub(super) fn wait_until_settled() {
    if !os::time::futex_wait_while(&ARENA_MOVE, MOVE_PENDING, SETTLE_WAIT) {
        // Given up once, not on every later call: a child made without
        // fork handlers (`_Fork`, a raw `clone`) in that moment has no
        // shim thread that will ever move.
        let _ = ARENA_MOVE.compare_exchange(MOVE_PENDING, MOVE_NONE, SeqCst, SeqCst);
    }
}

/// Fork child: no shim thread is starting there.
#[unsafe(link_section = ".text.startup")]
pub(super) fn forget_pending_start() {
    ARENA_MOVE.reset_to(MOVE_NONE);
}

/// How many threads the shim has now: this one, the spawner if it runs,
/// and the Python bridge's job thread if one exists.
pub(super) fn our_threads() -> u64 {
    1 + u64::from(spawner::alive()) + u64::from(crate::python::worker_exists())
}

/// Tick length: a quarter of the dirty decay time, within [50 ms, 1 s].
fn tick_ms(dirty_decay_ms: i64) -> i64 {
    if dirty_decay_ms > 0 {
        (dirty_decay_ms / 4).clamp(MIN_TICK_MS, MAX_TICK_MS)
    } else {
        MAX_TICK_MS
    }
}

/// How long the process must be alone before the thread stops by itself:
/// long enough for pages freed just before to decay away.
fn alone_grace_ms(dirty_decay_ms: i64) -> u64 {
    (dirty_decay_ms.clamp(0, 30_000) as u64) + 1000
}

/// Moves this thread to a descriptor table of its own, first starting the
/// spawner if CPython is here (it must be created from the application's
/// table). Returns whether the table is private.
fn leave_the_application_table() -> bool {
    if options::fd_table() == FdTable::Shared || !os::fd::can_be_private() {
        return false;
    }
    spawner::allow(true);
    if crate::python::present() {
        spawner::start();
    }
    // With MEMSHIM_VERBOSE, fd 2 stays (a copy of the application's
    // stderr), for this thread's own messages.
    if os::fd::make_private(options::verbose()) {
        return true;
    }
    spawner::stop();
    false
}

/// The endpoint and the wake pipe: what the thread holds while it runs.
struct Held {
    endpoint: Option<control::Endpoint>,
    wake: Option<Wake>,
}

impl Held {
    fn open() -> Held {
        Held {
            wake: Wake::open(),
            endpoint: control::Endpoint::open(),
        }
    }

    fn close(&mut self) {
        if let Some(e) = self.endpoint.take() {
            e.close();
        }
        if let Some(w) = self.wake.take() {
            w.close();
        }
    }
}

extern "C" fn main(_: *mut c_void) -> *mut c_void {
    // First: application threads created meanwhile wait for it
    // (`wait_until_settled`).
    let _ = jemalloc::use_own_arena();
    ARENA_MOVE.store(MOVE_DONE, SeqCst);
    os::time::futex_wake(&ARENA_MOVE);
    // Before the name: a process that sees it sees the threshold lifted.
    jemalloc::lift_first_arena_threshold();
    jemalloc::share_big_blocks();
    os::thread::set_name(c"memshim");
    let _ = jemalloc::disable_own_tcache();
    jemalloc::exclude_own_thread_from_profiles();
    leave_the_application_table();
    let mut own = Held {
        wake: Wake::open(),
        endpoint: None,
    };
    STATE.set_phase(Phase::Running);
    own.endpoint = control::Endpoint::open();
    let mut last_decay = os::time::monotonic_ms();
    let mut cuda_idle = super::cuda_idle::Watcher::new(last_decay);
    let mut alone_since: Option<u64> = None;
    let mut watcher = Watcher::new();
    // Where huge pages may back the heap, purges split the ones they cover
    // in part (os/thp.rs). Looked at again later only in the thread's own
    // table: reading a file opens a descriptor for a moment.
    refresh_thp();
    let mut next_thp_look = last_decay + os::thp::LOOK_MS;
    loop {
        let dirty = jemalloc::decay_ms()
            .map(|d| d.0)
            .unwrap_or(options::dirty_decay_ms());
        let tick = tick_ms(dirty);
        // fds[0]: the wake pipe; then the endpoint's listener and
        // connections; then the pressure watcher's.
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 1 + control::MAX_POLL_FDS + pressure::MAX_POLL_FDS];
        if let Some(w) = &own.wake {
            fds[0] = w.pollfd();
        }
        let now = os::time::monotonic_ms();
        let n_ep = own
            .endpoint
            .as_mut()
            .map_or(0, |e| e.poll_fds(&mut fds[1..], now));
        let n_pr = watcher.poll_fds(&mut fds[1 + n_ep..]);
        let n = os::poll(&mut fds[..1 + n_ep + n_pr], tick.min(watcher.timeout_ms()));
        if let Some(w) = &own.wake {
            if n > 0 && fds[0].revents != 0 {
                w.drain();
            }
        }
        // The application closed or replaced it (its own table only): make a
        // new one.
        if own.wake.as_ref().is_none_or(|w| w.lost()) {
            if let Some(w) = own.wake.take() {
                w.close();
            }
            own.wake = Wake::open();
        }
        let asked = STATE.take_stop();
        if asked != Stop::No && try_stop(&mut own, asked == Stop::Always) {
            return finish();
        }
        let facts = facts();
        if let Some(e) = own.endpoint.as_mut() {
            if n > 0 {
                e.on_events(&fds[1..1 + n_ep], &facts);
            }
            e.on_tick(&facts);
        }
        // The attached bridge's `detach`: its answer went out in
        // `on_events`; the endpoint closes, the socket file goes.
        #[cfg(memshim_bridge)]
        if control::detach_asked() {
            crate::python::py_trace_stop_ours(os::time::monotonic_ms());
            if try_stop(&mut own, true) {
                return finish();
            }
        }
        if n > 0 {
            watcher.on_events(&fds[1 + n_ep..1 + n_ep + n_pr]);
        }
        watcher.on_tick();
        let now = os::time::monotonic_ms();
        if dirty >= 0 && now.saturating_sub(last_decay) >= tick as u64 {
            let _ = jemalloc::decay_all();
            last_decay = now;
        }
        if now >= next_thp_look && os::fd::private() {
            refresh_thp();
            next_thp_look = now + os::thp::LOOK_MS;
        }
        cuda_idle.tick(now);
        crate::python::py_trace_tick(now);
        crate::profile::tick(now);
        // A job thread that has left since the last request is joined, so
        // that only threads the kernel still lists count as ours.
        crate::python::reap_worker();
        let threads = os::proc::thread_count();
        let alone = threads.is_some_and(|n| n <= 1 + our_threads());
        if alone && os::proc::leader_exited() && try_stop(&mut own, false) {
            // Every thread of the application has ended (its main thread
            // with pthread_exit). Without us the process would have exited;
            // returning lets glibc's last-thread exit(0) happen, in any
            // mode. Staying would keep it alive forever, and since we block
            // every signal, even SIGTERM would stay pending.
            return finish();
        }
        // Sampling or tracing a request started waits for the thread to
        // switch it off at its deadline.
        let owed = crate::profile::pending() || crate::python::py_trace_pending();
        if options::control() == Control::Auto {
            if alone && !owed {
                let since = *alone_since.get_or_insert(now);
                if now.saturating_sub(since) >= alone_grace_ms(dirty) && try_stop(&mut own, false) {
                    return finish();
                }
            } else {
                alone_since = None;
            }
        }
    }
}

/// Leaves the loop unless the process created a thread meanwhile (with
/// `always`: in any case, [`Stop::Always`]). Returns true if the thread
/// must exit now (its endpoint and wake pipe are closed; the spawner still
/// runs until [`finish`]).
fn try_stop(own: &mut Held, always: bool) -> bool {
    STATE.clear_wanted();
    if !STATE.move_phase(Phase::Running, Phase::Stopping) {
        return false;
    }
    // Application threads keep us, unless the main thread has ended with
    // `pthread_exit` (then we must not outlive them: state.rs, LEADER_GONE)
    // or the stop is asked for whatever they are.
    let gone = always || super::state::LEADER_GONE.load(core::sync::atomic::Ordering::Relaxed);
    if !gone && os::proc::thread_count().is_some_and(|n| n > 1 + our_threads()) {
        STATE.set_phase(Phase::Running);
        return false;
    }
    // Without the thread's decay, big blocks go back to their threads'
    // arenas (jemalloc.rs, "Big blocks in one shared arena").
    jemalloc::stop_sharing_big_blocks();
    own.close();
    STATE.set_phase(Phase::Idle);
    // A thread created while we were stopping wants us back.
    if !gone && STATE.wanted() && STATE.move_phase(Phase::Idle, Phase::Running) {
        jemalloc::share_big_blocks();
        *own = Held::open();
        return false;
    }
    true
}

/// The thread's last act: the spawner ends with it (a fork handler or
/// `arm`, which join this thread, then see both gone).
fn finish() -> *mut c_void {
    spawner::stop();
    core::ptr::null_mut()
}

/// `os::thp::refresh` with what it needs of jemalloc's settings.
fn refresh_thp() {
    let je = jemalloc::opt_thp().map_or(&b"default"[..], |c| c.to_bytes());
    os::thp::refresh(je, jemalloc::page_size() as usize);
}

/// What the control endpoint reports about the thread and the process.
fn facts() -> crate::control::Facts {
    crate::control::Facts {
        interposed: STATE.interposed(),
        fork_child: STATE.fork_child(),
        uptime_ms: STATE.uptime_ms(),
        thread_starts: STATE.starts(),
        private_fds: os::fd::private(),
        cuda_idle: super::cuda_idle::counters(),
        pressure: pressure::facts(),
        #[cfg(not(memshim_bridge))]
        deepbind_cleared: crate::deepbind::cleared(),
        #[cfg(memshim_bridge)]
        deepbind_cleared: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_follows_decay() {
        assert_eq!(tick_ms(1000), 250);
        assert_eq!(tick_ms(10), MIN_TICK_MS);
        assert_eq!(tick_ms(60_000), MAX_TICK_MS);
        assert_eq!(tick_ms(-1), MAX_TICK_MS);
        assert_eq!(tick_ms(0), MAX_TICK_MS);
        assert_eq!(alone_grace_ms(1000), 2000);
        assert_eq!(alone_grace_ms(-1), 1000);
    }
}
