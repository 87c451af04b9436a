//! Running a fixed job inside the interpreter, whatever its main thread is
//! doing: on a short-lived thread of the shim's, `memshim-py`, that takes
//! the GIL with a thread state of its own, as `PyGILState_Ensure` would. docs/python.md explains the design and
//! why it is safe.
//!
//! One request at a time, in static storage (a job thread that outlives its
//! requester must never touch freed memory). Its phase word is the whole
//! protocol between the requester (the shim's thread) and the job thread:
//!
//! ```text
//!   IDLE --post--> POSTED --job thread claims (CAS)--> RUNNING --> DONE --taken--> IDLE
//!                    \--requester gives up (CAS)--> IDLE
//! ```
//!
//! The job thread claims `POSTED` with a compare-and-swap only once it holds
//! the GIL, and the requester withdraws it with a compare-and-swap when its
//! wait is over, so exactly one of them wins: either the job runs (once)
//! and its result is delivered, or the requester answers "busy" and the job
//! thread, whenever it gets the GIL, finds nothing to do. A job that
//! started is never interrupted; if it outlives the requester, its result
//! is dropped by the next request. The phase word doubles as a futex.
//!
//! At most one job thread exists at a time (`WORKER`). It takes every
//! request posted while it lives, so a job thread held up by a C extension
//! that keeps the GIL does not multiply: later requests answer "busy" too.
//! It is joined before the answer goes out (`reap_worker`), so a request
//! leaves no thread behind (one still waiting for the GIL is joined later).
//!
//! Fork: [`after_fork_child`] resets everything (the job thread is not in
//! the child).

use super::ffi;
use super::gate;
use super::guard::Guard;
use super::object::Py;
use super::version::{self, LateAttach};
use crate::os::ResetTo;
use crate::os::{self, spawner, thread::Key, time};
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{
    AtomicI32, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst,
};
use memshim_proto::{
    EmptyCacheResult, GcResult, PythonSection, PythonUnavailable, ReleaseStep, TorchSection,
};
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
    /// The CUDA steps of `release` (`cuda.rs`).
    CudaRelease,
    /// One look of the idle VRAM return (`cuda::idle_check`): act only if
    /// the allocation count is `expect` and `min_unused` bytes are unused.
    CudaIdle {
        /// The allocation count of the previous look.
        expect: Option<u64>,
        /// The least unused cache worth returning.
        min_unused: u64,
    },
    /// tracemalloc (`tracemalloc.rs`).
    PyTrace(PyTraceJob),
    /// Nothing but what every job does first: the exit hooks registered.
    Hooks,
}

/// What a tracemalloc job does (`tracemalloc.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyTraceJob {
    /// The state.
    Status {
        /// The shim's monotonic clock at the request.
        now_ms: u64,
    },
    /// Start tracing.
    Start {
        /// Frames kept per allocation.
        frames: u32,
        /// When the shim stops it (monotonic ms).
        deadline_ms: u64,
        /// The shim's monotonic clock at the request.
        now_ms: u64,
    },
    /// The lines holding most.
    Snapshot {
        /// How many lines.
        top: usize,
        /// The shim's monotonic clock at the request.
        now_ms: u64,
    },
    /// Stop what the shim started.
    Stop {
        /// The shim's monotonic clock at the request.
        now_ms: u64,
    },
}

/// What a job produced.
pub enum Done {
    /// Stats.
    Stats(Box<(PythonSection, Option<TorchSection>)>),
    /// gc.
    Gc(GcResult),
    /// empty_cache.
    EmptyCache(EmptyCacheResult),
    /// The CUDA steps of release.
    CudaRelease(Vec<ReleaseStep>),
    /// The idle return's look.
    CudaIdle(super::cuda::IdleCheck),
    /// tracemalloc's state (and snapshot).
    PyTrace(Box<memshim_proto::PyTraceReply>),
    /// The hooks are registered.
    Hooks,
}

/// A job's outcome.
pub type Outcome = Result<Done, PythonUnavailable>;

const IDLE: u32 = 0;
const POSTED: u32 = 1;
const RUNNING: u32 = 2;
const DONE: u32 = 3;

/// How long a job that has started may take before the requester stops
/// waiting for its result (it still completes on the job thread).
const RUN_LIMIT: Duration = Duration::from_secs(10);

touched_at_start! {
    static PHASE: AtomicU32 = AtomicU32::new(IDLE);
    /// Monotonic ns at which a job was posted that its requester then withdrew
    /// while the job thread still waited for the GIL; 0 once the job thread
    /// holds the GIL or has left. While it is set, something else has held the
    /// GIL since then, and a new request answers "busy" at once instead of
    /// waiting its whole time again: the shim's thread serves one request at
    /// a time, so each such wait would hold up every other client too (a
    /// client that pipelines ten `gc` requests to a process whose C extension
    /// keeps the GIL would otherwise stall the endpoint for 50 s).
    static STARVED_SINCE_NS: AtomicU64 = AtomicU64::new(0);
    /// pid of the process whose job thread is alive, 0 if none. (A fork child
    /// inherits the word but not the thread: `after_fork_child` clears it.)
    static WORKER: AtomicI32 = AtomicI32::new(0);
}

struct Slot {
    job: UnsafeCell<Option<Job>>,
    outcome: UnsafeCell<Option<Outcome>>,
}

// SAFETY: access follows the phase protocol: the requester touches `job`
// and `outcome` only in IDLE (and takes `outcome` in DONE), the job thread
// only after winning POSTED->RUNNING and before publishing DONE; the
// transitions are SeqCst atomics, which order the accesses.
unsafe impl Sync for Slot {}

static SLOT: Slot = Slot {
    job: UnsafeCell::new(None),
    outcome: UnsafeCell::new(None),
};

fn futex_wake() {
    time::futex_wake(&PHASE);
}

/// Fork child handler: no job thread, no request. Async-signal-safe
/// (atomics only; the slot's contents are dropped by the next request).
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    WORKER.reset_to(0);
    HANDLE.reset_to(0);
    PHASE.reset_to(IDLE);
    STARVED_SINCE_NS.reset_to(0);
    gate::after_fork_child();
}

/// Longest wait, after a job's result is in, for its thread to give up its
/// claim (it has only its thread state to delete).
const LEAVE_WAIT_MS: u64 = 20;

/// The exit gate's generation (`gate::generation`) when the job thread
/// alive now was started.
static WORKER_GENERATION: AtomicU32 = AtomicU32::new(0);

/// The requester, before it posts: if the interpreter the job thread was
/// started under has finalized since, and the thread still claims the
/// slot, CPython ended it or parked it for ever. Write it off: detach it (a
/// parked thread is never joined) and free the claim. Shim's thread.
fn forget_parked_worker() {
    if WORKER.load(SeqCst) == 0 || WORKER_GENERATION.load(SeqCst) == gate::generation() {
        return;
    }
    // The handle first: whoever sees WORKER 0 next finds no handle to join.
    let h = HANDLE.swap(0, SeqCst);
    if h != 0 {
        os::thread::detach(h as libc::pthread_t);
    }
    STARVED_SINCE_NS.store(0, SeqCst);
    WORKER.store(0, SeqCst);
}

/// Whether a job thread exists (running, waiting for the GIL, or exited
/// and not yet joined): one of the shim's threads, for the thread layer's
/// count.
pub fn worker_exists() -> bool {
    WORKER.load(SeqCst) != 0 || HANDLE.load(SeqCst) != 0
}

/// Set while the thread layer wants the shim's thread to stop (a fork or
/// a namespace change by a process alone but for us): a requester waiting
/// for a job that has not started withdraws it at once instead of after its
/// whole time limit (a job that has started is waited for).
static INTERRUPTED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Interrupts (`true`) the requester's wait, or lets later ones wait
/// again (`false`). Any thread; async-signal-safe.
pub fn interrupt(on: bool) {
    INTERRUPTED.store(on, SeqCst);
    if on {
        futex_wake();
    }
}

/// Waits while the phase is `from`, at most `limit`: whether it moved
/// (false: the time is up, or, `interruptible`, the wait was interrupted).
fn wait_phase(from: u32, limit: Duration, interruptible: bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if interruptible && INTERRUPTED.load(SeqCst) {
            return PHASE.load(SeqCst) != from;
        }
        if PHASE.load(SeqCst) != from {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        // Woken by the job thread (the phase moved), by `interrupt`, or
        // spuriously: look again.
        time::futex_wait(&PHASE, from, Some(left));
    }
}

fn busy(start: Instant) -> PythonUnavailable {
    PythonUnavailable::Busy {
        waited_ms: start.elapsed().as_millis() as u64,
    }
}

/// How the served interpreter treats a late attach (`version::LateAttach`
/// as a number, for the job thread): set by the requester before it starts
/// a job thread.
static LATE_ATTACH: AtomicU8 = AtomicU8::new(EXITS);
const EXITS: u8 = 0;
const PARKS: u8 = 1;
const GUARDED: u8 = 2;

fn late_attach() -> LateAttach {
    match LATE_ATTACH.load(SeqCst) {
        EXITS => LateAttach::Exits,
        PARKS => LateAttach::Parks,
        _ => LateAttach::Guarded,
    }
}

/// Runs `job` in the interpreter, waiting at most about `timeout` for the
/// GIL. Shim's thread only. When it returns, the job thread has exited
/// unless it is still waiting for the GIL or still running the job: a
/// request leaves no thread behind.
pub fn run(job: Job, timeout: Duration) -> Outcome {
    let r = post_and_wait(job, timeout);
    reap_worker();
    r
}

touched_at_start! {
    /// The job thread (joinable), 0 if none is left to join. Touched by the
    /// shim's thread only (and reset in a fork child).
    static HANDLE: AtomicUsize = AtomicUsize::new(0);
}

/// Joins the job thread if it has left its loop (it then exits within
/// microseconds); one still waiting for the GIL is left to a later call.
/// Only the shim's thread posts requests, so a job thread that has given
/// up its claim (`WORKER` 0) outside `run` never takes it again.
pub fn reap_worker() {
    if WORKER.load(SeqCst) == 0 {
        join_worker();
    }
}

/// Joins the last job thread, which must have given up its claim.
fn join_worker() {
    let h = HANDLE.swap(0, SeqCst);
    if h != 0 {
        // A joinable thread we created, joined once (the handle was taken
        // above), and past the point where it could take a request.
        os::thread::join(h as libc::pthread_t);
    }
}

fn post_and_wait(job: Job, timeout: Duration) -> Outcome {
    let start = Instant::now();
    let Some(api) = ffi::api() else {
        // A CPython whose API did not resolve is one the bridge does not
        // support (2.7, 3.6), not an absent one.
        return Err(if ffi::present() {
            PythonUnavailable::Unsupported {
                version: ffi::unresolved_version(),
                build: None,
            }
        } else {
            PythonUnavailable::NoPython
        });
    };
    gate::on_library(ffi::library());
    // The version and build first: `Py_GetVersion` answers before
    // `Py_Initialize`, so an unsupported interpreter is "unsupported" from
    // its first moment.
    let profile = version::profile(&api.version(), ffi::free_threaded(api))?;
    if profile.late_attach == LateAttach::Guarded && api.guard_from_view.is_none() {
        // A 3.15 without PEP 788's functions (an early pre-release).
        return Err(PythonUnavailable::Unsupported {
            version: api.version(),
            build: None,
        });
    }
    LATE_ATTACH.store(
        match profile.late_attach {
            LateAttach::Exits => EXITS,
            LateAttach::Parks => PARKS,
            LateAttach::Guarded => GUARDED,
        },
        SeqCst,
    );
    api.usable()?;
    if gate::closed() {
        return Err(PythonUnavailable::Finalizing);
    }
    forget_parked_worker();
    let starved_since = STARVED_SINCE_NS.load(SeqCst);
    if starved_since != 0 && WORKER.load(SeqCst) != 0 {
        return Err(PythonUnavailable::Busy {
            waited_ms: time::monotonic_ns().saturating_sub(starved_since) / 1_000_000,
        });
    }
    match PHASE.load(SeqCst) {
        IDLE => {}
        DONE => {
            // A job that outlived its requester: drop its result.
            // SAFETY: DONE: the job thread has published and let go of the slot.
            unsafe { *SLOT.outcome.get() = None };
            PHASE.store(IDLE, SeqCst);
        }
        // A job that outlived its requester is still running.
        _ => return Err(busy(start)),
    }
    // SAFETY: IDLE: the slot is ours until we publish POSTED.
    unsafe {
        *SLOT.job.get() = Some(job);
        *SLOT.outcome.get() = None;
    }
    let posted_ns = time::monotonic_ns();
    PHASE.store(POSTED, SeqCst);
    // Posted first, then the worker: a job thread that is on its way out
    // looks at the phase after giving up its `WORKER` claim (`worker_main`).
    let pid = os::getpid();
    if WORKER.compare_exchange(0, pid, SeqCst, SeqCst).is_ok()
        && let Err(why) = spawn_worker()
    {
        WORKER.store(0, SeqCst);
        if PHASE.compare_exchange(POSTED, IDLE, SeqCst, SeqCst).is_ok() {
            return Err(why);
        }
        // An older job thread claimed it after all: wait for it below.
    }
    let left = (start + timeout).saturating_duration_since(Instant::now());
    // A job not started yet is withdrawn when the shim's thread must stop;
    // one that has started is waited for (its requester gets its result).
    if !wait_phase(POSTED, left, true)
        && PHASE.compare_exchange(POSTED, IDLE, SeqCst, SeqCst).is_ok()
    {
        // Withdrawn: the job thread will find nothing to do.
        if WORKER.load(SeqCst) != 0 {
            STARVED_SINCE_NS.store(posted_ns, SeqCst);
        }
        return Err(if gate::closed() {
            PythonUnavailable::Finalizing
        } else {
            busy(start)
        });
    }
    if !wait_phase(RUNNING, RUN_LIMIT.max(timeout), false) {
        // Still running: it completes on the job thread, and its result is
        // dropped by the next request.
        return Err(busy(start));
    }
    if PHASE.load(SeqCst) != DONE {
        return Err(busy(start));
    }
    // SAFETY: DONE: the job thread has published the outcome and let go.
    let outcome = unsafe { (*SLOT.outcome.get()).take() };
    PHASE.store(IDLE, SeqCst);
    // The job thread is on its way out (it deletes its thread state, then
    // gives up its claim): microseconds. Waiting for it here lets `run` join
    // it; left unjoined, it was counted as one of the shim's threads after
    // it had gone, and a process with one thread of its own then looked
    // alone (thread/run.rs), so the shim's thread stopped.
    os::time::wait_while(LEAVE_WAIT_MS, Duration::from_micros(50), || {
        WORKER.load(SeqCst) != 0
    });
    outcome.unwrap_or_else(|| {
        Err(PythonUnavailable::Error {
            message: "no result".into(),
        })
    })
}

// --- the job thread --------------------------------------------------------

/// Key whose destructor notices the job thread's end, however it ends: a
/// return, or `pthread_exit` from inside `PyEval_RestoreThread` during
/// finalization. 0 until created; stored as key + 1.
static EXIT_KEY: AtomicU32 = AtomicU32::new(0);

/// Runs on the job thread as it exits (glibc calls thread-specific-data
/// destructors after the forced unwind of `pthread_exit`, too).
unsafe extern "C" fn on_worker_exit(_: *mut c_void) {
    STARVED_SINCE_NS.store(0, SeqCst);
    WORKER.store(0, SeqCst);
    gate::leave();
}

fn exit_key() -> Option<Key> {
    let k = EXIT_KEY.load(SeqCst);
    if k != 0 {
        return Some(Key::from_raw(k - 1));
    }
    // Only the shim's thread gets here, so at most one key is ever created.
    let key = Key::create(on_worker_exit)?;
    EXIT_KEY.store(key.as_raw() + 1, SeqCst);
    Some(key)
}

/// Starts the job thread (the caller holds the `WORKER` claim). It must
/// share the application's descriptor table (Python code runs on it), so
/// it is started through `os::spawner`.
fn spawn_worker() -> Result<(), PythonUnavailable> {
    let failed = |what: &str| PythonUnavailable::Error {
        message: format!("could not start the bridge's thread: {what}"),
    };
    let key = exit_key().ok_or_else(|| failed("pthread_key_create failed"))?;
    if !gate::enter() {
        return Err(PythonUnavailable::Finalizing);
    }
    // A previous job thread has given up its claim (we hold it now): it is
    // exiting or gone.
    join_worker();
    // CPython 3.8-3.13.7 end a thread with `pthread_exit` during
    // finalization, and glibc's unwinder must then be loaded: load it here,
    // on the shim's thread, not on the job thread at the host's exit
    // (os/unwind.rs). A missing library makes that `pthread_exit` abort
    // with or without us. Later versions never end the thread.
    if late_attach() == LateAttach::Exits {
        let _ = os::unwind::load();
    }
    WORKER_GENERATION.store(gate::generation(), SeqCst);
    match spawner::spawn_joinable(worker_main, key.as_raw() as usize) {
        Ok(handle) => {
            HANDLE.store(handle as usize, SeqCst);
            Ok(())
        }
        Err(e) => {
            gate::leave();
            Err(match e {
                spawner::SpawnError::NoSpawner => failed(
                    "CPython was loaded after the shim's thread started; the bridge reaches it once the \
                     process starts its next thread",
                ),
                spawner::SpawnError::Failed => failed("pthread_create failed"),
            })
        }
    }
}

/// The job thread: takes the GIL, claims the posted job, runs it, and
/// leaves; once more if a request was posted as it was leaving.
extern "C" fn worker_main(arg: *mut c_void) -> *mut c_void {
    let key = Key::from_raw(arg as usize as u32);
    os::thread::set_name(c"memshim-py");
    // Any value arms the key's destructor for this thread.
    if !key.set(true) {
        // Without the destructor a pthread_exit could not be accounted for:
        // do not enter CPython at all.
        WORKER.store(0, SeqCst);
        gate::leave();
        return core::ptr::null_mut();
    }
    // What a job frees ends up in this thread's cache only until the job
    // flushes it (`gc::collect`) or the thread exits; meanwhile the cache
    // makes the thread-state allocation below quick (`new_thread_state`).
    let pid = os::getpid();
    // Leaving: give up the claim, then look once more, so a request posted
    // meanwhile (whose requester saw us alive and started no thread) is not
    // stranded.
    loop {
        let more = take_one();
        STARVED_SINCE_NS.store(0, SeqCst);
        WORKER.store(0, SeqCst);
        if !more
            || PHASE.load(SeqCst) != POSTED
            || WORKER.compare_exchange(0, pid, SeqCst, SeqCst).is_err()
        {
            break;
        }
    }
    // This normal exit does the destructor's work here.
    key.set(false);
    gate::leave();
    core::ptr::null_mut()
}

/// Takes the GIL, and runs the posted job if it is still there. Returns
/// false if the interpreter cannot be entered any more (shutdown).
fn take_one() -> bool {
    let Some(api) = ffi::resolved() else {
        return false;
    };
    if gate::closed() {
        refuse(PythonUnavailable::Finalizing);
        return false;
    }
    if let Err(why) = api.usable() {
        refuse(why);
        return false;
    }
    if PHASE.load(SeqCst) != POSTED {
        return true;
    }
    // 3.15: a PEP 788 guard from before the thread state exists until it is
    // deleted. Finalization cannot begin while it is held, so the attach
    // below can neither be parked nor come too late; once finalization has
    // begun, there is no guard to be had.
    let Some(guard) = Guard::take(api, late_attach()) else {
        refuse(PythonUnavailable::Finalizing);
        return false;
    };
    let Some(tstate) = new_thread_state(api) else {
        guard.close();
        return !gate::closed();
    };
    // Taking the GIL may block. If the runtime starts finalizing meanwhile
    // (possible only before this interpreter's first job registered the
    // exit gate's hook, and never under a guard), CPython ends this thread
    // with pthread_exit, and the key's destructor accounts for it, or parks
    // it for ever, holding nothing of ours (`gate::finalized` writes it off).
    // SAFETY: `tstate` is this thread's new thread state.
    unsafe { (api.restore_thread)(tstate) };
    STARVED_SINCE_NS.store(0, SeqCst);
    if gate::closed() {
        // The exit gate shut while we waited for the GIL: leave at once.
        refuse(PythonUnavailable::Finalizing);
    } else if PHASE
        .compare_exchange(POSTED, RUNNING, SeqCst, SeqCst)
        .is_ok()
    {
        // SAFETY: RUNNING: the slot is ours until we publish DONE.
        let job = unsafe { (*SLOT.job.get()).take() };
        // SAFETY: this thread holds the GIL (is attached) until its thread
        // state is deleted below, after `py` is gone.
        let py = unsafe { Py::assume_attached(api) };
        let outcome = match job {
            Some(job) => {
                gate::ensure_hook(&py);
                #[cfg(memshim_bridge)]
                super::at_fork::ensure_hooks(&py);
                let r = execute(&py, job);
                super::threads::forget_dummy(&py);
                r
            }
            None => Err(PythonUnavailable::Error {
                message: "bridge state lost".into(),
            }),
        };
        // SAFETY: RUNNING: still ours; DONE below hands it over.
        unsafe { *SLOT.outcome.get() = Some(outcome) };
        PHASE.store(DONE, SeqCst);
        futex_wake();
    }
    // Clear it, then delete it and release the GIL in one call, so the
    // runtime's thread-list lock is only taken while we hold the GIL (no
    // fork can copy it held: os.fork holds the GIL).
    // SAFETY: this thread holds the GIL with `tstate`.
    unsafe {
        (api.thread_state_clear)(tstate);
        (api.thread_state_delete_current)();
    }
    // No call into CPython after this (but the guard's release).
    guard.close();
    !gate::closed()
}

/// Answers the posted request, if there is one, with `why` instead of
/// running it, so its requester does not wait out its time limit. Job
/// thread; no call into CPython.
fn refuse(why: PythonUnavailable) {
    if PHASE
        .compare_exchange(POSTED, RUNNING, SeqCst, SeqCst)
        .is_ok()
    {
        // SAFETY: RUNNING: the slot is ours until we publish DONE.
        unsafe {
            *SLOT.job.get() = None;
            *SLOT.outcome.get() = Some(Err(why));
        }
        PHASE.store(DONE, SeqCst);
        futex_wake();
    }
}

/// A thread state for this thread, created inside the fork fence.
///
/// `PyThreadState_New` takes the runtime's thread-list lock without the
/// GIL. A fork by another thread while we held it would leave the lock held
/// in the child, whose `PyOS_AfterFork_Child` then waits for it forever
/// (seen: a multiprocessing child hung under request fire, 3.11). So the
/// creation runs inside the fork fence (`os/fence.rs`), which the fork
/// prepare handler waits for; while a fork is under way we wait for it.
/// (`PyGILState_Ensure` would create the state the same way, but
/// unfenced.) `None`: the interpreter is shutting down.
fn new_thread_state(api: &ffi::Api) -> Option<*mut c_void> {
    prewarm_cache();
    loop {
        let t0 = time::monotonic_ns();
        if gate::closed() || api.usable().is_err() {
            return None;
        }
        if let Some(_fence) = os::fence::enter() {
            // The check above and the creation below must be close in time:
            // a thread descheduled in between could find the interpreter
            // torn down (`PyThreadState_New` on a finalized runtime
            // crashes; docs/python.md, "Shutdown"). If we were held up,
            // look again.
            if time::monotonic_ns().saturating_sub(t0) > RECHECK_NS {
                continue;
            }
            // SAFETY: the runtime is initialised and not finalizing
            // (checked just above, moments ago; the exit gate covers the
            // rest); the main interpreter lives as long as the runtime.
            let t = unsafe { (api.thread_state_new)((api.interp_main)()) };
            return (!t.is_null()).then_some(t);
        }
        time::sleep(Duration::from_micros(200));
    }
}

/// Longest gap between the interpreter check and the thread-state creation.
const RECHECK_NS: u64 = 100_000;

/// Puts one block of each size a thread state may take (3.8-3.13: a few
/// hundred bytes to a few KiB) into this thread's allocator cache, so that
/// `PyThreadState_New`'s allocation is served from it at once, without the
/// arena locks that a main thread tearing down its interpreter keeps busy:
/// the time between our check and the creation stays short.
fn prewarm_cache() {
    for size in [256usize, 512, 1024, 2048, 4096, 8192] {
        // SAFETY: a plain allocation freed at once.
        unsafe { libc::free(libc::calloc(1, size)) };
    }
}

fn execute(py: &Py, job: Job) -> Outcome {
    let err = |message: String| PythonUnavailable::Error { message };
    match job {
        Job::Stats => {
            let section = super::gc::section(py).map_err(err)?;
            let torch = super::torch::section(py).map_err(err)?;
            Ok(Done::Stats(Box::new((section, torch))))
        }
        Job::Gc => super::gc::collect(py).map(Done::Gc).map_err(err),
        Job::Hooks => Ok(Done::Hooks),
        Job::EmptyCache => super::cuda::empty_cache(py)
            .map(Done::EmptyCache)
            .map_err(err),
        Job::CudaRelease => super::cuda::release_steps(py)
            .map(Done::CudaRelease)
            .map_err(err),
        Job::CudaIdle { expect, min_unused } => super::cuda::idle_check(py, expect, min_unused)
            .map(Done::CudaIdle)
            .map_err(err),
        Job::PyTrace(t) => {
            use super::tracemalloc as tm;
            match t {
                PyTraceJob::Status { now_ms } => tm::status(py, now_ms),
                PyTraceJob::Start {
                    frames,
                    deadline_ms,
                    now_ms,
                } => tm::start(py, frames, deadline_ms, now_ms),
                PyTraceJob::Snapshot { top, now_ms } => tm::snapshot(py, top, now_ms),
                PyTraceJob::Stop { now_ms } => tm::stop(py, now_ms),
            }
            .map(|r| Done::PyTrace(Box::new(r)))
            .map_err(err)
        }
    }
}
