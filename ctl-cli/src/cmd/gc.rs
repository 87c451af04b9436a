//! `memshim-ctl gc <PID> [--json]`: a full `gc.collect()` in a Python process.

use super::{OneArgs, ask_one, print_reached};
use crate::exit::{Exit, Failure};
use crate::output::render::{bytes, delta, ms};
use memshim_proto::{GcResult, Request};

/// Options of `gc`.
pub type GcArgs = OneArgs;

/// Runs `gc`: over the socket of a shimmed process, by ptrace on a CPython
/// started without the preload (`crate::reach`).
pub fn run(a: GcArgs) -> Result<Exit, Failure> {
    if crate::reach::ptrace::applies(a.pid) {
        let (r, how) = crate::reach::ptrace::gc(a.pid)?;
        return print_reached(&a, &r, &how, line);
    }
    ask_one(&a, &Request::Gc, line)
}

fn line(r: &GcResult) -> String {
    format!(
        "gc.collect() found {} unreachable objects in {}; rss {} -> {} ({})",
        r.collected,
        ms(r.elapsed_ms),
        bytes(r.rss_before),
        bytes(r.rss_after),
        delta(r.rss_before, r.rss_after)
    )
}
