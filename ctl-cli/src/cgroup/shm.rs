//! The `/dev/shm` files a cgroup's processes see, and whether any live
//! process still maps them or holds them open.
//!
//! Files left in `/dev/shm` by dead workers (torch and multiprocessing
//! shared memory, POSIX semaphores) stay in memory, charged as `shmem` to
//! the cgroup that first wrote them, until someone deletes them.
//!
//! * The directories: `/dev/shm` as each process of the cgroup sees it,
//!   once per filesystem: ours when its mountinfo shows the same mount
//!   there, else `/proc/<pid>/root/dev/shm` (across mount namespaces).
//! * A file is **in use** when some process maps it (`/proc/*/maps`: device
//!   and inode columns) or has it open (`/proc/*/fd/*`, by device and inode,
//!   which works across mount namespaces); **unowned** when no process does;
//!   **unknown** when no readable process does but some process that has
//!   this filesystem mounted could not be read (another user's without
//!   root, or a non-dumpable one). A process whose mount table lacks the
//!   filesystem cannot open its files and is not needed.
//! * Files already deleted but still held open or mapped are listed too
//!   (they are in use, by definition), from the `/proc/*/fd` and
//!   `/proc/*/map_files` entries that point at a `/dev/shm` filesystem.
//! * **Whose charge** ([`attribute`]): a tmpfs page is charged to the cgroup
//!   whose process first touched it, not to the cgroups that see the file
//!   (a node's `/dev/shm` bound into several containers, a file another
//!   pod wrote). The kernel offers no per-file answer without mapping the
//!   file, so the listing is held against the cgroup's own `shmem` charge:
//!   where the files hold more than the cgroup is charged for tmpfs, not
//!   all of them are its own; an unowned file is then `charged_elsewhere`
//!   (the cgroup is charged nothing for tmpfs) or `unattributed`, and
//!   deleting it is never suggested: it would free another cgroup's
//!   memory, or none of this one's.

use crate::reach::procfs;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Entries walked per directory tree at most.
const WALK_LIMIT: usize = 100_000;

/// One file.
#[derive(Debug, Clone, Serialize)]
pub struct ShmFile {
    /// The path as the cgroup's processes see it (`/dev/shm/...`), with
    /// ` (deleted)` for a deleted file still held.
    pub path: String,
    /// Where memshim-ctl reached it (differs across mount namespaces).
    pub reached_at: String,
    /// Memory it holds (allocated blocks, `st_blocks * 512`).
    pub bytes: u64,
    /// Its size (`st_size`; a sparse file holds less).
    pub size: u64,
    /// `in_use`, `unowned` (no process holds it, and this cgroup's tmpfs
    /// charge covers the files listed), `unknown` (a process that could
    /// hold it could not be read), `charged_elsewhere` or `unattributed`
    /// (no process holds it, but this cgroup is charged for less tmpfs than
    /// the files hold: nothing, or less; [`attribute`]).
    pub state: &'static str,
    /// Processes that map it or hold it open.
    pub users: Vec<i32>,
}

/// The `/dev/shm` part of `memshim-ctl cgroup`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ShmReport {
    /// The directories listed (as reached from here).
    pub dirs: Vec<String>,
    /// Their files, largest first.
    pub files: Vec<ShmFile>,
    /// Sum of `bytes` of all files.
    pub bytes: u64,
    /// Sum of `bytes` of unowned files: what deleting them gives back to
    /// this cgroup.
    pub unowned_bytes: u64,
    /// This cgroup's `shmem` charge, when [`attribute`] held the files
    /// against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charged: Option<u64>,
    /// Processes that have one of these filesystems mounted but whose maps
    /// or descriptors could not be read.
    pub unreadable_processes: usize,
    /// Processes of the cgroup whose `/dev/shm` could not be reached
    /// (`/proc/<pid>/root` needs root or the process's uid).
    pub unreachable: Vec<i32>,
}

/// Linux `dev_t` as glibc encodes it: (major, minor).
fn major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    (major, minor)
}

/// The mount at `/dev/shm` in a mountinfo text: (mount id, device).
fn shm_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && f[4] == "/dev/shm").then(|| (f[0].to_owned(), f[2].to_owned()))
    })
}

/// The `/dev/shm` that `pid` sees, as we reach it: ours when its mount
/// there is the very mount we see (mountinfo is readable without ptrace
/// rights), else through `/proc/<pid>/root` (needs them).
fn dev_shm_of(pid: i32) -> Option<PathBuf> {
    let view = procfs::view(pid);
    let theirs = procfs::read_text(view.join("mountinfo")).ok();
    let ours = procfs::read_text("/proc/self/mountinfo").ok();
    let (theirs, ours) = (
        theirs.as_deref().and_then(shm_mount),
        ours.as_deref().and_then(shm_mount),
    );
    if theirs.is_some() && theirs == ours {
        return Some(PathBuf::from("/dev/shm"));
    }
    let via_root = view.join("root/dev/shm");
    if std::fs::metadata(&via_root).is_ok() {
        return Some(via_root);
    }
    // No /dev/shm mount on either side (a plain directory) in one mount
    // namespace.
    (theirs.is_none() && ours.is_none() && procfs::same_mount_ns(&view))
        .then(|| PathBuf::from("/dev/shm"))
}

/// The `/dev/shm` of each of `pids` (deduplicated by filesystem), and the
/// pids whose `/dev/shm` could not be reached.
fn shm_dirs(pids: &[i32]) -> (Vec<(PathBuf, u64)>, Vec<i32>) {
    let mut out: Vec<(PathBuf, u64)> = vec![];
    let mut unreachable = vec![];
    for &pid in pids {
        let Some(dir) = dev_shm_of(pid) else {
            if std::fs::metadata(format!("/proc/{pid}")).is_ok() {
                unreachable.push(pid);
            }
            continue;
        };
        if let Ok(m) = std::fs::metadata(&dir)
            && m.is_dir()
            && !out.iter().any(|(_, d)| *d == m.dev())
        {
            out.push((dir, m.dev()));
        }
    }
    (out, unreachable)
}

/// Regular files under `dir`, keyed by (device, inode).
fn walk(dir: &Path, shown: &Path, files: &mut BTreeMap<(u64, u64), ShmFile>) {
    let mut stack = vec![(dir.to_path_buf(), shown.to_path_buf(), 0)];
    let mut n = 0;
    while let Some((d, s, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            n += 1;
            if n > WALK_LIMIT {
                return;
            }
            let Ok(m) = e.metadata() else { continue };
            let shown = s.join(e.file_name());
            if m.is_dir() && depth < 8 {
                stack.push((e.path(), shown, depth + 1));
            } else if m.is_file() {
                files.insert(
                    (m.dev(), m.ino()),
                    ShmFile {
                        path: shown.display().to_string(),
                        reached_at: e.path().display().to_string(),
                        bytes: m.blocks() * 512,
                        size: m.len(),
                        state: "unowned",
                        users: vec![],
                    },
                );
            }
        }
    }
}

/// Which of the filesystems `devs` `pid` has mounted (so could open their
/// files): none when the process has exited meanwhile (it holds nothing
/// any more), all of them when its mount table cannot be read for another
/// reason. `/proc/<pid>/mountinfo` is readable where its maps and
/// descriptors are not.
fn mounted_of(pid: i32, devs: &BTreeSet<(u64, u64)>) -> BTreeSet<(u64, u64)> {
    use std::io::ErrorKind::{InvalidInput, NotFound};
    let mi = match procfs::read_text(procfs::view(pid).join("mountinfo")) {
        Ok(mi) => mi,
        // ENOENT once reaped; EINVAL while exiting (no mount namespace);
        // ESRCH (3), which has no ErrorKind of its own.
        Err(e) if matches!(e.kind(), NotFound | InvalidInput) || e.raw_os_error() == Some(3) => {
            return BTreeSet::new();
        }
        Err(_) => return devs.clone(),
    };
    mi.lines()
        .filter_map(|l| {
            let (a, b) = l.split(' ').nth(2)?.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .filter(|d| devs.contains(d))
        .collect()
}

/// One `maps` line's device and inode, and whether it is a deleted file.
fn maps_entry(line: &str) -> Option<((u64, u64), u64, &str, bool)> {
    let mut f = line.split_whitespace();
    let range = f.next()?;
    let _perms = f.next()?;
    let _off = f.next()?;
    let (ma, mi) = f.next()?.split_once(':')?;
    let ino: u64 = f.next()?.parse().ok()?;
    if ino == 0 {
        return None;
    }
    let dev = (
        u64::from_str_radix(ma, 16).ok()?,
        u64::from_str_radix(mi, 16).ok()?,
    );
    Some((dev, ino, range, line.ends_with(" (deleted)")))
}

/// Lists the `/dev/shm` files seen by `pids` and who uses them.
pub fn scan(pids: &[i32]) -> ShmReport {
    let (dirs, unreachable) = shm_dirs(pids);
    let mut files = BTreeMap::new();
    for (d, _) in &dirs {
        walk(d, Path::new("/dev/shm"), &mut files);
    }
    let devs: BTreeSet<(u64, u64)> = dirs.iter().map(|(_, d)| major_minor(*d)).collect();
    let raw_devs: BTreeSet<u64> = dirs.iter().map(|(_, d)| *d).collect();
    let mut users: BTreeMap<(u64, u64), BTreeSet<i32>> = BTreeMap::new();
    let mut deleted: BTreeMap<(u64, u64), ShmFile> = BTreeMap::new();
    let mut unreadable = 0;
    // The filesystems an unreadable process has mounted: their files may
    // be that process's, the others' not.
    let mut unsure: BTreeSet<(u64, u64)> = BTreeSet::new();
    if !dirs.is_empty() {
        let me = std::process::id() as i32;
        for pid in procfs::all_pids() {
            if pid == me || procfs::is_kernel_thread(pid) {
                continue;
            }
            let mut denied = false;
            // A running thread's files, if the main thread has exited.
            let base = procfs::view(pid);
            match procfs::read_text(base.join("maps")) {
                Ok(maps) => {
                    for (dev, ino, range, gone) in maps.lines().filter_map(maps_entry) {
                        if !devs.contains(&dev) {
                            continue;
                        }
                        let link = base.join("map_files").join(range).display().to_string();
                        match std::fs::metadata(&link) {
                            Ok(m) if gone || m.nlink() == 0 => {
                                note_deleted(&mut deleted, &m, pid, &link);
                            }
                            Ok(m) => {
                                users.entry((m.dev(), m.ino())).or_default().insert(pid);
                            }
                            // map_files needs CAP_SYS_ADMIN: match by the
                            // maps columns (device numbers as the kernel
                            // prints them), which the directory's own stat
                            // translates.
                            Err(_) => {
                                for raw in raw_devs.iter().filter(|r| major_minor(**r) == dev) {
                                    users.entry((*raw, ino)).or_default().insert(pid);
                                }
                            }
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied = true,
                Err(_) => continue, // exited meanwhile
            }
            match std::fs::read_dir(base.join("fd")) {
                Ok(rd) => {
                    for e in rd.flatten() {
                        let Ok(m) = std::fs::metadata(e.path()) else {
                            continue;
                        };
                        if !raw_devs.contains(&m.dev()) || !m.is_file() {
                            continue;
                        }
                        if m.nlink() == 0 {
                            note_deleted(&mut deleted, &m, pid, &e.path().display().to_string());
                        } else {
                            users.entry((m.dev(), m.ino())).or_default().insert(pid);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied = true,
                Err(_) => {}
            }
            if denied {
                let seen = mounted_of(pid, &devs);
                if !seen.is_empty() {
                    unreadable += 1;
                    unsure.extend(seen);
                }
            }
        }
    }
    let mut out = ShmReport {
        dirs: dirs.iter().map(|(d, _)| d.display().to_string()).collect(),
        unreadable_processes: unreadable,
        unreachable,
        ..ShmReport::default()
    };
    for (key, mut f) in files {
        if let Some(u) = users.get(&key) {
            f.users = u.iter().copied().collect();
        }
        f.state = if !f.users.is_empty() {
            "in_use"
        } else if unsure.contains(&major_minor(key.0)) {
            "unknown"
        } else {
            "unowned"
        };
        out.files.push(f);
    }
    out.files.extend(deleted.into_values());
    out.files
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.path.cmp(&b.path)));
    out.bytes = out.files.iter().map(|f| f.bytes).sum();
    out.unowned_bytes = out
        .files
        .iter()
        .filter(|f| f.state == "unowned")
        .map(|f| f.bytes)
        .sum();
    out
}

/// Tolerance of [`attribute`]: the charge is counted in pages, the files
/// in filesystem blocks.
const CHARGE_SLACK: u64 = 1 << 20;

/// Holds the listing against `charged`, the cgroup's `shmem` charge
/// (module docs, "Whose charge"). Where the files hold more, unowned files
/// become `charged_elsewhere` (nothing is charged) or `unattributed`, and
/// no longer count in `unowned_bytes`.
pub fn attribute(r: &mut ShmReport, charged: u64) {
    r.charged = Some(charged);
    if r.bytes <= charged.saturating_add(CHARGE_SLACK) {
        return;
    }
    let state = if charged < CHARGE_SLACK {
        "charged_elsewhere"
    } else {
        "unattributed"
    };
    for f in r.files.iter_mut().filter(|f| f.state == "unowned") {
        f.state = state;
    }
    r.unowned_bytes = 0;
}

/// Records a deleted file that `pid` still holds (`link` is the
/// `/proc` entry it was seen through).
fn note_deleted(
    deleted: &mut BTreeMap<(u64, u64), ShmFile>,
    m: &std::fs::Metadata,
    pid: i32,
    link: &str,
) {
    let f = deleted.entry((m.dev(), m.ino())).or_insert_with(|| {
        let name = std::fs::read_link(link)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| format!("/dev/shm/<inode {}> (deleted)", m.ino()));
        let name = if name.ends_with(" (deleted)") {
            name
        } else {
            format!("{name} (deleted)")
        };
        ShmFile {
            path: name,
            reached_at: link.to_owned(),
            bytes: m.blocks() * 512,
            size: m.len(),
            state: "in_use",
            users: vec![],
        }
    });
    if !f.users.contains(&pid) {
        f.users.push(pid);
        f.users.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_decode_like_the_kernel_prints_them() {
        // makedev(0, 0x1b) and makedev(259, 1) in glibc's encoding.
        assert_eq!(major_minor(0x1b), (0, 0x1b));
        assert_eq!(major_minor((259 << 8) | 1), (259, 1));
        assert_eq!(major_minor((0x1000 << 32) | 0x100 | 0x20), (0x1001, 0x20));
    }

    #[test]
    fn maps_lines_give_device_inode_and_deletion() {
        let l = "7f3a1c000000-7f3a1c400000 rw-s 00000000 00:1b 4242                       /dev/shm/torch_1_2";
        assert_eq!(
            maps_entry(l),
            Some(((0, 0x1b), 4242, "7f3a1c000000-7f3a1c400000", false))
        );
        let d = "7f3a1c000000-7f3a1c400000 rw-s 00000000 00:1b 77 /dev/shm/x (deleted)";
        assert!(maps_entry(d).unwrap().3);
        assert_eq!(
            maps_entry("7ffd0000-7ffd1000 rw-p 00000000 00:00 0   [stack]"),
            None
        );
        assert_eq!(maps_entry("garbage"), None);
    }

    #[test]
    fn the_visible_dev_shm_mount_is_the_last_one_there() {
        let mi = "24 27 0:6 / /dev rw - devtmpfs devtmpfs rw\n25 24 0:23 / /dev/shm rw - tmpfs tmpfs rw\n\
                  30 25 0:27 / /dev/shm rw - tmpfs tmpfs rw\n";
        assert_eq!(shm_mount(mi), Some(("30".into(), "0:27".into())));
        assert_eq!(
            shm_mount("24 27 0:6 / /dev rw - devtmpfs devtmpfs rw\n"),
            None
        );
    }

    #[test]
    fn files_hold_against_the_cgroups_tmpfs_charge() {
        let file = |bytes, state| ShmFile {
            path: "/dev/shm/x".into(),
            reached_at: "/dev/shm/x".into(),
            bytes,
            size: bytes,
            state,
            users: vec![],
        };
        let report = |files: Vec<ShmFile>| {
            let mut r = ShmReport {
                bytes: files.iter().map(|f| f.bytes).sum(),
                unowned_bytes: files
                    .iter()
                    .filter(|f| f.state == "unowned")
                    .map(|f| f.bytes)
                    .sum(),
                files,
                ..ShmReport::default()
            };
            r.charged = None;
            r
        };
        // The cgroup is charged for what is listed: unowned stays unowned.
        let mut r = report(vec![file(60 << 20, "unowned"), file(8 << 20, "in_use")]);
        attribute(&mut r, 70 << 20);
        assert_eq!((r.files[0].state, r.unowned_bytes), ("unowned", 60 << 20));
        // Charged nothing for tmpfs: another cgroup's.
        let mut r = report(vec![file(60 << 20, "unowned")]);
        attribute(&mut r, 0);
        assert_eq!(
            (r.files[0].state, r.unowned_bytes),
            ("charged_elsewhere", 0)
        );
        // Charged less than the files hold: not said whose.
        let mut r = report(vec![file(60 << 20, "unowned"), file(50 << 20, "unowned")]);
        attribute(&mut r, 50 << 20);
        assert!(r.files.iter().all(|f| f.state == "unattributed"));
        assert_eq!((r.unowned_bytes, r.charged), (0, Some(50 << 20)));
    }

    #[test]
    fn a_file_nobody_holds_is_unowned_and_one_we_hold_is_in_use() {
        let dir = std::env::temp_dir().join(format!("memshim-shm-unit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/left"), vec![1u8; 8192]).unwrap();
        let mut files = BTreeMap::new();
        walk(&dir, Path::new("/dev/shm"), &mut files);
        let f: Vec<&ShmFile> = files.values().collect();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].path, "/dev/shm/sub/left");
        assert_eq!((f[0].size, f[0].bytes >= 8192), (8192, true));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
