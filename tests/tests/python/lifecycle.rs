//! The lives of an interpreter and of its library, and the process's own
//! namespace changes, while the bridge serves it: an embedder that
//! finalizes while a job waits for the GIL, initialises again, or unloads
//! libpython and loads another; a program that enters a user namespace
//! while a job runs. Each behaves as without the shim.

use memshim_proto::{PythonUnavailable, Reply, Request, Response};
use memshim_tests::py::*;
use memshim_tests::{Child, Cmd, fixture};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every CPython with a shared libpython an embedder can load: (the
/// interpreter, its PYTHONHOME, its libpython), as the process sees them.
fn libpythons() -> Vec<(Cpython, PathBuf, PathBuf)> {
    cpythons()
        .into_iter()
        .filter_map(|py| {
            let (lib, home) = py.embedding()?;
            Some((py, home, lib))
        })
        .collect()
}

/// `py_embed` under the shim with its endpoint on, where `py` runs (on
/// this machine, or in the sid root), and its socket.
fn embedder(py: &Cpython, tag: &str) -> (Child, PathBuf) {
    let dir = socket_dir(tag);
    let cmd = Cmd::new(fixture("py_embed", &[]), Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", &dir);
    let mut child = py.enter(cmd).spawn();
    let sock = socket_of(&dir, child.pid());
    child.labelled(&format!("{tag}, {}", py.label));
    (child, sock)
}

/// Sends a command to `py_embed` and returns its answer line.
fn say(child: &mut Child, cmd: &str, answer: &str) -> String {
    child.send(cmd);
    child.wait_for_line(answer, Duration::from_secs(60))
}

fn load(child: &mut Child, home: &Path, lib: &Path) {
    say(child, &format!("home {}", home.display()), "home");
    say(child, &format!("open {}", lib.display()), "opened");
    say(child, "init", "up");
}

fn gc_served(sock: &Path) -> bool {
    matches!(request(sock, &Request::Gc), Response::Ok(Reply::Gc(_)))
}

fn python_version(sock: &Path) -> Option<String> {
    stats(sock).python.map(|p| p.version)
}

fn mapped(pid: i32, name: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(name))
}

/// An embedder that finalizes its interpreter and initialises it again is
/// served again. The exit gate, shut by the first interpreter's exit hook,
/// stayed shut for ever: every later request answered "shutting down".
#[test]
fn an_embedder_that_initialises_again_is_served_again() {
    for (py, home, lib) in libpythons() {
        let v = &py.label;
        let (mut child, sock) = embedder(&py, &format!("again-{}", py.tag()));
        load(&mut child, &home, &lib);
        assert!(gc_served(&sock), "{v}: the first interpreter");
        say(&mut child, "fini", "finalized");
        let r = request(&sock, &Request::Gc);
        assert!(
            matches!(&r, Response::Error(e) if e.python == Some(PythonUnavailable::NotInitialized)),
            "{v}: between the two: {r:?}"
        );
        say(&mut child, "init", "up");
        assert!(gc_served(&sock), "{v}: the second interpreter");
        say(&mut child, "fini", "finalized");
        child.send("exit");
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    }
}

/// An embedder that unloads its libpython and loads another version:
/// the first library is unmapped as without the shim, the process has no
/// Python in between, and the second interpreter is served. The bridge's
/// lookups used to pin every libpython they found (glibc makes a library
/// found by `dlsym(RTLD_DEFAULT)` from a preloaded one unloadable), so the
/// second library bound to the first one's symbols and the process
/// crashed in `Py_Initialize`, with or without a request.
#[test]
fn an_embedder_can_unload_libpython_and_load_another() {
    // Two libraries from the same place: this machine's newest two, and
    // sid's newest two (each pair in one process).
    let libs = libpythons();
    let mut pairs = vec![];
    for sid in [false, true] {
        let here: Vec<_> = libs
            .iter()
            .filter(|(p, _, _)| p.sid().is_some() == sid)
            .collect();
        if let [.., a, b] = &here[..] {
            pairs.push(((*a).clone(), (*b).clone()));
        }
    }
    if pairs.is_empty() {
        memshim_tests::skip(format_args!(
            "two CPythons with a shared libpython in one place are needed"
        ));
    }
    for ((p1, home1, lib1), (p2, home2, lib2)) in pairs {
        unload_and_load_another((&p1, &home1, &lib1), (&p2, &home2, &lib2));
    }
}

fn unload_and_load_another(first: (&Cpython, &Path, &Path), second: (&Cpython, &Path, &Path)) {
    let ((p1, home1, lib1), (p2, home2, lib2)) = (first, second);
    let (v1, v2) = (&p1.minor, &p2.minor);
    let (mut child, sock) = embedder(p1, &format!("unload-{}", p1.tag()));
    let pid = child.pid();
    load(&mut child, home1, lib1);
    assert!(gc_served(&sock), "{v1}");
    assert!(python_version(&sock).is_some_and(|p| p.starts_with(&format!("{v1}."))));
    say(&mut child, "fini", "finalized");
    say(&mut child, "close", "closed");
    let name1 = lib1.file_name().unwrap().to_string_lossy().into_owned();
    assert!(!mapped(pid, &name1), "{v1}: still mapped after dlclose");
    let r = request(&sock, &Request::Gc);
    assert!(
        matches!(&r, Response::Error(e) if e.python == Some(PythonUnavailable::NoPython)),
        "between the libraries: {r:?}"
    );
    load(&mut child, home2, lib2);
    assert!(gc_served(&sock), "{v2}");
    let now = python_version(&sock);
    assert!(
        now.as_deref()
            .is_some_and(|p| p.starts_with(&format!("{v2}."))),
        "{now:?}"
    );
    say(&mut child, "fini", "finalized");
    child.send("exit");
    let out = child.finish(Duration::from_secs(30));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

/// An embedder that finalizes while a job thread waits for the GIL (the
/// embedder holds it in C, as embedders do), after an earlier job
/// registered the exit gate's hook: `Py_FinalizeEx` takes what it takes
/// without the shim, and the queued request is answered at once: served,
/// if the interpreter let the GIL go before its `atexit` functions ran
/// (3.11 runs Python code there), else told "shutting down". On 3.13.8+
/// and 3.14, which park such a thread for ever, the gate's late hook waited
/// 5 s for it.
#[test]
fn finalizing_while_a_job_waits_for_the_gil_is_not_delayed() {
    // Timed (Py_FinalizeEx within 1 s, the request within 4 s).
    let _machine = memshim_tests::serial::exclusive(module_path!());
    for (py, home, lib) in libpythons() {
        let v = &py.label;
        let (mut child, sock) = embedder(&py, &format!("park-{}", py.tag()));
        let pid = child.pid();
        load(&mut child, &home, &lib);
        assert!(gc_served(&sock), "{v}: the first job registers the gate");
        // Its thread gone, so that the one seen below is the next job's.
        let job_thread = || {
            memshim_tests::thread_names(pid)
                .iter()
                .any(|n| n == "memshim-py")
        };
        memshim_tests::wait_until(Duration::from_secs(10), || (!job_thread()).then_some(()))
            .unwrap_or_else(|| panic!("{v}: the first job's thread stays"));
        say(&mut child, "hold", "holding");
        let queued = {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                (try_request(&sock, &Request::Gc), t.elapsed())
            })
        };
        // The job thread exists and waits for the GIL.
        memshim_tests::wait_until(Duration::from_secs(10), || job_thread().then_some(()))
            .unwrap_or_else(|| panic!("{v}: no job thread"));
        let line = say(&mut child, "fini", "finalized");
        let ms: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (r, took) = queued.join().unwrap();
        child.send("exit");
        let out = child.finish(Duration::from_secs(30));
        eprintln!(
            "python::lifecycle: {v} Py_FinalizeEx {ms} ms with a job queued; the request answered in {took:?}"
        );
        assert!(ms < 1000.0, "{v}: Py_FinalizeEx took {ms} ms");
        assert!(
            matches!(&r, Ok(Response::Error(e)) if e.python == Some(PythonUnavailable::Finalizing))
                || matches!(&r, Ok(Response::Ok(Reply::Gc(_)))),
            "{v}: the queued request: {r:?}"
        );
        assert!(took < Duration::from_secs(4), "{v}: it waited {took:?}");
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    }
}

/// `os.unshare(CLONE_NEWUSER)` needs a single-threaded process. Called
/// while a `gc` job runs (its finalizers sleep, releasing the GIL), it
/// failed with EINVAL under the shim: the job thread was not counted as
/// the shim's, and the shim's thread could not stop while it waited for
/// the job. Now the call waits for the job to finish, the request gets its
/// result, and the call succeeds, as it does without the shim.
#[test]
fn unshare_during_a_job_succeeds_as_without_the_shim() {
    let script = fixture_py("py_unshare.py");
    for py in cpythons() {
        if py.parsed().1 < 12 {
            continue; // os.unshare is 3.12+
        }
        let v = &py.label;
        // Without the shim, no job: the reference.
        let mut plain = py.cmd([&script]).spawn();
        plain.wait_for_line("ready", Duration::from_secs(30));
        plain.send("go");
        let reference = plain.wait_for_line("unshare:", Duration::from_secs(30));
        let _ = plain.finish(Duration::from_secs(30));
        if reference != "unshare: ok" {
            eprintln!(
                "SKIP {v}: os.unshare(CLONE_NEWUSER) fails here without the shim: {reference}"
            );
            continue;
        }
        let dir = socket_dir(&format!("unshare-{}", py.tag()));
        let mut child = py
            .cmd([&script])
            .shimmed()
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        let sock = socket_of(&dir, child.pid());
        // On a loaded machine the job thread may not get the GIL within the
        // request's wait: the job is then withdrawn before it runs and the
        // answer is "busy". Ask again, as the answer says, until one runs.
        let gc = std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let r = try_request(&sock, &Request::Gc);
                let busy = matches!(&r, Ok(Response::Error(e))
                    if matches!(e.python, Some(PythonUnavailable::Busy { .. })));
                if !busy || std::time::Instant::now() > deadline {
                    return r;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        child.wait_for_line("fin running", Duration::from_secs(30));
        child.send("go");
        let got = child.wait_for_line("unshare:", Duration::from_secs(30));
        let fins = child.wait_for_line("fins:", Duration::from_secs(30));
        let out = child.finish(Duration::from_secs(30));
        let r = gc.join().unwrap();
        assert_eq!(got, "unshare: ok", "{v}");
        assert_eq!(fins, "fins: 8", "{v}: the job finished before the call");
        assert!(
            matches!(&r, Ok(Response::Ok(Reply::Gc(g))) if g.collected >= 8),
            "{v}: {r:?}"
        );
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
    }
}

/// The job thread of a request is joined before the answer goes out. It
/// was left unjoined when the answer came before the thread had given up
/// its claim (most of the time on two CPUs), and then counted as one of the
/// shim's threads after it had gone: a process with one thread of its own
/// (`import torch` makes one) looked alone, and under the default
/// `MEMSHIM_CONTROL=auto` the shim's thread stopped, with its idle return
/// and its endpoint. Several rounds of a `gc` and a wait past the time
/// after which a process alone stops the thread (decay 200 ms + 1 s).
#[test]
fn requests_leave_the_shim_thread_running_beside_one_thread_of_the_programs() {
    let py = default_python();
    let dir = socket_dir("job-reaped");
    let src = "import sys, threading\n\
               t = threading.Thread(target=sys.stdin.readline)\n\
               t.start()\n\
               print('ready', flush=True)\n\
               t.join()\n";
    let mut child = py
        .cmd(["-c", src])
        .shimmed()
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .env("MEMSHIM_DIRTY_DECAY_MS", "200")
        .spawn();
    child.wait_for_line("ready", Duration::from_secs(60));
    let pid = child.pid();
    let sock = socket_of(&dir, pid);
    for round in 1..=6 {
        match ok(request(&sock, &Request::Gc)) {
            Reply::Gc(_) => {}
            other => panic!("round {round}: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(1600));
        assert!(
            !memshim_tests::control::shim_tids(pid).is_empty(),
            "round {round}: the shim's thread stopped beside the program's thread"
        );
    }
    child.send("");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// An embedder without the preload whose interpreter is not running (its
/// libpython loaded, not initialised yet, or finalized): the verbs by
/// ptrace refuse with exit 7, as a Python step that cannot run (they
/// exited 1, "unexpected error"), and nothing was changed.
#[test]
fn an_unshimmed_embedder_whose_interpreter_is_not_running_is_a_python_step_failure() {
    let Some((py, home, lib)) = libpythons().into_iter().next() else {
        eprintln!("SKIP: no CPython with a shared libpython");
        return;
    };
    let mut child = py
        .enter(Cmd::new(fixture("py_embed", &[]), Vec::<String>::new()))
        .spawn();
    child.labelled(&format!("unshimmed embedder, {}", py.label));
    say(&mut child, &format!("home {}", home.display()), "home");
    say(&mut child, &format!("open {}", lib.display()), "opened");
    let pid = child.pid().to_string();
    let step = i32::from(memshim_proto::exit::PYTHON_STEP.code);
    for state in ["not initialised", "finalized"] {
        if state == "finalized" {
            say(&mut child, "init", "up");
            say(&mut child, "fini", "finalized");
        }
        for verb in ["gc", "stats"] {
            let o = Cmd::new(memshim_tests::ctl(), [verb, pid.as_str()]).run();
            assert_eq!(o.code, step, "{state}, {verb}: {o:?}");
            assert!(o.stderr.contains("interpreter is not running"), "{o:?}");
        }
    }
    child.send("exit");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}
