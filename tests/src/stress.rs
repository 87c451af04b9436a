//! For the reliability tests (`tests/tests/stress/`): the smoke/full level, the
//! seed, and the figures file that docs/reliability.md is filled from.

use std::io::Write;
use std::time::Duration;

/// How long and how hard a test runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Level {
    /// `make test`: seconds.
    Smoke,
    /// `make stress`: minutes.
    Full,
}

impl Level {
    /// The level of a test that runs in `make test`: smoke, unless
    /// `MEMSHIM_STRESS=full` (read by this test binary; the harness removes
    /// `MEMSHIM_*` from the environment of the processes it starts).
    pub fn smoke() -> Level {
        match std::env::var("MEMSHIM_STRESS").as_deref() {
            Ok("full") => Level::Full,
            _ => Level::Smoke,
        }
    }

    /// Picks the smoke or the full figure.
    pub fn pick<T>(self, smoke: T, full: T) -> T {
        match self {
            Level::Smoke => smoke,
            Level::Full => full,
        }
    }

    /// A duration: `MEMSHIM_STRESS_SECS` overrides both figures.
    pub fn secs(self, smoke: u64, full: u64) -> Duration {
        let s = std::env::var("MEMSHIM_STRESS_SECS")
            .ok()
            .and_then(|v| v.parse().ok());
        Duration::from_secs(s.unwrap_or(self.pick(smoke, full)))
    }

    pub fn name(self) -> &'static str {
        self.pick("smoke", "full")
    }
}

/// The seed of this run: `MEMSHIM_STRESS_SEED`, else derived from the clock.
/// Every failure message includes it.
pub fn seed() -> u64 {
    if let Some(s) = std::env::var("MEMSHIM_STRESS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return s;
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (t.as_nanos() as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

/// Records one line of figures (`name key=value ...`): printed, and
/// appended to `target/test-scratch/reliability-<level>.txt`.
pub fn figures(level: Level, name: &str, kv: &[(&str, String)]) {
    let mut line = name.to_string();
    for (k, v) in kv {
        line.push_str(&format!(" {k}={v}"));
    }
    println!("reliability figures: {line}");
    let path = crate::scratch().join(format!("reliability-{}.txt", level.name()));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// A small deterministic generator (xorshift64*), for reproducible inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    #[allow(clippy::should_implement_trait)] // an endless generator, not an Iterator
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Thread names of `pid` with their tids.
pub fn tasks(pid: i32) -> Vec<(i32, String)> {
    let mut v = vec![];
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            let tid = e.file_name().to_string_lossy().parse().unwrap_or(0);
            if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
                v.push((tid, c.trim().to_owned()));
            }
        }
    }
    v
}

/// How many threads of `pid` are named `memshim`.
pub fn memshim_threads(pid: i32) -> usize {
    tasks(pid).iter().filter(|(_, n)| n == "memshim").count()
}

/// Files in the socket directory of this uid (`/tmp/memshim-<uid>`) or `dir`.
pub fn socket_files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| !s[i + 1..].trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// What each thread of `pid` is doing (name, state, kernel stack), for a
/// failure message: a stuck or busy shim thread shows where it is.
pub fn threads_report(pid: i32) -> String {
    let mut out = String::new();
    for (tid, name) in tasks(pid) {
        let stat =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .map_or("?", |i| stat[i + 2..].get(..1).unwrap_or("?"));
        let stack =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stack")).unwrap_or_default();
        out += &format!(
            "\n  {tid} {name} {state}: {}",
            stack.lines().take(6).collect::<Vec<_>>().join(" < ")
        );
    }
    out
}
