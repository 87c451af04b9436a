//! Do no harm in odd hosts: an executable with its own malloc (it wins the
//! symbol lookup over any preload) and a shim loaded with dlopen instead of
//! LD_PRELOAD (its initial-exec TLS may not fit).

use memshim_tests::{Cmd, fixture, python, shim};

/// Enlarges glibc's spare static TLS so that dlopen of the shim succeeds
/// and the "loaded but inert" path is exercised too.
const ROOMY_TLS: &str = "glibc.rtld.optional_static_tls=1048576";

#[test]
fn executable_with_its_own_malloc_runs_normally_and_the_shim_stays_inert() {
    let f = fixture("own_malloc", &[]);
    let plain = Cmd::new(&f, [""; 0]).run();
    assert_eq!((plain.code, plain.stderr.as_str()), (0, ""), "{plain:?}");
    assert!(
        plain.stdout.contains("threads while running: 4"),
        "{plain:?}"
    );
    assert!(
        plain.stdout.contains("own allocator used: yes"),
        "{plain:?}"
    );
    assert!(
        plain
            .stdout
            .contains("reallocarray from the own allocator: yes"),
        "{plain:?}"
    );
    // Same output under the shim: in particular no memshim thread joins
    // the 3 workers, although the process creates threads.
    let o = Cmd::new(&f, [""; 0]).shimmed().run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, plain.stdout.as_str(), "")
    );
    let o = Cmd::new(&f, [""; 0])
        .shimmed()
        .env("MEMSHIM_VERBOSE", "1")
        .run();
    assert_eq!(o.stdout, plain.stdout);
    assert!(o.stderr.contains("interposed=no"), "{o:?}");
}

/// Under valgrind with the shim preloaded (a container's `ENV` line),
/// valgrind rewrites calls to our malloc family but not to `reallocarray`
/// (3.19, Debian 12's), which handed out jemalloc's memory: "Invalid free()",
/// then a crash in jemalloc (GNU grep, ls and sort call it; grep's SIGSEGV
/// handler then printed "program error" forever). And the shim's thread,
/// started under valgrind, was reported as a leak, failing
/// `--error-exitcode`. The shim now stays out of valgrind runs.
#[test]
fn a_program_under_valgrind_runs_as_without_the_shim() {
    if Cmd::new("valgrind", ["--version"]).run().code != 0 {
        eprintln!("SKIP: valgrind is not installed (make test-deps installs it)");
        return;
    }
    let f = fixture("valgrind_realloc", &[]);
    let f = f.to_str().unwrap();
    let args = ["-q", "--leak-check=full", "--error-exitcode=9", f];
    for control in ["auto", "on"] {
        let o = Cmd::new("valgrind", args)
            .shimmed()
            .env("MEMSHIM_CONTROL", control)
            .run_timeout(std::time::Duration::from_secs(60));
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, "abc\ndone\n", ""),
            "MEMSHIM_CONTROL={control}: {o:?}"
        );
    }
}

#[test]
fn verbose_reports_interposed_yes_for_an_ordinary_program() {
    // The counterpart of the test above: the detection is not constant.
    let o = Cmd::new("/bin/true", [""; 0])
        .shimmed()
        .env("MEMSHIM_VERBOSE", "1")
        .run();
    assert!(o.stderr.contains("interposed=yes"), "{o:?}");
}

#[test]
fn a_non_pie_program_that_takes_mallocs_address_is_interposed() {
    // Its `malloc` in the global scope is its own PLT slot; the shim must
    // not take that for a malloc of the program's own and stay inert (no
    // thread, no endpoint: what Debian's python3 got).
    let f = fixture("nopie_malloc_ptr", &["-fno-pie", "-no-pie"]);
    let elf = std::fs::read(&f).unwrap();
    assert_eq!(elf[16], 2, "not built as ET_EXEC (non-PIE)");
    let o = Cmd::new(&f, [""; 0])
        .shimmed()
        .env("MEMSHIM_VERBOSE", "1")
        .run();
    assert_eq!((o.code, o.stdout.as_str()), (0, "ok\n"), "{o:?}");
    assert!(o.stderr.contains("interposed=yes"), "{o:?}");
}

#[test]
fn a_non_pie_python_is_interposed_and_its_api_says_so() {
    // Debian's and Ubuntu's /usr/bin/python3 are not PIE and take malloc's
    // address: the same case as above, in the Python API too.
    let py = std::path::Path::new("/usr/bin/python3");
    let Ok(elf) = std::fs::read(py) else {
        eprintln!("SKIP: no /usr/bin/python3");
        return;
    };
    if elf.get(16) != Some(&2) {
        eprintln!("SKIP: /usr/bin/python3 is PIE here");
        return;
    }
    let api = memshim_tests::root().join("python");
    let o = Cmd::new(py, ["-c", "import memshim; print(memshim.is_preloaded())"])
        .shimmed()
        .env("PYTHONPATH", &api)
        .env("MEMSHIM_VERBOSE", "1")
        .run();
    assert_eq!((o.code, o.stdout.as_str()), (0, "True\n"), "{o:?}");
    assert!(o.stderr.contains("interposed=yes"), "{o:?}");
}

#[test]
fn a_shared_sanitizer_runtime_loaded_after_the_shim_leaves_it_inert() {
    // A sanitizer must own malloc; a shared runtime loaded after the shim
    // does not (ASan with `verify_asan_link_order=0`, TSan). Such a process
    // may not run at all (docs/deploy.md), but the shim must not act on
    // it. It is recognised by the runtime's file name, so an empty library
    // under that name stands in for it here.
    let lib = fixture("stand_in_lib", &["-shared"]);
    for name in ["libtsan.so.2", "libclang_rt.asan-x86_64.so"] {
        let dir = memshim_tests::scratch().join("sanitizer-names");
        std::fs::create_dir_all(&dir).unwrap();
        let runtime = dir.join(name);
        std::fs::copy(&lib, &runtime).unwrap();
        let preload = format!("{} {}", shim().display(), runtime.display());
        let o = Cmd::new("/bin/true", [""; 0])
            .env("LD_PRELOAD", &preload)
            .env("MEMSHIM_VERBOSE", "1")
            .run();
        assert_eq!(o.code, 0, "{name}: {o:?}");
        assert!(o.stderr.contains("interposed=no"), "{name}: {o:?}");
    }
    // The same library under another name changes nothing.
    let preload = format!("{} {}", shim().display(), lib.display());
    let o = Cmd::new("/bin/true", [""; 0])
        .env("LD_PRELOAD", &preload)
        .env("MEMSHIM_VERBOSE", "1")
        .run();
    assert!(o.stderr.contains("interposed=yes"), "{o:?}");
}

fn check_dlopen_outcome(o: &memshim_tests::Output, what: &str) {
    assert_eq!(o.code, 0, "{what}: {o:?}");
    let first = o.stdout.lines().next().unwrap_or("");
    assert!(
        first == "dlopen: loaded"
            || (first.starts_with("dlopen: failed:") && first.contains("static TLS")),
        "{what}: unexpected dlopen outcome: {o:?}"
    );
    // glibc remains the allocator (24 is glibc's usable size of malloc(1)),
    // the heap is intact, and no shim thread joined the 2 workers even
    // with MEMSHIM_CONTROL=on.
    let rest: Vec<&str> = o.stdout.lines().skip(1).collect();
    assert_eq!(rest, ["usable 24", "threads 3", "heap ok"], "{what}: {o:?}");
}

#[test]
fn dlopen_of_the_shim_from_c_fails_cleanly_or_stays_inert() {
    let f = fixture("dlopen_shim", &[]);
    for mode in ["local", "global"] {
        // As it is: the static TLS block is too small, dlopen fails cleanly.
        let o = Cmd::new(&f, [shim().to_str().unwrap(), mode])
            .env("MEMSHIM_CONTROL", "on")
            .run();
        check_dlopen_outcome(&o, mode);
        assert_eq!(o.stderr, "", "{o:?}");
        // With room for it: loaded, inert, and it says so.
        let o = Cmd::new(&f, [shim().to_str().unwrap(), mode])
            .env("GLIBC_TUNABLES", ROOMY_TLS)
            .env("MEMSHIM_CONTROL", "on")
            .env("MEMSHIM_VERBOSE", "1")
            .run();
        check_dlopen_outcome(&o, mode);
        if o.stdout.starts_with("dlopen: loaded") {
            assert!(o.stderr.contains("interposed=no"), "{o:?}");
        }
    }
}

#[test]
fn ctypes_cdll_of_the_shim_fails_cleanly_or_stays_inert_and_python_goes_on() {
    let script = format!(
        r#"
import ctypes, json, os, threading
try:
    ctypes.CDLL({lib:?})
    print("loaded")
except OSError as e:
    print("OSError", "static TLS" in str(e))
t = threading.Thread(target=lambda: None); t.start(); t.join()
data = [{{"k": i, "v": "x" * (i % 300)}} for i in range(50000)]
assert json.loads(json.dumps(data)) == data
print("threads", len(os.listdir("/proc/self/task")))
print("python ok")
"#,
        lib = shim().to_str().unwrap()
    );
    for tunables in [None, Some(ROOMY_TLS)] {
        let mut c = Cmd::new(python(), ["-c", &script]).env("MEMSHIM_CONTROL", "on");
        if let Some(t) = tunables {
            c = c.env("GLIBC_TUNABLES", t);
        }
        let o = c.run();
        assert_eq!(o.code, 0, "{o:?}");
        let lines: Vec<&str> = o.stdout.lines().collect();
        assert!(lines[0] == "loaded" || lines[0] == "OSError True", "{o:?}");
        assert_eq!(&lines[1..], ["threads 1", "python ok"], "{o:?}");
        assert_eq!(o.stderr, "", "{o:?}");
    }
}

#[test]
fn control_on_starts_no_thread_in_an_executable_with_its_own_malloc() {
    let f = fixture("own_malloc", &[]);
    let plain = Cmd::new(&f, [""; 0]).run();
    let o = Cmd::new(&f, [""; 0])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, plain.stdout.as_str(), ""),
        "MEMSHIM_CONTROL=on must not start the shim's thread where it does not interpose malloc"
    );
}
