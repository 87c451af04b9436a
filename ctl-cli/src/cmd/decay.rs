//! `memshim-ctl decay <PID> [--dirty-ms N] [--muzzy-ms N] [--json]`.

use crate::args::pid_parser;
use crate::exit::{self, Exit, Failure};
use crate::output::print::outln;
use crate::reach::client::Client;
use clap::Args;
use memshim_proto::{DecayResult, Request};

/// Options of `decay`.
#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("change").required(true).multiple(true).args(["dirty_ms", "muzzy_ms"]))]
pub struct DecayArgs {
    /// Process id.
    #[arg(value_parser = pid_parser())]
    pub pid: i32,
    /// Milliseconds until freed pages are returned to the OS (-1: never).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::decay_ms)]
    pub dirty_ms: Option<i64>,
    /// Milliseconds MADV_FREE'd pages are kept (-1: never).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::decay_ms)]
    pub muzzy_ms: Option<i64>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `decay`.
pub fn run(a: DecayArgs) -> Result<Exit, Failure> {
    let mut c = Client::open(a.pid)?;
    let r: DecayResult = c.ask(&Request::Decay {
        dirty_ms: a.dirty_ms,
        muzzy_ms: a.muzzy_ms,
    })?;
    if a.json {
        outln!("{}", serde_json::to_string(&r).unwrap_or_default())?;
    } else {
        let show = |v: i64| {
            if v < 0 {
                "never".to_owned()
            } else {
                format!("{v} ms")
            }
        };
        outln!(
            "pid {}: dirty decay {}, muzzy decay {}",
            a.pid,
            show(r.dirty_decay_ms),
            show(r.muzzy_decay_ms)
        )?;
    }
    Ok(exit::OK)
}
