//! The aarch64 wheel, smoke-tested under qemu-user (Debian's
//! qemu-user-static, with Debian's arm64 glibc from libc6-arm64-cross):
//! the packaged library loads into aarch64 programs and takes their malloc,
//! jemalloc runs with 64 KiB pages (so it also starts on 64 KiB-page
//! kernels), and the packaged aarch64 memshim-ctl reaches an aarch64 shimmed
//! process. The fixtures are compiled for aarch64 with zig (`make tools`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use memshim_tests::deploy::fresh_dir;
use memshim_tests::wheel::{
    assert_glibc_floor, assert_stubless, build_wheels, tools_python, workspace_version,
};
use memshim_tests::{Cmd, fixture_up_to_date, root, run_ok, scratch, wait_until};

const QEMU: &str = "qemu-aarch64-static";
const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// The packaged `memshim` directories of the two aarch64 wheels, each
/// installed by pip (for aarch64) into scratch.
struct Unpacked {
    glibc_2_17: PathBuf,
    glibc_2_34: PathBuf,
}

/// The aarch64 wheels installed, or None (with a SKIP line) where rustup has
/// no aarch64 standard library to build them with.
fn unpacked() -> Option<&'static Unpacked> {
    static W: OnceLock<Option<Unpacked>> = OnceLock::new();
    W.get_or_init(|| {
        let o = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .output();
        let have = o.is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == "aarch64-unknown-linux-gnu")
        });
        if !have {
            eprintln!(
                "SKIP aarch64 wheel: rustup has no aarch64-unknown-linux-gnu standard library \
                 (make test-deps runs `rustup target add`, which needs its download server)"
            );
            return None;
        }
        for need in [Path::new("/usr/bin/qemu-aarch64-static"), Path::new(SYSROOT)] {
            assert!(
                need.exists(),
                "{} is missing: `make test-deps` installs it (Debian packages qemu-user-static, libc6-arm64-cross)",
                need.display()
            );
        }
        let wheels = build_wheels("aarch64");
        let [glibc_2_17, glibc_2_34] =
            [(&wheels.glibc_2_17, "2.17"), (&wheels.glibc_2_34, "2.34")].map(|(w, floor)| {
                let dir = fresh_dir(&format!("aarch64-wheel-{floor}"));
                memshim_tests::wheel::pip_install_for(w, &dir);
                dir.join("memshim")
            });
        Some(Unpacked {
            glibc_2_17,
            glibc_2_34,
        })
    })
    .as_ref()
}

/// `tests/fixtures/<name>.c` compiled for aarch64 (glibc 2.17) with zig cc,
/// unless an earlier run compiled it from the files as they are.
fn fixture_aarch64(name: &str) -> PathBuf {
    let src = root().join("tests/fixtures").join(format!("{name}.c"));
    let out = scratch().join(format!("{name}-aarch64"));
    if fixture_up_to_date(&out, &src) {
        return out;
    }
    run_ok(
        Command::new(tools_python())
            .args(["-m", "ziglang", "cc", "-target", "aarch64-linux-gnu.2.17"])
            .args(["-O1", "-Wall", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-ldl"),
        format_args!("zig cc {}", src.display()),
    );
    out
}

/// `qemu-aarch64-static -L <arm64 sysroot> prog args...`.
fn qemu<S: AsRef<std::ffi::OsStr>>(prog: &Path, args: impl IntoIterator<Item = S>) -> Cmd {
    let mut c = Cmd::new(QEMU, ["-L", SYSROOT]);
    c.command().arg(prog).args(args);
    c
}

#[test]
fn aarch64_binaries_need_no_glibc_newer_than_their_wheels_tag() {
    let Some(u) = unpacked() else { return };
    for pkg in [&u.glibc_2_17, &u.glibc_2_34] {
        for bin in [
            "lib/libmemshim.so",
            "lib/libmemshim_bridge.so",
            "bin/memshim-ctl",
        ] {
            let p = pkg.join(bin);
            let o = Cmd::new("file", ["-b"]).arg_path(&p).run();
            assert!(o.stdout.contains("ARM aarch64"), "{bin}: {o:?}");
            if pkg == &u.glibc_2_34 && bin.starts_with("lib/") {
                assert_stubless(&p);
            } else {
                assert_glibc_floor(&p, (2, 17));
            }
        }
    }
}

#[test]
fn aarch64_library_routes_malloc_to_jemalloc_with_64k_pages() {
    let Some(u) = unpacked() else { return };
    for pkg in [&u.glibc_2_17, &u.glibc_2_34] {
        routes_malloc_with_64k_pages(&pkg.join("lib/libmemshim.so"));
    }
}

/// What `aarch64_library_routes_malloc_to_jemalloc_with_64k_pages` checks, for one wheel's library.
fn routes_malloc_with_64k_pages(lib: &Path) {
    let f = fixture_aarch64("alloc_matrix");
    let plain = qemu(&f, ["usable"]).run();
    assert_eq!(
        (plain.code, plain.stdout.trim()),
        (0, "24"),
        "glibc's usable size on aarch64: {plain:?}"
    );
    let o = qemu(&f, ["usable"]).env("LD_PRELOAD", lib).run();
    assert_eq!(
        (o.code, o.stdout.trim(), o.stderr.as_str()),
        (0, "8", ""),
        "{o:?}"
    );
    // Every allocator with every compatible free, through the shim.
    let o = qemu(&f, ["--all"]).env("LD_PRELOAD", lib).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!(o.stdout.trim(), "matrix ok 560", "{o:?}");
    // jemalloc's compiled page size is 64 KiB (the kernel here has 4 KiB
    // pages: a 64 KiB build runs on both, a 4 KiB build only on 4 KiB).
    let o = qemu(&f, ["usable"])
        .env("LD_PRELOAD", lib)
        .env(
            "MEMSHIM_MALLOC_CONF",
            "stats_print:true,stats_print_opts:mdablxe",
        )
        .run();
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stderr.lines().any(|l| l.trim() == "Page size: 65536"),
        "jemalloc's page size is not 64 KiB: {}",
        o.stderr
    );
}

#[test]
fn aarch64_memshim_ctl_reads_stats_of_an_aarch64_shimmed_process() {
    let Some(u) = unpacked() else { return };
    let pkg = &u.glibc_2_34;
    let lib = pkg.join("lib/libmemshim.so");
    let ctl = pkg.join("bin/memshim-ctl");
    let ver = workspace_version();
    let o = qemu(&ctl, ["--version"]).run();
    assert_eq!(o.stdout.trim(), format!("memshim-ctl {ver}"), "{o:?}");

    let sockdir = memshim_tests::socket_dir_path("aarch64-sock");
    let mut host = qemu(&fixture_aarch64("deploy_wait"), [""; 0])
        .env("LD_PRELOAD", &lib)
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", &sockdir)
        .spawn();
    let line = host.wait_for_line("ready", Duration::from_secs(30));
    let pid = line.split_whitespace().nth(1).unwrap().to_owned();
    assert_eq!(pid, host.pid().to_string(), "qemu-user keeps the pid");
    let stats = wait_until(Duration::from_secs(30), || {
        let o = qemu(&ctl, ["stats", "--json", &pid])
            .env("MEMSHIM_SOCKET_DIR", &sockdir)
            .run();
        (o.code == 0).then_some(o)
    })
    .unwrap_or_else(|| {
        let o = qemu(&ctl, ["stats", "--json", &pid])
            .env("MEMSHIM_SOCKET_DIR", &sockdir)
            .run();
        panic!("aarch64 memshim-ctl stats never answered: {o:?}")
    });
    let j: serde_json::Value = serde_json::from_str(&stats.stdout).unwrap();
    assert_eq!(j["config"]["shim_version"], ver.as_str(), "{j}");
    assert!(j["allocator"]["resident"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(j["config"]["interposed"], true, "{j}");
    let out = host.finish(Duration::from_secs(30));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{out:?}");
}

trait ArgPath {
    fn arg_path(self, p: &Path) -> Self;
}

impl ArgPath for Cmd {
    fn arg_path(mut self, p: &Path) -> Self {
        self.command().arg(p);
        self
    }
}
