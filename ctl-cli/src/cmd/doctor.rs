//! `memshim-ctl doctor [PID]`: why a process has no shim or a degraded one,
//! and the host facts that change memory behaviour. Reads /proc, /sys and
//! the executable's ELF headers; asks the process's control endpoint when it
//! has one. Exit status: 0 when the process runs with a working shim (or no
//! PID was given), 1 when a problem was found, 3 when there is no such process.
//!
//! The rules, in the order they are looked at: what keeps the shim inert
//! whatever it does (`inert`); with the shim mapped, what its endpoint
//! says (`loaded`); without it, why the loader did not preload it
//! (`not_loaded`).

pub mod host;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::exit::{self, Exit, Failure};
use crate::output::print::{outln, printable};
use crate::reach::client::Client;
use crate::reach::no_endpoint;
use crate::reach::procfs::{self, Environ, Proc};
use crate::reach::socket;
use memshim_proto::settings::{self, Control};

/// Options of `memshim-ctl doctor`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Process to examine; without it, only host facts and the library `run` would use
    #[arg(value_parser = crate::args::pid_parser())]
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

/// What doctor reads of a process besides [`Proc`]. `None` where
/// unreadable.
struct Facts {
    /// What every command reads.
    proc: Proc,
    /// Its `comm`, printable.
    comm: String,
    exe: Option<PathBuf>,
    maps: Option<String>,
    environ: Option<Environ>,
    at_secure: Option<bool>,
    parent_comm: Option<String>,
}

fn read_facts(pid: i32) -> Result<Facts, Failure> {
    let comm = procfs::read_text(format!("/proc/{pid}/comm")).map_err(|e| {
        Failure::new(
            exit::NOT_FOUND,
            Some(pid),
            format!("no such process (/proc/{pid}: {e})"),
        )
    })?;
    // Shown on the terminal: any process can put newlines and escape
    // sequences in its own name (and in its executable's file name).
    let comm = printable(comm.strip_suffix('\n').unwrap_or(&comm));
    let proc = procfs::read_proc(pid)?;
    if procfs::is_zombie(pid) && procfs::all_threads_exited(pid) {
        return Err(Failure::new(
            exit::NOT_FOUND,
            Some(pid),
            "the process has exited (a zombie its parent has not reaped): nothing to diagnose",
        ));
    }
    if procfs::is_kernel_thread(pid) {
        return Err(Failure::new(
            exit::NOT_FOUND,
            Some(pid),
            format!(
                "{comm} is a kernel thread: it runs no program, so there is no allocator to shim"
            ),
        ));
    }
    let parent_comm = procfs::read_text(format!("/proc/{}/comm", proc.ppid))
        .ok()
        .map(|c| printable(c.trim()));
    // Address space, environment and executable: a running thread's, if
    // the main thread has ended with `pthread_exit` (`proc.view`).
    let view = &proc.view;
    Ok(Facts {
        comm,
        exe: std::fs::read_link(view.join("exe")).ok(),
        maps: procfs::read_text(view.join("maps")).ok(),
        environ: Environ::read(view),
        at_secure: procfs::at_secure(view),
        parent_comm,
        proc,
    })
}

impl Facts {
    /// A variable of its initial environment.
    fn env(&self, key: &str) -> Option<String> {
        self.environ.as_ref()?.get(key)
    }
}

/// The first mapped file whose name contains `needle`.
fn mapped(maps: &str, needle: &str) -> Option<String> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains(needle))
        .map(String::from)
}

/// The findings, in the order they are made.
#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn add(&mut self, level: Level, code: &'static str, message: String) {
        self.0.push(Finding {
            level,
            code,
            message,
        });
    }
}

/// What the rules look at.
struct Seen<'a> {
    pid: i32,
    p: &'a Facts,
    /// The executable's ELF facts, or why they could not be read.
    elf: Result<crate::elf::ElfFacts, String>,
    /// The executable, or `[comm]`-like name, for messages.
    exe_name: String,
    /// Runs under valgrind.
    valgrind: bool,
    /// The sanitizer whose runtime owns malloc, if any.
    sanitizer: Option<String>,
}

/// Diagnoses `pid`; `endpoint` asks its control endpoint (injected so the
/// rules can be tested without one).
pub fn diagnose(pid: i32, endpoint: impl FnOnce(&Proc) -> Endpoint) -> Result<Diagnosis, Failure> {
    let p = read_facts(pid)?;
    let mut f = Findings::default();
    let maps = p.maps.as_deref();
    let shim = maps.and_then(|m| mapped(m, "libmemshim"));
    let exe_name = p
        .exe
        .as_ref()
        .map(|e| printable(&e.display().to_string()))
        .unwrap_or_else(|| p.comm.clone());
    let mut seen = Seen {
        pid,
        p: &p,
        // /proc/<pid>/exe opens the executable even inside another mount namespace.
        elf: crate::elf::inspect(&p.proc.view.join("exe")),
        exe_name,
        valgrind: false,
        sanitizer: None,
    };
    if maps.is_none() {
        f.add(
            Level::Problem,
            "no_access",
            if procfs::my_euid() == Some(0) {
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
    inert(&mut f, &mut seen);
    if let Some(lib) = &shim {
        loaded(&mut f, &seen, lib, endpoint);
    } else if maps.is_some() {
        not_loaded(&mut f, &seen);
    }
    Ok(Diagnosis {
        pid,
        command: p.comm.clone(),
        shim,
        findings: f.0,
        host: host::facts(&pid.to_string()),
    })
}

/// What keeps the shim inert whatever it does: valgrind, which replaces
/// malloc itself, and a sanitizer's runtime, which must own it. Notes both
/// in `seen`.
fn inert(f: &mut Findings, seen: &mut Seen<'_>) {
    let maps = seen.p.maps.as_deref();
    seen.valgrind = seen.exe_name.contains("/valgrind/")
        || maps.is_some_and(|m| mapped(m, "vgpreload").is_some());
    if seen.valgrind {
        f.add(
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
    seen.sanitizer = san_lib.or_else(|| seen.elf.as_ref().ok().and_then(|e| e.sanitizer.clone()));
    if let Some(s) = &seen.sanitizer {
        f.add(
            Level::Problem,
            "sanitizer",
            format!(
                "built with a sanitizer ({s}), whose runtime must own malloc; the shim stays out of the way. \
                 Run sanitizer builds with `env -u LD_PRELOAD`."
            ),
        );
    }
}

/// The shim is mapped from `lib`: whether the executable's own malloc
/// keeps it idle, and what its control endpoint says.
fn loaded(f: &mut Findings, seen: &Seen<'_>, lib: &str, endpoint: impl FnOnce(&Proc) -> Endpoint) {
    if lib.contains("libmemshim_bridge") {
        return attached(f, lib, endpoint(&seen.p.proc));
    }
    let exe_name = &seen.exe_name;
    let own_malloc = seen.elf.as_ref().is_ok_and(|e| e.defines_malloc);
    if own_malloc {
        f.add(
            Level::Problem,
            "own_malloc",
            format!(
                "{exe_name} defines malloc itself; an executable's symbols come before every preload, \
                 so the shim sits idle and purges do nothing. Remove LD_PRELOAD for it."
            ),
        );
    }
    let ahead = if own_malloc { None } else { malloc_ahead(seen) };
    if let Some(other) = &ahead {
        let debug = if other.contains("libc_malloc_debug") {
            " glibc's malloc debugging library reads glibc's block headers on the shim's blocks \
             (through the shim's __libc_malloc), and answers wrongly or crashes."
        } else {
            ""
        };
        f.add(
            Level::Problem,
            "not_interposed",
            format!(
                "{other}, preloaded ahead of the shim, defines malloc, so the process's malloc is \
                 its: stats and purges do not reflect the process's heap.{debug} Preload one \
                 allocator (libmemshim.so alone, or first in LD_PRELOAD)."
            ),
        );
    }
    // The problems above are why the shim does not interpose here.
    let inert = seen.sanitizer.is_some() || seen.valgrind || own_malloc || ahead.is_some();
    match endpoint(&seen.p.proc) {
        Endpoint::Answered {
            interposed: false, ..
        } if ahead.is_some() => {}
        Endpoint::Answered { interposed: false, .. } => f.add(
            Level::Problem,
            "not_interposed",
            "the shim reports interposed=false: another malloc is in use (its own allocator, a sanitizer, \
             or the shim was dlopen'ed); stats and purge do not reflect the process's heap"
                .into(),
        ),
        Endpoint::Answered { interposed: true, cuda } if !inert => {
            f.add(Level::Ok, "shim_active", format!("shim loaded from {lib} and answering on its control socket"));
            for note in cuda {
                f.add(Level::Note, "cuda_fragmentation", note);
            }
        }
        Endpoint::Answered { .. } => {}
        Endpoint::Absent => absent(f, seen, lib, inert),
        Endpoint::Unreachable(why) => {
            f.add(Level::Problem, "endpoint_unreachable", format!("shim loaded from {lib}; its control socket: {why}"))
        }
    }
}

/// The first library `LD_PRELOAD` names ahead of the shim that defines
/// `malloc` (another allocator, a tracer, glibc's `libc_malloc_debug.so`):
/// ld.so binds the process's `malloc` to it, and the shim stays inert.
/// An entry without a slash is the mapped file of that name.
fn malloc_ahead(seen: &Seen<'_>) -> Option<String> {
    let list = seen.p.env("LD_PRELOAD")?;
    let maps = seen.p.maps.as_deref().unwrap_or("");
    for entry in list.split([' ', ':', '\t', '\n']).filter(|e| !e.is_empty()) {
        if entry.contains("libmemshim") {
            return None;
        }
        let path = if entry.contains('/') {
            Some(entry.to_owned())
        } else {
            maps.lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .find(|p| p.rsplit('/').next() == Some(entry))
                .map(str::to_owned)
        };
        let Some(path) = path else { continue };
        let file = seen
            .p
            .proc
            .view
            .join("root")
            .join(path.trim_start_matches('/'));
        if crate::elf::inspect(&file).is_ok_and(|e| e.defines_malloc) {
            return Some(printable(entry));
        }
    }
    None
}

/// The bridge `memshim-ctl attach` loads is mapped from `lib`: attached, or
/// detached (docs/attach.md, "attach").
fn attached(f: &mut Findings, lib: &str, endpoint: Endpoint) {
    match endpoint {
        Endpoint::Answered { cuda, .. } => {
            f.add(
                Level::Ok,
                "attached",
                format!(
                    "memshim attached from {lib} (memshim-ctl attach) and answering on its control socket; \
                     the heap is the process's own allocator's: jemalloc's decay and native heap profiles \
                     need a start with LD_PRELOAD"
                ),
            );
            for note in cuda {
                f.add(Level::Note, "cuda_fragmentation", note);
            }
        }
        Endpoint::Absent => f.add(
            Level::Note,
            "detached",
            format!(
                "{lib} is mapped but detached (memshim-ctl detach): the verbs reach the process by \
                 ptrace; memshim-ctl attach brings the thread back"
            ),
        ),
        Endpoint::Unreachable(why) => f.add(
            Level::Problem,
            "endpoint_unreachable",
            format!("memshim attached from {lib}; its control socket: {why}"),
        ),
    }
}

/// The shim is mapped from `lib` but has no control socket: why, from its
/// settings, its threads and its socket's directory and path.
fn absent(f: &mut Findings, seen: &Seen<'_>, lib: &str, inert: bool) {
    let p = &seen.p.proc;
    let control = procfs::control_mode(seen.p.environ.as_ref());
    let single = p.threads == 1;
    if control == Control::Off {
        f.add(
            Level::Note,
            "control_off",
            format!("shim loaded from {lib}; MEMSHIM_CONTROL=off, so it has no thread and no control socket"),
        );
    } else if inert {
        // The problem found above is why.
    } else if single && control == Control::On {
        f.add(
            Level::Note,
            "endpoint_not_started",
            format!(
                "shim loaded from {lib}; the process is single-threaded although MEMSHIM_CONTROL=on starts \
                 the shim's thread at once: most likely it is the fork child of a shimmed process, which \
                 starts the thread and control socket with its own first pthread_create (or the thread \
                 gave its slot to the program at a limit of threads)"
            ),
        );
    } else if single {
        f.add(
            Level::Note,
            "endpoint_not_started",
            format!(
                "shim loaded from {lib}; the process is single-threaded, and with MEMSHIM_CONTROL={} \
                 the shim's thread and control socket start only with its second thread. \
                 Set MEMSHIM_CONTROL=on to reach it anyway.",
                control.word()
            ),
        );
    } else if let Some((code, why)) = socket_problem(p) {
        f.add(
            Level::Problem,
            code,
            format!("shim loaded from {lib}; {why}"),
        );
    } else {
        let (why, hint) = no_endpoint::why(p, &socket::locate(p));
        f.add(
            Level::Note,
            "endpoint_absent",
            format!(
                "shim loaded from {lib}, but no control socket answers for pid {}: {why} ({hint})",
                seen.pid
            ),
        );
    }
}

/// No shim is mapped: why the loader did not preload it.
fn not_loaded(f: &mut Findings, seen: &Seen<'_>) {
    let explained = seen.valgrind || seen.sanitizer.is_some() || loader(f, seen);
    let p = seen.p;
    let exe_name = &seen.exe_name;
    if !explained && p.at_secure == Some(true) {
        f.add(
            Level::Problem,
            "secure_exec",
            format!(
                "{exe_name} runs in secure-execution mode (setuid/setgid or file capabilities): \
                 ld.so ignores LD_PRELOAD paths with slashes. Expected; such programs keep glibc malloc."
            ),
        );
    } else if !explained {
        preload(f, seen);
    }
}

/// A loader that cannot preload libmemshim.so: none (a static binary),
/// another ELF class, musl's. Whether one was found.
fn loader(f: &mut Findings, seen: &Seen<'_>) -> bool {
    let exe_name = &seen.exe_name;
    match &seen.elf {
        Ok(e) if e.interp.is_none() => f.add(
            Level::Problem,
            "static_binary",
            format!(
                "{exe_name} is statically linked: the dynamic loader never runs, so LD_PRELOAD has no effect"
            ),
        ),
        Ok(e) if e.bits != 64 => f.add(
            Level::Problem,
            "elf_class",
            format!(
                "{exe_name} is a {}-bit program and libmemshim.so is 64-bit; ld.so skips it \
                 (and prints an error on every run). Install a build for that ABI or unset LD_PRELOAD for it.",
                e.bits
            ),
        ),
        Ok(e) if e.interp.as_deref().is_some_and(|i| i.contains("musl")) => f.add(
            Level::Problem,
            "musl",
            format!("{exe_name} uses musl's loader; libmemshim.so is built for glibc and cannot be preloaded"),
        ),
        _ => return false,
    }
    true
}

/// What `LD_PRELOAD` says: unreadable, naming a library ld.so rejected or
/// that does not exist, or not naming the shim at all (and which launcher
/// may have dropped it).
fn preload(f: &mut Findings, seen: &Seen<'_>) {
    let (pid, p) = (seen.pid, seen.p);
    match p.env("LD_PRELOAD").as_deref() {
        None if p.environ.is_none() => f.add(
            Level::Problem,
            "no_access",
            if procfs::my_euid() == Some(0) {
                format!("no shim mapped, and /proc/{pid}/environ is unreadable even as root")
            } else {
                format!("no shim mapped, and /proc/{pid}/environ is unreadable: run doctor as root to see why")
            },
        ),
        Some(v) if v.contains("libmemshim") => {
            let missing = v
                .split([' ', ':'])
                .filter(|e| e.contains("libmemshim"))
                .find(|e| !Path::new(&format!("/proc/{pid}/root{e}")).exists());
            f.add(
                Level::Problem,
                "preload_ignored",
                match missing {
                    Some(m) => format!("LD_PRELOAD names {m}, which does not exist in the process's filesystem"),
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
            f.add(
                Level::Problem,
                "no_preload",
                format!("LD_PRELOAD does not name libmemshim.so in its environment.{via}"),
            );
        }
    }
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
                crate::output::render::bytes(d.reserved),
                crate::output::render::bytes(d.inactive_split)
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

/// What keeps the shim of `p` from having its control socket, as a
/// finding (code, text), if anything does: something other than a socket
/// at its path (`socket_blocked`), or a socket directory it refuses (a
/// symbolic link, not a directory, another owner, open to others) or
/// cannot create (no parent) (`socket_dir`).
fn socket_problem(p: &Proc) -> Option<(&'static str, String)> {
    let loc = socket::locate(p);
    if let Some((why, hint)) = no_endpoint::blocked_socket(&loc.path()) {
        return Some(("socket_blocked", format!("{why} ({hint})")));
    }
    let why = no_endpoint::unsafe_dir(&loc.dir, p.uid)
        .or_else(|| no_endpoint::missing_parent(&loc.dir))?;
    Some((
        "socket_dir",
        format!(
            "it cannot create its control socket: {why}. If MEMSHIM_SOCKET_DIR names it, point the variable at \
             a directory of the process's user; otherwise remove it (the shim re-creates the directory within 5 s)"
        ),
    ))
}

/// Asks the control endpoint of `p` for `stats`, if it has a socket.
pub fn ask_endpoint(p: &Proc) -> Endpoint {
    if std::fs::symlink_metadata(socket::locate(p).path()).is_err() {
        return Endpoint::Absent;
    }
    let req = memshim_proto::Request::Stats {
        arenas: false,
        pss: false,
    };
    let asked = Client::open_proc(p.clone())
        .and_then(|mut c| c.ask::<Box<memshim_proto::StatsReport>>(&req));
    match asked {
        Ok(s) => Endpoint::Answered {
            interposed: s.config.interposed,
            cuda: s.torch.as_ref().map(cuda_notes).unwrap_or_default(),
        },
        // The file exists (checked above), so "no endpoint" is a file
        // nobody listens on (left over from before an exec): explained by
        // the process's state like a missing one.
        Err(f) if f.exit == exit::NO_ENDPOINT => Endpoint::Absent,
        Err(f) => Endpoint::Unreachable(f.message),
    }
}

/// Runs `doctor`.
pub fn run(a: DoctorArgs) -> Result<Exit, Failure> {
    let Some(pid) = a.pid else {
        let h = host::facts("self");
        let lib = super::run::locate_library(
            std::env::var_os(settings::LIB.name).as_deref(),
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
            for l in host::lines(&h) {
                outln!("{l}")?;
            }
        }
        return Ok(exit::OK);
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
            outln!("{tag:<10} {}: {}", f.code, printable(&f.message))?;
        }
        for l in host::lines(&d.host) {
            outln!("{l}")?;
        }
    }
    // Unreadable /proc files are a permission problem (exit 5); other
    // problems are findings about the process (exit 1).
    Ok(if d.findings.iter().any(|f| f.code == "no_access") {
        exit::PERMISSION
    } else if d.has_problem() {
        exit::FAILED
    } else {
        exit::OK
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
