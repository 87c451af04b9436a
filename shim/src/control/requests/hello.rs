//! `hello`: version negotiation, answered by the connection itself
//! (conn.rs) before any other request.

use super::super::facts::Ctx;
use crate::os;
use memshim_proto::*;

/// The answer to `hello`, or an error if the versions have nothing in common.
pub fn handle(client_version: u32, ctx: &Ctx<'_>) -> Result<HelloReply, ErrorReply> {
    let Some(version) = negotiate(client_version, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION) else {
        return Err(ErrorReply::new(
            ErrorCode::VersionMismatch,
            format!(
                "client speaks protocol {client_version}, this process speaks {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}; \
                 use a memshim-ctl of the same release as the library"
            ),
        ));
    };
    Ok(HelloReply {
        version,
        min_version: MIN_PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        pid: os::getpid(),
        starttime: ctx.starttime,
        pidns: (ctx.pidns != 0).then_some(ctx.pidns),
        shim_version: env!("CARGO_PKG_VERSION").to_owned(),
        max_request_bytes: MAX_REQUEST_BYTES as u64,
        ops: OPS.iter().map(|s| s.to_string()).collect(),
    })
}
