//! `memshim-ctl watch <PID> [--interval S] [--count N]`: RSS, resident and
//! purgeable memory over time, and for a PyTorch process with CUDA, each
//! device's reserved VRAM and what the driver says the process uses. On a terminal the view is redrawn in place
//! with sparklines; otherwise (a pipe, a log) one line per sample.

use crate::args::{parse_interval, pid_parser};
use crate::exit::{self, Exit, Failure};
use crate::output::render::{bytes, delta, sparkline};
use crate::reach::client::Client;
use clap::Args;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Samples kept for the sparklines.
const HISTORY: usize = 60;

/// Options of `watch`.
#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Process id.
    #[arg(value_parser = pid_parser())]
    pub pid: i32,
    /// Seconds between samples (0.1 to 3600).
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
    /// Stop after this many samples, at least 1 (default: until interrupted).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

/// One sample.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// RSS.
    pub rss: u64,
    /// jemalloc resident.
    pub resident: u64,
    /// dirty + muzzy.
    pub purgeable: u64,
    /// Per CUDA device: (index, torch reserved, driver's figure for the
    /// process if NVML has one).
    pub vram: Vec<(u32, u64, Option<u64>)>,
}

/// Runs `watch`.
pub fn run(a: WatchArgs) -> Result<Exit, Failure> {
    let tty = std::io::stdout().is_terminal();
    let mut client: Option<Client> = None;
    let mut history: Vec<Sample> = Vec::new();
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        if client.is_none() {
            client = Some(Client::open(a.pid)?);
        }
        let Some(c) = client.as_mut() else {
            unreachable!()
        };
        let s = match super::stats::fetch(c, false, false) {
            Ok(s) => s,
            Err(_) => {
                // The server closes idle connections; reconnect once.
                client = Some(Client::open(a.pid)?);
                super::stats::fetch(
                    client.as_mut().unwrap_or_else(|| unreachable!()),
                    false,
                    false,
                )?
            }
        };
        let vram = s
            .torch
            .as_ref()
            .map(|t| crate::gpu::vram(a.pid, t).0)
            .unwrap_or_default();
        let sample = Sample {
            rss: s.process.rss,
            resident: s.allocator.resident,
            purgeable: s.allocator.purgeable,
            vram: vram
                .iter()
                .map(|d| (d.index, d.torch_reserved, d.driver_used))
                .collect(),
        };
        history.push(sample);
        if history.len() > HISTORY {
            history.remove(0);
        }
        let command = client
            .as_ref()
            .map(|c| c.proc.command.clone())
            .unwrap_or_default();
        let text = if tty {
            format!(
                "\x1b[H\x1b[2J{}",
                screen(a.pid, &command, &history, a.interval)
            )
        } else {
            line(start.elapsed().as_secs_f64(), &history)
        };
        let written = crate::output::closed::stdout()
            .and_then(|mut out| out.write_all(text.as_bytes()).and_then(|()| out.flush()));
        match written {
            Ok(()) => {}
            // The reader went away (`| head`): a stream ends there.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(exit::OK),
            Err(e) => {
                return Err(Failure::new(
                    exit::FAILED,
                    None,
                    format!("writing to stdout: {e}"),
                ));
            }
        }
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(exit::OK);
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

/// One line per sample (not a terminal): time, figures, change since the
/// previous sample.
pub fn line(t: f64, history: &[Sample]) -> String {
    let cur = history.last().cloned().unwrap_or_default();
    let prev = history
        .len()
        .checked_sub(2)
        .map_or(cur.clone(), |i| history[i].clone());
    let mut s = format!(
        "t={t:.1}s rss={} ({}) resident={} ({}) purgeable={} ({})",
        bytes(cur.rss),
        delta(prev.rss, cur.rss),
        bytes(cur.resident),
        delta(prev.resident, cur.resident),
        bytes(cur.purgeable),
        delta(prev.purgeable, cur.purgeable)
    );
    for &(i, reserved, driver) in &cur.vram {
        s += &format!(" cuda:{i} reserved={}", bytes(reserved));
        if let Some(d) = driver {
            s += &format!(" driver={}", bytes(d));
        }
    }
    s.push('\n');
    s
}

/// The series of the screen: name, and each sample's value (`None` where a
/// sample lacks it).
fn series(history: &[Sample]) -> Vec<(String, Vec<Option<u64>>)> {
    let mut out: Vec<(String, Vec<Option<u64>>)> = vec![
        ("rss".into(), history.iter().map(|x| Some(x.rss)).collect()),
        (
            "resident".into(),
            history.iter().map(|x| Some(x.resident)).collect(),
        ),
        (
            "purgeable".into(),
            history.iter().map(|x| Some(x.purgeable)).collect(),
        ),
    ];
    let devices: Vec<u32> = history
        .last()
        .map(|x| x.vram.iter().map(|d| d.0).collect())
        .unwrap_or_default();
    for dev in devices {
        let of = |x: &Sample| x.vram.iter().find(|d| d.0 == dev).copied();
        out.push((
            format!("cuda:{dev} reserved"),
            history.iter().map(|x| of(x).map(|d| d.1)).collect(),
        ));
        if history.last().and_then(of).is_some_and(|d| d.2.is_some()) {
            out.push((
                format!("cuda:{dev} driver"),
                history.iter().map(|x| of(x).and_then(|d| d.2)).collect(),
            ));
        }
    }
    out
}

/// The full-screen view: per figure, the value, its change since the last
/// sample and since the first shown, and a sparkline.
pub fn screen(pid: i32, command: &str, history: &[Sample], interval: f64) -> String {
    let mut s = format!(
        "memshim-ctl watch: pid {pid} ({command}), every {interval}s, last {} samples (Ctrl-C to stop)\n\n",
        history.len()
    );
    s += &format!(
        "{:<16} {:>11} {:>12} {:>12}  trend\n",
        "", "now", "last", "window"
    );
    for (name, values) in series(history) {
        let known: Vec<u64> = values.iter().flatten().copied().collect();
        let now = known.last().copied().unwrap_or(0);
        let prev = known.len().checked_sub(2).map_or(now, |i| known[i]);
        let first = known.first().copied().unwrap_or(0);
        s += &format!(
            "{:<16} {:>11} {:>12} {:>12}  {}\n",
            name,
            bytes(now),
            delta(prev, now),
            delta(first, now),
            sparkline(&known)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_show_changes() {
        let h = [
            Sample {
                rss: 100 << 20,
                resident: 80 << 20,
                purgeable: 0,
                vram: vec![],
            },
            Sample {
                rss: 60 << 20,
                resident: 40 << 20,
                purgeable: 1 << 20,
                vram: vec![],
            },
        ];
        assert_eq!(
            line(2.0, &h),
            "t=2.0s rss=60.0 MiB (-40.0 MiB) resident=40.0 MiB (-40.0 MiB) purgeable=1.0 MiB (+1.0 MiB)\n"
        );
        let sc = screen(1, "x", &h, 1.0);
        assert!(
            sc.contains("rss") && sc.contains("▁") && sc.contains("█"),
            "{sc}"
        );
    }

    #[test]
    fn cuda_devices_get_their_own_rows() {
        let h = [
            Sample {
                vram: vec![(0, 4 << 30, Some(5 << 30))],
                ..Default::default()
            },
            Sample {
                vram: vec![(0, 1 << 30, Some(2 << 30))],
                ..Default::default()
            },
        ];
        let sc = screen(1, "x", &h, 1.0);
        assert!(
            sc.contains("cuda:0 reserved") && sc.contains("cuda:0 driver"),
            "{sc}"
        );
        assert!(sc.contains("-3.00 GiB"), "{sc}");
        assert!(
            line(1.0, &h).ends_with("cuda:0 reserved=1.00 GiB driver=2.00 GiB\n"),
            "{}",
            line(1.0, &h)
        );
    }

    #[test]
    fn interval_is_bounded() {
        assert!(parse_interval("0.05").is_err());
        assert!(parse_interval("x").is_err());
        assert_eq!(parse_interval("2"), Ok(2.0));
    }
}
