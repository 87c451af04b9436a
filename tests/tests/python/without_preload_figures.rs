//! What the verbs read and draw of a CPython started without the preload
//! (issue 46), on every CPython the tests run: `stats` (the sections whose
//! figures exist without the shim, pymalloc's arenas among them), the
//! `torch` section, `empty-cache` and `release`'s CUDA steps against a
//! stand-in torch, `record` from `/proc` without stopping it, and
//! `profile --python`'s tracemalloc by ptrace. The process goes on as
//! before. Helpers and fixture: `without_preload.rs`.

use super::without_preload::{ctl_as_nobody, ctl_json, garbage, in_kernel_wait, start, start_for};
use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl, rss_bytes};
use std::time::Duration;

/// `elapsed=` of the fixture's last line.
fn elapsed(stdout: &str) -> f64 {
    stdout
        .split("elapsed=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed= in {stdout:?}"))
}

#[test]
fn stats_reaches_an_unshimmed_cpython_with_the_sections_that_exist_and_changes_nothing() {
    // The cgroup section is there wherever a memory cgroup is mounted:
    // v2's unified hierarchy with `memory` enabled, or v1's `memory`.
    let have_cgroup = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        || std::fs::metadata("/sys/fs/cgroup/memory/memory.usage_in_bytes").is_ok();
    let wait = 4.0;
    for py in cpythons() {
        let what = format!("CPython {}", py.label);
        let child = start_for(&py, "sleep", wait);
        let pid = child.pid();
        in_kernel_wait(pid);
        let (code, v, err) = ctl_json(&["stats", &pid.to_string(), "--json"]);
        assert_eq!((code, err.as_str()), (0, ""), "{what}: {v}");
        assert_eq!(v["pid"], pid, "{what}: {v}");
        assert_eq!(v["reached"]["by"], "ptrace", "{what}: {v}");
        assert!(
            v["allocator"].is_null() && v["config"].is_null(),
            "{what}: {v}"
        );
        let why = v["allocator_unavailable"].as_str().unwrap_or("");
        assert!(why.contains("libmemshim.so is not loaded"), "{what}: {v}");
        // The kernel's figures, as /proc says them now.
        let rss = v["process"]["rss"].as_u64().unwrap_or(0);
        let now = rss_bytes(pid);
        assert!(
            rss.abs_diff(now) < now / 20,
            "{what}: rss {rss}, /proc {now}"
        );
        assert_eq!(v["process"]["unmanaged"], rss, "{what}: {v}");
        assert!(
            v["process"]["anon"].as_u64().unwrap_or(0) > 0,
            "{what}: {v}"
        );
        if have_cgroup {
            // Its path as /proc/PID/cgroup says it, for the version found.
            let theirs = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            let prefix = if v["cgroup"]["version"] == 1 {
                "memory:"
            } else {
                ":"
            };
            let path = theirs
                .lines()
                .find_map(|l| l.split_once(':')?.1.strip_prefix(prefix))
                .unwrap_or("?");
            assert_eq!(v["cgroup"]["path"], path, "{what}: {v}");
            assert!(
                v["cgroup"]["current"].as_u64().unwrap_or(0) >= rss / 2,
                "{what}: {v}"
            );
        }
        // CPython's figures, read in the process: its version, the
        // collector it disabled, its 200000 garbage cycles still counted.
        let p = &v["python"];
        assert!(v["python_unavailable"].is_null(), "{what}: {v}");
        assert_eq!(p["version"], py.version.as_str(), "{what}: {v}");
        assert_eq!(p["gc_enabled"], false, "{what}: {v}");
        assert_eq!(p["free_threaded"], false, "{what}: {v}");
        assert_eq!(p["threads"], 1, "{what}: {v}");
        assert!(
            p["allocated_blocks"].as_u64().unwrap_or(0) > 200_000,
            "{what}: {v}"
        );
        assert!(
            p["gc_counts"][0].as_u64().unwrap_or(0) > 1000,
            "{what}: {v}"
        );
        // pymalloc's arenas, as `_PyObject_DebugMallocStats` wrote them into
        // a stream in the process's memory: whole arenas (256 KiB, 1 MiB
        // from 3.10), holding the 200000 cycles' objects, inside RSS.
        let arenas = p["pymalloc_arena_bytes"].as_u64().unwrap_or(0);
        assert!(
            arenas % (256 << 10) == 0 && (8 << 20..=rss).contains(&arenas),
            "{what}: pymalloc arenas {arenas} B, rss {rss}: {v}"
        );
        assert_eq!(
            p["gc_thresholds"].as_array().map(Vec::len),
            Some(3),
            "{what}: {v}"
        );
        // The human form: the shimmed report's sections, in its order.
        let o = Cmd::new(ctl(), ["stats", &pid.to_string()]).run();
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{what}: {o:?}");
        let h = &o.stdout;
        let at = |s: &str| {
            h.find(s)
                .unwrap_or_else(|| panic!("{what}: no {s:?} in\n{h}"))
        };
        assert!(
            at(&format!(
                "pid {pid}: reached by ptrace, not preloaded (CPython {}",
                py.minor
            )) < at("\nallocator: not available (libmemshim.so is not loaded")
                && at("\nallocator:") < at("\nprocess\n")
                && at("\nprocess\n") < at("\nconfig: not available")
                && at("\nconfig:") < at(&format!("\npython {}\n", py.version)),
            "{what}:\n{h}"
        );
        // Nothing collected, nothing lost: the wait ends on time.
        let o = child.finish(Duration::from_secs(30));
        assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{what}: {o:?}");
        assert!(
            garbage(&o.stdout) >= 200_000,
            "{what}: stats collected: {o:?}"
        );
        let e = elapsed(&o.stdout);
        assert!(
            (wait - 0.02..wait + 0.15).contains(&e),
            "{what}: waited {e} s for {wait} s"
        );
    }
}

/// `stats`' torch section, `empty-cache` and `release` on a CPython without
/// the preload: torch's own calls as the shim's bridge makes them, with its
/// figures, on the
/// device with a context only (a stand-in torch,
/// tests/fixtures/py_fake_cuda.py: CI has no GPU); and "nothing to do"
/// where torch is not imported. The process goes on.
#[test]
fn stats_empty_cache_and_release_make_the_bridges_cuda_calls_on_an_unshimmed_cpython() {
    const GIB: u64 = 1 << 30;
    let py = cpythons().into_iter().next().expect("a CPython");
    let mut child = py
        .cmd([fixture_py("py_fake_cuda.py").display().to_string()])
        .spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid().to_string();
    // stats: the torch section a shimmed process gives, read without a call
    // that changes anything.
    let (code, v, stderr) = ctl_json(&["stats", &pid, "--json"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "{v}");
    let t = &v["torch"];
    assert_eq!(
        (&t["version"], &t["cuda_initialized"]),
        (&"2.15.0+fake".into(), &true.into()),
        "{v}"
    );
    assert_eq!(
        t["devices"].as_array().map(Vec::len),
        Some(1),
        "only cuda:1 has a context: {v}"
    );
    let d = &t["devices"][0];
    assert_eq!(
        (&d["index"], &d["reserved"], &d["fragmentation"]),
        (&1.into(), &(4 * GIB).into(), &0.5.into()),
        "{v}"
    );
    assert_eq!(d["uuid"], "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", "{v}");
    assert_eq!(t["allocator_backend"], "native", "{v}");
    assert_eq!(
        t["alloc_conf"], "expandable_segments:False,max_split_size_mb:512",
        "{v}"
    );
    assert_eq!(t["host_pinned"]["cached"], 64 << 20, "{v}");
    let o = Cmd::new(ctl(), ["stats", &pid]).run();
    assert!(o.stdout.contains("torch 2.15.0+fake"), "{o:?}");
    let (code, v, stderr) = ctl_json(&["empty-cache", &pid, "--json"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "{v}");
    assert_eq!(v["devices"], serde_json::json!([1]), "{v}");
    assert_eq!(v["reserved_before"], 4 * GIB, "{v}");
    // What is allocated stays reserved: 1 GiB + 224 MiB.
    assert_eq!(v["reserved_after"], GIB + (224 << 20), "{v}");
    assert!(v["skipped"].is_null(), "{v}");
    assert_eq!(v["reached"]["by"], "ptrace", "{v}");
    child.send("calls");
    let calls = child.wait_for_line("calls:", Duration::from_secs(10));
    assert!(calls.contains(r#"["device.enter", 0, 1]"#), "{calls}");
    assert!(calls.contains(r#"["empty_cache", 1]"#), "{calls}");
    assert!(
        !calls.contains(r#"["empty_cache", 0]"#),
        "cuda:0 has no context: {calls}"
    );
    child.send("quit");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");

    // release: the CUDA steps of the shim's bridge, in its order, with its figures.
    let mut child = py
        .cmd([fixture_py("py_fake_cuda.py").display().to_string()])
        .spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let (code, v, stderr) = ctl_json(&["release", &child.pid().to_string(), "--json"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "{v}");
    let steps = &v["release"][0]["result"]["steps"];
    let kinds: Vec<&str> = steps
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|s| s["step"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        [
            "gc",
            "ipc_collect",
            "cublas_workspaces",
            "empty_cache",
            "host_cache",
            "purge"
        ],
        "{v}"
    );
    let figures = |i: usize| (steps[i]["before"].as_u64(), steps[i]["after"].as_u64());
    assert_eq!(figures(3), (Some(4 * GIB), Some(GIB)), "{v}");
    assert_eq!(figures(4), (Some(64 << 20), Some(0)), "{v}");
    assert_eq!(steps[3]["devices"][0]["index"], 1, "{v}");
    let ipc = figures(1);
    assert_eq!(ipc.0.unwrap() - ipc.1.unwrap(), 128 << 20, "{v}");
    child.send("quit");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");

    let child = start(&py, "sleep");
    in_kernel_wait(child.pid());
    let o = Cmd::new(ctl(), ["empty-cache", &child.pid().to_string()]).run();
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("nothing to do: torch is not imported"),
        "{o:?}"
    );
    let (code, v, _) = ctl_json(&["stats", &child.pid().to_string(), "--json"]);
    assert!(
        code == 0 && v["torch"].is_null() && v.get("torch_unavailable").is_none(),
        "{v}"
    );
    assert!(o.stdout.contains("reached by ptrace"), "{o:?}");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
}

/// `record` on a CPython without the preload: a timeline of its RSS (and
/// cgroup) from `/proc`, taken without stopping it (its sleep ends on time,
/// nothing traces it), that says so; the recording ends when it exits.
#[test]
fn record_draws_an_unshimmed_cpython_from_proc_without_stopping_it() {
    let py = cpythons().into_iter().next().expect("a CPython");
    let child = start_for(&py, "sleep", 3.0);
    let pid = child.pid();
    in_kernel_wait(pid);
    let out = memshim_tests::scratch().join(format!("record-unshimmed-{pid}.html"));
    let o = Cmd::new(
        ctl(),
        [
            "record",
            &pid.to_string(),
            "--seconds",
            "2",
            "--interval",
            "0.2",
            "-o",
            &out.display().to_string(),
        ],
    )
    .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert!(
        o.stdout.contains("not preloaded: recorded from /proc"),
        "{o:?}"
    );
    let samples: u32 = o
        .stdout
        .lines()
        .find(|l| l.contains("samples over"))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{o:?}"));
    assert!(samples >= 8, "{o:?}");
    let html = std::fs::read_to_string(&out).expect("the timeline");
    assert!(
        html.contains("RSS") && html.contains("not preloaded"),
        "{html}"
    );
    assert!(
        !html.contains("allocator resident"),
        "no allocator series without the shim"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(status.contains("TracerPid:\t0"), "{status}");
    let o = child.finish(Duration::from_secs(30));
    assert_eq!((o.code, o.stderr.as_str()), (5, ""), "{o:?}");
    // Root's preloaded CPython, recorded by uid 65534, which may not read
    // its maps: not called "not preloaded" (it was), nor anything else.
    let mut shimmed = py
        .cmd([
            fixture_py("py_unshimmed.py").display().to_string(),
            "sleep".into(),
            "3".into(),
        ])
        .shimmed()
        .spawn();
    shimmed.wait_for_line("ready", Duration::from_secs(60));
    let out = std::path::PathBuf::from(format!("/tmp/memshim-record-other-{}.svg", shimmed.pid()));
    let o = ctl_as_nobody(&[
        "record",
        &shimmed.pid().to_string(),
        "--seconds",
        "1",
        "-o",
        &out.display().to_string(),
    ]);
    let _ = std::fs::remove_file(&out);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        !o.stdout.contains("not preloaded") && o.stdout.contains("is not known"),
        "{o:?}"
    );
    let o = shimmed.finish(Duration::from_secs(30));
    assert_eq!(o.code, 5, "{o:?}");
    assert!(
        (3.0..3.5).contains(&elapsed(&o.stdout)),
        "its sleep ended on time: {o:?}"
    );

    // A process that exits ends the recording, which says so.
    let child = start_for(&py, "sleep", 0.5);
    let pid = child.pid().to_string();
    let o = Cmd::new(
        ctl(),
        [
            "record",
            &pid,
            "--seconds",
            "5",
            "--interval",
            "0.1",
            "-o",
            &out.display().to_string(),
        ],
    )
    .run();
    assert_eq!(
        o.code,
        i32::from(memshim_proto::exit::NOT_FOUND.code),
        "{o:?}"
    );
    assert!(o.stderr.contains("the recording stopped after"), "{o:?}");
    child.finish(Duration::from_secs(30));
}

/// `profile --python` on a CPython without the preload, on every CPython:
/// tracemalloc switched on by ptrace (and left on with `--keep`), the line
/// that keeps the memory on top, `--stop` switches off what memshim-ctl
/// started and never the program's own tracing; the program's output and
/// exit are unchanged.
#[test]
fn python_lines_of_an_unshimmed_cpython_name_the_line_that_keeps_the_memory() {
    let script = fixture_py("py_profile.py");
    let (where_, _) = super::profile::grow_line();
    for py in cpythons() {
        let v = &py.label;
        let mut child = py.cmd([script.display().to_string()]).spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        let pid = child.pid().to_string();
        in_kernel_wait(child.pid());
        let profile = |args: &[&str]| {
            let mut a = vec!["profile", &pid, "--python"];
            a.extend_from_slice(args);
            Cmd::new(ctl(), a).run()
        };
        let o = profile(&["--seconds", "0", "--keep", "--json"]);
        assert_eq!(o.code, 0, "{v}: {o:?}");
        assert!(
            o.stderr.contains("tracemalloc started") && o.stderr.contains("reached by ptrace"),
            "{v}: {o:?}"
        );
        // The program waits and allocates nothing: memshim-ctl's own calls
        // are not counted (they showed as `<string>:1`, 30 to 140 KiB).
        let v_json: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
        let snap = &v_json["snapshot"];
        let lines = snap["lines"].as_array().cloned().unwrap_or_default();
        assert!(
            lines
                .iter()
                .all(|l| !l["file"].as_str().unwrap_or("<").starts_with('<')),
            "{v}: {snap}"
        );
        assert!(
            snap["bytes"].as_u64().is_some_and(|b| b < 32 << 10),
            "{v}: {snap}"
        );
        child.send("grow");
        child.wait_for_line("grown", Duration::from_secs(30));
        in_kernel_wait(child.pid());
        let o = profile(&[]);
        assert_eq!(o.code, 0, "{v}: {o:?}");
        let first = super::profile::table_rows(&o.stdout)
            .first()
            .copied()
            .unwrap_or("");
        assert!(
            first.contains(&where_),
            "{v}: the top line keeps the memory:\n{}",
            o.stdout
        );
        let share: f64 = first
            .split_whitespace()
            .nth(2)
            .and_then(|s| s.trim_end_matches('%').parse().ok())
            .unwrap_or_else(|| panic!("{v}: {first}"));
        assert!(share >= 80.0, "{v}: {first}");
        let o = profile(&["--stop"]);
        assert!(
            o.code == 0 && o.stdout.contains("tracemalloc stopped"),
            "{v}: {o:?}"
        );
        child.send("traced");
        assert_eq!(
            child
                .wait_for_line("traced", Duration::from_secs(10))
                .trim(),
            "traced False",
            "{v}"
        );
        // The program's own tracing is never stopped.
        child.send("trace");
        child.wait_for_line("tracing", Duration::from_secs(10));
        in_kernel_wait(child.pid());
        let o = profile(&["--stop"]);
        assert!(
            o.code == 0 && o.stdout.contains("the program's own"),
            "{v}: {o:?}"
        );
        child.send("traced");
        assert_eq!(
            child
                .wait_for_line("traced", Duration::from_secs(10))
                .trim(),
            "traced True",
            "{v}"
        );
        child.send("quit");
        let o = child.finish(Duration::from_secs(30));
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{v}: {o:?}");
    }
}
