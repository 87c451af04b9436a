//! `memshim-ctl metrics`: the Prometheus text exposition (format 0.0.4) of
//! every shimmed process the caller can reach. The metric names below are a
//! stable contract, documented in docs/deploy.md ("Metrics").
//!
//! Collection is bounded: at most `max_processes` processes, each asked once
//! with a per-process time limit, [`ASKERS`] at a time, the whole scrape
//! under a deadline. Nothing is kept between runs.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memshim_proto::client::Connection;
use memshim_proto::{Reply, Request, Response, StatsReport};

use crate::exit::{self, Exit, Failure};
use crate::output::print::out;
use crate::reach::procfs::{self, Proc};
use crate::reach::socket;

/// Limits shared by `metrics` and `serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Limits {
    /// Ask at most this many processes per scrape (the rest are counted in
    /// memshim_scrape_skipped_processes)
    #[arg(long, default_value_t = 256, value_name = "N", value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u64).range(1..=1_000_000), |n| n as usize))]
    pub max_processes: usize,
    /// Time limit for one process's answer
    #[arg(long, default_value_t = 1000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub timeout_ms: u64,
    /// Time limit for the whole scrape; processes not reached by then are skipped
    #[arg(long, default_value_t = 8000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub deadline_ms: u64,
}

/// Options of `memshim-ctl metrics`.
#[derive(clap::Args, Debug)]
pub struct MetricsArgs {
    #[command(flatten)]
    pub limits: Limits,
}

/// One process found by discovery and what it answered.
#[derive(Debug)]
pub struct ProcSample {
    /// Pid as the caller sees it.
    pub pid: i32,
    /// `comm` of the process.
    pub command: String,
    /// Its `stats` report, or why there is none.
    pub stats: Result<StatsReport, String>,
}

/// Figures about the scrape itself.
#[derive(Debug, Default)]
pub struct ScrapeInfo {
    /// Processes with a control socket the caller could see.
    pub found: usize,
    /// Processes not asked (cap or deadline).
    pub skipped: usize,
    /// Wall time of the collection.
    pub duration: Duration,
}

/// Escapes a label value: backslash, double quote and newline.
pub fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A metric family being written: HELP and TYPE once, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

fn family<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    Family { out }
}

impl Family<'_> {
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(val));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {v}");
    }
}

/// Extra labels and value of one sample.
type Row = (Vec<(&'static str, String)>, f64);
type Get = fn(&StatsReport) -> Vec<Row>;

/// `(name, type, help, extractor)`: one entry per per-process metric family.
/// Each extractor returns the samples (extra labels, value) for one report.
const FAMILIES: &[(&str, &str, &str, Get)] = &[
    (
        "memshim_allocator_bytes",
        "gauge",
        "jemalloc figures of the process by kind, in bytes (docs/stats.md).",
        |s| {
            let a = &s.allocator;
            [
                ("allocated", a.allocated),
                ("active", a.active),
                ("resident", a.resident),
                ("mapped", a.mapped),
                ("retained", a.retained),
                ("metadata", a.metadata),
                ("dirty", a.dirty),
                ("muzzy", a.muzzy),
                ("tcache", a.tcache),
            ]
            .into_iter()
            .map(|(k, v)| (vec![("kind", k.to_string())], v as f64))
            .collect()
        },
    ),
    (
        "memshim_purgeable_bytes",
        "gauge",
        "Dirty plus muzzy bytes: what a purge returns now.",
        |s| vec![(vec![], s.allocator.purgeable as f64)],
    ),
    (
        "memshim_resident_bytes",
        "gauge",
        "Resident set size of the process (VmRSS), in bytes.",
        |s| vec![(vec![], s.process.rss as f64)],
    ),
    (
        "memshim_unmanaged_bytes",
        "gauge",
        "Resident bytes the shim does not manage (RSS less the allocator's pages).",
        |s| vec![(vec![], s.process.unmanaged as f64)],
    ),
    (
        "memshim_swap_bytes",
        "gauge",
        "Swapped-out anonymous memory of the process (VmSwap), in bytes.",
        |s| {
            s.process
                .swap
                .map(|v| (vec![], v as f64))
                .into_iter()
                .collect()
        },
    ),
    (
        "memshim_cgroup_memory_usage_bytes",
        "gauge",
        "Usage of the process's memory cgroup (memory.current or memory.usage_in_bytes).",
        |s| {
            s.cgroup
                .iter()
                .map(|c| (vec![("cgroup", c.path.clone())], c.current as f64))
                .collect()
        },
    ),
    (
        "memshim_cgroup_memory_limit_bytes",
        "gauge",
        "Limit of the process's memory cgroup (memory.max or memory.limit_in_bytes); absent when unlimited.",
        |s| {
            s.cgroup
                .iter()
                .filter_map(|c| Some((vec![("cgroup", c.path.clone())], c.max? as f64)))
                .collect()
        },
    ),
    (
        "memshim_purges_total",
        "counter",
        "Purge requests the process has served (purge and release).",
        |s| s.purges.iter().map(|p| (vec![], p.count as f64)).collect(),
    ),
    (
        "memshim_purge_released_bytes_total",
        "counter",
        "Resident bytes released by those purge requests, summed.",
        |s| {
            s.purges
                .iter()
                .map(|p| (vec![], p.released_bytes as f64))
                .collect()
        },
    ),
    (
        "memshim_pressure_purges_total",
        "counter",
        "Purges the process ran because its memory cgroup was under pressure (MEMSHIM_PRESSURE).",
        |s| {
            s.pressure
                .iter()
                .map(|p| (vec![], p.purges as f64))
                .collect()
        },
    ),
    (
        "memshim_pressure_bytes_returned_total",
        "counter",
        "Resident bytes returned by those pressure purges, summed.",
        |s| {
            s.pressure
                .iter()
                .map(|p| (vec![], p.bytes_returned as f64))
                .collect()
        },
    ),
    (
        "memshim_pressure_events_total",
        "counter",
        "Memory pressure signals the process saw (cgroup notifications, threshold crossings).",
        |s| {
            s.pressure
                .iter()
                .map(|p| (vec![], p.events as f64))
                .collect()
        },
    ),
    (
        "memshim_pressure_ignored_total",
        "counter",
        "Cgroup notifications after which the working set was below the threshold (page cache the kernel reclaims; not pressure).",
        |s| {
            s.pressure
                .iter()
                .map(|p| (vec![], p.ignored as f64))
                .collect()
        },
    ),
    (
        "memshim_pressure_active",
        "gauge",
        "1 while the process is under memory pressure (decay is short), else 0.",
        |s| {
            s.pressure
                .iter()
                .map(|p| (vec![], if p.active { 1.0 } else { 0.0 }))
                .collect()
        },
    ),
    (
        "memshim_cuda_idle_returns_total",
        "counter",
        "Times the idle VRAM return emptied PyTorch's caches (MEMSHIM_CUDA_IDLE_MS; absent when off).",
        |s| {
            s.cuda_idle
                .iter()
                .map(|c| (vec![], c.returns as f64))
                .collect()
        },
    ),
    (
        "memshim_cuda_idle_returned_bytes_total",
        "counter",
        "Bytes the idle VRAM return gave back, by memory kind (vram, pinned_host).",
        |s| {
            s.cuda_idle
                .iter()
                .flat_map(|c| {
                    [
                        (vec![("kind", "vram".into())], c.vram_returned as f64),
                        (
                            vec![("kind", "pinned_host".into())],
                            c.pinned_returned as f64,
                        ),
                    ]
                })
                .collect()
        },
    ),
    (
        "memshim_decay_seconds",
        "gauge",
        "Current decay time by page state, in seconds; -1 means never.",
        |s| {
            let secs = |ms: i64| if ms < 0 { -1.0 } else { ms as f64 / 1000.0 };
            vec![
                (
                    vec![("state", "dirty".into())],
                    secs(s.config.dirty_decay_ms),
                ),
                (
                    vec![("state", "muzzy".into())],
                    secs(s.config.muzzy_decay_ms),
                ),
            ]
        },
    ),
    (
        "memshim_interposed",
        "gauge",
        "1 if the shim's malloc is the process's malloc, else 0.",
        |s| vec![(vec![], if s.config.interposed { 1.0 } else { 0.0 })],
    ),
    (
        "memshim_info",
        "gauge",
        "Constant 1, labelled with versions and the control mode.",
        |s| {
            vec![(
                vec![
                    ("shim_version", s.config.shim_version.clone()),
                    ("jemalloc_version", s.config.jemalloc_version.clone()),
                    ("control", s.config.control.clone()),
                ],
                1.0,
            )]
        },
    ),
    (
        "memshim_python_gc_collections_total",
        "counter",
        "CPython garbage collections by generation.",
        |s| {
            // Absent when the program never imported gc (gc_collections is None).
            s.python
                .iter()
                .filter_map(|p| p.gc_collections)
                .flat_map(|c| {
                    (0..3).map(move |g| (vec![("generation", g.to_string())], c[g] as f64))
                })
                .collect()
        },
    ),
    (
        "memshim_python_allocated_blocks",
        "gauge",
        "CPython sys.getallocatedblocks().",
        |s| {
            s.python
                .iter()
                .map(|p| (vec![], p.allocated_blocks as f64))
                .collect()
        },
    ),
    (
        "memshim_python_pymalloc_arena_bytes",
        "gauge",
        "Bytes in pymalloc arenas (mmap'ed directly, outside the shim).",
        |s| {
            s.python
                .iter()
                .filter_map(|p| Some((vec![], p.pymalloc_arena_bytes? as f64)))
                .collect()
        },
    ),
    (
        "memshim_python_threads",
        "gauge",
        "Threads of the CPython interpreter.",
        |s| {
            s.python
                .iter()
                .map(|p| (vec![], p.threads as f64))
                .collect()
        },
    ),
    (
        "memshim_torch_cuda_bytes",
        "gauge",
        "PyTorch CUDA caching allocator by device and kind, in bytes.",
        |s| {
            let mut v = vec![];
            for d in s.torch.iter().flat_map(|t| &t.devices) {
                for (k, b) in [
                    ("allocated", d.allocated),
                    ("reserved", d.reserved),
                    ("active", d.active),
                    ("inactive_split", d.inactive_split),
                    ("peak_allocated", d.peak_allocated),
                ] {
                    v.push((
                        vec![("device", d.index.to_string()), ("kind", k.to_string())],
                        b as f64,
                    ));
                }
            }
            v
        },
    ),
    (
        "memshim_torch_cuda_fragmentation_ratio",
        "gauge",
        "Share of a device's reserved CUDA memory in free fragments of split blocks.",
        |s| {
            s.torch
                .iter()
                .flat_map(|t| &t.devices)
                .map(|d| (vec![("device", d.index.to_string())], d.fragmentation))
                .collect()
        },
    ),
    (
        "memshim_torch_pinned_host_bytes",
        "gauge",
        "PyTorch's pinned (page-locked) host memory cache by kind, in bytes.",
        |s| {
            let mut v = vec![];
            for h in s.torch.iter().filter_map(|t| t.host_pinned) {
                for (k, b) in [("allocated", h.allocated), ("cached", h.cached)] {
                    v.push((vec![("kind", k.to_string())], b as f64));
                }
            }
            v
        },
    ),
    (
        "memshim_torch_cuda_alloc_retries_total",
        "counter",
        "PyTorch cache flushes forced by a failed cudaMalloc.",
        |s| {
            s.torch
                .iter()
                .flat_map(|t| &t.devices)
                .map(|d| {
                    (
                        vec![("device", d.index.to_string())],
                        d.num_alloc_retries as f64,
                    )
                })
                .collect()
        },
    ),
    (
        "memshim_torch_cuda_ooms_total",
        "counter",
        "PyTorch CUDA out-of-memory errors.",
        |s| {
            s.torch
                .iter()
                .flat_map(|t| &t.devices)
                .map(|d| (vec![("device", d.index.to_string())], d.num_ooms as f64))
                .collect()
        },
    ),
];

/// The whole exposition for `samples`.
pub fn render(samples: &[ProcSample], info: &ScrapeInfo) -> String {
    let mut out = String::new();
    let pids: Vec<String> = samples.iter().map(|s| s.pid.to_string()).collect();
    {
        let mut f = family(
            &mut out,
            "memshim_up",
            "gauge",
            "1 if the process's control endpoint answered this scrape.",
        );
        for (s, pid) in samples.iter().zip(&pids) {
            f.sample(
                "memshim_up",
                &[("pid", pid), ("command", &s.command)],
                s.stats.is_ok() as u8 as f64,
            );
        }
    }
    for (name, kind, help, get) in FAMILIES {
        let rows: Vec<(usize, Row)> = samples
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.stats.as_ref().ok().map(|r| (i, r)))
            .flat_map(|(i, r)| get(r).into_iter().map(move |row| (i, row)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let mut f = family(&mut out, name, kind, help);
        for (i, (extra, v)) in rows {
            let mut labels: Vec<(&str, &str)> =
                vec![("pid", &pids[i]), ("command", &samples[i].command)];
            labels.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
            f.sample(name, &labels, v);
        }
    }
    let scrape = [
        info.found as f64,
        info.skipped as f64,
        info.duration.as_secs_f64(),
    ];
    for ((name, help), v) in SCRAPE_GAUGES.into_iter().zip(scrape) {
        family(&mut out, name, "gauge", help).sample(name, &[], v);
    }
    out
}

/// The scrape's own gauges, after the processes' families: name and help.
const SCRAPE_GAUGES: [(&str, &str); 3] = [
    (
        "memshim_scrape_processes",
        "Shimmed processes with a reachable control socket.",
    ),
    (
        "memshim_scrape_skipped_processes",
        "Processes not asked in this scrape (process cap or scrape deadline).",
    ),
    (
        "memshim_scrape_duration_seconds",
        "Time this scrape took to collect.",
    ),
];

/// Sends one request line and reads one response line, at most
/// MAX_RESPONSE_BYTES, within the stream's timeouts.
/// `hello` + `stats` with every step under `budget`: a process that does not
/// answer in time costs at most that.
pub fn ask_stats(p: &Proc, budget: Duration) -> Result<StatsReport, String> {
    let t0 = Instant::now();
    let loc = socket::locate(p);
    let left = || {
        budget
            .saturating_sub(t0.elapsed())
            .max(Duration::from_millis(1))
    };
    let mut c = Connection::open(&loc.dir, &loc.name, left())
        .map_err(|_| format!("cannot connect to {}", loc.path().display()))?;
    let client = Some(format!("memshim-ctl {} metrics", env!("CARGO_PKG_VERSION")));
    match c.hello(client).map_err(|e| format!("hello: {e}"))? {
        Ok(h) if socket::hello_matches(&h, p) => {}
        Ok(h) => {
            return Err(format!(
                "socket answered as pid {} started at {}",
                h.pid, h.starttime
            ));
        }
        Err(_) => return Err("unexpected answer to hello".into()),
    }
    c.set_timeout(left());
    let req = Request::Stats {
        arenas: false,
        pss: false,
    };
    match c.request(&req).map_err(|e| format!("stats: {e}"))? {
        Response::Ok(Reply::Stats(s)) => Ok(*s),
        Response::Ok(_) => Err("unexpected answer to stats".into()),
        Response::Error(e) => Err(format!("stats: {}", e.message)),
    }
}

/// Shimmed processes with a control socket, as (process, comm).
fn reachable() -> Vec<(Proc, String)> {
    let me = std::process::id() as i32;
    procfs::all_pids()
        .into_iter()
        .filter(|&pid| pid != me && matches!(procfs::shim_loaded(pid), Ok(true)))
        .filter_map(|pid| {
            let p = procfs::read_proc(pid).ok()?;
            std::fs::symlink_metadata(socket::locate(&p).path()).ok()?;
            let comm = crate::reach::procfs::read_text(format!("/proc/{pid}/comm"))
                .ok()?
                .trim()
                .to_owned();
            Some((p, comm))
        })
        .collect()
}

/// Processes asked at once by one scrape.
pub const ASKERS: usize = 8;

/// Discovers and asks every reachable shimmed process, within `limits`.
pub fn collect(limits: &Limits) -> (Vec<ProcSample>, ScrapeInfo) {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_millis(limits.deadline_ms);
    let found = reachable();
    let asked = &found[..found.len().min(limits.max_processes)];
    // Processes are asked [`ASKERS`] at a time, so that a few that do not
    // answer (stopped, swapped out) each hold one asker for `--timeout-ms`
    // instead of using up the deadline of everyone after them.
    let next = AtomicUsize::new(0);
    // One asker: the (index, sample) of each process it took, in turn.
    let ask = || {
        let mut mine = vec![];
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            if i >= asked.len() || now >= deadline {
                return mine;
            }
            let (p, comm) = &asked[i];
            let budget = Duration::from_millis(limits.timeout_ms).min(deadline - now);
            let stats = ask_stats(p, budget);
            mine.push((
                i,
                ProcSample {
                    pid: p.pid,
                    command: comm.clone(),
                    stats,
                },
            ));
        }
    };
    let mut answers = std::thread::scope(|sc| {
        // Without another thread, this one asks them all.
        let helpers: Vec<_> = (1..ASKERS.min(asked.len()))
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(sc, ask).ok())
            .collect();
        let mut all = ask();
        for h in helpers {
            all.extend(h.join().unwrap_or_default());
        }
        all
    });
    answers.sort_unstable_by_key(|(i, _)| *i);
    let samples: Vec<ProcSample> = answers.into_iter().map(|(_, s)| s).collect();
    let info = ScrapeInfo {
        found: found.len(),
        skipped: found.len() - samples.len(),
        duration: t0.elapsed(),
    };
    (samples, info)
}

/// Prints the exposition once.
pub fn run(a: MetricsArgs) -> Result<Exit, Failure> {
    let (samples, info) = collect(&a.limits);
    out!("{}", render(&samples, &info))?;
    Ok(exit::OK)
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
