//! A main thread that does not reach a point where CPython runs pending
//! calls gets a bounded "busy" answer, and a withdrawn request never runs
//! later; a main thread busy in pure Python still serves each request
//! exactly once.

mod python_support;

use memshim_proto::{PythonUnavailable, Reply, Request, Response};
use memshim_tests::python;
use python_support::*;
use std::io::Write;
use std::time::{Duration, Instant};

fn is_busy(r: &Response) -> bool {
    match r {
        Response::Error(e) => matches!(e.python, Some(PythonUnavailable::Busy { .. })),
        Response::Ok(Reply::Stats(s)) => {
            matches!(s.python_unavailable, Some(PythonUnavailable::Busy { .. }))
        }
        _ => false,
    }
}

/// Waits until the main thread is inside time.sleep's system call
/// (clock_nanosleep, nanosleep or select; the fixture idles in pselect6).
fn wait_in_sleep(pid: i32) {
    memshim_tests::wait_until(Duration::from_secs(10), || {
        let s = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
        let nr: u64 = s.split_whitespace().next()?.parse().ok()?;
        [
            libc::SYS_clock_nanosleep,
            libc::SYS_nanosleep,
            libc::SYS_select,
        ]
        .contains(&(nr as i64))
        .then_some(())
    })
    .expect("the main thread never entered time.sleep");
}

#[test]
fn main_thread_asleep_gets_bounded_busy_and_nothing_runs_late() {
    let dir = socket_dir("busy-sleep");
    let mut child =
        shimmed_python(&python(), &fixture_py("py_host.py"), &["--gc-off"], &dir).spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let sock = socket_of(&dir, child.pid());
    child.send("sleep 30");
    child.wait_for_line("sleeping", Duration::from_secs(10));
    wait_in_sleep(child.pid());

    let t = Instant::now();
    let r = request(
        &sock,
        &Request::Stats {
            arenas: false,
            pss: false,
        },
    );
    let stats_ms = t.elapsed().as_millis();
    assert!(is_busy(&r), "{r:?}");
    assert!(stats_ms < 2_000, "stats took {stats_ms} ms");

    let t = Instant::now();
    let r = request(&sock, &Request::Gc);
    let gc_ms = t.elapsed().as_millis();
    assert!(is_busy(&r), "{r:?}");
    assert!(gc_ms < 10_000, "gc took {gc_ms} ms");
    let _ = writeln!(
        std::io::stderr(),
        "main thread in time.sleep(30): stats busy after {stats_ms} ms, gc busy after {gc_ms} ms"
    );

    child.wait_for_line("sleep: done", Duration::from_secs(40));
    // The withdrawn gc never ran, not even once the main thread woke up.
    assert_eq!(ask(&mut child, "full"), "full: count=0");
    // A new request runs exactly once.
    assert!(matches!(ok(request(&sock, &Request::Gc)), Reply::Gc(_)));
    assert_eq!(ask(&mut child, "full"), "full: count=1");
    child.send("quit");
    let out = child.finish(Duration::from_secs(30));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

#[test]
fn main_thread_in_a_pure_python_loop_runs_each_request_exactly_once() {
    let times = spin_serves_each_request_once(&python(), "busy-spin", 5);
    let _ = writeln!(
        std::io::stderr(),
        "main thread spinning in pure Python: gc answered in {times:?} ms"
    );
    assert!(times.iter().all(|&t| t < 2_000), "{times:?}");
}
