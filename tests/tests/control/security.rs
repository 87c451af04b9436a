//! Who may talk to the endpoint, and attacks on the socket directory.

use memshim_proto::exit::{NO_ENDPOINT, PERMISSION};
use memshim_tests::control::*;
use memshim_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

const NOBODY: &[&str] = &["--reuid=65534", "--regid=65534", "--clear-groups"];

fn is_root() -> bool {
    default_dir().ends_with("memshim-0")
}

#[test]
fn another_uid_is_refused_with_a_clear_message() {
    if !is_root() {
        eprintln!("SKIP: needs root to run memshim-ctl as another uid");
        return;
    }
    let child = start_heap(&[]);
    let pid = child.pid();
    wait_endpoint(pid);
    // As uid 65534 the process is not even visible enough to find the socket.
    let mut args: Vec<String> = NOBODY.iter().map(|s| s.to_string()).collect();
    args.extend([ctl().display().to_string(), "stats".into(), pid.to_string()]);
    let o = Cmd::new("setpriv", &args).run();
    assert_eq!(o.code, i32::from(PERMISSION.code), "{o:?}");
    assert!(
        o.stderr.contains(&format!("pid {pid}: permission denied")),
        "{o:?}"
    );
    assert!(
        o.stderr.contains("run memshim-ctl as uid 0 or as root"),
        "{o:?}"
    );

    // A client of another uid that can reach the socket (CAP_DAC_OVERRIDE
    // kept across the uid change) is refused by the endpoint itself
    // (SO_PEERCRED), and told why.
    let sock = socket_in(&default_dir(), pid);
    let script = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); \
         s.sendall(b'{{\"op\":\"hello\",\"version\":1}}\\n'); print(s.makefile().readline(), end='')",
        sock.display().to_string()
    );
    let mut args: Vec<String> = NOBODY.iter().map(|s| s.to_string()).collect();
    args.extend([
        "--inh-caps=+dac_override".into(),
        "--ambient-caps=+dac_override".into(),
    ]);
    args.extend([python().display().to_string(), "-c".into(), script]);
    let o = Cmd::new("setpriv", &args).run();
    if o.code != 0 && o.stderr.contains("setpriv") {
        eprintln!(
            "SKIP: setpriv cannot keep CAP_DAC_OVERRIDE here: {}",
            o.stderr.trim()
        );
        return;
    }
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(v["error"]["code"], "permission_denied", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uid 65534"),
        "{v}"
    );
    // The endpoint still serves its own uid.
    assert_eq!(ctl_run(&["stats", &pid.to_string()]).code, 0);
}

/// Starts the fixture with `MEMSHIM_SOCKET_DIR=dir` and checks that no
/// socket appears inside `watch_dir`, the host is fine, and memshim-ctl
/// explains with `expect` in its message.
fn refused_dir(dir: &Path, watch_dir: &Path, expect: &str) {
    let mut child = start_heap(&[("MEMSHIM_SOCKET_DIR", dir.to_str().unwrap())]);
    let pid = child.pid();
    // The shim's thread (it starts with the fixture's thread) has tried
    // once it waits in its loop (the next try is a 1 s tick away).
    wait_shim_polling(pid);
    let entries: Vec<_> = std::fs::read_dir(watch_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        entries.is_empty(),
        "the shim created {entries:?} in {}",
        watch_dir.display()
    );
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(o.stderr.contains(expect), "expected {expect:?} in {o:?}");
    child.send("alloc 8");
    child.wait_for_line("ready", Duration::from_secs(10));
    child.send("quit");
    let out = child.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "host affected");
}

#[test]
fn a_symlinked_socket_dir_is_refused() {
    let target = socket_dir_path("symt");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = socket_dir_path("syml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    refused_dir(&link, &target, "is a symbolic link");
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_dir_all(&target).unwrap();
}

/// A process's user may replace its socket with a symbolic link to any
/// socket (one only root may reach, say); memshim-ctl run by root then
/// sent its `hello` there. It now connects only to a socket file itself.
#[test]
fn memshim_ctl_never_follows_a_symbolic_link_in_place_of_a_socket() {
    let dir = socket_dir_path("lnk");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim_dir = socket_dir_path("vic");
    std::fs::create_dir(&victim_dir).unwrap();
    let victim = std::os::unix::net::UnixListener::bind(victim_dir.join("v.sock")).unwrap();
    victim.set_nonblocking(true).unwrap();
    // Single-threaded under `auto`: no shim thread re-creates the socket.
    let mut ch = Cmd::new(fixture("deploy_wait", &[]), [""; 0])
        .shimmed()
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .spawn();
    ch.wait_for_line("ready", Duration::from_secs(10));
    let pid = ch.pid();
    let planted = socket_in(&dir, pid);
    std::os::unix::fs::symlink(victim_dir.join("v.sock"), &planted).unwrap();
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_ne!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("symbolic link"), "{o:?}");
    assert!(
        matches!(victim.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "memshim-ctl connected to the socket the link points at"
    );
    drop(ch);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&victim_dir);
}

#[test]
fn a_socket_dir_precreated_by_another_uid_is_refused() {
    if !is_root() {
        eprintln!("SKIP: needs root to create a directory owned by another uid");
        return;
    }
    let dir = socket_dir_path("own");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    refused_dir(&dir, &dir, "owned by uid 65534");
    assert_eq!(
        std::fs::metadata(&dir).unwrap().uid(),
        65534,
        "the shim must not take it over"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_socket_dir_open_to_others_is_refused_then_recreated_once_removed() {
    let dir = socket_dir_path("mode");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut child = start_heap(&[("MEMSHIM_SOCKET_DIR", dir.to_str().unwrap())]);
    let pid = child.pid();
    wait_shim_polling(pid);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let o = ctl_run(&["stats", &pid.to_string()]);
    assert_eq!(o.code, i32::from(NO_ENDPOINT.code), "{o:?}");
    assert!(o.stderr.contains("mode 0777"), "{o:?}");
    // Following the hint: remove it; the shim re-creates it safely.
    std::fs::remove_dir(&dir).unwrap();
    wait_until(Duration::from_secs(10), || {
        (ctl_run(&["stats", &pid.to_string()]).code == 0).then_some(())
    })
    .expect("endpoint re-created after the unsafe directory was removed");
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
    child.send("quit");
    assert_eq!(child.finish(Duration::from_secs(10)).stderr, "");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process of another uid started under a umask that removes the
/// owner's bits (0777) creates the socket directory: mode 000 there left
/// that process, and every later one of its uid, without a control
/// endpoint, for good. The directory is 0700, and a later process of that
/// uid is served as that uid.
#[test]
fn a_umask_that_removes_the_owners_bits_does_not_lock_the_socket_dir() {
    if !is_root() {
        eprintln!("SKIP: needs root to run as another uid");
        return;
    }
    let parent = std::env::temp_dir().join(format!("ms-umask-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // Copies every uid can reach: the checkout may lie under a directory
    // only root can enter (a `mktemp -d` clone).
    let [lib, ctl]: [String; 2] =
        memshim_tests::reachable_by_any_uid(&parent.join("bin"), &[shim(), ctl()])
            .try_into()
            .unwrap();
    let dir = parent.join("d");
    let run = |umask: &str, seconds: &str| {
        let mut args: Vec<String> = NOBODY.iter().map(|s| s.to_string()).collect();
        args.extend([
            "sh".into(),
            "-c".into(),
            format!(
                "umask {umask}; exec env LD_PRELOAD={} MEMSHIM_CONTROL=on MEMSHIM_SOCKET_DIR={} sleep {seconds}",
                lib,
                dir.display()
            ),
        ]);
        // Preloaded in the command only, not in setpriv (still root; setpriv,
        // sh and env exec in turn, so the pid stays).
        Cmd::new("setpriv", &args)
    };
    let o = run("0777", "0.5").run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!((md.mode() & 0o7777, md.uid()), (0o700, 65534));
    let child = run("0022", "30").spawn();
    let pid = child.pid().to_string();
    let mut args: Vec<String> = NOBODY.iter().map(|s| s.to_string()).collect();
    args.extend([ctl.clone(), "stats".into(), pid.clone()]);
    let served = wait_until(Duration::from_secs(10), || {
        let o = Cmd::new("setpriv", &args).run();
        (o.code == 0).then_some(())
    });
    let last = Cmd::new("setpriv", &args).run();
    assert!(served.is_some(), "{last:?}");
    drop(child);
    let _ = std::fs::remove_dir_all(&parent);
}
