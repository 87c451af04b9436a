//! Real memory cgroups for the `cgroup` family (tests/tests/cgroup/): made by the test, with
//! processes started inside, removed on drop even when the test fails.
//! v1 (`/sys/fs/cgroup/memory`, this CI machine) or v2 where the unified
//! hierarchy has the memory controller.

use crate::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Set to 1 in a test run's environment, every process that
/// [`TestCgroup::cmd`] starts in a v2 cgroup sees it as a Kubernetes pod
/// does: a cgroup namespace rooted at the test cgroup, cgroup2 mounted
/// there read-only, a pid namespace of its own (with its /proc). The test
/// VMs' container-view cells set it (tests/tests/cgroup_vm.rs).
pub const CONTAINER_VIEW_ENV: &str = "MEMSHIM_TEST_CONTAINER_VIEW";

/// Whether [`CONTAINER_VIEW_ENV`] asks for the container view.
pub fn container_view() -> bool {
    std::env::var_os(CONTAINER_VIEW_ENV).is_some_and(|v| v == "1")
}

/// A memory cgroup made for one test.
pub struct TestCgroup {
    /// Its directory.
    pub dir: PathBuf,
    /// Its path as `/proc/<pid>/cgroup` shows it.
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    /// The mount point of its hierarchy.
    pub mount: PathBuf,
}

/// Whether we are root (cgroups are made by root).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))?
                .split_whitespace()
                .nth(2)
                .map(|u| u == "0")
        })
        .unwrap_or(false)
}

/// The hierarchy tests can make memory cgroups in: (version, mount point).
fn hierarchy() -> Option<(u8, PathBuf)> {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("memory.usage_in_bytes").exists() {
        return Some((1, v1.to_path_buf()));
    }
    for m in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let sub = std::fs::read_to_string(Path::new(m).join("cgroup.subtree_control"))
            .unwrap_or_default();
        if sub.split_whitespace().any(|c| c == "memory") {
            return Some((2, PathBuf::from(m)));
        }
    }
    None
}

impl TestCgroup {
    /// A fresh cgroup named for `tag`, or `None` (after saying why) where
    /// tests cannot make one.
    pub fn new(tag: &str) -> Option<TestCgroup> {
        if !is_root() {
            eprintln!("SKIP: making memory cgroups needs root");
            return None;
        }
        let Some((version, mount)) = hierarchy() else {
            eprintln!(
                "SKIP: no writable memory controller (v1 /sys/fs/cgroup/memory or v2 with memory enabled)"
            );
            return None;
        };
        remove_stale(&mount);
        let name = format!("memshim-test-{}-{tag}", std::process::id());
        let dir = mount.join(&name);
        if dir.exists() {
            let _ = TestCgroup::remove(&dir);
        }
        if let Err(e) = std::fs::create_dir(&dir) {
            eprintln!("SKIP: cannot make {}: {e}", dir.display());
            return None;
        }
        Some(TestCgroup {
            dir,
            path: format!("/{name}"),
            version,
            mount,
        })
    }

    /// `program args...`, started inside the cgroup (the shell that starts
    /// it joins first, then execs it, so all of its memory is charged here).
    /// In the container view ([`CONTAINER_VIEW_ENV`], v2 only) it runs in
    /// new cgroup, mount and pid namespaces, with cgroup2 mounted read-only,
    /// as the child of `unshare` ([`Child::pid`] is still its pid).
    pub fn cmd<S: AsRef<str>>(
        &self,
        program: impl AsRef<Path>,
        args: impl IntoIterator<Item = S>,
    ) -> Cmd {
        let pod = self.version == 2 && container_view();
        let enter = if pod {
            format!(
                "exec unshare --cgroup --mount --propagation private --pid --fork --kill-child \
                 --mount-proc sh -c 'umount -l {m} && mount -t cgroup2 -o ro,nosuid,nodev,noexec \
                 cgroup2 {m} && exec \"$@\"' sh \"$@\"",
                m = self.mount.display()
            )
        } else {
            "exec \"$@\"".into()
        };
        let mut a: Vec<String> = vec![
            "-c".into(),
            format!(
                "echo $$ > '{}' && {enter}",
                self.dir.join("cgroup.procs").display()
            ),
            "sh".into(),
            program.as_ref().display().to_string(),
        ];
        a.extend(args.into_iter().map(|s| s.as_ref().to_owned()));
        let c = Cmd::new("sh", a);
        if pod { c.program_is_child() } else { c }
    }

    /// The control fixture (tests/fixtures/control_heap.c) shimmed in this
    /// cgroup with decay off, after `alloc <mib>`: it keeps what it freed
    /// until purged. Returns it and the bytes it freed.
    pub fn freed_heap(&self, mib: u32) -> (Child, u64) {
        let mut heap = self
            .cmd(crate::control::heap_fixture(), Vec::<String>::new())
            .shimmed()
            .env("MEMSHIM_DIRTY_DECAY_MS", "-1")
            .spawn();
        heap.wait_for_line("started", Duration::from_secs(10));
        heap.send(&format!("alloc {mib}"));
        let ready = heap.wait_for_line("ready", Duration::from_secs(30));
        let freed = ready
            .split("freed=")
            .nth(1)
            .and_then(|f| f.trim().parse().ok())
            .unwrap_or_else(|| panic!("no freed= in {ready:?}"));
        (heap, freed)
    }

    /// What the kernel charges it now (`memory.current`, v1:
    /// `memory.usage_in_bytes`): the figure limits, dashboards and the OOM
    /// killer go by.
    pub fn usage(&self) -> u64 {
        let f = if self.version == 2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        let s = std::fs::read_to_string(self.dir.join(f)).unwrap();
        s.trim().parse().unwrap_or_else(|_| panic!("{f}: {s:?}"))
    }

    /// Its `memory.stat`.
    pub fn stat(&self) -> BTreeMap<String, u64> {
        let text = std::fs::read_to_string(self.dir.join("memory.stat")).unwrap();
        memshim_proto::cgroup::parse_flat_keyed(&text)
    }

    fn stat_key(&self, v2: &str, v1: &str) -> u64 {
        let s = self.stat();
        let k = if self.version == 2 { v2 } else { v1 };
        s.get(k).copied().unwrap_or(0)
    }

    /// Page cache on the file LRUs, read from the kernel directly.
    pub fn file_pages(&self) -> u64 {
        self.stat_key("active_file", "total_active_file")
            + self.stat_key("inactive_file", "total_inactive_file")
    }

    /// Shared memory charged here.
    pub fn shmem(&self) -> u64 {
        self.stat_key("shmem", "total_shmem")
    }

    /// The pids in it.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills whatever is in `dir` and removes it.
    fn remove(dir: &Path) -> bool {
        let procs = dir.join("cgroup.procs");
        let gone = wait_until(Duration::from_secs(10), || {
            let pids: Vec<String> = std::fs::read_to_string(&procs)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect();
            if pids.is_empty() {
                return Some(());
            }
            let _ = std::process::Command::new("kill")
                .arg("-9")
                .args(&pids)
                .output();
            None
        });
        gone.is_some()
            && wait_until(Duration::from_secs(5), || std::fs::remove_dir(dir).ok()).is_some()
    }
}

/// Removes cgroups a killed test run left behind (their test process is
/// gone).
fn remove_stale(mount: &Path) {
    let Ok(rd) = std::fs::read_dir(mount) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix("memshim-test-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{owner}")).exists() {
            let _ = TestCgroup::remove(&e.path());
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if !TestCgroup::remove(&self.dir) {
            eprintln!(
                "warning: could not remove test cgroup {}",
                self.dir.display()
            );
        }
    }
}

/// A file of `mib` MiB under target/test-scratch that is not in the page
/// cache (written, synced, then dropped with POSIX_FADV_DONTNEED), so that
/// reading it charges its pages to the reader's cgroup.
pub fn uncached_file(name: &str, mib: usize) -> PathBuf {
    let p = scratch().join(format!("{name}-{}.bin", std::process::id()));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&p).unwrap();
        let block = vec![0x5au8; 1 << 20];
        for _ in 0..mib {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    }
    let script = format!(
        "import os; fd = os.open({:?}, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)",
        p.display().to_string()
    );
    let o = Cmd::new(python(), ["-c", &script]).run();
    assert_eq!(o.code, 0, "fadvise: {o:?}");
    p
}

/// MiB, for messages.
pub fn m(b: u64) -> String {
    format!("{:.1} MiB", mib(b))
}

/// The entry for `path` in the `shm.files` of a `memshim-ctl cgroup
/// --json` report; panics, showing the listing, if it is not there.
pub fn shm_file<'a>(report: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    report["shm"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("{path} not listed: {}", report["shm"]))
}
