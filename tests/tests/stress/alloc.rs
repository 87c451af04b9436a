//! 32 threads allocate, fill, verify and free blocks of mixed sizes (the C
//! fixture stress_alloc.c) while the control socket is hammered with
//! `stats`, `purge` and `decay` changes. No checksum error, no deadlock
//! (every wait has a bound), and the shim's own threads and metadata do not
//! grow over the run.

use memshim_tests::endpoint::Conn;
use memshim_tests::stress::{Level, Rng, alive, figures, memshim_threads, seed};
use memshim_tests::*;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const THREADS: usize = 32;

struct Sample {
    ms: u64,
    metadata: u64,
    threads: u64,
}

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Sends requests to `pid`'s socket until `stop`; returns how many were
/// answered. Panics (with the seed and the last requests) on a wrong or
/// missing answer.
fn hammer(
    dir: std::path::PathBuf,
    pid: i32,
    seed: u64,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) {
    let mut rng = Rng::new(seed ^ 0xC0FFEE);
    let mut last: VecDeque<String> = VecDeque::new();
    let mut conn: Option<Conn> = None;
    while !stop.load(Relaxed) {
        if conn.is_none() || rng.below(50) == 0 {
            match Conn::to_pid(&dir, pid) {
                Ok(c) => conn = Some(c),
                Err(_) if stop.load(Relaxed) || !alive(pid) => return,
                Err(e) => panic!("seed {seed}: connect to {pid}: {e}; last requests: {last:?}"),
            }
        }
        let req = match rng.below(10) {
            0..=3 => r#"{"op":"stats"}"#.to_owned(),
            4 => r#"{"op":"stats","arenas":true}"#.to_owned(),
            5..=6 => r#"{"op":"purge"}"#.to_owned(),
            _ => {
                let d = [-1i64, 0, 10, 250, 1000, 5000][rng.below(6) as usize];
                let m = [-1i64, 0, 100][rng.below(3) as usize];
                format!(r#"{{"op":"decay","dirty_ms":{d},"muzzy_ms":{m}}}"#)
            }
        };
        last.push_back(req.clone());
        if last.len() > 8 {
            last.pop_front();
        }
        let c = conn.as_mut().unwrap();
        match c.ask(&req) {
            Ok(v) if v.get("ok").is_some() => {
                count.fetch_add(1, Relaxed);
            }
            // The run ended under our feet: fine.
            Err(_) if stop.load(Relaxed) || !alive(pid) => return,
            other => panic!(
                "seed {seed}: pid {pid}: answer to {req}: {other:?}; last requests: {last:?}"
            ),
        }
    }
    // Leave the process with the default decay.
    if let Some(c) = conn.as_mut() {
        let _ = c.ask(r#"{"op":"decay","dirty_ms":1000,"muzzy_ms":0}"#);
    }
}

pub fn run(level: Level) {
    let secs = level.secs(5, 150);
    let seed = seed();
    let exe = fixture("stress_alloc", &["-O2"]);
    let dir = memshim_tests::socket_dir_path("alloc");
    let mut child = Cmd::new(
        &exe,
        [
            THREADS.to_string(),
            secs.as_secs().to_string(),
            seed.to_string(),
        ],
    )
    .shimmed()
    .env("MEMSHIM_CONTROL", "on")
    .env("MEMSHIM_SOCKET_DIR", &dir)
    .spawn();
    let pid = child.pid();
    child.wait_for_line("ready", Duration::from_secs(20));
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let hammers: Vec<_> = (0..2)
        .map(|i| {
            let (dir, stop, count) = (dir.clone(), stop.clone(), count.clone());
            std::thread::spawn(move || hammer(dir, pid, seed.wrapping_add(i), stop, count))
        })
        .collect();
    let mut samples = vec![];
    let mut memshim_seen = vec![];
    let t0 = Instant::now();
    let done = loop {
        let line = child.wait_for_line("", secs + Duration::from_secs(120));
        assert!(
            !line.contains("CHECKSUM ERROR"),
            "seed {seed} pid {pid}: {line}"
        );
        if line.starts_with("sample") {
            samples.push(Sample {
                ms: field(&line, "ms"),
                metadata: field(&line, "metadata"),
                threads: field(&line, "threads"),
            });
            // Counted only while the process runs: the test may read the
            // last sample after the fixture has joined its workers and
            // exited.
            let m = memshim_threads(pid);
            memshim_seen.push(memshim_tests::stress::alive(pid).then_some(m));
        } else if line.starts_with("done") {
            break line;
        }
        assert!(
            t0.elapsed() < secs + Duration::from_secs(120),
            "seed {seed} pid {pid}: no end (deadlock?)"
        );
    };
    stop.store(true, Relaxed);
    for h in hammers {
        h.join()
            .unwrap_or_else(|_| panic!("seed {seed}: a control client failed (see above)"));
    }
    let out = child.finish(Duration::from_secs(30));
    assert_eq!(out.code, 0, "seed {seed} pid {pid}: {out:?}");
    assert_eq!(out.stderr, "", "seed {seed}: stderr must stay empty");
    let ops = field(&done, "ops");
    let verified = field(&done, "verified_bytes");
    let requests = count.load(Relaxed);
    // Threads: the workers, main, and exactly one memshim thread, throughout.
    assert!(
        samples.len() >= 4,
        "seed {seed}: too few samples ({})",
        samples.len()
    );
    assert!(
        memshim_seen.iter().flatten().count() >= 4,
        "seed {seed}: too few samples read while the process ran"
    );
    for (s, m) in samples.iter().zip(&memshim_seen) {
        assert_eq!(
            s.threads,
            THREADS as u64 + 2,
            "seed {seed}: thread count at {} ms",
            s.ms
        );
        if let Some(m) = m {
            assert_eq!(*m, 1, "seed {seed}: memshim threads at {} ms", s.ms);
        }
    }
    // Metadata: after the first quarter (warm-up) it may wobble with the
    // workload, but not climb: the end is within 1.5x (+2 MiB) of the most
    // seen in the second quarter.
    let q = samples.len() / 4;
    let warm = samples[q..2 * q.max(1)]
        .iter()
        .map(|s| s.metadata)
        .max()
        .unwrap_or(0);
    let end = samples.last().unwrap().metadata;
    assert!(
        end <= warm * 3 / 2 + (2 << 20),
        "seed {seed}: jemalloc metadata grew from {warm} to {end} bytes over the run"
    );
    assert!(
        requests > 10,
        "seed {seed}: only {requests} control requests answered"
    );
    let _ = std::fs::remove_dir_all(&dir);
    figures(
        level,
        "alloc_stress",
        &[
            ("threads", THREADS.to_string()),
            ("seconds", secs.as_secs().to_string()),
            ("ops_verified", ops.to_string()),
            ("bytes_verified", verified.to_string()),
            ("control_requests", requests.to_string()),
            ("metadata_warm", warm.to_string()),
            ("metadata_end", end.to_string()),
            ("seed", seed.to_string()),
            ("failures", "0".into()),
        ],
    );
}
