//! `memshim-ctl purge <PID>... | --all [--json]`.

use super::{Outcome, for_targets, outcome_json, print_failures};
use crate::args::Targets;
use crate::exit::{Exit, Failure};
use crate::output::print::{out, outln};
use crate::output::render::{bytes, ms, shorten, table};
use clap::Args;
use memshim_proto::{PurgeResult, Request};

/// Options of `purge`.
#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Which processes.
    #[command(flatten)]
    pub targets: Targets,
}

/// Runs `purge`.
pub fn run(a: PurgeArgs) -> Result<Exit, Failure> {
    let (outcomes, exit) = for_targets(&a.targets, |c| c.ask::<PurgeResult>(&Request::Purge))?;
    if a.targets.json {
        let v: Vec<_> = outcomes.iter().map(outcome_json).collect();
        outln!("{}", serde_json::json!({ "purge": v }))?;
    } else {
        out!("{}", human(&outcomes))?;
    }
    print_failures(&outcomes, &[], exit);
    Ok(exit)
}

/// The human table of purge results.
pub fn human(outcomes: &[Outcome<PurgeResult>]) -> String {
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .filter_map(|o| {
            let r = o.result.as_ref().ok()?;
            Some(vec![
                o.pid.to_string(),
                bytes(r.rss_before),
                bytes(r.rss_after),
                bytes(r.released),
                ms(r.elapsed_ms),
                shorten(o.command.as_deref().unwrap_or(""), 40),
            ])
        })
        .collect();
    if rows.is_empty() {
        return if outcomes.is_empty() {
            "no shimmed process with a running endpoint\n".into()
        } else {
            String::new()
        };
    }
    table(
        &[
            "PID",
            "RSS BEFORE",
            "RSS AFTER",
            "RELEASED",
            "TIME",
            "COMMAND",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_table() {
        let o = vec![Outcome {
            pid: 9,
            command: Some("app".into()),
            result: Ok(PurgeResult {
                rss_before: 1 << 30,
                rss_after: 100 << 20,
                released: (1 << 30) - (100 << 20),
                elapsed_ms: 41.0,
                ..Default::default()
            }),
        }];
        assert_eq!(
            human(&o),
            "PID  RSS BEFORE  RSS AFTER   RELEASED   TIME  COMMAND\n  9    1.00 GiB  100.0 MiB  924.0 MiB  41 ms  app\n"
        );
    }
}
