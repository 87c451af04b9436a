//! `memshim-ctl release <PID>... | --all [--json]`: gc, empty-cache, purge.

use super::{Outcome, for_targets, outcome_json, print_failures};
use crate::cli::Targets;
use crate::exit::{Exit, Failure};
use crate::render::{bytes, delta, ms, table};
use clap::Args;
use memshim_proto::{ReleaseResult, ReleaseStepKind, Reply, Request};

/// Options of `release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// Which processes.
    #[command(flatten)]
    pub targets: Targets,
}

/// Runs `release`.
pub fn run(a: ReleaseArgs) -> Result<Exit, Failure> {
    let (outcomes, exit) = for_targets(&a.targets, |c| match c.request(&Request::Release)? {
        Reply::Release(r) => Ok(r),
        other => Err(c.unexpected(&other)),
    });
    if a.targets.json {
        let v: Vec<_> = outcomes.iter().map(outcome_json).collect();
        println!("{}", serde_json::json!({ "release": v }));
    } else {
        print!("{}", human(&outcomes));
        print_failures(&outcomes);
    }
    Ok(exit)
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
        let rows: Vec<Vec<String>> = r
            .steps
            .iter()
            .map(|s| {
                let name = match s.step {
                    ReleaseStepKind::Gc => "gc",
                    ReleaseStepKind::EmptyCache => "empty-cache",
                    ReleaseStepKind::Purge => "purge",
                };
                match &s.skipped {
                    Some(why) => vec![
                        name.into(),
                        s.measure.clone(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        format!("skipped: {why}"),
                    ],
                    None => vec![
                        name.into(),
                        s.measure.clone(),
                        bytes(s.before),
                        bytes(s.after),
                        delta(s.before, s.after),
                        ms(s.elapsed_ms),
                    ],
                }
            })
            .collect();
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
    use memshim_proto::ReleaseStep;

    #[test]
    fn release_shows_each_step() {
        let step = |step, before, after, skipped: Option<&str>| ReleaseStep {
            step,
            measure: "rss".into(),
            before,
            after,
            elapsed_ms: 1.0,
            skipped: skipped.map(str::to_owned),
        };
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
            h.contains("empty-cache") && h.contains("skipped: torch is not imported"),
            "{h}"
        );
        assert!(h.contains("-924.0 MiB"), "{h}");
    }
}
