//! `memshim-ctl watch <PID> [--interval S] [--count N]`: RSS, resident and
//! purgeable memory over time. On a terminal the view is redrawn in place
//! with sparklines; otherwise (a pipe, a log) one line per sample.

use crate::cli::pid_parser;
use crate::client::Client;
use crate::exit::{Exit, Failure};
use crate::render::{bytes, delta, sparkline};
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
    /// Seconds between samples (at least 0.1).
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
    /// Stop after this many samples (default: until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (0.1..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be between 0.1 and 3600 seconds".into())
    }
}

/// One sample.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// RSS.
    pub rss: u64,
    /// jemalloc resident.
    pub resident: u64,
    /// dirty + muzzy.
    pub purgeable: u64,
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
        let sample = Sample {
            rss: s.process.rss,
            resident: s.allocator.resident,
            purgeable: s.allocator.purgeable,
        };
        history.push(sample);
        if history.len() > HISTORY {
            history.remove(0);
        }
        let command = client
            .as_ref()
            .map(|c| c.proc.command.clone())
            .unwrap_or_default();
        let mut out = std::io::stdout().lock();
        let text = if tty {
            format!(
                "\x1b[H\x1b[2J{}",
                screen(a.pid, &command, &history, a.interval)
            )
        } else {
            line(start.elapsed().as_secs_f64(), &history)
        };
        if out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return Ok(Exit::Ok); // stdout closed (`| head`)
        }
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(Exit::Ok);
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

/// One line per sample (not a terminal): time, figures, change since the
/// previous sample.
pub fn line(t: f64, history: &[Sample]) -> String {
    let cur = history.last().copied().unwrap_or_default();
    let prev = history.len().checked_sub(2).map_or(cur, |i| history[i]);
    format!(
        "t={t:.1}s rss={} ({}) resident={} ({}) purgeable={} ({})\n",
        bytes(cur.rss),
        delta(prev.rss, cur.rss),
        bytes(cur.resident),
        delta(prev.resident, cur.resident),
        bytes(cur.purgeable),
        delta(prev.purgeable, cur.purgeable)
    )
}

/// The full-screen view: per figure, the value, its change since the last
/// sample and since the first shown, and a sparkline.
pub fn screen(pid: i32, command: &str, history: &[Sample], interval: f64) -> String {
    let cur = history.last().copied().unwrap_or_default();
    let prev = history.len().checked_sub(2).map_or(cur, |i| history[i]);
    let first = history.first().copied().unwrap_or_default();
    let mut s = format!(
        "memshim-ctl watch: pid {pid} ({command}), every {interval}s, last {} samples (Ctrl-C to stop)\n\n",
        history.len()
    );
    s += &format!(
        "{:<10} {:>11} {:>12} {:>12}  trend\n",
        "", "now", "last", "window"
    );
    for (name, get) in [
        ("rss", (|x: &Sample| x.rss) as fn(&Sample) -> u64),
        ("resident", |x: &Sample| x.resident),
        ("purgeable", |x: &Sample| x.purgeable),
    ] {
        let values: Vec<u64> = history.iter().map(get).collect();
        s += &format!(
            "{:<10} {:>11} {:>12} {:>12}  {}\n",
            name,
            bytes(get(&cur)),
            delta(get(&prev), get(&cur)),
            delta(get(&first), get(&cur)),
            sparkline(&values)
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
            },
            Sample {
                rss: 60 << 20,
                resident: 40 << 20,
                purgeable: 1 << 20,
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
    fn interval_is_bounded() {
        assert!(parse_interval("0.05").is_err());
        assert!(parse_interval("x").is_err());
        assert_eq!(parse_interval("2"), Ok(2.0));
    }
}
