//! Link flags for libmemshim.so.
//!
//! * `--wrap=secure_getenv`: jemalloc reads its configuration with
//!   `secure_getenv("_RJEM_MALLOC_CONF")` exactly once, inside its own
//!   initialisation, on the first allocation of the process. Wrapping that one
//!   call is how `MEMSHIM_*`, `MALLOC_CONF` and `MEMSHIM_MALLOC_CONF` reach
//!   jemalloc before `main` without adding anything to the allocation path
//!   (see `src/options.rs`).
//! * `--wrap=madvise,mmap,munmap,mprotect,sbrk`: the system calls jemalloc
//!   can make inside `free` keep errno themselves, so `free` forwards with
//!   nothing around it, and a `malloc` that succeeds after a failed try
//!   leaves errno as it was (exports.rs, "jemalloc's system calls keep
//!   errno").
//! * `link.ld` (`-T`, added to the default script by `INSERT`; one file,
//!   as zig passes only the last `-T`): drops jemalloc's constructor, so
//!   jemalloc initialises on the first allocation instead of in every exec
//!   (`src/jemalloc.rs`, "Lazy initialisation and fork"); puts the code
//!   every exec and every fork child runs (`.text.startup`) together, a
//!   page fault where it took seven (`src/exports.rs`, "Start-up pages");
//!   and the statics that code touches on one page (`touched_at_start!`,
//!   `src/lib.rs`).
//! * `--wrap=readlink`: jemalloc's initialisation reads the symbolic link
//!   `/etc/_rjem_malloc.conf` for options; the shim's configuration is the
//!   environment's alone, so that one path reads as absent (`src/exports.rs`).
//! * `--wrap=pthread_atfork`: jemalloc's fork functions, which it registers
//!   during that initialisation, run inside the shim's handlers instead, in
//!   the order they had when jemalloc registered first (same section).
//! * `-z nodelete`: if someone `dlopen`s the library and later `dlclose`s it,
//!   the atfork handlers and the exported symbols must stay mapped.
//! * `-z now`: resolve everything at load time, so no lazy PLT resolution
//!   (which can allocate) ever runs inside `malloc`.
//! * `src/os/unwind.c`, linked whole: hidden definitions of the `_Unwind_*`
//!   functions std imports, which forward to `libgcc_s.so.1` loaded on first
//!   use (`src/os/unwind.rs`). With every import defined here, the linker's
//!   `--as-needed` drops std's `-lgcc_s`, and no exec loads that library.
//! * `src/os/libm.c`, linked the same way: hidden `log`, `exp` and `round`,
//!   the libm functions jemalloc's profiler calls, so no exec loads libm.
//! * `MEMSHIM_JE_TCACHE_MAX_LIMIT`: the largest `tcache_max` this build's
//!   jemalloc accepts (5.3.1 clips larger values silently; see
//!   `options::tcache_clipped`).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(memshim_bridge)");
    tcache_limit();
    unwind_forwarders();
    if std::env::var("CARGO_PKG_NAME").as_deref() == Ok("memshim-bridge") {
        return bridge();
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=secure_getenv");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=pthread_atfork");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=readlink");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{dir}/link.ld");
    for f in ["madvise", "mmap", "munmap", "mprotect", "sbrk"] {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap={f}");
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmemshim.so");
}

/// libmemshim_bridge.so (the `memshim-bridge` package, the same sources):
/// `cfg(memshim_bridge)`, no jemalloc and none of the wraps above, which
/// serve it. `-z nodelete` and `-z now` as for the shim: `detach` leaves the
/// library mapped, and nothing resolves lazily on its thread.
fn bridge() {
    println!("cargo:rustc-cfg=memshim_bridge");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmemshim_bridge.so");
}

/// jemalloc 5.3.1 caps `tcache_max` at `TCACHE_MAXCLASS_LIMIT` =
/// 2^(SC_LG_NGROUP + LG_PAGE + 1) = 8 pages (its `USIZE_GROW_SLOW_THRESHOLD`)
/// and clips larger requests without a word. LG_PAGE is what
/// tikv-jemalloc-sys configures: `JEMALLOC_SYS_WITH_LG_PAGE` (target-prefixed
/// or not) if set, else 16 on aarch64 Linux and 12 elsewhere.
fn tcache_limit() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let prefixed = format!(
        "{}_JEMALLOC_SYS_WITH_LG_PAGE",
        target.to_uppercase().replace('-', "_")
    );
    println!("cargo:rerun-if-env-changed={prefixed}");
    println!("cargo:rerun-if-env-changed=JEMALLOC_SYS_WITH_LG_PAGE");
    let lg_page = std::env::var(&prefixed)
        .or_else(|_| std::env::var("JEMALLOC_SYS_WITH_LG_PAGE"))
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(
            if target.starts_with("aarch64") && target.contains("linux") {
                16
            } else {
                12
            },
        );
    let limit = 1u64 << (2 + lg_page + 1).min(40);
    println!("cargo:rustc-env=MEMSHIM_JE_TCACHE_MAX_LIMIT={limit}");
}

/// Compiles `src/os/unwind.c` and `src/os/libm.c`. `+whole-archive` puts its definitions into
/// the link ahead of std, whose `_Unwind_*` references they then satisfy;
/// unwind tables let an unwinder pass through the forwarders' own frames.
fn unwind_forwarders() {
    // The shim's directory, whichever package (the bridge's is beside it).
    let dir = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("../shim")
        .canonicalize()
        .unwrap();
    let (unwind, libm) = (dir.join("src/os/unwind.c"), dir.join("src/os/libm.c"));
    println!("cargo:rerun-if-changed={}", unwind.display());
    println!("cargo:rerun-if-changed={}", libm.display());
    cc::Build::new()
        .file(unwind)
        .file(libm)
        .flag("-fno-builtin")
        .flag("-funwind-tables")
        .flag("-fvisibility=hidden")
        .warnings(true)
        .extra_warnings(true)
        .cargo_metadata(false)
        .compile("memshim_unwind");
    let out = std::env::var("OUT_DIR").unwrap();
    println!("cargo:rustc-link-search=native={out}");
    println!("cargo:rustc-link-lib=static:+whole-archive=memshim_unwind");
}
