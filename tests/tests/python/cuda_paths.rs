//! The bridge's CUDA paths without a GPU: a CPython whose `torch` is a
//! stand-in answering PyTorch's calls (tests/fixtures/py_fake_cuda.py; the
//! real torch cannot initialise CUDA on CI). Proves the bridge's own logic:
//! the stats fields, the order and figures of release's CUDA steps, that a
//! device without a context is never touched, and what the CLI shows.
//! tests/gpu/check_cuda.py checks the same against real PyTorch on a GPU.

use memshim_proto::{ReleaseStepKind, Reply, Request, StepOutcome};
use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl, python};
use std::time::Duration;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

#[test]
fn stats_release_and_doctor_follow_pytorchs_cuda_allocators() {
    let dir = socket_dir("fake-cuda");
    let mut child = shimmed_python(&python(), &fixture_py("py_fake_cuda.py"), &[], &dir).spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid();
    let sock = socket_of(&dir, pid);

    let s = stats(&sock);
    let t = s.torch.expect("torch section");
    assert!(t.cuda_initialized);
    assert_eq!(t.devices.len(), 1, "only cuda:1 has a context: {t:?}");
    let d = &t.devices[0];
    assert_eq!(
        (d.index, d.reserved, d.inactive_split),
        (1, 4 * GIB, 2 * GIB)
    );
    assert_eq!(d.fragmentation, 0.5);
    assert_eq!(d.num_alloc_retries, 3);
    assert_eq!(
        d.uuid.as_deref(),
        Some("GPU-00000001-aaaa-bbbb-cccc-dddddddddddd")
    );
    assert_eq!(t.allocator_backend.as_deref(), Some("native"));
    assert_eq!(
        t.alloc_conf.as_deref(),
        Some("expandable_segments:False,max_split_size_mb:512")
    );
    let h = t.host_pinned.expect("pinned host cache");
    assert_eq!((h.allocated, h.cached), (64 * MIB, 64 * MIB));

    // doctor explains the fragmentation it sees.
    let doc = Cmd::new(ctl(), ["doctor", &pid.to_string()])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert!(
        doc.stdout.contains("cuda:1 is fragmented: 50%")
            && doc.stdout.contains("3 allocation retries"),
        "{doc:?}"
    );

    let Reply::Release(r) = ok(request(&sock, &Request::Release)) else {
        panic!()
    };
    let kinds: Vec<ReleaseStepKind> = r.steps.iter().map(|s| s.step).collect();
    assert_eq!(
        kinds,
        [
            ReleaseStepKind::Gc,
            ReleaseStepKind::IpcCollect,
            ReleaseStepKind::CublasWorkspaces,
            ReleaseStepKind::EmptyCache,
            ReleaseStepKind::HostCache,
            ReleaseStepKind::Purge
        ],
        "{r:?}"
    );
    assert!(
        r.steps.iter().all(|s| s.outcome == StepOutcome::Done),
        "{r:?}"
    );
    let step = |k| r.steps.iter().find(|s| s.step == k).unwrap();
    let ipc = step(ReleaseStepKind::IpcCollect);
    assert_eq!(ipc.before - ipc.after, 128 * MIB, "{ipc:?}");
    let ws = step(ReleaseStepKind::CublasWorkspaces);
    assert_eq!(ws.before - ws.after, 96 * MIB, "{ws:?}");
    let ec = step(ReleaseStepKind::EmptyCache);
    assert_eq!((ec.before, ec.after), (4 * GIB, GIB), "{ec:?}");
    assert_eq!(ec.devices.len(), 1);
    assert_eq!(ec.devices[0].index, 1);
    let hc = step(ReleaseStepKind::HostCache);
    assert_eq!((hc.before, hc.after), (64 * MIB, 0), "{hc:?}");

    // The calls, in order, never on cuda:0 and never the public
    // ipc_collect (which would initialise CUDA).
    let calls = ask(&mut child, "calls");
    let calls: serde_json::Value =
        serde_json::from_str(calls.trim_start_matches("calls: ")).unwrap();
    let names: Vec<&str> = calls
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[0].as_str().unwrap())
        .filter(|n| *n != "memory_stats")
        .collect();
    assert_eq!(
        names,
        [
            "_cuda_ipc_collect",
            "_cuda_clearCublasWorkspaces",
            "device.enter",
            "empty_cache",
            "device.exit",
            "empty_host_cache"
        ],
        "{calls}"
    );
    for c in calls.as_array().unwrap() {
        let name = c[0].as_str().unwrap();
        if name == "empty_cache" {
            assert_eq!(
                c[1], 1,
                "empty_cache ran with cuda:{} current: {calls}",
                c[1]
            );
        }
        if name == "device.enter" {
            assert_eq!(c[2], 1, "{calls}");
        }
    }

    // The CLI shows each step, and exits 0.
    let out = Cmd::new(ctl(), ["release", &pid.to_string()])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    for want in [
        "ipc-collect",
        "cublas-workspaces",
        "empty-cache",
        "host-cache",
    ] {
        assert!(out.stdout.contains(want), "{want}: {out:?}");
    }
    child.send("quit");
    let out = child.finish(Duration::from_secs(30));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

#[test]
fn without_cuda_release_has_one_cuda_step_with_nothing_to_do() {
    let dir = socket_dir("fake-cuda-off");
    let mut child = shimmed_python(
        &python(),
        &fixture_py("py_fake_cuda.py"),
        &["--cuda-off"],
        &dir,
    )
    .spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let sock = socket_of(&dir, child.pid());
    let s = stats(&sock);
    let t = s.torch.expect("torch section");
    assert!(!t.cuda_initialized && t.devices.is_empty());
    assert!(
        t.host_pinned.is_none() && t.allocator_backend.is_none(),
        "{t:?}"
    );
    let Reply::Release(r) = ok(request(&sock, &Request::Release)) else {
        panic!()
    };
    assert_eq!(r.steps.len(), 3, "{r:?}");
    assert_eq!(r.steps[1].step, ReleaseStepKind::EmptyCache);
    assert_eq!(
        r.steps[1].skipped.as_deref(),
        Some("CUDA is not initialized")
    );
    let calls = ask(&mut child, "calls");
    assert_eq!(calls, "calls: []", "nothing CUDA may be called");
    child.send("quit");
    let out = child.finish(Duration::from_secs(30));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}
