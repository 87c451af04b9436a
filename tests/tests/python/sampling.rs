//! Heap sampling inside real CPythons, with numpy and torch loaded: every
//! sampled allocation takes a call stack through frames that CPython,
//! numpy's and PyTorch's wheels and Debian's builds compiled without frame
//! pointers. The wheel's library once walked frame pointers there and
//! crashed at its first sample (issue 44); `make test` runs this module
//! against both builds (`make test-shipped`), and each message names the
//! library under test ([`memshim_tests::build_under_test`]).

use memshim_tests::py::*;
use memshim_tests::{Cmd, build_under_test, ctl, mib};
use std::time::Duration;

/// pyenv's 3.11 and Debian sid's 3.14 (with Debian's numpy and torch).
fn pythons() -> Vec<Cpython> {
    let mut out: Vec<Cpython> = cpythons()
        .into_iter()
        .filter(|p| (p.origin(), p.minor.as_str()) == ("pyenv", "3.11"))
        .collect();
    out.extend(sid_cpythons(&["3.14"]));
    assert!(!out.is_empty(), "neither pyenv's 3.11 nor sid's 3.14");
    out
}

/// Whether `module` imports in `py` (without the shim).
fn has(py: &Cpython, module: &str) -> bool {
    py.cmd(["-c", &format!("import {module}")]).run().code == 0
}

/// `MEMSHIM_PROFILE=start`: sampling from the constructor on, so every
/// import and every array below is sampled as it is made. Exit 0, empty
/// stderr, the same stdout as without the shim.
#[test]
fn memshim_profile_start_with_numpy_and_torch_imported_exits_as_without() {
    let lib = build_under_test();
    for py in pythons() {
        let v = format!("{} with {lib}", py.label);
        assert!(
            has(&py, "numpy"),
            "{v}: numpy is not installed (make test-deps)"
        );
        let mut code = String::from(
            "import numpy\nkept = [numpy.ones(1 << 20) for _ in range(8)]\n\
             junk = [bytearray(1 << 16) for _ in range(256)]\n",
        );
        if has(&py, "torch") {
            code.push_str("import torch\nt = [torch.ones(1 << 20) for _ in range(8)]\n");
        } else {
            memshim_tests::skip(format_args!("{v}: torch is not installed: numpy only"));
        }
        code.push_str("print(sum(a.size for a in kept))\n");
        let plain = py.cmd(["-c", &code]).run();
        assert_eq!(plain.code, 0, "{v}, without the shim: {plain:?}");
        let o = py
            .cmd(["-c", &code])
            .shimmed()
            .env("MEMSHIM_PROFILE", "start")
            .run();
        assert_eq!(
            (o.code, o.stderr.as_str(), o.stdout.as_str()),
            (0, "", plain.stdout.as_str()),
            "{v}: {o:?}"
        );
    }
}

/// `MEMSHIM_PROFILE=on`, sampling switched on from outside, then numpy
/// allocates: the process lives, and the profile holds the arrays, under
/// numpy's library and the function that keeps them.
#[test]
fn a_numpy_program_sampled_from_outside_lives_and_its_profile_shows_the_arrays() {
    let lib = build_under_test();
    for py in pythons() {
        let v = format!("{} with {lib}", py.label);
        let (mut child, pid) = sampled(&py, "py_numpy.py", "sampling", Duration::from_secs(60));
        let run = |args: &[&str]| Cmd::new(ctl(), args).run();
        ask(&mut child, "alloc");
        let o = run(&["profile", &pid, "--json"]);
        assert_eq!(o.code, 0, "{v}: {o:?}");
        let p: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        let numpy = held_by_library(&p, &["_multiarray_umath"]);
        // 16 arrays of 8 MiB: each is sampled (one sample per 512 KiB).
        assert!(
            numpy >= 100 << 20,
            "{v}: numpy's library holds {:.1} MiB of the 128 MiB of arrays in\n{}",
            mib(numpy.max(0) as u64),
            o.stdout
        );
        assert_eq!(run(&["profile", &pid, "--stop"]).code, 0, "{v}");
        child.send("quit");
        let out = child.finish(Duration::from_secs(30));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}: {out:?}");
    }
}

/// Python frames in samples, walked inside allocations on every CPython:
/// deep recursion, generators and exceptions, ctypes with the GIL
/// released, threads that come and go, and daemon threads that still
/// allocate while the interpreter shuts down. Sampling from the start
/// (`MEMSHIM_PROFILE=start`, no request, so no exit hook) and switched on
/// from outside (the exit hook registered): the same output as without the
/// shim, exit 0, an empty stderr.
#[test]
fn walking_python_frames_in_samples_leaves_every_cpython_as_it_was() {
    let lib = build_under_test();
    let script = fixture_py("py_sample_stress.py");
    for py in cpythons() {
        let v = format!("{} with {lib}", py.label);
        let plain = py.cmd([&script]).stdin("go\n").run();
        assert_eq!(plain.code, 0, "{v}, without the shim: {plain:?}");
        for rounds in 0..3 {
            let o = py
                .cmd([&script])
                .shimmed()
                .env("MEMSHIM_PROFILE", "start")
                .stdin("go\n")
                .run();
            assert_eq!(
                (o.code, o.stderr.as_str(), o.stdout.as_str()),
                (0, "", plain.stdout.as_str()),
                "{v}, MEMSHIM_PROFILE=start, run {rounds}: {o:?}"
            );
        }
        let (mut child, _) = sampled(
            &py,
            "py_sample_stress.py",
            "sample-stress",
            Duration::from_secs(30),
        );
        child.send("go");
        let out = child.finish(Duration::from_secs(60));
        assert_eq!(
            (out.code, out.stderr.as_str(), out.stdout.lines().last()),
            (0, "", plain.stdout.lines().last()),
            "{v}, sampling switched on from outside: {out:?}"
        );
    }
}
