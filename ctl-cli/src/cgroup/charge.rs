//! What a memory cgroup is charged, attributed: the kernel's figures
//! (fs.rs), the processes in the cgroup with their allocators and
//! interpreters (through their control sockets, as `list` and `stats`
//! reach them), and for each part what gives it back. Shared by `cgroup`
//! and `reclaim`; docs/stats.md defines every field.

use crate::cgroup::{self, fs::Location};
use crate::exit::{self, Failure};
use crate::reach::client::Client;
use crate::reach::no_endpoint;
use crate::reach::procfs;
use crate::reach::socket;
use memshim_proto::cgroup::CgroupMemory;
use memshim_proto::{AllocatorStats, PythonSection, TorchSection};
use serde::Serialize;

/// One process of the cgroup.
#[derive(Debug, Clone, Serialize)]
pub struct ProcEntry {
    /// Pid as we see it.
    pub pid: i32,
    /// Its cgroup below the one reported (`/` = that cgroup itself).
    pub cgroup: String,
    /// Command line.
    pub command: String,
    /// `VmRSS`, bytes.
    pub rss: u64,
    /// `RssAnon`, bytes.
    pub rss_anon: Option<u64>,
    /// `RssFile`, bytes.
    pub rss_file: Option<u64>,
    /// `RssShmem`, bytes.
    pub rss_shmem: Option<u64>,
    /// `yes`, `no`, or `unknown` (its maps could not be read).
    pub shim: &'static str,
    /// Its control endpoint answered.
    pub endpoint: bool,
    /// Why there are no allocator figures, for a shimmed process.
    pub reason: Option<String>,
    /// The shim's allocator figures (`stats`' `allocator`).
    pub allocator: Option<AllocatorStats>,
    /// `stats`' `python` section.
    pub python: Option<PythonSection>,
    /// `stats`' `torch` section.
    pub torch: Option<TorchSection>,
    /// Its socket exists but asking it failed (no answer in time, an
    /// error): not a process without an endpoint, but a failed one.
    #[serde(skip)]
    pub failure: Option<Failure>,
}

impl ProcEntry {
    /// The shim is or may be loaded (its maps could not be read), but
    /// there are no allocator figures: its free pages are not told apart.
    pub fn figures_missing(&self) -> bool {
        self.shim != "no" && self.allocator.is_none()
    }
}

/// A cgroup's charge and the processes in it, read at one moment.
#[derive(Debug, Clone)]
pub struct Charge {
    /// The kernel's figures.
    pub memory: CgroupMemory,
    /// The processes of the cgroup and its descendants.
    pub processes: Vec<ProcEntry>,
    /// Processes in it that are outside our pid namespace.
    pub hidden: usize,
}

/// Reads the charge of the cgroup at `loc` (`pid`: for error messages).
pub fn read(loc: &Location, pid: Option<i32>) -> Result<Charge, Failure> {
    let memory = cgroup::fs::read_memory(loc, pid)?;
    let (pids, hidden) = cgroup::fs::processes(loc);
    let processes = pids
        .into_iter()
        .filter_map(|(p, sub)| entry(p, sub))
        .collect();
    Ok(Charge {
        memory,
        processes,
        hidden,
    })
}

fn entry(pid: i32, cgroup: String) -> Option<ProcEntry> {
    let p = procfs::read_proc(pid).ok()?;
    let [rss_anon, rss_file, rss_shmem] = procfs::rss_parts(&p);
    let mut e = ProcEntry {
        pid,
        cgroup,
        command: p.command.clone(),
        rss: p.rss,
        rss_anon,
        rss_file,
        rss_shmem,
        shim: "no",
        endpoint: false,
        reason: None,
        allocator: None,
        python: None,
        torch: None,
        failure: None,
    };
    match procfs::shim_loaded(pid) {
        Ok(true) => e.shim = "yes",
        Ok(false) => return Some(e),
        Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
            e.shim = "unknown";
            e.reason = Some(if procfs::my_euid() == Some(0) {
                format!(
                    "/proc/{pid}/maps is not readable: {}",
                    procfs::DENIED_TO_ROOT
                )
            } else {
                format!(
                    "/proc/{pid}/maps is not readable: run as uid {} or root",
                    p.uid
                )
            });
            return Some(e);
        }
        Err(_) => return None, // exited meanwhile
    }
    if pid == std::process::id() as i32 {
        e.reason = Some("this memshim-ctl".into());
        return Some(e);
    }
    let loc = socket::locate(&p);
    if std::fs::symlink_metadata(loc.path()).is_err() {
        e.reason = Some(no_endpoint::why(&p, &loc).0);
        return Some(e);
    }
    let stats = Client::open_proc(p).and_then(|mut c| c.stats());
    match stats {
        Ok(s) => {
            e.endpoint = true;
            e.rss = s.process.rss;
            // The allocator's figures and the RssAnon they are capped at
            // from one moment.
            e.rss_anon = s.process.anon.or(e.rss_anon);
            e.allocator = Some(s.allocator);
            e.python = s.python;
            e.torch = s.torch;
        }
        Err(f) => {
            e.reason = Some(f.message.clone());
            // "No endpoint" is a file nobody listens on: none to fail.
            e.failure = (f.exit != exit::NO_ENDPOINT).then_some(f);
        }
    }
    Some(e)
}

/// One part of the charge.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Part {
    /// Bytes; `null` where this cgroup version does not report it.
    pub bytes: Option<u64>,
    /// What gives it back: `purge`, `release`, `reclaim`, `writeback`,
    /// `delete`, `exit`, `program` or `none` (docs/stats.md).
    pub action: &'static str,
}

macro_rules! parts {
    ($($(#[$doc:meta])* $name:ident : $depth:literal, $label:literal, $text:literal;)*) => {
        /// The charge, part by part (docs/stats.md, "memshim-ctl cgroup").
        #[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
        pub struct Parts {
            $($(#[$doc])* pub $name: Part,)*
        }

        impl Parts {
            /// (JSON name, depth, label, what gives it back, part), in order.
            pub fn rows(&self) -> Vec<(&'static str, usize, &'static str, &'static str, Part)> {
                vec![$((stringify!($name), $depth, $label, $text, self.$name),)*]
            }
        }
    };
}

parts! {
    /// Anonymous memory.
    anon: 0, "anon", "";
    /// Free pages in the memshim allocators of the cgroup's processes.
    allocator_free: 1, "allocators, free", "purge: `memshim-ctl reclaim` or `purge` returns it now";
    /// Allocator resident memory that is not free.
    allocator_in_use: 1, "allocators, in use", "program: live allocations, thread caches, metadata";
    /// CPython pymalloc arenas.
    python_arenas: 1, "python arenas", "release: gc, then CPython frees empty arenas (`memshim-ctl release`)";
    /// Anonymous memory no memshim allocator holds.
    anon_other: 1, "other anonymous", "program: unshimmed heaps, stacks, mmap; only the program frees it";
    /// Page cache.
    page_cache: 0, "page cache", "reclaim: `memshim-ctl reclaim`; the kernel also drops it under pressure";
    /// Recently used page cache.
    active_file: 1, "active", "reclaim: in the working set until reclaimed";
    /// Page cache not used lately.
    inactive_file: 1, "inactive", "reclaim: not in the working set, dropped first";
    /// Page cache mapped by processes.
    mapped_file: 1, "mapped", "reclaim: code and mmap'ed files, read back on next use";
    /// Page cache not yet written.
    dirty: 1, "dirty", "writeback: written within 30 s (or `sync`), then reclaimable";
    /// Page cache being written.
    writeback: 1, "writeback", "writeback: being written now";
    /// tmpfs and shared memory.
    shmem: 0, "shmem", "exit: freed when deleted and no longer mapped (/dev/shm below)";
    /// Unowned /dev/shm files.
    shm_unowned: 1, "/dev/shm unowned", "delete: `rm` the unowned files listed below";
    /// Kernel memory.
    kernel: 0, "kernel", "";
    /// Reclaimable slab.
    slab_reclaimable: 1, "slab, reclaimable", "reclaim: dentries and inodes";
    /// Unreclaimable slab.
    slab_unreclaimable: 1, "slab, in use", "exit: freed with the files, sockets and processes holding it";
    /// Socket buffers.
    sock: 1, "sockets", "exit: freed as data is read and sockets close";
    /// Page tables.
    pagetables: 1, "page tables", "exit: shrink as processes unmap memory or exit";
    /// Kernel stacks.
    kernel_stack: 1, "kernel stacks", "exit: one per thread";
    /// Per-CPU kernel data.
    percpu: 1, "per-cpu", "exit: freed with the kernel objects that own it";
    /// The rest of usage.
    other: 0, "other", "none: per-CPU charge batches, mlocked pages, zswap";
    /// Swapped out (not in usage).
    swap: 0, "swap (not in usage)", "none: comes back when touched";
}

/// The parts of `c`; `shm_unowned` from the /dev/shm listing, if made.
pub fn parts(c: &Charge, shm_unowned: Option<u64>) -> Parts {
    let m = &c.memory;
    // Each allocator's pages that may be resident (stats.md, `unmanaged`):
    // jemalloc's `resident` plus its muzzy pages, at most the process's
    // anonymous RSS; of those, the free ones.
    let (resident, free) = c
        .processes
        .iter()
        .filter_map(|p| Some((p.allocator.as_ref()?, p.rss_anon)))
        .map(|(a, anon): (&AllocatorStats, _)| {
            let held = a
                .resident
                .saturating_add(a.muzzy)
                .min(anon.unwrap_or(u64::MAX));
            (held, a.purgeable.min(held))
        })
        .fold((0u64, 0u64), |(r, f), (h, p)| {
            (r.saturating_add(h), f.saturating_add(p))
        });
    let arenas: u64 = c
        .processes
        .iter()
        .filter_map(|p| p.python.as_ref()?.pymalloc_arena_bytes)
        .sum();
    let shmem_mapped = c
        .processes
        .iter()
        .filter_map(|p| p.rss_shmem)
        .fold(0u64, u64::saturating_add)
        .min(m.shmem);
    let p = |bytes: u64, action| Part {
        bytes: Some(bytes),
        action,
    };
    let o = |bytes: Option<u64>, action| Part { bytes, action };
    Parts {
        anon: p(m.anon, "none"),
        allocator_free: p(free, "purge"),
        allocator_in_use: p(resident.saturating_sub(free), "program"),
        python_arenas: p(arenas, "release"),
        anon_other: p(m.anon.saturating_sub(resident + arenas), "program"),
        page_cache: p(m.page_cache, "reclaim"),
        active_file: p(m.active_file, "reclaim"),
        inactive_file: p(m.inactive_file, "reclaim"),
        // The kernel counts mapped shared memory here too: what the
        // processes map of it (their RssShmem, at most `shmem`) is under
        // `shmem`, and no more than the page cache it is shown as part of.
        mapped_file: p(
            m.mapped_file.saturating_sub(shmem_mapped).min(m.page_cache),
            "reclaim",
        ),
        dirty: p(m.dirty, "writeback"),
        writeback: p(m.writeback, "writeback"),
        shmem: p(m.shmem, "exit"),
        shm_unowned: o(shm_unowned, "delete"),
        kernel: o(m.kernel, "none"),
        slab_reclaimable: o(m.slab_reclaimable, "reclaim"),
        slab_unreclaimable: o(m.slab_unreclaimable, "exit"),
        sock: o(m.sock, "exit"),
        pagetables: o(m.pagetables, "exit"),
        kernel_stack: o(m.kernel_stack, "exit"),
        percpu: o(m.percpu, "exit"),
        other: p(m.other, "none"),
        swap: o(m.swap, "none"),
    }
}

/// Notes for a person reading the report.
pub fn notes(loc: &Location, c: &Charge) -> Vec<String> {
    let mut n = vec![];
    if loc.version == 1 {
        n.push(
            "cgroup v1 does not break kernel memory down; `kernel` is memory.kmem.usage_in_bytes, and `sockets` \
             (memory.kmem.tcp.usage_in_bytes) is not part of usage"
                .into(),
        );
    }
    let unshimmed = c.processes.iter().filter(|p| p.shim == "no").count();
    if unshimmed > 0 {
        n.push(format!(
            "{unshimmed} process(es) run without the shim: their heaps are in `other anonymous`, which no purge reaches"
        ));
    }
    let blind: Vec<String> = c
        .processes
        .iter()
        .filter(|p| p.figures_missing())
        .map(|p| p.pid.to_string())
        .collect();
    if !blind.is_empty() {
        n.push(format!(
            "pid(s) {} have or may have the shim but gave no allocator figures (see their reason): their heaps, \
             free pages included, are counted in `other anonymous`, though a purge may reach them once their \
             endpoint answers (MEMSHIM_CONTROL=on, or as their user or root)",
            blind.join(", ")
        ));
    }
    if c.hidden > 0 {
        n.push(format!(
            "{} process(es) of the cgroup are outside this pid namespace and not listed",
            c.hidden
        ));
    }
    if loc.searched {
        n.push(format!(
            "{} was found by searching the cgroup filesystem for the process (its path is outside this cgroup \
             namespace)",
            loc.dir.display()
        ));
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_with(resident: u64, purgeable: u64, arenas: Option<u64>) -> ProcEntry {
        ProcEntry {
            pid: 1,
            cgroup: "/".into(),
            command: "python3 app.py".into(),
            rss: resident,
            rss_anon: None,
            rss_file: None,
            rss_shmem: None,
            shim: "yes",
            endpoint: true,
            reason: None,
            allocator: Some(AllocatorStats {
                resident,
                purgeable,
                ..Default::default()
            }),
            python: arenas.map(|a| PythonSection {
                pymalloc_arena_bytes: Some(a),
                ..Default::default()
            }),
            torch: None,
            failure: None,
        }
    }

    #[test]
    fn anonymous_memory_is_split_between_allocators_arenas_and_the_rest() {
        let c = Charge {
            memory: CgroupMemory {
                version: 2,
                anon: 1000,
                page_cache: 300,
                active_file: 100,
                inactive_file: 200,
                ..Default::default()
            },
            processes: vec![proc_with(500, 200, Some(100)), proc_with(100, 0, None)],
            hidden: 0,
        };
        let p = parts(&c, Some(64));
        assert_eq!(
            p.allocator_free,
            Part {
                bytes: Some(200),
                action: "purge"
            }
        );
        assert_eq!(p.allocator_in_use.bytes, Some(400));
        assert_eq!(p.python_arenas.bytes, Some(100));
        assert_eq!(p.anon_other.bytes, Some(300));
        assert_eq!(
            p.shm_unowned,
            Part {
                bytes: Some(64),
                action: "delete"
            }
        );
        assert_eq!(p.kernel.bytes, None);
        let rows = p.rows();
        assert_eq!(rows[0].0, "anon");
        assert!(rows.iter().all(|r| r.1 <= 1));
        let j = serde_json::to_value(p).unwrap();
        assert_eq!(j["page_cache"]["bytes"], 300);
        assert_eq!(j["page_cache"]["action"], "reclaim");
        assert_eq!(j.as_object().unwrap().len(), rows.len());
        // More allocator memory than the cgroup's anon (charged elsewhere):
        // never negative.
        let c = Charge {
            processes: vec![proc_with(5000, 0, None)],
            ..c
        };
        assert_eq!(parts(&c, None).anon_other.bytes, Some(0));
    }

    #[test]
    fn an_allocator_counts_its_muzzy_pages_and_at_most_its_anonymous_rss() {
        let memory = CgroupMemory {
            version: 1,
            anon: 1000,
            ..Default::default()
        };
        // 3000 handed out, never written: only the 200 of RssAnon can be
        // resident, and of those at most all are free.
        let mut untouched = proc_with(3000, 2500, None);
        untouched.rss_anon = Some(200);
        // Muzzy pages (left out of jemalloc's resident) stay in RSS.
        let mut muzzy = proc_with(50, 400, None);
        muzzy.allocator.as_mut().unwrap().muzzy = 350;
        muzzy.rss_anon = Some(600);
        let c = Charge {
            memory,
            processes: vec![untouched, muzzy],
            hidden: 0,
        };
        let p = parts(&c, None);
        assert_eq!(p.allocator_free.bytes, Some(200 + 400));
        assert_eq!(p.allocator_in_use.bytes, Some(0));
        assert_eq!(p.anon_other.bytes, Some(1000 - 200 - 400));
    }
}
