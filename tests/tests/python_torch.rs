//! Real PyTorch on the CPU: a BERT model built from its config, unloaded,
//! then `release`, while the main thread sleeps.
//!
//! * With the default python3's torch (PyPI's): needs `torch` and
//!   `transformers` there, so it is `#[ignore]`d in `make test`'s
//!   integration run and run by `make test-torch` (which CI runs after
//!   installing them; see docs/python.md "Tests"). Without torch it fails
//!   loudly: a target that exists to run it must not pass by skipping.
//! * With Debian's torch and transformers on Debian sid's python3 (3.14),
//!   in the root scripts/test-deps.sh builds (`memshim_tests::sid`): runs
//!   in the integration run, and says SKIP with the reason where the root
//!   is unavailable.

use memshim_proto::{Reply, Request};
use memshim_tests::py::*;
use memshim_tests::{mib, rss_bytes, sid};
use std::io::Write;
use std::time::Duration;

const MIB: u64 = 1024 * 1024;

#[test]
#[ignore = "needs torch and transformers: make test-torch"]
fn bert_unloaded_then_release_returns_its_memory_and_never_touches_cuda() {
    bert_cycle(&default_python());
}

/// The same with Debian's torch (its CPU build) and transformers, on the
/// python3 Debian builds them for (3.14; the root's manifest names it).
#[test]
fn bert_on_debian_sid_python_with_debian_torch_unloaded_then_released() {
    let Some(s) = sid::sid_or_skip("BERT with Debian's torch on Debian sid's python3") else {
        return;
    };
    let minor = s.manifest("torch_python").unwrap_or("3.14");
    let Some(py) = sid_cpythons(&[minor]).pop() else {
        return;
    };
    bert_cycle(&py);
}

/// Load, unload, release while the main thread sleeps, on `py`: RSS back
/// near its baseline, the torch section there, CUDA never initialised.
fn bert_cycle(py: &Cpython) {
    let v = &py.label;
    let dir = socket_dir(&format!("torch-{}", py.tag()));
    let mut child = py
        .shimmed(&fixture_py("py_torch.py"), &[], &dir)
        // Keep what `del model` frees until the release purges it, so the
        // figures show the release at work rather than the idle decay.
        .env("MEMSHIM_DIRTY_DECAY_MS", "-1")
        .spawn();
    let ready = child.wait_for_line("ready", Duration::from_secs(180));
    let pid = child.pid();
    let sock = socket_of(&dir, pid);
    let threads = ask(&mut child, "threads");

    let Reply::Stats(s) = ok(request(
        &sock,
        &Request::Stats {
            arenas: false,
            pss: false,
        },
    )) else {
        panic!()
    };
    let t = s
        .torch
        .unwrap_or_else(|| panic!("{v}: torch is imported: the torch section must be there"));
    assert!(
        ready.contains(&format!("torch={}", t.version)),
        "{v}: {ready} vs {}",
        t.version
    );
    assert!(!t.cuda_initialized, "{v}");
    assert!(t.devices.is_empty(), "{v}");

    let base = rss_bytes(pid);
    ask(&mut child, "load");
    let loaded = rss_bytes(pid);
    ask(&mut child, "unload");
    let unloaded = rss_bytes(pid);
    let model = loaded.saturating_sub(base);
    assert!(
        model > 300 * MIB,
        "{v}: bert-base should take >300 MiB, took {:.0}",
        mib(model)
    );

    let Reply::EmptyCache(e) = ok(request(&sock, &Request::EmptyCache)) else {
        panic!()
    };
    assert_eq!(e.skipped.as_deref(), Some("CUDA is not initialized"), "{v}");
    // The release runs while the main thread sleeps, as a server's does
    // between requests.
    child.send("sleep 10");
    child.wait_for_line("sleeping", Duration::from_secs(10));
    let asleep = std::time::Instant::now();
    let Reply::Release(r) = ok(request(&sock, &Request::Release)) else {
        panic!()
    };
    let after = rss_bytes(pid);
    assert!(
        asleep.elapsed() < Duration::from_secs(8),
        "{v}: release took {:?}: the main thread may have woken meanwhile",
        asleep.elapsed()
    );
    assert!(
        r.steps
            .iter()
            .all(|s| s.outcome != memshim_proto::StepOutcome::Failed),
        "{v}: {r:?}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "torch release, {v}, torch {}: baseline {:.1} MiB, loaded {:.1} MiB, after del {:.1} MiB, after release {:.1} MiB; steps: {}",
        t.version,
        mib(base),
        mib(loaded),
        mib(unloaded),
        mib(after),
        r.steps
            .iter()
            .map(|s| format!(
                "{} {:?} {:.1}->{:.1} MiB {:.1} ms{}",
                s.name(),
                s.outcome,
                mib(s.before),
                mib(s.after),
                s.elapsed_ms,
                s.skipped
                    .as_deref()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default()
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let limit = base + model * 15 / 100 + 32 * MIB;
    assert!(
        after <= limit,
        "{v}: RSS after release {:.1} MiB, limit {:.1} MiB",
        mib(after),
        mib(limit)
    );

    // No CUDA: neither initialised by the bridge nor any driver loaded.
    assert_eq!(ask(&mut child, "cuda"), "cuda: initialized=False", "{v}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("libcuda.so"),
        "{v}: the CUDA driver was loaded"
    );
    assert_eq!(ask(&mut child, "threads"), threads, "{v}");

    child.send("quit");
    let out = child.finish(Duration::from_secs(60));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
}
