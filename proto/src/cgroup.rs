//! Memory cgroups, v1 and v2: parsers for `/proc/<pid>/cgroup`,
//! `/proc/<pid>/mountinfo`, `memory.stat` and the limit files, and the
//! figures derived from them (docs/stats.md, "memshim-ctl cgroup").
//!
//! Pure functions on the kernel's text formats: no I/O, so that the shim and
//! memshim-ctl read cgroups the same way and the tests can feed them the
//! exact texts of both versions. The byte-level ones (`*_bytes`, [`keyed`],
//! [`MemoryEvents::parse`]) allocate nothing: the shim's pressure watcher
//! reads its files into fixed buffers.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// v1 reports "no limit" as `PAGE_COUNTER_MAX` pages, a page-rounded number
/// near 2^63; anything at or above this is no limit.
pub const V1_NO_LIMIT: u64 = 1 << 62;

/// Where `/proc/<pid>/cgroup` puts a process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcCgroup {
    /// The unified (v2) path, from the `0::<path>` line.
    pub v2: Option<String>,
    /// The path in the v1 hierarchy that has the `memory` controller.
    pub v1_memory: Option<String>,
    /// The path in the v1 hierarchy that has the `freezer` controller.
    pub v1_freezer: Option<String>,
}

/// Parses `/proc/<pid>/cgroup` (`id:controllers:path` lines). Paths are
/// relative to the reader's cgroup namespace; a path outside it starts
/// with `/..`.
pub fn parse_proc_cgroup(text: &str) -> ProcCgroup {
    let mut out = ProcCgroup::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            out.v2 = Some(path.to_owned());
        } else {
            if ctrls.split(',').any(|c| c == "memory") {
                out.v1_memory = Some(path.to_owned());
            }
            if ctrls.split(',').any(|c| c == "freezer") {
                out.v1_freezer = Some(path.to_owned());
            }
        }
    }
    out
}

/// One cgroup filesystem mount from `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// Where it is mounted (octal escapes decoded).
    pub mount_point: String,
    /// The cgroup at the mount's root, relative to the reader's cgroup
    /// namespace (`/..` and deeper when the mount reaches above it).
    pub root: String,
    /// `cgroup2` (true) or `cgroup` (v1).
    pub v2: bool,
    /// A v1 mount whose hierarchy has the `memory` controller.
    pub memory: bool,
    /// A v1 mount whose hierarchy has the `freezer` controller.
    pub freezer: bool,
    /// Mounted read-only (mount or superblock option `ro`).
    pub read_only: bool,
}

/// Decodes the `\040`-style octal escapes mountinfo uses in paths.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup mounts of a mountinfo text, in order. When several mounts
/// share a mount point, only the last (the visible one) is kept.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out: Vec<CgroupMount> = Vec::new();
    for line in mountinfo.lines() {
        // id parent maj:min root mount_point options [optional...] - fstype source super_options
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 6 || r.is_empty() {
            continue;
        }
        let v2 = match r[0] {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        let sup = r.get(2).copied().unwrap_or("");
        let ro = |opts: &str| opts.split(',').any(|o| o == "ro");
        let m = CgroupMount {
            mount_point: unescape(l[4]),
            root: unescape(l[3]),
            v2,
            memory: !v2 && sup.split(',').any(|o| o == "memory"),
            freezer: !v2 && sup.split(',').any(|o| o == "freezer"),
            read_only: ro(l[5]) || ro(sup),
        };
        out.retain(|o| o.mount_point != m.mount_point);
        out.push(m);
    }
    out
}

/// Path components, with `.` and empty ones dropped.
fn components(p: &str) -> Vec<&str> {
    p.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

/// The cgroup `path` (from `/proc/<pid>/cgroup`) relative to a mount whose
/// root is `mount_root` (from mountinfo), both relative to the same cgroup
/// namespace: `Some("/a/b")` to join to the mount point, `None` when the
/// path is not below the mount's root, or when either reaches above the
/// namespace (`/..`), where the names of the cgroups in between are
/// unknown.
pub fn path_in_mount(path: &str, mount_root: &str) -> Option<String> {
    let p = components(path);
    let r = components(mount_root);
    if p.contains(&"..") || r.contains(&"..") {
        return None;
    }
    let rest = p.strip_prefix(r.as_slice())?;
    Some(format!("/{}", rest.join("/")))
}

/// The trailing named components of a path that reaches above the
/// namespace (`/../../kubepods/pod1/c2` → `["kubepods", "pod1", "c2"]`),
/// used to find the cgroup by name from a mount that sees it.
pub fn named_tail(path: &str) -> Vec<&str> {
    let c = components(path);
    let last_up = c.iter().rposition(|x| *x == "..").map_or(0, |i| i + 1);
    c[last_up..].to_vec()
}

/// `cpu.max` of cgroup v2 (`"max 100000"` or `"200000 100000"`): (quota,
/// period) in µs, `None` for no quota. Allocation-free.
pub fn parse_cpu_max(text: &[u8]) -> Option<(u64, u64)> {
    let mut it = text
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let quota = crate::settings::parse_u64(it.next()?)?;
    let period = crate::settings::parse_u64(it.next()?)?;
    Some((quota, period))
}

/// v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`: (quota, period), `None`
/// for no quota (-1). Allocation-free.
pub fn parse_cfs(quota: &[u8], period: &[u8]) -> Option<(u64, u64)> {
    let q = u64::try_from(crate::settings::parse_i64(quota.trim_ascii())?).ok()?;
    Some((q, crate::settings::parse_u64(period.trim_ascii())?))
}

/// The CPUs a quota allows, rounded up to whole CPUs (at least 1); `None`
/// for a quota or period of 0.
pub fn quota_cpus(quota: u64, period: u64) -> Option<u32> {
    if period == 0 || quota == 0 {
        return None;
    }
    Some(quota.div_ceil(period).clamp(1, 1 << 16) as u32)
}

/// The process's cgroup path in a `/proc/<pid>/cgroup` text: the v2 line
/// (`0::/path`) with `controller` `None`, or the v1 line whose controllers
/// include `controller`. Allocation-free (the shim reads it in every exec).
#[inline] // into the shim's start-up code (its `.text.startup`), where LTO allows
//
// Plain loops over indices: an iterator adapter's `try_fold` is generic
// code of its own, which would lie outside that section (a page fault of
// its own in every exec).
pub fn proc_cgroup_path<'a>(text: &'a [u8], controller: Option<&[u8]>) -> Option<&'a [u8]> {
    let mut rest = text;
    while !rest.is_empty() {
        let end = memchr(rest, b'\n').unwrap_or(rest.len());
        let line = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or(&[]);
        let Some(a) = memchr(line, b':') else {
            continue;
        };
        let Some(b) = memchr(&line[a + 1..], b':').map(|b| a + 1 + b) else {
            continue;
        };
        let (id, ctrls, path) = (&line[..a], &line[a + 1..b], &line[b + 1..]);
        let hit = match controller {
            None => id == b"0" && ctrls.is_empty(),
            Some(c) => {
                let (mut list, mut found) = (ctrls, false);
                loop {
                    let cut = memchr(list, b',').unwrap_or(list.len());
                    if &list[..cut] == c {
                        found = true;
                        break;
                    }
                    if cut == list.len() {
                        break;
                    }
                    list = &list[cut + 1..];
                }
                found
            }
        };
        if hit {
            return Some(path);
        }
    }
    None
}

/// The first `byte` in `s`, by a plain loop (see [`proc_cgroup_path`]).
#[inline]
fn memchr(s: &[u8], byte: u8) -> Option<usize> {
    let mut i = 0;
    while i < s.len() {
        if s[i] == byte {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The `total=` of the `some` line of a PSI file (`memory.pressure`):
/// microseconds some task stalled, since the cgroup was made.
pub fn psi_some_total(text: &[u8]) -> Option<u64> {
    let line = text
        .split(|&b| b == b'\n')
        .find(|l| l.starts_with(b"some "))?;
    line.split(|&b| b == b' ')
        .find_map(|w| w.strip_prefix(b"total="))
        .and_then(|v| crate::settings::parse_u64(v.trim_ascii()))
}

/// The files of a memory cgroup's usage and limit: (usage, limit).
pub fn usage_and_limit_files(version: u8) -> (&'static str, &'static str) {
    if version == 1 {
        ("memory.usage_in_bytes", "memory.limit_in_bytes")
    } else {
        ("memory.current", "memory.max")
    }
}

/// Parses a flat keyed file (`memory.stat`: `key value` lines).
pub fn parse_flat_keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// A limit file (`memory.max`, `memory.high`, `memory.limit_in_bytes`):
/// `None` for no limit (`max`, or v1's near-2^63 value).
pub fn parse_limit(text: &str) -> Option<u64> {
    parse_limit_bytes(text.as_bytes())
}

/// [`parse_limit`] on bytes.
pub fn parse_limit_bytes(text: &[u8]) -> Option<u64> {
    crate::settings::parse_u64(text.trim_ascii()).filter(|&v| v < V1_NO_LIMIT)
}

/// The value of `key` in a flat keyed file (`memory.stat`,
/// `memory.events`: `key value` lines), without allocating.
pub fn keyed(text: &[u8], key: &[u8]) -> Option<u64> {
    text.split(|&b| b == b'\n').find_map(|l| {
        let sp = l.iter().position(|&b| b == b' ')?;
        (&l[..sp] == key)
            .then(|| crate::settings::parse_u64(l[sp + 1..].trim_ascii()))
            .flatten()
    })
}

/// The key of `memory.stat` that holds the inactive page cache: what
/// reclaim can take without the allocator's help, and what Kubernetes'
/// working set leaves out (hierarchical `total_inactive_file` in v1).
pub fn inactive_file_key(version: u8) -> &'static [u8] {
    if version == 1 {
        b"total_inactive_file"
    } else {
        b"inactive_file"
    }
}

/// The counters of a v2 `memory.events` file that mean pressure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryEvents {
    /// Times usage went over `memory.high` (reclaim, throttling).
    pub high: u64,
    /// Times usage was about to go over `memory.max`.
    pub max: u64,
    /// Times the OOM killer was invoked.
    pub oom: u64,
}

impl MemoryEvents {
    /// Parses v2 `memory.events` (`oom_kill` is not `oom`).
    pub fn parse(text: &[u8]) -> MemoryEvents {
        MemoryEvents {
            high: keyed(text, b"high").unwrap_or(0),
            max: keyed(text, b"max").unwrap_or(0),
            oom: keyed(text, b"oom").unwrap_or(0),
        }
    }
}

/// Kubernetes' working set, as cAdvisor computes it
/// (`lib/container/libcontainer/handler.go`, `setMemoryStats`): usage minus
/// inactive file pages, never below zero. Usage is `memory.current` (v2) or
/// `memory.usage_in_bytes` (v1); inactive file is `inactive_file` (v2) or
/// `total_inactive_file` (v1) of `memory.stat`.
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

/// The raw files of one memory cgroup, as read.
#[derive(Debug, Clone, Default)]
pub struct MemoryFiles {
    /// 1 or 2.
    pub version: u8,
    /// `memory.stat`, parsed.
    pub stat: BTreeMap<String, u64>,
    /// `memory.current` (v2) or `memory.usage_in_bytes` (v1).
    pub usage: u64,
    /// `memory.max` (v2) or `memory.limit_in_bytes` (v1), parsed.
    pub limit: Option<u64>,
    /// v2 `memory.high`, parsed.
    pub high: Option<u64>,
    /// v1 `memory.kmem.usage_in_bytes`.
    pub kmem_usage: Option<u64>,
    /// v1 `memory.kmem.tcp.usage_in_bytes`.
    pub tcp_usage: Option<u64>,
    /// v2 `memory.swap.current`.
    pub swap_current: Option<u64>,
}

/// A memory cgroup's charge, in the same terms for v1 and v2 (bytes).
/// docs/stats.md defines every field.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupMemory {
    /// 1 or 2.
    pub version: u8,
    /// What the cgroup is charged (`memory.current`, v1 `memory.usage_in_bytes`).
    pub usage: u64,
    /// `memory.max` (v1 `memory.limit_in_bytes`), or where the cgroup has
    /// none, the lowest of its ancestors' (v1 `hierarchical_memory_limit`;
    /// v2 the closest ancestor with one, as far up as is visible): the limit
    /// the kernel enforces. `None` = no limit.
    pub limit: Option<u64>,
    /// v2 `memory.high`; `None` = none (always `None` on v1).
    pub high: Option<u64>,
    /// `usage - inactive_file`: Kubernetes' working set (cAdvisor).
    pub working_set: u64,
    /// Anonymous memory (`anon`, v1 `total_rss`).
    pub anon: u64,
    /// `active_file + inactive_file`: page cache on the file LRUs.
    pub page_cache: u64,
    /// Recently used page cache (`active_file`).
    pub active_file: u64,
    /// Page cache not used lately (`inactive_file`).
    pub inactive_file: u64,
    /// Page cache mapped by processes (`file_mapped`, v1 `total_mapped_file`).
    pub mapped_file: u64,
    /// Page cache not yet written back (`file_dirty`, v1 `total_dirty`).
    pub dirty: u64,
    /// Page cache being written back (`file_writeback`, v1 `total_writeback`).
    pub writeback: u64,
    /// tmpfs, `/dev/shm`, shared anonymous memory (`shmem`, v1 `total_shmem`).
    pub shmem: u64,
    /// Kernel memory (`kernel`, v1 `memory.kmem.usage_in_bytes`).
    pub kernel: Option<u64>,
    /// Reclaimable slab (dentries, inodes); v2 only.
    pub slab_reclaimable: Option<u64>,
    /// Unreclaimable slab; v2 only.
    pub slab_unreclaimable: Option<u64>,
    /// Socket buffers (`sock`; v1 `memory.kmem.tcp.usage_in_bytes`, which
    /// v1 does not count in `usage`).
    pub sock: Option<u64>,
    /// Page tables (`pagetables + sec_pagetables`); v2 only.
    pub pagetables: Option<u64>,
    /// Kernel stacks (`kernel_stack`); v2 only.
    pub kernel_stack: Option<u64>,
    /// Per-CPU kernel data (`percpu`); v2 only.
    pub percpu: Option<u64>,
    /// Swapped out (`memory.swap.current`, v1 `total_swap`); not in `usage`.
    pub swap: Option<u64>,
    /// `usage` minus anon, page cache, shmem, kernel (and v2 sock), never
    /// below zero: per-CPU charge batches, mlocked file pages, zswap.
    pub other: u64,
}

impl CgroupMemory {
    /// The figures of one cgroup from its files.
    pub fn from_files(f: &MemoryFiles) -> CgroupMemory {
        let s = &f.stat;
        let get = |k: &str| s.get(k).copied();
        // v1: the hierarchical `total_*` keys (use_hierarchy is always 1
        // since Linux 5.x; the plain keys are the cgroup alone).
        let v1 = |k: &str| get(&format!("total_{k}")).or_else(|| get(k));
        let sum = |keys: &[&str]| -> Option<u64> {
            let v: Vec<u64> = keys.iter().filter_map(|k| get(k)).collect();
            (!v.is_empty()).then(|| v.iter().sum())
        };
        let mut m = CgroupMemory {
            version: f.version,
            usage: f.usage,
            // v1 without a limit of its own: the lowest of its ancestors'
            // (`hierarchical_memory_limit`, what the kernel enforces; a
            // pod-level limit above a container's cgroup).
            limit: f.limit.or_else(|| {
                (f.version == 1)
                    .then(|| get("hierarchical_memory_limit"))
                    .flatten()
                    .filter(|&l| l < V1_NO_LIMIT)
            }),
            high: f.high,
            ..CgroupMemory::default()
        };
        if f.version == 2 {
            m.anon = get("anon").unwrap_or(0);
            m.active_file = get("active_file").unwrap_or(0);
            m.inactive_file = get("inactive_file").unwrap_or(0);
            m.mapped_file = get("file_mapped").unwrap_or(0);
            m.dirty = get("file_dirty").unwrap_or(0);
            m.writeback = get("file_writeback").unwrap_or(0);
            m.shmem = get("shmem").unwrap_or(0);
            m.slab_reclaimable = get("slab_reclaimable");
            m.slab_unreclaimable = get("slab_unreclaimable");
            m.sock = get("sock");
            m.pagetables = sum(&["pagetables", "sec_pagetables"]);
            m.kernel_stack = get("kernel_stack");
            m.percpu = get("percpu");
            // `kernel` since Linux 5.18; before, the sum of its parts.
            m.kernel = get("kernel").or_else(|| {
                sum(&[
                    "kernel_stack",
                    "pagetables",
                    "sec_pagetables",
                    "percpu",
                    "vmalloc",
                    "slab_reclaimable",
                    "slab_unreclaimable",
                ])
            });
            m.swap = f.swap_current;
        } else {
            m.anon = v1("rss").unwrap_or(0);
            m.active_file = v1("active_file").unwrap_or(0);
            m.inactive_file = v1("inactive_file").unwrap_or(0);
            m.mapped_file = v1("mapped_file").unwrap_or(0);
            m.dirty = v1("dirty").unwrap_or(0);
            m.writeback = v1("writeback").unwrap_or(0);
            m.shmem = v1("shmem").unwrap_or(0);
            m.kernel = f.kmem_usage;
            m.sock = f.tcp_usage;
            m.swap = v1("swap");
        }
        m.page_cache = m.active_file + m.inactive_file;
        m.working_set = working_set(m.usage, m.inactive_file);
        // v1 counts socket buffers apart from `usage`; v2 charges them to it.
        let sock_in_usage = if f.version == 2 {
            m.sock.unwrap_or(0)
        } else {
            0
        };
        m.other = m.usage.saturating_sub(
            m.anon + m.page_cache + m.shmem + m.kernel.unwrap_or(0) + sock_in_usage,
        );
        m
    }
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
