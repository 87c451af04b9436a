//! Clocks (monotonic, CPU time), sleeping, and futexes.

use core::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

/// A clock's reading in nanoseconds. Allocation-free, async-signal-safe.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ns(&ts)
}

#[inline]
fn ns(ts: &libc::timespec) -> u64 {
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Monotonic clock in milliseconds. Allocation-free, async-signal-safe.
pub fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// As [`monotonic_ms`], by the system call (0 if it failed): libc's
/// `clock_gettime` reads the vDSO's data page, a page fault of its own in
/// a process (or fork child) that reads no clock otherwise. For the
/// constructor and the fork child handler.
#[inline]
pub fn monotonic_ms_by_syscall() -> u64 {
    super::raw::clock_gettime(libc::CLOCK_MONOTONIC).map_or(0, |ts| ns(&ts) / 1_000_000)
}

/// Monotonic clock in nanoseconds. Allocation-free, async-signal-safe.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time the whole process has used (every thread, user and system),
/// in nanoseconds. Allocation-free.
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time the calling thread has used, in nanoseconds. Allocation-free.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// Sleeps for `d` (or less, if a signal interrupts). Async-signal-safe.
pub fn sleep(d: Duration) {
    super::raw::nanosleep(&timespec(d));
}

/// Polls `busy` every `step` until it is false or `limit_ms` have passed;
/// returns whether it became false. The same cancellation rule as
/// [`sleep`]. Async-signal-safe if `busy` is.
pub fn wait_while(limit_ms: u64, step: Duration, mut busy: impl FnMut() -> bool) -> bool {
    let deadline = monotonic_ms() + limit_ms;
    while busy() {
        if monotonic_ms() >= deadline {
            return false;
        }
        sleep(step);
    }
    true
}

/// Waits until `word` is no longer `expected`, a wake-up, or `timeout`
/// (`None`: no limit). Returns at once if the word differs already.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(timespec);
    let tp = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a live u32 with a relative timeout (or none).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tp,
            core::ptr::null::<u32>(),
            0,
        )
    };
}

/// Waits while `word` is `value`, at most `limit` (a wake-up that changed
/// it ends the wait early). Returns whether it changed in time.
pub fn futex_wait_while(word: &AtomicU32, value: u32, limit: Duration) -> bool {
    if word.load(SeqCst) != value {
        return true;
    }
    let deadline = std::time::Instant::now() + limit;
    while word.load(SeqCst) == value {
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        futex_wait(word, value, Some(deadline - now));
    }
    true
}

/// Wakes every waiter on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
            core::ptr::null::<libc::timespec>(),
            core::ptr::null::<u32>(),
            0,
        )
    };
}
