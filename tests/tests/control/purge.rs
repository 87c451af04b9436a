//! list / stats / purge against real shimmed processes (C and CPython) that
//! allocate and free a fragmented heap with decay off: the freed pages stay
//! resident until `memshim-ctl purge` returns them.

use memshim_proto::exit::{NO_ENDPOINT, NOT_FOUND};
use memshim_tests::control::*;
use memshim_tests::*;
use std::time::Duration;

const HEAP_MIB: u64 = 256;
const SLACK: u64 = 32 << 20;

fn parse_ready(line: &str) -> (u64, u64) {
    let field = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    (field("live="), field("freed="))
}

/// The checks shared by the C and Python cases. `baseline` is the RSS
/// before the heap was built.
fn purge_returns_freed_pages(pid: i32, baseline: u64, live: u64, freed: u64) {
    let before = rss_bytes(pid);
    // Live test: with decay off the freed pages are still resident.
    assert!(
        before > baseline + live + freed / 2,
        "freed pages should still be resident before the purge: rss {:.0} MiB, baseline {:.0} + live {:.0} MiB",
        mib(before),
        mib(baseline),
        mib(live)
    );

    let (code, list) = ctl_json(&["list"]);
    assert_eq!(code, 0);
    let me = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .expect("pid listed");
    assert_eq!(me["endpoint"], true, "{me}");
    assert!(me["purgeable"].as_u64().unwrap() > freed / 2, "{me}");

    let (code, stats) = ctl_json(&["stats", &pid.to_string()]);
    assert_eq!(code, 0, "{stats}");
    assert!(
        stats["allocator"]["dirty"].as_u64().unwrap() > freed / 2,
        "{stats}"
    );
    assert!(
        stats["allocator"]["allocated"].as_u64().unwrap() >= live,
        "{stats}"
    );
    assert_eq!(stats["config"]["dirty_decay_ms"], -1);
    assert_eq!(stats["config"]["interposed"], true);
    assert!(stats["process"]["rss"].as_u64().unwrap() > 0);
    let human = ctl_run(&["stats", &pid.to_string()]);
    assert!(
        human.stdout.contains("purgeable") && human.stdout.contains("MiB"),
        "{human:?}"
    );

    let (code, purge) = ctl_json(&["purge", &pid.to_string()]);
    assert_eq!(code, 0, "{purge}");
    let r = &purge["purge"][0]["result"];
    let after = rss_bytes(pid);
    let target = baseline + live;
    let bound = target + freed * 15 / 100 + SLACK;
    eprintln!(
        "pid {pid}: baseline {:.0} MiB, live {:.0} MiB, freed {:.0} MiB; rss before purge {:.0} MiB, after {:.0} MiB \
         (bound {:.0} MiB); purge took {} ms",
        mib(baseline),
        mib(live),
        mib(freed),
        mib(before),
        mib(after),
        mib(bound),
        r["elapsed_ms"]
    );
    assert!(
        after <= bound,
        "rss after purge {:.0} MiB exceeds {:.0} MiB",
        mib(after),
        mib(bound)
    );
    assert!(r["released"].as_u64().unwrap() > freed / 2, "{r}");
    assert!(r["rss_before"].as_u64().unwrap() > r["rss_after"].as_u64().unwrap());
}

#[test]
fn purge_returns_a_c_programs_freed_heap() {
    let mut child = start_heap(&[]);
    let pid = child.pid();
    wait_endpoint(pid);
    let baseline = rss_bytes(pid);
    child.send(&format!("alloc {HEAP_MIB}"));
    let (live, freed) = parse_ready(&child.wait_for_line("ready", Duration::from_secs(30)));
    purge_returns_freed_pages(pid, baseline, live, freed);
    child.send("quit");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

const PY_HEAP: &str = r#"
import os, random, sys
print("started", os.getpid(), flush=True)
sys.stdin.readline()
r = random.Random(1)
blocks, total = [], 0
while total < 256 << 20:
    n = r.randrange(16 << 10, 512 << 10)
    blocks.append(bytearray(n))
    total += n
freed = sum(len(b) for b in blocks[::2])
del blocks[::2]
print(f"ready live={total - freed} freed={freed}", flush=True)
sys.stdin.readline()
"#;

#[test]
fn purge_returns_a_python_programs_freed_heap() {
    let mut child = Cmd::new(python(), ["-c", PY_HEAP])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_DIRTY_DECAY_MS", "-1")
        .spawn();
    let pid = child.pid();
    child.wait_for_line("started", Duration::from_secs(10));
    wait_endpoint(pid);
    let baseline = rss_bytes(pid);
    child.send("go");
    let (live, freed) = parse_ready(&child.wait_for_line("ready", Duration::from_secs(60)));
    purge_returns_freed_pages(pid, baseline, live, freed);
    child.send("quit");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

#[test]
fn decay_changes_at_runtime_and_stats_show_it() {
    let child = start_heap(&[]);
    let pid = child.pid().to_string();
    wait_endpoint(child.pid());
    let (code, d) = ctl_json(&["decay", &pid, "--dirty-ms", "250", "--muzzy-ms", "-1"]);
    assert_eq!(code, 0, "{d}");
    assert_eq!(
        (d["dirty_decay_ms"].as_i64(), d["muzzy_decay_ms"].as_i64()),
        (Some(250), Some(-1))
    );
    let (_, s) = ctl_json(&["stats", &pid]);
    assert_eq!(
        (
            s["config"]["dirty_decay_ms"].as_i64(),
            s["config"]["muzzy_decay_ms"].as_i64()
        ),
        (Some(250), Some(-1))
    );
    let o = ctl_run(&["watch", &pid, "--interval", "0.1", "--count", "3"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(
        o.stdout
            .lines()
            .filter(|l| l.starts_with("t=") && l.contains("rss="))
            .count(),
        3,
        "{o:?}"
    );
}

#[test]
fn list_explains_why_a_shimmed_process_has_no_endpoint() {
    // `cat` is single-threaded: the shim never starts a thread in it.
    let cat = Cmd::new("cat", Vec::<String>::new()).shimmed().spawn();
    let off = Cmd::new(heap_fixture(), Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_CONTROL", "off")
        .spawn();
    let pid = cat.pid();
    for p in [pid, off.pid()] {
        wait_shim_mapped(p);
    }
    let (_, list) = ctl_json(&["list"]);
    let find = |p: i32| {
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["pid"] == p)
            .cloned()
    };
    let c = find(pid).expect("cat listed");
    assert_eq!(c["endpoint"], false);
    assert!(
        c["reason"].as_str().unwrap().contains("single-threaded"),
        "{c}"
    );
    let o = find(off.pid()).expect("MEMSHIM_CONTROL=off process listed");
    assert!(
        o["reason"]
            .as_str()
            .unwrap()
            .contains("MEMSHIM_CONTROL=off"),
        "{o}"
    );
    let s = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(s.code, i32::from(NO_ENDPOINT.code), "{s:?}");
    assert!(
        s.stderr.contains(&format!("pid {pid}")) && s.stderr.contains("MEMSHIM_CONTROL=on"),
        "{s:?}"
    );
    let none = ctl_run(&["stats", &std::process::id().to_string()]);
    assert_eq!(none.code, i32::from(NOT_FOUND.code), "{none:?}");
    assert!(none.stderr.contains("not loaded"), "{none:?}");
}

/// Frees 96 MiB of written 1 MiB blocks (with a short dirty decay and muzzy
/// decay -1 they become muzzy: `MADV_FREE`d, still in RSS), then hands out
/// 1 GiB that it never writes.
const PY_UNMANAGED: &str = r#"
import ctypes, sys
L = ctypes.CDLL(None)
L.malloc.restype = ctypes.c_void_p
L.malloc.argtypes = [ctypes.c_size_t]
L.free.argtypes = [ctypes.c_void_p]
print('started', flush=True)
sys.stdin.readline()
blocks = [L.malloc(1 << 20) for _ in range(96)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
for b in blocks:
    L.free(b)
print('muzzy', flush=True)
sys.stdin.readline()
big = L.malloc(1 << 30)
if not big:
    raise SystemExit('malloc(1 GiB) failed')
print('untouched', flush=True)
sys.stdin.readline()
"#;

/// `process.unmanaged` is RSS the allocator does not hold: muzzy pages are
/// the allocator's (jemalloc's `resident` leaves them out, RSS does not),
/// and pages handed out but never written (which `resident` counts) do not
/// hide the rest of RSS.
#[test]
fn unmanaged_counts_neither_muzzy_pages_nor_untouched_ones_against_the_program() {
    const MIB: u64 = 1 << 20;
    let mut child = Cmd::new(python(), ["-c", PY_UNMANAGED])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_DIRTY_DECAY_MS", "100")
        .env("MEMSHIM_MUZZY_DECAY_MS", "-1")
        .spawn();
    let pid = child.pid();
    child.wait_for_line("started", Duration::from_secs(10));
    wait_endpoint(pid);
    let stats = || ctl_json(&["stats", &pid.to_string()]).1;
    let field = |s: &serde_json::Value, sec: &str, k: &str| s[sec][k].as_u64().unwrap();
    let s0 = stats();

    child.send("muzzy");
    child.wait_for_line("muzzy", Duration::from_secs(30));
    let s1 = wait_until(Duration::from_secs(10), || {
        let s = stats();
        (field(&s, "allocator", "muzzy") >= 64 * MIB).then_some(s)
    })
    .unwrap_or_else(|| panic!("no muzzy pages: {}", stats()["allocator"]));
    assert!(
        field(&s1, "process", "unmanaged") <= field(&s0, "process", "unmanaged") + 16 * MIB,
        "muzzy pages counted as unmanaged: before {} after {}",
        s0["process"],
        s1["process"]
    );

    child.send("untouched");
    child.wait_for_line("untouched", Duration::from_secs(30));
    let s2 = stats();
    assert!(
        field(&s2, "allocator", "resident") >= 1 << 30,
        "{}",
        s2["allocator"]
    );
    let (file, shmem) = (
        field(&s2, "process", "file"),
        field(&s2, "process", "shmem"),
    );
    assert!(file > 0, "{}", s2["process"]);
    assert!(
        field(&s2, "process", "unmanaged") >= file + shmem,
        "untouched allocator pages hid mapped files: {}",
        s2["process"]
    );
    child.send("quit");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}
