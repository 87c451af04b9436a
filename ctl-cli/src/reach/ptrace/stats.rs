//! `stats` of a CPython started without the preload: the kernel's and the
//! cgroup's figures, and CPython's read in the process.

use super::torch::{TORCH_SECTION, torch_section};
use super::*;

/// `stats` of a process without the preload: the sections whose figures
/// exist without the shim (the kernel's, the cgroup's, CPython's through
/// the injector), in the shape of the shimmed report; `allocator` and
/// `config` are `null`, and `allocator_unavailable` says why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    /// The process id.
    pub pid: i32,
    /// How it was reached.
    pub reached: Reached,
    /// Always `null`: jemalloc's figures need the shim.
    pub allocator: Option<()>,
    /// Why there is no `allocator` section.
    pub allocator_unavailable: String,
    /// The process as the kernel sees it (`unmanaged` is all of its RSS:
    /// none of it is the shim's).
    pub process: ProcessStats,
    /// Its memory cgroup, if one can be read here.
    pub cgroup: Option<CgroupStats>,
    /// Always `null`: the shim's settings and state.
    pub config: Option<()>,
    /// CPython's figures, read by the injector.
    pub python: Option<PythonSection>,
    /// Why `python` is absent.
    pub python_unavailable: Option<PythonUnavailable>,
    /// PyTorch, as a shimmed process reports it; `null` unless torch is
    /// imported.
    pub torch: Option<TorchSection>,
    /// Why `torch` could not be read, where torch is imported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_unavailable: Option<String>,
    /// Time taken, ms.
    pub elapsed_ms: f64,
}

/// The sentence for `allocator_unavailable`.
pub const NO_ALLOCATOR: &str = "libmemshim.so is not loaded: the process's malloc is its own \
                                (glibc's), whose figures memshim does not read";

/// The Python expression that reads the `python` section (the figures of
/// the shim's bridge, `shim/src/python/gc.rs`), as one line of text:
/// `version|abiflags has t|allocated blocks|gc figures` where the gc
/// figures are empty unless the program imported `gc` (nothing is
/// imported: `sys` always is).
const PYTHON_FIGURES: &str = "(lambda s, g, t: '|'.join((s.version.split()[0], \
str(int('t' in getattr(s, 'abiflags', ''))), str(s.getallocatedblocks()), \
'' if g is None else ' '.join((str(int(g.isenabled())), t(g.get_count()), \
t(g.get_threshold()), t([x['collections'] for x in g.get_stats()]))))))\
(__import__('sys'), __import__('sys').modules.get('gc'), \
lambda v: ' '.join(map(str, (list(v) + [0, 0, 0])[:3])))";

/// The `python` section from [`PYTHON_FIGURES`]'s line.
fn python_section(line: &str) -> Option<PythonSection> {
    let mut parts = line.split('|');
    let version = parts.next()?.to_owned();
    let free_threaded = parts.next()? == "1";
    let allocated_blocks = parts.next()?.parse().ok()?;
    let gc: Vec<u64> = parts
        .next()?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let mut s = PythonSection {
        version,
        free_threaded,
        allocated_blocks,
        ..Default::default()
    };
    if let [enabled, rest @ ..] = &gc[..] {
        let three = |i: usize| rest.get(i..i + 3).map(|v| [v[0], v[1], v[2]]);
        s.gc_enabled = *enabled != 0;
        s.gc_counts = three(0);
        s.gc_thresholds = three(3);
        s.gc_collections = three(6);
        three(6)?;
    }
    Some(s)
}

/// A field of `/proc/PID/status` in kB, as bytes.
fn status_bytes(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        v.split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    })
}

/// The `process` section from `/proc/PID/status` (and `smaps_rollup`
/// with `pss`, which costs the process the kernel's walk of its pages).
fn process_stats(pid: i32, pss: bool) -> ProcessStats {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status_bytes(&status, "VmRSS").unwrap_or_else(|| rss(pid));
    let pss = pss
        .then(|| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .flatten()
        .and_then(|s| status_bytes(&s, "Pss"));
    ProcessStats {
        rss,
        pss,
        anon: status_bytes(&status, "RssAnon"),
        file: status_bytes(&status, "RssFile"),
        shmem: status_bytes(&status, "RssShmem"),
        swap: status_bytes(&status, "VmSwap"),
        unmanaged: rss,
    }
}

/// `stats` on a process without the preload, with its `cgroup` section as
/// the caller read it.
pub fn stats(pid: i32, pss: bool, cgroup: Option<CgroupStats>) -> Result<Stats, Failure> {
    let start = Instant::now();
    let mut calls = memshim_reach::python(pid, SAFE_POINT_LIMIT).map_err(|e| failure(pid, e))?;
    let how = reached(&calls);
    let read = (|| {
        let line = calls.eval(PYTHON_FIGURES)?;
        let enabled = calls.gc_is_enabled()?;
        let threads = calls.threads()?;
        let arenas = calls
            .malloc_stats()?
            .and_then(|t| memshim_proto::pymalloc_arena_bytes(&t));
        let torch = match calls.imported("torch")? {
            true => calls.eval(&answer_of(TORCH_SECTION))?,
            false => Some("null".to_owned()),
        };
        Ok::<_, Error>((line, enabled, threads, arenas, torch))
    })();
    let finished = calls.finish();
    let (line, enabled, threads, arenas, torch) = read.map_err(|e| failure(pid, e))?;
    let (torch, torch_unavailable) = match torch.as_deref().filter(|a| *a != "None") {
        Some(answer) => match torch_section(answer) {
            Ok(t) => (t, None),
            Err(e) => (
                None,
                Some(format!("torch's figures could not be read: {e}")),
            ),
        },
        None => (
            None,
            Some("torch's figures could not be read: Python raised".into()),
        ),
    };
    finished.map_err(|e| failure(pid, e))?;
    let (python, python_unavailable) = match line.as_deref().and_then(python_section) {
        Some(mut s) => {
            if s.gc_counts.is_none() {
                // `gc` not imported: the C API's flag (3.10+); before 3.10
                // only the gc module can disable the collector.
                s.gc_enabled = enabled.unwrap_or(true);
            }
            s.threads = threads.unwrap_or(0);
            s.pymalloc_arena_bytes = arenas;
            (Some(s), None)
        }
        None => (
            None,
            Some(PythonUnavailable::Error {
                message: format!(
                    "the figures could not be read in the process ({})",
                    line.as_deref().unwrap_or("Python raised")
                ),
            }),
        ),
    };
    Ok(Stats {
        pid,
        reached: how,
        allocator: None,
        allocator_unavailable: NO_ALLOCATOR.into(),
        process: process_stats(pid, pss),
        cgroup,
        config: None,
        python,
        python_unavailable,
        torch,
        torch_unavailable,
        elapsed_ms: ms(start),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_figures_are_parsed_with_and_without_gc() {
        let s = python_section("3.11.9|0|12345|1 5 0 0 700 10 10 3 2 1").unwrap();
        assert_eq!(s.version, "3.11.9");
        assert!(s.gc_enabled && !s.free_threaded);
        assert_eq!(s.allocated_blocks, 12345);
        assert_eq!(s.gc_counts, Some([5, 0, 0]));
        assert_eq!(s.gc_thresholds, Some([700, 10, 10]));
        assert_eq!(s.gc_collections, Some([3, 2, 1]));
        let s = python_section("3.8.20|0|7|").unwrap();
        assert_eq!((s.gc_counts, s.allocated_blocks), (None, 7));
        // A short gc list is no section, not zeros.
        assert!(python_section("3.8.20|0|7|1 5 0").is_none());
        assert!(python_section("garbage").is_none());
    }
}
