//! `empty_cache`: `torch.cuda.empty_cache()` through the Python bridge.

use super::{PY_ACTION_TIMEOUT, ms, nothing_to_do};
use memshim_proto::*;
use std::time::Instant;

/// `empty_cache`. A process without a usable interpreter has nothing to
/// empty: that is an answer, not an error.
pub fn handle() -> Result<EmptyCacheResult, ErrorReply> {
    let t0 = Instant::now();
    match crate::python::empty_cache(PY_ACTION_TIMEOUT) {
        Ok(r) => Ok(r),
        Err(why) if nothing_to_do(&why) => Ok(EmptyCacheResult {
            skipped: Some(why.to_string()),
            elapsed_ms: ms(t0),
            ..Default::default()
        }),
        Err(why) => Err(ErrorReply::python(why)),
    }
}
