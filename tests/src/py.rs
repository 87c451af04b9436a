//! For the `python_*` tests: a CPython under the shim, and requests to its
//! control socket (through `endpoint::Conn`).

use crate::endpoint::Conn;
use crate::{Child, Cmd, pyenv_pythons, root};
use memshim_proto::{Reply, Request, Response};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `tests/fixtures/<name>`.
pub fn fixture_py(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

/// A private socket directory (0700) for one test, so tests running in
/// parallel never see each other's processes.
pub fn socket_dir(test: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = crate::socket_dir_path(test);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// `python script args...` under the shim with its control endpoint on.
pub fn shimmed_python(python: &Path, script: &Path, args: &[&str], dir: &Path) -> Cmd {
    let mut a: Vec<String> = vec![script.to_string_lossy().into_owned()];
    a.extend(args.iter().map(|s| s.to_string()));
    endpoint_on(Cmd::new(python, a), dir)
}

/// `python -c code` under the shim with its control endpoint on.
pub fn shimmed_python_c(python: &Path, code: &str, dir: &Path) -> Cmd {
    endpoint_on(Cmd::new(python, ["-c", code]), dir)
}

/// `cmd` under the shim, its endpoint on from the start, its socket in `dir`.
fn endpoint_on(cmd: Cmd, dir: &Path) -> Cmd {
    cmd.shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", dir)
}

/// The socket of `pid` in `dir`, once it exists.
pub fn socket_of(dir: &Path, pid: i32) -> PathBuf {
    crate::wait_until(Duration::from_secs(10), || {
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

/// One request on a fresh connection (after `hello`), waiting up to a minute.
pub fn try_request(sock: &Path, req: &Request) -> std::io::Result<Response> {
    let mut c = Conn::try_connect(sock)?;
    c.0.set_timeout(Duration::from_secs(60));
    c.request(&Request::Hello {
        version: memshim_proto::PROTOCOL_VERSION,
        client: None,
    })
    .map_err(std::io::Error::other)?;
    c.request(req).map_err(std::io::Error::other)
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

/// The `stats` reply (no arenas, no PSS) of the endpoint at `sock`.
pub fn stats(sock: &Path) -> Box<memshim_proto::StatsReport> {
    match ok(request(
        sock,
        &Request::Stats {
            arenas: false,
            pss: false,
        },
    )) {
        Reply::Stats(s) => s,
        other => panic!("not a stats reply: {other:?}"),
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
    let flags: [&[&str]; 6] = [
        &["--atexit", "--gc"],
        &[],
        &["--spin", "--gc"],
        &["--spin", "--atexit"],
        &["--threading"],
        &["--spin", "--threading", "--gc"],
    ];
    let answered = Arc::new(AtomicU64::new(0));
    for round in 0..rounds {
        let dir = socket_dir(&format!("{tag}-{}", round % 6));
        let f = flags[(round % 6) as usize];
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

/// The CPython minor versions the bridge supports.
pub const SUPPORTED: [&str; 6] = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"];

/// (minor version, executable) of each supported version pyenv has here.
/// Absent ones are named on stderr (visible without --nocapture).
pub fn cpythons() -> Vec<(&'static str, PathBuf)> {
    let all = pyenv_pythons();
    let mut out = vec![];
    for want in SUPPORTED {
        match all
            .iter()
            .find(|(v, _)| v.starts_with(&format!("{want}.")) && !v.contains('t'))
        {
            Some((_, exe)) => out.push((want, exe.clone())),
            None => eprintln!("SKIP: CPython {want} is not installed under ~/.pyenv/versions"),
        }
    }
    out
}

/// Runs `f` for every installed supported CPython, `parallel` versions at
/// a time, and returns the results in version order. A panic in one
/// version fails the test with that version's message.
pub fn for_each_cpython<T: Send + 'static>(
    parallel: usize,
    f: impl Fn(&'static str, PathBuf) -> T + Send + Sync + 'static,
) -> Vec<(&'static str, T)> {
    use std::sync::{Arc, Mutex};
    let work = Arc::new(Mutex::new(cpythons()));
    let f = Arc::new(f);
    let results = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..parallel.max(1))
        .map(|_| {
            let (work, f, results) = (work.clone(), f.clone(), results.clone());
            std::thread::spawn(move || {
                loop {
                    let next = work.lock().unwrap().pop();
                    let Some((v, exe)) = next else { break };
                    let r = f(v, exe);
                    results.lock().unwrap().push((v, r));
                }
            })
        })
        .collect();
    let mut failed = None;
    for w in workers {
        if let Err(e) = w.join() {
            failed = Some(e);
        }
    }
    if let Some(e) = failed {
        std::panic::resume_unwind(e);
    }
    let mut r = std::mem::take(&mut *results.lock().unwrap());
    r.sort_by_key(|(v, _)| SUPPORTED.iter().position(|s| s == v));
    r
}
