//! Real PyTorch on the CPU: a BERT model built from its config, unloaded,
//! then `release`. Needs `torch` and `transformers` for the default
//! python3, so these tests are `#[ignore]`d in `make test` and run by
//! `make test-torch` (which CI runs after installing them; see
//! docs/python.md "Tests"). Without torch they fail loudly: a target that
//! exists to run them must not pass by skipping.

use memshim_proto::{Reply, Request};
use memshim_tests::py::*;
use memshim_tests::{mib, python, rss_bytes};
use std::io::Write;
use std::time::Duration;

const MIB: u64 = 1024 * 1024;

#[test]
#[ignore = "needs torch and transformers: make test-torch"]
fn bert_unloaded_then_release_returns_its_memory_and_never_touches_cuda() {
    let dir = socket_dir("torch");
    let mut child = shimmed_python(&python(), &fixture_py("py_torch.py"), &[], &dir)
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
        .expect("torch is imported: the torch section must be there");
    assert!(
        ready.contains(&format!("torch={}", t.version)),
        "{ready} vs {}",
        t.version
    );
    assert!(!t.cuda_initialized);
    assert!(t.devices.is_empty());

    let base = rss_bytes(pid);
    ask(&mut child, "load");
    let loaded = rss_bytes(pid);
    ask(&mut child, "unload");
    let unloaded = rss_bytes(pid);
    let model = loaded.saturating_sub(base);
    assert!(
        model > 300 * MIB,
        "bert-base should take >300 MiB, took {:.0}",
        mib(model)
    );

    let Reply::EmptyCache(e) = ok(request(&sock, &Request::EmptyCache)) else {
        panic!()
    };
    assert_eq!(e.skipped.as_deref(), Some("CUDA is not initialized"));
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
        "release took {:?}: the main thread may have woken meanwhile",
        asleep.elapsed()
    );
    assert!(
        r.steps
            .iter()
            .all(|s| s.outcome != memshim_proto::StepOutcome::Failed),
        "{r:?}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "torch release: baseline {:.1} MiB, loaded {:.1} MiB, after del {:.1} MiB, after release {:.1} MiB; steps: {}",
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
        "RSS after release {:.1} MiB, limit {:.1} MiB",
        mib(after),
        mib(limit)
    );

    // No CUDA: neither initialised by the bridge nor any driver loaded.
    assert_eq!(ask(&mut child, "cuda"), "cuda: initialized=False");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libcuda.so"), "the CUDA driver was loaded");
    assert_eq!(ask(&mut child, "threads"), threads);

    child.send("quit");
    let out = child.finish(Duration::from_secs(60));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}
