//! `gc`: a full `gc.collect()` through the Python bridge.

use super::PY_ACTION_TIMEOUT;
use memshim_proto::*;

/// `gc`.
pub fn handle() -> Result<GcResult, ErrorReply> {
    crate::python::gc(PY_ACTION_TIMEOUT).map_err(ErrorReply::python)
}
