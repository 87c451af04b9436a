//! `profile`: jemalloc's heap profiler (the work is in `crate::profile`).

use super::super::{Ctx, socket};
use memshim_proto::*;

/// `profile`: the dump file is named for the process's socket, beside it.
pub fn handle(
    action: ProfileAction,
    seconds: Option<u64>,
    ctx: &Ctx<'_>,
) -> Result<Box<ProfileReply>, ErrorReply> {
    let heap = socket::join(
        &socket::dir(),
        &format!("{}.heap", socket::name(ctx.starttime, ctx.pidns)),
    );
    crate::profile::request(action, seconds, super::super::now_ms(), &heap).map(Box::new)
}
