//! `memshim-ctl cgroup [PID] [--json]`: what PID's memory cgroup is charged
//! (what dashboards and the OOM killer read), part by part, which process
//! and which `/dev/shm` file holds it, and what gives each part back.
//! Figures are defined in docs/stats.md.

use crate::args::pid_parser;
use crate::cgroup::charge::{self, Charge, Parts, ProcEntry};
use crate::cgroup::shm::{self, ShmReport};
use crate::cgroup::{self, fs::Location};
use crate::exit::{self, Exit, Failure};
use crate::output::print::{out, outln, printable};
use crate::output::render::{bytes, kv, opt_bytes, shorten, table};
use clap::Args;
use memshim_proto::cgroup::CgroupMemory;
use serde::Serialize;

/// Options of `cgroup`.
#[derive(Args, Debug)]
pub struct CgroupArgs {
    /// Process id; without it, memshim-ctl's own cgroup (in a container: the container's).
    #[arg(value_parser = pid_parser())]
    pub pid: Option<i32>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The whole `cgroup` document.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The pid asked about (`null`: memshim-ctl's own cgroup).
    pub pid: Option<i32>,
    /// Where the cgroup is.
    pub cgroup: Location,
    /// The kernel's figures.
    pub memory: CgroupMemory,
    /// Where `memory.limit` comes from: the cgroup's own file
    /// (`memory.max`, `memory.limit_in_bytes`) or an ancestor's
    /// (`hierarchical_memory_limit`, `an ancestor's memory.max`); `null`
    /// without a limit.
    pub limit_source: Option<&'static str>,
    /// The charge, part by part, with what gives each back.
    pub parts: Parts,
    /// Every process of the cgroup and its descendants.
    pub processes: Vec<ProcEntry>,
    /// Processes of the cgroup outside our pid namespace (not listed).
    pub hidden_processes: usize,
    /// `/dev/shm` as the cgroup's processes see it.
    pub shm: ShmReport,
    /// Things a person should know.
    pub notes: Vec<String>,
}

/// Runs `cgroup`.
pub fn run(a: CgroupArgs) -> Result<Exit, Failure> {
    let loc = cgroup::fs::locate(a.pid)?;
    let c = charge::read(&loc, a.pid)?;
    let pids: Vec<i32> = c.processes.iter().map(|p| p.pid).collect();
    let mut shm = shm::scan(&pids);
    shm::attribute(&mut shm, c.memory.shmem);
    let mut notes = charge::notes(&loc, &c);
    if !shm.unreachable.is_empty() {
        let list: Vec<String> = shm.unreachable.iter().map(i32::to_string).collect();
        let why = if crate::reach::procfs::my_euid() == Some(0) {
            crate::reach::procfs::DENIED_TO_ROOT
        } else {
            "/proc/<pid>/root needs root or their uid"
        };
        notes.push(format!(
            "the /dev/shm of pid(s) {} could not be reached ({why}): its files are not listed",
            list.join(", ")
        ));
    }
    if shm.unreadable_processes > 0 {
        notes.push(format!(
            "{} process(es) that see this /dev/shm could not be read (permission denied): a file on a filesystem \
             they have mounted that no readable process holds is `unknown`, not `unowned`; {}",
            shm.unreadable_processes,
            if crate::reach::procfs::my_euid() == Some(0) {
                crate::reach::procfs::DENIED_TO_ROOT
            } else {
                "run as root to know"
            }
        ));
    }
    let r = Report {
        pid: a.pid,
        parts: charge::parts(&c, Some(shm.unowned_bytes)),
        limit_source: limit_source(&loc, &c.memory),
        memory: c.memory,
        hidden_processes: c.hidden,
        processes: c.processes.clone(),
        cgroup: loc,
        shm,
        notes,
    };
    if a.json {
        outln!("{}", serde_json::to_string(&r).unwrap_or_default())?;
    } else {
        out!("{}", human(&r, &c))?;
    }
    Ok(exit::OK)
}

/// The file the cgroup's limit is read from: its own, or, where it has none
/// of its own, an ancestor's (the limit the kernel enforces; docs/stats.md).
pub fn limit_source(loc: &Location, m: &CgroupMemory) -> Option<&'static str> {
    let own_file = if loc.version == 2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    m.limit?;
    // Unreadable now: say the usual file.
    let own = crate::reach::procfs::read_text(loc.dir.join(own_file))
        .map_or(m.limit, |t| memshim_proto::cgroup::parse_limit(&t));
    Some(match (own, loc.version) {
        (Some(_), _) => own_file,
        (None, 1) => "hierarchical_memory_limit",
        (None, _) => "an ancestor's memory.max",
    })
}

/// The header line and the dashboard figures.
pub fn header(loc: &Location, m: &CgroupMemory) -> String {
    let mut out = format!(
        "memory cgroup {} (v{}, {}{})\n\n",
        printable(&loc.path),
        loc.version,
        printable(&loc.dir.display().to_string()),
        if loc.read_only {
            ", read-only here"
        } else {
            ""
        }
    );
    let (usage_file, inactive) = if loc.version == 2 {
        ("memory.current", "inactive_file")
    } else {
        ("memory.usage_in_bytes", "total_inactive_file")
    };
    let usage_note = format!("{usage_file}: container_memory_usage_bytes; the OOM killer's figure");
    let ws_note =
        format!("usage - {inactive}: container_memory_working_set_bytes, kubectl top, eviction");
    let limit = m.limit.map_or_else(|| "none".to_owned(), bytes);
    let mut rows = vec![
        ("usage", bytes(m.usage), usage_note.as_str()),
        ("working set", bytes(m.working_set), ws_note.as_str()),
        (
            "limit",
            limit,
            limit_source(loc, m).unwrap_or(if loc.version == 2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            }),
        ),
    ];
    if let Some(h) = m.high {
        rows.push((
            "high",
            bytes(h),
            "memory.high: above it the kernel throttles and reclaims",
        ));
    }
    out += "what dashboards and the OOM killer read\n";
    out += &kv(&rows);
    out
}

/// The parts as `label  bytes  gives back` lines (parts that this cgroup
/// version does not report are left out).
pub fn parts_lines(p: &Parts) -> String {
    let rows: Vec<(String, String, &str)> = p
        .rows()
        .into_iter()
        .filter(|r| r.4.bytes.is_some())
        .map(|(_, depth, label, text, part)| {
            (
                format!("{}{label}", "  ".repeat(depth)),
                opt_bytes(part.bytes),
                text,
            )
        })
        .collect();
    let rows: Vec<(&str, String, &str)> = rows
        .iter()
        .map(|(l, b, t)| (l.as_str(), b.clone(), *t))
        .collect();
    kv(&rows)
}

fn py_torch(p: &ProcEntry) -> String {
    let mut v = vec![];
    if let Some(py) = &p.python {
        v.push(match py.pymalloc_arena_bytes {
            Some(a) => format!("py {} arenas {}", py.version, bytes(a)),
            None => format!("py {}", py.version),
        });
    }
    if let Some(t) = &p.torch {
        let reserved: u64 = t.devices.iter().map(|d| d.reserved).sum();
        v.push(if t.devices.is_empty() {
            format!("torch {}", t.version)
        } else {
            format!("torch cuda reserved {}", bytes(reserved))
        });
    }
    if v.is_empty() {
        "-".into()
    } else {
        v.join("; ")
    }
}

/// The process table and the reasons some have no figures.
pub fn processes_lines(procs: &[ProcEntry]) -> String {
    if procs.is_empty() {
        return "  (none visible)\n".into();
    }
    let rows: Vec<Vec<String>> = procs
        .iter()
        .map(|p| {
            let a = p.allocator.as_ref();
            vec![
                p.pid.to_string(),
                bytes(p.rss),
                opt_bytes(p.rss_anon),
                opt_bytes(p.rss_shmem),
                p.shim.to_owned(),
                opt_bytes(a.map(|a| a.resident)),
                opt_bytes(a.map(|a| a.purgeable)),
                py_torch(p),
                shorten(
                    &if p.cgroup == "/" {
                        p.command.clone()
                    } else {
                        format!("[{}] {}", p.cgroup, p.command)
                    },
                    48,
                ),
            ]
        })
        .collect();
    let mut out = String::new();
    for l in table(
        &[
            "PID",
            "RSS",
            "ANON",
            "SHMEM",
            "SHIM",
            "RESIDENT",
            "PURGEABLE",
            "PYTHON/TORCH",
            "COMMAND",
        ],
        &rows,
    )
    .lines()
    {
        out += &format!("  {l}\n");
    }
    for p in procs.iter().filter(|p| p.figures_missing()) {
        out += &format!(
            "  pid {}: no allocator figures: {}\n",
            p.pid,
            printable(p.reason.as_deref().unwrap_or("?"))
        );
    }
    out
}

fn shm_lines(s: &ShmReport) -> String {
    let mut out = format!(
        "\n/dev/shm ({}): {} file(s), {}; {} unowned\n",
        if s.dirs.is_empty() {
            "not found".to_owned()
        } else {
            s.dirs.join(", ")
        },
        s.files.len(),
        bytes(s.bytes),
        bytes(s.unowned_bytes)
    );
    if s.files.is_empty() {
        return out;
    }
    let rows: Vec<Vec<String>> = s
        .files
        .iter()
        .map(|f| {
            let users = if f.users.is_empty() {
                "-".to_owned()
            } else {
                f.users
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            vec![
                bytes(f.bytes),
                f.state.replace('_', " "),
                users,
                printable(&f.path),
            ]
        })
        .collect();
    for l in table(&["MEMORY", "STATE", "USERS", "FILE"], &rows).lines() {
        out += &format!("  {l}\n");
    }
    if s.unowned_bytes > 0 {
        out += "  unowned: no live process maps or holds it; `rm` it to give its memory back\n";
    }
    let elsewhere = |st: &str| s.files.iter().any(|f| f.state == st);
    if let Some(charged) = s
        .charged
        .filter(|_| elsewhere("charged_elsewhere") || elsewhere("unattributed"))
    {
        out += &format!(
            "  this cgroup is charged {} for tmpfs, less than these files hold: a tmpfs page is charged to the \
             cgroup whose process first wrote it, so {}; deleting {} would not give this cgroup memory back. \
             Look in the cgroup that wrote them (`memshim-ctl cgroup PID` of one of its processes)\n",
            bytes(charged),
            if charged == 0 {
                "the files nobody holds (`charged elsewhere`) are another cgroup's"
            } else {
                "some of the files nobody holds (`unattributed`) are another cgroup's"
            },
            if charged == 0 { "them" } else { "one" },
        );
    }
    out
}

/// The human report.
pub fn human(r: &Report, c: &Charge) -> String {
    let mut out = header(&r.cgroup, &c.memory);
    out += "\nwhere the charge is, and what gives it back\n";
    out += &parts_lines(&r.parts);
    out += &format!("\nprocesses ({})\n", r.processes.len());
    out += &processes_lines(&r.processes);
    out += &shm_lines(&r.shm);
    if !r.notes.is_empty() {
        out += "\nnotes\n";
        for n in &r.notes {
            out += &format!("  - {n}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::shm::ShmFile;
    use memshim_proto::AllocatorStats;
    use std::path::PathBuf;

    #[test]
    fn human_report_aligns_figures_and_says_what_gives_each_part_back() {
        let loc = Location {
            version: 1,
            path: "/process_api/0708".into(),
            dir: PathBuf::from("/sys/fs/cgroup/memory/process_api/0708"),
            mount_point: PathBuf::from("/sys/fs/cgroup/memory"),
            read_only: false,
            searched: false,
        };
        let memory = CgroupMemory {
            version: 1,
            usage: 700 << 20,
            limit: Some(1 << 30),
            working_set: 600 << 20,
            anon: 400 << 20,
            page_cache: 200 << 20,
            active_file: 100 << 20,
            inactive_file: 100 << 20,
            shmem: 64 << 20,
            kernel: Some(36 << 20),
            ..Default::default()
        };
        let p = ProcEntry {
            pid: 4242,
            cgroup: "/".into(),
            command: "python3 serve.py".into(),
            rss: 300 << 20,
            rss_anon: Some(290 << 20),
            rss_file: Some(10 << 20),
            rss_shmem: Some(0),
            shim: "yes",
            endpoint: true,
            reason: None,
            allocator: Some(AllocatorStats {
                resident: 250 << 20,
                purgeable: 120 << 20,
                ..Default::default()
            }),
            python: None,
            torch: None,
            failure: None,
        };
        let c = Charge {
            memory,
            processes: vec![p],
            hidden: 0,
        };
        let shm = ShmReport {
            dirs: vec!["/dev/shm".into()],
            files: vec![ShmFile {
                path: "/dev/shm/torch_1_2".into(),
                reached_at: "/dev/shm/torch_1_2".into(),
                bytes: 64 << 20,
                size: 64 << 20,
                state: "unowned",
                users: vec![],
            }],
            bytes: 64 << 20,
            unowned_bytes: 64 << 20,
            unreadable_processes: 0,
            unreachable: vec![],
            charged: None,
        };
        let r = Report {
            pid: Some(4242),
            cgroup: loc,
            parts: charge::parts(&c, Some(shm.unowned_bytes)),
            limit_source: Some("memory.limit_in_bytes"),
            memory,
            processes: c.processes.clone(),
            hidden_processes: 0,
            shm,
            notes: vec![],
        };
        let h = human(&r, &c);
        for want in [
            "memory cgroup /process_api/0708 (v1, /sys/fs/cgroup/memory/process_api/0708)",
            "  usage        700.0 MiB  memory.usage_in_bytes: container_memory_usage_bytes",
            "  working set  600.0 MiB  usage - total_inactive_file",
            "  limit         1.00 GiB  memory.limit_in_bytes",
            "  anon                  400.0 MiB\n",
            "    allocators, free    120.0 MiB  purge: ",
            "    allocators, in use  130.0 MiB  program: ",
            "    other anonymous     150.0 MiB  program: ",
            "  page cache            200.0 MiB  reclaim: ",
            "    /dev/shm unowned     64.0 MiB  delete: ",
            "  kernel                 36.0 MiB\n",
            "  4242  300.0 MiB  290.0 MiB    0 B  yes   250.0 MiB  120.0 MiB             -  python3 serve.py",
            "  64.0 MiB  unowned      -  /dev/shm/torch_1_2",
        ] {
            assert!(h.contains(want), "missing {want:?} in\n{h}");
        }
        assert!(!h.contains("slab"), "v1 has no slab figures:\n{h}");
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["cgroup"]["version"], 1);
        assert_eq!(j["memory"]["working_set"], 600 << 20);
        assert_eq!(j["parts"]["allocator_free"]["bytes"], 120 << 20);
        assert_eq!(j["processes"][0]["allocator"]["purgeable"], 120 << 20);
        assert_eq!(j["shm"]["files"][0]["state"], "unowned");
    }
}
