//! `memshim-ctl gc <PID> [--json]`: a full `gc.collect()` in a Python process.

use super::{OneArgs, ask_one};
use crate::exit::{Exit, Failure};
use crate::output::render::{bytes, delta, ms};
use memshim_proto::{GcResult, Request};

/// Options of `gc`.
pub type GcArgs = OneArgs;

/// Runs `gc`.
pub fn run(a: GcArgs) -> Result<Exit, Failure> {
    ask_one(&a, &Request::Gc, |r: &GcResult| {
        format!(
            "gc.collect() found {} unreachable objects in {}; rss {} -> {} ({})",
            r.collected,
            ms(r.elapsed_ms),
            bytes(r.rss_before),
            bytes(r.rss_after),
            delta(r.rss_before, r.rss_after)
        )
    })
}
