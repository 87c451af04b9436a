//! Finding shimmed processes and their control sockets through `/proc`.
//!
//! * The shim is loaded if `/proc/<pid>/maps` maps a `libmemshim.so`.
//! * The socket is `<dir>/<nspid>-<starttime>-<pidns>.sock`
//!   (`memshim_proto::endpoint`), where `<dir>` is the process's
//!   `MEMSHIM_SOCKET_DIR` (from `/proc/<pid>/environ`) or
//!   `/tmp/memshim-<euid>`, `<nspid>` is the last `NSpid` entry of
//!   `/proc/<pid>/status` (the pid inside the process's own pid namespace),
//!   `<starttime>` is field 22 of `/proc/<pid>/stat` and `<pidns>` the inode
//!   of `/proc/<pid>/ns/pid`. A file with the right pid but another start
//!   time belongs to an earlier process that had the same pid, and is never
//!   used.
//! * A process in another mount namespace (a container) is reached through
//!   `/proc/<pid>/root/<dir>` (needs root or ptrace rights). Its euid is
//!   translated through `/proc/<pid>/uid_map` when it has its own user
//!   namespace.

use crate::exit::{Exit, Failure};
use crate::out::printable;
use memshim_proto::endpoint::{self, SocketName};
use std::io;
use std::path::{Path, PathBuf};

/// What `/proc` says about one process.
#[derive(Debug, Clone)]
pub struct Proc {
    /// Pid as we see it.
    pub pid: i32,
    /// Pid inside its own pid namespace (last `NSpid` entry).
    pub nspid: i32,
    /// Effective uid as we see it.
    pub uid: u32,
    /// Command line (or `[comm]`), shortened for display elsewhere.
    pub command: String,
    /// Threads.
    pub threads: u64,
    /// Field 22 of `stat`.
    pub starttime: u64,
    /// Inode of its pid namespace (`/proc/<pid>/ns/pid`); 0 if unreadable.
    pub pidns: u64,
    /// `VmRSS` in bytes.
    pub rss: u64,
    /// Where its address space, environment and root are read ([`view`]).
    pub view: PathBuf,
}

/// A `/proc`, `/sys` or cgroup file as text. Not `read_to_string`: what the
/// kernel shows may hold bytes that are not UTF-8 (a `comm` cut in the
/// middle of a character at 15 bytes, a name set with `prctl`, a mapped
/// file's or mount point's name), and one such byte must not make a whole
/// process, or a whole mount table, unreadable. Such bytes read as U+FFFD.
pub fn read_text(path: impl AsRef<Path>) -> io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

fn proc_path(pid: i32, file: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{file}"))
}

/// The `/proc` directory that shows `pid`'s address space, environment,
/// command line, executable, root and mount namespace: `/proc/<pid>`, or,
/// when its main thread has ended with `pthread_exit` while other threads
/// run on, `/proc/<pid>/task/<tid>` of a thread still running. The main
/// thread is a zombie then, and those files of it read empty or fail
/// (`maps` is empty, `environ` gives `ESRCH`, `status` has no `VmRSS`).
pub fn view(pid: i32) -> PathBuf {
    let leader = read_text(proc_path(pid, "stat")).unwrap_or_default();
    view_from(pid, &leader)
}

/// `/proc/<pid>`: the main thread's directory, which [`view`] is unless
/// that thread has ended.
fn main_dir(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
}

impl Proc {
    /// Its main thread has ended with `pthread_exit` while others run on
    /// ([`view`] is another thread's directory).
    pub fn main_thread_gone(&self) -> bool {
        self.view != main_dir(self.pid)
    }
}

/// [`view`], given the main thread's `stat` line.
fn view_from(pid: i32, leader_stat: &str) -> PathBuf {
    let leader = main_dir(pid);
    if !exited(leader_stat) {
        return leader;
    }
    running_task(pid).unwrap_or(leader)
}

/// Whether a `stat` line is a thread's that is a zombie, dead, or exiting
/// (`PF_EXITING`, set as the kernel starts to tear a thread down, before it
/// closes its descriptors and long before it is a zombie).
fn exited(stat: &str) -> bool {
    const PF_EXITING: u64 = 0x4;
    let mut fields = stat_fields(stat);
    let state = fields.as_mut().and_then(|f| f.next());
    // `flags` is field 9, the 6th after the state (field 3).
    let flags: u64 = fields.and_then(|mut f| f.nth(5)?.parse().ok()).unwrap_or(0);
    matches!(state, Some("Z" | "X" | "x")) || flags & PF_EXITING != 0
}

/// `/proc/<pid>/task/<tid>` of a thread of `pid` that has not exited.
fn running_task(pid: i32) -> Option<PathBuf> {
    std::fs::read_dir(proc_path(pid, "task"))
        .ok()?
        .flatten()
        .map(|t| t.path())
        .find(|t| read_text(t.join("stat")).is_ok_and(|stat| !exited(&stat)))
}

/// The fields of a `stat` line from field 3 (the state) on: those after
/// the last `)`, since the command (field 2) may hold spaces and `)`.
fn stat_fields(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace())
}

/// Field 22 of a `stat` line.
pub fn parse_starttime(stat: &str) -> Option<u64> {
    stat_fields(stat)?.nth(19)?.parse().ok()
}

/// A `Key:` line of `status`, split into fields.
fn status_fields<'a>(status: &'a str, key: &str) -> Option<Vec<&'a str>> {
    status.lines().find_map(|l| {
        Some(
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .split_whitespace()
                .collect(),
        )
    })
}

/// Reads what `/proc/<pid>` says. `NotFound` if there is no such process.
pub fn read_proc(pid: i32) -> Result<Proc, Failure> {
    let status = read_text(proc_path(pid, "status")).map_err(|e| gone(pid, e))?;
    let stat = read_text(proc_path(pid, "stat")).map_err(|e| gone(pid, e))?;
    not_a_thread(pid, &status)?;
    let nspid = status_fields(&status, "NSpid")
        .and_then(|f| f.last().and_then(|s| s.parse().ok()))
        .unwrap_or(pid);
    let uid = status_fields(&status, "Uid")
        .and_then(|f| f.get(1).and_then(|s| s.parse().ok()))
        .unwrap_or(u32::MAX);
    let threads = status_fields(&status, "Threads")
        .and_then(|f| f.first().and_then(|s| s.parse().ok()))
        .unwrap_or(0);
    let view = view_from(pid, &stat);
    let live_status = (view != main_dir(pid))
        .then(|| read_text(view.join("status")).ok())
        .flatten();
    let rss = status_fields(live_status.as_deref().unwrap_or(&status), "VmRSS")
        .and_then(|f| f.first().and_then(|s| s.parse::<u64>().ok()))
        .unwrap_or(0)
        * 1024;
    let command = match std::fs::read(view.join("cmdline")) {
        Ok(c) if !c.is_empty() => {
            let parts: Vec<String> = c
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            printable(&parts.join(" "))
        }
        _ => format!(
            "[{}]",
            printable(
                &status_fields(&status, "Name")
                    .map(|f| f.join(" "))
                    .unwrap_or_default()
            )
        ),
    };
    use std::os::unix::fs::MetadataExt;
    let pidns = std::fs::metadata(proc_path(pid, "ns/pid")).map_or(0, |m| m.ino());
    Ok(Proc {
        pid,
        nspid,
        uid,
        command,
        threads,
        starttime: parse_starttime(&stat).unwrap_or(0),
        pidns,
        rss,
        view,
    })
}

/// `/proc/<tid>` exists for every thread, though `ls /proc` lists only
/// processes: the failure for a thread id given as a pid (`status` is its
/// `/proc/<pid>/status`).
pub fn not_a_thread(pid: i32, status: &str) -> Result<(), Failure> {
    match status_fields(status, "Tgid")
        .and_then(|f| f.first().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&t| t != pid)
    {
        Some(tgid) => Err(Failure::new(
            Exit::NotFound,
            Some(pid),
            format!("a thread of process {tgid}, not a process"),
        )
        .hint(format!("use the process's pid: {tgid}"))),
        None => Ok(()),
    }
}

fn gone(pid: i32, e: io::Error) -> Failure {
    Failure::new(
        Exit::NotFound,
        Some(pid),
        format!("no such process (/proc/{pid}: {e})"),
    )
    .hint("check the pid with `memshim-ctl list`")
}

/// Whether the process `p` still runs: its pid names the same process
/// (same start time) and one of its threads is neither a zombie nor
/// exiting. For a connection that broke in the middle of a request: a
/// process that died is "no such process".
pub fn still_running(p: &Proc) -> bool {
    let Ok(stat) = read_text(proc_path(p.pid, "stat")) else {
        return false;
    };
    parse_starttime(&stat) == Some(p.starttime) && !threads_exited(p.pid, &stat)
}

/// Whether no thread of `pid` runs: each is a zombie, dead, or exiting
/// (`PF_EXITING`, set as the kernel starts to tear a thread down, before
/// it closes its descriptors and long before it is a zombie). A main thread
/// that called `pthread_exit` is a zombie while the others run, so every
/// thread is looked at. True if `/proc/<pid>` is gone.
pub fn all_threads_exited(pid: i32) -> bool {
    read_text(proc_path(pid, "stat")).map_or(true, |stat| threads_exited(pid, &stat))
}

/// The state letter (field 3) of the `stat` file in `task`, a
/// `/proc/<pid>` or `/proc/<pid>/task/<tid>` directory.
fn state_in(task: &Path) -> Option<String> {
    let stat = read_text(task.join("stat")).ok()?;
    stat_fields(&stat)?.next().map(str::to_owned)
}

/// Whether the task directory `task` is a thread of the shim's (named
/// `memshim`).
fn is_shim_thread(task: &Path) -> bool {
    read_text(task.join("comm")).is_ok_and(|c| c.trim() == "memshim")
}

/// Whether `pid` is stopped (state `T`, or `t` under a tracer): its
/// threads run nothing, the shim's included, until it continues.
pub fn stopped(pid: i32) -> bool {
    matches!(state_in(&main_dir(pid)).as_deref(), Some("T" | "t"))
}

/// Whether `pid` is in a group stop (SIGSTOP, Ctrl-Z: state `T`), its
/// shim's threads (named `memshim`) included, seen twice 20 ms apart:
/// nothing in it answers until it continues. A tracer's stops (`t`: gdb,
/// and profilers such as py-spy, which stop a process for a moment many
/// times a second) do not count here; a request to such a process waits
/// for its time limit and then says it is stopped. Cheap where the main
/// thread runs: only a stopped one has its threads looked at.
pub fn shim_thread_stopped(pid: i32) -> bool {
    let look = || {
        if state_in(&main_dir(pid)).as_deref() != Some("T") {
            return false;
        }
        let Ok(rd) = std::fs::read_dir(proc_path(pid, "task")) else {
            return false;
        };
        let mut seen = false;
        for t in rd.flatten().map(|t| t.path()).filter(|t| is_shim_thread(t)) {
            if state_in(&t).as_deref() != Some("T") {
                return false;
            }
            seen = true;
        }
        seen
    };
    look() && {
        std::thread::sleep(std::time::Duration::from_millis(20));
        look()
    }
}

/// [`all_threads_exited`], given the main thread's `stat` line.
fn threads_exited(pid: i32, leader_stat: &str) -> bool {
    exited(leader_stat) && running_task(pid).is_none()
}

/// Whether `p` has stopped running, or stops within `limit`. A dying
/// process closes its descriptors before /proc shows it dying: the shim's
/// thread keeps its own descriptor table (design.md, "Descriptors of its
/// own"), which goes when that thread does, while the main thread may not
/// have begun to exit yet.
pub fn exits_within(p: &Proc, limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if !still_running(p) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `RssAnon`, `RssFile` and `RssShmem` of `/proc/<pid>/status`, in bytes.
pub fn rss_parts(p: &Proc) -> [Option<u64>; 3] {
    let status = read_text(p.view.join("status")).unwrap_or_default();
    ["RssAnon", "RssFile", "RssShmem"].map(|k| {
        status_fields(&status, k)?
            .first()?
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    })
}

/// Every pid in `/proc`, ascending.
pub fn all_pids() -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// Whether the process's `maps` ([`view`]) maps libmemshim.so.
pub fn shim_loaded(pid: i32) -> io::Result<bool> {
    let mut maps = std::fs::read(proc_path(pid, "maps"))?;
    if maps.is_empty() {
        // A kernel thread, or a main thread gone with `pthread_exit`.
        let v = view(pid);
        if v != main_dir(pid) {
            maps = std::fs::read(v.join("maps"))?;
        }
    }
    Ok(maps
        .split(|&b| b == b'\n')
        .any(|l| l.ends_with(b"/libmemshim.so") || l.ends_with(b"/libmemshim.so (deleted)")))
}

/// A `MEMSHIM_*` variable of the process's initial environment, if readable.
pub fn environ_var(p: &Proc, key: &str) -> Option<String> {
    let env = std::fs::read(p.view.join("environ")).ok()?;
    let prefix = format!("{key}=");
    env.split(|&b| b == 0).find_map(|kv| {
        kv.strip_prefix(prefix.as_bytes())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

/// Translates a uid of ours into the process's user namespace
/// (`/proc/<pid>/uid_map`: "inside outside count" lines).
pub fn uid_inside(pid: i32, uid: u32) -> u32 {
    let Ok(map) = read_text(proc_path(pid, "uid_map")) else {
        return uid;
    };
    map_uid(&map, uid).unwrap_or(uid)
}

/// `uid` (outside) mapped through a uid_map text.
pub fn map_uid(map: &str, uid: u32) -> Option<u32> {
    map.lines().find_map(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect();
        let [inside, outside, count] = f[..] else {
            return None;
        };
        let u = u64::from(uid);
        (u >= outside && u < outside + count).then(|| (u - outside + inside) as u32)
    })
}

/// Whether the process whose `/proc` directory is `view` ([`view`]) is in our
/// mount namespace (true when that cannot be read).
pub fn same_mount_ns(view: &Path) -> bool {
    match (
        std::fs::read_link("/proc/self/ns/mnt"),
        std::fs::read_link(view.join("ns/mnt")),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    }
}

/// Where a process's control socket is.
#[derive(Debug, Clone)]
pub struct SocketLoc {
    /// The directory as the process sees it.
    pub dir_inside: PathBuf,
    /// The directory as we reach it (`/proc/<pid>/root/...` across mount
    /// namespaces).
    pub dir: PathBuf,
    /// `<nspid>-<starttime>-<pidns>.sock`.
    pub name: String,
}

impl SocketLoc {
    /// Full path as we reach it.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

/// The socket directory the shim in `p` uses, and how we reach it.
pub fn socket_loc(p: &Proc) -> SocketLoc {
    let dir_inside = environ_var(p, "MEMSHIM_SOCKET_DIR")
        .filter(|d| endpoint::valid_socket_dir(d.as_bytes()))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(endpoint::default_socket_dir(uid_inside(p.pid, p.uid))));
    let dir = if same_mount_ns(&p.view) {
        dir_inside.clone()
    } else {
        p.view
            .join("root")
            .join(dir_inside.strip_prefix("/").unwrap_or(&dir_inside))
    };
    let name = socket_name(p, &dir);
    SocketLoc {
        dir_inside,
        dir,
        name,
    }
}

/// The file name of `p`'s socket. Without the pid namespace (no permission
/// to read `/proc/<pid>/ns/pid`), the one file in `dir` with `p`'s pid and
/// start time, if there is exactly one.
fn socket_name(p: &Proc, dir: &Path) -> String {
    let want = SocketName {
        pid: p.nspid,
        starttime: p.starttime,
        pidns: p.pidns,
    };
    if p.pidns != 0 {
        return want.to_string();
    }
    let candidates: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| {
                    SocketName::parse(n)
                        .is_some_and(|s| s.pid == p.nspid && s.starttime == p.starttime)
                })
                .collect()
        })
        .unwrap_or_default();
    match &candidates[..] {
        [one] => one.clone(),
        _ => want.to_string(),
    }
}

/// Whether a `hello` answer comes from the process `p`.
pub fn hello_matches(h: &memshim_proto::HelloReply, p: &Proc) -> bool {
    h.pid == p.nspid
        && h.starttime == p.starttime
        && (p.pidns == 0 || h.pidns.is_none_or(|n| n == p.pidns))
}

/// Why a directory is one the shim refuses, if it is.
pub fn unsafe_dir(dir: &Path, uid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).ok()?;
    if m.file_type().is_symlink() {
        return Some(format!(
            "{} is a symbolic link; the shim refuses it",
            dir.display()
        ));
    }
    if !m.is_dir() {
        return Some(format!("{} is not a directory", dir.display()));
    }
    if m.uid() != uid {
        return Some(format!(
            "{} is owned by uid {}, not by the process's uid {uid}; the shim refuses it",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Some(format!(
            "{} has mode {:04o}; the shim refuses a directory group or others can use",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// Why the shim cannot create the socket directory `dir`: its parent does
/// not exist (the shim creates only the last component).
pub fn missing_parent(dir: &Path) -> Option<String> {
    let parent = dir.parent().filter(|d| !d.exists())?;
    Some(format!(
        "the socket directory {} cannot be created: its parent {} does not exist (the shim creates only the last \
         component)",
        dir.display(),
        parent.display()
    ))
}

/// The mode a `MEMSHIM_CONTROL` value gives the shim, spelled as in the
/// docs: `"on"` and `"off"` for any of the library's boolean spellings
/// (any case), `"auto"` for `auto`, an unset and an invalid value (the
/// library warns and uses its default).
pub fn control_mode(value: Option<&str>) -> &'static str {
    match value.unwrap_or_default().to_ascii_lowercase().as_str() {
        "off" | "0" | "false" | "no" => "off",
        "on" | "1" | "true" | "yes" => "on",
        _ => "auto",
    }
}

/// Why the endpoint of a shimmed process is not there, for a person.
pub fn why_no_endpoint(p: &Proc, loc: &SocketLoc) -> (String, String) {
    let control = control_mode(environ_var(p, "MEMSHIM_CONTROL").as_deref());
    if control == "off" {
        return (
            "MEMSHIM_CONTROL=off: this process has no control endpoint".into(),
            "restart it without MEMSHIM_CONTROL=off".into(),
        );
    }
    let on = control == "on";
    if p.threads <= 1 && !on {
        return (
            "single-threaded process: the endpoint starts with its second thread, or set MEMSHIM_CONTROL=on".into(),
            "start the process with MEMSHIM_CONTROL=on to have the endpoint from the start".into(),
        );
    }
    if let Some(why) = unsafe_dir(&loc.dir, p.uid) {
        return (
            why,
            format!(
                "remove {} (the shim re-creates it safely within 5 s)",
                loc.dir.display()
            ),
        );
    }
    if p.main_thread_gone() {
        return (
            "its main thread has ended with pthread_exit: the shim's thread then stops for good, so that the \
             process's exit (atexit handlers, stdio's flush) runs on one of the program's own threads"
                .into(),
            "none: memory still goes back as the program allocates and frees (decay); `memshim-ctl list` and \
             `cgroup` still show the process"
                .into(),
        );
    }
    let has_thread = std::fs::read_dir(proc_path(p.pid, "task"))
        .map(|rd| rd.flatten().any(|t| is_shim_thread(&t.path())))
        .unwrap_or(true);
    if !has_thread {
        return (
            "the shim's thread is not running (it stops when the process has been single-threaded for a while, and \
             never runs where the shim does not interpose malloc)"
                .into(),
            format!(
                "`memshim-ctl doctor {}` tells whether the shim interposes (a program with its own malloc, a \
                 sanitizer); if it does, MEMSHIM_CONTROL=on keeps the thread",
                p.pid
            ),
        );
    }
    if let Some(why) = missing_parent(&loc.dir) {
        let parent = loc.dir.parent().unwrap_or(Path::new("/"));
        return (
            why,
            format!(
                "create {} (the shim binds within 5 s), or point MEMSHIM_SOCKET_DIR elsewhere",
                parent.display()
            ),
        );
    }
    if let Some(blocked) = blocked_socket(&loc.path()) {
        return blocked;
    }
    // The thread runs: its socket is missing, or a file nobody listens on
    // (the thread is binding it again).
    let why = if std::fs::symlink_metadata(loc.path()).is_ok() {
        "the shim's thread runs and binds its socket again shortly".to_owned()
    } else {
        format!("no socket at {}", loc.path().display())
    };
    (
        why,
        "the endpoint may be starting (retry in a few seconds); MEMSHIM_VERBOSE=1 shows why it failed".into(),
    )
}

/// What occupies a socket's path when it is not a socket (nor a symbolic
/// link, which the client refuses by itself): "a regular file", "a
/// directory", ... The shim never removes a file it did not make, so it
/// cannot bind there until someone does.
pub fn not_a_socket(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::symlink_metadata(path).ok()?.file_type();
    Some(if t.is_socket() || t.is_symlink() {
        return None;
    } else if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else {
        "a device file"
    })
}

/// Why, and what to do, when something other than a socket occupies the
/// socket's path ([`not_a_socket`]).
pub fn blocked_socket(path: &Path) -> Option<(String, String)> {
    let kind = not_a_socket(path)?;
    Some((
        format!(
            "{} is {kind}, not a socket: the shim never removes a file it did not make, so it cannot bind its \
             socket there",
            path.display()
        ),
        format!(
            "remove it (`rm {}`); the shim then binds its socket within a few seconds",
            shell_quoted(&path.display().to_string())
        ),
    ))
}

/// `s` as one shell word: as it is where it has only characters no shell
/// treats specially, else in single quotes (a path another user chose goes
/// into a command we suggest).
pub fn shell_quoted(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%,=".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Resolves `pid` to a process with the shim loaded.
pub fn shimmed(pid: i32) -> Result<Proc, Failure> {
    let p = read_proc(pid)?;
    match shim_loaded(pid) {
        Ok(true) => Ok(p),
        // A zombie's maps read empty, shim or not.
        Ok(false) if all_threads_exited(pid) => Err(Failure::new(
            Exit::NotFound,
            Some(pid),
            format!(
                "the process has exited (a zombie its parent has not reaped: {})",
                p.command
            ),
        )
        .hint("nothing is left to ask; its parent reaps it with wait()")),
        Ok(false) => Err(Failure::new(
            Exit::NotFound,
            Some(pid),
            format!("libmemshim.so is not loaded in this process ({})", p.command),
        )
        .hint("start it with LD_PRELOAD=/path/to/libmemshim.so (it is dropped for setuid programs and by sudo)")),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(permission(&p, &format!("/proc/{pid}/maps"))),
        Err(e) => Err(gone(pid, e)),
    }
}

/// The permission-denied failure for `p` at `path`.
pub fn permission(p: &Proc, path: &str) -> Failure {
    let f = Failure::new(
        Exit::Permission,
        Some(p.pid),
        format!(
            "permission denied: {path} (the process runs as uid {})",
            p.uid
        ),
    );
    if my_euid() == Some(0) {
        f.hint("denied even to root: the process may be in another user namespace, or ptrace access is restricted (Yama ptrace_scope, seccomp, LSM)")
    } else {
        f.hint(format!("run memshim-ctl as uid {} or as root", p.uid))
    }
}

/// Why a process's `/proc` maps or descriptors can be refused even to root,
/// for the notes of commands that count such processes (`list`, `cgroup`):
/// the kernel shows a non-dumpable process only to a caller with
/// `CAP_SYS_PTRACE` over it.
pub const DENIED_TO_ROOT: &str = "even root needs CAP_SYS_PTRACE over a non-dumpable process, which containers often \
     drop and which does not reach another user namespace";

/// Our effective uid (from /proc/self/status; the CLI has no unsafe code).
pub fn my_euid() -> Option<u32> {
    let s = read_text("/proc/self/status").ok()?;
    status_fields(&s, "Uid")?.get(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_starttime(stat), Some(987654));
        assert_eq!(parse_starttime("garbage"), None);
    }

    #[test]
    fn maps_uids_through_user_namespaces() {
        assert_eq!(
            map_uid("         0     100000      65536\n", 100000),
            Some(0)
        );
        assert_eq!(
            map_uid("         0     100000      65536\n", 100005),
            Some(5)
        );
        assert_eq!(map_uid("         0     100000      65536\n", 5), None);
        assert_eq!(
            map_uid("         0          0 4294967295\n", 1000),
            Some(1000)
        );
    }

    #[test]
    fn reads_own_process() {
        let me = std::process::id() as i32;
        let p = read_proc(me).unwrap();
        assert_eq!(p.pid, me);
        assert!(p.starttime > 0 && p.rss > 0 && p.threads >= 1);
        let loc = socket_loc(&p);
        assert!(p.pidns != 0);
        assert_eq!(
            loc.name,
            format!("{}-{}-{}.sock", p.nspid, p.starttime, p.pidns)
        );
        assert!(read_proc(i32::MAX).is_err_and(|f| f.exit == Exit::NotFound));
    }
}
