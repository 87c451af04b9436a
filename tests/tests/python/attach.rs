//! `memshim-ctl attach` and `detach` (issue 46): the bridge loaded into a
//! CPython started without the preload, on every CPython the tests run.
//! Once attached, the verbs reach the process over its socket (no ptrace,
//! no "reached by" line); `release` gives back what an in-process
//! `gc.collect(); malloc_trim(0)` does; `--idle-return` returns the free
//! heap by itself after each unload; `detach` stops the thread and closes
//! the socket, and the verbs then reach it by ptrace again; `attach` again
//! loads a fresh copy. Throughout, the process goes on as before: its wait
//! ends when it would have, its stdout, empty stderr and exit status are
//! unchanged, a fork in it works. Two `attach` at once leave one bridge.
//! Refusals: a preloaded process, `detach` of a process never attached, a
//! process under strace. Fixtures: tests/fixtures/py_unshimmed.py,
//! tests/fixtures/py_attach.py.

use super::without_preload::{
    ctl_json, goes_on_unchanged, in_kernel_wait, in_process_rss, start_for, traced_pid,
    under_strace,
};
use memshim_proto::exit::{NO_SAFE_POINT, NOT_ATTACHED, NOT_FOUND, PRELOADED, TRACED};
use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl, mib, rss_bytes, wait_until};
use std::time::{Duration, Instant};

/// How long py_unshimmed.py waits in its state: long enough for every
/// step a test takes while it waits (attach, the verbs, detach, attach
/// again: about 2.5 s on a quiet 2-CPU machine), with room for a machine
/// running other tests. At 3 s, a loaded machine let the fixture finish
/// its wait and exit before the test had listed it.
const WAIT: f64 = 8.0;

fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

#[test]
fn attached_cpythons_are_served_over_their_socket_and_go_on_unchanged_after_detach() {
    let mut report = Vec::new();
    let states = ["sleep", "select", "epoll", "read"];
    for (i, py) in cpythons().into_iter().enumerate() {
        let state = states[i % states.len()];
        let what = format!("CPython {}, main thread in {state}", py.label);
        let inproc = in_process_rss(&py);
        let child = start_for(&py, state, WAIT);
        let pid = child.pid();
        let p = pid.to_string();
        in_kernel_wait(pid);
        let t = Instant::now();
        let (code, v, err) = ctl_json(&["attach", &p, "--json"]);
        let attach_took = t.elapsed();
        assert_eq!(code, 0, "{what}: {v} {err}");
        assert_eq!(v["loaded_now"], true, "{what}: {v}");
        assert_eq!(err, "", "{what}");
        // Over the socket: no "reached" line; the allocator is the process's.
        let (code, s, err) = ctl_json(&["stats", &p, "--json"]);
        assert_eq!(code, 0, "{what}: {s} {err}");
        assert!(s.get("reached").is_none(), "{what}: {s}");
        let version = s["config"]["jemalloc_version"].as_str().unwrap_or("");
        assert_eq!(version, "glibc malloc (attached bridge)", "{what}: {s}");
        assert!(
            s["allocator"]["allocated"].as_u64().unwrap_or(0) > 0,
            "{what}: {s}"
        );
        let t = Instant::now();
        let (code, r, err) = ctl_json(&["release", &p, "--json"]);
        let release_took = t.elapsed();
        assert_eq!(code, 0, "{what}: {r} {err}");
        assert!(r["release"][0].get("reached").is_none(), "{what}: {r}");
        assert!(
            release_took < Duration::from_secs(1),
            "{what}: {release_took:?}"
        );
        let after = r["release"][0]["result"]["rss_after"]
            .as_u64()
            .unwrap_or(u64::MAX);
        assert!(
            after < inproc + inproc / 5 + (4 << 20),
            "{what}: rss after release {:.1} MiB, in-process {:.1} MiB",
            mib(after),
            mib(inproc)
        );
        // Listed as attached.
        let (code, l, err) = ctl_json(&["list", "--json"]);
        assert_eq!(code, 0, "{what}: {err}");
        let row = l["processes"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["pid"] == pid));
        assert!(
            row.is_some_and(|e| e["attached"] == true && e["endpoint"] == true),
            "{what}: {l}"
        );
        let doctor = |code: &str| {
            let (_, d, err) = ctl_json(&["doctor", &p, "--json"]);
            let codes: Vec<_> = d["findings"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["code"].as_str())
                .collect();
            assert!(codes.contains(&code), "{what}: {d} {err}");
            assert!(!codes.contains(&"not_interposed"), "{what}: {d}");
        };
        doctor("attached");
        // Native heap profiles need the preload: said so.
        let o = Cmd::new(ctl(), ["profile", &p]).run();
        assert_ne!(o.code, 0, "{what}: {o:?}");
        assert!(o.stderr.contains("LD_PRELOAD"), "{what}: {o:?}");
        // The bridge's thread and its spawner, then none.
        assert!(threads(pid) > 1, "{what}");
        let detach = |what: &str| {
            let (code, d, err) = ctl_json(&["detach", &p, "--json"]);
            assert_eq!(code, 0, "{what}: {d} {err}");
            wait_until(Duration::from_secs(5), || (threads(pid) == 1).then_some(()))
                .unwrap_or_else(|| panic!("{what}: {} threads after detach", threads(pid)));
        };
        detach(&what);
        doctor("detached");
        // Detached: the verbs reach it by ptrace again.
        let (code, s, err) = ctl_json(&["stats", &p, "--json"]);
        assert_eq!(code, 0, "{what}: {s} {err}");
        assert_eq!(s["reached"]["by"], "ptrace", "{what}: {s}");
        // Attached again: a fresh copy (the first file stays mapped, idle).
        let (code, v, err) = ctl_json(&["attach", &p, "--json"]);
        assert_eq!(code, 0, "{what}: {v} {err}");
        assert!(
            v["library"]
                .as_str()
                .is_some_and(|l| l.starts_with("a copy of")),
            "{what}: {v}"
        );
        let (code, s, err) = ctl_json(&["stats", &p, "--json"]);
        assert_eq!(code, 0, "{what}: {s} {err}");
        assert!(s.get("reached").is_none(), "{what}: {s}");
        detach(&what);
        goes_on_unchanged(child, state, WAIT, &what);
        report.push(format!(
            "{what}: attach {attach_took:?}, release {release_took:?} to {:.1} MiB (in-process {:.1} MiB)",
            mib(after),
            mib(inproc)
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// py_attach.py under `py`, as the process runs it (`-c`, so that another
/// uid needs no right to the checkout), once it printed "ready".
fn attach_fixture(cmd: Cmd) -> (memshim_tests::Child, u64) {
    let mut child = cmd.spawn();
    let line = child.wait_for_line("ready", Duration::from_secs(60));
    let rss = line
        .split("rss=")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    (child, rss)
}

fn source() -> String {
    std::fs::read_to_string(fixture_py("py_attach.py")).unwrap()
}

/// Loads and unloads twice; returns the RSS two seconds after each unload.
fn cycles(child: &mut memshim_tests::Child, ready: u64, idle_return: bool, what: &str) -> Vec<u64> {
    let pid = child.pid();
    let mut out = vec![];
    for _ in 0..2 {
        child.send("load");
        child.wait_for_line("loaded", Duration::from_secs(30));
        child.send("unload");
        child.wait_for_line("unloaded", Duration::from_secs(30));
        if idle_return {
            // With no command: back near where it started.
            wait_until(Duration::from_secs(5), || {
                (rss_bytes(pid) < ready + (24 << 20)).then_some(())
            })
            .unwrap_or_else(|| {
                panic!(
                    "{what}: rss {:.1} MiB 5 s after unload, {:.1} MiB at start",
                    mib(rss_bytes(pid)),
                    mib(ready)
                )
            });
        } else {
            std::thread::sleep(Duration::from_secs(2));
        }
        out.push(rss_bytes(pid));
    }
    out
}

#[test]
fn attach_idle_return_gives_the_heap_back_after_each_unload_with_no_command() {
    let all = cpythons();
    let oldest = all.first().expect("a CPython").clone();
    let newest = all.last().expect("a CPython").clone();
    // Without memshim, glibc keeps the unloaded heap: what the test
    // would see if the idle return did nothing.
    let (mut plain, ready) = attach_fixture(oldest.cmd(["-c", &source()]));
    let kept = cycles(&mut plain, ready, false, "without memshim");
    assert!(
        kept.iter().all(|&r| r > ready + (60 << 20)),
        "without memshim glibc kept {kept:?} (start {ready})"
    );
    plain.send("quit");
    let o = plain.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (7, ""), "{o:?}");

    for py in [oldest, newest] {
        let what = format!("CPython {}", py.label);
        let (mut child, ready) = attach_fixture(py.cmd(["-c", &source()]));
        let pid = child.pid();
        in_kernel_wait(pid);
        let (code, v, err) = ctl_json(&["attach", &pid.to_string(), "--idle-return=300", "--json"]);
        assert_eq!(code, 0, "{what}: {v} {err}");
        assert_eq!(v["idle_return_ms"], 300, "{what}: {v}");
        let after = cycles(&mut child, ready, true, &what);
        // A fork of the attached process.
        child.send("fork");
        child.wait_for_line("child pid=", Duration::from_secs(30));
        child.wait_for_line("forked status=0", Duration::from_secs(30));
        let (code, d, err) = ctl_json(&["detach", &pid.to_string(), "--json"]);
        assert_eq!(code, 0, "{what}: {d} {err}");
        assert!(d["idle_returns"].as_u64().unwrap_or(0) >= 2, "{what}: {d}");
        child.send("quit");
        let o = child.finish(Duration::from_secs(30));
        assert_eq!((o.code, o.stderr.as_str()), (7, ""), "{what}: {o:?}");
        eprintln!(
            "{what}: start {:.1} MiB; after each unload {:?} MiB with the idle return, {:?} MiB without",
            mib(ready),
            after.iter().map(|&r| mib(r).round()).collect::<Vec<_>>(),
            kept.iter().map(|&r| mib(r).round()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn another_users_cpython_is_attached_and_served() {
    // Debian's own python3 (not PIE), as uid 65534.
    let (mut child, ready) = attach_fixture(Cmd::new(
        "setpriv",
        [
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &source(),
        ],
    ));
    let pid = child.pid();
    in_kernel_wait(pid);
    let (code, v, err) = ctl_json(&["attach", &pid.to_string(), "--idle-return=300", "--json"]);
    assert_eq!(code, 0, "{v} {err}");
    let after = cycles(&mut child, ready, true, "uid 65534");
    let (code, s, err) = ctl_json(&["gc", &pid.to_string(), "--json"]);
    assert_eq!(code, 0, "{s} {err}");
    assert!(s.get("reached").is_none(), "{s}");
    // Nothing of ours is left in its /tmp: no copy made for this process
    // (`memshim-bridge-<ctl pid>-<pid>-<time>`; other tests attach to
    // theirs meanwhile).
    let tmp = std::fs::read_dir(format!("/proc/{pid}/root/tmp")).unwrap();
    let left: Vec<_> = tmp
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.starts_with("memshim-bridge-") && n.split('-').nth(3) == Some(&pid.to_string())
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
    child.send("quit");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (7, ""), "{o:?}");
    eprintln!("uid 65534: after each unload {after:?}, start {ready}");
}

#[test]
fn attach_refuses_a_preloaded_process_and_detach_one_never_attached() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let dir = memshim_tests::scratch();
    let mut shimmed = py
        .shimmed_c(
            "import sys; print('ready', flush=True); sys.stdin.readline()",
            &dir,
        )
        .spawn();
    shimmed.wait_for_line("ready", Duration::from_secs(60));
    let p = shimmed.pid().to_string();
    for verb in ["attach", "detach"] {
        let o = Cmd::new(ctl(), [verb, &p]).run();
        assert_eq!(o.code, i32::from(PRELOADED.code), "{verb}: {o:?}");
        assert!(o.stderr.contains("preloaded"), "{verb}: {o:?}");
    }
    shimmed.send("");
    let o = shimmed.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");

    let child = start_for(&py, "sleep", WAIT);
    let pid = child.pid();
    let o = Cmd::new(ctl(), ["detach", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("never attached"), "{o:?}");
    // Stopped (SIGSTOP): refused at once, and nothing is loaded (the
    // bridge's thread would have waited, stopped, for a SIGCONT, and
    // `attach` failed after 5 s with the bridge left behind).
    in_kernel_wait(pid);
    // SAFETY: signals to the fixture this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_until(Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.starts_with('T').then_some(())
    })
    .expect("stopped");
    let t = Instant::now();
    let o = Cmd::new(ctl(), ["attach", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(NO_SAFE_POINT.code), "{o:?}");
    assert!(o.stderr.contains("the process is stopped"), "{o:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    assert!(!maps.contains("libmemshim_bridge"), "loaded anyway");
    assert_eq!(threads(pid), 1);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
}

#[test]
fn two_attaches_at_once_leave_one_bridge_and_a_traced_process_is_refused() {
    let py = cpythons().into_iter().next().expect("a CPython");
    // Twice: from where the library lies, then (after a detach) from
    // copies, where two loads would be two bridges.
    let (mut child, _) = attach_fixture(py.cmd(["-c", &source()]));
    let pid = child.pid();
    let p = pid.to_string();
    in_kernel_wait(pid);
    for round in ["first", "after a detach"] {
        let two: Vec<_> = (0..2)
            .map(|_| Cmd::new(ctl(), ["attach", &p]).spawn())
            .collect();
        let codes: Vec<i32> = two
            .into_iter()
            .map(|c| c.finish(Duration::from_secs(30)).code)
            .collect();
        assert!(codes.contains(&0), "{round}: {codes:?}");
        assert!(
            codes.iter().all(|&c| c == 0 || c == i32::from(TRACED.code)),
            "{round}: {codes:?}"
        );
        // One serving bridge: its thread and its spawner.
        child.send("threads");
        let line = child.wait_for_line("threads n=", Duration::from_secs(30));
        assert_eq!(line.trim(), "threads n=3", "{round}");
        let (code, d, err) = ctl_json(&["detach", &p, "--json"]);
        assert_eq!(code, 0, "{round}: {d} {err}");
    }
    child.send("quit");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (7, ""), "{o:?}");

    // Under strace: refused, and nothing changed.
    let traced = under_strace(&py, WAIT);
    let pid = traced_pid(&traced);
    let o = Cmd::new(ctl(), ["attach", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(TRACED.code), "{o:?}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    assert!(!maps.contains("libmemshim_bridge"), "loaded anyway");
    let o = traced.finish(Duration::from_secs(30));
    assert_eq!(o.code, 5, "{o:?}");
}

/// A fork of an attached CPython, on every CPython the tests run: the
/// parent's `os.fork()` prints nothing (CPython 3.13.0 counted the threads
/// after its `after_in_parent` hooks, where the bridge's thread used to
/// start again: "This process is multi-threaded" on stderr), the bridge
/// serves the parent again after it, and a child it forked (which has no
/// bridge: the thread is not copied) is attached with a fresh one (the copy
/// it inherited said it served, and the new one stayed idle).
#[test]
fn a_fork_of_an_attached_cpython_is_silent_and_its_child_can_be_attached() {
    let threads_now = |child: &mut memshim_tests::Child| {
        child.send("threads");
        child
            .wait_for_line("threads n=", Duration::from_secs(30))
            .trim()
            .to_string()
    };
    for py in cpythons() {
        let what = format!("CPython {}", py.label);
        let (mut child, _) = attach_fixture(py.cmd(["-c", &source()]));
        let pid = child.pid();
        let p = pid.to_string();
        in_kernel_wait(pid);
        let (code, v, err) = ctl_json(&["attach", &p, "--json"]);
        assert_eq!(code, 0, "{what}: {v} {err}");
        let attached = threads_now(&mut child);
        // Twice: with the bridge's hook the last one registered, then with
        // a Python hook after it (3.13.0 runs the pending call inside that
        // hook, before its count, unless the call waits for the frame that
        // forked).
        for round in ["", "hook"] {
            if !round.is_empty() {
                child.send(round);
                child.wait_for_line("hooked", Duration::from_secs(30));
            }
            child.send("fork");
            child.wait_for_line("forked status=0", Duration::from_secs(30));
            // The bridge's threads are back.
            let back = wait_until(Duration::from_secs(5), || {
                let n = threads_now(&mut child);
                (n == attached).then_some(n)
            });
            assert!(
                back.is_some(),
                "{what} {round}: not {attached} after the fork"
            );
        }
        // It answers over its socket.
        let (code, s, err) = ctl_json(&["stats", &p, "--json"]);
        assert_eq!(code, 0, "{what}: {s} {err}");
        assert!(s.get("reached").is_none(), "{what}: {s}");
        // A child forked after the attach, attached in its turn.
        child.send("spawn");
        let line = child.wait_for_line("spawned pid=", Duration::from_secs(30));
        let forked: i32 = line
            .trim()
            .strip_prefix("spawned pid=")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: {line}"));
        // Killed if an assertion fails before the reap below: it holds
        // the fixture's pipes and would sleep for a minute.
        let grandchild = KillOnDrop(forked);
        in_kernel_wait(forked);
        let (code, v, err) = ctl_json(&["attach", &forked.to_string(), "--json"]);
        assert_eq!(code, 0, "{what}: the fork child: {v} {err}");
        let (code, s, err) = ctl_json(&["stats", &forked.to_string(), "--json"]);
        assert_eq!(code, 0, "{what}: the fork child: {s} {err}");
        assert!(s.get("reached").is_none(), "{what}: the fork child: {s}");
        let (code, d, err) = ctl_json(&["detach", &forked.to_string(), "--json"]);
        assert_eq!(code, 0, "{what}: the fork child: {d} {err}");
        // SAFETY: a signal to the child this test's fixture forked.
        assert_eq!(unsafe { libc::kill(forked, libc::SIGTERM) }, 0);
        child.send("reap");
        child.wait_for_line(
            &format!("reaped status={}", libc::SIGTERM),
            Duration::from_secs(30),
        );
        // Reaped: its pid may be another process's now.
        std::mem::forget(grandchild);
        child.send("quit");
        let o = child.finish(Duration::from_secs(30));
        assert_eq!((o.code, o.stderr.as_str()), (7, ""), "{what}: {o:?}");
    }
}

/// A CPython whose root has no /proc mounted (a chroot without it) is not
/// attached: the bridge names its socket by what /proc says, and it served
/// where no verb looked, for the process's life, and could not be
/// detached. It is refused (exit 22) with nothing loaded, and the verbs
/// still reach it by ptrace.
#[test]
fn a_cpython_without_proc_is_not_attached_and_the_verbs_still_reach_it() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let run = format!(
        "umount -l /proc && exec '{}' -c 'import time; print(\"ready\", flush=True); time.sleep(60)'",
        py.exe.display()
    );
    let mut child = in_own_mount_namespace(&run);
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid();
    in_kernel_wait(pid);
    let (code, v, err) = ctl_json(&["attach", &pid.to_string(), "--json"]);
    assert_eq!(code, i32::from(NOT_ATTACHED.code), "{v} {err}");
    assert!(err.contains("no /proc"), "{err}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libmemshim_bridge"), "{maps}");
    let (code, v, err) = ctl_json(&["stats", &pid.to_string(), "--json"]);
    assert_eq!(code, 0, "{v} {err}");
    assert_eq!(v["reached"]["by"], "ptrace", "{v}");
}

/// SIGKILL to a process this test forked, when dropped.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: a signal to a child of this test's fixture, not yet reaped.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// A CPython whose `malloc` is a preloaded jemalloc or tcmalloc (Debian's,
/// not memshim): attached, `stats` names that allocator, and `release`
/// gives the unloaded heap back with its own call (jemalloc's arena purge,
/// tcmalloc's `MallocExtension_ReleaseFreeMemory`), which neither returns
/// by itself in the time.
#[test]
fn an_attached_process_with_a_preloaded_jemalloc_or_tcmalloc_is_released_with_its_own_call() {
    let py = cpythons()
        .into_iter()
        .find(|p| p.origin() == "pyenv")
        .expect("a pyenv CPython");
    for (name, lib) in [
        ("jemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
        (
            "tcmalloc",
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        ),
    ] {
        assert!(
            std::path::Path::new(lib).exists(),
            "{lib} is missing (make test-deps installs it)"
        );
        let what = format!("CPython {} with {name} preloaded", py.label);
        let (mut child, _) = attach_fixture(py.cmd(["-c", &source()]).env("LD_PRELOAD", lib));
        let pid = child.pid();
        child.send("load");
        child.wait_for_line("loaded", Duration::from_secs(30));
        child.send("unload");
        child.wait_for_line("unloaded", Duration::from_secs(30));
        in_kernel_wait(pid);
        let unloaded = rss_bytes(pid);
        // Before the attach, by ptrace: glibc's malloc_trim would give
        // back nothing of this heap, and the purge says so (it said
        // "done", 0 bytes released).
        let (code, r, err) = ctl_json(&["release", &pid.to_string(), "--json"]);
        assert_eq!(code, 0, "{what}: {r} {err}");
        let purge = r["release"][0]["result"]["steps"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["step"] == "purge").cloned())
            .unwrap_or_else(|| panic!("{what}: {r}"));
        assert_eq!(purge["outcome"], "nothing_to_do", "{what}: {r}");
        in_kernel_wait(pid);
        let (code, v, err) = ctl_json(&["attach", &pid.to_string(), "--json"]);
        assert_eq!(code, 0, "{what}: {v} {err}");
        let s = Cmd::new(ctl(), ["stats", &pid.to_string()]).run();
        assert_eq!(s.code, 0, "{what}: {s:?}");
        assert!(
            s.stdout.contains(&format!("allocator ({name}, preloaded")),
            "{what}: {}",
            s.stdout
        );
        let (code, r, err) = ctl_json(&["release", &pid.to_string(), "--json"]);
        assert_eq!(code, 0, "{what}: {r} {err}");
        let released = rss_bytes(pid);
        eprintln!(
            "{what}: {:.1} MiB after unload, {:.1} MiB after release",
            mib(unloaded),
            mib(released)
        );
        assert!(
            released + (60 << 20) < unloaded,
            "{what}: release left {:.1} MiB of {:.1} MiB",
            mib(released),
            mib(unloaded)
        );
        child.send("quit");
        let o = child.finish(Duration::from_secs(30));
        assert_eq!((o.code, o.stderr.as_str()), (7, ""), "{what}: {o:?}");
    }
}

/// A CPython whose only thread runs a pure-Python loop has no thread at a
/// safe point: on 3.14 and 3.15 `attach` loads the bridge through the
/// interpreter's remote debugging (PEP 768), and the verbs then reach it
/// over its socket; the loop goes on and ends as it would. On 3.13 the
/// answer stays 21 (no safe point), and with `PYTHON_DISABLE_REMOTE_DEBUG`
/// 17, nothing changed.
#[test]
fn a_busy_cpython_314_or_newer_is_attached_through_remote_debugging() {
    let stop = memshim_tests::scratch().join(format!("busy-stop-{}", std::process::id()));
    let busy = |py: &Cpython, env: Option<(&str, &str)>| {
        let _ = std::fs::remove_file(&stop);
        let mut cmd = py.cmd([
            fixture_py("py_busy.py").display().to_string(),
            stop.display().to_string(),
        ]);
        if let Some((k, v)) = env {
            cmd = cmd.env(k, v);
        }
        let mut child = cmd.spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        child
    };
    let end = |child: memshim_tests::Child, imported: bool, what: &str| {
        std::fs::write(&stop, "").unwrap();
        let o = child.finish(Duration::from_secs(60));
        assert_eq!(
            (o.code, o.stderr.as_str(), o.stdout.trim()),
            (
                0,
                "",
                format!("done ctypes={}", if imported { "True" } else { "False" }).as_str()
            ),
            "{what}: {o:?}"
        );
    };
    let newest = sid_cpythons(&["3.14", "3.15"]);
    for py in &newest {
        let what = format!("CPython {}", py.label);
        let child = busy(py, None);
        let pid = child.pid().to_string();
        let t0 = Instant::now();
        let (code, v, err) = ctl_json(&["attach", &pid, "--json"]);
        assert_eq!(code, 0, "{what}: {v} {err}");
        assert_eq!(v["road"], "remote debugging (PEP 768)", "{what}: {v}");
        eprintln!("{what}: attached through PEP 768 in {:?}", t0.elapsed());
        let o = Cmd::new(ctl(), ["release", &pid]).run();
        assert_eq!(o.code, 0, "{what}: {o:?}");
        assert!(!o.stdout.contains("reached by ptrace"), "{what}: {o:?}");
        let (code, d, err) = ctl_json(&["detach", &pid, "--json"]);
        assert_eq!(code, 0, "{what}: {d} {err}");
        end(child, true, &what);

        // Remote debugging switched off: refused, nothing changed.
        let child = busy(py, Some(("PYTHON_DISABLE_REMOTE_DEBUG", "1")));
        let o = Cmd::new(ctl(), ["attach", &child.pid().to_string()]).run();
        assert_eq!(o.code, 17, "{what}: {o:?}");
        end(child, false, &what);
    }
    // Before 3.14: no road to a process with no safe point.
    if let Some(py) = cpythons().into_iter().find(|p| p.minor == "3.13") {
        let what = format!("CPython {}", py.label);
        let child = busy(&py, None);
        let o = Cmd::new(
            ctl(),
            ["attach", &child.pid().to_string(), "--timeout", "1"],
        )
        .run();
        assert_eq!(o.code, 21, "{what}: {o:?}");
        end(child, false, &what);
    }
    let _ = std::fs::remove_file(&stop);
}

/// A CPython in a root of its own whose `/tmp` is a symbolic link to a
/// directory of the host: where the bridge's file is not in its root,
/// `attach` places a copy in its `/tmp`, and memshim-ctl would follow that
/// link from its own root (root's, writing where the process's user
/// chose). It is refused (exit 22), and nothing is written there.
#[test]
fn attach_never_follows_a_link_in_place_of_the_processs_tmp() {
    if !memshim_tests::control::default_dir().ends_with("memshim-0") {
        eprintln!("SKIP: needs root for chroot");
        return;
    }
    let tag = format!("{}", std::process::id());
    let root = memshim_tests::scratch().join(format!("tmp-link-root-{tag}"));
    let victim = memshim_tests::scratch().join(format!("tmp-link-victim-{tag}"));
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&victim);
    std::fs::create_dir_all(&victim).unwrap();
    for d in ["usr", "proc", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(to, root.join(link)).unwrap();
    }
    std::os::unix::fs::symlink(&victim, root.join("tmp")).unwrap();
    let r = root.display();
    let run = format!(
        "mount --rbind /usr {r}/usr && mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev && \
         exec chroot {r} /usr/bin/python3 -c 'import time; print(\"ready\", flush=True); time.sleep(60)'"
    );
    let mut child = in_own_mount_namespace(&run);
    let _kill = KillOnDrop(child.pid());
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid();
    in_kernel_wait(pid);
    // An entry made and removed again changes the directory's mtime.
    let mtime = || std::fs::metadata(&victim).unwrap().modified().unwrap();
    let before = mtime();
    std::thread::sleep(Duration::from_millis(20));
    let (code, v, err) = ctl_json(&["attach", &pid.to_string(), "--json"]);
    assert_eq!(code, i32::from(NOT_ATTACHED.code), "{v} {err}");
    assert!(err.contains("/tmp"), "{err}");
    assert_eq!(mtime(), before, "memshim-ctl wrote in the host's directory");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libmemshim_bridge"), "{maps}");
    drop(_kill);
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&victim);
}

/// Tracing that `profile --python --keep` started through the bridge stops
/// at `detach`: with the bridge's thread gone nothing stopped it at its
/// deadline, and the program traced every allocation for its life.
#[test]
fn detach_stops_the_tracing_the_bridge_started() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let code = "import sys, tracemalloc\n\
                print('ready', flush=True)\n\
                for _ in sys.stdin: print('tracing', tracemalloc.is_tracing(), flush=True)\n";
    let mut child = Cmd::new(&py.exe, ["-c", code]).spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid();
    in_kernel_wait(pid);
    let p = pid.to_string();
    let o = Cmd::new(ctl(), ["attach", &p]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let o = Cmd::new(
        ctl(),
        ["profile", &p, "--python", "--keep", "--seconds", "0"],
    )
    .run();
    assert_eq!(o.code, 0, "{o:?}");
    child.send("");
    assert_eq!(
        child.wait_for_line("tracing", Duration::from_secs(10)),
        "tracing True"
    );
    let o = Cmd::new(ctl(), ["detach", &p]).run();
    assert_eq!(o.code, 0, "{o:?}");
    // The thread has gone once the process has its own thread only.
    wait_until(Duration::from_secs(10), || {
        (threads(pid) == 1).then_some(())
    })
    .expect("the bridge's threads stop");
    child.send("");
    assert_eq!(
        child.wait_for_line("tracing", Duration::from_secs(10)),
        "tracing False"
    );
    drop(child);
}

/// `attach` into a process whose `/tmp` is mounted `noexec` (its own mount
/// namespace, so the copy goes there): refused before anything is placed.
/// It was refused by the process's `dlopen`, which left part of the copy
/// mapped, so each try held the file (3.9 MB of the cargo build's) in that
/// tmpfs for the process's life, though the answer said nothing changed.
#[test]
fn attach_refuses_a_noexec_tmp_before_placing_anything() {
    if !memshim_tests::control::default_dir().ends_with("memshim-0") {
        eprintln!("SKIP: needs root for a mount namespace");
        return;
    }
    let py = cpythons().into_iter().next().expect("a CPython");
    let run = format!(
        "mount -t tmpfs -o noexec memshim-test /tmp && exec {} -c 'import time; print(\"ready\", flush=True); time.sleep(60)'",
        py.exe.display()
    );
    let mut child = in_own_mount_namespace(&run);
    let _kill = KillOnDrop(child.pid());
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid();
    in_kernel_wait(pid);
    // memshim-ctl and its bridge where the process cannot see them (its
    // /tmp is a tmpfs of its own): the bridge goes in as a copy.
    let ctl = ctl();
    let dir = memshim_tests::socket_dir_path("noexec");
    let [ctl, _bridge]: [String; 2] = memshim_tests::reachable_by_any_uid(
        &dir,
        &[ctl.clone(), ctl.with_file_name("libmemshim_bridge.so")],
    )
    .try_into()
    .unwrap();
    let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let before = maps().lines().count();
    for _ in 0..2 {
        let o = Cmd::new(&ctl, ["attach", &pid.to_string()]).run();
        assert_eq!(o.code, i32::from(NOT_ATTACHED.code), "{o:?}");
        assert!(o.stderr.contains("noexec"), "{o:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let after = maps();
    assert!(!after.contains("libmemshim_bridge"), "{after}");
    assert_eq!(after.lines().count(), before, "{after}");
    let tmp = std::fs::read_dir(format!("/proc/{pid}/root/tmp"))
        .unwrap()
        .count();
    assert_eq!(tmp, 0, "left in its /tmp");
}

/// memshim-ctl `attach` run with default dispositions for Ctrl-C and
/// SIGTERM (a test harness may ignore them), `sig` sent once `now` says so
/// (asked every 20 ms): how it ended, its stderr and how long it took from
/// the signal on.
fn attach_signalled(
    pid: i32,
    extra: &[&str],
    sig: i32,
    now: impl Fn() -> bool,
) -> (Option<i32>, String, Duration) {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let mut c = std::process::Command::new(ctl());
    c.arg("attach").args(extra).arg(pid.to_string());
    c.stdout(std::process::Stdio::null());
    c.stderr(std::process::Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    let _ = wait_until(Duration::from_secs(30), || now().then_some(()));
    let t = Instant::now();
    // SAFETY: a signal to the memshim-ctl this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    let status = child.wait().unwrap();
    let took = t.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.signal(), err, took)
}

/// Ctrl-C while `attach` only looks for a safe point (nothing traced or
/// changed yet) ends it at once; it was held until its `--timeout` ran
/// out.
#[test]
fn ctrl_c_ends_attach_at_once_while_it_looks_for_a_safe_point() {
    let py = cpythons().into_iter().next().expect("a CPython");
    // A pure-Python loop: no thread ever at a safe point.
    let spin = "import time\nprint('ready', flush=True)\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass\n";
    let mut child = py.cmd(["-c", spin]).spawn();
    child.wait_for_line("ready", Duration::from_secs(60));
    let t0 = Instant::now();
    let (sig, err, took) =
        attach_signalled(child.pid(), &["--timeout", "20"], libc::SIGINT, || {
            t0.elapsed() >= Duration::from_millis(500)
        });
    drop(child);
    assert_eq!(sig, Some(libc::SIGINT), "{err}");
    assert!(
        took < Duration::from_secs(10),
        "ended {took:?} after Ctrl-C"
    );
}

/// `detach` of a zombie says that it has exited, as `attach` and the verbs
/// do (it said "memshim was never attached to this process").
#[test]
fn detach_of_a_zombie_says_it_has_exited() {
    let mut z = std::process::Command::new("true").spawn().unwrap();
    let pid = z.id() as i32;
    let zombie = wait_until(Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.starts_with('Z').then_some(())
    });
    let o = Cmd::new(ctl(), ["detach", &pid.to_string()]).run();
    let _ = z.wait();
    assert!(zombie.is_some(), "no zombie");
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("has exited"), "{o:?}");
}

/// `sh -c script` in a mount namespace of its own (`unshare -m`, private
/// propagation), where `script` mounts what the test needs and then execs
/// the process under test (the pid stays).
fn in_own_mount_namespace(script: &str) -> memshim_tests::Child {
    Cmd::new(
        "unshare",
        ["-m", "--propagation", "private", "sh", "-c", script],
    )
    .spawn()
}
