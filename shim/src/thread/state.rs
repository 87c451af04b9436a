//! The one owner of the shim thread's state.
//!
//! Everything the constructor, our `pthread_create`, the fork handlers and
//! the shim's thread itself share about that thread is here, in one static
//! of atomics (fork handlers must reach it, and they may only touch
//! atomics). Nothing outside `thread/` reads or writes it; the control
//! endpoint gets a [`Facts`](crate::control::Facts) snapshot instead.

use crate::os;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering::*};

/// Where the shim's thread is in its life.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Phase {
    /// No thread.
    Idle = 0,
    /// Being created (by `arm`), not in its loop yet.
    Starting = 1,
    /// Running its loop.
    Running = 2,
    /// Cleaning up before it exits.
    Stopping = 3,
}

/// A request to the thread to stop now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Stop {
    /// None (or withdrawn).
    No = 0,
    /// Stop if the process is alone but for the shim's threads (a fork or
    /// a namespace change by the process's only thread).
    IfAlone = 1,
    /// Stop whatever the application's threads (a set*id call, a thread
    /// limit, a main thread that ended).
    Always = 2,
}

/// The state. One instance: [`STATE`].
pub struct State {
    phase: AtomicU8,
    /// The process created a thread since the shim's thread last looked.
    wanted: AtomicBool,
    /// A [`Stop`] request to the thread.
    stop: AtomicU8,
    /// pthread_t of the last shim thread started (joinable), 0 if none.
    handle: AtomicUsize,
    /// getpid() of the process this state belongs to.
    pid: AtomicI32,
    /// The constructor has run.
    ctor_done: AtomicBool,
    /// `pthread_create` was called before our constructor ran.
    pending: AtomicBool,
    /// Our `malloc` is the one the process uses (not `dlopen`ed, not
    /// shadowed by an executable with its own malloc, no sanitizer).
    interposed: AtomicBool,
    /// This process is a fork child of a shimmed process.
    fork_child: AtomicBool,
    /// Monotonic ms at constructor (or fork) time, for the uptime figure.
    start_ms: AtomicU64,
    /// How many times the thread was started in this process.
    starts: AtomicU64,
    /// Where a fork handler reaches the running thread's wake pipe: the
    /// thread's id in the high half, the write end's number in the low half
    /// (0: no pipe).
    wake: AtomicU64,
}

touched_at_start! {
    /// The shim thread's state.
    pub static STATE: State = State {
        phase: AtomicU8::new(Phase::Idle as u8),
        wanted: AtomicBool::new(false),
        stop: AtomicU8::new(Stop::No as u8),
        handle: AtomicUsize::new(0),
        pid: AtomicI32::new(0),
        ctor_done: AtomicBool::new(false),
        pending: AtomicBool::new(false),
        interposed: AtomicBool::new(false),
        fork_child: AtomicBool::new(false),
        start_ms: AtomicU64::new(0),
        starts: AtomicU64::new(0),
        wake: AtomicU64::new(0),
    };
}

impl State {
    /// The thread's phase.
    pub fn phase(&self) -> Phase {
        match self.phase.load(Acquire) {
            1 => Phase::Starting,
            2 => Phase::Running,
            3 => Phase::Stopping,
            _ => Phase::Idle,
        }
    }

    /// Sets the phase.
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Release);
    }

    /// Moves from `from` to `to` if the phase is `from`.
    pub fn move_phase(&self, from: Phase, to: Phase) -> bool {
        self.phase
            .compare_exchange(from as u8, to as u8, AcqRel, Acquire)
            .is_ok()
    }

    /// Records that the process created a thread.
    pub fn want(&self) {
        self.wanted.store(true, Release);
    }

    /// Clears the "wanted" flag.
    pub fn clear_wanted(&self) {
        self.wanted.store(false, Release);
    }

    /// Whether a thread was created since [`State::clear_wanted`].
    pub fn wanted(&self) -> bool {
        self.wanted.load(Acquire)
    }

    /// Asks the thread to stop (or withdraws the request: [`Stop::No`]).
    pub fn ask_stop(&self, how: Stop) {
        self.stop.store(how as u8, Release);
    }

    /// Takes a pending stop request.
    pub fn take_stop(&self) -> Stop {
        match self.stop.swap(Stop::No as u8, AcqRel) {
            1 => Stop::IfAlone,
            2 => Stop::Always,
            _ => Stop::No,
        }
    }

    /// Records the handle of a newly started thread.
    pub fn set_handle(&self, t: libc::pthread_t) {
        self.handle.store(t as usize, Release);
        self.starts.fetch_add(1, Relaxed);
    }

    /// Takes the handle of the last thread (to join it), 0 if none.
    pub fn take_handle(&self) -> libc::pthread_t {
        self.handle.swap(0, AcqRel) as libc::pthread_t
    }

    /// Start-up: this process's pid and clock, whether we interpose. The
    /// clock by the system call ([`os::time::monotonic_ms_by_syscall`]): libc's reads
    /// the vDSO's data page, a page fault in every exec.
    #[unsafe(link_section = ".text.startup")]
    pub fn on_load(&self, pid: i32, interposed: bool) {
        self.pid.store(pid, Relaxed);
        self.start_ms
            .store(os::time::monotonic_ms_by_syscall(), Relaxed);
        self.interposed.store(interposed, Relaxed);
    }

    /// The constructor has finished; returns whether a thread was created
    /// before it ran.
    #[unsafe(link_section = ".text.startup")]
    pub fn ctor_finished(&self) -> bool {
        self.ctor_done.store(true, Release);
        self.pending.load(Relaxed)
    }

    /// Whether the constructor has run (else records that a thread was
    /// created before it).
    pub fn ctor_done_or_pend(&self) -> bool {
        if self.ctor_done.load(Acquire) {
            return true;
        }
        self.pending.store(true, Relaxed);
        false
    }

    /// The pid this state belongs to.
    pub fn pid(&self) -> i32 {
        self.pid.load(Relaxed)
    }

    /// Whether our malloc is the process's.
    pub fn interposed(&self) -> bool {
        self.interposed.load(Relaxed)
    }

    /// Whether this is a fork child of a shimmed process.
    pub fn fork_child(&self) -> bool {
        self.fork_child.load(Relaxed)
    }

    /// Milliseconds since the constructor (or the fork) ran.
    pub fn uptime_ms(&self) -> u64 {
        os::time::monotonic_ms().saturating_sub(self.start_ms.load(Relaxed))
    }

    /// How many times the thread was started.
    pub fn starts(&self) -> u64 {
        self.starts.load(Relaxed)
    }

    /// Publishes (or, with `None`, withdraws) where the wake pipe's write
    /// end is: (thread id, descriptor number).
    pub fn set_wake(&self, w: Option<(i32, i32)>) {
        let v = w.map_or(0, |(tid, fd)| {
            (u64::from(tid as u32) << 32) | u64::from(fd as u32)
        });
        self.wake.store(v, Release);
    }

    /// Where the wake pipe's write end is, if there is one.
    pub fn wake(&self) -> Option<(i32, i32)> {
        let v = self.wake.load(Acquire);
        (v != 0).then_some(((v >> 32) as i32, v as u32 as i32))
    }

    /// Fork child: the thread is not here; this is a new process.
    /// Async-signal-safe (atomics only).
    #[unsafe(link_section = ".text.startup")]
    pub fn after_fork_child(&self, pid: i32) {
        // Plain stores (not `os::ResetTo`): the pid and the start time
        // change in every child, so this struct's page is copied anyway.
        // The clock by the system call, as in `on_load`: the vDSO's pages
        // would be faults of the child's own.
        self.pid.store(pid, Relaxed);
        self.fork_child.store(true, Relaxed);
        self.start_ms
            .store(os::time::monotonic_ms_by_syscall(), Relaxed);
        self.starts.store(0, Relaxed);
        self.handle.store(0, Relaxed);
        self.stop.store(Stop::No as u8, Relaxed);
        self.wanted.store(false, Relaxed);
        self.pending.store(false, Relaxed);
        self.wake.store(0, Relaxed);
        self.set_phase(Phase::Idle);
    }
}

touched_at_start! {
    /// The main thread has ended with `pthread_exit` (our wrapper saw it): the
    /// shim's threads have stopped and do not start again in this process.
    /// glibc runs `exit(0)`, with the `atexit` handlers, static destructors and
    /// stdio's flush, on the process's last thread; were that the shim's
    /// thread, it would run them in the shim's own descriptor table, after the
    /// application's table went with its last thread: buffered output and
    /// every write of those handlers would be lost.
    pub static LEADER_GONE: AtomicBool = AtomicBool::new(false);
}
