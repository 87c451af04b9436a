//! `memshim-ctl empty-cache <PID> [--json]`: `torch.cuda.empty_cache()` on
//! the devices the process already uses.

use super::{OneArgs, ask_one};
use crate::exit::{Exit, Failure};
use crate::output::render::{bytes, delta, ms};
use memshim_proto::{EmptyCacheResult, Request};

/// Options of `empty-cache`.
pub type EmptyCacheArgs = OneArgs;

/// Runs `empty-cache`.
pub fn run(a: EmptyCacheArgs) -> Result<Exit, Failure> {
    ask_one(&a, &Request::EmptyCache, |r: &EmptyCacheResult| {
        if let Some(why) = &r.skipped {
            return format!("nothing to do: {why}");
        }
        let devs: Vec<String> = r.devices.iter().map(|d| format!("cuda:{d}")).collect();
        format!(
            "emptied the CUDA cache of {} in {}; reserved {} -> {} ({})",
            if devs.is_empty() {
                "no device".to_owned()
            } else {
                devs.join(", ")
            },
            ms(r.elapsed_ms),
            bytes(r.reserved_before),
            bytes(r.reserved_after),
            delta(r.reserved_before, r.reserved_after)
        )
    })
}
