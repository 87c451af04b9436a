//! Unit tests of cgroup.rs on the kernel's texts, cgroup v1 and v2.

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
        m[1].memory && !m[1].v2 && !m[1].read_only && m[1].mount_point == "/sys/fs/cgroup/memory"
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
