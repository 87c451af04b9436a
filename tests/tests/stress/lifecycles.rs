//! Hostile lifecycles: a main thread that ends first, signals at a high
//! rate, a daemon that closes every descriptor and reuses the numbers, exec
//! chains, and kill -9 in the middle of a purge.

use memshim_tests::endpoint::{Conn, socket_path};
use memshim_tests::stress::{Level, Rng, alive, figures, seed, tasks};
use memshim_tests::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Regression: with the shim's thread alive, a process whose main thread
/// called pthread_exit never ended (MEMSHIM_CONTROL=on; SIGTERM stayed
/// pending because our thread blocks every signal), or lingered 2 s (auto).
pub fn main_thread_exits_first(level: Level) {
    let exe = fixture("main_exits", &[]);
    let rounds = level.pick(2, 20);
    for _ in 0..rounds {
        // The same program without the shim, timed in the same moment: the
        // machine's load adds to both.
        let t0 = Instant::now();
        let plain = Cmd::new(&exe, Vec::<String>::new()).run_timeout(Duration::from_secs(30));
        let plain_took = t0.elapsed();
        assert_eq!(plain.code, 0, "{plain:?}");
        for mode in ["auto", "on", "off"] {
            let t0 = Instant::now();
            let o = Cmd::new(&exe, Vec::<String>::new())
                .shimmed()
                .env("MEMSHIM_CONTROL", mode)
                .run_timeout(Duration::from_secs(30));
            let took = t0.elapsed();
            assert_eq!(
                (o.code, o.stdout.as_str(), o.stderr.as_str()),
                (0, "worker done\n", ""),
                "mode {mode}"
            );
            // Without the shim: 0.1 s. One tick of the shim's thread (at
            // most 1 s) may be added; a thread that lingered added 2 s.
            assert!(
                took.saturating_sub(plain_took) < Duration::from_millis(1500),
                "mode {mode}: the process took {took:?} to end ({plain_took:?} without the shim)"
            );
        }
    }
    // What the process's exit writes (stdio's flush, an atexit handler)
    // reaches its stdout: glibc runs exit(0) on the last thread, which must
    // be the application's, in the application's descriptor table.
    for mode in ["auto", "on"] {
        let o = Cmd::new(&exe, ["flush"])
            .shimmed()
            .env("MEMSHIM_CONTROL", mode)
            .run_timeout(Duration::from_secs(30));
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, "worker done\natexit ran\n", ""),
            "mode {mode}"
        );
    }
    figures(
        level,
        "main_thread_exits_first",
        &[("runs", (rounds * 3).to_string()), ("failures", "0".into())],
    );
}

fn sigblk(pid: i32, tid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    let v = s.lines().find(|l| l.starts_with("SigBlk:")).unwrap();
    u64::from_str_radix(v.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

pub fn signal_storm(level: Level) {
    let n = level.pick(20_000u64, 500_000);
    let exe = fixture("sig_storm", &[]);
    let mut figures_kv = vec![];
    for mode in ["auto", "on"] {
        let mut child = Cmd::new(&exe, Vec::<String>::new())
            .shimmed()
            .env("MEMSHIM_CONTROL", mode)
            .spawn();
        let pid = child.pid();
        child.wait_for_line("ready", Duration::from_secs(10));
        let tid = wait_until(Duration::from_secs(10), || {
            tasks(pid)
                .into_iter()
                .find(|(_, n)| n == "memshim")
                .map(|(t, _)| t)
        })
        .unwrap_or_else(|| panic!("mode {mode}: no memshim thread in {pid}: {:?}", tasks(pid)));
        // Every signal blocked except those the kernel and glibc refuse to
        // block: SIGKILL (9), SIGSTOP (19), and glibc's 32 and 33.
        let must: u64 = (1..=64u32)
            .filter(|s| ![9, 19, 32, 33].contains(s))
            .map(|s| 1u64 << (s - 1))
            .sum();
        let blk = sigblk(pid, tid);
        assert_eq!(
            blk & must,
            must,
            "mode {mode}: SigBlk of the memshim thread is {blk:016x}"
        );
        let t0 = Instant::now();
        for i in 0..n {
            // SAFETY: kill(2) on our own child.
            let rc = unsafe { libc::kill(pid, libc::SIGUSR1) };
            assert_eq!(rc, 0, "kill #{i}");
        }
        let rate = n as f64 / t0.elapsed().as_secs_f64();
        child.send("stop");
        let line = child.wait_for_line("handled=", Duration::from_secs(30));
        let out = child.finish(Duration::from_secs(10));
        assert_eq!(out.code, 0, "mode {mode}: {out:?}");
        assert_eq!(out.stderr, "");
        let field = |k: &str| -> i64 {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
                .unwrap()
        };
        assert_eq!(field("memshim_tid"), i64::from(tid), "mode {mode}: {line}");
        assert_eq!(
            field("on_memshim"),
            0,
            "mode {mode}: the app's handler ran on the memshim thread: {line}"
        );
        // Standard signals coalesce while pending: some were handled, not all.
        assert!(field("handled") > 0, "{line}");
        figures_kv.push((
            if mode == "auto" {
                "auto_handled"
            } else {
                "on_handled"
            },
            field("handled").to_string(),
        ));
        figures_kv.push((
            if mode == "auto" {
                "auto_rate_per_s"
            } else {
                "on_rate_per_s"
            },
            format!("{rate:.0}"),
        ));
    }
    figures_kv.push(("signals_sent_per_mode", n.to_string()));
    figures_kv.push(("on_memshim", "0".into()));
    figures(level, "signal_storm", &figures_kv);
}

pub fn fd_closing_daemon(level: Level) {
    // With the shim's descriptors in a table of their own, and in the
    // application's (the fallback), where the daemon's dup2 lands on them.
    for table in ["auto", "shared"] {
        fd_closing_daemon_with(level, table);
    }
}

fn fd_closing_daemon_with(level: Level, table: &str) {
    let conns = level.pick(200, 5000);
    let dir = memshim_tests::socket_dir_path("daemon");
    let app_sock = format!("/tmp/msr-{}-app.sock", std::process::id());
    let exe = fixture("fd_daemon", &[]);
    let mut child = Cmd::new(&exe, [app_sock.clone(), dir.display().to_string()])
        .shimmed()
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .env("MEMSHIM_FD_TABLE", table)
        .spawn();
    let pid = child.pid();
    let ready = child.wait_for_line("ready", Duration::from_secs(20));
    // The shim's endpoint comes back by itself (on another number).
    let mut shim = Conn::to_pid(&dir, pid)
        .unwrap_or_else(|e| panic!("endpoint of {pid} did not come back: {e}"));
    let mut served = 0;
    for i in 0..conns {
        let mut s = std::os::unix::net::UnixStream::connect(&app_sock)
            .unwrap_or_else(|e| panic!("connection {i} to the app: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"ping\n").unwrap();
        let mut a = String::new();
        s.read_to_string(&mut a).unwrap();
        assert!(
            a.starts_with("app "),
            "connection {i} to the app's socket got {a:?} (stolen by the shim?)"
        );
        served += 1;
        if i % 20 == 0 {
            let v = shim.ask(r#"{"op":"purge"}"#).unwrap();
            assert!(v.get("ok").is_some(), "{v}");
        }
    }
    child.send("stop");
    let line = child.wait_for_line("served=", Duration::from_secs(10));
    let out = child.finish(Duration::from_secs(10));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stderr, "");
    assert_eq!(line, format!("served={served} own_fds_intact=1"), "{ready}");
    let _ = std::fs::remove_file(&app_sock);
    let _ = std::fs::remove_dir_all(&dir);
    figures(
        level,
        "fd_closing_daemon",
        &[
            ("table", table.to_owned()),
            ("app_connections", served.to_string()),
            ("stolen", "0".into()),
            ("failures", "0".into()),
        ],
    );
}

pub fn exec_chain(level: Level) {
    let exe = fixture("spawn_storm", &[]);
    let py = python();
    let rounds = level.pick(3, 50);
    for _ in 0..rounds {
        // With MEMSHIM_CONTROL=on the C program's own shim thread may or
        // may not be named yet when it looks (7 or 99).
        for (mode, want) in [("auto", [7, 7]), ("off", [7, 7]), ("on", [7, 99])] {
            // bash -> exec python (which starts a thread, so the shim's
            // thread runs in it) -> exec the C fixture, which exits 7 unless
            // it has a memshim thread (which only MEMSHIM_CONTROL=on starts).
            let script = format!(
                "echo bash; exec {} -c 'import os, sys, threading; t = threading.Thread(target=lambda: None); t.start(); t.join(); print(\"python\", flush=True); os.execv(\"{}\", [\"x\", \"child\", \"7\"])'",
                py.display(),
                exe.display()
            );
            let o = Cmd::new("bash", ["-c", &script])
                .shimmed()
                .env("MEMSHIM_CONTROL", mode)
                .run();
            assert!(want.contains(&o.code), "mode {mode}: {o:?}");
            assert_eq!(
                (o.stdout.as_str(), o.stderr.as_str()),
                ("bash\npython\n", ""),
                "mode {mode}"
            );
        }
    }
    figures(
        level,
        "exec_chain",
        &[
            ("chains", (rounds * 3).to_string()),
            ("failures", "0".into()),
        ],
    );
}

pub fn kill_9_during_purge(level: Level) {
    let rounds = level.pick(5, 60);
    let seed = seed();
    let mut rng = Rng::new(seed);
    let dir = memshim_tests::socket_dir_path("kill9");
    let prog = "import threading, time\n\
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n\
        bufs = [bytearray(1 << 20) for _ in range(300)]\n\
        for b in bufs: b[::4096] = b'x' * len(b[::4096])\n\
        del bufs[::2]\n\
        print('ready', flush=True)\n\
        time.sleep(600)";
    let mut answered = 0;
    for r in 0..rounds {
        let mut child = Cmd::new(python(), ["-c", prog])
            .shimmed()
            .env("MEMSHIM_SOCKET_DIR", &dir)
            .env("MEMSHIM_DIRTY_DECAY_MS", "-1")
            .spawn();
        let pid = child.pid();
        child.wait_for_line("ready", Duration::from_secs(30));
        let mut c =
            Conn::to_pid(&dir, pid).unwrap_or_else(|e| panic!("seed {seed} round {r}: {e}"));
        let path = socket_path(&dir, pid).unwrap();
        let delay = Duration::from_micros(rng.below(30_000));
        let killer = std::thread::spawn(move || {
            // On purpose: the kill lands at a random moment of the purge.
            std::thread::sleep(delay);
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        // Either the answer or end of file, never a hang (bounded by 10 s).
        match c.ask(r#"{"op":"purge"}"#) {
            Ok(v) => {
                assert!(v.get("ok").is_some(), "{v}");
                answered += 1;
            }
            // Killed before the request was written: a broken pipe.
            Err(e) => assert!(
                e.contains("closed") || e.contains("reset") || e.contains("Broken pipe"),
                "seed {seed} round {r} pid {pid}: {e}"
            ),
        }
        killer.join().unwrap();
        let out = child.finish(Duration::from_secs(10));
        assert_eq!(out.code, 128 + 9);
        assert!(!alive(pid));
        // The stale file refuses connections; a client cannot hang on it.
        if path.exists() {
            let e = std::os::unix::net::UnixStream::connect(&path)
                .expect_err("a dead process accepted a connection");
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        }
    }
    // memshim-ctl copes with the stale files (and removes them).
    let o = Cmd::new(ctl(), ["list", "--json"])
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .run();
    assert_eq!(o.code, 0, "{o:?}");
    let _ = std::fs::remove_dir_all(&dir);
    figures(
        level,
        "kill_9_during_purge",
        &[
            ("rounds", rounds.to_string()),
            ("answered_before_kill", answered.to_string()),
            ("seed", seed.to_string()),
            ("failures", "0".into()),
        ],
    );
}
