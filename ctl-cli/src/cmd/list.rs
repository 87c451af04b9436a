//! `memshim-ctl list [--json]`: every visible process with the shim loaded,
//! then every CPython without it ("not preloaded"), which the verbs reach
//! by ptrace, and whether they may (`crate::reach::ptrace::candidate`).

use crate::exit::{self, Exit, Failure};
use crate::output::print::{out, outln, printable};
use crate::output::render;
use crate::reach::client::{self, Client};
use crate::reach::procfs::{self, Proc};
use crate::reach::socket;
use clap::Args;
use memshim_proto::client::ConnectError;
use memshim_proto::endpoint::SocketName;
use memshim_proto::settings;
use serde::Serialize;

/// Options of `list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// One row of `list`.
#[derive(Serialize, Debug)]
pub struct Entry {
    /// Pid as we see it.
    pub pid: i32,
    /// Pid inside its own namespace.
    pub nspid: i32,
    /// Effective uid.
    pub uid: u32,
    /// Command line.
    pub command: String,
    /// RSS in bytes (from /proc, always present).
    pub rss: u64,
    /// Whether the endpoint answered.
    pub endpoint: bool,
    /// The socket path (as reached from here).
    pub socket: String,
    /// Why there is no endpoint.
    pub reason: Option<String>,
    /// jemalloc resident bytes (endpoint only).
    pub resident: Option<u64>,
    /// Bytes a purge could give back now (endpoint only).
    pub purgeable: Option<u64>,
    /// Reached by `attach` (libmemshim_bridge.so), not preloaded.
    pub attached: bool,
}

/// The whole `list` document.
#[derive(Serialize, Debug)]
pub struct Listing {
    /// Shimmed processes.
    pub processes: Vec<Entry>,
    /// CPython processes without the shim, which the verbs reach by ptrace
    /// (`null`-free addition: older readers ignore it).
    pub not_preloaded: Vec<crate::reach::ptrace::Candidate>,
    /// Processes whose maps we could not read (other users' processes).
    pub unreadable: usize,
    /// Stale socket files (no listener, no such process) that were removed.
    pub stale_removed: Vec<String>,
    /// `list` ran as root (what to say about `unreadable`).
    #[serde(skip)]
    pub as_root: bool,
}

/// Why `n` processes could not be read, and what to do about it; telling
/// root to run as root would help nobody.
fn unreadable_note(n: usize, as_root: bool) -> String {
    let processes = if n == 1 { "process" } else { "processes" };
    if as_root {
        format!(
            "{n} {processes} could not be read: {}",
            procfs::DENIED_TO_ROOT
        )
    } else {
        format!("{n} {processes} of other users could not be read; run as root to see them")
    }
}

fn entry(p: Proc) -> Entry {
    let loc = socket::locate(&p);
    let socket = loc.path().display().to_string();
    let mut e = Entry {
        pid: p.pid,
        nspid: p.nspid,
        uid: p.uid,
        command: p.command.clone(),
        rss: p.rss,
        endpoint: false,
        socket,
        reason: None,
        resident: None,
        purgeable: None,
        attached: false,
    };
    let stats = Client::open_proc(p).and_then(|mut c| c.stats());
    match stats {
        Ok(s) => {
            e.endpoint = true;
            e.rss = s.process.rss;
            e.resident = Some(s.allocator.resident);
            e.purgeable = Some(s.allocator.purgeable);
        }
        Err(f) => e.reason = Some(f.message),
    }
    e
}

/// Removes socket files in `dir` that are stale by proto's rule
/// (`SocketName::stale`, which the shim applies too; of any pid namespace)
/// and that nobody listens on (only in directories of our own mount
/// namespace, where the pids are ours).
fn remove_stale(dirs: &[std::path::PathBuf]) -> Vec<String> {
    let mut removed = vec![];
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for f in rd.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if !SocketName::stale(&name, None, procfs::seen) {
                continue; // a live process's (its shim manages the file), or not ours to judge
            }
            if matches!(client::connect(dir, &name), Err(ConnectError::Refused))
                && std::fs::remove_file(f.path()).is_ok()
            {
                removed.push(f.path().display().to_string());
            }
        }
    }
    removed
}

/// Runs `list`.
pub fn run(a: ListArgs) -> Result<Exit, Failure> {
    let me = std::process::id() as i32;
    let mut processes = vec![];
    let mut not_preloaded = vec![];
    let mut unreadable = 0;
    // Stale files are looked for in our own default directory, and in the
    // directory of every shimmed process found below.
    let mut dirs = vec![];
    if let Some(uid) = procfs::my_euid() {
        dirs.push(std::path::PathBuf::from(
            memshim_proto::endpoint::default_socket_dir(uid),
        ));
    }
    if let Some(d) = std::env::var_os(settings::SOCKET_DIR.name)
        .and_then(|d| socket::configured_dir(d.as_encoded_bytes()))
    {
        dirs.push(d);
    }
    for pid in procfs::all_pids() {
        if pid == me {
            continue;
        }
        let loaded = procfs::memshim_in(pid);
        let detached = matches!(loaded, Ok(procfs::Loaded::Attached))
            && !crate::reach::ptrace::bridge_serves(pid);
        match loaded {
            Ok(procfs::Loaded::Preloaded | procfs::Loaded::Attached) if !detached => {}
            Ok(_) => {
                if let Ok(p) = procfs::read_proc(pid)
                    && let Some(c) = crate::reach::ptrace::candidate(&p)
                {
                    not_preloaded.push(c);
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                unreadable += 1;
                continue;
            }
            Err(_) => continue, // exited meanwhile, or a kernel thread
        }
        let Ok(p) = procfs::read_proc(pid) else {
            continue;
        };
        let loc = socket::locate(&p);
        if loc.dir == loc.dir_inside && !dirs.contains(&loc.dir) {
            dirs.push(loc.dir.clone());
        }
        let mut e = entry(p);
        e.attached = matches!(loaded, Ok(procfs::Loaded::Attached));
        processes.push(e);
    }
    let listing = Listing {
        processes,
        not_preloaded,
        unreadable,
        stale_removed: remove_stale(&dirs),
        as_root: procfs::my_euid() == Some(0),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&listing).unwrap_or_default())?;
    } else {
        out!("{}", human(&listing))?;
    }
    Ok(exit::OK)
}

/// The human form of a listing.
pub fn human(l: &Listing) -> String {
    if l.processes.is_empty() {
        let mut s = "no process with libmemshim.so loaded is visible".to_owned();
        if l.unreadable > 0 {
            s.push_str(&format!(" ({})", unreadable_note(l.unreadable, l.as_root)));
        }
        s.push('\n');
        s.push_str(&not_preloaded(&l.not_preloaded));
        for f in &l.stale_removed {
            s.push_str(&format!("removed stale socket {f}\n"));
        }
        return s;
    }
    let rows: Vec<Vec<String>> = l
        .processes
        .iter()
        .map(|e| {
            vec![
                e.pid.to_string(),
                render::bytes(e.rss),
                render::opt_bytes(e.resident),
                render::opt_bytes(e.purgeable),
                match (e.endpoint, e.attached) {
                    (true, false) => "up".into(),
                    (true, true) => "up (attached)".into(),
                    (false, _) => "down".into(),
                },
                render::shorten(&e.command, 40),
            ]
        })
        .collect();
    let mut s = render::table(
        &["PID", "RSS", "RESIDENT", "PURGEABLE", "ENDPOINT", "COMMAND"],
        &rows,
    );
    let down: Vec<String> = l
        .processes
        .iter()
        .filter(|e| !e.endpoint)
        .map(|e| {
            format!(
                "pid {}: {}",
                e.pid,
                printable(e.reason.as_deref().unwrap_or("?"))
            )
        })
        .collect();
    s.push_str(&reasons("endpoint down", &down));
    s.push_str(&not_preloaded(&l.not_preloaded));
    if l.unreadable > 0 {
        s.push_str(&format!("({})\n", unreadable_note(l.unreadable, l.as_root)));
    }
    for f in &l.stale_removed {
        s.push_str(&format!("removed stale socket {f}\n"));
    }
    s
}

/// `title:` and one indented line per reason, after a blank line; nothing
/// when there is none.
fn reasons(title: &str, lines: &[String]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let mut s = format!("\n{title}:\n");
    for l in lines {
        s.push_str(&format!("  {l}\n"));
    }
    s
}

/// The section of CPython processes without the preload (nothing when
/// there are none): a table, then why each that may not be reached is not.
fn not_preloaded(c: &[crate::reach::ptrace::Candidate]) -> String {
    if c.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = c
        .iter()
        .map(|e| {
            vec![
                e.pid.to_string(),
                render::bytes(e.rss),
                e.python.clone().unwrap_or_else(|| "-".into()),
                match e.code {
                    None => "yes".into(),
                    Some(code) => format!("no ({})", code.name),
                },
                render::shorten(&e.command, 40),
            ]
        })
        .collect();
    let mut s = String::from("\nnot preloaded (CPython; the verbs reach it by ptrace):\n");
    s.push_str(&render::table(
        &["PID", "RSS", "PYTHON", "REACHABLE", "COMMAND"],
        &rows,
    ));
    let refused: Vec<String> = c
        .iter()
        .filter(|e| !e.reachable)
        .map(|e| {
            format!(
                "pid {}: {} (exit {})",
                e.pid,
                printable(e.reason.as_deref().unwrap_or("?")),
                e.code.map_or(0, |c| c.code)
            )
        })
        .collect();
    s.push_str(&reasons("not reachable", &refused));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_listing_shows_endpoint_state() {
        let l = Listing {
            processes: vec![
                Entry {
                    pid: 10,
                    nspid: 10,
                    uid: 0,
                    command: "python3 app.py".into(),
                    rss: 300 << 20,
                    endpoint: true,
                    socket: "/tmp/memshim-0/10-5.sock".into(),
                    reason: None,
                    resident: Some(200 << 20),
                    purgeable: Some(64 << 20),
                    attached: false,
                },
                Entry {
                    pid: 12,
                    nspid: 12,
                    uid: 0,
                    command: "python3 server.py".into(),
                    rss: 900 << 20,
                    endpoint: true,
                    socket: "/tmp/memshim-0/12-7.sock".into(),
                    reason: None,
                    resident: Some(800 << 20),
                    purgeable: Some(1 << 20),
                    attached: true,
                },
                Entry {
                    pid: 11,
                    nspid: 11,
                    uid: 0,
                    command: "cat".into(),
                    rss: 1 << 20,
                    endpoint: false,
                    socket: "/tmp/memshim-0/11-6.sock".into(),
                    reason: Some("single-threaded process".into()),
                    resident: None,
                    purgeable: None,
                    attached: false,
                },
            ],
            not_preloaded: vec![],
            unreadable: 0,
            stale_removed: vec![],
            as_root: true,
        };
        let h = human(&l);
        assert!(!h.contains("not preloaded"), "{h}");
        assert!(
            h.starts_with("PID        RSS   RESIDENT  PURGEABLE  ENDPOINT"),
            "{h}"
        );
        assert!(h.contains("300.0 MiB  200.0 MiB   64.0 MiB  up"), "{h}");
        assert!(h.contains("down           cat"), "{h}");
        assert!(h.contains("up (attached)  python3 server.py"), "{h}");
        assert!(
            h.contains("endpoint down:\n  pid 11: single-threaded process\n"),
            "{h}"
        );
        let j = serde_json::to_value(&l).unwrap();
        assert_eq!(j["processes"][2]["endpoint"], false);
        assert_eq!(j["processes"][1]["attached"], true);
        assert_eq!(j["processes"][0]["purgeable"], 64 << 20);
    }

    #[test]
    fn unreadable_processes_get_advice_that_fits_the_caller() {
        let mut l = Listing {
            processes: vec![],
            not_preloaded: vec![],
            unreadable: 2,
            stale_removed: vec![],
            as_root: false,
        };
        assert!(human(&l).contains("2 processes of other users could not be read; run as root"));
        l.as_root = true;
        let h = human(&l);
        assert!(!h.contains("as root"), "{h}");
        assert!(
            h.contains("2 processes could not be read: even root needs CAP_SYS_PTRACE"),
            "{h}"
        );
        assert!(serde_json::to_value(&l).unwrap().get("as_root").is_none());
    }

    #[test]
    fn cpythons_without_the_preload_are_listed_after_the_shimmed_with_why_not() {
        let one = |pid, code: Option<Exit>, reason: Option<&str>| crate::reach::ptrace::Candidate {
            pid,
            uid: 0,
            command: format!("python3 app{pid}.py"),
            rss: 50 << 20,
            preload: "not preloaded",
            python: code.is_none().then(|| "3.11".into()),
            reachable: code.is_none(),
            code,
            reason: reason.map(Into::into),
        };
        let l = Listing {
            processes: vec![],
            not_preloaded: vec![
                one(20, None, None),
                one(21, Some(exit::TRACED), Some("traced by process 9")),
            ],
            unreadable: 0,
            stale_removed: vec![],
            as_root: true,
        };
        let h = human(&l);
        assert!(
            h.starts_with("no process with libmemshim.so loaded is visible\n\nnot preloaded"),
            "{h}"
        );
        assert!(h.contains("3.11  yes          python3 app20.py"), "{h}");
        assert!(h.contains("no (traced)"), "{h}");
        let why = format!(
            "not reachable:\n  pid 21: traced by process 9 (exit {})\n",
            exit::TRACED.code
        );
        assert!(h.contains(&why), "{h}");
        let j = serde_json::to_value(&l).unwrap();
        assert_eq!(j["processes"], serde_json::json!([]));
        assert_eq!(j["not_preloaded"][0]["reachable"], true);
        assert_eq!(j["not_preloaded"][1]["code"], "traced");
        assert_eq!(j["not_preloaded"][1]["preload"], "not preloaded");
    }
}
