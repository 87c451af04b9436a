//! The endpoint across the life of processes: fork, exit, kill -9, pid
//! reuse, and an application that closes every descriptor and reuses the
//! numbers.

use memshim_proto::exit::{NO_ENDPOINT, NOT_FOUND, OK, REMOTE};
use memshim_tests::control::*;
use memshim_tests::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

fn hello_pid(path: &std::path::Path) -> i64 {
    Conn::connect(path).hello()["ok"]["pid"].as_i64().unwrap()
}

#[test]
fn parent_and_fork_child_each_answer_on_their_own_endpoint() {
    for table in ["auto", "shared"] {
        fork_child_round(table);
    }
}

fn fork_child_round(table: &str) {
    let started = std::time::Instant::now();
    let mut parent = start_heap(&[("MEMSHIM_FD_TABLE", table)]);
    let ppid = parent.pid();
    wait_endpoint(ppid);
    let forked = std::time::Instant::now();
    parent.send("fork");
    let line = parent.wait_for_line("child ", Duration::from_secs(10));
    let cpid: i32 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    wait_endpoint(cpid);

    let dir = default_dir();
    let (psock, csock) = (socket_in(&dir, ppid), socket_in(&dir, cpid));
    assert_ne!(psock, csock);
    assert_eq!(
        hello_pid(&psock),
        i64::from(ppid),
        "the parent's socket is answered by the parent"
    );
    assert_eq!(
        hello_pid(&csock),
        i64::from(cpid),
        "the child's socket is answered by the child"
    );
    let (_, ps) = ctl_json(&["stats", &ppid.to_string()]);
    let (_, cs) = ctl_json(&["stats", &cpid.to_string()]);
    assert_eq!(
        (
            ps["config"]["fork_child"].as_bool(),
            cs["config"]["fork_child"].as_bool()
        ),
        (Some(false), Some(true))
    );
    // Each one's uptime is its own: since its constructor ran, since the
    // fork (20 ms of slack for the two clocks' rounding).
    let uptime = |s: &serde_json::Value| s["config"]["uptime_ms"].as_u64().unwrap();
    let (pu, cu) = (uptime(&ps), uptime(&cs));
    let ms = |since: std::time::Instant| since.elapsed().as_millis() as u64;
    assert!(
        cu <= ms(forked) + 20 && pu <= ms(started) + 20 && pu >= cu,
        "uptime: parent {pu} ms, child {cu} ms; {} ms since the parent started, {} ms since the fork",
        ms(started),
        ms(forked)
    );
    // The child holds no descriptor of the parent's endpoint (it closed
    // what it inherited; a table of the shim's own is not inherited).
    let shared: Vec<_> = sockets_of(ppid)
        .intersection(&sockets_of(cpid))
        .cloned()
        .collect();
    assert!(
        shared.is_empty(),
        "child still holds the parent's sockets {shared:?}"
    );

    // The child exits normally (destructors run): its socket goes, the
    // parent's stays and answers.
    assert_eq!(Cmd::new("kill", ["-USR1", &cpid.to_string()]).run().code, 0);
    wait_until(Duration::from_secs(10), || (!csock.exists()).then_some(()))
        .expect("child's socket removed at exit");
    assert!(
        psock.exists(),
        "the child's exit removed the parent's socket"
    );
    assert_eq!(hello_pid(&psock), i64::from(ppid));
    parent.send("quit");
    let out = parent.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
    assert!(!psock.exists(), "socket removed at exit");
}

/// `memshim-ctl list` connects to every socket file in the default
/// directory whose process is gone (to tell stale from live) and to every
/// shimmed process's socket: the test that plants an impostor and a fake
/// server there must not run beside the one that lists.
static DEFAULT_DIR_LIST: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_stale_socket_after_kill_9_is_tolerated_and_cleaned_up() {
    // `list` also connects to stale-looking files in every shimmed
    // process's directory, the impostor test's among them.
    let _alone = DEFAULT_DIR_LIST.lock().unwrap_or_else(|e| e.into_inner());
    // A directory of its own: another test's shimmed process, binding its
    // socket in the default one, would remove this stale file first.
    let dir = memshim_tests::socket_dir_path("kill9-list");
    let mut child = start_heap(&[("MEMSHIM_SOCKET_DIR", dir.to_str().unwrap())]);
    let pid = child.pid();
    wait_endpoint(pid);
    let sock = socket_in(&dir, pid);
    child.child.kill().unwrap();
    child.child.wait().unwrap();
    assert!(
        sock.exists(),
        "kill -9 leaves the socket file (no destructor runs)"
    );
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(o.stderr.contains("no such process"), "{o:?}");
    let o = Cmd::new(ctl(), ["list", "--json"])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(o.code, 0, "{o:?}");
    let list: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let removed: Vec<&str> = list["stale_removed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(removed.contains(&sock.to_str().unwrap()), "{list}");
    assert!(!sock.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `_exit` runs no destructor, so a process that ends with it (dash ends
/// every `sh -c` so, Python's `os._exit`) leaves its socket file. The next
/// shimmed process of the pid namespace removes such files when it binds
/// its own; before, every one of them stayed until `memshim-ctl list`.
#[test]
fn socket_files_left_by_exit_go_when_the_next_process_binds() {
    let dir = memshim_tests::socket_dir_path("leftover");
    // Waits until its socket is the only file there (its thread has bound
    // it and removed what the one before left), then leaves without
    // cleaning up. Exit status 3 if that never happens.
    let src = "import os, time\n\
               d = os.environ['MEMSHIM_SOCKET_DIR']\n\
               mine = '%d-' % os.getpid()\n\
               end = time.monotonic() + 20\n\
               while time.monotonic() < end:\n\
               \x20   f = os.listdir(d) if os.path.isdir(d) else []\n\
               \x20   if len(f) == 1 and f[0].startswith(mine): os._exit(0)\n\
               \x20   time.sleep(0.005)\n\
               os._exit(3)\n";
    for _ in 0..5 {
        let o = Cmd::new(python(), ["-c", src])
            .shimmed()
            .env("MEMSHIM_CONTROL", "on")
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .run_timeout(Duration::from_secs(30));
        let left: Vec<_> = std::fs::read_dir(&dir).map_or(vec![], |d| d.flatten().collect());
        assert_eq!(
            (o.code, o.stderr.as_str()),
            (0, ""),
            "the files before it were not removed: {o:?}, {left:?}"
        );
    }
    let files = || -> Vec<String> {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(
        files().len(),
        1,
        "only the last one's file is left: {:?}",
        files()
    );
    let mut cat = Cmd::new("cat", Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .spawn();
    let pid = cat.pid();
    let mine = format!("{pid}-");
    let left = wait_until(Duration::from_secs(10), || {
        let f = files();
        (f.len() == 1 && f[0].starts_with(&mine)).then_some(f)
    });
    assert!(left.is_some(), "files beside the live one's: {:?}", files());
    cat.send("x");
    let o = cat.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_socket_from_an_earlier_process_with_the_same_pid_is_never_used() {
    let _alone = DEFAULT_DIR_LIST.lock().unwrap_or_else(|e| e.into_inner());
    // A directory of its own: another test's shimmed process binding in the
    // default one would remove the planted stale file.
    let dir = memshim_tests::socket_dir_path("same-pid");
    // A live shimmed process without an endpoint (single-threaded `cat`).
    let cat = Cmd::new("cat", Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .spawn();
    let pid = cat.pid();
    wait_shim_mapped(pid);
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    }
    // An earlier process with the same pid left a (listening!) socket.
    let old = dir.join(
        memshim_proto::endpoint::SocketName {
            pid,
            starttime: starttime(pid) - 1,
            pidns: memshim_tests::endpoint::pid_namespace(pid).unwrap(),
        }
        .to_string(),
    );
    let _ = std::fs::remove_file(&old);
    let impostor = UnixListener::bind(&old).unwrap();
    impostor.set_nonblocking(true).unwrap();
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(o.stderr.contains("single-threaded"), "{o:?}");
    assert!(
        impostor.accept().is_err(),
        "memshim-ctl connected to another process's socket"
    );

    // Something answering at the exact name, but as another process: refused.
    let exact = socket_in(&dir, pid);
    let _ = std::fs::remove_file(&exact);
    let fake = UnixListener::bind(&exact).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = fake.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        let hello = r#"{"ok":{"kind":"hello","version":1,"min_version":1,"max_version":1,"pid":1,"starttime":5,"shim_version":"0","max_request_bytes":65536,"ops":[]}}"#;
        (&s).write_all(format!("{hello}\n").as_bytes()).unwrap();
    });
    let o = ctl_run(&["stats", &pid.to_string()]);
    server.join().unwrap();
    assert_eq!(o.code, i32::from(REMOTE.code), "{o:?}");
    assert!(o.stderr.contains("refusing to use it"), "{o:?}");
    assert!(
        old.exists(),
        "the planted file is still there: the check above was live"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn close_range_and_fd_reuse_by_the_app_do_not_confuse_the_endpoint() {
    // The race this guards against (the app's close_range and dup2 while
    // the shim re-creates its listener) is timing-dependent: several rounds,
    // with the shim's descriptors in a table of their own and in the
    // application's (the fallback).
    for table in ["auto", "shared"] {
        for _ in 0..6 {
            close_range_round(table);
        }
    }
}

fn close_range_round(table: &str) {
    let mut child = start_heap(&[("MEMSHIM_FD_TABLE", table)]);
    let pid = child.pid();
    wait_endpoint(pid);
    let sock = socket_in(&default_dir(), pid);
    // The number of the shim's listener (in the application's table, at
    // 512 or above; in a table of its own, any).
    let ours = listener_fd(pid, &sock).expect("the shim's listener");
    let app_path = std::path::PathBuf::from(format!("/tmp/msh-app-{pid}.sock"));
    // The app closes everything and puts its own listening socket on the
    // very number the shim's listener had.
    child.send(&format!("close_range {ours} {}", app_path.display()));
    child.wait_for_line("app-listening", Duration::from_secs(10));
    // The endpoint stays (or comes back) at the same path.
    let back = wait_until(Duration::from_secs(10), || {
        (ctl_run(&["stats", &pid.to_string()]).code == 0).then_some(())
    });
    assert!(
        back.is_some(),
        "endpoint of pid {pid} did not come back after close_range: {:?}",
        ctl_run(&["stats", &pid.to_string()])
    );
    assert_eq!(hello_pid(&sock), i64::from(pid));
    // The app's socket on that number is untouched and gets its own clients.
    child.send(&format!("check {ours}"));
    let l = child.wait_for_line(&format!("fd {ours}"), Duration::from_secs(5));
    assert_eq!(
        l,
        format!("fd {ours} ok {}", app_path.display()),
        "the shim closed or replaced the app's descriptor"
    );
    let _client = UnixStream::connect(&app_path).unwrap();
    child.send(&format!("accept {ours}"));
    child.wait_for_line("app-accepted", Duration::from_secs(5));
    child.send("quit");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
    let _ = std::fs::remove_file(&app_path);
}

/// After the program `chroot`s, the shim's paths name files inside the new
/// root: it took its socket for lost, closed it, and made its directory
/// there (`<jail>/tmp/...`). It keeps serving through the socket outside
/// and leaves the program's new root alone, also when its thread starts
/// again after the `chroot` (here: the next thread after an idle spell).
#[test]
fn a_program_that_chroots_keeps_its_endpoint_and_gets_nothing_in_its_new_root() {
    if !default_dir().ends_with("memshim-0") {
        eprintln!("SKIP: chroot needs root");
        return;
    }
    let jail = std::path::PathBuf::from(format!("/tmp/msh-jail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&jail);
    std::fs::create_dir_all(jail.join("tmp")).unwrap();
    let made = || -> Vec<_> {
        std::fs::read_dir(jail.join("tmp"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect()
    };
    // Directly under /tmp, which the new root has too: a directory of its
    // own, so the file the process leaves (it cannot remove it from inside
    // its new root) goes with it.
    let dir = memshim_tests::socket_dir_path("chroot");
    let start = || {
        let mut c = Cmd::new(fixture("chroot_later", &[]), [jail.to_str().unwrap()])
            .shimmed()
            .env("MEMSHIM_SOCKET_DIR", &dir)
            // Ticks every 50 ms; alone for 1.2 s, the thread stops.
            .env("MEMSHIM_DIRTY_DECAY_MS", "200")
            .spawn();
        c.wait_for_line("ready", Duration::from_secs(10));
        c
    };
    let ask = |c: &mut Child, cmd: &str, reply: &str| {
        c.send(cmd);
        c.wait_for_line(reply, Duration::from_secs(10));
    };

    // The thread runs on through the chroot.
    let mut child = start();
    let pid = child.pid();
    ask(&mut child, "live", "live");
    wait_endpoint(pid);
    ask(&mut child, "go", "chrooted");
    // 16 turns of the shim's thread (800 ms of 50 ms ticks), each one that
    // could have taken the socket for lost.
    wait_shim_turns(pid, 16);
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        made().is_empty(),
        "the shim made {:?} in the program's new root",
        made()
    );
    drop(child);

    // The thread stops, the program chroots, then starts a thread.
    let mut child = start();
    let pid = child.pid();
    ask(&mut child, "brief", "joined");
    wait_endpoint(pid);
    wait_until(Duration::from_secs(10), || {
        (threads(pid) == 1).then_some(())
    })
    .expect("the shim's thread stopped after the idle spell");
    ask(&mut child, "go", "chrooted");
    ask(&mut child, "live", "live");
    wait_until(Duration::from_secs(10), || {
        thread_names(pid)
            .iter()
            .any(|n| n == "memshim")
            .then_some(())
    })
    .expect("the shim's thread started again");
    // Its first try at the socket and the next 10 turns (500 ms of ticks,
    // retries included).
    wait_shim_turns(pid, 10);
    assert!(
        made().is_empty(),
        "the shim made {:?} in the program's new root",
        made()
    );
    drop(child);
    let _ = std::fs::remove_dir_all(&jail);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `thread_rule` fixture under the shim, with no decay time: its
/// shim thread stops a second after the process is alone again.
fn thread_rule_without_decay() -> Child {
    let mut child = Cmd::new(fixture("thread_rule", &[]), [""; 0])
        .shimmed()
        .env("MEMSHIM_DIRTY_DECAY_MS", "0")
        .spawn();
    child.wait_for_line("ready", Duration::from_secs(10));
    child
}

/// Asked again and again while the shim's thread stops (the process has
/// been alone for the decay time plus a second), `stats` answers (0) or
/// says the endpoint is gone (4). A connection the thread had not
/// accepted when it closed its socket broke with "writing the request:
/// Broken pipe" and exit 1, once in each such run.
#[test]
fn asking_while_the_shim_thread_stops_gives_exit_0_or_4_only() {
    let mut child = thread_rule_without_decay();
    let pid = child.pid();
    child.send("spawn");
    child.wait_for_line("spawned", Duration::from_secs(10));
    wait_endpoint(pid);
    child.send("release");
    child.wait_for_line("joined", Duration::from_secs(10));
    let pid_s = pid.to_string();
    let mut asked = 0;
    let gone = wait_until(Duration::from_secs(15), || {
        asked += 1;
        let o = ctl_run(&["stats", &pid_s]);
        assert!(
            [OK.code, NO_ENDPOINT.code].map(i32::from).contains(&o.code),
            "ask {asked}: {o:?}"
        );
        (o.code == i32::from(NO_ENDPOINT.code)).then_some(())
    });
    assert!(
        gone.is_some(),
        "the shim's thread never stopped ({asked} asks)"
    );
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

/// The same while the thread stops and, at once, starts again with the
/// program's next thread (threads that come and go): a connection broken
/// by the stop found the endpoint back when memshim-ctl looked, and got a
/// bare "Connection reset by peer", exit 1 (about 1 request in 40 in such
/// a program, auditor's run). Now exit `NO_ENDPOINT`, "listens again": ask again.
#[test]
fn asking_while_the_shim_thread_stops_and_starts_again_gives_exit_0_or_4_only() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let mut child = thread_rule_without_decay();
    let pid = child.pid();
    let pid_s = pid.to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let codes = Arc::new(Mutex::new(Vec::new()));
    let askers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, codes, pid_s) = (stop.clone(), codes.clone(), pid_s.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let o = ctl_run(&["stats", &pid_s]);
                    if ![OK.code, NO_ENDPOINT.code].map(i32::from).contains(&o.code) {
                        codes.lock().unwrap().push(format!("{o:?}"));
                    }
                    codes.lock().unwrap().push(o.code.to_string());
                }
            })
        })
        .collect();
    for _ in 0..6 {
        child.send("spawn");
        child.wait_for_line("spawned", Duration::from_secs(10));
        wait_endpoint(pid);
        child.send("release");
        child.wait_for_line("joined", Duration::from_secs(10));
        wait_until(Duration::from_secs(15), || {
            shim_tids(pid).is_empty().then_some(())
        })
        .expect("the shim's thread never stopped");
    }
    stop.store(true, Ordering::Relaxed);
    for a in askers {
        a.join().unwrap();
    }
    let codes = codes.lock().unwrap();
    let bad: Vec<_> = codes
        .iter()
        .filter(|c| !matches!(c.as_str(), "0" | "4"))
        .collect();
    assert!(bad.is_empty(), "{} asks, not 0 or 4: {bad:?}", codes.len());
    assert!(codes.iter().any(|c| c == "0"), "never answered: {codes:?}");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

#[test]
fn the_socket_goes_when_the_shim_thread_stops_and_comes_back_with_a_new_thread() {
    let script = r#"
import sys, threading, time
def run(seconds):
    t = threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
    t.start()
    return t
t = run(1.0)
print("threaded", flush=True)
t.join()
print("alone", flush=True)
sys.stdin.readline()
t = run(30)
print("threaded again", flush=True)
sys.stdin.readline()
"#;
    let mut child = Cmd::new(python(), ["-c", script])
        .shimmed()
        .env("MEMSHIM_DIRTY_DECAY_MS", "0")
        .spawn();
    let pid = child.pid();
    child.wait_for_line("threaded", Duration::from_secs(10));
    wait_endpoint(pid);
    let sock = socket_in(&default_dir(), pid);
    assert!(sock.exists());
    child.wait_for_line("alone", Duration::from_secs(10));
    // Alone for the decay time plus a second: the thread stops, the socket goes.
    wait_until(Duration::from_secs(10), || (!sock.exists()).then_some(()))
        .expect("socket removed when the thread stopped");
    // The thread removes the socket, then exits: until the kernel stops
    // listing it, the CLI sees two threads and calls the endpoint starting.
    wait_until(Duration::from_secs(10), || {
        (threads(pid) == 1).then_some(())
    })
    .expect("the shim's thread exited after removing its socket");
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(o.stderr.contains("single-threaded"), "{o:?}");
    child.send("go");
    child.wait_for_line("threaded again", Duration::from_secs(10));
    wait_endpoint(pid);
    assert_eq!(hello_pid(&sock), i64::from(pid));
    child.send("quit");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

#[test]
fn a_process_whose_main_thread_has_exited_is_listed_and_says_why_it_has_no_endpoint() {
    // It lists: not beside the tests that plant files `list` would touch.
    let _alone = DEFAULT_DIR_LIST.lock().unwrap_or_else(|e| e.into_inner());
    // Once `main` calls pthread_exit, the shim's thread stops for good (the
    // process's exit must run on a thread of the program's), and the main
    // thread is a zombie whose /proc files for the address space read empty:
    // memshim-ctl reads a running thread's instead, and says why there is
    // no endpoint.
    let exe = fixture("main_exits", &[]);
    let mut child = Cmd::new(&exe, ["stdin"])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    let pid = child.pid();
    child.wait_for_line("ready", Duration::from_secs(10));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(
        state.contains(") Z "),
        "the main thread has not exited: {state}"
    );
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(o.stderr.contains("ended with pthread_exit"), "{o:?}");
    let (code, list) = ctl_json(&["list"]);
    assert_eq!(code, 0, "{list}");
    let me = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("{pid} not listed: {list}"));
    assert!(
        me["command"].as_str().unwrap().contains("main_exits stdin"),
        "{me}"
    );
    assert!(me["rss"].as_u64().unwrap() > 8 << 20, "{me}");
    let o = ctl_run(&["doctor", &pid.to_string()]);
    assert_eq!(o.code, 0, "{o:?}");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}

/// An exit that comes while the shim's thread is creating its socket (the
/// file is bound, its path not yet recorded for the destructor) still
/// removes the file. The thread is held there by ptrace, stopped as it
/// enters `listen` (the call after `bind`), while the program exits; it is
/// let go once the exit is under way: gone (the file would stay) or waiting
/// in the destructor for the record.
#[test]
fn an_exit_while_the_shim_thread_creates_its_socket_still_removes_the_file() {
    let t = Duration::from_secs(20);
    let mut child = Cmd::new("cat", [""; 0])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    let pid = child.pid();
    let sock = memshim_tests::endpoint::wait_socket(&default_dir(), pid, t)
        .expect("the socket was created");
    let tid = wait_until(t, || shim_tids(pid).first().copied()).expect("the shim's thread");
    let held = Tracee::seize(tid);
    // Lost: the thread creates it again on its next tick.
    std::fs::remove_file(&sock).unwrap();
    held.run_to_entry(libc::SYS_listen, t);
    assert!(sock.exists(), "bound before listen");
    drop(child.child.stdin.take());
    let how = poll_every(Duration::from_millis(1), t, || main_thread_leaving(pid));
    assert!(how.is_some(), "cat never exited");
    drop(held);
    let out = child.finish(t);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (0, "", ""),
        "{out:?}"
    );
    assert!(
        !sock.exists(),
        "the socket outlived the exit ({how:?} when the thread went on)"
    );
}

/// Where `pid`'s main thread is once its exit began: in the destructor's
/// sleep, or gone (a zombie).
fn main_thread_leaving(pid: i32) -> Option<&'static str> {
    if !memshim_tests::stress::alive(pid) {
        return Some("gone");
    }
    let nr = blocked_in(pid, pid)?;
    [libc::SYS_nanosleep, libc::SYS_clock_nanosleep]
        .contains(&nr)
        .then_some("sleeping")
}

/// One thread of another process, traced (`PTRACE_SEIZE`) by the test's
/// thread; let go (and, if it died, reaped) on drop.
struct Tracee(i32);

impl Tracee {
    fn seize(tid: i32) -> Tracee {
        // SAFETY: ptrace requests on a thread id, with no pointers.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                tid,
                0,
                libc::PTRACE_O_TRACESYSGOOD as libc::c_long,
            )
        };
        assert_eq!(rc, 0, "seize {tid}: {}", std::io::Error::last_os_error());
        let t = Tracee(tid);
        // SAFETY: as above.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) };
        t.wait_stop();
        t
    }

    /// Waits for the next stop; panics if the thread ended instead.
    fn wait_stop(&self) -> i32 {
        let mut st = 0;
        loop {
            // SAFETY: `st` is a valid int.
            let r = unsafe { libc::waitpid(self.0, &mut st, libc::__WALL) };
            if r == self.0 {
                break;
            }
            assert_eq!(
                std::io::Error::last_os_error().kind(),
                std::io::ErrorKind::Interrupted
            );
        }
        assert!(libc::WIFSTOPPED(st), "thread {} ended: {st:#x}", self.0);
        st
    }

    /// Lets the thread run until it enters system call `nr`, and holds it
    /// there. Signals it receives meanwhile are passed on.
    fn run_to_entry(&self, nr: libc::c_long, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        let mut signal = 0;
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "thread {} never entered system call {nr}",
                self.0
            );
            // SAFETY: ptrace requests on a stopped tracee, with no pointers.
            unsafe { libc::ptrace(libc::PTRACE_SYSCALL, self.0, 0, signal as libc::c_long) };
            let st = self.wait_stop();
            signal = 0;
            let sig = libc::WSTOPSIG(st);
            if sig == libc::SIGTRAP | 0x80 {
                // SAFETY: all-zero bytes are a valid `ptrace_syscall_info`.
                let mut info: libc::ptrace_syscall_info = unsafe { std::mem::zeroed() };
                // SAFETY: the kernel writes at most the size given into `info`.
                unsafe {
                    libc::ptrace(
                        libc::PTRACE_GET_SYSCALL_INFO,
                        self.0,
                        std::mem::size_of_val(&info),
                        &mut info as *mut libc::ptrace_syscall_info,
                    )
                };
                if info.op == libc::PTRACE_SYSCALL_INFO_ENTRY
                    // SAFETY: `entry` is the union's member for an entry stop.
                    && unsafe { info.u.entry.nr } == nr as u64
                {
                    return;
                }
            } else if st >> 16 == 0 {
                signal = sig;
            }
        }
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        // SAFETY: ptrace and waitpid on our tracee, with no pointers but a
        // valid int. A tracee that is running is stopped first; one that has
        // died is reaped instead (its process can then be reaped).
        unsafe {
            if libc::ptrace(libc::PTRACE_DETACH, self.0, 0, 0) != 0 {
                libc::ptrace(libc::PTRACE_INTERRUPT, self.0, 0, 0);
                let mut st = 0;
                if libc::waitpid(self.0, &mut st, libc::__WALL) == self.0 && libc::WIFSTOPPED(st) {
                    libc::ptrace(libc::PTRACE_DETACH, self.0, 0, 0);
                }
            }
        }
    }
}
