//! The process's memory cgroup, for the `cgroup` section of `stats`: where
//! it is (`/proc/self/cgroup`, v2 or v1's `memory` controller) and what it
//! holds. Shim's thread (it reads files).

/// What the memory cgroup holds, in bytes (docs/stats.md, "cgroup").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// 1 or 2.
    pub version: u8,
    /// Its path inside the hierarchy.
    pub path: String,
    /// Usage now.
    pub current: u64,
    /// The limit, `None` for none.
    pub max: Option<u64>,
    /// Anonymous memory.
    pub anon: Option<u64>,
    /// Page cache.
    pub file: Option<u64>,
    /// Kernel memory.
    pub kernel: Option<u64>,
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// Where the process's memory cgroup is, from `/proc/self/cgroup`.
/// Returns (version, path inside the hierarchy).
pub fn parse_cgroup_file(text: &str) -> (Option<String>, Option<String>) {
    let mut v2 = None;
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2 = Some(path.to_owned());
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_owned());
        }
    }
    (v2, v1)
}

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

/// The process's memory cgroup (v2 preferred, v1 `memory` controller
/// otherwise), `None` without one.
pub fn memory() -> Option<Memory> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v2, v1) = parse_cgroup_file(&text);
    if let Some(p) = &v2 {
        for mount in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            if let Some((dir, path)) = locate(mount, p, "memory.current") {
                let stat =
                    std::fs::read_to_string(format!("{dir}/memory.stat")).unwrap_or_default();
                let kernel = stat_field(&stat, "kernel").or_else(|| {
                    let parts = ["kernel_stack", "pagetables", "percpu", "sock", "slab"];
                    let v: Vec<u64> = parts.iter().filter_map(|k| stat_field(&stat, k)).collect();
                    (!v.is_empty()).then(|| v.iter().sum())
                });
                return Some(Memory {
                    version: 2,
                    path,
                    current: read_u64(&format!("{dir}/memory.current"))?,
                    max: read_u64(&format!("{dir}/memory.max")), // "max" does not parse: no limit
                    anon: stat_field(&stat, "anon"),
                    file: stat_field(&stat, "file"),
                    kernel,
                });
            }
        }
    }
    let p = v1?;
    let (dir, path) = locate("/sys/fs/cgroup/memory", &p, "memory.usage_in_bytes")?;
    let stat = std::fs::read_to_string(format!("{dir}/memory.stat")).unwrap_or_default();
    // v1 reports "no limit" as a huge page-rounded number.
    let max = read_u64(&format!("{dir}/memory.limit_in_bytes")).filter(|&m| m < 1 << 62);
    Some(Memory {
        version: 1,
        path,
        current: read_u64(&format!("{dir}/memory.usage_in_bytes"))?,
        max,
        anon: stat_field(&stat, "total_rss"),
        file: stat_field(&stat, "total_cache"),
        kernel: read_u64(&format!("{dir}/memory.kmem.usage_in_bytes")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup_paths() {
        let (v2, v1) = parse_cgroup_file("4:memory:/a/b\n1:cpu:/\n0::/user.slice\n");
        assert_eq!(v2.as_deref(), Some("/user.slice"));
        assert_eq!(v1.as_deref(), Some("/a/b"));
        let (v2, v1) = parse_cgroup_file("0::/\n");
        assert_eq!((v2.as_deref(), v1), (Some("/"), None));
        assert_eq!(stat_field("anon 5\nfile 7\n", "file"), Some(7));
    }
}
