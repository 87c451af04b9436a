//! `memshim-ctl empty-cache <PID> [--json]`: `torch.cuda.empty_cache()` on
//! the devices the process already uses.

use super::{OneArgs, ask_one, print_reached};
use crate::exit::{Exit, Failure};
use crate::output::render::{bytes, delta, ms};
use memshim_proto::{EmptyCacheResult, Request};

/// Options of `empty-cache`.
pub type EmptyCacheArgs = OneArgs;

/// Runs `empty-cache`: over the socket of a shimmed process, by ptrace on
/// a CPython started without the preload (`crate::reach`).
pub fn run(a: EmptyCacheArgs) -> Result<Exit, Failure> {
    if crate::reach::ptrace::applies(a.pid) {
        let (r, how) = crate::reach::ptrace::empty_cache(a.pid)?;
        return print_reached(&a, &r, &how, line);
    }
    ask_one(&a, &Request::EmptyCache, line)
}

fn line(r: &EmptyCacheResult) -> String {
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
}
