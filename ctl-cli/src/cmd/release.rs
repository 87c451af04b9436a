//! `memshim-ctl release <PID>... | --all [--json]`: gc, empty-cache, purge.

use super::{Outcome, exit_of, for_targets, outcome_json, print_failures};
use crate::args::Targets;
use crate::exit::{self, Exit, Failure};
use crate::output::print::{out, outln};
use crate::output::render::{bytes, delta, ms, table};
use crate::reach::client::Client;
use clap::Args;
use memshim_proto::{ReleaseResult, Request, StepOutcome};

/// Options of `release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// Which processes.
    #[command(flatten)]
    pub targets: Targets,
}

/// Runs `release`. A process whose release had a step that could not run
/// or failed counts as failed ([`exit::PYTHON_STEP`] for a single target), though what the
/// other steps did is reported as usual.
pub fn run(a: ReleaseArgs) -> Result<Exit, Failure> {
    use crate::reach::ptrace;
    // Given pids: a CPython started without the preload is reached by
    // ptrace (reach/ptrace/), any other over its socket, as
    // `for_targets` does; `--all` is the shimmed processes only.
    let mut reached = Vec::new();
    let (outcomes, exit) = if a.targets.all {
        for_targets(&a.targets, |c| c.ask::<ReleaseResult>(&Request::Release))?
    } else {
        let outcomes: Vec<Outcome<ReleaseResult>> = a
            .targets
            .pids
            .iter()
            .map(|&pid| Outcome {
                pid,
                command: crate::reach::procfs::read_proc(pid).ok().map(|p| p.command),
                result: if ptrace::applies(pid) {
                    ptrace::release(pid).map(|(r, how)| {
                        reached.push((pid, how));
                        r
                    })
                } else {
                    Client::open(pid).and_then(|mut c| c.ask(&Request::Release))
                },
            })
            .collect();
        let exit = exit_of(&outcomes);
        (outcomes, exit)
    };
    let partial: Vec<Failure> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().ok().map(|r| (o.pid, r)))
        .flat_map(|(pid, r)| step_failures(pid, r))
        .collect();
    let exit = overall(exit, outcomes.len(), &outcomes, !partial.is_empty());
    if a.targets.json {
        let v: Vec<_> = outcomes
            .iter()
            .map(|o| {
                let mut v = outcome_json(o);
                if let Some((_, how)) = reached.iter().find(|(pid, _)| *pid == o.pid) {
                    v["reached"] = serde_json::json!(how);
                }
                v
            })
            .collect();
        outln!("{}", serde_json::json!({ "release": v }))?;
    } else {
        out!("{}", human(&outcomes))?;
        for (pid, how) in &reached {
            outln!("{}", ptrace::reached_line(*pid, how))?;
        }
    }
    print_failures(&outcomes, &partial, exit);
    Ok(exit)
}

/// A failure for each step of `r` that could not run or failed.
fn step_failures(pid: i32, r: &ReleaseResult) -> impl Iterator<Item = Failure> + '_ {
    r.failed_steps().map(move |s| {
        Failure::new(
            exit::PYTHON_STEP,
            Some(pid),
            format!(
                "release: the {} step could not run: {}",
                s.name(),
                s.error.as_deref().unwrap_or("no reason given")
            ),
        )
    })
}

/// The exit status: a process with a failed step counts as a failed target.
fn overall(exit: Exit, targets: usize, outcomes: &[Outcome<ReleaseResult>], partial: bool) -> Exit {
    if !partial {
        return exit;
    }
    let bad = outcomes
        .iter()
        .filter(|o| {
            o.result
                .as_ref()
                .map_or(true, |r| r.failed_steps().next().is_some())
        })
        .count();
    if targets == 1 && bad == 1 {
        exit::PYTHON_STEP
    } else {
        exit::FAILED
    }
}

/// The human form: one block per process, one row per step.
pub fn human(outcomes: &[Outcome<ReleaseResult>]) -> String {
    let mut out = String::new();
    if outcomes.is_empty() {
        return "no shimmed process with a running endpoint\n".into();
    }
    for o in outcomes {
        let Ok(r) = &o.result else { continue };
        out += &format!(
            "pid {} ({}): rss {} -> {} (released {}) in {}\n",
            o.pid,
            o.command.as_deref().unwrap_or("?"),
            bytes(r.rss_before),
            bytes(r.rss_after),
            bytes(r.released),
            ms(r.elapsed_ms)
        );
        let mut rows: Vec<Vec<String>> = Vec::new();
        for s in &r.steps {
            let name = s.name().to_owned();
            let not_run = |what: String| {
                vec![
                    name.clone(),
                    s.measure.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    what,
                ]
            };
            rows.push(match s.outcome {
                StepOutcome::Failed => not_run(format!(
                    "FAILED: {}",
                    s.error.as_deref().unwrap_or("no reason given")
                )),
                StepOutcome::NothingToDo => not_run(format!(
                    "nothing to do: {}",
                    s.skipped.as_deref().unwrap_or("-")
                )),
                StepOutcome::Done => vec![
                    name.clone(),
                    s.measure.clone(),
                    bytes(s.before),
                    bytes(s.after),
                    delta(s.before, s.after),
                    ms(s.elapsed_ms),
                ],
            });
            // A CUDA step on more than one device: one row per device.
            if s.devices.len() > 1 {
                for d in &s.devices {
                    rows.push(vec![
                        format!("  cuda:{}", d.index),
                        String::new(),
                        bytes(d.before),
                        bytes(d.after),
                        delta(d.before, d.after),
                        String::new(),
                    ]);
                }
            }
        }
        for line in table(
            &["STEP", "MEASURE", "BEFORE", "AFTER", "CHANGE", "TIME"],
            &rows,
        )
        .lines()
        {
            out += &format!("  {line}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memshim_proto::{ReleaseStep, ReleaseStepKind};

    fn step(step: ReleaseStepKind, before: u64, after: u64, skipped: Option<&str>) -> ReleaseStep {
        let mut s = ReleaseStep::new(step, "rss");
        (s.before, s.after, s.elapsed_ms) = (before, after, 1.0);
        match skipped {
            Some(why) => s.nothing_to_do(why),
            None => s,
        }
    }

    #[test]
    fn release_shows_each_step() {
        let o = vec![Outcome {
            pid: 5,
            command: Some("python3 x.py".into()),
            result: Ok(ReleaseResult {
                rss_before: 1 << 30,
                rss_after: 100 << 20,
                released: 924 << 20,
                elapsed_ms: 50.0,
                steps: vec![
                    step(ReleaseStepKind::Gc, 1 << 30, 1 << 30, None),
                    step(
                        ReleaseStepKind::EmptyCache,
                        0,
                        0,
                        Some("torch is not imported"),
                    ),
                    step(ReleaseStepKind::Purge, 1 << 30, 100 << 20, None),
                ],
            }),
        }];
        let h = human(&o);
        assert!(
            h.starts_with(
                "pid 5 (python3 x.py): rss 1.00 GiB -> 100.0 MiB (released 924.0 MiB) in 50 ms\n"
            ),
            "{h}"
        );
        assert!(
            h.contains("empty-cache") && h.contains("nothing to do: torch is not imported"),
            "{h}"
        );
        assert!(h.contains("-924.0 MiB"), "{h}");
        assert_eq!(overall(exit::OK, 1, &o, false), exit::OK);
    }

    #[test]
    fn a_failed_step_is_shown_and_fails_the_command() {
        let mut gc = step(ReleaseStepKind::Gc, 0, 0, None);
        gc.outcome = StepOutcome::Failed;
        gc.error = Some("CPython was busy".into());
        let ok = ReleaseResult {
            steps: vec![step(ReleaseStepKind::Purge, 2, 1, None)],
            ..Default::default()
        };
        let bad = ReleaseResult {
            steps: vec![gc, step(ReleaseStepKind::Purge, 2, 1, None)],
            ..Default::default()
        };
        let one = |pid, r| Outcome {
            pid,
            command: None,
            result: Ok(r),
        };
        let o = vec![one(5, bad.clone())];
        assert!(
            human(&o).contains("FAILED: CPython was busy"),
            "{}",
            human(&o)
        );
        assert_eq!(overall(exit::OK, 1, &o, true), exit::PYTHON_STEP);
        let o = vec![one(5, bad), one(6, ok)];
        assert_eq!(overall(exit::OK, 2, &o, true), exit::FAILED);
    }

    #[test]
    fn a_cuda_step_on_two_devices_shows_each() {
        let mut ec = step(ReleaseStepKind::EmptyCache, 3 << 30, 1 << 30, None);
        ec.devices = vec![
            memshim_proto::DeviceChange {
                index: 0,
                before: 2 << 30,
                after: 1 << 30,
            },
            memshim_proto::DeviceChange {
                index: 1,
                before: 1 << 30,
                after: 0,
            },
        ];
        let o = vec![Outcome {
            pid: 5,
            command: None,
            result: Ok(ReleaseResult {
                steps: vec![ec],
                ..Default::default()
            }),
        }];
        let h = human(&o);
        assert!(h.contains("cuda:0") && h.contains("cuda:1"), "{h}");
        assert!(h.contains("-1.00 GiB"), "{h}");
    }
}
