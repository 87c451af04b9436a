//! Results of the actions: purge, decay, gc, empty_cache, release.

use crate::python;
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

/// Answer to `detach`, sent before the bridge's thread stops.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DetachResult {
    /// Idle returns the bridge made while attached.
    pub idle_returns: u64,
    /// Milliseconds the bridge was attached.
    pub attached_ms: u64,
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

/// A step of `release`, in the order they run.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseStepKind {
    /// `gc.collect()`; `before`/`after` are RSS.
    Gc,
    /// `torch.cuda.ipc_collect()`: memory of CUDA tensors shared with other
    /// processes that they have let go, back to the caching allocator; CUDA
    /// allocated bytes.
    IpcCollect,
    /// cuBLAS workspaces freed back to the caching allocator
    /// (`torch._C._cuda_clearCublasWorkspaces`, where the installed torch
    /// has it); CUDA allocated bytes.
    CublasWorkspaces,
    /// `torch.cuda.empty_cache()`; CUDA reserved bytes.
    EmptyCache,
    /// The pinned host-memory cache (`torch.accelerator.empty_host_cache`
    /// or `torch._C._host_emptyCache`); cached pinned bytes.
    HostCache,
    /// The allocator purge; `before`/`after` are RSS.
    Purge,
    /// A step this build does not know (sent by a newer server).
    #[serde(other)]
    Unknown,
}

/// One device's figure before and after a CUDA step of `release`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceChange {
    /// CUDA device index (as torch numbers it).
    pub index: u32,
    /// Bytes before the step.
    pub before: u64,
    /// Bytes after the step.
    pub after: u64,
}

/// How a step of `release` went.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// The step ran.
    #[default]
    Done,
    /// There was nothing to do: no CPython in the process, torch not
    /// imported, CUDA not initialised, an empty cache. Not a failure.
    NothingToDo,
    /// The step could not run (the GIL could not be had in time, the
    /// interpreter is shutting down, an unsupported version) or it failed
    /// (Python raised). `memshim-ctl release` exits non-zero.
    Failed,
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
    /// How it went (absent from servers before 0.2: read as `done`).
    #[serde(default)]
    pub outcome: StepOutcome,
    /// Why there was nothing to do (`outcome` `nothing_to_do`), e.g.
    /// "torch is not imported".
    #[serde(default)]
    pub skipped: Option<String>,
    /// Why the step could not run or failed (`outcome` `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The bridge's reason, where CPython could not be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<python::PythonUnavailable>,
    /// Per device, for the CUDA steps (`before`/`after` are their sums).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceChange>,
}

impl ReleaseStep {
    /// A step that ran (`done`) with no figures yet.
    pub fn new(step: ReleaseStepKind, measure: &str) -> ReleaseStep {
        ReleaseStep {
            step,
            measure: measure.to_owned(),
            before: 0,
            after: 0,
            elapsed_ms: 0.0,
            outcome: StepOutcome::Done,
            skipped: None,
            error: None,
            python: None,
            devices: Vec::new(),
        }
    }

    /// The step had nothing to do, and why.
    pub fn nothing_to_do(mut self, why: impl Into<String>) -> ReleaseStep {
        self.outcome = StepOutcome::NothingToDo;
        self.skipped = Some(why.into());
        self
    }

    /// The step could not run or failed, and why.
    pub fn failed(mut self, why: impl Into<String>) -> ReleaseStep {
        self.outcome = StepOutcome::Failed;
        self.error = Some(why.into());
        self
    }

    /// The step's name as the CLI shows it.
    pub fn name(&self) -> &'static str {
        match self.step {
            ReleaseStepKind::Gc => "gc",
            ReleaseStepKind::IpcCollect => "ipc-collect",
            ReleaseStepKind::CublasWorkspaces => "cublas-workspaces",
            ReleaseStepKind::EmptyCache => "empty-cache",
            ReleaseStepKind::HostCache => "host-cache",
            ReleaseStepKind::Purge => "purge",
            ReleaseStepKind::Unknown => "unknown",
        }
    }
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

impl ReleaseResult {
    /// The steps that could not run or failed.
    pub fn failed_steps(&self) -> impl Iterator<Item = &ReleaseStep> {
        self.steps
            .iter()
            .filter(|s| s.outcome == StepOutcome::Failed)
    }
}
