//! `memshim-ctl empty-cache <PID> [--json]`: `torch.cuda.empty_cache()` on
//! the devices the process already uses.

use crate::args::pid_parser;
use crate::client::Client;
use crate::exit::{self, Exit, Failure};
use crate::out::outln;
use crate::render::{bytes, delta, ms};
use clap::Args;
use memshim_proto::{Reply, Request};

/// Options of `empty-cache`.
#[derive(Args, Debug)]
pub struct EmptyCacheArgs {
    /// Process id.
    #[arg(value_parser = pid_parser())]
    pub pid: i32,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `empty-cache`.
pub fn run(a: EmptyCacheArgs) -> Result<Exit, Failure> {
    let mut c = Client::open(a.pid)?;
    let r = match c.request(&Request::EmptyCache)? {
        Reply::EmptyCache(r) => r,
        other => return Err(c.unexpected(&other)),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&r).unwrap_or_default())?;
    } else if let Some(why) = &r.skipped {
        outln!("pid {}: nothing to do: {why}", a.pid)?;
    } else {
        let devs: Vec<String> = r.devices.iter().map(|d| format!("cuda:{d}")).collect();
        outln!(
            "pid {}: emptied the CUDA cache of {} in {}; reserved {} -> {} ({})",
            a.pid,
            if devs.is_empty() {
                "no device".to_owned()
            } else {
                devs.join(", ")
            },
            ms(r.elapsed_ms),
            bytes(r.reserved_before),
            bytes(r.reserved_after),
            delta(r.reserved_before, r.reserved_after)
        )?;
    }
    Ok(exit::OK)
}
