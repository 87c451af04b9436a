//! Results of the actions: purge, decay, gc, empty_cache, release.

use serde::{Deserialize, Serialize};

/// Answer to `purge`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct PurgeResult {
    /// RSS before, bytes.
    pub rss_before: u64,
    /// RSS after, bytes.
    pub rss_after: u64,
    /// `max(0, rss_before - rss_after)`.
    pub released: u64,
    /// jemalloc `resident` before, bytes.
    pub resident_before: u64,
    /// jemalloc `resident` after, bytes.
    pub resident_after: u64,
    /// Dirty plus muzzy bytes before the purge.
    pub purgeable_before: u64,
    /// Time the purge took, ms.
    pub elapsed_ms: f64,
}

/// Answer to `decay`: the settings now in force.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecayResult {
    /// Dirty decay, ms (-1 = never).
    pub dirty_decay_ms: i64,
    /// Muzzy decay, ms (-1 = never).
    pub muzzy_decay_ms: i64,
}

/// Answer to `gc`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct GcResult {
    /// Return value of `gc.collect()`: unreachable objects found.
    pub collected: u64,
    /// RSS before, bytes.
    pub rss_before: u64,
    /// RSS after, bytes.
    pub rss_after: u64,
    /// Time `gc.collect()` took (GIL wait included), ms.
    pub elapsed_ms: f64,
}

/// Answer to `empty_cache`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct EmptyCacheResult {
    /// Devices whose cache was emptied (those that already had a context).
    pub devices: Vec<u32>,
    /// Sum of `reserved` over those devices before, bytes.
    pub reserved_before: u64,
    /// The same after, bytes.
    pub reserved_after: u64,
    /// Time taken, ms.
    pub elapsed_ms: f64,
    /// Why nothing was done, e.g. "torch is not imported" or
    /// "CUDA is not initialized".
    #[serde(default)]
    pub skipped: Option<String>,
}

/// A step of `release`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseStepKind {
    /// `gc.collect()`; `before`/`after` are RSS.
    Gc,
    /// `torch.cuda.empty_cache()`; `before`/`after` are CUDA reserved bytes.
    EmptyCache,
    /// The allocator purge; `before`/`after` are RSS.
    Purge,
}

/// One step of `release`, with its effect.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReleaseStep {
    /// Which step.
    pub step: ReleaseStepKind,
    /// What `before`/`after` measure: `"rss"` or `"cuda_reserved"`.
    pub measure: String,
    /// Bytes before the step.
    pub before: u64,
    /// Bytes after the step.
    pub after: u64,
    /// Time the step took, ms.
    pub elapsed_ms: f64,
    /// Why the step did nothing (Python unavailable, torch not imported...).
    #[serde(default)]
    pub skipped: Option<String>,
}

/// Answer to `release`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ReleaseResult {
    /// RSS before the first step, bytes.
    pub rss_before: u64,
    /// RSS after the last step, bytes.
    pub rss_after: u64,
    /// `max(0, rss_before - rss_after)`.
    pub released: u64,
    /// Total time, ms.
    pub elapsed_ms: f64,
    /// gc, empty_cache, purge, in that order.
    pub steps: Vec<ReleaseStep>,
}
