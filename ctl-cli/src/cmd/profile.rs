//! `memshim-ctl profile <PID> [--seconds N] [--every S --count N]
//! [--format table|folded|json|svg|pprof|speedscope|html] [-o FILE]`, `profile --diff OLD NEW`,
//! `profile <PID> --stop`: where the live memory of a process was
//! allocated, from jemalloc's heap profiler, switched on from outside
//! (docs/profile.md). The process must have started with
//! `MEMSHIM_PROFILE=on`; without it the answer is
//! [`exit::NO_PROFILER`] and how to turn it on.
//!
//! If sampling was off, this command switches it on, waits `--seconds`
//! (default 10), takes the profile and switches it off again (`--keep`
//! leaves it on). Only allocations made while sampling is on are seen, and
//! stay in later profiles for as long as they are live.

use crate::args::{parse_interval, pid_parser};
use crate::exit::{self, Exit, Failure};
use crate::output::print::{errln, outln};
use crate::output::render::bytes;
use crate::profile::heap::{NativeFrames, Profile, signed_bytes};
use crate::reach::client::Client;
use crate::reach::untrusted::{self, Links};
use clap::{Args, ValueEnum};
use memshim_proto::{
    HeapDump, MAX_PROFILE_SECONDS, MAX_PY_TRACE_SECONDS, ProfileAction, ProfileReply,
    PyTraceAction, PyTraceReply, Request,
};
use std::path::PathBuf;
use std::time::Duration;

/// How long a first profile samples when `--seconds` is not given.
const DEFAULT_SECONDS: u64 = 10;

/// Options of `profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Process id.
    #[arg(value_parser = pid_parser(), required_unless_present = "diff")]
    pub pid: Option<i32>,
    /// Seconds to sample before the profile is taken (default: 10 when this
    /// command switches sampling on, 0 when it was on already).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub seconds: Option<u64>,
    /// Growth mode: after the first profile, take one every S seconds and
    /// show what grew since the one before (the leak view).
    #[arg(long, value_name = "S", value_parser = parse_interval)]
    pub every: Option<f64>,
    /// How many growth steps `--every` takes.
    #[arg(long, default_value_t = 1, requires = "every", value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub count: u32,
    /// Leave sampling on after this command.
    #[arg(long)]
    pub keep: bool,
    /// Forget what was sampled before, then profile.
    #[arg(long)]
    pub reset: bool,
    /// Only switch sampling off (with --python: tracemalloc, if memshim started it).
    #[arg(long, conflicts_with_all = ["seconds", "every", "keep", "reset", "diff"])]
    pub stop: bool,
    /// Python lines instead of native call sites: CPython's tracemalloc,
    /// started through the bridge for --seconds and stopped again.
    #[arg(long, conflicts_with_all = ["diff", "reset"])]
    pub python: bool,
    /// The difference NEW minus OLD of two profiles saved with `--format json`.
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"], conflicts_with_all = ["pid", "seconds", "every", "keep"])]
    pub diff: Option<Vec<PathBuf>>,
    /// How to show it (default: from the name given to -o, else table).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Same as `--format json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// In a stack with Python frames, `fold` leaves out the interpreter's
    /// own C frames between them (but the one that allocated); `all` keeps
    /// every native frame.
    #[arg(long, value_enum, default_value_t = NativeFrames::Fold, value_name = "WHICH", conflicts_with = "python")]
    pub native_frames: NativeFrames,
    /// Rows of the table.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100000))]
    pub top: u64,
    /// Write to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Output formats.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The top call sites, by live bytes (and what each library holds).
    Table,
    /// Folded stacks (`outer;...;inner bytes`) for flamegraph.pl, inferno, speedscope.
    Folded,
    /// The symbolized profile (what `--diff` reads).
    Json,
    /// A flame graph.
    Svg,
    /// pprof's protobuf (gzipped), for `go tool pprof` and its web view.
    Pprof,
    /// speedscope's JSON (a sampled profile weighted by live bytes).
    Speedscope,
    /// One HTML file: the table and the interactive flame graph.
    Html,
}

/// A combination clap cannot check itself (`cli.rs` reports it as a usage
/// error, [`exit::USAGE`]).
pub fn conflict(a: &ProfileArgs) -> Option<String> {
    let format = format_of(a);
    if a.python && !matches!(format, Format::Table | Format::Json) {
        return Some(
            "--python shows Python lines as a table or as JSON only (--format table|json)".into(),
        );
    }
    if a.every.is_some() && a.output.is_none() && !format.streams() && format != Format::Json {
        return Some(format!(
            "--every with --format {} makes one file per growth step: give -o FILE (the steps go to FILE.1, FILE.2, ... before its extension)",
            format.name()
        ));
    }
    let long = |cap: u64| span_s(a, a.seconds.unwrap_or(0)) > cap as f64;
    let under = |cap: u64| cap - MARGIN_S;
    if a.python && long(MAX_PY_TRACE_SECONDS) {
        return Some(format!(
            "--python runs tracemalloc for at most an hour: --seconds and --every x --count must add up to under {} s",
            under(MAX_PY_TRACE_SECONDS)
        ));
    }
    if long(MAX_PROFILE_SECONDS) {
        return Some(format!(
            "sampling runs for at most a day: --seconds and --every x --count must add up to under {} s",
            under(MAX_PROFILE_SECONDS)
        ));
    }
    None
}

/// What the shim is given beyond the command's own run before it switches
/// off what the command started (the last answer's time, a slow machine).
const MARGIN_S: u64 = 60;

/// Seconds what this command starts must last: its `wait`, the growth steps
/// (`--every` x `--count`) and [`MARGIN_S`].
fn span_s(a: &ProfileArgs, wait: u64) -> f64 {
    wait as f64 + a.every.map_or(0.0, |e| e * f64::from(a.count)) + MARGIN_S as f64
}

/// What the end of an `-o` file name asks for when no `--format` is given,
/// longest first.
const BY_NAME: [(&str, Format); 8] = [
    (".speedscope.json", Format::Speedscope),
    (".pb.gz", Format::Pprof),
    (".pprof", Format::Pprof),
    (".folded", Format::Folded),
    (".html", Format::Html),
    (".htm", Format::Html),
    (".svg", Format::Svg),
    (".json", Format::Json),
];

/// The format asked for: `--json`, else `--format`, else what the name
/// given to `-o` ends with ([`BY_NAME`]), else the table.
fn format_of(a: &ProfileArgs) -> Format {
    if a.json {
        return Format::Json;
    }
    if let Some(f) = a.format {
        return f;
    }
    let name = a
        .output
        .as_ref()
        .and_then(|o| o.file_name())
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    match BY_NAME.iter().find(|(end, _)| name.ends_with(end)) {
        Some(&(_, f)) => f,
        _ => Format::Table,
    }
}

impl Format {
    /// Whether successive profiles can follow one another in one stream:
    /// the table and folded stacks can; a JSON document, an SVG, a pprof
    /// file, a speedscope file or an HTML page cannot (each is a whole
    /// file). With `--every` and `-o FILE`, the others go one file per step
    /// ([`step_path`]).
    fn streams(self) -> bool {
        matches!(self, Format::Table | Format::Folded)
    }

    /// As `--format` spells it.
    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

/// Where growth step `step` goes with `-o path` in a format that does not
/// stream: `.N` before the suffix that names the format (`leak.pb.gz` ->
/// `leak.1.pb.gz`, [`BY_NAME`]), else before the last extension, else at
/// the end (the name's bytes as they are).
fn step_path(path: &std::path::Path, step: u32) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let name = path.file_name().map(|n| n.as_bytes()).unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    let at = BY_NAME
        .iter()
        .map(|(end, _)| end.as_bytes())
        .find(|end| lower.len() > end.len() && lower.ends_with(end))
        .map(|end| name.len() - end.len())
        .or_else(|| name.iter().rposition(|&b| b == b'.').filter(|&i| i > 0))
        .unwrap_or(name.len());
    let mut named = name[..at].to_vec();
    named.extend_from_slice(format!(".{step}").as_bytes());
    named.extend_from_slice(&name[at..]);
    path.with_file_name(std::ffi::OsString::from_vec(named))
}

/// Runs `profile`.
pub fn run(a: ProfileArgs) -> Result<Exit, Failure> {
    let format = format_of(&a);
    // A file that cannot be written is said before the sampling, not after.
    check_output(&a, format)?;
    if let Some(files) = &a.diff {
        let old = load(&files[0])?;
        let new = load(&files[1])?;
        let d = Profile::diff(&old, &new);
        let title = format!("{} \u{2192} {}", files[0].display(), files[1].display());
        emit(&a, format, &d, &title, None, 0)?;
        return Ok(exit::OK);
    }
    let pid = a.pid.unwrap_or_default();
    if a.python {
        return run_python(&a, format, pid);
    }
    if a.stop {
        let r = ask(pid, ProfileAction::Stop)?;
        let what = if r.changed { "stopped" } else { "was off" };
        stop_line(format, pid, "sampling", what)?;
        return Ok(exit::OK);
    }
    // One connection for the whole command: start, the dumps, stop.
    let mut c = Client::open(pid)?;
    if a.reset {
        ask_on(&mut c, ProfileAction::Reset, None)?;
    }
    let before = ask_on(&mut c, ProfileAction::Status, None)?;
    let wait = a
        .seconds
        .unwrap_or(if before.active { 0 } else { DEFAULT_SECONDS });
    let state = ask_on(
        &mut c,
        ProfileAction::Start,
        Some(bound(&a, wait, MAX_PROFILE_SECONDS)),
    )?;
    let started = state.changed;
    if started {
        errln!(
            "memshim-ctl: sampling started in {pid} (one sample per {} allocated); profiling what is allocated from now on{}",
            bytes(1u64 << state.lg_sample.min(63)),
            if wait > 0 {
                format!(", for {wait} s")
            } else {
                String::new()
            }
        );
    }
    let result = profile_after(&a, format, &mut c, wait);
    if started && !a.keep {
        // Switched off whatever happened above: a process left sampling
        // pays for it on every allocation. A connection that broke above
        // is made again for it.
        let off = ask_on(&mut c, ProfileAction::Stop, None)
            .or_else(|_| ask(pid, ProfileAction::Stop))
            .map(|_| ());
        return switched_off(pid, result, off);
    }
    result
}

/// How long what this command starts may last at most, in seconds:
/// [`span_s`]; with `--keep`, `cap`.
fn bound(a: &ProfileArgs, wait: u64, cap: u64) -> u64 {
    if a.keep {
        return cap;
    }
    (span_s(a, wait).ceil() as u64).min(cap)
}

/// The command's result, unless switching off what it started failed
/// (then it did not do its whole job: a warning and a failure).
fn switched_off(
    pid: i32,
    result: Result<Exit, Failure>,
    off: Result<(), Failure>,
) -> Result<Exit, Failure> {
    match (result, off) {
        (Ok(_), Err(f)) => Err(Failure::new(
            f.exit,
            Some(pid),
            format!(
                "the profile was taken, but switching it off again failed ({}); the process stops by itself at the deadline",
                f.message
            ),
        )),
        (r, _) => r,
    }
}

fn profile_after(
    a: &ProfileArgs,
    format: Format,
    c: &mut Client,
    wait: u64,
) -> Result<Exit, Failure> {
    let pid = c.proc.pid;
    hold(c, Duration::from_secs(wait))?;
    let (mut prev, mut active_ms) = dump(c, a.native_frames)?;
    let Some(every) = a.every else {
        let title = format!("pid {pid}");
        emit(a, format, &prev, &title, active_ms, 0)?;
        return Ok(exit::OK);
    };
    for step in 1..=a.count {
        hold(c, Duration::from_secs_f64(every))?;
        let (cur, ms) = dump(c, a.native_frames)?;
        active_ms = ms;
        let grown = Profile::diff(&prev, &cur);
        let title = format!("pid {pid}: growth {step} of {}, {every} s", a.count);
        emit(a, format, &grown, &title, active_ms, step)?;
        prev = cur;
    }
    Ok(exit::OK)
}

/// One `profile` request on a connection of its own.
fn ask(pid: i32, action: ProfileAction) -> Result<ProfileReply, Failure> {
    ask_on(&mut Client::open(pid)?, action, None)
}

/// How often a waiting `profile` asks for the state, so that its connection
/// is never idle as long as the endpoint's limit (`IDLE_TIMEOUT_MS`).
const KEEP_OPEN: Duration = Duration::from_millis(memshim_proto::IDLE_TIMEOUT_MS / 3);

/// Waits `d` with the connection kept open (a `status` now and then).
fn hold(c: &mut Client, d: Duration) -> Result<(), Failure> {
    let end = std::time::Instant::now() + d;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(KEEP_OPEN));
        if !left.saturating_sub(KEEP_OPEN).is_zero() {
            ask_on(c, ProfileAction::Status, None)?;
        }
    }
}

/// One `profile` request on `c`; `seconds`: after how long the shim
/// switches off the sampling this start begins (so a client killed during
/// its wait leaves none behind).
fn ask_on(
    c: &mut Client,
    action: ProfileAction,
    seconds: Option<u64>,
) -> Result<ProfileReply, Failure> {
    c.ask::<Box<ProfileReply>>(&Request::Profile { action, seconds })
        .map(|r| *r)
}

/// A dump: the shim has jemalloc write it next to its socket and names the
/// file; it is read, parsed and removed here, outside the process.
fn dump(c: &mut Client, native: NativeFrames) -> Result<(Profile, Option<u64>), Failure> {
    let pid = c.proc.pid;
    let t0 = std::time::Instant::now();
    let r = ask_on(c, ProfileAction::Dump, None)?;
    let mut d = match (&r.dump, &r.dump_file) {
        (Some(d), _) => d.clone(),
        (None, Some(name)) => {
            let (_, mut d) = read_dump(c, name)?;
            d.elapsed_ms = t0.elapsed().as_secs_f64() * 1000.0;
            d
        }
        (None, None) => HeapDump::default(),
    };
    d.set_build_ids(&r.build_ids);
    d.python_frames = r.python_frames.clone();
    if d.dropped_stacks > 0 {
        errln!(
            "memshim-ctl: {pid} has more sampled stacks than one answer carries: the {} smallest ({}) are left out",
            d.dropped_stacks,
            bytes(d.dropped_bytes)
        );
    }
    let own_pid = c.proc.nspid;
    let (p, mismatched) = Profile::from_dump(pid, own_pid, r.lg_sample, &d, native);
    for m in mismatched {
        errln!("memshim-ctl: {pid}: {m}; its frames are shown as offsets");
    }
    Ok((p, r.active_ms))
}

/// The largest heap profile read (jemalloc's text, a line per sampled
/// stack: tens of MiB for a very large process).
const DUMP_LIMIT: u64 = 1 << 30;

/// Reads and removes the dump file `name` in the process's socket
/// directory, and parses it.
fn read_dump(c: &Client, name: &str) -> Result<(u32, HeapDump), Failure> {
    let pid = c.proc.pid;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Failure::new(
            exit::REMOTE,
            Some(pid),
            format!("the process named {name:?} as its dump file, which is not a file name"),
        ));
    }
    let path = c.loc.dir.join(name);
    // The directory is the process's user's: what is there now may be
    // another file than the one the shim wrote.
    let text = untrusted::read_regular(&path, Links::Refuse, DUMP_LIMIT);
    let _ = std::fs::remove_file(&path);
    let text = text.map_err(|e| {
        Failure::new(
            exit::FAILED,
            Some(pid),
            format!("reading the heap profile {}: {e}", path.display()),
        )
    })?;
    HeapDump::parse(&String::from_utf8_lossy(&text)).ok_or_else(|| {
        Failure::new(
            exit::REMOTE,
            Some(pid),
            format!(
                "{} is not jemalloc's heap profile (heap_v2 format)",
                path.display()
            ),
        )
    })
}

fn load(path: &PathBuf) -> Result<Profile, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::new(exit::FAILED, None, format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        Failure::new(
            exit::FAILED,
            None,
            format!(
                "{}: not a profile written by `profile --format json`: {e}",
                path.display()
            ),
        )
    })
}

/// Writes one profile in `format`, to `-o FILE` or stdout: the one profile
/// (`step` 0) or growth step `step` of `--every` ([`write_out`]).
fn emit(
    a: &ProfileArgs,
    format: Format,
    p: &Profile,
    title: &str,
    active_ms: Option<u64>,
    step: u32,
) -> Result<(), Failure> {
    let data = match format {
        Format::Table => table(p, title, a.top as usize, active_ms).into_bytes(),
        Format::Folded => p.folded().into_bytes(),
        Format::Json => {
            let mut s = serde_json::to_string(p).unwrap_or_default();
            s.push('\n');
            s.into_bytes()
        }
        Format::Svg => crate::profile::flame::svg(p, title).into_bytes(),
        Format::Pprof => crate::profile::pprof::encode(p),
        Format::Speedscope => crate::profile::speedscope::encode(p, title).into_bytes(),
        Format::Html => {
            let text = table(p, title, a.top as usize, active_ms);
            crate::profile::report::profile(p, title, &text).into_bytes()
        }
    };
    write_out(a, format, &data, step).map(|_| ())
}

/// The table: a header line, the top call sites, what each library's
/// functions hold, and the known retainers among them.
fn table(p: &Profile, title: &str, top: usize, active_ms: Option<u64>) -> String {
    let mut s = format!(
        "{title}: {} live in {} allocations (estimated from one sample per {} allocated{})\n\n",
        signed_bytes(p.bytes),
        p.objects,
        bytes(1u64 << p.lg_sample.min(63)),
        active_ms.map_or(String::new(), |ms| format!(
            "; sampling on for {:.1} s",
            ms as f64 / 1000.0
        )),
    );
    s.push_str(&p.top_table(top));
    let libs = p.by_library();
    if !libs.is_empty() {
        let list: Vec<String> = libs
            .iter()
            .take(8)
            .map(|(l, b)| format!("{l} {}", signed_bytes(*b)))
            .collect();
        s.push_str(&format!("\nby library: {}\n", list.join(", ")));
    }
    let lines = p.by_python_line();
    if !lines.is_empty() {
        let total = p.bytes.unsigned_abs().max(1) as f64;
        let rows: Vec<Vec<String>> = lines
            .iter()
            .take(top.min(10))
            .map(|(l, b)| {
                vec![
                    signed_bytes(*b),
                    format!("{:.1}%", *b as f64 * 100.0 / total),
                    l.clone(),
                ]
            })
            .collect();
        s.push_str("\nby Python line (the innermost Python frame of each stack):\n");
        s.push_str(&crate::output::render::table(
            &["LIVE", "SHARE", "PYTHON LINE"],
            &rows,
        ));
        let stacks = p.by_python_stack();
        s.push_str("\nby Python stack (its innermost frames, outermost first):\n");
        for (st, b) in stacks.iter().take(5) {
            // The innermost five frames: where the program was.
            let frames: Vec<&str> = st.split(" > ").collect();
            let shown = frames[frames.len().saturating_sub(5)..].join(" > ");
            let more = if frames.len() > 5 { "... > " } else { "" };
            s.push_str(&format!("{:>10}  {more}{shown}\n", signed_bytes(*b)));
        }
    }
    let py = p.by_python();
    if !py.is_empty() {
        let list: Vec<String> = py
            .iter()
            .take(8)
            .map(|(f, b)| format!("{} {}", f.trim_start_matches("py::"), signed_bytes(*b)))
            .collect();
        s.push_str(&format!("by Python function: {}\n", list.join(", ")));
    }
    for r in crate::profile::retainers::found(p) {
        s.push_str(&format!("\n{r}\n"));
    }
    s.push_str("\nOnly allocations made while sampling was on are seen (docs/profile.md).\n");
    s
}

/// One `python_trace` request on a connection of its own; on a CPython
/// started without the preload, the same by ptrace, the first of them
/// saying on stderr how the process was reached.
fn ask_py(pid: i32, action: PyTraceAction, seconds: Option<u64>) -> Result<PyTraceReply, Failure> {
    use crate::reach::ptrace;
    if ptrace::applies(pid) {
        let (r, how) = ptrace::py_trace(pid, action, seconds)?;
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| errln!("memshim-ctl: {}", ptrace::reached_line(pid, &how)));
        return Ok(r);
    }
    let mut c = Client::open(pid)?;
    let req = Request::PythonTrace {
        action,
        frames: None,
        seconds,
        top: Some(10_000),
    };
    c.ask::<Box<PyTraceReply>>(&req).map(|r| *r)
}

/// What `--stop` did to `what` (`sampling`, `tracemalloc`): a line, or
/// with `--json` one document, `{"pid","sampling":"stopped"}`.
fn stop_line(format: Format, pid: i32, what: &str, outcome: &str) -> Result<(), Failure> {
    if format == Format::Json {
        outln!("{}", serde_json::json!({ "pid": pid, what: outcome }))
    } else {
        outln!("pid {pid}: {what} {outcome}")
    }
}

/// `profile --python`: tracemalloc started (bounded: the shim stops it
/// after the whole run plus a minute even if this command is killed),
/// snapshots by line, stopped again unless `--keep`.
fn run_python(a: &ProfileArgs, format: Format, pid: i32) -> Result<Exit, Failure> {
    if a.stop {
        let r = ask_py(pid, PyTraceAction::Stop, None)?;
        let what = match (r.changed, r.tracing) {
            (true, _) => "stopped",
            (false, true) => "is the program's own (left on)",
            (false, false) => "was off",
        };
        stop_line(format, pid, "tracemalloc", what)?;
        return Ok(exit::OK);
    }
    let state = ask_py(pid, PyTraceAction::Status, None)?;
    let wait = a
        .seconds
        .unwrap_or(if state.tracing { 0 } else { DEFAULT_SECONDS });
    // Ctrl-C or `timeout` wait from here on, also during the call that
    // starts the tracing: what this command starts, it stops before it
    // ends (below).
    let signals = (!a.keep).then(memshim_reach::Interruptible::hold);
    // With --keep, the cap: an hour.
    let started = ask_py(
        pid,
        PyTraceAction::Start,
        Some(bound(a, wait, MAX_PY_TRACE_SECONDS)),
    )?;
    if started.changed {
        errln!(
            "memshim-ctl: tracemalloc started in {pid}; Python allocations from now on are traced{}",
            if wait > 0 {
                format!(", for {wait} s")
            } else {
                String::new()
            }
        );
    }
    // What this command started, it stops, also when Ctrl-C or `timeout`
    // ends it during its wait: those signals wait for it meanwhile. Where
    // it started nothing, they take effect now.
    let ours = started.changed && !a.keep;
    let held = if ours { signals } else { None };
    let result = python_after(a, format, pid, wait, held.as_ref());
    if !ours {
        return result.map_err(Ended::failure);
    }
    let off = ask_py(pid, PyTraceAction::Stop, None).map(|_| ());
    match (result, held) {
        (Err(Ended::Signal(sig)), Some(held)) => {
            match off {
                Ok(()) => errln!("memshim-ctl: interrupted; tracemalloc stopped in {pid}"),
                Err(e) => errln!(
                    "memshim-ctl: interrupted; tracemalloc could not be stopped in {pid} ({}): memshim-ctl profile {pid} --python --stop",
                    e.message
                ),
            }
            held.end_with(sig)
        }
        (result, _) => switched_off(pid, result.map_err(Ended::failure), off),
    }
}

/// How `profile --python`'s steps ended early.
enum Ended {
    Failed(Failure),
    /// A signal that ends memshim-ctl came during a wait.
    Signal(i32),
}

impl From<Failure> for Ended {
    fn from(f: Failure) -> Ended {
        Ended::Failed(f)
    }
}

impl Ended {
    fn failure(self) -> Failure {
        match self {
            Ended::Failed(f) => f,
            Ended::Signal(sig) => Failure::new(exit::FAILED, None, format!("signal {sig}")),
        }
    }
}

/// Sleeps `d`, or until a signal that ends memshim-ctl comes (while
/// `held`).
fn nap(held: Option<&memshim_reach::Interruptible>, d: Duration) -> Result<(), Ended> {
    match held.and_then(|h| h.sleep(d)) {
        Some(sig) => Err(Ended::Signal(sig)),
        None if held.is_none() => {
            std::thread::sleep(d);
            Ok(())
        }
        None => Ok(()),
    }
}

fn python_after(
    a: &ProfileArgs,
    format: Format,
    pid: i32,
    wait: u64,
    held: Option<&memshim_reach::Interruptible>,
) -> Result<Exit, Ended> {
    nap(held, Duration::from_secs(wait))?;
    let mut prev = ask_py(pid, PyTraceAction::Snapshot, None)?;
    if prev.snapshot.is_none() {
        return Err(Ended::Failed(Failure::new(
            exit::FAILED,
            Some(pid),
            "tracemalloc is not tracing in the process (the program, or the shim at its deadline, stopped it)",
        )));
    }
    let top = a.top as usize;
    let Some(every) = a.every else {
        let text = match format {
            Format::Json => format!("{}\n", serde_json::to_string(&prev).unwrap_or_default()),
            _ => crate::profile::tracemalloc::report(pid, &prev, top),
        };
        return Ok(write_out(a, format, text.as_bytes(), 0)?);
    };
    for step in 1..=a.count {
        nap(held, Duration::from_secs_f64(every))?;
        let cur = ask_py(pid, PyTraceAction::Snapshot, None)?;
        let (Some(old), Some(new)) = (&prev.snapshot, &cur.snapshot) else {
            return Err(Ended::Failed(Failure::new(
                exit::FAILED,
                Some(pid),
                "tracemalloc stopped tracing in the process",
            )));
        };
        let rows = crate::profile::tracemalloc::growth(old, new);
        let total = new.bytes as i64 - old.bytes as i64;
        let text = match format {
            Format::Json => format!(
                "{}\n",
                serde_json::json!({ "pid": pid, "step": step, "growth_bytes": total, "lines": rows })
            ),
            _ => format!(
                "pid {pid}: growth {step} of {}, {every} s: {} by Python allocations\n\n{}{}",
                a.count,
                signed_bytes(total),
                crate::profile::tracemalloc::table_of(pid, &rows, total, top),
                crate::profile::tracemalloc::footer(&cur)
            ),
        };
        write_out(a, format, text.as_bytes(), step)?;
        prev = cur;
    }
    Ok(exit::OK)
}

/// Where `-o` sends what `step` writes, and whether it adds to the file:
/// the table and folded stacks of `--every` go one after another into FILE;
/// the other formats go one file per step ([`step_path`]).
fn output_for(a: &ProfileArgs, format: Format, step: u32) -> Option<(PathBuf, bool)> {
    let path = a.output.as_ref()?;
    Some(if step == 0 || format.streams() || is_stream(path) {
        (path.clone(), step > 1)
    } else {
        (step_path(path, step), false)
    })
}

/// Whether `-o PATH` is a stream that takes the steps one after another, as
/// stdout does, with no file to number: a FIFO, a terminal, a device, or a
/// name under /dev or /proc (`/dev/stdout`, `/proc/self/fd/1`, which may
/// lead to a regular file: the shell's `> out.bin`).
fn is_stream(path: &std::path::Path) -> bool {
    path.starts_with("/dev/")
        || path.starts_with("/proc/")
        || std::fs::metadata(path).is_ok_and(|m| !m.is_file())
}

/// A stream `-o` names ([`is_stream`]), opened once for all the steps of
/// `--every`: a FIFO's reader sees one stream to its end, where opening it
/// again for each step gave the reader an end of file after the first, and
/// the next step then waited for a reader that never came.
static STREAM: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// Writes to `-o FILE` ([`output_for`]) or stdout (where `--every` with
/// `--json` makes one JSON document a line).
fn write_out(a: &ProfileArgs, format: Format, data: &[u8], step: u32) -> Result<Exit, Failure> {
    use std::io::Write;
    match output_for(a, format, step) {
        Some((path, _)) if is_stream(&path) => {
            let mut stream = STREAM.lock().unwrap_or_else(|e| e.into_inner());
            if stream.is_none() {
                *stream = Some(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .write(true)
                        .truncate(true)
                        .open(&path)
                        .map_err(|e| cannot_write(a, &path, e))?,
                );
            }
            stream
                .as_mut()
                .map_or(Ok(()), |f| f.write_all(data).and_then(|()| f.flush()))
                .map_err(|e| cannot_write(a, &path, e))?
        }
        Some((path, append)) => std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&path)
            .and_then(|mut f| f.write_all(data))
            .map_err(|e| cannot_write(a, &path, e))?,
        None => crate::output::print::write_bytes(data)?,
    }
    Ok(exit::OK)
}

fn cannot_write(a: &ProfileArgs, path: &std::path::Path, e: std::io::Error) -> Failure {
    Failure::new(
        exit::FAILED,
        a.pid,
        format!("writing {}: {e}", path.display()),
    )
}

/// Checks the first file `-o` will be written to ([`crate::output::check_file`]),
/// so that a path that cannot be written fails before the sampling.
fn check_output(a: &ProfileArgs, format: Format) -> Result<(), Failure> {
    let first = if a.every.is_some() && a.diff.is_none() {
        1
    } else {
        0
    };
    let Some((path, _)) = output_for(a, format, first) else {
        return Ok(());
    };
    crate::output::check_file(&path).map_err(|e| cannot_write(a, &path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::step_path;
    use std::path::Path;

    #[test]
    fn a_growth_step_goes_before_the_extensions_of_the_file_name() {
        let at = |p: &str, n| step_path(Path::new(p), n).display().to_string();
        assert_eq!(at("leak.pb.gz", 1), "leak.1.pb.gz");
        assert_eq!(at("/tmp/a.b/heap.json", 12), "/tmp/a.b/heap.12.json");
        assert_eq!(at("heap", 2), "heap.2");
        assert_eq!(at(".hidden", 3), ".hidden.3");
        assert_eq!(at("out/.leak.svg", 1), "out/.leak.1.svg");
        assert_eq!(at("heap-2024.01.05.json", 1), "heap-2024.01.05.1.json");
        assert_eq!(at("x.speedscope.json", 2), "x.2.speedscope.json");
        assert_eq!(at("trace.tar", 1), "trace.1.tar");
        assert_eq!(at("äheap.json", 1), "äheap.1.json");
    }
}
