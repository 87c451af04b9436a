//! Running a fixed job on the interpreter's main thread: a pending call
//! (`Py_AddPendingCall`) posted by the shim's thread, with a bounded wait
//! and exact abandonment. docs/python.md explains the choice over
//! `PyGILState_Ensure` on the shim's thread.
//!
//! One request at a time, in static storage (a late callback must never
//! touch freed memory). Its phase word is the whole protocol:
//!
//! ```text
//!   IDLE --post--> POSTED --callback claims (CAS)--> RUNNING --> DONE --taken--> IDLE
//!                    \--requester gives up (CAS)--> IDLE
//! ```
//!
//! The callback and the requester race for the `POSTED` state with a
//! compare-and-swap, so exactly one of them wins: either the job runs (once)
//! and its result is delivered, or the requester answers "busy" and the
//! callback, whenever the main thread gets to it, finds nothing to do. A job
//! that started is never interrupted (nothing is left half-done); if it
//! outlives the requester's patience, its result is dropped by the next
//! request. The phase word doubles as a futex, so the requester sleeps until
//! the main thread is done.
//!
//! At most one of our callbacks sits in CPython's small pending-call queue
//! at a time (`QUEUED`), so abandoned requests cannot fill it.
//!
//! Fork: the child inherits this state and maybe our queued callback. Every
//! word is tagged with the owner's pid: a callback in another process does
//! nothing, and the first request in a child resets the state.

use super::ffi;
use super::gate;
use super::nudge;
use super::object::{Py, SavedError};
use crate::sys;
use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering::SeqCst};
use memshim_proto::{EmptyCacheResult, GcResult, PythonSection, PythonUnavailable, TorchSection};
use std::time::{Duration, Instant};

/// The fixed jobs. Nothing else can run: the socket never sends code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// Read the `python` and `torch` sections.
    Stats,
    /// A full collection.
    Gc,
    /// `torch.cuda.empty_cache()` on devices with a context.
    EmptyCache,
}

/// What a job produced.
pub enum Done {
    /// Stats.
    Stats(PythonSection, Option<TorchSection>),
    /// gc.
    Gc(GcResult),
    /// empty_cache.
    EmptyCache(EmptyCacheResult),
}

/// A job's outcome.
pub type Outcome = Result<Done, PythonUnavailable>;

const IDLE: u32 = 0;
const POSTED: u32 = 1;
const RUNNING: u32 = 2;
const DONE: u32 = 3;

/// How long a job that has started may take before the requester stops
/// waiting for its result (it still completes on the main thread).
const RUN_LIMIT: Duration = Duration::from_secs(10);
/// How long to wait for the main thread before nudging it (`nudge.rs`).
const NUDGE_AFTER: Duration = Duration::from_millis(2);

static PHASE: AtomicU32 = AtomicU32::new(IDLE);
static OWNER: AtomicI32 = AtomicI32::new(0);
static QUEUED: AtomicBool = AtomicBool::new(false);

struct Slot {
    job: UnsafeCell<Option<Job>>,
    outcome: UnsafeCell<Option<Outcome>>,
}

// SAFETY: access follows the phase protocol: the requester touches `job`
// and `outcome` only in IDLE (and takes `outcome` in DONE), the callback
// only after winning POSTED->RUNNING and before publishing DONE; the
// transitions are SeqCst atomics, which order the accesses.
unsafe impl Sync for Slot {}

static SLOT: Slot = Slot {
    job: UnsafeCell::new(None),
    outcome: UnsafeCell::new(None),
};

fn futex_wait(expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live static u32 with a relative timeout; it
    // returns at once if the word is no longer `expected`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            PHASE.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
            core::ptr::null::<u32>(),
            0,
        )
    };
}

fn futex_wake() {
    // SAFETY: FUTEX_WAKE on a live static u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            PHASE.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
            core::ptr::null::<libc::timespec>(),
            core::ptr::null::<u32>(),
            0,
        )
    };
}

/// In a fork child (or the first time), start from a clean state.
fn adopt_state() {
    let pid = sys::getpid();
    if OWNER.load(SeqCst) != pid {
        QUEUED.store(false, SeqCst);
        PHASE.store(IDLE, SeqCst);
        // SAFETY: IDLE: the requester (us, the only one) owns the slot.
        unsafe { *SLOT.outcome.get() = None };
        gate::after_fork();
        OWNER.store(pid, SeqCst);
    }
}

fn busy(start: Instant) -> PythonUnavailable {
    PythonUnavailable::Busy {
        waited_ms: start.elapsed().as_millis() as u64,
    }
}

/// Runs `job` on the main thread, waiting at most about `timeout` for the
/// main thread to pick it up. Shim's thread only.
pub fn run(job: Job, timeout: Duration) -> Outcome {
    let start = Instant::now();
    let api = ffi::api().ok_or(PythonUnavailable::NoPython)?;
    api.usable()?;
    let version = api.version();
    let mm = match ffi::major_minor(&version) {
        Some(v) if ((3, 8)..=(3, 13)).contains(&v) => v,
        _ => return Err(PythonUnavailable::Unsupported { version }),
    };
    if gate::closed() {
        return Err(PythonUnavailable::Finalizing);
    }
    adopt_state();
    match PHASE.load(SeqCst) {
        IDLE => {}
        DONE => {
            // A job that outlived its requester: drop its result.
            // SAFETY: DONE: the callback has published and let go of the slot.
            unsafe { *SLOT.outcome.get() = None };
            PHASE.store(IDLE, SeqCst);
        }
        _ => return Err(busy(start)),
    }
    // SAFETY: IDLE: the slot is ours until we publish POSTED.
    unsafe { *SLOT.job.get() = Some(job) };
    PHASE.store(POSTED, SeqCst);
    if !QUEUED.swap(true, SeqCst) {
        let posted = if gate::enter() {
            // Checked again right before the call; the gate covers the rest.
            let ok = api.usable().is_ok()
                // SAFETY: Py_AddPendingCall may be called from any thread
                // without the GIL; the gate guarantees the interpreter is not
                // being freed; the callback is a plain function, no data.
                && unsafe { (api.add_pending_call)(on_main_thread, core::ptr::null_mut()) } == 0;
            gate::leave();
            ok
        } else {
            false
        };
        if !posted {
            QUEUED.store(false, SeqCst);
            if PHASE.compare_exchange(POSTED, IDLE, SeqCst, SeqCst).is_ok() {
                api.usable()?;
                return Err(if gate::closed() {
                    PythonUnavailable::Finalizing
                } else {
                    busy(start)
                });
            }
            // An older queued callback of ours claimed it meanwhile: wait.
        }
    }
    let deadline = start + timeout;
    let mut nudge_at = nudge::needed(mm).then(|| Instant::now() + NUDGE_AFTER);
    loop {
        if PHASE.load(SeqCst) != POSTED {
            break;
        }
        let now = Instant::now();
        if nudge_at.is_some_and(|t| now >= t) {
            nudge_at = None;
            nudge::poke(api);
            continue;
        }
        if now >= deadline {
            if PHASE.compare_exchange(POSTED, IDLE, SeqCst, SeqCst).is_ok() {
                // Abandoned: a late callback will find nothing to do.
                return Err(busy(start));
            }
            break;
        }
        let until = nudge_at.map_or(deadline, |t| t.min(deadline));
        futex_wait(POSTED, until.saturating_duration_since(now));
    }
    let run_deadline = Instant::now() + RUN_LIMIT.max(timeout);
    loop {
        if PHASE.load(SeqCst) == DONE {
            break;
        }
        let now = Instant::now();
        if now >= run_deadline {
            // Still running on the main thread: it completes there, its
            // result is dropped by the next request.
            return Err(busy(start));
        }
        futex_wait(RUNNING, run_deadline - now);
    }
    // SAFETY: DONE: the callback has published the outcome and let go.
    let outcome = unsafe { (*SLOT.outcome.get()).take() };
    PHASE.store(IDLE, SeqCst);
    outcome.unwrap_or_else(|| {
        Err(PythonUnavailable::Error {
            message: "no result".into(),
        })
    })
}

/// The pending call. Runs on the main thread with the GIL held, at a point
/// where the interpreter checks for pending work. Always returns 0: a
/// nonzero return would raise an exception in the host's code.
extern "C" fn on_main_thread(_: *mut c_void) -> c_int {
    if OWNER.load(SeqCst) != sys::getpid() {
        return 0; // inherited through fork; the child's own requests reset
    }
    QUEUED.store(false, SeqCst);
    if PHASE
        .compare_exchange(POSTED, RUNNING, SeqCst, SeqCst)
        .is_err()
    {
        return 0; // abandoned, or already taken by a duplicate entry
    }
    // SAFETY: RUNNING: the slot is ours until we publish DONE.
    let job = unsafe { (*SLOT.job.get()).take() };
    let outcome = match (ffi::resolved(), job) {
        (Some(api), Some(job)) => {
            // SAFETY: CPython runs pending calls with the GIL held (attached,
            // in a free-threaded build) on the main thread.
            let py = unsafe { Py::assume_attached(api) };
            let saved = SavedError::save(&py);
            let r = if gate::closed() || api.usable().is_err() {
                Err(PythonUnavailable::Finalizing)
            } else {
                gate::ensure_hook(&py);
                execute(&py, job)
            };
            saved.restore(&py);
            r
        }
        _ => Err(PythonUnavailable::Error {
            message: "bridge state lost".into(),
        }),
    };
    // SAFETY: RUNNING: still ours; DONE below hands it over.
    unsafe { *SLOT.outcome.get() = Some(outcome) };
    PHASE.store(DONE, SeqCst);
    futex_wake();
    0
}

fn execute(py: &Py, job: Job) -> Outcome {
    let err = |message: String| PythonUnavailable::Error { message };
    match job {
        Job::Stats => {
            let section = super::gc::section(py).map_err(err)?;
            let torch = super::torch::section(py).map_err(err)?;
            Ok(Done::Stats(section, torch))
        }
        Job::Gc => super::gc::collect(py).map(Done::Gc).map_err(err),
        Job::EmptyCache => super::torch::empty_cache(py)
            .map(Done::EmptyCache)
            .map_err(err),
    }
}
