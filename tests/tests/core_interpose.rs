//! The interposed surface: every entry point reaches jemalloc, every
//! compatible pair of allocate/free works, and the library exports exactly
//! the documented symbols.

use memshim_tests::{Cmd, fixture, shim};
use std::process::Command;

/// Every symbol libmemshim.so defines for the dynamic linker (issue 2,
/// "Interposed surface"; `dlopen` for `RTLD_DEEPBIND` clearing, `pthread_create` for the
/// thread rule, `unshare` and `setns` so a namespace change by a process
/// alone but for the shim's thread finds it stopped). A change here is a
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
    "dlopen",
    "free",
    "free_aligned_sized",
    "free_sized",
    "mallinfo",
    "mallinfo2",
    "malloc",
    "malloc_info",
    "malloc_stats",
    "malloc_trim",
    "malloc_usable_size",
    "mallopt",
    "memalign",
    "posix_memalign",
    "pthread_create",
    "pvalloc",
    "realloc",
    "reallocarray",
    "setns",
    "unshare",
    "valloc",
];

fn dynamic_symbols(defined_only: bool) -> Vec<String> {
    let mut cmd = Command::new("nm");
    cmd.arg("-D");
    if defined_only {
        cmd.arg("--defined-only");
    }
    let o = cmd.arg(shim()).output().expect("run nm");
    assert!(
        o.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .collect();
    v.sort();
    v
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
