//! What each request does, one file per request (its `op`). Runs on the
//! shim's thread, one request at a time; nothing here blocks longer than
//! the Python bridge's time limit. Adding a request: docs/design.md,
//! "Adding a request".

use super::facts::Ctx;
use crate::jemalloc;
use memshim_proto::*;
use std::time::{Duration, Instant};

mod decay;
pub mod detach;
mod empty_cache;
mod gc;
pub mod hello;
mod profile;
pub mod purge;
mod python_trace;
mod release;
mod stats;

/// How long `stats` waits for the GIL before reporting the `python` section
/// as "busy" (the rest of the report is complete either way).
pub(super) const PY_STATS_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `gc` / `empty_cache` (and each of those steps of `release`)
/// wait for the GIL before answering "busy".
pub(super) const PY_ACTION_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

pub(super) fn internal(what: &str, e: jemalloc::Error) -> ErrorReply {
    ErrorReply::new(ErrorCode::Internal, format!("{what} failed: {e}"))
}

/// Whether a Python step that could not use the interpreter simply had
/// nothing to do (there is no interpreter to act on), rather than failed.
pub(super) fn nothing_to_do(why: &PythonUnavailable) -> bool {
    matches!(
        why,
        PythonUnavailable::NoPython | PythonUnavailable::NotInitialized
    )
}

/// Runs one decoded request (other than `hello`), one line per request.
pub fn dispatch(req: &Request, ctx: &Ctx<'_>) -> Response {
    let r = match *req {
        Request::Hello { .. } => Err(ErrorReply::new(
            ErrorCode::Internal,
            "hello is handled by the connection",
        )),
        Request::Stats { arenas, pss } => stats::handle(arenas, pss, ctx).map(Reply::Stats),
        Request::Purge => purge::handle().map(Reply::Purge),
        Request::Decay { dirty_ms, muzzy_ms } => {
            decay::handle(dirty_ms, muzzy_ms).map(Reply::Decay)
        }
        Request::Gc => gc::handle().map(Reply::Gc),
        Request::EmptyCache => empty_cache::handle().map(Reply::EmptyCache),
        Request::Release => release::handle().map(Reply::Release),
        Request::Profile { action, seconds } => {
            profile::handle(action, seconds, ctx).map(Reply::Profile)
        }
        Request::PythonTrace {
            action,
            frames,
            seconds,
            top,
        } => python_trace::handle(action, frames, seconds, top).map(Reply::PythonTrace),
        Request::Detach => detach::handle(ctx).map(Reply::Detach),
    };
    match r {
        Ok(reply) => Response::Ok(reply),
        Err(e) => Response::Error(e),
    }
}
