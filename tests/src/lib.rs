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
pub mod deploy;
pub mod endpoint;
pub mod py;
pub mod serial;
pub mod sid;
pub mod stress;
pub mod vm;
pub mod wheel;

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// Compiles `tests/fixtures/<name>.c` (once per process) with `extra` flags
/// and returns the executable (or `.so` if `extra` contains `-shared`).
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
    if !up_to_date(&out, &src) {
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

/// Whether `out` exists and is no older than `src`, from which it is made.
pub fn up_to_date(out: &Path, src: &Path) -> bool {
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

/// Result of a finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit code (128 + signal if killed).
    pub code: i32,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
}

/// A command to run with or without the shim.
pub struct Cmd {
    cmd: Command,
    /// The program runs as the only child of the process started (a pid
    /// namespace's first process: see [`Cmd::program_is_child`]).
    program_is_child: bool,
}

impl Cmd {
    /// `program args...`, with `LD_PRELOAD`, every `MEMSHIM_*` variable and
    /// the allocator and Python settings of the test environment removed
    /// (a CI job's `MALLOC_CONF` or `PYTHONWARNINGS` would change what the
    /// tests compare).
    pub fn new<S: AsRef<OsStr>>(
        program: impl AsRef<OsStr>,
        args: impl IntoIterator<Item = S>,
    ) -> Cmd {
        let mut cmd = Command::new(program);
        cmd.args(args);
        for k in [
            "LD_PRELOAD",
            "MALLOC_CONF",
            "_RJEM_MALLOC_CONF",
            "GLIBC_TUNABLES",
            "PYTHONWARNINGS",
            "PYTHONDEVMODE",
            "PYTHONMALLOC",
        ] {
            cmd.env_remove(k);
        }
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("MEMSHIM_") {
                cmd.env_remove(k);
            }
        }
        // SAFETY: the closure runs in the forked child before exec and
        // calls only `signal`, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                default_signal_dispositions();
                Ok(())
            });
        }
        Cmd {
            cmd,
            program_is_child: false,
        }
    }

    /// Says that the program runs as the only child of the process this
    /// starts (`unshare --pid --fork`): [`Child::pid`] is then the child's.
    pub fn program_is_child(mut self) -> Cmd {
        self.program_is_child = true;
        self
    }

    /// Preloads the shim.
    pub fn shimmed(mut self) -> Cmd {
        self.cmd.env("LD_PRELOAD", shim());
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Cmd {
        self.cmd.env(k, v);
        self
    }

    /// Sets the working directory.
    pub fn dir(mut self, d: impl AsRef<Path>) -> Cmd {
        self.cmd.current_dir(d);
        self
    }

    /// Feeds `input` on stdin.
    pub fn stdin(self, input: &str) -> RunWithInput {
        RunWithInput {
            cmd: self,
            input: input.to_owned(),
        }
    }

    /// Access to the underlying `Command`.
    pub fn command(&mut self) -> &mut Command {
        &mut self.cmd
    }

    /// Runs to completion (killed after `timeout`) and captures output.
    pub fn run_timeout(mut self, timeout: Duration) -> Output {
        self.cmd.stdin(Stdio::null());
        run_captured(self.cmd, None, timeout)
    }

    /// Runs to completion (at most 120 s) and captures output.
    pub fn run(self) -> Output {
        self.run_timeout(Duration::from_secs(120))
    }

    /// Starts it in the background with piped stdout.
    pub fn spawn(mut self) -> Child {
        self.cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.cmd.spawn().expect("spawn");
        let stdout = child.stdout.take().expect("piped stdout");
        Child {
            child,
            stdout,
            pending: Vec::new(),
            label: String::new(),
            program_is_child: self.program_is_child,
            program_pid: std::cell::OnceCell::new(),
        }
    }
}

/// Puts every standard signal's disposition back to the default, in a
/// child about to exec. An ignored disposition survives exec, and test runs
/// inherit some: a shell without job control starts a background command
/// (`bash .ci/run &` in a script) with SIGINT and SIGQUIT ignored, `nohup`
/// ignores SIGHUP, and an ignored SIGCHLD makes a child's children reap
/// themselves. CPython then installs no KeyboardInterrupt handler, and a
/// test that presses Ctrl-C waits for an exit that never comes. The
/// programs under test start as from a terminal, with or without the shim;
/// a test that wants another disposition sets it in its own `pre_exec`,
/// which runs after this one.
fn default_signal_dispositions() {
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: `signal` with SIG_DFL installs no handler.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

/// A command with stdin input.
pub struct RunWithInput {
    cmd: Cmd,
    input: String,
}

impl RunWithInput {
    /// Runs to completion and captures output.
    pub fn run(self) -> Output {
        let mut c = self.cmd.cmd;
        c.stdin(Stdio::piped());
        run_captured(c, Some(self.input), Duration::from_secs(120))
    }
}

fn run_captured(mut c: Command, input: Option<String>, timeout: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    if let Some(i) = input {
        let mut sin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = sin.write_all(i.as_bytes());
        });
    }
    let so = child.stdout.take().unwrap();
    let se = child.stderr.take().unwrap();
    // Both pipes are drained while the process runs (a full pipe would
    // block it); what is left is read once it has exited.
    let (tx, rx) = std::sync::mpsc::channel();
    let tx2 = tx.clone();
    std::thread::spawn(move || tx.send((1, drain(so))));
    std::thread::spawn(move || tx2.send((2, drain(se))));
    let (status, timed_out) = match poll_every(Duration::from_millis(5), timeout, || {
        child.try_wait().unwrap()
    }) {
        Some(s) => (s, false),
        None => {
            let _ = child.kill();
            (child.wait().unwrap(), true)
        }
    };
    // A process it started that outlives it and keeps the pipes open
    // would make the reads wait forever: that fails here instead.
    let mut outs = [Vec::new(), Vec::new()];
    let deadline = Instant::now() + PIPE_GRACE;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((fd, bytes)) => outs[fd - 1] = bytes,
            Err(_) => panic!(
                "{c:?} {} ({status:?}), but its stdout or stderr was still open {PIPE_GRACE:?} \
                 later: a process it started holds it (read so far: stdout {:?}, stderr {:?})",
                if timed_out {
                    format!("did not finish within {timeout:?} and was killed")
                } else {
                    "ended".to_owned()
                },
                String::from_utf8_lossy(&outs[0]),
                String::from_utf8_lossy(&outs[1])
            ),
        }
    }
    if timed_out {
        panic!(
            "{c:?} did not finish within {timeout:?} (status {status:?}, stdout {:?}, stderr {:?})",
            String::from_utf8_lossy(&outs[0]),
            String::from_utf8_lossy(&outs[1])
        );
    }
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let [stdout, stderr] = outs.map(|b| String::from_utf8_lossy(&b).into_owned());
    Output {
        code,
        stdout,
        stderr,
    }
}

/// How long the harness reads a pipe after the process that owned it has
/// exited, before it fails: only a leftover descendant keeps it open.
const PIPE_GRACE: Duration = Duration::from_secs(20);

/// Reads `r` to its end.
fn drain(mut r: impl Read) -> Vec<u8> {
    let mut s = Vec::new();
    let _ = r.read_to_end(&mut s);
    s
}

/// Reads what is left in `r` after its writer exited: to its end, or
/// `None` when it is still open after [`PIPE_GRACE`].
fn drain_exited(r: &mut (impl Read + std::os::fd::AsRawFd), into: &mut Vec<u8>) -> Option<()> {
    let deadline = Instant::now() + PIPE_GRACE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !poll_readable(r.as_raw_fd(), left) {
            return None;
        }
        let mut buf = [0u8; 4096];
        match r.read(&mut buf) {
            Ok(0) => return Some(()),
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Some(()),
        }
    }
}

/// Waits at most `timeout` until `fd` has data (or its end).
fn poll_readable(fd: i32, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd on the stack.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            n if n > 0 => return true,
            0 => return false,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return false,
        }
    }
}

/// A background process; killed (SIGKILL) and reaped on drop.
pub struct Child {
    /// The process.
    pub child: std::process::Child,
    stdout: std::process::ChildStdout,
    /// Bytes read from stdout and not yet returned as a line.
    pending: Vec<u8>,
    /// What the process is, for failure messages (see `labelled`).
    label: String,
    /// See [`Cmd::program_is_child`].
    program_is_child: bool,
    program_pid: std::cell::OnceCell<i32>,
}

impl Child {
    /// Names the process in this helper's failure messages ("CPython
    /// 3.12, main thread in sleep").
    pub fn labelled(&mut self, label: &str) {
        self.label = format!(" ({label})");
    }

    /// Its pid (in this pid namespace); that of the program where it runs
    /// as the child of the process started ([`Cmd::program_is_child`]).
    pub fn pid(&self) -> i32 {
        let pid = self.child.id() as i32;
        if !self.program_is_child {
            return pid;
        }
        *self.program_pid.get_or_init(|| {
            let children = format!("/proc/{pid}/task/{pid}/children");
            wait_until(Duration::from_secs(10), || {
                std::fs::read_to_string(&children)
                    .ok()?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{pid}{} started no child", self.label))
        })
    }

    /// Reads stdout lines until one contains `needle`, and returns that
    /// line. Fails after `timeout` even if the process hangs without
    /// printing (never blocks past it), or at once if stdout ends.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line).trim_end().to_owned();
                if line.contains(needle) {
                    return line;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero() && self.readable(left),
                "process {}{}: no line containing {needle:?} within {timeout:?} (pending output {:?})",
                self.pid(),
                self.label,
                String::from_utf8_lossy(&self.pending)
            );
            let mut buf = [0u8; 4096];
            let n = self.stdout.read(&mut buf).unwrap_or(0);
            if n == 0 {
                let how = self.how_it_ended();
                panic!(
                    "process {}{} ended before printing {needle:?}: {}",
                    self.pid(),
                    self.label,
                    how
                );
            }
            self.pending.extend_from_slice(&buf[..n]);
        }
    }

    /// After stdout ended: how the process ended (waiting up to 10 s for
    /// it to be reaped), with its stderr, for a failure message.
    fn how_it_ended(&mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        let status = poll_every(
            Duration::from_millis(10),
            Duration::from_secs(10),
            || match self.child.try_wait() {
                Ok(None) => None,
                ended => Some(ended.ok().flatten()),
            },
        )
        .flatten();
        let mut err = Vec::new();
        if status.is_some()
            && let Some(mut e) = self.child.stderr.take()
            && drain_exited(&mut e, &mut err).is_none()
        {
            err.extend_from_slice(b" [still open: a process it started holds it]");
        }
        let err = String::from_utf8_lossy(&err);
        let how = match status {
            Some(s) => match (s.code(), s.signal()) {
                (Some(c), _) => format!("exit status {c}"),
                (_, Some(sig)) => {
                    format!("killed by signal {sig} (core dumped: {})", s.core_dumped())
                }
                _ => format!("{s:?}"),
            },
            None => "still not reaped after 10 s".to_owned(),
        };
        format!("{how}; stderr {err:?}")
    }

    /// Waits at most `timeout` until stdout has data (or its end).
    fn readable(&self, timeout: Duration) -> bool {
        use std::os::fd::AsRawFd;
        poll_readable(self.stdout.as_raw_fd(), timeout)
    }

    /// Writes a line to its stdin.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let sin = self.child.stdin.as_mut().expect("piped stdin");
        // One write: `writeln!` would write the line and its newline
        // separately, and a fixture that ends on reading the line closes
        // the pipe before the second write (EPIPE).
        if let Err(e) = sin.write_all(format!("{line}\n").as_bytes()) {
            let pid = self.pid();
            let status = self.child.try_wait();
            let mut err = String::new();
            if let (Ok(Some(_)), Some(se)) = (&status, self.child.stderr.as_mut()) {
                let mut bytes = Vec::new();
                if drain_exited(se, &mut bytes).is_none() {
                    bytes.extend_from_slice(b" [still open: a process it started holds it]");
                }
                err = String::from_utf8_lossy(&bytes).into_owned();
            }
            panic!("sending {line:?} to process {pid}: {e} (status {status:?}, stderr {err:?})");
        }
    }

    /// Closes stdin, waits for exit (at most `timeout`), returns the rest of
    /// stdout, all of stderr, and the exit code.
    pub fn finish(mut self, timeout: Duration) -> Output {
        drop(self.child.stdin.take());
        let status = poll_every(Duration::from_millis(10), timeout, || {
            self.child.try_wait().unwrap()
        })
        .unwrap_or_else(|| {
            panic!(
                "process {}{} did not exit within {timeout:?}; where its threads wait:{}",
                self.pid(),
                self.label,
                thread_report(self.pid())
            )
        });
        let mut rest = std::mem::take(&mut self.pending);
        let mut err = Vec::new();
        let drained = drain_exited(&mut self.stdout, &mut rest).and_then(|()| {
            match self.child.stderr.take() {
                Some(mut e) => drain_exited(&mut e, &mut err),
                None => Some(()),
            }
        });
        assert!(
            drained.is_some(),
            "process {}{} exited ({status:?}), but its stdout or stderr was still open {PIPE_GRACE:?} later: a process it started holds it",
            self.pid(),
            self.label
        );
        let out = String::from_utf8_lossy(&rest).into_owned();
        let err = String::from_utf8_lossy(&err).into_owned();
        use std::os::unix::process::ExitStatusExt;
        Output {
            code: status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            stdout: out,
            stderr: err,
        }
    }
}

/// CLOCK_MONOTONIC in ns: Python's `time.monotonic_ns()` reads the same
/// clock, in any process on the machine.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Waits at most `timeout` until each of `children` has exited, without
/// reaping them ([`Child::finish`] does), and says when each did, in
/// [`monotonic_ns`] (`None`: still running at the timeout). Wakes as each
/// exits (its pidfd becomes readable), for tests that time exits.
pub fn exit_instants(children: &[&Child], timeout: Duration) -> Vec<Option<u64>> {
    let deadline = Instant::now() + timeout;
    let mut at = vec![None; children.len()];
    let mut fds: Vec<libc::pollfd> = children
        .iter()
        .map(|c| libc::pollfd {
            // SAFETY: pidfd_open(pid, 0) returns a new descriptor
            // (close-on-exec) or -1; our children are not reaped yet, so
            // their pids are theirs.
            fd: unsafe { libc::syscall(libc::SYS_pidfd_open, c.pid(), 0) } as i32,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if fds.iter().any(|p| p.fd < 0) {
        // A kernel older than 5.3: each one's zombie state, every millisecond.
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = poll_every(Duration::from_millis(1), left, || {
            for (i, c) in children.iter().enumerate() {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.pid()));
                let zombie = stat
                    .ok()
                    .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')));
                if at[i].is_none() && zombie == Some(true) {
                    at[i] = Some(monotonic_ns());
                }
            }
            at.iter().all(Option::is_some).then_some(())
        });
    } else {
        while at.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: `fds` is a live array of that many pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            let now = monotonic_ns();
            if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
            for (i, p) in fds.iter_mut().enumerate() {
                if p.fd >= 0 && p.revents != 0 {
                    at[i] = Some(now);
                    // SAFETY: the descriptor opened above, closed once;
                    // poll ignores a negative one.
                    unsafe { libc::close(p.fd) };
                    p.fd = -1;
                }
            }
        }
    }
    for p in &fds {
        if p.fd >= 0 {
            // SAFETY: as above.
            unsafe { libc::close(p.fd) };
        }
    }
    at
}

/// Where each thread of the live process `pid` waits, for the message of a
/// test that found it hung: name, state and kernel stack of every thread
/// ([`stress::threads_report`]), then every thread's stack from gdb where
/// gdb is installed (at most 20 s). A hang that shows once in many runs can
/// then be read from the one failure.
fn thread_report(pid: i32) -> String {
    let mut s = stress::threads_report(pid);
    let pid = pid.to_string();
    let gdb = Command::new("timeout")
        .args([
            "20",
            "gdb",
            "-p",
            &pid,
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    if let Some(o) = gdb.ok().filter(|o| o.status.success()) {
        s += "\n";
        s += &String::from_utf8_lossy(&o.stdout);
    }
    s
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_until<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    poll_every(Duration::from_millis(20), timeout, f)
}

/// Calls `f` at once and then every `every` until it returns `Some`, or
/// until `timeout` has passed (then `None`, after a last call). What every
/// wait of the tests is made of, [`wait_until`] first: the one place they
/// sleep, between two looks at the condition they wait for.
pub fn poll_every<T>(
    every: Duration,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Waits (at most 5 s) until `pid` has libmemshim.so mapped: a process
/// just spawned under the shim is still exec'ing before that, and
/// memshim-ctl would call it unshimmed. Panics if it never is.
pub fn wait_shim_mapped(pid: i32) {
    wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .ok()?
            .contains("libmemshim.so")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("libmemshim.so never mapped in pid {pid}"));
}

/// A `key:` line of `/proc/<pid>/status`, in kB or count.
pub fn proc_status(pid: i32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// This machine's transparent huge page mode, as the kernel's `enabled`
/// file selects it: `always`, `madvise` or `never` (`None` without THP).
pub fn thp_mode() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    Some(s.split('[').nth(1)?.split(']').next()?.to_owned())
}

/// Resident set size of `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: i32) -> u64 {
    proc_status(pid, "VmRSS").expect("VmRSS") * 1024
}

/// Number of threads of `pid`.
pub fn threads(pid: i32) -> u64 {
    proc_status(pid, "Threads").expect("Threads")
}

/// Names (`comm`) of the threads of `pid`.
pub fn thread_names(pid: i32) -> Vec<String> {
    let mut v = vec![];
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
                v.push(c.trim().to_owned());
            }
        }
    }
    v
}

/// MiB, for messages.
pub fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
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
