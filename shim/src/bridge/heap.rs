//! The attached bridge's stand-in for `jemalloc.rs`: the same functions,
//! answered by the allocator the process already has. A library loaded into
//! a running process must never take over `malloc` (one `free` of the other
//! allocator's pointer is a crash), so the bridge has no allocator of its
//! own: the control requests and the thread call these instead.
//!
//! * whose allocator: the object that defines the process's `malloc`
//!   (found as `os::interpose` finds it), asked once, on the bridge's
//!   thread, for the functions below, in that object only;
//! * `purge_all` (the `purge` and `release` requests): glibc's
//!   `malloc_trim(0)`, jemalloc's `arena.4096.purge`, tcmalloc's
//!   `MallocExtension_ReleaseFreeMemory`, mimalloc's `mi_collect(true)`;
//! * `stats`: glibc's `mallinfo2` (docs/attach.md maps its fields),
//!   jemalloc's `stats.*`, tcmalloc's `generic.*` properties; mimalloc's
//!   figures are not read (zeros);
//! * `decay_ms` / `set_decay_ms` / `decay_all`: the idle return
//!   (`attach --idle-return`, or `decay --dirty-ms` later): off (-1) until
//!   asked for. Each tick of the thread, the process's CPU time, less the
//!   bridge thread's own, tells whether the process worked since the last
//!   tick; once it has been quiet for the whole `dirty` interval, the heap
//!   is returned once (`purge_all`), and again only after it has worked.
//!   No allocator figure is read per tick: glibc's `mallinfo2` walks every
//!   free chunk under the arena locks, which a busy application would feel.
//! * the heap profiler, arenas and thread caches are the shim's only: the
//!   profiler is never ready here, the rest does nothing.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering::*};

/// `MALLCTL_ARENAS_ALL`, as in jemalloc.rs (the bridge has no arenas).
pub const ARENAS_ALL: u32 = 4096;

/// An errno: the allocator has no such call, or it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error(pub c_int);

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            libc::ENOTSUP => write!(
                f,
                "the process's allocator ({}) has no such call",
                version()
            ),
            n => write!(f, "the process's allocator failed (errno {n})"),
        }
    }
}

/// Whose `malloc` the process calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Unknown = 0,
    Glibc = 1,
    Jemalloc = 2,
    Tcmalloc = 3,
    Mimalloc = 4,
    Other = 5,
}

static KIND: AtomicU8 = AtomicU8::new(Kind::Unknown as u8);
/// The allocator's release call (`malloc_trim`, `mallctl`,
/// `MallocExtension_ReleaseFreeMemory`, `mi_collect`).
static RELEASE: AtomicUsize = AtomicUsize::new(0);
/// Its figures (`mallinfo2`, `mallctl`,
/// `MallocExtension_GetNumericProperty`); 0 if none.
static FIGURES: AtomicUsize = AtomicUsize::new(0);

/// The allocator, found on first use.
fn kind() -> Kind {
    let k = KIND.load(Acquire);
    if k != Kind::Unknown as u8 {
        // SAFETY: only `Kind` values are stored.
        return unsafe { core::mem::transmute::<u8, Kind>(k) };
    }
    let found = find();
    KIND.store(found as u8, Release);
    found
}

fn find() -> Kind {
    let Some(malloc) = crate::os::interpose::process_malloc() else {
        return Kind::Other;
    };
    let mine = |name: &core::ffi::CStr| {
        crate::os::dl::global_definition(name)
            .filter(|p| crate::os::dl::same_object(*p as usize, malloc as usize))
            .map(|p| p as usize)
    };
    if let Some(ctl) = mine(c"mallctl") {
        RELEASE.store(ctl, Relaxed);
        FIGURES.store(ctl, Relaxed);
        return Kind::Jemalloc;
    }
    if let Some(rel) = mine(c"MallocExtension_ReleaseFreeMemory") {
        RELEASE.store(rel, Relaxed);
        FIGURES.store(
            mine(c"MallocExtension_GetNumericProperty").unwrap_or(0),
            Relaxed,
        );
        return Kind::Tcmalloc;
    }
    if let Some(collect) = mine(c"mi_collect") {
        RELEASE.store(collect, Relaxed);
        return Kind::Mimalloc;
    }
    if let Some(trim) = mine(c"malloc_trim") {
        RELEASE.store(trim, Relaxed);
        FIGURES.store(mine(c"mallinfo2").unwrap_or(0), Relaxed);
        return Kind::Glibc;
    }
    Kind::Other
}

/// The allocator's name, for the stats report's `jemalloc_version` field
/// (which says whose figures those are).
pub fn version() -> &'static str {
    match kind() {
        Kind::Glibc => "glibc malloc (attached bridge)",
        Kind::Jemalloc => "jemalloc, preloaded (attached bridge)",
        Kind::Tcmalloc => "tcmalloc, preloaded (attached bridge)",
        Kind::Mimalloc => "mimalloc, preloaded (attached bridge)",
        Kind::Unknown | Kind::Other => "unknown allocator (attached bridge)",
    }
}

type Mallctl =
    unsafe extern "C" fn(*const c_char, *mut c_void, *mut usize, *mut c_void, usize) -> c_int;

/// One `mallctl` of the preloaded jemalloc (the same call jemalloc.rs
/// makes on the shim's own): `old`/`old_len` to read, `new`/`new_len` to
/// write, all null for an action.
fn mallctl(
    key: &core::ffi::CStr,
    old: *mut c_void,
    old_len: *mut usize,
    new: *mut c_void,
    new_len: usize,
) -> Result<(), Error> {
    let f = FIGURES.load(Relaxed);
    if kind() != Kind::Jemalloc || f == 0 {
        return Err(Error(libc::ENOTSUP));
    }
    // SAFETY: `f` is the process's jemalloc's `mallctl` (`find`); the key
    // is NUL-terminated and the callers pass buffers of the key's type.
    let rc = unsafe {
        core::mem::transmute::<usize, Mallctl>(f)(key.as_ptr(), old, old_len, new, new_len)
    };
    if rc == 0 { Ok(()) } else { Err(Error(rc)) }
}

/// Reads a `T` (the key's type) from the preloaded jemalloc.
fn je_read<T: Copy>(key: &core::ffi::CStr) -> Result<T, Error> {
    let mut v = core::mem::MaybeUninit::<T>::zeroed();
    let mut len = core::mem::size_of::<T>();
    mallctl(
        key,
        v.as_mut_ptr().cast(),
        &mut len,
        core::ptr::null_mut(),
        0,
    )?;
    // SAFETY: zeroed, then written by jemalloc.
    Ok(unsafe { v.assume_init() })
}

/// Runs an action key (`arena.4096.purge`) of the preloaded jemalloc.
fn je_run(key: &core::ffi::CStr) -> Result<(), Error> {
    mallctl(
        key,
        core::ptr::null_mut(),
        core::ptr::null_mut(),
        core::ptr::null_mut(),
        0,
    )
}

/// Returns the free heap to the OS with the allocator's own call.
pub fn purge_all() -> Result<(), Error> {
    let k = kind();
    let f = RELEASE.load(Relaxed);
    if f == 0 {
        return Err(Error(libc::ENOTSUP));
    }
    // SAFETY: each `f` is the named function of the process's allocator
    // (`find`), called with its documented arguments.
    unsafe {
        match k {
            Kind::Glibc => {
                let trim = core::mem::transmute::<usize, unsafe extern "C" fn(usize) -> c_int>(f);
                trim(0);
            }
            Kind::Jemalloc => je_run(c"arena.4096.purge")?,
            Kind::Tcmalloc => core::mem::transmute::<usize, unsafe extern "C" fn()>(f)(),
            Kind::Mimalloc => core::mem::transmute::<usize, unsafe extern "C" fn(bool)>(f)(true),
            Kind::Unknown | Kind::Other => return Err(Error(libc::ENOTSUP)),
        }
    }
    IDLE_RETURNED.store(true, Relaxed);
    Ok(())
}

// --- The idle return ---------------------------------------------------------------

/// The idle interval in ms (`-1`: off, the default after `attach`).
static IDLE_MS: AtomicI64 = AtomicI64::new(-1);
/// Process CPU time at the last tick, less the bridge thread's, in ns.
static LAST_CPU_NS: AtomicU64 = AtomicU64::new(0);
/// Since when (monotonic ms) every tick was quiet; 0: not quiet.
static QUIET_SINCE: AtomicU64 = AtomicU64::new(0);
/// The heap was returned since the process last worked.
static IDLE_RETURNED: AtomicBool = AtomicBool::new(false);
/// Idle returns done (the `stats` report's `purges` counts requests).
static IDLE_RETURNS: AtomicU64 = AtomicU64::new(0);

/// A tick that used less than this share of one CPU (per mille) is quiet.
const QUIET_PER_MILLE: u64 = 20;

fn cpu_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills `ts`.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The idle return's interval (`dirty`) and `-1` for `muzzy`.
pub fn decay_ms() -> Result<(i64, i64), Error> {
    Ok((IDLE_MS.load(Relaxed), -1))
}

/// Sets the idle return's interval (`dirty`; `-1` switches it off).
/// `muzzy` has no meaning here and must be absent or `-1`.
pub fn set_decay_ms(dirty: Option<i64>, muzzy: Option<i64>) -> Result<(), Error> {
    if muzzy.is_some_and(|m| m != -1) || dirty.is_some_and(|d| d < -1) {
        return Err(Error(libc::EINVAL));
    }
    if let Some(d) = dirty {
        IDLE_MS.store(d, Relaxed);
        QUIET_SINCE.store(0, Relaxed);
    }
    Ok(())
}

/// The thread's tick while the idle return is on (see the module docs).
pub fn decay_all() -> Result<(), Error> {
    let idle = IDLE_MS.load(Relaxed);
    if idle < 0 {
        return Ok(());
    }
    let now = crate::os::time::monotonic_ms();
    let app = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
        .saturating_sub(cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID));
    let used = app.saturating_sub(LAST_CPU_NS.swap(app, Relaxed));
    let since = QUIET_SINCE.load(Relaxed);
    // The tick's length: from the last look (the first look only sets it).
    let last = LAST_LOOK_MS.swap(now, Relaxed);
    let span_ns = now.saturating_sub(last).max(1) * 1_000_000;
    if last == 0 || used * 1000 > span_ns * QUIET_PER_MILLE {
        QUIET_SINCE.store(0, Relaxed);
        IDLE_RETURNED.store(false, Relaxed);
        return Ok(());
    }
    if since == 0 {
        QUIET_SINCE.store(last, Relaxed);
        return Ok(());
    }
    if !IDLE_RETURNED.load(Relaxed) && now.saturating_sub(since) >= idle as u64 {
        purge_all()?;
        IDLE_RETURNS.fetch_add(1, Relaxed);
    }
    Ok(())
}

/// When the idle return last looked (monotonic ms; 0: never).
static LAST_LOOK_MS: AtomicU64 = AtomicU64::new(0);

/// Idle returns done since the bridge was attached.
pub fn idle_returns() -> u64 {
    IDLE_RETURNS.load(Relaxed)
}

// --- Figures -----------------------------------------------------------------------

/// The protocol's allocator figures (docs/attach.md says what each means
/// for each allocator).
pub type Stats = memshim_proto::AllocatorStats;

use crate::os::mallinfo::Mallinfo2;

/// The allocator's figures now.
pub fn stats() -> Result<Stats, Error> {
    let k = kind();
    let f = FIGURES.load(Relaxed);
    let mut s = Stats::default();
    match k {
        Kind::Glibc if f != 0 => {
            // SAFETY: glibc's `mallinfo2` (2.33 and later; `find`).
            let m =
                unsafe { core::mem::transmute::<usize, unsafe extern "C" fn() -> Mallinfo2>(f)() };
            let mapped = (m.arena + m.hblkhd) as u64;
            s.allocated = (m.uordblks + m.hblkhd) as u64;
            s.active = s.allocated;
            s.mapped = mapped;
            s.resident = mapped;
            s.dirty = m.fordblks as u64;
        }
        Kind::Jemalloc => {
            advance_epoch()?;
            let sz = |k: &core::ffi::CStr| je_read::<usize>(k).map(|v| v as u64);
            s.allocated = sz(c"stats.allocated")?;
            s.active = sz(c"stats.active")?;
            s.resident = sz(c"stats.resident")?;
            s.mapped = sz(c"stats.mapped")?;
            s.retained = sz(c"stats.retained").unwrap_or(0);
            s.metadata = sz(c"stats.metadata").unwrap_or(0);
            let page = sz(c"arenas.page").unwrap_or(4096);
            s.dirty = sz(c"stats.arenas.4096.pdirty").unwrap_or(0) * page;
            s.muzzy = sz(c"stats.arenas.4096.pmuzzy").unwrap_or(0) * page;
        }
        Kind::Tcmalloc if f != 0 => {
            type Get = unsafe extern "C" fn(*const c_char, *mut usize) -> c_int;
            // SAFETY: tcmalloc's C entry point (`find`).
            let get = unsafe { core::mem::transmute::<usize, Get>(f) };
            let prop = |k: &core::ffi::CStr| {
                let mut v = 0usize;
                // SAFETY: a NUL-terminated property name and a size_t out.
                if unsafe { get(k.as_ptr(), &mut v) } != 0 {
                    v as u64
                } else {
                    0
                }
            };
            s.allocated = prop(c"generic.current_allocated_bytes");
            s.active = s.allocated;
            s.mapped = prop(c"generic.heap_size");
            s.resident = s
                .mapped
                .saturating_sub(prop(c"tcmalloc.pageheap_unmapped_bytes"));
            s.dirty = prop(c"tcmalloc.pageheap_free_bytes");
        }
        _ => {}
    }
    s.purgeable = s.dirty + s.muzzy;
    Ok(s)
}

/// Refreshes jemalloc's statistics (a preloaded jemalloc); nothing for the
/// others, whose figures are always current.
pub fn advance_epoch() -> Result<(), Error> {
    if kind() == Kind::Jemalloc {
        let mut one = 1u64;
        // As before: figures one epoch old rather than none.
        let _ = mallctl(
            c"epoch",
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            (&raw mut one).cast(),
            8,
        );
    }
    Ok(())
}

/// The per-arena summaries (the shim's only).
pub type ArenaStats = memshim_proto::ArenaStats;

/// None: the bridge has no arenas to report.
pub fn arena_stats(_index: u32) -> Option<ArenaStats> {
    None
}

/// The system's page size.
pub fn page_size() -> u64 {
    crate::os::page_size() as u64
}

/// 0: no arenas of the shim's.
pub fn narenas() -> u32 {
    0
}

/// 0: no arenas of the shim's.
pub fn narenas_auto() -> u32 {
    0
}

/// False.
pub fn background_thread() -> bool {
    false
}

/// True: the figures above are always there.
pub fn stats_enabled() -> bool {
    true
}

/// None: the bridge maps no heap of its own.
pub fn opt_thp() -> Option<&'static core::ffi::CStr> {
    None
}

// --- What only the shim's own jemalloc does: nothing here ------------------------

/// Nothing: no jemalloc to initialise.
pub fn ensure_init() {}
/// Nothing.
pub fn shim_fork_handlers_registered() {}
/// False.
pub fn claim_atfork(_prepare: usize) -> bool {
    false
}
/// Nothing: the process's allocator has its own fork handling.
pub fn prefork(_alone: bool) {}
/// Nothing.
pub fn postfork_parent() {}
/// Nothing.
pub fn postfork_child() {}
/// Nothing to flush.
pub fn flush_own_tcache() -> Result<(), Error> {
    Ok(())
}
/// Nothing to disable.
pub fn disable_own_tcache() -> Result<(), Error> {
    Ok(())
}
/// No arena of our own.
pub fn use_own_arena() -> Result<(), Error> {
    Ok(())
}
/// Nothing: the bridge is not on the allocation path.
pub fn note_allocation(_size: usize) {}
/// Nothing.
pub fn lift_first_arena_threshold() {}
/// Nothing: the bridge is not on the allocation path.
pub fn share_big_blocks() {}
/// Nothing.
pub fn stop_sharing_big_blocks() {}
/// Nothing.
pub fn big_blocks_after_fork_child() {}
/// The profiler is the preload's only.
pub fn prof_ready() -> bool {
    false
}
/// False.
pub fn prof_unwinds_with_dwarf() -> bool {
    false
}
/// False.
pub fn prof_active() -> bool {
    false
}
/// Not here.
pub fn set_prof_active(_on: bool) -> Result<(), Error> {
    Err(Error(libc::ENOTSUP))
}
/// 0.
pub fn prof_lg_sample() -> u32 {
    0
}
/// Not here.
pub fn prof_reset() -> Result<(), Error> {
    Err(Error(libc::ENOTSUP))
}
/// Not here.
pub fn prof_dump(_path: &core::ffi::CStr) -> Result<(), Error> {
    Err(Error(libc::ENOTSUP))
}
/// Not here.
pub fn prof_backtrace_hook() -> Result<crate::jemalloc::BacktraceHook, Error> {
    Err(Error(libc::ENOTSUP))
}
/// Not here.
pub fn set_prof_backtrace_hook(_hook: crate::jemalloc::BacktraceHook) -> Result<(), Error> {
    Err(Error(libc::ENOTSUP))
}
/// The hook's type, as the preload's jemalloc.rs names it.
pub type BacktraceHook = unsafe extern "C" fn(*mut *mut core::ffi::c_void, *mut u32, u32);
/// Nothing.
pub fn exclude_own_thread_from_profiles() {}
