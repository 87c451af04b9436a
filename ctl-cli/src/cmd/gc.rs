//! `memshim-ctl gc <PID> [--json]`: a full `gc.collect()` in a Python process.

use crate::args::pid_parser;
use crate::client::Client;
use crate::exit::{Exit, Failure};
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
    // A CPython started without the preload: reached by ptrace (reach.rs).
    let mut reached = None;
    let r = if crate::reach::applies(a.pid) {
        let (r, how) = crate::reach::gc(a.pid)?;
        reached = Some(how);
        r
    } else {
        let mut c = Client::open(a.pid)?;
        match c.request(&Request::Gc)? {
            Reply::Gc(r) => r,
            other => return Err(c.unexpected(&other)),
        }
    };
    if a.json {
        let mut v = serde_json::to_value(&r).unwrap_or_default();
        if let Some(how) = &reached {
            v["reached"] = serde_json::json!(how);
        }
        outln!("{v}")?;
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
        if let Some(how) = &reached {
            outln!("{}", crate::reach::reached_line(a.pid, how))?;
        }
    }
    Ok(Exit::Ok)
}
