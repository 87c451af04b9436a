//! Link flags for libmemshim.so.
//!
//! * `--wrap=secure_getenv`: jemalloc reads its configuration with
//!   `secure_getenv("_RJEM_MALLOC_CONF")` exactly once, inside its own
//!   initialisation, on the first allocation of the process. Wrapping that one
//!   call is how `MEMSHIM_*`, `MALLOC_CONF` and `MEMSHIM_MALLOC_CONF` reach
//!   jemalloc before `main` without adding anything to the allocation path
//!   (see `src/options.rs`).
//! * `-z nodelete`: if someone `dlopen`s the library and later `dlclose`s it,
//!   the atfork handlers and the exported symbols must stay mapped.
//! * `-z now`: resolve everything at load time, so no lazy PLT resolution
//!   (which can allocate) ever runs inside `malloc`.
//! * The unwinder is linked statically (`libgcc_eh.a`) instead of depending
//!   on `libgcc_s.so.1`: that library's constructor (`__cpu_indicator_init`)
//!   runs a few dozen `cpuid` instructions, and `cpuid` traps to the
//!   hypervisor in a VM; loading it cost about 75 µs of every exec there
//!   (bench/FINDINGS-issue15.md). Nothing of the unwinder is exported, and
//!   with `panic = "abort"` it only serves backtraces. Native builds only:
//!   the wheels (`make wheel`, zig, glibc 2.17) set `MEMSHIM_DYNAMIC_LIBGCC`
//!   and keep `libgcc_s.so.1`, as does a compiler without `libgcc_eh.a`.
//! * `MEMSHIM_JE_TCACHE_MAX_LIMIT`: the largest `tcache_max` this build's
//!   jemalloc accepts (5.3.1 clips larger values silently; see
//!   `options::tcache_clipped`).
fn main() {
    static_unwinder();
    tcache_limit();
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=secure_getenv");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmemshim.so");
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

/// std's `unwind` crate asks for `-lgcc_s`. A directory searched first that
/// holds a `libgcc_s.so` linker script naming `libgcc_eh.a` makes that
/// `-lgcc_s` resolve to the static unwinder.
fn static_unwinder() {
    println!("cargo:rerun-if-env-changed=MEMSHIM_DYNAMIC_LIBGCC");
    println!("cargo:rerun-if-env-changed=CC");
    // Native builds only: the host compiler's `libgcc_eh.a` is for the host,
    // and may use glibc calls newer than a wheel's floor (gcc 12's uses
    // `_dl_find_object`, glibc 2.35).
    let target = std::env::var("TARGET").unwrap_or_default();
    let native = std::env::var("HOST").is_ok_and(|h| h == target);
    if !native
        || !target.contains("linux-gnu")
        || std::env::var_os("MEMSHIM_DYNAMIC_LIBGCC").is_some()
    {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = std::process::Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !std::path::Path::new(&path).is_absolute() {
        return; // the compiler does not know the file: keep libgcc_s.so.1
    }
    let dir = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("static-unwind");
    let _ = std::fs::create_dir_all(&dir);
    if std::fs::write(dir.join("libgcc_s.so"), format!("INPUT({path})\n")).is_ok() {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
}
