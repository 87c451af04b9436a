//! `memshim-ctl gc <PID> [--json]`: a full `gc.collect()` in a Python process.

use crate::args::pid_parser;
use crate::client::Client;
use crate::exit::{self, Exit, Failure};
use crate::out::outln;
use crate::render::{bytes, delta, ms};
use clap::Args;
use memshim_proto::{Reply, Request};

/// Options of `gc`.
#[derive(Args, Debug)]
pub struct GcArgs {
    /// Process id.
    #[arg(value_parser = pid_parser())]
    pub pid: i32,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `gc`.
pub fn run(a: GcArgs) -> Result<Exit, Failure> {
    let mut c = Client::open(a.pid)?;
    let r = match c.request(&Request::Gc)? {
        Reply::Gc(r) => r,
        other => return Err(c.unexpected(&other)),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&r).unwrap_or_default())?;
    } else {
        outln!(
            "pid {}: gc.collect() found {} unreachable objects in {}; rss {} -> {} ({})",
            a.pid,
            r.collected,
            ms(r.elapsed_ms),
            bytes(r.rss_before),
            bytes(r.rss_after),
            delta(r.rss_before, r.rss_after)
        )?;
    }
    Ok(exit::OK)
}
