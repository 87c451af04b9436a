//! `detach`: the attached bridge's thread stops after this answer, and its
//! socket closes (thread/run.rs reads [`asked`]). The preloaded shim refuses: its thread
//! returns the memory of the allocator the shim is, for the process's life.

use super::super::facts::Ctx;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};
use memshim_proto::*;

/// A `detach` was answered: the thread leaves its loop (thread/run.rs).
static ASKED: AtomicBool = AtomicBool::new(false);

/// Whether `detach` was answered.
pub fn asked() -> bool {
    ASKED.load(Relaxed)
}

/// `detach`.
#[cfg(memshim_bridge)]
pub fn handle(ctx: &Ctx<'_>) -> Result<DetachResult, ErrorReply> {
    ASKED.store(true, Relaxed);
    Ok(DetachResult {
        idle_returns: crate::jemalloc::idle_returns(),
        attached_ms: ctx.facts.uptime_ms,
    })
}

/// `detach`: refused by the preloaded shim.
#[cfg(not(memshim_bridge))]
pub fn handle(_ctx: &Ctx<'_>) -> Result<DetachResult, ErrorReply> {
    Err(ErrorReply::new(
        ErrorCode::InvalidArgument,
        "libmemshim.so was preloaded in this process and is its allocator: there is no attached \
         bridge to detach (MEMSHIM_CONTROL=off at start runs the shim without its thread)",
    ))
}
