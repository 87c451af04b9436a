//! Shared by `deploy::wheel` and `deploy::aarch64`: build a wheel with
//! the make target `make test` builds it with (cargo has nothing to build
//! when it is up to date), find it, read the glibc versions a binary needs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::root;

/// `version` of `[workspace.package]` in Cargo.toml: the single source of
/// the CLI's, the library's and the wheel's version.
pub fn workspace_version() -> String {
    let toml = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let section = toml
        .split("[workspace.package]")
        .nth(1)
        .expect("[workspace.package] in Cargo.toml");
    section
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "version").then(|| v.trim().trim_matches('"').to_owned())
        })
        .expect("version in [workspace.package]")
}

/// The two wheels `make` builds for one architecture.
pub struct Wheels {
    /// The directory that holds both, as pip's `--find-links` would see it.
    pub dir: PathBuf,
    /// `manylinux_2_17`: every glibc from 2.17 on.
    pub glibc_2_17: PathBuf,
    /// `manylinux_2_34`: libraries linked against glibc 2.34, which name no
    /// `libpthread.so.0` or `libdl.so.2`; pip prefers it where glibc ≥ 2.34.
    pub glibc_2_34: PathBuf,
}

/// The wheels for `arch`, built as `make test` builds them, then their
/// paths, which must carry exactly the workspace version and the manylinux
/// tags: x86_64 (what a user of this machine installs) by `make
/// wheel-x86_64` into `target/wheels/`; the others by `make wheels` into
/// scratch (`target/wheels/` keeps only wheels this machine can install).
/// `make wheels` builds both architectures in one cargo run, and after
/// `make test`'s own run it has nothing left to build; `make wheel-aarch64`
/// alone would build the aarch64 library and its dependencies again (cargo
/// makes other units for one target than for two: 8 minutes on 2 CPUs).
pub fn build_wheels(arch: &str) -> Wheels {
    let (target, dir) = if arch == "x86_64" {
        ("wheel-x86_64", root().join("target/wheels"))
    } else {
        ("wheels", crate::scratch().join("wheels"))
    };
    crate::deploy::make(target, &[("WHEEL_DIR", &dir)]);
    let [glibc_2_17, glibc_2_34] = ["2_17", "2_34"].map(|floor| {
        let name = format!(
            "memshim-{}-py3-none-manylinux_{floor}_{arch}.whl",
            workspace_version()
        );
        let p = dir.join(&name);
        assert!(
            p.is_file(),
            "make {target} did not write {}; it has {:?}",
            p.display(),
            std::fs::read_dir(&dir)
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
                .unwrap_or_default()
        );
        p
    });
    Wheels {
        dir,
        glibc_2_17,
        glibc_2_34,
    }
}

/// The venv with the wheel build's tools (zig, cargo-zigbuild, auditwheel),
/// made by `make tools`.
pub fn tools_python() -> PathBuf {
    root().join(".tools/venv/bin/python")
}

/// Installs `wheel` into `dir` with pip (`--target`), as pip would on a
/// machine of the wheel's architecture and glibc (`--platform`, the tag in
/// the wheel's name: pip takes no other tag for it), and the files get the
/// modes the wheel gives them.
pub fn pip_install_for(wheel: &Path, dir: &Path) {
    let name = wheel.file_name().unwrap().to_str().unwrap();
    let platform = name
        .strip_suffix(".whl")
        .and_then(|n| n.rsplit('-').next())
        .expect("a wheel's name ends in -<platform>.whl");
    crate::run_ok(
        Command::new(tools_python())
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(["--no-index", "--no-deps", "--only-binary=:all:"])
            .args(["--platform", platform])
            .arg("--target")
            .arg(dir)
            .arg(wheel)
            .env_remove("LD_PRELOAD"),
        format_args!("pip install --platform {platform} {}", wheel.display()),
    );
}

/// What `objdump FLAG bin` prints (it must succeed).
fn objdump(flag: &str, bin: &Path) -> String {
    let o = Command::new("objdump")
        .arg(flag)
        .arg(bin)
        .output()
        .expect("objdump (binutils) on PATH");
    assert!(
        o.status.success(),
        "objdump {flag} {}: {o:?}",
        bin.display()
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every `GLIBC_x.y` version `bin` references (`objdump -T`), sorted; panics
/// on `GLIBC_PRIVATE`, which no distribution promises to keep.
pub fn glibc_versions(bin: &Path) -> Vec<(u32, u32)> {
    let text = objdump("-T", bin);
    assert!(
        !text.contains("GLIBC_PRIVATE"),
        "{} needs GLIBC_PRIVATE",
        bin.display()
    );
    let mut v: Vec<(u32, u32)> = text
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut it = v.split('.');
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect();
    v.sort();
    v.dedup();
    assert!(
        !v.is_empty(),
        "{} references no GLIBC_ version",
        bin.display()
    );
    // An undefined symbol without a version would bind to whatever an old
    // glibc has, or fail the load (BIND_NOW); only weak ones (Rust std's
    // optional gettid/statx, which it checks for null) may go without.
    // objdump's flag columns: "0000000000000000  w   D  *UND*".
    let unversioned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("*UND*") && !l.contains("GLIBC_"))
        .filter(|l| l.get(16..24).is_none_or(|flags| !flags.contains('w')))
        .collect();
    assert!(
        unversioned.is_empty(),
        "{}: strong undefined symbols without a glibc version: {unversioned:#?}",
        bin.display()
    );
    v
}

/// Asserts that `bin` needs no glibc newer than `floor`, its wheel's
/// manylinux tag.
pub fn assert_glibc_floor(bin: &Path, floor: (u32, u32)) {
    let v = glibc_versions(bin);
    let newest = *v.last().unwrap();
    assert!(
        newest <= floor,
        "{} needs GLIBC_{}.{} (all: {v:?}); its wheel promises glibc {}.{}",
        bin.display(),
        newest.0,
        newest.1,
        floor.0,
        floor.1
    );
}

/// The `DT_NEEDED` names of `bin` (`objdump -p`), in order.
pub fn needed(bin: &Path) -> Vec<String> {
    objdump("-p", bin)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("NEEDED"))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// Asserts what the glibc 2.34 wheel's library is for: it names neither of
/// the stub libraries glibc before 2.34 needs, and needs glibc 2.34 at most.
pub fn assert_stubless(lib: &Path) {
    assert_glibc_floor(lib, (2, 34));
    let n = needed(lib);
    assert!(
        !n.iter()
            .any(|n| n == "libpthread.so.0" || n == "libdl.so.2"),
        "{} names {n:?}",
        lib.display()
    );
}
