//! Access to the socket directory under attack by another uid (65534):
//! a world-writable parent in which the attacker plants the directory (as
//! its own directory, or as a symbolic link to one), symbolic links planted
//! inside a real socket directory, and connections from the other uid.
//! (tests/tests/control/security.rs covers the plain cases of each.)

use memshim_proto::exit::{FAILED, OK};
use memshim_tests::endpoint::Conn;
use memshim_tests::stress::{Level, figures, memshim_threads, socket_files};
use memshim_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn as_nobody(cmd: &str) -> Output {
    Cmd::new(
        "setpriv",
        [
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            cmd,
        ],
    )
    .run()
}

/// Starts a shimmed python with a thread (so the endpoint comes up) using `dir`.
fn host(dir: &Path) -> Child {
    let mut c = Cmd::new(python(), ["-c", "import threading, sys; threading.Thread(target=sys.stdin.read).start(); print('ready', flush=True)"])
        .shimmed()
        .env("MEMSHIM_SOCKET_DIR", dir)
        .spawn();
    c.wait_for_line("ready", Duration::from_secs(20));
    let pid = c.pid();
    wait_until(Duration::from_secs(10), || {
        (memshim_threads(pid) >= 1).then_some(())
    })
    .expect("memshim thread");
    c
}

pub fn run(level: Level) {
    if !is_root() {
        println!("SKIP: needs root to act as another uid");
        return;
    }
    let rounds = level.pick(1, 5);
    let mut cases = 0;
    for r in 0..rounds {
        let parent = std::path::PathBuf::from(format!("/tmp/msr-ww-{}-{r}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir(&parent).unwrap();
        // World-writable, no sticky bit: anyone may create and rename here.
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
        let dir = parent.join("sock");
        let loot = parent.join("loot");

        // 1. The attacker plants `sock` as a symlink to its own directory.
        let o = as_nobody(&format!(
            "mkdir -m 0777 {0} && ln -s {0} {1}",
            loot.display(),
            dir.display()
        ));
        assert_eq!(o.code, 0, "{o:?}");
        let mut h = host(&dir);
        // Its first try, and its retry on the next tick (250 ms).
        memshim_tests::control::wait_shim_turns(h.pid(), 1);
        assert!(
            socket_files(&loot).is_empty(),
            "a socket was created in the attacker's directory"
        );
        h.send("");
        let out = h.finish(Duration::from_secs(10));
        assert_eq!((out.code, out.stderr.as_str()), (0, ""));
        std::fs::remove_file(&dir).unwrap();
        cases += 1;

        // 2. The attacker plants `sock` as its own directory (mode 0700 or 0777).
        for mode in ["0700", "0777"] {
            let o = as_nobody(&format!("mkdir -m {mode} {}", dir.display()));
            assert_eq!(o.code, 0, "{o:?}");
            let mut h = host(&dir);
            memshim_tests::control::wait_shim_turns(h.pid(), 1);
            assert_eq!(
                std::fs::metadata(&dir).unwrap().uid(),
                65534,
                "the shim took over the attacker's directory"
            );
            assert!(
                socket_files(&dir).is_empty(),
                "a socket was created in the attacker's directory"
            );
            h.send("");
            assert_eq!(h.finish(Duration::from_secs(10)).stderr, "");
            std::fs::remove_dir_all(&dir).unwrap();
            cases += 1;
        }

        // 3. A real directory of ours with symlinks planted in it (as if by
        //    an earlier, compromised process of the same uid), pointing at a
        //    victim file and directory. Neither the shim nor memshim-ctl's
        //    stale-socket cleanup may follow them.
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let victim = parent.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("1-1.sock")).unwrap();
        std::os::unix::fs::symlink(&parent, dir.join("2-2.sock")).unwrap();
        let mut h = host(&dir);
        let pid = h.pid();
        let mut c = Conn::to_pid(&dir, pid).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.ask(r#"{"op":"stats"}"#).unwrap().get("ok").is_some());
        let o = Cmd::new(ctl(), ["list", "--json"])
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .run();
        assert!(
            [OK.code, FAILED.code].map(i32::from).contains(&o.code),
            "{o:?}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        cases += 1;

        // 4. Another uid cannot reach it: the 0700 directory stops it at
        //    connect (the SO_PEERCRED refusal behind it is exercised by
        //    control/security.rs).
        //    Debian's python3 (test-deps installs it): nobody cannot run
        //    pyenv's, which lives under root's 0700 home.
        let sock = memshim_tests::endpoint::socket_path(&dir, pid).unwrap();
        let o = as_nobody(&format!(
            "/usr/bin/python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{}\")' 2>&1; echo rc=$?",
            sock.display()
        ));
        assert!(
            o.stdout.contains("PermissionError") && o.stdout.ends_with("rc=1\n"),
            "{o:?}"
        );
        h.send("");
        assert_eq!(h.finish(Duration::from_secs(10)).stderr, "");
        cases += 1;
        let _ = std::fs::remove_dir_all(&parent);
    }
    figures(
        level,
        "socket_dir_attacks",
        &[
            ("cases", cases.to_string()),
            ("refused", cases.to_string()),
            ("failures", "0".into()),
        ],
    );
}
