//! The thread rule (shim/src/thread/): a single-threaded process stays
//! single-threaded; the shim's `memshim` thread appears with the process's
//! own second thread and leaves once the process is alone again.

use super::forks::OTHERS;
use memshim_tests::{Child, Cmd, pyenv_pythons, python, thread_names, threads, wait_until};
use std::time::{Duration, Instant};

pub(super) const T: Duration = Duration::from_secs(10);

pub(super) fn has_memshim(pid: i32) -> bool {
    thread_names(pid).iter().any(|n| n == "memshim")
}

pub(super) fn thread_rule(envs: &[(&str, &str)]) -> Child {
    let mut c = Cmd::new(memshim_tests::fixture("thread_rule", &[]), [""; 0]).shimmed();
    for (k, v) in envs {
        c = c.env(k, v);
    }
    let mut ch = c.spawn();
    ch.wait_for_line("ready", T);
    ch
}

pub(super) fn ask(ch: &mut Child, cmd: &str, reply: &str) -> String {
    ch.send(cmd);
    ch.wait_for_line(reply, T)
}

/// The thread_rule fixture once it has a second thread, and the shim's
/// thread with it; and its pid.
pub(super) fn with_a_second_thread() -> (Child, i32) {
    let mut ch = thread_rule(&[]);
    let pid = ch.pid();
    ask(&mut ch, "spawn", "spawned");
    assert!(
        wait_until(T, || has_memshim(pid).then_some(())).is_some(),
        "no memshim thread with a second thread: {:?}",
        thread_names(pid)
    );
    (ch, pid)
}

/// Closes the fixture's stdin: it must exit 0 with nothing on stderr.
pub(super) fn ends_cleanly(ch: Child) {
    let o = ch.finish(T);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

#[test]
fn single_threaded_python_has_one_thread_even_after_many_imports() {
    let script = r#"
import os
print(len(os.listdir("/proc/self/task")))
import json, sqlite3, ssl, asyncio, decimal, email.parser, http.client, xml.etree.ElementTree
import ctypes, hashlib, logging, subprocess, unittest, concurrent.futures, multiprocessing, zlib
import collections, re, datetime, tempfile, pickle, csv, argparse, socket, selectors, uuid
sum(len(json.dumps(list(range(i)))) for i in range(2000))
print(len(os.listdir("/proc/self/task")))
"#;
    let o = Cmd::new(python(), ["-c", script]).shimmed().run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, "1\n1\n", ""),
        "{o:?}"
    );
    // Live: the same count sees the shim's threads when they are forced on:
    // its thread, and in a Python process its spawner (os/spawner.rs). The
    // thread starts the spawner itself, which on a loaded machine can come
    // after Python's first listing.
    let o = Cmd::new(python(), ["-c", script])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .run();
    assert!(matches!(o.stdout.as_str(), "3\n3\n" | "2\n3\n"), "{o:?}");
}

#[test]
fn unshare_user_namespace_works_under_the_shim() {
    let plain = Cmd::new("unshare", ["-U", "true"]).run();
    if plain.code != 0 {
        eprintln!(
            "SKIP: unshare -U does not work on this machine even without the shim: {plain:?}"
        );
        return;
    }
    let o = Cmd::new("unshare", ["-U", "true"]).shimmed().run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    // Live: a forced shim thread makes unshare(CLONE_NEWUSER) fail (EINVAL).
    let o = Cmd::new("unshare", ["-U", "true"])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .run();
    assert_ne!(
        o.code, 0,
        "unshare -U should fail in a two-threaded process: {o:?}"
    );
}

#[test]
fn python_can_unshare_through_ctypes_while_the_shim_thread_lingers() {
    if Cmd::new("unshare", ["-U", "true"]).run().code != 0 {
        eprintln!("SKIP: no user namespaces on this machine");
        return;
    }
    let script = r#"
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
t = threading.Thread(target=lambda: None); t.start(); t.join()
print("joined", flush=True)
for line in sys.stdin:
    rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
    print("unshare", rc, ctypes.get_errno(), flush=True)
"#;
    let mut ch = Cmd::new(python(), ["-c", script]).shimmed().spawn();
    ch.wait_for_line("joined", T);
    let pid = ch.pid();
    // The shim thread came with the Python thread...
    assert!(
        wait_until(T, || has_memshim(pid).then_some(())).is_some(),
        "no memshim thread: {:?}",
        thread_names(pid)
    );
    // CPython's join returns before the joined thread's OS thread has
    // exited; until it has, the process is not single-threaded, with or
    // without the shim. Wait until only the main thread and the shim's are
    // left.
    assert!(
        wait_until(T, || {
            let app = thread_names(pid)
                .iter()
                .filter(|n| !n.starts_with("memshim"))
                .count();
            (app == 1).then_some(())
        })
        .is_some(),
        "the joined thread did not exit: {:?}",
        thread_names(pid)
    );
    // ...and while it is there, the process is alone but for the shim's
    // thread: our unshare stops that thread first, so unshare(CLONE_NEWUSER)
    // works as in a single-threaded process (a multi-threaded one gets
    // EINVAL), and the process is single-threaded afterwards.
    let first = ask(&mut ch, "try", "unshare");
    assert!(
        first.starts_with("unshare 0 "),
        "unshare(CLONE_NEWUSER) failed while the shim's thread lingered: {first}"
    );
    assert_eq!(threads(pid), 1, "{:?}", thread_names(pid));
    ends_cleanly(ch);
}

/// Without /proc (a chroot, a mount namespace without it) the shim cannot
/// count threads, and its thread, which came with the program's first
/// one, stays; `unshare(CLONE_NEWUSER)` by the program, alone again, then
/// failed (EINVAL, a multi-threaded caller). The shim's `unshare` stops its
/// thread first whatever the count, as where it can count.
#[test]
fn unshare_works_without_proc_after_the_programs_threads_are_gone() {
    if Cmd::new("unshare", ["-U", "true"]).run().code != 0 {
        eprintln!("SKIP: no user namespaces on this machine");
        return;
    }
    let script = r#"
import ctypes, threading, time
libc = ctypes.CDLL(None, use_errno=True)
t = threading.Thread(target=lambda: None); t.start(); t.join()
time.sleep(0.3)
rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
print("unshare", rc, ctypes.get_errno(), flush=True)
"#;
    let run = format!(
        "umount -l /proc && exec env LD_PRELOAD='{}' '{}' -c '{}'",
        memshim_tests::shim().display(),
        python().display(),
        script.replace('\'', "'\\''")
    );
    let o = Cmd::new(
        "unshare",
        ["-m", "--propagation", "private", "sh", "-c", &run],
    )
    .run();
    assert_eq!(
        (o.code, o.stdout.trim(), o.stderr.as_str()),
        (0, "unshare 0 0", ""),
        "{o:?}"
    );
}

#[test]
fn memshim_thread_comes_with_the_second_thread_and_leaves_when_alone() {
    let mut ch = thread_rule(&[]);
    let pid = ch.pid();
    assert_eq!(ask(&mut ch, "threads", "threads"), "threads 1");
    assert!(!has_memshim(pid));
    ask(&mut ch, "spawn", "spawned");
    let up = wait_until(T, || has_memshim(pid).then_some(()));
    assert!(
        up.is_some(),
        "no memshim thread after the 2nd thread: {:?}",
        thread_names(pid)
    );
    assert_eq!(threads(pid), 3);
    // Timed from the request: reading "joined" may come late on a loaded
    // machine, and the grace time starts a moment after the request.
    let alone = Instant::now();
    ask(&mut ch, "release", "joined");
    assert!(
        has_memshim(pid),
        "left at once instead of after the grace time"
    );
    let gone = wait_until(T, || (!has_memshim(pid) && threads(pid) == 1).then_some(()));
    let took = alone.elapsed();
    assert!(
        gone.is_some(),
        "memshim thread did not leave: {:?}",
        thread_names(pid)
    );
    // Dirty decay (1 s) + 1 s grace, checked at 250 ms ticks.
    assert!(
        took >= Duration::from_millis(1500),
        "left after {took:?}, before decay + grace"
    );
    // It comes back with the next thread.
    ask(&mut ch, "spawn", "spawned");
    assert!(wait_until(T, || has_memshim(pid).then_some(())).is_some());
    ask(&mut ch, "release", "joined");
    ends_cleanly(ch);
}

#[test]
fn control_off_never_starts_the_thread() {
    let mut ch = thread_rule(&[("MEMSHIM_CONTROL", "off")]);
    let pid = ch.pid();
    ask(&mut ch, "spawn", "spawned");
    // In auto mode the thread exists once pthread_create returns; give it
    // generous time anyway.
    let appeared = wait_until(Duration::from_millis(500), || {
        has_memshim(pid).then_some(())
    });
    assert!(
        appeared.is_none(),
        "memshim thread with MEMSHIM_CONTROL=off: {:?}",
        thread_names(pid)
    );
    assert_eq!(ask(&mut ch, "threads", "threads"), "threads 2");
    ask(&mut ch, "release", "joined");
    ends_cleanly(ch);
}

#[test]
fn control_on_starts_the_thread_in_a_single_threaded_process() {
    let mut ch = thread_rule(&[("MEMSHIM_CONTROL", "on")]);
    let pid = ch.pid();
    assert!(
        wait_until(T, || has_memshim(pid).then_some(())).is_some(),
        "{:?}",
        thread_names(pid)
    );
    assert_eq!(ask(&mut ch, "threads", "threads"), "threads 2");
    ends_cleanly(ch);
}

/// Copies of the fixture `fixture` and of the shim in a fresh directory
/// under /tmp that every uid can reach: a checkout may lie under a
/// directory only root can enter, and a process that runs as another uid
/// must still open the shim and its own executable. Returns the directory
/// and the two copies' paths.
fn fixture_and_shim_for_any_uid(tag: &str, fixture: &str) -> (std::path::PathBuf, String, String) {
    let dir = std::path::PathBuf::from(format!("/tmp/msh-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let [exe, lib]: [String; 2] = memshim_tests::reachable_by_any_uid(
        &dir,
        &[memshim_tests::fixture(fixture, &[]), memshim_tests::shim()],
    )
    .try_into()
    .unwrap();
    (dir, exe, lib)
}

/// glibc gives every thread the new ids of a set*id call and aborts the
/// process if one fails where the caller succeeded. Capabilities belong to
/// a thread: after `capset` on the main thread, a shim thread created
/// before it had no CAP_SETGID, and `setresgid` aborted the process
/// (SIGABRT, nothing on stderr). `setpriv --reuid --regid` drops root this
/// way.
#[test]
fn dropping_root_with_capabilities_kept_works_while_the_shim_thread_runs() {
    if !memshim_tests::cgroups::is_root() {
        eprintln!("SKIP: dropping root needs root");
        return;
    }
    let (dir, exe, lib) = fixture_and_shim_for_any_uid("setxid", "setxid_caps");
    // A joined thread leaves the shim's thread running (auto); `on` runs it
    // from the start.
    for (control, joined) in [("auto", "1"), ("on", "0"), ("on", "1")] {
        let o = Cmd::new(&exe, [joined])
            .env("LD_PRELOAD", &lib)
            .env("MEMSHIM_CONTROL", control)
            .run();
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, "uid=65534 gid=65534\n", ""),
            "MEMSHIM_CONTROL={control}, thread first: {joined}: {o:?}"
        );
    }
    let o = Cmd::new(
        "setpriv",
        [
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "id",
            "-u",
        ],
    )
    .env("LD_PRELOAD", &lib)
    .env("MEMSHIM_CONTROL", "on")
    .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, "65534\n", ""),
        "{o:?}"
    );
    // The shim's thread comes back after the call, started by the caller
    // with its new credentials.
    let mut ch = Cmd::new(&exe, ["0", "wait"])
        .env("LD_PRELOAD", &lib)
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    ch.wait_for_line("dropped", T);
    let pid = ch.pid();
    assert!(
        wait_until(T, || has_memshim(pid).then_some(())).is_some(),
        "{:?}",
        thread_names(pid)
    );
    // Its socket moved to the new uid's directory, and goes at the normal
    // exit (the destructor removed the path bound first, which the process
    // could no longer reach, and left the new one).
    let new_dir = std::path::Path::new("/tmp/memshim-65534");
    let moved = memshim_tests::endpoint::wait_socket(new_dir, pid, T);
    assert!(moved.is_some(), "no socket in {}", new_dir.display());
    ends_cleanly(ch);
    assert!(
        !moved.unwrap().exists(),
        "the socket in the new uid's directory outlived a normal exit"
    );
    // Only a call whose caller has other capabilities than the shim's
    // thread stops it: a call every thread can make leaves it alone.
    let o = Cmd::new(&exe, ["tids"])
        .env("LD_PRELOAD", &lib)
        .env("MEMSHIM_CONTROL", "on")
        .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (
            0,
            "plain: same thread\nuid=65534 gid=65534\ndrop: other thread\n",
            ""
        ),
        "{o:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shim's thread takes a slot of the process's thread limit
/// (RLIMIT_NPROC counts a uid's threads; a pids cgroup's `pids.max` too).
/// A program that creates exactly as many threads as its limit allows lost
/// its last one to it (EAGAIN). Now the shim's thread makes room.
#[test]
fn a_program_at_its_thread_limit_gets_every_thread_it_gets_without_the_shim() {
    if !memshim_tests::cgroups::is_root() {
        eprintln!("SKIP: running as another uid needs root");
        return;
    }
    let (dir, exe, lib) = fixture_and_shim_for_any_uid("nproc", "nproc_limit");
    // A uid of its own (RLIMIT_NPROC counts every process of the uid),
    // different for each run of the suite on one host. The limit is set
    // while still root; setpriv then becomes the uid and runs the program.
    let uid = 50_000 + std::process::id() % 10_000;
    let (reuid, regid) = (format!("--reuid={uid}"), format!("--regid={uid}"));
    let run = |shim: Option<&str>| {
        let args = [
            "--nproc=5",
            "setpriv",
            reuid.as_str(),
            regid.as_str(),
            "--clear-groups",
            exe.as_str(),
            "4",
        ];
        let mut c = Cmd::new("prlimit", args);
        if let Some(control) = shim {
            c = c.env("LD_PRELOAD", &lib).env("MEMSHIM_CONTROL", control);
        }
        c.run()
    };
    let plain = run(None);
    assert_eq!(
        (plain.code, plain.stdout.as_str()),
        (0, "created 4 of 4\n"),
        "{plain:?}"
    );
    for control in ["auto", "on"] {
        let o = run(Some(control));
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, "created 4 of 4\n", ""),
            "MEMSHIM_CONTROL={control}: {o:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts and joins a thread, then waits until only the main thread and the
/// shim's are left (the shim's thread lingers for the decay time plus a
/// second), then runs `call` at once.
fn right_after_the_last_thread(call: &str) -> String {
    format!(
        r#"{OTHERS}
t = threading.Thread(target=lambda: None); t.start(); t.join()
while others():
    time.sleep(0.001)
{call}
print("ok", flush=True)
"#
    )
}

#[test]
fn python_can_unshare_a_user_namespace_while_the_shim_thread_lingers() {
    if Cmd::new("unshare", ["-U", "true"]).run().code != 0 {
        eprintln!("SKIP: no user namespaces on this machine");
        return;
    }
    let script = right_after_the_last_thread("os.unshare(os.CLONE_NEWUSER)");
    let pys: Vec<_> = pyenv_pythons()
        .into_iter()
        .filter(|(v, _)| v.starts_with("3.12") || v.starts_with("3.13"))
        .collect();
    for (v, exe) in pys {
        let plain = Cmd::new(&exe, ["-c", &script]).run();
        assert_eq!(
            (plain.code, plain.stdout.as_str()),
            (0, "ok\n"),
            "{v}: {plain:?}"
        );
        for round in 0..3 {
            let o = Cmd::new(&exe, ["-c", &script]).shimmed().run();
            assert_eq!(
                (o.code, o.stdout.as_str(), o.stderr.as_str()),
                (0, "ok\n", ""),
                "CPython {v} round {round}"
            );
        }
    }
}

/// A mount namespace needs a caller whose filesystem context no other
/// thread shares, a time namespace a single-threaded caller (`EUSERS`
/// otherwise): the shim's lingering thread stops first.
#[test]
fn python_can_setns_into_a_mount_or_time_namespace_while_the_shim_thread_lingers() {
    let pys: Vec<_> = pyenv_pythons()
        .into_iter()
        .filter(|(v, _)| v.starts_with("3.12") || v.starts_with("3.13"))
        .collect();
    for (ns, flag) in [("mnt", "CLONE_NEWNS"), ("time", "CLONE_NEWTIME")] {
        let script = right_after_the_last_thread(&format!(
            "fd = os.open('/proc/self/ns/{ns}', os.O_RDONLY)\nos.setns(fd, os.{flag})"
        ));
        for (v, exe) in &pys {
            let plain = Cmd::new(exe, ["-c", &script]).run();
            if plain.code != 0 {
                eprintln!("SKIP: setns({flag}) fails here without the shim: {plain:?}");
                continue;
            }
            for round in 0..3 {
                let o = Cmd::new(exe, ["-c", &script]).shimmed().run();
                assert_eq!(
                    (o.code, o.stdout.as_str(), o.stderr.as_str()),
                    (0, "ok\n", ""),
                    "CPython {v}, {flag}, round {round}"
                );
            }
        }
    }
}

/// `(index, threads)` of every arena in `stats --arenas` of a process whose
/// main thread and `workers` workers allocated and parked, under
/// `MEMSHIM_NARENAS=narenas`; and `config.narenas`.
fn arena_threads(narenas: u32, workers: u32, control: &str) -> (Vec<(u64, u64)>, u64) {
    let narenas_s = narenas.to_string();
    let stats = memshim_tests::control::parked_cache_stats(
        workers,
        "park",
        &[
            ("MEMSHIM_NARENAS", &narenas_s),
            ("MEMSHIM_CONTROL", control),
        ],
        &["--arenas"],
    );
    let arenas = stats["arenas"]
        .as_array()
        .unwrap_or_else(|| panic!("no arenas in {stats}"))
        .iter()
        .map(|a| (a["index"].as_u64().unwrap(), a["threads"].as_u64().unwrap()))
        .collect();
    (arenas, stats["config"]["narenas"].as_u64().unwrap())
}

#[test]
fn the_shims_threads_leave_every_automatic_arena_to_the_application() {
    // jemalloc gives each thread the automatic arena with the fewest threads.
    // The shim's thread must not be counted there: it sits in an arena of
    // its own beyond them. Before, it took an automatic one, and with as
    // many arenas as the program has threads two of the program's shared
    // one (medium sizes at T=2 then ran 2.9x slower in some runs).
    //
    // With MEMSHIM_CONTROL=on the thread has left before the program's
    // first thread starts, so each of the program's threads gets an arena
    // to itself, as without the shim. With auto it starts right after the
    // program's first thread, which may choose while the shim's is still
    // counted (jemalloc binds a thread at its first call); the threads
    // after it wait for it to leave (thread/run.rs, `wait_until_settled`).
    for (narenas, control) in [(2, "on"), (3, "on"), (2, "auto"), (4, "auto")] {
        let workers = narenas - 1;
        let (arenas, configured) = arena_threads(narenas, workers, control);
        let what = format!("MEMSHIM_NARENAS={narenas} MEMSHIM_CONTROL={control}: {arenas:?}");
        assert_eq!(configured, u64::from(narenas), "config.narenas, {what}");
        let auto: Vec<u64> = arenas
            .iter()
            .filter(|a| a.0 < u64::from(narenas))
            .map(|a| a.1)
            .collect();
        assert_eq!(
            auto.iter().sum::<u64>(),
            u64::from(workers) + 1,
            "the automatic arenas count the program's threads only, {what}"
        );
        if control == "on" {
            assert_eq!(
                auto,
                vec![1; narenas as usize],
                "one thread per arena, {what}"
            );
        }
        let own: Vec<&(u64, u64)> = arenas
            .iter()
            .filter(|a| a.0 >= u64::from(narenas))
            .collect();
        assert_eq!(own.len(), 1, "one arena of the shim's, {what}");
        assert_eq!(own[0].1, 1, "the shim's thread in it, {what}");
    }
}
