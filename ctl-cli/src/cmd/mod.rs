//! Subcommands, one file each, and what the multi-target ones share.
//!
//! Adding a subcommand (for example `run`, `doctor`, `metrics`, `serve`):
//!
//! 1. Create `cmd/<name>.rs` with a `#[derive(clap::Args, Debug)] pub struct
//!    <Name>Args` (its options, with doc comments: they are the `--help`
//!    text; arguments several commands share are in `args.rs`) and
//!    `pub fn run(args: <Name>Args) -> Result<Exit, Failure>`.
//!    Print data to stdout (`--json`: exactly one JSON document); return a
//!    `Failure` (exit.rs) for errors, never print them yourself.
//! 2. Add `pub mod <name>;` below.
//! 3. Add a variant `<Name>(cmd::<name>::<Name>Args)` with a one-line doc
//!    comment to `Command` in `cli.rs`, its `--json` flag (or `false`) to
//!    `Command::json` and its arm to `Command::run`.
//! 4. Add a parsing case to the tests in `cli.rs`.
//!
//! Shared helpers: `procfs` (process facts), `socket` (where a socket is),
//! `no_endpoint` (why there is none), `client::Client` (connect +
//! requests), `render` (sizes, tables), `out` (stdout, stderr), and
//! [`for_targets`] for commands that take `<PID>... | --all`.

pub mod attach;
pub mod cgroup;
pub mod decay;
pub mod doctor;
pub mod empty_cache;
pub mod gc;
pub mod list;
pub mod metrics;
pub mod profile;
pub mod purge;
pub mod reclaim;
pub mod record;
pub mod release;
pub mod run;
pub mod serve;
pub mod stats;
pub mod watch;

use crate::args::{Targets, pid_parser};
use crate::exit::{self, Exit, Failure};
use crate::output::print::{errln, outln, printable};
use crate::reach::client::Client;
use crate::reach::procfs;
use crate::reach::socket;
use memshim_proto::{Answer, Request};

/// Options of a command that asks one process one thing (`gc`,
/// `empty-cache`).
#[derive(clap::Args, Debug)]
pub struct OneArgs {
    /// Process id.
    #[arg(value_parser = pid_parser())]
    pub pid: i32,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Sends `req` to the process of `a` and prints its answer: the reply as
/// one JSON document with `--json`, else the line `line` makes of it.
pub fn ask_one<R: Answer + serde::Serialize>(
    a: &OneArgs,
    req: &Request,
    line: impl FnOnce(&R) -> String,
) -> Result<Exit, Failure> {
    let r: R = Client::open(a.pid)?.ask(req)?;
    if a.json {
        outln!("{}", serde_json::to_string(&r).unwrap_or_default())?;
    } else {
        outln!("pid {}: {}", a.pid, line(&r))?;
    }
    Ok(exit::OK)
}

/// Prints the answer of a one-process verb reached by ptrace
/// (`crate::reach::ptrace`), as [`ask_one`] prints a shimmed process's
/// (`line` makes the human line), with how it was reached: the line of
/// `reached_line`, or in JSON a `"reached"` field beside the answer's.
pub fn print_reached<R: serde::Serialize>(
    a: &OneArgs,
    r: &R,
    how: &crate::reach::ptrace::Reached,
    line: impl FnOnce(&R) -> String,
) -> Result<Exit, Failure> {
    if a.json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        v["reached"] = serde_json::json!(how);
        outln!("{v}")?;
    } else {
        outln!("pid {}: {}", a.pid, line(r))?;
        outln!("{}", crate::reach::ptrace::reached_line(a.pid, how))?;
    }
    Ok(exit::OK)
}

/// The outcome for one target of a multi-target command.
pub struct Outcome<T> {
    /// Pid as given.
    pub pid: i32,
    /// Command line, if the process was found.
    pub command: Option<String>,
    /// The answer or the failure.
    pub result: Result<T, Failure>,
}

/// Runs `f` on a connected client for every target: the given pids, or with
/// `--all` every shimmed process whose endpoint is up (others are skipped,
/// and listed by `memshim-ctl list`). Returns the outcomes and the exit
/// status: [`exit::OK`] if all succeeded; the target's own status if there
/// was exactly one, or if every one failed for the same kind of reason
/// (`purge 999998 999999`: [`exit::NOT_FOUND`]); [`exit::FAILED`] if some
/// of several failed. `--all` that finds no target is a failure of its own
/// ([`exit::NOT_FOUND`]): nothing was done.
pub fn for_targets<T>(
    t: &Targets,
    mut f: impl FnMut(&mut Client) -> Result<T, Failure>,
) -> Result<(Vec<Outcome<T>>, Exit), Failure> {
    let mut out = Vec::new();
    if t.all {
        for pid in procfs::all_pids() {
            let Ok(p) = procfs::read_proc(pid) else {
                continue;
            };
            if !matches!(procfs::shim_loaded(pid), Ok(true)) || pid == std::process::id() as i32 {
                continue;
            }
            if std::fs::symlink_metadata(socket::locate(&p).path()).is_err() {
                continue; // no endpoint: `list` says why
            }
            let command = Some(p.command.clone());
            let result = Client::open_proc(p).and_then(|mut c| f(&mut c));
            out.push(Outcome {
                pid,
                command,
                result,
            });
        }
    } else {
        for &pid in &t.pids {
            let command = procfs::read_proc(pid).ok().map(|p| p.command);
            let result = Client::open(pid).and_then(|mut c| f(&mut c));
            out.push(Outcome {
                pid,
                command,
                result,
            });
        }
    }
    if t.all && out.is_empty() {
        return Err(Failure::new(
            exit::NOT_FOUND,
            None,
            "--all found no shimmed process with a running control endpoint: nothing was done",
        )
        .hint("`memshim-ctl list` shows every shimmed process and why one has no endpoint"));
    }
    let exit = exit_of(&out);
    Ok((out, exit))
}

/// The exit status of several outcomes, as [`for_targets`] gives it.
pub fn exit_of<T>(out: &[Outcome<T>]) -> Exit {
    let failed: Vec<&Failure> = out.iter().filter_map(|o| o.result.as_ref().err()).collect();
    match (failed.len(), out.len()) {
        (0, _) => exit::OK,
        (n, m) if n == m && failed.iter().all(|f| f.exit == failed[0].exit) => failed[0].exit,
        _ => exit::FAILED,
    }
}

/// Prints the failures of a multi-target report to stderr (with `--json`
/// too, beside the document), then `extra` (failures found in answers,
/// such as a release step that could not run), then, unless `exit` is
/// success, the exit-code line every failing command ends with.
pub fn print_failures<T>(outcomes: &[Outcome<T>], extra: &[Failure], exit: Exit) {
    let failed = outcomes.iter().filter_map(|o| o.result.as_ref().err());
    for f in failed.chain(extra) {
        // Messages name paths and names other users' processes chose.
        errln!("memshim-ctl: error: {}", printable(&f.line()));
        if let Some(h) = &f.hint {
            errln!("  hint: {}", printable(h));
        }
    }
    if exit != exit::OK {
        errln!("{}", exit.line());
    }
}

/// JSON for one outcome: `{"pid":..,"command":..,"result":{..}}` or
/// `{"pid":..,"command":..,"error":{..}}`.
pub fn outcome_json<T: serde::Serialize>(o: &Outcome<T>) -> serde_json::Value {
    match &o.result {
        Ok(r) => serde_json::json!({"pid": o.pid, "command": o.command, "result": r}),
        Err(f) => serde_json::json!({"pid": o.pid, "command": o.command, "error": f}),
    }
}
