//! The interposed surface: every entry point reaches jemalloc, every
//! compatible pair of allocate/free works, and the library exports exactly
//! the documented symbols.

use memshim_tests::{Cmd, fixture, root, run_ok, shim};
use std::process::Command;

/// Every symbol libmemshim.so defines for the dynamic linker (issue 2,
/// "Interposed surface"; `dlopen` for `RTLD_DEEPBIND` clearing, `pthread_create` for the
/// thread rule, `unshare` and `setns` so a namespace change by a process
/// alone but for the shim's thread finds it stopped, `pthread_exit` and
/// the set*id functions, which stop it too: core/threads.rs; jemalloc's own
/// API, for programs linked to a jemalloc library: compat.rs). A change here is a
/// change to the product's ABI.
const GOLDEN_EXPORTS: &[&str] = &[
    "__libc_calloc",
    "__libc_free",
    "__libc_malloc",
    "__libc_memalign",
    "__libc_pvalloc",
    "__libc_realloc",
    "__libc_valloc",
    "__posix_memalign",
    "aligned_alloc",
    "calloc",
    "cfree",
    "dallocx",
    "dlopen",
    "free",
    "free_aligned_sized",
    "free_sized",
    "initgroups",
    "mallctl",
    "mallctlbymib",
    "mallctlnametomib",
    "mallinfo",
    "mallinfo2",
    "malloc",
    "malloc_info",
    "malloc_stats",
    "malloc_stats_print",
    "malloc_trim",
    "malloc_usable_size",
    "mallocx",
    "mallopt",
    "memalign",
    "nallocx",
    "posix_memalign",
    "pthread_create",
    "pthread_exit",
    "pvalloc",
    "rallocx",
    "realloc",
    "reallocarray",
    "sallocx",
    "sdallocx",
    "setegid",
    "seteuid",
    "setgid",
    "setgroups",
    "setns",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setuid",
    "unshare",
    "valloc",
    "xallocx",
];

/// What `nm ARGS FILE` prints.
fn nm_text(args: &[&str], file: &std::path::Path) -> String {
    let o = run_ok(
        Command::new("nm").args(args).arg(file),
        format_args!("nm {args:?} {file:?}"),
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The symbol names `nm ARGS FILE` lists (its last column), sorted.
fn nm(args: &[&str], file: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = nm_text(args, file)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .collect();
    v.sort();
    v
}

/// What `readelf FLAG FILE` prints.
fn readelf(flag: &str, file: &std::path::Path) -> String {
    let o = run_ok(
        Command::new("readelf").arg(flag).arg(file),
        format_args!("readelf {flag} {file:?}"),
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Address and size of section `name` in `readelf -SW` output.
fn section(sections: &str, name: &str) -> Option<(u64, u64)> {
    let line = sections
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == name))?;
    // [Nr] Name Type Address Off Size ...
    let words: Vec<&str> = line.split(']').nth(1)?.split_whitespace().collect();
    let hex = |i: usize| u64::from_str_radix(words.get(i)?, 16).ok();
    Some((hex(2)?, hex(4)?))
}

/// Where symbol `name` lies in an `nm` table (the line that ends in it).
fn symbol_at(table: &str, name: &str) -> Option<u64> {
    table
        .lines()
        .find(|l| l.ends_with(&format!(" {name}")))
        .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
}

fn dynamic_symbols(defined_only: bool) -> Vec<String> {
    let args: &[&str] = if defined_only {
        &["-D", "--defined-only"]
    } else {
        &["-D"]
    };
    nm(args, &shim())
}

#[test]
fn exported_symbols_match_the_golden_list() {
    let got = dynamic_symbols(true);
    let want: Vec<String> = GOLDEN_EXPORTS.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        got, want,
        "nm -D --defined-only libmemshim.so differs from the golden list"
    );
}

#[test]
fn no_jemalloc_internals_are_exported_or_imported() {
    let leaked: Vec<String> = dynamic_symbols(false)
        .into_iter()
        .filter(|s| s.contains("_rjem_") || s.starts_with("je_"))
        .collect();
    assert!(
        leaked.is_empty(),
        "jemalloc symbols in the dynamic table: {leaked:?}"
    );
}

/// The loader looks up each of the library's imports once per exec. The
/// library is linked `-z now`, so every symbol relocation is bound at load;
/// an import named by both a GOT slot (Rust's calls, full RELRO) and a PLT
/// slot (C compiled without `-fno-plt`) is looked up twice, about 700
/// instructions each time (`.cargo/config.toml`; bench/FINDINGS-startup.md).
/// Where jemalloc's C code was built with the PLT, 23 of its imports were.
/// One pair is the C runtime's, not the library's: gcc's `crtbeginS.o`
/// tests the weak `__cxa_finalize` through the GOT before calling it
/// through the PLT. x86_64 only: on aarch64 rustc calls through the PLT
/// itself, and std names a few weak imports both ways.
#[test]
#[cfg(target_arch = "x86_64")]
fn each_import_is_bound_once() {
    let lib = shim();
    let relocs = readelf("-rW", &lib);
    let mut bound = std::collections::BTreeMap::<&str, Vec<&str>>::new();
    for line in relocs.lines() {
        // Offset Info Type Symbol's-value Symbol's-name + Addend
        let w: Vec<&str> = line.split_whitespace().collect();
        let symbol_reloc =
            w.len() >= 5 && (w[2].ends_with("_GLOB_DAT") || w[2].ends_with("_JUMP_SLOT"));
        if symbol_reloc && !w[4].starts_with("__cxa_finalize@") {
            bound.entry(w[4]).or_default().push(w[2]);
        }
    }
    assert!(
        bound.len() > 50,
        "readelf -rW {lib:?} lists {} symbol relocations; a parse error?\n{relocs}",
        bound.len()
    );
    let twice: Vec<String> = bound
        .iter()
        .filter(|(_, kinds)| kinds.len() > 1)
        .map(|(sym, kinds)| format!("{sym} ({})", kinds.join(", ")))
        .collect();
    assert!(
        twice.is_empty(),
        "{} imports of {lib:?} are bound more than once in every exec: {twice:?}",
        twice.len()
    );
}

/// The control endpoint's system calls (its sockets, its directory, its
/// descriptors, its sleeps) are made without libc (shim/src/os/raw.rs): an
/// import costs every exec of every preloaded process a symbol lookup,
/// and these 24 were the library's own (bench/FINDINGS-startup.md, "The
/// endpoint's imports"). Fails if one comes back as a libc call.
#[test]
fn the_control_endpoint_imports_no_system_call_wrappers() {
    const RAW: [&str; 24] = [
        "accept4",
        "bind",
        "chmod",
        "dup3",
        "eventfd",
        "fchmod",
        "fcntl",
        "fstat",
        "geteuid",
        "getrlimit",
        "getsockname",
        "getsockopt",
        "listen",
        "lstat",
        "mkdir",
        "nanosleep",
        "pipe2",
        "prctl",
        "pread",
        "recv",
        "send",
        "socket",
        "stat",
        "unshare",
    ];
    let imported: Vec<String> = nm(&["-D", "--undefined-only"], &shim())
        .into_iter()
        .filter(|s| RAW.contains(&s.split('@').next().unwrap_or("")))
        .collect();
    assert!(
        imported.is_empty(),
        "{:?} imports {imported:?}: each is a symbol lookup in every exec",
        shim()
    );
}

/// The code every exec runs lies together in `.text.startup`
/// (shim/src/exports.rs, "Start-up pages"; shim/link.ld), in the cargo
/// build (GNU ld or rust-lld) and the wheel's (zig's lld): an exec then
/// faults in one window of the library's code where it took seven
/// (BENCHMARKS.md, "Start-up"). So does what a fork child runs before it
/// execs: the fork child handler, `malloc` and `free`, and jemalloc's entry
/// points behind them (one window where it took four). The exported
/// `malloc` and `free` must be inside the section; where the library keeps
/// its symbol table, the constructor, `options::load`, the child handler and
/// jemalloc's `malloc` and `free` too.
#[test]
fn the_start_up_code_lies_in_one_section() {
    let lib = shim();
    let sections = readelf("-SW", &lib);
    let (addr, size) = section(&sections, ".text.startup")
        .unwrap_or_else(|| panic!("no .text.startup in {lib:?}:\n{sections}"));
    assert!(
        size >= 4096,
        ".text.startup ({size:#x} bytes): too small to hold the start-up path"
    );
    // The kernel maps a library's code 64 KiB around the address that
    // faulted: a larger section would take two faults where it takes one.
    assert!(
        size <= 0x10000,
        ".text.startup ({size:#x} bytes): more than 64 KiB"
    );
    let syms = nm_text(&["-C"], &lib);
    let dynamic = nm_text(&["-D", "--defined-only"], &lib);
    let assert_inside = |name: &str, at: u64| {
        assert!(
            (addr..addr + size).contains(&at),
            "{name} at {at:#x}, outside .text.startup {addr:#x}+{size:#x}"
        );
    };
    for name in ["malloc", "free"] {
        let at = symbol_at(&dynamic, name).unwrap_or_else(|| panic!("{lib:?} exports no {name}"));
        assert_inside(name, at);
    }
    for name in [
        "memshim::exports::constructor",
        "memshim::options::load",
        "memshim::thread::fork::child",
        "_rjem_malloc",
        "_rjem_free",
    ] {
        // In a stripped library only the section's size is checked.
        if let Some(at) = symbol_at(&syms, name) {
            assert_inside(name, at);
        }
    }
}

/// What the loader and every exec's constructor write outside RELRO lies
/// on one page, the one `.data.memshim_touched` starts (shim/link.ld, part
/// 3): every relocation there, and the partial page the loader zeroes where
/// a writable segment's file data ends and its `.bss` begins. Each other page
/// would be a fault in every exec (bench/FINDINGS-startup.md, ninth change).
/// The cargo build (rust-lld) and the wheel's (zig's lld).
#[test]
fn the_data_an_exec_writes_lies_on_one_page() {
    const PAGE: u64 = 4096;
    let lib = shim();
    let hex = |w: &str| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok();
    let headers = readelf("-lW", &lib);
    // Type Offset VirtAddr PhysAddr FileSiz MemSiz Flg Align
    let rows: Vec<Vec<&str>> = headers
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() >= 7 && (w[0] == "LOAD" || w[0] == "GNU_RELRO"))
        .collect();
    let relro_end = rows
        .iter()
        .find(|w| w[0] == "GNU_RELRO")
        .and_then(|w| Some(hex(w[2])? + hex(w[5])?))
        .unwrap_or_else(|| panic!("no GNU_RELRO in {lib:?}:\n{headers}"));
    let mut written = std::collections::BTreeMap::<u64, String>::new();
    for w in rows
        .iter()
        .filter(|w| w[0] == "LOAD" && w[6..].concat().contains('W'))
    {
        let (vaddr, filesz, memsz) = (hex(w[2]).unwrap(), hex(w[4]).unwrap(), hex(w[5]).unwrap());
        let end = vaddr + filesz;
        if memsz > filesz && end % PAGE != 0 && end >= relro_end {
            written.insert(end / PAGE, format!("the loader zeroes from {end:#x}"));
        }
    }
    let sections = readelf("-SW", &lib);
    // Packed relocations (`.relr.dyn`) are listed in another form, which
    // the reading below would skip.
    assert!(
        !sections.contains(".relr.dyn"),
        "{lib:?} packs its relocations; read them here too"
    );
    let relocations = readelf("-rW", &lib);
    let mut read = 0;
    for at in relocations
        .lines()
        .filter_map(|l| hex(l.split_whitespace().next()?))
    {
        read += 1;
        if at >= relro_end {
            written
                .entry(at / PAGE)
                .or_insert_with(|| format!("a relocation at {at:#x}"));
        }
    }
    assert!(read > 1000, "{read} relocations read in {lib:?}");
    let (touched, _) = section(&sections, ".data.memshim_touched")
        .unwrap_or_else(|| panic!("no .data.memshim_touched in {lib:?}:\n{sections}"));
    written.remove(&(touched / PAGE));
    assert!(
        written.is_empty(),
        "{lib:?}: besides the page at {touched:#x}, an exec writes {written:?}"
    );
    // The statics the constructor and the fork handlers write share that
    // page, up to the head of the composed configuration, which comes last
    // (where the library keeps its symbol table).
    if let Some(at) = symbol_at(&nm_text(&["-C"], &lib), "memshim::options::LOADED") {
        assert_eq!(
            at / PAGE,
            touched / PAGE,
            "options::LOADED at {at:#x}, past the page at {touched:#x}"
        );
    }
}

/// std's unwinder imports are forwarded to `libgcc_s.so.1` on first use
/// (shim/src/os/unwind.rs), so an exec under the shim loads no unwinder:
/// not as a dependency, not through an exported or imported `_Unwind_*`.
/// Nor libm: jemalloc's profiler's `log`, `exp` and `round` are the shim's
/// own (shim/src/os/libm.c). A plain program's own map of itself shows it.
#[test]
fn an_exec_under_the_shim_loads_no_unwinder_and_no_libm() {
    let unwind: Vec<String> = dynamic_symbols(false)
        .into_iter()
        .filter(|s| {
            s.starts_with("_Unwind_")
                || s.starts_with("__gcc_")
                || ["log", "exp", "round"]
                    .iter()
                    .any(|f| s.split('@').next() == Some(*f))
        })
        .collect();
    assert!(
        unwind.is_empty(),
        "unwinder symbols in the dynamic table: {unwind:?}"
    );
    let plain = Cmd::new("cat", ["/proc/self/maps"]).run();
    let shimmed = Cmd::new("cat", ["/proc/self/maps"]).shimmed().run();
    assert_eq!((plain.code, shimmed.code), (0, 0), "{shimmed:?}");
    assert!(
        shimmed.stdout.contains("libmemshim.so"),
        "the shim was not loaded: {shimmed:?}"
    );
    for out in [&plain, &shimmed] {
        assert!(
            !out.stdout.contains("libgcc_s") && !out.stdout.contains("/libm."),
            "libgcc_s.so.1 or libm is mapped:\n{}",
            out.stdout
        );
    }
}

/// jemalloc initialises on the first allocation, not in every exec
/// (shim/src/jemalloc.rs, "Lazy initialisation and fork"). Its
/// initialisation opens `/proc/sys/vm/overcommit_memory`, which nothing else
/// in these processes reads: `strace` (scripts/test-deps.sh) shows whether
/// it ran.
#[test]
fn jemalloc_initialises_only_in_a_process_that_allocates() {
    let f = fixture("lazy_init", &[]);
    let initialises = |arg: &str| {
        let preload = format!("LD_PRELOAD={}", shim().display());
        let args = ["-f", "-qq", "-e", "trace=%file", "-E", &preload];
        let mut argv: Vec<&str> = args.to_vec();
        argv.push(f.to_str().unwrap());
        argv.push(arg);
        let o = Cmd::new("strace", argv).run();
        assert_eq!(
            o.code, 0,
            "strace (scripts/test-deps.sh installs it): {o:?}"
        );
        assert!(o.stderr.contains("libmemshim.so"), "not preloaded: {o:?}");
        o.stderr.contains("/proc/sys/vm/overcommit_memory")
    };
    assert!(
        initialises("alloc"),
        "jemalloc did not initialise in a process that allocates, or no longer reads overcommit_memory"
    );
    assert!(
        !initialises(""),
        "jemalloc initialised in a process that never allocates"
    );
}

/// Options in jemalloc's own syntax are checked by jemalloc alone, when it
/// initialises; with such options the shim initialises it at start-up, so a
/// bad one gets its warning line even in a process that never allocates.
#[test]
fn a_bad_jemalloc_option_warns_in_a_process_that_never_allocates() {
    let f = fixture("lazy_init", &[]);
    for (var, val) in [
        ("MEMSHIM_MALLOC_CONF", "narenas:abc"),
        ("MALLOC_CONF", "no_such_option:1"),
    ] {
        let o = Cmd::new(&f, [""; 0]).shimmed().env(var, val).run();
        let lines: Vec<&str> = o.stderr.lines().collect();
        assert_eq!((o.code, lines.len()), (0, 1), "{var}={val}: {o:?}");
        assert!(
            lines[0].starts_with("memshim: warning: jemalloc: Invalid conf")
                && lines[0].contains(val),
            "{var}={val}: {o:?}"
        );
    }
}

/// Every C library function the bundled jemalloc calls, and why it cannot
/// change errno inside `free`: `free` forwards to jemalloc with nothing
/// around it (exports.rs, "jemalloc's system calls keep errno").
const JEMALLOC_IMPORTS: &[(&str, &str)] = &[
    ("madvise", "wrapped: keeps errno"),
    ("mmap", "wrapped: keeps errno"),
    ("munmap", "wrapped: keeps errno"),
    ("mprotect", "wrapped: keeps errno"),
    ("secure_getenv", "wrapped: the configuration hook"),
    ("__ctype_b_loc", "no errno"),
    (
        "_Unwind_Backtrace",
        "heap profiles: a sampled allocation's backtrace (os/unwind.c), never in free",
    ),
    (
        "_Unwind_GetIP",
        "heap profiles: inside _Unwind_Backtrace's callback; no errno",
    ),
    ("_exit", "does not return"),
    (
        "__errno_location",
        "jemalloc sets ENOMEM on failed allocations",
    ),
    ("__popcountdi2", "no errno"),
    ("__sched_cpucount", "no errno"),
    ("abort", "does not return"),
    ("atexit", "start-up only"),
    ("clock_gettime", "sets errno only for a bad clock id"),
    ("close", "heap profiles: prof.dump, on the shim's thread"),
    ("creat", "heap profiles: prof.dump, on the shim's thread"),
    ("dlsym", "background threads only (off)"),
    (
        "exp",
        "the shim's own (os/libm.c): sets no errno; heap profiles' start-up",
    ),
    ("getpid", "no errno"),
    ("gettid", "no errno"),
    ("gettimeofday", "no errno for valid arguments"),
    (
        "log",
        "the shim's own (os/libm.c): sets no errno; a sampled allocation",
    ),
    ("memcmp", "no errno"),
    ("memchr", "no errno"),
    ("memcpy", "no errno"),
    ("memmove", "no errno"),
    ("memset", "no errno"),
    (
        "open",
        "heap profiles: prof.dump reads /proc/self/maps, on the shim's thread",
    ),
    (
        "pthread_atfork",
        "wrapped: its handlers run inside the shim's",
    ),
    ("pthread_cond_init", "background threads only (off)"),
    ("pthread_cond_signal", "background threads only (off)"),
    ("pthread_cond_timedwait", "background threads only (off)"),
    ("pthread_cond_wait", "background threads only (off)"),
    ("pthread_create", "background threads only (off)"),
    (
        "pthread_getname_np",
        "heap profiles' thread names only (prof_sys_thread_name, off)",
    ),
    ("pthread_join", "background threads only (off)"),
    ("pthread_key_create", "start-up only"),
    ("pthread_mutex_init", "returns its error; no errno"),
    ("pthread_mutex_lock", "returns its error; no errno"),
    ("pthread_mutex_trylock", "returns its error; no errno"),
    ("pthread_mutex_unlock", "returns its error; no errno"),
    ("pthread_mutexattr_destroy", "returns its error; no errno"),
    ("pthread_mutexattr_init", "returns its error; no errno"),
    ("pthread_mutexattr_settype", "returns its error; no errno"),
    ("pthread_self", "no errno"),
    ("pthread_setname_np", "background threads only (off)"),
    ("pthread_setspecific", "returns its error; no errno"),
    ("pthread_sigmask", "background threads only (off)"),
    ("readlink", "start-up only (its configuration file)"),
    (
        "round",
        "the shim's own (os/libm.c): sets no errno; heap profiles' start-up",
    ),
    (
        "sbrk",
        "wrapped: keeps errno (the fallback where a mapping failed)",
    ),
    ("sched_getaffinity", "start-up only"),
    ("sched_getcpu", "per-CPU arenas only (off)"),
    ("sched_setaffinity", "background threads only (off)"),
    ("sched_yield", "no errno"),
    ("sigfillset", "background threads only (off)"),
    ("strchr", "no errno"),
    ("strcpy", "no errno"),
    ("strcmp", "no errno"),
    ("strerror_r", "error messages only"),
    ("strlen", "no errno"),
    ("strncmp", "no errno"),
    ("strncpy", "no errno"),
    ("strtok", "start-up only"),
    ("strtol", "start-up only (configuration)"),
    ("syscall", "start-up only (reads /proc and /sys files)"),
    ("sysconf", "start-up only"),
];

#[test]
fn every_c_function_jemalloc_calls_is_known_to_keep_errno_inside_free() {
    // A jemalloc upgrade that calls something new fails here, until someone
    // decides whether it can run inside `free` and change errno (then it
    // needs a wrapper in build.rs and exports.rs).
    let build = root().join("target/release/build");
    let archives: Vec<_> = std::fs::read_dir(&build)
        .expect("target/release/build: build the library first")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("tikv-jemalloc-sys-")
        })
        .map(|e| e.path().join("out/lib/libjemalloc_pic.a"))
        .filter(|a| a.exists())
        .collect();
    assert!(!archives.is_empty(), "no libjemalloc_pic.a under {build:?}");
    for a in archives {
        let mut imports: Vec<String> = nm(&["-u"], &a)
            .into_iter()
            .filter(|s| {
                !s.ends_with(':') && !s.starts_with("_rjem_") && s != "_GLOBAL_OFFSET_TABLE_"
            })
            .collect();
        imports.dedup();
        let unknown: Vec<&String> = imports
            .iter()
            .filter(|s| !JEMALLOC_IMPORTS.iter().any(|(k, _)| k == s))
            .collect();
        assert!(
            unknown.is_empty(),
            "{a:?} calls functions not classified in JEMALLOC_IMPORTS: {unknown:?}"
        );
        assert!(
            imports.iter().any(|s| s == "madvise"),
            "the import list of {a:?} looks wrong: {imports:?}"
        );
    }
}

#[test]
fn matrix_fixture_is_valid_against_glibc() {
    // The fixture itself is correct C: it passes on glibc's allocator.
    let o = Cmd::new(fixture("alloc_matrix", &[]), ["glibc"]).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert!(o.stdout.starts_with("matrix ok "), "{o:?}");
}

#[test]
fn every_allocator_pairs_with_every_compatible_free_under_the_shim() {
    let o = Cmd::new(fixture("alloc_matrix", &[]), ["--all"])
        .shimmed()
        .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    // 16 allocators x 5 frees (free_sized / free_aligned_sized each take
    // only their kind) x 7 sizes.
    assert_eq!(o.stdout.trim(), "matrix ok 560", "{o:?}");
}

#[test]
fn every_allocator_pairs_with_every_compatible_free_with_junk_filling() {
    // junk:true fills freed and fresh memory: a block freed through the
    // wrong path or a size mismatch shows up as changed contents or a crash.
    let o = Cmd::new(fixture("alloc_matrix", &[]), ["--all"])
        .shimmed()
        .env("MEMSHIM_MALLOC_CONF", "junk:true")
        .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!(o.stdout.trim(), "matrix ok 560", "{o:?}");
}

#[test]
fn every_allocator_pairs_with_every_compatible_free_while_big_blocks_are_shared() {
    // With a second thread the shim's thread runs, and blocks of 1 MiB and
    // more (the matrix's 3 MiB) take the shared arena through `mallocx`:
    // the same pairs, contents, alignments, zeroed `calloc` of reused pages
    // and errno; with junk filling, a block freed the wrong way shows.
    for conf in ["", "junk:true"] {
        let mut c = Cmd::new(fixture("alloc_matrix", &[]), ["--all", "--threaded"]).shimmed();
        if !conf.is_empty() {
            c = c.env("MEMSHIM_MALLOC_CONF", conf);
        }
        let o = c.run();
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{conf:?}: {o:?}");
        assert_eq!(o.stdout.trim(), "matrix ok 560", "{conf:?}: {o:?}");
    }
}

#[test]
fn malloc_is_routed_to_jemalloc_size_classes() {
    // jemalloc's smallest size class is 8 bytes; glibc's smallest chunk
    // gives 24 usable bytes on x86_64. Proves malloc really goes to the shim.
    let f = fixture("alloc_matrix", &[]);
    let with = Cmd::new(&f, ["usable"]).shimmed().run();
    let without = Cmd::new(&f, ["usable"]).run();
    assert_eq!((with.code, with.stderr.as_str()), (0, ""), "{with:?}");
    assert_eq!(with.stdout.trim(), "8", "under the shim: {with:?}");
    assert_eq!(without.stdout.trim(), "24", "glibc: {without:?}");
}
