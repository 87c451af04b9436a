//! Helpers shared by the control_*.rs tests: the C fixture, memshim-ctl
//! with JSON output, raw socket access.

#![allow(dead_code)]

use memshim_tests::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// The fixture program (tests/fixtures/control_heap.c).
pub fn heap_fixture() -> PathBuf {
    fixture("control_heap", &[])
}

/// Starts the fixture under the shim with decay off, waits for "started".
pub fn start_heap(extra_env: &[(&str, &str)]) -> Child {
    let mut c = Cmd::new(heap_fixture(), Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_DIRTY_DECAY_MS", "-1");
    for (k, v) in extra_env {
        c = c.env(k, v);
    }
    let mut child = c.spawn();
    child.wait_for_line("started", Duration::from_secs(10));
    child
}

/// Runs memshim-ctl.
pub fn ctl_run(args: &[&str]) -> Output {
    Cmd::new(ctl(), args).run()
}

/// Runs memshim-ctl with `--json` appended and parses stdout.
pub fn ctl_json(args: &[&str]) -> (i32, serde_json::Value) {
    let mut a = args.to_vec();
    a.push("--json");
    let o = ctl_run(&a);
    let v = serde_json::from_str(&o.stdout).unwrap_or_else(|e| {
        panic!("memshim-ctl {args:?}: stdout is not one JSON document ({e}): {o:?}")
    });
    (o.code, v)
}

/// Field 22 of /proc/<pid>/stat.
pub fn starttime(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    s[s.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

/// The default socket directory of this (root or not) test process.
pub fn default_dir() -> PathBuf {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = s
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_owned();
    PathBuf::from(format!("/tmp/memshim-{uid}"))
}

/// The socket path of `pid` in `dir`.
pub fn socket_in(dir: &std::path::Path, pid: i32) -> PathBuf {
    dir.join(format!("{pid}-{}.sock", starttime(pid)))
}

/// Waits until the endpoint of `pid` (default directory) answers `stats`.
pub fn wait_endpoint(pid: i32) {
    wait_until(Duration::from_secs(10), || {
        (ctl_run(&["stats", &pid.to_string(), "--json"]).code == 0).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "endpoint of {pid} never answered: {:?}",
            ctl_run(&["stats", &pid.to_string()])
        )
    });
}

/// A raw protocol connection.
pub struct Raw {
    pub reader: BufReader<UnixStream>,
}

impl Raw {
    pub fn connect(path: &std::path::Path) -> Raw {
        let s =
            UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw {
            reader: BufReader::new(s),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    /// Reads one response line ("" at end of file).
    pub fn line(&mut self) -> String {
        let mut l = String::new();
        let _ = self.reader.read_line(&mut l);
        l
    }

    /// Sends one request line and parses the answer.
    pub fn ask(&mut self, req: &str) -> serde_json::Value {
        self.send(format!("{req}\n").as_bytes()).unwrap();
        let l = self.line();
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("answer to {req}: {e}: {l:?}"))
    }

    pub fn hello(&mut self) -> serde_json::Value {
        self.ask(r#"{"op":"hello","version":1}"#)
    }
}

/// RSS in MiB, for messages.
pub fn rss_mib(pid: i32) -> f64 {
    mib(rss_bytes(pid))
}
