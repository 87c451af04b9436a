//! Verbs on a CPython started without the preload (issue 46): `release`
//! (of one pid, and of several reached each its own way) and `gc` reach it
//! by ptrace, and `list` shows it, in each idle main-thread state, on every CPython
//! the tests run (`py::cpythons`: pyenv's 3.8-3.13, Debian sid's 3.13-3.15).
//! Each is served within a second, gives back what an in-process
//! `gc.collect(); malloc_trim(0)` gives back, and the process goes on as
//! before: its wait ends when it would have, its stdout, empty stderr and
//! exit status are unchanged. Refusals: a process under strace, another
//! user's process, `PYTHON_DISABLE_REMOTE_DEBUG`, a process that is no
//! CPython, a main thread that never idles (nothing is changed).
//!
//! What the other verbs read and draw of such a process:
//! `without_preload_figures.rs`. Fixture: tests/fixtures/py_unshimmed.py.

use memshim_proto::exit::{
    NO_PTRACE, NO_SAFE_POINT, NOT_CPYTHON, NOT_FOUND, REMOTE_DEBUG_DISABLED, TRACED,
};
use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl, mib, rss_bytes, wait_until};
use std::time::{Duration, Instant};

/// How long the fixture waits in its state.
const WAIT: f64 = 2.0;

/// The fixture, unshimmed, in `state`, once it printed "ready".
pub(super) fn start(py: &Cpython, state: &str) -> memshim_tests::Child {
    start_for(py, state, WAIT)
}

/// [`start`], waiting `seconds` in its state.
pub(super) fn start_for(py: &Cpython, state: &str, seconds: f64) -> memshim_tests::Child {
    let mut child = py
        .cmd([
            fixture_py("py_unshimmed.py").display().to_string(),
            state.to_string(),
            seconds.to_string(),
        ])
        .spawn();
    child.labelled(&format!(
        "CPython {}, unshimmed, main thread in {state}",
        py.label
    ));
    child.wait_for_line("ready", Duration::from_secs(60));
    child
}

/// The fixture sleeping `seconds` under `strace -o /dev/null` (already
/// traced: the `traced` refusal), ready.
pub(super) fn under_strace(py: &Cpython, seconds: f64) -> memshim_tests::Child {
    let mut traced = Cmd::new(
        "strace",
        [
            "-o".to_string(),
            "/dev/null".into(),
            py.exe.display().to_string(),
            fixture_py("py_unshimmed.py").display().to_string(),
            "sleep".into(),
            seconds.to_string(),
        ],
    )
    .spawn();
    traced.wait_for_line("ready", Duration::from_secs(60));
    traced
}

/// The pid of the CPython that [`under_strace`] runs (strace's child).
pub(super) fn traced_pid(traced: &memshim_tests::Child) -> i32 {
    wait_until(Duration::from_secs(10), || {
        let kids =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", traced.pid())).ok()?;
        kids.split_whitespace().next()?.parse::<i32>().ok()
    })
    .expect("strace's child")
}

/// The fixture's end, after a verb reached it in `state` with release's
/// gc: exit 5, empty stderr, no garbage left, and its wait as without
/// memshim: the line it is sent now (`read`), or `seconds` (a sleep,
/// select or epoll that ends when it would have). Returns the seconds it
/// waited.
pub(super) fn goes_on_unchanged(
    mut child: memshim_tests::Child,
    state: &str,
    seconds: f64,
    what: &str,
) -> f64 {
    if state == "read" {
        child.send("hello");
    }
    let o = child.finish(Duration::from_secs(30));
    assert_eq!(o.code, 5, "{what}: {o:?}");
    assert_eq!(o.stderr, "", "{what}: {o:?}");
    let elapsed: f64 = o
        .stdout
        .split("elapsed=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {o:?}"));
    let got = o.stdout.split("got=").nth(1).unwrap_or("").trim();
    // The garbage went with release's gc.collect().
    assert_eq!(garbage(&o.stdout), 0, "{what}: {o:?}");
    if state == "read" {
        assert_eq!(got, "hello", "{what}: {o:?}");
    } else {
        assert!(
            (seconds - 0.02..seconds + 0.15).contains(&elapsed),
            "{what}: waited {elapsed} s for {seconds} s"
        );
    }
    elapsed
}

/// Waits until the main thread sleeps in the kernel (in its wait).
pub(super) fn in_kernel_wait(pid: i32) {
    wait_until(Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat.rsplit(')').next()?.split_whitespace().next()?;
        (state == "S").then_some(())
    })
    .expect("the main thread sleeps in the kernel");
}

/// RSS after the fixture's own `gc.collect(); malloc_trim(0)`.
pub(super) fn in_process_rss(py: &Cpython) -> u64 {
    let o = py
        .cmd([
            fixture_py("py_unshimmed.py").display().to_string(),
            "inproc".into(),
            "0".into(),
        ])
        .run();
    assert_eq!(o.code, 5, "{o:?}");
    o.stdout
        .split("rss=")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no rss in {o:?}"))
}

/// What the fixture's last gc.collect() found.
pub(super) fn garbage(stdout: &str) -> u64 {
    stdout
        .split("garbage=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no garbage= in {stdout:?}"))
}

pub(super) fn ctl_json(args: &[&str]) -> (i32, serde_json::Value, String) {
    let o = Cmd::new(ctl(), args).run();
    let v = serde_json::from_str(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o.code, v, o.stderr)
}

/// memshim-ctl with `args`, run as uid 65534 (`setpriv`): another user's.
pub(super) fn ctl_as_nobody(args: &[&str]) -> memshim_tests::Output {
    let ctl = ctl().display().to_string();
    let mut a = vec![
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        ctl.as_str(),
    ];
    a.extend_from_slice(args);
    Cmd::new("setpriv", a).run()
}

#[test]
fn release_reaches_an_unshimmed_cpython_in_every_idle_state_and_it_goes_on_unchanged() {
    let mut report = Vec::new();
    for py in cpythons() {
        let inproc = in_process_rss(&py);
        for state in ["sleep", "select", "epoll", "read"] {
            let what = format!("CPython {}, main thread in {state}", py.label);
            let child = start(&py, state);
            let pid = child.pid();
            in_kernel_wait(pid);
            let t = Instant::now();
            let (code, v, err) = ctl_json(&["release", &pid.to_string(), "--json"]);
            let took = t.elapsed();
            assert_eq!(code, 0, "{what}: {v} {err}");
            assert!(took < Duration::from_secs(1), "{what}: took {took:?}");
            let r = &v["release"][0];
            assert_eq!(r["reached"]["by"], "ptrace", "{what}: {v}");
            let before = r["result"]["rss_before"].as_u64().unwrap_or(0);
            let after = r["result"]["rss_after"].as_u64().unwrap_or(u64::MAX);
            assert!(after < before / 4 * 3, "{what}: rss {before} -> {after}");
            // Close to what the process gives back by itself.
            assert!(
                after < inproc + inproc / 5 + (4 << 20),
                "{what}: rss after release {:.1} MiB, in-process {:.1} MiB",
                mib(after),
                mib(inproc)
            );
            // The figure is the process's RSS after (what it touches on
            // waking may add a page or two).
            let now = rss_bytes(pid);
            assert!(
                now.abs_diff(after) < 1 << 20,
                "{what}: rss {now}, reported {after}"
            );
            let elapsed = goes_on_unchanged(child, state, WAIT, &what);
            report.push(format!(
                "{what}: {took:?}, rss {:.1} -> {:.1} MiB (in-process {:.1} MiB), waited {elapsed} s",
                mib(before),
                mib(after),
                mib(inproc)
            ));
        }
    }
    eprintln!("{}", report.join("\n"));
}

/// A wait with a timeout that a stop interrupted (ours, SIGSTOP and
/// SIGCONT, a debugger's) goes on in the kernel as `restart_syscall`: a
/// sleep or a `poll` is still a safe point there, and the verbs reach it
/// again and again (from the second verb on, they said "system call 219",
/// exit 21).
#[test]
fn a_wait_resumed_after_a_stop_is_still_a_safe_point() {
    for (i, py) in cpythons().into_iter().enumerate() {
        // Sleeps on one CPython: the kernel's restart is the same for all.
        // libc's relative usleep is resumed by restart_syscall, whose
        // wchan names no sleep (on 6.18: do_syscall_64).
        let states: &[&str] = if i == 0 {
            &["poll", "sleep", "usleep"]
        } else {
            &["poll"]
        };
        for &state in states {
            let what = format!("CPython {}, main thread in {state}", py.label);
            let child = start_for(&py, state, 2.5);
            let pid = child.pid();
            let p = pid.to_string();
            in_kernel_wait(pid);
            // A stop and a continue, as from job control.
            for sig in ["-STOP", "-CONT"] {
                assert_eq!(Cmd::new("kill", [sig, p.as_str()]).run().code, 0);
            }
            in_kernel_wait(pid);
            for _ in 0..3 {
                let (code, v, err) = ctl_json(&["gc", &p, "--json"]);
                assert_eq!(code, 0, "{what}: {v} {err}");
            }
            goes_on_unchanged(child, state, 2.5, &what);
        }
    }
}

/// A socket wait with a receive timeout (`SO_RCVTIMEO`) answers EINTR to
/// the verb's interrupt where the kernel restarts other waits: the
/// program's own `recv`, called from C, failed with EINTR on every try,
/// even where the verb then said "nothing was changed" (no safe point).
/// It is a safe point now, restarted: the call ends as without memshim,
/// with EAGAIN at its timeout (counted again from the interrupt).
#[test]
fn a_socket_wait_with_a_receive_timeout_is_restarted_not_ended_by_eintr() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let child = start_for(&py, "rcvtimeo", 2.0);
    let pid = child.pid();
    in_kernel_wait(pid);
    let (code, v, err) = ctl_json(&["gc", &pid.to_string(), "--json"]);
    assert_eq!(code, 0, "{v} {err}");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
    let got = o.stdout.split("got=").nth(1).unwrap_or("").trim();
    assert_eq!(got, format!("errno={}", libc::EAGAIN), "{o:?}");
}

/// Another thread runs `execve` while a verb holds the main thread (which
/// waits for the GIL the other holds): the new program runs untouched, and
/// memshim-ctl says what happened, exit 3. It said "the called function
/// faulted" (exit 1), or, exec'ing the same CPython, waited for ever with
/// its ending signals held.
#[test]
fn a_process_that_runs_execve_while_held_runs_its_new_program_and_the_verb_says_so() {
    let py = cpythons().into_iter().next().expect("a CPython");
    // The main thread sleeps (a safe point) before the other takes the GIL
    // for 3 s, which it does not give up (a switch interval of 5 s).
    let src = "import os, sys, threading, time\n\
               sys.setswitchinterval(5)\n\
               def hog():\n\
               \x20   time.sleep(0.5)\n\
               \x20   end = time.monotonic() + 3\n\
               \x20   while time.monotonic() < end: pass\n\
               \x20   os.execv('/bin/sh', ['sh', '-c', 'echo execed; exit 9'])\n\
               threading.Thread(target=hog, daemon=True).start()\n\
               print('ready', flush=True)\n\
               time.sleep(30)\n";
    let mut child = py.cmd(["-c", src]).spawn();
    child.wait_for_line("ready", Duration::from_secs(60));
    let pid = child.pid();
    std::thread::sleep(Duration::from_millis(800));
    let o = Cmd::new(ctl(), ["gc", &pid.to_string()]).run();
    let end = child.finish(Duration::from_secs(30));
    assert_eq!(
        (end.code, end.stdout.as_str(), end.stderr.as_str()),
        (9, "execed\n", ""),
        "{end:?}"
    );
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("started another program"), "{o:?}");
}

/// A thread with a small stack of its own (16 KiB, `PTHREAD_STACK_MIN`)
/// blocked in `read` is not used as a safe point: the calls overflowed its
/// stack ("the called function faulted"), and a fault inside `attach`'s
/// `dlopen` left the loader's lock held, so the process hung at its next
/// `dlsym` (here, ctypes'). The verb says why it found none, and the
/// process goes on.
#[test]
fn a_thread_with_too_little_stack_is_not_a_safe_point() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let lib = memshim_tests::fixture("small_stack_lib", &["-shared", "-fPIC", "-pthread"]);
    // The main thread runs Python for 4 s (no safe point), then wakes the
    // native thread and ends.
    let src = format!(
        "import ctypes, os, sys, time\n\
         lib = ctypes.CDLL({lib:?})\n\
         w = lib.small_stack_start(16384)\n\
         print('ready', flush=True)\n\
         end = time.monotonic() + 4\n\
         while time.monotonic() < end: pass\n\
         os.write(w, b'hello')\n\
         time.sleep(0.2)\n\
         print('read', lib.small_stack_result(), flush=True)\n\
         sys.exit(42)\n",
        lib = lib.display().to_string()
    );
    let mut child = py.cmd(["-c", src.as_str()]).spawn();
    child.wait_for_line("ready", Duration::from_secs(60));
    let o = Cmd::new(ctl(), ["attach", &child.pid().to_string()]).run();
    let end = child.finish(Duration::from_secs(30));
    assert_eq!(
        (end.code, end.stdout.as_str(), end.stderr.as_str()),
        (42, "read 5\n", ""),
        "{end:?}"
    );
    assert_eq!(o.code, i32::from(NO_SAFE_POINT.code), "{o:?}");
    assert!(o.stderr.contains("of stack below it"), "{o:?}");
}

#[test]
fn gc_reaches_an_unshimmed_cpython_and_finds_its_cycles() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let child = start(&py, "sleep");
    let pid = child.pid();
    in_kernel_wait(pid);
    let o = Cmd::new(ctl(), ["gc", &pid.to_string()]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let found: u64 = o
        .stdout
        .split("found ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{o:?}"));
    // 150000 self-referencing objects and their dicts.
    assert!(found >= 150_000, "{o:?}");
    assert!(o.stdout.contains("reached by ptrace"), "{o:?}");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
}

#[test]
fn a_main_thread_that_never_idles_is_not_reached_and_nothing_changes() {
    let py = cpythons().into_iter().next().expect("a CPython");
    // It spins well past the verb's limit for a safe point
    // (SAFE_POINT_LIMIT, 2 s): one that ends its spin and exits within
    // the limit has exited, the case below.
    let child = start_for(&py, "spin", 3.0 * WAIT);
    let pid = child.pid();
    let (code, v, err) = ctl_json(&["gc", &pid.to_string(), "--json"]);
    assert_eq!(code, i32::from(NO_SAFE_POINT.code), "{v} {err}");
    assert_eq!(v["error"]["code"], "no_safe_point", "{v}");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
    // Nothing ran: the garbage is still there for the fixture's own collection.
    assert!(garbage(&o.stdout) >= 200_000, "{o:?}");
    // One that exits while the verb waits for a safe point (a zombie until
    // the test reaps it) has exited: exit 3, not "no safe point".
    let child = start_for(&py, "spin", 0.5);
    let (code, v, err) = ctl_json(&["gc", &child.pid().to_string(), "--json"]);
    assert_eq!(code, i32::from(NOT_FOUND.code), "{v} {err}");
    assert!(err.contains("exited"), "{err}");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!(o.code, 5, "{o:?}");
}

#[test]
fn refusals_have_their_own_code_and_leave_the_process_alone() {
    let py = cpythons().into_iter().next().expect("a CPython");
    // Under strace: already traced.
    let traced = under_strace(&py, WAIT);
    let pid = traced_pid(&traced);
    let (code, v, err) = ctl_json(&["release", &pid.to_string(), "--json"]);
    assert_eq!(code, i32::from(TRACED.code), "{v} {err}");
    let message = v["release"][0]["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("already traced"), "{v}");
    let o = traced.finish(Duration::from_secs(30));
    assert_eq!(o.code, 5, "{o:?}");
    assert!(o.stdout.contains("elapsed="), "{o:?}");

    // Another user's process, from uid 65534.
    let root_py = start(&py, "sleep");
    let pid = root_py.pid().to_string();
    let o = ctl_as_nobody(&["release", &pid]);
    assert_eq!(o.code, i32::from(NO_PTRACE.code), "{o:?}");
    assert!(o.stderr.contains("belongs to uid 0"), "{o:?}");
    // `attach` and `detach` refuse it the same way (they said "permission
    // denied", exit 5, on reading its maps).
    for verb in ["attach", "detach"] {
        let o = ctl_as_nobody(&[verb, &pid]);
        assert_eq!(o.code, i32::from(NO_PTRACE.code), "{verb}: {o:?}");
    }
    let o = root_py.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");

    // Its owner disabled remote debugging: respected.
    let mut off = py
        .cmd([
            fixture_py("py_unshimmed.py").display().to_string(),
            "sleep".into(),
            WAIT.to_string(),
        ])
        .env("PYTHON_DISABLE_REMOTE_DEBUG", "1")
        .spawn();
    off.wait_for_line("ready", Duration::from_secs(60));
    let (code, v, err) = ctl_json(&["gc", &off.pid().to_string(), "--json"]);
    assert_eq!(code, i32::from(REMOTE_DEBUG_DISABLED.code), "{v} {err}");
    let o = off.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
    assert!(garbage(&o.stdout) >= 200_000, "nothing ran: {o:?}");

    // Named like a CPython, but not one (a process with no such name and
    // no shim is "not loaded", as before: control::purge).
    let fake = memshim_tests::scratch().join("python3-not-cpython");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    let sleeper = Cmd::new(&fake, ["30"]).spawn();
    let pid = sleeper.pid().to_string();
    let (code, v, err) = ctl_json(&["release", &pid, "--json"]);
    assert_eq!(code, i32::from(NOT_CPYTHON.code), "{v} {err}");
    assert_eq!(v["release"][0]["error"]["code"], "not_cpython", "{v}");
    drop(sleeper);

    // A thread id given as a pid: refused by every verb, as for a shimmed
    // process (/proc/<tid> reads as its process, and the verbs went on as
    // if the thread were one, under its id and no command name).
    let src = "import sys, threading\n\
               t = threading.Thread(target=sys.stdin.readline)\n\
               t.start()\n\
               print('ready', threading.get_native_id(), t.native_id, flush=True)\n\
               t.join()\n";
    let mut two = py.cmd(["-c", src]).spawn();
    let line = two.wait_for_line("ready", Duration::from_secs(60));
    let tid = line.split_whitespace().nth(2).unwrap().to_string();
    let main = line.split_whitespace().nth(1).unwrap().to_string();
    for verb in ["stats", "gc", "release", "attach"] {
        let o = Cmd::new(ctl(), [verb, &tid]).run();
        assert_eq!(o.code, i32::from(NOT_FOUND.code), "{verb}: {o:?}");
        assert!(
            o.stderr.contains(&format!("a thread of process {main}")),
            "{verb}: {o:?}"
        );
    }
    two.send("");
    let o = two.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// The `not_preloaded` entry of `list --json` for `pid`.
fn listed(list: &serde_json::Value, pid: i32) -> Option<serde_json::Value> {
    list["not_preloaded"]
        .as_array()?
        .iter()
        .find(|e| e["pid"] == pid)
        .cloned()
}

#[test]
fn list_shows_unshimmed_cpythons_and_whether_they_can_be_reached() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let child = start_for(&py, "sleep", 10.0);
    let pid = child.pid();
    let traced = under_strace(&py, 10.0);
    let traced_pid = traced_pid(&traced);
    let sleeper = Cmd::new("sleep", ["30"]).spawn();

    let (code, v, err) = ctl_json(&["list", "--json"]);
    assert_eq!((code, err.as_str()), (0, ""), "{v}");
    // Shimmed processes only, as before; the others in a field of their own.
    for p in [pid, traced_pid, sleeper.pid()] {
        let shimmed = v["processes"].as_array().expect("processes");
        assert!(!shimmed.iter().any(|e| e["pid"] == p), "{p} in {v}");
    }
    let e = listed(&v, pid).unwrap_or_else(|| panic!("{pid} not in {v}"));
    assert_eq!(e["preload"], "not preloaded", "{e}");
    assert_eq!(e["reachable"], true, "{e}");
    assert_eq!(e["python"], py.minor.as_str(), "{e}");
    assert!(e["code"].is_null() && e["reason"].is_null(), "{e}");
    let e = listed(&v, traced_pid).unwrap_or_else(|| panic!("{traced_pid} not in {v}"));
    assert_eq!(e["reachable"], false, "{e}");
    assert_eq!(e["code"], TRACED.name, "{e}");
    assert!(
        e["reason"]
            .as_str()
            .unwrap_or("")
            .contains("already traced"),
        "{e}"
    );
    assert!(listed(&v, sleeper.pid()).is_none(), "not a CPython: {v}");

    let o = Cmd::new(ctl(), ["list"]).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let row = o
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{pid} ")))
        .unwrap_or_else(|| panic!("no row for {pid}: {}", o.stdout));
    assert!(
        row.contains(&format!(" {} ", py.minor)) && row.contains(" yes "),
        "{row}"
    );
    assert!(
        o.stdout.contains("\nnot preloaded (CPython"),
        "{}",
        o.stdout
    );
    let why = format!("  pid {traced_pid}: process {traced_pid} is already traced");
    assert!(o.stdout.contains(&why), "{}", o.stdout);
    assert!(
        o.stdout.contains(&format!("(exit {})", TRACED.code)),
        "{}",
        o.stdout
    );

    // Another user sees only its own: not root's CPython.
    let o = ctl_as_nobody(&["list", "--json"]);
    assert_eq!(o.code, 0, "{o:?}");
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("JSON");
    assert!(listed(&v, pid).is_none(), "{v}");

    // Listing touched nothing.
    drop(sleeper);
    let o = child.finish(Duration::from_secs(40));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
    assert!(garbage(&o.stdout) >= 200_000, "{o:?}");
    let o = traced.finish(Duration::from_secs(40));
    assert_eq!(o.code, 5, "{o:?}");
}

/// `release` of several pids: a CPython without the preload (by ptrace), a
/// shimmed one (over its socket) and a pid that does not exist. Each gets
/// its own answer, the unshimmed one its `reached`, and the exit status
/// says that some failed.
#[test]
fn release_of_several_pids_reaches_each_its_own_way() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let unshimmed = start_for(&py, "sleep", 3.0);
    let dir = socket_dir("release-mixed");
    let mut shimmed = shimmed_python(
        &py.exe,
        &fixture_py("py_unshimmed.py"),
        &["sleep", "3"],
        &dir,
    )
    .spawn();
    shimmed.wait_for_line("ready", Duration::from_secs(60));
    socket_of(&dir, shimmed.pid());
    in_kernel_wait(unshimmed.pid());
    let (a, b) = (unshimmed.pid().to_string(), shimmed.pid().to_string());
    let o = Cmd::new(ctl(), ["release", &a, &b, "999999", "--json"])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(o.code, i32::from(memshim_proto::exit::FAILED.code), "{o:?}");
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    let r = &v["release"];
    assert_eq!(r[0]["reached"]["by"], "ptrace", "{v}");
    assert!(
        r[0]["result"]["rss_before"].as_u64() > r[0]["result"]["rss_after"].as_u64(),
        "{v}"
    );
    assert!(
        r[1]["reached"].is_null() && r[1]["result"]["steps"].is_array(),
        "{v}"
    );
    assert_eq!(r[2]["error"]["code"], "not_found", "{v}");
    // Without --json: both blocks, and the line for the one reached by ptrace.
    let o = Cmd::new(ctl(), ["release", &a, &b])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains(&format!("pid {a} (")) && o.stdout.contains(&format!("pid {b} (")),
        "{o:?}"
    );
    assert!(
        o.stdout.contains(&format!("pid {a}: reached by ptrace")),
        "{o:?}"
    );
    for child in [unshimmed, shimmed] {
        let o = child.finish(Duration::from_secs(30));
        assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
    }
}
