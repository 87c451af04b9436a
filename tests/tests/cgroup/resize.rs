//! `memshim-ctl reclaim --to SIZE`, the step before an in-place resize of a
//! pod's limit (the kubelet refuses a limit under the pod's usage): on real
//! memory cgroups made by the tests, it reaches a size made of page cache
//! and freed heap, and where what is left is in use it exits 10 naming who
//! holds it.

use memshim_proto::exit;
use memshim_tests::cgroups::*;
use memshim_tests::control::{ctl_json, ctl_run};
use memshim_tests::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn usage(r: &serde_json::Value, when: &str) -> u64 {
    r[when]["memory"]["usage"].as_u64().unwrap()
}

/// Waits until `cgroup` shows the shimmed `heap` with its endpoint.
fn wait_for_endpoint(heap: &Child) {
    let hp = heap.pid().to_string();
    wait_until(Duration::from_secs(10), || {
        let (code, r) = ctl_json(&["cgroup", &hp]);
        (code == 0
            && r["processes"]
                .as_array()?
                .iter()
                .any(|p| p["pid"] == heap.pid() && p["endpoint"] == true))
        .then_some(())
    })
    .expect("the heap's endpoint answers");
}

#[test]
fn reclaim_to_reaches_a_size_made_of_page_cache_and_freed_heap() {
    let Some(cg) = TestCgroup::new("resize") else {
        return;
    };
    // A shimmed heap with 96 MiB freed and kept (no decay), and a sleeper
    // whose 64 MiB read left page cache charged to the cgroup.
    let (heap, freed) = cg.freed_heap(96);
    let file = uncached_file("cgroup-resize", 64);
    let script = format!(
        "cat '{}' > /dev/null; echo ready; exec sleep 600",
        file.display()
    );
    let mut sleeper = cg.cmd("sh", ["-c", &script]).spawn();
    sleeper.wait_for_line("ready", Duration::from_secs(30));
    let hp = heap.pid().to_string();
    wait_for_endpoint(&heap);

    let (_, r) = ctl_json(&["cgroup", &hp]);
    let before = r["memory"]["usage"].as_u64().unwrap();
    let cache = r["memory"]["page_cache"].as_u64().unwrap();
    assert!(cache >= 48 * MIB, "page cache charged: {}", m(cache));
    // Both the freed heap and the page cache must go for the size asked.
    let target = before - (freed / 2 + cache / 2);
    let (code, rr) = ctl_json(&["reclaim", "--to", &target.to_string(), &hp]);
    eprintln!(
        "usage {} -> {} (asked {}; freed heap {}, page cache {}): kernel {}",
        m(usage(&rr, "before")),
        m(usage(&rr, "after")),
        m(target),
        m(freed),
        m(cache),
        rr["kernel"]
    );
    assert_eq!(code, i32::from(exit::OK.code), "{rr}");
    assert_eq!(rr["reached"], true, "{rr}");
    assert_eq!(rr["to"], target, "{rr}");
    assert!(rr["left"].is_null(), "{rr}");
    assert!(usage(&rr, "after") <= target, "{rr}");
    let purged = rr["purge"].as_array().unwrap();
    assert!(
        purged
            .iter()
            .any(|o| o["pid"] == heap.pid()
                && o["result"]["released"].as_u64().unwrap_or(0) > freed / 2),
        "the heap was purged: {rr}"
    );
    // Sizes with units are read the way the settings read them.
    let o = ctl_run(&["reclaim", "--to", "1T", &hp]);
    assert_eq!(o.code, i32::from(exit::OK.code), "{o:?}");
    assert!(o.stdout.contains("under the size asked already"), "{o:?}");
    drop(sleeper);
    let _ = std::fs::remove_file(file);
}

#[test]
fn reclaim_to_under_what_is_in_use_exits_10_and_names_the_holder() {
    let Some(cg) = TestCgroup::new("resize-held") else {
        return;
    };
    // 64 MiB that a process holds and touches: no purge or reclaim can take
    // it (there is no swap on the test machines; where there is, the
    // swappiness=0 key or v1's force_empty leaves anonymous memory alone).
    let src = "b = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n\
               print('ready', flush=True)\nimport sys; sys.stdin.readline()\n";
    let mut holder = cg.cmd(python(), ["-c", src]).spawn();
    holder.wait_for_line("ready", Duration::from_secs(30));
    let pid = holder.pid().to_string();

    let (code, r) = ctl_json(&["reclaim", "--to", "8M", &pid]);
    assert_eq!(code, i32::from(exit::NOT_REACHED.code), "{r}");
    assert_eq!(r["reached"], false, "{r}");
    let left = r["left"].as_u64().unwrap();
    assert!(
        left >= 48 * MIB && usage(&r, "after") == 8 * MIB + left,
        "{r}"
    );

    let o = ctl_run(&["reclaim", "--to", "8M", &pid]);
    assert_eq!(o.code, i32::from(exit::NOT_REACHED.code), "{o:?}");
    let listed = o
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("left:"))
        .any(|l| l.split_whitespace().next() == Some(pid.as_str()));
    assert!(listed, "the holder is named under `left:`: {}", o.stdout);
    assert!(o.stderr.contains("in use"), "{}", o.stderr);
    holder.send("done");

    // A size that is not one is a usage error, before anything is done.
    let o = ctl_run(&["reclaim", "--to", "lots", &pid]);
    assert_eq!(o.code, i32::from(exit::USAGE.code), "{o:?}");
    assert!(o.stderr.contains("is not a size"), "{}", o.stderr);
}

/// With `--gc` each shimmed process is asked for a `release`, and `--json`
/// gives its answer as it came, steps and all, under `release`: not a
/// purge's figures made up from it (an earlier version filled `purge`'s
/// `resident_*` from the release's RSS and its `purgeable_before` with 0).
#[test]
fn reclaim_gc_reports_each_release_as_the_process_answered() {
    let Some(cg) = TestCgroup::new("reclaim-gc") else {
        return;
    };
    let (heap, freed) = cg.freed_heap(48);
    let hp = heap.pid().to_string();
    wait_for_endpoint(&heap);
    let (code, r) = ctl_json(&["reclaim", "--gc", &hp]);
    assert_eq!(code, i32::from(exit::OK.code), "{r}");
    assert!(r.get("purge").is_none(), "no purge made up: {r}");
    let ours = r["release"]
        .as_array()
        .and_then(|a| a.iter().find(|o| o["pid"] == heap.pid()))
        .unwrap_or_else(|| panic!("the heap's release: {r}"));
    let result = &ours["result"];
    assert!(
        result["released"].as_u64().unwrap() > freed / 2,
        "released most of {}: {r}",
        m(freed)
    );
    let steps = result["steps"].as_array().unwrap();
    let purge = steps
        .iter()
        .find(|s| s["step"] == "purge")
        .unwrap_or_else(|| panic!("a purge step: {r}"));
    assert_eq!(purge["outcome"], "done", "{r}");
    assert_eq!(purge["measure"], "rss", "{r}");
    assert!(
        steps.iter().any(|s| s["step"] == "gc"),
        "the gc step is reported: {r}"
    );
    // The human report names the step it asked for, per process.
    let o = ctl_run(&["reclaim", "--gc", &hp]);
    assert_eq!(o.code, i32::from(exit::OK.code), "{o:?}");
    assert!(o.stdout.contains("\nrelease:\n"), "{o:?}");
    assert!(o.stdout.contains(&format!("pid {hp} (")), "{o:?}");
}

/// A process whose `release` ends it (its gc runs a finalizer that exits)
/// has exited meanwhile: it is `skipped`, and `reclaim` succeeds (it failed,
/// exit 1, "the process exited while memshim-ctl talked to it"). It is a
/// zombie until this test reaps it, as under a parent that has not yet.
#[test]
fn a_process_that_exits_during_reclaim_gc_is_skipped() {
    let Some(cg) = TestCgroup::new("reclaim-exits") else {
        return;
    };
    let script = "import os, sys, time\n\
                  class Bomb:\n    def __del__(self): os._exit(0)\n\
                  a = Bomb(); b = [a]; a.ref = b\n\
                  del a, b\n\
                  print('ready', flush=True)\n\
                  time.sleep(600)\n";
    let mut bomb = cg
        .cmd(python(), ["-c", script])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    bomb.wait_for_line("ready", Duration::from_secs(30));
    wait_for_endpoint(&bomb);
    let bp = bomb.pid().to_string();
    let (code, r) = ctl_json(&["reclaim", "--gc", &bp]);
    assert_eq!(code, i32::from(exit::OK.code), "{r}");
    let skipped = r["skipped"].as_array().unwrap();
    assert!(
        skipped
            .iter()
            .any(|s| s["pid"] == bomb.pid() && s["reason"] == "exited meanwhile"),
        "{r}"
    );
    let o = bomb.finish(Duration::from_secs(10));
    assert_eq!(o.code, 0, "{o:?}");
}
