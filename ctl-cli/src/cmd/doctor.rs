//! `memshim-ctl doctor [PID]`: why a process has no shim or a degraded one,
//! and the host facts that change memory behaviour. Reads /proc, /sys and
//! the executable's ELF headers; asks the process's control endpoint when it
//! has one. Exit status: 0 when the process runs with a working shim (or no
//! PID was given), 1 when a problem was found, 3 when there is no such process.

mod elf;
pub mod host;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::client::Client;
use crate::discover;
use crate::exit::{Exit, Failure};
use crate::out::outln;

/// Options of `memshim-ctl doctor`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Process to examine; without it, only host facts and the library `run` would use
    pub pid: Option<i32>,
    /// Print the diagnosis as JSON
    #[arg(long)]
    pub json: bool,
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Working as intended.
    Ok,
    /// Worth knowing, nothing wrong.
    Note,
    /// The shim is not in effect, or cannot do its job.
    Problem,
}

/// One line of the diagnosis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Severity.
    pub level: Level,
    /// Stable identifier (`static_binary`, `secure_exec`, ...).
    pub code: &'static str,
    /// What it means and what to do.
    pub message: String,
}

/// What the control endpoint said, if it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// No socket for the process.
    Absent,
    /// A socket exists but did not answer.
    Unreachable(String),
    /// It answered `stats`.
    Answered {
        /// `config.interposed`.
        interposed: bool,
        /// What its CUDA caching allocator's figures say (see
        /// [`cuda_notes`]).
        cuda: Vec<String>,
    },
}

/// The whole diagnosis of one process.
#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    /// The process.
    pub pid: i32,
    /// Its `comm`.
    pub command: String,
    /// Path of the mapped libmemshim.so, if any.
    pub shim: Option<String>,
    /// Everything found, most important first.
    pub findings: Vec<Finding>,
    /// Host facts as they apply to this process.
    pub host: host::HostFacts,
}

impl Diagnosis {
    /// True if a problem was found.
    pub fn has_problem(&self) -> bool {
        self.findings.iter().any(|f| f.level == Level::Problem)
    }
}

/// Facts read from /proc for one process. `None` where unreadable.
#[derive(Debug, Default)]
struct Proc {
    comm: String,
    exe: Option<PathBuf>,
    maps: Option<String>,
    environ: Option<Vec<(String, String)>>,
    at_secure: Option<bool>,
    threads: Option<u64>,
    parent_comm: Option<String>,
}

fn read_proc(pid: i32) -> Result<Proc, Failure> {
    let base = PathBuf::from(format!("/proc/{pid}"));
    let comm = crate::discover::read_text(base.join("comm")).map_err(|e| {
        Failure::new(
            Exit::NotFound,
            Some(pid),
            format!("no such process (/proc/{pid}: {e})"),
        )
    })?;
    // Shown on the terminal: any process can put newlines and escape
    // sequences in its own name (and in its executable's file name).
    let comm = crate::out::printable(comm.strip_suffix('\n').unwrap_or(&comm));
    let status = crate::discover::read_text(base.join("status")).unwrap_or_default();
    crate::discover::not_a_thread(pid, &status)?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
    };
    if field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
        && crate::discover::all_threads_exited(pid)
    {
        return Err(Failure::new(
            Exit::NotFound,
            Some(pid),
            "the process has exited (a zombie its parent has not reaped): nothing to diagnose",
        ));
    }
    let parent_comm = field("PPid:")
        .and_then(|p| crate::discover::read_text(format!("/proc/{p}/comm")).ok())
        .map(|c| crate::out::printable(c.trim()));
    // Address space, environment and executable: a running thread's, if
    // the main thread has ended with `pthread_exit`.
    let base = crate::discover::view(pid);
    let environ = std::fs::read(base.join("environ")).ok().map(|b| {
        b.split(|c| *c == 0)
            .filter_map(|kv| {
                let s = String::from_utf8_lossy(kv);
                s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect()
    });
    // AT_SECURE (23) in the auxiliary vector: setuid/setgid or file capabilities.
    let at_secure = std::fs::read(base.join("auxv")).ok().and_then(|b| {
        b.chunks_exact(16).find_map(|kv| {
            let k = u64::from_ne_bytes(kv[..8].try_into().unwrap());
            let v = u64::from_ne_bytes(kv[8..].try_into().unwrap());
            (k == 23).then_some(v != 0)
        })
    });
    Ok(Proc {
        comm,
        exe: std::fs::read_link(base.join("exe")).ok(),
        maps: crate::discover::read_text(base.join("maps")).ok(),
        environ,
        at_secure,
        threads: field("Threads:").and_then(|t| t.parse().ok()),
        parent_comm,
    })
}

fn env<'a>(p: &'a Proc, k: &str) -> Option<&'a str> {
    p.environ
        .as_ref()?
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
}

/// The first mapped file whose name contains `needle`.
fn mapped(maps: &str, needle: &str) -> Option<String> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains(needle))
        .map(String::from)
}

/// Diagnoses `pid`; `endpoint` asks its control endpoint (injected so the
/// rules can be tested without one).
pub fn diagnose(pid: i32, endpoint: impl FnOnce(i32) -> Endpoint) -> Result<Diagnosis, Failure> {
    let p = read_proc(pid)?;
    let mut f: Vec<Finding> = vec![];
    let mut add = |level, code, message: String| {
        f.push(Finding {
            level,
            code,
            message,
        })
    };
    let maps = p.maps.as_deref();
    let shim = maps.and_then(|m| mapped(m, "libmemshim"));
    let preload = env(&p, "LD_PRELOAD");
    // /proc/<pid>/exe opens the executable even inside another mount namespace.
    let elf = elf::inspect(&crate::discover::view(pid).join("exe"));
    let exe_name = p
        .exe
        .as_ref()
        .map(|e| crate::out::printable(&e.display().to_string()))
        .unwrap_or_else(|| p.comm.clone());

    if maps.is_none() {
        add(
            Level::Problem,
            "no_access",
            if crate::discover::my_euid() == Some(0) {
                format!(
                    "cannot read /proc/{pid}/maps, even as root: the process is not dumpable or belongs to \
                     another user namespace"
                )
            } else {
                format!(
                    "cannot read /proc/{pid}/maps: run doctor as the process's user or as root (ptrace access is needed)"
                )
            },
        );
    }
    let valgrind =
        exe_name.contains("/valgrind/") || maps.is_some_and(|m| mapped(m, "vgpreload").is_some());
    if valgrind {
        add(
            Level::Problem,
            "valgrind",
            "runs under valgrind, which replaces malloc itself; the shim stays inert here (no thread, no control \
             socket). Start valgrind runs with `env -u LD_PRELOAD`."
                .into(),
        );
    }
    let san_lib = maps.and_then(|m| {
        ["libasan.so", "libtsan.so", "libmsan.so", "libhwasan.so"]
            .iter()
            .find_map(|s| mapped(m, s))
    });
    let san = san_lib.or_else(|| elf.as_ref().ok().and_then(|e| e.sanitizer.clone()));
    if let Some(s) = &san {
        add(
            Level::Problem,
            "sanitizer",
            format!(
                "built with a sanitizer ({s}), whose runtime must own malloc; the shim stays out of the way. \
                 Run sanitizer builds with `env -u LD_PRELOAD`."
            ),
        );
    }

    if let Some(lib) = &shim {
        let own_malloc = elf.as_ref().is_ok_and(|e| e.defines_malloc);
        if own_malloc {
            add(
                Level::Problem,
                "own_malloc",
                format!(
                    "{exe_name} defines malloc itself; an executable's symbols come before every preload, \
                     so the shim sits idle and purges do nothing. Remove LD_PRELOAD for it."
                ),
            );
        }
        let control = crate::discover::control_mode(env(&p, "MEMSHIM_CONTROL"));
        match endpoint(pid) {
            Endpoint::Answered { interposed: false, .. } => add(
                Level::Problem,
                "not_interposed",
                "the shim reports interposed=false: another malloc is in use (its own allocator, a sanitizer, \
                 or the shim was dlopen'ed); stats and purge do not reflect the process's heap"
                    .into(),
            ),
            Endpoint::Answered { interposed: true, cuda } if san.is_none() && !valgrind && !own_malloc => {
                add(Level::Ok, "shim_active", format!("shim loaded from {lib} and answering on its control socket"));
                for note in cuda {
                    add(Level::Note, "cuda_fragmentation", note);
                }
            }
            Endpoint::Answered { .. } => {}
            Endpoint::Absent if control == "off" => add(
                Level::Note,
                "control_off",
                format!("shim loaded from {lib}; MEMSHIM_CONTROL=off, so it has no thread and no control socket"),
            ),
            // The problem above is why: the shim does not interpose here.
            Endpoint::Absent if san.is_some() || valgrind || own_malloc => {}
            Endpoint::Absent if p.threads == Some(1) && control == "on" => add(
                Level::Note,
                "endpoint_not_started",
                format!(
                    "shim loaded from {lib}; the process is single-threaded although MEMSHIM_CONTROL=on starts \
                     the shim's thread at once: most likely it is the fork child of a shimmed process, which \
                     starts the thread and control socket with its own first pthread_create (or the thread \
                     gave its slot to the program at a limit of threads)"
                ),
            ),
            Endpoint::Absent if p.threads == Some(1) => add(
                Level::Note,
                "endpoint_not_started",
                format!(
                    "shim loaded from {lib}; the process is single-threaded, and with MEMSHIM_CONTROL={control} \
                     the shim's thread and control socket start only with its second thread. \
                     Set MEMSHIM_CONTROL=on to reach it anyway."
                ),
            ),
            Endpoint::Absent => match socket_problem(pid) {
                Some((code, why)) => add(Level::Problem, code, format!("shim loaded from {lib}; {why}")),
                None => add(
                    Level::Note,
                    "endpoint_absent",
                    match crate::discover::read_proc(pid) {
                        Ok(dp) => {
                            let loc = crate::discover::socket_loc(&dp);
                            let (why, hint) = crate::discover::why_no_endpoint(&dp, &loc);
                            format!("shim loaded from {lib}, but no control socket answers for pid {pid}: {why} ({hint})")
                        }
                        Err(_) => format!(
                            "shim loaded from {lib}, but no control socket was found for pid {pid} \
                             (the thread starts with the process's second thread and stops after an idle spell; \
                             or MEMSHIM_SOCKET_DIR differs from the caller's)"
                        ),
                    },
                ),
            },
            Endpoint::Unreachable(why) => {
                add(Level::Problem, "endpoint_unreachable", format!("shim loaded from {lib}; its control socket: {why}"))
            }
        }
    } else if maps.is_some() {
        let mut explained = valgrind || san.is_some();
        match &elf {
            Ok(e) if e.interp.is_none() => {
                explained = true;
                add(
                    Level::Problem,
                    "static_binary",
                    format!(
                        "{exe_name} is statically linked: the dynamic loader never runs, so LD_PRELOAD has no effect"
                    ),
                );
            }
            Ok(e) if e.bits != 64 => {
                explained = true;
                add(
                    Level::Problem,
                    "elf_class",
                    format!(
                        "{exe_name} is a {}-bit program and libmemshim.so is 64-bit; ld.so skips it \
                         (and prints an error on every run). Install a build for that ABI or unset LD_PRELOAD for it.",
                        e.bits
                    ),
                );
            }
            Ok(e) if e.interp.as_deref().is_some_and(|i| i.contains("musl")) => {
                explained = true;
                add(
                    Level::Problem,
                    "musl",
                    format!(
                        "{exe_name} uses musl's loader; libmemshim.so is built for glibc and cannot be preloaded"
                    ),
                );
            }
            _ => {}
        }
        if !explained && p.at_secure == Some(true) {
            explained = true;
            add(
                Level::Problem,
                "secure_exec",
                format!(
                    "{exe_name} runs in secure-execution mode (setuid/setgid or file capabilities): \
                     ld.so ignores LD_PRELOAD paths with slashes. Expected; such programs keep glibc malloc."
                ),
            );
        }
        if !explained {
            match preload {
                None if p.environ.is_none() => add(
                    Level::Problem,
                    "no_access",
                    if crate::discover::my_euid() == Some(0) {
                        format!(
                            "no shim mapped, and /proc/{pid}/environ is unreadable even as root"
                        )
                    } else {
                        format!(
                            "no shim mapped, and /proc/{pid}/environ is unreadable: run doctor as root to see why"
                        )
                    },
                ),
                Some(v) if v.contains("libmemshim") => {
                    let missing = v
                        .split([' ', ':'])
                        .filter(|e| e.contains("libmemshim"))
                        .find(|e| !Path::new(&format!("/proc/{pid}/root{e}")).exists());
                    add(
                        Level::Problem,
                        "preload_ignored",
                        match missing {
                            Some(m) => format!(
                                "LD_PRELOAD names {m}, which does not exist in the process's filesystem"
                            ),
                            None => format!(
                                "LD_PRELOAD={v} is set but the library is not mapped (ld.so rejected it; run the program by hand to see ld.so's message)"
                            ),
                        },
                    );
                }
                _ => {
                    let via = match p.parent_comm.as_deref() {
                        Some("sudo") => {
                            " It was started by sudo, whose env_reset drops LD_PRELOAD: use `sudo memshim-ctl run -- CMD`, \
                             or keep the variable with env_keep."
                        }
                        _ => {
                            " Start it with `memshim-ctl run -- CMD` or set LD_PRELOAD in its environment (launchers such as sudo, su -, env -i or a systemd unit drop it)."
                        }
                    };
                    add(
                        Level::Problem,
                        "no_preload",
                        format!("LD_PRELOAD does not name libmemshim.so in its environment.{via}"),
                    );
                }
            }
        }
    }
    Ok(Diagnosis {
        pid,
        command: p.comm,
        shim,
        findings: f,
        host: host::facts(&pid.to_string()),
    })
}

fn bytes(b: u64) -> String {
    let gib = b as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// Human lines for host facts.
pub fn host_lines(h: &host::HostFacts) -> Vec<String> {
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
            let cur = c.memory_current.map(bytes).unwrap_or_else(|| "?".into());
            let max = c
                .memory_max
                .map(bytes)
                .unwrap_or_else(|| "unlimited".into());
            let high = c
                .memory_high
                .map(|b| format!(", memory.high {}", bytes(b)))
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

/// A share of reserved VRAM in free fragments of split blocks above which
/// `doctor` explains fragmentation.
const FRAGMENTATION_NOTE: f64 = 0.25;

/// Fragmentation of the CUDA caching allocator, explained: a high inactive
/// split share, or allocation retries (each one a cudaMalloc that failed
/// and made torch free its cache and try again).
pub fn cuda_notes(t: &memshim_proto::TorchSection) -> Vec<String> {
    let mut out = vec![];
    for d in &t.devices {
        let mut why = vec![];
        if d.fragmentation >= FRAGMENTATION_NOTE && d.inactive_split >= 64 << 20 {
            why.push(format!(
                "{:.0}% of its {} reserved sits in free fragments of split blocks ({}): memory torch holds                  but cannot hand out for larger tensors",
                d.fragmentation * 100.0,
                crate::render::bytes(d.reserved),
                crate::render::bytes(d.inactive_split)
            ));
        }
        if d.num_alloc_retries > 0 {
            why.push(format!(
                "{} allocation retries: cudaMalloc failed and torch had to free its cache and retry (slow,                  and the step before an out-of-memory error{})",
                d.num_alloc_retries,
                if d.num_ooms > 0 {
                    format!("; {} already happened", d.num_ooms)
                } else {
                    String::new()
                }
            ));
        }
        if !why.is_empty() {
            out.push(format!(
                "cuda:{} is fragmented: {}. `memshim-ctl release` returns the free fragments now; for good,                  set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow instead of splitting), or                  max_split_size_mb to keep large blocks whole (docs/stats.md, \"fragmentation\")",
                d.index,
                why.join("; ")
            ));
        }
    }
    out
}

/// What keeps the shim of `pid` from having its control socket, as a
/// finding (code, text), if anything does: something other than a socket
/// at its path (`socket_blocked`), or a socket directory it refuses (a
/// symbolic link, not a directory, another owner, open to others) or
/// cannot create (no parent) (`socket_dir`).
fn socket_problem(pid: i32) -> Option<(&'static str, String)> {
    let p = discover::read_proc(pid).ok()?;
    let loc = discover::socket_loc(&p);
    if let Some((why, hint)) = discover::blocked_socket(&loc.path()) {
        return Some(("socket_blocked", format!("{why} ({hint})")));
    }
    let why =
        discover::unsafe_dir(&loc.dir, p.uid).or_else(|| discover::missing_parent(&loc.dir))?;
    Some((
        "socket_dir",
        format!(
            "it cannot create its control socket: {why}. If MEMSHIM_SOCKET_DIR names it, point the variable at \
             a directory of the process's user; otherwise remove it (the shim re-creates the directory within 5 s)"
        ),
    ))
}

/// Asks the control endpoint of `pid` for `stats`, if it has a socket.
pub fn ask_endpoint(pid: i32) -> Endpoint {
    let Ok(p) = discover::read_proc(pid) else {
        return Endpoint::Absent;
    };
    if std::fs::symlink_metadata(discover::socket_loc(&p).path()).is_err() {
        return Endpoint::Absent;
    }
    let req = memshim_proto::Request::Stats {
        arenas: false,
        pss: false,
    };
    match Client::open_proc(p).and_then(|mut c| c.request(&req)) {
        Ok(memshim_proto::Reply::Stats(s)) => Endpoint::Answered {
            interposed: s.config.interposed,
            cuda: s.torch.as_ref().map(cuda_notes).unwrap_or_default(),
        },
        Ok(_) => Endpoint::Unreachable("answered stats with another kind of reply".into()),
        // The file exists (checked above), so "no endpoint" is a file
        // nobody listens on (left over from before an exec): explained by
        // the process's state like a missing one.
        Err(f) if f.exit == Exit::NoEndpoint => Endpoint::Absent,
        Err(f) => Endpoint::Unreachable(f.message),
    }
}

/// Runs `doctor`.
pub fn run(a: DoctorArgs) -> Result<Exit, Failure> {
    let Some(pid) = a.pid else {
        let h = host::facts("self");
        let lib = super::run::locate_library(
            std::env::var_os("MEMSHIM_LIB").as_deref(),
            std::env::current_exe().ok().as_deref(),
        );
        if a.json {
            let lib = lib
                .as_ref()
                .map(|l| l.path.display().to_string())
                .map_err(Clone::clone);
            outln!(
                "{}",
                serde_json::json!({"host": h, "library": lib.as_ref().ok(), "library_error": lib.err()})
            )?;
        } else {
            match &lib {
                Ok(l) => outln!("library    {} ({})", l.path.display(), l.how)?,
                Err(e) => outln!("library    {e}")?,
            }
            for l in host_lines(&h) {
                outln!("{l}")?;
            }
        }
        return Ok(Exit::Ok);
    };
    let d = diagnose(pid, ask_endpoint)?;
    if a.json {
        outln!("{}", serde_json::to_string(&d).expect("diagnosis encodes"))?;
    } else {
        outln!("pid {} ({})", d.pid, d.command)?;
        for f in &d.findings {
            let tag = match f.level {
                Level::Ok => "ok",
                Level::Note => "note",
                Level::Problem => "problem",
            };
            // Findings quote paths and values the process chose.
            outln!(
                "{tag:<10} {}: {}",
                f.code,
                crate::out::printable(&f.message)
            )?;
        }
        for l in host_lines(&d.host) {
            outln!("{l}")?;
        }
    }
    // Unreadable /proc files are a permission problem (exit 5); other
    // problems are findings about the process (exit 1).
    Ok(if d.findings.iter().any(|f| f.code == "no_access") {
        Exit::Permission
    } else if d.has_problem() {
        Exit::Failed
    } else {
        Exit::Ok
    })
}

#[cfg(test)]
mod tests {
    use super::cuda_notes;
    use memshim_proto::{TorchDevice, TorchSection};

    fn section(d: TorchDevice) -> TorchSection {
        TorchSection {
            cuda_initialized: true,
            devices: vec![d],
            ..Default::default()
        }
    }

    #[test]
    fn fragmentation_is_explained_only_when_it_is_there() {
        let healthy = TorchDevice {
            reserved: 4 << 30,
            inactive_split: 100 << 20,
            fragmentation: TorchDevice::fragmentation_of(100 << 20, 4 << 30),
            ..Default::default()
        };
        assert!(cuda_notes(&section(healthy)).is_empty());
        let split = TorchDevice {
            index: 1,
            reserved: 4 << 30,
            inactive_split: 2 << 30,
            fragmentation: 0.5,
            ..Default::default()
        };
        let n = cuda_notes(&section(split));
        assert_eq!(n.len(), 1);
        assert!(
            n[0].starts_with("cuda:1 is fragmented: 50% of its 4.00 GiB"),
            "{}",
            n[0]
        );
        assert!(n[0].contains("expandable_segments:True"), "{}", n[0]);
        let retries = TorchDevice {
            num_alloc_retries: 3,
            num_ooms: 1,
            ..Default::default()
        };
        let n = cuda_notes(&section(retries));
        assert!(
            n[0].contains("3 allocation retries") && n[0].contains("1 already happened"),
            "{}",
            n[0]
        );
    }
}
