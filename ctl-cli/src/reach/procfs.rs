//! What `/proc` says about a process: its ids, command, threads and
//! their states, memory lines, environment, user namespace's uid map and
//! mount namespace, and whether it maps `libmemshim.so`; with the failures
//! for a pid that is no process, a thread, or one we may not read.
//!
//! A process whose main thread has ended with `pthread_exit` while others
//! run on shows its address space, environment and root only through a
//! running thread's directory ([`view`]).

use crate::exit::{self, Failure};
use crate::output::print::printable;
use memshim_proto::endpoint::Seen;
use memshim_proto::procfs;
use memshim_proto::settings::{self, Control};
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
    /// Parent's pid as we see it (0 if outside our pid namespace or
    /// unreadable).
    pub ppid: i32,
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
    Ok(lossy_text(std::fs::read(path)?))
}

/// `bytes` as text, those that are not UTF-8 as U+FFFD (no copy when all
/// are).
pub fn lossy_text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
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
    let state = procfs::stat_state(stat.as_bytes());
    matches!(state, Some(b'Z' | b'X' | b'x')) || stat_flags(stat).unwrap_or(0) & PF_EXITING != 0
}

/// `/proc/<pid>/task/<tid>` of a thread of `pid` that has not exited.
fn running_task(pid: i32) -> Option<PathBuf> {
    std::fs::read_dir(proc_path(pid, "task"))
        .ok()?
        .flatten()
        .map(|t| t.path())
        .find(|t| read_text(t.join("stat")).is_ok_and(|stat| !exited(&stat)))
}

/// What this `/proc` says of `pid`, for the stale-socket rule
/// (`SocketName::stale`).
pub fn seen(pid: i32) -> Seen {
    match std::fs::read(proc_path(pid, "stat")) {
        Ok(stat) => procfs::stat_starttime(&stat).map_or(Seen::Unknown, Seen::Started),
        // ENOENT; or ESRCH (3, no ErrorKind of its own): gone since the open.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(3) => Seen::Gone,
        Err(_) => Seen::Unknown,
    }
}

/// The `flags` of a `stat` line (field 9).
pub fn stat_flags(stat: &str) -> Option<u64> {
    procfs::stat_flags(stat.as_bytes())
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
    let ppid = status_fields(&status, "PPid")
        .and_then(|f| f.first().and_then(|s| s.parse().ok()))
        .unwrap_or(0);
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
        ppid,
        command,
        threads,
        starttime: procfs::stat_starttime(stat.as_bytes()).unwrap_or(0),
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
            exit::NOT_FOUND,
            Some(pid),
            format!("a thread of process {tgid}, not a process"),
        )
        .hint(format!("use the process's pid: {tgid}"))),
        None => Ok(()),
    }
}

/// Whether `pid` names a thread of another process (its `Tgid` differs).
pub fn is_thread_id(pid: i32) -> bool {
    read_text(proc_path(pid, "status")).is_ok_and(|s| not_a_thread(pid, &s).is_err())
}

pub fn gone(pid: i32, e: io::Error) -> Failure {
    Failure::new(
        exit::NOT_FOUND,
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
    procfs::stat_starttime(stat.as_bytes()) == Some(p.starttime) && !threads_exited(p.pid, &stat)
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
    procfs::stat_state(stat.as_bytes()).map(|c| char::from(c).to_string())
}

/// Whether the task directory `task` is a thread of the shim's (named
/// `memshim`).
fn is_shim_thread(task: &Path) -> bool {
    read_text(task.join("comm")).is_ok_and(|c| c.trim() == "memshim")
}

/// Whether a thread of `pid` named `memshim` (the shim's) is listed; true
/// when the threads cannot be read.
pub fn has_shim_thread(pid: i32) -> bool {
    std::fs::read_dir(proc_path(pid, "task"))
        .map(|rd| rd.flatten().any(|t| is_shim_thread(&t.path())))
        .unwrap_or(true)
}

/// Whether the main thread of `pid` is a zombie or dead (state `Z` or `X`).
pub fn is_zombie(pid: i32) -> bool {
    matches!(state_in(&main_dir(pid)).as_deref(), Some("Z" | "X"))
}

/// `PF_KTHREAD` in the flags of `/proc/<pid>/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Whether `pid` is a kernel thread: it runs no program, so it has no
/// allocator, no environment and no executable to look at.
pub fn is_kernel_thread(pid: i32) -> bool {
    read_text(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_flags(&s))
        .is_some_and(|f| f & PF_KTHREAD != 0)
}

/// Whether `pid` is stopped (state `T`, or `t` under a tracer): its
/// threads run nothing, the shim's included, until it continues.
pub fn stopped(pid: i32) -> bool {
    matches!(state_in(&main_dir(pid)).as_deref(), Some("T" | "t"))
}

/// Whether `pid` is frozen by its cgroup's freezer (`docker pause`; v2
/// `cgroup.events` says `frozen 1`, v1 `freezer.state` is FROZEN or
/// FREEZING): nothing in it runs until it is thawed. Its threads need not
/// show it: one asleep stays where it sleeps, in state `D`.
pub fn frozen(pid: i32) -> bool {
    use memshim_proto::cgroup;
    let Ok(text) = read_text(proc_path(pid, "cgroup")) else {
        return false;
    };
    let pc = cgroup::parse_proc_cgroup(&text);
    let mounts = cgroup::cgroup_mounts(&read_text("/proc/self/mountinfo").unwrap_or_default());
    let read = |m: &cgroup::CgroupMount, path: &str, file: &str| {
        let rel = cgroup::path_in_mount(path, &m.root)?;
        let dir = Path::new(&m.mount_point).join(rel.trim_start_matches('/'));
        read_text(dir.join(file)).ok()
    };
    let v2 = pc.v2.as_deref().is_some_and(|p| {
        mounts
            .iter()
            .filter(|m| m.v2)
            .filter_map(|m| read(m, p, "cgroup.events"))
            .any(|t| t.lines().any(|l| l == "frozen 1"))
    });
    let v1 = pc.v1_freezer.as_deref().is_some_and(|p| {
        mounts
            .iter()
            .filter(|m| m.freezer)
            .filter_map(|m| read(m, p, "freezer.state"))
            .any(|t| matches!(t.trim(), "FROZEN" | "FREEZING"))
    });
    v2 || v1
}

/// Whether the main thread of `pid` is in a group stop (SIGSTOP, Ctrl-Z:
/// state `T`; not a tracer's `t`).
pub fn group_stopped(pid: i32) -> bool {
    state_in(&main_dir(pid)).as_deref() == Some("T")
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
        if !group_stopped(pid) {
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
    Ok(memshim_in(pid)? != Loaded::No)
}

/// How memshim is in a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// Neither library.
    No,
    /// libmemshim.so, preloaded: the process's allocator.
    Preloaded,
    /// libmemshim_bridge.so, loaded by `attach` (it stays mapped after
    /// `detach`: its socket says whether it serves).
    Attached,
}

/// Which memshim library `pid` has mapped ([`Loaded`]); the preload wins
/// where both are (`attach` refuses such a process).
pub fn memshim_in(pid: i32) -> io::Result<Loaded> {
    let mut maps = std::fs::read(proc_path(pid, "maps"))?;
    if maps.is_empty() {
        // A kernel thread, or a main thread gone with `pthread_exit`.
        let v = view(pid);
        if v != main_dir(pid) {
            maps = std::fs::read(v.join("maps"))?;
        }
    }
    let has = |name: &[u8]| {
        maps.split(|&b| b == b'\n').any(|l| {
            let l = l.strip_suffix(b" (deleted)").unwrap_or(l);
            l.ends_with(name)
        })
    };
    Ok(if has(b"/libmemshim.so") {
        Loaded::Preloaded
    } else if has(b"/libmemshim_bridge.so") {
        Loaded::Attached
    } else {
        Loaded::No
    })
}

/// A process's initial environment (`/proc/<pid>/environ`, from its
/// [`view`]): `KEY=value` entries, each ended by a NUL.
#[derive(Debug, Clone)]
pub struct Environ(Vec<u8>);

impl Environ {
    /// Reads the environment of the process whose `/proc` directory is
    /// `view`; `None` if it cannot be read.
    pub fn read(view: &Path) -> Option<Environ> {
        std::fs::read(view.join("environ")).ok().map(Environ)
    }

    /// The value of the first `key=` entry, as bytes.
    pub fn get_bytes(&self, key: &str) -> Option<&[u8]> {
        self.0
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(key.as_bytes())?.strip_prefix(b"="))
    }

    /// The value of the first `key=` entry (bytes that are not UTF-8 read as
    /// U+FFFD).
    pub fn get(&self, key: &str) -> Option<String> {
        self.get_bytes(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// The mode `MEMSHIM_CONTROL` in a process's environment `env` gives its
/// shim, read by the shim's own parser: its default where the variable is
/// unset, invalid (the library warns and uses it) or unreadable.
pub fn control_mode(env: Option<&Environ>) -> Control {
    let value = env
        .and_then(|e| e.get_bytes(settings::CONTROL.name))
        .and_then(settings::parse_control);
    Control::from_value(value.unwrap_or(settings::CONTROL.default_value()))
}

/// Whether the process runs in secure-execution mode (setuid/setgid or
/// file capabilities): `AT_SECURE` (23) in the auxiliary vector of the
/// process whose `/proc` directory is `view`.
pub fn at_secure(view: &Path) -> Option<bool> {
    std::fs::read(view.join("auxv")).ok().and_then(|b| {
        b.chunks_exact(16).find_map(|kv| {
            let k = u64::from_ne_bytes(kv[..8].try_into().ok()?);
            let v = u64::from_ne_bytes(kv[8..].try_into().ok()?);
            (k == 23).then_some(v != 0)
        })
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

/// The failure for a process that has exited and is not reaped yet.
pub fn zombie(p: &Proc) -> Failure {
    Failure::new(
        exit::NOT_FOUND,
        Some(p.pid),
        format!(
            "the process has exited (a zombie its parent has not reaped: {})",
            p.command
        ),
    )
    .hint("nothing is left to ask; its parent reaps it with wait()")
}

/// Resolves `pid` to a process with the shim loaded.
pub fn shimmed(pid: i32) -> Result<Proc, Failure> {
    let p = read_proc(pid)?;
    match shim_loaded(pid) {
        Ok(true) => Ok(p),
        // A zombie's maps read empty, shim or not.
        Ok(false) if all_threads_exited(pid) => Err(zombie(&p)),
        Ok(false) => Err(Failure::new(
            exit::NOT_FOUND,
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
        exit::PERMISSION,
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
        assert!(p.starttime > 0 && p.rss > 0 && p.threads >= 1 && p.pidns != 0);
        assert!(read_proc(i32::MAX).is_err_and(|f| f.exit == exit::NOT_FOUND));
    }

    #[test]
    fn environment_entries_and_the_control_mode_read_as_the_shim_reads_them() {
        let env =
            Environ(b"A=1\0MEMSHIM_CONTROL=Yes\0MEMSHIM_CONTROL=off\0B=\xff\0AB=2\0".to_vec());
        assert_eq!(env.get("A").as_deref(), Some("1"));
        assert_eq!(env.get("B").as_deref(), Some("\u{fffd}"));
        assert_eq!(env.get("C"), None);
        assert_eq!(control_mode(Some(&env)), Control::On);
        assert_eq!(control_mode(None), Control::Auto);
        for (v, mode) in [
            ("OFF", Control::Off),
            ("0", Control::Off),
            ("no", Control::Off),
            ("1", Control::On),
            ("true", Control::On),
            ("auto", Control::Auto),
            ("sometimes", Control::Auto),
            ("", Control::Auto),
        ] {
            let env = Environ(format!("MEMSHIM_CONTROL={v}\0").into_bytes());
            assert_eq!(control_mode(Some(&env)), mode, "{v:?}");
        }
    }
}
