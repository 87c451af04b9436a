//! `detach`: the attached bridge's thread stops after this answer, and its
//! socket closes (bridge/mod.rs). The preloaded shim refuses: its thread
//! returns the memory of the allocator the shim is, for the process's life.

use super::super::facts::Ctx;
use memshim_proto::*;

/// `detach`.
#[cfg(memshim_bridge)]
pub fn handle(ctx: &Ctx<'_>) -> Result<DetachResult, ErrorReply> {
    crate::bridge::ask_detach();
    Ok(DetachResult {
        idle_returns: crate::bridge::heap::idle_returns(),
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
