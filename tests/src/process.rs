//! Running the programs under test: [`Cmd`] runs one to its end and
//! captures its [`Output`]; [`Child`] is a long-running one, killed and
//! reaped on drop; [`exit_instants`] times exits.

use crate::{poll_every, shim, stress, wait_until};
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
