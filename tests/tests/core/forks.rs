//! Forks, vfork, posix_spawn and pending cancellations around the shim's
//! thread (shim/src/thread/fork.rs): a child is single-threaded, the host
//! never dies of the fork handler, CPython does not warn because of us.
//! The thread rule itself is `threads.rs`, whose fixture helpers these use.

use super::threads::{T, ask, ends_cleanly, has_memshim, thread_rule, with_a_second_thread};
use memshim_tests::{Cmd, pyenv_pythons, thread_names, threads, wait_until};
use std::time::Duration;

#[test]
fn fork_while_alone_but_for_the_shim_thread_leaves_both_single_threaded() {
    // Slowly: the shim thread is running when the fork comes.
    let (mut ch, pid) = with_a_second_thread();
    ask(&mut ch, "release", "joined");
    assert!(has_memshim(pid));
    assert_eq!(ask(&mut ch, "fork", "fork"), "fork parent=1 child=1");
    // At once: create, join and fork back to back (the shim thread may
    // still be starting).
    for _ in 0..20 {
        ch.send("spawn");
        ch.send("release");
        ch.send("fork");
        assert_eq!(ch.wait_for_line("fork", T), "fork parent=1 child=1");
    }
    ends_cleanly(ch);
}

/// The fork handler wakes the shim's thread through its pipe while the
/// thread may already be closing it; a write to a pipe without a reader
/// raised SIGPIPE on the forking thread and killed the host (6 of 15 runs
/// of 500 back-to-back rounds before the fix, thread/wake.rs).
#[test]
fn forks_right_after_the_last_thread_ends_never_kill_the_host() {
    // A fork storm: 2000 rounds of thread, join and fork.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let mut ch = thread_rule(&[]);
    let rounds = 2000;
    ch.send("spawn\nrelease\nfork\n".repeat(rounds).trim_end());
    ch.send("threads");
    // Commands run in order: the answer to `threads` comes after every fork.
    // (About 20 s; the limit only catches a hang.)
    assert_eq!(
        ch.wait_for_line("threads", Duration::from_secs(300)),
        "threads 1"
    );
    ends_cleanly(ch);
}

#[test]
fn fork_from_a_multithreaded_process_gives_a_single_threaded_child() {
    let (mut ch, pid) = with_a_second_thread();
    // The parent keeps its threads (the shim's included, so idle purging
    // continues); the child has only the forking thread.
    assert_eq!(ask(&mut ch, "fork", "fork"), "fork parent=3 child=1");
    assert!(has_memshim(pid));
    ask(&mut ch, "release", "joined");
    ends_cleanly(ch);
}

#[test]
fn vfork_and_posix_spawn_children_get_no_thread() {
    let (mut ch, _) = with_a_second_thread();
    assert_eq!(ask(&mut ch, "vfork", "vfork"), "vfork child=1");
    // The spawned program runs under the shim too (LD_PRELOAD is inherited)
    // and is single-threaded.
    assert_eq!(ask(&mut ch, "spawnp", "spawn child"), "spawn child=1");
    ask(&mut ch, "release", "joined");
    ends_cleanly(ch);
}

/// Start and join a thread, then fork. CPython's `t.join()` returns a
/// moment before the OS thread is gone, and CPython 3.12+ warns by itself
/// (without any shim) if the fork lands in that moment; the script waits
/// until only the main thread and the shim's remain, as a program that
/// forks "later" would.
fn fork_after_join() -> String {
    format!(
        r#"{OTHERS}
for i in range(5):
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    while others():
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print("forked")
"#
    )
}

/// Python: `others()` counts the process's threads but its main thread
/// and the shim's.
pub(super) const OTHERS: &str = r#"import os, threading, time
def others():
    n = 0
    for tid in os.listdir("/proc/self/task"):
        if tid != str(os.getpid()):
            try:
                n += open("/proc/self/task/%s/comm" % tid).read().strip() != "memshim"
            except OSError:
                pass
    return n
"#;

#[test]
fn cpython_312_plus_does_not_warn_about_fork_after_a_joined_thread() {
    let pys: Vec<_> = pyenv_pythons()
        .into_iter()
        .filter(|(v, _)| v.starts_with("3.12") || v.starts_with("3.13") || v.starts_with("3.14"))
        .collect();
    if pys.is_empty() {
        eprintln!("SKIP: no CPython >= 3.12 under ~/.pyenv/versions");
        return;
    }
    let script = fork_after_join();
    for (v, exe) in pys {
        // Default warning filters show the DeprecationWarning (it is raised
        // in __main__); -W error::DeprecationWarning is what the issue names.
        for flags in [&[][..], &["-W", "error::DeprecationWarning"]] {
            let mut args: Vec<&str> = flags.to_vec();
            args.extend(["-c", &script]);
            for round in 0..3 {
                let o = Cmd::new(&exe, &args).shimmed().run();
                assert_eq!(
                    (o.code, o.stdout.as_str(), o.stderr.as_str()),
                    (0, "forked\n", ""),
                    "CPython {v} {flags:?} round {round}"
                );
            }
        }
        // Live: with the shim thread forced on, the warning does appear.
        let o = Cmd::new(&exe, ["-c", &script])
            .shimmed()
            .env("MEMSHIM_CONTROL", "on")
            .run();
        assert!(
            o.stderr.contains("DeprecationWarning"),
            "CPython {v}: warning expected with MEMSHIM_CONTROL=on: {o:?}"
        );
    }
}

/// Start, join and fork at once, 20 times, counting CPython's warnings. It
/// warns often without any shim (the joined OS thread is still on its way
/// out); under the shim it warned in nearly every round, because the
/// prepare handler saw that thread and left the shim's thread up. Now it
/// waits a few milliseconds for such a thread to go, then stops its own,
/// and waits for the kernel to stop counting both.
const FORK_RIGHT_AFTER_JOIN: &str = r#"
import os, threading, warnings
warnings.simplefilter("always")
n = 0
for i in range(20):
    t = threading.Thread(target=lambda: [bytearray(1000) for _ in range(10000)]); t.start(); t.join()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pid = os.fork()
        if pid == 0:
            os._exit(0)
    os.waitpid(pid, 0)
    n += any(issubclass(x.category, DeprecationWarning) for x in w)
print(n)
"#;

#[test]
fn cpython_312_plus_fork_right_after_a_join_rarely_warns_under_the_shim() {
    // Counted against a bound (6 of 20): kept apart from the fork storms
    // of other modules, as when this file was a binary of its own.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let Some((v, exe)) = pyenv_pythons()
        .into_iter()
        .find(|(v, _)| v.starts_with("3.12") || v.starts_with("3.13"))
    else {
        eprintln!("SKIP: no CPython 3.12 or 3.13 under ~/.pyenv/versions");
        return;
    };
    let count = |shimmed: bool| {
        let c = Cmd::new(&exe, ["-c", FORK_RIGHT_AFTER_JOIN]);
        let o = if shimmed { c.shimmed() } else { c }.run();
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "CPython {v}: {o:?}");
        o.stdout.trim().parse::<u32>().unwrap()
    };
    // Measured on 2 CPUs: without the shim 8-16 of 20 warn; under the
    // shim before the wait 13-19; with it 0-2, with two busy loops beside.
    let (plain, shim) = (count(false), count(true));
    assert!(
        shim <= 6,
        "CPython {v}: {shim} of 20 forks right after a join warned under the shim, {plain} without"
    );
}

#[test]
fn thread_started_in_a_library_constructor_brings_the_memshim_thread() {
    // The DT_NEEDED library's constructor creates a thread, possibly before
    // the shim's constructor has run ("pending" in thread/state.rs).
    let lib = memshim_tests::fixture("ctor_thread_lib", &["-shared", "-fPIC"]);
    let exe = memshim_tests::fixture(
        "ctor_thread_main",
        &["-Wl,--no-as-needed", lib.to_str().unwrap()],
    );
    let mut ch = Cmd::new(&exe, [""; 0]).shimmed().spawn();
    ch.wait_for_line("ready", T);
    let pid = ch.pid();
    assert!(
        wait_until(T, || has_memshim(pid).then_some(())).is_some(),
        "{:?}",
        thread_names(pid)
    );
    assert_eq!(threads(pid), 3);
    ends_cleanly(ch);
}

#[test]
fn a_pending_cancel_acts_after_fork_returns_not_inside_it() {
    let exe = memshim_tests::fixture("cancel_points", &[]);
    let plain = Cmd::new(&exe, ["fork"]).run();
    assert_eq!(
        (plain.code, plain.stdout.as_str()),
        (0, "forked\ncanceled\nagain\n"),
        "{plain:?}"
    );
    for _ in 0..3 {
        let o = Cmd::new(&exe, ["fork"]).shimmed().run();
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, plain.stdout.as_str(), ""),
            "under the shim"
        );
    }
}

#[test]
fn a_pending_cancel_acts_after_pthread_create_returns_not_inside_it() {
    let exe = memshim_tests::fixture("cancel_points", &[]);
    let plain = Cmd::new(&exe, ["create"]).run();
    assert_eq!(
        (plain.code, plain.stdout.as_str()),
        (0, "created\nworker\n"),
        "{plain:?}"
    );
    let o = Cmd::new(&exe, ["create"])
        .shimmed()
        .env("MEMSHIM_DIRTY_DECAY_MS", "0")
        .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, plain.stdout.as_str(), ""),
        "under the shim"
    );
}

/// A fork by a single-threaded program writes no page of the shim's data
/// in the parent (issue 48, item 1; bench/FINDINGS-startup.md, "The
/// shell's share, by section"): the fork fence skips its handshake when the
/// forking thread is alone, and the prepare handler only reads the PEP 788
/// guard. Each write there was a copy-on-write fault per fork, which a
/// preloaded shell pays in every command. The fixture (fork_dirty.c)
/// reads the frames of the library's writable pages and of its `.bss`
/// (where jemalloc's locks lie, which a fork by a process that is not alone
/// takes and releases) from /proc/self/pagemap before and after a fork,
/// while a process made by a raw `clone` (which runs no fork handler and
/// writes nothing) shares every page: a page the parent wrote then has a
/// new frame, whatever order the fork's child runs in. Deterministic, where
/// counting faults is not. Both builds (`make test-shipped`).
#[test]
fn a_single_threaded_fork_writes_no_page_of_the_shims_data() {
    let exe = memshim_tests::fixture("fork_dirty", &[]);
    let lib = memshim_tests::shim();
    let name = lib
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("libmemshim");
    let o = Cmd::new(&exe, [name]).shimmed().run();
    if o.code == 77 {
        eprintln!("SKIP: /proc/self/pagemap shows no frame numbers (not root)");
        return;
    }
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let pages: u32 = o
        .stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pages=")?.parse().ok())
        .unwrap_or_else(|| panic!("{o:?}"));
    assert!(
        pages > 0,
        "no page of {lib:?}'s writable data was read: {o:?}"
    );
    assert!(
        o.stdout.contains(" written=0\n"),
        "a fork wrote pages of {lib:?} in the parent:\n{}",
        o.stdout
    );
}

/// A fork under the shim costs few page faults (issue 48, item 1): the
/// fork handlers write one page of statics (`touched_at_start!`, placed by
/// shim/link.ld), the child's handler runs code that lies with the
/// start-up code, and `errno` is written back only when it changed. The
/// parent then takes about one fault more than without the shim, the child
/// two or three; together they took 8 to 12 more before, which a bash loop
/// of commands pays in every iteration. Medians of 51 forks of a program
/// that has allocated (so jemalloc is initialised), both builds (`make
/// test-shipped`); the bound leaves room for a page that ASLR puts across
/// a boundary.
#[test]
fn a_fork_costs_at_most_a_few_page_faults_more_than_without_the_shim() {
    let exe = memshim_tests::fixture("fork_faults", &[]);
    let faults = |shimmed: bool| {
        let mut c = Cmd::new(&exe, ["51"]);
        if shimmed {
            c = c.shimmed();
        }
        let o = c.run();
        assert_eq!(o.code, 0, "{o:?}");
        assert!(o.stderr.is_empty(), "{o:?}");
        let field = |k: &str| -> i64 {
            o.stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.parse().ok())
                .unwrap_or_else(|| panic!("no {k} in {o:?}"))
        };
        (field("child="), field("parent="))
    };
    let (c0, p0) = faults(false);
    let (c1, p1) = faults(true);
    assert!(
        (c1 + p1) - (c0 + p0) <= 6,
        "per fork, child {c1} and parent {p1} page faults under the shim, {c0} and {p0} without"
    );
}
