//! `profile`: jemalloc's heap profiler (the work is in `crate::profile`).

use super::super::facts::Ctx;
use super::super::socket;
use memshim_proto::*;

/// `profile`: the dump file is named for the process's socket, beside it;
/// the client reads it.
pub fn handle(
    action: ProfileAction,
    seconds: Option<u64>,
    ctx: &Ctx<'_>,
) -> Result<Box<ProfileReply>, ErrorReply> {
    let name = format!("{}.heap", socket::name(ctx.starttime, ctx.pidns));
    let heap = socket::join(&socket::dir(), &name);
    crate::profile::request(
        action,
        seconds,
        crate::os::time::monotonic_ms(),
        &heap,
        &name,
    )
    .map(Box::new)
}
