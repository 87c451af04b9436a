//! Memory comes back under pressure (thread/pressure.rs), in real memory
//! cgroups made by the tests: the A/B scenario of issue 13 at a smaller
//! scale. A (the heap fixture, shimmed, 60 s decay) frees a fragmented heap
//! and keeps its pages; B (unshimmed) then loads memory in 8 MiB steps.
//! With the watcher, A purges when usage nears the limit and both live;
//! with `MEMSHIM_PRESSURE=off`, the OOM killer ends one of them.

use memshim_tests::cgroups::*;
use memshim_tests::control::{ctl_json, heap_fixture};
use memshim_tests::*;
use serde_json::Value;
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// The cgroup's limit.
const LIMIT_MIB: u64 = 320;
/// A allocates this much in blocks of 16..512 KiB and frees every other
/// block: about half stays live, half is free pages kept by the decay.
/// Under transparent huge pages `always` a block's RSS is its jemalloc
/// size class (the untouched tail is in the same huge page), about 12%
/// more than it asked for: A alone must stay under the threshold then too
/// (256 MiB made 288 MiB of RSS, the threshold of 90% of 320 MiB; the
/// watcher then rightly purged before B began).
const A_MIB: u64 = 224;
/// B loads this much: more than the limit minus all of A's pages, less
/// than the limit minus A's live memory.
const B_MIB: u64 = 140;

/// A memory cgroup limited to [`LIMIT_MIB`] without swap, or `None`
/// (after printing SKIP) where tests cannot make one.
fn limited_cgroup(tag: &str) -> Option<TestCgroup> {
    let cg = TestCgroup::new(tag)?;
    let (limit, noswap) = if cg.version == 1 {
        (("memory.limit_in_bytes"), ("memory.swappiness", "0"))
    } else {
        ("memory.max", ("memory.swap.max", "0"))
    };
    std::fs::write(cg.dir.join(limit), (LIMIT_MIB * MIB).to_string()).unwrap();
    // Without swap the only way out is the OOM killer (and the test can
    // fail); machines without swap refuse nothing here.
    let _ = std::fs::write(cg.dir.join(noswap.0), noswap.1);
    Some(cg)
}

/// Starts A in `cg` with `env`, lets it build and free its heap, and waits
/// until its watcher has found the cgroup. Returns A and its `pressure`
/// section then.
fn start_a(cg: &TestCgroup, env: &[(&str, &str)]) -> (Child, Value) {
    let mut c = cg
        .cmd(heap_fixture(), Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_DIRTY_DECAY_MS", "60000");
    for (k, v) in env {
        c = c.env(k, v);
    }
    let mut a = c.spawn();
    a.wait_for_line("started", Duration::from_secs(10));
    a.send(&format!("alloc {A_MIB}"));
    a.wait_for_line("ready", Duration::from_secs(30));
    let pid = a.pid().to_string();
    let p = wait_until(Duration::from_secs(5), || {
        let p = pressure(&pid);
        (p["mode"] == "off" || p["source"] != "none").then_some(p)
    })
    .unwrap_or_else(|| panic!("the watcher never found the cgroup: {}", pressure(&pid)));
    (a, p)
}

fn stats(pid: &str) -> Value {
    let (code, s) = ctl_json(&["stats", pid]);
    assert_eq!(code, 0, "stats of A: {s}");
    s
}

fn pressure(pid: &str) -> Value {
    stats(pid)["pressure"].clone()
}

/// B: loads [`B_MIB`] in 4 MiB steps, 50 ms apart. From the threshold to
/// the limit are eight steps: 400 ms for A's thread to wake and purge on a
/// loaded machine, polling included where no eventfd is used (it takes
/// about 10 ms; BENCHMARKS.md s8 times it at full speed).
fn run_b(cg: &TestCgroup) -> Output {
    let b = fixture("pressure_load", &[]);
    cg.cmd(b, [B_MIB.to_string(), "4".into(), "50".into()])
        .run_timeout(Duration::from_secs(60))
}

/// OOM kills in the cgroup so far.
fn oom_kills(cg: &TestCgroup) -> u64 {
    let file = if cg.version == 1 {
        "memory.oom_control"
    } else {
        "memory.events"
    };
    std::fs::read_to_string(cg.dir.join(file))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// The line of /proc/`pid`/status that starts with `key`.
fn proc_status_line(pid: i32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or("")
        .to_owned()
}

/// `AnonHugePages` of `pid` (transparent huge pages), from smaps_rollup.
fn anon_huge_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("AnonHugePages:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .map_or(0, |kib: u64| kib << 10)
}

fn alive(a: &mut Child) -> bool {
    a.child.try_wait().unwrap().is_none()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn under_pressure_a_purges_so_both_processes_live_and_the_loader_finishes() {
    // A cgroup filled to its limit, timed (the purge within eight 50 ms steps).
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let Some(cg) = limited_cgroup("pressure-ab") else {
        return;
    };
    let (mut a, p) = start_a(&cg, &[]);
    let pid = a.pid().to_string();
    if container_view() && cg.version == 2 {
        // A sees its cgroup as a pod does: the root of its cgroup
        // namespace, on a read-only cgroup2 mount.
        // (/proc/<pid>/cgroup shows paths from the reader's namespace.)
        let ns = |p: &str, n: &str| std::fs::read_link(format!("/proc/{p}/ns/{n}")).unwrap();
        for n in ["cgroup", "pid", "mnt"] {
            assert_ne!(ns(&pid, n), ns("self", n), "A is in this {n} namespace");
        }
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        assert!(
            mounts.lines().any(|l| l.contains(" - cgroup2 ")
                && l.split_whitespace()
                    .nth(5)
                    .is_some_and(|o| o.split(',').any(|o| o == "ro"))),
            "no read-only cgroup2 mount in A's view:\n{mounts}"
        );
        let nspid = proc_status_line(a.pid(), "NSpid:");
        assert!(
            nspid.split_whitespace().count() == 3 && nspid.split_whitespace().last() == Some("1"),
            "A is not pid 1 of a pid namespace: {nspid}"
        );
    }
    assert_eq!(p["mode"], "on", "{p}");
    assert_eq!(p["source"], format!("v{}", cg.version), "{p}");
    assert_eq!(u(&p["limit"]), LIMIT_MIB * MIB, "{p}");
    assert_eq!(u(&p["threshold"]), LIMIT_MIB * MIB * 90 / 100, "{p}");
    let watching = p["watching"].as_array().unwrap();
    assert!(watching.iter().any(|w| w == "check"), "{p}");
    if cg.version == 1 {
        // The thread keeps its descriptors in a table of its own here, so
        // both eventfds are registered.
        assert!(watching.iter().any(|w| w == "usage_threshold"), "{p}");
        assert!(watching.iter().any(|w| w == "pressure_level"), "{p}");
    }
    assert_eq!((u(&p["purges"]), p["active"].as_bool()), (0, Some(false)));
    let rss_before = rss_bytes(a.pid());
    let huge_before = anon_huge_bytes(a.pid());

    let b = run_b(&cg);
    let kills = oom_kills(&cg);
    assert!(
        b.code == 0 && b.stdout.contains(&format!("loaded {B_MIB} in")),
        "B did not finish loading (OOM kills in the cgroup: {kills}): {b:?}"
    );
    assert!(alive(&mut a), "A died (OOM kills: {kills})");
    assert_eq!(kills, 0, "OOM kills in the cgroup");

    let s = stats(&pid);
    let p = &s["pressure"];
    let rss_after = rss_bytes(a.pid());
    eprintln!(
        "A: RSS {} before B ({} in huge pages), {} after; pressure: {p}",
        m(rss_before),
        m(huge_before),
        m(rss_after)
    );
    assert!(u(&p["events"]) >= 1 && u(&p["purges"]) >= 1, "{p}");
    assert!(
        u(&p["bytes_returned"]) >= 64 * MIB,
        "pressure purges returned too little: {p}"
    );
    assert!(
        rss_after + 64 * MIB <= rss_before,
        "A's RSS did not drop: {} -> {}",
        m(rss_before),
        m(rss_after)
    );
    assert!(p["last_purge_ms"].as_f64().is_some(), "{p}");
    // While pressure lasts, decay is short; 10 s after it is gone (B has
    // exited), A's own 60 s decay is back.
    if p["active"] == true {
        assert_eq!(s["config"]["dirty_decay_ms"], 100, "{}", s["config"]);
    }
    let back = wait_until(Duration::from_secs(25), || {
        let s = stats(&pid);
        (s["pressure"]["active"] == false && s["config"]["dirty_decay_ms"] == 60000).then_some(())
    });
    assert!(back.is_some(), "decay not restored: {}", stats(&pid));
    // Nothing of this shows in the process: exit status and stderr are as
    // without the shim.
    a.send("quit");
    let o = a.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// A purge that covers part of a huge page unmaps that part (RSS drops)
/// but leaves the whole page charged to the cgroup until reclaim splits
/// it: under a limit the OOM killer can come first. The shim splits such
/// pages as it purges (shim/src/os/thp.rs), so the cgroup's usage drops
/// with A's RSS. Twice: with A's heap as the kernel's mode puts it (in huge
/// pages in the VMs' THP `always` cells), and with jemalloc asking for huge
/// pages (`thp:always`, which `madvise`, Debian's default and this
/// machine's, grants: huge pages on the host's cgroup v1 too).
#[test]
fn a_purge_gives_the_cgroup_back_what_it_takes_from_rss_in_huge_pages_too() {
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let mode = thp_mode();
    for conf in ["", "thp:always"] {
        let Some(cg) = limited_cgroup("pressure-thp") else {
            return;
        };
        let (mut a, _) = start_a(&cg, &[("MEMSHIM_MALLOC_CONF", conf)]);
        let pid = a.pid().to_string();
        let (rss0, huge0, usage0) = (rss_bytes(a.pid()), anon_huge_bytes(a.pid()), cg.usage());
        let (code, r) = ctl_json(&["purge", &pid]);
        assert_eq!(code, 0, "purge: {r}");
        let (rss1, usage1) = (rss_bytes(a.pid()), cg.usage());
        let split = u(&stats(&pid)["config"]["thp_split_bytes"]);
        eprintln!(
            "THP {mode:?}, MEMSHIM_MALLOC_CONF={conf:?}: A's RSS {} ({} in huge pages) -> {}, \
             the cgroup's usage {} -> {}; purges split at {split} B",
            m(rss0),
            m(huge0),
            m(rss1),
            m(usage0),
            m(usage1)
        );
        assert!(rss1 + 64 * MIB <= rss0, "A's RSS did not drop: {}", m(rss1));
        // Not vacuous where it matters: where A's heap is in huge pages, the
        // shim knows it.
        if huge0 >= 32 * MIB {
            assert!(
                split >= 2 * MIB,
                "{} in huge pages, split at {split}",
                m(huge0)
            );
        }
        if conf == "thp:always" && mode.as_deref() == Some("madvise") {
            assert!(
                huge0 >= 32 * MIB,
                "jemalloc's thp:always: {} in huge pages",
                m(huge0)
            );
        }
        // The cgroup got back (nearly) all that A's RSS gave: without the
        // split, under THP, it got none of it.
        let given = rss0 - rss1;
        assert!(
            usage1 + given * 9 / 10 <= usage0,
            "A's RSS gave {}, the cgroup's usage went {} -> {}",
            m(given),
            m(usage0),
            m(usage1)
        );
        a.send("quit");
        let o = a.finish(Duration::from_secs(10));
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    }
}

#[test]
fn without_pressure_watching_the_oom_killer_ends_a_or_b() {
    // A cgroup filled to its limit, and the OOM killer.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let Some(cg) = limited_cgroup("pressure-off") else {
        return;
    };
    let (mut a, p) = start_a(&cg, &[("MEMSHIM_PRESSURE", "off")]);
    assert_eq!(p["mode"], "off", "{p}");
    assert_eq!(p["source"], "none", "{p}");
    assert_eq!(p["watching"].as_array().map(Vec::len), Some(0), "{p}");
    let b = run_b(&cg);
    let b_killed = b.code == 128 + 9;
    let a_killed = wait_until(Duration::from_secs(2), || (!alive(&mut a)).then_some(())).is_some();
    eprintln!(
        "off: B exit {}, A {}; OOM kills {}",
        b.code,
        if a_killed { "killed" } else { "alive" },
        oom_kills(&cg)
    );
    assert!(
        a_killed || b_killed,
        "with MEMSHIM_PRESSURE=off both lived: the scenario no longer needs the watcher: {b:?}"
    );
    assert!(oom_kills(&cg) >= 1);
}

#[test]
fn a_heap_already_over_a_lower_threshold_is_purged_without_any_loader() {
    // A cgroup filled to its limit.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let Some(cg) = limited_cgroup("pressure-threshold") else {
        return;
    };
    // 50% of 320 MiB is below A's heap, so the watcher's own check sees
    // pressure at once.
    let (a, p) = start_a(&cg, &[("MEMSHIM_PRESSURE_THRESHOLD", "50")]);
    let pid = a.pid().to_string();
    assert_eq!(u(&p["threshold"]), LIMIT_MIB * MIB / 2, "{p}");
    // The watcher may see the crossing while A is still building its heap
    // (then its purge finds little, and the short decay returns the rest):
    // either way A's free pages go back within seconds, not 60 s.
    let done = wait_until(Duration::from_secs(5), || {
        let p = pressure(&pid);
        (u(&p["purges"]) >= 1 && p["active"] == true && rss_bytes(a.pid()) < (A_MIB - 64) * MIB)
            .then_some(p)
    });
    assert!(
        done.is_some(),
        "RSS {}, {}",
        m(rss_bytes(a.pid())),
        pressure(&pid)
    );
}

#[test]
fn in_the_applications_descriptor_table_the_watcher_checks_usage_and_still_saves_both() {
    // A cgroup filled to its limit, timed (the purge within eight 50 ms steps).
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let Some(cg) = limited_cgroup("pressure-shared") else {
        return;
    };
    let (mut a, p) = start_a(&cg, &[("MEMSHIM_FD_TABLE", "shared")]);
    let watching = p["watching"].as_array().unwrap();
    // No eventfd in the application's table: its identity could not be
    // told from one of the application's.
    assert!(
        !watching
            .iter()
            .any(|w| w == "usage_threshold" || w == "pressure_level"),
        "{p}"
    );
    assert!(watching.iter().any(|w| w == "check"), "{p}");
    let b = run_b(&cg);
    assert_eq!(b.code, 0, "B: {b:?} (OOM kills {})", oom_kills(&cg));
    assert!(alive(&mut a), "A died");
    let p = pressure(&a.pid().to_string());
    assert!(u(&p["purges"]) >= 1, "{p}");
}

#[test]
fn gc_mode_collects_python_cycles_under_pressure_and_returns_their_memory() {
    // A cgroup filled to its limit.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let Some(cg) = limited_cgroup("pressure-gc") else {
        return;
    };
    // 200 MiB held only by reference cycles, with the collector off: only
    // a collection can free them.
    // Each buffer is exactly 1 MiB, a jemalloc size class, so that its RSS
    // is the same with and without transparent huge pages. The 200 MiB
    // stay under the threshold (75% of 320 MiB); pressure comes only when
    // A then loads 48 MiB more, after the garbage is all there (a
    // collection while it was being made would leave what came after).
    let script = "import gc, sys\n\
        gc.disable()\n\
        class Node: pass\n\
        for i in range(200):\n\
        \x20   n = Node(); n.buf = bytearray((1 << 20) - 1); n.me = n\n\
        del n\n\
        print('ready', flush=True)\n\
        sys.stdin.readline()\n\
        load = bytearray(48 << 20)\n\
        print('loaded', flush=True)\n\
        sys.stdin.readline()\n";
    let mut py = cg
        .cmd(python(), ["-c", script])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_PRESSURE", "gc")
        .env("MEMSHIM_PRESSURE_THRESHOLD", "75")
        .env("MEMSHIM_DIRTY_DECAY_MS", "60000")
        .spawn();
    py.wait_for_line("ready", Duration::from_secs(30));
    let pid = py.pid().to_string();
    let p = pressure(&pid);
    assert_eq!(
        (u(&p["gc_runs"]), u(&p["purges"])),
        (0, 0),
        "the garbage alone crossed the threshold (RSS {}): {p}",
        m(rss_bytes(py.pid()))
    );
    py.send("load");
    py.wait_for_line("loaded", Duration::from_secs(30));
    let done = wait_until(Duration::from_secs(10), || {
        let p = pressure(&pid);
        (u(&p["gc_runs"]) >= 1 && rss_bytes(py.pid()) < 100 * MIB).then_some(p)
    });
    let p = pressure(&pid);
    assert!(
        done.is_some(),
        "RSS {} after pressure in gc mode: {p}",
        m(rss_bytes(py.pid()))
    );
    assert_eq!(p["mode"], "gc", "{p}");
    // What the collection freed goes back by the purge after it (or, for
    // what is freed later, by the short decay, which is not counted).
    assert!(u(&p["bytes_returned"]) >= 64 * MIB, "{p}");
    let o = py.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// A cgroup v2 with `memory.high` at [`LIMIT_MIB`] and `memory.max` twice
/// that, without swap (Kubernetes memory QoS: the kubelet sets `high`
/// below the limit), or `None` after SKIP (v1 has no `memory.high`).
fn high_cgroup(tag: &str) -> Option<TestCgroup> {
    let cg = TestCgroup::new(tag)?;
    if cg.version != 2 {
        eprintln!("SKIP: memory.high is cgroup v2's (tests/tests/cgroup_vm.rs runs this on v2)");
        return None;
    }
    std::fs::write(cg.dir.join("memory.high"), (LIMIT_MIB * MIB).to_string()).unwrap();
    std::fs::write(cg.dir.join("memory.max"), (2 * LIMIT_MIB * MIB).to_string()).unwrap();
    let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
    Some(cg)
}

/// The `high` count of the cgroup's `memory.events`.
fn high_events(cg: &TestCgroup) -> u64 {
    std::fs::read_to_string(cg.dir.join("memory.events"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("high ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// The A/B scenario under `memory.high` once: B's load time (ms, from its
/// own report), the `high` events, and A's `pressure` section after.
fn high_scenario(tag: &str, env: &[(&str, &str)]) -> Option<(f64, u64, Value)> {
    let cg = high_cgroup(tag)?;
    let (mut a, p) = start_a(&cg, env);
    let pid = a.pid().to_string();
    if env.is_empty() {
        assert_eq!(
            u(&p["limit"]),
            LIMIT_MIB * MIB,
            "the threshold is not of memory.high: {p}"
        );
    }
    let b = cg
        .cmd(
            fixture("pressure_load", &[]),
            [B_MIB.to_string(), "4".into(), "50".into()],
        )
        .run_timeout(Duration::from_secs(300));
    assert!(
        b.code == 0 && b.stdout.contains(&format!("loaded {B_MIB} in")),
        "B did not finish loading under memory.high (OOM kills {}): {b:?}",
        oom_kills(&cg)
    );
    assert!(alive(&mut a), "A died under memory.high");
    let ms: f64 = b
        .stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("loaded {B_MIB} in "))?
                .strip_suffix(" ms")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no load time from B: {}", b.stdout));
    Some((ms, high_events(&cg), pressure(&pid)))
}

#[test]
fn under_memory_high_a_purges_so_the_loader_is_not_throttled() {
    // Without the watcher: A keeps its free pages, the cgroup stays over
    // memory.high, and the kernel throttles B (reclaim finds nothing
    // without swap, so B sleeps on each return to user space).
    let Some((off_ms, off_high, _)) = high_scenario("high-off", &[("MEMSHIM_PRESSURE", "off")])
    else {
        return;
    };
    let (on_ms, on_high, p) = high_scenario("high-on", &[]).unwrap();
    eprintln!(
        "memory.high: B loaded {B_MIB} MiB in {on_ms:.0} ms with the watcher ({on_high} high events), \
         {off_ms:.0} ms without ({off_high}); pressure: {p}"
    );
    assert!(
        u(&p["purges"]) >= 1 && u(&p["bytes_returned"]) >= 64 * MIB,
        "{p}"
    );
    assert!(
        on_ms * 2.0 < off_ms,
        "B was throttled as long with the watcher ({on_ms:.0} ms) as without ({off_ms:.0} ms): {p}"
    );
}
