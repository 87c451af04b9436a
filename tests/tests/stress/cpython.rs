//! CPython's own regression tests under the shim, compared with a run
//! without it (tests/cpython/regrtest_compare.py does the work); and, in
//! the `ptrace` mode, without the preload while `memshim-ctl release`
//! reaches every process of the run by ptrace each second (issue 46); and
//! in the `attach` mode, with every process of the run attached (`attach
//! --idle-return`) and released over the bridge's socket each second.

use memshim_tests::stress::{Level, figures};
use memshim_tests::*;
use std::time::Duration;

/// At least 12 modules: gc, threading, subprocess, fork, signals, mmap,
/// ctypes, os, sqlite3, pickle, json, zlib, tracemalloc; asyncio (full).
const FULL: &[&str] = &[
    "test_gc",
    "test_threading",
    "test_subprocess",
    "test_fork1",
    "test_signal",
    "test_mmap",
    "test_ctypes",
    "test_os",
    "test_sqlite3",
    "test_pickle",
    "test_json",
    "test_zlib",
    "test_tracemalloc",
    "test_faulthandler",
    "test_select",
    "test_thread",
    "test_tempfile",
    "test_asyncio",
];
/// Left out of the smoke form: the slow test_subprocess (33 s alone),
/// test_asyncio and the extras; the rest takes about 20 s per mode on two cores.
const FULL_ONLY: &[&str] = &[
    "test_subprocess",
    "test_faulthandler",
    "test_select",
    "test_thread",
    "test_tempfile",
    "test_asyncio",
];

/// The CPython that has `Lib/test` (pyenv's 3.11 by default).
fn cpython() -> Option<std::path::PathBuf> {
    let py = python();
    let o = Cmd::new(
        &py,
        ["-c", "import test.support, test.libregrtest; print('ok')"],
    )
    .run();
    (o.code == 0).then_some(py)
}

pub fn run(level: Level) {
    let Some(py) = cpython() else {
        println!(
            "SKIP: {} has no Lib/test (CPython's test suite is not installed)",
            python().display()
        );
        return;
    };
    let modules: Vec<&str> = FULL
        .iter()
        .copied()
        .filter(|m| level.pick(!FULL_ONLY.contains(m), true))
        .collect();
    let script = root().join("tests/cpython/regrtest_compare.py");
    let mut args = vec![
        script.display().to_string(),
        "--shim".into(),
        shim().display().to_string(),
        "--ctl".into(),
        ctl().display().to_string(),
        "--modes".into(),
        level
            .pick(
                "base,on,off,ptrace,attach",
                "base,on,off,auto,ptrace,attach",
            )
            .into(),
        "--jobs".into(),
        "2".into(),
    ];
    args.extend(modules.iter().map(|m| m.to_string()));
    let t0 = std::time::Instant::now();
    let o = Cmd::new(&py, &args)
        .dir(scratch())
        .run_timeout(Duration::from_secs(level.pick(900, 1800)));
    assert_eq!(
        o.code, 0,
        "regrtest_compare.py failed: {}\n{}",
        o.stderr, o.stdout
    );
    let v: serde_json::Value = serde_json::from_str(&o.stdout)
        .unwrap_or_else(|e| panic!("regrtest_compare.py output is not JSON ({e}): {}", o.stdout));
    let runs = v["runs"].as_array().unwrap();
    let mut kv = vec![
        ("python", v["python"].as_str().unwrap_or("?").to_owned()),
        ("modules", modules.len().to_string()),
    ];
    for r in runs {
        let m = r["mode"].as_str().unwrap();
        kv.push((leak(format!("{m}_tests_run")), r["tests_run"].to_string()));
        kv.push((
            leak(format!("{m}_failures")),
            r["failures"].as_array().unwrap().len().to_string(),
        ));
        kv.push((leak(format!("{m}_seconds")), r["seconds"].to_string()));
        println!(
            "mode {m}: rc {} tests run {} failures {} (not reproduced alone: {}; expected in this mode: {})",
            r["rc"], r["tests_run"], r["failures"], r["not_reproduced"], r["expected"]
        );
        if let Some(u) = r["unexplained"].as_str().filter(|u| !u.is_empty()) {
            println!("mode {m}: failed without naming a case; its output's end:\n{u}");
        }
        let expected = r["expected"].as_object().map_or(0, |o| o.len());
        kv.push((
            leak(format!("{m}_expected_differences")),
            expected.to_string(),
        ));
    }
    let new = v["new_failures"].as_array().unwrap();
    kv.push(("new_failures", new.len().to_string()));
    kv.push(("seconds", t0.elapsed().as_secs().to_string()));
    figures(level, "cpython_regrtest", &kv);
    for r in runs {
        assert!(
            r["tests_run"].as_u64().unwrap_or(0) > 100,
            "mode {} ran almost nothing: {}",
            r["mode"],
            r["tail"]
        );
    }
    // The ptrace mode did reach the processes (a release that reached
    // nothing proves nothing).
    let ptrace = runs
        .iter()
        .find(|r| r["mode"] == "ptrace")
        .expect("the ptrace mode ran");
    let reached = ptrace["releases"]["0"].as_u64().unwrap_or(0);
    println!("ptrace mode: releases by exit code {}", ptrace["releases"]);
    assert!(
        reached >= 5,
        "few releases reached the run's processes: {}",
        ptrace["releases"]
    );
    // The attach mode did attach (and release over the socket).
    let attach = runs
        .iter()
        .find(|r| r["mode"] == "attach")
        .expect("the attach mode ran");
    println!(
        "attach mode: attaches by exit code {}, releases by exit code {}; refusals: {}",
        attach["attaches"], attach["releases"], attach["attach_refusals"]
    );
    assert!(
        attach["attaches"]["0"].as_u64().unwrap_or(0) >= 5
            && attach["releases"]["0"].as_u64().unwrap_or(0) >= 5,
        "few attaches or releases reached the run's processes: {} {}",
        attach["attaches"],
        attach["releases"]
    );
    assert!(
        new.is_empty(),
        "new failures under the shim (reproduced alone, passing without the shim): {new:?}\n{}",
        serde_json::to_string_pretty(runs).unwrap()
    );
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}
