//! memshim-ctl when things go wrong around it: its stdout is closed or
//! full, the process exits while it is being asked, a thread id is given
//! as a pid, `--all` reaches nobody, `doctor` may not read a process or
//! finds a zombie, `run` is given a library that is not one. Each gets a
//! clear message and its own exit code (docs/troubleshooting.md), never a
//! crash and never 0.

use memshim_proto::exit::{FAILED, NO_ENDPOINT, NOT_FOUND, PERMISSION, USAGE};
use memshim_tests::control::start_heap;
use memshim_tests::{Cmd, Output, ctl, python, shim, wait_until};
use std::process::Stdio;
use std::time::Duration;

/// The line every failing command's stderr ends with, for [`NOT_FOUND`].
fn not_found_line() -> String {
    NOT_FOUND.line() + "\n"
}

/// Waits until process `pid` has a thread named `memshim`.
fn wait_for_shim_thread(pid: i32) {
    wait_until(Duration::from_secs(10), || {
        (!memshim_tests::control::shim_tids(pid).is_empty()).then_some(())
    })
    .expect("the shim's thread");
}

/// `exe 60` (a `sleep`) under the shim with its endpoint on from the start.
fn sleeper(exe: impl AsRef<std::ffi::OsStr>) -> Cmd {
    Cmd::new(exe, ["60"]).shimmed().env("MEMSHIM_CONTROL", "on")
}

const NOBODY: &[&str] = &["--reuid=65534", "--regid=65534", "--clear-groups"];

/// `memshim-ctl args` with its stdout on `out`.
fn ctl_to(out: impl Into<Stdio>, args: &[&str]) -> Output {
    let mut c = std::process::Command::new(ctl());
    c.args(args).stdout(out).stderr(Stdio::piped());
    let o = c.output().expect("run memshim-ctl");
    Output {
        code: o.status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// memshim-ctl with `args` and no stdout at all (`>&-`).
fn ctl_closed(args: &[&str]) -> Output {
    let mut c = std::process::Command::new("sh");
    c.args(["-c", "exec \"$@\" >&-", "sh"])
        .arg(ctl())
        .args(args)
        .stderr(Stdio::piped());
    let o = c.output().expect("run memshim-ctl");
    Output {
        code: o.status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[test]
fn a_closed_or_full_stdout_is_an_error_not_a_crash() {
    let heap = start_heap(&[]);
    let pid = heap.pid().to_string();
    for args in [
        vec!["list"],
        vec!["list", "--json"],
        vec!["stats", pid.as_str()],
        vec!["purge", pid.as_str()],
        vec!["doctor", pid.as_str()],
        vec!["stats", "999999999", "--json"],
        // Help and the version too (clap's own printing exited 0).
        vec!["--help"],
        vec!["stats", "--help"],
        vec!["--version"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let (reader, closed) = std::io::pipe().unwrap();
        drop(reader);
        for (what, o) in [
            ("/dev/full", ctl_to(full, &args)),
            ("a closed pipe", ctl_to(closed, &args)),
            // Rust's runtime puts /dev/null there before main: the CLI
            // looked first (it exited 0, its output gone).
            ("no stdout (>&-)", ctl_closed(&args)),
        ] {
            assert!(
                !o.stderr.contains("panicked") && o.code != 134 && o.code != 0,
                "{args:?} with stdout on {what}: {o:?}"
            );
            // An answer that could not be written is exit 1, saying so; a
            // failure (no such pid) keeps its own code and message.
            if args.get(1) == Some(&"999999999") {
                assert_eq!(
                    o.code,
                    i32::from(NOT_FOUND.code),
                    "{args:?} to {what}: {o:?}"
                );
            } else {
                assert_eq!(o.code, i32::from(FAILED.code), "{args:?} to {what}: {o:?}");
                assert!(
                    o.stderr.contains("writing to stdout"),
                    "{args:?} to {what}: {o:?}"
                );
            }
        }
    }
}

#[test]
fn a_process_that_exits_during_a_request_is_no_such_process() {
    // `gc` runs a finalizer that says so and then takes 5 s; the process is
    // killed during it.
    let src = "import gc, sys, time\ngc.disable()\n\
               class Slow:\n    def __del__(self): print('finalizing', flush=True); time.sleep(5)\n\
               a = Slow(); a.self = a; del a\n\
               print('ready', flush=True)\nsys.stdin.read()\n";
    let mut host = Cmd::new(python(), ["-c", src])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    host.wait_for_line("ready", Duration::from_secs(30));
    let pid = host.pid();
    memshim_tests::control::wait_endpoint(pid);
    let asker = std::thread::spawn(move || Cmd::new(ctl(), ["release", &pid.to_string()]).run());
    host.wait_for_line("finalizing", Duration::from_secs(30));
    host.child.kill().unwrap(); // SIGKILL
    let o = asker.join().unwrap();
    drop(host);
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(
        o.stderr.contains("exited while memshim-ctl talked to it"),
        "{o:?}"
    );
    assert!(o.stderr.ends_with(&not_found_line()), "{o:?}");
}

#[test]
fn a_thread_id_is_not_taken_for_a_process() {
    let src = "import threading, sys\n\
               t = threading.Thread(target=sys.stdin.read); t.start()\n\
               print('ready', flush=True); t.join()\n";
    let mut host = Cmd::new(python(), ["-c", src]).shimmed().spawn();
    host.wait_for_line("ready", Duration::from_secs(30));
    let pid = host.pid();
    let tid = wait_until(Duration::from_secs(10), || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|&t| t != pid)
    })
    .expect("a second thread");
    for cmd in ["stats", "purge", "doctor"] {
        let o = Cmd::new(ctl(), [cmd, &tid.to_string()]).run();
        assert_eq!(o.code, i32::from(NOT_FOUND.code), "{cmd}: {o:?}");
        assert!(
            o.stderr.contains(&format!("a thread of process {pid}")),
            "{cmd}: {o:?}"
        );
        assert!(o.stderr.ends_with(&not_found_line()), "{cmd}: {o:?}");
    }
}

#[test]
fn all_that_reaches_nobody_did_nothing() {
    // A pid namespace of its own, whose /proc shows no shimmed process.
    for cmd in ["purge", "release"] {
        let o = Cmd::new(
            "unshare",
            [
                "--pid",
                "--fork",
                "--mount-proc",
                ctl().to_str().unwrap(),
                cmd,
                "--all",
            ],
        )
        .run();
        assert_eq!(o.code, i32::from(NOT_FOUND.code), "{cmd} --all: {o:?}");
        assert!(
            o.stderr.contains("--all found no shimmed process"),
            "{cmd}: {o:?}"
        );
    }
}

/// Several targets that all fail for the same kind of reason exit with that
/// reason's code (it was 1, "some of several failed", which told a script
/// nothing); a mix of reasons, or of success and failure, is still 1.
#[test]
fn several_targets_failing_alike_give_their_code_and_a_mix_gives_1() {
    for cmd in ["purge", "release"] {
        let o = Cmd::new(ctl(), [cmd, "999999998", "999999999"]).run();
        assert_eq!(o.code, i32::from(NOT_FOUND.code), "{cmd}: {o:?}");
    }
    // No such process (3) beside a process without the shim (3 too, "not
    // loaded"), then beside one whose shim has no endpoint (4): mixed.
    let plain = Cmd::new("sleep", ["30"]).spawn();
    let lone = Cmd::new("sleep", ["30"]).shimmed().spawn();
    let (p, l) = (plain.pid().to_string(), lone.pid().to_string());
    memshim_tests::wait_shim_mapped(lone.pid());
    let o = Cmd::new(ctl(), ["purge", "999999999", &p]).run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    let o = Cmd::new(ctl(), ["purge", "999999999", &l]).run();
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    drop((plain, lone));
}

#[test]
fn doctor_says_permission_and_zombie_with_their_codes() {
    let heap = start_heap(&[]);
    let mut a: Vec<String> = NOBODY.iter().map(|s| s.to_string()).collect();
    a.extend([
        ctl().display().to_string(),
        "doctor".into(),
        heap.pid().to_string(),
    ]);
    let o = Cmd::new("setpriv", a).run();
    assert_eq!(o.code, i32::from(PERMISSION.code), "{o:?}");
    assert!(o.stdout.contains("no_access"), "{o:?}");

    // A child that has exited and that its parent has not reaped.
    let src = "import os, sys\npid = os.fork()\nif pid == 0: os._exit(0)\n\
               print('child', pid, flush=True)\nsys.stdin.read()\n";
    let mut parent = Cmd::new(python(), ["-c", src]).shimmed().spawn();
    let line = parent.wait_for_line("child", Duration::from_secs(30));
    let child: i32 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{child}/status"))
            .ok()?
            .contains("State:\tZ")
            .then_some(())
    })
    .expect("a zombie");
    let o = Cmd::new(ctl(), ["doctor", &child.to_string()]).run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("has exited"), "{o:?}");
    // A zombie's maps read empty: not "libmemshim.so is not loaded", and
    // for `attach` not "the process exited during attach". On cgroup v1 an
    // exiting process reads as in the root cgroup: `cgroup` showed the
    // whole machine, and `reclaim` would have purged every shimmed process
    // in it.
    for verb in ["stats", "attach", "cgroup", "reclaim"] {
        let o = Cmd::new(ctl(), [verb, &child.to_string()]).run();
        assert_eq!(o.code, i32::from(NOT_FOUND.code), "{verb}: {o:?}");
        assert!(
            o.stderr.contains("a zombie its parent has not reaped"),
            "{verb}: {o:?}"
        );
    }
}

/// A kernel thread (kthreadd, pid 2, where this pid namespace shows it)
/// has no program and no environment: "no shim" (3), not "permission
/// denied" (5), for `doctor` as for `stats`.
#[test]
fn doctor_says_a_kernel_thread_runs_no_program() {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let kthread = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(") ").map_or("", |(_, r)| r);
            after
                .split_whitespace()
                .nth(6)
                .and_then(|f| f.parse::<u64>().ok())
                .is_some_and(|f| f & PF_KTHREAD != 0)
        });
    let Some(pid) = kthread else {
        memshim_tests::skip("doctor on a kernel thread: none is visible in this pid namespace");
        return;
    };
    let o = Cmd::new(ctl(), ["doctor", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("is a kernel thread"), "{o:?}");
    let o = Cmd::new(ctl(), ["stats", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
}

#[test]
fn run_refuses_a_library_that_is_not_one_and_arena_counts_the_shim_refuses() {
    let dir = memshim_tests::scratch().join(format!("cli-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("not-a-library.txt");
    std::fs::write(&text, "hello\n").unwrap();
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let o = Cmd::new(ctl(), ["run", "--", "sh", "-c", &touch])
        .env("MEMSHIM_LIB", &text)
        .run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("not a shared library"), "{o:?}");
    assert!(!marker.exists(), "the command ran");
    // A position-independent executable is ELF of type ET_DYN too, which
    // ld.so will not preload: the command ran without the shim, and `run`
    // said 0.
    let o = Cmd::new(ctl(), ["run", "--", "sh", "-c", &touch])
        .env("MEMSHIM_LIB", ctl())
        .run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("not a shared library"), "{o:?}");
    assert!(!marker.exists(), "the command ran");
    // The library itself is accepted.
    let o = Cmd::new(ctl(), ["run", "--", "sh", "-c", &touch])
        .env("MEMSHIM_LIB", shim())
        .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert!(marker.exists());
    // A path LD_PRELOAD would split (at a space or a colon) is refused.
    let spaced = dir.join("a b.so");
    let o = Cmd::new("cp", [shim().as_path(), spaced.as_path()]).run();
    assert_eq!(o.code, 0, "{o:?}");
    std::fs::remove_file(&marker).unwrap();
    let o = Cmd::new(ctl(), ["run", "--", "sh", "-c", &touch])
        .env("MEMSHIM_LIB", &spaced)
        .run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("cannot be preloaded"), "{o:?}");
    assert!(!marker.exists(), "the command ran without the shim");
    // A dry run shows what it would do, and does not do it.
    let o = Cmd::new(ctl(), ["run", "--dry-run", "--", "sh", "-c", &touch]).run();
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("LD_PRELOAD="), "{o:?}");
    assert!(!marker.exists(), "--dry-run ran the command");
    // What `run` accepts, the shim takes without a warning; one more is a
    // usage error.
    let max = memshim_proto::endpoint::MAX_NARENAS;
    let o = Cmd::new(ctl(), ["run", "--narenas", &max.to_string(), "--", "true"]).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let o = Cmd::new(
        ctl(),
        ["run", "--narenas", &(max + 1).to_string(), "--", "true"],
    )
    .run();
    assert_eq!(o.code, i32::from(USAGE.code), "{o:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_socket_dir_that_is_a_file_is_no_endpoint_and_a_problem_for_doctor() {
    let dir = memshim_tests::socket_dir_path("sockdir");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let host = sleeper("sleep").env("MEMSHIM_SOCKET_DIR", &file).spawn();
    let pid = host.pid();
    wait_for_shim_thread(pid);
    let o = Cmd::new(ctl(), ["stats", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(
        o.stderr
            .contains(&format!("{} is not a directory", file.display())),
        "{o:?}"
    );
    let o = Cmd::new(ctl(), ["doctor", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(o.stdout.contains("socket_dir"), "{o:?}");
    drop(host);
    // A directory whose parent does not exist: the shim creates only the
    // last component.
    let deeper = dir.join("nope/deeper");
    let host = sleeper("sleep").env("MEMSHIM_SOCKET_DIR", &deeper).spawn();
    let pid = host.pid();
    wait_for_shim_thread(pid);
    let o = Cmd::new(ctl(), ["stats", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(o.stderr.contains("does not exist"), "{o:?}");
    let o = Cmd::new(ctl(), ["doctor", &pid.to_string()]).run();
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(o.stdout.contains("socket_dir"), "{o:?}");
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A regular file put where a live process's socket was: the shim never
/// removes a file it did not make, so the endpoint stays down until the
/// file goes. `stats` and `doctor` say so (they said "binds its socket
/// again shortly", and `doctor` exited 0), and removing the file heals it.
#[test]
fn a_file_in_place_of_the_socket_is_named_and_a_problem_for_doctor() {
    let dir = memshim_tests::socket_dir_path("squat");
    let host = sleeper("sleep").env("MEMSHIM_SOCKET_DIR", &dir).spawn();
    let pid = host.pid();
    wait_for_shim_thread(pid);
    let sock = memshim_tests::endpoint::wait_socket(&dir, pid, Duration::from_secs(15))
        .expect("no socket");
    // The endpoint answers (its socket file appears at bind, before listen).
    let up = wait_until(Duration::from_secs(15), || {
        let o = Cmd::new(ctl(), ["stats", &pid.to_string()])
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .run();
        (o.code == 0).then_some(())
    });
    assert!(up.is_some(), "the endpoint never answered `stats`");
    // Put over the socket in one step: between a removal and a write the
    // shim could bind its socket there again.
    let squatter = dir.with_extension("squatter");
    std::fs::write(&squatter, "squatter\n").unwrap();
    std::fs::rename(&squatter, &sock).unwrap();
    let o = Cmd::new(ctl(), ["stats", &pid.to_string()])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(
        o.stderr.contains("is a regular file, not a socket") && o.stderr.contains("rm "),
        "{o:?}"
    );
    let o = Cmd::new(ctl(), ["doctor", &pid.to_string()])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(o.stdout.contains("socket_blocked"), "{o:?}");
    std::fs::remove_file(&sock).unwrap();
    let healed = wait_until(Duration::from_secs(15), || {
        let o = Cmd::new(ctl(), ["stats", &pid.to_string()])
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .run();
        (o.code == 0).then_some(())
    });
    assert!(
        healed.is_some(),
        "the endpoint did not come back once the file was removed"
    );
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sleep 60` under the shim (`MEMSHIM_CONTROL=on`) as an executable named
/// `name`, in a scratch directory of its own (returned, to remove).
fn sleep_named(tag: &str, name: &str) -> (std::path::PathBuf, memshim_tests::Child) {
    let dir = memshim_tests::scratch().join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    // Copied by `cp`, not by this multi-threaded process: a descriptor open
    // for writing here could leak into a child forked meanwhile, and the
    // exec below would fail with ETXTBSY.
    let o = Cmd::new("cp", [std::path::Path::new("/bin/sleep"), exe.as_path()]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let host = sleeper(&exe).spawn();
    (dir, host)
}

/// Any process can put newlines and terminal escapes in its own name (here
/// through its executable's file name, which `comm` and `exe` show):
/// `doctor` prints neither (it printed both raw, so a process could forge
/// lines of root's report or drive root's terminal), as `list` did not.
#[test]
fn doctor_never_prints_control_characters_from_a_process_name() {
    let (dir, host) = sleep_named("cli-ctlchars", "ev\nil\u{1b}[31mX");
    let pid = host.pid();
    memshim_tests::control::wait_endpoint(pid);
    let o = Cmd::new(ctl(), ["doctor", &pid.to_string()]).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert!(
        !o.stdout.contains('\u{1b}') && o.stdout.contains(&format!("pid {pid} (ev il [31mX)\n")),
        "{o:?}"
    );
    let o = Cmd::new(ctl(), ["list"]).run();
    assert_eq!(o.code, 0, "{o:?}");
    assert!(!o.stdout.contains('\u{1b}'), "{o:?}");
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process chooses its socket directory (`MEMSHIM_SOCKET_DIR`), and its
/// name reaches root's reports when the shim refuses it: no command prints
/// its terminal escapes or forges a line with its newline. `purge`,
/// `release`, `reclaim` and `cgroup` printed them raw (`stats` and `list`
/// did not), so another user could clear root's screen or set its title.
#[test]
fn no_report_prints_control_characters_from_a_socket_directorys_name() {
    // Short, under /tmp: the socket's path must fit a socket address
    // (108 bytes) wherever the checkout lies, or the shim says that instead.
    let dir = std::path::PathBuf::from(format!(
        "/tmp/m-{}-\u{1b}]0;P\u{7}\u{1b}[2J\nforged",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let host = sleeper("sleep").env("MEMSHIM_SOCKET_DIR", &dir).spawn();
    let pid = host.pid().to_string();
    // The shim refuses the directory; `stats` names it (live: the name
    // reaches the reports).
    let refused = wait_until(Duration::from_secs(10), || {
        let o = Cmd::new(ctl(), ["stats", &pid]).run();
        o.stderr.contains("has mode 0777").then_some(o)
    })
    .unwrap_or_else(|| {
        let o = Cmd::new(ctl(), ["stats", &pid]).run();
        panic!("the shim does not refuse the directory: {o:?}")
    });
    for args in [
        vec!["stats", &pid],
        vec!["list"],
        vec!["purge", &pid],
        vec!["purge", "--json", &pid],
        vec!["release", &pid],
        vec!["cgroup", &pid],
    ] {
        let o = Cmd::new(ctl(), &args).run();
        for text in [&o.stdout, &o.stderr] {
            assert!(
                !text.contains(['\u{1b}', '\u{7}']) && !text.contains("\nforged"),
                "{args:?}: {o:?}"
            );
        }
        assert!(
            o.stdout.contains("has mode 0777")
                || o.stderr.contains("has mode 0777")
                || o.stdout.contains("\\u001b"),
            "{args:?} names the directory: {o:?} ({refused:?})"
        );
    }
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stopped process (SIGSTOP, Ctrl-Z, a debugger) cannot answer: it is
/// reported as stopped at once instead of after the 5 s time limit, which
/// `list`, `cgroup` and `reclaim` paid for each stopped process in turn
/// (`list` took 80 s with 16 of them). Continued, it answers again.
#[test]
fn stopped_processes_are_reported_without_waiting_out_the_time_limit() {
    let hosts: Vec<_> = (0..3).map(|_| sleeper("sleep").spawn()).collect();
    let pids: Vec<String> = hosts.iter().map(|h| h.pid().to_string()).collect();
    for h in &hosts {
        memshim_tests::control::wait_endpoint(h.pid());
    }
    let signal = |sig: &str| {
        for p in &pids {
            assert_eq!(Cmd::new("kill", [sig, p.as_str()]).run().code, 0);
        }
    };
    signal("-STOP");
    for p in &pids {
        let all_stopped = || {
            let rd = std::fs::read_dir(format!("/proc/{p}/task")).ok()?;
            rd.flatten()
                .all(|t| {
                    std::fs::read_to_string(t.path().join("stat"))
                        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, f)| f.starts_with('T')))
                })
                .then_some(())
        };
        wait_until(Duration::from_secs(10), all_stopped).expect("stopped");
    }
    let t = std::time::Instant::now();
    let o = Cmd::new(ctl(), ["stats", &pids[0]]).run();
    let one = t.elapsed();
    let t = std::time::Instant::now();
    let (code, list) = memshim_tests::control::ctl_json(&["list"]);
    let all = t.elapsed();
    signal("-CONT");
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(o.stderr.contains("the process is stopped"), "{o:?}");
    assert!(one < Duration::from_secs(4), "stats waited {one:?}");
    assert_eq!(code, 0, "{list}");
    for p in &pids {
        let me = list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["pid"].as_i64() == p.parse::<i64>().ok())
            .cloned();
        assert!(
            me.is_some_and(|e| e["endpoint"] == false
                && e["reason"].as_str().is_some_and(|r| r.contains("stopped"))),
            "{p}: {list}"
        );
    }
    assert!(
        all < Duration::from_secs(10),
        "list waited {all:?} for 3 stopped processes"
    );
    let o = Cmd::new(ctl(), ["stats", &pids[0]]).run();
    assert_eq!(o.code, 0, "continued: {o:?}");
    drop(hosts);
}

#[test]
fn a_process_whose_name_is_not_utf8_is_found_like_any_other() {
    // The kernel cuts `comm` at 15 bytes: an executable named with 14 ASCII
    // bytes and a two-byte character gets a `comm` ending in half of it.
    let (dir, host) = sleep_named("cli-utf8", "model-servers-\u{fc}");
    let pid = host.pid();
    let comm = wait_until(Duration::from_secs(10), || {
        std::fs::read(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.starts_with(b"model"))
    })
    .expect("the process's comm");
    assert!(std::str::from_utf8(&comm).is_err(), "{comm:?}");
    memshim_tests::control::wait_endpoint(pid);
    for cmd in ["stats", "purge", "doctor"] {
        let o = Cmd::new(ctl(), [cmd, &pid.to_string()]).run();
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{cmd}: {o:?}");
    }
    let (code, list) = memshim_tests::control::ctl_json(&["list"]);
    assert_eq!(code, 0, "{list}");
    let me = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid);
    assert!(
        me.is_some_and(|p| p["command"]
            .as_str()
            .unwrap()
            .contains("model-servers-\u{fc}")),
        "{pid} not listed: {list}"
    );
    let o = Cmd::new(ctl(), ["metrics"]).run();
    assert!(o.stdout.contains(&format!("pid=\"{pid}\"")), "{o:?}");
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every verb that takes a pid refuses 0 and negative ones as a usage
/// error (`doctor` took them and said "no such process", exit 3).
#[test]
fn every_verb_refuses_pid_0_and_negative_pids_as_a_usage_error() {
    for verb in [
        "stats",
        "purge",
        "decay",
        "watch",
        "gc",
        "empty-cache",
        "release",
        "doctor",
        "cgroup",
        "reclaim",
        "record",
        "profile",
        "attach",
        "detach",
    ] {
        for pid in ["0", "-1"] {
            let o = Cmd::new(ctl(), [verb, "--", pid]).run();
            assert_eq!(o.code, i32::from(USAGE.code), "{verb} {pid}: {o:?}");
            assert!(o.stderr.contains("is not in 1..="), "{verb} {pid}: {o:?}");
        }
    }
}
