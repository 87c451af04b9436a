//! Hosts that make the bridge's work hard: jobs whose Python calls raise
//! long non-ASCII exceptions (the host must live), signals that raise
//! `KeyboardInterrupt` and `SystemExit` in the host while a job runs (they
//! must reach the host as without the shim), and forks while requests are
//! in flight (the child starts clean and exits at once).
//! Fixture: tests/fixtures/py_hostile.py.

use memshim_proto::exit::PYTHON_STEP;
use memshim_proto::{PythonUnavailable, Reply, Request, Response, StepOutcome};
use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn stats() -> Request {
    Request::Stats {
        arenas: false,
        pss: false,
    }
}

/// The bridge's error text in an answer, if it has one.
fn python_error(r: &Response) -> Option<String> {
    let why = match r {
        Response::Error(e) => e.python.clone(),
        Response::Ok(Reply::Stats(s)) => s.python_unavailable.clone(),
        _ => None,
    }?;
    match why {
        PythonUnavailable::Error { message } => Some(message),
        _ => None,
    }
}

#[test]
fn jobs_that_raise_long_non_ascii_exceptions_leave_the_host_alive() {
    for_each_cpython(2, |py| {
        let v = &py.label;
        let dir = socket_dir(&format!("hostile-exc-{}", py.tag()));
        let mut child = py
            .shimmed(&fixture_py("py_hostile.py"), &["exceptions"], &dir)
            .spawn();
        child.labelled(v);
        child.wait_for_line("ready", Duration::from_secs(30));
        let sock = socket_of(&dir, child.pid());
        let mut kinds = std::collections::BTreeSet::new();
        for round in 0..12 {
            for req in [stats(), Request::Gc, Request::EmptyCache] {
                let r = request(&sock, &req);
                let msg =
                    python_error(&r).unwrap_or_else(|| panic!("{v} round {round} {req:?}: {r:?}"));
                assert!(msg.len() <= 400, "{v}: {} bytes", msg.len());
                kinds.insert(msg.split(':').next().unwrap_or("").to_owned());
            }
            let Reply::Release(r) = ok(request(&sock, &Request::Release)) else {
                panic!("{v}: not a release")
            };
            assert_eq!(r.steps[0].outcome, StepOutcome::Failed, "{v}: {r:?}");
            assert_eq!(r.steps[2].outcome, StepOutcome::Done, "{v}: {r:?}");
        }
        // Every kind of exception went through: ordinary ones, the
        // KeyboardInterrupt, and the one whose str() raises.
        assert!(
            kinds
                .iter()
                .any(|k| k.starts_with("interrupted by KeyboardInterrupt")),
            "{v}: {kinds:?}"
        );
        assert!(kinds.contains("RuntimeError"), "{v}: {kinds:?}");
        assert!(kinds.contains("Unprintable"), "{v}: {kinds:?}");
        // The CLI: a failed step is reported with its reason, exit `PYTHON_STEP`.
        let out = Cmd::new(ctl(), ["release", &child.pid().to_string()]).run();
        assert_eq!(out.code, i32::from(PYTHON_STEP.code), "{v}: {out:?}");
        assert!(
            out.stderr.contains("the gc step could not run"),
            "{v}: {out:?}"
        );
        let out = Cmd::new(ctl(), ["gc", &child.pid().to_string()]).run();
        assert_eq!(out.code, i32::from(PYTHON_STEP.code), "{v}: {out:?}");
        child.send("quit");
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    });
}

/// Whether the main thread of `pid` is blocked inside the system call that
/// `time.sleep` makes: clock_nanosleep (3.11 and later), select or
/// pselect6 (3.8-3.10). Read from /proc/PID/task/PID/syscall, whose first
/// field is the number of the call a blocked thread is in ("running"
/// otherwise).
fn main_thread_sleeps(pid: i32) -> bool {
    #[cfg(target_arch = "x86_64")]
    const SLEEPS: [libc::c_long; 3] = [
        libc::SYS_clock_nanosleep,
        libc::SYS_select,
        libc::SYS_pselect6,
    ];
    #[cfg(not(target_arch = "x86_64"))]
    const SLEEPS: [libc::c_long; 2] = [libc::SYS_clock_nanosleep, libc::SYS_pselect6];
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<libc::c_long>().ok())
        .is_some_and(|n| SLEEPS.contains(&n))
}

/// Sends `sig` to `child` once its main thread is inside its sleep's system
/// call. CPython checks for a pending signal before it sleeps, not in the
/// instant between that check and the call (pysleep), so a signal that
/// lands there is handled only when the sleep ends (60 s in the fixture);
/// inside the call, the signal interrupts it at once.
fn signal_in_sleep(child: &memshim_tests::Child, sig: i32, what: &str) {
    let pid = child.pid();
    memshim_tests::wait_until(Duration::from_secs(10), || {
        main_thread_sleeps(pid).then_some(())
    })
    .unwrap_or_else(|| panic!("{what}: the main thread never went to sleep in time.sleep"));
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(pid, sig) };
}

/// The fixture's `signals` mode without the shim, the reference: SIGINT
/// then SIGTERM, each sent while its main thread sleeps.
fn signals_without_the_shim(py: &Cpython) -> memshim_tests::Output {
    let script = fixture_py("py_hostile.py");
    let mut c = py
        .cmd([script.as_os_str(), std::ffi::OsStr::new("signals")])
        .spawn();
    let what = format!("{} without the shim", py.label);
    c.labelled(&what);
    c.wait_for_line("ready", Duration::from_secs(30));
    signal_in_sleep(&c, libc::SIGINT, &what);
    c.wait_for_line("caught KeyboardInterrupt", Duration::from_secs(10));
    signal_in_sleep(&c, libc::SIGTERM, &what);
    c.finish(Duration::from_secs(30))
}

/// SIGINT and SIGTERM while a `gc` job runs reach the host as without the
/// shim: the default python3, and Debian sid's 3.14 and 3.15. Each signal
/// is sent once the host's main thread sleeps in `time.sleep`.
#[test]
fn signals_raise_in_the_host_as_without_the_shim_while_a_job_runs() {
    // Timed (the signal within 2 s).
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let mut pys = vec![default_python()];
    pys.extend(sid_cpythons(&["3.14", "3.15"]));
    for py in pys {
        signals_during_a_job(&py);
    }
}

fn signals_during_a_job(py: &Cpython) {
    let v = &py.label;
    let reference = signals_without_the_shim(py);
    assert_eq!(reference.code, 3, "{v}: {reference:?}");

    let dir = socket_dir(&format!("hostile-signals-{}", py.tag()));
    let mut child = py
        .shimmed(&fixture_py("py_hostile.py"), &["signals"], &dir)
        .spawn();
    let what = format!("{v} under the shim");
    child.labelled(&what);
    child.wait_for_line("ready", Duration::from_secs(30));
    let sock = socket_of(&dir, child.pid());
    // A gc of slow finalizers (about 4 s), on the bridge's thread.
    let gc = {
        let sock = sock.clone();
        std::thread::spawn(move || try_request(&sock, &Request::Gc))
    };
    child.wait_for_line("fin running", Duration::from_secs(10));
    // Where CPython may end the job thread with `pthread_exit` at the exit
    // below (3.8 to 3.13.7), glibc's unwinder was loaded before the thread
    // started, on the shim's thread (shim/src/os/unwind.rs); no exec loads
    // it otherwise (core::interpose). Later versions never end it so.
    let (major, minor, patch) = py.parsed();
    if (major, minor) == (3, 13) && patch < 8 || (major, minor) < (3, 13) {
        let maps =
            std::fs::read_to_string(format!("/proc/{}/maps", child.pid())).unwrap_or_default();
        assert!(maps.contains("libgcc_s.so.1"), "{v}: {maps}");
    }
    let t = Instant::now();
    signal_in_sleep(&child, libc::SIGINT, &what);
    child.wait_for_line("caught KeyboardInterrupt", Duration::from_secs(10));
    let caught = t.elapsed();
    assert!(
        !gc.is_finished(),
        "{v}: the job ended before the signal was delivered: the test proves nothing"
    );
    // SIGTERM during the job: SystemExit(3) ends the host, whose exit
    // waits for the running job at most as long as the job runs.
    signal_in_sleep(&child, libc::SIGTERM, &what);
    let out = child.finish(Duration::from_secs(30));
    let _ = gc.join();
    eprintln!(
        "python::hostile: {v}: KeyboardInterrupt reached the host {caught:?} after SIGINT, during a gc job"
    );
    assert!(caught < Duration::from_secs(2), "{v}: {caught:?}");
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (reference.code, reference.stderr.as_str()),
        "{v}: {out:?}"
    );
}

#[test]
fn a_fork_child_starts_with_clean_bridge_state_and_exits_at_once() {
    // Timed (4 s), two interpreters forking under request fire.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    for_each_cpython(2, |py| {
        let v = &py.label;
        let dir = socket_dir(&format!("hostile-fork-{}", py.tag()));
        let mut child = py
            .shimmed(&fixture_py("py_hostile.py"), &["fork", "150"], &dir)
            .spawn();
        child.labelled(&format!("{v}, forking under fire"));
        child.wait_for_line("ready", Duration::from_secs(30));
        let parent = child.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let child_answers = Arc::new(AtomicU64::new(0));
        // Fire at every socket in the directory: the parent's, whose job
        // threads are in flight when it forks, and each child's.
        let fire = {
            let (stop, child_answers, dir) = (stop.clone(), child_answers.clone(), dir.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let socks: Vec<_> = std::fs::read_dir(&dir)
                        .map(|rd| rd.flatten().map(|e| e.path()).collect())
                        .unwrap_or_default();
                    for s in socks {
                        let of_parent = s
                            .file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&format!("{parent}-")));
                        if let Ok(Response::Ok(Reply::Gc(_))) = try_request(&s, &Request::Gc)
                            && !of_parent
                        {
                            child_answers.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        };
        let line = child.wait_for_line("children:", Duration::from_secs(60));
        stop.store(true, Ordering::Relaxed);
        fire.join().unwrap();
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
        assert_eq!(field::<u32>(&line, "hung"), 0, "{v}: a child hung: {line}");
        assert_eq!(field::<String>(&line, "codes"), "0", "{v}: {line}");
        // A child that inherited the parent's job in flight would wait 5 s
        // at exit; one forked while the bridge's thread held the runtime's
        // thread-list lock would hang in os.fork (the test would time out).
        let worst: u64 = field(&line, "max_ms");
        // 4 s: room for a loaded 2-core machine, below the 5 s that an
        // inherited job would add.
        assert!(
            worst < 4000,
            "{v}: a child took {worst} ms more than it lives: {line}"
        );
        assert!(
            child_answers.load(Ordering::Relaxed) > 0,
            "{v}: no child answered a gc: their bridges were not clean"
        );
        eprintln!(
            "python::hostile: {v} 150 forks under fire, slowest child {worst} ms, {} gc answered by children",
            child_answers.load(Ordering::Relaxed)
        );
    });
}
