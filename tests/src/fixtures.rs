//! The programs the tests run and the files they need: C fixtures compiled
//! once per run, the real CPython, copies of executables, a private `/tmp`,
//! the cache scripts/test-deps.sh fills.

use crate::{root, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Compiles `tests/fixtures/<name>.c` with `extra` flags, unless the last
/// build is newer than it and than every header beside it, and returns the
/// executable (or `.so` if `extra` contains `-shared`).
pub fn fixture(name: &str, extra: &[&str]) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let src = root().join("tests/fixtures").join(format!("{name}.c"));
    let shared = extra.contains(&"-shared");
    let tag = if extra.is_empty() {
        String::new()
    } else {
        format!("-{:x}", hash(extra))
    };
    let out = scratch().join(if shared {
        format!("lib{name}{tag}.so")
    } else {
        format!("{name}{tag}")
    });
    if !fixture_up_to_date(&out, &src) {
        let mut cmd = Command::new("cc");
        cmd.args(["-O1", "-g", "-Wall", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .args(extra);
        if !shared {
            cmd.args(["-ldl"]);
        }
        let o = cmd.output().expect("run cc");
        assert!(
            o.status.success(),
            "compiling {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    out
}

/// The headers fixtures include (`tests/fixtures/*.h`): a fixture older than
/// any of them is compiled again.
fn headers() -> &'static [PathBuf] {
    static H: OnceLock<Vec<PathBuf>> = OnceLock::new();
    H.get_or_init(|| {
        let dir = root().join("tests/fixtures");
        let mut h: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "h"))
            .collect();
        h.sort();
        h
    })
}

/// Whether `out`, compiled from the fixture `src`, is no older than it and
/// than every header of `tests/fixtures`.
pub fn fixture_up_to_date(out: &Path, src: &Path) -> bool {
    up_to_date(out, src) && headers().iter().all(|h| up_to_date(out, h))
}

/// Whether `out` exists and is no older than `src`, from which it is made.
fn up_to_date(out: &Path, src: &Path) -> bool {
    out.metadata()
        .and_then(|o| Ok(o.modified()? >= src.metadata()?.modified()?))
        .unwrap_or(false)
}

fn hash(parts: &[&str]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// The real python3 binary (pyenv's `python3` is a bash script that runs
/// several processes; tests want one process). `MEMSHIM_TEST_PYTHON` overrides.
pub fn python() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        if let Some(p) = std::env::var_os("MEMSHIM_TEST_PYTHON") {
            return PathBuf::from(p);
        }
        let o = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .env_remove("LD_PRELOAD")
            .output()
            .expect("python3 on PATH");
        PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
    })
    .clone()
}

/// Every CPython under `~/.pyenv/versions` as (version, executable).
pub fn pyenv_pythons() -> Vec<(String, PathBuf)> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(home.join(".pyenv/versions")) {
        for e in rd.flatten() {
            let v = e.file_name().to_string_lossy().into_owned();
            let mm: Vec<&str> = v.split('.').collect();
            if mm.len() < 2 {
                continue;
            }
            let exe = e.path().join(format!("bin/python{}.{}", mm[0], mm[1]));
            if exe.exists() {
                out.push((v, exe));
            }
        }
    }
    out.sort();
    out
}

/// A `sh -c` prefix for tests that give a process a private `/tmp` (in its
/// own mount namespace), the way a container has one. The files are opened
/// *before* `mount -t tmpfs ... /tmp` and copied into the new `/tmp/.memshim/<n>/`
/// (executable), because the checkout itself may live under `/tmp` and
/// would be hidden by the mount. Returns the prefix (ending in `&& `) and
/// the new paths, in order.
pub fn private_tmp_prefix(files: &[&Path]) -> (String, Vec<String>) {
    let mut open = String::new();
    let mut copy = String::new();
    let mut paths = vec![];
    for (i, f) in files.iter().enumerate() {
        let fd = 3 + i;
        // One directory per file keeps each file name as it was (memshim-ctl
        // recognises the library by its name in /proc/<pid>/maps).
        let name = format!(
            "/tmp/.memshim/{i}/{}",
            f.file_name().unwrap().to_string_lossy()
        );
        open += &format!("exec {fd}<'{}' && ", f.display());
        copy += &format!(
            "mkdir /tmp/.memshim/{i} && cat <&{fd} > '{name}' && chmod 0755 '{name}' && exec {fd}<&- && "
        );
        paths.push(name);
    }
    (
        format!("{open}mount -t tmpfs tmpfs /tmp && mkdir /tmp/.memshim && {copy}"),
        paths,
    )
}

/// Where scripts/test-deps.sh keeps what it fetches outside the checkout
/// (the sid root, the VM kernels): `$MEMSHIM_CACHE_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/memshim`, as the script computes it.
pub fn cache_dir() -> PathBuf {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    nonempty("MEMSHIM_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            nonempty("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(nonempty("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
                })
                .join("memshim")
        })
}

/// Runs `cmd` to its end and returns its output; a command that cannot
/// start or fails panics with `what` and its stderr.
pub fn run_ok(cmd: &mut Command, what: impl std::fmt::Display) -> std::process::Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Copies the executable `src` to `dst`, for tests that run a program from
/// another path.
///
/// The copy is written by a `cp` process, never by this one. A file this
/// process had open for writing would be inherited by every child another
/// test thread forks meanwhile (until that child execs), and running the
/// file then fails with "text file busy" (ETXTBSY): the classic race of
/// multi-threaded test harnesses. `cp` exits before we run the copy, and
/// nothing else holds the file open for writing.
pub fn copy_executable(src: &Path, dst: &Path) {
    let _ = std::fs::remove_file(dst);
    run_ok(
        Command::new("cp")
            .arg("--")
            .arg(src)
            .arg(dst)
            .env_remove("LD_PRELOAD"),
        format_args!("cp {} {}", src.display(), dst.display()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_copied_by_the_harness_run_while_other_threads_fork() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let forker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = Command::new("/bin/true").status();
                }
            })
        };
        let d = scratch().join("copy-executable");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut busy = 0;
        for i in 0..300 {
            let p = d.join(format!("true-{i}"));
            copy_executable(Path::new("/bin/true"), &p);
            match Command::new(&p).status() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => busy += 1,
                r => assert!(r.as_ref().is_ok_and(|s| s.success()), "{r:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        forker.join().unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(busy, 0, "text file busy in {busy} of 300 runs");
    }
}
