//! The only file that talks to jemalloc's control interface (`mallctl`).
//!
//! Each function names the mallctl key it reads or writes; the keys are
//! described in jemalloc's manual (`man jemalloc`, "MALLCTL NAMESPACE").
//! Nearly nothing here is on the allocation path: these run in the
//! constructor, the shim's own thread, fork handlers, or glibc-API calls
//! such as `malloc_trim`. The exceptions are the big blocks' checks
//! ([`note_allocation`], [`big_block_flags`]): atomics, and a `mallctl`
//! once per process.
//! jemalloc's fork functions are called from here too ("Lazy initialisation
//! and fork" below).

use crate::os::ResetTo;
use core::ffi::{c_char, c_int, c_void};
use core::fmt::Write;
use core::ptr;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};
use tikv_jemalloc_sys as sys;

/// `MALLCTL_ARENAS_ALL`: the pseudo-arena index meaning "every arena".
pub const ARENAS_ALL: u32 = 4096;

/// An errno returned by `mallctl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error(pub c_int);

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let what = match self.0 {
            libc::EINVAL => "invalid value",
            libc::ENOENT => "no such mallctl key",
            libc::EPERM => "not writable",
            libc::EAGAIN => "resource unavailable",
            libc::EFAULT => "failure while applying the value",
            _ => "mallctl failed",
        };
        write!(f, "{what} (errno {})", self.0)
    }
}

/// Reads a value of type `T` from a NUL-terminated key.
fn read<T: Copy>(key: &[u8]) -> Result<T, Error> {
    debug_assert_eq!(key.last(), Some(&0));
    let mut value = core::mem::MaybeUninit::<T>::uninit();
    let mut len = core::mem::size_of::<T>();
    // SAFETY: `key` is NUL-terminated; `value`/`len` describe a buffer of
    // exactly the size jemalloc documents for that key (callers pick T).
    let rc = unsafe {
        sys::mallctl(
            key.as_ptr().cast::<c_char>(),
            value.as_mut_ptr().cast::<c_void>(),
            &mut len,
            ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return Err(Error(rc));
    }
    if len != core::mem::size_of::<T>() {
        return Err(Error(libc::EINVAL));
    }
    // SAFETY: jemalloc wrote exactly size_of::<T>() bytes.
    Ok(unsafe { value.assume_init() })
}

/// Writes `len` bytes at `value` (none for an action) to a NUL-terminated key.
fn set(key: &[u8], value: *mut c_void, len: usize) -> Result<(), Error> {
    debug_assert_eq!(key.last(), Some(&0));
    // SAFETY: `key` is NUL-terminated; `value` is null with `len` 0 (an
    // action key takes no buffer) or points to `len` live bytes of the type
    // the key expects (callers below).
    let rc = unsafe {
        sys::mallctl(
            key.as_ptr().cast::<c_char>(),
            ptr::null_mut(),
            ptr::null_mut(),
            value,
            len,
        )
    };
    if rc == 0 { Ok(()) } else { Err(Error(rc)) }
}

/// Writes `value` to a NUL-terminated key.
fn write<T: Copy>(key: &[u8], mut value: T) -> Result<(), Error> {
    set(key, (&raw mut value).cast(), core::mem::size_of::<T>())
}

/// Runs a key that takes no value (an action such as `arena.4096.purge`).
fn run(key: &[u8]) -> Result<(), Error> {
    set(key, ptr::null_mut(), 0)
}

/// A key with an arena index in it, such as `arena.3.dirty_decay_ms`.
fn arena_key(arena: u32, suffix: &str) -> crate::os::StackBuf<64> {
    let mut k = crate::os::StackBuf::<64>::new();
    let _ = write!(k, "arena.{arena}.{suffix}\0");
    k
}

/// `version`: jemalloc's version string. Reading it also forces jemalloc to
/// initialise if nothing has allocated yet.
pub fn version() -> &'static str {
    match read::<*const c_char>(b"version\0") {
        // SAFETY: jemalloc returns a pointer to a static NUL-terminated string.
        Ok(p) if !p.is_null() => unsafe { core::ffi::CStr::from_ptr(p) }
            .to_str()
            .unwrap_or("?"),
        _ => "?",
    }
}

// --- Lazy initialisation and fork ----------------------------------------------
//
// jemalloc initialises on the first allocation of the process, not in every
// exec: the link drops its constructor (build.rs, `link.ld`), so a
// process that never allocates (`/bin/true`, most of a shell's children
// before `exec`) never pays for it. jemalloc's constructor was there for one
// race: a thread created before the first allocation could be initialising
// jemalloc, before its fork handlers exist, while another thread forks. The
// shim closes it instead: every thread it or the application creates goes
// through [`ensure_init`] first.
//
// jemalloc registers its fork functions with `pthread_atfork` during its
// initialisation. glibc runs prepare handlers in reverse order of
// registration, and jemalloc's prepare (which locks every arena) must run
// after the shim's, which waits for the shim's thread to exit, something
// that needs those locks. Every registration goes through
// `--wrap=pthread_atfork` ([`claim_atfork`]):
// * jemalloc initialised before the shim's handlers were registered (an
//   allocation in the loader or in an earlier library's constructor): its
//   registration goes to glibc, first, as it always did, and its functions
//   run from then on, even for a fork inside such a constructor;
// * jemalloc initialised later: its registration is kept from glibc, and
//   the shim's handlers call its functions in the places glibc would have
//   if it had registered first: its prepare after the shim's, its parent
//   and child handlers before the shim's.
//
// In the second case a fork by a process that has no other thread takes
// none of jemalloc's locks, as glibc's `fork` takes none of its own malloc's
// when single-threaded: no other thread can hold one, so there is nothing
// to lock in the parent or to reinitialise in the child. Locking them
// writes to every page that holds one of jemalloc's mutexes, in the parent
// and again in the child, each a copy-on-write fault: 38 faults per
// command of a shell, 40 % of what its `fork` and `exec` of `/bin/true`
// cost under glibc (bench/FINDINGS-issue15.md, "Single-threaded forks").
// "No other thread" is the kernel's count, where glibc's test is "never
// had one": the shim's own thread, which the prepare handler stops first,
// and threads that have exited no longer count. A thread that is exiting
// still counts until its last user-space code (jemalloc's thread-exit
// cleanup included) has run. Only the forking thread can create another
// before the fork, with two exotic exceptions that glibc's own malloc does
// not cover either: a prepare handler registered before the shim's (it
// runs after the count) that starts a thread, and a task cloned with
// `CLONE_VM` but not `CLONE_THREAD`, which shares the heap without being
// one of the process's threads.

unsafe extern "C" {
    // jemalloc's fork functions (jemalloc.c), hidden in this library.
    #[link_name = "_rjem_je_jemalloc_prefork"]
    fn je_prefork();
    #[link_name = "_rjem_je_jemalloc_postfork_parent"]
    fn je_postfork_parent();
    #[link_name = "_rjem_je_jemalloc_postfork_child"]
    fn je_postfork_child();
    // jemalloc's own purging threads are on (background_thread.c: an
    // `atomic_b_t`, a `bool`). Their state is reset in the child by
    // `je_postfork_child`, so a fork never skips it while they are on.
    #[link_name = "_rjem_je_background_thread_enabled_state"]
    static JE_BACKGROUND_THREADS_ON: AtomicBool;
}

touched_at_start! {
    /// The shim's fork handlers are registered with glibc. Written by the
    /// constructor.
    static SHIM_HANDLERS: AtomicBool = AtomicBool::new(false);
    /// jemalloc registered its fork functions after the shim's handlers: they
    /// run from inside the shim's.
    static FORK_READY: AtomicBool = AtomicBool::new(false);
    /// jemalloc's prepare ran for the fork under way: the parent and child
    /// handlers must run its others. Only [`prefork`] sets it, after seeing
    /// `FORK_READY`, so it implies that flag. Written by a forking thread, and
    /// only when it changes, so a process that forks again and again writes its
    /// page once. Two threads forking at once both count two threads and both
    /// write `true`; only a thread that is truly alone writes `false`.
    static LOCKED_FOR_FORK: AtomicBool = AtomicBool::new(false);
}

// --- errno through jemalloc's initialisation ----------------------------------
//
// jemalloc initialises on the first allocation (or in the constructor where
// the shim needs it there), and its initialisation changes errno: parsing a
// number of its configuration sets errno to 0, and its system calls may
// fail. A program that allocates between a failed call and its `perror`
// (`printf` allocates its buffer) would then print "Success". glibc's
// `malloc` leaves errno alone when it succeeds, so the shim keeps it
// through the initialisation, with nothing on the allocation path: errno
// is taken when jemalloc asks for its configuration (the first thing it
// does that reaches the shim, after reading `/etc/…malloc.conf`, which
// keeps errno itself) and put back when it registers its fork functions,
// after every step that can change it (`malloc_init_hard_a0_locked` and
// the CPU count). What follows (the arenas, the first thread cache) makes
// no call that sets errno except through the wrappers that keep it
// (exports.rs, "jemalloc's system calls keep errno"). A failed
// allocation still sets ENOMEM, after this.

touched_at_start! {
    /// errno as jemalloc's initialisation found it.
    static ERRNO_AT_INIT: AtomicI32 = AtomicI32::new(0);
}

/// jemalloc's initialisation has begun (it asks for its configuration):
/// remembers errno.
#[unsafe(link_section = ".text.startup")]
pub fn init_began() {
    ERRNO_AT_INIT.store(crate::os::errno(), Relaxed);
}

/// jemalloc registers its fork functions (`prepare`): past the steps of its
/// initialisation that change errno, which gets back what it had when
/// [`init_began`]. Only for jemalloc's own registration.
#[unsafe(link_section = ".text.startup")]
pub fn init_past_errno(prepare: usize) {
    if prepare == je_prefork as *const () as usize {
        crate::os::set_errno(ERRNO_AT_INIT.load(Relaxed));
    }
}

/// The shim's fork handlers are registered (`thread::on_load`, once).
#[unsafe(link_section = ".text.startup")]
pub fn shim_fork_handlers_registered() {
    SHIM_HANDLERS.store(true, Release);
}

/// For the `pthread_atfork` wrapper: true if `prepare` is jemalloc's and the
/// shim's handlers are registered already; its functions then run from
/// those handlers, and the registration is not passed to glibc.
pub fn claim_atfork(prepare: usize) -> bool {
    if prepare != je_prefork as *const () as usize || !SHIM_HANDLERS.load(Acquire) {
        return false;
    }
    FORK_READY.store(true, Release);
    true
}

/// jemalloc's fork prepare: locks every allocator mutex. Runs last of the
/// shim's prepare handler; nothing if jemalloc has not initialised, or
/// registered its functions with glibc itself, or the forking thread is
/// the process's only one (`alone`, the kernel's count taken by the
/// prepare handler) and jemalloc's purging threads are off.
pub fn prefork(alone: bool) {
    if !FORK_READY.load(Acquire) {
        return;
    }
    // SAFETY: jemalloc's flag, a plain atomic bool it reads relaxed too.
    let background = unsafe { JE_BACKGROUND_THREADS_ON.load(Relaxed) };
    let lock = !alone || background;
    LOCKED_FOR_FORK.reset_to(lock);
    if lock {
        // SAFETY: jemalloc's own atfork prepare function, called where
        // glibc would call it; jemalloc has handed it to us (FORK_READY).
        unsafe { je_prefork() }
    }
}

/// jemalloc's fork parent handler; pairs with [`prefork`].
pub fn postfork_parent() {
    if LOCKED_FOR_FORK.load(Relaxed) {
        // SAFETY: as `prefork`: the parent handler after jemalloc's prepare.
        unsafe { je_postfork_parent() }
    }
}

/// jemalloc's fork child handler; pairs with [`prefork`]. Async-signal-safe
/// as jemalloc's is: it reinitialises the mutexes `prefork` locked.
#[unsafe(link_section = ".text.startup")]
pub fn postfork_child() {
    if LOCKED_FOR_FORK.load(Relaxed) {
        // SAFETY: as `prefork`: the child handler after jemalloc's prepare.
        unsafe { je_postfork_child() }
    }
}

/// Initialises jemalloc if nothing has allocated yet, without touching its
/// control interface: any `mallctl` call runs `ctl_init`, which allocates and
/// zeroes jemalloc's statistics tables (about 150 KiB, ~37 page faults and
/// ~180 k instructions in every process; bench/FINDINGS-issue15.md).
/// `nallocx` only runs `malloc_init`.
pub fn ensure_init() {
    // SAFETY: nallocx has no preconditions; it initialises jemalloc and
    // computes a size class, allocating nothing.
    let _ = unsafe { sys::nallocx(1, 0) };
}

/// `arena.4096.purge`: returns every unused dirty and muzzy page of every
/// arena to the OS now. Pages held in thread caches are not reached.
pub fn purge_all() -> Result<(), Error> {
    run(b"arena.4096.purge\0")
}

/// `arena.4096.decay`: purges the share of unused pages that the decay
/// curves say is due by now. This is what the shim's thread runs on every
/// tick, so an idle process still gives memory back.
pub fn decay_all() -> Result<(), Error> {
    run(b"arena.4096.decay\0")
}

/// `thread.tcache.flush`: empties the calling thread's cache.
pub fn flush_own_tcache() -> Result<(), Error> {
    run(b"thread.tcache.flush\0")
}

/// `thread.tcache.enabled = false` for the calling thread (the shim's own
/// thread allocates little and should not hold a cache).
pub fn disable_own_tcache() -> Result<(), Error> {
    write(b"thread.tcache.enabled\0", false)
}

/// The arena of the shim's own threads (0 until created: arena 0 is always
/// an automatic one, so 0 never names it).
static OWN_ARENA: AtomicU32 = AtomicU32::new(0);

/// Moves the calling thread (the shim's thread or the spawner, which live
/// as long as the shim runs) to an arena of the shim's own: created once
/// with `arenas.create`, entered with `thread.arena`.
///
/// jemalloc gives each thread, at its first call, the automatic arena with
/// the fewest threads, and creates a new one while any of the
/// `opt.narenas` slots is free. A shim thread counted there would skew the
/// application's layout for as long as it runs: with as many slots as busy
/// threads, two of the application's threads would share an arena while
/// the shim's, which hardly allocates, had one to itself (`tput medium 2`
/// with `MEMSHIM_NARENAS=2` ran 2.9× slower in a third of the runs; see
/// bench/FINDINGS-issue15.md). A created arena lies beyond the automatic
/// slots, which jemalloc alone hands out. The thread's first call has
/// bound it to an automatic arena for the moment until this moves it (the
/// binding jemalloc makes at a thread's start cannot be avoided); that
/// arena's count is back where it was afterwards. If no other thread is
/// bound to it, jemalloc purges it as the thread leaves (`arena_migrate`).
/// The Python bridge's job threads do not move: they live for one job, and
/// each move could purge an idle arena.
pub fn use_own_arena() -> Result<(), Error> {
    write(b"thread.arena\0", own_arena()?)
}

/// The index of the shim's own arena, created on first use.
fn own_arena() -> Result<u32, Error> {
    let mut index = OWN_ARENA.load(Acquire);
    if index == 0 {
        let created = read::<u32>(b"arenas.create\0")?;
        // Only the shim's thread creates it, before it starts any other;
        // should two ever race, both use the first one's.
        index = match OWN_ARENA.compare_exchange(0, created, AcqRel, Acquire) {
            Ok(_) => created,
            Err(first) => first,
        };
    }
    Ok(index)
}

// --- Large frees in the first arena -------------------------------------------
//
// The shim turns jemalloc's huge arena off (`oversize_threshold:0`,
// options.rs) so that freed buffers of 8 MiB and more wait for the decay
// like everything else, instead of being purged at once and faulted in
// again at their next use. jemalloc 5.3.1 does this for every arena but the
// first: arena 0 is created with the built-in threshold before
// `arena_init_huge` turns the option into one, and that copies it into
// arena 0 only when the huge arena is on. So arena 0, the main thread's,
// keeps the built-in 8 MiB: a free there that leaves
// 8 MiB or more free in one piece (after coalescing) is purged at once
// (`extent_record`), and a buffer of that size the main thread frees and
// allocates again faults in every page each time (`x * 2.0 + x` on 16 MiB
// PyTorch tensors ran 6x slower than with the pages kept, 4x slower than
// under glibc, which keeps them; bench/bigblocks.py, 5 to 25 MiB blocks in
// one thread, 4.6x glibc's time).
//
// So arena 0's threshold is raised to [`FIRST_ARENA_KEEPS_BELOW`]
// (`arena.0.oversize_threshold`) at the first allocation of
// [`LIFT_AT`] or more ([`note_allocation`]) or when the shim's thread
// starts, whichever comes first, and stays there, in a fork child too.
// Not at load: the write runs jemalloc's `ctl_init` (see [`ensure_init`]),
// which a process that never allocates a big block should not pay. Not at
// a `realloc`: a buffer grown by `realloc` alone keeps jemalloc's 8 MiB, so
// its copies of 8 to 32 MiB go back at once (`io.BytesIO` grown to 256 MiB
// in one thread: 523 MB peak and 47 MB left after `del`, against 690 MB
// and 212 MB if `realloc` lifted it; after a big `malloc` it is 604 MB and
// 129 MB, the price of the lift in such a process until its decay runs).
//
// What arena 0 then keeps is bounded twice. Per free: a piece of 32 MiB or
// more (after coalescing) still goes back at once, all of it, so a buffer
// grown by `realloc` (`io.BytesIO`, a list) never leaves a whole series of
// large copies behind (`io.BytesIO` grown to 256 MiB with no bound peaked
// at 1.27 GB instead of 0.50 GB). In time: the decay returns what is kept,
// run by the shim's thread where it runs and otherwise by jemalloc's
// inline decay, which every allocation and free in the arena ticks (about
// every thousandth looks at the 1 s curve), as it does for every smaller
// block today. What it does not bound is a process without the thread
// that frees big blocks and then stops calling `malloc`: it keeps them
// (bench/bigblocks.py's "idle" column; glibc keeps its heap top there too)
// until its next allocations, as it keeps freed blocks below 8 MiB.
// Starting the shim's thread at a big free instead would return them, and
// break "a single-threaded process stays single-threaded" (docs/design.md,
// Threads). A huge arena the user turned on (their own
// `oversize_threshold`) keeps their threshold.

/// Arena 0's threshold once lifted: a free that leaves less than this free
/// in one piece (after coalescing) waits for the decay, one that leaves
/// this much or more goes back at once, all of it. glibc draws the same
/// line at its largest mmap threshold (32 MiB on 64-bit): it keeps freed
/// blocks up to that size for reuse.
const FIRST_ARENA_KEEPS_BELOW: usize = 32 << 20;

/// An allocation of this size or more lifts arena 0's threshold: the
/// smallest block that arena 0 would purge at its free (jemalloc's
/// built-in threshold).
const LIFT_AT: usize = 8 << 20;

/// Arena 0's threshold is lifted (or the lift was tried: once is enough).
static FIRST_ARENA_LIFTED: AtomicBool = AtomicBool::new(false);

/// Called by the allocation functions but `realloc` with the size asked
/// for, before allocating: one comparison, and the lift at the first big
/// one.
#[inline(always)]
pub fn note_allocation(size: usize) {
    if size >= LIFT_AT {
        first_big_allocation();
    }
}

#[cold]
#[inline(never)]
fn first_big_allocation() {
    if !FIRST_ARENA_LIFTED.load(Relaxed) {
        lift_first_arena_threshold();
    }
}

/// Lifts arena 0's `oversize_threshold` to [`FIRST_ARENA_KEEPS_BELOW`]
/// (the first big allocation; the shim's thread starts). Nothing when it
/// already is, or when the huge arena is on. Initialises jemalloc if need
/// be (`mallctl` does).
pub fn lift_first_arena_threshold() {
    // Set first: the reads below may allocate inside jemalloc, and a second
    // caller meanwhile has nothing to add.
    if FIRST_ARENA_LIFTED.swap(true, Relaxed) || read::<usize>(b"opt.oversize_threshold\0") != Ok(0)
    {
        return;
    }
    let _ = write(b"arena.0.oversize_threshold\0", FIRST_ARENA_KEEPS_BELOW);
}

// --- Big blocks in one shared arena ------------------------------------------
//
// jemalloc gives a program's threads arenas of their own (4 per CPU), and a
// freed block waits as dirty pages in its thread's arena until the decay
// returns it (1 s). For the big buffers a server allocates per request
// (hundreds of KiB to MiBs), that means one thread faults in fresh pages
// while another thread's arena holds the ones it just freed: scenario 3's
// peak was 1.14x to 1.4x glibc's, and at its highest sample 28 of 49 MB
// were such dirty pages (bench/FINDINGS-peak.md). So while the shim's
// thread runs, allocations of [`BIG_AT`] up to [`FIRST_ARENA_KEEPS_BELOW`]
// go to one arena that every thread shares ([`share_big_blocks`]), created
// by the shim with the usual decay, where one thread reuses what another
// freed. Smaller sizes keep their per-thread arenas: sharing from 256 KiB
// up raised scenario 9's `stress` peak (blocks of up to 1 MiB written only
// at their ends) from 23 to 34 MB for little more of scenario 3's gain, and
// sharing every size (one arena per CPU) made the 32-64 KiB blocks, which
// bypass the thread caches, contend for one lock. Larger sizes keep theirs
// too, so that the first arena still returns a free of 32 MiB or more at
// once, as above, and glibc draws its line there too (it maps and unmaps
// every block above its largest mmap threshold).
//
// Only while the thread runs, because the thread's decay is what returns
// the shared arena's pages: jemalloc's inline decay ticks an arena only on
// calls into it, and the big blocks are few. In a process without the
// thread (single-threaded under `auto`, a fork child before the thread is
// back, `MEMSHIM_CONTROL=off`) they stay where jemalloc puts them, with
// the first arena's bound above. A `realloc` is never sent there: a buffer
// it moves goes to the thread's arena, so the first arena's 32 MiB bound
// still holds for buffers grown by `realloc` in the main thread. Not where
// the user turned jemalloc's huge arena on (their own
// `oversize_threshold`): it takes the blocks of that size and more.
// jemalloc's huge arena cannot serve as the shared one: the threshold that
// sends blocks there also makes every arena purge at once each free run of
// that size (bench/FINDINGS-peak.md).

/// Allocations of this size or more go to the shared arena while the
/// shim's thread runs.
pub const BIG_AT: usize = 1 << 20;

/// Big blocks are shared now: the shim's thread runs, and the user has not
/// turned jemalloc's huge arena on.
static SHARING: AtomicBool = AtomicBool::new(false);

/// The shared arena's index; 0 until the first big block creates it (0 is
/// always an automatic arena), [`CREATING`] while one thread does, and for
/// good if `arenas.create` failed.
static BIG_ARENA: AtomicU32 = AtomicU32::new(0);

/// [`BIG_ARENA`] while a thread creates it, or after that failed.
const CREATING: u32 = u32::MAX;

/// The `mallocx` flags for a block of `size` bytes, [`BIG_AT`] or more:
/// the shared arena's, or `None` where it goes where jemalloc puts it
/// (not shared now, or too big to share). The first such block creates
/// the arena, so a process that never allocates one has none.
#[inline(always)]
pub fn big_block_flags(size: usize) -> Option<c_int> {
    if !SHARING.load(Relaxed) || size >= FIRST_ARENA_KEEPS_BELOW {
        return None;
    }
    match BIG_ARENA.load(Acquire) {
        0 => create_big_arena(),
        CREATING => None,
        index => Some(sys::MALLOCX_ARENA(index as usize)),
    }
}

/// `arenas.create`, once. A thread that comes while another creates it
/// allocates where jemalloc puts it, without waiting; if it fails (jemalloc
/// ran out of arena slots), big blocks are never shared.
#[cold]
#[inline(never)]
fn create_big_arena() -> Option<c_int> {
    if BIG_ARENA
        .compare_exchange(0, CREATING, Acquire, Relaxed)
        .is_err()
    {
        return None;
    }
    match read::<u32>(b"arenas.create\0") {
        Ok(index) if index != 0 && index != CREATING => {
            BIG_ARENA.store(index, Release);
            Some(sys::MALLOCX_ARENA(index as usize))
        }
        _ => None,
    }
}

/// From now on, big blocks go to the shared arena. The shim's thread, as
/// it starts (or does not stop after all).
pub fn share_big_blocks() {
    if read::<usize>(b"opt.oversize_threshold\0") == Ok(0) {
        SHARING.store(true, Relaxed);
    }
}

/// Big blocks go where jemalloc puts them again: the shim's thread stops.
pub fn stop_sharing_big_blocks() {
    SHARING.store(false, Relaxed);
}

/// Fork child: the shim's thread is not there. A creation another thread
/// of the parent had begun is not finished here; the child's first big
/// block once it shares again tries anew. Async-signal-safe (atomics).
pub fn big_blocks_after_fork_child() {
    SHARING.store(false, Relaxed);
    let _ = BIG_ARENA.compare_exchange(CREATING, 0, Relaxed, Relaxed);
}

/// `epoch`: refreshes the statistics snapshot that `stats.*` keys read.
pub fn advance_epoch() -> Result<(), Error> {
    write(b"epoch\0", 1u64)
}

/// Effective decay settings for arenas created from now on
/// (`arenas.dirty_decay_ms`, `arenas.muzzy_decay_ms`).
pub fn decay_ms() -> Result<(i64, i64), Error> {
    Ok((
        read::<isize>(b"arenas.dirty_decay_ms\0")? as i64,
        read::<isize>(b"arenas.muzzy_decay_ms\0")? as i64,
    ))
}

/// Changes decay at runtime: the default for new arenas
/// (`arenas.{dirty,muzzy}_decay_ms`) and every existing arena
/// (`arena.<i>.{dirty,muzzy}_decay_ms`). `-1` means never.
pub fn set_decay_ms(dirty: Option<i64>, muzzy: Option<i64>) -> Result<(), Error> {
    let narenas = read::<u32>(b"arenas.narenas\0")?;
    for (value, default_key, suffix) in [
        (dirty, &b"arenas.dirty_decay_ms\0"[..], "dirty_decay_ms"),
        (muzzy, &b"arenas.muzzy_decay_ms\0"[..], "muzzy_decay_ms"),
    ] {
        let Some(ms) = value else { continue };
        let ms = isize::try_from(ms).map_err(|_| Error(libc::EINVAL))?;
        write(default_key, ms)?;
        for i in 0..narenas {
            // Arenas that were never initialised answer EFAULT; they will
            // pick up the new default when they are created.
            let _ = write(arena_key(i, suffix).as_bytes(), ms);
        }
    }
    Ok(())
}

/// Process-wide allocator figures, in bytes, from one `epoch` snapshot:
/// the protocol's type, whose fields docs/stats.md defines (`stats.allocated`,
/// `stats.active`, `stats.resident`, `stats.mapped`, `stats.retained`,
/// `stats.metadata`; `stats.arenas.4096.pdirty`/`pmuzzy` × page size;
/// `stats.arenas.4096.tcache_bytes`).
pub type Stats = memshim_proto::AllocatorStats;

/// `arenas.page`: jemalloc's page size.
pub fn page_size() -> u64 {
    read::<usize>(b"arenas.page\0")
        .map(|p| p as u64)
        .unwrap_or(4096)
}

/// `arenas.narenas`: number of arena slots: the automatic ones
/// (`opt.narenas`) and those created since, the shim's own included.
pub fn narenas() -> u32 {
    read::<u32>(b"arenas.narenas\0").unwrap_or(0)
}

/// `opt.narenas`: number of automatic arena slots, the ones jemalloc hands
/// out to threads (`MEMSHIM_NARENAS`, or jemalloc's count).
pub fn narenas_auto() -> u32 {
    read::<u32>(b"opt.narenas\0").unwrap_or(0)
}

/// Takes a fresh statistics snapshot.
pub fn stats() -> Result<Stats, Error> {
    advance_epoch()?;
    let page = page_size();
    let sz = |k: &[u8]| read::<usize>(k).map(|v| v as u64);
    Ok(Stats {
        allocated: sz(b"stats.allocated\0")?,
        active: sz(b"stats.active\0")?,
        resident: sz(b"stats.resident\0")?,
        mapped: sz(b"stats.mapped\0")?,
        retained: sz(b"stats.retained\0")?,
        metadata: sz(b"stats.metadata\0")?,
        dirty: sz(b"stats.arenas.4096.pdirty\0")? * page,
        muzzy: sz(b"stats.arenas.4096.pmuzzy\0")? * page,
        tcache: sz(b"stats.arenas.4096.tcache_bytes\0").unwrap_or(0),
        purgeable: 0,
    })
    .map(|mut s: Stats| {
        s.purgeable = s.dirty + s.muzzy;
        s
    })
}

/// Per-arena summary (the protocol's type): `stats.arenas.<i>.nthreads`,
/// `pactive`/`pdirty`/`pmuzzy` × page size, `resident`, `tcache_bytes`.
pub type ArenaStats = memshim_proto::ArenaStats;

/// Per-arena summaries of initialised arenas (after `advance_epoch`).
pub fn arena_stats(index: u32) -> Option<ArenaStats> {
    let init = {
        let mut k = crate::os::StackBuf::<64>::new();
        let _ = write!(k, "arena.{index}.initialized\0");
        read::<bool>(k.as_bytes()).ok()?
    };
    if !init {
        return None;
    }
    let page = page_size();
    let key = |suffix: &str| {
        let mut k = crate::os::StackBuf::<64>::new();
        let _ = write!(k, "stats.arenas.{index}.{suffix}\0");
        k
    };
    let sz = |s: &str| {
        read::<usize>(key(s).as_bytes())
            .map(|v| v as u64)
            .unwrap_or(0)
    };
    Some(ArenaStats {
        index,
        threads: read::<u32>(key("nthreads").as_bytes()).unwrap_or(0),
        active: sz("pactive") * page,
        dirty: sz("pdirty") * page,
        muzzy: sz("pmuzzy") * page,
        resident: sz("resident"),
        tcache: sz("tcache_bytes"),
    })
}

/// A few `opt.*` values, for `MEMSHIM_VERBOSE` and the stats report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opts {
    /// `opt.dirty_decay_ms`
    pub dirty_decay_ms: i64,
    /// `opt.muzzy_decay_ms`
    pub muzzy_decay_ms: i64,
    /// `opt.narenas`
    pub narenas: u32,
    /// `opt.tcache_max`
    pub tcache_max: u64,
    /// `opt.background_thread` (jemalloc's own purging threads)
    pub background_thread: bool,
    /// `opt.oversize_threshold`
    pub oversize_threshold: u64,
    /// `opt.retain`
    pub retain: bool,
}

/// Reads the `opt.*` values in [`Opts`].
pub fn opts() -> Opts {
    Opts {
        dirty_decay_ms: read::<isize>(b"opt.dirty_decay_ms\0").unwrap_or(0) as i64,
        muzzy_decay_ms: read::<isize>(b"opt.muzzy_decay_ms\0").unwrap_or(0) as i64,
        narenas: read::<u32>(b"opt.narenas\0").unwrap_or(0),
        tcache_max: read::<usize>(b"opt.tcache_max\0").unwrap_or(0) as u64,
        background_thread: read::<bool>(b"opt.background_thread\0").unwrap_or(false),
        oversize_threshold: read::<usize>(b"opt.oversize_threshold\0").unwrap_or(0) as u64,
        retain: read::<bool>(b"opt.retain\0").unwrap_or(false),
    }
}

/// `background_thread`: whether jemalloc's own purging threads run.
pub fn background_thread() -> bool {
    read::<bool>(b"background_thread\0").unwrap_or(false)
}

/// `config.stats`: statistics compiled in (the `stats` cargo feature).
pub fn stats_enabled() -> bool {
    read::<bool>(b"config.stats\0").unwrap_or(false)
}

/// `opt.thp` (`default`, `always` or `never`): what jemalloc asks of
/// transparent huge pages for its mappings (`MADV_HUGEPAGE` for `always`
/// where the system's mode is `madvise`, `MADV_NOHUGEPAGE` for `never`).
/// `None` where this jemalloc has no such option.
pub fn opt_thp() -> Option<&'static core::ffi::CStr> {
    match read::<*const c_char>(b"opt.thp\0") {
        // SAFETY: jemalloc's static NUL-terminated name of the mode.
        Ok(p) if !p.is_null() => Some(unsafe { core::ffi::CStr::from_ptr(p) }),
        _ => None,
    }
}

// --- Heap profiles -------------------------------------------------------------
//
// With `MEMSHIM_PROFILE=on` jemalloc starts with `prof:true,prof_active:false`
// (options.rs): its profiler is ready, and samples nothing until
// `prof.active` is set (`profile.rs`, on the shim's thread).

/// `opt.prof`: the profiler was started with the process.
pub fn prof_ready() -> bool {
    read::<bool>(b"opt.prof\0").unwrap_or(false)
}

/// `config.prof_libgcc`: this jemalloc takes its call stacks with libgcc's
/// DWARF unwinder (`_Unwind_Backtrace`). Its configure script chooses that
/// only where a test program links `-lgcc` with that symbol; elsewhere (zig,
/// the wheel's linker, before `.cargo/config.toml` answered the check) it
/// falls back to `__builtin_frame_address`, a walk of frame pointers that
/// follows whatever a frame compiled without them left in `rbp`: a SIGSEGV
/// in the first sampled allocation under CPython (issue 44). Sampling is
/// refused where this is false (`profile.rs`).
pub fn prof_unwinds_with_dwarf() -> bool {
    read::<bool>(b"config.prof_libgcc\0").unwrap_or(false)
}

/// `prof.active`: sampling is on.
pub fn prof_active() -> bool {
    read::<bool>(b"prof.active\0").unwrap_or(false)
}

/// Sets `prof.active`.
pub fn set_prof_active(on: bool) -> Result<(), Error> {
    write(b"prof.active\0", on)
}

/// `prof.lg_sample`: one sample per 2^n bytes allocated, on average.
pub fn prof_lg_sample() -> u32 {
    read::<usize>(b"prof.lg_sample\0").map_or(0, |n| n as u32)
}

/// `prof.reset`: forgets every sample, keeping the sampling interval.
pub fn prof_reset() -> Result<(), Error> {
    run(b"prof.reset\0")
}

/// `prof.dump`: writes the heap profile to `path` (jemalloc `creat`s it).
pub fn prof_dump(path: &core::ffi::CStr) -> Result<(), Error> {
    write(b"prof.dump\0", path.as_ptr())
}

/// What jemalloc calls for a sampled allocation's call stack: fills
/// `vec[..*len]`, at most `max` return addresses, innermost first.
pub type BacktraceHook = unsafe extern "C" fn(*mut *mut c_void, *mut u32, u32);

/// `experimental.hooks.prof_backtrace`: the hook in use (jemalloc's own,
/// libgcc's unwinder, until the shim sets its own).
pub fn prof_backtrace_hook() -> Result<BacktraceHook, Error> {
    read::<BacktraceHook>(b"experimental.hooks.prof_backtrace\0")
}

/// Sets `experimental.hooks.prof_backtrace` (profile/python_stack.rs).
pub fn set_prof_backtrace_hook(hook: BacktraceHook) -> Result<(), Error> {
    write(b"experimental.hooks.prof_backtrace\0", hook)
}

/// `thread.prof.active = false` for the calling thread (the shim's own),
/// so that a heap profile holds the application's allocations and not the
/// shim's (those of the very request that takes it). Nothing if the
/// profiler was not started with the process.
pub fn exclude_own_thread_from_profiles() {
    if crate::options::profile() {
        let _ = write(b"thread.prof.active\0", false);
    }
}
