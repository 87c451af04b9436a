//! A shimmed process in its own pid and mount namespace (a container
//! without a container engine: `unshare -pmf --mount-proc` plus a private
//! /tmp) is reachable from outside, through /proc/<pid>/root and NSpid.

use memshim_tests::control::*;
use memshim_tests::*;
use std::time::Duration;

#[test]
fn a_process_in_another_pid_and_mount_namespace_is_reachable_from_outside() {
    if !default_dir().ends_with("memshim-0") {
        eprintln!("SKIP: needs root for unshare -pm");
        return;
    }
    let probe = Cmd::new("unshare", ["-pmf", "--mount-proc", "true"]).run();
    if probe.code != 0 {
        eprintln!(
            "SKIP: unshare -pmf does not work here: {}",
            probe.stderr.trim()
        );
        return;
    }
    let (prefix, p) = private_tmp_prefix(&[&shim(), &heap_fixture()]);
    let script = format!(
        "{prefix}exec env LD_PRELOAD={} MEMSHIM_DIRTY_DECAY_MS=-1 {}",
        p[0], p[1]
    );
    let mut ns = Cmd::new("unshare", ["-pmf", "--mount-proc", "sh", "-c", &script]).spawn();
    let line = ns.wait_for_line("started", Duration::from_secs(10));
    assert_eq!(line, "started 1", "the fixture is pid 1 of its namespace");
    let unshare_pid = ns.pid();
    let host_pid: i32 = wait_until(Duration::from_secs(5), || child_of(unshare_pid))
        .expect("the namespaced process");
    let nspid = std::fs::read_to_string(format!("/proc/{host_pid}/status")).unwrap();
    assert!(
        nspid
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
        "{nspid}"
    );

    // Its socket lives in its private /tmp, invisible at the host's path.
    let inside = format!(
        "/tmp/memshim-0/{}",
        memshim_tests::endpoint::socket_name_inside(1, host_pid).unwrap()
    );
    wait_until(Duration::from_secs(10), || {
        std::path::Path::new(&format!("/proc/{host_pid}/root{inside}"))
            .exists()
            .then_some(())
    })
    .expect("socket inside the namespace");
    assert!(
        !std::path::Path::new(&inside).exists(),
        "the namespace's /tmp should be private"
    );

    ns.send("alloc 64");
    ns.wait_for_line("ready", Duration::from_secs(30));
    let (code, s) = ctl_json(&["stats", &host_pid.to_string()]);
    assert_eq!(code, 0, "{s}");
    assert_eq!(s["pid"], 1, "the process reports its own pid");
    assert!(s["allocator"]["dirty"].as_u64().unwrap() > 16 << 20, "{s}");
    let (code, list) = ctl_json(&["list"]);
    assert_eq!(code, 0);
    let me = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == host_pid)
        .cloned()
        .expect("listed");
    assert_eq!(
        (me["nspid"].as_i64(), me["endpoint"].as_bool()),
        (Some(1), Some(true)),
        "{me}"
    );
    let (code, p) = ctl_json(&["purge", &host_pid.to_string()]);
    assert_eq!(code, 0, "{p}");
    assert!(
        p["purge"][0]["result"]["released"].as_u64().unwrap() > 16 << 20,
        "{p}"
    );
    ns.send("quit");
    let out = ns.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

/// The host pid of the only child of `pid`.
fn child_of(pid: i32) -> Option<i32> {
    let rd = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    rd.flatten().find_map(|t| {
        std::fs::read_to_string(t.path().join("children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// The pid (in our namespace) of the process listening on `path`.
fn server_pid(path: &std::path::Path) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let s = std::os::unix::net::UnixStream::connect(path).ok()?;
    // SAFETY: ucred is plain data; getsockopt fills it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket and a buffer of the size SO_PEERCRED writes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.pid)
}

#[test]
fn processes_with_the_same_pid_and_start_time_in_two_pid_namespaces_keep_their_own_sockets() {
    if Cmd::new("unshare", ["-pf", "true"]).run().code != 0 {
        eprintln!("SKIP: unshare -pf does not work here");
        return;
    }
    let dir = memshim_tests::socket_dir_path("pidns");
    let script = format!(
        "exec env LD_PRELOAD={} MEMSHIM_CONTROL=on MEMSHIM_SOCKET_DIR={} MEMSHIM_DIRTY_DECAY_MS=-1 {}",
        shim().display(),
        dir.display(),
        heap_fixture().display()
    );
    // Two processes, each pid 1 of its own pid namespace, sharing /tmp;
    // tried until both started in the same clock tick.
    for attempt in 0..40 {
        let mut a = Cmd::new("unshare", ["-pf", "--kill-child", "sh", "-c", &script]).spawn();
        let mut b = Cmd::new("unshare", ["-pf", "--kill-child", "sh", "-c", &script]).spawn();
        a.wait_for_line("started", Duration::from_secs(10));
        b.wait_for_line("started", Duration::from_secs(10));
        let (ua, ub) = (a.pid(), b.pid());
        let (Some(pa), Some(pb)) = (child_of(ua), child_of(ub)) else {
            continue;
        };
        if starttime(pa) != starttime(pb) {
            continue;
        }
        // Both endpoints exist, and each is served by its own process.
        let served = wait_until(Duration::from_secs(10), || {
            let mut who: Vec<i32> = std::fs::read_dir(&dir)
                .ok()?
                .flatten()
                .filter_map(|e| server_pid(&e.path()))
                .collect();
            who.sort_unstable();
            let mut want = vec![pa, pb];
            want.sort_unstable();
            (who == want).then_some(())
        });
        let files: Vec<_> = std::fs::read_dir(&dir)
            .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            served.is_some(),
            "attempt {attempt}: pids {pa} and {pb} (both pid 1, start time {}) do not each have an endpoint: {files:?}",
            starttime(pa)
        );
        a.send("quit");
        b.send("quit");
        let (oa, ob) = (
            a.finish(Duration::from_secs(10)),
            b.finish(Duration::from_secs(10)),
        );
        assert_eq!((oa.code, oa.stderr.as_str()), (0, ""));
        assert_eq!((ob.code, ob.stderr.as_str()), (0, ""));
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    eprintln!("SKIP: could not start two processes in the same clock tick");
}
