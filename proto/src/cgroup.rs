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
        } else if ctrls.split(',').any(|c| c == "memory") {
            out.v1_memory = Some(path.to_owned());
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
pub fn proc_cgroup_path<'a>(text: &'a [u8], controller: Option<&[u8]>) -> Option<&'a [u8]> {
    text.split(|&b| b == b'\n').find_map(|line| {
        let mut parts = line.splitn(3, |&b| b == b':');
        let (id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match controller {
            None => id == b"0" && ctrls.is_empty(),
            Some(c) => ctrls.split(|&b| b == b',').any(|x| x == c),
        };
        hit.then_some(path)
    })
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
    /// `memory.max` (v1 `memory.limit_in_bytes`); `None` = no limit.
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
            limit: f.limit,
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
mod tests {
    use super::*;

    /// `memory.events` of a v2 cgroup (Linux 6.x) whose `memory.high` was
    /// hit and whose limit was reached once.
    const EVENTS_V2: &[u8] = b"low 0\nhigh 1423\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n";

    #[test]
    fn psi_totals() {
        let t = b"some avg10=0.00 avg60=0.12 avg300=0.03 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=999\n";
        assert_eq!(psi_some_total(t), Some(123456));
        assert_eq!(psi_some_total(b"full avg10=0 total=5\n"), None);
    }

    #[test]
    fn cpu_quotas_of_both_versions() {
        assert_eq!(parse_cpu_max(b"max 100000\n"), None);
        assert_eq!(parse_cpu_max(b"200000 100000\n"), Some((200_000, 100_000)));
        assert_eq!(parse_cfs(b"-1\n", b"100000\n"), None);
        assert_eq!(parse_cfs(b"50000\n", b"100000\n"), Some((50_000, 100_000)));
        assert_eq!(quota_cpus(150_000, 100_000), Some(2));
        assert_eq!(quota_cpus(50_000, 100_000), Some(1));
        assert_eq!(quota_cpus(0, 100_000), None);
        let text = b"12:cpu,cpuacct:/kubepods/pod1\n4:memory:/a/b\n0::/pod/c\n";
        assert_eq!(proc_cgroup_path(text, None), Some(&b"/pod/c"[..]));
        assert_eq!(
            proc_cgroup_path(text, Some(b"cpu")),
            Some(&b"/kubepods/pod1"[..])
        );
        assert_eq!(proc_cgroup_path(text, Some(b"cpuset")), None);
    }

    #[test]
    fn v2_memory_events_counters() {
        assert_eq!(
            MemoryEvents::parse(EVENTS_V2),
            MemoryEvents {
                high: 1423,
                max: 7,
                oom: 1
            }
        );
        // `oom_kill` must not be read as `oom`, nor `low` as anything.
        assert_eq!(
            MemoryEvents::parse(b"oom_kill 9\nlow 3\n"),
            MemoryEvents::default()
        );
        assert_eq!(MemoryEvents::parse(b""), MemoryEvents::default());
    }

    #[test]
    fn keyed_values_and_the_inactive_page_cache_of_both_versions() {
        let v1 = b"cache 100\nrss 5\ninactive_file 1\ntotal_cache 300\ntotal_inactive_file 250\n";
        assert_eq!(keyed(v1, inactive_file_key(1)), Some(250));
        let v2 = b"anon 5\nfile 300\nactive_file 50\ninactive_file 250\n";
        assert_eq!(keyed(v2, inactive_file_key(2)), Some(250));
        assert_eq!(keyed(b"anon 1\n", b"inactive_file"), None);
        assert_eq!(parse_limit_bytes(b"-1"), None);
        assert_eq!(parse_limit_bytes(b""), None);
    }

    /// `memory.stat` of a v2 cgroup on Linux 6.x (a container with a model
    /// server), as the kernel prints it.
    pub const V2_STAT: &str = "anon 1481719808
file 2351644672
kernel 122621952
kernel_stack 6127616
pagetables 22032384
sec_pagetables 0
percpu 3360
sock 4096
vmalloc 0
shmem 67108864
zswap 0
zswapped 0
file_mapped 285007872
file_dirty 135168
file_writeback 0
swapcached 0
anon_thp 0
file_thp 0
shmem_thp 0
inactive_anon 1548824576
active_anon 4096
inactive_file 1686167552
active_file 598368256
unevictable 0
slab_reclaimable 88281856
slab_unreclaimable 5498616
slab 93780472
workingset_refault_anon 0
workingset_refault_file 23422
workingset_activate_anon 0
workingset_activate_file 1067
workingset_restore_anon 0
workingset_restore_file 0
workingset_nodereclaim 0
pgdemote_kswapd 0
pgscan 0
pgsteal 0
pgfault 1289471
pgmajfault 1523
thp_fault_alloc 0
thp_collapse_alloc 0
";

    /// `memory.stat` of a v1 cgroup on Linux 6.18 (this project's CI).
    pub const V1_STAT: &str = "cache 67108864
rss 110592
rss_huge 0
shmem 8388608
mapped_file 0
dirty 36864
writeback 0
workingset_refault_anon 0
workingset_refault_file 887
swap 0
swapcached 0
pgpgin 23929
pgpgout 22668
pgfault 53682
pgmajfault 20
inactive_anon 8491008
active_anon 12288
inactive_file 50331648
active_file 8388608
unevictable 0
hierarchical_memory_limit 9223372036854771712
hierarchical_memsw_limit 9223372036854771712
total_cache 67108864
total_rss 110592
total_rss_huge 0
total_shmem 8388608
total_mapped_file 0
total_dirty 36864
total_writeback 0
total_workingset_refault_anon 0
total_workingset_refault_file 887
total_swap 0
total_swapcached 0
total_pgpgin 23929
total_pgpgout 22668
total_pgfault 53682
total_pgmajfault 20
total_inactive_anon 8491008
total_active_anon 12288
total_inactive_file 50331648
total_active_file 8388608
total_unevictable 0
";

    #[test]
    fn proc_cgroup_lines_of_both_versions() {
        let p = parse_proc_cgroup("9:name=systemd:/\n4:memory:/process_api/0708\n1:cpu:/\n0::/\n");
        assert_eq!(p.v1_memory.as_deref(), Some("/process_api/0708"));
        assert_eq!(p.v2.as_deref(), Some("/"));
        let p = parse_proc_cgroup("0::/kubepods.slice/pod1/cri-containerd-2.scope\n");
        assert_eq!(
            p.v2.as_deref(),
            Some("/kubepods.slice/pod1/cri-containerd-2.scope")
        );
        assert_eq!(p.v1_memory, None);
        // Paths may contain ':'.
        let p = parse_proc_cgroup("5:memory,hugetlb:/a:b\n");
        assert_eq!(p.v1_memory.as_deref(), Some("/a:b"));
        assert_eq!(parse_proc_cgroup("garbage\n"), ProcCgroup::default());
    }

    #[test]
    fn mountinfo_cgroup_mounts_of_a_hybrid_host_and_containers() {
        // This CI machine: v1 controllers, cgroup2 without controllers.
        let host = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let m = cgroup_mounts(host);
        assert_eq!(m.len(), 3);
        assert!(
            m[1].memory
                && !m[1].v2
                && !m[1].read_only
                && m[1].mount_point == "/sys/fs/cgroup/memory"
        );
        assert!(m[2].v2 && !m[2].memory);
        assert!(!m[0].memory);
        // A Docker container on v1 without a cgroup namespace: the mount's
        // root is the container's cgroup, read-only.
        let docker = "1130 1124 0:32 /docker/4f2a /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:16 - cgroup cgroup rw,memory\n";
        let m = cgroup_mounts(docker);
        assert_eq!(m[0].root, "/docker/4f2a");
        assert!(m[0].read_only && m[0].memory);
        // A Kubernetes pod on v2 with its own cgroup namespace.
        let pod = "712 705 0:29 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate,memory_recursiveprot\n";
        let m = cgroup_mounts(pod);
        assert!(m[0].v2 && m[0].read_only && m[0].root == "/");
        // The host's cgroupfs mounted into a DaemonSet pod, seen from the
        // pod's cgroup namespace; and a path with an escaped space.
        let ds = "801 712 0:29 /../../.. /host/sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n\
                  802 712 0:29 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        let m = cgroup_mounts(ds);
        assert_eq!(m[0].root, "/../../..");
        assert_eq!(m[1].mount_point, "/mnt/my cg");
        // Over-mounted: the last one is the visible one.
        let over = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    90 35 0:32 / /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        let m = cgroup_mounts(over);
        assert_eq!(m.len(), 1);
        assert!(m[0].read_only);
    }

    #[test]
    fn paths_relative_to_a_mount_root() {
        assert_eq!(path_in_mount("/a/b", "/").as_deref(), Some("/a/b"));
        assert_eq!(path_in_mount("/", "/").as_deref(), Some("/"));
        assert_eq!(
            path_in_mount("/docker/4f2a", "/docker/4f2a").as_deref(),
            Some("/")
        );
        assert_eq!(
            path_in_mount("/docker/4f2a/sub", "/docker/4f2a").as_deref(),
            Some("/sub")
        );
        assert_eq!(path_in_mount("/docker/4f2ab", "/docker/4f2a"), None);
        assert_eq!(path_in_mount("/other", "/docker/4f2a"), None);
        // Above the namespace: unknown names in between.
        assert_eq!(path_in_mount("/../pod/c", "/"), None);
        assert_eq!(path_in_mount("/", "/.."), None);
        assert_eq!(
            named_tail("/../../kubepods/pod1/c2"),
            ["kubepods", "pod1", "c2"]
        );
        assert!(named_tail("/..").is_empty());
        assert_eq!(named_tail("/a/b"), ["a", "b"]);
    }

    #[test]
    fn limits_and_stat_files() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("734003200\n"), Some(734003200));
        assert_eq!(parse_limit("garbage"), None);
        let s = parse_flat_keyed(V2_STAT);
        assert_eq!(s["inactive_file"], 1686167552);
        assert_eq!(s.len(), 41);
    }

    #[test]
    fn v2_figures_add_up_to_memory_current() {
        let stat = parse_flat_keyed(V2_STAT);
        // memory.current of the same cgroup: the parts plus 1 MiB of
        // per-CPU charge batches.
        let usage = 1481719808 + 2351644672 + 122621952 + 4096 + (1 << 20);
        let m = CgroupMemory::from_files(&MemoryFiles {
            version: 2,
            stat,
            usage,
            limit: parse_limit("8589934592"),
            high: parse_limit("max"),
            swap_current: Some(0),
            ..Default::default()
        });
        assert_eq!(m.anon, 1481719808);
        assert_eq!(m.page_cache, 1686167552 + 598368256);
        assert_eq!(m.working_set, usage - 1686167552);
        assert_eq!(m.shmem, 67108864);
        assert_eq!(m.kernel, Some(122621952));
        assert_eq!(m.pagetables, Some(22032384));
        assert_eq!(m.slab_reclaimable, Some(88281856));
        assert_eq!(m.sock, Some(4096));
        assert_eq!(m.limit, Some(8 << 30));
        assert_eq!(m.high, None);
        // file = page cache + shmem here, so `other` is the 1 MiB.
        assert_eq!(m.other, 1 << 20);
        assert_eq!(
            m.anon + m.page_cache + m.shmem + m.kernel.unwrap() + m.sock.unwrap() + m.other,
            m.usage
        );
        // Kernels before 5.18 have no `kernel` key: the sum of its parts.
        let mut old = parse_flat_keyed(V2_STAT);
        old.remove("kernel");
        let m = CgroupMemory::from_files(&MemoryFiles {
            version: 2,
            stat: old,
            usage,
            ..Default::default()
        });
        assert_eq!(
            m.kernel,
            Some(6127616 + 22032384 + 3360 + 88281856 + 5498616)
        );
    }

    #[test]
    fn v1_figures_use_the_hierarchical_keys() {
        let usage = 110592 + 67108864 + 118784 + 8192;
        let m = CgroupMemory::from_files(&MemoryFiles {
            version: 1,
            stat: parse_flat_keyed(V1_STAT),
            usage,
            limit: parse_limit("9223372036854771712"),
            kmem_usage: Some(118784),
            tcp_usage: Some(0),
            ..Default::default()
        });
        assert_eq!(m.anon, 110592);
        assert_eq!(m.inactive_file, 50331648);
        assert_eq!(m.page_cache, 50331648 + 8388608);
        assert_eq!(m.shmem, 8388608);
        assert_eq!(m.dirty, 36864);
        assert_eq!(m.working_set, usage - 50331648);
        assert_eq!(m.limit, None);
        assert_eq!(m.kernel, Some(118784));
        assert_eq!((m.slab_reclaimable, m.pagetables), (None, None));
        assert_eq!(m.swap, Some(0));
        assert_eq!(m.other, 8192);
        // cAdvisor's clamp: never below zero.
        assert_eq!(working_set(10, 20), 0);
    }
}
