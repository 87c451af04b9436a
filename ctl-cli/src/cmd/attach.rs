//! `memshim-ctl attach <PID> [--idle-return[=MS]] [--json]` and
//! `memshim-ctl detach <PID> [--json]`: the bridge in a running CPython
//! started without the preload (docs/attach.md, "attach").
//!
//! `attach` has the process `dlopen` libmemshim_bridge.so on one of its
//! threads held at a safe point (the `memshim-reach` injector, as the verbs
//! without the preload use it); the library's constructor starts the
//! shim's thread, its socket and the Python bridge, and replaces nothing of
//! the process's (its `malloc` least of all). From then on every verb
//! reaches the process over its socket, as a shimmed one, with no ptrace.
//! `--idle-return` also has the thread return the free heap with the
//! process's own allocator once the process has idled for MS.
//!
//! The process opens the library where it is (the same file in the
//! process's mount namespace), or else a copy placed in its `/tmp` in a
//! directory only its uid may use, and removed once loaded.

use crate::exit::{self, Exit, Failure};
use crate::output::print::{errln, outln};
use crate::reach::client::Client;
use crate::reach::procfs::{self, Loaded, Proc};
use crate::reach::{ptrace, socket, untrusted};
use clap::Args;
use memshim_proto::{DecayResult, DetachResult, Request};
use serde::Serialize;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The library's file name (`attach` finds it beside memshim-ctl).
pub const BRIDGE: &str = "libmemshim_bridge.so";
/// `--idle-return` without a value: the preload's default dirty decay.
const IDLE_RETURN_DEFAULT_MS: &str = "1000";
/// How long the bridge's socket may take to appear after the `dlopen`.
const SOCKET_WAIT: Duration = Duration::from_secs(5);

/// Options of `attach`.
#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Process id (a CPython started without the preload).
    #[arg(value_parser = crate::args::pid_parser())]
    pub pid: i32,
    /// Also return the free heap, with the process's own allocator
    /// (glibc's malloc_trim, or a preloaded jemalloc's, tcmalloc's or
    /// mimalloc's call), once the process has idled this many ms
    /// (default 1000).
    #[arg(long, value_name = "MS", num_args = 0..=1, require_equals = true,
          default_missing_value = IDLE_RETURN_DEFAULT_MS, value_parser = clap::value_parser!(u32).range(1..=86_400_000))]
    pub idle_return: Option<u32>,
    /// Longest wait for a thread of the process to reach a safe point, in seconds.
    #[arg(long, default_value = "2", value_parser = clap::value_parser!(u64).range(1..=60))]
    pub timeout: u64,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Options of `detach`.
#[derive(Args, Debug)]
pub struct DetachArgs {
    /// Process id (one `attach` reached).
    #[arg(value_parser = crate::args::pid_parser())]
    pub pid: i32,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What `attach --json` prints.
#[derive(Serialize, Debug)]
struct Attached {
    pid: i32,
    /// False: the bridge was there and serving already.
    loaded_now: bool,
    /// The thread that ran the `dlopen`, and the system call it was in.
    tid: Option<i32>,
    syscall: Option<&'static str>,
    /// The file the process loaded (as the process names it).
    library: Option<String>,
    /// Its control socket.
    socket: String,
    /// The idle return's interval, ms (`null`: off).
    idle_return_ms: Option<i64>,
    /// How the library got in when no thread was held: "remote debugging
    /// (PEP 768)"; absent for a thread held at a safe point.
    #[serde(skip_serializing_if = "Option::is_none")]
    road: Option<&'static str>,
}

impl Attached {
    /// The process loaded `library` on the thread of `d`.
    fn loaded(&mut self, d: &memshim_reach::Done, library: String) {
        self.tid = Some(d.tid);
        self.syscall = Some(d.syscall);
        self.library = Some(library);
        self.loaded_now = true;
    }
}

/// Connections `attach` opens again when one breaks before the bridge's
/// first answers (a fork of the process closes it).
const CONVERSE_TRIES: u32 = 5;

/// Runs `attach`.
pub fn run_attach(a: AttachArgs) -> Result<Exit, Failure> {
    let pid = a.pid;
    let p = procfs::read_proc(pid)?;
    if procfs::all_threads_exited(pid) {
        return Err(procfs::zombie(&p));
    }
    let mut done = Attached {
        pid,
        loaded_now: false,
        tid: None,
        syscall: None,
        library: None,
        socket: socket::locate(&p).path().display().to_string(),
        idle_return_ms: None,
        road: None,
    };
    let loaded = which_memshim(&p)?;
    if loaded == Loaded::Preloaded {
        return Err(preloaded(pid, "attach"));
    }
    let serving = loaded == Loaded::Attached && Client::open_proc(p.clone()).is_ok();
    // A process that exits meanwhile fails wherever it was: say so.
    let exited = |f: Failure| match procfs::read_proc(pid) {
        Ok(now) if now.starttime == p.starttime && !procfs::all_threads_exited(pid) => f,
        _ => Failure::new(
            exit::NOT_FOUND,
            Some(pid),
            "the process exited during attach",
        ),
    };
    if !serving && procfs::group_stopped(pid) {
        // Its threads run nothing: the `dlopen` would run under ptrace, and
        // the bridge's thread then wait, stopped, until the process goes on.
        return Err(Failure::new(
            exit::NO_SAFE_POINT,
            Some(pid),
            format!(
                "the process is stopped (SIGSTOP or a job-control stop), so the bridge could not start in it; nothing \
                 changed: continue it (`kill -CONT {pid}`), then attach"
            ),
        ));
    }
    if !serving && !procfs::view(pid).join("root/proc/meminfo").exists() {
        // The bridge names its socket by what /proc tells it (its pid as
        // the verbs see it, its start time): without it, it would serve
        // where no verb looks, for the process's life.
        return Err(Failure::new(
            exit::NOT_ATTACHED,
            Some(pid),
            "the process's root has no /proc mounted (a chroot without it), which the bridge needs to name its \
             socket; nothing was changed",
        )
        .hint("mount /proc in its root, or start the process with LD_PRELOAD; the verbs reach it by ptrace meanwhile"));
    }
    // Ctrl-C, `timeout` and the like wait while the library loads: before
    // it has loaded they end memshim-ctl at once, nothing changed; after,
    // it says that the bridge stays before it ends.
    let signals = memshim_reach::Interruptible::hold_ending_searches();
    if !serving && let Err(f) = load(&p, loaded == Loaded::Attached, &a, &mut done) {
        if let Some(sig) = signals.pending() {
            signals.end_with(sig);
        }
        return Err(exited(f));
    }
    let interrupted = |signals: memshim_reach::Interruptible, sig: i32| -> ! {
        errln!(
            "memshim-ctl: interrupted: pid {pid}: the bridge is loaded and stays in the process; \
             `memshim-ctl detach {pid}` removes it"
        );
        signals.end_with(sig)
    };
    if let Some(sig) = signals.pending() {
        interrupted(signals, sig);
    }
    let decay = Request::Decay {
        dirty_ms: a.idle_return.map(i64::from),
        muzzy_ms: None,
    };
    // Its first Python job registers the bridge's fork hooks with the
    // interpreter (shim/src/thread/attached.rs): a `stats`, at once, which
    // must be answered; until then each fork of the process restarts the
    // bridge's thread before CPython counts threads, and CPython warns. A
    // fork stops the thread and closes the connection under way, so a
    // process that forks often may break one: it is opened again.
    let mut tries = 0;
    let r: DecayResult = loop {
        let answered = wait_for_socket(&p, &signals).and_then(|mut c| {
            c.stats()?;
            Ok(c.ask(&decay)?)
        });
        match answered {
            Ok(r) => break r,
            Err(Waited::Signal(sig)) => interrupted(signals, sig),
            // A stopped process answers nothing until it continues: the
            // wait has said so once.
            Err(Waited::Failed(f))
                if tries < CONVERSE_TRIES
                    && f.exit != exit::NOT_FOUND
                    && !procfs::group_stopped(pid) =>
            {
                tries += 1;
                if let Some(sig) = signals.sleep(Duration::from_millis(20)) {
                    interrupted(signals, sig);
                }
            }
            Err(Waited::Failed(_)) if procfs::group_stopped(pid) => {
                return Err(Failure::new(
                    exit::NO_ENDPOINT,
                    Some(pid),
                    "the bridge was loaded, but the process was stopped meanwhile (SIGSTOP or a job-control \
                     stop): it answers once the process continues (`kill -CONT`)",
                ));
            }
            Err(Waited::Failed(f)) => return Err(exited(f)),
        }
    };
    if let Some(sig) = signals.pending() {
        interrupted(signals, sig);
    }
    drop(signals);
    done.idle_return_ms = if a.idle_return.is_some() {
        Some(r.dirty_decay_ms)
    } else {
        (r.dirty_decay_ms >= 0).then_some(r.dirty_decay_ms)
    };
    if a.json {
        outln!("{}", serde_json::to_string(&done).unwrap_or_default())?;
        return Ok(exit::OK);
    }
    match (done.tid, done.syscall, done.road) {
        (Some(tid), Some(sc), _) => outln!(
            "pid {pid}: attached: {} loaded on thread {tid}, which was in {sc} and goes on as before",
            done.library.as_deref().unwrap_or(BRIDGE)
        )?,
        (_, _, Some(road)) => outln!(
            "pid {pid}: attached: {} loaded by a script its interpreter ran through {road} \
             (no thread was idle in the kernel); `ctypes` stays imported",
            done.library.as_deref().unwrap_or(BRIDGE)
        )?,
        _ => outln!("pid {pid}: attached already")?,
    }
    outln!(
        "its socket is {}; the verbs reach it there, without ptrace",
        done.socket
    )?;
    match done.idle_return_ms {
        Some(ms) => outln!(
            "idle return: the free heap goes back to the OS once the process has idled {ms} ms"
        )?,
        None => outln!("idle return: off (attach --idle-return turns it on)")?,
    }
    Ok(exit::OK)
}

/// Runs `detach`.
pub fn run_detach(a: DetachArgs) -> Result<Exit, Failure> {
    let pid = a.pid;
    let p = procfs::read_proc(pid)?;
    if procfs::all_threads_exited(pid) {
        return Err(procfs::zombie(&p));
    }
    match which_memshim(&p)? {
        Loaded::Preloaded => return Err(preloaded(pid, "detach")),
        Loaded::No => {
            return Err(Failure::new(
                exit::NOT_FOUND,
                Some(pid),
                format!("memshim was never attached to this process ({})", p.command),
            ));
        }
        Loaded::Attached => {}
    }
    let sock = socket::locate(&p).path();
    let mut c = Client::open_proc(p).map_err(|f| {
        // The reasons a preloaded shim has no endpoint (a single thread,
        // MEMSHIM_CONTROL) do not apply to a bridge: its socket is there from
        // `attach` until `detach`.
        let why = if f.exit == exit::NO_ENDPOINT {
            format!("it was detached already, or its thread has stopped; `memshim-ctl attach {pid}` starts it again")
        } else {
            f.message
        };
        Failure::new(f.exit, Some(pid), format!("the bridge is not serving: {why}"))
    })?;
    let r: DetachResult = c.ask(&Request::Detach)?;
    drop(c);
    // The thread closes its socket within a tick of its answer.
    let t0 = Instant::now();
    while sock.exists() && t0.elapsed() < SOCKET_WAIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    if sock.exists() {
        return Err(Failure::new(
            exit::FAILED,
            Some(pid),
            format!(
                "the bridge answered detach but its socket {} is still there after {} s",
                sock.display(),
                SOCKET_WAIT.as_secs()
            ),
        ));
    }
    if a.json {
        outln!(
            "{}",
            serde_json::json!({ "pid": pid, "detached": true, "attached_ms": r.attached_ms,
                                "idle_returns": r.idle_returns })
        )?;
    } else {
        outln!(
            "pid {pid}: detached after {:.1} s ({} idle returns): the bridge's thread has stopped \
             and its socket is closed; {BRIDGE} stays mapped (a library whose fork handlers are \
             registered cannot be unloaded safely), idle",
            r.attached_ms as f64 / 1000.0,
            r.idle_returns
        )?;
    }
    Ok(exit::OK)
}

/// Which memshim library the process has mapped; its maps unreadable is
/// a permission failure, not a missing process.
fn which_memshim(p: &Proc) -> Result<Loaded, Failure> {
    procfs::memshim_in(p.pid).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            // Why it may not be traced, as the verbs say it (another
            // user's process: exit 13), where the checks tell.
            match memshim_reach::check::may_trace(p.pid) {
                Err(r) => crate::reach::ptrace::failure(p.pid, memshim_reach::Error::Refused(r)),
                Ok(()) => procfs::permission(p, &format!("/proc/{}/maps", p.pid)),
            }
        } else {
            procfs::gone(p.pid, e)
        }
    })
}

fn preloaded(pid: i32, verb: &str) -> Failure {
    Failure::new(
        exit::PRELOADED,
        Some(pid),
        format!(
            "libmemshim.so is preloaded in this process: the verbs reach it already, and there is \
             no bridge to {verb}"
        ),
    )
}

/// Loads the bridge into `p`: from where it lies if the process sees the
/// same file, else (or when that fails, or when an earlier bridge is
/// still mapped, whose file a `dlopen` would not load again) from a copy.
fn load(p: &Proc, earlier: bool, a: &AttachArgs, done: &mut Attached) -> Result<(), Failure> {
    let pid = p.pid;
    let ours = locate_bridge()?;
    let limit = Duration::from_secs(a.timeout);
    let same_file = !earlier && sees_same_file(pid, &ours);
    let mut why_copy = None;
    if same_file {
        let path = ours.display().to_string();
        match memshim_reach::dlopen(pid, &path, limit) {
            Ok(d) if d.value != 0 => {
                done.loaded(&d, path);
                return Ok(());
            }
            Ok(d) => why_copy = d.error,
            Err(memshim_reach::Error::Failed(memshim_reach::Failure::NoSafePoint(seen)))
                if runs_314_or_newer(pid) =>
            {
                let copy = Copy::place(pid, &ours)?;
                return by_remote_debugging(p, &ours, &copy, a, done, &seen);
            }
            Err(e) => return Err(ptrace::failure(pid, e)),
        }
    }
    let copy = Copy::place(pid, &ours)?;
    let r = memshim_reach::dlopen(pid, &copy.inside, limit);
    if let Err(memshim_reach::Error::Failed(memshim_reach::Failure::NoSafePoint(seen))) = &r
        && runs_314_or_newer(pid)
    {
        return by_remote_debugging(p, &ours, &copy, a, done, seen);
    }
    drop(copy);
    match r {
        Ok(d) if d.value != 0 => {
            done.loaded(&d, format!("a copy of {}", ours.display()));
            Ok(())
        }
        Ok(d) => Err(Failure::new(
            exit::NOT_ATTACHED,
            Some(pid),
            format!(
                "the process could not load {BRIDGE}: {}{}; nothing was changed",
                d.error.unwrap_or_else(|| "dlopen returned NULL".into()),
                why_copy
                    .map(|w| format!(" (from where it lies: {w})"))
                    .unwrap_or_default()
            ),
        )
        .hint("a /tmp mounted noexec in the process's mount namespace refuses it")),
        Err(e) => Err(ptrace::failure(pid, e)),
    }
}

/// Whether `pid` runs a CPython that has remote debugging (3.14+).
fn runs_314_or_newer(pid: i32) -> bool {
    memshim_reach::examine(pid).is_ok_and(|(py, _)| py.version >= (3, 14))
}

/// The script the process runs to load the bridge: silent whatever
/// happens (an exception in it would be printed on the process's stderr).
fn load_script(library: &str) -> String {
    format!(
        "try:\n    import ctypes\n    ctypes.CDLL({library:?})\nexcept BaseException:\n    pass\n"
    )
}

/// No thread reached a safe point (`seen`: what they were doing), and the
/// process runs CPython 3.14+: it runs a script that loads the bridge
/// through its remote debugging (PEP 768), the next time its running
/// thread checks its eval breaker, which it does while it runs bytecode
/// (`memshim_reach::remote_exec`). The files stay until the bridge's
/// socket is there; a script not taken within `--timeout` is withdrawn.
fn by_remote_debugging(
    p: &Proc,
    ours: &Path,
    copy: &Copy,
    a: &AttachArgs,
    done: &mut Attached,
    seen: &str,
) -> Result<(), Failure> {
    let pid = p.pid;
    let script = copy.add(pid, "load.py", &load_script(&copy.inside))?;
    let pending = memshim_reach::remote_exec::remote_exec(pid, &script)
        .map_err(|e| ptrace::failure(pid, e))?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    loop {
        let taken = pending.taken().map_err(|e| ptrace::failure(pid, e))?;
        if taken && Client::open_proc(p.clone()).is_ok() {
            done.tid = None;
            done.syscall = None;
            done.library = Some(format!("a copy of {}", ours.display()));
            done.loaded_now = true;
            done.road = Some("remote debugging (PEP 768)");
            return Ok(());
        }
        if Instant::now() >= deadline {
            let withdrawn = !taken && pending.withdraw().unwrap_or(false);
            return Err(Failure::new(
                exit::NO_SAFE_POINT,
                Some(pid),
                if withdrawn {
                    format!(
                        "no thread reached a safe point ({seen}), and the process did not run the remote-debugging script within {} s (it runs one only while it runs Python code); the script was withdrawn, nothing was changed",
                        a.timeout
                    )
                } else {
                    format!(
                        "the process took the remote-debugging script but its bridge's socket did not appear within {} s",
                        a.timeout
                    )
                },
            )
            .hint("try again when the process idles or runs Python code"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// libmemshim_bridge.so beside the real path of memshim-ctl: `../lib/` of
/// an installed tree, the same directory of a build tree or a wheel.
fn locate_bridge() -> Result<PathBuf, Failure> {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|e| e.canonicalize().ok());
    let dir = exe
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    let candidates = [dir.join("../lib").join(BRIDGE), dir.join(BRIDGE)];
    candidates
        .iter()
        .find_map(|c| c.canonicalize().ok().filter(|p| p.is_file()))
        .ok_or_else(|| {
            Failure::new(
                exit::NOT_ATTACHED,
                None,
                format!(
                    "{BRIDGE} not found: looked at {} and {}; nothing was changed",
                    candidates[0].display(),
                    candidates[1].display()
                ),
            )
            .hint(
                "reinstall memshim (make install, or the wheel), which puts it beside memshim-ctl",
            )
        })
}

/// Whether `pid` sees `path` as the very file we see.
fn sees_same_file(pid: i32, path: &Path) -> bool {
    let inside = procfs::view(pid)
        .join("root")
        .join(path.strip_prefix("/").unwrap_or(path));
    match (std::fs::metadata(path), std::fs::metadata(inside)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A copy of the bridge in the process's `/tmp`, in a directory of its
/// uid's with mode 0700; removed on drop (the process keeps its mapping).
///
/// That `/tmp` is the process's user's: a link there would be followed
/// from memshim-ctl's root, not the process's. So `/tmp` must be a
/// directory, not a link, and both it and the new directory are held open
/// and named through those descriptors (`/proc/self/fd/N`): once the
/// directory is the process's uid's, whatever that user renames or links
/// there changes nothing memshim-ctl writes.
struct Copy {
    /// The new directory, held open.
    dir: std::fs::File,
    /// The file's path as the process names it.
    inside: String,
    /// The process's `/tmp`, held open (also once the process has exited,
    /// when `/proc/<pid>/root` is gone).
    tmp: std::fs::File,
    /// `dir`'s name in `tmp`.
    name: String,
}

/// `/proc/self/fd/N`: the file `f` is, whatever its path is now.
fn held(f: &std::fs::File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

impl Copy {
    fn place(pid: i32, from: &Path) -> Result<Copy, Failure> {
        let (uid, gid) =
            ids(pid).ok_or_else(|| procfs::gone(pid, std::io::ErrorKind::NotFound.into()))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("memshim-bridge-{}-{pid}-{nanos:x}", std::process::id());
        let fail = |what: &str, e: std::io::Error| {
            Failure::new(
                exit::NOT_ATTACHED,
                Some(pid),
                format!(
                    "cannot place {BRIDGE} in the process's /tmp ({what}: {e}); nothing was changed"
                ),
            )
        };
        let tmp = untrusted::open_dir(&procfs::view(pid).join("root").join("tmp"))
            .map_err(|e| fail("its /tmp, a directory and not a link", e))?;
        // A library there would not load, and glibc's failed `dlopen`
        // leaves part of it mapped, held in that /tmp for the process's
        // life.
        if memshim_reach::mounted_noexec(&tmp) {
            return Err(fail(
                "its /tmp",
                std::io::Error::other("mounted noexec: a library there cannot be loaded"),
            ));
        }
        let path = held(&tmp).join(&name);
        std::fs::create_dir(&path).map_err(|e| fail("mkdir", e))?;
        let dir = untrusted::open_dir(&path).map_err(|e| fail("open", e));
        // Removed on drop from here on.
        let copy = Copy {
            dir: dir.inspect_err(|_| {
                let _ = std::fs::remove_dir(&path);
            })?,
            inside: format!("/tmp/{name}/{BRIDGE}"),
            tmp,
            name,
        };
        let file = held(&copy.dir).join(BRIDGE);
        std::fs::copy(from, &file).map_err(|e| fail("copy", e))?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o500))
            .map_err(|e| fail("chmod", e))?;
        std::os::unix::fs::chown(&file, Some(uid), Some(gid)).map_err(|e| fail("chown", e))?;
        copy.dir
            .set_permissions(std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail("chmod", e))?;
        std::os::unix::fs::fchown(&copy.dir, Some(uid), Some(gid)).map_err(|e| fail("chown", e))?;
        Ok(copy)
    }
}

impl Copy {
    /// Writes `text` as file `name` beside the library, readable by the
    /// process's uid only; its path as the process names it.
    fn add(&self, pid: i32, name: &str, text: &str) -> Result<String, Failure> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let (uid, gid) =
            ids(pid).ok_or_else(|| procfs::gone(pid, std::io::ErrorKind::NotFound.into()))?;
        let fail = |e: std::io::Error| {
            Failure::new(
                exit::NOT_ATTACHED,
                Some(pid),
                format!("cannot place the script in the process's /tmp: {e}; nothing was changed"),
            )
        };
        // A new file: the directory is the process's uid's by now.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(held(&self.dir).join(name))
            .map_err(fail)?;
        f.write_all(text.as_bytes()).map_err(fail)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o400))
            .map_err(fail)?;
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(fail)?;
        let inside = self.inside.rsplit_once('/').map_or("", |(d, _)| d);
        Ok(format!("{inside}/{name}"))
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        // Through `/tmp`'s descriptor: the process may have exited. A link
        // put in its place is removed, not followed.
        let _ = std::fs::remove_dir_all(held(&self.tmp).join(&self.name));
    }
}

/// The process's effective uid and gid, as its own user namespace's root
/// directory sees them (`/proc/<pid>/status`).
fn ids(pid: i32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(procfs::view(pid).join("status")).ok()?;
    let field = |key: &str| -> Option<u32> {
        let l = status.lines().find(|l| l.starts_with(key))?;
        l.split_whitespace().nth(2)?.parse().ok()
    };
    Some((field("Uid:")?, field("Gid:")?))
}

/// How waiting for the bridge ended, where it did not answer.
enum Waited {
    /// It failed.
    Failed(Failure),
    /// A signal that ends memshim-ctl came meanwhile.
    Signal(i32),
}

impl From<Failure> for Waited {
    fn from(f: Failure) -> Waited {
        Waited::Failed(f)
    }
}

/// Connects to the bridge once its socket is there.
fn wait_for_socket(p: &Proc, signals: &memshim_reach::Interruptible) -> Result<Client, Waited> {
    let t0 = Instant::now();
    loop {
        match Client::open_proc(p.clone()) {
            Ok(c) => return Ok(c),
            Err(f) if t0.elapsed() >= SOCKET_WAIT => {
                // The preload's reasons for a missing endpoint (a single
                // thread, MEMSHIM_CONTROL) are not the bridge's.
                let why = if procfs::group_stopped(p.pid) {
                    "the process was stopped meanwhile (SIGSTOP or a job-control stop): the bridge's thread starts \
                     when it continues"
                        .to_string()
                } else if f.exit == exit::NO_ENDPOINT {
                    "its thread did not start or bind the socket".to_string()
                } else {
                    f.message
                };
                return Err(Waited::Failed(Failure::new(
                    exit::NO_ENDPOINT,
                    Some(p.pid),
                    format!(
                        "the bridge was loaded but its socket did not answer within {} s: {why}",
                        SOCKET_WAIT.as_secs()
                    ),
                )));
            }
            Err(_) => {
                if let Some(sig) = signals.sleep(Duration::from_millis(20)) {
                    return Err(Waited::Signal(sig));
                }
            }
        }
    }
}
