//! glibc's malloc control API works on the shim, called the way Python/ML
//! code calls it: through ctypes (tests/fixtures/glibc_api.py).

use memshim_tests::control::parked_cache_stats;
use memshim_tests::{Cmd, Output, fixture, python, root, scratch};
use std::collections::HashMap;

fn api(args: &[&str], envs: &[(&str, &str)], shimmed: bool) -> Output {
    let script = root().join("tests/fixtures/glibc_api.py");
    let mut all = vec![script.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut c = Cmd::new(python(), all);
    if shimmed {
        c = c.shimmed();
    }
    for (k, v) in envs {
        c = c.env(k, v);
    }
    c.run()
}

fn values(o: &Output) -> HashMap<String, String> {
    o.stdout
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

fn num(v: &HashMap<String, String>, k: &str) -> i64 {
    v.get(k)
        .unwrap_or_else(|| panic!("no {k} in {v:?}"))
        .parse()
        .unwrap()
}

#[test]
fn malloc_trim_releases_a_freed_fragmented_heap_and_returns_1() {
    // Decay off: freed pages stay dirty until malloc_trim purges them.
    let o = api(&["trim"], &[("MEMSHIM_DIRTY_DECAY_MS", "-1")], true);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let v = values(&o);
    assert_eq!(num(&v, "trim"), 1, "{o:?}");
    let (before, after) = (num(&v, "rss_before"), num(&v, "rss_after"));
    // ~320 MiB allocated, 95% freed: most of it must leave RSS.
    assert!(
        before - after > 200 << 20,
        "RSS {before} -> {after}: malloc_trim released too little"
    );
}

/// `allocator.tcache` of a process whose 4 workers filled their thread
/// caches and parked, with or without a `malloc_trim(0)` of their own first.
fn parked_tcache_bytes(mode: &str) -> u64 {
    let stats = parked_cache_stats(4, mode, &[("MEMSHIM_CONTROL", "on")], &[]);
    stats["allocator"]["tcache"].as_u64().unwrap()
}

#[test]
fn malloc_trim_returns_the_calling_threads_cache_which_a_purge_cannot() {
    // What docs/troubleshooting.md tells users of parked thread pools: a
    // parked thread's cache is out of a purge's reach, and the thread's own
    // malloc_trim(0) returns it.
    let parked = parked_tcache_bytes("park");
    let trimmed = parked_tcache_bytes("trim");
    assert!(
        parked > 4 << 20,
        "4 parked workers should hold MiBs in their caches: {parked} bytes"
    );
    assert!(
        trimmed < parked / 8,
        "after each worker's malloc_trim(0): {trimmed} bytes cached (without: {parked})"
    );
}

#[test]
fn mallinfo2_and_mallinfo_follow_a_live_allocation() {
    let o = api(&["mallinfo"], &[], true);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let v = values(&o);
    // 64 MiB are allocated between the two calls; the interpreter may free
    // a little of its own in between, so allow a small margin.
    assert!(num(&v, "uordblks_growth") >= 60 << 20, "{o:?}");
    assert_eq!(num(&v, "arena_ge_uordblks"), 1, "{o:?}");
    assert_eq!(num(&v, "fordblks_consistent"), 1, "{o:?}");
    assert!(num(&v, "int_uordblks") >= 60 << 20, "{o:?}");
}

#[test]
fn malloc_info_writes_well_formed_xml() {
    let path = scratch().join("malloc_info.xml");
    let o = api(&["info", path.to_str().unwrap()], &[], true);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let v = values(&o);
    // Parsed by Python's xml.etree in the fixture.
    assert_eq!(v["root"], "malloc", "{o:?}");
    assert!(num(&v, "children") >= 2, "{o:?}");
    assert_eq!(num(&v, "rc"), 0);
    assert_eq!(
        num(&v, "rc_bad_options"),
        22,
        "options != 0 is EINVAL, as in glibc"
    );
}

#[test]
fn malloc_stats_prints_to_stderr_and_mallopt_returns_1() {
    let o = api(&["stats"], &[], true);
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(o.stdout.trim(), "mallopt 1 1 1", "{o:?}");
    assert!(o.stderr.starts_with("memshim (jemalloc "), "{o:?}");
    for field in ["system bytes", "in use bytes"] {
        assert!(
            o.stderr.contains(field),
            "malloc_stats lacks {field:?}: {o:?}"
        );
    }
}

/// `malloc_stats` and `malloc_info` from C, beside glibc's own answers:
/// the summary goes through the `stderr` stream, so a program that pointed
/// `stderr` at a file finds it there, and a buffered `stderr` keeps the
/// program's order (the shim wrote to descriptor 2: on the terminal, ahead
/// of text written before); `malloc_info` answers 0 where the stream cannot
/// be written, as glibc does (the shim answered -1).
#[test]
fn malloc_stats_and_malloc_info_use_the_stream_as_glibc_does() {
    let exe = fixture("malloc_reports", &[]);
    for shimmed in [false, true] {
        let log = scratch().join(format!("malloc_reports-{shimmed}.log"));
        let mut c = Cmd::new(&exe, ["stats", log.to_str().unwrap()]);
        if shimmed {
            c = c.shimmed();
        }
        let o = c.run();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            o.code == 0 && text.contains("system bytes"),
            "shimmed {shimmed}: the file has {text:?}; {o:?}"
        );
        let lines: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(
            (lines.first(), lines.last(), lines.len() > 2),
            (Some(&"before"), Some(&"after"), true),
            "shimmed {shimmed}: {o:?}"
        );
    }
    let glibc = Cmd::new(&exe, ["info"]).run();
    assert_eq!(
        (glibc.code, glibc.stdout.as_str()),
        (0, "dev_full 0\nread_only 0\n")
    );
    let o = Cmd::new(&exe, ["info"]).shimmed().run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, glibc.stdout.as_str(), "")
    );
}

/// A `malloc` of most of RAM and swap that succeeds leaves errno as glibc's
/// does. jemalloc's first try maps more than the block (its growth of
/// retained memory), above RAM and swap, which the shim refuses as the
/// kernel's heuristic would (os/overcommit.rs); jemalloc then tried `sbrk`,
/// whose ENOMEM stayed in errno after the exact mapping succeeded.
#[test]
fn a_big_malloc_that_succeeds_leaves_errno_as_it_was() {
    let exe = fixture("malloc_reports", &[]);
    let glibc = Cmd::new(&exe, ["big"]).run();
    assert_eq!(glibc.code, 0, "{glibc:?}");
    assert!(
        !glibc.stdout.starts_with("succeeded 0"),
        "nothing to compare: {glibc:?}"
    );
    let o = Cmd::new(&exe, ["big"]).shimmed().run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, glibc.stdout.as_str(), "")
    );
}

#[test]
fn ctypes_cdll_none_reaches_the_shim_but_libc_so_6_reaches_glibc() {
    let o = api(&["where"], &[], true);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let v = values(&o);
    assert_eq!(
        v["same"], "0",
        "CDLL(None) and CDLL('libc.so.6') should differ under the shim: {o:?}"
    );
    assert_eq!(v["default_owner"], "libmemshim.so", "{o:?}");
    assert_eq!(v["glibc_trim_rc"], "True", "{o:?}");
    // Without the shim both are glibc's (so the difference is the shim's).
    let o = api(&["where"], &[], false);
    let v = values(&o);
    assert_eq!(
        (v["same"].as_str(), v["default_owner"].as_str()),
        ("1", "libc.so.6"),
        "{o:?}"
    );
}
