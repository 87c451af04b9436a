//! A thread that starts threads in the application's descriptor table.
//!
//! A thread shares the descriptor table of the thread that created it.
//! Once the shim's thread has a table of its own (`fd.rs`), every thread it
//! creates would share that private table. The Python bridge's job threads
//! must not: they run Python code (finalizers during `gc`, torch's
//! `empty_cache`) that closes, opens and passes descriptors by number, and
//! those numbers are the application's. So the shim's thread creates this
//! small idle thread *before* it leaves the application's table, and asks
//! it for each job thread ([`spawn_joinable`]; the shim's thread joins it); it is the shim's only other
//! long-lived thread, exists only while the shim's thread runs with a
//! private table in a process that hosts CPython, and is stopped with it.
//!
//! A process that loads CPython only after the shim's thread started (an
//! embedder that `dlopen`s libpython) has no spawner. While none runs, the
//! exported `dlopen` passes every library name to the thread layer, which
//! starts one when the name is CPython's (on the application's thread,
//! which is in its table). Otherwise [`spawn_joinable`] says there is no
//! spawner, and the application's next `pthread_create` starts one
//! ([`wanted`]).

use super::ResetTo;
use super::thread::{self, Stack};
use super::time;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering::*};

const OFF: u32 = 0;
const STARTING: u32 = 1;
const ON: u32 = 2;
const STOPPING: u32 = 3;

touched_at_start! {
    /// The spawner's life.
    static LIFE: AtomicU32 = AtomicU32::new(OFF);
    /// The shim's thread runs with a private table and allows a spawner.
    static ALLOWED: AtomicBool = AtomicBool::new(false);
    /// A job thread was wanted and there was no spawner.
    static WANTED: AtomicBool = AtomicBool::new(false);
    /// What the spawner's thread runs first (a `fn()`; 0 for nothing): set
    /// once by the thread layer, which moves the shim's threads to an arena of
    /// their own.
    static ON_START: AtomicUsize = AtomicUsize::new(0);
    /// pthread_t of the spawner (joinable).
    static HANDLE: AtomicUsize = AtomicUsize::new(0);
    /// 1 while a spawner is allowed and none runs: the exported `dlopen` then
    /// tells the thread layer about each library the application loads, so a
    /// CPython loaded later gets a spawner at once (read by its assembly).
    pub(crate) static WATCH: AtomicU8 = AtomicU8::new(0);
}

fn update_watch() {
    let w = ALLOWED.load(Acquire) && LIFE.load(Acquire) == OFF;
    WATCH.store(u8::from(w), Release);
}

const IDLE: u32 = 0;
const REQUEST: u32 = 1;
const EXIT: u32 = 2;
touched_at_start! {
    /// The request word the spawner waits on (a futex).
    static ORDER: AtomicU32 = AtomicU32::new(IDLE);
    /// The answer: 0 none yet, 1 started, 2 failed (a futex).
    static ANSWER: AtomicU32 = AtomicU32::new(0);
}
static ENTRY: AtomicUsize = AtomicUsize::new(0);
static ARG: AtomicUsize = AtomicUsize::new(0);
/// The started thread's handle (valid once ANSWER is 1).
static STARTED: AtomicUsize = AtomicUsize::new(0);

/// Stack of the spawner: it only calls `pthread_create`.
const STACK: usize = 64 * 1024;

/// Whether a spawner thread exists (or is being created): it counts among
/// the shim's threads.
pub fn alive() -> bool {
    LIFE.load(Acquire) != OFF
}

/// Allows (or, with `false`, forbids) starting a spawner: the shim's
/// thread allows it while it runs with a private table.
pub fn allow(yes: bool) {
    ALLOWED.store(yes, Release);
    if !yes {
        WANTED.store(false, Release);
    }
    update_watch();
}

/// Whether a job thread was asked for while no spawner existed.
pub fn wanted() -> bool {
    WANTED.load(Acquire) && ALLOWED.load(Acquire) && !alive()
}

/// Sets what every spawner thread runs first.
#[unsafe(link_section = ".text.startup")]
pub fn on_start(f: fn()) {
    ON_START.store(f as usize, Release);
}

/// Starts the spawner. Call only on a thread that uses the application's
/// descriptor table (the shim's thread before it leaves it, or an
/// application thread). Returns whether one runs now.
pub fn start() -> bool {
    if !ALLOWED.load(Acquire) {
        return false;
    }
    if LIFE
        .compare_exchange(OFF, STARTING, AcqRel, Acquire)
        .is_err()
    {
        return LIFE.load(Acquire) == ON;
    }
    ORDER.store(IDLE, SeqCst);
    match thread::spawn(main, 0, Stack::Bytes(STACK), false) {
        Some(t) => {
            HANDLE.store(t as usize, Release);
            WANTED.store(false, Release);
            LIFE.store(ON, Release);
            update_watch();
            true
        }
        None => {
            LIFE.store(OFF, Release);
            false
        }
    }
}

/// Stops the spawner and waits until it has ended (shim's thread).
pub fn stop() {
    allow(false);
    // A start on an application's thread takes a few microseconds.
    while LIFE.load(Acquire) == STARTING {
        time::sleep(std::time::Duration::from_micros(100));
    }
    if LIFE
        .compare_exchange(ON, STOPPING, AcqRel, Acquire)
        .is_err()
    {
        return;
    }
    ORDER.store(EXIT, SeqCst);
    time::futex_wake(&ORDER);
    let t = HANDLE.swap(0, AcqRel);
    if t != 0 {
        thread::join(t as libc::pthread_t);
    }
    LIFE.store(OFF, Release);
    update_watch();
}

/// Why no thread was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnError {
    /// The shim's thread has a private table and no spawner runs (CPython
    /// was loaded after the shim's thread started).
    NoSpawner,
    /// `pthread_create` failed.
    Failed,
}

/// Starts a joinable thread, with every signal blocked, that shares the
/// application's descriptor table: directly where the shim's thread shares
/// it, through the spawner where it has a table of its own. Returns its
/// handle; the caller joins it ([`super::thread::join`]: any thread of the
/// process may). Shim's thread only (one request at a time).
pub fn spawn_joinable(
    entry: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: usize,
) -> Result<libc::pthread_t, SpawnError> {
    if !super::fd::private() {
        return thread::spawn(entry, arg, Stack::Default, false).ok_or(SpawnError::Failed);
    }
    if LIFE.load(Acquire) != ON {
        WANTED.store(true, Release);
        return Err(SpawnError::NoSpawner);
    }
    ENTRY.store(entry as usize, SeqCst);
    ARG.store(arg, SeqCst);
    ANSWER.store(0, SeqCst);
    ORDER.store(REQUEST, SeqCst);
    time::futex_wake(&ORDER);
    // The spawner only calls pthread_create: wait for its answer.
    loop {
        match ANSWER.load(SeqCst) {
            0 => time::futex_wait(&ANSWER, 0, None),
            1 => return Ok(STARTED.load(SeqCst) as libc::pthread_t),
            _ => return Err(SpawnError::Failed),
        }
    }
}

/// Fork child: no spawner here. Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    LIFE.reset_to(OFF);
    HANDLE.reset_to(0);
    ORDER.reset_to(IDLE);
    ANSWER.reset_to(0);
    ALLOWED.reset_to(false);
    WANTED.reset_to(false);
    WATCH.reset_to(0);
}

extern "C" fn main(_: *mut c_void) -> *mut c_void {
    let on_start = ON_START.load(Acquire);
    if on_start != 0 {
        // SAFETY: ON_START holds 0 or a `fn()` stored by `on_start`.
        unsafe { core::mem::transmute::<usize, fn()>(on_start)() };
    }
    thread::set_name(c"memshim");
    loop {
        match ORDER.load(SeqCst) {
            IDLE => time::futex_wait(&ORDER, IDLE, None),
            REQUEST => {
                let entry = ENTRY.load(SeqCst);
                // SAFETY: ENTRY holds the `extern "C" fn` that
                // `spawn_joinable` stored before posting the request.
                let entry = unsafe {
                    core::mem::transmute::<usize, extern "C" fn(*mut c_void) -> *mut c_void>(entry)
                };
                let started = thread::spawn(entry, ARG.load(SeqCst), Stack::Default, false);
                STARTED.store(started.unwrap_or(0) as usize, SeqCst);
                let ok = started.is_some();
                // Idle before answering: the requester may post the next
                // request as soon as it sees the answer.
                ORDER.store(IDLE, SeqCst);
                ANSWER.store(if ok { 1 } else { 2 }, SeqCst);
                time::futex_wake(&ANSWER);
            }
            _ => return core::ptr::null_mut(),
        }
    }
}
