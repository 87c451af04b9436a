//! `memshim-ctl cgroup` and `reclaim` refuse bad input with a clear message
//! and a distinct exit code, and a `reclaim` that cannot do its job changes
//! nothing: a pid that is gone (3), no memory cgroup (8), no permission
//! (5, another uid via setpriv), a read-only cgroup filesystem (9, a
//! read-only bind mount in a mount namespace, as containers have it).

use memshim_proto::exit::{FAILED, NO_CGROUP, NOT_FOUND, PERMISSION, READ_ONLY};
use memshim_tests::cgroups::*;
use memshim_tests::control::{ctl_json, ctl_run};
use memshim_tests::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const NOBODY: &[&str] = &["--reuid=65534", "--regid=65534", "--clear-groups"];

/// memshim-ctl run as uid 65534.
fn as_nobody(args: &[&str]) -> Output {
    let mut a: Vec<String> = NOBODY.iter().map(|s| s.to_string()).collect();
    a.push(ctl().display().to_string());
    a.extend(args.iter().map(|s| s.to_string()));
    Cmd::new("setpriv", a).run()
}

fn json_error(o: &Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {o:?}"));
    v["error"].clone()
}

#[test]
fn a_pid_that_is_gone_is_exit_3() {
    let o = Cmd::new("true", Vec::<String>::new()).spawn();
    let pid = o.pid();
    let _ = o.finish(Duration::from_secs(10));
    for cmd in ["cgroup", "reclaim"] {
        let o = ctl_run(&[cmd, &pid.to_string()]);
        assert_eq!(o.code, i32::from(NOT_FOUND.code), "{cmd}: {o:?}");
        assert!(
            o.stderr.contains(&format!("pid {pid}: no such process")),
            "{o:?}"
        );
        let (code, v) = ctl_json(&[cmd, &pid.to_string()]);
        assert_eq!(
            (code, v["error"]["code"].as_str()),
            (i32::from(NOT_FOUND.code), Some(NOT_FOUND.name)),
            "{v}"
        );
    }
}

#[test]
fn no_memory_controller_mounted_is_exit_8() {
    if !is_root() {
        eprintln!("SKIP: unmounting the cgroup filesystems in a mount namespace needs root");
        return;
    }
    // Take away every cgroup mount in a mount namespace of our own: the
    // process is still in its memory cgroup, but nothing here shows it.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut cgroup_mounts: Vec<&str> = mounts
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup")
                .then(|| left.split(' ').nth(4))
                .flatten()
        })
        .collect();
    cgroup_mounts.reverse(); // children first
    let umounts: String = cgroup_mounts
        .iter()
        .map(|m| format!("umount -l '{m}' && "))
        .collect();
    for cmd in ["cgroup", "reclaim"] {
        let script = format!("{umounts}exec '{}' {cmd} --json", ctl().display());
        let o = Cmd::new("unshare", ["-m", "sh", "-c", &script]).run();
        if o.stderr.contains("umount") || o.stderr.contains("unshare:") {
            eprintln!(
                "SKIP: cannot unmount the cgroup filesystems here: {}",
                o.stderr.trim()
            );
            return;
        }
        assert_eq!(o.code, i32::from(NO_CGROUP.code), "{cmd}: {o:?}");
        let e = json_error(&o);
        assert_eq!(e["code"], "no_cgroup", "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .starts_with("no memory cgroup:"),
            "{e}"
        );
        assert!(
            o.stderr.contains("no memory cgroup") && o.stderr.contains("hint:"),
            "{o:?}"
        );
    }
}

/// A sleeper inside `cg` that read 32 MiB of a file (page cache charged
/// to the cgroup).
fn cached_sleeper(cg: &TestCgroup, tag: &str) -> (Child, std::path::PathBuf) {
    let file = uncached_file(tag, 32);
    let script = format!(
        "cat '{}' > /dev/null; echo ready; exec sleep 600",
        file.display()
    );
    let mut ch = cg.cmd("sh", ["-c", &script]).spawn();
    ch.wait_for_line("ready", Duration::from_secs(30));
    assert!(
        cg.file_pages() >= 24 * MIB,
        "page cache {}",
        m(cg.file_pages())
    );
    (ch, file)
}

#[test]
fn another_uid_may_look_but_reclaim_is_refused_with_exit_5_and_changes_nothing() {
    let Some(cg) = TestCgroup::new("perm") else {
        return;
    };
    let (sleeper, file) = cached_sleeper(&cg, "cgroup-perm");
    // A root process of the cgroup maps a file in our own /dev/shm.
    let shm = format!("/dev/shm/memshim-test-{}-perm", std::process::id());
    let src = format!(
        "import mmap\nf = open({shm:?}, 'w+b'); f.truncate(1 << 20)\nm = mmap.mmap(f.fileno(), 1 << 20)\n\
         m[:] = b'z' * (1 << 20)\nprint('ready', flush=True)\ninput()\n"
    );
    let mut mapper = cg.cmd(python(), ["-c", &src]).spawn();
    mapper.wait_for_line("ready", Duration::from_secs(30));
    let pid = sleeper.pid().to_string();

    let before = cg.file_pages();
    let o = as_nobody(&["reclaim", &pid, "--json"]);
    assert_eq!(o.code, i32::from(PERMISSION.code), "{o:?}");
    let e = json_error(&o);
    assert_eq!(e["code"], "permission", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("nothing was changed"),
        "{e}"
    );
    assert!(
        o.stderr.contains("permission denied") && o.stderr.contains("as root"),
        "{o:?}"
    );
    assert!(
        cg.file_pages() + 4 * MIB >= before,
        "page cache untouched: {} -> {}",
        m(before),
        m(cg.file_pages())
    );

    // Looking is allowed, and honest about what it could not see: the
    // file root's process maps is not called unowned.
    let o = as_nobody(&["cgroup", &pid, "--json"]);
    assert_eq!(o.code, 0, "{o:?}");
    let r: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let f = shm_file(&r, &shm);
    assert_eq!(f["state"], "unknown", "{f}");
    assert!(
        r["shm"]["unreadable_processes"].as_u64().unwrap() >= 1,
        "{}",
        r["shm"]
    );
    assert!(
        r["notes"].to_string().contains("could not be read"),
        "{}",
        r["notes"]
    );
    // As root: in use, by the mapper.
    let (_, r) = ctl_json(&["cgroup", &pid]);
    let f = shm_file(&r, &shm);
    assert_eq!(f["state"], "in_use", "{f}");
    assert_eq!(f["users"][0], mapper.pid(), "{f}");
    drop(mapper);
    let _ = std::fs::remove_file(&shm);
    let _ = std::fs::remove_file(file);
}

/// A process that could not be read makes only the files of filesystems
/// it has mounted `unknown`. Seen by uid 65534: root's processes cannot be
/// read and have the host's /dev/shm; nobody's own process, in a user and
/// mount namespace of its own, has a private /dev/shm with a leftover.
#[test]
fn an_unreadable_process_leaves_the_files_of_other_filesystems_unowned() {
    let Some(cg) = TestCgroup::new("shmscope") else {
        return;
    };
    let userns = Cmd::new(
        "setpriv",
        NOBODY.iter().copied().chain(["unshare", "-Urm", "true"]),
    )
    .run();
    if userns.code != 0 {
        eprintln!("SKIP: uid 65534 cannot make a user namespace here: {userns:?}");
        return;
    }
    let host = format!("/dev/shm/memshim-test-{}-scope", std::process::id());
    std::fs::write(&host, vec![7u8; MIB as usize]).unwrap();
    let root_sleeper = cg.cmd("sleep", ["600"]).spawn();
    let script = "mount -t tmpfs -o size=16m memshim-test-scope /dev/shm \
                  && head -c 2097152 /dev/zero > /dev/shm/leftover && echo ready && exec sleep 600";
    let mut own = cg
        .cmd(
            "setpriv",
            NOBODY
                .iter()
                .copied()
                .chain(["unshare", "-Urm", "sh", "-c", script]),
        )
        .spawn();
    own.wait_for_line("ready", Duration::from_secs(30));

    let o = as_nobody(&["cgroup", &own.pid().to_string(), "--json"]);
    assert_eq!(o.code, 0, "{o:?}");
    let r: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let state = |path: &str| shm_file(&r, path)["state"].clone();
    // Root's sleeper may hold the host's file: nobody cannot tell.
    assert_eq!(state(&host), "unknown", "{}", r["shm"]);
    // Only nobody's own process has the private tmpfs mounted.
    assert_eq!(state("/dev/shm/leftover"), "unowned", "{}", r["shm"]);
    assert_eq!(r["shm"]["unowned_bytes"], 2 * MIB, "{}", r["shm"]);
    assert!(
        r["shm"]["unreadable_processes"].as_u64().unwrap() >= 1,
        "{}",
        r["shm"]
    );
    drop(own);
    drop(root_sleeper);
    let _ = std::fs::remove_file(&host);
}

#[test]
fn a_read_only_cgroup_filesystem_is_exit_9_says_what_to_do_and_changes_nothing() {
    let Some(cg) = TestCgroup::new("ro") else {
        return;
    };
    let (sleeper, file) = cached_sleeper(&cg, "cgroup-ro");
    let pid = sleeper.pid().to_string();
    let mp = cg.mount.display().to_string();
    let script = format!(
        "mount --bind '{mp}' '{mp}' && mount -o remount,bind,ro '{mp}' && exec '{}' reclaim {pid} \"$@\"",
        ctl().display()
    );
    let before = cg.file_pages();
    let o = Cmd::new("unshare", ["-m", "sh", "-c", &script, "sh", "--json"]).run();
    if o.stderr.contains("mount:") {
        eprintln!(
            "SKIP: cannot make a read-only bind mount here: {}",
            o.stderr.trim()
        );
        return;
    }
    assert_eq!(o.code, i32::from(READ_ONLY.code), "{o:?}");
    let e = json_error(&o);
    assert_eq!(e["code"], "read_only", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("read-only") && msg.contains("nothing was changed"),
        "{e}"
    );
    let hint = e["hint"].as_str().unwrap();
    assert!(
        hint.contains("on the host") && hint.contains("DaemonSet"),
        "{e}"
    );
    assert!(
        cg.file_pages() + 4 * MIB >= before,
        "page cache untouched: {} -> {}",
        m(before),
        m(cg.file_pages())
    );
    // The human form says the same on stderr.
    let o = Cmd::new("unshare", ["-m", "sh", "-c", &script, "sh"]).run();
    assert_eq!(o.code, i32::from(READ_ONLY.code), "{o:?}");
    assert!(
        o.stderr.contains("read-only") && o.stderr.contains("DaemonSet"),
        "{o:?}"
    );
    let _ = std::fs::remove_file(file);
}

/// A shimmed CPython in `cg` that sleeps in short naps, its endpoint up
/// (`MEMSHIM_CONTROL=on`).
fn shimmed_sleeper(cg: &TestCgroup) -> Child {
    let src = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)\n";
    let mut c = cg
        .cmd(python(), ["-c", src])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    c.wait_for_line("ready", Duration::from_secs(30));
    memshim_tests::control::wait_endpoint(c.pid());
    c
}

#[test]
fn a_thread_id_is_refused_and_a_shimmed_process_that_does_not_answer_fails_reclaim() {
    let Some(cg) = TestCgroup::new("stopped") else {
        return;
    };
    let (a, b) = (shimmed_sleeper(&cg), shimmed_sleeper(&cg));
    let (ap, bp) = (a.pid(), b.pid());

    // A thread id (the shim's thread of `a`) is not taken for a process.
    let tid = std::fs::read_dir(format!("/proc/{ap}/task"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|&t| t != ap)
        .expect("a second thread");
    for cmd in ["cgroup", "reclaim"] {
        let o = ctl_run(&[cmd, &tid.to_string()]);
        assert_eq!(o.code, i32::from(NOT_FOUND.code), "{cmd}: {o:?}");
        assert!(
            o.stderr.contains(&format!("a thread of process {ap}")),
            "{cmd}: {o:?}"
        );
    }

    // A stopped process's socket accepts but nothing answers: its purge
    // failed, it was not "skipped", and reclaim did not do its whole job.
    assert_eq!(Cmd::new("kill", ["-STOP", &bp.to_string()]).run().code, 0);
    let (code, v) = ctl_json(&["reclaim", &ap.to_string()]);
    // `cgroup` says whose heap it cannot break down.
    let (ccode, c) = ctl_json(&["cgroup", &ap.to_string()]);
    assert_eq!(Cmd::new("kill", ["-CONT", &bp.to_string()]).run().code, 0);
    assert_eq!(ccode, 0, "{c}");
    assert!(
        c["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .contains(&format!("pid(s) {bp} have or may have the shim"))),
        "{c}"
    );
    assert_eq!(code, i32::from(FAILED.code), "{v}");
    let entry = |list: &str| {
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == bp)
            .cloned()
    };
    assert!(entry("skipped").is_none(), "{v}");
    assert!(
        entry("purge").is_some_and(|p| p["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("the process is stopped"))),
        "{v}"
    );
    assert!(
        v["purge"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == ap && p["result"].is_object()),
        "{v}"
    );
    drop((a, b));
}

/// A process its cgroup's freezer holds (`docker pause`) is not asked, as
/// a stopped one is not: its socket accepts, nothing answers, and each
/// request waited out its 5 s limit and said only "no answer in time"
/// (`reclaim` asked twice, so a paused pod of 30 processes took 5
/// minutes). It is named as frozen at once; thawed, it answers.
#[test]
fn a_process_its_cgroups_freezer_holds_is_named_as_frozen() {
    let Some(cg) = TestCgroup::new("frozen") else {
        return;
    };
    let c = shimmed_sleeper(&cg);
    let pid = c.pid().to_string();
    // v2: the cgroup's own cgroup.freeze; v1: a cgroup of the freezer
    // hierarchy.
    let (state, frozen, thawed, v1dir) = if cg.version == 2 {
        (cg.dir.join("cgroup.freeze"), "1", "0", None)
    } else {
        let dir = std::path::PathBuf::from(format!(
            "/sys/fs/cgroup/freezer/memshim-test-{}-frozen",
            std::process::id()
        ));
        if std::fs::create_dir_all(&dir).is_err() {
            memshim_tests::skip("no v1 freezer hierarchy at /sys/fs/cgroup/freezer");
            return;
        }
        std::fs::write(dir.join("cgroup.procs"), &pid).unwrap();
        (dir.join("freezer.state"), "FROZEN", "THAWED", Some(dir))
    };
    std::fs::write(&state, frozen).unwrap();
    let o = ctl_run(&["stats", &pid]);
    let (code, v) = ctl_json(&["cgroup", &pid]);
    std::fs::write(&state, thawed).unwrap();
    let after = memshim_tests::wait_until(Duration::from_secs(10), || {
        let o = ctl_run(&["stats", &pid]);
        (o.code == 0).then_some(o)
    });
    drop(c);
    if let Some(dir) = v1dir {
        let _ =
            memshim_tests::wait_until(Duration::from_secs(10), || std::fs::remove_dir(&dir).ok());
    }
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(o.stderr.contains("frozen by its cgroup's freezer"), "{o:?}");
    assert_eq!(code, 0, "{v}");
    assert!(v.to_string().contains("frozen"), "{v}");
    assert!(after.is_some(), "thawed, it did not answer");
}

/// The root cgroup's `cgroup.procs` lists kernel threads, which run no
/// program and have no memory: `cgroup` counted them among the processes
/// without the shim ("77 process(es) run without the shim: their heaps are
/// in `other anonymous`", with 62 kernel threads among them).
#[test]
fn kernel_threads_are_not_counted_among_a_cgroups_processes() {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let flags = |pid: i32| -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(6)?
            .parse()
            .ok()
    };
    let memory_cgroup = |pid: i32| -> Option<String> {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()?
            .lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == "memory"))
                    || l.starts_with("0::")
            })
            .map(str::to_owned)
    };
    let pids: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let kthread_cgroups: Vec<String> = pids
        .iter()
        .filter(|&&p| flags(p).is_some_and(|f| f & PF_KTHREAD != 0))
        .filter_map(|&p| memory_cgroup(p))
        .collect();
    // A process in the cgroup the kernel threads are in (the root).
    let Some(pid) = pids.iter().copied().find(|&p| {
        flags(p).is_some_and(|f| f & PF_KTHREAD == 0)
            && memory_cgroup(p).is_some_and(|c| kthread_cgroups.contains(&c))
    }) else {
        memshim_tests::skip("no process shares a memory cgroup with the kernel threads here");
        return;
    };
    let (code, v) = ctl_json(&["cgroup", &pid.to_string()]);
    if code == i32::from(NO_CGROUP.code) {
        memshim_tests::skip("the kernel threads' cgroup is not a memory cgroup here");
        return;
    }
    assert_eq!(code, 0, "{v}");
    let listed: Vec<i64> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pid"].as_i64())
        .collect();
    let kernel: Vec<i64> = listed
        .iter()
        .copied()
        .filter(|&p| flags(p as i32).is_some_and(|f| f & PF_KTHREAD != 0))
        .collect();
    assert!(
        !listed.is_empty() && kernel.is_empty(),
        "kernel threads listed: {kernel:?}"
    );
}
