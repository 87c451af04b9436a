//! list / stats / purge against real shimmed processes (C and CPython) that
//! allocate and free a fragmented heap with decay off: the freed pages stay
//! resident until `memshim-ctl purge` returns them.

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
    assert_eq!(s.code, 4, "{s:?}");
    assert!(
        s.stderr.contains(&format!("pid {pid}")) && s.stderr.contains("MEMSHIM_CONTROL=on"),
        "{s:?}"
    );
    let none = ctl_run(&["stats", &std::process::id().to_string()]);
    assert_eq!(none.code, 3, "{none:?}");
    assert!(none.stderr.contains("not loaded"), "{none:?}");
}
