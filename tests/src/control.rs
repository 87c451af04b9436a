//! For the `control` family (tests/tests/control/): the C fixture with a heap to purge, and
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

/// The number of the system call the thread `tid` of `pid` is blocked in
/// (`/proc/<pid>/task/<tid>/syscall`), or `None` while it runs or once it
/// is gone.
pub fn blocked_in(pid: i32, tid: i32) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Whether `nr` is poll(2) or ppoll(2), where the shim's thread waits
/// between two turns of its loop (glibc's `poll` is either).
fn is_poll(nr: i64) -> bool {
    #[cfg(target_arch = "x86_64")]
    if nr == libc::SYS_poll {
        return true;
    }
    nr == libc::SYS_ppoll
}

/// Times the thread `tid` of `pid` has given up the CPU of its own accord
/// (`voluntary_ctxt_switches`): once per wait in a system call.
fn voluntary_switches(pid: i32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Waits (at most 10 s) until the shim's thread of `pid` waits in its
/// loop's poll(2), and returns its thread id. It has then made its first
/// attempt at its socket, whatever came of it: the endpoint is opened
/// before the loop's first poll (shim/src/thread/run.rs). (Its spawner, the
/// other `memshim` thread of a Python process, waits on a futex.)
pub fn wait_shim_polling(pid: i32) -> i32 {
    wait_until(Duration::from_secs(10), || {
        shim_tids(pid)
            .into_iter()
            .find(|&t| blocked_in(pid, t).is_some_and(is_poll))
    })
    .unwrap_or_else(|| {
        panic!(
            "the shim's thread of {pid} never waited in its poll: {}",
            crate::stress::threads_report(pid)
        )
    })
}

/// Waits until the shim's thread of `pid` has gone round its loop at least
/// `turns` times from now, and waits in its poll again: each turn ends in
/// a wait in poll(2) (a voluntary switch), and each turn acts on what it
/// finds (a lost socket, a directory to retry, a changed root), so the
/// thread has had `turns` chances to act since the call. A turn takes its
/// tick (`MEMSHIM_DIRTY_DECAY_MS` / 4, from 50 ms up to 1 s) or less.
pub fn wait_shim_turns(pid: i32, turns: u64) {
    let tid = wait_shim_polling(pid);
    let from = voluntary_switches(pid, tid).unwrap_or(0);
    wait_until(Duration::from_secs(30), || {
        (voluntary_switches(pid, tid)? >= from + turns && blocked_in(pid, tid).is_some_and(is_poll))
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the shim's thread {tid} of {pid} did not go round its loop {turns} times in 30 s: {}",
            crate::stress::threads_report(pid)
        )
    });
}

/// Whether process `pid` holds a Unix stream socket connected to a peer
/// (state 03 in /proc/net/unix): a client whose `connect` has returned,
/// accepted by the other end yet or not.
pub fn has_connected_socket(pid: i32) -> bool {
    let mine = sockets_of(pid);
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| {
            // "Num RefCount Protocol Flags Type St Inode Path"
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 7 && f[5] == "03" && mine.contains(&format!("socket:[{}]", f[6]))
        })
}
