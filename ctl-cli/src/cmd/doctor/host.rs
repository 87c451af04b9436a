//! Host facts that change how a shimmed process's memory behaves: THP mode,
//! the memory cgroup's usage and limit, and the CPU quota compared with the
//! CPUs the process may run on. Read from /proc and /sys only; the
//! cgroup files are parsed by `memshim_proto::cgroup`.

use crate::output::render::mib_or_gib;
use memshim_proto::cgroup;
use std::path::{Path, PathBuf};

/// Facts for one process (or for memshim-ctl itself with `pid = "self"`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct HostFacts {
    /// `/sys/kernel/mm/transparent_hugepage/enabled`, the selected mode.
    pub thp_enabled: Option<String>,
    /// `.../transparent_hugepage/defrag`, the selected mode.
    pub thp_defrag: Option<String>,
    /// The process's memory cgroup, if readable.
    pub cgroup: Option<Cgroup>,
    /// CPUs in the process's affinity mask (`Cpus_allowed_list`).
    pub cpus_allowed: Option<u32>,
    /// CPUs online on the host.
    pub cpus_online: Option<u32>,
}

/// A memory/CPU cgroup.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Cgroup {
    /// 1 or 2.
    pub version: u8,
    /// Path inside the cgroup filesystem.
    pub path: String,
    /// Bytes in use (`memory.current` / `memory.usage_in_bytes`).
    pub memory_current: Option<u64>,
    /// Limit in bytes; `None` = unlimited.
    pub memory_max: Option<u64>,
    /// `memory.high` (v2), `None` = unlimited.
    pub memory_high: Option<u64>,
    /// CPU quota in CPUs (quota / period); `None` = unlimited.
    pub cpu_quota: Option<f64>,
}

/// The bracketed choice of a sysfs multiple-choice file (`always [madvise] never`).
pub fn selected(s: &str) -> Option<String> {
    let a = s.find('[')?;
    let b = s[a..].find(']')? + a;
    Some(s[a + 1..b].to_owned())
}

/// Number of CPUs in a list like `0-3,8,10-11`.
pub fn count_cpu_list(s: &str) -> Option<u32> {
    let mut n = 0;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                b.trim()
                    .parse::<u32>()
                    .ok()?
                    .checked_sub(a.trim().parse().ok()?)?
                    + 1
            }
            None => {
                part.trim().parse::<u32>().ok()?;
                1
            }
        };
    }
    Some(n)
}

fn read(p: impl AsRef<Path>) -> Option<String> {
    crate::reach::procfs::read_text(p).ok()
}

/// `cpu.max` (`"max 100000"` or `"200000 100000"`) as CPUs.
pub fn cpu_max(s: &str) -> Option<f64> {
    let (q, p) = cgroup::parse_cpu_max(s.as_bytes())?;
    (p > 0).then(|| q as f64 / p as f64)
}

/// The tightest CPU quota (in CPUs) from the cgroup directory `dir` up to
/// `mount`, as the shim sizes its arenas by (shim/src/options.rs): a pod's
/// quota sits above its container's cgroup. `quota` reads one directory's.
fn tightest_quota(mount: &Path, dir: &Path, quota: impl Fn(&Path) -> Option<f64>) -> Option<f64> {
    let start = if dir.exists() { dir } else { mount };
    start
        .ancestors()
        .take_while(|d| d.starts_with(mount))
        .filter_map(quota)
        .reduce(f64::min)
}

/// The cgroup of `/proc/<pid>` (`pid` may be `"self"`), read through the
/// cgroup filesystem mounted at `/sys/fs/cgroup` in this mount namespace.
pub fn cgroup_of(pid: &str) -> Option<Cgroup> {
    let text = read(format!("/proc/{pid}/cgroup"))?;
    let root = PathBuf::from("/sys/fs/cgroup");
    // cgroup v2: a single "0::/path" line and a unified mount.
    if let Some(path) = cgroup::parse_proc_cgroup(&text).v2
        && root.join("cgroup.controllers").exists()
    {
        let d = root.join(path.trim_start_matches('/'));
        let (usage, limit) = cgroup::usage_and_limit_files(2);
        return Some(Cgroup {
            version: 2,
            memory_current: read(d.join(usage)).and_then(|s| s.trim().parse().ok()),
            // A limit set above (a pod's, over its container's) binds too.
            memory_max: d
                .ancestors()
                .take_while(|a| a.starts_with(&root))
                .filter_map(|a| read(a.join(limit)).and_then(|s| cgroup::parse_limit(&s)))
                .min(),
            memory_high: read(d.join("memory.high")).and_then(|s| cgroup::parse_limit(&s)),
            cpu_quota: tightest_quota(&root, &d, |d| {
                read(d.join("cpu.max")).and_then(|s| cpu_max(&s))
            }),
            path,
        });
    }
    // cgroup v1: "N:memory:/path" and "N:cpu,cpuacct:/path".
    let ctl = |name: &str| {
        text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctls, path) = (f.next()?, f.next()?, f.next()?);
            ctls.split(',')
                .any(|c| c == name)
                .then(|| (ctls.to_owned(), path.to_owned()))
        })
    };
    let (mctl, mpath) = ctl("memory")?;
    let md = root.join(&mctl).join(mpath.trim_start_matches('/'));
    let cpu_quota = ctl("cpu").and_then(|(c, p)| {
        let mount = root.join(c);
        let d = mount.join(p.trim_start_matches('/'));
        tightest_quota(&mount, &d, |d| {
            let q = read(d.join("cpu.cfs_quota_us"))?;
            let per = read(d.join("cpu.cfs_period_us"))?;
            let (q, per) = cgroup::parse_cfs(q.as_bytes(), per.as_bytes())?;
            (q > 0 && per > 0).then(|| q as f64 / per as f64)
        })
    });
    let (usage, limit) = cgroup::usage_and_limit_files(1);
    Some(Cgroup {
        version: 1,
        path: mpath,
        memory_current: read(md.join(usage)).and_then(|s| s.trim().parse().ok()),
        // Without a limit of its own, the closest limited ancestor's (the
        // kernel's `hierarchical_memory_limit`), as `cgroup` and `stats` say.
        memory_max: read(md.join(limit))
            .and_then(|s| cgroup::parse_limit(&s))
            .or_else(|| {
                let stat = read(md.join("memory.stat"))?;
                let v = cgroup::keyed(stat.as_bytes(), b"hierarchical_memory_limit")?;
                cgroup::parse_limit(&v.to_string())
            }),
        memory_high: None,
        cpu_quota,
    })
}

/// Every fact for `/proc/<pid>`.
pub fn facts(pid: &str) -> HostFacts {
    let thp = "/sys/kernel/mm/transparent_hugepage";
    HostFacts {
        thp_enabled: read(format!("{thp}/enabled")).and_then(|s| selected(&s)),
        thp_defrag: read(format!("{thp}/defrag")).and_then(|s| selected(&s)),
        cgroup: cgroup_of(pid),
        cpus_allowed: read(format!("/proc/{pid}/status")).and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(count_cpu_list)
        }),
        cpus_online: read("/sys/devices/system/cpu/online").and_then(|s| count_cpu_list(&s)),
    }
}

/// Human lines for host facts.
pub fn lines(h: &HostFacts) -> Vec<String> {
    let mut v = vec![];
    let thp = h.thp_enabled.as_deref().unwrap_or("unknown");
    let hint = match thp {
        "always" => ": huge pages can make purged memory return late (and RSS jump by 2 MiB steps)",
        _ => "",
    };
    v.push(format!(
        "THP        enabled={thp} defrag={}{hint}",
        h.thp_defrag.as_deref().unwrap_or("unknown")
    ));
    match &h.cgroup {
        // Its files unreadable (the memory hierarchy is not mounted here):
        // no figure, not "unlimited".
        Some(c) if c.memory_current.is_none() && c.memory_max.is_none() => v.push(format!(
            "cgroup     v{} {}: its memory figures are not readable here",
            c.version, c.path
        )),
        Some(c) => {
            let cur = c
                .memory_current
                .map(mib_or_gib)
                .unwrap_or_else(|| "?".into());
            let max = c
                .memory_max
                .map(mib_or_gib)
                .unwrap_or_else(|| "unlimited".into());
            let high = c
                .memory_high
                .map(|b| format!(", memory.high {}", mib_or_gib(b)))
                .unwrap_or_default();
            v.push(format!(
                "cgroup     v{} {}: using {cur} of {max}{high}",
                c.version, c.path
            ));
        }
        None => v.push("cgroup     not readable".into()),
    }
    let allowed = h
        .cpus_allowed
        .map(|n| n.to_string())
        .unwrap_or_else(|| "?".into());
    let online = h
        .cpus_online
        .map(|n| n.to_string())
        .unwrap_or_else(|| "?".into());
    let quota = h.cgroup.as_ref().and_then(|c| c.cpu_quota);
    let q = match (quota, h.cpus_allowed) {
        (Some(q), Some(a)) if q < a as f64 => {
            format!(
                ", CPU quota {q:.2}: fewer than visible; the shim sizes its arenas by the quota"
            )
        }
        (Some(q), _) => format!(", CPU quota {q:.2}"),
        (None, _) => ", no CPU quota".into(),
    };
    v.push(format!(
        "CPUs       {allowed} allowed of {online} online{q}"
    ));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_formats_parse() {
        assert_eq!(
            selected("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(selected("none"), None);
        assert_eq!(count_cpu_list("0-3,8,10-11\n"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(cpu_max("max 100000"), None);
        assert_eq!(cpu_max("150000 100000"), Some(1.5));
    }

    #[test]
    fn own_facts_are_readable() {
        let f = facts("self");
        assert!(
            f.cpus_allowed.unwrap() >= 1 && f.cpus_online.unwrap() >= f.cpus_allowed.unwrap(),
            "{f:?}"
        );
    }

    #[test]
    fn host_lines_show_limits_in_mib_or_gib() {
        let h = HostFacts {
            thp_enabled: Some("always".into()),
            cgroup: Some(Cgroup {
                version: 2,
                path: "/a".into(),
                memory_current: Some(512 << 20),
                memory_max: Some(3 << 29),
                memory_high: None,
                cpu_quota: Some(0.5),
            }),
            cpus_allowed: Some(2),
            cpus_online: Some(4),
            ..Default::default()
        };
        let l = lines(&h);
        assert!(
            l[0].starts_with("THP        enabled=always defrag=unknown: huge pages"),
            "{l:?}"
        );
        assert_eq!(l[1], "cgroup     v2 /a: using 512.0 MiB of 1.5 GiB");
        assert_eq!(
            l[2],
            "CPUs       2 allowed of 4 online, CPU quota 0.50: fewer than visible; the shim sizes its arenas by the quota"
        );
        // v1's "no limit" (near 2^63) is no limit.
        let mut v1 = h.cgroup.clone().unwrap();
        v1.memory_max = cgroup::parse_limit("9223372036854771712");
        assert!(
            lines(&HostFacts {
                cgroup: Some(v1),
                ..h
            })
            .iter()
            .any(|l| l.ends_with("of unlimited"))
        );
    }
}
