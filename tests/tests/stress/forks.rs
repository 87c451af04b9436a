//! Fork storms: multiprocessing with fork, spawn and forkserver, and
//! posix_spawn / fork+exec / fork in a loop, while purges run against every
//! process that has an endpoint. Every child finishes with the right result,
//! no child inherits the shim's thread or socket, and no socket is left.

use memshim_tests::endpoint::Conn;
use memshim_tests::stress::{Level, figures, socket_files};
use memshim_tests::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Inodes of the sockets bound under `dir` (from /proc/net/unix: the
/// listening sockets and the server ends of their connections), with their
/// /proc/net/unix line.
fn endpoint_inodes(dir: &Path) -> Vec<(u64, String)> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[7].starts_with(&prefix))
                .then(|| Some((f[6].parse().ok()?, l.to_owned())))
                .flatten()
        })
        .collect()
}

/// Purges (and releases) every process with a socket in `dir` until
/// `stop`; records the endpoint inodes it saw and counts the answers.
struct Purger {
    stop: Arc<AtomicBool>,
    purges: Arc<AtomicU64>,
    inodes: Arc<Mutex<std::collections::HashMap<u64, String>>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Purger {
    fn start(dir: PathBuf) -> Purger {
        let stop = Arc::new(AtomicBool::new(false));
        let purges = Arc::new(AtomicU64::new(0));
        let inodes = Arc::new(Mutex::new(std::collections::HashMap::new()));
        let (s, p, i) = (stop.clone(), purges.clone(), inodes.clone());
        let handle = std::thread::spawn(move || {
            let mut round = 0u64;
            while !s.load(Relaxed) {
                i.lock().unwrap().extend(endpoint_inodes(&dir));
                for name in socket_files(&dir) {
                    // Processes come and go: a refused or vanished endpoint is fine here.
                    // Alternate `purge` and `release` (gc in CPython, then purge):
                    // the Python bridge runs on the shim's thread while the
                    // process forks.
                    let op = if round.is_multiple_of(2) {
                        r#"{"op":"purge"}"#
                    } else {
                        r#"{"op":"release"}"#
                    };
                    round += 1;
                    let answered = Conn::open(&dir.join(&name))
                        .and_then(|mut c| c.ask(op))
                        .is_ok_and(|v| v.get("ok").is_some());
                    if answered {
                        p.fetch_add(1, Relaxed);
                    }
                }
                // On purpose: the purges' pace, a sweep every 5 ms.
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Purger {
            stop,
            purges,
            inodes,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> (u64, std::collections::HashMap<u64, String>) {
        self.stop.store(true, Relaxed);
        self.handle.take().unwrap().join().expect("purger thread");
        (
            self.purges.load(Relaxed),
            self.inodes.lock().unwrap().clone(),
        )
    }
}

/// Socket files left in `dir` whose process still runs, or that still
/// accept a connection.
fn live_leftovers(dir: &Path) -> Vec<String> {
    socket_files(dir)
        .into_iter()
        .filter(|n| {
            let pid: i32 = n
                .split('-')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            memshim_tests::stress::alive(pid)
                || std::os::unix::net::UnixStream::connect(dir.join(n)).is_ok()
        })
        .collect()
}

pub fn multiprocessing(level: Level) {
    let (rounds, tasks) = level.pick((1, 40), (12, 400));
    let dir = memshim_tests::socket_dir_path("mp");
    let purger = Purger::start(dir.clone());
    let script = root().join("tests/fixtures/mp_storm.py");
    let o = Cmd::new(
        python(),
        [
            script.display().to_string(),
            rounds.to_string(),
            tasks.to_string(),
        ],
    )
    .shimmed()
    .env("MEMSHIM_SOCKET_DIR", &dir)
    .run_timeout(Duration::from_secs(level.pick(300, 900)));
    let (purges, inodes) = purger.finish();
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(o.stderr, "", "stderr must stay empty");
    let mut total_tasks = 0;
    let mut workers = 0;
    for line in o.stdout.lines().filter(|l| l.contains("\"method\"")) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let m = v["method"].as_str().unwrap();
        assert_eq!(v["bad"], 0, "{m}: wrong results: {line}");
        assert_eq!(v["tasks"], rounds * tasks, "{m}: {line}");
        total_tasks += v["tasks"].as_u64().unwrap();
        workers += v["workers"].as_u64().unwrap();
        for f in v["first"].as_array().unwrap() {
            let names: Vec<&str> = f["threads"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap())
                .collect();
            assert!(
                !names.contains(&"memshim"),
                "{m}: worker {} inherited a memshim thread: {names:?}",
                f["pid"]
            );
            for s in f["sockets"].as_array().unwrap() {
                let s = s.as_u64().unwrap();
                assert!(
                    !inodes.contains_key(&s),
                    "{m}: worker {} holds a socket of a control endpoint: {:?} (/proc/net/unix: Num RefCount Protocol Flags Type St Inode Path)",
                    f["pid"],
                    inodes[&s]
                );
            }
        }
    }
    assert!(o.stdout.contains("done"), "{}", o.stdout);
    assert_eq!(total_tasks, 3 * rounds * tasks);
    let left = live_leftovers(&dir);
    assert!(
        left.is_empty(),
        "live sockets left after every process ended: {left:?}"
    );
    let stale = socket_files(&dir).len();
    let _ = std::fs::remove_dir_all(&dir);
    figures(
        level,
        "fork_storm_multiprocessing",
        &[
            ("methods", "fork,spawn,forkserver".into()),
            ("tasks", total_tasks.to_string()),
            ("worker_processes", workers.to_string()),
            ("purges_and_releases", purges.to_string()),
            ("endpoints_seen", inodes.len().to_string()),
            ("stale_socket_files", stale.to_string()),
            ("failures", "0".into()),
        ],
    );
}

pub fn spawn_loop(level: Level) {
    let n = level.pick(150, 6000);
    let dir = memshim_tests::socket_dir_path("spawn");
    let purger = Purger::start(dir.clone());
    let exe = fixture("spawn_storm", &[]);
    let o = Cmd::new(&exe, [n.to_string()])
        .shimmed()
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run_timeout(Duration::from_secs(level.pick(120, 900)));
    let (purges, inodes) = purger.finish();
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(o.stderr, "");
    assert!(
        o.stdout.contains(&format!("done children={n} bad=0")),
        "{}",
        o.stdout
    );
    assert!(
        purges > 0 && !inodes.is_empty(),
        "the parent's endpoint was never purged ({purges})"
    );
    let left = live_leftovers(&dir);
    assert!(left.is_empty(), "live sockets left: {left:?}");
    let stale = socket_files(&dir);
    assert!(
        stale.is_empty(),
        "the parent exited normally but left {stale:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    figures(
        level,
        "fork_storm_spawn",
        &[
            ("children", n.to_string()),
            ("kinds", "posix_spawn,fork+exec,fork".into()),
            ("purges_and_releases", purges.to_string()),
            ("failures", "0".into()),
        ],
    );
}
