//! Option parsing (shim/src/options.rs): every `MEMSHIM_*` variable, valid
//! and invalid. A bad value gets exactly one `memshim: warning:` line that
//! names the variable and the default, and nothing else changes; good
//! values take effect before `main`.

use memshim_proto::endpoint::{MAX_DECAY_MS, MAX_NARENAS, MAX_SOCKET_DIR};
use memshim_tests::{Cmd, Output, fixture};

/// (variable, default as the warning prints it, bad values).
fn bad_values() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let decay_bad = || {
        [
            "abc",
            "",
            "-2",
            "1e3",
            " 5",
            "99999999999999999999",
            "0x10",
            "5\nmemshim: a line of its own",
            "a\rb\x1b[31mX\x7f",
        ]
        .map(String::from)
        .into_iter()
        .chain([(MAX_DECAY_MS + 1).to_string()])
        .collect()
    };
    vec![
        ("MEMSHIM_DIRTY_DECAY_MS", "1000", decay_bad()),
        ("MEMSHIM_MUZZY_DECAY_MS", "0", decay_bad()),
        (
            "MEMSHIM_NARENAS",
            "auto",
            ["0", "-1", "", "many", "99999999999999999999"]
                .map(String::from)
                .into_iter()
                .chain([MAX_NARENAS + 1, MAX_NARENAS + 2].map(|n| n.to_string()))
                .collect(),
        ),
        (
            "MEMSHIM_CONTROL",
            "auto",
            ["", "maybe", "2", "auto-ish"].map(String::from).to_vec(),
        ),
        (
            "MEMSHIM_PRESSURE",
            "on",
            ["", "sometimes", "2", "gc,on"].map(String::from).to_vec(),
        ),
        (
            "MEMSHIM_PRESSURE_THRESHOLD",
            "90",
            ["", "5", "100", "0.9", "ninety", "-90"]
                .map(String::from)
                .to_vec(),
        ),
        (
            "MEMSHIM_CLEAR_DEEPBIND",
            "1",
            ["", "2", "maybe"].map(String::from).to_vec(),
        ),
        (
            "MEMSHIM_VERBOSE",
            "0",
            ["", "2", "loud"].map(String::from).to_vec(),
        ),
        (
            "MEMSHIM_SOCKET_DIR",
            "/tmp/memshim-<uid>",
            vec![
                "".into(),
                "relative/dir".into(),
                format!("/{}", "d".repeat(MAX_SOCKET_DIR)),
            ],
        ),
        (
            "MEMSHIM_MALLOC_CONF",
            "(empty)",
            vec![
                "narenas: 2".into(),
                "junk".into(),
                "narenas:2,".into(),
                "a:1,,b:2".into(),
                "x:y,".repeat(600),
                "narenas:2\nmemshim: a line of its own".into(),
            ],
        ),
        (
            "MALLOC_CONF",
            "(ignored)",
            ["junk", ",", "narenas:1 dirty_decay_ms:5", "junk\r\x1b[2K"]
                .map(String::from)
                .to_vec(),
        ),
    ]
}

fn echo(envs: &[(&str, &str)]) -> Output {
    let mut c = Cmd::new("/bin/echo", ["still here"]).shimmed();
    for (k, v) in envs {
        c = c.env(k, v);
    }
    c.run()
}

fn verbose(envs: &[(&str, &str)]) -> String {
    let mut all = vec![("MEMSHIM_VERBOSE", "1")];
    all.extend_from_slice(envs);
    let o = echo(&all);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "still here\n"),
        "{envs:?}: {o:?}"
    );
    assert!(!o.stderr.contains("warning"), "{envs:?}: {o:?}");
    o.stderr
}

#[test]
fn every_bad_value_gets_exactly_one_warning_naming_variable_and_default() {
    let mut checked = 0;
    for (var, default, values) in bad_values() {
        for v in values {
            let o = echo(&[(var, &v)]);
            assert_eq!(
                (o.code, o.stdout.as_str()),
                (0, "still here\n"),
                "{var}={v:?}: {o:?}"
            );
            let lines: Vec<&str> = o.stderr.lines().collect();
            assert_eq!(
                lines.len(),
                1,
                "{var}={v:?}: expected exactly one line: {o:?}"
            );
            let l = lines[0];
            assert!(l.starts_with("memshim: warning: "), "{var}={v:?}: {l}");
            assert!(
                !l.bytes().any(|b| b.is_ascii_control()),
                "{var}={v:?}: a control character in the warning: {l:?}"
            );
            assert!(
                l.contains(&format!("{var}=")),
                "{var}={v:?}: does not name the variable: {l}"
            );
            assert!(
                l.contains(&format!("default {default}")),
                "{var}={v:?}: does not name the default: {l}"
            );
            checked += 1;
        }
    }
    assert!(checked > 40);
}

#[test]
fn each_bad_variable_gets_its_own_line_and_the_good_ones_still_apply() {
    let o = echo(&[
        ("MEMSHIM_DIRTY_DECAY_MS", "soon"),
        ("MEMSHIM_NARENAS", "lots"),
        ("MEMSHIM_CONTROL", "sometimes"),
        ("MEMSHIM_MUZZY_DECAY_MS", "250"),
        ("MEMSHIM_VERBOSE", "1"),
    ]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "still here\n"), "{o:?}");
    let warnings: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("memshim: warning: "))
        .collect();
    assert_eq!(warnings.len(), 3, "{o:?}");
    for var in [
        "MEMSHIM_DIRTY_DECAY_MS",
        "MEMSHIM_NARENAS",
        "MEMSHIM_CONTROL",
    ] {
        assert_eq!(
            warnings.iter().filter(|l| l.contains(var)).count(),
            1,
            "{var}: {o:?}"
        );
    }
    assert!(
        o.stderr.contains("dirty_decay_ms=1000 muzzy_decay_ms=250"),
        "{o:?}"
    );
}

#[test]
fn malformed_malloc_conf_does_not_swallow_the_settings_after_it() {
    // jemalloc stops parsing a conf string at a malformed spot; the shim
    // rejects such a MALLOC_CONF as a whole so MEMSHIM_* still apply.
    let o = echo(&[
        ("MALLOC_CONF", "junk"),
        ("MEMSHIM_DIRTY_DECAY_MS", "1234"),
        ("MEMSHIM_VERBOSE", "1"),
    ]);
    assert_eq!(
        o.stderr.lines().filter(|l| l.contains("warning")).count(),
        1,
        "{o:?}"
    );
    assert!(o.stderr.contains("dirty_decay_ms=1234"), "{o:?}");
}

#[test]
fn jemalloc_rejects_a_bad_pair_in_one_line_that_names_its_source() {
    for (var, val) in [
        ("MEMSHIM_MALLOC_CONF", "narenas:abc"),
        ("MALLOC_CONF", "no_such_option:1"),
    ] {
        let o = echo(&[(var, val)]);
        assert_eq!((o.code, o.stdout.as_str()), (0, "still here\n"), "{o:?}");
        let lines: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{var}={val}: {o:?}");
        assert!(
            lines[0].starts_with("memshim: warning: jemalloc: Invalid conf"),
            "{o:?}"
        );
        assert!(
            lines[0].contains(val)
                && lines[0].contains("MALLOC_CONF")
                && lines[0].contains("default"),
            "{o:?}"
        );
    }
}

#[test]
fn unknown_memshim_variable_warns_once() {
    let o = echo(&[("MEMSHIM_FOO", "1")]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "still here\n"));
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{o:?}");
    assert!(
        lines[0].starts_with("memshim: warning: MEMSHIM_FOO "),
        "{o:?}"
    );
    // A typo of a real name is caught the same way.
    let o = echo(&[("MEMSHIM_DIRTY_DECAY", "5")]);
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
}

#[test]
fn valid_values_print_nothing() {
    // The longest directory the shim takes, and the proto's limits.
    let long_dir = format!("/{}", "d".repeat(MAX_SOCKET_DIR - 1));
    let max_decay = MAX_DECAY_MS.to_string();
    let max_narenas = MAX_NARENAS.to_string();
    let cases: Vec<(&str, &str)> = vec![
        ("MEMSHIM_DIRTY_DECAY_MS", "0"),
        ("MEMSHIM_DIRTY_DECAY_MS", "-1"),
        ("MEMSHIM_DIRTY_DECAY_MS", &max_decay),
        ("MEMSHIM_MUZZY_DECAY_MS", "-1"),
        ("MEMSHIM_MUZZY_DECAY_MS", "5000"),
        ("MEMSHIM_NARENAS", "auto"),
        ("MEMSHIM_NARENAS", "AUTO"),
        ("MEMSHIM_NARENAS", "1"),
        ("MEMSHIM_NARENAS", &max_narenas),
        ("MEMSHIM_CONTROL", "auto"),
        ("MEMSHIM_CONTROL", "on"),
        ("MEMSHIM_CONTROL", "OFF"),
        ("MEMSHIM_PRESSURE", "on"),
        ("MEMSHIM_PRESSURE", "GC"),
        ("MEMSHIM_PRESSURE", "off"),
        ("MEMSHIM_PRESSURE_THRESHOLD", "75"),
        ("MEMSHIM_PRESSURE_THRESHOLD", "99%"),
        ("MEMSHIM_CLEAR_DEEPBIND", "0"),
        ("MEMSHIM_CLEAR_DEEPBIND", "yes"),
        ("MEMSHIM_VERBOSE", "0"),
        ("MEMSHIM_VERBOSE", "false"),
        ("MEMSHIM_SOCKET_DIR", "/run/memshim"),
        ("MEMSHIM_SOCKET_DIR", &long_dir),
        ("MEMSHIM_MALLOC_CONF", ""),
        ("MEMSHIM_MALLOC_CONF", "narenas:2,tcache_max:4096"),
        ("MEMSHIM_LIB", "/opt/memshim/lib/libmemshim.so"),
        ("MALLOC_CONF", "narenas:3"),
        ("MALLOC_CONF", ""),
    ];
    for (k, v) in cases {
        let o = echo(&[(k, v)]);
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, "still here\n", ""),
            "{k}={v:?}"
        );
    }
}

#[test]
fn valid_values_take_effect() {
    let d = verbose(&[]);
    assert!(
        d.contains("dirty_decay_ms=1000 muzzy_decay_ms=0 "),
        "defaults: {d}"
    );
    assert!(d.contains("oversize_threshold=0"), "defaults: {d}");
    assert!(
        d.contains("control=Auto clear_deepbind=true"),
        "defaults: {d}"
    );
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("MEMSHIM_DIRTY_DECAY_MS", "1234")],
            "dirty_decay_ms=1234 ",
        ),
        (&[("MEMSHIM_DIRTY_DECAY_MS", "-1")], "dirty_decay_ms=-1 "),
        (&[("MEMSHIM_MUZZY_DECAY_MS", "77")], "muzzy_decay_ms=77 "),
        (&[("MEMSHIM_NARENAS", "7")], "narenas=7 "),
        (&[("MEMSHIM_CONTROL", "off")], "control=Off"),
        (&[("MEMSHIM_CONTROL", "on")], "control=On"),
        (&[("MEMSHIM_CLEAR_DEEPBIND", "0")], "clear_deepbind=false"),
        // A stock jemalloc's MALLOC_CONF is honoured...
        (&[("MALLOC_CONF", "narenas:3")], "narenas=3 "),
        (
            &[("MALLOC_CONF", "dirty_decay_ms:4321")],
            "dirty_decay_ms=4321 ",
        ),
        (&[("_RJEM_MALLOC_CONF", "narenas:4")], "narenas=4 "),
        // ...below the MEMSHIM_* knobs...
        (
            &[("MALLOC_CONF", "narenas:3"), ("MEMSHIM_NARENAS", "6")],
            "narenas=6 ",
        ),
        // ...and MEMSHIM_MALLOC_CONF is applied over everything.
        (
            &[
                ("MALLOC_CONF", "narenas:3"),
                ("MEMSHIM_MALLOC_CONF", "narenas:5"),
            ],
            "narenas=5 ",
        ),
        (
            &[
                ("MEMSHIM_NARENAS", "6"),
                ("MEMSHIM_MALLOC_CONF", "narenas:5"),
            ],
            "narenas=5 ",
        ),
        (
            &[
                ("MEMSHIM_DIRTY_DECAY_MS", "10"),
                ("MEMSHIM_MALLOC_CONF", "dirty_decay_ms:20"),
            ],
            "dirty_decay_ms=20 ",
        ),
        (
            &[("MEMSHIM_MALLOC_CONF", "tcache_max:1024")],
            "tcache_max=1024 ",
        ),
    ];
    for (envs, want) in cases {
        let v = verbose(envs);
        assert!(v.contains(want), "{envs:?}: expected {want:?} in\n{v}");
    }
}

/// `MALLOC_CONF` may hold up to 2048 bytes, and so may
/// `MEMSHIM_MALLOC_CONF`; the composed string was kept in 2048 bytes, so a
/// long `MALLOC_CONF` cut off the override after it (here: narenas 8, not 5).
#[test]
fn a_long_malloc_conf_does_not_cut_off_what_comes_after_it() {
    let long = vec!["dirty_decay_ms:1000"; 100].join(",");
    assert!((1900..2048).contains(&long.len()));
    let v = verbose(&[
        ("MALLOC_CONF", long.as_str()),
        ("MEMSHIM_MALLOC_CONF", "narenas:5"),
    ]);
    assert!(v.contains("narenas=5 "), "expected narenas=5 in\n{v}");
}

#[test]
fn settings_are_in_force_before_main_and_before_library_constructors() {
    let lib = fixture("early_junk_lib", &["-shared", "-fPIC"]);
    let exe = fixture("config_early", &[lib.to_str().unwrap()]);
    let o = Cmd::new(&exe, ["plain"])
        .shimmed()
        .env("MEMSHIM_MALLOC_CONF", "junk:true")
        .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, "ctor junk=1 main junk=1\n", ""),
        "{o:?}"
    );
    // Live: without the option, fresh blocks are not junk-filled.
    let o = Cmd::new(&exe, ["plain"]).shimmed().run();
    assert_eq!(o.stdout, "ctor junk=0 main junk=0\n", "{o:?}");
    // The verbose report (effective settings) precedes main's first line.
    let o = Cmd::new(&exe, ["mark"])
        .shimmed()
        .env("MEMSHIM_VERBOSE", "1")
        .env("MEMSHIM_DIRTY_DECAY_MS", "2345")
        .run();
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(lines.last(), Some(&"main starts"), "{o:?}");
    let at = lines
        .iter()
        .position(|l| l.contains("dirty_decay_ms=2345"))
        .expect("verbose line");
    assert!(at < lines.len() - 1, "{o:?}");
}

#[test]
fn a_preload_that_allocates_inside_open_and_read_does_not_hang_start_up() {
    let lib = memshim_tests::fixture("alloc_in_open", &["-shared", "-fPIC"]);
    let preload = format!("{}:{}", lib.display(), memshim_tests::shim().display());
    for prog in [["/bin/true", ""], ["/bin/echo", "hello"]] {
        let mut c = Cmd::new(prog[0], [prog[1]]);
        c.command().env("LD_PRELOAD", &preload);
        let o = c.run_timeout(std::time::Duration::from_secs(20));
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{prog:?}: {o:?}");
    }
}

/// A warning goes to fd 2 even when nobody reads it: a pipe whose reader is
/// gone (`prog 2>&1 | head -1` after `head` exits) must not kill the
/// program with SIGPIPE for a line it never wrote (it did: signal 13).
#[test]
fn a_warning_to_a_stderr_nobody_reads_does_not_kill_the_program() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors, which we own from here on.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: as above; the read end is closed at once.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    let st = std::process::Command::new("/bin/true")
        .env("LD_PRELOAD", memshim_tests::shim())
        .env("MEMSHIM_DIRTY_DECAY_MS", "bogus")
        .stderr(w)
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!((st.code(), st.signal()), (Some(0), None), "{st:?}");
}

/// `narenas=N` of the last process in `o` that reported its settings.
fn last_narenas(o: &Output) -> u32 {
    o.stderr
        .rsplit("narenas=")
        .next()
        .filter(|_| o.stderr.contains("narenas="))
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no narenas= in {o:?}"))
}

/// `auto` (the default) leaves jemalloc's arena count (4 per CPU of the
/// affinity mask) alone, but caps it at 4 per CPU of a tighter CPU quota,
/// read from the cgroup mounted where a container sees its own
/// (`/sys/fs/cgroup/cpu`, v1).
#[test]
fn auto_caps_arenas_at_four_per_cpu_of_a_tighter_quota() {
    let nproc = Cmd::new("nproc", Vec::<&str>::new()).run();
    let cpus: u32 = nproc.stdout.trim().parse().expect("nproc");
    let o = Output {
        code: 0,
        stdout: String::new(),
        stderr: verbose(&[]),
    };
    assert_eq!(last_narenas(&o), 4 * cpus, "{o:?}");

    // An affinity mask of one CPU: `taskset` (itself shimmed, reporting the
    // full mask) execs echo with one CPU, for which jemalloc makes a single
    // arena.
    let o = Cmd::new("taskset", ["-c", "0", "/bin/echo", "still here"])
        .shimmed()
        .env("MEMSHIM_VERBOSE", "1")
        .run();
    assert_eq!((o.code, o.stdout.as_str()), (0, "still here\n"), "{o:?}");
    assert_eq!(last_narenas(&o), 1, "{o:?}");

    // A CPU quota on a real cpu cgroup, mounted where a container has its
    // own.
    let cpu = std::path::Path::new("/sys/fs/cgroup/cpu");
    if cpus < 2 || !cpu.join("cpu.cfs_quota_us").exists() {
        eprintln!("SKIP quota part: {cpus} CPU(s), or no v1 cpu controller");
        return;
    }
    let dir = cpu.join(format!("memshim-test-{}-quota", std::process::id()));
    if std::fs::create_dir(&dir).is_err() {
        eprintln!("SKIP quota part: cannot make {}", dir.display());
        return;
    }
    struct Rmdir(std::path::PathBuf);
    impl Drop for Rmdir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let dir = Rmdir(dir);
    std::fs::write(dir.0.join("cpu.cfs_period_us"), "100000").unwrap();
    let script = format!(
        "mount --bind '{}' /sys/fs/cgroup/cpu && exec /bin/echo still here",
        dir.0.display()
    );
    let under_quota_with = |quota: &str, env: &[(&str, &str)]| {
        std::fs::write(dir.0.join("cpu.cfs_quota_us"), quota).unwrap();
        let mut c = Cmd::new("unshare", ["-m", "sh", "-c", &script])
            .shimmed()
            .env("MEMSHIM_VERBOSE", "1");
        for (k, v) in env {
            c = c.env(k, v);
        }
        c.run()
    };
    let under_quota = |quota: &str| under_quota_with(quota, &[]);
    // Half a CPU rounds up to one: 4 arenas.
    let o = under_quota("50000");
    if o.stderr.contains("unshare:") || o.stderr.contains("mount:") {
        eprintln!("SKIP quota part: {}", o.stderr.trim());
        return;
    }
    assert_eq!((o.code, o.stdout.as_str()), (0, "still here\n"), "{o:?}");
    assert_eq!(last_narenas(&o), 4, "{o:?}");
    // A quota as wide as the mask changes nothing.
    let o = under_quota(&(100000 * cpus).to_string());
    assert_eq!(last_narenas(&o), 4 * cpus, "{o:?}");
    // A count of the user's wins over the quota's, in every form jemalloc
    // reads: the quota's count is a default, though the shim adds it when
    // jemalloc initialises (`narenas:default` is jemalloc's own, 4 per CPU
    // of the mask).
    for (var, value, want) in [
        ("MEMSHIM_NARENAS", "6", 6),
        ("MALLOC_CONF", "narenas:3", 3),
        ("MEMSHIM_MALLOC_CONF", "narenas:0x6", 6),
        ("MEMSHIM_MALLOC_CONF", "narenas:default", 4 * cpus),
    ] {
        let o = under_quota_with("50000", &[(var, value)]);
        assert_eq!((o.code, o.stdout.as_str()), (0, "still here\n"), "{o:?}");
        assert_eq!(last_narenas(&o), want, "{var}={value}: {o:?}");
    }
}

/// The CPU quota is read when jemalloc initialises, on the first
/// allocation, not in the constructor (issue 48, item 1): under the shim,
/// `/bin/true`, which never allocates, neither asks for its affinity mask
/// nor opens a cgroup file; `/bin/echo`, which allocates (setlocale), does
/// both. Only where the mask has two CPUs or more: with one, no quota could
/// be tighter and nothing is read.
#[test]
fn only_a_process_that_allocates_reads_its_cpu_quota() {
    let nproc = Cmd::new("nproc", Vec::<&str>::new()).run();
    let cpus: u32 = nproc.stdout.trim().parse().expect("nproc");
    if cpus < 2 {
        eprintln!("SKIP: {cpus} CPU(s): the quota is never read");
        return;
    }
    let trace = |prog: &str, args: &[&str]| -> String {
        let out = memshim_tests::scratch().join(format!(
            "quota-strace-{}-{}",
            prog.rsplit('/').next().unwrap(),
            std::process::id()
        ));
        let preload = format!("LD_PRELOAD={}", memshim_tests::shim().display());
        let o = Cmd::new(
            "strace",
            [
                "-f",
                "-qq",
                "-e",
                "trace=openat,open,sched_getaffinity",
                "-E",
                &preload,
                "-o",
                out.to_str().unwrap(),
                prog,
            ]
            .iter()
            .chain(args),
        )
        .run();
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "strace {prog}: {o:?}");
        let t = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        t
    };
    let t = trace("/bin/true", &[]);
    assert!(
        t.contains("libmemshim.so"),
        "the shim was not loaded into /bin/true:\n{t}"
    );
    assert!(
        !t.contains("/proc/self/cgroup") && !t.contains("sched_getaffinity"),
        "/bin/true, which never allocates, read its CPU quota:\n{t}"
    );
    let t = trace("/bin/echo", &["still here"]);
    assert!(
        t.contains("/proc/self/cgroup") && t.contains("sched_getaffinity"),
        "/bin/echo allocates, but its CPU quota was not read:\n{t}"
    );
}
