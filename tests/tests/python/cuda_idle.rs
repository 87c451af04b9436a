//! The idle VRAM return (`MEMSHIM_CUDA_IDLE_MS`) without a GPU: a CPython
//! whose `torch` is the stand-in of tests/fixtures/py_fake_cuda.py (cuda:1
//! has a context and 4 GiB reserved, 1.2 GiB allocated, a 64 MiB pinned
//! host cache; cuda:0 has none). Proves the shim's decision: off by
//! default; never while the process keeps the CPU and the GPU busy, nor
//! while the GPU allocates with little CPU; once after the idle time, on
//! cuda:1 only, with the figures counted in `stats` and the metrics; not
//! below `MEMSHIM_CUDA_IDLE_MIN_MB`; nothing CUDA when CUDA is not
//! initialised. tests/gpu/check_cuda.py checks it against real PyTorch.

use memshim_proto::CudaIdleCounters;
use memshim_tests::py::*;
use memshim_tests::{Child, Cmd, ctl, poll_every, python};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn start(tag: &str, envs: &[(&str, &str)], args: &[&str]) -> (Child, PathBuf, PathBuf) {
    let dir = socket_dir(tag);
    let mut cmd = shimmed_python(&python(), &fixture_py("py_fake_cuda.py"), args, &dir);
    for (k, v) in envs {
        cmd = cmd.env(k, v);
    }
    let mut child = cmd.spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let sock = socket_of(&dir, child.pid());
    (child, dir, sock)
}

fn counters(sock: &Path) -> CudaIdleCounters {
    stats(sock).cuda_idle.expect("cuda_idle in stats")
}

/// Polls the counters every 400 ms (each `stats` takes the GIL and some
/// CPU: polled faster, the process would not look idle) until `want`.
fn wait_counters(
    sock: &Path,
    timeout: Duration,
    want: impl Fn(&CudaIdleCounters) -> bool,
) -> Option<CudaIdleCounters> {
    poll_every(Duration::from_millis(400), timeout, || {
        Some(counters(sock)).filter(&want)
    })
}

/// The recorded CUDA calls as (name, current device, first argument).
fn calls(child: &mut Child) -> Vec<(String, i64, Option<i64>)> {
    let line = ask(child, "calls");
    let v: serde_json::Value = serde_json::from_str(line.trim_start_matches("calls: ")).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c[0].as_str().unwrap().to_owned(),
                c[1].as_i64().unwrap(),
                c.get(2).and_then(|a| a.as_i64()),
            )
        })
        .collect()
}

fn emptied(calls: &[(String, i64, Option<i64>)]) -> usize {
    calls.iter().filter(|c| c.0 == "empty_cache").count()
}

#[test]
fn the_caches_go_back_once_after_the_idle_time_and_never_while_busy() {
    let (mut child, dir, sock) = start("cuda-idle", &[("MEMSHIM_CUDA_IDLE_MS", "1000")], &[]);
    // Busy: CPU and GPU allocations for 3 s, three idle times.
    child.send("busy 3");
    child.wait_for_line("busy-done", Duration::from_secs(20));
    let during = calls(&mut child);
    assert_eq!(emptied(&during), 0, "emptied while busy: {during:?}");
    let t0 = Instant::now();
    let c = wait_counters(&sock, Duration::from_secs(10), |c| c.returns > 0)
        .unwrap_or_else(|| panic!("no idle return within 10 s: {:?}", counters(&sock)));
    let after_ms = t0.elapsed().as_millis();
    assert_eq!(c.returns, 1, "{c:?}");
    assert_eq!(c.idle_ms, 1000);
    assert_eq!(c.min_bytes, 256 * MIB);
    // Reserved 4 GiB down to what is allocated; the whole pinned cache.
    assert_eq!(c.vram_returned, 4 * GIB - (GIB + 224 * MIB), "{c:?}");
    assert_eq!(c.pinned_returned, 64 * MIB, "{c:?}");
    let done = calls(&mut child);
    assert_eq!(emptied(&done), 1, "{done:?}");
    for (name, current, arg) in &done {
        if name == "empty_cache" {
            assert_eq!(*current, 1, "empty_cache on cuda:{current}: {done:?}");
        }
        if name == "device.enter" {
            assert_eq!(
                *arg,
                Some(1),
                "entered a device without a context: {done:?}"
            );
        }
    }
    assert!(done.iter().any(|c| c.0 == "empty_host_cache"), "{done:?}");
    // Still idle: nothing more to do, and nothing is done again (on
    // purpose: three idle times pass, in which nothing may happen).
    std::thread::sleep(Duration::from_secs(3));
    let later = counters(&sock);
    assert_eq!(later.returns, 1, "{later:?}");
    assert_eq!(emptied(&calls(&mut child)), 1);
    // The metrics carry the counters.
    let m = Cmd::new(ctl(), ["metrics"])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(m.code, 0, "{m:?}");
    let pid = format!("pid=\"{}\"", child.pid());
    let line = |name: &str, extra: &str| {
        m.stdout
            .lines()
            .find(|l| l.starts_with(name) && l.contains(&pid) && l.contains(extra))
            .unwrap_or_else(|| panic!("no {name} {extra} for {pid}: {}", m.stdout))
            .to_owned()
    };
    assert!(line("memshim_cuda_idle_returns_total", "").ends_with(" 1"));
    let vram = line("memshim_cuda_idle_returned_bytes_total", "kind=\"vram\"");
    assert!(vram.ends_with(&format!(" {}", c.vram_returned)), "{vram}");
    child.send("quit");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
    eprintln!("idle return {after_ms} ms after the busy period ended (idle time 1000 ms)");
}

#[test]
fn off_by_default_and_never_while_the_gpu_allocates() {
    // Off by default: no counters, no CUDA call but the stats' reads.
    let (mut child, _dir, sock) = start("cuda-idle-off", &[], &[]);
    // On purpose: 2.5 s in which an idle return that was on by default
    // would look, and act.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(stats(&sock).cuda_idle, None);
    let c = calls(&mut child);
    assert!(c.iter().all(|c| c.0 == "memory_stats"), "{c:?}");
    drop(child);

    // The GPU allocates every 300 ms with little CPU: looks, never acts.
    let (mut child, _dir, sock) = start(
        "cuda-idle-trickle",
        &[("MEMSHIM_CUDA_IDLE_MS", "1000")],
        &[],
    );
    child.send("gpu-trickle 300");
    child.wait_for_line("trickle-set", Duration::from_secs(5));
    let looked = wait_counters(&sock, Duration::from_secs(10), |c| c.checks >= 4)
        .unwrap_or_else(|| panic!("fewer than 4 looks in 10 s: {:?}", counters(&sock)));
    assert_eq!(looked.returns, 0, "{looked:?}");
    assert_eq!(emptied(&calls(&mut child)), 0);
    // The GPU stops: the caches go back.
    child.send("gpu-trickle 0");
    child.wait_for_line("trickle-set", Duration::from_secs(5));
    let c = wait_counters(&sock, Duration::from_secs(10), |c| c.returns == 1);
    assert!(c.is_some(), "{:?}", counters(&sock));
}

#[test]
fn too_little_unused_or_no_cuda_means_nothing_is_done() {
    // 5 GiB minimum; 2.8 GiB + 64 MiB unused.
    let (mut child, _dir, sock) = start(
        "cuda-idle-min",
        &[
            ("MEMSHIM_CUDA_IDLE_MS", "1000"),
            ("MEMSHIM_CUDA_IDLE_MIN_MB", "5120"),
        ],
        &[],
    );
    let mut c = wait_counters(&sock, Duration::from_secs(10), |c| c.checks >= 2)
        .unwrap_or_else(|| panic!("fewer than 2 looks: {:?}", counters(&sock)));
    // Two looks settle it; a look that found the GIL busy (a loaded
    // machine) makes one more. Then it never looks again while idle.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // On purpose: settled means 1.5 s without a look.
        std::thread::sleep(Duration::from_millis(1500));
        let now = counters(&sock);
        if now.checks == c.checks {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kept looking while idle: {now:?}"
        );
        c = now;
    }
    // On purpose: two more idle times without a look.
    std::thread::sleep(Duration::from_secs(2));
    let later = counters(&sock);
    assert_eq!(
        (later.returns, later.checks),
        (0, c.checks),
        "looked again while idle"
    );
    assert_eq!(emptied(&calls(&mut child)), 0);
    drop(child);

    // CUDA not initialised: not one CUDA call, ever.
    let (mut child, _dir, sock) = start(
        "cuda-idle-nocuda",
        &[("MEMSHIM_CUDA_IDLE_MS", "1000")],
        &["--cuda-off"],
    );
    let c = wait_counters(&sock, Duration::from_secs(10), |c| c.checks >= 1);
    assert!(c.is_some(), "no look: {:?}", counters(&sock));
    // On purpose: two idle times in which nothing may happen.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(counters(&sock).returns, 0);
    assert_eq!(ask(&mut child, "calls"), "calls: []");
}
