//! Harness for memshim's integration tests: real processes under
//! `LD_PRELOAD`, real `/proc`, real sockets. No mocks.
//!
//! * [`shim`] / [`ctl`]: the release artifacts (`make` builds them;
//!   `MEMSHIM_TEST_LIB` / `MEMSHIM_TEST_CTL` override, for installed copies).
//! * [`fixture`]: compiles a C file from `tests/fixtures/` once per run.
//! * [`python`]: the real CPython binary (not pyenv's bash shim).
//! * [`Cmd`]: runs a command with or without the shim and captures the result.
//! * [`Child`]: a long-running process, killed and reaped on drop.
//! * [`wait_until`]: readiness by polling, never a bare sleep.
//! * [`copy_executable`]: a program at another path, without the "text file
//!   busy" race.
//!
//! Helpers of the test families: [`endpoint`] (the socket and a protocol
//! connection, through `memshim_proto`'s client), [`control`], [`py`],
//! [`cgroups`], [`deploy`], [`wheel`] and [`stress`]; [`sid`]: Debian
//! sid's CPythons, run chrooted in the root scripts/test-deps.sh builds;
//! [`serial`]: the tests that must not run beside each other.

pub mod cgroups;
pub mod control;
pub mod cpython;
pub mod deploy;
pub mod endpoint;
mod fixtures;
mod process;
mod procinfo;
pub mod py;
pub mod serial;
pub mod sid;
pub mod stress;
pub mod vm;
mod wait;
pub mod wheel;

pub use fixtures::*;
pub use process::*;
pub use procinfo::*;
pub use wait::*;

use std::path::{Path, PathBuf};

/// Workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn artifact(env: &str, rel: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let p = root().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `make` first (or set {env})",
        p.display()
    );
    p
}

/// Path of libmemshim.so: the cargo build, or the one `MEMSHIM_TEST_LIB`
/// names (`make test-shipped`: the wheel's). The first call of a test
/// binary names it on stderr, past libtest's capture.
pub fn shim() -> PathBuf {
    static NAMED: std::sync::Once = std::sync::Once::new();
    let p = artifact("MEMSHIM_TEST_LIB", "target/release/libmemshim.so");
    NAMED.call_once(|| {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "memshim-tests: libmemshim.so under test: {}",
            build_of(&p)
        );
    });
    p
}

/// Which build of libmemshim.so the tests preload, for their messages:
/// "the cargo build (target/release/libmemshim.so)" or "the wheel's build
/// (target/x86_64-unknown-linux-gnu/release/libmemshim.so)".
pub fn build_under_test() -> String {
    build_of(&shim())
}

fn build_of(lib: &Path) -> String {
    let shown = lib.strip_prefix(root()).unwrap_or(lib).display();
    let kind = if lib == root().join("target/release/libmemshim.so") {
        "the cargo build"
    } else if lib.starts_with(root().join("target"))
        && lib.to_string_lossy().contains("-linux-gnu/")
    {
        "the wheel's build"
    } else {
        "an installed copy"
    };
    format!("{kind} ({shown})")
}

/// Path of memshim-ctl.
pub fn ctl() -> PathBuf {
    artifact("MEMSHIM_TEST_CTL", "target/release/memshim-ctl")
}

/// Directory for compiled fixtures and scratch files of this test run.
pub fn scratch() -> PathBuf {
    let d = root().join("target/test-scratch");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A directory path for one test's control sockets (or one it plants a
/// file at), `/tmp/ms-<pid>-<tag>`, with whatever a previous run left
/// there removed; not created. Never under the checkout: its path may be
/// long, and a socket directory may be at most
/// [`MAX_SOCKET_DIR`](memshim_proto::endpoint::MAX_SOCKET_DIR) bytes, the
/// shim's limit (a longer `MEMSHIM_SOCKET_DIR` is refused, with a warning,
/// for the default directory; a checkout under `/tmp/tmp.XXXXXXXXXX/memshim` made
/// `target/test-scratch/sock-reach-3.12-condition` 73 bytes long).
pub fn socket_dir_path(tag: &str) -> PathBuf {
    use memshim_proto::endpoint::MAX_SOCKET_DIR;
    let d = PathBuf::from(format!("/tmp/ms-{}-{tag}", std::process::id()));
    assert!(
        d.as_os_str().len() <= MAX_SOCKET_DIR - 20,
        "{}: leave room for a path below it within {MAX_SOCKET_DIR} bytes",
        d.display()
    );
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_file(&d);
    d
}

/// Copies of `files`, mode 0755, in `dir` (created, mode 0755), as paths:
/// what another uid can run where the checkout lies under a directory only
/// root can enter (a `mktemp -d` clone is mode 0700).
pub fn reachable_by_any_uid(dir: &Path, files: &[PathBuf]) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    files
        .iter()
        .map(|f| {
            let to = dir.join(f.file_name().unwrap());
            std::fs::copy(f, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
            to.to_str().unwrap().to_owned()
        })
        .collect()
}

/// Prints `SKIP: <what>` on the test process's stderr, past libtest's
/// capture (which keeps what `eprintln!` prints in a passing test to
/// itself): a test that returns without testing must say so in every run.
pub fn skip(what: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIP: {what}");
}

/// Whether `tool` is an executable file in a directory of `PATH`.
pub fn have(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            std::fs::metadata(d.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}
