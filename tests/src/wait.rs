//! Waiting by polling, never by a bare sleep.

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_until<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    poll_every(Duration::from_millis(20), timeout, f)
}

/// Calls `f` at once and then every `every` until it returns `Some`, or
/// until `timeout` has passed (then `None`, after a last call). What every
/// wait of the tests is made of, [`wait_until`] first: the one place they
/// sleep, between two looks at the condition they wait for.
pub fn poll_every<T>(
    every: Duration,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Waits (at most 5 s) until `pid` has libmemshim.so mapped: a process
/// just spawned under the shim is still exec'ing before that, and
/// memshim-ctl would call it unshimmed. Panics if it never is.
pub fn wait_shim_mapped(pid: i32) {
    wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .ok()?
            .contains("libmemshim.so")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("libmemshim.so never mapped in pid {pid}"));
}
