//! `memshim-ctl stats <PID> [--json] [--arenas] [--pss]`: the memory report.
//! Every figure is defined in docs/stats.md.

use crate::cli::pid_parser;
use crate::client::Client;
use crate::exit::{Exit, Failure};
use crate::render::{bytes, kv, ms, opt_bytes, table};
use clap::Args;
use memshim_proto::{Reply, Request, StatsReport};

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
    match c.request(&Request::Stats { arenas, pss })? {
        Reply::Stats(s) => Ok(*s),
        other => Err(c.unexpected(&other)),
    }
}

/// Runs `stats`.
pub fn run(a: StatsArgs) -> Result<Exit, Failure> {
    let mut c = Client::open(a.pid)?;
    let s = fetch(&mut c, a.arenas, a.pss)?;
    if a.json {
        println!("{}", serde_json::to_string(&s).unwrap_or_default());
    } else {
        print!("{}", human(&s, a.pid, &c.proc.command));
    }
    Ok(Exit::Ok)
}

/// The human form of a stats report.
pub fn human(s: &StatsReport, pid: i32, command: &str) -> String {
    let a = &s.allocator;
    let p = &s.process;
    let c = &s.config;
    let mut out = format!("pid {pid}: {command}\n");
    out += &format!(
        "\nallocator (jemalloc {})\n",
        c.jemalloc_version.split('-').next().unwrap_or("")
    );
    out += &kv(&[
        ("allocated", bytes(a.allocated), "in live allocations"),
        ("active", bytes(a.active), "pages holding allocations"),
        (
            "resident",
            bytes(a.resident),
            "physically resident, allocator-managed",
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
    if let Some(ar) = &s.arenas {
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
        out += "\narenas\n";
        out += &indent(&table(
            &[
                "ARENA", "THREADS", "ACTIVE", "DIRTY", "MUZZY", "RESIDENT", "TCACHE",
            ],
            &rows,
        ));
    }
    out += "\nprocess\n";
    out += &kv(&[
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
            "rss - resident: not the shim's (pymalloc, mmap, stacks, code)",
        ),
    ]);
    if let Some(g) = &s.cgroup {
        out += &format!("\ncgroup v{} {}\n", g.version, g.path);
        let max = g.max.map_or_else(|| "no limit".to_owned(), bytes);
        out += &kv(&[
            (
                "current",
                bytes(g.current),
                "what the OOM killer and dashboards count",
            ),
            ("max", max, ""),
            ("anon", opt_bytes(g.anon), ""),
            ("file", opt_bytes(g.file), "page cache, reclaimable"),
            ("kernel", opt_bytes(g.kernel), ""),
        ]);
    }
    out += "\nconfig\n";
    let decay = |v: i64| {
        if v < 0 {
            "never".to_owned()
        } else {
            format!("{v} ms")
        }
    };
    out += &kv(&[
        ("dirty_decay", decay(c.dirty_decay_ms), ""),
        ("muzzy_decay", decay(c.muzzy_decay_ms), ""),
        ("narenas", c.narenas.to_string(), ""),
        (
            "background_purge",
            yes(c.background_purge),
            "the shim's thread decays idle pages",
        ),
        (
            "interposed",
            yes(c.interposed),
            "the shim's malloc is the process's malloc",
        ),
        ("control", c.control.clone(), "MEMSHIM_CONTROL"),
        ("uptime", ms(c.uptime_ms as f64), ""),
        ("fork_child", yes(c.fork_child), ""),
        (
            "deepbind_cleared",
            c.deepbind_cleared.to_string(),
            "dlopen calls with RTLD_DEEPBIND removed",
        ),
        ("thread_starts", c.thread_starts.to_string(), ""),
        ("shim", c.shim_version.clone(), ""),
    ]);
    match (&s.python, &s.python_unavailable) {
        (Some(py), _) => {
            out += &format!(
                "\npython {}{}\n",
                py.version,
                if py.free_threaded {
                    " (free-threaded)"
                } else {
                    ""
                }
            );
            let three = |v: [u64; 3]| format!("{} {} {}", v[0], v[1], v[2]);
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
        }
        (None, Some(why)) if !matches!(why, memshim_proto::PythonUnavailable::NoPython) => {
            out += &format!("\npython: {why}\n");
        }
        _ => {}
    }
    if let Some(t) = &s.torch {
        out += &format!(
            "\ntorch {} (CUDA {})\n",
            t.version,
            if t.cuda_initialized {
                "initialized"
            } else {
                "not initialized"
            }
        );
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
                    "PEAK",
                    "RETRIES",
                    "OOMS",
                ],
                &rows,
            ));
        }
    }
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
                ..Default::default()
            }],
        });
        s.config.dirty_decay_ms = -1;
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
        ] {
            assert!(h.contains(want), "missing {want:?} in\n{h}");
        }
    }
}
