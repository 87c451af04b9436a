//! The CPython / PyTorch bridge (issue "Python bridge").
//!
//! STUB: the control endpoint calls these three functions; the bridge's
//! owner replaces the bodies and keeps the signatures. Each runs on the
//! shim's thread, must return within about `timeout` (answering
//! `PythonUnavailable::Busy` rather than waiting longer), and must leave the
//! host exactly as it was when it fails.

use memshim_proto::{EmptyCacheResult, GcResult, PythonSection, PythonUnavailable, TorchSection};
use std::time::Duration;

/// The `python` section of `stats`, and the `torch` section if `torch` is
/// already imported.
pub fn stats(
    timeout: Duration,
) -> Result<(PythonSection, Option<TorchSection>), PythonUnavailable> {
    let _ = timeout;
    Err(PythonUnavailable::NoPython)
}

/// A full `gc.collect()`.
pub fn gc(timeout: Duration) -> Result<GcResult, PythonUnavailable> {
    let _ = timeout;
    Err(PythonUnavailable::NoPython)
}

/// `torch.cuda.empty_cache()` on every device that already has a context.
pub fn empty_cache(timeout: Duration) -> Result<EmptyCacheResult, PythonUnavailable> {
    let _ = timeout;
    Err(PythonUnavailable::NoPython)
}
