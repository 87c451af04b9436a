//! Compatibility with what real processes do around the allocator: fork
//! while threads allocate and fork alone, allocation in library constructors,
//! `RTLD_DEEPBIND` (such a library would otherwise bind to glibc's
//! malloc), dlopen's caller semantics, `errno` across `free` (glibc's
//! manual requires replacements to keep it), and glibc's answers for the aligned allocators.

use memshim_tests::{Cmd, fixture, scratch, shim};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn shared(name: &str) -> PathBuf {
    fixture(name, &["-shared", "-fPIC"])
}

/// Runs `exe args` without and with the shim: both must exit 0 with
/// exactly `stdout` and an empty stderr (a hang fails at `timeout`).
fn same_without_and_with_the_shim(exe: &Path, args: &[&str], timeout: Duration, stdout: &str) {
    for shimmed in [false, true] {
        let mut c = Cmd::new(exe, args);
        if shimmed {
            c = c.shimmed();
        }
        let o = c.run_timeout(timeout);
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, stdout, ""),
            "shimmed={shimmed}: {o:?}"
        );
    }
}

#[test]
fn fork_in_a_loop_while_eight_threads_allocate_does_not_deadlock() {
    // Loads the machine: eight threads allocate while it forks.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let f = fixture("fork_threads", &[]);
    // A deadlock hangs the process: run_timeout kills it and fails.
    same_without_and_with_the_shim(&f, &["25"], Duration::from_secs(60), "forks ok 25\n");
}

/// jemalloc initialised before the shim's constructor ran (here by a
/// DT_NEEDED library's constructor) registers its fork functions with glibc
/// itself, so a fork inside that constructor, while threads allocate,
/// still runs them (shim/src/jemalloc.rs, "Lazy initialisation and fork").
/// When they only ran inside the shim's handlers, registered later, the
/// children deadlocked.
#[test]
fn fork_in_a_constructor_before_the_shims_while_threads_allocate_does_not_deadlock() {
    // Loads the machine: threads allocate while it forks.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let lib = shared("ctor_fork_lib");
    let exe = fixture("ctor_fork_main", &[lib.to_str().unwrap()]);
    same_without_and_with_the_shim(&exe, &[], Duration::from_secs(60), "ctor forks ok 25\n");
}

/// A fork by a process's only thread takes none of jemalloc's locks
/// (shim/src/jemalloc.rs, "Lazy initialisation and fork"). Its children
/// must still allocate, start threads and fork while those allocate, and
/// the parent's own forks must go back to taking the locks while it has
/// threads, and skip them again once they are gone.
#[test]
fn lone_forks_and_forks_with_threads_alternate_without_deadlock() {
    // Loads the machine: forks, with and without allocating threads.
    let _machine = memshim_tests::serial::exclusive(module_path!());
    let f = fixture("fork_alone", &[]);
    same_without_and_with_the_shim(
        &f,
        &["check", "10"],
        Duration::from_secs(60),
        "alone forks ok 10\n",
    );
}

/// The outcome: taking jemalloc's locks writes to every page that holds
/// one, so each fork then cost the parent about 14 more page faults (20
/// against glibc's 6 in `fork_alone faults`; a shell pays them on every
/// command). A lone fork now dirties no more of the parent than glibc's:
/// also when options in jemalloc's syntax make jemalloc initialise in the
/// shim's constructor, and after a thread has come and gone, when the
/// first fork stops the shim's own thread (40 faults before, glibc 10).
#[test]
fn a_lone_fork_dirties_no_more_of_the_parent_than_under_glibc() {
    let f = fixture("fork_alone", &[]);
    let faults = |shimmed: bool, jemalloc_conf: &str, after: &str| -> f64 {
        let mut c = Cmd::new(&f, ["faults", "200", after]);
        if shimmed {
            c = c.shimmed();
        }
        if !jemalloc_conf.is_empty() {
            c = c.env("MEMSHIM_MALLOC_CONF", jemalloc_conf);
        }
        let o = c.run_timeout(Duration::from_secs(60));
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
        o.stdout.trim().parse().unwrap()
    };
    for (conf, after) in [("", ""), ("narenas:4", ""), ("", "after-thread")] {
        let glibc = faults(false, "", after);
        let shim = faults(true, conf, after);
        assert!(
            shim <= glibc + 4.0,
            "parent's page faults per fork (fork_alone faults 200 {after:?}, \
             MEMSHIM_MALLOC_CONF={conf:?}): {shim} under the shim, {glibc} under glibc"
        );
    }
}

#[test]
fn allocation_in_a_dt_needed_library_constructor_works() {
    let lib = shared("needed_ctor_lib");
    let exe = fixture("needed_ctor_main", &[lib.to_str().unwrap()]);
    let want = "allocated in a DT_NEEDED constructor\nok\n";
    let plain = Cmd::new(&exe, [""; 0]).run();
    assert_eq!(
        (plain.code, plain.stdout.as_str(), plain.stderr.as_str()),
        (0, want, ""),
        "{plain:?}"
    );
    let o = Cmd::new(&exe, [""; 0]).shimmed().run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, want, ""),
        "{o:?}"
    );
    // junk filling would expose a block the constructor got from another allocator.
    let o = Cmd::new(&exe, [""; 0])
        .shimmed()
        .env("MEMSHIM_MALLOC_CONF", "junk:true")
        .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, want, ""),
        "{o:?}"
    );
}

fn deepbind(shimmed: bool, clear: Option<&str>) -> memshim_tests::Output {
    let lib = shared("deepbind_lib");
    let mut c = Cmd::new(fixture("deepbind_main", &[]), [lib.to_str().unwrap()]);
    if shimmed {
        c = c.shimmed();
    }
    if let Some(v) = clear {
        c = c.env("MEMSHIM_CLEAR_DEEPBIND", v);
    }
    c.run_timeout(Duration::from_secs(30))
}

#[test]
fn deepbind_library_shares_the_shim_allocator_by_default() {
    let want = "allocated inside the DEEPBIND library\nsurvived\n";
    let o = deepbind(true, None);
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, want, ""),
        "{o:?}"
    );
    let o = deepbind(false, None);
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, want, ""),
        "without the shim: {o:?}"
    );
}

#[test]
fn deepbind_crashes_when_the_flag_is_kept_proving_the_test_is_live() {
    // With the flag left in place the library binds glibc's malloc and the
    // first pointer that crosses allocators kills the process.
    let o = deepbind(true, Some("0"));
    assert!(
        o.code > 128,
        "expected death by signal with MEMSHIM_CLEAR_DEEPBIND=0, got {o:?}"
    );
    assert!(!o.stdout.contains("survived"), "{o:?}");
}

/// Lays out `dir/runpath_main` (RUNPATH=$ORIGIN/plugins) and
/// `dir/plugins/librunpath_plugin.so`.
fn runpath_layout() -> PathBuf {
    let dir = scratch().join("runpath");
    std::fs::create_dir_all(dir.join("plugins")).unwrap();
    let exe = fixture(
        "runpath_main",
        &["-Wl,--enable-new-dtags,-rpath,$ORIGIN/plugins"],
    );
    memshim_tests::copy_executable(&exe, &dir.join("runpath_main"));
    std::fs::copy(
        shared("runpath_plugin"),
        dir.join("plugins/librunpath_plugin.so"),
    )
    .unwrap();
    dir
}

#[test]
fn dlopen_searches_the_callers_runpath_under_the_shim() {
    let dir = runpath_layout();
    let exe = dir.join("runpath_main");
    same_without_and_with_the_shim(
        &exe,
        &["librunpath_plugin.so"],
        Duration::from_secs(120),
        "plugin found via the caller's RUNPATH\n",
    );
    // Live: a dlopen wrapper that is an ordinary function call becomes the
    // "caller" and the same lookup fails.
    let naive = shared("naive_dlopen_wrapper");
    let o = Cmd::new(&exe, ["librunpath_plugin.so"])
        .env("LD_PRELOAD", &naive)
        .run();
    assert_eq!(
        o.code, 1,
        "a naive wrapper should break the RUNPATH lookup: {o:?}"
    );
    assert!(o.stdout.contains("dlopen failed"), "{o:?}");
}

#[test]
fn free_keeps_errno_when_the_purge_inside_it_fails() {
    let fm = shared("failing_madvise");
    let preload = format!("{}:{}", shim().display(), fm.display());
    let o = Cmd::new(fixture("errno_free", &[]), [""; 0])
        .env("LD_PRELOAD", &preload)
        .env("MEMSHIM_DIRTY_DECAY_MS", "0")
        .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let inside: i64 = o
        .stdout
        .trim()
        .strip_prefix("errno kept 100 madvise_inside=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {o:?}"));
    // Live: the failing madvise (which sets errno) really ran inside free.
    assert!(
        inside > 0,
        "no free called madvise: the test proves nothing ({o:?})"
    );
}

#[test]
fn aligned_allocators_and_overflow_checks_answer_like_glibc() {
    let f = fixture("align_edges", &[]);
    let glibc = Cmd::new(&f, [""; 0]).run();
    let ours = Cmd::new(&f, [""; 0]).shimmed().run();
    assert_eq!((glibc.code, glibc.stderr.as_str()), (0, ""), "{glibc:?}");
    assert_eq!((ours.code, ours.stderr.as_str()), (0, ""), "{ours:?}");
    // Sanity: the fixture exercises successes, EINVAL and ENOMEM.
    for needle in [
        "-> ok errno=0 aligned=1",
        "errno=22",
        "errno=12",
        "rc=22",
        "rc=12",
        "rc=0",
        "mallopt(1, 161) -> rc=0",
    ] {
        assert!(glibc.stdout.contains(needle), "fixture lacks {needle:?}");
    }
    assert!(
        !glibc.stdout.contains("aligned=0"),
        "glibc misaligned?\n{}",
        glibc.stdout
    );
    let diff: Vec<String> = glibc
        .stdout
        .lines()
        .zip(ours.stdout.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("glibc: {a}\nshim:  {b}"))
        .collect();
    assert!(
        diff.is_empty(),
        "differences from glibc:\n{}",
        diff.join("\n")
    );
    assert_eq!(glibc.stdout.lines().count(), ours.stdout.lines().count());
}

#[test]
fn closing_all_descriptors_never_lets_the_shim_touch_a_reused_one() {
    // close_range(3, ~0) while the shim's thread runs, then a file takes the
    // freed numbers (the shim's eventfd among them), then forks (the fork
    // handler wakes the thread) and a new thread re-arms it.
    let file = scratch().join("fd_reuse.txt");
    let f = fixture("fd_reuse", &[]);
    same_without_and_with_the_shim(
        &f,
        &[file.to_str().unwrap()],
        Duration::from_secs(30),
        "file ok 3\n",
    );
}

#[test]
fn under_an_address_space_limit_freed_memory_makes_room_as_with_glibc() {
    // jemalloc keeps address space for reuse after returning its pages
    // (`retain`); under RLIMIT_AS that space still counts, and a later large
    // allocation failed where glibc's succeeds. The shim turns `retain` off
    // when such a limit is set.
    let f = fixture("as_limit", &[]);
    for limit in ["--as=1073741824", "--data=1073741824"] {
        let args = [limit, "--", f.to_str().unwrap()];
        let plain = Cmd::new("prlimit", args).run();
        assert_eq!(
            (plain.code, plain.stdout.as_str()),
            (0, "600 ok\n700 ok\n"),
            "{limit}: {plain:?}"
        );
        let o = Cmd::new("prlimit", args).shimmed().run();
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, plain.stdout.as_str(), ""),
            "{limit}"
        );
    }
}

/// `large_blocks ARGS` under the shim (with `envs`): the one `key=value`
/// number it prints, after a clean exit.
fn large_blocks(args: &[&str], envs: &[(&str, &str)], key: &str) -> f64 {
    let mut c = Cmd::new(fixture("large_blocks", &[]), args).shimmed();
    for (k, v) in envs {
        c = c.env(k, v);
    }
    let o = c.run();
    assert_eq!(
        (o.code, o.stderr.as_str()),
        (0, ""),
        "{args:?} {envs:?}: {o:?}"
    );
    o.stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{args:?}: no {key}= in {o:?}"))
}

#[test]
fn a_large_block_written_to_its_end_takes_the_pages_of_its_size() {
    // jemalloc's cache-oblivious layout put each large block at a random
    // offset in one extra page: a 16 KiB block written whole took 5 pages
    // (glibc: 4). The shim turns it off (docs/configuration.md).
    for (kib, pages) in [(16, 4.0), (40, 10.0)] {
        let got = large_blocks(
            &["blocks", "1000", &kib.to_string()],
            &[],
            "pages_per_block",
        );
        assert!(
            got < pages + 0.3,
            "{kib} KiB blocks take {got} pages each, not {pages}"
        );
    }
}

#[test]
fn a_buffer_grown_by_realloc_in_whole_pages_mostly_grows_where_it_lies() {
    // Grown in 1 MiB steps to 256 MiB, the buffer moved (a copy of all of
    // it, into pages faulted in anew) 131 times of 256 with jemalloc's
    // cache-oblivious layout in a single-threaded program and about 60
    // times with the shim's thread; 27 times without it (glibc: 8).
    for envs in [&[][..], &[("MEMSHIM_CONTROL", "on")][..]] {
        let moves = large_blocks(&["grow", "1024", "256"], envs, "moves");
        assert!(
            moves <= 256.0 / 6.0,
            "{envs:?}: moved {moves} times in 256 steps"
        );
    }
}

/// The first allocation of a process keeps errno, whichever function makes
/// it: jemalloc initialises inside it, and its initialisation parses
/// numbers (errno = 0) and makes system calls that may fail. Before, a
/// program's `printf` between a failed call and `perror` made it print
/// "Success". In every mode: under `on` and with profiling, the
/// initialisation runs in the constructor instead, or earlier in the call.
#[test]
fn the_first_allocation_keeps_errno() {
    let f = fixture("errno_first_alloc", &[]);
    let hows = [
        "malloc",
        "calloc",
        "realloc",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "strdup",
    ];
    let modes: [&[(&str, &str)]; 4] = [
        &[],
        &[("MEMSHIM_CONTROL", "off")],
        &[("MEMSHIM_CONTROL", "on")],
        &[("MEMSHIM_PROFILE", "on")],
    ];
    for how in hows {
        let glibc = Cmd::new(&f, [how]).run();
        assert_eq!(
            (glibc.code, glibc.stdout.trim()),
            (0, format!("{how} errno=1234").as_str()),
            "glibc: {glibc:?}"
        );
        for mode in modes {
            let mut c = Cmd::new(&f, [how]).shimmed();
            for (k, v) in mode {
                c = c.env(k, v);
            }
            let o = c.run();
            assert_eq!(
                (o.code, o.stdout.as_str(), o.stderr.as_str()),
                (0, glibc.stdout.as_str(), ""),
                "{how} under {mode:?}"
            );
        }
    }
}

/// jemalloc reads options from the name of the symbolic link
/// `/etc/_rjem_malloc.conf` (its `/etc/malloc.conf`, prefixed as this
/// build is); the shim's configuration is the environment's alone, so the
/// link is not read: no option of it applies and no warning of jemalloc's
/// about it reaches the program's fd 2. Run in a mount namespace whose
/// `/etc` holds only the loader's cache and the link.
#[test]
fn jemallocs_prefixed_malloc_conf_link_is_not_read() {
    let f = fixture("errno_first_alloc", &[]);
    let etc = scratch().join("etc-rjem-malloc-conf");
    let _ = std::fs::remove_dir_all(&etc);
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::copy("/etc/ld.so.cache", etc.join("ld.so.cache")).unwrap();
    std::os::unix::fs::symlink("narenas:abc,junk", etc.join("_rjem_malloc.conf")).unwrap();
    let script = format!(
        "mount --bind '{}' /etc && exec env LD_PRELOAD='{}' '{}' malloc",
        etc.display(),
        shim().display(),
        f.display()
    );
    let o = Cmd::new("unshare", ["-m", "sh", "-c", &script]).run();
    assert_eq!(
        (o.code, o.stdout.trim(), o.stderr.as_str()),
        (0, "malloc errno=1234", ""),
        "{o:?}"
    );
    // Live: the link is where jemalloc looks (readlink sees it).
    let check = format!(
        "mount --bind '{}' /etc && exec readlink /etc/_rjem_malloc.conf",
        etc.display()
    );
    let o = Cmd::new("unshare", ["-m", "sh", "-c", &check]).run();
    assert_eq!(o.stdout.trim(), "narenas:abc,junk", "{o:?}");
    let _ = std::fs::remove_dir_all(&etc);
}

/// A program linked to Debian's libjemalloc (redis, varnish) mixes
/// jemalloc's API with malloc and free, as jemalloc allows: under the
/// preload both are the shim's jemalloc (`free(mallocx(n))` crashed, two
/// heaps).
#[test]
fn a_program_linked_to_libjemalloc_keeps_one_heap() {
    let lib = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    if !std::path::Path::new(lib).exists() {
        eprintln!("SKIP: no {lib} (scripts/test-deps.sh installs libjemalloc2)");
        return;
    }
    let f = fixture("jemalloc_api", &[lib]);
    let plain = Cmd::new(&f, [""; 0]).run();
    assert_eq!((plain.code, plain.stderr.as_str()), (0, ""), "{plain:?}");
    for control in ["auto", "on"] {
        let o = Cmd::new(&f, [""; 0])
            .shimmed()
            .env("MEMSHIM_CONTROL", control)
            .run();
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, plain.stdout.as_str(), ""),
            "MEMSHIM_CONTROL={control}"
        );
    }
}
