//! What a request is answered from: the facts the shim's thread reports
//! about itself and the process ([`Facts`], with the pressure watcher's
//! [`PressureFacts`]), and the endpoint's identity, given to each handler
//! as a [`Ctx`]. The endpoint never reads the thread's state.

/// What the shim's thread tells the endpoint about itself and the process
/// (reported in `stats`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts {
    /// Our `malloc` is the process's.
    pub interposed: bool,
    /// The process is a fork child of a shimmed process.
    pub fork_child: bool,
    /// Milliseconds since the constructor (or the fork).
    pub uptime_ms: u64,
    /// How many times the shim's thread was started in this process.
    pub thread_starts: u64,
    /// The shim's descriptors live in a table of their own.
    pub private_fds: bool,
    /// The idle VRAM return's counters (`None`: off).
    pub cuda_idle: Option<memshim_proto::CudaIdleCounters>,
    /// The pressure watcher.
    pub pressure: PressureFacts,
    /// How many `dlopen` calls had `RTLD_DEEPBIND` cleared.
    pub deepbind_cleared: u64,
}

/// What the pressure watcher (thread/pressure.rs) reports, for the
/// `pressure` section of `stats`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PressureFacts {
    /// `MEMSHIM_PRESSURE`.
    pub mode: &'static str,
    /// `"v1"`, `"v2"` or `"none"`.
    pub source: &'static str,
    /// The notifications in use.
    pub watching: [Option<&'static str>; 6],
    /// The limit watched, in bytes.
    pub limit: Option<u64>,
    /// The threshold, in bytes.
    pub threshold: Option<u64>,
    /// Pressure now.
    pub active: bool,
    /// Signals seen.
    pub events: u64,
    /// Purges run on pressure.
    pub purges: u64,
    /// RSS those purges returned.
    pub bytes_returned: u64,
    /// `gc` runs on pressure.
    pub gc_runs: u64,
    /// Notifications after which the working set was below the threshold.
    pub ignored: u64,
    /// Signal to end of purge at the last onset, in microseconds.
    pub last_purge_us: Option<u64>,
}

/// What a request is answered with: the thread's facts and the endpoint's
/// identity.
pub(crate) struct Ctx<'a> {
    pub(super) facts: &'a Facts,
    pub(super) starttime: u64,
    pub(super) pidns: u64,
}
