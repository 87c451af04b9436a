//! Unit tests of fs.rs on trees laid out like `/sys/fs/cgroup`, with
//! the files of cgroup v2 (which this CI machine's kernel has without a
//! memory controller) and v1 in the kernel's formats. The v1 paths also
//! run live in tests/tests/cgroup_*.rs.

use super::*;

/// `memory.stat` of a v2 cgroup on Linux 6.x (a model-server container).
const V2_STAT: &str = "anon 1481719808\nfile 2351644672\nkernel 122621952\nkernel_stack 6127616\n\
pagetables 22032384\nsec_pagetables 0\npercpu 3360\nsock 4096\nvmalloc 0\nshmem 67108864\nzswap 0\n\
zswapped 0\nfile_mapped 285007872\nfile_dirty 135168\nfile_writeback 0\nswapcached 0\nanon_thp 0\n\
file_thp 0\nshmem_thp 0\ninactive_anon 1548824576\nactive_anon 4096\ninactive_file 1686167552\n\
active_file 598368256\nunevictable 0\nslab_reclaimable 88281856\nslab_unreclaimable 5498616\n\
slab 93780472\nworkingset_refault_anon 0\nworkingset_refault_file 23422\npgfault 1289471\npgmajfault 1523\n";

/// `memory.stat` of a v1 cgroup on Linux 6.18 (hierarchical keys only).
const V1_STAT: &str = "cache 67108864\nrss 110592\nshmem 0\ntotal_cache 67108864\ntotal_rss 110592\n\
total_shmem 0\ntotal_mapped_file 0\ntotal_dirty 0\ntotal_writeback 0\ntotal_swap 0\n\
total_inactive_anon 98304\ntotal_active_anon 12288\ntotal_inactive_file 67108864\ntotal_active_file 0\n";

struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Tree {
        let p = std::env::temp_dir().join(format!("memshim-cgfs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Tree(p)
    }
    /// Writes `files` (name, text) into directory `rel` of the tree.
    fn cg(&self, rel: &str, files: &[(&str, &str)]) -> PathBuf {
        let d = self.0.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap();
        for (n, t) in files {
            std::fs::write(d.join(n), t).unwrap();
        }
        d
    }
    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.0.join(rel.trim_start_matches('/'))).unwrap()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn v2_cgroup(pids: &str) -> Vec<(&'static str, String)> {
    let usage = 1481719808u64 + 2351644672 + 122621952 + 4096 + (1 << 20);
    vec![
        ("cgroup.procs", pids.to_owned()),
        ("memory.current", format!("{usage}\n")),
        ("memory.max", "8589934592\n".into()),
        ("memory.high", "max\n".into()),
        ("memory.stat", V2_STAT.into()),
        ("memory.swap.current", "0\n".into()),
        ("memory.reclaim", String::new()),
    ]
}

fn files<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(n, t)| (*n, t.as_str())).collect()
}

const HOST_V2: &str =
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n";

#[test]
fn v2_host_view_finds_reads_and_reclaims_a_pod() {
    let t = Tree::new("v2host");
    t.cg(
        "/sys/fs/cgroup",
        &[
            ("cgroup.procs", "1\n"),
            ("memory.stat", V2_STAT),
            ("cgroup.controllers", "cpu memory\n"),
        ],
    );
    let ctr = v2_cgroup("4242\n");
    t.cg("/sys/fs/cgroup/kubepods/pod1/ctr", &files(&ctr));
    t.cg(
        "/sys/fs/cgroup/kubepods/pod1/ctr/worker",
        &[("cgroup.procs", "4243\n0\n")],
    );

    let loc = locate_in(&t.0, "0::/kubepods/pod1/ctr\n", HOST_V2, 4242).unwrap();
    assert_eq!(
        (loc.version, loc.path.as_str(), loc.read_only, loc.searched),
        (2, "/kubepods/pod1/ctr", false, false)
    );
    assert_eq!(loc.dir, t.0.join("sys/fs/cgroup/kubepods/pod1/ctr"));

    let m = read_memory(&loc, None).unwrap();
    assert_eq!(m.version, 2);
    assert_eq!(m.limit, Some(8 << 30));
    assert_eq!(m.working_set, m.usage - 1686167552);
    assert_eq!(m.other, 1 << 20);

    let (procs, hidden) = processes(&loc);
    assert_eq!(
        procs,
        [(4242, "/".to_owned()), (4243, "/worker".to_owned())]
    );
    assert_eq!(hidden, 1);

    assert!(check_writable(&loc, None).unwrap());
    let step = reclaim_kernel(&loc, &m, false, None).unwrap();
    let want = (1686167552u64 + 598368256 + 88281856).to_string();
    assert_eq!(
        t.read("/sys/fs/cgroup/kubepods/pod1/ctr/memory.reclaim"),
        want
    );
    assert_eq!(
        (step.outcome, step.wrote.as_deref()),
        ("done", Some(want.as_str()))
    );
    assert_eq!(step.requested, Some(1686167552 + 598368256 + 88281856));

    // With swap, file pages only.
    std::fs::write(loc.dir.join("memory.reclaim"), "").unwrap();
    reclaim_kernel(&loc, &m, true, None).unwrap();
    assert_eq!(
        t.read("/sys/fs/cgroup/kubepods/pod1/ctr/memory.reclaim"),
        format!("{want} swappiness=0")
    );
}

#[test]
fn v2_inside_a_container_with_its_own_cgroup_namespace_is_read_only() {
    let t = Tree::new("v2pod");
    // The pod's view: its cgroup is the root of its namespace, mounted ro.
    let ctr = v2_cgroup("1\n7\n");
    t.cg("/sys/fs/cgroup", &files(&ctr));
    let mi = "712 705 0:29 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate\n";
    let loc = locate_in(&t.0, "0::/\n", mi, 7).unwrap();
    assert_eq!(
        (loc.version, loc.path.as_str(), loc.read_only),
        (2, "/", true)
    );
    assert!(read_memory(&loc, None).is_ok());
    let f = check_writable(&loc, Some(7)).unwrap_err();
    assert_eq!(f.exit, exit::READ_ONLY);
    assert!(
        f.message.contains("read-only") && f.message.contains("nothing was changed"),
        "{}",
        f.message
    );
    assert!(f.hint.as_deref().unwrap().contains("DaemonSet"));
    assert_eq!(
        t.read("/sys/fs/cgroup/memory.reclaim"),
        "",
        "nothing written"
    );
}

#[test]
fn v2_from_a_daemonset_namespace_finds_the_pod_through_the_hosts_cgroupfs() {
    let t = Tree::new("v2ds");
    // Its own cgroup (ro) and the host's cgroupfs mounted at /host.
    let own = v2_cgroup("1\n");
    t.cg("/sys/fs/cgroup", &files(&own));
    let ctr = v2_cgroup("4242\n");
    t.cg("/host/sys/fs/cgroup/kubepods/pod1/ctr", &files(&ctr));
    t.cg(
        "/host/sys/fs/cgroup/kubepods/pod2/ctr",
        &files(&v2_cgroup("5000\n")),
    );
    let mi = "712 705 0:29 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n\
              801 712 0:29 /../../.. /host/sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
    let loc = locate_in(&t.0, "0::/../../kubepods/pod1/ctr\n", mi, 4242).unwrap();
    assert_eq!(loc.dir, t.0.join("host/sys/fs/cgroup/kubepods/pod1/ctr"));
    assert!(loc.searched && !loc.read_only);
    assert_eq!(loc.mount_point, t.0.join("host/sys/fs/cgroup"));
    // A pid that is in no cgroup under the mount is not guessed.
    assert!(locate_in(&t.0, "0::/../../kubepods/pod9/ctr\n", mi, 999).is_err());
}

#[test]
fn v2_root_cgroup_and_v2_without_memory_controller_are_no_memory_cgroup() {
    let t = Tree::new("v2root");
    t.cg(
        "/sys/fs/cgroup",
        &[("cgroup.procs", "1\n"), ("memory.stat", V2_STAT)],
    );
    let e = locate_in(&t.0, "0::/\n", HOST_V2, 1).unwrap_err();
    assert!(e.contains("root of the unified hierarchy"), "{e}");

    let t = Tree::new("v2nomem");
    t.cg(
        "/sys/fs/cgroup/app",
        &[("cgroup.procs", "9\n"), ("cpu.stat", "")],
    );
    let e = locate_in(&t.0, "0::/app\n", HOST_V2, 9).unwrap_err();
    assert!(e.contains("no memory controller"), "{e}");
    let e = locate_in(&t.0, "0::/app\n", "", 9).unwrap_err();
    assert!(e.contains("no cgroup2 filesystem is mounted"), "{e}");
}

/// This machine's layout: v1 controllers, a cgroup2 without any.
const HYBRID: &str = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

fn v1_cgroup(pids: &str) -> Vec<(&'static str, String)> {
    vec![
        ("cgroup.procs", pids.to_owned()),
        (
            "memory.usage_in_bytes",
            format!("{}\n", 67108864 + 110592 + 118784),
        ),
        ("memory.limit_in_bytes", "9223372036854771712\n".into()),
        ("memory.kmem.usage_in_bytes", "118784\n".into()),
        ("memory.kmem.tcp.usage_in_bytes", "0\n".into()),
        ("memory.stat", V1_STAT.into()),
        ("memory.force_empty", String::new()),
        ("memory.swappiness", "60\n".into()),
    ]
}

#[test]
fn v1_on_a_hybrid_host_is_found_read_and_force_emptied() {
    let t = Tree::new("v1");
    t.cg(
        "/sys/fs/cgroup/unified",
        &[("cgroup.procs", "1\n9\n"), ("cgroup.controllers", "")],
    );
    t.cg("/sys/fs/cgroup/memory/a", &files(&v1_cgroup("9\n")));
    let loc = locate_in(&t.0, "4:memory:/a\n1:cpu:/\n0::/\n", HYBRID, 9).unwrap();
    assert_eq!(
        (loc.version, loc.path.as_str(), loc.searched),
        (1, "/a", false)
    );
    let m = read_memory(&loc, None).unwrap();
    assert_eq!(
        (m.anon, m.page_cache, m.kernel, m.limit),
        (110592, 67108864, Some(118784), None)
    );
    assert_eq!(m.working_set, 110592 + 118784);

    let step = reclaim_kernel(&loc, &m, false, None).unwrap();
    assert_eq!(
        (step.outcome, step.wrote.as_deref(), step.requested),
        ("done", Some("0"), None)
    );
    assert_eq!(t.read("/sys/fs/cgroup/memory/a/memory.force_empty"), "0");
    assert_eq!(t.read("/sys/fs/cgroup/memory/a/memory.swappiness"), "60\n");
    // With swap: swappiness is 0 during force_empty and restored after.
    let step = reclaim_kernel(&loc, &m, true, None).unwrap();
    assert_eq!(t.read("/sys/fs/cgroup/memory/a/memory.swappiness"), "60\n");
    assert!(step.note.unwrap().contains("restored to 60"));
}

#[test]
fn v1_container_layouts_docker_bind_and_cgroup_namespace() {
    // Docker on v1 without a cgroup namespace: the container's cgroup is
    // bind-mounted as the mount's root, read-only.
    let t = Tree::new("v1docker");
    t.cg("/sys/fs/cgroup/memory", &files(&v1_cgroup("1\n")));
    let mi = "1130 1124 0:32 /docker/4f2a /sys/fs/cgroup/memory ro,nosuid master:16 - cgroup cgroup rw,memory\n";
    let loc = locate_in(&t.0, "4:memory:/docker/4f2a\n", mi, 1).unwrap();
    assert_eq!(loc.dir, t.0.join("sys/fs/cgroup/memory"));
    assert!(loc.read_only && !loc.searched);
    assert_eq!(
        check_writable(&loc, None).unwrap_err().exit,
        exit::READ_ONLY
    );

    // `unshare -C` under the host's mount (measured on this machine): the
    // path is "/", the mount's root "/..". Found by its cgroup.procs.
    let t = Tree::new("v1ns");
    t.cg("/sys/fs/cgroup/memory", &files(&v1_cgroup("1\n2\n")));
    t.cg("/sys/fs/cgroup/memory/other", &files(&v1_cgroup("3\n")));
    t.cg("/sys/fs/cgroup/memory/mine", &files(&v1_cgroup("4242\n")));
    let mi = "51 47 0:32 /.. /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
    let loc = locate_in(&t.0, "4:memory:/\n0::/\n", mi, 4242).unwrap();
    assert_eq!(loc.dir, t.0.join("sys/fs/cgroup/memory/mine"));
    assert!(loc.searched);
}

/// The root of the v1 hierarchy (`release_agent` is there only): refused
/// by `check_writable`, before `reclaim` purges anything, as the kernel
/// would refuse its `memory.force_empty`.
#[test]
fn v1_root_is_refused_before_anything_is_done() {
    let t = Tree::new("v1root");
    let mut root = v1_cgroup("1\n");
    root.push(("release_agent", String::new()));
    t.cg("/sys/fs/cgroup/memory", &files(&root));
    t.cg("/sys/fs/cgroup/memory/app", &files(&v1_cgroup("5\n")));
    let mi = "51 47 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
    let loc = locate_in(&t.0, "4:memory:/\n", mi, 1).unwrap();
    let f = check_writable(&loc, Some(1)).unwrap_err();
    assert_eq!(f.exit, exit::NO_CGROUP);
    assert!(f.message.contains("nothing was changed"), "{}", f.message);
    let loc = locate_in(&t.0, "4:memory:/app\n", mi, 5).unwrap();
    assert!(check_writable(&loc, Some(5)).unwrap());
}

#[test]
fn v1_not_mounted_is_no_memory_cgroup() {
    let t = Tree::new("v1none");
    t.cg("/sys/fs/cgroup/unified", &[("cgroup.procs", "9\n")]);
    let mi = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    let e = locate_in(&t.0, "4:memory:/a\n0::/\n", mi, 9).unwrap_err();
    assert!(
        e.starts_with("no memory cgroup:") && e.contains("`memory` hierarchy is not mounted"),
        "{e}"
    );
}

#[test]
fn kernel_step_reports_missing_files_and_empty_caches() {
    let t = Tree::new("v2old");
    let mut ctr = v2_cgroup("5\n");
    ctr.retain(|(n, _)| *n != "memory.reclaim");
    t.cg("/sys/fs/cgroup/app", &files(&ctr));
    let loc = locate_in(&t.0, "0::/app\n", HOST_V2, 5).unwrap();
    assert!(!check_writable(&loc, None).unwrap());
    let m = read_memory(&loc, None).unwrap();
    let step = reclaim_kernel(&loc, &m, false, None).unwrap();
    assert_eq!(step.outcome, "unsupported");
    assert!(step.note.unwrap().contains("5.19"));

    std::fs::write(loc.dir.join("memory.reclaim"), "").unwrap();
    let empty = CgroupMemory {
        version: 2,
        ..CgroupMemory::default()
    };
    let step = reclaim_kernel(&loc, &empty, false, None).unwrap();
    assert_eq!(step.outcome, "skipped");
    assert_eq!(t.read("/sys/fs/cgroup/app/memory.reclaim"), "");
}
