//! A process's memory cgroup: where it is, what it is charged, which
//! processes are in it, and asking the kernel to reclaim its page cache.
//! The text formats are parsed by `memshim_proto::cgroup`.
//!
//! Finding the directory (v2 first, then the v1 `memory` hierarchy, since
//! a controller is bound to one hierarchy only):
//! 1. `/proc/<pid>/cgroup` gives the path, relative to our cgroup namespace;
//!    `/proc/self/mountinfo` gives each cgroup mount and the cgroup at its
//!    root, relative to the same namespace. The path below that root,
//!    joined to the mount point, is the directory.
//! 2. When the path is not below a mount's root (a cgroup namespace whose
//!    root is below the mount, `/..` paths from a DaemonSet's namespace,
//!    old container layouts), the mount is searched for the directory whose
//!    `cgroup.procs` lists the pid, matching the path's named tail.
//!
//! Every function takes the filesystem root (`/`); the unit tests point it
//! at a tree laid out like `/sys/fs/cgroup` with the kernel's file formats.

use crate::exit::{self, Failure};
use memshim_proto::cgroup::{self, CgroupMemory, CgroupMount, MemoryFiles};
use serde::Serialize;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Most directories a search visits.
const SEARCH_LIMIT: usize = 20_000;

/// Where a memory cgroup is.
#[derive(Debug, Clone, Serialize)]
pub struct Location {
    /// 1 or 2.
    pub version: u8,
    /// The cgroup's path as `/proc/<pid>/cgroup` shows it here.
    pub path: String,
    /// Its directory, as reached from here.
    pub dir: PathBuf,
    /// The mount it was found under.
    pub mount_point: PathBuf,
    /// That mount is read-only.
    pub read_only: bool,
    /// Found by searching `cgroup.procs` rather than by its path.
    pub searched: bool,
}

/// Locates the memory cgroup of `pid` (ours without one).
pub fn locate(pid: Option<i32>) -> Result<Location, Failure> {
    let who = pid.map_or_else(|| "self".to_owned(), |p| p.to_string());
    let text = crate::reach::procfs::read_text(format!("/proc/{who}/cgroup")).map_err(|e| {
        Failure::new(
            exit::NOT_FOUND,
            pid,
            format!("no such process (/proc/{who}/cgroup: {e})"),
        )
        .hint("check the pid (`ps`, `memshim-ctl list`)")
    })?;
    if let Some(p) = pid {
        // /proc/<tid>/cgroup reads, but a thread is not what was meant.
        let status =
            crate::reach::procfs::read_text(format!("/proc/{p}/status")).unwrap_or_default();
        crate::reach::procfs::not_a_thread(p, &status)?;
        // An exiting process (a zombie, or one in `exit`) reads as in the
        // root cgroup on v1: that is not the cgroup it ran in.
        if crate::reach::procfs::all_threads_exited(p) {
            return Err(crate::reach::procfs::read_proc(p)
                .map_or_else(|f| f, |proc| crate::reach::procfs::zombie(&proc)));
        }
    }
    let mountinfo = crate::reach::procfs::read_text("/proc/self/mountinfo").unwrap_or_default();
    let me = pid.unwrap_or(std::process::id() as i32);
    locate_in(Path::new("/"), &text, &mountinfo, me).map_err(|why| {
        Failure::new(exit::NO_CGROUP, pid, why).hint(
            "memshim-ctl needs the memory controller mounted here: cgroup v2 with `memory` enabled, \
             or the v1 `memory` hierarchy (in a container, /sys/fs/cgroup; on the host it is always there)",
        )
    })
}

/// [`locate`] on given texts, under filesystem root `root`; `pid` is the
/// process as our `cgroup.procs` files list it.
pub fn locate_in(
    root: &Path,
    proc_cgroup: &str,
    mountinfo: &str,
    pid: i32,
) -> Result<Location, String> {
    let pc = cgroup::parse_proc_cgroup(proc_cgroup);
    let mut mounts = cgroup::cgroup_mounts(mountinfo);
    mounts.sort_by_key(|m| m.read_only); // writable mounts first (stable)
    let mut why = vec![];
    if let Some(path) = &pc.v2 {
        for m in mounts.iter().filter(|m| m.v2) {
            let Some((dir, searched)) = find(root, m, path, pid, "cgroup.procs") else {
                continue;
            };
            if dir.join("memory.current").exists() {
                return Ok(location(2, path, dir, root, m, searched));
            }
            if dir.join("memory.stat").exists() {
                why.push(format!(
                    "the process is in the root of the unified hierarchy ({}), which has no memory.current \
                     of its own: its memory is the whole machine's (/proc/meminfo)",
                    dir.display()
                ));
            }
        }
    }
    if let Some(path) = &pc.v1_memory {
        for m in mounts.iter().filter(|m| m.memory) {
            if let Some((dir, searched)) = find(root, m, path, pid, "memory.usage_in_bytes") {
                return Ok(location(1, path, dir, root, m, searched));
            }
        }
        if !mounts.iter().any(|m| m.memory) {
            why.push(format!(
                "the process is in v1 memory cgroup {path}, but the v1 `memory` hierarchy is not mounted here"
            ));
        } else {
            why.push(format!(
                "v1 memory cgroup {path} is not visible under any mount of the `memory` hierarchy here"
            ));
        }
    }
    if why.is_empty() {
        why.push(match (&pc.v2, mounts.iter().any(|m| m.v2)) {
            (None, _) => "the process is in no memory cgroup (no memory controller in /proc/<pid>/cgroup)".into(),
            (Some(p), true) => format!(
                "the process is in unified cgroup {p}, which has no memory controller (not enabled in its parent's \
                 cgroup.subtree_control, or not visible here)"
            ),
            (Some(p), false) => format!("the process is in unified cgroup {p}, but no cgroup2 filesystem is mounted here"),
        });
    }
    Err(format!("no memory cgroup: {}", why.join("; ")))
}

fn location(
    version: u8,
    path: &str,
    dir: PathBuf,
    root: &Path,
    m: &CgroupMount,
    searched: bool,
) -> Location {
    Location {
        version,
        path: path.to_owned(),
        dir,
        mount_point: under(root, &m.mount_point),
        read_only: m.read_only,
        searched,
    }
}

fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// The directory of cgroup `path` under mount `m`, if it is there and has
/// `probe`; by name first, else by searching for `pid`.
fn find(
    root: &Path,
    m: &CgroupMount,
    path: &str,
    pid: i32,
    probe: &str,
) -> Option<(PathBuf, bool)> {
    let mp = under(root, &m.mount_point);
    if let Some(rel) = cgroup::path_in_mount(path, &m.root) {
        let dir = mp.join(rel.trim_start_matches('/'));
        if dir.join(probe).exists() {
            return Some((dir, false));
        }
    }
    let tail = cgroup::named_tail(path);
    let mut queue = VecDeque::from([mp.clone()]);
    let mut seen = 0;
    while let Some(dir) = queue.pop_front() {
        seen += 1;
        if seen > SEARCH_LIMIT {
            break;
        }
        let rel: Vec<String> = dir
            .strip_prefix(&mp)
            .map(|r| r.iter().map(|c| c.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let tail_ok = rel.len() >= tail.len()
            && rel[rel.len() - tail.len()..]
                .iter()
                .zip(&tail)
                .all(|(a, b)| a == b);
        if tail_ok && dir.join(probe).exists() && procs_of(&dir).contains(&pid) {
            return Some((dir, true));
        }
        if let Ok(rd) = std::fs::read_dir(&dir) {
            let mut subs: Vec<PathBuf> = rd
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            subs.sort();
            queue.extend(subs);
        }
    }
    None
}

/// The pids in one cgroup directory's `cgroup.procs` (0 for processes
/// outside our pid namespace).
fn procs_of(dir: &Path) -> Vec<i32> {
    crate::reach::procfs::read_text(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The processes of a cgroup and its descendants, kernel threads left out:
/// (pid, path below the cgroup), sorted, and how many are outside our pid
/// namespace.
pub fn processes(loc: &Location) -> (Vec<(i32, String)>, usize) {
    let mut out = vec![];
    let mut hidden = 0;
    let mut queue = VecDeque::from([(loc.dir.clone(), "/".to_owned())]);
    let mut seen = 0;
    while let Some((dir, rel)) = queue.pop_front() {
        seen += 1;
        if seen > SEARCH_LIMIT {
            break;
        }
        for pid in procs_of(&dir) {
            // The root cgroup lists kernel threads: no program, no memory.
            if pid > 0 && crate::reach::procfs::is_kernel_thread(pid) {
                continue;
            }
            if pid > 0 {
                out.push((pid, rel.clone()));
            } else {
                hidden += 1;
            }
        }
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let sub = if rel == "/" {
                        format!("/{name}")
                    } else {
                        format!("{rel}/{name}")
                    };
                    queue.push_back((e.path(), sub));
                }
            }
        }
    }
    out.sort();
    out.dedup_by_key(|p| p.0); // v1 lists a process once per thread's cgroup
    (out, hidden)
}

fn io_failure(e: &io::Error, path: &Path, pid: Option<i32>) -> Failure {
    match e.kind() {
        io::ErrorKind::NotFound => Failure::new(
            exit::NO_CGROUP,
            pid,
            format!(
                "no memory cgroup: {} disappeared (the cgroup was removed)",
                path.display()
            ),
        ),
        io::ErrorKind::PermissionDenied => Failure::new(
            exit::PERMISSION,
            pid,
            format!("permission denied: {}", path.display()),
        )
        .hint("run memshim-ctl as root"),
        _ => Failure::new(
            exit::FAILED,
            pid,
            format!("reading {}: {e}", path.display()),
        ),
    }
}

fn read_file(dir: &Path, name: &str, pid: Option<i32>) -> Result<String, Failure> {
    let p = dir.join(name);
    crate::reach::procfs::read_text(&p).map_err(|e| io_failure(&e, &p, pid))
}

fn read_opt(dir: &Path, name: &str) -> Option<u64> {
    crate::reach::procfs::read_text(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What the cgroup is charged now.
pub fn read_memory(loc: &Location, pid: Option<i32>) -> Result<CgroupMemory, Failure> {
    Ok(CgroupMemory::from_files(&read_files(loc, pid)?))
}

/// The cgroup's memory files, as read now.
pub fn read_files(loc: &Location, pid: Option<i32>) -> Result<MemoryFiles, Failure> {
    let d = &loc.dir;
    let stat = cgroup::parse_flat_keyed(&read_file(d, "memory.stat", pid)?);
    let files = if loc.version == 2 {
        MemoryFiles {
            version: 2,
            stat,
            usage: read_file(d, "memory.current", pid)?
                .trim()
                .parse()
                .unwrap_or(0),
            limit: v2_limit(loc, pid),
            high: cgroup::parse_limit(&read_file(d, "memory.high", pid).unwrap_or_default()),
            swap_current: read_opt(d, "memory.swap.current"),
            ..MemoryFiles::default()
        }
    } else {
        MemoryFiles {
            version: 1,
            stat,
            usage: read_file(d, "memory.usage_in_bytes", pid)?
                .trim()
                .parse()
                .unwrap_or(0),
            limit: cgroup::parse_limit(
                &read_file(d, "memory.limit_in_bytes", pid).unwrap_or_default(),
            ),
            kmem_usage: read_opt(d, "memory.kmem.usage_in_bytes"),
            tcp_usage: read_opt(d, "memory.kmem.tcp.usage_in_bytes"),
            ..MemoryFiles::default()
        }
    };
    Ok(files)
}

/// v2: the cgroup's `memory.max`, or where it has none, the closest
/// ancestor's as far up as the mount shows (a pod's limit above its
/// containers'): the limit the kernel enforces on it.
fn v2_limit(loc: &Location, pid: Option<i32>) -> Option<u64> {
    let mut dir = loc.dir.as_path();
    loop {
        if let Some(l) = read_file(dir, "memory.max", pid)
            .ok()
            .and_then(|t| cgroup::parse_limit(&t))
        {
            return Some(l);
        }
        if dir == loc.mount_point {
            return None;
        }
        dir = dir.parent().filter(|p| p.starts_with(&loc.mount_point))?;
    }
}

/// The file `reclaim` writes: `memory.reclaim` (v2) or `memory.force_empty` (v1).
pub fn control_file(loc: &Location) -> PathBuf {
    loc.dir.join(if loc.version == 2 {
        "memory.reclaim"
    } else {
        "memory.force_empty"
    })
}

/// The failure for a cgroup filesystem that is read-only here.
fn read_only(loc: &Location, file: &Path, pid: Option<i32>) -> Failure {
    Failure::new(
        exit::READ_ONLY,
        pid,
        format!(
            "cannot write {}: the cgroup filesystem is read-only here (mounted ro at {}, as containers get it); \
             nothing was changed",
            file.display(),
            loc.mount_point.display()
        ),
    )
    .hint(
        "run `memshim-ctl reclaim <pid>` on the host (the pid as the host sees it), or from a DaemonSet that mounts \
         the host's /sys/fs/cgroup read-write (docs/deploy.md, \"Reclaiming a pod's memory\"); \
         `memshim-ctl purge --all` works from here",
    )
}

/// Checks, without changing anything, that `reclaim` may write the
/// cgroup's control file. `Ok(false)`: the kernel has no such file.
pub fn check_writable(loc: &Location, pid: Option<i32>) -> Result<bool, Failure> {
    let file = control_file(loc);
    if !file.exists() {
        return Ok(false);
    }
    if loc.read_only {
        return Err(read_only(loc, &file, pid));
    }
    if loc.version == 1 && loc.dir.join("release_agent").exists() {
        // The hierarchy's root (the only v1 cgroup with `release_agent`,
        // whatever path a namespace shows): the kernel refuses it (EINVAL).
        // Said before anything is purged.
        return Err(root_refused(loc, pid));
    }
    // Opening a cgroup file for writing checks permission and has no effect.
    match std::fs::OpenOptions::new().write(true).open(&file) {
        Ok(_) => Ok(true),
        Err(e) => Err(write_failure(loc, &file, &e, pid)),
    }
}

/// v1's root memory cgroup: the kernel refuses `memory.force_empty` there.
fn root_refused(loc: &Location, pid: Option<i32>) -> Failure {
    Failure::new(
        exit::NO_CGROUP,
        pid,
        format!(
            "the kernel refuses memory.force_empty for {} (the root memory cgroup cannot be emptied); nothing was changed",
            loc.path
        ),
    )
    .hint(
        "reclaim acts on a child cgroup (a container, a service); for the whole machine, \
         /proc/sys/vm/drop_caches",
    )
}

fn write_failure(loc: &Location, file: &Path, e: &io::Error, pid: Option<i32>) -> Failure {
    match e.raw_os_error() {
        Some(30) => read_only(loc, file, pid), // EROFS
        Some(1 | 13) => Failure::new(
            exit::PERMISSION,
            pid,
            format!(
                "permission denied: cannot write {} ({e}); nothing was changed",
                file.display()
            ),
        )
        .hint("run memshim-ctl reclaim as root (or as the owner of a delegated cgroup)"),
        _ => Failure::new(
            exit::FAILED,
            pid,
            format!("writing {}: {e}", file.display()),
        ),
    }
}

/// The kernel step of `reclaim`.
#[derive(Debug, Clone, Serialize)]
pub struct KernelStep {
    /// The file written.
    pub file: String,
    /// What was written (`null` when skipped).
    pub wrote: Option<String>,
    /// Bytes asked for (v2, summed over the batches), `null` for v1's
    /// `force_empty` (everything).
    pub requested: Option<u64>,
    /// Writes made: 1, or with `--to` on v2 one per batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batches: Option<u32>,
    /// `done`, `partial` (v2: the kernel reclaimed less than asked),
    /// `skipped` (nothing to reclaim) or `unsupported` (no such file).
    pub outcome: &'static str,
    /// Milliseconds the write took.
    pub elapsed_ms: f64,
    /// What a person should know about it.
    pub note: Option<String>,
}

/// Whether the machine has swap (then reclaim could push anonymous memory
/// out; `reclaim` restricts itself to file pages).
pub fn swap_enabled() -> bool {
    crate::reach::procfs::read_text("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("SwapTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok()
        })
        .is_some_and(|kb| kb > 0)
}

fn write_once(file: &Path, text: &str) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)?
        .write_all(text.as_bytes())
}

/// Asks the kernel to reclaim the cgroup's page cache (and reclaimable
/// slab), file pages only. v2: `memory.reclaim` with the page cache's size
/// (`swappiness=0` when there is swap). v1: `memory.force_empty`, which
/// reclaims all it can, with the cgroup's `memory.swappiness` set to 0 for
/// the duration when there is swap.
pub fn reclaim_kernel(
    loc: &Location,
    before: &CgroupMemory,
    swap: bool,
    pid: Option<i32>,
) -> Result<KernelStep, Failure> {
    let file = control_file(loc);
    let mut step = KernelStep {
        file: file.display().to_string(),
        wrote: None,
        requested: None,
        batches: None,
        outcome: "done",
        elapsed_ms: 0.0,
        note: None,
    };
    if !file.exists() {
        step.outcome = "unsupported";
        step.note = Some(if loc.version == 2 {
            "this kernel has no memory.reclaim (Linux 5.19 or later has it); the kernel still reclaims page cache by \
             itself as the cgroup nears memory.high or memory.max"
                .into()
        } else {
            "this kernel has no memory.force_empty".into()
        });
        return Ok(step);
    }
    let t = Instant::now();
    if loc.version == 2 {
        let amount = before.page_cache + before.slab_reclaimable.unwrap_or(0);
        if amount == 0 {
            step.outcome = "skipped";
            step.note = Some("no page cache to reclaim".into());
            return Ok(step);
        }
        step.requested = Some(amount);
        let mut text = if swap {
            format!("{amount} swappiness=0")
        } else {
            amount.to_string()
        };
        let mut r = write_once(&file, &text);
        if swap && r.as_ref().err().and_then(io::Error::raw_os_error) == Some(22) {
            // EINVAL: a kernel before 6.8 has no swappiness key.
            text = amount.to_string();
            step.note = Some("this kernel's memory.reclaim has no swappiness key: some anonymous memory may have \
                              been swapped out too"
                .into());
            r = write_once(&file, &text);
        }
        step.wrote = Some(text);
        match r {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(11) => {
                // EAGAIN: less than asked could be reclaimed.
                step.outcome = "partial";
                step.note = Some(
                    "the kernel reclaimed less than asked: the rest is in use (mapped and touched again, dirty, or \
                     under writeback)"
                        .into(),
                );
            }
            Err(e) => return Err(write_failure(loc, &file, &e, pid)),
        }
    } else {
        let swappiness = loc.dir.join("memory.swappiness");
        let old = crate::reach::procfs::read_text(&swappiness)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let lowered = swap && !old.is_empty() && old != "0" && write_once(&swappiness, "0").is_ok();
        step.wrote = Some("0".into());
        let r = write_once(&file, "0");
        if lowered {
            let _ = write_once(&swappiness, &old);
            step.note = Some(format!(
                "memory.swappiness was 0 during force_empty (restored to {old}) so that only file pages were reclaimed"
            ));
        } else if swap && old != "0" {
            step.note = Some(
                "the machine has swap: force_empty may also have swapped anonymous memory out"
                    .into(),
            );
        }
        match r {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(22) => return Err(root_refused(loc, pid)),
            Err(e) => return Err(write_failure(loc, &file, &e, pid)),
        }
    }
    step.elapsed_ms = t.elapsed().as_secs_f64() * 1000.0;
    Ok(step)
}

/// Largest amount one write of `memory.reclaim` asks for with `--to`: in
/// batches, so that reclaim stops as soon as usage is under the size asked
/// (one large request takes what it can, and more than needed).
pub const RECLAIM_BATCH: u64 = 64 << 20;

/// `reclaim --to`: asks the kernel to reclaim page cache until usage is at
/// most `target`. v2: `memory.reclaim` in batches of at most
/// [`RECLAIM_BATCH`] (file pages only where there is swap), until usage is
/// under `target`, the kernel reclaims less than asked, usage stops falling,
/// or the page cache and reclaimable slab found at the start have been
/// asked for. v1: `memory.force_empty` once (it takes all it can).
pub fn reclaim_kernel_to(
    loc: &Location,
    target: u64,
    swap: bool,
    pid: Option<i32>,
) -> Result<KernelStep, Failure> {
    let start = read_memory(loc, pid)?;
    if start.usage <= target {
        return Ok(KernelStep {
            file: control_file(loc).display().to_string(),
            wrote: None,
            requested: None,
            batches: None,
            outcome: "skipped",
            elapsed_ms: 0.0,
            note: Some("usage is under the size asked already".into()),
        });
    }
    if loc.version != 2 {
        return reclaim_kernel(loc, &start, swap, pid);
    }
    let file = control_file(loc);
    let mut step = KernelStep {
        file: file.display().to_string(),
        wrote: None,
        requested: Some(0),
        batches: Some(0),
        outcome: "done",
        elapsed_ms: 0.0,
        note: None,
    };
    if !file.exists() {
        return reclaim_kernel(loc, &start, swap, pid);
    }
    let t = Instant::now();
    let budget = start.page_cache + start.slab_reclaimable.unwrap_or(0);
    let mut asked = 0u64;
    let mut usage = start.usage;
    let mut key = swap.then_some(" swappiness=0");
    while usage > target && asked < budget {
        let ask = (usage - target)
            .min(RECLAIM_BATCH)
            .min(budget - asked)
            .max(1 << 20);
        let text = format!("{ask}{}", key.unwrap_or(""));
        let mut r = write_once(&file, &text);
        if key.is_some() && r.as_ref().err().and_then(io::Error::raw_os_error) == Some(22) {
            // EINVAL: a kernel before 6.8 has no swappiness key.
            key = None;
            step.note = Some("this kernel's memory.reclaim has no swappiness key: some anonymous memory may have \
                              been swapped out too"
                .into());
            r = write_once(&file, &ask.to_string());
        }
        asked += ask;
        step.requested = Some(asked);
        step.batches = step.batches.map(|b| b + 1);
        step.wrote = Some(text);
        match r {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(11) => {
                step.outcome = "partial";
                break;
            }
            Err(e) => return Err(write_failure(loc, &file, &e, pid)),
        }
        let now = read_memory(loc, pid)?.usage;
        if now >= usage {
            step.outcome = "partial";
            break;
        }
        usage = now;
    }
    if asked == 0 {
        step.outcome = "skipped";
        step.note = Some(if usage <= target {
            "usage is under the size asked already".into()
        } else {
            "no page cache to reclaim".into()
        });
    } else if step.outcome == "partial" {
        step.note = Some(
            "the kernel reclaimed less than asked: the rest is in use (mapped and touched again, dirty, or under \
             writeback)"
                .into(),
        );
    }
    step.elapsed_ms = t.elapsed().as_secs_f64() * 1000.0;
    Ok(step)
}

#[cfg(test)]
#[path = "fs_tests.rs"]
mod tests;
