//! `release` on a real python3 whose garbage sits in reference cycles with
//! the collector disabled: only a collection can free it. The main thread
//! is asleep meanwhile, as a server's is between requests.

use memshim_proto::{Reply, Request, StepOutcome};
use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl, mib, python, rss_bytes};
use std::io::Write;
use std::time::Duration;

const MIB: u64 = 1024 * 1024;

#[test]
fn release_frees_cyclic_garbage_that_purge_alone_cannot() {
    // Timed (within the 8 s the main thread sleeps).
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let dir = socket_dir("release");
    let mut child =
        shimmed_python(&python(), &fixture_py("py_host.py"), &["--gc-off"], &dir).spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid();
    let sock = socket_of(&dir, pid);
    let threads_before = ask(&mut child, "threads");

    let base = rss_bytes(pid);
    ask(&mut child, "alloc 256");
    let high = rss_bytes(pid);
    let garbage = high.saturating_sub(base);
    assert!(
        garbage > 200 * MIB,
        "the fixture should hold ~256 MiB of garbage, RSS grew by {:.0} MiB",
        mib(garbage)
    );

    // Live-ness: the allocator purge alone cannot free garbage in cycles.
    ok(request(&sock, &Request::Purge));
    let after_purge = rss_bytes(pid);
    assert!(
        after_purge > base + garbage * 8 / 10,
        "purge alone freed the cyclic garbage ({:.0} -> {:.0} MiB): the test would prove nothing",
        mib(high),
        mib(after_purge)
    );

    // The main thread blocks in time.sleep (GIL released) while
    // `memshim-ctl release --json` runs, as a user would run it.
    child.send("sleep 8");
    child.wait_for_line("sleeping", Duration::from_secs(10));
    let asleep = std::time::Instant::now();
    let out = Cmd::new(ctl(), ["release", &pid.to_string(), "--json"]).run();
    assert!(
        asleep.elapsed() < Duration::from_secs(7),
        "release took {:?}: the main thread may have woken up meanwhile",
        asleep.elapsed()
    );
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{out:?}");
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let r: memshim_proto::ReleaseResult =
        serde_json::from_value(doc["release"][0]["result"].clone()).unwrap();
    let after = rss_bytes(pid);
    let _ = writeln!(
        std::io::stderr(),
        "release (main thread asleep): baseline {:.1} MiB, with garbage {:.1} MiB, after purge alone {:.1} MiB, after release {:.1} MiB; steps: {}",
        mib(base),
        mib(high),
        mib(after_purge),
        mib(after),
        steps_line(&r.steps)
    );
    assert_eq!(r.steps[0].outcome, StepOutcome::Done, "{:?}", r.steps[0]);
    let limit = base + garbage * 15 / 100 + 32 * MIB;
    assert!(
        after <= limit,
        "RSS after release {:.1} MiB, limit {:.1} MiB",
        mib(after),
        mib(limit)
    );

    // The collection ran on the bridge's thread (the main thread slept):
    // the finalizers ran there, and threading.enumerate() is what it was
    // although each of them called threading.current_thread().
    child.wait_for_line("sleep: done", Duration::from_secs(30));
    let fin = ask(&mut child, "fin");
    assert!(field::<u64>(&fin, "count") >= 4000, "{fin}");
    assert!(!fin.contains("MainThread"), "{fin}");
    assert_eq!(ask(&mut child, "threads"), threads_before);

    child.send("quit");
    let out = child.finish(Duration::from_secs(30));
    assert_eq!(out.code, 0);
    assert_eq!(out.stderr, "", "the host's stderr must stay empty");
}

#[test]
fn gc_without_the_gc_module_collects_and_imports_nothing() {
    let dir = socket_dir("nogcmod");
    let mut child = shimmed_python(
        &python(),
        &fixture_py("py_host.py"),
        &["--no-gc-module"],
        &dir,
    )
    .spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let sock = socket_of(&dir, child.pid());
    ask(&mut child, "alloc 8");
    let Reply::Gc(g) = ok(request(&sock, &Request::Gc)) else {
        panic!("not a gc reply")
    };
    // The collector is on, so it already took some of the garbage itself.
    assert!(g.collected > 0, "collected {}", g.collected);
    let Reply::Stats(s) = ok(request(
        &sock,
        &Request::Stats {
            arenas: false,
            pss: false,
        },
    )) else {
        panic!()
    };
    let p = s.python.expect("python section");
    assert_eq!(
        p.gc_counts, None,
        "gc figures need the gc module, which the program did not import"
    );
    assert!(p.gc_enabled);
    assert!(
        ask(&mut child, "has gc").contains("gc=False"),
        "the bridge imported gc"
    );
    child.send("quit");
    let out = child.finish(Duration::from_secs(30));
    assert_eq!(out.stderr, "");
}
