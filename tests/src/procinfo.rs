//! What `/proc` and `/sys` say about a process or this machine, for
//! assertions and messages.

/// A `key:` line of `/proc/<pid>/status`, in kB or count.
pub fn proc_status(pid: i32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// This machine's transparent huge page mode, as the kernel's `enabled`
/// file selects it: `always`, `madvise` or `never` (`None` without THP).
pub fn thp_mode() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    Some(s.split('[').nth(1)?.split(']').next()?.to_owned())
}

/// Resident set size of `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: i32) -> u64 {
    proc_status(pid, "VmRSS").expect("VmRSS") * 1024
}

/// Number of threads of `pid`.
pub fn threads(pid: i32) -> u64 {
    proc_status(pid, "Threads").expect("Threads")
}

/// Names (`comm`) of the threads of `pid`.
pub fn thread_names(pid: i32) -> Vec<String> {
    let mut v = vec![];
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
                v.push(c.trim().to_owned());
            }
        }
    }
    v
}

/// MiB, for messages.
pub fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}
