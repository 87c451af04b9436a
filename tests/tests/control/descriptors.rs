//! The shim's descriptors and the application's: the application never
//! sees, loses or shares one because of the shim, whatever it does to its
//! descriptor table and whenever it does it.

use memshim_tests::control::*;
use memshim_tests::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// CPU time (user + system, clock ticks) of the thread named `name` in `pid`.
fn thread_ticks(pid: i32, name: &str) -> Option<u64> {
    let rd = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    rd.flatten().find_map(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        if comm.trim() != name {
            return None;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
        let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
        Some(f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?)
    })
}

#[test]
fn a_host_out_of_descriptors_with_a_client_waiting_does_not_make_the_shim_spin() {
    for table in ["auto", "shared", "seccomp-old"] {
        exhaustion_round(table);
    }
}

fn exhaustion_round(table: &str) {
    let exe = fixture("fd_exhaust", &[]);
    let mut ch = placed(table, &exe, &["256"])
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    ch.wait_for_line("ready", T);
    let pid = ch.pid();
    wait_endpoint(pid);
    ch.send("fill");
    let full = ch.wait_for_line("full", T);
    assert!(full.ends_with("errno=24"), "{full}");
    // A client connects and waits for its answer.
    let mut client = Cmd::new(ctl(), ["stats", &pid.to_string(), "--json"]).spawn();
    // Until its connection waits on the listener (which then polls as
    // readable at every turn of the shim's thread), or it has its answer.
    wait_until(T, || {
        (has_connected_socket(client.pid()) || client.child.try_wait().unwrap().is_some())
            .then_some(())
    })
    .expect("the client connects");
    let before = thread_ticks(pid, "memshim").expect("the shim's thread");
    let t0 = Instant::now();
    // On purpose: the window the shim's thread's CPU time is measured over.
    std::thread::sleep(Duration::from_secs(2));
    let used = thread_ticks(pid, "memshim").unwrap() - before;
    let ticks_per_s = 100.0; // USER_HZ
    let share = used as f64 / ticks_per_s / t0.elapsed().as_secs_f64();
    assert!(
        share < 0.2,
        "{table}: the shim's thread used {:.0}% of a core while the host had no descriptor left",
        share * 100.0
    );
    if table == "auto" {
        // With a table of its own the shim has descriptors to spare: the
        // client is answered while the host's table is full.
        assert!(
            wait_until(Duration::from_secs(10), || client
                .child
                .try_wait()
                .unwrap()
                .map(|_| ()))
            .is_some(),
            "the client is still waiting although the shim's table is its own"
        );
    }
    // Once the host frees descriptors, the client is answered.
    ch.send("free");
    ch.wait_for_line("freed", T);
    let o = client.finish(T);
    assert_eq!(o.code, 0, "{table}: {o:?}");
    ch.send("quit");
    let o = ch.finish(T);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{table}: {o:?}");
}

#[test]
fn a_fresh_child_under_control_on_lists_the_same_descriptors_as_without_the_shim() {
    let script = "import os, subprocess, sys\n\
        print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.listdir(\"/proc/self/fd\")))'], \
        capture_output=True, text=True, close_fds=True).stdout.strip())";
    let plain = Cmd::new(python(), ["-c", script]).run();
    assert_eq!(plain.code, 0, "{plain:?}");
    let o = Cmd::new(python(), ["-c", script])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, plain.stdout.as_str(), ""),
        "a fresh child under MEMSHIM_CONTROL=on sees other descriptors than without the shim"
    );
}

/// In the application's table (the fallback where seccomp refuses a table
/// of its own) with a soft descriptor limit under 512, the shim's
/// descriptors stayed on the lowest numbers (3, 4, 6): the program's first
/// file was 5, and CPython's `test_pass_fds` failed. They go to the top of
/// what the limit allows, and the program's files are numbered as without
/// the shim.
#[test]
fn under_a_low_descriptor_limit_the_shared_tables_numbers_stay_the_programs() {
    let script = "import time, os; time.sleep(0.5); \
        fds = [os.open('/dev/null', os.O_RDONLY) for _ in range(4)]; print(fds)";
    let py = python().display().to_string();
    let args = ["--nofile=256:256", "--", py.as_str(), "-c", script];
    let run = |shim: bool| {
        let mut c = Cmd::new("prlimit", args);
        if shim {
            c = c
                .shimmed()
                .env("MEMSHIM_CONTROL", "on")
                .env("MEMSHIM_FD_TABLE", "shared");
        }
        c.run()
    };
    let plain = run(false);
    assert_eq!(plain.code, 0, "{plain:?}");
    let o = run(true);
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, plain.stdout.as_str(), ""),
        "{o:?}"
    );
}

#[test]
fn cpython_test_pass_fds_redirected_passes_with_control_on() {
    let py = python();
    let probe = Cmd::new(&py, ["-c", "import test.support, test.test_subprocess"]).run();
    if probe.code != 0 {
        eprintln!("SKIP: {} has no Lib/test", py.display());
        return;
    }
    let args = [
        "-m",
        "test",
        "test_subprocess",
        "-m",
        "test_pass_fds_redirected",
    ];
    let base = Cmd::new(&py, args).run_timeout(Duration::from_secs(300));
    assert_eq!(base.code, 0, "fails without the shim: {base:?}");
    let o = Cmd::new(&py, args)
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .run_timeout(Duration::from_secs(300));
    assert_eq!(o.code, 0, "{}", o.stdout);
}

/// A command with the shim, its descriptors placed by `table`: `auto` (a
/// table of their own), `shared` (the application's, forced by the
/// test-only switch), or `seccomp-docker` / `seccomp-old` (under a real
/// seccomp filter, tests/fixtures/seccomp_run.c, like a container
/// runtime's: `unshare` refused; `unshare` and `close_range` refused).
fn placed(table: &str, program: &std::path::Path, args: &[&str]) -> Cmd {
    let c = match table.strip_prefix("seccomp-") {
        Some(profile) => {
            let mut a = vec![profile.to_owned(), program.display().to_string()];
            a.extend(args.iter().map(|s| s.to_string()));
            Cmd::new(fixture("seccomp_run", &[]), a)
        }
        None => Cmd::new(program, args).env("MEMSHIM_FD_TABLE", table),
    };
    c.shimmed()
}

/// Runs tests/fixtures/fd_race.c in `mode` with the shim's descriptors
/// placed by `table` (see [`placed`]), makes a client connect to its
/// endpoint, and returns its check line.
fn race(mode: &str, table: &str) -> String {
    let exe = fixture("fd_race", &[]);
    let mut ch = placed(table, &exe, &[mode]).spawn();
    ch.wait_for_line("ready", T);
    let pid = ch.pid();
    // The endpoint comes up (again, if a creation was spoiled), and a client
    // connection is accepted.
    wait_endpoint(pid);
    ch.send("check");
    let line = ch.wait_for_line("check", T);
    ch.send("quit");
    let o = ch.finish(T);
    assert_eq!(
        (o.code, o.stderr.as_str()),
        (0, ""),
        "{mode} {table}: {o:?}"
    );
    line
}

/// A table of its own is out of the application's reach: nothing can be
/// put on its numbers (also under a Docker-like seccomp profile, which
/// allows `close_range`). In the application's table (the fallback,
/// forced by the switch or by a profile that refuses both calls), the
/// application's descriptor is put there, and the shim must leave it alone.
fn race_both(mode: &str, want: &[&str]) {
    for table in ["auto", "seccomp-docker", "shared", "seccomp-old"] {
        let line = race(mode, table);
        let fallback = table == "shared" || table == "seccomp-old";
        let reached = if fallback { "injected=1" } else { "injected=0" };
        assert!(line.contains(reached), "{mode} {table}: {line}");
        for w in want {
            assert!(line.contains(w), "{mode} {table}: {line}");
        }
    }
}

#[test]
fn the_shim_never_closes_an_app_descriptor_put_on_its_socket_while_binding() {
    race_both("bind", &["number_intact=1"]);
}

#[test]
fn the_shim_never_closes_an_app_descriptor_put_on_a_number_it_moves_high() {
    race_both("dupfd", &["number_intact=1"]);
}

#[test]
fn the_shim_never_reads_or_closes_an_app_pipe_put_on_its_wake_pipe() {
    race_both("pipe", &["number_intact=1", "pipe_data=1"]);
}

/// Between the last check of its listener and `accept4` no check can help
/// in a shared table (docs/reliability.md, "Descriptors"): only a table of
/// its own keeps the application's connections from the shim.
#[test]
fn the_shim_never_accepts_on_an_app_listener_put_on_its_listeners_number() {
    let l = race("accept", "auto");
    assert!(l.contains("injected=0") && l.contains("own_conn=1"), "{l}");
}

#[test]
fn the_table_of_its_own_is_used_where_seccomp_allows_close_range_and_not_where_it_refuses_both() {
    for (table, private) in [
        ("auto", true),
        ("seccomp-docker", true),
        ("shared", false),
        ("seccomp-old", false),
    ] {
        let exe = fixture("fd_exhaust", &[]);
        let mut ch = placed(table, &exe, &["1024"])
            .env("MEMSHIM_CONTROL", "on")
            .spawn();
        ch.wait_for_line("ready", T);
        let pid = ch.pid();
        wait_endpoint(pid);
        let (code, s) = ctl_json(&["stats", &pid.to_string()]);
        assert_eq!(code, 0, "{table}: {s}");
        assert_eq!(s["config"]["private_fds"], private, "{table}: {s}");
        // In a table of its own, none of the shim's descriptors is in the
        // application's; in the fallback they are, at 512 or above.
        let app: Vec<i32> = task_fds(pid, pid).into_iter().map(|(n, _)| n).collect();
        let high = app.iter().filter(|&&n| n >= 512).count();
        assert_eq!(
            high > 0,
            !private,
            "{table}: the application's table holds {app:?}"
        );
        ch.send("quit");
        let o = ch.finish(T);
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{table}: {o:?}");
    }
}
