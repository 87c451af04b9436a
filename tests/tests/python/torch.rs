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

/// A heap profile of a real BERT on Debian's torch: while the model is
/// loaded, PyTorch's libraries hold its weights, and the profile says so;
/// after inference and `del model`, what they still hold is named, and is
/// a small part of it.
#[test]
fn a_heap_profile_names_the_libraries_that_hold_a_bert_and_what_is_left_after_unload() {
    let Some(s) = sid::sid_or_skip("a heap profile of BERT on Debian sid's python3") else {
        return;
    };
    let minor = s.manifest("torch_python").unwrap_or("3.14");
    let Some(py) = sid_cpythons(&[minor]).pop() else {
        return;
    };
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let v = &py.label;
    let dir = socket_dir(&format!("torch-profile-{}", py.tag()));
    let mut child = py
        .shimmed(&fixture_py("py_torch.py"), &[], &dir)
        .env("MEMSHIM_PROFILE", "on")
        .spawn();
    child.wait_for_line("ready", Duration::from_secs(180));
    let pid = child.pid().to_string();
    socket_of(&dir, child.pid());
    let ctl = |args: &[&str]| memshim_tests::Cmd::new(memshim_tests::ctl(), args).run();
    let on = ctl(&["profile", &pid, "--seconds", "0", "--keep"]);
    assert_eq!(on.code, 0, "{v}: {on:?}");
    ask(&mut child, "load");
    let held_by_torch = |o: &memshim_tests::Output| -> (i64, i64) {
        assert_eq!(o.code, 0, "{v}: {o:?}");
        let p: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        let torch = held_by_library(&p, &["libtorch", "libc10"]);
        (torch, p["bytes"].as_i64().unwrap())
    };
    let (loaded_torch, loaded) = held_by_torch(&ctl(&["profile", &pid, "--json"]));
    assert!(
        loaded_torch > 300 << 20 && loaded_torch as f64 > 0.8 * loaded as f64,
        "{v}: bert-base's weights are PyTorch's allocations: {:.0} of {:.0} MiB",
        mib(loaded_torch as u64),
        mib(loaded as u64)
    );
    let loaded_table = ctl(&["profile", &pid]);
    assert!(
        loaded_table
            .stdout
            .lines()
            .any(|l| l.starts_with("by library: libc10")),
        "{v}: the library that holds the weights is named first: {}",
        loaded_table.stdout
    );
    ask(&mut child, "infer");
    ask(&mut child, "unload");
    let table = ctl(&["profile", &pid]);
    assert_eq!(table.code, 0, "{v}: {table:?}");
    // Either the libraries that still hold what was allocated since
    // sampling started, or nothing left at all.
    assert!(
        table.stdout.contains("by library: ")
            || table.stdout.contains("no live sampled allocations"),
        "{v}: {}",
        table.stdout
    );
    let (left_torch, left) = held_by_torch(&ctl(&["profile", &pid, "--json"]));
    let _ = writeln!(
        std::io::stderr(),
        "profile of BERT, {v}: loaded {:.1} MiB live ({:.1} MiB from torch's libraries); after inference and del {:.1} MiB ({:.1} MiB); the table:\n{}",
        mib(loaded as u64),
        mib(loaded_torch as u64),
        mib(left.max(0) as u64),
        mib(left_torch.max(0) as u64),
        table.stdout
    );
    assert!(
        left_torch < loaded_torch / 5,
        "{v}: after del, torch's libraries still hold {:.0} MiB",
        mib(left_torch.max(0) as u64)
    );
    assert_eq!(ctl(&["profile", &pid, "--stop"]).code, 0);
    child.send("quit");
    let out = child.finish(Duration::from_secs(60));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
}

/// Load, unload, release while the main thread sleeps, on `py`: RSS back
/// near its baseline, the torch section there, CUDA never initialised.
fn bert_cycle(py: &Cpython) {
    // A real model, and timed (the release within the main thread's sleep).
    let _machine = memshim_tests::serial::exclusive(module_path!());
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

    let s = stats(&sock);
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
        steps_line(&r.steps)
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

/// A FastAPI server (uvicorn) with a BERT model, started the ordinary way
/// (no preload), idle in `epoll_wait` after its second `del model`: `release PID`
/// reaches it by ptrace and brings its RSS to within 10 % of what the same
/// server under the shim keeps after its own `release`; both servers
/// answer afterwards and stop on SIGINT with status 0 and an empty stderr.
#[test]
#[ignore = "needs torch, transformers, fastapi and uvicorn: make test-torch"]
fn a_fastapi_bert_server_started_without_the_preload_gives_back_what_a_shimmed_one_does_released_or_attached()
 {
    use memshim_tests::deploy::{http, json_num};
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let py = default_python();
    let v = &py.label;
    let dir = socket_dir("torch-fastapi");
    let script = fixture_py("py_bert_server.py");
    // (RSS loaded, after `del model`, after `release`, and without the
    // preload: after a third load and unload under `attach --idle-return`,
    // with no command) of one server.
    let cycle = |shimmed: bool| -> (u64, u64, u64, u64) {
        let cmd = if shimmed {
            py.shimmed(&script, &[], &dir)
        } else {
            py.cmd([&script])
        };
        let mut server = cmd.spawn();
        let line = server.wait_for_line("listening", Duration::from_secs(180));
        let addr = format!("127.0.0.1:{}", line.split_whitespace().nth(1).unwrap());
        let pid = server.pid();
        // Two loads: glibc's first frees of the big tensors raise its mmap
        // threshold, so the second model's tensors come from its heap and
        // stay there after `del` (the bloat users see); the first model's
        // went back to the kernel at once.
        let mut loaded = 0;
        for _ in 0..2 {
            let (code, body) = http(&addr, "POST", "/load");
            assert_eq!(code, 200, "{v}: {body}");
            assert!(json_num(&body, "params").unwrap() > 1e8, "{v}: {body}");
            loaded = rss_bytes(pid);
            let (code, body) = http(&addr, "POST", "/unload");
            assert_eq!(code, 200, "{v}: {body}");
        }
        let unloaded = rss_bytes(pid);
        // The main thread back in epoll_wait, the worker thread idle.
        std::thread::sleep(Duration::from_secs(1));
        let o = memshim_tests::Cmd::new(memshim_tests::ctl(), ["release", &pid.to_string()]).run();
        assert_eq!(o.code, 0, "{v}, shimmed {shimmed}: {o:?}");
        assert_eq!(
            o.stdout.contains("reached by ptrace"),
            !shimmed,
            "{v}, shimmed {shimmed}: {o:?}"
        );
        let released = rss_bytes(pid);
        assert_eq!(
            http(&addr, "GET", "/health").0,
            200,
            "{v}: the server answers"
        );
        // Attached with the idle return, another load and unload: back
        // down by itself once the server idles.
        let mut idle_returned = 0;
        if !shimmed {
            let o = memshim_tests::Cmd::new(
                memshim_tests::ctl(),
                ["attach", &pid.to_string(), "--idle-return"],
            )
            .run();
            assert_eq!(o.code, 0, "{v}: {o:?}");
            let (code, body) = http(&addr, "POST", "/load");
            assert_eq!(code, 200, "{v}: {body}");
            let (code, body) = http(&addr, "POST", "/unload");
            assert_eq!(code, 200, "{v}: {body}");
            idle_returned = memshim_tests::wait_until(Duration::from_secs(20), || {
                let r = rss_bytes(pid);
                (r < released + released / 10).then_some(r)
            })
            .unwrap_or_else(|| rss_bytes(pid));
        }
        let k = memshim_tests::Cmd::new("kill", ["-INT", &pid.to_string()]).run();
        assert_eq!(k.code, 0);
        let out = server.finish(Duration::from_secs(60));
        assert_eq!(
            (out.code, out.stderr.as_str()),
            (0, ""),
            "{v}, shimmed {shimmed}"
        );
        (loaded, unloaded, released, idle_returned)
    };
    let (p_loaded, p_unloaded, p_released, p_idle) = cycle(false);
    let (s_loaded, s_unloaded, s_released, _) = cycle(true);
    let _ = writeln!(
        std::io::stderr(),
        "FastAPI BERT server, {v}: without the preload loaded {:.0} MiB, after del {:.0} MiB, after release {:.0} MiB, \
         attached with --idle-return after a third load and unload {:.0} MiB; \
         shimmed loaded {:.0} MiB, after del {:.0} MiB, after release {:.0} MiB",
        mib(p_loaded),
        mib(p_unloaded),
        mib(p_released),
        mib(p_idle),
        mib(s_loaded),
        mib(s_unloaded),
        mib(s_released)
    );
    assert!(
        p_unloaded > p_released + 100 * MIB,
        "{v}: without the preload, del kept the model's pages ({:.0} MiB) until release ({:.0} MiB)",
        mib(p_unloaded),
        mib(p_released)
    );
    assert!(
        p_idle as f64 <= 1.10 * s_released as f64,
        "{v}: attached with --idle-return, after a third load and unload the server keeps {:.0} MiB, \
         the shimmed one after release {:.0} MiB",
        mib(p_idle),
        mib(s_released)
    );
    assert!(
        p_released as f64 <= 1.10 * s_released as f64,
        "{v}: after release, the server without the preload keeps {:.0} MiB, the shimmed one {:.0} MiB",
        mib(p_released),
        mib(s_released)
    );
}

/// Python lines in a native profile of the FastAPI BERT server (the model
/// is built on one of anyio's worker threads, and PyTorch allocates with
/// the GIL released): after `/load`, the stacks through the load's line
/// hold at least 80 % of what `c10::alloc_cpu` holds, and the table's
/// Python view names that line's function.
#[test]
#[ignore = "needs torch, transformers, fastapi and uvicorn: make test-torch"]
fn a_native_profile_of_the_fastapi_bert_server_names_the_python_line_of_the_load() {
    use memshim_tests::deploy::http;
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let py = default_python();
    let v = &py.label;
    let dir = socket_dir("torch-fastapi-profile");
    let script = fixture_py("py_bert_server.py");
    let text = std::fs::read_to_string(&script).unwrap();
    let n = text
        .lines()
        .position(|l| l.contains("state[\"model\"] = BertModel(BertConfig())"))
        .unwrap()
        + 1;
    let load_line = format!("/py_bert_server.py:{n}");
    let mut server = py
        .shimmed(&script, &[], &dir)
        .env("MEMSHIM_PROFILE", "on")
        .spawn();
    let line = server.wait_for_line("listening", Duration::from_secs(180));
    let addr = format!("127.0.0.1:{}", line.split_whitespace().nth(1).unwrap());
    let pid = server.pid().to_string();
    socket_of(&dir, server.pid());
    let ctl = |args: &[&str]| memshim_tests::Cmd::new(memshim_tests::ctl(), args).run();
    let on = ctl(&["profile", &pid, "--seconds", "0", "--keep"]);
    assert_eq!(on.code, 0, "{v}: {on:?}");
    let (code, body) = http(&addr, "POST", "/load");
    assert_eq!(code, 200, "{v}: {body}");
    let o = ctl(&["profile", &pid, "--json", "--keep"]);
    assert_eq!(o.code, 0, "{v}: {o:?}");
    let p: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let (mut alloc_cpu, mut at_load) = (0i64, 0i64);
    for s in p["stacks"].as_array().unwrap() {
        let fr = s["frames"].as_array().unwrap();
        if !fr[0]["function"]
            .as_str()
            .unwrap_or("")
            .starts_with("c10::alloc_cpu")
        {
            continue;
        }
        let b = s["bytes"].as_i64().unwrap();
        alloc_cpu += b;
        if fr
            .iter()
            .any(|f| f["source"].as_str().unwrap_or("").ends_with(&load_line))
        {
            at_load += b;
        }
    }
    let table = ctl(&["profile", &pid, "--keep"]);
    assert_eq!(table.code, 0, "{v}: {table:?}");
    let _ = writeln!(
        std::io::stderr(),
        "FastAPI BERT server, {v}: c10::alloc_cpu holds {:.1} MiB, {:.1} MiB of it under {load_line}; the table:\n{}",
        mib(alloc_cpu.max(0) as u64),
        mib(at_load.max(0) as u64),
        table.stdout
    );
    assert!(
        alloc_cpu > 300 << 20,
        "{v}: {alloc_cpu} bytes in c10::alloc_cpu"
    );
    assert!(
        at_load * 10 >= alloc_cpu * 8,
        "{v}: the load's line holds {at_load} of c10::alloc_cpu's {alloc_cpu} bytes"
    );
    // BERT's weights are made in torch.nn's layers (`Linear.__init__`).
    let lines: Vec<&str> = super::profile::python_line_rows(&table.stdout)
        .into_iter()
        .take(3)
        .collect();
    assert!(
        lines.iter().any(|l| l.contains("Linear.__init__")),
        "{v}: {}",
        table.stdout
    );
    assert_eq!(ctl(&["profile", &pid, "--stop"]).code, 0);
    let k = memshim_tests::Cmd::new("kill", ["-INT", &pid]).run();
    assert_eq!(k.code, 0);
    let out = server.finish(Duration::from_secs(60));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{v}");
}
