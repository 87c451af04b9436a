//! Every CPython the tests run (`py::cpythons`: pyenv's 3.8-3.13 on this
//! machine, Debian sid's 3.13, 3.14 and 3.15 in the root test-deps.sh
//! builds): stats, gc, and 200 exits under request fire each, timed against
//! the same program without the shim. Absent ones are skipped with a SKIP
//! line on stderr (visible without --nocapture). Also: processes without a
//! visible interpreter answer "no python", and one that has not initialised
//! its interpreter yet is never entered. (Main-thread states:
//! python_reach.rs.)

use memshim_proto::{PythonUnavailable, Reply, Request};
use memshim_tests::py::*;
use memshim_tests::{Cmd, fixture};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

fn say(msg: String) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

#[test]
fn stats_and_gc_work_on_every_installed_cpython() {
    for py in cpythons() {
        let v = &py.label;
        let dir = socket_dir(&format!("ver-{}", py.tag()));
        let mut child = py.shimmed(&fixture_py("py_host.py"), &[], &dir).spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        let sock = socket_of(&dir, child.pid());
        ask(&mut child, "alloc 4");
        let s = stats(&sock);
        let p = s
            .python
            .unwrap_or_else(|| panic!("{v}: no python section: {:?}", s.python_unavailable));
        assert_eq!(p.version, py.version, "{v}");
        assert!(!p.free_threaded, "{v}");
        assert!(p.gc_enabled, "{v}");
        assert!(
            p.gc_counts.is_some() && p.gc_thresholds.is_some_and(|t| t[0] > 0),
            "{v}: {p:?}"
        );
        assert!(p.allocated_blocks > 1000, "{v}: {p:?}");
        assert_eq!(p.threads, 1, "{v}: the fixture's one thread state");
        assert!(p.pymalloc_arena_bytes.is_some_and(|b| b > 0), "{v}: {p:?}");
        assert!(s.torch.is_none(), "{v}: torch is not imported");
        let Reply::Gc(g) = ok(request(&sock, &Request::Gc)) else {
            panic!()
        };
        let s2 = stats(&sock);
        let c1 = p.gc_collections.unwrap()[2];
        let c2 = s2.python.unwrap().gc_collections.unwrap()[2];
        assert_eq!(c2, c1 + 1, "{v}: one gc request, one full collection");
        // Finalizers ran (on the bridge's thread), and left no trace in
        // threading.enumerate().
        assert!(!ask(&mut child, "fin").contains("count=0"), "{v}");
        assert_eq!(
            ask(&mut child, "threads"),
            "threads: names=MainThread",
            "{v}"
        );
        say(format!(
            "python_versions: {v} stats ok (blocks {}, arenas {} KiB), gc collected {} in {:.1} ms",
            p.allocated_blocks,
            p.pymalloc_arena_bytes.unwrap_or(0) / 1024,
            g.collected,
            g.elapsed_ms
        ));
        child.send("quit");
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    }
}

/// Interpreters exiting normally while another thread fires `stats` and
/// `gc` at them: no hang, no crash, exit status 0 and an empty stderr, with
/// and without `atexit` imported, from a sleep and from a spinning loop
/// (no call into CPython may begin once its finalization has begun: the exit
/// gate in shim/src/python/gate.rs). And no later than without the shim:
/// each exit is timed from the moment the interpreter was told to exit to
/// its reaping, 200 under the shim and 200 of the same program without it,
/// in pairs that run side by side; the slowest under the shim must be within
/// `py::EXIT_SLACK` (100 ms) of the slowest without (a job thread that the
/// exit waited for while CPython had parked it cost 5 s: 3.13.8+, 3.14); an
/// exit over it is run again, and fails the test only if it is slow every
/// time (`ExitTimes::settle`: a loaded machine stalls a process now and then).
/// The figures of every interpreter are printed, then the check.
#[test]
fn two_hundred_exits_under_request_fire_on_every_cpython_take_no_longer_than_without_the_shim() {
    let results = for_each_cpython(2, |py| {
        let tag = format!("exit-{}", py.tag());
        let times = exit_rounds(py, &tag, 200);
        let verdict = times.settle(py, &tag);
        (times, verdict)
    });
    let mut failed = vec![];
    for (py, (times, verdict)) in &results {
        match verdict.clone() {
            Ok(summary) => say(format!("python_versions: {summary}")),
            Err(why) => {
                say(format!("python_versions: FAILED {why}"));
                failed.push(why);
            }
        }
        if times.answered == 0 {
            failed.push(format!(
                "{}: no request was ever answered: the fire was not live",
                py.label
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The exit-time check can fail: one exit among a few, delayed 5 s by an
/// atexit function of its own, is measured as such and fails it, as an exit
/// the shim held up would.
#[test]
fn an_exit_delayed_by_five_seconds_fails_the_exit_time_check() {
    let py = default_python();
    let mut times = exit_rounds(&py, "exit-delayed", 4);
    let (took, plain, _) = exit_pair(&py, &["--exit-delay", "5"], &[], "exit-delayed-5", 0);
    assert!(
        took >= Duration::from_secs(5),
        "the delayed exit measured {took:?}"
    );
    times.shimmed.push((took, &["--exit-delay", "5"]));
    times.plain.push((plain, &[]));
    let verdict = times.check();
    assert!(verdict.is_err(), "a 5 s exit passed the check: {verdict:?}");
    say(format!(
        "python_versions: a 5 s exit fails the check: {}",
        verdict.unwrap_err().replace('\n', " ")
    ));
}

/// A server whose main script returns while a non-daemon thread serves on
/// (the interpreter waits for it in `threading._shutdown`), after a first
/// job registered the exit gate: `gc` still collects, for as long as the
/// thread serves. The gate once hooked `threading._register_atexit`, whose
/// functions run before those threads are joined: every later `gc` and
/// `release` answered "shutting down" (3.9, 3.10, 3.12, 3.13; and 3.11 without
/// a site hook that imports `atexit`, hence `-S`).
#[test]
fn gc_works_after_the_main_script_returns_while_a_thread_serves() {
    for_each_cpython(2, |py| {
        let v = &py.label;
        let dir = socket_dir(&format!("main-ends-{}", py.tag()));
        let script = fixture_py("py_main_ends.py");
        let mut child = py
            .cmd([std::ffi::OsStr::new("-S"), script.as_os_str()])
            .shimmed()
            .env("MEMSHIM_CONTROL", "on")
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .spawn();
        let ready = child.wait_for_line("ready:", Duration::from_secs(30));
        assert!(ready.contains("atexit=False"), "{v}: {ready}");
        let sock = socket_of(&dir, child.pid());
        assert!(
            matches!(ok(request(&sock, &Request::Gc)), Reply::Gc(_)),
            "{v}: the first gc, while the main script runs"
        );
        ask(&mut child, "end-main");
        ask(&mut child, "alloc");
        assert!(ask(&mut child, "fin").contains("count=0"), "{v}");
        let r = request(&sock, &Request::Gc);
        assert!(
            matches!(&r, memshim_proto::Response::Ok(Reply::Gc(_))),
            "{v}: gc after the main script returned: {r:?}"
        );
        let fin = ask(&mut child, "fin");
        assert!(field::<u32>(&fin, "count") >= 1000, "{v}: {fin}");
        child.send("quit");
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    });
}

/// A global whose finalizer runs while the interpreter tears its modules
/// down (after the atexit functions, when `Py_IsInitialized()` is already
/// 0), says so, and waits there for a line on stdin.
const TEARDOWN: &str = r#"
import os, sys
class Slow:
    def __del__(self, write=os.write, read=os.read):
        write(1, b"teardown\n")
        read(0, 100)
x = Slow()
print("ready", flush=True)
sys.stdin.readline()
sys.exit(3)
"#;

/// A request that reaches an interpreter tearing its modules down is told
/// "shutting down", and `release` exits 7 as `gc` does. It was told "not
/// initialised yet" (the interpreter clears "initialized" before that
/// stage), which `release` counts as nothing to do, exit 0.
#[test]
fn a_request_during_module_teardown_is_told_shutting_down() {
    for_each_cpython(2, |py| {
        let v = &py.label;
        let dir = socket_dir(&format!("teardown-{}", py.tag()));
        let mut child = py.shimmed_c(TEARDOWN, &dir).spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        let sock = socket_of(&dir, child.pid());
        child.send("exit");
        child.wait_for_line("teardown", Duration::from_secs(30));
        let r = request(&sock, &Request::Gc);
        assert!(
            matches!(&r, memshim_proto::Response::Error(e) if e.python == Some(PythonUnavailable::Finalizing)),
            "{v}: gc during teardown: {r:?}"
        );
        let o = memshim_tests::control::ctl_run(&["release", &child.pid().to_string()]);
        assert_eq!(o.code, 7, "{v}: release during teardown: {o:?}");
        assert!(o.stderr.contains("shutting down"), "{v}: {o:?}");
        child.send("bye");
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (3, ""), "{v}");
    });
}

fn no_python(r: memshim_proto::Response) -> bool {
    matches!(r, memshim_proto::Response::Ok(Reply::Stats(s)) if s.python.is_none()
        && s.python_unavailable == Some(PythonUnavailable::NoPython))
}

#[test]
fn a_process_without_python_reports_no_python() {
    let dir = socket_dir("nopy");
    let mut child = Cmd::new("/bin/cat", Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .spawn();
    let sock = socket_of(&dir, child.pid());
    assert!(no_python(request(
        &sock,
        &Request::Stats {
            arenas: false,
            pss: false
        }
    )));
    let r = request(&sock, &Request::Gc);
    assert!(
        matches!(&r, memshim_proto::Response::Error(e) if e.python == Some(PythonUnavailable::NoPython)),
        "{r:?}"
    );
    child.send("x");
    drop(child);
}

/// CPythons older than 3.8 (pyenv's 2.7, 3.6, 3.7 here) are there but not
/// supported: `gc`, `release` and `stats` say so, with the version, and
/// never "no python" (which `release` counts as nothing to do, exit 0).
#[test]
fn an_older_cpython_is_unsupported_not_absent() {
    let old: Vec<(String, PathBuf)> = memshim_tests::pyenv_pythons()
        .into_iter()
        .filter(|(v, _)| {
            memshim_tests::py::SUPPORTED
                .iter()
                .all(|s| !v.starts_with(&format!("{s}.")))
        })
        .filter(|(v, _)| v.starts_with("2.") || v.starts_with("3."))
        .collect();
    if old.is_empty() {
        say(
            "python_versions: skipped the unsupported check: no CPython older than 3.8 in pyenv"
                .into(),
        );
        return;
    }
    for (v, exe) in old {
        let dir = socket_dir(&format!("old-{v}"));
        // "ready" once the interpreter runs; the version is checked before
        // the interpreter's state, so the answer is the same before it.
        let mut child = shimmed_python_c(
            &exe,
            "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()",
            &dir,
        )
        .spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        let sock = socket_of(&dir, child.pid());
        let unsupported = |u: &Option<PythonUnavailable>| matches!(u, Some(PythonUnavailable::Unsupported { version, .. }) if *version == v);
        let r = request(&sock, &Request::Gc);
        assert!(
            matches!(&r, memshim_proto::Response::Error(e) if unsupported(&e.python)),
            "{v}: {r:?}"
        );
        let s = stats(&sock);
        assert!(
            s.python.is_none() && unsupported(&s.python_unavailable),
            "{v}: {:?}",
            s.python_unavailable
        );
        let o = Cmd::new(memshim_tests::ctl(), ["release", &child.pid().to_string()])
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .run();
        assert_eq!(o.code, 7, "{v}: release must fail: {o:?}");
        assert!(
            o.stderr.contains(&format!("CPython {v} is not supported")),
            "{v}: {o:?}"
        );
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
        say(format!(
            "python_versions: CPython {v} is reported unsupported"
        ));
    }
}

/// An interpreter embedded `RTLD_LOCAL` is invisible: "no python". With
/// each of [`embeddable_cpythons`] (pyenv's newest, Debian sid's).
#[test]
fn python_embedded_rtld_local_is_no_python() {
    for py in embeddable_cpythons() {
        let v = &py.label;
        let (lib, home) = py.embedding().unwrap();
        let dir = socket_dir(&format!("local-{}", py.tag()));
        let mut child = py
            .enter(Cmd::new(fixture("py_local", &[]), [lib.as_os_str()]))
            .shimmed()
            .env("MEMSHIM_CONTROL", "on")
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .env("PYTHONHOME", &home)
            .spawn();
        child.labelled(&format!("py_local embedding {v} RTLD_LOCAL"));
        child.wait_for_line("up", Duration::from_secs(30));
        let sock = socket_of(&dir, child.pid());
        let r = request(
            &sock,
            &Request::Stats {
                arenas: false,
                pss: false,
            },
        );
        assert!(no_python(r.clone()), "{v}: {r:?}");
        child.send("x");
        child.wait_for_line("finalized", Duration::from_secs(30));
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
        say(format!(
            "python_versions: {v} embedded RTLD_LOCAL: no python"
        ));
    }
}

/// An embedder that has finalized its interpreter and runs on: "not
/// initialised" again (CPython's "finalizing" stays set until a new
/// `Py_Initialize`), so `release` has nothing to do and exits 0. No request
/// reached the interpreter before, so no exit gate is involved.
#[test]
fn an_embedded_interpreter_after_py_finalize_is_not_initialised() {
    for py in embeddable_cpythons() {
        let v = &py.label;
        let (mut child, sock) = embedder(&py, "postfini");
        child.send("go");
        child.wait_for_line("up", Duration::from_secs(30));
        child.send("x");
        child.wait_for_line("finalized", Duration::from_secs(30));
        let r = request(&sock, &Request::Gc);
        assert!(
            matches!(&r, memshim_proto::Response::Error(e) if e.python == Some(PythonUnavailable::NotInitialized)),
            "{v}: gc after Py_FinalizeEx: {r:?}"
        );
        let o = memshim_tests::control::ctl_run(&["release", &child.pid().to_string()]);
        assert_eq!(o.code, 0, "{v}: release after Py_FinalizeEx: {o:?}");
        child.send("bye");
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    }
}

/// `py_local` embedding `py`'s libpython RTLD_GLOBAL, under the shim with
/// its endpoint on, stopped before `Py_Initialize`: (the program, its
/// socket); `tag` names its socket directory (short: a socket path holds
/// 107 bytes).
fn embedder(py: &Cpython, tag: &str) -> (memshim_tests::Child, PathBuf) {
    let (lib, home) = py.embedding().unwrap();
    let dir = socket_dir(&format!("{tag}-{}", py.tag()));
    let mut child = py
        .enter(Cmd::new(
            fixture("py_local", &[]),
            [lib.as_os_str(), "global".as_ref()],
        ))
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .env("PYTHONHOME", &home)
        .spawn();
    child.labelled(&format!("py_local embedding {} RTLD_GLOBAL", py.label));
    child.wait_for_line("pre-init", Duration::from_secs(30));
    let sock = socket_of(&dir, child.pid());
    (child, sock)
}

#[test]
fn requests_before_py_initialize_run_nothing() {
    for py in embeddable_cpythons() {
        let v = &py.label;
        let (mut child, sock) = embedder(&py, "preinit");
        let not_init = |r: &memshim_proto::Response| match r {
            memshim_proto::Response::Ok(Reply::Stats(s)) => {
                s.python_unavailable == Some(PythonUnavailable::NotInitialized)
            }
            memshim_proto::Response::Error(e) => {
                e.python == Some(PythonUnavailable::NotInitialized)
            }
            _ => false,
        };
        let r = request(
            &sock,
            &Request::Stats {
                arenas: false,
                pss: false,
            },
        );
        assert!(not_init(&r), "{v}: {r:?}");
        let r = request(&sock, &Request::Gc);
        assert!(not_init(&r), "{v}: {r:?}");
        // Initialised, but the main thread sits in C (fgets) holding the
        // GIL, as an embedder does: found (not "no python"), and busy. The
        // bridge's thread stays queued for the GIL; the program then
        // finalizes the interpreter, which ends that thread with
        // pthread_exit (3.13.0: every time), parks it (3.13.8+, 3.14) or
        // lets it through first. Either way the program finalizes and exits
        // as it would without the shim.
        child.send("go");
        child.wait_for_line("up", Duration::from_secs(30));
        let r = request(
            &sock,
            &Request::Stats {
                arenas: false,
                pss: false,
            },
        );
        assert!(
            matches!(&r, memshim_proto::Response::Ok(Reply::Stats(s))
                if matches!(s.python_unavailable, Some(PythonUnavailable::Busy { .. }))),
            "{v}: {r:?}"
        );
        child.send("x");
        child.wait_for_line("finalized", Duration::from_secs(30));
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    }
}
