//! `memshim-ctl cgroup` and `reclaim` on real memory cgroups made by the
//! tests: page cache read inside the cgroup, `/dev/shm` leftovers and files
//! in use, shimmed processes with allocator and Python figures.

use memshim_tests::cgroups::*;
use memshim_tests::control::{ctl_json, ctl_run};
use memshim_tests::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn sleeper_that_read(cg: &TestCgroup, file: &std::path::Path) -> Child {
    let script = format!(
        "cat '{}' > /dev/null; echo ready; exec sleep 600",
        file.display()
    );
    let mut ch = cg.cmd("sh", ["-c", &script]).spawn();
    ch.wait_for_line("ready", Duration::from_secs(30));
    ch
}

#[test]
fn reclaim_drops_the_page_cache_of_a_file_read_inside_the_cgroup() {
    let Some(cg) = TestCgroup::new("cache") else {
        return;
    };
    let file = uncached_file("cgroup-cache", 64);
    let sleeper = sleeper_that_read(&cg, &file);
    let pid = sleeper.pid().to_string();
    let before = cg.file_pages();
    assert!(
        before >= 48 * MIB,
        "reading 64 MiB inside the cgroup should charge its page cache there: {}",
        m(before)
    );

    // `cgroup` reports it, and the working set the way cAdvisor computes it.
    let (code, r) = ctl_json(&["cgroup", &pid]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["cgroup"]["path"], cg.path.as_str(), "{r}");
    assert_eq!(r["cgroup"]["version"], cg.version);
    let mem = &r["memory"];
    let (usage, inactive) = (
        mem["usage"].as_u64().unwrap(),
        mem["inactive_file"].as_u64().unwrap(),
    );
    assert_eq!(
        mem["working_set"].as_u64().unwrap(),
        usage.saturating_sub(inactive),
        "{mem}"
    );
    assert!(mem["page_cache"].as_u64().unwrap() >= 48 * MIB, "{mem}");
    assert_eq!(r["parts"]["page_cache"]["action"], "reclaim");
    assert!(
        r["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == sleeper.pid()),
        "the sleeper is listed: {r}"
    );
    let human = ctl_run(&["cgroup", &pid]);
    assert!(
        human.stdout.contains("working set")
            && human.stdout.contains("page cache")
            && human.stdout.contains("MiB"),
        "{human:?}"
    );

    let (code, r) = ctl_json(&["reclaim", &pid]);
    assert_eq!(code, 0, "{r}");
    let after = cg.file_pages();
    let kernel = &r["kernel"];
    eprintln!(
        "page cache of {}: {} before reclaim, {} after ({} written to {} in {} ms, {})",
        cg.path,
        m(before),
        m(after),
        kernel["wrote"],
        kernel["file"],
        kernel["elapsed_ms"],
        kernel["outcome"]
    );
    assert!(
        matches!(kernel["outcome"].as_str(), Some("done" | "partial")),
        "{r}"
    );
    assert!(after < 8 * MIB, "page cache after reclaim: {}", m(after));
    let b = r["before"]["memory"]["page_cache"].as_u64().unwrap();
    let a = r["after"]["memory"]["page_cache"].as_u64().unwrap();
    assert!(
        b >= 48 * MIB && a < 8 * MIB,
        "reported before {} after {}",
        m(b),
        m(a)
    );
    // What dashboards read: usage drops by the page cache. The working set
    // (usage minus inactive file) excluded that cache already, so it stays
    // about where it was; kernel memory can grow by a few pages meanwhile,
    // so only its formula is checked here.
    let (ub, ua) = (
        r["before"]["memory"]["usage"].as_u64().unwrap(),
        r["after"]["memory"]["usage"].as_u64().unwrap(),
    );
    assert!(
        ua + 40 * MIB <= ub,
        "usage before {} after {}: {r}",
        m(ub),
        m(ua)
    );
    let am = &r["after"]["memory"];
    assert_eq!(
        am["working_set"].as_u64().unwrap(),
        ua.saturating_sub(am["inactive_file"].as_u64().unwrap()),
        "{am}"
    );
    // The sleeper lives on.
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    drop(sleeper);
    let _ = std::fs::remove_file(file);
}

/// Maps /dev/shm/mapped (4 MiB written), holds /dev/shm/held open (2 MiB)
/// and a deleted /dev/shm/gone (1 MiB), then waits.
const SHM_USER: &str = r#"
import mmap, os, sys
f = open('/dev/shm/mapped', 'w+b'); f.truncate(4 << 20)
m = mmap.mmap(f.fileno(), 4 << 20); m[:] = b'x' * (4 << 20); f.close()
h = open('/dev/shm/held', 'w+b'); h.write(b'y' * (2 << 20)); h.flush()
g = open('/dev/shm/gone', 'w+b'); g.write(b'g' * (1 << 20)); g.flush(); os.unlink('/dev/shm/gone')
print('ready', flush=True)
sys.stdin.readline()
"#;

#[test]
fn a_dev_shm_leftover_is_unowned_and_files_mapped_or_held_are_in_use() {
    let Some(cg) = TestCgroup::new("shm") else {
        return;
    };
    // A container's /dev/shm: a tmpfs of its own mount namespace. A worker
    // left an 8 MiB file behind; a live process maps one file and holds
    // another open.
    let script = format!(
        "mount -t tmpfs -o size=64m memshim-test-shm /dev/shm && head -c 8388608 /dev/zero > /dev/shm/leftover \
         && exec '{}' -c \"$0\"",
        python().display()
    );
    let mut user = cg
        .cmd("unshare", ["-m", "sh", "-c", &script, SHM_USER])
        .spawn();
    user.wait_for_line("ready", Duration::from_secs(30));
    let pid = user.pid();
    // memory.stat is flushed lazily (per-CPU batches, every 2 s at most):
    // wait until it shows the 15 MiB written.
    let _ = wait_until(Duration::from_secs(5), || {
        (cg.shmem() >= 14 * MIB).then_some(())
    });

    let (code, r) = ctl_json(&["cgroup", &pid.to_string()]);
    assert_eq!(code, 0, "{r}");
    let file = |name: &str| shm_file(&r, name);
    let left = file("/dev/shm/leftover");
    assert_eq!(left["state"], "unowned", "{left}");
    assert_eq!(left["bytes"], 8 * MIB, "{left}");
    assert_eq!(left["users"].as_array().unwrap().len(), 0);
    for name in ["/dev/shm/mapped", "/dev/shm/held"] {
        let f = file(name);
        assert_eq!(f["state"], "in_use", "{f}");
        assert_eq!(f["users"][0], pid, "{f}");
    }
    let gone = file("/dev/shm/gone (deleted)");
    assert_eq!(
        (gone["state"].as_str(), gone["bytes"].as_u64()),
        (Some("in_use"), Some(MIB)),
        "{gone}"
    );
    assert_eq!(gone["users"][0], pid, "{gone}");
    assert_eq!(r["shm"]["unowned_bytes"], 8 * MIB);
    assert_eq!(r["parts"]["shm_unowned"]["bytes"], 8 * MIB);
    assert_eq!(r["parts"]["shm_unowned"]["action"], "delete");
    // The kernel charges the tmpfs pages written inside the cgroup to it.
    let shmem = r["memory"]["shmem"].as_u64().unwrap();
    assert!(
        shmem >= 14 * MIB,
        "shmem {} (kernel says {})",
        m(shmem),
        m(cg.shmem())
    );
    eprintln!("shmem of {}: {}; /dev/shm: {}", cg.path, m(shmem), r["shm"]);

    let human = ctl_run(&["cgroup", &pid.to_string()]);
    let line = human
        .stdout
        .lines()
        .find(|l| l.ends_with("/dev/shm/leftover"))
        .unwrap_or_else(|| panic!("{}", human.stdout));
    assert!(
        line.contains("8.0 MiB") && line.contains("unowned"),
        "{line}"
    );
    assert!(
        human.stdout.contains("`rm` it to give its memory back"),
        "{}",
        human.stdout
    );

    // The kernel counts the 4 MiB mapped file in mapped_file too; it is
    // shared memory, under `shmem`, not among the mapped files `reclaim`
    // gives back (it was, where the page cache was larger than it).
    let file = uncached_file("shm-cache", 16);
    assert_eq!(cg.cmd("cat", [file.to_str().unwrap()]).run().code, 0);
    let (_, r) = ctl_json(&["cgroup", &pid.to_string()]);
    let mapped = r["memory"]["mapped_file"].as_u64().unwrap();
    let part = r["parts"]["mapped_file"]["bytes"].as_u64().unwrap();
    assert!(
        part <= mapped.saturating_sub(4 * MIB),
        "mapped files {} of the kernel's {}: {}",
        m(part),
        m(mapped),
        r["parts"]
    );
    user.send("done");
}

#[test]
fn shimmed_processes_are_listed_with_allocator_and_python_figures_and_reclaim_purges_them() {
    let Some(cg) = TestCgroup::new("shim") else {
        return;
    };
    let (heap, freed) = cg.freed_heap(128);
    let py_src = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)\n";
    let mut py = cg
        .cmd(python(), ["-c", py_src])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    py.wait_for_line("ready", Duration::from_secs(30));
    let (hp, pp) = (heap.pid(), py.pid());

    // Both endpoints up (the shim's thread starts within a tick).
    let r = wait_until(Duration::from_secs(10), || {
        let (code, r) = ctl_json(&["cgroup", &hp.to_string()]);
        let procs = r["processes"].as_array()?.clone();
        let up = |pid: i32| {
            procs
                .iter()
                .any(|p| p["pid"] == pid && p["endpoint"] == true)
        };
        let py_ok = procs
            .iter()
            .any(|p| p["pid"] == pp && p["python"]["version"].is_string());
        (code == 0 && up(hp) && up(pp) && py_ok).then_some(r)
    })
    .expect("both shimmed processes answer, Python with its section");
    let procs = r["processes"].as_array().unwrap();
    let h = procs.iter().find(|p| p["pid"] == hp).unwrap();
    assert_eq!(h["shim"], "yes");
    assert!(
        h["allocator"]["purgeable"].as_u64().unwrap() > freed / 2,
        "{h}"
    );
    assert!(h["allocator"]["resident"].as_u64().unwrap() > freed, "{h}");
    let p = procs.iter().find(|p| p["pid"] == pp).unwrap();
    assert!(
        p["python"]["version"].as_str().unwrap().starts_with("3."),
        "{p}"
    );
    assert!(
        r["parts"]["allocator_free"]["bytes"].as_u64().unwrap() > freed / 2,
        "{}",
        r["parts"]
    );
    let human = ctl_run(&["cgroup", &hp.to_string()]);
    assert!(
        human.stdout.contains("allocators, free") && human.stdout.contains("py 3."),
        "{}",
        human.stdout
    );

    let rss_before = rss_bytes(hp);
    let anon_before = r["memory"]["anon"].as_u64().unwrap();
    let (code, rr) = ctl_json(&["reclaim", &hp.to_string()]);
    assert_eq!(code, 0, "{rr}");
    let purged: Vec<&serde_json::Value> = rr["purge"].as_array().unwrap().iter().collect();
    assert_eq!(purged.len(), 2, "both shimmed processes purged: {rr}");
    let hr = purged.iter().find(|o| o["pid"] == hp).unwrap();
    assert!(
        hr["result"]["released"].as_u64().unwrap() > freed / 2,
        "{hr}"
    );
    let rss_after = rss_bytes(hp);
    let anon_after = rr["after"]["memory"]["anon"].as_u64().unwrap();
    eprintln!(
        "heap pid {hp}: freed {}; rss {} -> {}; cgroup anon {} -> {}; allocator free {} -> {}",
        m(freed),
        m(rss_before),
        m(rss_after),
        m(anon_before),
        m(anon_after),
        m(rr["before"]["parts"]["allocator_free"]["bytes"]
            .as_u64()
            .unwrap()),
        m(rr["after"]["parts"]["allocator_free"]["bytes"]
            .as_u64()
            .unwrap()),
    );
    assert!(
        rss_after + freed / 2 < rss_before,
        "RSS drops by the freed pages"
    );
    assert!(
        anon_after + freed / 2 < anon_before,
        "so does the cgroup's anon"
    );
    assert!(
        rr["after"]["parts"]["allocator_free"]["bytes"]
            .as_u64()
            .unwrap()
            < freed / 8,
        "{rr}"
    );
    let human = ctl_run(&["reclaim", &hp.to_string()]);
    assert_eq!(human.code, 0, "{human:?}");
    assert!(
        human.stdout.contains("RSS BEFORE") && human.stdout.contains("BEFORE      AFTER"),
        "{}",
        human.stdout
    );
}

/// A cgroup with no limit of its own inside one limited to 1 GiB (a
/// container in a pod with a pod-level limit): the limit shown is the
/// parent's, which the kernel enforces (it showed "none").
#[test]
fn the_limit_of_a_cgroup_without_one_is_its_closest_limited_ancestors() {
    let Some(pod) = TestCgroup::new("pod") else {
        return;
    };
    let limit_file = if pod.version == 1 {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    std::fs::write(pod.dir.join(limit_file), (1u64 << 30).to_string()).unwrap();
    if pod.version == 2 {
        // The child's memory controller comes from its parent's.
        std::fs::write(pod.dir.join("cgroup.subtree_control"), "+memory").unwrap();
    }
    let dir = pod.dir.join("ctr");
    std::fs::create_dir(&dir).unwrap();
    let ctr = TestCgroup {
        dir,
        path: format!("{}/ctr", pod.path),
        version: pod.version,
        mount: pod.mount.clone(),
    };
    let (mut heap, _) = ctr.freed_heap(8);
    let pid = heap.pid().to_string();
    let o = ctl_run(&["cgroup", &pid, "--json"]);
    assert_eq!(o.code, 0, "{o:?}");
    let r: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(r["cgroup"]["path"], ctr.path.as_str(), "{r}");
    assert_eq!(r["memory"]["limit"], 1u64 << 30, "{r}");
    let s = ctl_run(&["stats", &pid, "--json"]);
    assert_eq!(s.code, 0, "{s:?}");
    let s: serde_json::Value = serde_json::from_str(&s.stdout).unwrap();
    assert_eq!(s["cgroup"]["max"], 1u64 << 30, "{s}");
    // `doctor` says the same (it said "unlimited").
    let d = ctl_run(&["doctor", &pid, "--json"]);
    let d: serde_json::Value = serde_json::from_str(&d.stdout).unwrap();
    assert_eq!(d["host"]["cgroup"]["memory_max"], 1u64 << 30, "{d}");
    heap.send("quit");
    let _ = heap.finish(Duration::from_secs(10));
    drop(ctr);
}

#[test]
fn without_a_pid_it_reports_its_own_cgroup() {
    let Some(cg) = TestCgroup::new("self") else {
        return;
    };
    let o = cg.cmd(ctl(), ["cgroup", "--json"]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let r: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(r["pid"], serde_json::Value::Null);
    assert_eq!(r["cgroup"]["path"], cg.path.as_str(), "{r}");
    assert_eq!(
        r["processes"].as_array().unwrap().len(),
        1,
        "only memshim-ctl itself: {r}"
    );
}

#[test]
fn in_a_cgroup_namespace_of_its_own_it_still_finds_its_cgroup() {
    let Some(cg) = TestCgroup::new("cgns") else {
        return;
    };
    // As in a container with a cgroup namespace but the host's cgroupfs
    // mount: /proc/self/cgroup says "/", the mount's root is above it.
    let o = cg
        .cmd(
            "unshare",
            ["-C", &ctl().display().to_string(), "cgroup", "--json"],
        )
        .run();
    if o.stderr.contains("unshare:") {
        eprintln!("SKIP: unshare -C does not work here: {}", o.stderr.trim());
        return;
    }
    assert_eq!(o.code, 0, "{o:?}");
    let r: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(r["cgroup"]["path"], "/", "{r}");
    assert_eq!(r["cgroup"]["dir"], cg.dir.display().to_string(), "{r}");
    assert_eq!(r["cgroup"]["searched"], true, "{r}");
    assert!(r["notes"].to_string().contains("found by searching"), "{r}");
}
