//! Hostile and clumsy clients: garbage, oversized lines, half-open and idle
//! connections, pipelining, and a flood of 1000 connections. The host must
//! stay alive and unchanged, and the endpoint must keep answering.

use memshim_tests::control::*;
use memshim_tests::*;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The host still works: it allocates on request, and has exactly its own
/// threads plus the shim's.
fn host_is_fine(child: &mut Child, threads_before: u64) {
    child.send("alloc 4");
    child.wait_for_line("ready", Duration::from_secs(10));
    assert_eq!(threads(child.pid()), threads_before, "thread count changed");
    assert_eq!(
        ctl_run(&["stats", &child.pid().to_string()]).code,
        0,
        "endpoint no longer answers"
    );
}

#[test]
fn garbage_and_oversized_lines_get_errors_and_the_endpoint_keeps_answering() {
    let mut child = start_heap(&[]);
    let pid = child.pid();
    wait_endpoint(pid);
    let threads_before = threads(pid);
    let sock = socket_in(&default_dir(), pid);

    let mut c = Conn::connect(&sock);
    let v = c.ask("\u{1}\u{7f}not json at all").unwrap();
    assert_eq!(v["error"]["code"], "bad_request", "{v}");
    let v = c.ask(r#"{"op":"stats"}"#).unwrap();
    assert_eq!(v["error"]["code"], "hello_required", "{v}");
    let v = c.ask(r#"{"op":"launch_missiles"}"#).unwrap();
    assert_eq!(v["error"]["code"], "unknown_op", "{v}");
    let v = c.ask(r#"{"op":"hello","version":0}"#).unwrap();
    assert_eq!(v["error"]["code"], "version_mismatch", "{v}");
    let v = c.ask(r#"{"op":"hello","version":99}"#).unwrap();
    assert_eq!(
        v["ok"]["version"], 1,
        "a newer client gets the server's version: {v}"
    );
    let v = c.ask(r#"{"op":"decay","dirty_ms":-7}"#).unwrap();
    assert_eq!(v["error"]["code"], "invalid_argument", "{v}");
    let v = c.ask(r#"{"op":"stats","arenas":true}"#).unwrap();
    assert!(
        v["ok"]["arenas"].as_array().is_some_and(|a| !a.is_empty()),
        "{v}"
    );

    // A 1 MiB line: one too_large error, then the connection is closed.
    let mut big = Conn::connect(&sock);
    let writer = {
        let mut s = big.0.stream().try_clone().unwrap();
        std::thread::spawn(move || {
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..16 {
                if s.write_all(&chunk).is_err() {
                    break; // closed by the server, as it should
                }
            }
        })
    };
    let v: serde_json::Value = serde_json::from_str(&big.line()).unwrap();
    assert_eq!(v["error"]["code"], "too_large", "{v}");
    assert_eq!(big.line(), "", "connection must be closed after too_large");
    writer.join().unwrap();

    // NUL bytes and invalid UTF-8 inside a line.
    let mut n = Conn::connect(&sock);
    n.send(b"{\"op\":\"hel\0lo\xff\"}\n").unwrap();
    let v: serde_json::Value = serde_json::from_str(&n.line()).unwrap();
    assert_eq!(v["error"]["code"], "bad_request", "{v}");

    host_is_fine(&mut child, threads_before);
    child.send("quit");
    assert_eq!(child.finish(Duration::from_secs(10)).stderr, "");
}

#[test]
fn half_open_idle_and_pipelining_clients_are_handled() {
    let mut child = start_heap(&[]);
    let pid = child.pid();
    wait_endpoint(pid);
    let threads_before = threads(pid);
    let sock = socket_in(&default_dir(), pid);

    // Idle: says nothing; closed with a timeout error after IDLE_TIMEOUT_MS.
    let mut idle = Conn::connect(&sock);
    let t0 = Instant::now();

    // Half-open: request, then shut down our write side; the answer still
    // comes, then end of file.
    let mut h = Conn::connect(&sock);
    h.send(b"{\"op\":\"hello\",\"version\":1}\n{\"op\":\"purge\"}\n")
        .unwrap();
    h.0.stream().shutdown(std::net::Shutdown::Write).unwrap();
    let a: serde_json::Value = serde_json::from_str(&h.line()).unwrap();
    let b: serde_json::Value = serde_json::from_str(&h.line()).unwrap();
    assert_eq!(
        (a["ok"]["kind"].as_str(), b["ok"]["kind"].as_str()),
        (Some("hello"), Some("purge"))
    );
    assert_eq!(h.line(), "");

    // Pipelining: 200 requests in one write are all answered, in order.
    let mut p = Conn::connect(&sock);
    let mut batch = String::from("{\"op\":\"hello\",\"version\":1}\n");
    for _ in 0..199 {
        batch.push_str("{\"op\":\"decay\"}\n");
    }
    p.send(batch.as_bytes()).unwrap();
    for i in 0..200 {
        let v: serde_json::Value =
            serde_json::from_str(&p.line()).unwrap_or_else(|e| panic!("answer {i}: {e}"));
        assert!(v.get("ok").is_some(), "answer {i}: {v}");
    }

    let v: serde_json::Value = serde_json::from_str(&idle.line()).unwrap();
    assert_eq!(v["error"]["code"], "timeout", "{v}");
    assert!(
        t0.elapsed() >= Duration::from_millis(4500),
        "closed too early: {:?}",
        t0.elapsed()
    );
    assert_eq!(idle.line(), "");

    host_is_fine(&mut child, threads_before);
}

#[test]
fn a_flood_of_1000_connections_leaves_the_host_alive_and_answering() {
    let mut child = start_heap(&[]);
    let pid = child.pid();
    wait_endpoint(pid);
    let threads_before = threads(pid);
    let rss_before = rss_bytes(pid);
    let sock = socket_in(&default_dir(), pid);

    let mut conns = Vec::new();
    for i in 0..1000 {
        match UnixStream::connect(&sock) {
            Ok(s) => {
                if i % 2 == 0 {
                    // Half of them start a request and never finish it.
                    let _ = (&s).write_all(b"{\"op\":\"hel");
                }
                conns.push(s);
            }
            Err(e) => panic!("connection {i} refused: {e}"),
        }
    }
    // While all 1000 are open, a real client still gets through.
    let o = ctl_run(&["stats", &pid.to_string(), "--json"]);
    assert_eq!(o.code, 0, "{o:?}");
    let grown = rss_bytes(pid).saturating_sub(rss_before);
    assert!(
        grown < 8 << 20,
        "the flood grew the host by {:.1} MiB",
        mib(grown)
    );
    // The shim holds at most a few descriptors, not one per client (counted
    // in its thread's table: the application's, or one of its own).
    let tid = shim_tids(pid)[0];
    let fds = task_fds(pid, tid).len();
    assert!(fds < 40, "{fds} descriptors open in the shim's table");
    drop(conns);
    host_is_fine(&mut child, threads_before);
    child.send("quit");
    assert_eq!(child.finish(Duration::from_secs(10)).stderr, "");
}

/// More memshim-ctl clients at once than the endpoint holds connections
/// (16): the oldest is closed with `busy` before its `hello` is read, and
/// memshim-ctl connects again after a short pause. Every one gets its
/// answer; 4 to 23 % of 200 exited 6 ("too many connections") before.
#[test]
fn a_burst_of_more_clients_than_connections_all_get_answers() {
    let host = Cmd::new("sleep", ["60"])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    let pid = host.pid().to_string();
    wait_endpoint(host.pid());
    let clients: Vec<_> = (0..200)
        .map(|_| {
            std::process::Command::new(ctl())
                .args(["stats", &pid])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let failed: Vec<String> = clients
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 200 failed: {:?}",
        failed.len(),
        failed.first()
    );
    drop(host);
}

/// A process whose socket answers `hello` and then one byte every 0.2 s:
/// every read came within its limit, so memshim-ctl, which limited each
/// read and not the answer, waited for ever, and `metrics` (and `serve`'s
/// scrapes, one at a time) with it. The answer as a whole has the limit.
#[test]
fn a_socket_that_answers_a_byte_at_a_time_does_not_hold_memshim_ctl() {
    let dir = memshim_tests::py::socket_dir("trickle");
    let mut child = memshim_tests::py::shimmed_python(
        &memshim_tests::python(),
        &memshim_tests::py::fixture_py("py_trickle.py"),
        &[],
        &dir,
    )
    .spawn();
    child.wait_for_line("ready", Duration::from_secs(20));
    let pid = child.pid().to_string();
    for args in [
        vec!["stats", pid.as_str()],
        vec!["metrics", "--timeout-ms", "1000"],
    ] {
        let t0 = Instant::now();
        let o = Cmd::new(ctl(), &args).run_timeout(Duration::from_secs(60));
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(20),
            "{args:?} took {took:?}: {o:?}"
        );
        if args[0] == "stats" {
            assert_ne!(o.code, 0, "{o:?}");
            assert!(o.stderr.contains("no answer in time"), "{o:?}");
        }
    }
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}
