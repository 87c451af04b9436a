//! `memshim-ctl run` (from an installed prefix and from the build tree) and
//! `memshim-ctl doctor` on real processes: static, setuid, sanitizer,
//! valgrind, own-malloc, preload dropped, single-threaded.

use memshim_proto::exit::{FAILED, NOT_FOUND, USAGE};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use memshim_tests::deploy::{fresh_dir, make};
use memshim_tests::{Child, Cmd, Output, copy_executable, ctl, fixture, python, shim};

/// One `make install` into a scratch prefix for every test in this file.
fn prefix() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let p = fresh_dir("deploy-run-prefix");
        make("install", &[("PREFIX", &p)]);
        p
    })
}

fn installed_ctl() -> PathBuf {
    prefix().join("bin/memshim-ctl")
}

fn installed_lib() -> String {
    prefix()
        .join("lib/libmemshim.so")
        .to_str()
        .unwrap()
        .to_owned()
}

fn doctor(pid: i32) -> Output {
    Cmd::new(ctl(), ["doctor".to_string(), pid.to_string()]).run()
}

/// A background process from `exe args`, started through `env` so that
/// `vars` (and nothing else of ours) are its environment additions.
fn start(exe: &Path, args: &[&str], vars: &[(&str, &str)]) -> Child {
    let mut c = Cmd::new(exe, args);
    for (k, v) in vars {
        c = c.env(k, v);
    }
    let mut ch = c.spawn();
    ch.wait_for_line("ready", Duration::from_secs(60));
    ch
}

fn finding(out: &Output, code: &str) -> bool {
    out.stdout
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&format!("{code}:")))
}

// --- run ----------------------------------------------------------------------

#[test]
fn run_from_an_installed_prefix_preloads_the_library_installed_beside_it() {
    let o = Cmd::new(installed_ctl(), ["run", "--", python().to_str().unwrap(), "-c",
        "import os; print(os.environ['LD_PRELOAD']); print(any('libmemshim' in l for l in open('/proc/self/maps')))"])
    .run();
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(
        o.stdout,
        format!("{}\ntrue\n", installed_lib()).replace("true", "True")
    );
    assert_eq!(o.stderr, "");
}

#[test]
fn run_passes_arguments_stdin_pid_and_exit_status_through_untouched() {
    // Options after `--` belong to the command, spaces and empty strings survive.
    let o = Cmd::new(
        ctl(),
        [
            "run",
            "--",
            "sh",
            "-c",
            r#"printf '[%s]' "$@"; cat; exit 42"#,
            "sh",
            "--dirty-ms",
            "a b",
            "",
        ],
    )
    .stdin("from stdin\n")
    .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (42, "[--dirty-ms][a b][]from stdin\n", "")
    );
    // exec, not spawn: the command has memshim-ctl's pid.
    let mut ch = Cmd::new(ctl(), ["run", "--", "sh", "-c", "echo ready $$; read x"]).spawn();
    let line = ch.wait_for_line("ready", Duration::from_secs(10));
    assert_eq!(line, format!("ready {}", ch.pid()));
    // A signal death is reported as the shell reports it.
    let o = Cmd::new(ctl(), ["run", "--", "sh", "-c", "kill -TERM $$"]).run();
    assert_eq!(o.code, 128 + 15);
}

#[test]
fn run_sets_memshim_variables_and_prepends_to_an_existing_preload() {
    let other = fixture("deploy_wait", &["-shared", "-fPIC"]);
    let o = Cmd::new(
        ctl(),
        [
            "run",
            "--dirty-ms",
            "250",
            "--muzzy-ms",
            "-1",
            "--control",
            "on",
            "--narenas",
            "3",
            "--",
            "sh",
            "-c",
            "env | grep -E '^(LD_PRELOAD|MEMSHIM_)' | sort",
        ],
    )
    .env("LD_PRELOAD", &other)
    .run();
    assert_eq!(o.code, 0, "{o:?}");
    let want = format!(
        "LD_PRELOAD={}:{}\nMEMSHIM_CONTROL=on\nMEMSHIM_DIRTY_DECAY_MS=250\nMEMSHIM_MUZZY_DECAY_MS=-1\nMEMSHIM_NARENAS=3\n",
        std::fs::canonicalize(shim()).unwrap().display(),
        other.display()
    );
    assert_eq!(o.stdout, want);
    // The shim accepted them: --verbose shows the effective values, no warning.
    let o = Cmd::new(
        ctl(),
        ["run", "--dirty-ms", "250", "--verbose", "--", "/bin/true"],
    )
    .run();
    assert!(
        o.stderr.contains("dirty_decay_ms=250") && !o.stderr.contains("warning"),
        "{}",
        o.stderr
    );
}

#[test]
fn run_finds_the_library_through_a_symlink_to_the_cli_and_honours_memshim_lib() {
    let d = fresh_dir("deploy-run-link");
    let link = d.join("memshim-ctl");
    std::os::unix::fs::symlink(installed_ctl(), &link).unwrap();
    let o = Cmd::new(&link, ["run", "--", "sh", "-c", "echo $LD_PRELOAD"]).run();
    assert_eq!(o.stdout.trim(), installed_lib(), "{o:?}");
    let o = Cmd::new(&link, ["run", "--", "sh", "-c", "echo $LD_PRELOAD"])
        .env("MEMSHIM_LIB", shim())
        .run();
    assert_eq!(
        o.stdout.trim(),
        std::fs::canonicalize(shim()).unwrap().to_str().unwrap()
    );
}

#[test]
fn run_without_a_library_fails_clearly_and_runs_nothing() {
    let d = fresh_dir("deploy-run-nolib");
    let lone = d.join("memshim-ctl");
    copy_executable(&ctl(), &lone);
    let marker = d.join("ran");
    let o = Cmd::new(&lone, ["run", "--", "touch", marker.to_str().unwrap()]).run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(
        o.stderr.contains("libmemshim.so not found") && o.stderr.contains("MEMSHIM_LIB"),
        "{}",
        o.stderr
    );
    assert!(!marker.exists(), "the command ran without the shim");
    let o = Cmd::new(ctl(), ["run", "--", "/nonexistent/cmd"]).run();
    assert_eq!(o.code, 127);
    assert!(
        o.stderr.contains("cannot execute /nonexistent/cmd"),
        "{}",
        o.stderr
    );
    let o = Cmd::new(ctl(), ["run", "--dirty-ms", "soon", "--", "/bin/true"]).run();
    assert_eq!(o.code, i32::from(USAGE.code));
    assert!(o.stderr.contains("--dirty-ms"), "{}", o.stderr);
}

// --- doctor -------------------------------------------------------------------

#[test]
fn doctor_without_pid_shows_host_facts_and_the_library_run_would_use() {
    let o = Cmd::new(installed_ctl(), ["doctor"]).run();
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains(&installed_lib()), "{}", o.stdout);
    let mode = memshim_tests::thp_mode().expect("a THP mode");
    assert!(
        o.stdout.contains(&format!("THP        enabled={mode}")),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("cgroup     v") && o.stdout.contains("CPUs       "),
        "{}",
        o.stdout
    );
}

#[test]
fn doctor_sees_a_healthy_single_threaded_process_waiting_for_its_second_thread() {
    let ch = start(
        &fixture("deploy_wait", &[]),
        &[],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    let o = doctor(ch.pid());
    assert_eq!(o.code, 0, "{o:?}");
    assert!(finding(&o, "endpoint_not_started"), "{}", o.stdout);
}

/// Under `MEMSHIM_CONTROL=on` a single-threaded process without the
/// shim's thread is a fork child (it starts the thread with its own first
/// `pthread_create`); doctor said to set MEMSHIM_CONTROL=on, which it is.
#[test]
fn doctor_explains_a_fork_child_under_control_on() {
    let mut ch = Cmd::new(fixture("deploy_wait", &[]), ["fork"])
        .env("LD_PRELOAD", shim())
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    let line = ch.wait_for_line("ready", Duration::from_secs(60));
    let child: i32 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let o = doctor(child);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(finding(&o, "endpoint_not_started"), "{}", o.stdout);
    assert!(o.stdout.contains("fork child"), "{}", o.stdout);
    assert!(!o.stdout.contains("Set MEMSHIM_CONTROL=on"), "{}", o.stdout);
    // The verbs say the same (they said the thread had stopped, and that
    // MEMSHIM_CONTROL=on keeps it).
    for verb in ["stats", "profile"] {
        let o = Cmd::new(memshim_tests::ctl(), [verb, &child.to_string()]).run();
        assert_eq!(o.code, 4, "{verb}: {o:?}");
        assert!(o.stderr.contains("fork child"), "{verb}: {o:?}");
        assert!(!o.stderr.contains("=on keeps"), "{verb}: {o:?}");
    }
}

/// A process whose main thread ended with `pthread_exit` has no endpoint
/// for good; doctor gives that reason, as `stats` does.
#[test]
fn doctor_explains_why_a_process_whose_main_thread_exited_has_no_endpoint() {
    let mut ch = Cmd::new(fixture("main_exits", &[]), ["stdin"])
        .env("LD_PRELOAD", shim())
        .spawn();
    ch.wait_for_line("ready", Duration::from_secs(60));
    let o = doctor(ch.pid());
    assert!(finding(&o, "endpoint_absent"), "{}", o.stdout);
    assert!(o.stdout.contains("pthread_exit"), "{}", o.stdout);
}

#[test]
fn doctor_finds_a_multithreaded_process_answering_on_its_socket() {
    let ch = start(
        &fixture("deploy_wait", &[]),
        &["thread"],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    let o = memshim_tests::wait_until(Duration::from_secs(20), || {
        let o = doctor(ch.pid());
        finding(&o, "shim_active").then_some(o)
    })
    .expect("the endpoint never answered doctor");
    assert_eq!(o.code, 0, "{o:?}");
    assert!(!o.stdout.contains("problem"), "{}", o.stdout);
}

#[test]
fn doctor_explains_a_dropped_preload() {
    // `env -u LD_PRELOAD` is what sudo's env_reset amounts to.
    let exe = fixture("deploy_wait", &[]);
    let ch = start(
        Path::new("env"),
        &["-u", "LD_PRELOAD", exe.to_str().unwrap()],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    let o = doctor(ch.pid());
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(finding(&o, "no_preload"), "{}", o.stdout);
    // Live check: the same program with the preload kept is not flagged.
    let ch = start(&exe, &[], &[("LD_PRELOAD", shim().to_str().unwrap())]);
    assert!(!finding(&doctor(ch.pid()), "no_preload"));
}

#[test]
fn doctor_explains_a_static_binary() {
    let ch = start(
        &fixture("deploy_wait", &["-static"]),
        &[],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    let o = doctor(ch.pid());
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(finding(&o, "static_binary"), "{}", o.stdout);
}

#[test]
fn doctor_explains_secure_execution_of_a_setuid_program() {
    let d = fresh_dir("deploy-suid");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = d.join("deploy_wait_suid");
    copy_executable(&fixture("deploy_wait", &[]), &exe);
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let lib = shim();
    let ch = start(
        Path::new("setpriv"),
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            exe.to_str().unwrap(),
        ],
        &[("LD_PRELOAD", lib.to_str().unwrap())],
    );
    let o = doctor(ch.pid());
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(finding(&o, "secure_exec"), "{}", o.stdout);
}

/// A library preloaded ahead of the shim that defines `malloc` takes the
/// process's `malloc`, and the shim stays inert: doctor names that library
/// (`not_interposed`, a problem). It said the process was probably a fork
/// child waiting for its thread, and exited 0.
#[test]
fn doctor_names_a_malloc_preloaded_ahead_of_the_shim() {
    let ahead = fixture("malloc_ahead_lib", &["-shared", "-fPIC"]);
    let preload = format!("{}:{}", ahead.display(), shim().display());
    let ch = start(
        &fixture("deploy_wait", &[]),
        &[],
        &[("LD_PRELOAD", &preload), ("MEMSHIM_CONTROL", "on")],
    );
    let o = doctor(ch.pid());
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(
        finding(&o, "not_interposed")
            && o.stdout.contains("malloc_ahead_lib")
            && !finding(&o, "endpoint_not_started"),
        "{}",
        o.stdout
    );
    // The shim first in LD_PRELOAD serves the process.
    let preload = format!("{}:{}", shim().display(), ahead.display());
    let ch = start(
        &fixture("deploy_wait", &[]),
        &[],
        &[("LD_PRELOAD", &preload), ("MEMSHIM_CONTROL", "on")],
    );
    let o = doctor(ch.pid());
    assert!(
        !finding(&o, "not_interposed") && finding(&o, "shim_active"),
        "{}",
        o.stdout
    );
}

#[test]
fn doctor_explains_a_program_with_its_own_malloc() {
    let ch = start(
        &fixture("deploy_own_malloc", &[]),
        &[],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    let o = doctor(ch.pid());
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(finding(&o, "own_malloc"), "{}", o.stdout);
    // Not "waiting for its second thread": the shim never serves it.
    assert!(!finding(&o, "endpoint_not_started"), "{}", o.stdout);
    // With a thread of its own it still gets no shim thread and no endpoint:
    // the shim sees that the executable's malloc wins and stays inert
    // (thread/mod.rs), and doctor still explains why.
    let ch2 = start(
        &fixture("deploy_own_malloc", &[]),
        &["thread"],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    memshim_tests::wait_until(Duration::from_secs(10), || {
        (memshim_tests::threads(ch2.pid()) >= 2).then_some(())
    })
    .expect("the fixture's own thread never appeared");
    let pid2 = ch2.pid().to_string();
    assert_ne!(Cmd::new(ctl(), ["stats", &pid2]).run().code, 0);
    assert!(
        !memshim_tests::thread_names(ch2.pid())
            .iter()
            .any(|n| n == "memshim"),
        "the shim started its thread in a process it does not serve"
    );
    let o = doctor(ch2.pid());
    assert!(
        finding(&o, "own_malloc") && !finding(&o, "shim_active"),
        "{}",
        o.stdout
    );
    // Live check: the ordinary fixture is not flagged.
    let ch = start(
        &fixture("deploy_wait", &[]),
        &[],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    assert!(!finding(&doctor(ch.pid()), "own_malloc"));
}

#[test]
fn doctor_explains_a_sanitizer_build() {
    let exe = fixture("deploy_wait", &["-fsanitize=address"]);
    // Under the shim the ASan runtime refuses to start (a sanitizer must own
    // malloc, and the preload comes before it) ...
    let o = Cmd::new(&exe, [""; 0]).shimmed().stdin("").run();
    assert_ne!(o.code, 0, "ASan started under the shim: {o:?}");
    // ... and the escape hatch runs it; doctor tells why it has no shim.
    let ch = start(
        Path::new("env"),
        &["-u", "LD_PRELOAD", exe.to_str().unwrap()],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    let o = doctor(ch.pid());
    assert!(finding(&o, "sanitizer"), "{}", o.stdout);
    assert!(o.stdout.contains("env -u LD_PRELOAD"), "{}", o.stdout);
}

#[test]
fn doctor_explains_a_valgrind_run() {
    if Cmd::new("valgrind", ["--version"]).run().code != 0 {
        eprintln!(
            "SKIP doctor_explains_a_valgrind_run: valgrind is not installed (make test-deps installs it)"
        );
        return;
    }
    let exe = fixture("deploy_wait", &[]);
    let ch = start(
        Path::new("valgrind"),
        &["-q", exe.to_str().unwrap()],
        &[("LD_PRELOAD", shim().to_str().unwrap())],
    );
    let o = doctor(ch.pid());
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(finding(&o, "valgrind"), "{}", o.stdout);
}

#[test]
fn doctor_on_a_missing_pid_fails_with_status_3() {
    let o = Cmd::new(ctl(), ["doctor", "999999999"]).run();
    assert_eq!(o.code, i32::from(NOT_FOUND.code), "{o:?}");
    assert!(
        o.stderr.contains("pid 999999999: no such process"),
        "{}",
        o.stderr
    );
}

#[test]
fn doctor_json_is_one_object_with_findings() {
    let ch = start(&fixture("deploy_wait", &["-static"]), &[], &[]);
    let o = Cmd::new(
        ctl(),
        ["doctor".into(), "--json".into(), ch.pid().to_string()],
    )
    .run();
    assert_eq!(o.stdout.lines().count(), 1, "{}", o.stdout);
    assert!(
        o.stdout.starts_with(&format!("{{\"pid\":{},", ch.pid())),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("\"code\":\"static_binary\""),
        "{}",
        o.stdout
    );
}
