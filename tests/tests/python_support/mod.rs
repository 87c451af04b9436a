//! Shared by the `python_*` tests: a CPython under the shim, and a client
//! for its control socket speaking the real protocol (`memshim-proto`).

#![allow(dead_code)]

use memshim_proto::{PROTOCOL_VERSION, Reply, Request, Response};
use memshim_tests::{Child, Cmd, root, scratch};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use std::time::Instant;

/// `tests/fixtures/<name>`.
pub fn fixture_py(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

/// A private socket directory (0700) for one test, so tests running in
/// parallel never see each other's processes.
pub fn socket_dir(test: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch().join(format!("sock-{test}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// `python script args...` under the shim with its control endpoint on.
pub fn shimmed_python(python: &Path, script: &Path, args: &[&str], dir: &Path) -> Cmd {
    let mut a: Vec<String> = vec![script.to_string_lossy().into_owned()];
    a.extend(args.iter().map(|s| s.to_string()));
    Cmd::new(python, a)
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", dir)
}

/// The socket of `pid` in `dir`, once it exists.
pub fn socket_of(dir: &Path, pid: i32) -> PathBuf {
    memshim_tests::wait_until(Duration::from_secs(10), || {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{pid}-")) && n.ends_with(".sock"))
            })
    })
    .unwrap_or_else(|| panic!("no control socket for pid {pid} in {}", dir.display()))
}

/// One request on a fresh connection (after `hello`).
pub fn try_request(sock: &Path, req: &Request) -> std::io::Result<Response> {
    let s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    w.write_all(
        &Request::Hello {
            version: PROTOCOL_VERSION,
            client: None,
        }
        .to_line(),
    )?;
    r.read_line(&mut line)?;
    line.clear();
    w.write_all(&req.to_line())?;
    r.read_line(&mut line)?;
    Response::from_line(line.as_bytes())
        .map_err(|e| std::io::Error::other(format!("{e}: {line:?}")))
}

/// One request that must succeed at the transport level.
pub fn request(sock: &Path, req: &Request) -> Response {
    try_request(sock, req).unwrap_or_else(|e| panic!("request {req:?} to {}: {e}", sock.display()))
}

/// A successful reply, or panic with the error.
pub fn ok(r: Response) -> Reply {
    match r {
        Response::Ok(reply) => reply,
        Response::Error(e) => panic!("error reply: {e:?}"),
    }
}

/// Sends a line to the fixture and waits for its answer line.
pub fn ask(child: &mut Child, cmd: &str) -> String {
    child.send(cmd);
    let word = cmd.split_whitespace().next().unwrap_or(cmd);
    child.wait_for_line(&format!("{word}:"), Duration::from_secs(60))
}

/// `key=value` from a fixture's answer line.
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> T {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// `rounds` short-lived interpreters, each exiting normally while another
/// thread fires `stats` and `gc` at its socket as fast as it can. Every one
/// must exit with 0 and an empty stderr within 20 s. Returns how many
/// requests were answered with a result (to show the fire was live).
pub fn exit_rounds(py: &Path, tag: &str, rounds: u32) -> u64 {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let flags: [&[&str]; 4] = [
        &["--atexit", "--gc"],
        &[],
        &["--spin", "--gc"],
        &["--spin", "--atexit"],
    ];
    let answered = Arc::new(AtomicU64::new(0));
    for round in 0..rounds {
        let dir = socket_dir(&format!("{tag}-{}", round % 4));
        let f = flags[(round % 4) as usize];
        let mut child = shimmed_python(py, &fixture_py("py_exit.py"), f, &dir).spawn();
        let pid = child.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let fire = {
            let (stop, answered, dir) = (stop.clone(), answered.clone(), dir.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let sock = std::fs::read_dir(&dir).ok().and_then(|rd| {
                        rd.flatten().map(|e| e.path()).find(|p| {
                            p.file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with(&format!("{pid}-")))
                        })
                    });
                    let Some(sock) = sock else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    i += 1;
                    let req = if i.is_multiple_of(2) {
                        Request::Gc
                    } else {
                        Request::Stats {
                            arenas: false,
                            pss: false,
                        }
                    };
                    match try_request(&sock, &req) {
                        Ok(Response::Ok(Reply::Gc(_))) => {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Response::Ok(Reply::Stats(s))) if s.python.is_some() => {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                }
            })
        };
        child.wait_for_line("up", Duration::from_secs(20));
        let out = child.finish(Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
        fire.join().unwrap();
        assert_eq!(
            (out.code, out.stderr.as_str()),
            (0, ""),
            "round {round} ({}, flags {f:?}): the interpreter must exit cleanly",
            py.display()
        );
    }
    answered.load(Ordering::Relaxed)
}

/// Runs `n` gc requests while the main thread spins in pure Python; each
/// must succeed promptly and run exactly once. The program imports
/// `atexit` and has answered one request before it spins: on 3.9-3.12 the
/// bridge nudges a spinning main thread only once its exit hook sits in
/// `atexit` (shim/src/python/nudge.rs).
pub fn spin_serves_each_request_once(py: &std::path::Path, tag: &str, n: u32) -> Vec<u128> {
    let dir = socket_dir(tag);
    let mut child = shimmed_python(
        py,
        &fixture_py("py_host.py"),
        &["--gc-off", "--atexit"],
        &dir,
    )
    .spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let sock = socket_of(&dir, child.pid());
    let threads = ask(&mut child, "threads");
    assert!(
        matches!(ok(request(&sock, &Request::Stats { arenas: false, pss: false })), Reply::Stats(s) if s.python.is_some())
    );
    child.send("spin 8");
    child.wait_for_line("spinning", Duration::from_secs(10));
    let mut times = vec![];
    for _ in 0..n {
        let t = Instant::now();
        let r = ok(request(&sock, &Request::Gc));
        times.push(t.elapsed().as_millis());
        assert!(matches!(r, Reply::Gc(_)), "{r:?}");
    }
    child.wait_for_line("spin: done", Duration::from_secs(30));
    assert_eq!(ask(&mut child, "full"), format!("full: count={n}"));
    assert_eq!(ask(&mut child, "threads"), threads);
    child.send("quit");
    let out = child.finish(Duration::from_secs(30));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
    times
}
