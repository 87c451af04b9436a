//! The library as a source build links it where the linker is GNU ld, not
//! lld: `cargo build` on aarch64 (rust-lld is Rust's default on x86_64
//! Linux only), a toolchain without rust-lld, or `-C link-arg=-fuse-ld=bfd`.
//! shim/link.ld is read by both linkers. GNU ld counted a section the
//! script placed before `.data` as part of RELRO, and the constructor's
//! first write to it crashed every process (SIGSEGV) before `main`.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use memshim_tests::{Cmd, python, root, scratch};

/// `cargo build --release -p memshim`, linked by GNU ld, in a target
/// directory of its own.
fn gnu_ld_build() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = scratch().join("gnu-ld");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let args = [
            "build",
            "--release",
            "--locked",
            "-p",
            "memshim",
            "--target-dir",
        ];
        let mut cmd = Cmd::new(
            cargo,
            args.map(OsStr::new).into_iter().chain([dir.as_os_str()]),
        )
        .dir(root())
        .env("RUSTFLAGS", "-C link-arg=-fuse-ld=bfd");
        cmd.command().env_remove("CARGO_ENCODED_RUSTFLAGS");
        let o = cmd.run_timeout(Duration::from_secs(900));
        assert_eq!(o.code, 0, "cargo build with GNU ld: {o:?}");
        let lib = dir.join("release/libmemshim.so");
        // rust-lld and zig's lld say so in `.comment`; GNU ld writes nothing.
        let o = Cmd::new(
            "readelf",
            [OsStr::new("-p"), OsStr::new(".comment"), lib.as_os_str()],
        )
        .run();
        assert!(
            !o.stdout.contains("LLD"),
            "{lib:?} was linked by lld, not GNU ld:\n{}",
            o.stdout
        );
        lib
    })
}

#[test]
fn programs_run_under_the_library_gnu_ld_links() {
    let lib = gnu_ld_build();
    let o = Cmd::new("/bin/true", [] as [&str; 0])
        .env("LD_PRELOAD", lib)
        .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "/bin/true: {o:?}");
    // A shell's fork and exec, with allocations between.
    let o = Cmd::new(
        "bash",
        [
            "-c",
            "for i in $(seq 20); do x=$(printf '%0500d' $i); /bin/true; done; echo ok",
        ],
    )
    .env("LD_PRELOAD", lib)
    .run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, "ok\n", ""),
        "bash loop: {o:?}"
    );
    let src = "import subprocess\n\
               b = [bytearray(i * 97) for i in range(3000)]\n\
               print(sum(map(len, b)))\n\
               print(subprocess.run(['/bin/true']).returncode)\n";
    let o = Cmd::new(python(), ["-c", src]).env("LD_PRELOAD", lib).run();
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (0, "436354500\n0\n", ""),
        "python: {o:?}"
    );
}
