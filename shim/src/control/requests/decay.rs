//! `decay`: reads or changes jemalloc's decay times.

use super::internal;
use crate::jemalloc;
use memshim_proto::*;

/// `decay`.
pub fn handle(dirty: Option<i64>, muzzy: Option<i64>) -> Result<DecayResult, ErrorReply> {
    for (name, v) in [("dirty_ms", dirty), ("muzzy_ms", muzzy)] {
        if let Some(v) = v
            && !valid_decay_ms(v)
        {
            return Err(ErrorReply::new(
                ErrorCode::InvalidArgument,
                format!("{name} must be -1 (never) or between 0 and {MAX_DECAY_MS}, not {v}"),
            ));
        }
    }
    if dirty.is_some() || muzzy.is_some() {
        jemalloc::set_decay_ms(dirty, muzzy).map_err(|e| internal("setting decay", e))?;
    }
    let (d, m) = jemalloc::decay_ms().map_err(|e| internal("reading decay", e))?;
    Ok(DecayResult {
        dirty_decay_ms: d,
        muzzy_decay_ms: m,
    })
}
