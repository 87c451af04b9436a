//! For the `control_*` tests: the C fixture with a heap to purge, and
//! memshim-ctl with JSON output.

use crate::*;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::endpoint::{Conn, default_dir, socket_name};

/// The fixture program (tests/fixtures/control_heap.c).
pub fn heap_fixture() -> PathBuf {
    fixture("control_heap", &[])
}

/// `memshim-ctl stats PID [extra...] --json` of `parked_cache <workers>
/// <mode>` (tests/fixtures/parked_cache.c) under the shim with `envs`, once
/// all its workers have allocated and parked; the fixture must then exit 0
/// with an empty stderr.
pub fn parked_cache_stats(
    workers: u32,
    mode: &str,
    envs: &[(&str, &str)],
    extra: &[&str],
) -> serde_json::Value {
    let mut c = Cmd::new(
        fixture("parked_cache", &[]),
        [workers.to_string().as_str(), mode],
    )
    .shimmed();
    for (k, v) in envs {
        c = c.env(k, v);
    }
    let mut c = c.spawn();
    c.wait_for_line("ready", Duration::from_secs(30));
    let pid = c.pid().to_string();
    let mut args = vec!["stats", pid.as_str()];
    args.extend_from_slice(extra);
    let (code, stats) = ctl_json(&args);
    assert_eq!(code, 0, "{stats}");
    c.send("quit");
    let o = c.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    stats
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

/// Field 22 of /proc/<pid>/stat (the process must exist).
pub fn starttime(pid: i32) -> u64 {
    crate::endpoint::starttime(pid).unwrap_or_else(|| panic!("no process {pid}"))
}

/// The socket path of `pid` in `dir` (the process must exist).
pub fn socket_in(dir: &std::path::Path, pid: i32) -> PathBuf {
    crate::endpoint::socket_path(dir, pid).unwrap_or_else(|| panic!("no process {pid}"))
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

/// RSS in MiB, for messages.
pub fn rss_mib(pid: i32) -> f64 {
    mib(rss_bytes(pid))
}

/// Thread ids of `pid`'s threads named `memshim` (the shim's thread, and
/// its spawner in a Python process).
pub fn shim_tids(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "memshim")
                })
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The descriptors of `pid`'s thread `tid` (its table: the application's,
/// or one of its own): (number, link target).
pub fn task_fds(pid: i32, tid: i32) -> Vec<(i32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/task/{tid}/fd"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.parse().ok()?;
                    let l = std::fs::read_link(e.path()).ok()?;
                    Some((n, l.display().to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every socket `pid` holds, in every descriptor table its threads use
/// (`socket:[inode]` links).
pub fn sockets_of(pid: i32) -> std::collections::HashSet<String> {
    let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.into_iter()
        .flat_map(|t| task_fds(pid, t))
        .map(|(_, l)| l)
        .filter(|l| l.starts_with("socket:"))
        .collect()
}

/// The number under which the shim's thread of `pid` holds the listening
/// socket bound to `path` (found through its inode in /proc/net/unix).
pub fn listener_fd(pid: i32, path: &std::path::Path) -> Option<i32> {
    let unix = std::fs::read_to_string("/proc/net/unix").ok()?;
    let want = path.to_str()?;
    // "Num RefCount Protocol Flags Type St Inode Path"; St 01 = listening.
    let inode = unix.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 8 && f[7] == want && f[5] == "01").then(|| f[6].to_owned())
    })?;
    let link = format!("socket:[{inode}]");
    shim_tids(pid)
        .into_iter()
        .flat_map(|t| task_fds(pid, t))
        .find_map(|(n, l)| (l == link).then_some(n))
}
