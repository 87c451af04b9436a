//! `memshim-ctl stats <PID> [--json] [--arenas] [--pss]`: the memory report.
//! Every figure is defined in docs/stats.md.

use crate::args::pid_parser;
use crate::exit::{self, Exit, Failure};
use crate::gpu;
use crate::output::print::{out, outln, printable};
use crate::output::render::{bytes, kv, ms, opt_bytes, table};
use crate::reach::client::Client;
use clap::Args;
use memshim_proto::settings::{self, Pressure};
use memshim_proto::{
    AllocatorStats, ArenaStats, CgroupStats, ConfigState, CudaIdleCounters, PressureStats,
    ProcessStats, PythonSection, PythonUnavailable, Request, StatsReport, TorchSection,
};

/// Options of `stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Process id.
    #[arg(value_parser = pid_parser())]
    pub pid: i32,
    /// One JSON document on stdout (the protocol's stats object).
    #[arg(long)]
    pub json: bool,
    /// Add the per-arena table.
    #[arg(long)]
    pub arenas: bool,
    /// Add PSS from smaps_rollup (costs the process about 16 ms per GiB resident).
    #[arg(long)]
    pub pss: bool,
}

/// Fetches a stats report.
pub fn fetch(c: &mut Client, arenas: bool, pss: bool) -> Result<StatsReport, Failure> {
    c.ask::<Box<StatsReport>>(&Request::Stats { arenas, pss })
        .map(|s| *s)
}

/// Runs `stats`. Where torch has CUDA devices, the driver's view of them
/// (NVML) is added: `gpu` in the JSON document, a table in the human form.
pub fn run(a: StatsArgs) -> Result<Exit, Failure> {
    // A CPython started without the preload: reached by ptrace (reach/ptrace/).
    if crate::reach::ptrace::applies(a.pid) {
        let s = crate::reach::ptrace::stats(a.pid, a.pss, cgroup_section(a.pid))?;
        if a.json {
            outln!("{}", serde_json::to_string(&s).unwrap_or_default())?;
        } else {
            let command = crate::reach::procfs::read_proc(a.pid)
                .map(|p| p.command)
                .unwrap_or_default();
            out!("{}", human_unshimmed(&s, &command, a.arenas))?;
        }
        return Ok(exit::OK);
    }
    let mut c = Client::open(a.pid)?;
    let s = fetch(&mut c, a.arenas, a.pss)?;
    let (vram, why) = s
        .torch
        .as_ref()
        .map_or((Vec::new(), None), |t| gpu::vram(a.pid, t));
    if a.json {
        let mut doc = serde_json::to_value(&s).unwrap_or_default();
        if !vram.is_empty()
            && let Some(o) = doc.as_object_mut()
        {
            o.insert("gpu".into(), serde_json::json!(vram));
            o.insert("gpu_unavailable".into(), serde_json::json!(why));
        }
        outln!("{doc}")?;
    } else {
        out!("{}", human(&s, a.pid, &c.proc.command))?;
        out!("{}", human_vram(&vram, why.as_deref()))?;
    }
    Ok(exit::OK)
}

/// The driver's view beside torch's, per device.
pub fn human_vram(vram: &[gpu::DeviceVram], why: Option<&str>) -> String {
    if vram.is_empty() {
        return String::new();
    }
    let opt = |b: Option<u64>| b.map_or("-".to_owned(), bytes);
    let rows: Vec<Vec<String>> = vram
        .iter()
        .map(|d| {
            vec![
                format!("cuda:{}", d.index),
                opt(d.driver_used),
                bytes(d.torch_reserved),
                opt(d.context_and_other),
                opt(d.total),
            ]
        })
        .collect();
    let mut out = String::from(
        "
GPU memory as the driver sees it (NVML)
",
    );
    out += &indent(&table(
        &[
            "DEVICE",
            "PROCESS_USES",
            "TORCH_RESERVED",
            "CONTEXT+OTHER",
            "DEVICE_TOTAL",
        ],
        &rows,
    ));
    out += "  CONTEXT+OTHER: the CUDA context (a fixed cost per device) and memory
              libraries allocate outside torch; only the process's exit returns it.
";
    if let Some(w) = why {
        out += &format!(
            "  (no driver figures: {w})
"
        );
    }
    out
}

/// The human form of a stats report: one section after another.
pub fn human(s: &StatsReport, pid: i32, command: &str) -> String {
    let mut out = format!("pid {pid}: {command}\n");
    out += &allocator(&s.allocator, &printable(&s.config.jemalloc_version));
    if let Some(ar) = &s.arenas {
        out += &arenas(ar);
    }
    out += &process(&s.process);
    if let Some(g) = &s.cgroup {
        out += &cgroup(g);
    }
    if let Some(pr) = &s.pressure {
        out += &pressure(pr);
    }
    out += &config(&s.config);
    out += &python(s.python.as_ref(), s.python_unavailable.as_ref());
    if let Some(t) = &s.torch {
        out += &torch(t);
    }
    if let Some(c) = &s.cuda_idle {
        out += &cuda_idle(c);
    }
    out
}

/// The human form of `stats` on a process without the preload: the
/// sections of [`human`] in its order, those that need the shim said to be
/// not available, and the line that says how the process was reached.
pub fn human_unshimmed(s: &crate::reach::ptrace::Stats, command: &str, arenas: bool) -> String {
    let mut out = format!("pid {}: {command}\n", s.pid);
    out += &crate::reach::ptrace::reached_line(s.pid, &s.reached);
    out += "\n";
    out += &format!("\nallocator: not available ({})\n", s.allocator_unavailable);
    if arenas {
        out += "\narenas: not available (jemalloc's, which the process does not have)\n";
    }
    out += &process(&s.process);
    if let Some(g) = &s.cgroup {
        out += &cgroup(g);
    }
    out += "\nconfig: not available (no shim in the process)\n";
    out += &python(s.python.as_ref(), s.python_unavailable.as_ref());
    if let Some(t) = &s.torch {
        out += &torch(t);
    }
    if let Some(why) = &s.torch_unavailable {
        out += &format!("\ntorch: not available ({why})\n");
    }
    out
}

/// The `allocator` section.
fn allocator(a: &AllocatorStats, jemalloc_version: &str) -> String {
    if attached(jemalloc_version) {
        return attached_allocator(a, jemalloc_version);
    }
    let mut out = format!(
        "\nallocator (jemalloc {})\n",
        jemalloc_version.split('-').next().unwrap_or("")
    );
    out += &kv(&[
        ("allocated", bytes(a.allocated), "in live allocations"),
        ("active", bytes(a.active), "pages holding allocations"),
        (
            "resident",
            bytes(a.resident),
            "pages in use, allocator-managed (at most)",
        ),
        ("mapped", bytes(a.mapped), ""),
        (
            "retained",
            bytes(a.retained),
            "virtual only, kept for reuse",
        ),
        ("metadata", bytes(a.metadata), "jemalloc's bookkeeping"),
        (
            "dirty",
            bytes(a.dirty),
            "free, not yet returned: purge returns it",
        ),
        ("muzzy", bytes(a.muzzy), "MADV_FREE'd, still counted in RSS"),
        (
            "tcache",
            bytes(a.tcache),
            "in thread caches: purge cannot reach it",
        ),
        ("purgeable", bytes(a.purgeable), "dirty + muzzy"),
    ]);
    out
}

/// Whether the report comes from an attached bridge, which names the
/// process's own allocator there (shim/src/bridge/heap.rs, `version`).
fn attached(jemalloc_version: &str) -> bool {
    jemalloc_version.ends_with("(attached bridge)")
}

/// The `allocator` section of an attached bridge: the process's own
/// allocator's figures that mean something there (docs/attach.md, "What
/// the bridge answers").
fn attached_allocator(a: &AllocatorStats, name: &str) -> String {
    format!("\nallocator ({name})\n")
        + &kv(&[
            ("allocated", bytes(a.allocated), "in live allocations"),
            ("mapped", bytes(a.mapped), "heap and mmap'ed chunks"),
            (
                "free",
                bytes(a.dirty),
                "free in the heap, returned to the OS or not (the allocator cannot tell)",
            ),
        ])
}

/// The per-arena table (`--arenas`).
fn arenas(ar: &[ArenaStats]) -> String {
    let rows: Vec<Vec<String>> = ar
        .iter()
        .map(|x| {
            vec![
                x.index.to_string(),
                x.threads.to_string(),
                bytes(x.active),
                bytes(x.dirty),
                bytes(x.muzzy),
                bytes(x.resident),
                bytes(x.tcache),
            ]
        })
        .collect();
    "\narenas\n".to_owned()
        + &indent(&table(
            &[
                "ARENA", "THREADS", "ACTIVE", "DIRTY", "MUZZY", "RESIDENT", "TCACHE",
            ],
            &rows,
        ))
}

/// The `process` section (the kernel's figures).
fn process(p: &ProcessStats) -> String {
    "\nprocess\n".to_owned()
        + &kv(&[
            ("rss", bytes(p.rss), "resident set size"),
            (
                "pss",
                opt_bytes(p.pss),
                if p.pss.is_none() {
                    "(--pss)"
                } else {
                    "proportional share"
                },
            ),
            ("anon", opt_bytes(p.anon), "anonymous"),
            (
                "file",
                opt_bytes(p.file),
                "file-backed (code, mapped files)",
            ),
            ("shmem", opt_bytes(p.shmem), "shared memory"),
            ("swap", opt_bytes(p.swap), "swapped out"),
            (
                "unmanaged",
                bytes(p.unmanaged),
                "not the shim's (pymalloc, mmap, stacks, code)",
            ),
        ])
}

/// The `cgroup` section of a process without the preload, if its memory
/// cgroup can be read here (as `memshim-ctl cgroup` reads it).
fn cgroup_section(pid: i32) -> Option<CgroupStats> {
    let loc = crate::cgroup::fs::locate(Some(pid)).ok()?;
    let files = crate::cgroup::fs::read_files(&loc, Some(pid)).ok()?;
    Some(CgroupStats::from_files(loc.path, &files))
}

/// The `cgroup` section.
fn cgroup(g: &CgroupStats) -> String {
    let max = g.max.map_or_else(|| "no limit".to_owned(), bytes);
    format!("\ncgroup v{} {}\n", g.version, printable(&g.path))
        + &kv(&[
            (
                "current",
                bytes(g.current),
                "what the OOM killer and dashboards count",
            ),
            ("max", max, ""),
            ("anon", opt_bytes(g.anon), ""),
            (
                "file",
                opt_bytes(g.file),
                "page cache, tmpfs and shared memory included",
            ),
            ("kernel", opt_bytes(g.kernel), ""),
        ])
}

/// The `config` section: the shim's settings and state.
fn config(c: &ConfigState) -> String {
    let decay = |v: i64| {
        if v < 0 {
            "never".to_owned()
        } else {
            format!("{v} ms")
        }
    };
    if attached(&c.jemalloc_version) {
        return "\nconfig (attached bridge)\n".to_owned()
            + &kv(&[
                (
                    "idle_return",
                    if c.dirty_decay_ms < 0 {
                        "off".to_owned()
                    } else {
                        format!("after {} idle", decay(c.dirty_decay_ms))
                    },
                    "attach --idle-return, decay --dirty-ms",
                ),
                ("attached", ms(c.uptime_ms as f64), "ago"),
                ("thread_starts", c.thread_starts.to_string(), ""),
                ("shim", c.shim_version.clone(), ""),
            ]);
    }
    "\nconfig\n".to_owned()
        + &kv(&[
            ("dirty_decay", decay(c.dirty_decay_ms), ""),
            ("muzzy_decay", decay(c.muzzy_decay_ms), ""),
            ("narenas", c.narenas.to_string(), ""),
            (
                "background_purge",
                yes(c.background_purge),
                if c.background_purge {
                    "the shim's thread decays idle pages"
                } else {
                    "dirty_decay_ms is -1: idle pages stay until purged"
                },
            ),
            (
                "interposed",
                yes(c.interposed),
                "the shim's malloc is the process's malloc",
            ),
            ("control", c.control.clone(), settings::CONTROL.name),
            ("uptime", ms(c.uptime_ms as f64), ""),
            ("fork_child", yes(c.fork_child), ""),
            (
                "deepbind_cleared",
                c.deepbind_cleared.to_string(),
                "dlopen calls with RTLD_DEEPBIND removed",
            ),
            ("thread_starts", c.thread_starts.to_string(), ""),
            ("shim", c.shim_version.clone(), ""),
        ])
}

/// The `python` section, or why the bridge could not look (nothing for a
/// process without Python).
fn python(py: Option<&PythonSection>, unavailable: Option<&PythonUnavailable>) -> String {
    let py = match (py, unavailable) {
        (Some(py), _) => py,
        (None, Some(why)) if !matches!(why, PythonUnavailable::NoPython) => {
            return format!("\npython: {why}\n");
        }
        _ => return String::new(),
    };
    let mut out = format!(
        "\npython {}{}\n",
        py.version,
        if py.free_threaded {
            " (free-threaded)"
        } else {
            ""
        }
    );
    // None: the program never imported gc (the bridge never imports it).
    let three = |v: Option<[u64; 3]>| {
        v.map_or_else(
            || "- (gc not imported)".to_owned(),
            |v| format!("{} {} {}", v[0], v[1], v[2]),
        )
    };
    out += &kv(&[
        ("gc_enabled", yes(py.gc_enabled), ""),
        ("gc_counts", three(py.gc_counts), "per generation"),
        ("gc_thresholds", three(py.gc_thresholds), ""),
        ("gc_collections", three(py.gc_collections), ""),
        (
            "allocated_blocks",
            py.allocated_blocks.to_string(),
            "sys.getallocatedblocks()",
        ),
        ("threads", py.threads.to_string(), ""),
        (
            "pymalloc_arenas",
            opt_bytes(py.pymalloc_arena_bytes),
            "mmap'ed directly, not via malloc",
        ),
    ]);
    out
}

/// The `torch` section: its allocator's settings and a table of devices.
fn torch(t: &TorchSection) -> String {
    let mut out = format!(
        "\ntorch {} (CUDA {})\n",
        t.version,
        if t.cuda_initialized {
            "initialized"
        } else {
            "not initialized"
        }
    );
    let mut facts: Vec<(&str, String, &str)> = Vec::new();
    if let Some(b) = &t.allocator_backend {
        facts.push(("allocator", b.clone(), "torch.cuda.get_allocator_backend()"));
    }
    if let Some(c) = &t.alloc_conf {
        facts.push(("alloc_conf", c.clone(), "allocator settings in effect"));
    }
    if let Some(h) = &t.host_pinned {
        facts.push((
            "pinned_host",
            format!("{} ({} cached)", bytes(h.allocated), bytes(h.cached)),
            "page-locked host memory; release empties the cache",
        ));
    }
    if !facts.is_empty() {
        out += &kv(&facts);
    }
    if !t.devices.is_empty() {
        let rows: Vec<Vec<String>> = t
            .devices
            .iter()
            .map(|d| {
                vec![
                    format!("cuda:{}", d.index),
                    bytes(d.allocated),
                    bytes(d.reserved),
                    bytes(d.active),
                    bytes(d.inactive_split),
                    format!("{:.0}%", d.fragmentation * 100.0),
                    bytes(d.peak_allocated),
                    d.num_alloc_retries.to_string(),
                    d.num_ooms.to_string(),
                ]
            })
            .collect();
        out += &indent(&table(
            &[
                "DEVICE",
                "ALLOCATED",
                "RESERVED",
                "ACTIVE",
                "INACTIVE_SPLIT",
                "FRAG",
                "PEAK",
                "RETRIES",
                "OOMS",
            ],
            &rows,
        ));
    }
    out
}

/// The idle VRAM return's section (`MEMSHIM_CUDA_IDLE_MS`).
fn cuda_idle(c: &CudaIdleCounters) -> String {
    format!(
        "\nidle VRAM return after {} ms idle, at least {} unused\n",
        c.idle_ms,
        bytes(c.min_bytes)
    ) + &kv(&[
        (
            "looks",
            c.checks.to_string(),
            "times it looked into the interpreter",
        ),
        (
            "returns",
            c.returns.to_string(),
            "times the caches were emptied",
        ),
        (
            "vram_returned",
            bytes(c.vram_returned),
            "VRAM given back to the driver",
        ),
        (
            "pinned_returned",
            bytes(c.pinned_returned),
            "pinned host memory given back",
        ),
    ])
}

/// The `pressure` section (MEMSHIM_PRESSURE).
fn pressure(p: &PressureStats) -> String {
    let watching = if p.watching.is_empty() {
        "nothing".to_owned()
    } else {
        p.watching.join(", ")
    };
    let what = match (p.mode.as_str(), p.source.as_str()) {
        (mode, _) if mode == Pressure::Off.word() => format!("{}={mode}", settings::PRESSURE.name),
        (_, "none") => "no memory limit to watch".to_owned(),
        (_, v) => format!("cgroup {v}: {watching}"),
    };
    let mut out = format!("\npressure ({}, {what})\n", p.mode);
    let mut rows = vec![];
    if let (Some(l), Some(t)) = (p.limit, p.threshold) {
        rows.push((
            "threshold",
            bytes(t),
            format!("working set that counts as pressure (limit {})", bytes(l)),
        ));
    }
    rows.extend([
        (
            "active",
            yes(p.active),
            "decay is short while pressure lasts".to_owned(),
        ),
        (
            "events",
            p.events.to_string(),
            "pressure signals".to_owned(),
        ),
        (
            "ignored",
            p.ignored.to_string(),
            "notifications with the working set below the threshold (page cache)".to_owned(),
        ),
        (
            "purges",
            p.purges.to_string(),
            "purges on pressure".to_owned(),
        ),
        (
            "returned",
            bytes(p.bytes_returned),
            "RSS those purges gave back".to_owned(),
        ),
    ]);
    if p.mode == Pressure::Gc.word() {
        rows.push((
            "gc_runs",
            p.gc_runs.to_string(),
            "Python gc on pressure".to_owned(),
        ));
    }
    if let Some(ms) = p.last_purge_ms {
        rows.push((
            "last_purge",
            format!("{ms:.1} ms"),
            "from the signal to the end of the purge".to_owned(),
        ));
    }
    let rows: Vec<(&str, String, &str)> = rows
        .iter()
        .map(|(k, v, d)| (*k, v.clone(), d.as_str()))
        .collect();
    out += &kv(&rows);
    out
}

fn indent(t: &str) -> String {
    t.lines().map(|l| format!("  {l}\n")).collect()
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memshim_proto::*;

    #[test]
    fn human_report_has_every_section() {
        let mut s = StatsReport::default();
        s.allocator.resident = 3 << 30;
        s.allocator.purgeable = 1 << 30;
        s.process.rss = (3 << 30) + (512 << 20);
        s.process.unmanaged = 512 << 20;
        s.cgroup = Some(CgroupStats {
            version: 2,
            path: "/a".into(),
            current: 1 << 30,
            ..Default::default()
        });
        s.python = Some(PythonSection {
            version: "3.11.9".into(),
            ..Default::default()
        });
        s.torch = Some(TorchSection {
            version: "2.5.1".into(),
            cuda_initialized: true,
            devices: vec![TorchDevice {
                index: 0,
                reserved: 2 << 30,
                inactive_split: 1 << 30,
                fragmentation: 0.5,
                ..Default::default()
            }],
            alloc_conf: Some("expandable_segments:True".into()),
            host_pinned: Some(HostPinned {
                allocated: 64 << 20,
                active: 0,
                cached: 64 << 20,
            }),
            ..Default::default()
        });
        s.config.dirty_decay_ms = -1;
        s.pressure = Some(PressureStats {
            mode: "on".into(),
            source: "v1".into(),
            watching: vec!["usage_threshold".into(), "check".into()],
            limit: Some(700 << 20),
            threshold: Some(630 << 20),
            events: 2,
            purges: 1,
            bytes_returned: 270 << 20,
            last_purge_ms: Some(6.25),
            ..Default::default()
        });
        let h = human(&s, 42, "python3 serve.py");
        for want in [
            "pid 42: python3 serve.py",
            "resident   3.00 GiB",
            "purgeable  1.00 GiB  dirty + muzzy",
            "unmanaged  512.0 MiB",
            "cgroup v2 /a",
            "max      no limit",
            "dirty_decay         never",
            "python 3.11.9",
            "torch 2.5.1 (CUDA initialized)",
            "  cuda:0",
            "50%",
            "expandable_segments:True  allocator settings in effect",
            "64.0 MiB (64.0 MiB cached)",
            "pressure (on, cgroup v1: usage_threshold, check)",
            "threshold   630.0 MiB",
            "returned    270.0 MiB",
            "6.2 ms  from the signal",
        ] {
            assert!(h.contains(want), "missing {want:?} in\n{h}");
        }
    }
}
