//! The process's memory cgroup, for the `cgroup` section of `stats`: where
//! it is (`/proc/self/cgroup`, v2 or v1's `memory` controller) and what it
//! holds; and, for the pressure watcher (thread/pressure.rs), the cgroup
//! whose limit applies, its notifications (v1 `cgroup.event_control`, v2
//! PSI triggers and `memory.events`) and the kernel's file formats.
//! Shim's thread (it reads files).

use super::fd::{self, Owned};
use memshim_proto::cgroup::{
    MemoryFiles, cgroup_mounts, keyed, parse_flat_keyed, parse_limit, parse_limit_bytes,
    parse_proc_cgroup, path_in_mount, usage_and_limit_files,
};

/// Joins a mount point and a cgroup path, falling back to the mount point
/// itself when the path is not visible there (a container without a cgroup
/// namespace sees the host's path but has its own cgroup mounted at root).
fn locate(mount: &str, path: &str, probe: &str) -> Option<(String, String)> {
    let full = format!("{mount}{}", path.trim_end_matches('/'));
    if std::path::Path::new(&format!("{full}/{probe}")).exists() {
        return Some((full, path.to_owned()));
    }
    std::path::Path::new(&format!("{mount}/{probe}"))
        .exists()
        .then(|| (mount.to_owned(), "/".to_owned()))
}

/// The directory of the process's memory cgroup: (version, directory,
/// mount point, path inside the hierarchy). v2 preferred. The mount points
/// are the process's own cgroup mounts (`/proc/self/mountinfo`, read by
/// proto's `cgroup_mounts`, as `memshim-ctl cgroup` reads them), each with
/// the cgroup path made relative to the cgroup the mount shows; where
/// mountinfo cannot be read, the usual places.
fn own_dir() -> Option<(u8, String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let found = parse_proc_cgroup(&text);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| cgroup_mounts(&t))
        .unwrap_or_default();
    // (mount point, the path to join to it) for each candidate mount.
    let candidates = |v2: bool, path: &str| -> Vec<(String, String)> {
        let mut c: Vec<(String, String)> = mounts
            .iter()
            .filter(|m| if v2 { m.v2 } else { m.memory })
            .map(|m| {
                let rel = path_in_mount(path, &m.root).unwrap_or_else(|| path.to_owned());
                (m.mount_point.clone(), rel)
            })
            .collect();
        if mounts.is_empty() {
            let usual: &[&str] = if v2 {
                &["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            } else {
                &["/sys/fs/cgroup/memory"]
            };
            c.extend(usual.iter().map(|m| ((*m).to_owned(), path.to_owned())));
        }
        c
    };
    if let Some(p) = &found.v2 {
        for (mount, rel) in candidates(true, p) {
            if let Some((dir, path)) = locate(&mount, &rel, "memory.current") {
                return Some((2, dir, mount, path));
            }
        }
    }
    let p = found.v1_memory?;
    for (mount, rel) in candidates(false, &p) {
        if let Some((dir, path)) = locate(&mount, &rel, "memory.usage_in_bytes") {
            return Some((1, dir, mount, path));
        }
    }
    None
}

/// The process's memory cgroup (v2 preferred, v1 `memory` controller
/// otherwise): its path inside the hierarchy and its files, `None` without
/// one. memshim-proto derives the figures, as for `memshim-ctl cgroup`.
pub fn memory() -> Option<(String, MemoryFiles)> {
    let (version, dir, mount, path) = own_dir()?;
    let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).ok();
    let number = |name: &str| read(name)?.trim().parse().ok();
    let (usage, limit) = usage_and_limit_files(version);
    let v2 = version == 2;
    let files = MemoryFiles {
        version,
        stat: parse_flat_keyed(&read("memory.stat").unwrap_or_default()),
        usage: number(usage)?,
        // v2 without a limit of its own: the closest ancestor's (v1's is in
        // `memory.stat`, which memshim-proto reads).
        limit: read(limit)
            .and_then(|t| parse_limit(&t))
            .or_else(|| v2.then(|| ancestor_max(&dir, &mount)).flatten()),
        high: v2
            .then(|| read("memory.high"))
            .flatten()
            .and_then(|t| parse_limit(&t)),
        kmem_usage: (!v2)
            .then(|| number("memory.kmem.usage_in_bytes"))
            .flatten(),
        tcp_usage: (!v2)
            .then(|| number("memory.kmem.tcp.usage_in_bytes"))
            .flatten(),
        swap_current: v2.then(|| number("memory.swap.current")).flatten(),
    };
    Some((path, files))
}

/// v2: the `memory.max` of the closest ancestor of `dir` that has one, as
/// far up as `mount`.
fn ancestor_max(dir: &str, mount: &str) -> Option<u64> {
    let mut d = dir.to_owned();
    while d.len() > mount.len() {
        d.truncate(d.rfind('/')?);
        if let Some(l) = std::fs::read_to_string(format!("{d}/memory.max"))
            .ok()
            .and_then(|t| parse_limit(&t))
        {
            return Some(l);
        }
    }
    None
}

// --- the pressure watcher's view (thread/pressure.rs) ------------------------

/// The nearest memory cgroup with a limit: the process's own, or the
/// closest ancestor visible under the mount point (a pod-level limit above
/// a container's cgroup).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    /// 1 or 2.
    pub version: u8,
    /// The process's own cgroup directory (its PSI is read there).
    pub own: String,
    /// The directory of the cgroup with the limit.
    pub dir: String,
    /// The limit in bytes: v1 `memory.limit_in_bytes`; v2 the lower of
    /// `memory.high` and `memory.max`.
    pub limit: u64,
}

/// The limit of the cgroup at `dir` (see [`Limited::limit`]).
fn limit_at(version: u8, dir: &str) -> Option<u64> {
    let read = |name: &str| {
        std::fs::read(format!("{dir}/{name}"))
            .ok()
            .and_then(|t| parse_limit_bytes(&t))
    };
    match version {
        1 => read("memory.limit_in_bytes"),
        _ => match (read("memory.high"), read("memory.max")) {
            (Some(h), Some(m)) => Some(h.min(m)),
            (h, m) => h.or(m),
        },
    }
}

/// The cgroup whose limit applies to the process, `None` where no memory
/// cgroup or no limit is visible.
pub fn limited() -> Option<Limited> {
    let (version, own, mount, _) = own_dir()?;
    let mut dir = own.clone();
    loop {
        if let Some(limit) = limit_at(version, &dir) {
            return Some(Limited {
                version,
                own,
                dir,
                limit,
            });
        }
        if dir.len() <= mount.len() {
            return None;
        }
        dir.truncate(dir.rfind('/')?);
    }
}

/// Memory that reclaim can take without the allocator's help: the
/// inactive page cache. Usage minus this is the working set Kubernetes
/// reads.
pub fn inactive_file(version: u8, stat: &[u8]) -> u64 {
    keyed(stat, memshim_proto::cgroup::inactive_file_key(version)).unwrap_or(0)
}

/// Opens `dir/name` as the shim's own descriptor.
pub fn open_in(dir: &str, name: &str, flags: i32) -> Option<Owned> {
    let path = std::ffi::CString::new(format!("{dir}/{name}")).ok()?;
    fd::open_file(&path, flags).ok()
}

/// Reads a cgroup file held open from its start (each read is a fresh
/// snapshot; for `memory.events` it also re-arms `POLLPRI`). Returns the
/// number of bytes read.
pub fn read_at_start(f: &Owned, buf: &mut [u8]) -> Option<usize> {
    let fd = f.fd()?;
    let mut len = 0;
    while len < buf.len() {
        match super::raw::pread(fd, &mut buf[len..], len) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(libc::EINTR) => continue,
            Err(_) => return None,
        }
    }
    Some(len)
}

/// Asks a v1 memory cgroup to signal `efd` (an eventfd of ours) through
/// `cgroup.event_control`: on crossings of a usage threshold
/// (`file` = `memory.usage_in_bytes`, `args` = bytes) or on a pressure
/// level (`memory.pressure_level`, `low`/`medium`/`critical`). The event
/// lasts as long as the eventfd: closing it unregisters it. Returns
/// whether the kernel took it.
pub fn v1_event(dir: &str, efd: &Owned, file: &str, args: &str) -> bool {
    let (Some(target), Some(ctl)) = (
        open_in(dir, file, libc::O_RDONLY),
        open_in(dir, "cgroup.event_control", libc::O_WRONLY),
    ) else {
        return false;
    };
    let (Some(e), Some(t), Some(c)) = (efd.fd(), target.fd(), ctl.fd()) else {
        return false;
    };
    let line = format!("{e} {t} {args}");
    super::raw::write(c, line.as_bytes()).is_ok_and(|n| n == line.len())
}

/// Reads (and so resets) an eventfd's counter: how many notifications
/// arrived since the last read.
pub fn drain_eventfd(efd: &Owned) -> u64 {
    let mut b = [0u8; 8];
    match efd.fd().map(|fd| super::raw::read(fd, &mut b)) {
        Some(Ok(8)) => u64::from_ne_bytes(b),
        _ => 0,
    }
}

/// A PSI trigger on the v2 cgroup at `dir` (`memory.pressure`): the
/// descriptor gets `POLLPRI` when tasks stalled on memory for `stall_us`
/// within a `window_us` window. Unprivileged processes may only use
/// windows that are multiples of 2 s, so a 1 s window that is refused is
/// retried at 2 s (with twice the stall).
pub fn psi_trigger(dir: &str, stall_us: u64, window_us: u64) -> Option<Owned> {
    psi_trigger_at(&format!("{dir}/memory.pressure"), stall_us, window_us)
}

/// [`psi_trigger`] on a PSI file (a cgroup's `memory.pressure`, or the
/// system's `/proc/pressure/memory`, which takes the same triggers).
fn psi_trigger_at(path: &str, stall_us: u64, window_us: u64) -> Option<Owned> {
    let path = std::ffi::CString::new(path).ok()?;
    for (stall, window) in [
        (stall_us, window_us),
        (stall_us * 2, window_us.max(1_000_000) * 2),
    ] {
        let f = fd::open_file(&path, libc::O_RDWR | libc::O_NONBLOCK).ok()?;
        // The kernel overwrites the last byte written with a NUL.
        let spec = format!("some {stall} {window}\0");
        if f.fd()
            .is_some_and(|fd| super::raw::write(fd, spec.as_bytes()).is_ok())
        {
            return Some(f);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trigger written is one the kernel takes: `/proc/pressure/memory`
    /// parses triggers with the same code as a v2 cgroup's
    /// `memory.pressure` (skipped where PSI is off or not ours to write).
    #[test]
    fn psi_trigger_is_accepted_by_the_kernel() {
        if !std::path::Path::new("/proc/pressure/memory").exists() {
            eprintln!("SKIP: no /proc/pressure/memory");
            return;
        }
        match psi_trigger_at("/proc/pressure/memory", 100_000, 1_000_000) {
            Some(f) => assert!(f.fd().is_some()),
            None => {
                let e = std::fs::OpenOptions::new()
                    .write(true)
                    .open("/proc/pressure/memory")
                    .err();
                assert!(e.is_some(), "the kernel refused a valid trigger");
                eprintln!("SKIP: /proc/pressure/memory not writable: {e:?}");
            }
        }
    }

    #[test]
    fn inactive_file_of_both_versions() {
        let v1 = b"cache 100\nrss 5\ninactive_file 1\ntotal_cache 300\ntotal_inactive_file 250\n";
        assert_eq!(inactive_file(1, v1), 250);
        let v2 = b"anon 5\nfile 300\nactive_file 50\ninactive_file 250\n";
        assert_eq!(inactive_file(2, v2), 250);
        assert_eq!(inactive_file(2, b"anon 1\n"), 0);
    }
}
