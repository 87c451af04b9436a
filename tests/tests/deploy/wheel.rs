//! The x86_64 wheels as a user gets them: `make wheel`, then `pip install
//! memshim` offline from the directory that holds both into a fresh venv
//! (pip takes the glibc 2.34 wheel here), then only what the venv has:
//! `memshim-ctl` on PATH, `python -m memshim lib|run`, the in-process API.
//! Also the glibc floor of each wheel's binaries, the 2.17 wheel installed
//! on its own, one version everywhere, and the steps of
//! examples/docker/Dockerfile.wheel run by hand.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use memshim_tests::deploy::{fresh_dir, http, json_num, json_tok};
use memshim_tests::wheel::{
    Wheels, assert_glibc_floor, assert_stubless, build_wheels, workspace_version,
};
use memshim_tests::{Cmd, fixture, python, root, rss_bytes, wait_until};

/// A venv with the wheel installed by pip, offline.
struct Venv {
    dir: PathBuf,
    wheels: Wheels,
}

impl Venv {
    fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }
    fn python(&self) -> PathBuf {
        self.bin("python")
    }
    /// `PATH` with the venv's bin first, as after `source bin/activate`.
    fn path_env(&self) -> String {
        format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }
}

fn make_venv(name: &str) -> PathBuf {
    let dir = fresh_dir(name);
    let o = Cmd::new(python(), ["-m", "venv"]).arg(&dir).run();
    assert_eq!(o.code, 0, "python -m venv: {o:?}");
    dir
}

fn pip_install(venv: &Path, args: &[&str]) {
    let o = Cmd::new(venv.join("bin/python"), ["-m", "pip", "install"])
        .args(["--no-index", "--disable-pip-version-check", "-q"])
        .args(args)
        .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "pip install: {o:?}");
}

/// `pip install memshim` with both wheels in `--find-links`, as from PyPI:
/// pip chooses the wheel for this machine's glibc.
fn venv() -> &'static Venv {
    static V: OnceLock<Venv> = OnceLock::new();
    V.get_or_init(|| {
        let wheels = build_wheels("x86_64");
        let dir = make_venv("wheel-venv");
        // The version pinned: pip takes the newest version before the best
        // tag, and the directory may hold wheels of earlier versions.
        let want = format!("memshim=={}", workspace_version());
        pip_install(&dir, &["--find-links", wheels.dir.to_str().unwrap(), &want]);
        Venv { dir, wheels }
    })
}

/// The packaged `memshim` directory of the venv at `venv`.
fn package(python: &Path) -> PathBuf {
    let o = Cmd::new(python, ["-m", "memshim", "lib"]).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let lib = PathBuf::from(o.stdout.trim_end());
    lib.parent().unwrap().parent().unwrap().to_path_buf()
}

trait CmdExt {
    fn arg(self, a: impl AsRef<std::ffi::OsStr>) -> Self;
    fn args<S: AsRef<std::ffi::OsStr>>(self, a: impl IntoIterator<Item = S>) -> Self;
}

impl CmdExt for Cmd {
    fn arg(mut self, a: impl AsRef<std::ffi::OsStr>) -> Self {
        self.command().arg(a);
        self
    }
    fn args<S: AsRef<std::ffi::OsStr>>(mut self, a: impl IntoIterator<Item = S>) -> Self {
        self.command().args(a);
        self
    }
}

#[test]
fn pip_puts_memshim_ctl_on_path_and_the_library_inside_the_package() {
    let v = venv();
    let o = Cmd::new(
        "sh",
        ["-c", "command -v memshim-ctl && memshim-ctl --version"],
    )
    .env("PATH", v.path_env())
    .run();
    assert_eq!(o.code, 0, "{o:?}");
    let mut lines = o.stdout.lines();
    assert_eq!(lines.next(), Some(v.bin("memshim-ctl").to_str().unwrap()));
    assert_eq!(
        lines.next(),
        Some(format!("memshim-ctl {}", workspace_version()).as_str())
    );

    let o = Cmd::new(v.python(), ["-m", "memshim", "lib"]).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let lib = PathBuf::from(o.stdout.trim_end());
    assert!(lib.is_absolute() && lib.is_file(), "{lib:?}");
    assert!(
        lib.starts_with(&v.dir) && lib.ends_with("site-packages/memshim/lib/libmemshim.so"),
        "python -m memshim lib gave {lib:?}"
    );
    // The library really loads (and is the packaged one).
    let o = Cmd::new("/bin/true", [""; 0]).env("LD_PRELOAD", &lib).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""));

    // A stdout closed at start-up (`>&-`) or full: exit 1, and no Python
    // traceback (`sys.stdout` is None then); the console script still
    // hands over to memshim-ctl.
    let py = v.python().display().to_string();
    for (redirect, what) in [(">&-", "closed"), ("> /dev/full", "full")] {
        for args in ["--version", "lib"] {
            let o = Cmd::new("sh", ["-c", &format!("{py} -m memshim {args} {redirect}")]).run();
            assert_eq!(
                (o.code, o.stderr.as_str()),
                (1, ""),
                "{args}, stdout {what}: {o:?}"
            );
        }
    }
    let o = Cmd::new("sh", ["-c", "memshim-ctl --version >&-"])
        .env("PATH", v.path_env())
        .run();
    assert!(!o.stderr.contains("Traceback"), "{o:?}");
}

#[test]
fn memshim_ctl_run_from_the_venv_routes_malloc_to_the_packaged_library() {
    let v = venv();
    let f = fixture("alloc_matrix", &[]);
    let plain = Cmd::new(&f, ["usable"]).run();
    assert_eq!(plain.stdout.trim(), "24", "glibc: {plain:?}");
    // The console script on PATH, as a user types it.
    let o = Cmd::new("memshim-ctl", ["run", "--"])
        .arg(&f)
        .arg("usable")
        .env("PATH", v.path_env())
        .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!(o.stdout.trim(), "8", "memshim-ctl run: {o:?}");
    // python -m memshim run: the same, with the command's exit status.
    let o = Cmd::new(v.python(), ["-m", "memshim", "run", "--"])
        .arg(&f)
        .arg("usable")
        .run();
    assert_eq!((o.code, o.stdout.trim(), o.stderr.as_str()), (0, "8", ""));
    let o = Cmd::new(
        v.python(),
        ["-m", "memshim", "run", "--", "sh", "-c", "exit 7"],
    )
    .run();
    assert_eq!((o.code, o.stderr.as_str()), (7, ""), "{o:?}");
    // It preloads the packaged file, found beside the packaged memshim-ctl.
    let o = Cmd::new(
        v.python(),
        ["-m", "memshim", "run", "--dry-run", "--", "/bin/true"],
    )
    .run();
    assert_eq!(o.code, 0, "{o:?}");
    let lib = v
        .dir
        .join("lib")
        .read_dir()
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
        .join("site-packages/memshim/lib/libmemshim.so");
    assert!(
        o.stderr.contains(&format!("LD_PRELOAD={}", lib.display())),
        "{o:?}"
    );
}

const API_SCRIPT: &str = r#"
import json, memshim
s = memshim.stats()
blocks = [bytearray(1 << 20) for _ in range(128)]
grown = memshim.stats()
del blocks
freed = memshim.purge()
after = memshim.stats()
print(json.dumps({"s": s, "grown": grown, "freed": freed, "after": after}))
"#;

#[test]
fn the_python_api_reports_and_purges_when_preloaded() {
    let v = venv();
    // Decay off: the freed 128 MiB stays dirty until purge() returns it.
    let o = Cmd::new(
        v.python(),
        [
            "-m",
            "memshim",
            "run",
            "--dirty-ms",
            "-1",
            "--muzzy-ms",
            "0",
            "--",
        ],
    )
    .arg(v.python())
    .args(["-c", API_SCRIPT])
    .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let j: serde_json::Value = serde_json::from_str(o.stdout.trim()).unwrap();
    let n = |k: &str, f: &str| j[k][f].as_u64().unwrap_or_else(|| panic!("{k}.{f}: {j}"));
    for f in [
        "allocated",
        "active",
        "resident",
        "dirty",
        "muzzy",
        "retained",
        "mapped",
        "metadata",
        "purgeable",
    ] {
        n("s", f);
    }
    assert!(n("s", "resident") > 0 && n("s", "allocated") > 0, "{j}");
    assert!(
        n("grown", "allocated") >= n("s", "allocated") + (120 << 20),
        "128 MiB allocated: {j}"
    );
    assert!(j["freed"].as_u64().unwrap() >= 100 << 20, "purge(): {j}");
    assert!(n("after", "dirty") < 8 << 20, "dirty after purge(): {j}");
    assert!(
        j["s"]["library"]
            .as_str()
            .unwrap()
            .ends_with("memshim/lib/libmemshim.so"),
        "{j}"
    );
    assert!(
        j["s"]["jemalloc_version"]
            .as_str()
            .unwrap()
            .starts_with("5.")
    );
}

#[test]
fn the_python_api_says_how_to_preload_when_it_is_not() {
    let v = venv();
    let script = r#"
import memshim
assert not memshim.is_preloaded()
for f in (memshim.stats, memshim.purge):
    try:
        f()
    except memshim.NotPreloadedError as e:
        print(e)
    else:
        raise SystemExit("no error from %s" % f.__name__)
"#;
    let o = Cmd::new(v.python(), ["-c", script]).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{o:?}");
    for l in lines {
        assert!(
            l.contains("not preloaded") && l.contains("python -m memshim run"),
            "{l}"
        );
    }
}

/// On glibc 2.34 and later pip installs the 2.34 wheel, and a preloaded
/// process maps no stub library: what that wheel is for.
#[test]
fn pip_installs_the_glibc_2_34_wheel_here_and_preloaded_processes_map_no_stub_library() {
    // SAFETY: glibc returns a static C string.
    let glibc = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let glibc = glibc.to_string_lossy();
    let mut parts = glibc.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
    if (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (2, 34) {
        eprintln!("SKIP: glibc {glibc}: pip takes the manylinux_2_17 wheel here");
        return;
    }
    let v = venv();
    let pkg = package(&v.python());
    let lib = pkg.join("lib/libmemshim.so");
    assert_eq!(
        std::fs::read(&lib).unwrap(),
        unzip(&v.wheels.glibc_2_34, "memshim/lib/libmemshim.so"),
        "pip did not install the manylinux_2_34 wheel's library"
    );
    assert_stubless(&lib);
    assert_stubless(&pkg.join("lib/libmemshim_bridge.so"));
    assert_glibc_floor(&pkg.join("bin/memshim-ctl"), (2, 17));
    let o = Cmd::new(
        v.bin("memshim-ctl"),
        ["run", "--", "cat", "/proc/self/maps"],
    )
    .run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let real = lib.canonicalize().unwrap();
    assert!(o.stdout.contains(real.to_str().unwrap()), "{}", o.stdout);
    for stub in ["/libpthread.so.0", "/libdl.so.2", "/libpthread-", "/libdl-"] {
        assert!(!o.stdout.contains(stub), "{stub} is mapped:\n{}", o.stdout);
    }
}

/// The 2.17 wheel on its own, as pip installs it where glibc is older than
/// 2.34: its three binaries need no newer glibc, the library routes malloc,
/// and the Python figures come through (`fmemopen` at its old version).
#[test]
fn the_glibc_2_17_wheel_needs_no_newer_glibc_and_routes_malloc() {
    let v = venv();
    let dir = make_venv("wheel-venv-2.17");
    pip_install(&dir, &[v.wheels.glibc_2_17.to_str().unwrap()]);
    let pkg = package(&dir.join("bin/python"));
    for bin in [
        "lib/libmemshim.so",
        "lib/libmemshim_bridge.so",
        "bin/memshim-ctl",
    ] {
        assert_glibc_floor(&pkg.join(bin), (2, 17));
    }
    let f = fixture("alloc_matrix", &[]);
    let o = Cmd::new(dir.join("bin/memshim-ctl"), ["run", "--"])
        .arg(&f)
        .arg("usable")
        .run();
    assert_eq!(
        (o.code, o.stdout.trim(), o.stderr.as_str()),
        (0, "8", ""),
        "{o:?}"
    );
    python_stats(&dir, "wheel-sock-2.17");
}

/// The bytes of `member` in the zip file `wheel`, by Python's zipfile.
fn unzip(wheel: &Path, member: &str) -> Vec<u8> {
    let o = std::process::Command::new(python())
        .args([
            "-c",
            "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))",
        ])
        .arg(wheel)
        .arg(member)
        .output()
        .unwrap();
    assert!(o.status.success(), "unzip {member}: {o:?}");
    o.stdout
}

/// A Python process started by the `memshim-ctl run --control on` of the
/// venv at `venv`, whose main thread keeps running bytecode; its private
/// socket directory.
fn python_host(venv: &Path, name: &str) -> (memshim_tests::Child, PathBuf) {
    let sockdir = memshim_tests::socket_dir_path(name);
    let child = Cmd::new(venv.join("bin/memshim-ctl"), ["run", "--control", "on", "--"])
        .arg(venv.join("bin/python"))
        .args([
            "-c",
            "import time\nx = [str(i) for i in range(200000)]\nprint('ready', flush=True)\nwhile True: time.sleep(0.02)",
        ])
        .env("MEMSHIM_SOCKET_DIR", &sockdir)
        .spawn();
    (child, sockdir)
}

/// `memshim-ctl stats --json` of a Python host started from the venv at
/// `venv`, once it has a python section. pymalloc's arenas are read
/// through fmemopen, which the 2.17 build binds at its pre-2.22 symbol
/// version and the 2.34 build at 2.22's: the figure must be there with
/// either.
fn python_stats(venv: &Path, name: &str) -> serde_json::Value {
    let (mut host, sockdir) = python_host(venv, name);
    host.wait_for_line("ready", Duration::from_secs(30));
    let pid = host.pid().to_string();
    let stats = wait_until(Duration::from_secs(20), || {
        let o = Cmd::new(venv.join("bin/memshim-ctl"), ["stats", "--json", &pid])
            .env("MEMSHIM_SOCKET_DIR", &sockdir)
            .run();
        let j: serde_json::Value = serde_json::from_str(&o.stdout).ok()?;
        j["python"]["pymalloc_arena_bytes"].as_u64().map(|_| j)
    })
    .expect("stats --json with a python section within 20 s");
    let arenas = stats["python"]["pymalloc_arena_bytes"].as_u64().unwrap();
    assert!(
        arenas >= 256 << 10,
        "pymalloc_arena_bytes {arenas}: {stats}"
    );
    stats
}

#[test]
fn one_version_everywhere_and_the_python_figures_come_through() {
    let v = venv();
    let ver = workspace_version();
    let o = Cmd::new(v.python(), ["-m", "memshim", "--version"]).run();
    assert_eq!(o.stdout.trim(), format!("memshim {ver}"));
    let o = Cmd::new(
        v.python(),
        ["-c", "import memshim, importlib.metadata as m; print(memshim.__version__, m.version('memshim'))"],
    )
    .run();
    assert_eq!(o.stdout.trim(), format!("{ver} {ver}"), "{o:?}");

    let stats = python_stats(&v.dir, "wheel-sock-version");
    // The library's own version (hello and stats report CARGO_PKG_VERSION).
    assert_eq!(stats["config"]["shim_version"], ver.as_str(), "{stats}");
}

// --- examples/docker/Dockerfile.wheel ------------------------------------------

fn wheel_dockerfile() -> Vec<String> {
    let df = std::fs::read_to_string(root().join("examples/docker/Dockerfile.wheel")).unwrap();
    df.replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

const FIXED_LIB: &str = "/usr/local/lib/libmemshim.so";

#[test]
fn wheel_dockerfile_has_no_rust_stage_and_preloads_its_fixed_path_last() {
    let ins = wheel_dockerfile();
    let froms: Vec<&String> = ins.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 1, "one stage, no build stage: {froms:?}");
    assert!(
        !ins.iter()
            .any(|l| l.contains("cargo") || l.contains("rust") || l.contains("make ")),
        "no Rust build in the wheel Dockerfile: {ins:#?}"
    );
    let env = ins
        .iter()
        .position(|l| l.starts_with("ENV LD_PRELOAD="))
        .expect("ENV LD_PRELOAD");
    assert_eq!(ins[env], format!("ENV LD_PRELOAD={FIXED_LIB}"));
    let last_run = ins.iter().rposition(|l| l.starts_with("RUN ")).unwrap();
    assert!(
        env > last_run,
        "ENV LD_PRELOAD must follow every RUN: {ins:#?}"
    );
    assert!(
        ins[env + 1..]
            .iter()
            .all(|l| !l.starts_with("RUN ") && !l.starts_with("ONBUILD ")),
        "{ins:#?}"
    );
    let link = ins
        .iter()
        .find(|l| l.starts_with("RUN ") && l.contains("ln -s"))
        .expect("a RUN ln -s step");
    assert!(
        link.contains("\"$(python -m memshim lib)\"") && link.ends_with(FIXED_LIB),
        "{link}"
    );
    let pip = ins
        .iter()
        .find(|l| l.starts_with("RUN ") && l.contains("pip install"))
        .expect("a RUN pip install step");
    assert!(
        pip.contains("--no-index"),
        "installs offline from the copied wheels: {pip}"
    );
}

#[test]
fn wheel_dockerfile_steps_by_hand_give_a_shimmed_app_that_returns_memory() {
    // Build the image's state on the host: COPY target/wheels/ -> a scratch
    // dir, each RUN step through sh with the venv's python and pip first on
    // PATH, /usr/local/lib moved into scratch; then the app under the ENV line.
    let _ = venv(); // the x86_64 wheel is built
    let root_dir = fresh_dir("wheel-docker-steps");
    let venv = make_venv("wheel-docker-venv");
    let wheels = root_dir.join("tmp/wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    for e in std::fs::read_dir(root().join("target/wheels"))
        .unwrap()
        .flatten()
    {
        std::fs::copy(e.path(), wheels.join(e.file_name())).unwrap();
    }
    let usr_local_lib = root_dir.join("usr/local/lib");
    std::fs::create_dir_all(&usr_local_lib).unwrap();
    let ins = wheel_dockerfile();
    let copies: Vec<&String> = ins.iter().filter(|l| l.starts_with("COPY ")).collect();
    assert!(
        copies
            .iter()
            .any(|l| l.as_str() == "COPY target/wheels/ /tmp/wheels/"),
        "{copies:?}"
    );
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for run in ins.iter().filter_map(|l| l.strip_prefix("RUN ")) {
        let script = run
            .replace("/tmp/wheels", wheels.to_str().unwrap())
            .replace("/usr/local/lib", usr_local_lib.to_str().unwrap());
        let o = Cmd::new("sh", ["-c", &script]).env("PATH", &path).run();
        assert_eq!(o.code, 0, "RUN {run}\n{o:?}");
    }
    let lib = usr_local_lib.join("libmemshim.so");
    let target = std::fs::read_link(&lib).expect("the RUN ln -s step made a symlink");
    assert!(target.starts_with(&venv), "{target:?}");

    // CMD under the ENV lines.
    let mut app = Cmd::new(
        venv.join("bin/python"),
        [
            root().join("examples/docker/app.py").to_str().unwrap(),
            "--port",
            "0",
            "--quiet",
        ],
    )
    .env("LD_PRELOAD", &lib)
    .env("MEMSHIM_CONTROL", "on")
    .env("DEMO_LAYERS", "2")
    .spawn();
    // The app imports torch and transformers before it listens: tens of
    // seconds with a cold page cache on a loaded 2-CPU machine (one run
    // timed out at 60 s there).
    let line = app.wait_for_line("listening on", Duration::from_secs(180));
    let addr = line.split_whitespace().nth(2).unwrap().to_owned();
    let pid = app.pid();
    let (code, body) = http(&addr, "POST", "/load");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json_tok(&body, "shim_mapped"), Some("true"), "{body}");
    let loaded = json_num(&body, "rss_bytes").unwrap() as u64;
    let before = json_num(&body, "rss_before").unwrap() as u64;
    let (code, body) = http(&addr, "POST", "/unload");
    assert_eq!(code, 200, "{body}");
    let grown = loaded - before;
    assert!(
        wait_until(Duration::from_secs(20), || (rss_bytes(pid)
            < loaded - grown * 3 / 4)
            .then_some(()))
        .is_some(),
        "RSS stayed at {} MiB after unload (loaded {} MiB)",
        rss_bytes(pid) >> 20,
        loaded >> 20
    );
    let k = Cmd::new("kill", ["-INT", &pid.to_string()]).run();
    assert_eq!(k.code, 0);
    let out = app.finish(Duration::from_secs(20));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{out:?}");
}
