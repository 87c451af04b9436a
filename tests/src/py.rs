//! For the `python` family (tests/tests/python/): a CPython under the shim,
//! requests to its control socket (through `endpoint::Conn`), the exit
//! rounds; the CPythons they run ([`cpythons`]: pyenv's and Debian sid's)
//! are in cpython.rs, re-exported here.

use crate::cpython::endpoint_on;
pub use crate::cpython::{
    Cpython, SUPPORTED, cpythons, default_python, embeddable_cpythons, for_each_cpython,
    for_each_of, sid_cpythons,
};
use crate::endpoint::Conn;
use crate::{Child, Cmd, root};
use memshim_proto::{Reply, Request, Response};
use std::ffi::OsStr;
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

/// `python fixture` under the shim with `MEMSHIM_PROFILE=on`, once it
/// printed "ready" (within `ready`) and its socket is there, with sampling
/// switched on from outside (`profile PID --seconds 0 --keep`): the child
/// and its pid, as an argument.
pub fn sampled(py: &Cpython, fixture: &str, dir_tag: &str, ready: Duration) -> (Child, String) {
    let dir = socket_dir(&format!("{dir_tag}-{}", py.tag()));
    let mut child = py
        .shimmed(&fixture_py(fixture), &[], &dir)
        .env("MEMSHIM_PROFILE", "on")
        .spawn();
    child.wait_for_line("ready", ready);
    let pid = child.pid().to_string();
    socket_of(&dir, child.pid());
    let on = Cmd::new(crate::ctl(), ["profile", &pid, "--seconds", "0", "--keep"]).run();
    assert_eq!(on.code, 0, "{}: sampling did not start: {on:?}", py.label);
    (child, pid)
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

/// A `release`'s steps on one line, for the figures a test prints: name,
/// outcome, resident before and after, time, and why one was skipped.
pub fn steps_line(steps: &[memshim_proto::ReleaseStep]) -> String {
    steps
        .iter()
        .map(|s| {
            format!(
                "{} {:?} {:.1}->{:.1} MiB {:.1} ms{}",
                s.name(),
                s.outcome,
                crate::mib(s.before),
                crate::mib(s.after),
                s.elapsed_ms,
                s.skipped
                    .as_deref()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The bytes of the stacks of a `memshim-ctl profile --json` answer that
/// have a frame in a library whose name starts with one of `prefixes`
/// (each stack counted once).
pub fn held_by_library(profile: &serde_json::Value, prefixes: &[&str]) -> i64 {
    let in_library = |f: &serde_json::Value| {
        let l = f["library"].as_str().unwrap_or("");
        prefixes.iter().any(|p| l.starts_with(p))
    };
    profile["stacks"]
        .as_array()
        .expect("a profile's stacks")
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .is_some_and(|f| f.iter().any(in_library))
        })
        .map(|s| s["bytes"].as_i64().unwrap_or(0))
        .sum()
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

/// The flags of `tests/fixtures/py_exit.py`, round by round: with and
/// without `atexit`, `threading` and `gc` imported, exiting from a sleep
/// and from a spinning loop.
const EXIT_FLAGS: [&[&str]; 6] = [
    &["--atexit", "--gc"],
    &[],
    &["--spin", "--gc"],
    &["--spin", "--atexit"],
    &["--threading"],
    &["--spin", "--threading", "--gc"],
];

/// How long exits took, from the moment each interpreter was told to exit
/// to its reaping ([`exit_rounds`]).
pub struct ExitTimes {
    /// Which interpreter.
    pub label: String,
    /// Each exit under the shim, with its flags, while requests fired.
    pub shimmed: Vec<(Duration, &'static [&'static str])>,
    /// Each exit of the same program without the shim.
    pub plain: Vec<(Duration, &'static [&'static str])>,
    /// Requests answered with a result during the shimmed exits' lives.
    pub answered: u64,
}

/// How much longer than the slowest exit without the shim the slowest
/// under the shim may take. The shim adds a running job's end at most
/// (milliseconds); an exit that waits for a job thread CPython has parked,
/// or for anything that never comes, takes the gate's 5 s or more.
pub const EXIT_SLACK: Duration = Duration::from_millis(100);

impl ExitTimes {
    /// Median, p99 and max, in ms.
    fn figures(times: &[(Duration, &[&str])]) -> (f64, f64, f64) {
        let mut ms: Vec<f64> = times.iter().map(|(d, _)| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        if ms.is_empty() {
            return (0.0, 0.0, 0.0);
        }
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        (at(0.5), at(0.99), ms[ms.len() - 1])
    }

    /// The figures, on one line.
    pub fn summary(&self) -> String {
        let (sm, s99, smax) = Self::figures(&self.shimmed);
        let (pm, p99, pmax) = Self::figures(&self.plain);
        let flags_of_max = |t: &[(Duration, &[&str])]| {
            t.iter()
                .max_by_key(|(d, _)| *d)
                .map(|(_, f)| format!("{f:?}"))
                .unwrap_or_default()
        };
        format!(
            "{}: exit ms, told-to-exit to reaped, {} with the shim under fire / {} without: \
             median {sm:.1} / {pm:.1}, p99 {s99:.1} / {p99:.1}, max {smax:.1} {} / {pmax:.1} {}; \
             {} requests answered",
            self.label,
            self.shimmed.len(),
            self.plain.len(),
            flags_of_max(&self.shimmed),
            flags_of_max(&self.plain),
            self.answered
        )
    }

    /// The acceptance: the slowest exit under the shim is within
    /// [`EXIT_SLACK`] of the slowest without. Worst against worst: the two
    /// exits of a round run side by side, so a stall of the machine slows
    /// both, and one in the unshimmed series widens the limit by no more
    /// than it is (a 5 s delay under the shim still fails, unless the same
    /// program took as long without it). The failure names the slowest
    /// shimmed rounds.
    pub fn check(&self) -> Result<String, String> {
        let worst_plain = self.plain.iter().map(|(d, _)| *d).max().unwrap_or_default();
        let limit = worst_plain + EXIT_SLACK;
        let mut slow: Vec<_> = self.shimmed.iter().filter(|(d, _)| *d > limit).collect();
        if slow.is_empty() {
            return Ok(self.summary());
        }
        slow.sort_by_key(|t| std::cmp::Reverse(t.0));
        Err(format!(
            "{}\n  {} exits under the shim took longer than the slowest without it ({worst_plain:?}) \
             + {EXIT_SLACK:?}: {:?}",
            self.summary(),
            slow.len(),
            slow.iter().take(5).collect::<Vec<_>>()
        ))
    }
}

/// How many times an exit over the limit is run again ([`ExitTimes::settle`]).
pub const EXIT_RERUNS: u32 = 3;

impl ExitTimes {
    /// [`check`](Self::check), on a machine that stalls now and then: each
    /// shimmed exit over the limit is run again, side by side with its twin
    /// without the shim (same flags), up to [`EXIT_RERUNS`] times, and
    /// counts only if every rerun is over the limit too. A delay the shim
    /// causes comes back (the 5 s wait for a parked job thread came in half
    /// the exits); a stall of a loaded machine (340 ms once, at load 14)
    /// does not. Returns the verdict, with what was run again.
    pub fn settle(&self, py: &Cpython, tag: &str) -> Result<String, String> {
        let first = match self.check() {
            Ok(summary) => return Ok(summary),
            Err(why) => why,
        };
        let worst_plain = self.plain.iter().map(|(d, _)| *d).max().unwrap_or_default();
        let limit = worst_plain + EXIT_SLACK;
        let mut kept = vec![];
        let mut reran = vec![];
        for (i, (d, flags)) in self.shimmed.iter().enumerate() {
            if *d <= limit {
                continue;
            }
            let mut again = vec![];
            let stays = (0..EXIT_RERUNS).all(|k| {
                let (shimmed, plain, _) =
                    exit_pair(py, flags, flags, &format!("{tag}-re"), i as u32 + k);
                again.push((shimmed, plain));
                shimmed > plain.max(worst_plain) + EXIT_SLACK
            });
            reran.push(format!("{d:?} {flags:?} again: {again:?}"));
            if stays {
                kept.push(format!("{d:?} {flags:?}"));
            }
        }
        if kept.is_empty() {
            Ok(format!(
                "{} (over the limit once, not again: {})",
                self.summary(),
                reran.join("; ")
            ))
        } else {
            Err(format!(
                "{first}\n  slow every time they ran again: {}\n  reruns: {}",
                kept.join(", "),
                reran.join("; ")
            ))
        }
    }
}

/// `rounds` rounds of two short-lived interpreters each ([`exit_pair`]):
/// the same program (`py_exit.py` with the flags of [`EXIT_FLAGS`] in
/// turn), one under the shim and its request fire, one without it, side
/// by side, told to exit at the same instant. Every one must exit with 0
/// and an empty stderr within 20 s.
pub fn exit_rounds(py: &Cpython, tag: &str, rounds: u32) -> ExitTimes {
    let mut t = ExitTimes {
        label: py.label.clone(),
        shimmed: vec![],
        plain: vec![],
        answered: 0,
    };
    for round in 0..rounds {
        let f = EXIT_FLAGS[(round % 6) as usize];
        let (shimmed, plain, answered) =
            exit_pair(py, f, f, &format!("{tag}-{}", round % 6), round);
        t.shimmed.push((shimmed, f));
        t.plain.push((plain, f));
        t.answered += answered;
    }
    t
}

/// One round of [`exit_rounds`]: `py_exit.py shim_flags` under the shim
/// (socket directory `tag`) and `py_exit.py plain_flags` without it,
/// started together (which one first alternates with `seed`). Once both
/// are up, both are told the same instant to exit, 20 to 60 ms ahead, and
/// each is timed from that instant to the moment it has exited (its pidfd
/// becomes readable). Side by side, a stall of the machine (another
/// program's burst, the hypervisor taking the CPU) slows both exits of a
/// round alike. While the shimmed one lives (a fraction of a second: the
/// fire covers its last second and more), another thread fires `stats`
/// and `gc` at its socket as fast as it can. Returns the two times, shimmed
/// first, and how many requests were answered with a result.
pub fn exit_pair(
    py: &Cpython,
    shim_flags: &'static [&'static str],
    plain_flags: &'static [&'static str],
    tag: &str,
    seed: u32,
) -> (Duration, Duration, u64) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let script = fixture_py("py_exit.py");
    let dir = socket_dir(tag);
    let start_shimmed = || {
        let mut c = py.shimmed(&script, shim_flags, &dir).spawn();
        c.labelled(&format!(
            "{} under the shim, flags {shim_flags:?}",
            py.label
        ));
        c
    };
    let start_plain = || {
        let mut a: Vec<&OsStr> = vec![script.as_os_str()];
        a.extend(plain_flags.iter().map(OsStr::new));
        let mut c = py.cmd(a).spawn();
        c.labelled(&format!(
            "{} without the shim, flags {plain_flags:?}",
            py.label
        ));
        c
    };
    let (mut shimmed, mut plain) = if seed.is_multiple_of(2) {
        let s = start_shimmed();
        (s, start_plain())
    } else {
        let p = start_plain();
        (start_shimmed(), p)
    };
    let pid = shimmed.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let fire = {
        let (stop, answered, dir) = (stop.clone(), answered.clone(), dir.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            // Its socket, looked for every millisecond (it appears as the
            // interpreter starts, and goes as it exits); `None` once told
            // to stop.
            let socket_or_stop = || {
                crate::poll_every(Duration::from_millis(1), Duration::MAX, || {
                    if stop.load(Ordering::Relaxed) {
                        return Some(None);
                    }
                    let rd = std::fs::read_dir(&dir).ok()?;
                    rd.flatten()
                        .map(|e| e.path())
                        .find(|p| {
                            p.file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with(&format!("{pid}-")))
                        })
                        .map(Some)
                })
                .flatten()
            };
            while let Some(sock) = socket_or_stop() {
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
    shimmed.wait_for_line("up", Duration::from_secs(20));
    plain.wait_for_line("up", Duration::from_secs(20));
    // 20 to 60 ms from now, spread over the rounds (a hash of the seed).
    let mut x = (seed as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    let exit_at = crate::monotonic_ns() + 20_000_000 + x % 40_000_000;
    let line = format!("exit_at {exit_at}");
    if seed.is_multiple_of(2) {
        shimmed.send(&line);
        plain.send(&line);
    } else {
        plain.send(&line);
        shimmed.send(&line);
    }
    let ended = crate::exit_instants(&[&shimmed, &plain], Duration::from_secs(20));
    let took =
        |at: Option<u64>| Duration::from_nanos(at.unwrap_or(u64::MAX).saturating_sub(exit_at));
    let (took_shimmed, took_plain) = (took(ended[0]), took(ended[1]));
    let out_shimmed = shimmed.finish(Duration::from_secs(20));
    let out_plain = plain.finish(Duration::from_secs(20));
    stop.store(true, Ordering::Relaxed);
    fire.join().unwrap();
    for (out, how, f) in [
        (out_shimmed, "under", shim_flags),
        (out_plain, "without", plain_flags),
    ] {
        assert_eq!(
            (out.code, out.stderr.as_str()),
            (0, ""),
            "{} {how} the shim (flags {f:?}): the interpreter must exit cleanly",
            py.label
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    (took_shimmed, took_plain, answered.load(Ordering::Relaxed))
}
