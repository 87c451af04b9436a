//! `memshim-ctl reclaim [PID] [--to SIZE] [--gc] [--json]`: purges every
//! shimmed process of PID's memory cgroup (with `--gc`, a `release`: gc,
//! CUDA caches, purge), then asks the kernel to reclaim the cgroup's page
//! cache (v2 `memory.reclaim`, v1 `memory.force_empty`), and shows each
//! part of the charge before and after. With `--to SIZE`, the page cache is
//! reclaimed in batches until usage is under SIZE; where that cannot be
//! reached, it says what is left and who holds it, and exits
//! [`exit::NOT_REACHED`] (an in-place resize of a pod's limit below its
//! usage is refused by the kubelet: docs/deploy.md).
//!
//! Nothing is done unless the kernel step can be done: a read-only cgroup
//! filesystem (inside a container) or missing permission fails first.

use super::{Outcome, outcome_json, purge, release};
use crate::args::{pid_parser, size_parser};
use crate::cgroup::charge::{self, Charge, Parts};
use crate::cgroup::{
    self,
    fs::{KernelStep, Location},
};
use crate::exit::{self, Exit, Failure};
use crate::output::print::{out, outln, printable};
use crate::output::render::{bytes, delta, ms, table};
use crate::reach::client::Client;
use clap::Args;
use memshim_proto::cgroup::CgroupMemory;
use memshim_proto::{Answer, Request};
use serde::Serialize;

/// Options of `reclaim`.
#[derive(Args, Debug)]
pub struct ReclaimArgs {
    /// Process id; without it, memshim-ctl's own cgroup (in a container: the container's).
    #[arg(value_parser = pid_parser())]
    pub pid: Option<i32>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Reclaim until the cgroup's usage is at most SIZE (bytes, or with K,
    /// M, G, T: 512M, 2G); exits [`exit::NOT_REACHED`] with what is left
    /// and who holds it where that cannot be reached (`--help`: [`to_help`]).
    #[arg(long, value_name = "SIZE", value_parser = size_parser(), help = to_help())]
    pub to: Option<u64>,
    /// Run `release` in each shimmed process (Python's gc, PyTorch's
    /// caches, then purge) instead of `purge` alone.
    #[arg(long)]
    pub gc: bool,
}

/// A shimmed process that was not purged, and why.
#[derive(Debug, Serialize)]
pub struct Skipped {
    /// Pid.
    pub pid: i32,
    /// Command line.
    pub command: String,
    /// Why.
    pub reason: String,
}

/// The charge at one moment.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    /// The kernel's figures.
    pub memory: CgroupMemory,
    /// The parts.
    pub parts: Parts,
}

fn snapshot(c: &Charge) -> Snapshot {
    Snapshot {
        memory: c.memory,
        parts: charge::parts(c, None),
    }
}

/// `--to`'s `--help` line, its exit status from proto's table.
fn to_help() -> String {
    format!(
        "Reclaim until the cgroup's usage is at most SIZE (bytes, or with K, M, G, T: 512M, 2G); \
         exits {} with what is left and who holds it where that cannot be reached",
        exit::NOT_REACHED.code
    )
}

/// Runs `reclaim`.
pub fn run(a: ReclaimArgs) -> Result<Exit, Failure> {
    if a.gc {
        reclaim(a, Request::Release, "release", release::human)
    } else {
        reclaim(a, Request::Purge, "purge", purge::human)
    }
}

/// `reclaim` with `request` (`purge`, or `release` for `--gc`) asked of
/// each shimmed process; the answers go under `key` in `--json` and are
/// shown by `human_answers`.
fn reclaim<R: Answer + Serialize>(
    a: ReclaimArgs,
    request: Request,
    key: &str,
    human_answers: fn(&[Outcome<R>]) -> String,
) -> Result<Exit, Failure> {
    let loc = cgroup::fs::locate(a.pid)?;
    let before = charge::read(&loc, a.pid)?;
    cgroup::fs::check_writable(&loc, a.pid)?;

    let mut answers: Vec<Outcome<R>> = vec![];
    let mut skipped = vec![];
    for p in &before.processes {
        // A process whose socket did not answer `stats` a moment ago
        // failed; it is not asked again (it would cost another timeout).
        let result = if p.endpoint {
            Some(Client::open(p.pid).and_then(|mut c| c.ask(&request)))
        } else {
            p.failure.clone().map(Err)
        };
        if let Some(result) = result {
            // A process that exited meanwhile has nothing left to purge
            // (a zombie too: `release`'s gc can end a program whose
            // finalizer exits).
            let gone = result.as_ref().is_err_and(|f| f.exit == exit::NOT_FOUND)
                && crate::reach::procfs::all_threads_exited(p.pid);
            if gone {
                skipped.push(Skipped {
                    pid: p.pid,
                    command: p.command.clone(),
                    reason: "exited meanwhile".into(),
                });
                continue;
            }
            answers.push(Outcome {
                pid: p.pid,
                command: Some(p.command.clone()),
                result,
            });
        } else if p.shim != "no" {
            skipped.push(Skipped {
                pid: p.pid,
                command: p.command.clone(),
                reason: p.reason.clone().unwrap_or_default(),
            });
        }
    }
    // What the kernel is asked for is the page cache as it is now.
    let kernel = match a.to {
        Some(target) => {
            cgroup::fs::reclaim_kernel_to(&loc, target, cgroup::fs::swap_enabled(), a.pid)?
        }
        None => {
            let now = cgroup::fs::read_memory(&loc, a.pid)?;
            cgroup::fs::reclaim_kernel(&loc, &now, cgroup::fs::swap_enabled(), a.pid)?
        }
    };
    let after = charge::read(&loc, a.pid)?;

    let failed = answers.iter().any(|o| o.result.is_err()) || kernel.outcome == "unsupported";
    let short = a.to.filter(|&t| after.memory.usage > t);
    let exit = match (short, failed) {
        (Some(_), _) => exit::NOT_REACHED,
        (None, true) => exit::FAILED,
        (None, false) => exit::OK,
    };
    if a.json {
        let mut doc = serde_json::json!({
            "pid": a.pid,
            "cgroup": loc,
            "skipped": skipped,
            "kernel": kernel,
            "before": snapshot(&before),
            "after": snapshot(&after),
            "to": a.to,
            "reached": a.to.map(|t| after.memory.usage <= t),
            "left": short.map(|t| after.memory.usage - t),
        });
        doc[key] = answers.iter().map(outcome_json).collect();
        outln!("{doc}")?;
    } else {
        out!(
            "{}",
            human(
                &loc,
                key,
                (!answers.is_empty())
                    .then(|| human_answers(&answers))
                    .as_deref(),
                &skipped,
                &kernel,
                &before,
                &after
            )
        )?;
        if let Some(t) = short {
            out!("{}", left_lines(t, &after))?;
        }
    }
    let mut kernel_failed: Vec<Failure> = (kernel.outcome == "unsupported")
        .then(|| {
            Failure::new(
                exit::FAILED,
                a.pid,
                format!(
                    "the kernel cannot reclaim this cgroup's page cache here: {} does not exist",
                    kernel.file
                ),
            )
        })
        .into_iter()
        .collect();
    if let Some(t) = short {
        kernel_failed.push(
            Failure::new(
                exit::NOT_REACHED,
                a.pid,
                format!(
                    "usage is {} after reclaim, over the {} asked: what is left is in use",
                    bytes(after.memory.usage),
                    bytes(t)
                ),
            )
            .hint(if a.gc {
                "the processes listed hold it; stop one, or ask for more".to_owned()
            } else {
                "the processes listed hold it; `--gc` also runs Python's gc and empties PyTorch's caches".to_owned()
            }),
        );
    }
    super::print_failures(&answers, &kernel_failed, exit);
    Ok(exit)
}

/// What is left over the size asked, and who holds it: the charge's parts
/// and the cgroup's processes, largest first.
fn left_lines(target: u64, after: &Charge) -> String {
    let mut out = format!(
        "\nleft: {} over the {} asked (usage {}); in use by\n",
        bytes(after.memory.usage - target),
        bytes(target),
        bytes(after.memory.usage)
    );
    let mut procs = after.processes.clone();
    procs.sort_by_key(|p| std::cmp::Reverse(p.rss));
    out += &super::cgroup::processes_lines(&procs);
    out
}

/// The kernel step in one line, and its note.
fn kernel_lines(k: &KernelStep) -> String {
    let mut out = match (&k.wrote, k.outcome) {
        (Some(w), o) => format!(
            "kernel: wrote {w:?} to {} in {}: {o}\n",
            k.file,
            ms(k.elapsed_ms)
        ),
        (None, o) => format!("kernel: {} {o}\n", k.file),
    };
    if let Some(n) = &k.note {
        out += &format!("  {n}\n");
    }
    out
}

/// Before/after rows: usage, working set, then every part both report.
pub fn compare(before: &Charge, after: &Charge) -> String {
    let (b, a) = (charge::parts(before, None), charge::parts(after, None));
    let (bm, am) = (&before.memory, &after.memory);
    let dashboards = [
        ("usage", bm.usage, am.usage, "dashboards"),
        ("working set", bm.working_set, am.working_set, "dashboards"),
    ];
    let parts = b.rows().into_iter().zip(a.rows()).filter_map(|(rb, ra)| {
        let label = format!("{}{}", "  ".repeat(rb.1), rb.2);
        Some((label, rb.4.bytes?, ra.4.bytes?, rb.4.action))
    });
    let rows: Vec<Vec<String>> = dashboards
        .into_iter()
        .map(|(l, x, y, by)| (l.to_owned(), x, y, by))
        .chain(parts)
        .map(|(label, x, y, by)| vec![label, bytes(x), bytes(y), delta(x, y), by.to_owned()])
        .collect();
    table(&["PART", "BEFORE", "AFTER", "CHANGE", "BY"], &rows)
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect()
}

/// The human report; `answers` shows what each shimmed process answered
/// (`step`: `purge`, or `release` with `--gc`), `None` where none was asked.
pub fn human(
    loc: &Location,
    step: &str,
    answers: Option<&str>,
    skipped: &[Skipped],
    kernel: &KernelStep,
    before: &Charge,
    after: &Charge,
) -> String {
    let mut out = format!(
        "memory cgroup {} (v{}, {})\n\n",
        printable(&loc.path),
        loc.version,
        printable(&loc.dir.display().to_string())
    );
    if let Some(answers) = answers {
        out += &format!("{step}:\n");
        out += &answers
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>();
    } else {
        out += &format!("{step}: no shimmed process with a running endpoint in this cgroup\n");
    }
    for s in skipped {
        out += &format!(
            "  skipped pid {} ({}): {}\n",
            s.pid,
            printable(&s.command),
            printable(&s.reason)
        );
    }
    out += &kernel_lines(kernel);
    out += "\n";
    out += &compare(before, after);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn charge(usage: u64, cache: u64, anon: u64) -> Charge {
        Charge {
            memory: CgroupMemory {
                version: 1,
                usage,
                working_set: usage - cache / 2,
                anon,
                page_cache: cache,
                active_file: cache / 2,
                inactive_file: cache / 2,
                kernel: Some(1 << 20),
                ..Default::default()
            },
            processes: vec![],
            hidden: 0,
        }
    }

    #[test]
    fn before_and_after_show_every_part_with_its_change() {
        let loc = Location {
            version: 1,
            path: "/t".into(),
            dir: PathBuf::from("/sys/fs/cgroup/memory/t"),
            mount_point: PathBuf::from("/sys/fs/cgroup/memory"),
            read_only: false,
            searched: false,
        };
        let k = KernelStep {
            file: "/sys/fs/cgroup/memory/t/memory.force_empty".into(),
            wrote: Some("0".into()),
            requested: None,
            batches: None,
            outcome: "done",
            elapsed_ms: 3.0,
            note: None,
        };
        let h = human(
            &loc,
            "purge",
            None,
            &[],
            &k,
            &charge(100 << 20, 64 << 20, 30 << 20),
            &charge(36 << 20, 0, 30 << 20),
        );
        for want in [
            "memory cgroup /t (v1, /sys/fs/cgroup/memory/t)",
            "purge: no shimmed process with a running endpoint in this cgroup",
            "kernel: wrote \"0\" to /sys/fs/cgroup/memory/t/memory.force_empty in 3.00 ms: done",
            "PART",
            "  usage                 100.0 MiB  36.0 MiB  -64.0 MiB  dashboards",
            "  page cache             64.0 MiB       0 B  -64.0 MiB  reclaim",
            "  anon                   30.0 MiB  30.0 MiB       ±0 B  none",
        ] {
            assert!(h.contains(want), "missing {want:?} in\n{h}");
        }
    }
}
