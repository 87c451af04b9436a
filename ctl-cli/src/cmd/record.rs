//! `memshim-ctl record <PID> [--seconds N] [--interval S] -o FILE.svg|.html`:
//! a memory timeline of one shimmed process. Every interval it asks the
//! process for `stats` (as `watch` does) and reads its memory cgroup, then
//! draws RSS, the allocator's resident and purgeable bytes, pymalloc's
//! arenas, PyTorch's reserved and allocated bytes per device, the
//! cgroup's usage and working set, with a marker wherever a purge (or a
//! release), a pressure purge or an idle VRAM return happened
//! (`timeline.rs` draws). Nothing is asked of the process but `stats`.

use crate::args::{parse_interval, pid_parser};
use crate::cgroup;
use crate::exit::{self, Exit, Failure};
use crate::output::print::outln;
use crate::output::render::bytes;
use crate::output::timeline::{Marker, Series, Timeline};
use crate::reach::client::Client;
use crate::reach::procfs;
use clap::Args;
use memshim_proto::StatsReport;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

/// Options of `record`.
#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Process id.
    #[arg(value_parser = pid_parser())]
    pub pid: i32,
    /// How long to record, in seconds (1 to 86400).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub seconds: u64,
    /// Seconds between samples (0.1 to 3600).
    #[arg(long, default_value_t = 0.5, value_parser = parse_interval)]
    pub interval: f64,
    /// Where to write the timeline: FILE.svg (the chart) or FILE.html (the
    /// chart, a table of each figure and the events).
    #[arg(short = 'o', long = "output", value_name = "FILE", value_parser = output_parser)]
    pub output: PathBuf,
}

/// `.svg` or `.html` (any case); anything else is a usage error.
fn output_parser(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    match p
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("svg" | "html" | "htm") => Ok(p),
        _ => Err(format!("{s:?}: the file must end in .svg or .html")),
    }
}

/// One sample's figures.
#[derive(Default, Clone)]
struct Sample {
    t: f64,
    rss: u64,
    resident: Option<u64>,
    purgeable: Option<u64>,
    pymalloc: Option<u64>,
    /// (device, reserved, allocated)
    torch: Vec<(u32, u64, u64)>,
    cg_usage: Option<u64>,
    cg_working_set: Option<u64>,
    purges: u64,
    released: u64,
    pressure_purges: u64,
    vram_returns: u64,
}

fn sample(t: f64, s: &StatsReport, cg: Option<&cgroup::fs::Location>, pid: i32) -> Sample {
    Sample {
        t,
        rss: s.process.rss,
        resident: Some(s.allocator.resident),
        purgeable: Some(s.allocator.purgeable),
        pymalloc: s.python.as_ref().and_then(|p| p.pymalloc_arena_bytes),
        torch: s
            .torch
            .as_ref()
            .map(|t| {
                t.devices
                    .iter()
                    .map(|d| (d.index, d.reserved, d.allocated))
                    .collect()
            })
            .unwrap_or_default(),
        purges: s.purges.map_or(0, |p| p.count),
        released: s.purges.map_or(0, |p| p.released_bytes),
        pressure_purges: s.pressure.as_ref().map_or(0, |p| p.purges),
        vram_returns: s.cuda_idle.map_or(0, |c| c.returns),
        ..with_cgroup(t, cg, pid)
    }
}

/// A sample with only the time and the cgroup's figures.
fn with_cgroup(t: f64, cg: Option<&cgroup::fs::Location>, pid: i32) -> Sample {
    let mem = cg.and_then(|l| cgroup::fs::read_memory(l, Some(pid)).ok());
    Sample {
        t,
        cg_usage: mem.as_ref().map(|m| m.usage),
        cg_working_set: mem.as_ref().map(|m| m.working_set),
        ..Sample::default()
    }
}

/// Where the samples come from.
enum Source {
    /// The shim, over its socket.
    Shim(Box<Client>),
    /// `/proc` (a process without the preload, never stopped): the first
    /// sample's start time, which tells a reused pid.
    Proc(u64),
}

impl Source {
    fn sample(
        &mut self,
        t: f64,
        cg: Option<&cgroup::fs::Location>,
        pid: i32,
    ) -> Result<Sample, Failure> {
        match self {
            Source::Shim(client) => {
                let s = match super::stats::fetch(client, false, false) {
                    Ok(s) => s,
                    // The server closes idle connections; connect again once.
                    Err(_) => {
                        let mut c = Client::open(pid)?;
                        let s = super::stats::fetch(&mut c, false, false)?;
                        **client = c;
                        s
                    }
                };
                Ok(sample(t, &s, cg, pid))
            }
            Source::Proc(start) => {
                let p = procfs::read_proc(pid)?;
                if p.starttime != *start || procfs::all_threads_exited(pid) {
                    return Err(Failure::new(
                        exit::NOT_FOUND,
                        Some(pid),
                        "the process exited",
                    ));
                }
                Ok(Sample {
                    rss: p.rss,
                    ..with_cgroup(t, cg, pid)
                })
            }
        }
    }
}

/// Runs `record`.
pub fn run(a: RecordArgs) -> Result<Exit, Failure> {
    let unshimmed = crate::reach::ptrace::applies(a.pid);
    // What a recording from /proc says of the process. Another user's,
    // whose maps we may not read, may be preloaded or not: not said.
    let note = unshimmed.then(|| {
        if procfs::memshim_in(a.pid).is_err() {
            UNKNOWN_PRELOAD
        } else {
            NOT_PRELOADED
        }
    });
    let (mut source, command) = if unshimmed {
        let p = procfs::read_proc(a.pid)?;
        (Source::Proc(p.starttime), p.command)
    } else {
        let client = Client::open(a.pid)?;
        let command = client.proc.command.clone();
        (Source::Shim(Box::new(client)), command)
    };
    let cg = cgroup::fs::locate(Some(a.pid)).ok();
    let started = SystemTime::now();
    let start = Instant::now();
    let total = Duration::from_secs(a.seconds);
    let mut samples = vec![source.sample(0.0, cg.as_ref(), a.pid)?];
    // A path that cannot be written fails at once, once the first sample is
    // in; the file itself is written at the end only, so that a recording
    // stopped on the way (Ctrl-C, a timeout) leaves no file, and an earlier
    // one stays as it was.
    crate::output::check_file(&a.output).map_err(|e| write_failure(&a, &e))?;
    outln!(
        "{}: recording pid {} ({command}) for {} s, a sample every {} s",
        a.output.display(),
        a.pid,
        a.seconds,
        a.interval
    )?;
    let mut ended: Option<Failure> = None;
    for k in 1u32.. {
        let due = start + Duration::from_secs_f64(a.interval * f64::from(k));
        if due > start + total {
            break;
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // A process that ended ends the recording.
        match source.sample(start.elapsed().as_secs_f64(), cg.as_ref(), a.pid) {
            Ok(s) => samples.push(s),
            Err(f) => {
                ended = Some(f);
                break;
            }
        }
    }
    let mut timeline = build(&a, &command, started, &samples, cg.as_ref());
    if let Some(note) = note {
        timeline.notes.push(note.into());
    }
    let is_svg = a
        .output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let text = if is_svg {
        timeline.svg()
    } else {
        timeline.html()
    };
    std::fs::write(&a.output, text).map_err(|e| write_failure(&a, &e))?;
    let (first, last) = (samples.first(), samples.last());
    outln!(
        "{}: {} samples over {:.1} s of pid {} ({}); RSS {} -> {}, highest {}; {} event(s)",
        a.output.display(),
        samples.len(),
        last.map_or(0.0, |s| s.t),
        a.pid,
        command,
        bytes(first.map_or(0, |s| s.rss)),
        bytes(last.map_or(0, |s| s.rss)),
        bytes(samples.iter().map(|s| s.rss).max().unwrap_or(0)),
        timeline.markers.len()
    )?;
    if let Some(note) = note {
        outln!("pid {}: {note}", a.pid)?;
    }
    match ended {
        None => Ok(exit::OK),
        Some(f) => Err(Failure::new(
            f.exit,
            Some(a.pid),
            format!(
                "the recording stopped after {:.1} of {} s: {}; the timeline up to then is in {}",
                last.map_or(0.0, |s| s.t),
                a.seconds,
                f.message,
                a.output.display()
            ),
        )),
    }
}

/// What a timeline of a process without the preload holds, and why.
const NOT_PRELOADED: &str = "not preloaded: recorded from /proc and its cgroup without stopping \
it (the allocator's, Python's and PyTorch's figures need the shim)";

/// The same, for a process whose maps we may not read (another user's):
/// whether it has the shim cannot be told.
const UNKNOWN_PRELOAD: &str = "another user's process (its /proc/PID/maps is not readable, so \
whether it is preloaded is not known): recorded from /proc and its cgroup without stopping it \
(the allocator's, Python's and PyTorch's figures need its socket: run memshim-ctl as its user)";

fn write_failure(a: &RecordArgs, e: &std::io::Error) -> Failure {
    Failure::new(
        exit::FAILED,
        Some(a.pid),
        format!("cannot write {}: {e}", a.output.display()),
    )
    .hint("choose a path in a directory you can write".to_owned())
}

/// The chart's series and markers from the samples.
fn build(
    a: &RecordArgs,
    command: &str,
    started: SystemTime,
    samples: &[Sample],
    cg: Option<&cgroup::fs::Location>,
) -> Timeline {
    type Figure<'a> = &'a dyn Fn(&Sample) -> Option<u64>;
    let line = |name: &str, f: Figure<'_>| Series {
        name: name.to_owned(),
        values: samples.iter().map(f).collect(),
    };
    let any = |f: Figure<'_>| samples.iter().any(|s| f(s).is_some());
    let mut series = vec![line("RSS", &|s| Some(s.rss))];
    if any(&|s| s.resident) {
        series.push(line("allocator resident", &|s| s.resident));
        series.push(line("allocator purgeable", &|s| s.purgeable));
    }
    if any(&|s| s.pymalloc) {
        series.push(line("pymalloc arenas", &|s| s.pymalloc));
    }
    let mut devices: Vec<u32> = samples
        .iter()
        .flat_map(|s| s.torch.iter().map(|d| d.0))
        .collect();
    devices.sort_unstable();
    devices.dedup();
    for dev in devices {
        let of = move |s: &Sample| s.torch.iter().find(|d| d.0 == dev).copied();
        series.push(line(&format!("cuda:{dev} reserved"), &|s| {
            of(s).map(|d| d.1)
        }));
        series.push(line(&format!("cuda:{dev} allocated"), &|s| {
            of(s).map(|d| d.2)
        }));
    }
    if any(&|s| s.cg_usage) {
        series.push(line("cgroup usage", &|s| s.cg_usage));
        series.push(line("cgroup working set", &|s| s.cg_working_set));
    }
    let mut markers = Vec::new();
    for w in samples.windows(2) {
        let (p, s) = (&w[0], &w[1]);
        if s.purges > p.purges {
            let n = s.purges - p.purges;
            markers.push(Marker {
                t: s.t,
                label: format!(
                    "purge{} {}",
                    if n > 1 {
                        format!(" ×{n}")
                    } else {
                        String::new()
                    },
                    bytes(s.released.saturating_sub(p.released))
                ),
            });
        }
        if s.pressure_purges > p.pressure_purges {
            markers.push(Marker {
                t: s.t,
                label: "pressure purge".into(),
            });
        }
        if s.vram_returns > p.vram_returns {
            markers.push(Marker {
                t: s.t,
                label: "vram return".into(),
            });
        }
    }
    let since = started
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut notes = vec![
        format!(
            "memshim-ctl record: a sample every {} s from {}",
            a.interval,
            utc(since)
        ),
        "markers: purge and release requests (bytes released), pressure purges, idle VRAM returns"
            .into(),
    ];
    match cg {
        Some(l) => notes.push(format!("cgroup: {} (v{})", l.path, l.version)),
        None => notes.push("no memory cgroup readable here: no cgroup lines".into()),
    }
    Timeline {
        title: format!("pid {} ({command})", a.pid),
        t: samples.iter().map(|s| s.t).collect(),
        series,
        markers,
        notes,
    }
}

/// `2026-11-29 06:55:39 UTC` from seconds since the epoch (the civil
/// calendar from a day count, as in Howard Hinnant's `civil_from_days`).
fn utc(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_935_339), "2026-11-29 06:55:39 UTC");
    }

    #[test]
    fn only_svg_and_html_are_written() {
        assert!(output_parser("a.svg").is_ok());
        assert!(output_parser("/tmp/A.HTML").is_ok());
        assert!(output_parser("a.png").is_err());
        assert!(output_parser("svg").is_err());
    }
}
